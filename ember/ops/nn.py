"""Neural-network operators: convolution, pooling, normalization, matrix products.

References accumulate in float64 for float inputs: they are the oracle the compiled code
is checked against, so they favour accuracy over speed."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np

from ember import te
from ember.codegen.toolchain import has_libmvec
from ember.graph.types import TensorType
from ember.ops import reduce as _reduce_ops  # noqa: F401  (registers the Softmax family lowered below)
from ember.ops.common import ShapeError, broadcast_shapes, norm_axes, norm_axis, window_out_dim
from ember.ops.opdef import Attr, Pattern, op
from ember.ops.te_lib import NotLowerable, broadcast_indices, lowering
from ember.target import current_target
from ember.te.config import CONFIG_ATTR
from ember.te.tensor import Tensor
from ember.templates import nn as T
from ember.tir.dtype import dtype as as_dtype
from ember.tir.expr import Expr

OUT = Pattern.OUT_ELEMWISE_FUSABLE
CONV_ATTRS = [Attr("strides", "ints"), Attr("pads", "ints"), Attr("dilations", "ints"), Attr("group", "int", 1)]


def _acc(x: np.ndarray) -> np.ndarray:
    """Accumulation dtype of a reference: float64 for floats, int64 for integers."""
    return x.astype(np.int64 if np.issubdtype(x.dtype, np.integer) else np.float64)


def _spatial(a: dict, nd: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    strides, pads, dil = a["strides"], a["pads"], a["dilations"]
    if len(strides) != nd or len(pads) != 2 * nd or len(dil) != nd:
        raise ShapeError(f"strides/dilations need {nd} entries and pads {2 * nd}, got {strides}, {pads}, {dil}")
    return strides, pads, dil


# -- convolution -------------------------------------------------------------------------------------
def _conv_infer(a: dict, x: TensorType, w: TensorType, b: TensorType | None = None, *zp) -> TensorType:
    nd = x.rank - 2
    strides, pads, dil = _spatial(a, nd)
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
    strides, pads, dil = _spatial(a, nd)
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


@op("Conv", OUT, infer=_conv_infer, inputs=(2, 3), attrs=CONV_ATTRS)
def conv(a: dict, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """Convolution with explicit strides, pads (begins then ends), dilations and group."""
    y = conv_nd(_acc(x), _acc(w), a)
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
    strides, pads, dil = _spatial(a, nd)
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
    return _conv_infer(a, x, w).with_dtype("int32")


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
    strides, pads, dil = _spatial(a, nd)
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
    strides, pads, dil = _spatial(a, nd)
    opad = a["output_padding"] or (0,) * nd
    ins = x.shape[2:]
    full = [strides[i] * (ins[i] - 1) + opad[i] + (ks[i] - 1) * dil[i] + 1 for i in range(nd)]
    out = np.zeros((n, g, mg) + tuple(full))
    xg = _acc(x).reshape(n, g, cg, -1)
    wg = _acc(w).reshape((g, cg, mg) + ks)
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
    strides, pads, dil = _spatial(a, nd)
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


# -- pooling ----------------------------------------------------------------------------------------
POOL_ATTRS = [
    Attr("kernel_shape", "ints"), Attr("strides", "ints"), Attr("pads", "ints"), Attr("dilations", "ints"),
    Attr("ceil_mode", "int", 0),
]  # fmt: skip


def _pool_dims(a: dict, shape: tuple[int, ...]) -> list[int]:
    nd = len(a["kernel_shape"])
    strides, pads, dil = _spatial(a, nd)
    ceil, kernel = bool(a["ceil_mode"]), a["kernel_shape"]
    return [window_out_dim(shape[2 + i], kernel[i], strides[i], (pads[i], pads[i + nd]), dil[i], ceil)
            for i in range(nd)]  # fmt: skip


def _pool_infer(a: dict, x: TensorType) -> TensorType:
    if x.rank != len(a["kernel_shape"]) + 2:
        raise ShapeError(f"pool kernel {list(a['kernel_shape'])} does not fit input {x}")
    return x.with_shape(x.shape[:2] + tuple(_pool_dims(a, x.shape)))


def pool_windows(x: np.ndarray, a: dict, fill: float) -> tuple[np.ndarray, list[int]]:
    """All windows stacked on a new leading axis K: (K, N, C, *out); outside cells hold `fill`."""
    nd = len(a["kernel_shape"])
    strides, pads, dil = _spatial(a, nd)
    out = _pool_dims(a, x.shape)
    # room for ceil-mode windows that run past the end padding
    extra = [max(0, (out[i] - 1) * strides[i] + dil[i] * (a["kernel_shape"][i] - 1) + 1 - x.shape[2 + i]
                 - pads[i] - pads[i + nd]) for i in range(nd)]  # fmt: skip
    widths = [(0, 0), (0, 0)] + [(pads[i], pads[i + nd] + extra[i]) for i in range(nd)]
    xp = np.pad(x, widths, constant_values=fill)
    wins = []
    for kidx in np.ndindex(*a["kernel_shape"]):
        index = tuple(slice(k * d, k * d + s * (o - 1) + 1, s) for k, d, s, o in zip(kidx, dil, strides, out))
        wins.append(xp[(Ellipsis,) + index])
    return np.stack(wins), extra


def _max_pool_infer(a: dict, x: TensorType) -> tuple[TensorType, TensorType]:
    y = _pool_infer(a, x)
    return y, y.with_dtype("int64")


@op("MaxPool", Pattern.OPAQUE, infer=_max_pool_infer, attrs=POOL_ATTRS + [Attr("storage_order", "int", 0)])
def max_pool(a: dict, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Max over windows; Indices flatten (N, C, *spatial) row-major, or column-major spatially."""
    low = -np.inf if np.issubdtype(x.dtype, np.floating) else np.iinfo(x.dtype).min
    wins, _ = pool_windows(x, a, low)
    y = wins.max(axis=0).astype(x.dtype)
    sp = x.shape[2:]
    if a["storage_order"]:
        flat = np.arange(int(np.prod(sp))).reshape(sp[::-1]).T
    else:
        flat = np.arange(int(np.prod(sp))).reshape(sp)
    base = (np.arange(x.shape[0] * x.shape[1]) * int(np.prod(sp))).reshape(x.shape[:2] + (1,) * len(sp))
    idx_wins, _ = pool_windows(np.broadcast_to(flat + base, x.shape).astype(np.int64), a, -1)
    arg = np.argmax(np.where(idx_wins >= 0, wins, low), axis=0)
    return y, np.take_along_axis(idx_wins, arg[None], axis=0)[0]


def _pool_acc(a: dict, x: Tensor, pad_value, reducer, pre=None, dtype=None, name: str = "pool"):
    """The window reduction of a pooling op (padded with pad_value, and past the end for ceil_mode
    windows); returns (acc, window, pads)."""
    if x.ndim < 3:
        raise NotLowerable("pooling needs at least one spatial dimension")
    nd = len(a["kernel_shape"])
    strides, pads, dil = _spatial(a, nd)
    out = _pool_dims(a, x.shape)
    ks = a["kernel_shape"]
    extra = [max(0, (out[i] - 1) * strides[i] + dil[i] * (ks[i] - 1) + 1 - x.shape[2 + i] - pads[i] - pads[i + nd])
             for i in range(nd)]  # fmt: skip
    dtype = dtype or x.dtype
    xp = T.pad_input(lambda *i: x[i], x.shape, pads[:nd], [pads[nd + i] + extra[i] for i in range(nd)],
                     te.const(pad_value, dtype), dtype, name=f"{name}_pad", materialize=strides[-1] == 1)  # fmt: skip
    win = T.Window(tuple(ks), strides, dil, tuple(out))
    return T.window_acc(xp, win, reducer, pre, name=f"{name}_acc"), win, pads


