"""Sketches by rules, and their random annotation: template-free schedules for any kernel's compute DAG.

A *sketch* is the structure of a schedule, decided by rules over the stages of a kernel (as Ansor does):

- every elementwise/injective stage that is not an output is inlined into its readers, unless the copies of
  it that one reader would hold grow past MAX_INLINE_NODES (a softmax's lane tree of maxima: each halving
  step reads its input four times, so six steps inlined are 4^6 loads and a C file of tens of megabytes);
- a reduction with data reuse (an input not indexed by every output axis: matmul, conv, depthwise conv) gets
  multi-level tiling: on CPUs "SSRSRS" (spatial loops in four levels, reduction loops in two), on GPUs
  "SSSRRSRS" (block, thread and register levels of the spatial loops; the reduction split twice inside the
  thread, the operands cached in shared memory per block, maybe double-buffered);
- such a reduction that is the kernel's output gets a write cache ("local"), and one read by an elementwise
  output of its shape (a fused epilogue: bias, activation) is computed inside that output's tile instead of a
  loop nest of its own (a consumer fused into the tiled producer);
- a long reduction without reuse (a row sum) may be split by `rfactor` into vectorized partial sums (on GPUs,
  `gpu.rfactor`: partial sums computed by as many threads per row, a kernel of their own, then combined by
  one thread per row, so that a few long rows still fill the device);
- on CPUs, a reuse reduction may instead be a register tile (`tile.reg`, what the GEMM and conv templates do):
  the output's last axis in whole vectors and its other axes a few rows each, as many as the vector registers
  hold, accumulated in a local tile at the output's tile loop, the reduction split outside the unrolled tile;
  the padding or packing stages it reads may be materialized (vectorized copies) instead of inlined; the
  kernel's other stages are scheduled around it as by the other rules;
- an elementwise stage read by several stages (a softmax's exp: its row sum and the output) may be computed
  once into a buffer instead of inlined into each reader;
- on CPUs, a kernel whose reductions are all short windows (pooling, depthwise convolution: a few taps, read at
  output position x stride + tap) may be a window tile (`window`): each output tiled over a block of channels,
  a few rows and a width of whole vectors, the window reduction it reads accumulated in a local tile at that
  tile's loop (the window outside, the tile unrolled inside, the width vectorized; the window optionally
  unrolled), the padded input inlined (the border partitioned off), at root, or copied per channel tile;
- every other stage (row reductions of softmax and normalizations, pooling) is computed at root or at a loop of
  the output, its spatial loop innermost so it vectorizes.

A sketch's free parameters (tile sizes, compute locations, which outer loops run parallel, which inner loops
are vectorized or unrolled, rfactor widths) are *decisions*, sampled by `Decider.pick` and stored by name:
`apply(sketch, outs, target, decisions)` replays them exactly, and a decision that is missing (or no longer
one of the choices) is sampled afresh. A candidate is therefore the pair (sketch name, decisions), and its
schedule is a plain `ember.te` step list that prints, logs and replays like any other.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ember import te
from ember.target import Target
from ember.te.lower import lower_schedule
from ember.te.schedule import Schedule, ScheduleError, Stage
from ember.te.tensor import ComputeOp, IterVar, Reduce, Tensor, TensorLoad
from ember.templates.gpu import INLINE_TAGS, is_gpu
from ember.templates.nn import lanes_of, vector_regs
from ember.tir.expr import Var
from ember.tir.functor import walk
from ember.tir.stmt import Allocate, For, PrimFunc

MAX_THREADS = 1024  # threads per GPU block
MAX_LOCAL = 256  # elements of a per-thread buffer
MAX_SHARED = 48 * 1024  # bytes of shared memory per block
MAX_UNROLL = 64  # iterations one unrolled nest may expand to
RFACTOR_MIN = 32  # shortest reduction that rfactor splits
MAX_REG_UNROLL = 256  # statements one unrolled register tile (with its reduction steps) may expand to
MAX_WINDOW = 64  # longest reduction (taps) that the window rule treats as a sliding window
MAX_INLINE_NODES = 512  # largest expression (tree nodes) that inlining a stage may copy into one reader


@dataclass(frozen=True)
class Sketch:
    """One schedule structure for a kernel: the rules that made it, by name (`tile`, `tile.cache`,
    `rows`, `rows.rfactor`, `gpu.tile.shared`, ...)."""

    name: str
    gpu: bool = False
    cache_write: bool = False  # a write cache for a reuse reduction that is the output
    rfactor: bool = False  # split long reductions without reuse into vectorized partial sums
    shared: bool = False  # GPU: the reuse reduction's operands cached in shared memory per block
    register: bool = False  # CPU: the reuse reduction as a register tile (vectorized columns, unrolled reduction)
    window: bool = False  # CPU: window reductions (pooling, depthwise) in local tiles of their outputs
    separable: bool = False  # window: each window reduction split by `separate` (column sums, then rows; a decision)


@dataclass
class Decider:
    """Answers a sketch's questions: the fixed decision where it is one of the choices, else a random one."""

    fixed: dict[str, Any] = field(default_factory=dict)
    rng: random.Random | None = None
    taken: dict[str, Any] = field(default_factory=dict)
    lanes: int = 0  # of the target's vectors (CPU), for `vectorize`

    def vectorize(self, name: str, extent: int) -> bool:
        """Whether to vectorize a loop of `extent`: always where it is whole vectors, else a decision."""
        whole = self.lanes > 1 and extent >= self.lanes and extent % self.lanes == 0
        return self.pick(name, [True] if whole else [True, False])

    def pick(self, name: str, choices: Sequence[Any]) -> Any:
        choices = list(choices)
        v = self.fixed.get(name)
        if v is None or v not in choices:
            v = self.rng.choice(choices) if self.rng is not None else choices[0]
        self.taken[name] = v
        return v


