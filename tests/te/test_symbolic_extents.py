"""Kernels with symbolic extents: size variables in te shapes become int64 kernel arguments; one build runs at
every size (split tails guarded, tiles of compute_at stages clamped to the size), checked against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ember
from ember import te
from ember.codegen.c import codegen_c
from ember.graph.dims import size_var
from ember.runtime.module import ArgumentError

SIZES = (0, 1, 7, 8, 33)


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_elementwise_with_tail_vector_and_parallel_loops(target):
    n = te.var("n", "int64")
    A = te.placeholder((n, 4), "float32", name="A")
    B = te.compute((n, 4), lambda i, j: A[i, j] * 2 + 1, name="B")
    s = te.create_schedule(B)
    xo, _ = s[B].split(B.op.axis[0], 8)
    s[B].vectorize(B.op.axis[1])
    s[B].parallel(xo)
    func = ember.lower(s, [A, B])
    assert "parallel((n + 7) // 8)" in str(func) and "if " in str(func)  # the tail is guarded
    assert "int64_t n)" in codegen_c(func)  # the size is an argument after the buffers
    f = ember.build(s, [A, B], target=target)
    rng = np.random.default_rng(0)
    for size in SIZES:
        a = rng.standard_normal((size, 4)).astype(np.float32)
        b = np.full_like(a, np.nan)
        f(a, b)
        np.testing.assert_allclose(b, a * 2 + 1, rtol=1e-6)
    with pytest.raises(ArgumentError, match=r"expected \[n, 4\] = \(3, 4\) with n=3"):
        f(np.zeros((3, 4), np.float32), np.zeros((4, 4), np.float32))


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_tiled_matmul_with_symbolic_rows_and_reduction(target):
    M, K = te.var("M", "int64"), te.var("K", "int64")
    A = te.placeholder((M, K), "float32", name="A")
    B = te.placeholder((K, 24), "float32", name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, 24), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    D = te.compute((M, 24), lambda i, j: te.max(C[i, j], te.const(0, "float32")), name="D")
    s = te.create_schedule(D)
    io, jo, _, ji = s[D].tile(D.op.axis[0], D.op.axis[1], 4, 8)
    s[C].compute_at(s[D], jo)
    s[D].vectorize(ji)
    s[D].parallel(io)
    text = str(ember.lower(s, [A, B, D]))
    assert "alloc float32[4, 8]" in text and "range(min(4, M - i.outer * 4))" in text  # a static tile, rows clamped
    f = ember.build(s, [A, B, D], target=target)
    rng = np.random.default_rng(1)
    for m, kk in ((1, 1), (3, 5), (16, 64), (33, 3)):
        a = rng.standard_normal((m, kk)).astype(np.float32)
        b = rng.standard_normal((kk, 24)).astype(np.float32)
        d = np.full((m, 24), np.nan, np.float32)
        f(a, b, d)
        np.testing.assert_allclose(d, np.maximum(a @ b, 0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_softmax_rows_of_symbolic_length_with_derived_dims(target):
    n = te.var("n", "int64")
    X = te.placeholder((n + 1, n), "float32", name="X")  # a derived dim: n + 1 rows
    k = te.reduce_axis((0, n), name="k")
    mx = te.compute((n + 1,), lambda i: te.max(X[i, k], axis=k), name="mx")
    k2 = te.reduce_axis((0, n), name="k2")
    e = te.compute((n + 1, n), lambda i, j: te.exp(X[i, j] - mx[i]), name="e")
    sm = te.compute((n + 1,), lambda i: te.sum(e[i, k2], axis=k2), name="sm")
    Y = te.compute((n + 1, n), lambda i, j: e[i, j] / sm[i], name="Y")
    s = te.create_schedule(Y)
    f = ember.build(s, [X, Y], target=target)
    rng = np.random.default_rng(2)
    for size in (1, 5, 16):
        x = rng.standard_normal((size + 1, size)).astype(np.float32)
        y = np.zeros_like(x)
        f(x, y)
        ref = np.exp(x - x.max(1, keepdims=True))
        np.testing.assert_allclose(y, ref / ref.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
    with pytest.raises(ArgumentError, match="expected"):
        f(np.zeros((3, 3), np.float32), np.zeros((3, 3), np.float32))  # n = 3 wants 4 rows


def test_symbolic_sizes_are_checked():
    n = te.var("n", "int64")
    with pytest.raises(TypeError, match="integer expression"):
        te.placeholder((te.const(1.5, "float32"),), name="bad")
    A = te.placeholder((n,), "float32", name="A")
    B = te.compute((n,), lambda i: A[i] + 1, name="B")
    with pytest.raises(NotImplementedError, match="c and llvm targets only so far, not 'opencl'"):
        ember.build(te.create_schedule(B), [A, B], target="opencl")


def test_symbolic_tiles_split_into_an_unguarded_main_part_and_a_guarded_tail():
    """The loop partition of a symbolic extent: full tiles [0, n // 4) run unrolled and vectorized with no guard,
    the tail [n // 4, (n + 3) // 4) keeps the guard and stays rolled; every size matches numpy."""
    n = size_var("n", 0, 64)
    A = te.placeholder((n, 16), "float32", name="A")
    B = te.compute((n, 16), lambda i, j: A[i, j] * 3 - 1, name="B")
    s = te.create_schedule(B)
    _, ii = s[B].split(B.op.axis[0], 4)
    s[B].unroll(ii)
    s[B].vectorize(B.op.axis[1])
    text = str(ember.lower(s, [A, B]))
    main, tail = text.split("for i.outer in range(n // 4, ")
    assert "for i.outer in range(n // 4):" in main and "if " not in main and "i.inner" not in main  # unrolled
    assert "for i.inner in range(4):" in tail and "if i.outer * 4 + i.inner - n < 0" in tail
    assert "ember_floordiv_int64" not in codegen_c(ember.lower(s, [A, B]))  # sizes are >= 0: plain division
    f = ember.build(s, [A, B], target="c")
    rng = np.random.default_rng(4)
    for size in (0, 1, 3, 4, 5, 18):
        a = rng.standard_normal((size, 16)).astype(np.float32)
        b = np.full_like(a, np.nan)
        f(a, b)
        np.testing.assert_allclose(b, a * 3 - 1, rtol=1e-6, atol=1e-6)  # the C compiler may fuse a * 3 - 1


def _register_tiled_matmul(tile: int, hi: int = 64):
    """D = A @ B (M x 16, M in [1, hi]) with a `tile` x 16 accumulator computed at each row tile, its loops
    unrolled (a register tile, as the GEMM template's), and the built kernel."""
    M = size_var("M", 1, hi)
    A = te.placeholder((M, 8), "float32", name="A")
    B = te.placeholder((8, 16), "float32", name="B")
    k = te.reduce_axis((0, 8), name="k")
    C = te.compute((M, 16), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    D = te.compute((M, 16), lambda i, j: C[i, j] + 1, name="D")
    s = te.create_schedule(D)
    io, ii = s[D].split(D.op.axis[0], tile)
    s[D].unroll(ii)
    s[D].vectorize(D.op.axis[1])
    CL = s.cache_write(C, "local")
    s[C].compute_inline()
    s[CL].compute_at(s[D], io)
    s[CL].reorder(CL.op.reduce_axis[0], *CL.op.axis)
    s[CL].unroll(CL.op.axis[0])
    s[CL].vectorize(CL.op.axis[1])
    return s, [A, B, D]


def test_symbolic_row_tiles_end_at_the_size_and_the_tail_has_a_variant_per_remainder():
    """The last row tile of a symbolic M starts at its own row and computes min(tile, M - start) rows (not a
    whole tile shifted back over the previous one); after full tiles the tail is one variant per remainder
    `M % tile == r` that computes r rows, below one tile one per size `M == r`. Every size matches numpy."""
    s, args = _register_tiled_matmul(5)
    func = ember.lower(s, args)
    text = str(func)
    assert "min(5, M - i.outer * 5)" in text and "M - 5" not in text
    src = codegen_c(func)
    assert all(f"M % ((int64_t)5LL) == ((int64_t){r}LL)" in src for r in range(1, 5))
    assert all(f"M == ((int64_t){r}LL)" in src for r in range(1, 5))
    # the remainder variant of r rows: r rows of A are read, none of another tile
    variant = src.split("M % ((int64_t)5LL) == ((int64_t)2LL)")[1].split("} else {")[0]
    assert variant.count("ember_bcast_float32x16(A[") == 2  # one row of A per row of the tile (k rolled)
    f = ember.build(s, args, target="c")
    rng = np.random.default_rng(2)
    for m in range(1, 18):
        a, b = rng.standard_normal((m, 8)).astype(np.float32), rng.standard_normal((8, 16)).astype(np.float32)
        d = np.full((m, 16), np.nan, np.float32)
        f(a, b, d)
        np.testing.assert_allclose(d, a @ b + 1, rtol=1e-5, atol=1e-5)


_BUILT: dict[int, object] = {}


@settings(max_examples=25, deadline=None)
@given(tile=st.sampled_from([3, 4, 7]), m=st.integers(1, 40), seed=st.integers(0, 2**31 - 1))
def test_register_tiles_of_a_symbolic_size_match_numpy_at_any_size(tile, m, seed):
    """Property: a register-tiled product over a symbolic M (full tiles, remainder variants, small variants)
    equals numpy's at every size and tile."""
    if tile not in _BUILT:
        s, args = _register_tiled_matmul(tile, hi=40)
        _BUILT[tile] = ember.build(s, args, target="c")
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((m, 8)).astype(np.float32), rng.standard_normal((8, 16)).astype(np.float32)
    d = np.full((m, 16), np.nan, np.float32)
    _BUILT[tile](a, b, d)
    np.testing.assert_allclose(d, a @ b + 1, rtol=1e-5, atol=1e-5)
