"""tensorize and the dot_u8s8 intrinsic (`ember.te.intrin`): an int8 GEMM whose reduction is one micro-kernel call.

Each case builds uint8 x int8 -> int32 products on fresh random integers and compares them with numpy's int64
product exactly: the AVX-512 VNNI, AVX2 and portable C implementations (by target), a property test over random
legal schedules around the tensorized loop, and the errors for nests the intrinsic cannot take."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ember
from ember import te
from ember.target import Target, host_cpu_flags
from ember.te.intrin import INTRINSICS, TensorizeError, dot_u8s8_isa


def gemm(m: int, n: int, k: int, nb: int):
    a = te.placeholder((m, k), "uint8", name="A")
    b = te.placeholder((n // nb, k // 4, nb, 4), "int8", name="B")
    k4 = te.reduce_axis((0, k // 4), name="k4")
    kk = te.reduce_axis((0, 4), name="kk")
    c = te.compute((m, n), lambda i, j: te.sum(te.cast(a[i, k4 * 4 + kk], "int32")
                                               * te.cast(b[j // nb, k4, j % nb, kk], "int32"), axis=[k4, kk]),
                   name="C")  # fmt: skip
    return a, b, c


def operands(m: int, n: int, k: int, nb: int, seed: int):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, (m, k)).astype(np.uint8)
    b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    packed = np.ascontiguousarray(b.reshape(k // 4, 4, n // nb, nb).transpose(2, 0, 3, 1))
    return a, b, packed


def run(s, tensors, m, n, k, nb, target="c", seed=0):
    f = ember.build(s, list(tensors), target=target)
    a, b, packed = operands(m, n, k, nb, seed)
    c = np.zeros((m, n), np.int32)
    f(a, packed, c)
    np.testing.assert_array_equal(c, a.astype(np.int64) @ b.astype(np.int64))
    return f


def tiled(m, n, k, mr, nb):
    A, B, C = gemm(m, n, k, nb)
    return tensorized(C, mr, nb, "dot_u8s8", rows_outer=False), (A, B, C)


def tensorized(C, mr: int, nb: int, intrin: str, rows_outer: bool):
    """C's rows split by `mr`, columns by `nb`, the 4-wide reduction tile under the (mr x nb) tile done by `intrin`."""
    s = te.create_schedule(C)
    i, j = C.op.axis
    k4, kk = C.op.reduce_axis
    io, ii = s[C].split(i, mr)
    jo, ji = s[C].split(j, nb)
    s[C].reorder(*((io, jo) if rows_outer else (jo, io)), k4, ii, ji, kk)
    s[C].tensorize(k4, intrin)
    return s


@pytest.mark.parametrize("target, isa", [("c", None), ("c -mcpu=haswell", "avx2"), ("c -mcpu=x86-64", "c")])
@pytest.mark.parametrize("mr, nb", [(4, 32), (7, 16), (1, 64), (3, 8)])
def test_dot_u8s8_implementations(target, isa, mr, nb):
    if isa is not None and isa != "c" and isa not in host_cpu_flags():
        pytest.skip(f"this CPU has no {isa}")
    m, n, k = 2 * mr, 2 * nb, 24
    s, t = tiled(m, n, k, mr, nb)
    f = run(s, t, m, n, k, nb, target)
    want = dot_u8s8_isa(Target.parse(target).simd_features(), nb)
    assert f"ember_dot_u8s8_{mr}x{nb}_{want}(" in f.source  # one call per tile, readable in the C


