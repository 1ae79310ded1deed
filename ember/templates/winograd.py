"""Winograd F(4x4, 3x3) convolution in the blocked layout NCHW[x]c (template "winograd_nchwc").

A stride-1, undilated 3x3 convolution computes each 4x4 tile of its output from a 6x6 tile of its
input with 36 products per (input, output) channel pair instead of 144 (Lavin and Gray, "Fast
Algorithms for Convolutional Neural Networks", 2016; points 0, +-1, +-2):

    Y = A^T [ (G g G^T) . (B^T d B) ] A

- the weight transform U = G g G^T is done at compile time (`winograd_weight`, called by
  `ember.passes.layout` on the constant weights): [36, K/kb, C/cb, cb, kb];
- the input transform V = B^T d B of each 6x6 tile, channel vectors at each point: [6, 6, C/cb, P, cb]
  (P = N x tile rows x tile columns), the padding inlined into its reads (bounds checks);
- 36 independent products M[e] = U[e] V[e] over the input channels: a 1x1 convolution in the blocked
  layout, computed and scheduled by the dense template of `ember.templates.nchwc` ("conv_nchwc": a
  register tile of positions x output channel vectors, broadcast inputs);
- the output transform A^T M A, with the bias and the fused epilogue (relu, residual add) applied to
  each output vector as it is stored.

The transforms are written out as sums of the non-zero terms of the matrices (a select over the
point, folded once the loops over points are unrolled), so they cost additions, not 6x6 products;
each is done in two passes (columns, then rows: B^T d in a 6x6 buffer per tile, A^T M in a buffer of
the product's size) so that the expressions stay small.
`winograd_gain` estimates when this beats the direct template; float32 rounding grows with the
transform constants (errors around 1e-5 relative at 3x3 kernels, see the tests).
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction as F

import numpy as np

from ember import te
from ember.target import Target
from ember.te.tensor import Tensor, size_hint
from ember.templates.nchwc import nchwc_plan, pad_nchwc
from ember.templates.nn import SCHEDULES, lanes_of, zero
from ember.tir.expr import Expr

M = 4  # output tile
R = 3  # kernel
ALPHA = M + R - 1  # input tile

BT = ((4, 0, -5, 0, 1, 0),
      (0, -4, -4, 1, 1, 0),
      (0, 4, -4, -1, 1, 0),
      (0, -2, -1, 2, 1, 0),
      (0, 2, -1, -2, 1, 0),
      (0, 4, 0, -5, 0, 1))  # fmt: skip
G = ((F(1, 4), 0, 0),
     (F(-1, 6), F(-1, 6), F(-1, 6)),
     (F(-1, 6), F(1, 6), F(-1, 6)),
     (F(1, 24), F(1, 12), F(1, 6)),
     (F(1, 24), F(-1, 12), F(1, 6)),
     (0, 0, 1))  # fmt: skip
AT = ((1, 1, 1, 1, 1, 0),
      (0, 1, -1, 2, -2, 0),
      (0, 1, 1, 4, 4, 0),
      (0, 1, -1, 8, -8, 1))  # fmt: skip


def tiles_of(out: tuple[int, int]) -> tuple[int, int]:
    """Tile rows and columns covering an output of `out` rows and columns."""
    return -(-out[0] // M), -(-out[1] // M)


def winograd_gain(n: int, c: int, k: int, out: tuple[int, int]) -> float:
    """Estimated time of the direct template over Winograd's for this convolution (> 1: Winograd is
    faster). Multiply-adds of each, the products of both at the same rate; the transforms count as
    the additions they make per channel vector of a tile (input: about 12 per point, output: about 8),
    plus the tiles' overhang past the output's border."""
    th, tw = tiles_of(out)
    tiles = n * th * tw
    direct = R * R * c * k * n * out[0] * out[1]
    wino = ALPHA * ALPHA * tiles * (c * k + 12 * c + 8 * k)
    return direct / wino


# -----------------------------------------------------------------------------------------------------
# the weight transform (compile time, numpy)
# -----------------------------------------------------------------------------------------------------
def winograd_weight(w: np.ndarray) -> np.ndarray:
    """Packed weights [K/kb, C/cb, 3, 3, cb, kb] -> U [36, K/kb, C/cb, cb, kb], U[a*6+b] = (G g G^T)[a, b],
    computed in float64 and rounded once to w's dtype."""
    if w.ndim != 6 or w.shape[2:4] != (R, R):
        raise ValueError(f"winograd_weight: weights must be packed [K/kb, C/cb, 3, 3, cb, kb], got {w.shape}")
    g = np.array(G, dtype=np.float64)
    u = np.einsum("ai,kcijxy,bj->abkcxy", g, w.astype(np.float64), g)
    return u.reshape(ALPHA * ALPHA, *w.shape[:2], *w.shape[4:]).astype(w.dtype)


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


