"""Convolutions: Conv, ConvInteger, ConvTranspose (entries, numpy references, TE computes).

References accumulate in float64 for float inputs (int64 for integers): they are the oracle the
compiled code is checked against, so they favour accuracy over speed. The computes build on the
GEMM and direct-convolution templates of `ember.templates.nn`."""

from __future__ import annotations

import numpy as np

from ember import te
from ember.graph.types import TensorType
from ember.ops.common import ShapeError, acc_array, spatial_attrs, window_out_dim
from ember.ops.opdef import Attr, Pattern, op
from ember.ops.te_lib import NotLowerable, lowering
from ember.te.config import CONFIG_ATTR
from ember.te.tensor import Tensor
from ember.templates import nn as T
from ember.tir.dtype import dtype as as_dtype
from ember.tir.expr import Expr

OUT = Pattern.OUT_ELEMWISE_FUSABLE
CONV_ATTRS = [Attr("strides", "ints"), Attr("pads", "ints"), Attr("dilations", "ints"), Attr("group", "int", 1)]


# -- convolution -------------------------------------------------------------------------------------
def conv_infer(a: dict, x: TensorType, w: TensorType, b: TensorType | None = None, *zp) -> TensorType:
    nd = x.rank - 2
    strides, pads, dil = spatial_attrs(a, nd)
    g = a["group"]
    if w.rank != x.rank or x.shape[1] != w.shape[1] * g or w.shape[0] % g:
        raise ShapeError(f"Conv weight {w} does not match input {x} with group={g}")
    if b is not None and b.shape != (w.shape[0],):
        raise ShapeError(f"Conv bias {b} must have shape [{w.shape[0]}]")
    sp = tuple(
        window_out_dim(x.shape[2 + i], w.shape[2 + i], strides[i], (pads[i], pads[i + nd]), dil[i]) for i in range(nd)
    )
    return TensorType((x.shape[0], w.shape[0]) + sp, x.dtype)


