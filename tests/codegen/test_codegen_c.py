"""C code generation and the toolchain: what the generated source looks like, and how it is compiled and cached."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import ember
from ember import te
from ember.codegen import toolchain
from ember.codegen.c import codegen_c
from ember.target import Target


def matmul(m: int = 16, n: int = 16, k: int = 16, dt: str = "float32"):
    A = te.placeholder((m, k), dt, name="A")
    B = te.placeholder((k, n), dt, name="B")
    r = te.reduce_axis((0, k), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    return A, B, C


def source_of(s, args, target: str = "c", name: str = "default_function") -> str:
    return codegen_c(ember.lower(s, args, name), target)


def body_of(src: str) -> str:
    return src[src.index("int32_t default_function") :]


# -- the generated source ---------------------------------------------------------------------------


def test_signature_has_restrict_pointers_and_const_inputs():
    A, B, C = matmul()
    src = source_of(te.create_schedule(C), [A, B, C])
    assert "int32_t default_function(const float* restrict A, const float* restrict B, float* restrict C) {" in src


def test_names_come_from_the_ir_and_are_made_valid_c():
    X = te.placeholder((8,), "float64", name="float")  # a C keyword
    Y = te.compute((8,), lambda int: X[int] * 2.0, name="out.local")
    s = te.create_schedule(Y)
    outer, _ = s[Y].split(Y.op.axis[0], factor=4)
    src = source_of(s, [X, Y], name="my kernel")
    assert "int32_t my_kernel(const double* restrict float_, double* restrict out_local) {" in src
    assert "for (int32_t int_outer = 0; int_outer < 2; ++int_outer) {" in src
    assert "out_local[int_outer * 4 + int_inner] = float_[int_outer * 4 + int_inner] * 2.0;" in src


def test_loops_with_the_same_name_get_distinct_c_names():
    A, B, C = matmul()
    s = te.create_schedule(C)
    s[C].reorder(C.op.reduce_axis[0], *C.op.axis)  # init nest and update nest both loop over i, j
    src = source_of(s, [A, B, C])
    assert "for (int32_t i = 0;" in src and "for (int32_t i_1 = 0;" in src


def test_parallel_loop_is_a_region_of_the_thread_pool():
    """A parallel loop's body is outlined over a range of iterations and run by ember_parallel_for in chunks taken
    from a shared counter (balanced as it runs), not an OpenMP static schedule; the nested one runs serially."""
    A, B, C = matmul()
    s = te.create_schedule(C)
    s[C].parallel(C.op.axis[0])
    s[C].parallel(C.op.axis[1])
    src = source_of(s, [A, B, C], "c -threads=2")
    assert "#pragma omp parallel" not in src and "schedule(static)" not in src
    assert "static void default_function_par1(void* ember_arg, int64_t ember_begin, int64_t ember_end) {" in src
    assert "for (int32_t i = (int32_t)ember_begin; i < (int32_t)ember_end; ++i) {" in src
    assert "const float* restrict A = ember_closure->A;" in src and "float* restrict C = ember_closure->C;" in src
    # 16 rows of 16 x 16 stores: at least 4 chunks per thread, so chunks of 2 rows
    assert "ember_parallel_for(default_function_par1, &default_function_par1_closure, 0, 16, 2, 2);" in body_of(src)
    assert "// parallel loop nested in a parallel loop: runs serially" in src


def test_parallel_chunks_carry_enough_work():
    """Small iterations are taken many at a time (a chunk does about CHUNK_WORK stores), large ones one by one."""
    from ember.codegen.c import CHUNK_WORK

    X = te.placeholder((4096, 4), "float32", name="X")
    Y = te.compute((4096, 4), lambda i, j: X[i, j] + 1.0, name="Y")
    s = te.create_schedule(Y)
    s[Y].parallel(Y.op.axis[0])
    src = body_of(source_of(s, [X, Y], "c -threads=2"))
    assert f", 0, 4096, {CHUNK_WORK // 4}, 2);" in src
    A, B, C = matmul(m=4, n=512, k=512)
    s = te.create_schedule(C)
    s[C].parallel(C.op.axis[0])
    assert ", 0, 4, 1, 0);" in body_of(source_of(s, [A, B, C]))  # no -threads: the library's count (0)


@pytest.mark.parametrize("dt, lanes, c_type", [("float32", 8, "float"), ("float64", 4, "double"),
                                               ("int8", 16, "int8_t"), ("int32", 8, "int32_t")])  # fmt: skip
def test_vectorized_loop_uses_gcc_vector_types(dt, lanes, c_type):
    X = te.placeholder((4, lanes), dt, name="X")
    Y = te.compute((4, lanes), lambda i, j: X[i, j] * X[i, j], name="Y")
    s = te.create_schedule(Y)
    s[Y].vectorize(Y.op.axis[1])
    src = source_of(s, [X, Y])
    vec = f"{dt}x{lanes}"
    itemsize = np.dtype(dt).itemsize
    assert f"typedef {c_type} {vec} __attribute__((vector_size({itemsize * lanes})));" in src
    load = f"ember_vload_{vec}(&X[i * {lanes}])"
    assert f"ember_vstore_{vec}(&Y[i * {lanes}], {load} * {load});" in src


def test_helpers_and_typedefs_are_emitted_only_when_used():
    X = te.placeholder((4,), name="X")
    Y = te.compute((4,), lambda i: X[i] + 1.0, name="Y")
    src = source_of(te.create_schedule(Y), [X, Y])
    assert "typedef" not in src and "static inline" not in src


def test_local_buffers_with_constant_offsets_live_in_registers():
    A, B, C = matmul()
    s = te.create_schedule(C)
    CL = s.cache_write(C, "local")
    _, jo, ii, ji = s[C].tile(C.op.axis[0], C.op.axis[1], 4, 8)
    s[C].unroll(ii)
    s[C].vectorize(ji)
    s[CL].compute_at(s[C], jo)
    i, j = CL.op.axis
    s[CL].reorder(CL.op.reduce_axis[0], i, j)
    s[CL].vectorize(j)
    s[CL].unroll(i)
    src = source_of(s, [A, B, C])
    for slot in (0, 8, 16, 24):
        assert f"float32x8 C_local_{slot};" in src
    assert "float C_local[" not in src


def test_small_local_arrays_are_aligned_on_the_stack_and_big_ones_on_the_heap(check_build, rng):
    def two_stage(n: int):
        X = te.placeholder((n,), name="X")
        T = te.compute((n,), lambda i: X[i] * 2.0, name="T")
        Y = te.compute((n,), lambda i: T[i] + 1.0, name="Y")
        return X, Y

    X, Y = two_stage(100)
    f = check_build(te.create_schedule(Y), [X, Y], lambda x: x * 2 + 1, rng)
    assert "float T[100] __attribute__((aligned(64)));" in f.source
    X, Y = two_stage(20000)  # 80 kB: more than the stack limit
    f = check_build(te.create_schedule(Y), [X, Y], lambda x: x * 2 + 1, rng)
    assert "float* restrict T = (float*)ember_scratch_alloc(80000);" in f.source
    assert "ember_scratch_free(T);" in f.source


def test_heap_buffers_are_reused_across_calls_and_threads():
    """Heap buffers come from the library's scratch slots (kept between calls, not paged in again each call): a
    module run from several threads at once, more of them than it keeps slots for, stays correct."""
    X = te.placeholder((30000,), name="X")
    T = te.compute(X.shape, lambda i: X[i] * 2.0, name="T")
    Y = te.compute(X.shape, lambda i: T[i] + 1.0, name="Y")
    f = ember.build(te.create_schedule(Y), [X, Y], target="c")
    assert "ember_scratch_alloc(" in f.source
    errors = []

    def run(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(40):
            x = rng.standard_normal(30000).astype(np.float32)
            y = np.empty_like(x)
            f(x, y)
            if not np.array_equal(y, x * 2 + 1):
                errors.append(seed)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_big_shapes_use_64_bit_indices():
    X = te.placeholder((1 << 16, 1 << 16), "int8", name="X")
    Y = te.compute((1 << 16, 1 << 16), lambda i, j: X[i, j] + X[i, j], name="Y")
    src = source_of(te.create_schedule(Y), [X, Y])
    assert "for (int64_t i = ((int64_t)0LL); i < ((int64_t)65536LL); ++i) {" in src


def test_thread_binding_needs_a_gpu_target():
    X = te.placeholder((8,), name="X")
    Y = te.compute((8,), lambda i: X[i] + 1.0, name="Y")
    s = te.create_schedule(Y)
    s[Y].bind(Y.op.axis[0], "threadIdx.x")
    with pytest.raises(Exception, match="loop 'i' is bound to threadIdx.x, which needs a GPU target"):
        source_of(s, [X, Y])


# -- toolchain --------------------------------------------------------------------------------------


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch) -> Path:
    """An empty compile cache for this test only (the tests below look at what the cache holds)."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def unique_source(tag: str) -> str:
    return f"int ember_test_{tag}(void) {{ return {abs(hash(tag)) % 1000}; }}\n"


