"""Compute/schedule templates of the blocked layout NCHW[x]c, for the ops of `ember.ops.layout`.

A blocked tensor [N, C/x, H, W, x] holds x channels (one vector of the target) contiguously at each
pixel, so channel vectors load and store whole, at any stride:

- dense convolution (`conv_nchwc_acc`, template "conv_nchwc"): a register tile of `owt` output
  positions x `kbt` blocks of output channels, each block one vector; the input element of each
  position is broadcast and multiplied by the weight vectors, weights pre-packed at compile time as
  [K/kb, C/cb, KH, KW, cb, kb] (`ember.passes.layout` folds the re-layout of the constant). The
  reduction loops (input channel blocks, kernel rows, kernel columns, channels of a block) run
  outside the tile, the input channels of a block innermost: both operands are read contiguously.
- window reductions with one channel vector per position (`window_nchwc_acc`, template
  "window_nchwc"): depthwise convolution, max/average pooling, global pooling. A tile of `owt`
  positions, the reduction over the window outside it.

The output of a template is the op's epilogue stage (bias, a fused relu or residual add, the
average's division), tiled as the accumulation and computed from its registers; the outer tile
loops run in parallel (batch, channel blocks, output rows) when there is enough work. Padding is
one materialized copy of the input (tag "nn_pad"), scheduled with the templates of
`ember.templates.nn`, which dispatches on the template names registered here.

Tile choices are made in one place, `nchwc_plan` (marked below). Tuning: `tuned_nchwc_plan` makes
them knobs of a config space (`ember.te.config`; templates "conv_nchwc" and "window_nchwc"): channel
blocks and output positions per tile, the order of the reduction loops, unrolling of the kernel
columns. The ops' computes (`ember.ops.layout`) pass the anchor's config as `cfg=`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ember import te
from ember.target import Target
from ember.te.config import ConfigBase
from ember.te.tensor import Tensor, prod_hint, size_hint
from ember.templates.nn import (
    SCHEDULES,
    Window,
    host_target,
    lanes_of,
    pad_input,
    prefetch_blocks,
    rows_outside,
    vector_regs,
    work,
    zero,
)
from ember.tir.dtype import DType
from ember.tir.dtype import dtype as as_dtype
from ember.tir.expr import Expr


@dataclass(frozen=True)
class NCHWcPlan:
    kbt: int  # blocks of output channels per register tile (window ops: 1)
    owt: int  # output positions per register tile along a row
    oht: int = 1  # rows per register tile (whole rows fit in one tile: short rows)
    order: str = "cb_k"  # reduction loops: input channel blocks outside the kernel window ("cb_k") or inside
    unroll_kw: bool = False  # unroll the kernel columns around the register tile
    unroll_window: bool = False  # window ops: unroll the window loops (rows and columns) around the register tile
    kchunk: int = 0  # input channel blocks per reduction chunk (0: none; `k_chunk`)


PANEL_BYTES = 512 << 10  # weights of one channel-block tile that stay in L2 while the rows of a map reuse them
K_CHUNK_BYTES = 4 << 10  # weights of one reduction chunk of a pointwise tile: they stay in L1 across its positions
L1_BYTES = 32 << 10  # a tile's weights up to this size stay in L1 whole: no chunks


# -----------------------------------------------------------------------------------------------------
# TILE CHOICES of the blocked templates: the one place to change them (tuning overrides them here)
# -----------------------------------------------------------------------------------------------------
def nchwc_plan(KB: int, block: int, out: tuple[int, int], dtype: DType | str, panel: int = 0,
               target: Target | None = None, narrow: int = 0) -> NCHWcPlan:  # fmt: skip
    """A register tile of output positions x output channel vectors that fills the accumulators (all
    vector registers but 4: weights, the broadcast input). Dense convolutions (`panel`: bytes of the
    weights of one output channel block) take 2 channel vectors per tile (each broadcast input element
    feeds 2 FMAs, each weight vector `owt`), 4 when rows are short (7x7 maps), fewer when the weights
    of the tile would not stay in L2 (`PANEL_BYTES`) for the next row; window ops one. A row is split
    into balanced tiles; short rows are taken whole, several per tile.

    Groups of `narrow` channels inside a block (`conv_nchwc_acc`) take one channel block per tile (each block
    reads its own input: a second one shares nothing) and leave a register to each shuffle pattern that is not
    an immediate (groups wider than 128 bits: an index vector per input channel of the group). RegNetY's groups
    of 8 at 14 x 14, 1 thread, 28 accumulators: 0.22 ms a model of it, 14: 0.19."""
    target = target or host_target()
    oh, ow = out
    lanes = min(lanes_of(dtype, target), block)
    vecs = max(1, block // lanes)  # vectors per channel block
    accs = vector_regs(target) - 4
    if narrow * as_dtype(dtype).bits > 128:
        accs -= narrow
    kbt = 1
    if panel and not narrow:
        want = 4 if ow <= 8 else 2
        kbt = max(d for d in range(1, KB + 1) if KB % d == 0 and d * vecs <= max(want, vecs)
                  and (d == 1 or d * panel <= PANEL_BYTES))  # fmt: skip
    owt = max(1, min(ow, accs // (kbt * vecs)))
    owt = -(-ow // -(-ow // owt))
    oht = 1
    if owt == ow:
        oht = max(1, min(oh, accs // (kbt * vecs * owt)))
        oht = -(-oh // -(-oh // oht))
    return NCHWcPlan(kbt, owt, oht)


POOL_WIDTH = 8  # output positions along a row per pooling tile: enough loads in flight, a short unrolled body
DEPTHWISE_TILE = (7, 2)  # positions x rows per depthwise tile: 14 accumulators (16 measured 20-30% slower)
POOL_UNROLL = 160  # window elements x tile vectors up to which a window tile's loops are unrolled


def k_chunk(plan: NCHWcPlan, blocks: int, window: int, cb: int, kb: int, dtype: DType | str) -> NCHWcPlan:
    """A pointwise convolution (`window` 1) whose tile's weights would not stay in L1 (`L1_BYTES`) takes its
    reduction in chunks of `K_CHUNK_BYTES` of them: each chunk's weights are read from L1 by every position of the
    map, the partial sums kept in a buffer of the tile's channels x the map's positions. Without, each register tile
    streamed all its weights from L2 or beyond: 1 x 1 convolutions (1 thread, AVX2, 512 KiB L2, weights warm in a
    sweep of one layer) of 1152 -> 192 channels ran 1.10x (28 x 28) to 1.34x (7 x 7) faster in chunks, 2048 -> 1024
    at 5 x 5 1.25x. Where the tile's weights fit L1 (400 -> 400 at 7 x 7: 26 KB), chunks only cost (0.81x)."""
    nbytes = plan.kbt * cb * kb * as_dtype(dtype).bits // 8  # one input block of the tile's weights
    kc = max(1, K_CHUNK_BYTES // nbytes)
    return replace(plan, kchunk=kc) if window == 1 and blocks > kc and blocks * nbytes > L1_BYTES else plan


def pool_plan(block: int, out: tuple[int, int], window: int, dtype: DType | str, target: Target | None = None,
              tile: tuple[int, int] = (POOL_WIDTH, 1)) -> NCHWcPlan:  # fmt: skip
    """The register tile of a window reduction with one channel vector per position (pooling; depthwise convolution
    with `DEPTHWISE_TILE`, each weight vector then serves two rows): up to tile[0] output positions along a row,
    balanced, times tile[1] rows (whole short rows, several per tile), the window loops unrolled around it when the
    tile's body stays small (`POOL_UNROLL`). A pool has one load per operation and a depthwise convolution two: the
    dense convolutions' tile of 26 accumulators only lengthens the loop body (measured 10-40% slower on the pools of
    bench/pool_nchwc.py, 1.3-1.8x on MobileNet's depthwise 3x3 layers)."""
    target = target or host_target()
    oh, ow = out
    vecs = max(1, block // lanes_of(dtype, target))
    width, rows = max(1, tile[0] // vecs), tile[1]
    owt = max(1, min(ow, width))
    owt = -(-ow // -(-ow // owt))
    oht = max(1, min(oh, rows))
    if owt == ow:
        oht = max(oht, min(oh, width * rows // owt))
    oht = -(-oh // -(-oh // oht))
    return NCHWcPlan(1, owt, oht, unroll_window=window * owt * oht * vecs <= POOL_UNROLL)


def tuned_nchwc_plan(cfg: ConfigBase, dflt: NCHWcPlan, KB: int, out: tuple[int, int], dense: bool) -> NCHWcPlan:
    """The knobs of the blocked templates, each defaulting to `nchwc_plan`'s choice: channel blocks per
    tile (dense convs: divisors of the blocks, up to 4 vectors), output positions per tile along a row
    and rows per tile, and for dense convs the reduction order and unrolling of the kernel columns."""
    cfg.template = cfg.template or ("conv_nchwc" if dense else "window_nchwc")
    oh, ow = out
    kbt = dflt.kbt
    if dense:
        kbts = sorted({d for d in (1, 2, 3, 4) if KB % d == 0} | {dflt.kbt})
        kbt = cfg.define_split("tile_kb", KB, 2, policy="candidate", candidates=[(-1, d) for d in kbts],
                               default=(-1, dflt.kbt))[-1]  # fmt: skip
    widths = sorted({w for w in (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 28) if w <= ow} | {dflt.owt})
    owt = cfg.define_split("tile_ow", ow, 2, policy="candidate", candidates=[(-1, w) for w in widths],
                           default=(-1, dflt.owt))[-1]  # fmt: skip
    heights = sorted({h for h in (1, 2, 4) if h <= oh} | {dflt.oht})
    oht = cfg.define_split("tile_oh", oh, 2, policy="candidate", candidates=[(-1, h) for h in heights],
                           default=(-1, dflt.oht))[-1]  # fmt: skip
    order, unroll_kw, unroll_window = dflt.order, dflt.unroll_kw, dflt.unroll_window
    if dense:
        order = cfg.define_knob("reduce_order", ["cb_k", "k_cb"], default=dflt.order)
        unroll_kw = cfg.define_knob("unroll_kw", [False, True], default=dflt.unroll_kw)
    else:
        unroll_window = cfg.define_knob("unroll_window", [False, True], default=dflt.unroll_window)
    return NCHWcPlan(kbt, owt, oht, order=order, unroll_kw=unroll_kw, unroll_window=unroll_window)


# -----------------------------------------------------------------------------------------------------
# computes
# -----------------------------------------------------------------------------------------------------
def pad_nchwc(x: Tensor, before: Sequence[int], after: Sequence[int], value: Expr, name: str) -> Tensor:
    """x [N, CB, *spatial, cb] padded along its spatial dims, inlined into its reader: loop partitioning
    confines the bounds checks to the tiles at the borders, and no copy of the input is made."""
    return pad_input(lambda *i: x[i], x.shape, (*before, 0), (*after, 0), value, x.dtype, name=name,
                     materialize=False)  # fmt: skip


def conv_nchwc_acc(x: Tensor, w: Tensor, pads: Sequence[int], win: Window, depthwise: bool, name: str = "conv",
                   cfg: ConfigBase | None = None, groups: int = 1) -> tuple[Tensor, Callable[..., Expr]]:  # fmt: skip
    """The accumulation of a 2-d convolution in NCHW[x]c: x [N, C/cb, H, W, cb], weights packed
    [K/kb, C/cb, KH, KW, cb, kb] (depthwise: [C/kb, 1, KH, KW, 1, kb]; `groups` > 1 not depthwise:
    [K/kb, C/groups/cb, KH, KW, cb, kb], each output block reading the input blocks of its group; groups narrower
    than a block, `narrow_groups`: [K/kb, 1, KH, KW, g, kb], g channels in and out per group, each block of kb = cb
    channels holding kb/g whole groups, output lane v reading the g input channels of its group, `v // g * g + rc`:
    whole vectors, rc unrolled, each rc's input one load of the block and a constant shuffle, `ember.codegen.lanes`;
    a ResNeXt 3 x 3 of 128 channels in 32 groups at 40 x 40, 1 thread: 43 -> 121 GFLOP/s over vectors of g lanes,
    one input element broadcast per group; 256 in 32 groups: 86 -> 114). Returns (acc, read): read(n, kb_, oh, ow,
    k) is the accumulated output element. `cfg`: a tuning config (`tuned_nchwc_plan`), None for the fallback plan."""
    N, _, H, W, cb = x.shape
    KB, CB, KH, KW, wcb, kb = w.shape  # CB: input blocks of one group
    OH, OW = win.out
    (sh, sw), (dh, dw) = win.strides, win.dilations
    if depthwise:
        return window_nchwc_acc(x, pads, zero(x.dtype), win, te.sum, lambda v, c, kh, kw, k: v * w[c, 0, kh, kw, 0, k],
                                name=name, cfg=cfg)  # fmt: skip
    narrow = wcb if narrow_groups(x.shape, w.shape, groups) else 0
    plan = nchwc_plan(KB, kb, (OH, OW), x.dtype, panel=CB * wcb * KH * KW * kb * x.dtype.bits // 8,
                       narrow=narrow)  # fmt: skip
    if cfg is not None:
        plan = tuned_nchwc_plan(cfg, plan, KB, (OH, OW), dense=True)
    if groups == 1 and not narrow:
        plan = k_chunk(plan, CB, KH * KW, wcb, kb, x.dtype)
    rcb = te.reduce_axis((0, CB), name="rcb")
    rc = te.reduce_axis((0, wcb), name="rc")
    xp = pad_nchwc(x, pads[:2], pads[2:], zero(x.dtype), name=f"{name}_pad")
    rkh = te.reduce_axis((0, KH), name="rkh")
    rkw = te.reduce_axis((0, KW), name="rkw")

    def body(n, k, oh, ow, v):
        if narrow:  # block k of the output: the groups of block k of the input, lane v's group at v // g * g
            xcb, xc = k + rcb, v // narrow * narrow + rc
        else:
            xcb, xc = rcb if groups == 1 else k // (KB // groups) * CB + rcb, rc  # k's group's first block, + rcb
        xv = xp[n, xcb, oh * sh + rkh * dh, ow * sw + rkw * dw, xc]
        return te.sum(xv * w[k, rcb, rkh, rkw, rc, v], axis=[rcb, rkh, rkw, rc])

    acc = te.compute((N, KB, OH, OW, kb), body, name=name, tag="conv_nchwc",
                     attrs={"plan": plan, "weight": w, "input": x, "narrow": narrow})  # fmt: skip
    return acc, lambda *i: acc[i]


def narrow_groups(x: Sequence, w: Sequence, groups: int) -> bool:
    """Whether a grouped ConvNCHWc of input [N, C/cb, H, W, cb] and weights `w` has groups narrower than a block:
    weights [C/cb, 1, KH, KW, g, cb] with g = C/groups channels in and out per group, g dividing cb."""
    if len(x) != 5 or len(w) != 6 or groups <= 1:
        return False
    g, cb = w[4], x[4]
    return w[0] == x[1] and w[1] == 1 and w[5] == cb and g < cb and cb % g == 0 and g * groups == x[1] * cb


def window_nchwc_acc(
    x: Tensor,
    pads: Sequence[int],
    pad_value: Expr,
    win: Window,
    reducer,
    term: Callable[..., Expr] | None = None,
    name: str = "pool",
    cfg: ConfigBase | None = None,
) -> tuple[Tensor, Callable]:
    """reducer over each window of x [N, CB, H, W, cb] padded with pad_value (pads: begins then ends,
    the ends may include ceil-mode overhang) of term(v, cb_, kh, kw, k), default the element v.
    Returns (acc, read) as `conv_nchwc_acc`."""
    N, CB, H, W, cb = x.shape
    OH, OW = win.out
    (sh, sw), (dh, dw) = win.strides, win.dilations
    tile = (POOL_WIDTH, 1) if term is None else DEPTHWISE_TILE  # pooling, or a depthwise convolution
    plan = pool_plan(cb, (OH, OW), win.kernel[0] * win.kernel[1], x.dtype, tile=tile)
    if cfg is not None:
        plan = tuned_nchwc_plan(cfg, plan, CB, (OH, OW), dense=False)
    xp = pad_nchwc(x, pads[:2], pads[2:], pad_value, name=f"{name}_pad")
    rkh = te.reduce_axis((0, win.kernel[0]), name="rkh")
    rkw = te.reduce_axis((0, win.kernel[1]), name="rkw")

    def body(n, c, oh, ow, k):
        v = xp[n, c, oh * sh + rkh * dh, ow * sw + rkw * dw, k]
        return reducer(term(v, c, rkh, rkw, k) if term else v, axis=[rkh, rkw])

    acc = te.compute((N, CB, OH, OW, cb), body, name=name, tag="window_nchwc", attrs={"plan": plan, "input": x})
    return acc, lambda *i: acc[i]


def global_parts(positions: int) -> int:
    """Partial results per channel vector of a global pooling: independent accumulators (an add or max has a latency
    of several cycles, a load issues every cycle), a divisor of the positions so that they split evenly; the
    largest up to 8, else the smallest above (short rows: 7x7 takes 7), else 1."""
    divs = [d for d in range(1, min(positions, 16) + 1) if positions % d == 0]
    small = [d for d in divs if d <= 8]
    return small[-1] if small[-1] >= 4 else next((d for d in divs if d > 8), small[-1])


def global_nchwc_acc(x: Tensor, reducer, name: str = "global_pool",
                     cfg: ConfigBase | None = None) -> tuple[Tensor, Callable]:  # fmt: skip
    """reducer over all positions of x [N, CB, H, W, cb] (global pooling) as a row reduction in memory order: the
    H*W positions of a channel block dealt round-robin to `global_parts` partial vectors (`{name}_part` [N, CB, parts,
    cb], in registers), which are then reduced. Returns (acc, read) as `conv_nchwc_acc`; template "global_nchwc"."""
    N, CB, H, W, cb = x.shape
    S = H * W
    J = global_parts(S)
    if cfg is not None:
        cfg.template = cfg.template or "global_nchwc"
        J = cfg.define_knob("parts", sorted({d for d in (1, 2, 4, 7, 8, 14, 16) if S % d == 0} | {J}), default=J)
    r = te.reduce_axis((0, S // J), name="rs")

    def part_body(n, c, j, k):
        s = r * J + j
        return reducer(x[n, c, s // W, s % W, k], axis=r)

    part = te.compute((N, CB, J, cb), part_body, name=f"{name}_part")
    q = te.reduce_axis((0, J), name="rj")
    acc = te.compute((N, CB, 1, 1, cb), lambda n, c, h, w, k: reducer(part[n, c, q, k], axis=q), name=name,
                     tag="global_nchwc", attrs={"part": part})  # fmt: skip
    return acc, lambda *i: acc[i]


# -----------------------------------------------------------------------------------------------------
# schedules
# -----------------------------------------------------------------------------------------------------
def _vector_axis(st: te.Stage, axis, block: int, lanes: int) -> list:
    """The channel axis of a tile in vectors: vectorized whole when it fits one register, else split
    into unrolled vectors. Returns the loops it became."""
    if block <= lanes:
        st.vectorize(axis)
        return [axis]
    vo, vi = st.split(axis, lanes)
    st.unroll(vo)
    st.vectorize(vi)
    return [vo, vi]


def _schedule_nchwc(s: te.Schedule, out: Tensor, attrs: dict, target: Target) -> set[str]:
    """Output tile = `oht` x `owt` positions x `kbt` channel blocks, accumulated in registers over the
    reduction loops (outside the tile); the epilogue stores channel vectors. Parallel over batch,
    channel-block tiles and chunks of rows; the rows of a chunk and the tiles of a row are serial
    loops, which loop partitioning splits at the borders of the padded input."""
    acc: Tensor = attrs["acc"]
    plan: NCHWcPlan = acc.op.attrs["plan"]
    block = acc.shape[-1]
    lanes = lanes_of(acc.dtype, target)
    O = s[out]
    n, kb, oh, ow, k = O.op.axis
    accl = s.cache_write(acc, "local")
    s[acc].compute_inline()
    kbo, kbi = O.split(kb, plan.kbt)
    tiles = size_hint(out.shape[0]) * (out.shape[1] // plan.kbt)  # (a symbolic batch: at its hint)
    rows = -(-size_hint(out.shape[2]) // plan.oht)
    rows_out = _rows_outside(acc, out, rows, target)
    if rows_out:
        chunks = _row_chunks(1, rows, target) if _parallel_ok(out, rows, target) else 0
    else:
        chunks = _row_chunks(tiles, rows, target) if _parallel_ok(out, tiles * rows, target) else 0
    ro, ri = O.split(oh, plan.oht)
    oho, ohi = O.split(ro, nparts=max(chunks, 1))
    po, pi = O.split(ow, plan.owt)
    outer = (oho, kbo) if rows_out else (kbo, oho)  # the parallel loops, around a chunk's rows and tiles
    O.reorder(n, *outer, ohi, po, ri, pi, kbi, k)
    O.unroll(ri)
    O.unroll(kbi)
    O.unroll(pi)
    _vector_axis(O, k, block, lanes)
    L = s[accl]
    ln, lkb, loh, low, lk = L.op.axis
    red = list(L.op.reduce_axis)
    w = acc.op.attrs.get("weight")
    if plan.kchunk and len(red) == 4:  # (`k_chunk`) the tile's channels x the chunk's positions, in chunks of K
        rcbo, rcbi = L.split(red[0], plan.kchunk)
        lho, lhi = L.split(loh, plan.oht)
        lwo, lwi = L.split(low, plan.owt)
        L.reorder(ln, rcbo, lho, lwo, rcbi, *red[1:], lhi, lwi, lkb, lk)
        for ax in (lhi, lwi, lkb):
            L.unroll(ax)
        _vector_axis(L, lk, block, lanes)
        L.compute_at(O, outer[-1])  # inside both: a parallel chunk's rows of one channel tile
        if w is not None and w.shape[0] > plan.kbt and prefetch_blocks(w, 0, target, 2, plan.kbt):
            L.prefetch(w, rcbi, dim=0, offset=plan.kbt, spread=(L, lwo))  # the next tile's chunk, shared by the tiles
        if chunks:
            O.parallel(O.fuse(n, *outer))
        return {O.name, L.name}
    if plan.order == "k_cb" and len(red) == 4:  # [rcb, rkh, rkw, rc] -> the kernel window outside the channel blocks
        red = [red[1], red[2], red[0], red[3]]
    L.reorder(ln, *red, loh, low, lkb, lk)  # the FMAs of one broadcast input element adjacent
    if plan.unroll_kw and len(red) == 4:
        L.unroll(red[1] if plan.order == "k_cb" else red[2])
    if plan.unroll_window and len(red) == 2:
        L.unroll(red[0])
        L.unroll(red[1])
    L.unroll(loh)
    L.unroll(low)
    L.unroll(lkb)
    if acc.op.attrs.get("narrow"):  # each input channel of a group: one constant shuffle of the block's vector
        L.unroll(red[-1])
    _vector_axis(L, lk, block, lanes)
    L.compute_at(O, po)
    positions = size_hint(out.shape[2]) * size_hint(out.shape[3])
    uses = rows * -(-size_hint(out.shape[3]) // plan.owt)  # spatial tiles
    # a block that one tile reads (a whole small map) still prefetches where each weight vector feeds enough FMAs
    # (PREFETCH_POSITIONS: ResNet-50's 5 x 5 maps, 1 thread 1.05x), not where the stream outruns them (Inception's
    # 3 x 3 maps, 9 FMAs a line: 0.83 -> 0.96 ms with it; the hardware prefetcher keeps up there)
    uses = max(uses, 2) if positions >= PREFETCH_POSITIONS else uses
    if w is not None and w.shape[0] > plan.kbt and prefetch_blocks(w, 0, target, uses, plan.kbt):
        # the next output-channel blocks' weights into L2 while these are computed, a line per input channel: the
        # first row tile of a block read them from memory (ResNet's 512-channel 7x7 layers: 2 row tiles per block)
        L.prefetch(w, red[-1], dim=0, offset=plan.kbt)
    if chunks:
        O.parallel(O.fuse(n, *outer))
    return {O.name, L.name}


PREFETCH_POSITIONS = 16  # output positions of a map from which a block of weights read once is prefetched


WINDOW_BLOCKS_PER_THREAD = 4  # channel blocks per thread from which a window op's threads split the blocks


def _rows_outside(acc: Tensor, out: Tensor, rows: int, target: Target) -> bool:
    """Whether the parallel loop takes chunks of rows outside the channel tiles (`rows_outside`: the input and
    output outweigh the weights), where the rows give each thread two chunks (a 3 x 3 convolution reads a row
    beyond its own). A window op (depthwise convolution, pooling) with WINDOW_BLOCKS_PER_THREAD channel blocks per
    thread splits the blocks instead: its blocks are independent, while split rows read the rows around their own
    from the other core, a large share of a small map (20 depthwise 3 x 3 of 960 channels at 7 x 7 in a chain, 2
    threads: 343 us with rows split, 180 by blocks, 160-190 at 1 thread). 2 threads, in-process A/B over two runs:
    EfficientNet-B0 1.04x, B1 1.04x, MNASNet 1.03-1.06x, MobileNetV2 0.99-1.02x, MobileNetV3-large 1.00x."""
    x = acc.op.attrs.get("input")
    if target.num_cores <= 1 or x is None or rows < 2 * target.num_cores:
        return False
    if acc.op.tag == "window_nchwc" and out.shape[1] >= WINDOW_BLOCKS_PER_THREAD * target.num_cores:
        return False
    w = acc.op.attrs.get("weight")
    wbytes = prod_hint(w.shape) * as_dtype(w.dtype).bits // 8 if w is not None else 0
    return rows_outside((prod_hint(x.shape) + prod_hint(out.shape)) * as_dtype(out.dtype).bits // 8, wbytes)


def _schedule_global_nchwc(s: te.Schedule, out: Tensor, attrs: dict, target: Target) -> set[str]:
    """Per channel block (parallel over batch x blocks): the partial vectors accumulated in registers over the
    positions in memory order (the parts unrolled inside), reduced, and the epilogue's vector stored."""
    acc: Tensor = attrs["acc"]
    part: Tensor = acc.op.attrs["part"]
    lanes = lanes_of(acc.dtype, target)
    block = acc.shape[-1]
    O = s[out]
    n, c, h, w, k = O.op.axis
    tile = O.fuse(n, c)
    O.reorder(tile, h, w, k)
    _vector_axis(O, k, block, lanes)
    A, P = s[acc], s[part]
    A.compute_at(O, tile)
    an, ac, ah, aw, ak = A.op.axis
    A.reorder(an, ac, ah, aw, *A.op.reduce_axis, ak)
    A.unroll(A.op.reduce_axis[0])
    _vector_axis(A, ak, block, lanes)
    P.compute_at(O, tile)
    P.set_scope("local")
    pn, pc, pj, pk = P.op.axis
    P.reorder(pn, pc, *P.op.reduce_axis, pj, pk)
    P.unroll(pj)
    _vector_axis(P, pk, block, lanes)
    if target.num_cores > 1 and work(out) >= 1 << 16 and size_hint(out.shape[0]) * out.shape[1] >= target.num_cores:
        O.parallel(tile)
    return {O.name, A.name, P.name}


def _row_chunks(tiles: int, rows: int, target: Target) -> int:
    """Parts to split the rows of each of `tiles` channel tiles into: at least 4 parallel iterations per
    thread, a multiple of the threads when the rows allow (each thread gets as many), at most a row each."""
    threads = target.num_cores
    least = min(rows, -(-4 * threads // tiles))
    even = [c for c in range(least, min(rows, 2 * least) + 1) if tiles * c % threads == 0]
    return even[0] if even else least


def _parallel_ok(out: Tensor, chunks: int, target: Target) -> bool:
    """Parallel when there are threads, enough work to pay for a fork/join, and a chunk per thread."""
    return target.num_cores > 1 and chunks >= target.num_cores and work(out) >= 1 << 16


def schedule_lane_gather(group: int, outs: list[Tensor], target: Target) -> te.Schedule:
    """A copy into a blocked tensor [N, C/x, H, W, x] whose lanes come from different places (a channel shuffle
    of `group` groups: lane l reads input l % group, at a channel fixed by the block and l): per channel block,
    a loop over the pixels whose body is the block's lanes unrolled, split by the group so that each statement
    reads its input at a constant offset from the pixel's (the index arithmetic of blocks and lanes hoisted out
    of the pixel loop; the C compiler packs the lanes). Parallel over the channel blocks where that pays."""
    (out,) = outs
    s = te.create_schedule(outs)
    st = s[out]
    n, c, h, w, lane = st.op.axis
    blocks, pixels = st.fuse(n, c), st.fuse(h, w)
    if group > 1 and out.shape[4] % group == 0:
        run, part = st.split(lane, group)
        st.reorder(blocks, pixels, run, part)
        st.unroll(run)
        st.unroll(part)
    else:
        st.reorder(blocks, pixels, lane)
        st.unroll(lane)
    if target.num_cores > 1 and work(out) >= 1 << 16:
        st.parallel(blocks)
    return s


SCHEDULES["conv_nchwc"] = _schedule_nchwc
SCHEDULES["window_nchwc"] = _schedule_nchwc
SCHEDULES["global_nchwc"] = _schedule_global_nchwc