class SketchError(ValueError):
    """A sketch that does not apply to this compute, or an annotation that does not fit the target."""


# -- analysis of the compute DAG ------------------------------------------------------------------------
def is_reduce(st: Stage) -> bool:
    return isinstance(st.op, ComputeOp) and isinstance(st.op.body, Reduce)


def inlinable(st: Stage) -> bool:
    op = st.op
    if st.is_placeholder or st.is_output or not isinstance(op, ComputeOp) or isinstance(op.body, Reduce):
        return False
    return not op.attrs.get("materialize") or op.tag in INLINE_TAGS


def has_reuse(st: Stage) -> bool:
    """A reduction with an input not indexed by every output axis: each of its elements serves many outputs."""
    if not is_reduce(st):
        return False
    spatial = {iv.var for iv in st.op.axis if iv.dom[1] > 1}  # type: ignore[index]
    for n in walk(st.op.body):
        if isinstance(n, TensorLoad):
            used = {v for i in n.indices for v in walk(i) if isinstance(v, Var)}
            if spatial - used:
                return True
    return False


def is_window(st: Stage) -> bool:
    """A short reduction (at most MAX_WINDOW taps) that reads an input at a spatial index plus a reduction index
    (a sliding window: pooling, depthwise convolution), with at least two output axes."""
    if not is_reduce(st) or _reduce_extent(st) > MAX_WINDOW or len(st.op.axis) < 2:
        return False
    spatial = {iv.var for iv in st.op.axis}
    taps = {iv.var for iv in st.op.reduce_axis}
    for n in walk(st.op.body):
        if isinstance(n, TensorLoad):
            for i in n.indices:
                used = {v for v in walk(i) if isinstance(v, Var)}
                if used & spatial and used & taps:
                    return True
    return False


def _readers(s: Schedule) -> dict[Stage, list[Stage]]:
    """Stages that read each stage once inlined stages are looked through (the loops that do the reading)."""
    direct: dict[Stage, list[Stage]] = {}
    for st in s.stages:
        if isinstance(st.op, ComputeOp):
            for t in st.op.inputs:
                direct.setdefault(s[t], []).append(st)

    def effective(st: Stage, seen: frozenset = frozenset()) -> list[Stage]:
        out: list[Stage] = []
        for r in direct.get(st, []):
            if r in seen:
                continue
            for x in effective(r, seen | {r}) if r.attach == "inline" else [r]:
                if x not in out:
                    out.append(x)
        return out

    return {st: effective(st) for st in s.stages}


def sketches(outs: Sequence[Tensor], target: Target) -> list[Sketch]:
    """The sketches that apply to a kernel computing `outs`, by the rules of the module doc."""
    s = te.create_schedule(list(outs))
    stages = [st for st in s.stages if not st.is_placeholder and not inlinable(st)]
    reuse = any(has_reuse(st) for st in stages)
    long_rows = any(is_reduce(st) and not has_reuse(st) and _reduce_extent(st) >= RFACTOR_MIN for st in stages)
    if is_gpu(target):
        out = [Sketch("gpu.flat", gpu=True)]
        if reuse:
            out += [Sketch("gpu.tile", gpu=True), Sketch("gpu.tile.shared", gpu=True, shared=True)]
        if long_rows:
            out.append(Sketch("gpu.rfactor", gpu=True, rfactor=True))
        return out
    out = [Sketch("tile" if reuse else "rows")]
    if reuse and any(st.is_output and has_reuse(st) for st in stages):
        out.append(Sketch("tile.cache", cache_write=True))
    if reuse and _register_reduction(s, inline=True) is not None:
        out.append(Sketch("tile.reg", register=True))
    if long_rows:
        out.append(Sketch("rows.rfactor" if not reuse else "tile.rfactor", rfactor=True))
    reductions = [st for st in stages if is_reduce(st)]
    if reductions and all(is_window(st) for st in reductions):
        out.append(Sketch("window", window=True))
        if any(_separate(te.create_schedule(list(outs)), st.name) for st in reductions):
            out.append(Sketch("window.sep", window=True, separable=True))
    return out


def _separate(s: Schedule, name: str, d: Decider | None = None) -> Stage | None:
    """Split window reduction `name` of s by one of its taps (`Schedule.separate`), a decision (first choice the
    first tap: a pooling window's rows, so that the partial sums are column sums read in whole vectors at any
    stride; at stride 2 they beat row sums, whose taps are stride-2 loads, 25 vs 41 us on a 3x3 pool of 64
    channels at 56x56); the partial stage, or None where its window is not separable (one tap, a weighted window:
    a depthwise convolution's). Only taps that separate are offered."""
    st = s[name]
    taps = [iv.name for iv in st.op.reduce_axis]
    ok = [tap for tap in taps if len(taps) > 1 and _separable(s, name, tap)]
    if not ok:
        return None
    tap = d.pick(f"{name}.separate", ok) if d is not None else ok[0]
    return s[s.separate(st.op.output(), tap)]


def _separable(s: Schedule, name: str, tap: str) -> bool:
    trial = te.create_schedule(list(s.outputs))
    try:
        trial.separate(trial[name].op.output(), tap)
    except ScheduleError:
        return False
    return True


def _reduce_extent(st: Stage) -> int:
    return math.prod(iv.dom[1] for iv in st.op.reduce_axis)  # type: ignore[index]


# -- annotation helpers ------------------------------------------------------------------------------
def tile_choices(n: int, limit: int = 64) -> list[int]:
    """Inner tile sizes for a loop of extent n: its divisors and the powers of two, up to `limit`."""
    out = {d for d in range(1, min(n, limit) + 1) if n % d == 0}
    out |= {1 << p for p in range(7) if (1 << p) <= min(n, limit)}
    return sorted(out)