def leftovers(cache: Path) -> list[Path]:
    """Anything in the cache that is not a finished entry (a temp dir of an interrupted or failed build)."""
    return [p for p in cache.glob("*/*") if not (p / "kernel.so").exists()]


def test_the_source_is_kept_beside_the_library(fresh_cache, check_build, rng):
    A, B, C = matmul(5, 6, 7)
    f = check_build(te.create_schedule(C), [A, B, C], lambda a, b: a @ b, rng)
    assert f.lib_path.parent.parent.parent == fresh_cache
    assert (f.lib_path.parent / "kernel.c").read_text() == f.source


def test_a_second_build_reuses_the_cached_library_without_compiling(fresh_cache, monkeypatch, rng):
    A, B, C = matmul(5, 6, 7)
    s = te.create_schedule(C)
    first = ember.build(s, [A, B, C])
    stamp = first.lib_path.stat().st_mtime_ns

    def no_compiler(*args, **kw):
        raise AssertionError(f"the compiler ran again: {args}")

    monkeypatch.setattr(toolchain.subprocess, "run", no_compiler)
    second = ember.build(s, [A, B, C])
    assert second.lib_path == first.lib_path
    assert second.lib_path.stat().st_mtime_ns == stamp
    a, b = rng.standard_normal((5, 7)).astype(np.float32), rng.standard_normal((7, 6)).astype(np.float32)
    c = np.zeros((5, 6), np.float32)
    second(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-5)


