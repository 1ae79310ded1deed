"""The llvm target: LLVM IR through llvmlite, JIT-compiled for the host.

The numeric tests of the te layer (schedule primitives, expressions and dtypes, random schedules, random
elementwise expressions) are re-run here on the llvm target: every test function of those modules that takes
the `check_build` fixture is called again with a `check_build` that builds for "llvm" (tests that read the
generated C source are left out). Then tests of what is particular to LLVM: vector types, the thread pool,
fast-math flags, the default target without a C compiler.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import itertools
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import ember
from ember import te
from ember.runtime.module import ArgumentError

pytest.importorskip("llvmlite", reason="the llvm target needs llvmlite (pip install 'ember[llvm]')")

TESTS = Path(__file__).resolve().parents[1]
RERUN = [
    "te/test_te_schedule_primitives.py",
    "te/test_te_expressions.py",
    "te/test_te_random_schedules.py",
    "codegen/test_codegen_random_exprs.py",
]


PROPERTY_EXAMPLES = os.environ.get("EMBER_LLVM_PROPERTY_EXAMPLES", "10")  # hypothesis examples per property test


def _load(rel: str):
    """A private copy of a test module (its property tests draw PROPERTY_EXAMPLES examples)."""
    name = "_llvm_rerun_" + rel.replace("/", "_").removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, TESTS / rel)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = mod  # dataclasses look their module up there
    old = os.environ.get("EMBER_PROPERTY_EXAMPLES")
    os.environ["EMBER_PROPERTY_EXAMPLES"] = old or PROPERTY_EXAMPLES
    try:
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
    finally:
        if old is None:
            del os.environ["EMBER_PROPERTY_EXAMPLES"]
    return mod


def _param_sets(fn) -> list[tuple[str, dict]]:
    """(id, kwargs) for every combination of the function's parametrize marks."""
    axes = []
    for mark in getattr(fn, "pytestmark", []):
        if mark.name != "parametrize":
            continue
        names, values = mark.args[0], list(mark.args[1])
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        ids = mark.kwargs.get("ids")
        rows = []
        for k, v in enumerate(values):
            v = v.values if hasattr(v, "values") and type(v).__name__ == "ParameterSet" else v
            v = v if len(names) > 1 else (v,)
            label = ids[k] if isinstance(ids, list | tuple) else "-".join(_label(x) for x in v)
            rows.append((str(label), dict(zip(names, v))))
        axes.append(rows)
    out = []
    for combo in itertools.product(*axes):
        out.append(("-".join(c[0] for c in combo), {k: v for c in combo for k, v in c[1].items()}))
    return out or [("", {})]


def _label(x) -> str:
    """A stable id for a parameter value (no addresses: xdist workers must collect the same ids)."""
    for attr in ("id", "name", "__name__"):
        v = getattr(x, attr, None)
        if isinstance(v, str):
            return v
    return str(x)


def _collect() -> list:
    cases = []
    for rel in RERUN:
        mod = _load(rel)
        for name, fn in vars(mod).items():
            if not (name.startswith("test_") and callable(fn)):
                continue
            target = getattr(fn, "hypothesis", None)
            inner = target.inner_test if target is not None else fn
            params = inspect.signature(inner).parameters
            if "check_build" not in params or ".source" in inspect.getsource(inner):
                continue
            marks = [pytest.mark.xfail(reason=m.kwargs.get("reason", ""), strict=False)
                     for m in getattr(fn, "pytestmark", []) if m.name == "xfail"]  # fmt: skip
            for pid, kwargs in _param_sets(fn):
                label = f"{Path(rel).stem}::{name}" + (f"[{pid}]" if pid else "")
                cases.append(pytest.param(fn, kwargs, id=label, marks=marks))
    return cases


def llvm_check(*args, **kwargs):
    from conftest import check

    kwargs["target"] = "llvm"
    return check(*args, **kwargs)


@pytest.mark.parametrize("fn, kwargs", _collect())
def test_te_numerics_on_llvm(fn, kwargs, rng):
    sig = inspect.signature(getattr(fn, "hypothesis", None).inner_test if hasattr(fn, "hypothesis") else fn)
    call = dict(kwargs)
    if "check_build" in sig.parameters:
        call["check_build"] = llvm_check
    if "rng" in sig.parameters:
        call["rng"] = rng
    if hasattr(fn, "hypothesis"):
        call.pop("data", None)
    fn(**call)


# -- what is particular to LLVM -----------------------------------------------------------------


def vector_add(n: int = 64, lanes: int = 8, dtype: str = "float32"):
    A = te.placeholder((n,), dtype, name="A")
    B = te.compute((n,), lambda i: A[i] * 2.0 + 1.0, name="B")
    s = te.create_schedule(B)
    _, xi = s[B].split(B.op.axis[0], lanes)
    s[B].vectorize(xi)
    return s, [A, B]


