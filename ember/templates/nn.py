"""Compute/schedule templates of the neural-network operators: GEMM on packed panels, direct
convolution (output channels or output width in vectors), window reductions, row reductions.

Each template has two halves that meet through stage tags and attributes:

- a compute builder, called from an op's compute in `ember.ops` (conv, matmul, pool, ...), makes
  the stages of the algorithm (packing, the accumulation) and records its plan (tile sizes, layouts) in the
  `attrs` of the accumulation stage; the op then writes its output stage (the epilogue: bias,
  scaling, the crop of padded tiles) reading the accumulation, and names it in the output's
  attrs (`{"template": "gemm", "acc": acc}`);
- `schedule_nn(attrs, outs, target)` finds those output stages and applies the template's
  schedule: the accumulation goes to a register tile (`cache_write` + `compute_at` the output's
  tile loop), its innermost data axis is vectorized by the target's lanes, the output's outer
  loops run in parallel. When a fused elementwise epilogue (relu, a residual add) reads the
  template's output, that output is inlined and the fused output is tiled in its place. Other
  stages are inlined unless their attrs say `materialize` (padded inputs, per-row buffers, the
  states of a recurrence), and root stages are fused and vectorized (`ember.templates.flat.schedule_flat`).

Tuning: the choices of the GEMM (`gemm_plan`), conv_oc and conv_ow (`_tuned_conv_*_plan`) plans are
knobs of a config space (`ember.te.config`). A config reaches a template explicitly: the compiler puts it
in the anchor node's attrs under `CONFIG_ATTR` ("__config__"), the op's compute (`ember.ops.conv`,
`ember.ops.matmul`) passes it as `cfg=` to `gemm_acc`/`conv_acc`, whose plan (recorded in the accumulation's attrs) the
schedule then reads. Without a config (None) the plans are the heuristics below, which are also the
knobs' defaults: the fallback config.

Layout decisions that change the compute (panel width, channel block) are taken at compute
time for the host CPU (`host_target()`); vector lanes are re-derived from the real target when
scheduling, so a cross-compiled kernel is still correct, if tuned for the host.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ember import te
from ember.target import DEFAULT_L1D, Cache, Target, host_cpu_flags
from ember.te.config import ConfigBase
from ember.te.tensor import ComputeOp, Reduce, Tensor, prod_hint, size_hint
from ember.templates.flat import schedule_flat
from ember.templates.int8 import schedule_int8, schedule_int8_dw
from ember.tir.dtype import DType
from ember.tir.dtype import dtype as as_dtype
from ember.tir.expr import Expr

Index = tuple[Expr, ...]


@functools.cache
def host_target() -> Target:
    return Target.parse("c")


def vector_regs(target: Target) -> int:
    """Vector registers of the target's ISA (AVX-512: 32, AVX2/SSE/NEON class: 16)."""
    if target.vector_bits >= 512 or (target.mcpu == "native" and "avx512f" in host_cpu_flags()):
        return 32
    return 16


def lanes_of(dtype: DType | str, target: Target) -> int:
    """Lanes of one vector register for elements of dtype."""
    return target.vector_lanes(max(as_dtype(dtype).bits, 8))


def zero(dtype: DType) -> Expr:
    return te.const(0, dtype)


def _pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def _best_block(n: int, cap: int) -> int:
    """A block size <= cap for an axis of length n: a divisor of n when one is at least cap/2,
    else cap (the last block is then shifted back to end at n: it overlaps, never overruns)."""
    if n <= cap:
        return n
    div = max(d for d in range(1, cap + 1) if n % d == 0)
    return div if 2 * div >= cap else cap


# =====================================================================================================
# GEMM: acc[*batch, i, j] = sum_k a(batch, i, k) * b(batch_b, k, j)
# =====================================================================================================
ROWS_OUTSIDE_BYTES = 1 << 20  # weights at most this large (half an L2 here) may be read whole by every row chunk


def rows_outside(activation_bytes: int, weight_bytes: int) -> bool:
    """Whether a parallel kernel takes its rows outside its column/channel tiles (GEMM, blocked convolution): where
    the activations it reads and writes outweigh, twice over, weights that stay in the L2. Each thread then writes
    whole rows, the rows the next kernel reads on that core (the pool gives each thread the same share of every
    loop); the other way, each thread wrote part of every row and the next kernel read the rest across cores."""
    return weight_bytes <= ROWS_OUTSIDE_BYTES and activation_bytes >= 2 * weight_bytes


# An L1 data cache indexes its sets with the address bits below its size / ways (4 KiB: 32 KiB in 8 ways on Zen 4
# and most x86/Arm cores, 48 KiB in 12 on recent Xeons), so lines that far apart share a set. A register tile's rows
# of A walk K in step, one line each: where A's row stride is a multiple of that period (K = 1024, 2048, 3072 floats:
# the down-projection of a transformer's FFN) all of them share one set and evict each other before the next 16 k's
# use their line. The tile takes at most the set's ways less ALIAS_SPARE_WAYS of them (left to B's panel and C), the
# ways of the target's L1 (`Target.l1d`). Zen 4, 8 ways: 128 x 3072 x 768 with 12-row tiles 97 GFLOP/s, 6 rows 107;
# K = 1024: 102 -> 111, K = 768 unchanged at 113. Xeon, 12 ways, 1 thread: 197 x 3072 x 768 with 6 rows (the 8-way
# limit) 136-162 GFLOP/s, 10 rows 146-173 (+7%), 12 rows 138.
ALIAS_SPARE_WAYS = 2


