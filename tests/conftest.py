"""Shared test helpers: a seeded RNG per test and the one helper that checks a build against numpy.

`check(s, args, ref, rng)` builds schedule `s` for `args` (placeholders first, then outputs), fills the
inputs with random values, the outputs with garbage (so an element the kernel never writes is caught),
runs the kernel and compares every output with `ref(*inputs)`.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Sequence

import numpy as np
import pytest

import ember
from ember import te

# Tests patch the compiler's internals and expect each compile to lower again: the whole-model compile cache is off
# in the test session (tests/runtime/test_compile_cache.py turns it on with its own cache directory).
os.environ.setdefault("EMBER_COMPILE_CACHE", "0")


def random_array(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, low=-2.0, high=2.0) -> np.ndarray:
    """Random values that keep integer arithmetic away from overflow (C signed overflow is undefined)."""
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype.startswith(("int", "uint")):
        lo, hi = (-8, 8) if dtype == "int8" else (-100, 100)
        return rng.integers(lo, hi, shape, endpoint=True).astype(dtype)
    return rng.uniform(low, high, shape).astype(dtype)


def garbage(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """An output buffer full of values no correct kernel produces: NaN for floats, a sentinel otherwise."""
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return np.full(shape, np.nan, dt)
    if dt.kind == "b":
        return np.zeros(shape, dt)
    return np.full(shape, np.iinfo(dt).min + 3, dt)


def check(
    s: te.Schedule,
    args: Sequence[te.Tensor],
    ref: Callable[..., np.ndarray | tuple[np.ndarray, ...]],
    rng: np.random.Generator,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    inputs: dict[str, np.ndarray] | None = None,
    target: str = "c",
) -> ember.runtime.module.Module:
    """Build `s` for `args`, run it on random inputs and compare its outputs with `ref(*inputs)`.

    Arguments that are placeholders are inputs (random unless given in `inputs` by name), the others
    outputs; `ref` returns one array per output, in argument order."""
    f = ember.build(s, list(args), target=target)
    given = inputs or {}
    arrays, outs = [], []
    for t in args:
        shape, dt = tuple(t.shape), t.dtype.name
        if isinstance(t.op, te.PlaceholderOp):
            a = given[t.name] if t.name in given else random_array(rng, shape, dt)
            arrays.append(np.ascontiguousarray(a, dtype=dt))
        else:
            arrays.append(garbage(shape, dt))
            outs.append(len(arrays) - 1)
    ins = [a.copy() for i, a in enumerate(arrays) if i not in outs]
    f(*arrays)
    expect = ref(*ins)
    expect = expect if isinstance(expect, tuple) else (expect,)
    assert len(expect) == len(outs), f"reference returned {len(expect)} arrays for {len(outs)} outputs"
    for i, e in zip(outs, expect):
        got = arrays[i]
        e = np.asarray(e)
        assert got.shape == e.shape, f"output {args[i].name}: shape {got.shape}, reference {e.shape}"
        if got.dtype.kind in "biu":
            np.testing.assert_array_equal(got, e.astype(got.dtype), err_msg=f"output {args[i].name}\n{f.source}")
        else:
            np.testing.assert_allclose(got, e, rtol=rtol, atol=atol, err_msg=f"output {args[i].name}")
    return f


def ort_int8_exact() -> bool:
    """Whether onnxruntime's uint8 x int8 products are exact on this CPU. On x86 without VNNI (AVX2, AVX-512 before
    Cascade Lake) it sums pairs of products in 16 bits with saturation (vpmaddubsw): a full-range quantized model is
    then off by up to tens of steps (`quantize_static(reduce_range=True)`'s 7-bit weights avoid it)."""
    import platform

    from ember.target import host_cpu_flags

    x86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
    return not x86 or bool({"avx512_vnni", "avx_vnni", "amx_int8"} & host_cpu_flags())


def int8_reference(model):
    """A runner of a quantized ONNX model to check Ember against (`.run(None, feeds)`): onnxruntime where its
    integer products are exact (`ort_int8_exact`), else ONNX's reference evaluator (dequantize, float op,
    quantize: within one step of exact integer arithmetic)."""
    if ort_int8_exact():
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    from onnx import version_converter
    from onnx.reference import ReferenceEvaluator

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 21)
    return ReferenceEvaluator(version_converter.convert_version(model, 21) if opset < 21 else model)  # (its Q/DQ)


def opencl_missing() -> str | None:
    """Why OpenCL kernels cannot run here (no pyopencl, no platform), None when they can."""
    from ember.runtime.opencl import OpenCLUnavailable, context

    try:
        context()
    except OpenCLUnavailable as e:
        return str(e)
    return None


def nvcc_missing() -> str | None:
    """Why generated CUDA cannot be compiled here, None when nvcc is installed."""
    from ember.codegen.cuda import find_nvcc

    return None if find_nvcc() else "nvcc is not installed"


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A numpy RNG seeded from the test's id: reproducible, different per test."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(scope="session")
def check_build() -> Callable[..., ember.runtime.module.Module]:
    return check


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "property: hypothesis property tests that compile many random schedules")
    config.addinivalue_line("markers", "tensorflow: tests that load TensorFlow (run apart: `pytest -m tensorflow`)")


@pytest.hookimpl(trylast=True)  # after `-m` has deselected
def pytest_collection_modifyitems(config, items) -> None:
    """TensorFlow loaded in a process breaks PoCL's OpenCL compiler there (a crash, or 'unknown target CPU'): a
    session that runs other tests too skips the TensorFlow ones, which run in a session of their own
    (`pytest -m tensorflow tests`, as .ci/run does)."""
    marked = [item for item in items if item.get_closest_marker("tensorflow")]
    if marked and len(marked) < len(items):
        skip = pytest.mark.skip(reason="TensorFlow breaks OpenCL (PoCL) in the same process: run these apart, "
                                       "with `pytest -m tensorflow tests`")  # fmt: skip
        for item in marked:
            item.add_marker(skip)
