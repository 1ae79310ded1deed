"""Schedules of operator kernels for the GPU targets (CUDA, OpenCL): every kernel the CPU lowers, bound to threads.

The computes are the operators' own (`ember.ops.conv`, `ember.ops.matmul` and the rest), so every op that
lowers natively on the CPU lowers here too; only the schedule differs. `schedule_gpu(outs, target)`:

- generic (any kernel): intermediate elementwise stages are inlined (those marked `materialize` that are not
  cheap to recompute, such as a recurrence's states, stay at root); each root stage's data-parallel loops are
  fused and split into blockIdx.x x threadIdx.x (lowering guards the tail), a reduction is computed per output
  element by one thread (its reduce loops serial inside the thread). A reduction read only by one elementwise
  root stage of at most its size (conv + bias + relu, matmul + gelu) is computed inside that stage's thread
  loop, into a private buffer of one element, instead of a kernel of its own;
- templates, found by the stage attributes the CPU templates record (`attrs["template"]`):
  * "gemm" (MatMul, Gemm, 1x1 conv): the output tiled per block (BM x BN: 128 x 128 down to 16 x 16, the
    largest that still makes enough blocks to fill a GPU) and per thread (a TM x TN register tile of the
    accumulation), the reduction split by TK, both operands' tiles loaded cooperatively into shared memory at
    each step (barriers placed by `codegen.gpu`);
  * "rows" (softmax, layer/instance/RMS normalization): one block per row, its threads over the row's
    elements; the row's reductions run before, their partial results (one per vector lane of the CPU compute)
    computed by as many threads into shared memory, then combined by each thread; per-row buffers (softmax's
    exp) are recomputed instead of stored. Short rows (< 32 elements): one thread per row;
  * "conv_oc"/"conv_ow" (convolutions): a thread per output pixel with a register tile of 2-8 output channels
    (dense convs: each input value is loaded once for all of them) or of 2-4 positions along the width
    (depthwise: each weight loaded once for all of them); pooling uses the generic schedule (one output each).
  Accumulators computed in a thread are "local": the renderer keeps them in registers.

Each template has knobs (a tuning config, `ember.te.config`, given to `schedule_gpu`; without one, every knob
takes its default, the shapes above): "gemm" the block and register tiles (`gpu_tile_m`: (-1, ty, tm) threads and
accumulators per thread along the rows, `gpu_tile_n` along the columns: each thread's tn consecutive columns are
its vector of work; the GPU renderers emit scalar code, so vector width here means that run), the reduction step
`gpu_tk` and whether its steps are unrolled (`gpu_unroll_k`); "conv_oc"/"conv_ow" the register tile
(`gpu_conv_tile`: (-1, channels, width positions)) and threads per block (`gpu_threads`); "rows" the threads per
row (`gpu_row_threads`). So `ember tune --target opencl|cuda` searches the GPU schedules themselves.

Every template's result is checked by bound inference before it is used (a per-thread buffer larger than
`LOCAL_LIMIT` elements, or shared memory over `SHARED_LIMIT` bytes, falls back to the generic schedule), so an
unusual shape gets a slower kernel, never a failing one.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from ember import te
from ember.target import Target
from ember.te.config import ConfigBase, as_config
from ember.te.lower import Lowering
from ember.te.schedule import Schedule, ScheduleError, Stage
from ember.te.tensor import ComputeOp, IterVar, Reduce, Tensor
from ember.templates.nn import elementwise_output

log = logging.getLogger(__name__)

GPU_KINDS = ("cuda", "opencl")
THREADS = 256  # threads per block of the generic schedule
MAX_BLOCK_THREADS = 1024  # threads per block a template may ask for
LOCAL_LIMIT = 64  # elements of a per-thread buffer made by compute_at
SHARED_LIMIT = 48 * 1024  # bytes of shared memory per block (CUDA's static limit)
ROW_MIN = 32  # rows shorter than this run one per thread
INLINE_TAGS = ("nn_pad", "row_buffer", "gemm_pack", "conv_pack")  # cheap to recompute in every reader


def is_gpu(target: Target) -> bool:
    return target.kind in GPU_KINDS


def schedule_gpu(outs: Sequence[Tensor], target: Target, cfg: ConfigBase | None = None) -> Schedule:
    """The GPU schedule of a kernel computing `outs` (see the module's doc); `cfg` answers the templates' knobs
    (None: their defaults)."""
    cfg = as_config(cfg)
    s = te.create_schedule(list(outs))
    try:
        _inline(s, set())
        done = _templates(s, outs, target, cfg)
        if done:
            _generic(s, outs, done)
            if _fits(s, outs):
                return s
            log.debug("GPU template does not fit; generic schedule for %s", [t.name for t in outs])
    except ScheduleError as e:  # a template that does not apply to this instance: the generic schedule runs it
        log.debug("GPU template failed (%s); generic schedule for %s", e, [t.name for t in outs])
    s = te.create_schedule(list(outs))
    _generic(s, outs, set())
    return s


# -- the generic schedule ------------------------------------------------------------------------------
def _inline(s: Schedule, done: set[str]) -> None:
    for st in s.stages:
        if st.name not in done and st.attach == "root" and _inlinable(st):
            st.compute_inline()


def _generic(s: Schedule, outs: Sequence[Tensor], done: set[str]) -> None:
    _inline(s, done)
    roots = [st for st in s.stages if not st.is_placeholder and st.attach == "root" and st.name not in done]
    readers = _effective_readers(s)
    folded: dict[Stage, Stage] = {}
    for st in roots:
        if st.is_output or not _is_reduce(st):
            continue
        rs = readers.get(st, set())
        if len(rs) == 1:
            (o,) = rs
            if o in roots and not _is_reduce(o) and _numel(st) >= _numel(o) > 0:
                folded[st] = o
    thread_loop = {st: bind_flat(st) for st in roots if st not in folded}
    for st, o in folded.items():
        if thread_loop.get(o) is None:
            thread_loop[st] = bind_flat(st)
            continue
        st.compute_at(o, thread_loop[o])
        st.set_scope("local")
    if not folded:
        return
    sizes = _regions(s, outs)
    for st in folded:
        if st.attach == "at" and sizes.get(st.name, 0) > 1:  # not one element per thread: a kernel of its own
            st.compute_root()
            bind_flat(st)


def bind_flat(st: Stage, threads: int = THREADS) -> IterVar | None:
    """Fuse a stage's data-parallel loops and split them into blockIdx.x x threadIdx.x; returns the thread loop
    (None for a stage without elements or axes: it runs as one thread)."""
    op = st.op
    size = _numel(st)
    if not op.axis or size == 0:
        return None
    fused = st.fuse(*op.axis) if len(op.axis) > 1 else op.axis[0]
    bx, tx = st.split(fused, min(threads, size))
    st.bind(bx, "blockIdx.x")
    st.bind(tx, "threadIdx.x")
    return tx


def _inlinable(st: Stage) -> bool:
    op = st.op
    if st.is_placeholder or st.is_output or not isinstance(op, ComputeOp) or isinstance(op.body, Reduce):
        return False
    return not op.attrs.get("materialize") or op.tag in INLINE_TAGS


def _is_reduce(st: Stage) -> bool:
    return isinstance(st.op, ComputeOp) and isinstance(st.op.body, Reduce)


def _numel(st: Stage) -> int:
    return math.prod(st.op.shape)


def _effective_readers(s: Schedule) -> dict[Stage, set[Stage]]:
    """The stages that read each stage, looking through inlined readers."""
    direct: dict[Stage, set[Stage]] = {}
    for st in s.stages:
        for t in st.op.inputs:
            direct.setdefault(s[t], set()).add(st)
    out: dict[Stage, set[Stage]] = {}

    def effective(st: Stage) -> set[Stage]:
        if st not in out:
            out[st] = set()
            for r in direct.get(st, ()):
                out[st] |= effective(r) if r.attach == "inline" else {r}
        return out[st]

    for st in s.stages:
        effective(st)
    return out


# -- checking a schedule by bound inference --------------------------------------------------------------
def _regions(s: Schedule, outs: Sequence[Tensor]) -> dict[str, int]:
    """Elements of the buffer of each stage computed inside another's loop (bound inference, no code)."""
    args = [st.op.output() for st in s.stages if st.is_placeholder] + list(outs)
    low = Lowering(s, args, "probe")
    low.inline()
    low.check()
    low.infer_bounds()
    return {st.name: math.prod(low.loops[st].extent[iv] for iv in st.op.axis) for st in low.stages
            if st.attach == "at"}  # fmt: skip


def _fits(s: Schedule, outs: Sequence[Tensor]) -> bool:
    sizes = _regions(s, outs)
    shared = 0
    for st in s.stages:
        if st.name not in sizes:
            continue
        if st.scope == "shared":
            shared += sizes[st.name] * st.op.dtype.bits // 8
        elif sizes[st.name] > LOCAL_LIMIT:
            return False
    return shared <= SHARED_LIMIT


# -- templates ---------------------------------------------------------------------------------------
def _templates(s: Schedule, outs: Sequence[Tensor], target: Target, cfg: ConfigBase) -> set[str]:
    """Apply the GPU template of every stage that names one; returns the stages they scheduled."""
    done: set[str] = set()
    for st in list(s.stages):
        op = st.op
        kind = op.attrs.get("template") if isinstance(op, ComputeOp) else None
        if kind not in TEMPLATES or _numel(st) == 0:
            continue
        anchor = st if st.is_output else elementwise_output(s, st, outs)
        if anchor is None:
            continue
        if anchor is not st:
            st.compute_inline()
        done |= TEMPLATES[kind](s, anchor, op.attrs, target, cfg)
    return done


# GEMM block shapes, largest first: (accumulators per thread, threads) along rows and columns
GEMM_TILES = (((8, 16), (8, 16)), ((4, 16), (4, 16)), ((4, 8), (4, 8)), ((2, 8), (2, 8)))
MIN_BLOCKS = 96  # a GEMM takes the largest block shape that gives at least this many blocks (a GPU's SMs)


def _gemm_tiles(batch: int, m: int, n: int) -> tuple[int, int, int, int]:
    """(tm, ty, tn, tx): tm x tn accumulators per thread, ty x tx threads per block. The largest block shape
    (128 x 128 with 8 x 8 per thread) that still makes MIN_BLOCKS blocks; otherwise the one with the most
    threads in all (small products)."""

    def fit(size: int, per: int, threads: int) -> tuple[int, int]:
        per = min(per, 1 << (size.bit_length() - 1))
        return per, max(1, min(threads, -(-size // per)))

    best, most = None, -1
    for (pm, tym), (pn, txn) in GEMM_TILES:
        (tm, ty), (tn, tx) = fit(m, pm, tym), fit(n, pn, txn)
        if ty < tym:  # few rows: more threads along the columns (a block stays a few warps, not 8 threads)
            tx = max(1, min(tym * txn // ty, -(-n // tn)))
        elif tx < txn:
            ty = max(1, min(tym * txn // tx, -(-m // tm)))
        blocks = batch * -(-m // (tm * ty)) * -(-n // (tn * tx))
        if blocks >= MIN_BLOCKS:
            return tm, ty, tn, tx
        if blocks * ty * tx > most:
            best, most = (tm, ty, tn, tx), blocks * ty * tx
    return best  # type: ignore[return-value]


GPU_TILE_THREADS = (4, 8, 16, 32)  # threads of a block along the rows or the columns (knob choices)
GPU_TILE_REGS = (1, 2, 4, 8)  # accumulators per thread along the rows or the columns


def _tile_choices(size: int, dflt: tuple[int, int]) -> list[tuple[int, int, int]]:
    """(-1, threads, accumulators) along one output axis of `size`: the default and the shapes whose block fits
    within the axis (a block past its end leaves threads without a part of the shared tiles to load)."""
    out = {(-1, t, r) for t in GPU_TILE_THREADS for r in GPU_TILE_REGS if t * r <= size}
    return sorted(out | {(-1, *dflt)})


def _gemm_knobs(cfg: ConfigBase, m: int, n: int, k: int, dflt: tuple[int, int, int, int]) -> tuple[int, ...]:
    """(tm, ty, tn, tx, tk, unroll): the GEMM template's knobs, defaults from `_gemm_tiles`."""
    cfg.template = cfg.template or "gpu_gemm"
    tm, ty, tn, tx = dflt
    tk = min(8 if tm * tn >= 64 else 16, k)
    _, ty, tm = cfg.define_split("gpu_tile_m", m, 3, policy="candidate", candidates=_tile_choices(m, (ty, tm)),
                                 default=(-1, ty, tm))  # fmt: skip
    _, tx, tn = cfg.define_split("gpu_tile_n", n, 3, policy="candidate", candidates=_tile_choices(n, (tx, tn)),
                                 default=(-1, tx, tn))  # fmt: skip
    tk = cfg.define_knob("gpu_tk", sorted({t for t in (4, 8, 16, 32) if t <= k} | {tk}), default=tk)
    unroll = cfg.define_knob("gpu_unroll_k", [False, True], default=False)
    return tm, ty, tn, tx, tk, unroll


def _gemm(s: Schedule, O: Stage, attrs: dict, target: Target, cfg: ConfigBase) -> set[str]:
    """Block tile (ty*tm) x (tx*tn) of the output, a tm x tn accumulator per thread, operand tiles in shared memory."""
    ia, ja = attrs.get("i_axis"), attrs.get("j_axis")
    A = s[attrs["acc"]]
    if ia is None or ja is None or len(A.op.reduce_axis) != 1 or A.attach != "root":
        return set()
    axes, shape = list(O.op.axis), O.op.shape
    nbatch = math.prod(n for d, n in enumerate(shape) if d not in (ia, ja))
    dflt = _gemm_tiles(nbatch, shape[ia], shape[ja])
    tm, ty, tn, tx, tk, unroll_k = _gemm_knobs(cfg, shape[ia], shape[ja], A.op.reduce_axis[0].dom[1], dflt)
    if ty * tx > MAX_BLOCK_THREADS:
        raise ScheduleError(f"stage '{O.name}': a block of {ty} x {tx} threads")
    batch = [ax for d, ax in enumerate(axes) if d not in (ia, ja)]
    io, ii = O.split(axes[ia], tm * ty)
    yo, ri = O.split(ii, tm)
    jo, ji = O.split(axes[ja], tn * tx)
    xo, rj = O.split(ji, tn)
    O.reorder(*batch, io, jo, yo, xo, ri, rj)
    block = O.fuse(*batch, io, jo)
    thread = O.fuse(yo, xo)
    O.bind(block, "blockIdx.x")
    O.bind(thread, "threadIdx.x")
    O.unroll(ri)
    O.unroll(rj)
    operands = [t for t in dict.fromkeys(A.op.inputs) if t.ndim >= 2]
    caches = [s[s.cache_read(t, "shared", [A])] for t in operands]
    A.compute_at(O, thread)
    A.set_scope("local")
    *lb, li, lj = A.op.axis
    ko, ki = A.split(A.op.reduce_axis[0], tk)
    A.reorder(*lb, ko, ki, li, lj)
    A.unroll(li)
    A.unroll(lj)
    if unroll_k:
        A.unroll(ki)
    for C in caches:
        C.compute_at(A, ko)
        f = C.fuse(*C.op.axis) if len(C.op.axis) > 1 else C.op.axis[0]
        _, t = C.split(f, ty * tx)
        C.bind(t, "threadIdx.x")
    return {O.name, A.name} | {C.name for C in caches}


def _conv(s: Schedule, O: Stage, attrs: dict, target: Target, cfg: ConfigBase) -> set[str]:
    """Direct convolution, one thread per output pixel and a register tile of `tc` output channels (dense convs:
    each input value read once for all of them), or of `tw` positions along the width (depthwise: each weight
    read once for all of them); the reduction over input channels and the window runs in the thread."""
    A = s[attrs["acc"]]
    plan = A.op.attrs.get("plan")
    rc = [iv for iv in A.op.reduce_axis if iv.name == "rc"]  # pooling has no channel reduction: generic
    shape, axes = O.op.shape, list(O.op.axis)
    if A.attach != "root" or not rc or len(shape) < 3 or plan is None:
        return set()
    co, width = shape[1], shape[-1]
    block = plan.block if A.op.tag == "conv_oc" else co  # conv_oc: channels in blocks of the CPU's vectors
    channels = [c for c in (8, 4, 2) if rc[0].dom[1] >= 4 and block % c == 0 and co >= 2 * c]
    tc = channels[0] if channels else 1
    tw = 1 if tc > 1 else 4 if width >= 8 else 2 if width >= 4 else 1
    if tc == 1 and tw == 1:
        return set()
    cfg.template = cfg.template or "gpu_conv"
    tiles = [(-1, c, 1) for c in channels] + [(-1, 1, w) for w in (2, 4) if width >= 2 * w]
    _, tc, tw = cfg.define_split("gpu_conv_tile", co, 3, policy="candidate", candidates=tiles, default=(-1, tc, tw))
    threads = cfg.define_knob("gpu_threads", [32, 64, 128, 256], default=128)
    if tc > 1:
        outer = [axes[0]]
        c = axes[1]
        if A.op.tag == "conv_oc":
            cb, c = O.split(c, block)
            outer.append(cb)
        c, tile = O.split(c, tc)
        outer += [c, *axes[2:]]
    else:
        w, tile = O.split(axes[-1], tw)
        outer = [*axes[:-1], w]
    O.reorder(*outer, tile)
    fused = O.fuse(*outer)
    bx, tx = O.split(fused, min(threads, math.prod(shape) // (tc * tw) or 1))
    O.bind(bx, "blockIdx.x")
    O.bind(tx, "threadIdx.x")
    O.unroll(tile)
    A.compute_at(O, tx)
    A.set_scope("local")
    data = [iv for iv in A.op.axis if iv is not A.op.axis[1 if tc > 1 else -1]]
    inner = A.op.axis[1 if tc > 1 else -1] if A.op.tag != "conv_oc" or tw > 1 else A.op.axis[-1]
    A.reorder(*[iv for iv in data if iv is not inner], *A.op.reduce_axis, inner)
    A.unroll(inner)
    region = _regions(s, s.outputs).get(A.name, 0)
    if region != tc * tw:  # the tile does not map to a box of the accumulation: the generic schedule
        raise ScheduleError(f"stage '{A.name}': conv tile of {tc * tw} needs {region} accumulators")
    return {O.name, A.name}


ROW_TAGS = ("row_partial", "row_reduce")


def _rows(s: Schedule, O: Stage, attrs: dict, target: Target, cfg: ConfigBase) -> set[str]:
    """A block per row (its threads over the row), or a thread per row for short rows; the row's reductions
    computed in the row's loop."""
    k = attrs.get("rows") or 0
    axes = O.op.axis
    if k == 0 or k >= len(axes):
        return set()
    nrows, length = math.prod(O.op.shape[:k]), math.prod(O.op.shape[k:])
    for st in s.stages:
        if st.attach == "root" and not st.is_output and isinstance(st.op, ComputeOp) and st.op.tag == "row_buffer":
            st.compute_inline()
    members = _row_members(s, O)
    row = O.fuse(*axes[:k]) if k > 1 else axes[0]
    inner = O.fuse(*axes[k:]) if len(axes) > k + 1 else axes[k]
    if length < ROW_MIN:
        bx, at = O.split(row, min(64, nrows))
        O.bind(bx, "blockIdx.x")
        O.bind(at, "threadIdx.x")
    else:
        threads = min(THREADS, 1 << (length - 1).bit_length())
        cfg.template = cfg.template or "gpu_rows"
        choices = sorted({t for t in (32, 64, 128, 256, 512) if t < 2 * length} | {threads})
        threads = cfg.define_knob("gpu_row_threads", choices, default=threads)
        at = row
        O.bind(row, "blockIdx.x")
        _, ti = O.split(inner, threads)
        O.bind(ti, "threadIdx.x")
    names = {O.name}
    for st in members:
        names.add(st.name)
        if length >= ROW_MIN and st.op.tag == "row_partial":
            # one partial result per thread: accumulated in a register, then stored to shared memory
            acc = s[s.cache_write(st.op.output(), "local")]
            st.compute_at(O, at)
            st.set_scope("shared")
            lane = st.op.axis[-1]
            st.bind(lane, "threadIdx.x")
            acc.compute_at(st, lane)
            names.add(acc.name)
        else:
            st.compute_at(O, at)
            st.set_scope("local")
    return names


def _row_members(s: Schedule, O: Stage) -> list[Stage]:
    """Row reductions whose readers (through inlined stages) are O or other row reductions computed with it."""
    readers = _effective_readers(s)
    cand = {st for st in s.stages if isinstance(st.op, ComputeOp) and st.op.tag in ROW_TAGS and not st.is_output
            and st.attach == "root"}  # fmt: skip
    changed = True
    while changed:
        changed = False
        for st in list(cand):
            if any(r is not O and r not in cand for r in readers.get(st, ())):
                cand.discard(st)
                changed = True
    return [st for st in s.stages if st in cand]


TEMPLATES = {"gemm": _gemm, "rows": _rows, "conv_oc": _conv, "conv_ow": _conv}