def test_different_flags_make_different_entries(fresh_cache):
    src = unique_source("flags")
    lib_o3 = toolchain.compile_c(src, Target.parse("c").cflags())
    lib_o1 = toolchain.compile_c(src, Target.parse("c -O1").cflags())
    assert lib_o3 != lib_o1 and lib_o3.exists() and lib_o1.exists()


def test_a_failed_compile_leaves_no_entry_and_no_temporary_files(fresh_cache):
    with pytest.raises(toolchain.CompileError, match="failed on .*kernel.c") as err:
        toolchain.compile_c("int broken( {\n", Target.parse("c").cflags())
    assert not list(fresh_cache.glob("*/*")), "no cache entry (finished or not) may be left"
    kept = Path(str(err.value).split("failed on ")[1].split(":")[0])
    assert kept.read_text() == "int broken( {\n", "the failing source is kept for reading"


def test_concurrent_builds_of_one_source_agree_and_leave_no_temporary_dirs(fresh_cache):
    src = unique_source("race")
    flags = Target.parse("c").cflags()
    results: list[Path | BaseException] = []

    def build():
        try:
            results.append(toolchain.compile_c(src, flags))
        except BaseException as e:  # noqa: BLE001 - reported below
            results.append(e)

    threads = [threading.Thread(target=build) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(r, Path) for r in results), results
    assert len(set(results)) == 1
    assert leftovers(fresh_cache) == []
    assert sorted(p.name for p in results[0].parent.iterdir()) == ["kernel.c", "kernel.so"]


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "x"))
    assert toolchain.cache_dir() == tmp_path / "x"
    monkeypatch.delenv("EMBER_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert toolchain.cache_dir() == tmp_path / "xdg" / "ember"


def test_target_flags():
    flags = Target.parse("c -mcpu=znver3 -O2 -cflag=-ffast-math").cflags()
    assert flags[:2] == ["-O2", "-march=znver3"]
    assert "-fopenmp" in flags and flags[-1] == "-ffast-math"
    assert str(Target.parse("c -threads=2 -O1")) == "c -threads=2 -O1"
    with pytest.raises(ValueError, match="unknown target 'fortran'"):
        Target.parse("fortran")
    with pytest.raises(ValueError, match="-threads needs a positive integer"):
        Target.parse("c -threads=0")


def test_openmp_thread_count_can_be_set_at_run_time(check_build, rng):
    A, B, C = matmul(9, 7, 5)
    s = te.create_schedule(C)
    s[C].parallel(C.op.axis[0])
    f = check_build(s, [A, B, C], lambda a, b: a @ b, rng)
    f.set_num_threads(1)
    check_build(s, [A, B, C], lambda a, b: a @ b, rng)
    f.set_num_threads(os.cpu_count() or 1)


def test_parallel_regions_do_not_lose_stores():
    """Regression: GCC 12's predictive commoning at -O3 made each thread write back stale values to rows of the
    other thread (one call in a few hundred left a NaN here); Target.cflags turns it off."""
    A, B, C = matmul(8, 7, 7)
    s = te.create_schedule(C)
    io, ii = s[C].split(C.op.axis[0], 2)
    s[C].reorder(C.op.reduce_axis[0], C.op.axis[1], ii, io)
    s[C].unroll(C.op.axis[1])
    s[C].parallel(ii)
    f = ember.build(s, [A, B, C], target="c -threads=2")
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((8, 7)).astype(np.float32), rng.standard_normal((7, 7)).astype(np.float32)
    c = np.empty((8, 7), np.float32)
    calls = lost = 0
    stop = time.monotonic() + 2.0  # about 3000 calls on an idle machine, fewer when the cores are shared
    while calls < 3000 and time.monotonic() < stop:
        c.fill(np.nan)
        f(a, b, c)
        calls += 1
        lost += int(np.isnan(c).any())
    assert lost == 0, f"{lost} of {calls} calls lost stores"
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("lanes", [4, 8, 16])
def test_inline_vector_exp_matches_numpy(lanes):
    """exp of float32 vectors is the inline helper (no libmvec call, no table in memory): within 2 ulp of exp in float64
    over the normal range, results below FLT_MIN flushed to 0 (a subnormal result costs a microcode assist),
    exp(-inf) = 0, exp(x > ln FLT_MAX) = inf, NaN stays NaN, and the masked scores of a softmax (-1e4) are 0."""
    n = 4096
    A = te.placeholder((n,), "float32", name="A")
    C = te.compute((n,), lambda i: te.exp(A[i]), name="C")
    s = te.create_schedule(C)
    _, vi = s[C].split(C.op.axis[0], lanes)
    s[C].vectorize(vi)
    f = ember.build(s, [A, C], target="c")
    assert f"ember_exp_float32x{lanes}" in f.source and "_ZGV" not in f.source and "ember_exp2_table" not in f.source
    rng = np.random.default_rng(lanes)
    a = np.concatenate([rng.uniform(-110, 90, n - 1024), rng.standard_normal(1024) * 2]).astype(np.float32)
    a[:14] = [-1e4, -104.0, -103.9, -100.0, -87.4, -87.3, -np.inf, np.nan, 88.0, 88.72, 88.73, np.inf, -87.3365,
              -87.3366]
    c = np.zeros(n, np.float32)
    f(a, c)
    with np.errstate(over="ignore"):
        want = np.exp(a.astype(np.float64))
    assert c[0] == 0 and c[6] == 0 and np.isnan(c[7]) and np.isinf(c[10]) and np.isinf(c[11])
    assert np.isfinite(c[9]) and c[9] > 3e38
    tiny = np.finfo(np.float32).tiny
    assert np.all(c[want < tiny] == 0) and c[12] >= tiny and c[13] == 0
    ok = np.isfinite(want) & (want < np.finfo(np.float32).max) & (want >= tiny)
    ulp = np.spacing(want[ok].astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(c[ok] - want[ok]) / ulp) <= 2.0


@pytest.mark.parametrize("dt,lanes", [("int32", 16), ("uint8", 16), ("int8", 16), ("uint8", 8), ("int16", 8),
                                      ("uint16", 32)])  # fmt: skip
def test_vector_integer_min_max_are_one_instruction(dt, lanes):
    """Integer vector min/max (the int8 kernels' clamps, int8 max pools) of one x86 register, or of 64 bits in the
    low half of one, are the instruction itself (GCC splits a 16-lane int32 loop in 256-bit halves on AVX-512 and
    compiles 8 bytes in general-purpose registers); elsewhere per-lane helpers, which the C compiler vectorizes.
    Equal to numpy's on random values."""
    from ember.target import Target

    n = 64
    A = te.placeholder((n,), dt, name="A")
    B = te.placeholder((n,), dt, name="B")
    C = te.compute((n,), lambda i: te.minimum(te.maximum(A[i], B[i]), te.const(100, dt)), name="C")
    s = te.create_schedule(C)
    _, vi = s[C].split(C.op.axis[0], lanes)
    s[C].vectorize(vi)
    f = ember.build(s, [A, B, C], target="c")
    bits, flags = np.dtype(dt).itemsize * 8, Target.parse("c").simd_features()
    width = bits * lanes
    need = {512: "avx512bw" if bits < 32 else "avx512f", 256: "avx2"}.get(width, "avx")
    sign = "u" if dt.startswith("u") else "i"
    if need in flags:
        assert f"ember_x86_max_{dt}x{lanes}(" in f.source and f"_max_ep{sign}{bits}" in f.source
    else:
        assert f"static inline {dt}x{lanes} ember_max_{dt}x{lanes}({dt}x{lanes} a, {dt}x{lanes} b) {{ {dt}x" in f.source
    info = np.iinfo(dt)
    rng = np.random.default_rng(3)
    a, b = (rng.integers(info.min, info.max, n, endpoint=True).astype(dt) for _ in range(2))
    c = np.zeros(n, dt)
    f(a, b, c)
    np.testing.assert_array_equal(c, np.minimum(np.maximum(a, b), np.array(100, dt)))


def test_parallel_loop_with_little_work_runs_serially():
    """A loop of fewer than PARALLEL_MIN_WORK stores in all is not split: a region costs more than it saves."""
    from ember.codegen.c import PARALLEL_MIN_WORK

    X = te.placeholder((16, 16), "float32", name="X")
    Y = te.compute((16, 16), lambda i, j: X[i, j] * 2.0, name="Y")
    s = te.create_schedule(Y)
    s[Y].parallel(Y.op.axis[0])
    assert PARALLEL_MIN_WORK > 16 * 16
    src = body_of(source_of(s, [X, Y], "c -threads=2"))
    assert "ember_parallel_for(" not in src and "runs serially" in src
    f = ember.build(s, [X, Y], target="c -threads=2")
    x = np.random.default_rng(3).standard_normal((16, 16), np.float32)
    y = np.empty_like(x)
    f(x, y)
    np.testing.assert_array_equal(y, x * np.float32(2))


@pytest.mark.parametrize("form", ["x < y ? y : x", "x < y ? x : y", "x > y ? x : y", "x > y ? y : x"])
@pytest.mark.parametrize("lanes", [8, 16])
def test_select_of_a_comparison_is_one_min_or_max(form, lanes):
    """A float vector select choosing one operand of its own comparison (the softmax's row max) is one
    vmaxps/vminps on x86 (operands ordered so that a false comparison, equal or NaN, gives the select's false
    arm), exactly numpy's np.where of the same comparison: NaN, signed zeros and equal values included."""
    from ember.target import Target

    n = 64
    X = te.placeholder((n,), "float32", name="X")
    Y = te.placeholder((n,), "float32", name="Y")
    pick = {
        "x < y ? y : x": lambda x, y: te.if_then_else(x < y, y, x),
        "x < y ? x : y": lambda x, y: te.if_then_else(x < y, x, y),
        "x > y ? x : y": lambda x, y: te.if_then_else(x > y, x, y),
        "x > y ? y : x": lambda x, y: te.if_then_else(x > y, y, x),
    }[form]
    C = te.compute((n,), lambda i: pick(X[i], Y[i]), name="C")
    s = te.create_schedule(C)
    s[C].vectorize(s[C].split(C.op.axis[0], lanes)[1])
    f = ember.build(s, [X, Y, C], target="c")
    flags = Target.parse("c").simd_features()
    if (lanes == 16 and "avx512f" in flags) or (lanes == 8 and "avx" in flags):
        w = "512" if lanes == 16 else "256"
        assert f"_mm{w}_max_ps" in f.source or f"_mm{w}_min_ps" in f.source
    rng = np.random.default_rng(lanes)
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    x[:6], y[:6] = [np.nan, 1.0, np.nan, 0.0, -0.0, 2.0], [1.0, np.nan, np.nan, -0.0, 0.0, 2.0]
    y[10:20] = x[10:20]
    c = np.zeros(n, np.float32)
    f(x, y, c)
    cmp = x < y if "<" in form else x > y
    want = np.where(cmp, y, x) if form.endswith("y : x") else np.where(cmp, x, y)
    np.testing.assert_array_equal(c, want)
    assert np.array_equal(np.signbit(c), np.signbit(want))
