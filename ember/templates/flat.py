"""The default schedules, keyed by nothing but the stages' shapes: fuse a stage's data-parallel loops,
vectorize by the target's lanes and run the outer part in parallel when there is enough work
(`schedule_flat`, `default_schedule`), or keep the outer axes apart and vectorize one row
(`schedule_rows`, the injective ops' own kernels: `schedule_injective`, `schedule_tables`).

A compute marks the trailing axes that are contiguous in its input too with `attrs["row_axes"]`
(`ember.ops.te_lib.rows`).
"""

from __future__ import annotations

from ember import te
from ember.target import Target
from ember.te.tensor import ComputeOp, Reduce, Tensor, TensorLoad, prod_hint
from ember.tir.expr import Expr, Var
from ember.tir.functor import walk


def default_schedule(outs: list[Tensor], target: Target) -> te.Schedule:
    """Inline elementwise intermediates; each root stage: fuse its loops, vectorize a target-wide
    inner part and run the outer part in parallel when there is enough work."""
    s = te.create_schedule(outs)
    for st in s.stages:
        if st.is_placeholder or st.is_output:
            continue
        if isinstance(st.op, ComputeOp) and not isinstance(st.op.body, Reduce):
            st.compute_inline()
    for st in s.stages:
        if st.is_placeholder or st.attach != "root":
            continue
        schedule_flat(st, target)
    return s


def lane_bits(op: ComputeOp) -> int:
    """Element bits that set a stage's vector lanes: its output's, or up to 32 when it computes in wider types
    (a uint8 QuantizeLinear computes in float32/float64: 64 lanes of those would be 8 to 16 registers each)."""
    widest = max((n.dtype.bits for n in walk(op.body) if isinstance(n, Expr) and not n.dtype.is_bool), default=8)
    return max(op.dtype.bits, min(widest, 32), 8)


def row_lanes(n: int, lanes: int) -> int:
    """Vector lanes for a row of n elements: the target's, halved (down to 4) until they divide the row, else 1."""
    while lanes > 4 and n % lanes:
        lanes //= 2
    return lanes if n % lanes == 0 else 1


def contiguous_run(op: ComputeOp) -> int:
    """Elements of a stage's trailing axes that one vector may cross: the product of the longest run of trailing
    axes over which every tensor its body reads (through the elementwise stages that will be inlined into it) is
    read in the same order (its trailing indices those axes, its trailing sizes the stage's) or not at all (a
    broadcast along them: an SE block's per-channel scale over H x W); the last axis at least."""
    k = 1
    while k < len(op.axis) and _reads_in_order(op, k + 1, 0):
        k += 1
    return prod_hint(op.shape[-k:])


def _reads_in_order(op: ComputeOp, k: int, depth: int) -> bool:
    tail, sizes = [iv.var for iv in op.axis[-k:]], tuple(op.shape[-k:])
    ids = {id(v) for v in tail}
    for n in walk(op.body):
        if not isinstance(n, TensorLoad):
            continue
        uses = [any(isinstance(m, Var) and id(m) in ids for m in walk(i)) for i in n.indices]
        if not any(uses):
            continue  # broadcast along the run
        idx = n.indices
        if len(idx) < k or any(uses[:-k]) or any(a is not b for a, b in zip(idx[-k:], tail)):
            return False
        if tuple(n.tensor.shape[-k:]) != sizes:
            return False
        t = n.tensor.op
        inlined = isinstance(t, ComputeOp) and not isinstance(t.body, Reduce) and not t.attrs.get("materialize")
        if inlined and (len(t.axis) != len(idx) or depth > 32 or not _reads_in_order(t, k, depth + 1)):
            return False
    return True


def schedule_flat(st: te.Stage, target: Target) -> None:
    """Fuse the data-parallel loops of a stage, vectorize by the target's lanes, parallelize the rest."""
    op = st.op
    assert isinstance(op, ComputeOp)
    size = prod_hint(op.shape) if op.shape else 1
    if not op.axis or size == 0:
        return
    fused = st.fuse(*op.axis) if len(op.axis) > 1 else op.axis[0]
    lanes = target.vector_lanes(lane_bits(op))
    is_reduce = isinstance(op.body, Reduce)
    inner_len = op.shape[-1] if is_reduce else contiguous_run(op)
    if len(op.axis) > 1 and isinstance(inner_len, int):
        # vectors that cross a row (56 columns in vectors of 16) need each lane's row and column: a division
        # and a remainder per lane, and gathers (20x slower than a row of whole vectors); fewer lanes fit a row
        # (a row of 7 or 14: scalar code beats per-lane index arithmetic)
        lanes = row_lanes(inner_len, lanes)
    if lanes > 1 and not is_reduce and size >= lanes * 2 and (inner_len % lanes == 0 or size >= 4 * lanes):
        outer, inner = st.split(fused, lanes)
        st.vectorize(inner)
        fused = outer
    work = size * (prod_hint([iv.dom[1] for iv in op.reduce_axis]) if is_reduce else 1)
    if work >= 1 << 15 and target.num_cores > 1:
        st.parallel(fused)


def standalone(outs: list[Tensor], tag: str) -> bool:
    """Whether a schedule is asked for the op's own kernel (its outputs carry the op's tag); inside a
    fused group the outputs are another member's, and the group gets the default schedule."""
    return bool(outs) and all(t.op.tag == tag for t in outs)


def schedule_rows(st: te.Stage, target: Target) -> None:
    """Loops of an injective stage: the outer axes fused (parallel when big), then one row vectorized
    by the widest lane count that divides it (else a plain loop). A row is the innermost axis, or the
    trailing axes the compute marks contiguous in its input too (attrs["row_axes"]: a Split's axes
    after the split axis). Unlike fusing every axis, the index arithmetic of the outer axes stays
    scalar: the vector lanes walk one row."""
    op = st.op
    if isinstance(op.body, Reduce):
        schedule_flat(st, target)
        return
    size = prod_hint(op.shape)
    if not op.axis or size == 0:
        return
    k = min(max(op.attrs.get("row_axes", 1), 1), len(op.axis))
    outer = list(op.axis[:-k])
    row = st.fuse(*op.axis[-k:])
    n = prod_hint(op.shape[-k:])
    lanes = row_lanes(n, target.vector_lanes(lane_bits(op)))
    if lanes >= 4:
        row, inner = st.split(row, lanes)
        st.vectorize(inner)
    fused = st.fuse(*outer) if outer else row  # a row keeps its own loop: per-row index math is hoisted
    if size >= 1 << 15 and target.num_cores > 1:
        st.parallel(fused)


def schedule_injective(tag: str, tables: bool = False):
    """The schedule of an injective op's own kernel: `schedule_rows` for each stage. Intermediate
    stages are inlined, unless `tables`: small precomputed tables (interpolation weights, twiddle
    factors) then stay separate loop nests, computed once instead of per output element."""

    def schedule(a: dict, outs: list[Tensor], target: Target) -> te.Schedule:
        if not standalone(outs, tag):
            return default_schedule(outs, target)
        s = te.create_schedule(outs)
        for st in s.stages:
            if not (tables or st.is_placeholder or st.is_output or isinstance(st.op.body, Reduce)):
                st.compute_inline()
        for st in s.stages:
            if not st.is_placeholder and st.attach == "root":
                schedule_rows(st, target)
        return s

    return schedule


def schedule_tables(tag: str):
    return schedule_injective(tag, tables=True)