def _pool_out(acc: Tensor, fn, name: str) -> Tensor:
    return te.compute(acc.shape, lambda *i: fn(acc[i], i), name=name, attrs={"template": "conv_ow", "acc": acc})


@lowering("MaxPool", schedule=T.schedule_nn)
def _max_pool_compute(a: dict, x: Tensor) -> list[Tensor]:
    """Y: max over windows; Indices: the first position (in window order) holding the max, as a flat
    index of x (row-major, or spatially column-major with storage_order=1)."""
    if x.dtype.is_bool:
        raise NotLowerable("MaxPool on bool")
    low = -np.inf if x.dtype.is_float else np.iinfo(x.dtype.numpy).min
    acc, win, pads = _pool_acc(a, x, low, te.max, name="maxpool")
    y = _pool_out(acc, lambda v, i: v, "maxpool")
    nd, sp = len(win.kernel), x.shape[2:]
    ks = [te.reduce_axis((0, k), name=f"rk{d}") for d, k in enumerate(win.kernel)]
    big = int(np.prod(win.kernel))

    def first(*i):
        pos = [o * s + k * d - p for o, k, s, d, p in zip(i[2:], ks, win.strides, win.dilations, pads)]
        inside = te.all(*[c for q, n in zip(pos, sp) for c in (q >= 0, q < n)])
        hit = te.all(inside, x[i[:2] + tuple(te.minimum(te.maximum(q, 0), n - 1) for q, n in zip(pos, sp))] == y[i])
        lin = te.const(0)
        for k, n in zip(ks, win.kernel):
            lin = lin * n + k
        return te.min(te.if_then_else(hit, lin, te.const(big)), axis=ks)

    pk = te.compute(y.shape, first, name="maxpool_first")

    def index(*i):
        rest, flat_pos = pk[i], []
        for d in reversed(range(nd)):
            k = rest % win.kernel[d]
            rest = rest // win.kernel[d]
            flat_pos.insert(0, i[2 + d] * win.strides[d] + k * win.dilations[d] - pads[d])
        order = list(reversed(range(nd))) if a["storage_order"] else list(range(nd))
        flat = te.cast(i[0], "int64") * x.shape[1] + i[1]
        for d in order:
            flat = flat * sp[d] + te.cast(flat_pos[d], "int64")
        return flat

    return [y, te.compute(y.shape, index, name="maxpool_indices")]


@op("AveragePool", Pattern.OPAQUE, infer=_pool_infer, attrs=POOL_ATTRS + [Attr("count_include_pad", "int", 0)])
def average_pool(a: dict, x: np.ndarray) -> np.ndarray:
    """Mean over windows; count_include_pad counts explicit pads, never the ceil-mode overhang."""
    nd = len(a["kernel_shape"])
    pads = a["pads"]
    wins, extra = pool_windows(_acc(x), a, 0.0)
    ones = np.ones((1, 1) + x.shape[2:])
    if a["count_include_pad"]:
        ones = np.pad(ones, [(0, 0), (0, 0)] + [(pads[i], pads[i + nd]) for i in range(nd)], constant_values=1)
        counted = dict(a, pads=(0,) * nd + tuple(extra))
        mask, _ = pool_windows(ones, dict(counted, ceil_mode=0), 0.0)
    else:
        mask, _ = pool_windows(ones, a, 0.0)
    return (wins.sum(axis=0) / mask.sum(axis=0)).astype(x.dtype)


@lowering("AveragePool", schedule=T.schedule_nn)
def _average_pool_compute(a: dict, x: Tensor) -> Tensor:
    """Window sums divided by the count of the window's cells inside the input (count_include_pad:
    inside the explicitly padded input; never the ceil_mode overhang), counted per axis."""
    if not x.dtype.is_float:
        raise NotLowerable(f"AveragePool on {x.dtype}")
    acc, win, pads = _pool_acc(a, x, 0.0, te.sum, name="avgpool")
    count = window_count(x.shape[2:], pads, win, bool(a["count_include_pad"]), x.dtype)
    return _pool_out(acc, lambda v, i: v / count(i[2:]), "avgpool")


