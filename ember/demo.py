"""The classic matrix-multiply schedule progression (blocking, permutation, packing, register
blocking, parallel), written with `ember.te`. Used by `ember demo` and `bench/matmul.py`.

Tile sizes come from the target (vector width and register count), not from one machine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import te
from .target import Target, host_cpu_flags


@dataclass(frozen=True)
class GemmTiles:
    lanes: int  # float32 lanes of one vector register
    mr: int  # rows of the register tile
    nr: int  # columns of the register tile (a multiple of lanes)
    kr: int  # reduction unroll

    @staticmethod
    def for_target(target: Target) -> GemmTiles:
        lanes = target.vector_lanes(32)
        regs = 32 if target.vector_bits >= 512 or "avx512f" in host_cpu_flags() else 16
        # accumulators mr x (nr/lanes) plus nr/lanes B vectors and one broadcast must fit the register file
        mr = 12 if regs >= 32 else 6
        return GemmTiles(lanes, mr, 2 * lanes, 4)


def gemm_compute(M: int, N: int, K: int, packed_width: int | None = None):
    """C = A @ B; with packed_width, B is first repacked into panels of that many columns."""
    A = te.placeholder((M, K), "float32", name="A")
    B = te.placeholder((K, N), "float32", name="B")
    k = te.reduce_axis((0, K), name="k")
    if packed_width is None:
        C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
        return A, B, C, None
    w = packed_width
    PB = te.compute((-(-N // w), K, w), lambda x, y, z: B[y, te.minimum(x * w + z, N - 1)], name="PB")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * PB[j // w, k, j % w], axis=k), name="C")
    return A, B, C, PB


def naive(M: int, N: int, K: int, t: GemmTiles):
    A, B, C, _ = gemm_compute(M, N, K)
    return te.create_schedule(C), [A, B, C]


def blocking(M: int, N: int, K: int, t: GemmTiles):
    A, B, C, _ = gemm_compute(M, N, K)
    s = te.create_schedule(C)
    io, jo, ii, ji = s[C].tile(C.op.axis[0], C.op.axis[1], 32, 32)
    ko, ki = s[C].split(C.op.reduce_axis[0], 4)
    s[C].reorder(io, jo, ko, ki, ii, ji)
    s[C].vectorize(ji)
    return s, [A, B, C]


def permutation(M: int, N: int, K: int, t: GemmTiles):
    A, B, C, _ = gemm_compute(M, N, K)
    s = te.create_schedule(C)
    io, jo, ii, ji = s[C].tile(C.op.axis[0], C.op.axis[1], 32, 32)
    ko, ki = s[C].split(C.op.reduce_axis[0], 4)
    s[C].reorder(io, jo, ko, ii, ki, ji)  # the vectorized column loop innermost, B read row-wise
    s[C].vectorize(ji)
    return s, [A, B, C]


def packing(M: int, N: int, K: int, t: GemmTiles):
    A, B, C, PB = gemm_compute(M, N, K, packed_width=32)
    s = te.create_schedule(C)
    io, jo, ii, ji = s[C].tile(C.op.axis[0], C.op.axis[1], 32, 32)
    ko, ki = s[C].split(C.op.reduce_axis[0], 4)
    s[C].reorder(io, jo, ko, ii, ki, ji)
    s[C].vectorize(ji)
    s[PB].vectorize(s[PB].op.axis[2])
    return s, [A, B, C]


def register_blocking(M: int, N: int, K: int, t: GemmTiles, parallel: bool = False):
    """Packed B panels of nr columns, an mr x nr accumulator tile held in registers (cache_write),
    the reduction unrolled by kr, vectors of the target's width."""
    A, B, C, PB = gemm_compute(M, N, K, packed_width=t.nr)
    s = te.create_schedule(C)
    CC = s.cache_write(C, "local")
    io, jo, ii, ji = s[C].tile(C.op.axis[0], C.op.axis[1], t.mr, t.nr)
    s[CC].compute_at(s[C], jo)
    ic, jc = s[CC].op.axis
    ko, ki = s[CC].split(s[CC].op.reduce_axis[0], t.kr)
    jco, jci = s[CC].split(jc, t.lanes)
    s[CC].reorder(ko, ki, ic, jco, jci)
    s[CC].vectorize(jci)
    s[CC].unroll(jco)
    s[CC].unroll(ic)
    s[CC].unroll(ki)
    jio, jii = s[C].split(ji, t.lanes)
    s[C].vectorize(jii)
    s[C].unroll(jio)
    s[C].unroll(ii)
    x, _, z = s[PB].op.axis
    s[PB].vectorize(z)
    if parallel:
        s[C].parallel(s[C].fuse(io, jo))
        s[PB].parallel(x)
    return s, [A, B, C]


def parallel(M: int, N: int, K: int, t: GemmTiles):
    return register_blocking(M, N, K, t, parallel=True)


SCHEDULES: dict[str, Callable] = {
    "naive": naive,
    "blocking": blocking,
    "permutation": permutation,
    "packing": packing,
    "register_blocking": register_blocking,
    "parallel": parallel,
}
