"""GPU targets: the host/device split, OpenCL kernels run on whatever OpenCL platform is installed (PoCL on the
CPU in CI), CUDA kernels compiled by nvcc (run only where a CUDA GPU is present).

Every numeric test compares with numpy; the schedules are the classic GPU ones: elementwise over
blockIdx/threadIdx, a matmul tiled through shared memory with register accumulators, a row reduction, a
softmax of four kernels with device temporaries.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import nvcc_missing, opencl_missing

import ember
from ember import te
from ember.codegen.c import CodegenError
from ember.codegen.gpu import split_host_device

OPENCL_MISSING = opencl_missing()
needs_opencl = pytest.mark.skipif(OPENCL_MISSING is not None, reason=f"no OpenCL platform: {OPENCL_MISSING}")


NVCC_MISSING = nvcc_missing()
needs_nvcc = pytest.mark.skipif(NVCC_MISSING is not None, reason=NVCC_MISSING or "")


# -- schedules -----------------------------------------------------------------------------------


def elementwise(n: int = 1000, block: int = 64):
    A = te.placeholder((n,), name="A")
    B = te.placeholder((n,), name="B")
    C = te.compute((n,), lambda i: te.exp(A[i]) * 0.5 + te.max(B[i], 0.0), name="C")
    s = te.create_schedule(C)
    bx, tx = s[C].split(C.op.axis[0], block)
    s[C].bind(bx, "blockIdx.x")
    s[C].bind(tx, "threadIdx.x")
    return s, [A, B, C], lambda a, b: np.exp(a) * 0.5 + np.maximum(b, 0)


def tiled_matmul(M: int = 70, N: int = 52, K: int = 45, T: int = 16):
    """C = A @ B: 16x16 blocks of threads, one output per thread, A and B tiles loaded cooperatively into
    shared memory for each step of the reduction (with tails: no size is a multiple of the tile)."""
    A = te.placeholder((M, K), name="A")
    B = te.placeholder((K, N), name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    s = te.create_schedule(C)
    AS = s.cache_read(A, "shared", [C])
    BS = s.cache_read(B, "shared", [C])
    CL = s.cache_write(C, "local")
    i, j = s[C].op.axis
    bi, ti = s[C].split(i, T)
    bj, tj = s[C].split(j, T)
    s[C].reorder(bi, bj, ti, tj)
    s[C].bind(bi, "blockIdx.y")
    s[C].bind(bj, "blockIdx.x")
    s[C].bind(ti, "threadIdx.y")
    s[C].bind(tj, "threadIdx.x")
    s[CL].compute_at(s[C], tj)
    ko, _ = s[CL].split(s[CL].op.reduce_axis[0], T)
    for X in (AS, BS):
        s[X].compute_at(s[CL], ko)
        a0, a1 = s[X].op.axis
        s[X].bind(a0, "threadIdx.y")
        s[X].bind(a1, "threadIdx.x")
    return s, [A, B, C], lambda a, b: a @ b


def row_sum(m: int = 100, n: int = 37):
    A = te.placeholder((m, n), name="A")
    k = te.reduce_axis((0, n), name="k")
    B = te.compute((m,), lambda i: te.sum(A[i, k] * A[i, k], axis=k), name="B")
    s = te.create_schedule(B)
    bx, tx = s[B].split(B.op.axis[0], 32)
    s[B].bind(bx, "blockIdx.x")
    s[B].bind(tx, "threadIdx.x")
    return s, [A, B], lambda a: (a * a).sum(axis=1)


def softmax(m: int = 33, n: int = 20):
    X = te.placeholder((m, n), name="X")
    k1 = te.reduce_axis((0, n), name="k1")
    mx = te.compute((m,), lambda i: te.max(X[i, k1], axis=k1), name="mx")
    E = te.compute((m, n), lambda i, j: te.exp(X[i, j] - mx[i]), name="E")
    k2 = te.reduce_axis((0, n), name="k2")
    S = te.compute((m,), lambda i: te.sum(E[i, k2], axis=k2), name="S")
    Y = te.compute((m, n), lambda i, j: E[i, j] / S[i], name="Y")
    s = te.create_schedule(Y)
    for T in (mx, S):
        bx, tx = s[T].split(T.op.axis[0], 16)
        s[T].bind(bx, "blockIdx.x")
        s[T].bind(tx, "threadIdx.x")
    for T in (E, Y):
        s[T].bind(T.op.axis[0], "blockIdx.x")
        s[T].bind(T.op.axis[1], "threadIdx.x")

    def ref(x):
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    return s, [X, Y], ref


CASES = {"elementwise": elementwise, "tiled_matmul": tiled_matmul, "row_sum": row_sum, "softmax": softmax}


def run_and_compare(f, args, ref, rng):
    ins = [rng.standard_normal([int(x) for x in a.shape]).astype(a.dtype.name) for a in args[:-1]]
    out = np.full([int(x) for x in args[-1].shape], np.nan, np.float32)
    f(*ins, out)
    np.testing.assert_allclose(out, ref(*ins), rtol=1e-4, atol=1e-4)


# -- the host/device split -----------------------------------------------------------------------


def test_launch_configuration_comes_from_the_bound_extents():
    s, args, _ = tiled_matmul(70, 52, 45)
    prog = split_host_device(ember.lower(s, args, gpu=True))
    (k,) = prog.kernels
    assert k.grid == (4, 5, 1) and k.block == (16, 16, 1)
    assert [p.name for p in k.params] == ["A", "B", "C"]


def test_shared_tiles_cover_the_block_and_are_hoisted_with_barriers():
    s, args, _ = tiled_matmul(64, 64, 64)
    prog = split_host_device(ember.lower(s, args, gpu=True))
    body = str(prog.kernels[0].body)
    assert "A.shared = alloc float32[16, 16], shared" in body
    assert body.index("alloc") < body.index("blockIdx")  # hoisted to the top of the kernel
    # one barrier after the cooperative loads, one before the next step overwrites the tiles
    assert body.count("gpu.barrier") == 2, body


def test_each_root_stage_is_a_kernel_and_intermediates_are_device_temporaries():
    s, args, _ = softmax()
    prog = split_host_device(ember.lower(s, args, gpu=True))
    assert len(prog.kernels) == 4  # mx, E, S, Y
    assert {t.name for t in prog.temps} == {"mx", "E", "S"}
    assert "launch" in str(prog)


def test_unbound_loops_are_refused_with_the_stage_named():
    A = te.placeholder((8, 8), name="A")
    B = te.compute((8, 8), lambda i, j: A[i, j] + 1.0, name="B")
    s = te.create_schedule(B)
    with pytest.raises(CodegenError, match=r"loop 'i' \(writing B\) is not bound to a GPU thread axis"):
        split_host_device(ember.lower(s, [A, B], gpu=True))
    prog = split_host_device(ember.lower(s, [A, B], gpu=True), allow_serial=True)
    assert prog.kernels[0].grid == (1, 1, 1) and prog.kernels[0].block == (1, 1, 1)


def test_a_loop_shorter_than_the_launch_runs_under_a_guard():
    A = te.placeholder((64, 8), name="A")
    B = te.compute((64, 8), lambda i, j: A[i, j] * 2.0, name="B")
    C = te.compute((64,), lambda i: B[i, 3] + 1.0, name="C")
    s = te.create_schedule([B, C])
    s[B].bind(B.op.axis[1], "threadIdx.x")
    s[B].bind(B.op.axis[0], "blockIdx.x")
    bx, tx = s[C].split(C.op.axis[0], 32)
    s[C].bind(bx, "blockIdx.x")
    s[C].bind(tx, "threadIdx.x")
    prog = split_host_device(ember.lower(s, [A, B, C], gpu=True))
    assert [k.block for k in prog.kernels] == [(8, 1, 1), (32, 1, 1)]


def test_vectorized_loops_become_unrolled_scalar_loops_on_gpus():
    A = te.placeholder((64,), name="A")
    B = te.compute((64,), lambda i: A[i] + 1.0, name="B")
    s = te.create_schedule(B)
    bx, tx = s[B].split(B.op.axis[0], 4)
    s[B].bind(bx, "blockIdx.x")
    s[B].vectorize(tx)
    assert "Ramp" not in str(ember.lower(s, [A, B], gpu=True)) and "x4" not in str(ember.lower(s, [A, B], gpu=True))


# -- OpenCL --------------------------------------------------------------------------------------


@needs_opencl
@pytest.mark.parametrize("case", list(CASES))
def test_opencl_matches_numpy(case, rng):
    s, args, ref = CASES[case]()
    f = ember.build(s, args, target="opencl")
    assert "__kernel" in f.source
    run_and_compare(f, args, ref, rng)


@needs_opencl
def test_opencl_shared_memory_is_local_with_barriers(rng):
    s, args, ref = tiled_matmul()
    f = ember.build(s, args, target="opencl")
    assert "__local float A_shared[256];" in f.source
    assert "barrier(CLK_LOCAL_MEM_FENCE)" in f.source
    run_and_compare(f, args, ref, rng)


@needs_opencl
def test_opencl_float64_int_and_bool(rng):
    A = te.placeholder((50,), "float64", name="A")
    I = te.placeholder((50,), "int32", name="I")
    M = te.compute((50,), lambda i: A[i] > 0.0, name="M")
    B = te.compute((50,), lambda i: te.if_then_else(M[i], A[i] * 2.0, te.sqrt(te.abs(A[i]))) + I[i] // 3, name="B")
    s = te.create_schedule([M, B])
    for T in (M, B):
        bx, tx = s[T].split(T.op.axis[0], 16)
        s[T].bind(bx, "blockIdx.x")
        s[T].bind(tx, "threadIdx.x")
    f = ember.build(s, [A, I, M, B], target="opencl")
    a = rng.standard_normal(50)
    i = rng.integers(-20, 20, 50).astype(np.int32)
    m, b = np.zeros(50, bool), np.zeros(50)
    f(a, i, m, b)
    np.testing.assert_array_equal(m, a > 0)
    np.testing.assert_allclose(b, np.where(a > 0, a * 2, np.sqrt(np.abs(a))) + i // 3, rtol=1e-12)


@needs_opencl
def test_opencl_arguments_are_checked():
    s, args, _ = elementwise()
    f = ember.build(s, args, target="opencl")
    with pytest.raises(ValueError, match="shape"):
        f(np.zeros(999, np.float32), np.zeros(1000, np.float32), np.zeros(1000, np.float32))


# -- CUDA ----------------------------------------------------------------------------------------


@needs_nvcc
@pytest.mark.parametrize("case", list(CASES))
def test_generated_cuda_compiles_with_nvcc(case):
    from ember.codegen.cuda import codegen_cuda, compile_cuda

    s, args, _ = CASES[case]()
    prog = split_host_device(ember.lower(s, args, gpu=True))
    src = codegen_cuda(prog, "cuda -arch=sm_90")
    assert 'extern "C" __global__' in src
    ptx = compile_cuda(src, "cuda -arch=sm_90").read_text()
    for k in prog.kernels:
        assert f".entry {k.name}" in ptx


@needs_nvcc
def test_cuda_build_gives_a_module_that_runs_where_a_gpu_is(rng):
    from ember.runtime.cuda import available

    s, args, ref = tiled_matmul()
    f = ember.build(s, args, target="cuda -arch=sm_80")
    assert "__shared__ float A_shared[256];" in f.source and "__syncthreads()" in f.source
    reason = available()
    if reason is not None:
        pytest.skip(f"no CUDA GPU to run on: {reason}")
    run_and_compare(f, args, ref, rng)