def window_count(size: tuple[int, ...], pads: tuple[int, ...], win: T.Window, include_pad: bool, dtype):
    """count(out_pos): the number of cells of the window at output position out_pos (spatial indices)
    inside the input of spatial shape `size` (include_pad: inside the explicitly padded input; never
    the ceil_mode overhang), counted per axis."""
    nd = len(win.kernel)

    def count(pos):
        total = te.const(1)
        for d in range(nd):
            pb, pe = pads[d], pads[nd + d]
            lo, hi = (-pb, size[d] + pe) if include_pad else (0, size[d])
            base = pos[d] * win.strides[d] - pb
            dil, k = win.dilations[d], win.kernel[d]
            first = te.maximum((lo - base + dil - 1) // dil, 0)
            last = te.minimum((hi - 1 - base) // dil, k - 1)
            total = total * te.maximum(last - first + 1, 0)
        return te.cast(total, dtype)

    return count


@op("LpPool", Pattern.OPAQUE, infer=_pool_infer, attrs=POOL_ATTRS + [Attr("p", "int", 2)])
def lp_pool(a: dict, x: np.ndarray) -> np.ndarray:
    wins, _ = pool_windows(np.abs(_acc(x)), a, 0.0)
    return (np.sum(wins ** a["p"], axis=0) ** (1.0 / a["p"])).astype(x.dtype)


@lowering("LpPool", schedule=T.schedule_nn)
def _lp_pool_compute(a: dict, x: Tensor) -> Tensor:
    if not x.dtype.is_float:
        raise NotLowerable(f"LpPool on {x.dtype}")
    p = a["p"]
    acc, _, _ = _pool_acc(a, x, 0.0, te.sum, pre=lambda v: _lp_pre(v, p), name="lppool")
    return _pool_out(acc, lambda v, i: _lp_root(v, p), "lppool")


def _lp_pre(v, p: int):
    return te.abs(v) if p == 1 else v * v if p == 2 else te.pow(te.abs(v), float(p))


def _lp_root(v, p: int):
    return v if p == 1 else te.sqrt(v) if p == 2 else te.pow(v, 1.0 / p)


def _global_infer(a: dict, x: TensorType) -> TensorType:
    return x.with_shape(x.shape[:2] + (1,) * (x.rank - 2))


def _spatial_axes(x: np.ndarray) -> tuple[int, ...]:
    return tuple(range(2, x.ndim))


@op("GlobalAveragePool", Pattern.REDUCTION, infer=_global_infer)
def global_average_pool(a: dict, x: np.ndarray) -> np.ndarray:
    return np.mean(_acc(x), axis=_spatial_axes(x), keepdims=True).astype(x.dtype)


@lowering("GlobalAveragePool", schedule=T.schedule_nn)
def _global_average_pool_compute(a: dict, x: Tensor) -> Tensor:
    if not x.dtype.is_float:
        raise NotLowerable(f"GlobalAveragePool on {x.dtype}")
    n = math.prod(x.shape[2:])
    return _global_pool_te(x, te.sum, None, lambda v: v * (1.0 / n) if n else v / 0.0, "global_avgpool")


@op("GlobalMaxPool", Pattern.REDUCTION, infer=_global_infer)
def global_max_pool(a: dict, x: np.ndarray) -> np.ndarray:
    return np.max(x, axis=_spatial_axes(x), keepdims=True)


@lowering("GlobalMaxPool", schedule=T.schedule_nn)
def _global_max_pool_compute(a: dict, x: Tensor) -> Tensor:
    if x.dtype.is_bool:
        raise NotLowerable("GlobalMaxPool on bool")
    return _global_pool_te(x, te.max, None, lambda v: v, "global_maxpool")


@op("GlobalLpPool", Pattern.REDUCTION, infer=_global_infer, attrs=[Attr("p", "int", 2)])
def global_lp_pool(a: dict, x: np.ndarray) -> np.ndarray:
    p = a["p"]
    return (np.sum(np.abs(_acc(x)) ** p, axis=_spatial_axes(x), keepdims=True) ** (1.0 / p)).astype(x.dtype)


@lowering("GlobalLpPool", schedule=T.schedule_nn)
def _global_lp_pool_compute(a: dict, x: Tensor) -> Tensor:
    if not x.dtype.is_float:
        raise NotLowerable(f"GlobalLpPool on {x.dtype}")
    p = a["p"]
    return _global_pool_te(x, te.sum, lambda v: _lp_pre(v, p), lambda v: _lp_root(v, p), "global_lppool")


def _unravel(flat, dims: tuple[int, ...]) -> tuple:
    """Row-major indices into dims of a flat index (the flattened C index simplifies back to it)."""
    out = []
    for n in reversed(dims[1:]):
        out.insert(0, flat % n)
        flat = flat // n
    return (flat, *out) if dims else ()


class _Stats:
    """Reductions of x over `axes`, and per-row stages built from them. Trailing axes use the row
    template (vectorized partial sums, everything computed per row inside the output's row loop);
    other axes a keepdims reduction scheduled on its own."""

    def __init__(self, shape: tuple[int, ...], axes: tuple[int, ...]):
        self.shape, self.axes = shape, tuple(sorted(axes))
        nd = len(shape)
        k = min(self.axes) if self.axes else nd
        self.k = k if self.axes == tuple(range(k, nd)) else None

    @property
    def attrs(self) -> dict:
        return {"template": "rows", "rows": self.k} if self.k is not None else {}

    def reduce(self, at, reducer, dtype, name: str):
        """reader(full index) of reducer over the axes of at(full index)."""
        shape, axes, k = self.shape, self.axes, self.k
        if k is not None:
            inner = shape[k:]
            rd = T.row_reduce(shape[:k], math.prod(inner), lambda r, l: at(tuple(r) + _unravel(l, inner)), reducer,
                              dtype, name)  # fmt: skip
            return lambda idx: rd(tuple(idx[:k]))
        raxes = {d: te.reduce_axis((0, shape[d]), name=f"r{d}") for d in axes}

        def body(*i):
            full = tuple(raxes[d] if d in raxes else i[d] for d in range(len(shape)))
            return reducer(at(full), axis=list(raxes.values()))

        kshape = tuple(1 if d in raxes else n for d, n in enumerate(shape))
        t = te.compute(kshape, body, name=name)
        return lambda idx: t[tuple(0 if d in raxes else i for d, i in enumerate(idx))]

    def stage(self, fn, name: str):
        """reader(full index) of a per-row value fn(full index), computed once per row."""
        shape, k = self.shape, self.k
        if k is not None:
            pad = (te.const(0),) * (len(shape) - k)
            t = T.row_buffer(shape[:k], lambda *r: fn(tuple(r) + pad), name)
            return lambda idx: t[tuple(idx[:k])]
        kshape = tuple(1 if d in self.axes else n for d, n in enumerate(shape))
        t = te.compute(kshape, lambda *i: fn(i), name=name, attrs={"materialize": True})
        return lambda idx: t[tuple(0 if d in self.axes else i for d, i in enumerate(idx))]


def _global_pool_te(x: Tensor, reducer, pre, post, name: str) -> Tensor:
    if x.ndim < 2:
        raise NotLowerable(f"{name} needs a channel dimension")
    st = _Stats(x.shape, tuple(range(2, x.ndim)))
    red = st.reduce(lambda i: pre(x[i]) if pre else x[i], reducer, x.dtype, f"{name}_acc")
    shape = x.shape[:2] + (1,) * (x.ndim - 2)
    return te.compute(shape, lambda *i: post(red(i)), name=name, attrs=st.attrs)


# -- normalization ----------------------------------------------------------------------------------
def _bn_infer(a: dict, x: TensorType, *params: TensorType) -> tuple[TensorType, ...]:
    c = x.shape[1] if x.rank > 1 else 1
    for p in params:
        if p.shape != (c,):
            raise ShapeError(f"BatchNormalization parameters must have shape [{c}] for input {x}, got {p}")
    stat = params[2] if len(params) > 2 else TensorType((c,), x.dtype)
    return (x, stat, stat) if a["training_mode"] else (x,)


@op(
    "BatchNormalization",
    Pattern.BROADCAST,
    infer=_bn_infer,
    inputs=(5, 5),
    attrs=[Attr("epsilon", "float", 1e-5), Attr("momentum", "float", 0.9), Attr("training_mode", "int", 0)],
)
def batch_norm(a: dict, x, scale, bias, mean, var) -> tuple[np.ndarray, ...]:
    """Inference: normalize with the running statistics; training_mode: batch statistics,
    and also return the updated running mean and variance."""
    shape = (1, -1) + (1,) * (x.ndim - 2)
    xd = _acc(x)
    if a["training_mode"]:
        axes = (0,) + tuple(range(2, x.ndim))
        bmean, bvar = xd.mean(axis=axes), xd.var(axis=axes)
        y = (xd - bmean.reshape(shape)) / np.sqrt(bvar.reshape(shape) + a["epsilon"])
        y = y * scale.reshape(shape) + bias.reshape(shape)
        m = a["momentum"]
        run_mean = mean * m + bmean * (1 - m)
        run_var = var * m + bvar * (1 - m)
        return y.astype(x.dtype), run_mean.astype(mean.dtype), run_var.astype(var.dtype)
    y = (xd - mean.reshape(shape)) / np.sqrt(_acc(var).reshape(shape) + a["epsilon"])
    return (y * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype)


@lowering("BatchNormalization", schedule=T.schedule_nn)
def _batch_norm_compute(a: dict, x: Tensor, scale, bias, mean, var) -> list[Tensor]:
    """Inference: x * s + t with s = scale / sqrt(var + eps) and t = bias - mean * s per channel
    (computed once, not per element). training_mode: batch statistics over all axes but the
    channels, and the running statistics updated with `momentum`."""
    if not x.dtype.is_float:
        raise NotLowerable(f"BatchNormalization on {x.dtype}")
    c = x.shape[1] if x.ndim > 1 else 1

    def ch(i):
        return i[1] if x.ndim > 1 else te.const(0)

    def p(t: Tensor, ci):
        return te.cast(t[ci], x.dtype)

    eps = a["epsilon"]
    if not a["training_mode"]:
        mul = te.compute((c,), lambda ci: p(scale, ci) * te.rsqrt(p(var, ci) + eps), name="bn_scale",
                         attrs={"materialize": True})  # fmt: skip
        add = te.compute((c,), lambda ci: p(bias, ci) - p(mean, ci) * mul[ci], name="bn_shift",
                         attrs={"materialize": True})  # fmt: skip
        return [te.compute(x.shape, lambda *i: x[i] * mul[ch(i)] + add[ch(i)], name="batch_norm")]
    st = _Stats(x.shape, tuple(d for d in range(x.ndim) if d != 1))
    n = math.prod(x.shape[d] for d in st.axes)
    inv_n = 1.0 / n if n else math.nan
    s1 = st.reduce(lambda i: x[i], te.sum, x.dtype, "bn_sum")
    bmean = st.stage(lambda i: s1(i) * inv_n, "bn_mean")

    def sq(i):
        d = x[i] - bmean(i)
        return d * d

    s2 = st.reduce(sq, te.sum, x.dtype, "bn_sumsq")
    bvar = st.stage(lambda i: s2(i) * inv_n, "bn_var")
    y = te.compute(x.shape, lambda *i: (x[i] - bmean(i)) * te.rsqrt(bvar(i) + eps) * p(scale, ch(i)) + p(bias, ch(i)),
                   name="batch_norm")  # fmt: skip
    m = a["momentum"]

    def running(old: Tensor, stat, name: str) -> Tensor:
        def body(ci):
            idx = tuple(ci if d == 1 else te.const(0) for d in range(x.ndim)) if x.ndim > 1 else (te.const(0),)
            return te.cast(te.cast(old[ci], x.dtype) * m + stat(idx) * (1.0 - m), old.dtype)

        return te.compute((c,), body, name=name)

    return [y, running(mean, bmean, "bn_running_mean"), running(var, bvar, "bn_running_var")]


@op("InstanceNormalization", Pattern.OPAQUE, infer=lambda a, x, s, b: x, inputs=(3, 3),
    attrs=[Attr("epsilon", "float", 1e-5)])  # fmt: skip
def instance_norm(a: dict, x, scale, bias) -> np.ndarray:
    axes = tuple(range(2, x.ndim))
    xd = _acc(x)
    y = (xd - xd.mean(axis=axes, keepdims=True)) / np.sqrt(xd.var(axis=axes, keepdims=True) + a["epsilon"])
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return (y * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype)


@lowering("InstanceNormalization", schedule=T.schedule_nn)
def _instance_norm_compute(a: dict, x: Tensor, scale: Tensor, bias: Tensor) -> Tensor:
    if not x.dtype.is_float:
        raise NotLowerable(f"InstanceNormalization on {x.dtype}")
    st = _Stats(x.shape, tuple(range(2, x.ndim)))
    mean, inv = _mean_inv(st, lambda i: x[i], x.dtype, a["epsilon"], "in")
    return te.compute(x.shape, lambda *i: (x[i] - mean(i)) * inv(i) * scale[i[1]] + bias[i[1]],
                      name="instance_norm", attrs=st.attrs)  # fmt: skip


def _mean_inv(st: _Stats, at, dtype, eps: float, name: str):
    """Readers of the mean and 1/sqrt(variance + eps) over st's axes (two passes: the variance of
    x - mean, not E[x^2] - mean^2)."""
    n = math.prod(st.shape[d] for d in st.axes)
    inv_n = 1.0 / n if n else math.nan
    s1 = st.reduce(at, te.sum, dtype, f"{name}_sum")
    mean = st.stage(lambda i: s1(i) * inv_n, f"{name}_mean")

    def sq(i):
        d = at(i) - mean(i)
        return d * d

    s2 = st.reduce(sq, te.sum, dtype, f"{name}_sumsq")
    inv = st.stage(lambda i: te.rsqrt(s2(i) * inv_n + eps), f"{name}_inv")
    return mean, inv


def _ln_infer(a: dict, x: TensorType, scale: TensorType, bias: TensorType | None = None) -> tuple[TensorType, ...]:
    axis = norm_axis(a["axis"], x.rank)
    stat_dtype = "float32" if a["stash_type"] == 1 else x.dtype
    stat = TensorType(x.shape[:axis] + (1,) * (x.rank - axis), stat_dtype)
    for p in (scale, bias):
        if p is not None and broadcast_shapes(x.shape, p.shape) != x.shape:
            raise ShapeError(f"LayerNormalization scale/bias {p} must broadcast to {x}")
    return x, stat, stat


@op("LayerNormalization", Pattern.OPAQUE, infer=_ln_infer, inputs=(2, 3),
    attrs=[Attr("axis", "int", -1), Attr("epsilon", "float", 1e-5), Attr("stash_type", "int", 1)])  # fmt: skip
def layer_norm(a: dict, x, scale, bias=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Normalize over axes [axis, rank); outputs Y, Mean and InvStdDev."""
    axes = tuple(range(norm_axis(a["axis"], x.ndim), x.ndim))
    xd = _acc(x)
    mean = xd.mean(axis=axes, keepdims=True)
    inv = 1 / np.sqrt(((xd - mean) ** 2).mean(axis=axes, keepdims=True) + a["epsilon"])
    y = (xd - mean) * inv * scale
    if bias is not None:
        y = y + bias
    stat = np.float32 if a["stash_type"] == 1 else x.dtype
    return y.astype(x.dtype), mean.astype(stat), inv.astype(stat)


@lowering("LayerNormalization", schedule=T.schedule_nn)
def _layer_norm_compute(a: dict, x: Tensor, scale: Tensor, bias: Tensor | None = None) -> list[Tensor]:
    """Y, Mean, InvStdDev; statistics in x's dtype (float32 for float32 input, as stash_type=1 asks)."""
    if not x.dtype.is_float:
        raise NotLowerable(f"LayerNormalization on {x.dtype}")
    axis = norm_axis(a["axis"], x.ndim)
    st = _Stats(x.shape, tuple(range(axis, x.ndim)))
    mean, inv = _mean_inv(st, lambda i: x[i], x.dtype, a["epsilon"], "ln")

    def y(*i):
        v = (x[i] - mean(i)) * inv(i) * scale[broadcast_indices(i, scale.shape, x.ndim)]
        return v + bias[broadcast_indices(i, bias.shape, x.ndim)] if bias is not None else v

    stat_dtype = "float32" if a["stash_type"] == 1 else x.dtype
    stat_shape = x.shape[:axis] + (1,) * (x.ndim - axis)
    pad = (te.const(0),) * (x.ndim - axis)
    return [
        te.compute(x.shape, y, name="layer_norm", attrs=st.attrs),
        te.compute(stat_shape, lambda *i: te.cast(mean(i[:axis] + pad), stat_dtype), name="ln_mean_out"),
        te.compute(stat_shape, lambda *i: te.cast(inv(i[:axis] + pad), stat_dtype), name="ln_inv_out"),
    ]


@op("RMSNormalization", Pattern.OPAQUE, infer=lambda a, x, s: (x,), inputs=(2, 2),
    attrs=[Attr("axis", "int", -1), Attr("epsilon", "float", 1e-5), Attr("stash_type", "int", 1)])  # fmt: skip
def rms_norm(a: dict, x, scale) -> np.ndarray:
    axes = tuple(range(norm_axis(a["axis"], x.ndim), x.ndim))
    xd = _acc(x)
    rms = np.sqrt(np.mean(xd * xd, axis=axes, keepdims=True) + a["epsilon"])
    return (xd / rms * scale).astype(x.dtype)


@lowering("RMSNormalization", schedule=T.schedule_nn)
def _rms_norm_compute(a: dict, x: Tensor, scale: Tensor) -> Tensor:
    if not x.dtype.is_float:
        raise NotLowerable(f"RMSNormalization on {x.dtype}")
    axis = norm_axis(a["axis"], x.ndim)
    st = _Stats(x.shape, tuple(range(axis, x.ndim)))
    n = math.prod(x.shape[axis:])
    ss = st.reduce(lambda i: x[i] * x[i], te.sum, x.dtype, "rms_sumsq")
    inv = st.stage(lambda i: te.rsqrt(ss(i) * (1.0 / n if n else math.nan) + a["epsilon"]), "rms_inv")
    return te.compute(x.shape, lambda *i: x[i] * inv(i) * scale[broadcast_indices(i, scale.shape, x.ndim)],
                      name="rms_norm", attrs=st.attrs)  # fmt: skip


@op("GroupNormalization", Pattern.OPAQUE, infer=lambda a, x, s, b: x, inputs=(3, 3),
    attrs=[Attr("num_groups", "int"), Attr("epsilon", "float", 1e-5), Attr("stash_type", "int", 1)])  # fmt: skip
def group_norm(a: dict, x, scale, bias) -> np.ndarray:
    """Normalize over groups of channels; scale and bias are per channel (opset 21)."""
    n, c = x.shape[:2]
    g = a["num_groups"]
    xg = _acc(x).reshape(n, g, -1)
    y = (xg - xg.mean(axis=2, keepdims=True)) / np.sqrt(xg.var(axis=2, keepdims=True) + a["epsilon"])
    shape = (1, c) + (1,) * (x.ndim - 2)
    return (y.reshape(x.shape) * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype)


@lowering("GroupNormalization", schedule=T.schedule_nn)
def _group_norm_compute(a: dict, x: Tensor, scale: Tensor, bias: Tensor) -> Tensor:
    """Statistics per (n, group) over the group's channels and all positions: rows of the view
    (N, G, C/G * spatial), computed at the output's batch loop."""
    if not x.dtype.is_float or x.ndim < 2:
        raise NotLowerable(f"GroupNormalization on {x.dtype}{list(x.shape)}")
    n, c, *sp = x.shape
    g = a["num_groups"]
    cg = c // g
    inner = (cg, *sp)

    def at(r, l):
        j = _unravel(l, inner)
        return x[(r[0], r[1] * cg + j[0], *j[1:])]

    view = _Stats((n, g, math.prod(inner)), (2,))
    mean, inv = _mean_inv(view, lambda i: at(i[:2], i[2]), x.dtype, a["epsilon"], "gn")

    def y(*i):
        r = (i[0], i[1] // cg, te.const(0))
        return (x[i] - mean(r)) * inv(r) * scale[i[1]] + bias[i[1]]

    return te.compute(x.shape, y, name="group_norm", attrs={"template": "rows", "rows": 1})


@op("LpNormalization", Pattern.OPAQUE, infer=lambda a, x: x, attrs=[Attr("axis", "int", -1), Attr("p", "int", 2)])
def lp_norm(a: dict, x: np.ndarray) -> np.ndarray:
    axis = norm_axis(a["axis"], x.ndim)
    xd = _acc(x)
    norm = (
        np.sum(np.abs(xd), axis=axis, keepdims=True)
        if a["p"] == 1
        else np.sqrt(np.sum(xd * xd, axis=axis, keepdims=True))
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norm == 0, 0, xd / norm).astype(x.dtype)


@lowering("LpNormalization", schedule=T.schedule_nn)
def _lp_norm_compute(a: dict, x: Tensor) -> Tensor:
    if not x.dtype.is_float or a["p"] not in (1, 2):
        raise NotLowerable(f"LpNormalization p={a['p']} on {x.dtype}")
    st = _Stats(x.shape, (norm_axis(a["axis"], x.ndim),))
    p = a["p"]
    red = st.reduce(lambda i: te.abs(x[i]) if p == 1 else x[i] * x[i], te.sum, x.dtype, "lpn_sum")
    norm = st.stage(lambda i: red(i) if p == 1 else te.sqrt(red(i)), "lpn_norm")
    zero = T.zero(x.dtype)
    return te.compute(x.shape, lambda *i: te.if_then_else(norm(i) == zero, zero, x[i] / norm(i)), name="lp_norm",
                      attrs=st.attrs)  # fmt: skip


@op("MeanVarianceNormalization", Pattern.OPAQUE, infer=lambda a, x: x, attrs=[Attr("axes", "ints", (0, 2, 3))])
def mvn(a: dict, x: np.ndarray) -> np.ndarray:
    axes = norm_axes(a["axes"], x.ndim)
    xd = _acc(x)
    mean = xd.mean(axis=axes, keepdims=True)
    return ((xd - mean) / (np.sqrt(((xd - mean) ** 2).mean(axis=axes, keepdims=True)) + 1e-9)).astype(x.dtype)


@lowering("MeanVarianceNormalization", schedule=T.schedule_nn)
def _mvn_compute(a: dict, x: Tensor) -> Tensor:
    if not x.dtype.is_float:
        raise NotLowerable(f"MeanVarianceNormalization on {x.dtype}")
    st = _Stats(x.shape, norm_axes(a["axes"], x.ndim))
    n = math.prod(x.shape[d] for d in st.axes)
    inv_n = 1.0 / n if n else math.nan
    s1 = st.reduce(lambda i: x[i], te.sum, x.dtype, "mvn_sum")
    mean = st.stage(lambda i: s1(i) * inv_n, "mvn_mean")

    def sq(i):
        d = x[i] - mean(i)
        return d * d

    s2 = st.reduce(sq, te.sum, x.dtype, "mvn_sumsq")
    den = st.stage(lambda i: te.sqrt(s2(i) * inv_n) + 1e-9, "mvn_den")
    return te.compute(x.shape, lambda *i: (x[i] - mean(i)) / den(i), name="mvn", attrs=st.attrs)


@op(
    "LRN",
    Pattern.OPAQUE,
    infer=lambda a, x: x,
    attrs=[Attr("size", "int"), Attr("alpha", "float", 1e-4), Attr("beta", "float", 0.75), Attr("bias", "float", 1.0)],
)
def lrn(a: dict, x: np.ndarray) -> np.ndarray:
    """Local response normalization across channels."""
    size = a["size"]
    sq = np.square(_acc(x))
    lo = (size - 1) // 2
    hi = size - 1 - lo
    padded = np.pad(sq, [(0, 0), (lo, hi)] + [(0, 0)] * (x.ndim - 2))
    total = sum(padded[:, i : i + x.shape[1]] for i in range(size))
    return (x / (a["bias"] + a["alpha"] / size * total) ** a["beta"]).astype(x.dtype)


@lowering("LRN", schedule=T.schedule_nn)
def _lrn_compute(a: dict, x: Tensor) -> Tensor:
    """x / (bias + alpha / size * sum of squares over `size` neighbouring channels) ** beta."""
    if not x.dtype.is_float or x.ndim < 2:
        raise NotLowerable(f"LRN on {x.dtype}{list(x.shape)}")
    size, c = a["size"], x.shape[1]
    lo = (size - 1) // 2
    r = te.reduce_axis((0, size), name="rs")

    def sq(*i):
        ch = i[1] - lo + r
        v = x[(i[0], te.minimum(te.maximum(ch, 0), c - 1), *i[2:])]
        return te.sum(te.if_then_else(te.all(ch >= 0, ch < c), v * v, T.zero(x.dtype)), axis=r)

    total = te.compute(x.shape, sq, name="lrn_sumsq")
    scale = a["alpha"] / size
    return te.compute(x.shape, lambda *i: x[i] / te.pow(total[i] * scale + a["bias"], a["beta"]), name="lrn")


# -- Softmax family: the entries (references) are in ember.ops.reduce; their computes are here, next to
# the normalizations they share the row template with.
def _row_exp(dtype) -> Callable[[Expr], Expr]:
    """exp for the softmax rows: the library's on C targets with glibc's vector math (libmvec: a whole vector
    per call, about 10x faster here than the arithmetic version's table gathers and scalar tails) and on
    GPUs; elsewhere (LLVM, no libmvec) the arithmetic float32 exp with a 2^n table, which vectorizes."""
    target = current_target()
    if dtype.name != "float32" or (target is not None and target.kind in ("cuda", "opencl")):
        return te.exp
    if (target is None or target.kind == "c") and has_libmvec():
        return te.exp
    tab = T.exp_table()
    return lambda v: T.exp(v, tab)


def _softmax_family(kind: str, a: dict, x: Tensor) -> Tensor:
    """Numerically stable: the row max is subtracted before exp."""
    if not x.dtype.is_float:
        raise NotLowerable(f"{kind} on {x.dtype}")
    axis = norm_axis(a["axis"], x.ndim)
    st = _Stats(x.shape, (axis,))
    m = st.reduce(lambda i: x[i], te.max, x.dtype, "sm_max")
    if kind == "Hardmax":
        first = st.reduce(lambda i: te.if_then_else(x[i] == m(i), i[axis], te.const(x.shape[axis])), te.min,
                          x.dtype, "hm_first")  # fmt: skip
        return te.compute(x.shape, lambda *i: te.cast(i[axis] == first(i), x.dtype), name="hardmax", attrs=st.attrs)
    exp = _row_exp(x.dtype)
    if kind == "LogSoftmax":
        total = st.reduce(lambda i: exp(x[i] - m(i)), te.sum, x.dtype, "lsm_sum")
        shift = st.stage(lambda i: m(i) + te.log(total(i)), "lsm_shift")
        return te.compute(x.shape, lambda *i: x[i] - shift(i), name="log_softmax", attrs=st.attrs)
    if st.k is not None:
        e = T.row_buffer(x.shape, lambda *i: exp(x[i] - m(i)), "sm_exp")
    else:
        e = te.compute(x.shape, lambda *i: exp(x[i] - m(i)), name="sm_exp", attrs={"materialize": True})
    if x.dtype.is_half:  # as numpy: the sum accumulated in float32 and rounded once, then one division per element
        wide = st.reduce(lambda i: te.cast(e[i], "float32"), te.sum, "float32", "sm_sum")
        total = st.stage(lambda i: te.cast(wide(i), x.dtype), "sm_total")
        return te.compute(x.shape, lambda *i: e[i] / total(i), name="softmax", attrs=st.attrs)
    total = st.reduce(lambda i: e[i], te.sum, x.dtype, "sm_sum")
    rcp = st.stage(lambda i: te.const(1.0, x.dtype) / total(i), "sm_rcp")
    return te.compute(x.shape, lambda *i: e[i] * rcp(i), name="softmax", attrs=st.attrs)


for _kind in ("Softmax", "LogSoftmax", "Hardmax"):
    lowering(_kind, schedule=T.schedule_nn)(lambda a, x, _kind=_kind: _softmax_family(_kind, a, x))


# -- matrix products ---------------------------------------------------------------------------------
def matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """numpy.matmul output shape (1-d operands promoted and the added axis removed)."""
    if not a or not b:
        raise ShapeError("MatMul operands must have rank >= 1")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ShapeError(f"MatMul inner dims differ: {list(a)} @ {list(b)}")
    out = broadcast_shapes(a2[:-2], b2[:-2]) + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def _matmul_infer(a: dict, x: TensorType, y: TensorType) -> TensorType:
    if x.dtype != y.dtype:
        raise ShapeError(f"MatMul operands must have one dtype, got {x.dtype} and {y.dtype}")
    return TensorType(matmul_shape(x.shape, y.shape), x.dtype)


@op("MatMul", OUT, infer=_matmul_infer, inputs=(2, 2))
def matmul(a: dict, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.matmul(_acc(x), _acc(y)).astype(x.dtype)


def matmul_te(x: Tensor, y: Tensor | None, dtype=None, pre_x=None, pre_y=None, post=None, name: str = "matmul",
              cfg=None, packed_b: Tensor | None = None, n: int = 0) -> Tensor:  # fmt: skip
    """numpy.matmul of x and y through the GEMM template: 1-d operands promoted, batch dims broadcast.

    pre_x/pre_y map an operand element (and its row index i / column index j) to the accumulation
    dtype (casts, zero points); post(v, i, j) is the epilogue on each accumulated element. With
    `packed_b` (panels [n / nr, K, nr] of a 2-d B with n columns, see `MatMulPackedB`) y is None."""
    xs = x.shape
    ys = y.shape if packed_b is None else (packed_b.shape[1], n)
    a1, b1 = len(xs) == 1, len(ys) == 1
    x2 = (1,) + xs if a1 else xs
    y2 = ys + (1,) if b1 else ys
    (M, K), N = x2[-2:], y2[-1]
    abatch, bbatch = x2[:-2], y2[:-2]
    batch = broadcast_shapes(abatch, bbatch)
    nb = len(batch)
    dtype = as_dtype(dtype) if dtype is not None else x.dtype
    half = dtype if dtype.is_half else None
    if half is not None:  # float16/bfloat16 products accumulate in float32 (as numpy's and onnxruntime's do)
        dtype = as_dtype("float32")
        pre_x = pre_x or (lambda v, i: te.cast(v, "float32"))
        pre_y = pre_y or (lambda v, j: te.cast(v, "float32"))
    pre_x = pre_x or (lambda v, i: v)
    pre_y = pre_y or (lambda v, j: v)

    def xa(ab, i, k):  # x's element, ab indexing x's own batch dims
        return pre_x(x[k] if a1 else x[tuple(ab) + (i, k)], i)

    def yb(bb, k, j):
        return pre_y(y[k] if b1 else y[tuple(bb) + (k, j)], j)

    def a_batch(bi):
        return broadcast_indices(bi, abatch, nb)

    def b_batch(bi):
        return broadcast_indices(bi, bbatch, nb)

    # few columns and many rows: compute the transpose (B^T A^T), so that vectors run along the rows
    swap = packed_b is None and not (a1 or b1) and N < T.lanes_of(dtype, T.host_target()) <= M // 2
    if packed_b is not None:
        acc = T.gemm_acc(batch, M, N, K, lambda bi, i, k: xa(a_batch(bi), i, k), None, (), lambda bi: (), dtype,
                         name=f"{name}_acc", cfg=cfg, packed_b=packed_b)  # fmt: skip
    elif swap:
        acc = T.gemm_acc(batch, N, M, K, lambda bi, j, k: yb(b_batch(bi), k, j), lambda ab, k, i: xa(ab, i, k),
                         abatch, a_batch, dtype, name=f"{name}_acc", cfg=cfg)  # fmt: skip
    else:
        acc = T.gemm_acc(batch, M, N, K, lambda bi, i, k: xa(a_batch(bi), i, k), yb, bbatch, b_batch, dtype,
                         name=f"{name}_acc", cfg=cfg)  # fmt: skip

    def out(*idx):
        i = te.const(0) if a1 else idx[nb]
        j = te.const(0) if b1 else idx[-1]
        v = acc[tuple(idx[:nb]) + ((j, i) if swap else (i, j))]
        v = post(v, i, j) if post else v
        return te.cast(v, half) if half is not None else v

    i_axis = None if a1 else nb
    j_axis = None if b1 else nb + (0 if a1 else 1)
    if swap:
        i_axis, j_axis = j_axis, i_axis
    attrs = {} if a1 and b1 else {"template": "gemm", "acc": acc, "i_axis": i_axis, "j_axis": j_axis}
    return te.compute(matmul_shape(xs, ys), out, name=name, attrs=attrs)


@lowering("MatMul", schedule=T.schedule_nn)
def _matmul_compute(a: dict, x: Tensor, y: Tensor) -> Tensor:
    return matmul_te(x, y, cfg=a.get(CONFIG_ATTR))


def _matmul_int_infer(a: dict, x: TensorType, y: TensorType, *zps) -> TensorType:
    return TensorType(matmul_shape(x.shape, y.shape), "int32")


@op("MatMulInteger", OUT, infer=_matmul_int_infer, inputs=(2, 4))
def matmul_integer(a: dict, x, y, x_zp=None, y_zp=None) -> np.ndarray:
    """Integer matmul with zero points (per tensor, per row of A or per column of B)."""
    xz = 0 if x_zp is None else x_zp.astype(np.int64)
    xz = xz.reshape(-1, 1) if np.ndim(xz) and np.size(xz) > 1 else xz
    yz = 0 if y_zp is None else y_zp.astype(np.int64)
    xi, yi = x.astype(np.int64) - xz, y.astype(np.int64) - yz
    return np.matmul(xi, yi).astype(np.int32)


def _zp_at(zp: Tensor | None, i):
    """A zero point as int32: per tensor, or the entry for index i (per row / per column)."""
    if zp is None:
        return None
    per = math.prod(zp.shape) > 1
    return te.cast(zp[(i if per else 0,) * zp.ndim] if zp.ndim else zp[()], "int32")


@lowering("MatMulInteger", schedule=T.schedule_nn)
def _matmul_integer_compute(a: dict, x: Tensor, y: Tensor, x_zp=None, y_zp=None) -> Tensor:
    def pre(zp):
        return lambda v, i: te.cast(v, "int32") - _zp_at(zp, i) if zp is not None else te.cast(v, "int32")

    return matmul_te(x, y, dtype="int32", pre_x=pre(x_zp), pre_y=pre(y_zp), name="matmul_integer")


def _gemm_infer(a: dict, x: TensorType, y: TensorType, c: TensorType | None = None) -> TensorType:
    if x.rank != 2 or y.rank != 2:
        raise ShapeError(f"Gemm needs 2-d operands, got {x} and {y}")
    m, k = x.shape[::-1] if a["transA"] else x.shape
    k2, n = y.shape[::-1] if a["transB"] else y.shape
    if k != k2:
        raise ShapeError(f"Gemm inner dims differ: {x} (transA={a['transA']}) and {y} (transB={a['transB']})")
    if c is not None and broadcast_shapes(c.shape, (m, n)) != (m, n):
        raise ShapeError(f"Gemm C {c} does not broadcast to [{m}, {n}]")
    return TensorType((m, n), x.dtype)


@op(
    "Gemm",
    OUT,
    infer=_gemm_infer,
    inputs=(2, 3),
    attrs=[Attr("alpha", "float", 1.0), Attr("beta", "float", 1.0), Attr("transA", "int", 0), Attr("transB", "int", 0)],
)
def gemm(a: dict, x, y, c=None) -> np.ndarray:
    """alpha * op(A) @ op(B) + beta * C."""
    xa = _acc(x).T if a["transA"] else _acc(x)
    yb = _acc(y).T if a["transB"] else _acc(y)
    out = a["alpha"] * (xa @ yb)
    if c is not None:
        out = out + a["beta"] * _acc(c)
    return out.astype(x.dtype)


@lowering("Gemm", schedule=T.schedule_nn)
def _gemm_compute(a: dict, x: Tensor, y: Tensor, c: Tensor | None = None) -> Tensor:
    alpha, beta = a["alpha"], a["beta"]
    xt = te.compute(x.shape[::-1], lambda i, k: x[k, i], name="a_t") if a["transA"] else x
    yt = te.compute(y.shape[::-1], lambda k, j: y[j, k], name="b_t") if a["transB"] else y
    exact = x.dtype.is_float

    def post(v, i, j):
        if alpha != 1.0:
            v = v * alpha if exact else te.cast(te.cast(v, "float64") * alpha, v.dtype)
        if c is not None and beta != 0.0:
            cv = c[broadcast_indices((i, j), c.shape, 2)]
            v = v + (cv * beta if exact else te.cast(te.cast(cv, "float64") * beta, v.dtype)) if beta != 1.0 else v + cv
        return v

    m, k = xt.shape
    if a["transB"] and m < 8 and k >= 2 * T.lanes_of(x.dtype, T.host_target()):
        return _dot_rows_te(xt, y, post, "gemm")  # a fully connected layer: rows of W are contiguous
    return matmul_te(xt, yt, post=post, name="gemm", cfg=a.get(CONFIG_ATTR))


def _packed_b_infer(a: dict, x: TensorType, w: TensorType, c: TensorType | None = None) -> TensorType:
    if x.rank < 2 or w.rank != 3 or x.dtype != w.dtype:
        raise ShapeError(f"MatMulPackedB needs x [..., M, K] and panels [N/nr, K, nr] of one dtype, got {x} and {w}")
    panels, k, nr = w.shape
    if x.shape[-1] != k or not (panels - 1) * nr < a["n"] <= panels * nr:
        raise ShapeError(f"MatMulPackedB: x {x} and panels {w} do not make a [{x.shape[-1]}, {a['n']}] B")
    out = (*x.shape[:-1], a["n"])
    if c is not None and broadcast_shapes(c.shape, out) != out:
        raise ShapeError(f"MatMulPackedB: C {c} does not broadcast to {list(out)}")
    return TensorType(out, x.dtype)


def unpack_b(w: np.ndarray, n: int) -> np.ndarray:
    """The 2-d B [K, n] of panels w [n / nr, K, nr]."""
    panels, k, nr = w.shape
    return w.transpose(1, 0, 2).reshape(k, panels * nr)[:, :n]


def pack_b(b: np.ndarray, nr: int) -> np.ndarray:
    """Panels [ceil(N / nr), K, nr] of a 2-d B [K, N], zeros past N (the layout the GEMM template reads)."""
    k, n = b.shape
    panels = -(-n // nr)
    padded = np.zeros((k, panels * nr), dtype=b.dtype)
    padded[:, :n] = b
    return np.ascontiguousarray(padded.reshape(k, panels, nr).transpose(1, 0, 2))


@op("MatMulPackedB", OUT, infer=_packed_b_infer, inputs=(2, 3),
    attrs=[Attr("n", "int"), Attr("alpha", "float", 1.0), Attr("beta", "float", 1.0)])  # fmt: skip
def matmul_packed_b(a: dict, x: np.ndarray, w: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
    """alpha * x @ B + beta * C, with the constant B [K, n] given packed in column panels (`pack_b`), as
    `ember.passes.pack` leaves MatMul and Gemm by weights: the packing is done once, at compile time."""
    out = a["alpha"] * np.matmul(_acc(x), _acc(unpack_b(w, a["n"])))
    if c is not None:
        out = out + a["beta"] * _acc(c)
    return out.astype(x.dtype)


@lowering("MatMulPackedB", schedule=T.schedule_nn)
def _matmul_packed_b_compute(a: dict, x: Tensor, w: Tensor, c: Tensor | None = None) -> Tensor:
    alpha, beta = a["alpha"], a["beta"]
    rank = len(x.shape)

    def post(v, i, j):
        if alpha != 1.0:
            v = v * alpha
        if c is not None and beta != 0.0:
            cv = c[broadcast_indices((i, j), c.shape, 2)] if len(c.shape) <= 1 or rank == 2 else None
            if cv is None:
                raise NotLowerable("MatMulPackedB: C must be at most 2-d with a 2-d x")
            v = v + (cv * beta if beta != 1.0 else cv)
        return v

    return matmul_te(x, None, post=post, name="dense", cfg=a.get(CONFIG_ATTR), packed_b=w, n=a["n"])


def _dot_rows_te(x: Tensor, w: Tensor, post, name: str) -> Tensor:
    """x @ w^T for few rows of x: each output a dot product of two contiguous rows (vectorized partial
    sums of the row template), so w streams once along its rows instead of across them."""
    (m, k), n = x.shape, w.shape[0]
    st = _Stats((m, n, k), (2,))
    dot = st.reduce(lambda i: x[i[0], i[2]] * w[i[1], i[2]], te.sum, x.dtype, f"{name}_dot")
    return te.compute((m, n), lambda i, j: post(dot((i, j, 0)), i, j), name=name, attrs={"template": "rows", "rows": 2})


def _einsum_infer(a: dict, *ts: TensorType) -> TensorType:
    dummies = [np.broadcast_to(np.zeros((), np.float32), t.shape) for t in ts]
    return TensorType(np.einsum(a["equation"], *dummies).shape, ts[0].dtype)


@op("Einsum", OUT, infer=_einsum_infer, inputs=(1, None), attrs=[Attr("equation", "str")])
def einsum(a: dict, *xs: np.ndarray) -> np.ndarray:
    return np.einsum(a["equation"], *[_acc(x) for x in xs]).astype(xs[0].dtype)


def _einsum_terms(equation: str, shapes: list[tuple[int, ...]]) -> tuple[list[list], list]:
    """Labels of each operand and of the output; the dims an ellipsis covers become labels
    ("...", k), k counting from the right, so broadcasting aligns them."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise NotLowerable(f"Einsum {equation!r}: {len(terms)} terms for {len(shapes)} operands")
    ell = 0
    labels = []
    for term, shape in zip(terms, shapes):
        head, dots, tail = term.partition("...")
        n = len(shape) - len(head) - len(tail) if dots else 0
        ell = max(ell, n)
        labels.append(list(head) + [("...", n - 1 - k) for k in range(n)] + list(tail))
    if arrow:
        head, dots, tail = rhs.partition("...")
        out = list(head) + ([("...", ell - 1 - k) for k in range(ell)] if dots else []) + list(tail)
    else:
        letters = [c for t in labels for c in t if isinstance(c, str)]
        out = [("...", ell - 1 - k) for k in range(ell)] + sorted(c for c in set(letters) if letters.count(c) == 1)
    return labels, out


@lowering("Einsum", schedule=T.schedule_nn)
def _einsum_compute(a: dict, *xs: Tensor) -> Tensor:
    """out[out labels] = sum over the other labels of the product of the operands (size-1 dims
    broadcast); a batched matrix product of two operands goes through the GEMM template."""
    labels, out = _einsum_terms(a["equation"], [x.shape for x in xs])
    size: dict = {}
    for lab, x in zip(labels, xs):
        for c, n in zip(lab, x.shape):
            size[c] = max(size.get(c, 1), n)
    mm = _einsum_matmul(labels, out, xs, size)
    if mm is not None:
        return mm
    red = [c for c in size if c not in out]
    raxes = {c: te.reduce_axis((0, size[c]), name=f"r{i}") for i, c in enumerate(red)}

    def body(*idx):
        env = dict(zip(out, idx)) | raxes
        v = None
        for lab, x in zip(labels, xs):
            e = x[tuple(te.const(0) if n == 1 and size[c] > 1 else env[c] for c, n in zip(lab, x.shape))]
            v = e if v is None else v * e
        return te.sum(v, axis=list(raxes.values())) if raxes else v

    return te.compute(tuple(size[c] for c in out), body, name="einsum")


def _einsum_matmul(labels, out, xs, size) -> Tensor | None:
    """`...ij,...jk->...ik`-like equations (one row, one column and one summed label at most, no
    repeated or broadcast labels, output in batch-row-column order) as matmul_te."""
    if len(xs) != 2 or any(len(set(lab)) != len(lab) for lab in labels):
        return None
    a, b = labels
    if any(n != size[c] for lab, x in zip(labels, xs) for c, n in zip(lab, x.shape)):
        return None
    batch = [c for c in out if c in a and c in b]
    rows = [c for c in a if c not in b and c in out]
    cols = [c for c in b if c not in a and c in out]
    red = [c for c in a if c in b and c not in out]
    if len(rows) > 1 or len(cols) > 1 or len(red) != 1 or out != batch + rows + cols:
        return None
    if set(a) != set(batch + rows + red) or set(b) != set(batch + cols + red):
        return None

    def view(x, lab, order, name):
        shape = tuple(size[c] for c in order)
        return te.compute(shape, lambda *i: x[tuple(i[order.index(c)] for c in lab)], name=name)

    xa = view(xs[0], a, batch + rows + red, "einsum_a")
    xb = view(xs[1], b, batch + red + cols, "einsum_b")
    if not rows:
        xa = te.compute(xa.shape[:-1] + (1,) + xa.shape[-1:], lambda *i: xa[i[:-2] + i[-1:]], name="einsum_a1")
    if not cols:
        xb = te.compute(xb.shape + (1,), lambda *i: xb[i[:-1]], name="einsum_b1")
    y = matmul_te(xa, xb, name="einsum_mm")
    shape = tuple(size[c] for c in out)
    if y.shape == shape:
        return y
    return None


def _det_infer(a: dict, x: TensorType) -> TensorType:
    if x.rank < 2 or x.shape[-1] != x.shape[-2]:
        raise ShapeError(f"Det needs square matrices, got {x}")
    return x.with_shape(x.shape[:-2])


@op("Det", Pattern.OPAQUE, infer=_det_infer)
def det(a: dict, x: np.ndarray) -> np.ndarray:
    return np.linalg.det(_acc(x)).astype(x.dtype)


DET_MAX = 4  # the Leibniz sum has n! terms


@lowering("Det", schedule=T.schedule_nn)
def _det_compute(a: dict, x: Tensor) -> Tensor:
    """Leibniz's formula (a signed sum over permutations), in float64, for matrices up to 4 x 4;
    LU with pivoting is sequential and data-dependent: larger matrices run by reference."""
    n = x.shape[-1]
    if n > DET_MAX or not x.dtype.is_float:
        raise NotLowerable(f"Det of {n} x {n} {x.dtype} matrices (native up to {DET_MAX} x {DET_MAX})")
    terms = []
    for perm in itertools.permutations(range(n)):
        inversions = sum(perm[i] > perm[j] for i in range(n) for j in range(i + 1, n))
        terms.append((-1.0 if inversions % 2 else 1.0, perm))

    def body(*b):
        total = te.const(0.0, "float64")
        for sign, perm in terms:
            term = te.const(sign, "float64")
            for r, col in enumerate(perm):
                term = term * te.cast(x[b + (r, col)], "float64")
            total = total + term
        return te.cast(total, x.dtype)

    return te.compute(x.shape[:-2], body, name="det")


# -- QLinearMatMul, QLinearConv: the entries are in ember.ops.quant (which imports this module for
# the shape rules), their computes here with the GEMM and convolution they reuse. int32 accumulation
# of zero-point-shifted operands, then the reference's requantization: the real value in float64,
# divided by y's scale in float32, rounded half to even, shifted by y's zero point, saturated.
def _f64(v):
    return te.cast(te.cast(v, "float32"), "float64")


def _per(p: Tensor, i):
    """A scale or zero point: per tensor, or its entry i (per row / column / output channel)."""
    return p[(i if math.prod(p.shape) > 1 else 0,) * p.ndim] if p.ndim else p[()]


def _requantize(real, ys: Tensor, yz: Tensor):
    from ember.ops.quant import int_range

    lo, hi = int_range(yz.dtype.name)
    q = te.round(te.cast(real, "float32") / te.cast(_per(ys, 0), "float32"))
    v = te.cast(q, "float64") + te.cast(_per(yz, 0), "float64")
    return te.cast(te.minimum(te.maximum(v, float(lo)), float(hi)), yz.dtype)


def _shifted(zp: Tensor):
    return lambda v, i: te.cast(v, "int32") - te.cast(_per(zp, i), "int32")


def _qlinear_matmul_compute(a: dict, x, xs, xz, w, ws, wz, ys, yz) -> Tensor:
    if not all(p.dtype.is_float for p in (xs, ws, ys)):
        raise NotLowerable("QLinearMatMul with non-float scales")

    def post(v, i, j):
        return _requantize(te.cast(v, "float64") * _f64(_per(xs, i)) * _f64(_per(ws, j)), ys, yz)

    return matmul_te(x, w, dtype="int32", pre_x=_shifted(xz), pre_y=_shifted(wz), post=post, name="qlinear_matmul")


def _qlinear_conv_compute(a: dict, x, xs, xz, w, ws, wz, ys, yz, b=None) -> Tensor:
    if x.ndim < 3 or not all(p.dtype.is_float for p in (xs, ws, ys)):
        raise NotLowerable("QLinearConv needs a spatial dimension and float scales")
    x_zero = _shifted(xz)

    def w_at(o, c, k):
        return te.cast(w[(o, c, *k)], "int32") - te.cast(_per(wz, o), "int32")

    def post(v, co):
        return _requantize(te.cast(v, "float64") * _f64(_per(xs, 0)) * _f64(_per(ws, co)), ys, yz)

    return conv_te(x, w, b, a, "int32", lambda *i: x_zero(x[i], 0), w_at, post=post, name="qlinear_conv")


def _attach_quantized() -> None:
    from ember.ops import quant  # noqa: F401  (imports this module: only once it is complete)

    lowering("QLinearMatMul", schedule=T.schedule_nn)(_qlinear_matmul_compute)
    lowering("QLinearConv", schedule=T.schedule_nn)(_qlinear_conv_compute)


_attach_quantized()