def winograd_input(x: Tensor, pads, out: tuple[int, int], name: str = "wino_in") -> Tensor:
    """V [6, 6, C/cb, P, cb]: B^T d B of each 6x6 input tile d of x [N, C/cb, H, W, cb] padded by pads
    (top, left, bottom, right), and further at the bottom/right to whole tiles. In two passes: the
    columns (B^T d: stage "_cols", [6, C/cb, P, 6, cb]), then the rows of that."""
    N, CB, H, W, cb = x.shape
    th, tw = tiles_of(out)
    after = (th * M + R - 1 - H - pads[0], tw * M + R - 1 - W - pads[1])
    xp = pad_nchwc(x, pads[:2], after, zero(x.dtype), name=f"{name}_pad")
    dt = x.dtype

    def cols(a, c, p, j, v):
        n, t = p // (th * tw), p % (th * tw)
        r0, c0 = t // tw * M, t % tw * M
        return _select(a, [_lincomb(BT[ai], lambda i: xp[n, c, r0 + i, c0 + j, v], dt) for ai in range(ALPHA)])

    bt_d = te.compute((ALPHA, CB, N * th * tw, ALPHA, cb), cols, name=f"{name}_cols")

    def rows(a, b, c, p, v):
        return _select(b, [_lincomb(BT[bi], lambda j: bt_d[a, c, p, j, v], dt) for bi in range(ALPHA)])

    return te.compute((ALPHA, ALPHA, CB, N * th * tw, cb), rows, name=name, tag="winograd_input",
                      attrs={"cols": bt_d})  # fmt: skip


def winograd_conv_nchwc(x: Tensor, u: Tensor, bias: Tensor | None, pads, name: str = "conv_wino") -> Tensor:
    """The convolution of x [N, C/cb, H, W, cb] with transformed weights u [36, K/kb, C/cb, cb, kb]
    (`winograd_weight`), plus bias [K]: [N, K/kb, OH, OW, kb]."""
    N, CB, H, W, cb = x.shape
    E, KB, _, _, kb = u.shape
    out = (H + pads[0] + pads[2] - R + 1, W + pads[1] + pads[3] - R + 1)
    th, tw = tiles_of(out)
    P = N * th * tw
    v = winograd_input(x, pads, out, name=f"{name}_in")
    rcb = te.reduce_axis((0, CB), name="rcb")
    rc = te.reduce_axis((0, cb), name="rc")
    # a symbolic batch: the tile plan of one image's tiles (a tile that divides them divides N times them)
    per = P if isinstance(P, int) else th * tw
    plan = nchwc_plan(KB, kb, (1, per), x.dtype, panel=CB * cb * kb * x.dtype.bits // 8)

    def product(e, k, _, p, j):
        return te.sum(v[e // ALPHA, e % ALPHA, rcb, p, rc] * u[e, k, rcb, rc, j], axis=[rcb, rc])

    acc = te.compute((E, KB, 1, P, kb), product, name=f"{name}_acc", tag="conv_nchwc", attrs={"plan": plan})
    prod = te.compute(acc.shape, lambda *i: acc[i], name=f"{name}_gemm",
                      attrs={"template": "conv_nchwc", "acc": acc})  # fmt: skip
    dt = x.dtype

    def cols(y, k, p, b, j):  # (A^T M)[y, b]
        return _select(y, [_lincomb(AT[yi], lambda a: prod[a * ALPHA + b, k, 0, p, j], dt) for yi in range(M)])

    at_m = te.compute((M, KB, P, ALPHA, kb), cols, name=f"{name}_out_cols", attrs={"materialize": True})

    def body(n, k, oh, ow, j):
        p = n * (th * tw) + oh // M * tw + ow // M
        val = _select(ow % M, [_lincomb(AT[z], lambda b: at_m[oh % M, k, p, b, j], dt) for z in range(M)])
        return val + bias[k * kb + j] if bias is not None else val

    return te.compute((N, KB, *out, kb), body, name=name,
                      attrs={"template": "winograd_nchwc", "input": v, "out_cols": at_m})  # fmt: skip


# -----------------------------------------------------------------------------------------------------
# schedule
# -----------------------------------------------------------------------------------------------------
def _schedule_winograd(s: te.Schedule, out: Tensor, attrs: dict, target: Target) -> set[str]:
    """The output (with its epilogue) in 4x4 tiles, the points unrolled (the selects fold), channel
    vectors stored whole, parallel over batch, channel blocks and tile rows; A^T M before it, per
    channel block and tile. The input transform: per channel block and tile (in parallel), B^T d into
    a 6x6 buffer of channel vectors, then the 36 points, unrolled. (The product is the "conv_nchwc"
    stage, scheduled by its own template.)"""
    lanes = lanes_of(out.dtype, target)
    O = s[out]
    n, kb, oh, ow, j = O.op.axis
    oho, ohi = O.split(oh, M)
    owo, owi = O.split(ow, M)
    O.reorder(n, kb, oho, owo, ohi, owi, j)
    O.unroll(ohi)
    O.unroll(owi)
    _vector(O, j, out.shape[-1], lanes)
    if target.num_cores > 1:
        O.parallel(O.fuse(n, kb, oho))
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
    if target.num_cores > 1:
        T.parallel(T.fuse(tk, tp))
    return {O.name, V.name, C.name, T.name}


def _vector(st: te.Stage, axis, block: int, lanes: int) -> None:
    if block <= lanes:
        st.vectorize(axis)
    else:
        vo, vi = st.split(axis, lanes)
        st.unroll(vo)
        st.vectorize(vi)


SCHEDULES["winograd_nchwc"] = _schedule_winograd

__all__ = ["ALPHA", "AT", "BT", "G", "tiles_of", "winograd_conv_nchwc", "winograd_gain", "winograd_input",
           "winograd_weight"]
