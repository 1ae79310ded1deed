"""ConvWinogradNCHWc: a stride-1 3x3 convolution in the blocked layout by Winograd F(4x4, 3x3) or F(2x2, 3x3).

Made by `ember.passes.layout` for the convolutions where `ember.templates.winograd.winograd_gain`
expects it to beat the direct template, at the tile `winograd_tile` picks; its weights are transformed
there, at compile time ([a*a, K/kb, C/cb, cb, kb], `winograd_weight`: 36 points for F(4x4), 16 for F(2x2)).
The reference runs the same algorithm in float64 numpy
(einsums over all tiles at once), independently of the TE compute."""

from __future__ import annotations

import numpy as np

from ember.graph.types import TensorType
from ember.ops.common import ShapeError
from ember.ops.layout import relayout
from ember.ops.opdef import Attr, Pattern, op
from ember.ops.te_lib import lowering
from ember.te.tensor import Tensor
from ember.templates import nn as T
from ember.templates.winograd import TILES, tile_of_points, tiles_of, winograd_conv_nchwc

PADS = Attr("pads", "ints", (0, 0, 0, 0))


def _infer(a: dict, x: TensorType, u: TensorType, b: TensorType | None = None) -> TensorType:
    if x.rank != 5 or u.rank != 5:
        raise ShapeError(f"ConvWinogradNCHWc takes x [N, C/cb, H, W, cb] and u [a*a, K/kb, C/cb, cb, kb], got {x}, {u}")
    n, cb_, h, w, cb = x.shape
    e, kb_, ucb_, ucb, kb = u.shape
    points = sorted(t.alpha * t.alpha for t in TILES.values())
    if e not in points or (ucb_, ucb) != (cb_, cb):
        raise ShapeError(f"ConvWinogradNCHWc weight {u} does not match input {x}: want [a*a, K/kb, {cb_}, {cb}, kb] "
                         f"with a*a in {points} (F(2x2, 3x3), F(4x4, 3x3))")
    if b is not None and b.shape != (kb_ * kb,):
        raise ShapeError(f"ConvWinogradNCHWc bias {b} must have shape [{kb_ * kb}]")
    pads = a["pads"]
    if len(pads) != 4:
        raise ShapeError(f"ConvWinogradNCHWc pads must be 4 values (top, left, bottom, right), got {pads}")
    oh, ow = h + pads[0] + pads[2] - 2, w + pads[1] + pads[3] - 2
    if oh < 1 or ow < 1:
        raise ShapeError(f"ConvWinogradNCHWc input {x} with pads {pads} is smaller than the 3x3 kernel")
    return TensorType((n, kb_, oh, ow, kb), x.dtype)


@op("ConvWinogradNCHWc", Pattern.OUT_ELEMWISE_FUSABLE, infer=_infer, inputs=(2, 3), attrs=[PADS])
def conv_winograd_nchwc(a: dict, x: np.ndarray, u: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """Winograd F(m x m, 3x3) of x NCHW[cb]c with transformed weights u [a*a, K/kb, C/cb, cb, kb], in float64."""
    n, cb_, h, w, cb = x.shape
    e, kb_, _, _, kb = u.shape
    tile = tile_of_points(e)
    ts, alpha = tile.m, tile.alpha
    t, left, bot, right = a["pads"]
    oh, ow = h + t + bot - 2, w + left + right - 2
    th, tw = tiles_of((oh, ow), ts)
    xd = relayout(x.astype(np.float64), f"NCHW{cb}c", "NCHW")
    xp = np.zeros((n, xd.shape[1], th * ts + 2, tw * ts + 2))
    xp[:, :, t:t + h, left:left + w] = xd
    bt, at = np.array(tile.bt, dtype=np.float64), np.array(tile.at, dtype=np.float64)
    # tiles [N, C, th, tw, a, a] -> V [a, a, N, C, th, tw]
    idx_h = np.arange(th)[:, None] * ts + np.arange(alpha)[None]
    idx_w = np.arange(tw)[:, None] * ts + np.arange(alpha)[None]
    d = xp[:, :, idx_h[:, None, :, None], idx_w[None, :, None, :]]
    v = np.einsum("ai,nctsij,bj->abncts", bt, d, bt)
    ud = u.astype(np.float64).reshape(alpha, alpha, kb_, cb_, cb, kb)
    ud = ud.transpose(0, 1, 2, 5, 3, 4).reshape(alpha, alpha, kb_ * kb, cb_ * cb)
    m = np.einsum("abkc,abncts->abnkts", ud, v)
    y = np.einsum("ya,abnkts,zb->nktysz", at, m, at).reshape(n, kb_ * kb, th * ts, tw * ts)
    y = y[:, :, :oh, :ow]
    if b is not None:
        y = y + b.astype(np.float64).reshape(1, -1, 1, 1)
    return relayout(y, "NCHW", f"NCHW{kb}c").astype(x.dtype)


@lowering("ConvWinogradNCHWc", schedule=T.schedule_nn)
def _conv_winograd_compute(a: dict, x: Tensor, u: Tensor, b: Tensor | None = None) -> Tensor:
    return winograd_conv_nchwc(x, u, b, tuple(a["pads"]), name="conv_wino")
