"""Normalizations: BatchNormalization, InstanceNormalization, LayerNormalization, RMSNormalization,
GroupNormalization, LpNormalization, MeanVarianceNormalization, LRN (entries, references, computes).

References accumulate in float64 for float inputs; the computes reduce rows with `ember.ops.rows`."""

from __future__ import annotations

import math

import numpy as np

from ember import te
from ember.graph.types import TensorType
from ember.ops.common import ShapeError, acc_array, broadcast_shapes, norm_axes, norm_axis
from ember.ops.opdef import Attr, Pattern, op
from ember.ops.rows import RowStats, unravel
from ember.ops.te_lib import NotLowerable, broadcast_indices, lowering, numel
from ember.te.config import CONFIG_ATTR
from ember.te.tensor import Tensor
from ember.templates import nn as T


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
    xd = acc_array(x)
    if a["training_mode"]:
        axes = (0,) + tuple(range(2, x.ndim))
        bmean, bvar = xd.mean(axis=axes), xd.var(axis=axes)
        y = (xd - bmean.reshape(shape)) / np.sqrt(bvar.reshape(shape) + a["epsilon"])
        y = y * scale.reshape(shape) + bias.reshape(shape)
        m = a["momentum"]
        run_mean = mean * m + bmean * (1 - m)
        run_var = var * m + bvar * (1 - m)
        return y.astype(x.dtype), run_mean.astype(mean.dtype), run_var.astype(var.dtype)
    y = (xd - mean.reshape(shape)) / np.sqrt(acc_array(var).reshape(shape) + a["epsilon"])
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
    st = RowStats(x.shape, tuple(d for d in range(x.ndim) if d != 1))
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
    xd = acc_array(x)
    y = (xd - xd.mean(axis=axes, keepdims=True)) / np.sqrt(xd.var(axis=axes, keepdims=True) + a["epsilon"])
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return (y * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype)


@lowering("InstanceNormalization", schedule=T.schedule_nn)
def _instance_norm_compute(a: dict, x: Tensor, scale: Tensor, bias: Tensor) -> Tensor:
    if not x.dtype.is_float:
        raise NotLowerable(f"InstanceNormalization on {x.dtype}")
    st = RowStats(x.shape, tuple(range(2, x.ndim)))
    mean, inv = _mean_inv(st, lambda i: x[i], x.dtype, a["epsilon"], "in")
    return te.compute(x.shape, lambda *i: (x[i] - mean(i)) * inv(i) * scale[i[1]] + bias[i[1]],
                      name="instance_norm", attrs=st.attrs)  # fmt: skip


def _mean_inv(st: RowStats, at, dtype, eps: float, name: str):
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
    xd = acc_array(x)
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
    st = RowStats(x.shape, tuple(range(axis, x.ndim)), T.row_knobs(a.get(CONFIG_ATTR), numel(x.shape[axis:]), x.dtype))
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
    xd = acc_array(x)
    rms = np.sqrt(np.mean(xd * xd, axis=axes, keepdims=True) + a["epsilon"])
    return (xd / rms * scale).astype(x.dtype)


@lowering("RMSNormalization", schedule=T.schedule_nn)
def _rms_norm_compute(a: dict, x: Tensor, scale: Tensor) -> Tensor:
    if not x.dtype.is_float:
        raise NotLowerable(f"RMSNormalization on {x.dtype}")
    axis = norm_axis(a["axis"], x.ndim)
    st = RowStats(x.shape, tuple(range(axis, x.ndim)), T.row_knobs(a.get(CONFIG_ATTR), numel(x.shape[axis:]), x.dtype))
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
    xg = acc_array(x).reshape(n, g, -1)
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
        j = unravel(l, inner)
        return x[(r[0], r[1] * cg + j[0], *j[1:])]

    view = RowStats((n, g, math.prod(inner)), (2,))
    mean, inv = _mean_inv(view, lambda i: at(i[:2], i[2]), x.dtype, a["epsilon"], "gn")

    def y(*i):
        r = (i[0], i[1] // cg, te.const(0))
        return (x[i] - mean(r)) * inv(r) * scale[i[1]] + bias[i[1]]

    return te.compute(x.shape, y, name="group_norm", attrs={"template": "rows", "rows": 1})


@op("LpNormalization", Pattern.OPAQUE, infer=lambda a, x: x, attrs=[Attr("axis", "int", -1), Attr("p", "int", 2)])
def lp_norm(a: dict, x: np.ndarray) -> np.ndarray:
    axis = norm_axis(a["axis"], x.ndim)
    xd = acc_array(x)
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
    st = RowStats(x.shape, (norm_axis(a["axis"], x.ndim),))
    p = a["p"]
    red = st.reduce(lambda i: te.abs(x[i]) if p == 1 else x[i] * x[i], te.sum, x.dtype, "lpn_sum")
    norm = st.stage(lambda i: red(i) if p == 1 else te.sqrt(red(i)), "lpn_norm")
    zero = T.zero(x.dtype)
    return te.compute(x.shape, lambda *i: te.if_then_else(norm(i) == zero, zero, x[i] / norm(i)), name="lp_norm",
                      attrs=st.attrs)  # fmt: skip


@op("MeanVarianceNormalization", Pattern.OPAQUE, infer=lambda a, x: x, attrs=[Attr("axes", "ints", (0, 2, 3))])
def mvn(a: dict, x: np.ndarray) -> np.ndarray:
    axes = norm_axes(a["axes"], x.ndim)
    xd = acc_array(x)
    mean = xd.mean(axis=axes, keepdims=True)
    return ((xd - mean) / (np.sqrt(((xd - mean) ** 2).mean(axis=axes, keepdims=True)) + 1e-9)).astype(x.dtype)


@lowering("MeanVarianceNormalization", schedule=T.schedule_nn)
def _mvn_compute(a: dict, x: Tensor) -> Tensor:
    if not x.dtype.is_float:
        raise NotLowerable(f"MeanVarianceNormalization on {x.dtype}")
    st = RowStats(x.shape, norm_axes(a["axes"], x.ndim))
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
    sq = np.square(acc_array(x))
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
