"""Winograd F(4x4, 3x3) and F(2x2, 3x3) convolution in the blocked layout NCHW[x]c (template "winograd_nchwc").

A stride-1, undilated 3x3 convolution computes each m x m tile of its output from an a x a tile of its
input (a = m + 2) with a*a products per (input, output) channel pair instead of 9*m*m (Lavin and Gray,
"Fast Algorithms for Convolutional Neural Networks", 2016): F(4x4, 3x3) with 36 products per 16 outputs
(points 0, +-1, +-2), F(2x2, 3x3) with 16 per 4 (points 0, +-1):

    Y = A^T [ (G g G^T) . (B^T d B) ] A

- the weight transform U = G g G^T is done at compile time (`winograd_weight`, called by
  `ember.passes.layout` on the constant weights): [a*a, K/kb, C/cb, cb, kb] (its first dim says the tile);
- the input transform V = B^T d B of each a x a tile, channel vectors at each point: [a, a, C/cb, P, cb]
  (P = N x tile rows x tile columns), the padding inlined into its reads (bounds checks);
- a*a independent products M[e] = U[e] V[e] over the input channels: a 1x1 convolution in the blocked
  layout, computed and scheduled by the dense template of `ember.templates.nchwc` ("conv_nchwc": a
  register tile of positions x output channel vectors, broadcast inputs);
- the output transform A^T M A, with the bias and the fused epilogue (relu, residual add) applied to
  each output vector as it is stored;
- where the products of the whole layer would not stay in L2 (few input channels, many tiles: SqueezeNet's
  16 -> 64 expand layers at 55x55, ResNet's 64-channel stage), they are fused with the output transform
  (`fused_plan`): per block of channel vectors x tile rows, the block's products of all points go to a
  cache-sized buffer that A^T M A reads at once, instead of M [a*a, K/kb, 1, P, kb] through memory.

The transforms are written out as sums of the non-zero terms of the matrices (a select over the
point, folded once the loops over points are unrolled), so they cost additions, not a x a products;
each is done in two passes (columns, then rows: B^T d in an a x a buffer per tile, A^T M in a buffer of
the product's size) so that the expressions stay small.

Which tile, if any: `winograd_cost` estimates the time of the direct template and of each tile (the
products at the same rate, the transforms' additions, the border tiles' overhang, and the weights streamed
from memory once per call: Winograd's are a*a/9 times the direct template's, read for only a few tiles each
at small maps); `winograd_tile` picks the cheaper one. float32 rounding grows with the
transform constants: errors around 1e-5 relative at F(4x4, 3x3), about 1e-6 at F(2x2, 3x3) (see the tests).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction as F

import numpy as np

from ember import te
from ember.target import Target
from ember.te.tensor import Tensor, size_hint
from ember.templates.nchwc import nchwc_plan, pad_nchwc
from ember.templates.nn import SCHEDULES, host_target, lanes_of, vector_regs, zero
from ember.tir.expr import Expr

R = 3  # kernel


@dataclass(frozen=True)
class Tile:
    """The matrices of F(m x m, 3x3): B^T (a x a), G (a x 3), A^T (m x a), a = m + 2."""

    m: int
    bt: tuple
    g: tuple
    at: tuple

    @property
    def alpha(self) -> int:
        return self.m + R - 1


F4 = Tile(
    4,
    bt=((4, 0, -5, 0, 1, 0),
        (0, -4, -4, 1, 1, 0),
        (0, 4, -4, -1, 1, 0),
        (0, -2, -1, 2, 1, 0),
        (0, 2, -1, -2, 1, 0),
        (0, 4, 0, -5, 0, 1)),
    g=((F(1, 4), 0, 0),
       (F(-1, 6), F(-1, 6), F(-1, 6)),
       (F(-1, 6), F(1, 6), F(-1, 6)),
       (F(1, 24), F(1, 12), F(1, 6)),
       (F(1, 24), F(-1, 12), F(1, 6)),
       (0, 0, 1)),
    at=((1, 1, 1, 1, 1, 0),
        (0, 1, -1, 2, -2, 0),
        (0, 1, 1, 4, 4, 0),
        (0, 1, -1, 8, -8, 1)),
)  # fmt: skip
F2 = Tile(
    2,
    bt=((1, 0, -1, 0),
        (0, 1, 1, 0),
        (0, -1, 1, 0),
        (0, 1, 0, -1)),
    g=((1, 0, 0),
       (F(1, 2), F(1, 2), F(1, 2)),
       (F(1, 2), F(-1, 2), F(1, 2)),
       (0, 0, 1)),
    at=((1, 1, 1, 0),
        (0, 1, -1, -1)),
)  # fmt: skip
TILES = {t.m: t for t in (F2, F4)}
# F(4x4, 3x3), the default tile, under the names of its paper
M, ALPHA, BT, G, AT = F4.m, F4.alpha, F4.bt, F4.g, F4.at


def tile_of_points(points: int) -> Tile:
    """The tile whose transformed weights have `points` (a*a) points: 16 -> F(2x2), 36 -> F(4x4)."""
    for t in TILES.values():
        if t.alpha * t.alpha == points:
            return t
    raise ValueError(f"Winograd weights with {points} points: want one of "
                     f"{sorted(t.alpha * t.alpha for t in TILES.values())} (F(2x2, 3x3) or F(4x4, 3x3))")  # fmt: skip


def tiles_of(out: tuple[int, int], m: int = M) -> tuple[int, int]:
    """Tile rows and columns of m x m covering an output of `out` rows and columns."""
    return -(-out[0] // m), -(-out[1] // m)


# The cost model, in scalar multiply-adds of the direct template (calibrated on `bench/winograd.py --sweep`: maps of
# 56..7, 64..512 channels, 1 thread, AVX-512; it ranks the tiles as measured there), then checked against the layers'
# times inside whole models (perf samples per kernel, SqueezeNet, GoogLeNet, ResNet-18, each layer compiled direct,
# F(2x2) and F(4x4)): Winograd's products and its transforms' additions per channel vector run WINOGRAD_RATE times
# slower than the direct template's multiply-adds (short reductions, three passes over memory); every byte of
# weights costs WEIGHT_BYTE_COST multiply-adds: inside a model the other layers have evicted them from L2, so each
# call streams them, also when they would fit (a standalone sweep, with the weights staying in L2, hid that:
# GoogLeNet's 32/48 -> 128-channel 7x7 layers, 0.9 MB of F(4x4) weights for 4 tiles, ran 2x slower than direct
# there, though estimated 2.1x faster with only the weights beyond L2 counted). The byte's cost is the direct
# template's multiply-add rate over the rate weights stream at inside a model: about 85 GMAC/s (1 thread, AVX-512) over
# 16-30 GB/s (memory to L3 on the Xeon this was measured on: `ember.runtime.roofline`), 3-5 multiply-adds a byte.
# At 1 (the first calibration, on another host) ResNet-18/34's 512-channel 7x7 layers took F(4x4): 38 MB of weights
# for 4 tiles, 2.8 ms a layer streaming them at 13.6 GB/s where the direct template takes 1.4 ms; at 4, ResNet-18
# 1.07x, ResNet-34 1.15x, GoogLeNet 1.08x, SqueezeNet 1.0 1.05x faster whole (1 thread, in turns).
L2_BYTES = 1 << 20  # half of a 2 MiB L2: the fused product's threshold (`fused_plan`)
WINOGRAD_RATE = 1.1
WEIGHT_BYTE_COST = 4.0
# The fused product (`fused_plan`): the a*a products of a block of output channel vectors and tile rows are computed
# into a buffer that the output transform then reads while it is in cache, instead of all products of the layer
# going through memory (at 16..64 input channels the products are short and their outputs, K/C times the size of
# the transformed input, dominated the time). It pays where the layer's products would not stay in L2 (`L2_BYTES`;
# below that the unfused order, all tiles per point, streams the weights in longer runs and measured faster),
# while the transformed weights of one channel-vector tile (all points) stay in L2 across the tile rows, and the
# block's products fit in a quarter of it.
FUSED_WEIGHT_BYTES = 512 << 10
FUSED_BLOCK_BYTES = 256 << 10


def winograd_cost(n: int, c: int, k: int, out: tuple[int, int], m: int | None) -> float:
    """Estimated time of the convolution (scalar multiply-adds of the direct template): by the direct template
    when m is None, else by Winograd F(m x m, 3x3): a*a products of c x k per tile, the input transform (about
    2a additions per point and input channel), the output transform (about 2m per point and output channel),
    the tiles' overhang past the border included; plus the weights streamed once per call (a batch of `n` reuses
    them)."""
    weights = R * R * c * k
    if m is None:
        macs = weights * n * out[0] * out[1]
    else:
        t = TILES[m]
        th, tw = tiles_of(out, m)
        weights = t.alpha * t.alpha * c * k
        macs = WINOGRAD_RATE * t.alpha * t.alpha * n * th * tw * (c * k + 2 * t.alpha * c + 2 * m * k)
    return macs + WEIGHT_BYTE_COST * 4 * weights


def winograd_tile(n: int, c: int, k: int, out: tuple[int, int]) -> int:
    """The output tile (2 or 4) of the cheaper Winograd for this convolution (`winograd_cost`)."""
    return min(TILES, key=lambda m: winograd_cost(n, c, k, out, m))


def winograd_gain(n: int, c: int, k: int, out: tuple[int, int], m: int | None = None) -> float:
    """Estimated time of the direct template over Winograd's for this convolution (> 1: Winograd is
    faster), at tile m (None: the cheaper tile, `winograd_tile`)."""
    m = m or winograd_tile(n, c, k, out)
    return winograd_cost(n, c, k, out, None) / winograd_cost(n, c, k, out, m)


@dataclass(frozen=True)
class FusedPlan:
    """The fused product's blocks: `kbt` output channel vectors x `rows` tile rows (of one image) per block,
    its register tile `owt` tiles x `kbt` vectors."""

    kbt: int
    rows: int
    owt: int


def fused_plan(c: int, KB: int, kb: int, tiles: tuple[int, int], points: int, dtype, target: Target | None = None,
               ) -> FusedPlan | None:  # fmt: skip
    """The blocks of the fused product (`FUSED_WEIGHT_BYTES`, `FUSED_BLOCK_BYTES`) for `tiles` (rows, columns) per
    image, or None where the layer's products fit in L2 or the weights of one channel-vector tile would not stay
    there: the product of all tiles at once then reads each weight panel for all tiles. Two channel vectors per
    tile where they fit (each broadcast input feeds two FMAs), tile rows of one image per block: the fewest (a
    divisor of the rows, so that no block runs past the image) whose tiles fill the register tile."""
    target = target or host_target()
    size = dtype.bits // 8
    th, tw = tiles
    if points * th * tw * KB * kb * size <= L2_BYTES:
        return None
    vecs = max(1, kb // lanes_of(dtype, target))
    kbts = [d for d in (2, 1) if KB % d == 0 and points * c * d * kb * size <= FUSED_WEIGHT_BYTES]
    if not kbts:
        return None
    kbt = kbts[0]
    accs = vector_regs(target) - 4
    want = max(1, accs // (kbt * vecs))
    fits = [r for r in range(1, th + 1) if th % r == 0 and points * r * tw * kbt * kb * size <= FUSED_BLOCK_BYTES]
    if not fits:
        return None
    rows = next((r for r in fits if r * tw >= want), fits[-1])
    per = rows * tw
    owt = min(per, want)
    owt = -(-per // -(-per // owt))
    return FusedPlan(kbt, rows, owt)


# -----------------------------------------------------------------------------------------------------
# the weight transform (compile time, numpy)
# -----------------------------------------------------------------------------------------------------
def winograd_weight(w: np.ndarray, m: int = M) -> np.ndarray:
    """Packed weights [K/kb, C/cb, 3, 3, cb, kb] -> U [a*a, K/kb, C/cb, cb, kb] of F(m x m, 3x3),
    U[i*a+j] = (G g G^T)[i, j], computed in float64 and rounded once to w's dtype."""
    if w.ndim != 6 or w.shape[2:4] != (R, R):
        raise ValueError(f"winograd_weight: weights must be packed [K/kb, C/cb, 3, 3, cb, kb], got {w.shape}")
    if m not in TILES:
        raise ValueError(f"winograd_weight: output tile {m} is not one of {sorted(TILES)}")
    t = TILES[m]
    g = np.array(t.g, dtype=np.float64)
    u = np.einsum("ai,kcijxy,bj->abkcxy", g, w.astype(np.float64), g)
    return u.reshape(t.alpha * t.alpha, *w.shape[:2], *w.shape[4:]).astype(w.dtype)