def conv_nd(x: np.ndarray, w: np.ndarray, a: dict) -> np.ndarray:
    """Grouped N-d correlation by im2col + matmul, in the dtype of x (float64/int64 given)."""
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    ks = w.shape[2:]
    nd = len(ks)
    strides, pads, dil = spatial_attrs(a, nd)
    g = a["group"]
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + nd]) for i in range(nd)])
    out_sp = [window_out_dim(x.shape[2 + i], ks[i], strides[i], (pads[i], pads[i + nd]), dil[i]) for i in range(nd)]
    xg = xp.reshape((n, g, cg) + xp.shape[2:])
    cols = []
    npos = int(np.prod(out_sp))  # explicit sizes: -1 cannot be inferred for an empty batch
    for kidx in np.ndindex(*ks):
        index = tuple(slice(k * d, k * d + s * (o - 1) + 1, s) for k, d, s, o in zip(kidx, dil, strides, out_sp))
        cols.append(xg[(Ellipsis,) + index].reshape(n, g, cg, npos))
    col = np.stack(cols, axis=3).reshape(n, g, cg * len(cols), npos)  # N, G, Cg*K, P
    wg = w.reshape(g, m // g, cg * len(cols))
    out = np.matmul(wg[None], col)  # N, G, Mg, P
    return out.reshape((n, m) + tuple(out_sp))


@op("Conv", OUT, infer=conv_infer, inputs=(2, 3), attrs=CONV_ATTRS)
def conv(a: dict, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """Convolution with explicit strides, pads (begins then ends), dilations and group."""
    y = conv_nd(acc_array(x), acc_array(w), a)
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * (x.ndim - 2))
    return y.astype(x.dtype)


def _as(e: Expr, dt) -> Expr:
    """e in dtype dt (a cast only where they differ: a half-precision bias added to a float32 accumulator)."""
    return e if e.dtype == dt else te.cast(e, dt)


def conv_te(x: Tensor, w: Tensor | tuple[int, ...], b: Tensor | None, a: dict, dtype=None, x_at=None, w_at=None,
            post=None, name: str = "conv") -> Tensor:  # fmt: skip
    """Direct convolution through the conv templates (`ember.templates.nn.conv_acc`).

    x_at(n, c, *pos) / w_at(co, ci, k) read the operands in the accumulation dtype (default: as is;
    w may then be just the weight shape); padding adds zeros of that dtype (after x_at, so zero
    points never reach the pads). post(v, co) is the epilogue after the bias (requantization)."""
    nd = x.ndim - 2
    strides, pads, dil = spatial_attrs(a, nd)
    dtype = as_dtype(dtype) if dtype is not None else x.dtype
    n, _, *isp = x.shape
    co, _, *ks = w if isinstance(w, tuple) else w.shape
    osp = tuple(window_out_dim(isp[i], ks[i], strides[i], (pads[i], pads[i + nd]), dil[i]) for i in range(nd))
    half = dtype if dtype.is_half else None
    if half is not None:  # float16/bfloat16 convolutions accumulate in float32, rounded once at the end
        dtype = as_dtype("float32")
        x_at = x_at or (lambda *i: te.cast(x[i], "float32"))
        w_at = w_at or (lambda o, c, k: te.cast(w[(o, c, *k)], "float32"))
        post = (lambda v, co_, p=post: te.cast(p(v, co_) if p else v, half))
    x_at = x_at or (lambda *i: x[i])
    w_at = w_at or (lambda o, c, k: w[(o, c, *k)])
    cfg = a.get(CONFIG_ATTR)  # a tuning config (ember.te.config), None: the templates' fallback
    if a["group"] == 1 and set(ks) | set(strides) == {1} and not any(pads):
        return _conv1x1_te(x, x_at, co, w_at, b, dtype, post, name, cfg=cfg)
    xp = T.pad_input(x_at, x.shape, pads[:nd], pads[nd:], T.zero(dtype), dtype, name=f"{name}_pad")
    acc, read, kind = T.conv_acc(xp, w_at, co, a["group"], T.Window(tuple(ks), strides, dil, osp), dtype,
                                 name=f"{name}_acc", cfg=cfg)  # fmt: skip

    def out(*idx):
        v = read(*idx)
        v = v + _as(b[idx[1]], v.dtype) if b is not None else v
        return post(v, idx[1]) if post else v

    return te.compute((n, co, *osp), out, name=name, attrs={"template": kind, "acc": acc})


def _conv1x1_te(x: Tensor, x_at, co: int, w_at, b: Tensor | None, dtype, post, name: str, cfg=None) -> Tensor:
    """A 1x1 convolution as one matrix product W (Co x Ci) @ X[n, :, row, :] (Ci x width) per output
    row: the GEMM template then vectorizes along the width and stores whole rows."""
    n, ci, *sp = x.shape
    nd = len(sp)
    batch = (n, *sp[:-1])
    zeros = (te.const(0),) * nd

    def xv(bi, k, j):
        return x_at(bi[0], k, *bi[1:], j)

    def wv(i, k):
        return w_at(i, k, zeros)

    swap = sp[-1] < T.lanes_of(dtype, T.host_target()) <= co // 2
    if swap:  # narrow rows: output channels in the vectors
        acc = T.gemm_acc(batch, sp[-1], co, ci, lambda bi, j, k: xv(bi, k, j), lambda bb, k, i: wv(i, k), (),
                         lambda bi: (), dtype, name=f"{name}_acc", cfg=cfg)  # fmt: skip
    else:
        acc = T.gemm_acc(batch, co, sp[-1], ci, lambda bi, i, k: wv(i, k), xv, batch, lambda bi: bi, dtype,
                         name=f"{name}_acc", cfg=cfg)  # fmt: skip

    def out(*idx):
        bi = (idx[0], *idx[2:-1])
        v = acc[bi + ((idx[-1], idx[1]) if swap else (idx[1], idx[-1]))]
        v = v + _as(b[idx[1]], v.dtype) if b is not None else v
        return post(v, idx[1]) if post else v

    ia, ja = (nd + 1, 1) if swap else (1, nd + 1)
    return te.compute((n, co, *sp), out, name=name, attrs={"template": "gemm", "acc": acc, "i_axis": ia, "j_axis": ja})


@lowering("Conv", schedule=T.schedule_nn)
def _conv_compute(a: dict, x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    if x.ndim < 3:
        raise NotLowerable("Conv needs at least one spatial dimension")
    return conv_te(x, w, b, a)


def _conv_integer_infer(a: dict, x: TensorType, w: TensorType, *zps: TensorType | None) -> TensorType:
    return conv_infer(a, x, w).with_dtype("int32")


@op("ConvInteger", OUT, infer=_conv_integer_infer, inputs=(2, 4), attrs=CONV_ATTRS)
def conv_integer(a: dict, x: np.ndarray, w: np.ndarray, x_zp=None, w_zp=None) -> np.ndarray:
    xi = x.astype(np.int64) - (0 if x_zp is None else x_zp.astype(np.int64).reshape(()))
    wz = 0 if w_zp is None else w_zp.astype(np.int64).reshape((-1,) + (1,) * (w.ndim - 1))
    return conv_nd(xi, w.astype(np.int64) - wz, a).astype(np.int32)


@lowering("ConvInteger", schedule=T.schedule_nn)
def _conv_integer_compute(a: dict, x: Tensor, w: Tensor, x_zp: Tensor | None = None, w_zp: Tensor | None = None):
    """int32 accumulation of (x - x_zp) * (w - w_zp); w_zp per tensor or per output channel."""
    if x.ndim < 3:
        raise NotLowerable("ConvInteger needs at least one spatial dimension")

    def x_at(*i):
        v = te.cast(x[i], "int32")
        return v - te.cast(x_zp[(0,) * x_zp.ndim], "int32") if x_zp is not None else v

    def w_at(o, c, k):
        v = te.cast(w[(o, c, *k)], "int32")
        if w_zp is None:
            return v
        return v - te.cast(w_zp[(o if w_zp.shape and w_zp.shape[0] > 1 else 0,) * w_zp.ndim], "int32")

    return conv_te(x, w, None, a, "int32", x_at, w_at, name="conv_integer")


def _conv_t_infer(a: dict, x: TensorType, w: TensorType, b: TensorType | None = None) -> TensorType:
    nd = x.rank - 2
    strides, pads, dil = spatial_attrs(a, nd)
    g = a["group"]
    if w.rank != x.rank or w.shape[0] != x.shape[1]:
        raise ShapeError(f"ConvTranspose weight {w} does not match input {x}")
    op_ = a["output_padding"] or (0,) * nd
    sp = tuple(
        strides[i] * (x.shape[2 + i] - 1) + op_[i] + (w.shape[2 + i] - 1) * dil[i] + 1 - pads[i] - pads[i + nd]
        for i in range(nd)
    )
    return TensorType((x.shape[0], w.shape[1] * g) + sp, x.dtype)


@op("ConvTranspose", OUT, infer=_conv_t_infer, inputs=(2, 3), attrs=CONV_ATTRS + [Attr("output_padding", "ints", ())])
def conv_transpose(a: dict, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """Transposed convolution: scatter each input pixel times the kernel, then crop pads."""
    n, c = x.shape[:2]
    g = a["group"]
    cg, mg = c // g, w.shape[1]
    ks = w.shape[2:]
    nd = len(ks)
    strides, pads, dil = spatial_attrs(a, nd)
    opad = a["output_padding"] or (0,) * nd
    ins = x.shape[2:]
    full = [strides[i] * (ins[i] - 1) + opad[i] + (ks[i] - 1) * dil[i] + 1 for i in range(nd)]
    out = np.zeros((n, g, mg) + tuple(full))
    xg = acc_array(x).reshape(n, g, cg, -1)
    wg = acc_array(w).reshape((g, cg, mg) + ks)
    for kidx in np.ndindex(*ks):
        contrib = np.matmul(np.swapaxes(wg[(Ellipsis,) + kidx], 1, 2)[None], xg).reshape((n, g, mg) + ins)
        index = tuple(slice(k * d, k * d + s * (i - 1) + 1, s) for k, d, s, i in zip(kidx, dil, strides, ins))
        out[(Ellipsis,) + index] += contrib
    crop = tuple(slice(pads[i], full[i] - pads[i + nd]) for i in range(nd))
    y = out[(Ellipsis,) + crop].reshape((n, g * mg) + tuple(f - pads[i] - pads[i + nd] for i, f in enumerate(full)))
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * nd)
    return y.astype(x.dtype)


@lowering("ConvTranspose", schedule=T.schedule_nn)
def _conv_transpose_compute(a: dict, x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """A direct convolution of the input spread out by the strides (zeros between pixels, pads
    turned into a shift) with the kernel flipped and its in/out channels swapped."""
    nd = x.ndim - 2
    if nd < 1:
        raise NotLowerable("ConvTranspose needs at least one spatial dimension")
    strides, pads, dil = spatial_attrs(a, nd)
    g = a["group"]
    n, c, *isp = x.shape
    cg, mg, *ks = w.shape
    cg = c // g
    opad = a["output_padding"] or (0,) * nd
    osp = [strides[i] * (isp[i] - 1) + opad[i] + (ks[i] - 1) * dil[i] + 1 - pads[i] - pads[i + nd] for i in range(nd)]
    span = [(ks[i] - 1) * dil[i] for i in range(nd)]
    shift = [span[i] - pads[i] for i in range(nd)]  # input pixel i lands at spread position shift + i * stride

    def spread(*idx):
        conds, src = [], list(idx[:2])
        for t, sh, st, size in zip(idx[2:], shift, strides, isp):
            q = t - sh
            if st > 1:
                conds.append(q % st == 0)
            src.append(q // st if st > 1 else q)
            conds += [src[-1] >= 0, src[-1] < size]
        return te.if_then_else(te.all(*conds), x[tuple(src)], T.zero(x.dtype))

    xs = te.compute((n, c, *(o + sp for o, sp in zip(osp, span))), spread, name="convt_spread", tag="nn_pad",
                    attrs={"materialize": True})  # fmt: skip

    def w_at(o, ci, k):
        return w[(o // mg * cg + ci, o % mg, *(kd - 1 - kk for kd, kk in zip(ks, k)))]

    conv_a = {"strides": (1,) * nd, "pads": (0,) * (2 * nd), "dilations": dil, "group": g}
    return conv_te(xs, (g * mg, cg, *ks), b, conv_a, w_at=w_at, name="conv_transpose")