@pytest.mark.parametrize("dtype, lanes, ty", [("float32", 8, "<8 x float>"), ("float64", 4, "<4 x double>"),
                                              ("float32", 16, "<16 x float>")])  # fmt: skip
def test_vectorized_loop_uses_llvm_vector_types(dtype, lanes, ty, rng):
    s, args = vector_add(64, lanes, dtype)
    f = ember.build(s, args, target="llvm")
    assert f"load {ty}" in f.source and f"store {ty}" in f.source, f.source
    a = rng.standard_normal(64).astype(dtype)
    b = np.empty_like(a)
    f(a, b)
    np.testing.assert_allclose(b, a * 2 + 1, rtol=1e-6)


def test_vector_code_reaches_the_machine_code():
    s, args = vector_add(64, 8)
    f = ember.build(s, args, target="llvm")
    asm = f.assembly
    assert "ymm" in asm or "zmm" in asm or "xmm" in asm or "v" in asm.lower()


def parallel_rows(m: int, n: int):
    A = te.placeholder((m, n), name="A")
    B = te.compute((m, n), lambda i, j: A[i, j] * 3.0 + te.const(0.5), name="B")
    s = te.create_schedule(B)
    s[B].parallel(B.op.axis[0])
    return s, [A, B]


@pytest.mark.parametrize("threads", [1, 2, 3, 8, 100])
@pytest.mark.parametrize("m", [1, 5, 64])
def test_parallel_loop_runs_every_chunk_once(threads, m, rng):
    s, args = parallel_rows(m, 17)
    f = ember.build(s, args, target=f"llvm -threads={threads}")
    assert ("ember_parallel_for" in f.source) == (m > 1)  # a loop of one iteration is no loop
    a = rng.standard_normal((m, 17)).astype("float32")
    for _ in range(5):
        b = np.full_like(a, np.nan)
        f(a, b)
        np.testing.assert_allclose(b, a * 3 + 0.5, rtol=1e-5, atol=1e-6)


def test_thread_count_can_be_set_at_run_time(rng):
    s, args = parallel_rows(40, 9)
    f = ember.build(s, args, target="llvm")
    a = rng.standard_normal((40, 9)).astype("float32")
    for n in (1, 2, 7):
        f.set_num_threads(n)
        b = np.full_like(a, np.nan)
        f(a, b)
        np.testing.assert_allclose(b, a * 3 + 0.5, rtol=1e-5, atol=1e-6)