def gemm_s8u8(m: int, n: int, k: int):
    """C = A (int8, rows) . B (uint8, packed [k / 4, n, 4]): the weights-times-activations form."""
    a = te.placeholder((m, k), "int8", name="A")
    b = te.placeholder((k // 4, n, 4), "uint8", name="B")
    k4 = te.reduce_axis((0, k // 4), name="k4")
    kk = te.reduce_axis((0, 4), name="kk")
    c = te.compute((m, n), lambda i, j: te.sum(te.cast(a[i, k4 * 4 + kk], "int32") * te.cast(b[k4, j, kk], "int32"),
                                               axis=[k4, kk]), name="C")  # fmt: skip
    return a, b, c


@pytest.mark.parametrize("target, isa", [("c", None), ("c -mcpu=haswell", "avx2"), ("c -mcpu=x86-64", "c")])
@pytest.mark.parametrize("mr, nb", [(4, 32), (4, 112), (8, 16), (3, 8), (4, 49), (2, 98)])
def test_dot_s8u8_implementations(target, isa, mr, nb):
    """int8 rows broadcast against uint8 columns, extremes included (-128 * 255 summed over K); column counts that
    16 does not divide (VNNI: the last vector masked)."""
    if isa is not None and isa != "c" and isa not in host_cpu_flags():
        pytest.skip(f"this CPU has no {isa}")
    m, n, k = 2 * mr, 2 * nb, 40
    A, B, C = gemm_s8u8(m, n, k)
    s = tensorized(C, mr, nb, "dot_s8u8", rows_outer=True)
    f = ember.build(s, [A, B, C], target=target)
    want = dot_u8s8_isa(Target.parse(target).simd_features(), nb, True)
    assert f"ember_dot_s8u8_{mr}x{nb}_{want}(" in f.source
    rng = np.random.default_rng(mr * nb)
    for a, b in ((rng.integers(-128, 128, (m, k)), rng.integers(0, 256, (k, n))),
                 (np.full((m, k), -128), np.full((k, n), 255))):  # fmt: skip
        a, b = a.astype(np.int8), b.astype(np.uint8)
        c = np.zeros((m, n), np.int32)
        f(a, np.ascontiguousarray(b.reshape(k // 4, 4, n).transpose(0, 2, 1)), c)
        np.testing.assert_array_equal(c, a.astype(np.int64) @ b.astype(np.int64))


@pytest.mark.parametrize("mr, nb", [(32, 32), (16, 48), (16, 16)])
@pytest.mark.parametrize("k", [128, 72])
@pytest.mark.parametrize("signed_rows", [False, True])
def test_amx_tiles(mr, nb, k, signed_rows):
    """Tiles of whole 16 x 16 blocks run on AMX's tile registers where the CPU has amx_int8 (`amx_tiles`): the
    exact product, extremes included, for K a multiple of 64 bytes (tiles) and not (the vpdpbusd kernel, by
    blocks of 8 rows); the same tile without AMX (-mattr=-amx-int8) calls the vpdpbusd kernel."""
    if "amx_int8" not in host_cpu_flags():
        pytest.skip("this CPU has no AMX")
    m, n = 2 * mr, 2 * nb
    A, B, C = gemm_s8u8(m, n, k) if signed_rows else gemm(m, n, k, nb)
    intrin = "dot_s8u8" if signed_rows else "dot_u8s8"
    tag = "s8u8" if signed_rows else "u8s8"
    rng = np.random.default_rng(mr + nb + k)
    lo, hi = (-128, 128) if signed_rows else (0, 256)
    for target in ("c", "c -mattr=-amx-int8"):
        s = tensorized(C, mr, nb, intrin, rows_outer=signed_rows)
        f = ember.build(s, [A, B, C], target=target)
        assert (f"ember_dot_{tag}_{mr}x{nb}_amx(" in f.source) == (target == "c")
        for a, b in ((rng.integers(lo, hi, (m, k)), rng.integers(-128 if not signed_rows else 0, 128 if not
                      signed_rows else 256, (k, n))),
                     (np.full((m, k), hi - 1), np.full((k, n), -128 if not signed_rows else 255))):  # fmt: skip
            a, b = a.astype(np.int8 if signed_rows else np.uint8), b.astype(np.uint8 if signed_rows else np.int8)
            if signed_rows:
                packed = np.ascontiguousarray(b.reshape(k // 4, 4, n).transpose(0, 2, 1))
            else:
                packed = np.ascontiguousarray(b.reshape(k // 4, 4, n // nb, nb).transpose(2, 0, 3, 1))
            c = np.zeros((m, n), np.int32)
            f(a, packed, c)
            np.testing.assert_array_equal(c, a.astype(np.int64) @ b.astype(np.int64))


def test_tensorize_in_the_loop_ir():
    s, t = tiled(8, 32, 16, 4, 32)
    text = str(ember.lower(s, list(t)))
    assert "dot_u8s8(address_of(C[" in text and "k4" not in text.split("dot_u8s8")[1].split("\n")[0]


def test_vnni_saturation_free():
    """Extremes: 255 * -128 summed over K; AVX2's vpmaddubsw would saturate the pair sums, the kernels must not."""
    m, n, k, nb = 4, 32, 64, 32
    s, t = tiled(m, n, k, m, nb)
    for target in ("c", "c -mcpu=haswell"):
        f = ember.build(s, list(t), target=target)
        a = np.full((m, k), 255, np.uint8)
        b = np.full((k, n), -128, np.int8)
        b[:, ::2] = 127
        packed = np.ascontiguousarray(b.reshape(k // 4, 4, 1, nb).transpose(2, 0, 3, 1))
        c = np.zeros((m, n), np.int32)
        f(a, packed, c)
        np.testing.assert_array_equal(c, a.astype(np.int64) @ b.astype(np.int64))


@settings(max_examples=8, deadline=None)
@given(
    mr=st.integers(1, 7), nb=st.sampled_from([8, 16, 32, 48, 64]),
    tiles=st.tuples(st.integers(1, 3), st.integers(1, 2)), k4=st.integers(1, 9),
    outer=st.permutations(["jo", "io"]), inner=st.permutations(["ii", "ji"]),
    kk_first=st.booleans(), split_io=st.booleans(), parallel=st.booleans(), cache=st.booleans(),
    seed=st.integers(0, 2**16),
)  # fmt: skip
def test_random_schedules_with_tensorize(mr, nb, tiles, k4, outer, inner, kk_first, split_io, parallel, cache, seed):
    """Random legal schedules of an int8 GEMM around the tensorized micro-kernel compute numpy's integers."""
    m, n, k = mr * tiles[0] * 2, nb * tiles[1], 4 * k4
    A, B, C = gemm(m, n, k, nb)
    s = te.create_schedule(C)
    if cache:
        L = s[s.cache_write(C, "local")]
        O = s[C]
    else:
        L = O = s[C]
    i, j = O.op.axis
    io, ii = O.split(i, mr)
    jo, ji = O.split(j, nb)
    loops = {"io": io, "jo": jo}
    order = [loops[x] for x in outer]
    if split_io:
        ioo, ioi = O.split(io, 2)
        order = [ioo if x is io else x for x in order] + [ioi]
    if cache:
        O.reorder(*order, ii, ji)
        li, lj = L.op.axis
        k4_, kk_ = L.op.reduce_axis
        region = {"ii": li, "ji": lj}
        L.reorder(*(k4_, kk_)[:: -1 if kk_first else 1], *[region[x] for x in inner])
        L.tensorize(kk_ if kk_first else k4_, "dot_u8s8")
        L.compute_at(O, order[-1])
    else:
        k4_, kk_ = O.op.reduce_axis
        region = {"ii": ii, "ji": ji}
        O.reorder(*order, *(k4_, kk_)[:: -1 if kk_first else 1], *[region[x] for x in inner])
        O.tensorize(kk_ if kk_first else k4_, "dot_u8s8")
    if parallel:
        O.parallel(order[0])
    run(s, (A, B, C), m, n, k, nb, "c -threads=2", seed)


def test_tensorize_errors():
    A, B, C = gemm(8, 32, 16, 32)
    s = te.create_schedule(C)
    with pytest.raises(te.ScheduleError, match="unknown intrinsic 'dot_s8s8'"):
        s[C].tensorize(C.op.reduce_axis[0], "dot_s8s8")
    i, j = C.op.axis
    s[C].tensorize(i, "dot_u8s8")  # the whole nest, init included: not one update
    with pytest.raises(TensorizeError, match="loop 'i'"):
        ember.lower(s, [A, B, C])
    s = te.create_schedule(C)
    io, ii = s[C].split(i, 3)  # 8 rows by 3: a guard inside the nest
    s[C].reorder(io, *C.op.reduce_axis, ii, j)
    s[C].tensorize(C.op.reduce_axis[0], "dot_u8s8")
    with pytest.raises(TensorizeError, match="guard"):
        ember.lower(s, [A, B, C])


def test_intrinsic_declaration_matches_numpy():
    """The intrinsic's TE declaration (what it computes), built plainly, is the same product."""
    a_t, b_t, c_t = INTRINSICS["dot_u8s8"].decl(3, 16, 5)
    f = ember.build(te.create_schedule(c_t), [a_t, b_t, c_t], target="c")
    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, (3, 20)).astype(np.uint8)
    b = rng.integers(-128, 128, (5, 16, 4)).astype(np.int8)
    c = np.zeros((3, 16), np.int32)
    f(a, b, c)
    np.testing.assert_array_equal(c, a.astype(np.int64) @ b.transpose(0, 2, 1).reshape(20, 16).astype(np.int64))


@pytest.mark.parametrize("target, isa", [("c", None), ("c -mcpu=haswell", "avx2"), ("c -mcpu=x86-64", "c")])
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_zeroing_of_a_whole_tile_folds_into_the_call(target, isa, dtype):
    """A call whose tile the loops before it set to zero (a local accumulator of one tile, a reduction one call
    covers: a 1 x 1 convolution) starts its accumulators at zero instead (`_set`: no zeroing in memory, no load);
    tiles of a wider C (its rows longer than the tile's) keep the zeroing loops. Both equal numpy's product."""
    if isa is not None and isa != "c" and isa not in host_cpu_flags():
        pytest.skip(f"this CPU has no {isa}")
    m, n, k = 8, 32, 40
    signed = dtype == "int8"  # dot_s8u8: int8 rows, uint8 columns packed [k / 4, n, 4]
    rng = np.random.default_rng(4)
    if signed:
        A, B, C = gemm_s8u8(m, n, k)
        a, b = rng.integers(-128, 128, (m, k)).astype(np.int8), rng.integers(0, 256, (k, n)).astype(np.uint8)
        packed = np.ascontiguousarray(b.reshape(k // 4, 4, n).transpose(0, 2, 1))
    else:
        A, B, C = gemm(m, n, k, n)
        a, b, packed = operands(m, n, k, n, seed=4)
    for nb, folded in ((n, True), (n // 2, False)):
        s = tensorized(C, m // 2, nb, "dot_s8u8" if signed else "dot_u8s8", rows_outer=True)
        f = ember.build(s, [A, B, C], target=target)
        isa_used = dot_u8s8_isa(Target.parse(target).simd_features(), nb, signed)
        assert f"_{m // 2}x{nb}_{isa_used}(" in f.source or f"_{m // 2}x{nb}_{isa_used}_set(" in f.source
        assert (f"_{m // 2}x{nb}_{isa_used}_set(" in f.source) == folded
        c = np.full((m, n), 7, np.int32)  # not zero: the folded call must overwrite it
        f(a, packed, c)
        np.testing.assert_array_equal(c, a.astype(np.int64) @ b.astype(np.int64))