# -----------------------------------------------------------------------------------------------------
# computes
# -----------------------------------------------------------------------------------------------------
def _lincomb(coefs, term: Callable[[int], Expr], dtype) -> Expr:
    """sum of c * term(i) over the non-zero c (a coefficient of +-1 is an addition/subtraction)."""
    acc = None
    for i, c in enumerate(coefs):
        if c == 0:
            continue
        t = term(i)
        if abs(c) != 1:
            t = t * te.const(float(abs(c)), dtype)
        if acc is None:
            acc = -t if c < 0 else t
        else:
            acc = acc - t if c < 0 else acc + t
    return acc


def _select(index: Expr, cases: list[Expr]) -> Expr:
    """cases[index] as a chain of selects (folded when index is a constant after unrolling)."""
    e = cases[-1]
    for i in range(len(cases) - 2, -1, -1):
        e = te.if_then_else(index == i, cases[i], e)
    return e


def winograd_input(x: Tensor, pads, out: tuple[int, int], tile: Tile = F4, name: str = "wino_in") -> Tensor:
    """V [a, a, C/cb, P, cb]: B^T d B of each a x a input tile d of x [N, C/cb, H, W, cb] padded by pads
    (top, left, bottom, right), and further at the bottom/right to whole tiles. In two passes: the
    columns (B^T d: stage "_cols", [a, C/cb, P, a, cb]), then the rows of that."""
    N, CB, H, W, cb = x.shape
    m, alpha, bt = tile.m, tile.alpha, tile.bt
    th, tw = tiles_of(out, m)
    after = (th * m + R - 1 - H - pads[0], tw * m + R - 1 - W - pads[1])
    xp = pad_nchwc(x, pads[:2], after, zero(x.dtype), name=f"{name}_pad")
    dt = x.dtype

    def cols(a, c, p, j, v):
        n, t = p // (th * tw), p % (th * tw)
        r0, c0 = t // tw * m, t % tw * m
        return _select(a, [_lincomb(bt[ai], lambda i: xp[n, c, r0 + i, c0 + j, v], dt) for ai in range(alpha)])

    bt_d = te.compute((alpha, CB, N * th * tw, alpha, cb), cols, name=f"{name}_cols")

    def rows(a, b, c, p, v):
        return _select(b, [_lincomb(bt[bi], lambda j: bt_d[a, c, p, j, v], dt) for bi in range(alpha)])

    return te.compute((alpha, alpha, CB, N * th * tw, cb), rows, name=name, tag="winograd_input",
                      attrs={"cols": bt_d})  # fmt: skip