def test_parallel_matmul_with_register_tiles_matches_numpy(rng):
    from ember.demo import GemmTiles, parallel
    from ember.target import Target

    target = Target.parse("llvm -threads=2")
    s, args = parallel(96, 80, 64, GemmTiles.for_target(target))
    f = ember.build(s, args, target=target)
    a, b = rng.standard_normal((96, 64)).astype("float32"), rng.standard_normal((64, 80)).astype("float32")
    c = np.full((96, 80), np.nan, np.float32)
    f(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


def test_nested_parallel_loop_runs_serially_inside_the_outer_one(rng):
    A = te.placeholder((6, 7), name="A")
    B = te.compute((6, 7), lambda i, j: A[i, j] + 1.0, name="B")
    s = te.create_schedule(B)
    s[B].parallel(B.op.axis[0])
    s[B].parallel(B.op.axis[1])
    f = ember.build(s, [A, B], target="llvm -threads=2")
    assert f.source.count("ember_parallel_for") == 2  # one declaration, one call
    a = rng.standard_normal((6, 7)).astype("float32")
    b = np.empty_like(a)
    f(a, b)
    np.testing.assert_allclose(b, a + 1)


def test_fastmath_only_when_the_target_asks():
    s, args = vector_add()
    plain = ember.build(s, args, target="llvm").source
    fast = ember.build(s, args, target="llvm -fastmath").source
    assert "fmul contract" in plain and " fast " not in plain
    assert "fmul fast" in fast


def test_mcpu_selects_the_cpu(rng):
    s, args = vector_add()
    f = ember.build(s, args, target="llvm -mcpu=x86-64" if _x86() else "llvm")
    a = rng.standard_normal(64).astype("float32")
    b = np.empty_like(a)
    f(a, b)
    np.testing.assert_allclose(b, a * 2 + 1, rtol=1e-6)


def _x86() -> bool:
    import platform

    return platform.machine() in ("x86_64", "AMD64")


def test_big_local_buffers_go_to_the_heap(rng):
    A = te.placeholder((64, 256), name="A")
    B = te.compute((64, 256), lambda i, j: A[i, j] + 1.0, name="B")
    C = te.compute((64, 256), lambda i, j: B[i, j] * 2.0, name="C")
    s = te.create_schedule(C)
    f = ember.build(s, [A, C], target="llvm")  # B: 64 KiB, more than the stack limit
    assert "aligned_alloc" in f.source
    a = rng.standard_normal((64, 256)).astype("float32")
    c = np.empty_like(a)
    f(a, c)
    np.testing.assert_allclose(c, (a + 1) * 2, rtol=1e-6)


def test_arguments_are_checked_before_native_code_runs():
    s, args = vector_add()
    f = ember.build(s, args, target="llvm")
    with pytest.raises(ArgumentError, match="shape"):
        f(np.zeros(63, np.float32), np.zeros(64, np.float32))
    with pytest.raises(ArgumentError, match="dtype"):
        f(np.zeros(64, np.float64), np.zeros(64, np.float32))
    with pytest.raises(ArgumentError, match="expects 2 arguments"):
        f(np.zeros(64, np.float32))


def test_thread_binding_needs_a_gpu_target():
    A = te.placeholder((8,), name="A")
    B = te.compute((8,), lambda i: A[i] + 1.0, name="B")
    s = te.create_schedule(B)
    s[B].bind(B.op.axis[0], "threadIdx.x")
    with pytest.raises(Exception, match="needs a GPU target"):
        ember.build(s, [A, B], target="llvm")


def test_llvm_is_the_default_without_a_c_compiler(monkeypatch, rng):
    build_mod = sys.modules["ember.build"]
    monkeypatch.setattr(build_mod, "find_cc", lambda: None)
    assert build_mod.default_target() == "llvm"
    s, args = vector_add()
    f = ember.build(s, args)
    assert "define i32" in f.source
    a = rng.standard_normal(64).astype("float32")
    b = np.empty_like(a)
    f(a, b)
    np.testing.assert_allclose(b, a * 2 + 1, rtol=1e-6)


@functools.cache
def _has_cc() -> bool:
    from ember.codegen.toolchain import find_cc

    return find_cc() is not None


def test_the_default_with_a_c_compiler_is_c():
    build_mod = sys.modules["ember.build"]
    assert build_mod.default_target() == ("c" if _has_cc() else "llvm")


def test_machine_code_is_cached_on_disk_by_content(monkeypatch, tmp_path, rng):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    s, args = vector_add(48, 8)
    first = ember.build(s, args, target="llvm")
    second = ember.build(s, args, target="llvm")
    assert not first.jit.from_cache and second.jit.from_cache
    assert list(tmp_path.glob("llvm/*/*.o")) == [second.jit.object_path]
    assert not list(tmp_path.glob("llvm/*/.*"))  # no temporary files left
    a = rng.standard_normal(48).astype("float32")
    b = np.empty_like(a)
    second(a, b)
    np.testing.assert_allclose(b, a * 2 + 1, rtol=1e-6)
    assert "<8 x float>" in second.jit.optimized_ir


@pytest.mark.parametrize("lanes", [8, 16])
def test_vector_exp_and_sigmoid_in_arithmetic(lanes):
    """exp and sigmoid of float32 vectors on llvm are vector arithmetic (no expf per lane, no table gather):
    exp within 2 ulp of exp in float64 over the normal range, 0 below FLT_MIN, exp(-inf) = 0, inf above
    ln FLT_MAX, NaN stays NaN; sigmoid within 2 ulp-ish of float64 (rtol 1e-6)."""
    n = 4096
    A = te.placeholder((n,), "float32", name="A")
    E = te.compute((n,), lambda i: te.exp(A[i]), name="E")
    S = te.compute((n,), lambda i: te.sigmoid(A[i]), name="S")
    s = te.create_schedule([E, S])
    for T in (E, S):
        s[T].vectorize(s[T].split(T.op.axis[0], lanes)[1])
    f = ember.build(s, [A, E, S], target="llvm")
    assert "llvm.exp" not in f.source and "ember_exp2_table" not in f.source  # no call per lane, no gather
    rng = np.random.default_rng(lanes)
    a = np.concatenate([rng.uniform(-110, 90, n - 1024), rng.standard_normal(1024) * 2]).astype(np.float32)
    a[:8] = [-1e4, -np.inf, np.nan, 88.0, 88.72, 88.73, np.inf, -87.3]
    e, sg = np.zeros(n, np.float32), np.zeros(n, np.float32)
    f(a, e, sg)
    with np.errstate(over="ignore"):
        want = np.exp(a.astype(np.float64))
    assert e[0] == 0 and e[1] == 0 and np.isnan(e[2]) and np.isfinite(e[4]) and np.isinf(e[5]) and np.isinf(e[6])
    tiny = np.finfo(np.float32).tiny
    assert np.all(e[want < tiny] == 0)
    ok = np.isfinite(want) & (want < np.finfo(np.float32).max) & (want >= tiny)
    ulp = np.spacing(want[ok].astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(e[ok] - want[ok]) / ulp) <= 2.0
    fin = np.isfinite(a)
    with np.errstate(over="ignore"):
        ref = 1.0 / (1.0 + np.exp(-a[fin].astype(np.float64)))
    np.testing.assert_allclose(sg[fin], ref, rtol=1e-6, atol=1e-38)
    assert np.isnan(sg[2])
