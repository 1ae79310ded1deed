"""Vector indices whose lanes stay inside one aligned block: a load of such an index is one contiguous vector load
and one shuffle with constant lane numbers, where the generic path gathers lane by lane.

The case that needs it: a grouped convolution in the blocked layout whose groups are narrower than a channel block
(`ember.templates.nchwc.conv_nchwc_acc`, `narrow_groups`). Output lane l of a block reads input channel
`l // g * g + rc` of the same block: for each (unrolled) rc, a vector whose lanes repeat one channel per group. Its
index is a multiple of the block (the pixel's first channel) plus constant lane offsets below the block, so the
block is loaded whole and its lanes are rearranged (`vpermilps`, `vpermps`, `tbl`).

`aligned_lanes` finds that form; the C and LLVM generators emit the load and the shuffle.
"""

from __future__ import annotations

import math

from ..tir.arith import Analyzer
from ..tir.expr import BinOp, Broadcast, Const, Expr, Ramp, const
from ..tir.stmt import Buffer


def lane_pattern(idx: Expr) -> tuple[Expr, list[int]] | None:
    """idx (a vector of integers) as a scalar plus constant per-lane offsets, (scalar, offsets); None where the
    lanes differ by more than constants. Divisions and remainders are taken only of vectors that are constant
    whole (the lane arithmetic of a vectorized loop from 0: `ramp(0, 1) // g * g`)."""
    n = idx.dtype.lanes
    if isinstance(idx, Broadcast):
        return idx.value, [0] * n
    if isinstance(idx, Ramp):
        if not isinstance(idx.stride, Const):
            return None
        return idx.base, [i * int(idx.stride.value) for i in range(n)]
    if not isinstance(idx, BinOp) or idx.op not in ("add", "sub", "mul", "floordiv", "floormod"):
        return None
    a, b = lane_pattern(idx.a), lane_pattern(idx.b)
    if a is None or b is None:
        return None
    (sa, pa), (sb, pb) = a, b
    dt = sa.dtype
    if idx.op in ("add", "sub"):
        sign = 1 if idx.op == "add" else -1
        return BinOp(idx.op, sa, sb, dt), [x + sign * y for x, y in zip(pa, pb)]
    ca, cb = isinstance(sa, Const), isinstance(sb, Const)
    if ca and cb:  # constant whole: lane by lane
        va = [int(sa.value) + x for x in pa]
        vb = [int(sb.value) + y for y in pb]
        if idx.op in ("floordiv", "floormod") and 0 in vb:
            return None
        op = {"mul": lambda x, y: x * y, "floordiv": lambda x, y: x // y, "floormod": lambda x, y: x % y}[idx.op]
        return const(0, dt), [op(x, y) for x, y in zip(va, vb)]
    if idx.op == "mul" and cb and not any(pb):  # (scalar + offsets) * k
        k = int(sb.value)
        return BinOp("mul", sa, sb, dt), [x * k for x in pa]
    if idx.op == "mul" and ca and not any(pa):
        k = int(sa.value)
        return BinOp("mul", sa, sb, dt), [k * y for y in pb]
    return None


def aligned_lanes(idx: Expr, buffer_elems: int | None) -> tuple[Expr, list[int]] | None:
    """For a vector load of L = idx's lanes from a buffer of `buffer_elems` elements: (the first index of an aligned
    block of L elements, the lane of the block each loaded lane takes) where every lane's index falls in that one
    block; None otherwise, or where the lanes are a plain contiguous or repeated run (loaded as they are).

    The block is aligned (its first index a multiple of L, proven from the index's linear form) and the buffer's
    length a multiple of L, so the block lies inside the buffer wherever the lanes read do: loading it whole reads
    nothing out of bounds."""
    n = idx.dtype.lanes
    if n < 2 or not buffer_elems or buffer_elems % n:
        return None
    got = lane_pattern(idx)
    if got is None:
        return None
    scalar, offsets = got
    if len(set(offsets)) == 1 or offsets == list(range(offsets[0], offsets[0] + n)):
        return None
    an = Analyzer()
    terms, c = an.lin(an.simplify(scalar))
    if any(k % n for k in terms.values()):
        return None
    q = [c + o for o in offsets]
    first = min(q) // n * n
    if max(q) - first >= n:
        return None
    return an.simplify(BinOp("add", scalar, const(first - c, scalar.dtype), scalar.dtype)), [x - first for x in q]


def buffer_elems(buf: Buffer) -> int | None:
    """The elements of a buffer of static shape; None where a dim is symbolic."""
    return math.prod(buf.shape) if buf.is_static else None
