"""Pooling: MaxPool, AveragePool, LpPool and their global forms (entries, references, computes).

Windowed pools use the window-reduction templates of `ember.templates.nn`; global pools reduce the
spatial axes with the row statistics of `ember.ops.rows`."""

from __future__ import annotations

import math

import numpy as np

from ember import te
from ember.graph.types import TensorType
from ember.ops.common import ShapeError, acc_array, spatial_attrs, window_out_dim
from ember.ops.opdef import Attr, Pattern, op
from ember.ops.rows import RowStats
from ember.ops.te_lib import NotLowerable, lowering
from ember.te.tensor import Tensor
from ember.templates import nn as T

# -- pooling ----------------------------------------------------------------------------------------
POOL_ATTRS = [
    Attr("kernel_shape", "ints"), Attr("strides", "ints"), Attr("pads", "ints"), Attr("dilations", "ints"),
    Attr("ceil_mode", "int", 0),
]  # fmt: skip


def pool_dims(a: dict, shape: tuple[int, ...]) -> list[int]:
    nd = len(a["kernel_shape"])
    strides, pads, dil = spatial_attrs(a, nd)
    ceil, kernel = bool(a["ceil_mode"]), a["kernel_shape"]
    return [window_out_dim(shape[2 + i], kernel[i], strides[i], (pads[i], pads[i + nd]), dil[i], ceil)
            for i in range(nd)]  # fmt: skip


def _pool_infer(a: dict, x: TensorType) -> TensorType:
    if x.rank != len(a["kernel_shape"]) + 2:
        raise ShapeError(f"pool kernel {list(a['kernel_shape'])} does not fit input {x}")
    return x.with_shape(x.shape[:2] + tuple(pool_dims(a, x.shape)))


def pool_windows(x: np.ndarray, a: dict, fill: float) -> tuple[np.ndarray, list[int]]:
    """All windows stacked on a new leading axis K: (K, N, C, *out); outside cells hold `fill`."""
    nd = len(a["kernel_shape"])
    strides, pads, dil = spatial_attrs(a, nd)
    out = pool_dims(a, x.shape)
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
    strides, pads, dil = spatial_attrs(a, nd)
    out = pool_dims(a, x.shape)
    ks = a["kernel_shape"]
    extra = [max(0, (out[i] - 1) * strides[i] + dil[i] * (ks[i] - 1) + 1 - x.shape[2 + i] - pads[i] - pads[i + nd])
             for i in range(nd)]  # fmt: skip
    dtype = dtype or x.dtype
    # the padded input is materialized once: window reads in vectors then need no bounds test per element
    xp = T.pad_input(lambda *i: x[i], x.shape, pads[:nd], [pads[nd + i] + extra[i] for i in range(nd)],
                     te.const(pad_value, dtype), dtype, name=f"{name}_pad", materialize=True)  # fmt: skip
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
    wins, extra = pool_windows(acc_array(x), a, 0.0)
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
    wins, _ = pool_windows(np.abs(acc_array(x)), a, 0.0)
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
    return np.mean(acc_array(x), axis=_spatial_axes(x), keepdims=True).astype(x.dtype)


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
    return (np.sum(np.abs(acc_array(x)) ** p, axis=_spatial_axes(x), keepdims=True) ** (1.0 / p)).astype(x.dtype)


@lowering("GlobalLpPool", schedule=T.schedule_nn)
def _global_lp_pool_compute(a: dict, x: Tensor) -> Tensor:
    if not x.dtype.is_float:
        raise NotLowerable(f"GlobalLpPool on {x.dtype}")
    p = a["p"]
    return _global_pool_te(x, te.sum, lambda v: _lp_pre(v, p), lambda v: _lp_root(v, p), "global_lppool")


def _global_pool_te(x: Tensor, reducer, pre, post, name: str) -> Tensor:
    if x.ndim < 2:
        raise NotLowerable(f"{name} needs a channel dimension")
    st = RowStats(x.shape, tuple(range(2, x.ndim)))
    red = st.reduce(lambda i: pre(x[i]) if pre else x[i], reducer, x.dtype, f"{name}_acc")
    shape = x.shape[:2] + (1,) * (x.ndim - 2)
    return te.compute(shape, lambda *i: post(red(i)), name=name, attrs=st.attrs)