def alias_free_rows(mr: int, row_bytes: int, l1d: Cache = DEFAULT_L1D) -> int:
    """The most rows, at most mr, of a tile whose A rows (row_bytes apart) put at most `l1d.ways - ALIAS_SPARE_WAYS`
    lines in one set of the L1 `l1d` at each step of the reduction."""
    limit = max(1, l1d.ways - ALIAS_SPARE_WAYS)
    period = max(l1d.line, l1d.size // l1d.ways)
    while mr > limit:
        sets: dict[int, int] = {}
        for i in range(mr):
            line = i * row_bytes % period // l1d.line
            sets[line] = sets.get(line, 0) + 1
        if max(sets.values()) <= limit:
            break
        mr -= 1
    return mr


# The packed product's reduction unrolled by 8 where K allows (else 4): the register tile's FMAs of 8 k's in one
# loop body. Xeon (AVX-512, 12 x 32 tiles), 1 thread, models whose time is their products: BERT-4 1.045x, ViT-4
# 1.059x, LLaMA-4 1.069x, T5 encoder 1.061x, Whisper encoder 1.035x, ConvNeXt 1.016x over 4; 2 threads BERT 1.05x,
# ViT 1.03x. 16 measured the same or up to 2% better at 1 thread and compiled BERT 20% slower (5.5 s, 4.6 at 8).
GEMM_K_UNROLL = 8


@dataclass(frozen=True)
class GemmPlan:
    mr: int  # rows of the register tile
    nr: int  # columns of the register tile (the panel width when packed)
    packed: bool  # B repacked into panels [N / nr, K, nr]
    kr: int = 4  # reduction unroll
    order: str = "ij"  # outer tile loops: row blocks outside ("ij") or column panels outside ("ji")
    unroll: tuple[str, str] = ("unroll", "unroll")  # register tile rows, column vectors: "unroll" or "none"


def gemm_plan(M: int, N: int, K: int, dtype: DType, target: Target | None = None, cfg: ConfigBase | None = None,
              fixed_nr: int | None = None, static_rows: bool = True) -> GemmPlan:  # fmt: skip
    """Tile sizes: an mr x nr accumulator tile that fits the register file. B is packed into
    panels when enough rows reuse each panel; for few rows (M < 8) the panel copy would cost as
    much as the product, and B is read in place with wider rows of the tile.

    With a tuning config `cfg` (`ember.te.config`), the packed plan's choices are its knobs
    (tile_m, tile_n, tile_k, order, pack_b, unroll_tile); the values computed here are their defaults
    (the fallback). `fixed_nr`: B comes packed already (a constant packed at compile time, panels of
    that width): the panel width and packing are no longer choices. `static_rows`: M is a constant (not a symbolic
    size at its hint), which the row-outside order needs."""
    target = target or host_target()
    lanes = lanes_of(dtype, target)
    regs = vector_regs(target)
    if fixed_nr is None and lanes > N and M < 8:
        return GemmPlan(mr=max(1, M), nr=max(N, 1), packed=False)
    if fixed_nr is None and M < 8:
        nvec = max(1, min(4, N // lanes, (regs - 4) // max(M, 1)))
        return GemmPlan(mr=max(M, 1), nr=nvec * lanes, packed=False)
    nr = fixed_nr or packed_width(N, dtype, target)
    vecs = max(1, -(-nr // lanes))
    # the accumulators, a row of B's vectors and a broadcast within the registers less two: 6 x 64 at four vectors
    # (7 x 64 took all 32 zmm registers and spilled in the loop: 8-12% slower at 64..384 rows)
    mr = min(M, (regs - 3 - vecs) // vecs if regs >= 32 else 6)
    mr = max(1, min(mr, 12))
    item = as_dtype(dtype).itemsize
    mr = alias_free_rows(mr, K * item, target.l1d)
    mr = -(-M // -(-M // mr))  # balanced row tiles: 64 rows as 6 x 11, not 5 x 12 and a tile of 4
    # column panels outside: each panel of B is read from memory once and reused by every row tile (A, the
    # activations, is the smaller operand in inference and stays in cache); rows outside re-read all of B per
    # row tile, from DRAM once a model's weights outgrow the L3 (BERT-4: 39.4 -> 35.2 ms, T5 encoder -7%).
    # Where the activations outweigh a B that stays in the L2, rows go outside: each thread then writes whole rows
    # of C, the rows the next product reads on that thread (the pool gives each thread the same share of every
    # loop); with panels outside the threads wrote columns of every row, read by the other core next (Swin and
    # ConvNeXt at 2 threads: 1.08x, 3136 x 96 x 96 products in a chain 2.77 -> 1.75 ms). Where they do not (a
    # sequence of 128 against a 256..512-wide layer's weights), each thread reading all of B cost more than that:
    # ELECTRA-small, CLIP text, LLaMA, T5 5-7% slower at 2 threads.
    # (Symbolic rows keep panels outside: their partial row tile, guarded, would keep its accumulators in memory.)
    rows_out = static_rows and rows_outside(M * (K + N) * item, K * N * item)
    kr = GEMM_K_UNROLL if K % GEMM_K_UNROLL == 0 else 4
    dflt = GemmPlan(mr=mr, nr=nr, packed=True, kr=kr, order="ij" if rows_out else "ji")
    if fixed_nr is not None and M < SKINNY_ROWS:
        dflt = skinny_plan(M, fixed_nr, target)  # B packed for a skinny product (`ember.passes.pack`)
    if cfg is None:
        return dflt
    return _tuned_gemm_plan(cfg, M, N, K, lanes, dflt, fixed_nr is not None)


def packed_width(N: int, dtype: DType | str, target: Target | None = None, rows: int | None = None,
                 rows_low: int | None = None) -> int:  # fmt: skip
    """Columns per panel of a packed B: two vectors (one when N is narrower than a vector); for a skinny product
    (`rows` < SKINNY_ROWS) `skinny_width`. Symbolic rows that may be skinny at run time (`rows_low` below
    SKINNY_ROWS, `rows` the hint) take the skinny width of SKINNY_ROWS - 1 rows where it is wider: the full
    tiles are then rows of the wide panel (6 x 64 with 32 vector registers, `gemm_plan`), and the size
    variants of the tail (1..6 rows) are the skinny plan's tiles, which a 32-wide panel would leave half as many
    independent FMA chains and twice the broadcasts per FMA."""
    target = target or host_target()
    lanes = lanes_of(dtype, target)
    if rows is not None and rows < SKINNY_ROWS:
        return skinny_width(N, rows, lanes, target)
    width = 2 * lanes if lanes < N else lanes
    if rows_low is not None and rows_low < SKINNY_ROWS:
        width = max(width, skinny_width(N, SKINNY_ROWS - 1, lanes, target))
    return width


# Skinny products (GEMV and small M): a few rows of activations against a large constant weight, as in the
# fully connected layers of a batch-1 model. The product is bound by streaming the weight from memory, so the
# weight is packed at compile time (`ember.passes.pack`) into panels [N / nr, K, nr] read front to back, each
# panel once for all M rows: the accumulators of the M x nr tile stay in registers while K runs; the panels
# are split across threads (the plan's order puts them outermost and `_parallel` fuses and parallelizes them).
SKINNY_ROWS = 8  # fewer rows than this: the skinny plan (from 8 rows the GEMM's own plan packs B)


def skinny_width(N: int, rows: int, lanes: int, target: Target) -> int:
    """Panel columns of a skinny product: up to four vectors (independent FMA chains that hide the latency) while
    the rows x vectors accumulators fit the registers, never wider than N needs."""
    vecs = max(1, min(4, (vector_regs(target) - 4) // max(rows, 1), -(-N // lanes)))
    return vecs * lanes


def skinny_plan(M: int, nr: int, target: Target) -> GemmPlan:
    """The plan of a skinny product on panels of width nr: all M rows in the register tile, the reduction
    unrolled by 8 (loads of the panel in flight), panels outermost."""
    return GemmPlan(mr=max(1, M), nr=nr, packed=True, kr=8, order="ji")


def _tuned_gemm_plan(cfg: ConfigBase, M: int, N: int, K: int, lanes: int, dflt: GemmPlan,
                     prepacked: bool = False) -> GemmPlan:  # fmt: skip
    """The packed GEMM's knobs: register tile rows and columns (whole vectors), reduction unroll,
    order of the outer tile loops, B packed into panels or read in place, unrolling of the register
    tile's rows and column vectors. A B packed at compile time (`prepacked`) fixes the columns."""
    cfg.template = cfg.template or "gemm"
    rows = sorted({r for r in (1, 2, 3, 4, 5, 6, 8, 10, 12, 14, 16) if r <= M} | {dflt.mr})
    mr = cfg.define_split("tile_m", M, 2, policy="candidate", candidates=[(-1, r) for r in rows],
                          default=(-1, dflt.mr))[-1]  # fmt: skip
    nr = dflt.nr
    if not prepacked:
        cols = sorted({v * lanes for v in (1, 2, 3, 4) if v == 1 or (v - 1) * lanes < N} | {dflt.nr})
        nr = cfg.define_split("tile_n", N, 2, policy="candidate", candidates=[(-1, c) for c in cols],
                              default=(-1, dflt.nr))[-1]  # fmt: skip
    unrolls = sorted({k for k in (1, 2, 4, 8) if k <= K} | {min(dflt.kr, K)})
    kr = cfg.define_split("tile_k", K, 2, policy="candidate", candidates=[(-1, k) for k in unrolls],
                          default=(-1, min(dflt.kr, K)))[-1]  # fmt: skip
    order = cfg.define_knob("order", ["ij", "ji"], default=dflt.order)
    packed = True if prepacked else cfg.define_knob("pack_b", [True, False], default=dflt.packed)
    unroll = cfg.define_annotate("unroll_tile", 2, policy="try_unroll", default=dflt.unroll)
    return GemmPlan(mr=mr, nr=nr, packed=packed, kr=kr, order=order, unroll=unroll)


def gemm_acc(
    batch: tuple[int, ...],
    M: int,
    N: int,
    K: int,
    a_at: Callable[[Index, Expr, Expr], Expr],
    b_at: Callable[[Index, Expr, Expr], Expr],
    b_batch: tuple[int, ...],
    b_index: Callable[[Index], Index],
    dtype: DType | str,
    name: str = "gemm",
    cfg: ConfigBase | None = None,
    packed_b: Tensor | None = None,
) -> Tensor:
    """The accumulation stage of a (batched) matrix product, shape (*batch, M, Np) with Np >= N
    (columns past N are padding: read only [..., :N]).

    a_at(batch_idx, i, k) and b_at(b_batch_idx, k, j) give the operands' elements (already cast to
    the accumulation dtype); b_index maps an index of `batch` to an index of B's batch dims
    `b_batch` (broadcasting), so a B without batch dims is packed once for all batches. `cfg` is
    the tuning config (`gemm_plan`), None for the fallback plan. `packed_b`: B already packed
    (`*b_batch, N / nr, K, nr`, zeros past N; a weight packed at compile time), read in place of
    b_at, with no packing stage in the kernel."""
    dt = as_dtype(dtype)
    plan = gemm_plan(size_hint(M), size_hint(N), size_hint(K), dt, cfg=cfg,  # symbolic sizes: tiles at their hint
                     fixed_nr=packed_b.shape[-1] if packed_b is not None else None,
                     static_rows=not isinstance(M, Expr))  # fmt: skip
    k = te.reduce_axis((0, K), name="k")
    nb = len(batch)
    if plan.packed:
        nr = plan.nr
        npanels = -(-N // nr) if not isinstance(N, Expr) else (N + (nr - 1)) // nr  # (the analyzer bounds this form)

        def pack(*idx):
            bb, (jb, kk, z) = idx[: len(b_batch)], idx[len(b_batch) :]
            j = jb * nr + z
            v = b_at(bb, kk, j)
            return v if N % nr == 0 else te.if_then_else(j < N, v, zero(v.dtype))

        if packed_b is not None:
            pb = packed_b
        else:
            pb = te.compute(b_batch + (npanels, K, nr), pack, name=f"{name}_packed_b", tag="gemm_pack")

        def body(*idx):
            bi, i, j = idx[:nb], idx[nb], idx[nb + 1]
            return te.sum(a_at(bi, i, k) * pb[b_index(bi) + (j // nr, k, j % nr)], axis=k)

        shape = batch + (M, npanels * nr)
    else:
        pb = None

        def body(*idx):
            bi, i, j = idx[:nb], idx[nb], idx[nb + 1]
            return te.sum(a_at(bi, i, k) * b_at(b_index(bi), k, j), axis=k)

        shape = batch + (M, N)
    stage = pb if packed_b is None else None  # a packing stage this kernel schedules
    return te.compute(shape, body, name=name, tag="gemm", attrs={"plan": plan, "pack": stage, "panels": pb})


def _schedule_gemm(s: te.Schedule, out: Tensor, attrs: dict, target: Target) -> set[str]:
    """Register-tile the accumulation at the output's (i, j) tile; attrs `i_axis`/`j_axis` name the
    output's row and column axes (None for a 1-d operand), its other axes are batch loops."""
    acc: Tensor = attrs["acc"]
    plan: GemmPlan = acc.op.attrs["plan"]
    O = s[out]
    axes = list(O.op.axis)
    ia, ja = attrs.get("i_axis"), attrs.get("j_axis")
    lanes = min(lanes_of(acc.dtype, target), plan.nr)
    vec = plan.nr % lanes == 0 and lanes > 1
    # symbolic sizes unroll too: the loop partition splits full tiles (no guards) from a guarded tail it keeps rolled
    accl = s.cache_write(acc, "local")
    s[acc].compute_inline()
    outer = [ax for d, ax in enumerate(axes) if d not in (ia, ja)]
    inner = []
    if ia is not None:
        io, ii = O.split(axes[ia], plan.mr)
        outer.append(io)
        inner.append(ii)
        O.unroll(ii)
    if ja is not None:
        jo, ji = O.split(axes[ja], plan.nr)
        outer.append(jo)
        inner.append(ji)
    if plan.order == "ji" and ia is not None and ja is not None:
        outer[-2], outer[-1] = outer[-1], outer[-2]  # column panels outside: one panel of B stays in cache
    O.reorder(*outer, *inner)
    if ja is not None and vec:
        jio, jii = O.split(inner[-1], lanes)
        O.unroll(jio)
        O.vectorize(jii)
    L = s[accl]
    *lb, li, lj = L.op.axis
    (kax,) = L.op.reduce_axis
    ko, ki = L.split(kax, plan.kr)
    if vec:
        jco, jci = L.split(lj, lanes)
        L.reorder(*lb, ko, ki, li, jco, jci)
        L.vectorize(jci)
        if plan.unroll[1] == "unroll":
            L.unroll(jco)
    else:
        L.reorder(*lb, ko, ki, li, lj)
    if plan.unroll[0] == "unroll":
        L.unroll(li)
    L.unroll(ki)
    L.compute_at(O, outer[-1])
    panels = acc.op.attrs.get("panels")
    row_tiles = -(-size_hint(out.shape[ia]) // plan.mr) if ia is not None else 1
    if plan.packed and plan.order == "ji" and ja is not None and panels is not None \
            and prefetch_blocks(panels, len(panels.shape) - 3, target, row_tiles):  # fmt: skip
        # the next panel of B into L2 while this one is computed: each row tile prefetches its share of the lines
        # the reduction step reads (a panel read from L3 or memory by the first row tile stalled it: 12-25%)
        L.prefetch(panels, ko, dim=len(panels.shape) - 3, offset=1, spread=(O, io))
    _parallel(O, outer, out, target)
    done = {O.name, L.name}
    pb = acc.op.attrs.get("pack")
    if pb is not None:
        done.add(_schedule_pack(s, pb, 3, target))
    return done


PREFETCH_MIN_BYTES = 1 << 18  # a constant operand this large prefetches its next block (smaller ones stay in cache)
PREFETCH_MAX_BLOCK = 1 << 19  # ... where one block is at most this (a quarter of L2: the next one fits beside it)


def prefetch_blocks(t: Tensor, dim: int, target: Target, uses: int, step: int = 1) -> bool:
    """Whether a kernel prefetches the next block of operand t along `dim` (B's panels of a GEMM, a convolution's
    output-channel blocks of weights) while it computes this one, each block read `uses` times (its row tiles):
    on CPU targets, for t of PREFETCH_MIN_BYTES or more (inside a model it comes from L3 or memory, and the first
    use of each block stalled on it), blocks (`step` of them along dim) of at most PREFETCH_MAX_BLOCK, used twice
    or more. A block read once (a skinny product's panel) is a stream that the hardware prefetcher follows;
    prefetching a whole block ahead of it evicted what it was reading (AlexNet's fully connected layers, 2.4 MB
    panels: 21.7 -> 30.0 ms)."""
    shape = t.shape
    if target.kind not in ("c", "llvm") or any(isinstance(n, Expr) for n in shape) or shape[dim] < 2 or uses < 2:
        return False
    size = prod_hint(shape) * as_dtype(t.dtype).bits // 8
    return size >= PREFETCH_MIN_BYTES and size // shape[dim] * step <= PREFETCH_MAX_BLOCK


def _schedule_pack(s: te.Schedule, t: Tensor, inner_dims: int, target: Target) -> str:
    """A packed operand [..., block, ..., lanes]: the last axis in the target's vectors (the block's width is the
    host's: a cross target's may be narrower, or none), parallel over the leading ones."""
    P = s[t]
    axes = P.op.axis
    lanes, width = target.vector_lanes(t.dtype.bits), size_hint(axes[-1].dom[1])
    if lanes > 1:
        P.vectorize(P.split(axes[-1], lanes)[1] if width > lanes and width % lanes == 0 else axes[-1])
    lead = axes[: len(axes) - inner_dims + 1]
    if target.num_cores > 1 and prod_hint(t.shape) >= 1 << 16:
        P.parallel(P.fuse(*lead) if len(lead) > 1 else lead[0])
    return P.name


def _parallel(O: te.Stage, outer: list, out: Tensor, target: Target) -> None:
    """Run the outer tile loops of an output stage in parallel when there is enough work."""
    if target.num_cores <= 1 or not outer or work(out) < 1 << 17:
        return
    O.parallel(O.fuse(*outer) if len(outer) > 1 else outer[0])


def work(out: Tensor) -> int:
    """Multiply-adds of the stages an output reads (a rough size for parallel decisions)."""
    total, seen, todo = 0, set(), [out]
    while todo:
        t = todo.pop()
        if id(t.op) in seen or not isinstance(t.op, ComputeOp):
            continue
        seen.add(id(t.op))
        n = prod_hint(t.shape)
        if isinstance(t.op.body, Reduce):
            n *= prod_hint(iv.dom[1] for iv in t.op.reduce_axis)
        total += n
        todo.extend(t.op.inputs)
    return total


# =====================================================================================================
# direct convolution and window reductions (pooling), N-d, NCHW
# =====================================================================================================
@dataclass(frozen=True)
class Window:
    """Geometry of a sliding window over the spatial dims (after padding)."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    out: tuple[int, ...]  # output spatial shape

    def at(self, o: Sequence[Expr], k: Sequence[Expr]) -> tuple[Expr, ...]:
        return tuple(oi * s + ki * d for oi, ki, s, d in zip(o, k, self.strides, self.dilations))


def pad_input(x_at: Callable[..., Expr], shape: tuple[int, ...], before: Sequence[int], after: Sequence[int],
              value: Expr, dtype: DType, name: str = "pad", materialize: bool = True) -> Tensor:  # fmt: skip
    """x padded along its trailing len(before) dims. Materialized once at root by default (a copy of
    the input is cheaper than a bounds check in every inner-loop read, and keeps those reads vector
    loads); else inlined into the reader, whose loop partitioning drops the checks inside.
    x_at(*idx) reads the unpadded input."""
    lead = len(shape) - len(before)
    if not any(before) and not any(after):
        return te.compute(shape, lambda *idx: x_at(*idx), name=name)  # inlined into its readers
    padded = shape[:lead] + tuple(n + b + a for n, b, a in zip(shape[lead:], before, after))

    def body(*idx):
        conds, src = [], list(idx[:lead])
        for i, n, b in zip(idx[lead:], shape[lead:], before):
            src.append(i - b)
            conds += [i >= b, i < b + n]
        return te.if_then_else(te.all(*conds), x_at(*src), value)

    return te.compute(padded, body, name=name, tag="nn_pad", attrs={"materialize": materialize})


@dataclass(frozen=True)
class ConvPlan:
    kind: str  # "conv_oc": output channels in vectors; "conv_ow": output width in vectors
    block: int  # conv_oc: channels per vector block (ocb); conv_ow: output channels per tile
    width: int  # output-width positions per tile
    vector: bool = True  # vectors along the width (False: strided reads would be gathers)
    height: int = 1  # conv_oc: output rows per tile
    reduce_order: str = "rc_k"  # conv_oc: input channels outside the kernel window ("rc_k"), inside it
    # ("k_rc"), or between its rows and columns ("kh_rc_kw")
    unroll_kw: bool = False  # conv_oc: unroll the innermost kernel axis
    unroll: tuple[str, str] = ("unroll", "unroll")  # conv_oc: register tile positions, channel vectors


def conv_plan(Co: int, Cog: int, ow: int, stride: int, dtype: DType, target: Target | None = None) -> ConvPlan:
    """conv_oc when a group's output channels fill whole vectors (dense convs: any stride, the input
    read as scalars), else conv_ow (depthwise, few channels per group: vectors along the width)."""
    target = target or host_target()
    lanes = lanes_of(dtype, target)
    regs = vector_regs(target)
    if Cog % lanes == 0 and lanes > 1:
        ocb = 2 * lanes if Cog % (2 * lanes) == 0 else lanes
        cap = (regs - 4) // (ocb // lanes)  # wider channel blocks for narrow maps spill (measured)
        return ConvPlan("conv_oc", ocb, _best_block(ow, min(cap, 24)))
    if ow >= 2 * lanes and stride == 1:
        return ConvPlan("conv_ow", max(1, min(Co, 12 if regs >= 32 else 6)), 2 * lanes)
    width = lanes if ow >= lanes else _pow2_floor(ow)
    return ConvPlan("conv_ow", max(1, min(Co, 8 if regs >= 32 else 4)), width)


def _tuned_conv_oc_plan(cfg: ConfigBase, dflt: ConvPlan, Cog: int, win: Window, lanes: int) -> ConvPlan:
    """conv_oc's knobs: channel block (whole vectors dividing a group's channels; it sets the weight
    layout), output positions per tile along the width and the height, the order of the reduction
    loops, unrolling of the innermost kernel axis and of the register tile (positions, channel vectors)."""
    cfg.template = cfg.template or "conv_oc"
    ow = win.out[-1]
    blocks = sorted({v * lanes for v in (1, 2, 4) if Cog % (v * lanes) == 0} | {dflt.block})
    block = cfg.define_split("tile_oc", Cog, 2, policy="candidate", candidates=[(-1, b) for b in blocks],
                             default=(-1, dflt.block))[-1]  # fmt: skip
    widths = sorted({w for w in (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28) if w <= ow} | {dflt.width})
    width = cfg.define_split("tile_ow", ow, 2, policy="candidate", candidates=[(-1, w) for w in widths],
                             default=(-1, dflt.width))[-1]  # fmt: skip
    height = 1
    if len(win.out) >= 2 and win.out[-2] > 1:
        height = cfg.define_split("tile_oh", win.out[-2], 2, policy="candidate", candidates=[(-1, 1), (-1, 2)],
                                  default=(-1, 1))[-1]  # fmt: skip
    orders = ["rc_k", "k_rc"] + (["kh_rc_kw"] if len(win.kernel) >= 2 else [])
    order = cfg.define_knob("reduce_order", orders, default=dflt.reduce_order)
    unroll_kw = cfg.define_knob("unroll_kw", [False, True], default=dflt.unroll_kw)
    unroll = cfg.define_annotate("unroll_tile", 2, policy="try_unroll", default=dflt.unroll)
    return ConvPlan("conv_oc", block, width, height=height, reduce_order=order, unroll_kw=unroll_kw, unroll=unroll)


def _tuned_conv_ow_plan(cfg: ConfigBase, dflt: ConvPlan, Co: int, win: Window, lanes: int) -> ConvPlan:
    """conv_ow's knobs (depthwise and narrow-group convs): output channels per tile, output positions
    per tile along the width (whole vectors, or the fallback's width)."""
    cfg.template = cfg.template or "conv_ow"
    blocks = sorted({b for b in (1, 2, 3, 4, 6, 8, 12, 16) if b <= Co} | {dflt.block})
    block = cfg.define_split("tile_co", Co, 2, policy="candidate", candidates=[(-1, b) for b in blocks],
                             default=(-1, dflt.block))[-1]  # fmt: skip
    ow = win.out[-1]
    widths = sorted({w * lanes for w in (1, 2, 4) if (w == 1 or w * lanes <= 2 * ow)} | {dflt.width})
    width = cfg.define_split("tile_ow", ow, 2, policy="candidate", candidates=[(-1, w) for w in widths],
                             default=(-1, dflt.width))[-1]  # fmt: skip
    return ConvPlan("conv_ow", block, width, vector=dflt.vector)


def conv_acc(
    xp: Tensor,
    w_at: Callable[[Expr, Expr, tuple[Expr, ...]], Expr],
    Co: int,
    groups: int,
    win: Window,
    dtype: DType,
    name: str = "conv",
    cfg: ConfigBase | None = None,
) -> tuple[Tensor, Callable[..., Expr], str]:
    """Direct grouped convolution of padded input xp (N, C, *spatial) with weights w_at(co, ci, k).

    Returns (acc, read, template): read(n, co, *o) is the accumulated output element. `cfg` is the
    tuning config of the conv_oc or conv_ow template (`_tuned_conv_oc_plan`, `_tuned_conv_ow_plan`),
    None for the fallback plan."""
    N, C = xp.shape[:2]
    Cg, Cog = C // groups, Co // groups
    plan = conv_plan(Co, Cog, win.out[-1], win.strides[-1], dtype)
    if cfg is not None and plan.kind == "conv_oc":
        plan = _tuned_conv_oc_plan(cfg, plan, Cog, win, lanes_of(dtype, host_target()))
    elif cfg is not None:
        plan = _tuned_conv_ow_plan(cfg, plan, Co, win, lanes_of(dtype, host_target()))
    ci = te.reduce_axis((0, Cg), name="rc")
    ks = [te.reduce_axis((0, k), name=f"rk{d}") for d, k in enumerate(win.kernel)]
    raxes = [ci, *ks]
    if plan.kind == "conv_oc":
        ocb = plan.block
        cbg = Cog // ocb  # vector blocks per group

        def pack(*idx):
            return w_at(idx[0] * ocb + idx[-1], idx[1], tuple(idx[2:-1]))

        wp = te.compute((Co // ocb, Cg, *win.kernel, ocb), pack, name=f"{name}_packed_w", tag="conv_pack")

        def body(*idx):
            n, cb, o, oc = idx[0], idx[1], idx[2:-1], idx[-1]
            x = xp[(n, (cb // cbg) * Cg + ci if groups > 1 else ci) + win.at(o, ks)]
            return te.sum(x * wp[(cb, ci, *ks, oc)], axis=raxes)

        acc = te.compute((N, Co // ocb, *win.out, ocb), body, name=name, tag="conv_oc",
                         attrs={"plan": plan, "pack": wp})  # fmt: skip
        return acc, lambda n, co, *o: acc[(n, co // ocb, *o, co % ocb)], "conv_oc"  # noqa: E731

    def body_ow(*idx):
        n, co, o = idx[0], idx[1], idx[2:]
        c = (co // Cog) * Cg + ci if groups > 1 else ci
        return te.sum(xp[(n, c) + win.at(o, ks)] * w_at(co, ci, tuple(ks)), axis=raxes)

    acc = te.compute((N, Co, *win.out), body_ow, name=name, tag="conv_ow", attrs={"plan": plan})
    return acc, lambda n, co, *o: acc[(n, co, *o)], "conv_ow"


def window_acc(xp: Tensor, win: Window, reducer, pre: Callable[[Expr], Expr] | None = None,
               name: str = "pool") -> Tensor:  # fmt: skip
    """reducer over each window of padded xp (N, C, *spatial): a pooling accumulation."""
    ks = [te.reduce_axis((0, k), name=f"rk{d}") for d, k in enumerate(win.kernel)]
    N, C = xp.shape[:2]
    lanes = lanes_of(xp.dtype, host_target())
    ow = win.out[-1]
    if win.strides[-1] > 1:  # strided window reads in vectors too: 4-9x faster than scalar reads (bench/ops_nn.py)
        plan = ConvPlan("conv_ow", max(1, min(C, 2)), lanes if ow >= lanes else _pow2_floor(ow))
    else:
        plan = ConvPlan("conv_ow", max(1, min(C, 4)), lanes if ow >= lanes else _pow2_floor(ow))

    def body(*idx):
        v = xp[idx[:2] + win.at(idx[2:], ks)]
        return reducer(pre(v) if pre else v, axis=ks)

    return te.compute((N, C, *win.out), body, name=name, tag="conv_ow", attrs={"plan": plan})


def _schedule_conv_oc(s: te.Schedule, out: Tensor, attrs: dict, target: Target) -> set[str]:
    """Output tile: `width` positions of the last spatial axis x one block of output channels, the
    block in vectors (the accumulator tile lives in registers); reduction loops (ci, kernel) outside
    the tile; the copy-out scatters channel vectors to NCHW."""
    acc: Tensor = attrs["acc"]
    plan: ConvPlan = acc.op.attrs["plan"]
    lanes = min(lanes_of(acc.dtype, target), plan.block)
    O = s[out]
    n, co, *sp = O.op.axis
    accl = s.cache_write(acc, "local")
    s[acc].compute_inline()
    cob, coi = O.split(co, plan.block)
    wo, wi = O.split(sp[-1], plan.width)
    rows = plan.height > 1 and len(sp) >= 2
    if rows:
        ho, hi = O.split(sp[-2], plan.height)
        outer, tile = [n, cob, *sp[:-2], ho, wo], [hi, wi]
    else:
        outer, tile = [n, cob, *sp[:-1], wo], [wi]
    O.reorder(*outer, *tile, coi)
    for ax in tile:
        O.unroll(ax)
    if plan.block % lanes == 0:
        cio, cii = O.split(coi, lanes)
        O.unroll(cio)
        O.vectorize(cii)
    L = s[accl]
    ln, lcb, *lsp, loc = L.op.axis
    red = _reduce_order(L.op.reduce_axis, plan.reduce_order)
    ltile = lsp[-2:] if rows else lsp[-1:]
    lrest = lsp[: len(lsp) - len(ltile)]
    if plan.block % lanes == 0:
        oco, oci = L.split(loc, lanes)
        L.reorder(ln, lcb, *lrest, *red, *ltile, oco, oci)
        L.vectorize(oci)
        if plan.unroll[1] == "unroll":
            L.unroll(oco)
    else:
        L.reorder(ln, lcb, *lrest, *red, *ltile, loc)
    if plan.unroll[0] == "unroll":
        for ax in ltile:
            L.unroll(ax)
    if plan.unroll_kw and len(red) > 1:
        L.unroll(L.op.reduce_axis[-1])
    L.compute_at(O, wo)
    _parallel(O, outer[:-1], out, target)
    return {O.name, L.name, _schedule_pack(s, acc.op.attrs["pack"], len(acc.op.attrs["pack"].shape), target)}


def _reduce_order(red: Sequence, order: str) -> list:
    """Reduction loops (rc, *kernel axes) in a conv_oc plan's order."""
    rc, *ks = red
    if order == "k_rc":
        return [*ks, rc]
    if order == "kh_rc_kw" and len(ks) >= 2:
        return [*ks[:-1], rc, ks[-1]]
    return [rc, *ks]


def _schedule_conv_ow(s: te.Schedule, out: Tensor, attrs: dict, target: Target) -> set[str]:
    """Output tile: `block` channels x `width` positions of the last spatial axis, the positions in
    vectors; reduction loops outside the tile (also serves pooling windows)."""
    acc: Tensor = attrs["acc"]
    plan: ConvPlan = acc.op.attrs["plan"]
    lanes = min(lanes_of(acc.dtype, target), plan.width)
    O = s[out]
    n, co, *sp = O.op.axis
    accl = s.cache_write(acc, "local")
    s[acc].compute_inline()
    cob, coi = O.split(co, plan.block)
    wo, wi = O.split(sp[-1], plan.width)
    outer = [n, cob, *sp[:-1], wo]
    O.reorder(*outer, coi, wi)
    O.unroll(coi)
    vec = plan.vector and plan.width % lanes == 0 and lanes > 1 and plan.width & (plan.width - 1) == 0
    if vec:
        wio, wii = O.split(wi, lanes)
        O.unroll(wio)
        O.vectorize(wii)
    L = s[accl]
    ln, lco, *lsp = L.op.axis
    red = L.op.reduce_axis
    if vec:
        lwo, lwi = L.split(lsp[-1], lanes)
        L.reorder(ln, *lsp[:-1], *red, lco, lwo, lwi)
        L.vectorize(lwi)
        L.unroll(lwo)
    else:
        L.reorder(ln, *lsp[:-1], *red, lco, lsp[-1])
        L.unroll(lsp[-1])
        O.unroll(wi)
    L.unroll(lco)
    L.compute_at(O, wo)
    pad = _padded_input(acc)
    if pad is None:
        _parallel(O, outer[:-1], out, target)
        return {O.name, L.name}
    # the padded copy of the tile's channels, made right before their rows are read (L2-resident), not a copy of
    # the whole input at root that is written to memory and read back (depthwise 3x3 at 112x112: the copy was
    # half the kernel's time); parallel over the channel tiles
    tiles = O.fuse(n, cob)
    if target.num_cores > 1 and work(out) >= 1 << 17:
        O.parallel(tiles)
    P = s[pad]
    P.compute_at(O, tiles)
    _schedule_rows(P, pad, target, parallel=False)
    return {O.name, L.name, P.name}


def _padded_input(acc: Tensor) -> Tensor | None:
    """The materialized padded input (`pad_input`) that a window accumulation reads, if any."""
    for t in acc.op.inputs:
        if isinstance(t.op, ComputeOp) and t.op.tag == "nn_pad" and t.op.attrs.get("materialize"):
            return t
    return None


# =====================================================================================================
# exp in vector arithmetic: what the LLVM renderer (and the C renderer without libmvec) emits for a vector
# exp (`ember.codegen.vmath`, with the table as constant data), and a building block for computes
# =====================================================================================================
def exp_table() -> Tensor:
    """2^(k - 151) for k in [0, 280): the powers of two `exp` scales by, computed once per kernel call."""
    return te.compute((280,), lambda k: te.pow(te.const(2.0, "float32"), te.cast(k - 151, "float32")),
                      name="exp2_table", attrs={"materialize": True})  # fmt: skip


EXP_LOW = -87.33654  # ln FLT_MIN, rounded up: exp below it would be subnormal, and the vector exps give 0 there


def exp(x: Expr, table: Tensor | None = None) -> Expr:
    """exp for float32 in plain arithmetic and selects, so that it vectorizes (the C library's expf
    runs once per lane): x = n ln2 + r with |r| <= ln2/2 (Cody-Waite), Cephes' degree-7 polynomial
    for e^r (about 1 ulp), and 2^n looked up in `table` (`exp_table()`, a gather), or else built
    as a product of one factor per binary digit of |n| (each digit found on its own: a sequential
    scale-by-digit would repeat the expression tree, te has no let). NaN stays NaN, exp(-inf) = 0,
    overflow gives inf, and results below FLT_MIN are 0 (x < EXP_LOW: a subnormal result costs the CPU a
    microcode assist, as `ember.codegen.vmath.c_vector_exp` says). Other dtypes use the library call."""
    if x.dtype.scalar.name != "float32":
        return te.exp(x)

    def f(v: float) -> Expr:
        return te.const(v, "float32")

    def rint(v: Expr) -> Expr:  # round to nearest for |v| < 2^22: adding 1.5 * 2^23 drops the fraction
        return (v + f(12582912.0)) - f(12582912.0)

    def pick(cond: Expr, a: float, b: float) -> Expr:  # selects of constants only: they vectorize
        return te.if_then_else(cond, f(a), f(b))

    finite = te.if_then_else(x != x, f(0.0), x)  # max/min propagate NaN; NaN is put back at the end
    xc = te.minimum(te.maximum(finite, f(EXP_LOW)), f(88.75))
    n = rint(xc * f(1.44269504088896341))
    r = xc - n * f(0.693359375) - n * f(-2.12194440e-4)
    p = f(1.9875691500e-4)
    for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        p = p * r + f(c)
    p = (p * (r * r) + r + f(1.0)) * f(2.0)  # times 2^n = 2 * 2^(n - 1): the factors stay finite
    if table is not None:  # 2^(n - 1) = table[n + 150]
        p = p * table[te.cast(n, "int32") + 150]
        return p * pick(x > f(88.72283), math.inf, 1.0) * pick(x != x, math.nan, 1.0) * pick(x < f(EXP_LOW), 0.0, 1.0)
    m = te.abs(n - f(1.0))  # an integer <= 152
    for b in range(8):
        half = float(2**b)
        q = rint(m * f(1.0 / (2 * half)) - f(0.5 - 0.25 / half))  # floor(m / 2^(b+1)), never a tie
        digit = pick(m - q * f(2 * half) >= f(half), 1.0, 0.0)
        up = pick(n < f(1.0), 2.0 ** -(2**b), 2.0 ** (2**b) if b < 7 else 0.0)  # 2^128: only needed below
        p = p * (digit * up + (f(1.0) - digit))  # exact: one of the two terms is 0
    return p * pick(x > f(88.72283), math.inf, 1.0) * pick(x != x, math.nan, 1.0) * pick(x < f(EXP_LOW), 0.0, 1.0)


# =====================================================================================================
# row reductions (softmax, normalizations, global pooling): rows of contiguous elements
# =====================================================================================================
ROW_TAGS = ("row_partial", "row_reduce", "row_buffer")


def row_reduce(rows: tuple[int, ...], length: int, at: Callable[[Index, Expr], Expr], reducer: te.Reducer,
               dtype: DType, name: str = "row", acc: int = 1) -> Callable[[Index], Expr]:  # fmt: skip
    """reducer over l in [0, length) of at(r, l), for each row index r of shape `rows`; returns the
    reduced value's reader. Long rows reduce in vectors first (a partial result per lane, then
    across the lanes, then the tail past the last whole vector), so the loop over l vectorizes.
    `acc` vectors of partial results (independent chains: the reduction's latency overlaps) where the row
    holds at least two steps of them, else one."""
    lanes = lanes_of(dtype, host_target())
    nr = len(rows)
    if size_hint(length) < 2 * lanes or lanes == 1:  # a symbolic length: the vector path and a symbolic tail
        l_ = te.reduce_axis((0, length), name="rl")
        whole = te.compute(rows, lambda *r: reducer(at(r, l_), axis=l_), name=name, tag="row_reduce")
        return lambda r: whole[tuple(r)]
    while acc > 1 and size_hint(length) < 2 * acc * lanes:
        acc //= 2
    base = lanes
    lanes *= acc  # several vectors of partials: the schedule splits their axis into vectors (`_schedule_row_template`)
    full = length // lanes
    lo = te.reduce_axis((0, full), name="rlo")
    part = te.compute(rows + (lanes,), lambda *i: reducer(at(i[:nr], lo * lanes + i[nr]), axis=lo),
                      name=f"{name}_lanes", tag="row_partial")  # fmt: skip
    # whole vectors past the last step of `acc` vectors (Np = 224 scores = 3 x 64 + 2 x 16): one more vector of
    # partials, joined where the lane tree is one vector wide, instead of a scalar tail of 32 dependent steps
    # (a symbolic length: a loop over the whole vectors where it is made of them, as attention's panel width is;
    # else a scalar tail)
    vectors = (length - full * lanes) // base if isinstance(length, int) or te.multiple_of(length, base) else 0
    extra = None
    if not isinstance(vectors, int) or vectors:
        v = te.reduce_axis((0, vectors), name="rv")
        extra = te.compute(rows + (base,), lambda *i: reducer(at(i[:nr], full * lanes + v * base + i[nr]), axis=v),
                           name=f"{name}_vectors", tag="row_partial")  # fmt: skip
    total = _lane_tree(part, rows, lanes, reducer, name, extra)
    rest = length - full * lanes - vectors * base
    if not isinstance(vectors, int) or rest == 0:  # (a symbolic count of vectors covers the row)
        return lambda r: total[(*r, 0)]
    t = te.reduce_axis((0, rest), name="rt")
    start = full * lanes + vectors * base
    tail = te.compute(rows, lambda *r: reducer(at(r, start + t), axis=t), name=f"{name}_tail", tag="row_reduce")
    return lambda r: reducer.combine(total[(*r, 0)], tail[tuple(r)])


def _lane_tree(part: Tensor, rows: tuple[int, ...], lanes: int, reducer: te.Reducer, name: str,
               extra: Tensor | None = None) -> Tensor:  # fmt: skip
    """The partial results of each row (its last axis, `lanes` of them, a power of two) combined in halves: each
    step one vector operation on half as many lanes, log2(lanes) dependent steps where a loop over the lanes
    would take `lanes`. `extra` (partials of the same row, fewer lanes) joins the step of its width."""
    nr, cur, width = len(rows), part, lanes
    while width > 1:
        width //= 2

        def body(*i, p=cur, w=width):
            r = reducer.combine(p[i], p[(*i[:nr], i[nr] + w)])
            return reducer.combine(r, extra[i]) if extra is not None and extra.shape[-1] == w else r

        cur = te.compute(rows + (width,), body, name=f"{name}_{width}" if width > 1 else name, tag="row_partial")
    return cur


def row_buffer(shape: tuple[int, ...], fn: Callable[..., Expr], name: str) -> Tensor:
    """An elementwise stage kept per row (computed once at the row loop, e.g. softmax's exp)."""
    return te.compute(shape, fn, name=name, tag="row_buffer", attrs={"materialize": True})


def _schedule_row_template(s: te.Schedule, out: Tensor, attrs: dict, target: Target) -> set[str]:
    """The output's leading `rows` axes fused into the row loop (parallel when big), its other axes
    fused and vectorized; every row stage whose readers all run in that loop is computed there."""
    O = s[out]
    k = attrs["rows"]
    axes = O.op.axis
    lanes = lanes_of(out.dtype, target)
    unroll = attrs.get("unroll", 1)
    inner = axes[k:]
    if inner:
        f = O.fuse(*inner) if len(inner) > 1 else inner[0]
        if prod_hint(out.shape[k:]) >= lanes:
            fo, fi = O.split(f, lanes)
            O.vectorize(fi)
            _unroll_vectors(O, fo, prod_hint(out.shape[k:]) // lanes, unroll)
    done = {O.name}
    if k == 0:
        return done
    if k > 1 and any(isinstance(d, Expr) for d in out.shape[:k]):  # symbolic rows: nested loops (a fused row
        outer, row = axes[0], axes[k - 1]  # index would unravel by a size at every access)
    else:
        outer = row = O.fuse(*axes[:k]) if k > 1 else axes[0]
    members = _row_members(s, O)
    for st in s.stages:
        if st not in members:
            continue
        st.compute_at(O, row)
        done.add(st.name)
        tag = st.op.tag
        sl = lanes_of(st.op.dtype, target)
        if tag == "row_partial" and 1 < st.op.shape[-1] < sl:  # a step of the lane tree: one narrower vector
            st.vectorize(st.op.axis[-1])
        elif tag == "row_partial" and st.op.shape[-1] % sl == 0:
            lo, li = st.split(st.op.axis[-1], sl)
            st.vectorize(li)
            if st.op.shape[-1] > sl:  # several vectors of partials (row_reduce's acc): one chain each
                st.reorder(*st.op.reduce_axis, lo, li)
                st.unroll(lo)
        elif tag == "row_buffer" and len(st.op.axis) > k:
            f = st.fuse(*st.op.axis[k:]) if len(st.op.axis) > k + 1 else st.op.axis[k]
            if prod_hint(st.op.shape[k:]) >= sl:
                fo, fi = st.split(f, sl)
                st.vectorize(fi)
                _unroll_vectors(st, fo, prod_hint(st.op.shape[k:]) // sl, unroll)
    if target.num_cores > 1 and work(out) >= 1 << 16 and prod_hint(out.shape[:k]) > 1:
        O.parallel(outer)
    return done


def _unroll_vectors(st: te.Stage, outer, vectors: int, unroll: int) -> None:
    """Unroll the loop over a row's whole vectors by `unroll` (the rows template's knob) where it divides them."""
    if unroll > 1 and vectors % unroll == 0 and vectors > unroll:
        _, ui = st.split(outer, unroll)
        st.unroll(ui)
    elif unroll > 1 and vectors == unroll:
        st.unroll(outer)


def row_knobs(cfg: ConfigBase | None, length: int, dtype: DType) -> tuple[int, int]:
    """The rows template's knobs for rows of `length` elements: (acc, unroll), the vectors of partial results
    of each reduction (`row_reduce`) and the unroll of the loops over a row's vectors; (1, 1) without a config."""
    if cfg is None:
        return ROW_DEFAULT
    vectors = max(1, size_hint(length) // lanes_of(dtype, host_target()))
    accs = [a for a in (1, 2, 4) if a == 1 or vectors >= 2 * a]
    acc = cfg.define_knob("row_acc", accs, min(ROW_DEFAULT[0], accs[-1]))
    unroll = cfg.define_knob("row_unroll", [u for u in (1, 2, 4) if u <= vectors], ROW_DEFAULT[1])
    return acc, unroll


ROW_DEFAULT = (4, 1)  # (acc, unroll) without a config: the best on softmax rows of 128 and 197 (bench/ops_nn.py)


def _row_members(s: te.Schedule, O: te.Stage) -> set[te.Stage]:
    """Row stages (by tag) that can be computed inside O's row loop: every stage that reads them
    (looking through stages that will be inlined) is O or another member."""

    def inlined(st: te.Stage) -> bool:  # (or already inlined: a template stage under its fused epilogue, whose
        op = st.op  # output is O: a global pool's quantization)
        return st.attach == "inline" or (not st.is_output and isinstance(op, ComputeOp) and not isinstance(
            op.body, Reduce) and not op.attrs.get("materialize") and not op.attrs.get("template"))  # fmt: skip

    readers: dict[te.Stage, set[te.Stage]] = {}
    for st in s.stages:
        for t in st.op.inputs:
            readers.setdefault(s[t], set()).add(st)

    def effective(st: te.Stage, seen=None) -> set[te.Stage]:
        out = set()
        for r in readers.get(st, ()):
            out |= effective(r) if inlined(r) else {r}
        return out

    cand = {st for st in s.stages if isinstance(st.op, ComputeOp) and st.op.tag in ROW_TAGS and not st.is_output}
    changed = True
    while changed:
        changed = False
        for st in list(cand):
            if any(r is not O and r not in cand for r in effective(st)):
                cand.discard(st)
                changed = True
    return cand


# =====================================================================================================
# schedule entry point
# =====================================================================================================
SCHEDULES: dict[str, Callable[[te.Schedule, Tensor, dict, Target], set[str]]] = {
    "gemm": _schedule_gemm,
    "conv_oc": _schedule_conv_oc,
    "conv_ow": _schedule_conv_ow,
    "rows": _schedule_row_template,
    "int8_gemm": schedule_int8,
    "int8_dw": schedule_int8_dw,
}


def schedule_nn(attrs: dict, outs: Sequence[Tensor], target: Target) -> te.Schedule:
    """Templates for the stages that name one (`attrs["template"]`), default treatment elsewhere.

    A template stage that a fused elementwise consumer reads (conv + bias + relu) is inlined into
    that output, which is then tiled in its place. Other elementwise intermediates are inlined
    unless marked `materialize`; root stages are fused, vectorized and parallelized (`schedule_flat`)."""
    s = te.create_schedule(list(outs))
    done: set[str] = set()
    for st in list(s.stages):
        op = st.op
        kind = op.attrs.get("template") if isinstance(op, ComputeOp) else None
        if kind is None or prod_hint(op.shape) == 0:
            continue
        anchor = st if st.is_output else elementwise_output(s, st, outs)
        if anchor is None:
            anchor = st
        elif anchor is not st:
            st.compute_inline()
        done |= SCHEDULES[kind](s, anchor.op.output(), op.attrs, target)
    for st in s.stages:
        if st.is_placeholder or st.is_output or st.name in done or st.attach != "root":
            continue
        op = st.op
        if isinstance(op, ComputeOp) and not isinstance(op.body, Reduce) and not op.attrs.get("materialize"):
            st.compute_inline()
    for st in s.stages:
        if st.is_placeholder or st.attach != "root" or st.name in done:
            continue
        if isinstance(st.op, ComputeOp) and st.op.tag == "nn_pad":
            _schedule_rows(st, st.op.output(), target)
        else:
            schedule_flat(st, target)
    return s


def _schedule_rows(st: te.Stage, t: Tensor, target: Target, parallel: bool = True) -> None:
    """Outer axes fused (parallel when big and `parallel`), the last axis split by the lanes and vectorized: bounds
    checks along the last axis (padding) are then partitioned out of the vector loop. The rows (the axis before
    the last) stay a loop of their own where the outer axes are enough for the threads: fused in, a padded row's
    check is a remainder (`i % 113 >= 1`) that no loop bound can take out."""
    axes = st.op.axis
    if not axes or prod_hint(t.shape) == 0:
        return
    lanes = lanes_of(t.dtype, target)
    if isinstance(st.op, ComputeOp) and st.op.tag == "nn_pad":  # bytes as many as int32 lanes: the padding's
        lanes = min(lanes, lanes_of("int32", target))  # index checks fit one register of masks
    if t.shape[-1] >= lanes:
        _, wi = st.split(axes[-1], lanes)
        st.vectorize(wi)
    if len(axes) > 1:
        big = parallel and target.num_cores > 1 and prod_hint(t.shape) >= 1 << 16
        keep_rows = len(axes) > 2 and (not big or prod_hint(t.shape[:-2]) >= 2 * target.num_cores)
        outer_axes = axes[:-2] if keep_rows else axes[:-1]
        outer = st.fuse(*outer_axes) if len(outer_axes) > 1 else outer_axes[0]
        if big:
            st.parallel(outer)


def elementwise_output(s: te.Schedule, st: te.Stage, outs: Sequence[Tensor]) -> te.Stage | None:
    """The output of the same shape that reads st through elementwise stages only (a fused epilogue)."""
    for out in outs:
        o = s[out]
        if tuple(out.shape) != tuple(st.op.shape) or isinstance(o.op.body, Reduce):
            continue
        todo, seen = [o], set()
        while todo:
            cur = todo.pop()
            for t in cur.op.inputs:
                p = s[t]
                if p is st:
                    return o
                if p.is_placeholder or p.name in seen or isinstance(p.op.body, Reduce):
                    continue
                seen.add(p.name)
                todo.append(p)
    return None