def winograd_conv_nchwc(x: Tensor, u: Tensor, bias: Tensor | None, pads, name: str = "conv_wino") -> Tensor:
    """The convolution of x [N, C/cb, H, W, cb] with transformed weights u [a*a, K/kb, C/cb, cb, kb]
    (`winograd_weight`; a*a = 16: F(2x2, 3x3), 36: F(4x4, 3x3)), plus bias [K]: [N, K/kb, OH, OW, kb]."""
    N, CB, H, W, cb = x.shape
    E, KB, _, _, kb = u.shape
    tile = tile_of_points(E)
    m, alpha, at = tile.m, tile.alpha, tile.at
    out = (H + pads[0] + pads[2] - R + 1, W + pads[1] + pads[3] - R + 1)
    th, tw = tiles_of(out, m)
    P = N * th * tw
    v = winograd_input(x, pads, out, tile, name=f"{name}_in")
    rcb = te.reduce_axis((0, CB), name="rcb")
    rc = te.reduce_axis((0, cb), name="rc")
    # a symbolic batch: the tile plan of one image's tiles (a tile that divides them divides N times them)
    per = P if isinstance(P, int) else th * tw
    plan = nchwc_plan(KB, kb, (1, per), x.dtype, panel=CB * cb * kb * x.dtype.bits // 8)
    fused = fused_plan(CB * cb, KB, kb, (th, tw), E, x.dtype)

    def product(e, k, _, p, j):
        return te.sum(v[e // alpha, e % alpha, rcb, p, rc] * u[e, k, rcb, rc, j], axis=[rcb, rc])

    acc = te.compute((E, KB, 1, P, kb), product, name=f"{name}_acc", tag="conv_nchwc", attrs={"plan": plan})
    # fused: scheduled with the output transform (`_schedule_fused_product`); else by the dense template
    prod_attrs = {"acc": acc, "materialize": True} if fused else {"template": "conv_nchwc", "acc": acc}
    prod = te.compute(acc.shape, lambda *i: acc[i], name=f"{name}_gemm", attrs=prod_attrs)
    dt = x.dtype

    def cols(y, k, p, b, j):  # (A^T M)[y, b]
        return _select(y, [_lincomb(at[yi], lambda a: prod[a * alpha + b, k, 0, p, j], dt) for yi in range(m)])

    at_m = te.compute((m, KB, P, alpha, kb), cols, name=f"{name}_out_cols", attrs={"materialize": True})

    def body(n, k, oh, ow, j):
        p = n * (th * tw) + oh // m * tw + ow // m
        val = _select(ow % m, [_lincomb(at[z], lambda b: at_m[oh % m, k, p, b, j], dt) for z in range(m)])
        return val + bias[k * kb + j] if bias is not None else val

    return te.compute((N, KB, *out, kb), body, name=name,
                      attrs={"template": "winograd_nchwc", "input": v, "out_cols": at_m, "tile": m, "product": prod,
                             "fused": fused})  # fmt: skip


# -----------------------------------------------------------------------------------------------------
# schedule
# -----------------------------------------------------------------------------------------------------
def _schedule_winograd(s: te.Schedule, out: Tensor, attrs: dict, target: Target) -> set[str]:
    """The output (with its epilogue) in m x m tiles, the points unrolled (the selects fold), channel
    vectors stored whole, parallel over batch, channel blocks and tile rows; A^T M before it, per
    channel block and tile. The input transform: per channel block and tile (in parallel), B^T d into
    a 6x6 buffer of channel vectors, then the 36 points, unrolled. (The product is the "conv_nchwc"
    stage, scheduled by its own template.)"""
    lanes = lanes_of(out.dtype, target)
    O = s[out]
    n, kb, oh, ow, j = O.op.axis
    oho, ohi = O.split(oh, attrs["tile"])
    owo, owi = O.split(ow, attrs["tile"])
    fused: FusedPlan | None = attrs.get("fused")
    names = set()
    if fused is None:
        O.reorder(n, kb, oho, owo, ohi, owi, j)
        block = [n, kb, oho]
    else:  # per block of kbt channel vectors x rows tile rows: the products, A^T M, then the output tiles
        kbo, kbi = O.split(kb, fused.kbt)
        roo, roi = O.split(oho, fused.rows)
        O.reorder(n, kbo, roo, kbi, roi, owo, ohi, owi, j)
        block = [n, kbo, roo]
        names = _schedule_fused_product(s, attrs["product"], fused, O, roo, target)
    O.unroll(ohi)
    O.unroll(owi)
    _vector(O, j, out.shape[-1], lanes)
    v: Tensor = attrs["input"]
    V = s[v]
    a, b, c, p, vj = V.op.axis
    V.reorder(c, p, a, b, vj)
    V.unroll(a)
    V.unroll(b)
    _vector(V, vj, v.shape[-1], lanes)
    C = s[v.op.attrs["cols"]]
    C.compute_at(V, p)
    ca, _, _, cj, cv = C.op.axis
    C.unroll(ca)
    C.unroll(cj)
    _vector(C, cv, v.shape[-1], lanes)
    if target.num_cores > 1 and size_hint(v.shape[3]) * v.shape[2] >= target.num_cores:
        V.parallel(V.fuse(c, p))
    T = s[attrs["out_cols"]]
    ty, tk, tp, tb, tj = T.op.axis
    T.reorder(tk, tp, ty, tb, tj)
    T.unroll(ty)
    T.unroll(tb)
    _vector(T, tj, out.shape[-1], lanes)
    if fused is not None:
        T.compute_at(O, roo)
    elif target.num_cores > 1:
        T.parallel(T.fuse(tk, tp))
    if target.num_cores > 1:  # (after the stages computed inside the block loop are attached to it)
        O.parallel(O.fuse(*block))
    return {O.name, V.name, C.name, T.name} | names


def _schedule_fused_product(s: te.Schedule, prod: Tensor, plan: FusedPlan, O: te.Stage, at, target: Target) -> set[str]:
    """The products of one block (all points, `plan.kbt` channel vectors, its tiles) computed inside the output's
    block loop `at`: per point, register tiles of `plan.owt` tiles x `plan.kbt` vectors accumulated over the input
    channels (the dense template's tile, `ember.templates.nchwc`), stored to the block's buffer."""
    acc: Tensor = prod.op.attrs["acc"]
    lanes = lanes_of(acc.dtype, target)
    block = acc.shape[-1]
    G = s[prod]
    accl = s.cache_write(acc, "local")
    s[acc].compute_inline()
    e, k, one, p, j = G.op.axis
    po, pi = G.split(p, plan.owt)
    G.reorder(e, one, po, pi, k, j)
    G.unroll(pi)
    G.unroll(k)
    _vector(G, j, block, lanes)
    L = s[accl]
    le, lk, lone, lp, lj = L.op.axis
    L.reorder(le, *L.op.reduce_axis, lone, lp, lk, lj)  # the FMAs of one broadcast input element adjacent
    L.unroll(lone)
    L.unroll(lp)
    L.unroll(lk)
    _vector(L, lj, block, lanes)
    L.compute_at(G, po)
    G.compute_at(O, at)
    return {G.name, L.name}


def _vector(st: te.Stage, axis, block: int, lanes: int) -> None:
    if block <= lanes:
        st.vectorize(axis)
    else:
        vo, vi = st.split(axis, lanes)
        st.unroll(vo)
        st.vectorize(vi)


SCHEDULES["winograd_nchwc"] = _schedule_winograd

__all__ = ["ALPHA", "AT", "BT", "F2", "F4", "G", "TILES", "FusedPlan", "Tile", "fused_plan", "tile_of_points",
           "tiles_of", "winograd_conv_nchwc", "winograd_cost", "winograd_gain", "winograd_input", "winograd_tile",
           "winograd_weight"]