def split_levels(st: Stage, iv: IterVar, levels: int, d: Decider, key: str, limit: int = 64) -> list[IterVar]:
    """Split loop iv into `levels` loops, outermost first; the inner levels' sizes are decisions."""
    n = iv.dom[1] if iv.dom is not None else 1
    parts: list[IterVar] = []
    cur = iv
    for lvl in range(levels - 1, 0, -1):
        f = d.pick(f"{key}.{lvl}", tile_choices(max(1, n), limit))
        cur, inner = st.split(cur, f)
        parts.insert(0, inner)
        n = -(-n // f)
    return [cur, *parts]


def _unroll(st: Stage, loops: list[IterVar], extents: dict[IterVar, int], limit: int = MAX_UNROLL) -> None:
    """Unroll the given loops (innermost first) while the expansion stays within `limit`."""
    total = 1
    for iv in reversed(loops):
        e = extents.get(iv, 1)
        if total * e > limit:
            break
        st.unroll(iv)
        total *= e


# -- applying a sketch ------------------------------------------------------------------------------
def apply(sketch: Sketch, outs: Sequence[Tensor], target: Target, decisions: dict | None = None,
          rng: random.Random | None = None) -> tuple[Schedule, dict]:  # fmt: skip
    """The schedule of `sketch` for `outs` under `decisions` (missing ones drawn from `rng`, or the first
    choice); returns it with the decisions taken (all of them: `apply` with those gives the same steps)."""
    d = Decider(dict(decisions or {}), rng, lanes=0 if sketch.gpu else lanes_of("float32", target))
    s = te.create_schedule(list(outs))
    windows = [st for st in s.stages if is_window(st)] if sketch.separable else []
    seps = [sep for sep in (_separate(s, st.name, d) for st in windows) if sep is not None]
    layouts = _layout_stages(s) if sketch.register else []
    pads = _pad_stages(s) if sketch.window else []
    optional = layouts + pads + ([] if sketch.gpu else _shared_stages(s))
    sizes: dict[Stage, int] = {}
    uses = _uses(s)
    for st in s.stages:
        first = [False, True] if st in pads else [True, False]  # window: a padded copy per channel tile first
        if not inlinable(st) or _inlined_size(s, st, sizes) * uses.get(st, 1) > MAX_INLINE_NODES:
            continue
        if st not in optional or d.pick(f"{st.name}.inline", first):
            st.compute_inline()
    if sketch.register:
        _apply_register(s, d, target, [st for st in layouts if st.attach != "inline"])
    elif sketch.gpu:
        _apply_gpu(sketch, s, d)
    elif sketch.window:
        _apply_window(s, d, target, [st for st in pads if st.attach != "inline"], seps)
    else:
        _apply_cpu(sketch, s, d, target)
    return s, d.taken


def _inlined_size(s: Schedule, st: Stage, sizes: dict[Stage, int]) -> int:
    """The nodes of st's body with the stages already inlined into it expanded, one copy per use (what the
    kernel's expression tree will hold); recorded in `sizes`. A lane tree's halving steps read their input four
    times each (max(a, b) is a < b ? b : a): inlined, six steps of them make one expression of 4^6 loads."""
    total = 0
    for n in walk(st.op.body):
        inner = s[n.tensor] if isinstance(n, TensorLoad) else None
        total += sizes.get(inner, 1) if inner is not None and inner.attach == "inline" else 1
    sizes[st] = total
    return total


def _uses(s: Schedule) -> dict[Stage, int]:
    """The most reads of each stage in one reader's body (a copy of it each, once it is inlined)."""
    out: dict[Stage, int] = {}
    for r in s.stages:
        if isinstance(r.op, ComputeOp):
            count: dict[Stage, int] = {}
            for n in walk(r.op.body):
                if isinstance(n, TensorLoad):
                    count[s[n.tensor]] = count.get(s[n.tensor], 0) + 1
            for st, k in count.items():
                out[st] = max(out.get(st, 0), k)
    return out


def _roots(s: Schedule) -> list[Stage]:
    return [st for st in s.stages if not st.is_placeholder and st.attach != "inline"]


def _fused_producer(s: Schedule, O: Stage) -> Stage | None:
    """A reuse reduction read only by output O (elementwise, same shape): computed inside O's tiles."""
    if is_reduce(O):
        return None
    readers = _readers(s)
    for st in _roots(s):
        if st is not O and has_reuse(st) and readers.get(st) == [O] and tuple(st.op.shape) == tuple(O.op.shape):
            return st
    return None


def _apply_cpu(sketch: Sketch, s: Schedule, d: Decider, target: Target, done: tuple[Stage, ...] = ()) -> None:
    """`done`: stages already scheduled (at root), left as they are."""
    outputs = [st for st in _roots(s) if st.is_output]
    O = outputs[0]
    if sketch.cache_write and has_reuse(O):
        s.cache_write(O.op.output(), "local")
    if sketch.rfactor and is_reduce(O) and not has_reuse(O) and O.op.reduce_axis[-1].dom[1] >= RFACTOR_MIN:
        f = d.pick(f"{O.name}.rfactor", [0, 4, 8, 16])  # the partial sums: a producer of O, scheduled below
        if f:
            s.rfactor(O.op.output(), O.op.reduce_axis[-1].name, f)
    P = _fused_producer(s, O)
    threads = target.threads or 1
    # the output's loops
    spatial = list(O.op.axis)
    if is_reduce(O) and has_reuse(O):  # SSRSRS
        levels = [split_levels(O, iv, 4, d, f"{O.name}.{iv.name}") for iv in spatial]
        red = [split_levels(O, iv, 2, d, f"{O.name}.{iv.name}") for iv in O.op.reduce_axis]
        order = ([lv[0] for lv in levels] + [lv[1] for lv in levels] + [r[0] for r in red] + [lv[2] for lv in levels]
                 + [r[1] for r in red] + [lv[3] for lv in levels])  # fmt: skip
        O.reorder(*order)
        inner = [lv[3] for lv in levels]
        _vectorize_unroll(O, inner, [r[1] for r in red], d, levels)
        outer = [lv[0] for lv in levels]
        at_loops = [lv[0] for lv in levels] + [lv[1] for lv in levels]
    else:
        levels = [split_levels(O, iv, 3, d, f"{O.name}.{iv.name}") for iv in spatial]
        red = list(O.op.reduce_axis)
        order = [lv[0] for lv in levels] + [lv[1] for lv in levels] + red + [lv[2] for lv in levels]
        if order:
            O.reorder(*order)
        _vectorize_unroll(O, [lv[2] for lv in levels], [], d, levels)
        outer = [lv[0] for lv in levels]
        at_loops = [lv[0] for lv in levels] + [lv[1] for lv in levels]
    par = O.fuse(*outer) if len(outer) > 1 else (outer[0] if outer else None)
    if par is not None:
        at_loops = [par] + at_loops[len(outer):]
        if d.pick(f"{O.name}.parallel", [True, False] if threads > 1 else [False]):
            O.parallel(par)
    # producers: innermost consumer first
    attached: set[Stage] = set()
    readers = _readers(s)
    for st in reversed(_roots(s)):
        if st is O or st.is_output or st in done:
            continue
        if st is P:
            loc = d.pick(f"{st.name}.at", list(range(len(at_loops)))) if at_loops else None
            if loc is None:
                _tile_root(st, d, threads, sketch)
                continue
            st.compute_at(O, at_loops[loc])
            st.set_scope("local")
            attached.add(st)
            _tile_reuse_inner(st, d)
            continue
        rs = readers.get(st, [])
        # inside every reader: O itself, or a stage computed at O's loop `at_loops[i]` (then only loops up to i)
        limit = len(at_loops) - 1
        for r in rs:
            if r is not O:
                limit = min(limit, at_loops.index(r.attach_axis)) if r in attached else -1
        loc = d.pick(f"{st.name}.at", ["root"] + list(range(limit + 1)))
        if loc != "root":
            st.compute_at(O, at_loops[loc])
            attached.add(st)
            _tile_rows(s, st, d, sketch, root=False, threads=threads)
        else:
            _tile_rows(s, st, d, sketch, root=True, threads=threads)
    for extra in outputs[1:]:
        _tile_rows(s, extra, d, sketch, root=True, threads=threads)


def _vectorize_unroll(st: Stage, inner: list[IterVar], red_inner: list[IterVar], d: Decider, levels) -> None:
    extents = {lv[-1]: d.taken.get(f"{st.name}.{iv.name}.{len(lv) - 1}", 1) for lv, iv in zip(levels, st.op.axis)}
    if inner and d.vectorize(f"{st.name}.vectorize", extents.get(inner[-1], 1)) and extents.get(inner[-1], 1) > 1:
        st.vectorize(inner[-1])
        rest = inner[:-1]
    else:
        rest = inner
    if d.pick(f"{st.name}.unroll", [True, False]):
        ext = dict(extents)
        for r, iv in zip(red_inner, st.op.reduce_axis):  # their sizes are the decisions of the 2-level splits
            ext[r] = d.taken.get(f"{st.name}.{iv.name}.1", MAX_UNROLL)
        _unroll(st, red_inner + rest, ext)


def _tile_reuse_inner(st: Stage, d: Decider) -> None:
    """A reuse reduction computed inside its consumer's tile: R S R S (reduction outer, register tile inner)."""
    spatial = list(st.op.axis)
    lv = [split_levels(st, iv, 2, d, f"{st.name}.{iv.name}") for iv in spatial]
    red = [split_levels(st, iv, 2, d, f"{st.name}.{iv.name}") for iv in st.op.reduce_axis]
    st.reorder(*([r[0] for r in red] + [x[0] for x in lv] + [r[1] for r in red] + [x[1] for x in lv]))
    _vectorize_unroll(st, [x[1] for x in lv], [r[1] for r in red], d, lv)


def _tile_root(st: Stage, d: Decider, threads: int, sketch: Sketch) -> None:
    lv = [split_levels(st, iv, 2, d, f"{st.name}.{iv.name}") for iv in st.op.axis]
    red = list(st.op.reduce_axis)
    order = [x[0] for x in lv] + red + [x[1] for x in lv]
    if order:
        st.reorder(*order)
    _vectorize_unroll(st, [x[1] for x in lv], [], d, lv)
    outer = [x[0] for x in lv]
    if outer:
        par = st.fuse(*outer) if len(outer) > 1 else outer[0]
        if d.pick(f"{st.name}.parallel", [True, False] if threads > 1 else [False]):
            st.parallel(par)


def _tile_rows(s: Schedule, st: Stage, d: Decider, sketch: Sketch, root: bool, threads: int) -> None:
    """A stage without reuse: optionally rfactor its (last) long reduction into vectorized partial sums; its
    innermost spatial loop moved inside the reduction (S R S) so it vectorizes."""
    long = is_reduce(st) and st.op.reduce_axis and st.op.reduce_axis[-1].dom[1] >= RFACTOR_MIN
    if sketch.rfactor and long and not st.name.endswith(".rf"):
        k = st.op.reduce_axis[-1]
        f = d.pick(f"{st.name}.rfactor", [0, 4, 8, 16])
        if f:
            rf = s[s.rfactor(st.op.output(), k.name, f)]
            if root:
                _tile_root(st, d, threads, sketch)
            leaf_spatial = [iv for iv in st.leaf_iter_vars if iv.kind == "data"]
            if leaf_spatial:
                rf.compute_at(st, leaf_spatial[-1])
                rf.set_scope("local")
            else:
                rf.compute_root()
            *sp, lane = rf.op.axis
            rf.reorder(*sp, *rf.op.reduce_axis, lane)
            rf.vectorize(lane)
            return
    if root:
        _tile_root(st, d, threads, sketch)
        return
    if not st.op.reduce_axis and st.op.axis and st.op.axis[-1].dom[1] > 1:  # an elementwise stage kept
        if d.vectorize(f"{st.name}.vectorize", st.op.axis[-1].dom[1]):
            st.vectorize(st.op.axis[-1])
        return
    if st.op.axis and st.op.reduce_axis and st.op.axis[-1].dom[1] > 1:
        last = st.op.axis[-1]
        st.reorder(*st.op.reduce_axis, last)
        if d.vectorize(f"{st.name}.vectorize", st.op.axis[-1].dom[1]):
            st.vectorize(last)


# -- register tiles (CPU) -----------------------------------------------------------------------------
def _layout_stages(s: Schedule) -> list[Stage]:
    """Inlinable stages that a reuse reduction reads directly (padding, packing into panels): each may be
    materialized at root instead, so that the reduction's inner loop reads a plain, contiguous buffer."""
    out: list[Stage] = []
    for st in s.stages:
        if is_reduce(st) and has_reuse(st):
            out += [s[t] for t in st.op.inputs if inlinable(s[t]) and s[t] not in out]
    return out


def _shared_stages(s: Schedule) -> list[Stage]:
    """Inlinable stages read by two or more stages (the exp of a softmax: its row sum and the output): inlined,
    each reader recomputes them; each may be computed once into a buffer instead."""
    readers: dict[Stage, int] = {}
    for st in s.stages:
        if isinstance(st.op, ComputeOp):
            for t in dict.fromkeys(st.op.inputs):
                readers[s[t]] = readers.get(s[t], 0) + 1
    return [st for st in s.stages if inlinable(st) and readers.get(st, 0) >= 2]


def _register_reduction(s: Schedule, inline: bool = False) -> Stage | None:
    """The reuse reduction that the output is, or that is fused into the output (elementwise, same shape), else
    the first one (computed at root, the kernel's other stages scheduled around it)."""
    if inline:
        for st in s.stages:
            if inlinable(st):
                st.compute_inline()
    outputs = [st for st in _roots(s) if st.is_output]
    if not outputs:
        return None
    O = outputs[0]
    if has_reuse(O):
        return O
    return _fused_producer(s, O) or next((st for st in _roots(s) if has_reuse(st)), None)


def _apply_register(s: Schedule, d: Decider, target: Target, layouts: list[Stage]) -> None:
    """The reuse reduction accumulated in a register tile at the output's tile loop: the output's last axis in
    whole vectors, its other axes a few rows each, as many as the vector registers hold; inside, the reduction
    (split into outer and unrolled inner steps) outside the unrolled tile (as the GEMM and conv templates do)."""
    R = _register_reduction(s)
    if R is None:
        raise SketchError("tile.reg: no reuse reduction")
    out = next(st for st in _roots(s) if st.is_output)
    # fused into the output's tile: read by it alone, axis for axis (it may read a part: a GEMM padded to panels)
    fused = not R.is_output and not is_reduce(out) and _readers(s).get(R) == [out]
    fused = fused and len(R.op.shape) == len(out.op.shape)
    if fused:
        L, O = R, next(st for st in _roots(s) if st.is_output)
        L.set_scope("local")
    else:  # the reduction into a local tile, copied out by the stage of its name
        L = s[s.cache_write(R.op.output(), "local")]
        O = next(st for st in s.stages if st.name == R.name)
    _register_tile(O, L, d, target)
    for st in layouts:  # a copy: its last axis in whole vectors
        last = st.op.axis[-1]
        lanes = lanes_of(st.op.output().dtype, target)
        st.vectorize(last if last.dom[1] <= 4 * lanes else st.split(last, lanes)[1])
    if not O.is_output:
        _apply_cpu(Sketch("rows"), s, d, target, done=(O, L, *layouts))


def _register_tile(O: Stage, L: Stage, d: Decider, target: Target) -> None:
    threads = target.threads or 1
    lanes = lanes_of(L.op.output().dtype, target)
    axes = list(O.op.axis)
    n_last = axes[-1].dom[1]
    vec = [lanes * m for m in (1, 2, 3, 4) if lanes * m <= n_last] or [n_last]
    nr = d.pick(f"{L.name}.nr", vec)
    room = max(1, (vector_regs(target) - 2) // max(1, -(-nr // lanes)))
    tile = {axes[-1]: nr}
    for iv in reversed(axes[:-1]):
        m = d.pick(f"{L.name}.{iv.name}.reg", list(range(1, min(iv.dom[1], room) + 1)))
        tile[iv] = m
        room = max(1, room // m)
    outer, inner, size = [], [], {}
    for iv in axes:
        if tile[iv] >= iv.dom[1]:
            inner.append(iv)
            size[iv] = iv.dom[1]
            continue
        o, i = O.split(iv, tile[iv])
        outer.append(o)
        inner.append(i)
        size[i] = tile[iv]
    if len(outer) >= 2 and d.pick(f"{O.name}.swap", [False, True]):
        outer[-2], outer[-1] = outer[-1], outer[-2]  # column tiles outside: one panel of the operand stays in cache
    O.reorder(*outer, *inner)
    if tile[axes[-1]] > lanes:
        jo, ji = O.split(inner[-1], lanes)
        O.vectorize(ji)
        _unroll(O, [*inner[:-1], jo], {**size, jo: -(-nr // lanes)})
    else:
        O.vectorize(inner[-1])
        _unroll(O, inner[:-1], size)
    if outer:  # fused only to run parallel: apart, the partial tiles at their ends are partitioned off the others
        if d.pick(f"{O.name}.parallel", [True, False] if threads > 1 else [False]):
            at = O.fuse(*outer) if len(outer) > 1 else outer[0]
            O.parallel(at)
        else:
            at = outer[-1]
            O.pragma(at, "exact_tail")  # serial tile loops: the tail tiles computed exactly (partitioned off)
        L.compute_at(O, at)
    # the accumulation: reduction loops outside, the unrolled register tile inside, its last axis vectorized
    red = [split_levels(L, iv, 2, d, f"{L.name}.{iv.name}", limit=16) for iv in L.op.reduce_axis]
    *rows, last = L.op.axis
    ext = {iv: tile[a] for iv, a in zip(L.op.axis, axes)}
    for r, iv in zip(red, L.op.reduce_axis):
        ext[r[1]] = d.taken.get(f"{L.name}.{iv.name}.1", 1)
    if nr > lanes:
        lo, li = L.split(last, lanes)
        ext[lo] = -(-nr // lanes)
        tail = [lo, li]
    else:
        tail = [last]
    L.reorder(*[r[0] for r in red], *[r[1] for r in red], *rows, *tail)
    L.vectorize(tail[-1])
    _unroll(L, [r[1] for r in red] + rows + tail[:-1], ext, MAX_REG_UNROLL)


# -- window tiles (CPU) -------------------------------------------------------------------------------
def _pad_stages(s: Schedule) -> list[Stage]:
    """Padded copies of an input (`nn_pad`) that a window reduction reads: inlined (the padded border is then
    partitioned off the window's loops), or materialized at root or per channel tile."""
    out: list[Stage] = []
    for st in s.stages:
        if is_window(st):
            out += [s[t] for t in st.op.inputs if inlinable(s[t]) and s[t].op.tag == "nn_pad" and s[t] not in out]
    return out


def _apply_window(s: Schedule, d: Decider, target: Target, pads: list[Stage], seps: list[Stage]) -> None:
    """Each output tiled over (lead axes, channel block, rows, width); the window reduction that it alone reads
    (same shape: the pooling divide, a bias) or that it is (through a write cache) is accumulated in a local tile
    at the output's width loop: the window's taps outside, the tile's channels and rows unrolled inside, its width
    in vectors. A materialized padded input is computed at root or at the output's channel-tile loop; a separated
    window's partial stage (`seps`) at root or at the output's channel-tile or row-tile loop."""
    readers = _readers(s)
    tiles: dict[Stage, tuple[IterVar, IterVar]] = {}  # each output's outermost (lead and channel tile) and row loop
    locals_: dict[Stage, Stage] = {}  # each window reduction's local tile -> the output that holds it
    for O in [st for st in _roots(s) if st.is_output]:
        if O.attach != "root":
            continue
        shape = tuple(O.op.shape)
        R = next((st for st in _roots(s) if not st.is_output and is_window(st) and readers.get(st) == [O]
                  and tuple(st.op.shape) == shape), None)  # fmt: skip
        if R is None and is_window(O):
            name = O.name
            R = s[s.cache_write(O.op.output(), "local")]
            O = next(st for st in s.stages if st.name == name)
        elif R is not None:
            R.set_scope("local")
        tiles[O] = _window_tile(O, R, d, target)
        if R is not None:
            locals_[R] = O
    readers = _readers(s)
    for P in seps:  # a separated window's partial sums: per row tile, per channel tile, or at root
        users = [r for r in readers.get(P, []) if r in locals_]
        O = locals_[users[0]] if users and users == readers.get(P) else None
        where = d.pick(f"{P.name}.at", ["rows", "tile", "root"] if O is not None else ["root"])
        if where != "root" and O is not None:
            P.compute_at(O, tiles[O][where == "rows"])
            locals_[P] = O
        _partial_rows(P, d, target)
    for P in pads:
        users = [r for r in readers.get(P, []) if r in locals_]
        where = (["tile"] if len(users) == 1 and users == readers.get(P) else []) + ["root"]  # first: the rule's
        O = locals_[users[0]] if users else None
        if d.pick(f"{P.name}.at", where) == "tile" and O is not None:
            P.compute_at(O, tiles[O][0])
        _vector_rows(P, d, target)
    for st in _roots(s):  # anything left (a window reduction read by several stages): at root, tiled plainly
        if st.attach == "root" and st not in tiles and st not in pads and st not in seps:
            _tile_root(st, d, target.threads or 1, Sketch("rows"))


def _window_tile(O: Stage, R: Stage | None, d: Decider, target: Target) -> tuple[IterVar, IterVar]:
    """Tile output O over its last three axes (channels, rows, width: each a decision, the accumulators within
    the vector registers), R (a window reduction, or None) accumulated in a local tile at the width loop; returns
    O's outer loop (its lead axes and channel tiles fused) and its row-tile loop."""
    lanes = min(lanes_of(st.op.output().dtype, target) for st in (R or O, O))  # int64 indices: 8-lane vectors
    *lead, h, w = O.op.axis
    c = lead.pop() if lead else None
    n_w, n_h = w.dom[1], h.dom[1]  # type: ignore[index]
    widths = sorted({lanes * m for m in (1, 2, 3, 4) if lanes * (m - 1) < n_w} | {v for v in (lanes // 2, lanes // 4)
                     if v >= 4 and v < n_w} or {n_w})  # fmt: skip
    widths.sort(key=lambda v: v != lanes)  # the first choice (the rule's, see `rule_candidates`): one vector wide
    width = d.pick(f"{O.name}.width", widths)
    vec = min(width, lanes)
    nvec = -(-width // vec)
    room = max(1, (vector_regs(target) - 4) // nvec)
    # rows: the most that divide the height (no partial tile) and fit the registers first
    rows = sorted((r for r in (1, 2, 3, 4, 7) if r <= min(n_h, room)), key=lambda r: (n_h % r != 0, -r)) or [1]
    rows = d.pick(f"{O.name}.rows", rows)
    n_c = c.dom[1] if c is not None else 1  # type: ignore[index]
    block = d.pick(f"{O.name}.block", [b for b in (1, 2, 4, 8) if b <= min(n_c, max(1, room // rows))] or [1])
    ho, hi = O.split(h, rows)
    wo, wi = O.split(w, width, tail=_tail(O, width, n_w))
    if c is not None:
        co, ci = O.split(c, block)
        outer, tile = [*lead, co, ho, wo], [ci, hi, wi]
    else:
        outer, tile = [*lead, ho, wo], [hi, wi]
    O.reorder(*outer, *tile)
    for iv in tile[:-1]:
        O.unroll(iv)
    if nvec > 1:
        wio, wii = O.split(wi, vec)
        O.unroll(wio)
        _vectorize(O, wii)
    else:
        _vectorize(O, wi)
    top = O.fuse(*outer[:-2]) if len(outer) > 3 else outer[0]
    if len(outer) > 2 and d.pick(f"{O.name}.parallel", [True, False] if (target.threads or 1) > 1 else [False]):
        O.parallel(top)
    if R is None:
        return top, ho
    R.compute_at(O, wo)
    *rlead, rh, rw = R.op.axis
    taps = list(R.op.reduce_axis)
    if nvec > 1:
        rwo, rwi = R.split(rw, vec)
        R.reorder(*rlead, *taps, rh, rwo, rwi)
        R.unroll(rwo)
    else:
        rwi = rw
        R.reorder(*rlead, *taps, rh, rw)
    _vectorize(R, rwi)
    R.unroll(rh)
    if rlead and c is not None:
        R.unroll(rlead[-1])
    if d.pick(f"{R.name}.unroll_window", [False, True]):
        _unroll(R, taps, {iv: iv.dom[1] for iv in taps}, MAX_UNROLL)  # type: ignore[misc]
    return top, ho


def _partial_rows(P: Stage, d: Decider, target: Target) -> None:
    """A separated window's partial stage (`<name>.sep`: a row of tap sums per input row): its last axis in
    vectors, its taps unrolled outside them."""
    *lead, last = P.op.axis
    taps = list(P.op.reduce_axis)
    lanes = lanes_of(P.op.output().dtype, target)
    if last.dom[1] > lanes:  # type: ignore[index]
        lo, li = P.split(last, lanes)
        P.reorder(*lead, lo, *taps, li)
        _vectorize(P, li)
    else:
        P.reorder(*lead, *taps, last)
        if d.vectorize(f"{P.name}.vectorize", last.dom[1]):  # type: ignore[arg-type]
            P.vectorize(last)
    _unroll(P, taps, {iv: iv.dom[1] for iv in taps}, MAX_UNROLL)  # type: ignore[misc]


def _vectorize(st: Stage, iv: IterVar) -> None:
    """Vectorize iv; where the loop partition peels the lanes of a padded border off a vector (the first vector
    of a row reads column -1), the rest (15 lanes) are vectors of 8, 4, 2 and 1, not a scalar loop."""
    st.vectorize(iv)
    st.pragma(iv, "vector_pieces", 1)


def _tail(st: Stage, factor: int, n: int) -> str:
    """How a split of a loop of extent n by `factor` ends: a partial last tile of a stage without reduction
    (an output, a copy) is shifted back to end at n, so that it is whole vectors too (it recomputes a few
    elements); a reduction's is guarded."""
    return "shift" if n > factor and n % factor and not is_reduce(st) else "guard"


def _vector_rows(st: Stage, d: Decider, target: Target) -> None:
    """A copy (the padded input): its last axis in vectors (a last partial vector shifted back to end at the
    row's end)."""
    last = st.op.axis[-1]
    lanes = lanes_of(st.op.output().dtype, target)
    if last.dom[1] > lanes:  # type: ignore[index]
        _vectorize(st, st.split(last, lanes, tail=_tail(st, lanes, last.dom[1]))[1])
    elif d.vectorize(f"{st.name}.vectorize", last.dom[1]):  # type: ignore[arg-type]
        st.vectorize(last)


# -- GPU ---------------------------------------------------------------------------------------------
def _bind_flat(st: Stage, d: Decider) -> IterVar | None:
    """Fuse a root stage's spatial loops into blockIdx.x x threadIdx.x (x an unrolled per-thread part)."""
    axes = list(st.op.axis)
    size = math.prod(st.op.shape)
    if not axes or size == 0:
        return None
    fused = st.fuse(*axes) if len(axes) > 1 else axes[0]
    per = d.pick(f"{st.name}.per_thread", [1, 2, 4] if size >= 4096 else [1])
    nt = d.pick(f"{st.name}.threads", [t for t in (32, 64, 128, 256, 512) if t <= max(32, size)])
    if per > 1:
        fused, ii = st.split(fused, per)
    bx, tx = st.split(fused, nt)
    st.bind(bx, "blockIdx.x")
    st.bind(tx, "threadIdx.x")
    if per > 1:
        st.reorder(bx, tx, ii)
        st.unroll(ii)
    return tx


def _gpu_rfactor(s: Schedule, d: Decider) -> None:
    """Each long reduction without reuse split into partial sums (a stage of their own, bound flat like any
    root stage: rows x parts threads); its own stage then combines the parts."""
    for st in _roots(s):
        if is_reduce(st) and not has_reuse(st) and st.op.reduce_axis[-1].dom[1] >= RFACTOR_MIN:
            f = d.pick(f"{st.name}.rfactor", [0, 8, 16, 32, 64])
            if f:
                s.rfactor(st.op.output(), st.op.reduce_axis[-1].name, f)


def _apply_gpu(sketch: Sketch, s: Schedule, d: Decider) -> None:
    if sketch.rfactor:
        _gpu_rfactor(s, d)
    outputs = [st for st in _roots(s) if st.is_output]
    O = outputs[0]
    tiled = sketch.name.startswith("gpu.tile")
    if tiled and is_reduce(O) and has_reuse(O):
        s.cache_write(O.op.output(), "local")
    P = _fused_producer(s, O) if tiled else None
    thread = None
    if P is not None:
        thread, nthreads = _gpu_tile_output(O, d)
        P.compute_at(O, thread)
        P.set_scope("local")
        red = [split_levels(P, iv, 2, d, f"{P.name}.{iv.name}", limit=16) for iv in P.op.reduce_axis]
        P.reorder(*([r[0] for r in red] + [r[1] for r in red] + list(P.op.axis)))
        for iv in P.op.axis:
            P.unroll(iv)
        if sketch.shared and red:
            operands = [t for t in dict.fromkeys(P.op.inputs) if t.ndim >= 2]
            double = d.pick(f"{P.name}.double_buffer", [False, True])  # prefetch the next operand tiles
            for t in operands:
                C = s[s.cache_read(t, "shared", [P])]
                C.compute_at(P, red[-1][0])
                f = C.fuse(*C.op.axis) if len(C.op.axis) > 1 else C.op.axis[0]
                _, tx = C.split(f, nthreads)
                C.bind(tx, "threadIdx.x")
                if double:
                    C.double_buffer()
    else:
        thread = _bind_flat(O, d)
    readers = _readers(s)
    for st in reversed(_roots(s)):
        if st is O or st is P or st.attach == "at":
            continue
        rs = readers.get(st, [])
        fold = not st.is_output and thread is not None and rs == [O]
        fold = fold and math.prod(st.op.shape) >= math.prod(O.op.shape)
        if fold and d.pick(f"{st.name}.at", ["thread", "root"]) == "thread":
            st.compute_at(O, thread)
            st.set_scope("local")
        else:
            _bind_flat(st, d)


def _gpu_tile_output(O: Stage, d: Decider) -> tuple[IterVar, int]:
    """SSS: each spatial loop of O split into block, thread and register levels; blocks and threads fused."""
    blocks, threads, regs, nthreads = [], [], [], 1
    for iv in O.op.axis:
        n = iv.dom[1]  # type: ignore[index]
        r = d.pick(f"{O.name}.{iv.name}.reg", [f for f in tile_choices(n, 8)])
        cap = max(1, MAX_THREADS // nthreads)
        t = d.pick(f"{O.name}.{iv.name}.thr", [f for f in tile_choices(-(-n // r), 32) if f <= cap])
        rest, ri = O.split(iv, r)
        bo, ti = O.split(rest, t)
        blocks.append(bo)
        threads.append(ti)
        regs.append(ri)
        nthreads *= min(t, -(-n // r))
    O.reorder(*blocks, *threads, *regs)
    b = O.fuse(*blocks) if len(blocks) > 1 else blocks[0]
    t = O.fuse(*threads) if len(threads) > 1 else threads[0]
    O.bind(b, "blockIdx.x")
    O.bind(t, "threadIdx.x")
    for r in regs:
        O.unroll(r)
    return t, nthreads


# -- checking and sampling -----------------------------------------------------------------------------
def check(sch: Schedule, args: Sequence[Tensor], target: Target) -> PrimFunc:
    """The schedule's loop nest (before loop passes); SketchError unless it lowers, and on GPUs fits a block
    (threads, local and shared memory)."""
    try:
        func = lower_schedule(sch, args, "candidate")
    except ScheduleError as e:
        raise SketchError(str(e)) from e
    if not is_gpu(target):
        return func
    shared = 0
    for n in walk(func.body):
        if isinstance(n, Allocate):
            if n.buffer.scope == "local" and n.buffer.size > MAX_LOCAL:
                raise SketchError(f"per-thread buffer {n.buffer.name} has {n.buffer.size} elements")
            if n.buffer.scope == "shared":
                shared += n.buffer.nbytes
        if isinstance(n, For) and (n.thread_tag or "").startswith("threadIdx"):
            ext = n.extent.value if hasattr(n.extent, "value") else MAX_THREADS + 1
            if ext > MAX_THREADS:
                raise SketchError(f"{ext} threads per block")
    if shared > MAX_SHARED:
        raise SketchError(f"{shared} bytes of shared memory per block")
    return func


def rule_candidates(sketch: Sketch, outs: Sequence[Tensor], target: Target) -> list[dict]:
    """Decisions of the rule's own choices for a sketch, tried before random ones: the window sketch's first
    choice of every decision (one vector wide, the most rows that divide the height, a padded copy per channel
    tile), and the same with the padded input inlined (its border partitioned off); none for other sketches."""
    if not sketch.window:
        return []
    _, first = apply(sketch, outs, target, None, None)
    out = [first]
    flipped = {k: (not v if k.endswith(".inline") else v) for k, v in first.items()}
    if flipped != first:
        out.append(flipped)
    return out


def sample(sketch: Sketch, outs: Sequence[Tensor], args: Sequence[Tensor], target: Target, rng: random.Random,
           tries: int = 20) -> tuple[Schedule, dict]:  # fmt: skip
    """A random valid annotation of `sketch`: (schedule, decisions); SketchError if none of `tries` fits."""
    last = ""
    for _ in range(tries):
        try:
            sch, dec = apply(sketch, outs, target, None, rng)
            check(sch, args, target)
            return sch, dec
        except (SketchError, ScheduleError) as e:
            last = str(e)
    raise SketchError(f"sketch {sketch.name}: no valid annotation in {tries} tries ({last})")
