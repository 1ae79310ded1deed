"""Quantized matrix product and convolution: QLinearMatMul, QLinearConv (entries, references, TE computes).

The computes accumulate zero-point-shifted operands in int32, then requantize as the reference does:
the real value in float64, divided by y's scale in float32, rounded half to even, shifted by y's zero
point, saturated."""

from __future__ import annotations

import math

import numpy as np

from ember import te
from ember.graph.types import TensorType
from ember.ops.conv import CONV_ATTRS, conv_infer, conv_nd, conv_te
from ember.ops.matmul import matmul_shape, matmul_te
from ember.ops.opdef import Pattern, op
from ember.ops.quant import int_range, quantize
from ember.ops.te_lib import NotLowerable, lowering
from ember.te.tensor import Tensor
from ember.templates import nn as T

OUT = Pattern.OUT_ELEMWISE_FUSABLE


def _qlinear_params(ps: tuple) -> tuple:
    return tuple(np.asarray(p).astype(np.float64) for p in ps)


def _qmm_infer(a: dict, x, xs, xz, w, ws, wz, ys, yz) -> TensorType:
    return TensorType(matmul_shape(x.shape, w.shape), yz.dtype)


@op("QLinearMatMul", OUT, infer=_qmm_infer, inputs=(8, 8))
def qlinear_matmul(a: dict, x, xs, xz, w, ws, wz, ys, yz) -> np.ndarray:
    """Quantized matmul: dequantize both operands, multiply, requantize to y's scale/zero point."""
    xs, xz_, ws, wz_, ys = _qlinear_params((xs, xz, ws, wz, ys))
    xd = (x.astype(np.float64) - (xz_.reshape(-1, 1) if xz_.ndim and xz_.size > 1 else xz_)) * (
        xs.reshape(-1, 1) if xs.ndim and xs.size > 1 else xs)  # fmt: skip
    wd = (w.astype(np.float64) - wz_) * ws
    return quantize(np.matmul(xd, wd), ys, yz.astype(np.float64), yz.dtype.name)


def _qconv_infer(a: dict, x, xs, xz, w, ws, wz, ys, yz, b=None) -> TensorType:
    return conv_infer(a, x, w).with_dtype(yz.dtype)


@op("QLinearConv", OUT, infer=_qconv_infer, inputs=(8, 9), attrs=CONV_ATTRS)
def qlinear_conv(a: dict, x, xs, xz, w, ws, wz, ys, yz, b=None) -> np.ndarray:
    """Quantized convolution with per-tensor input scale and per-tensor or per-channel weights."""
    xs, xz_, ws, wz_, ys = _qlinear_params((xs, xz, ws, wz, ys))
    per_out = (-1,) + (1,) * (w.ndim - 1)
    xd = (x.astype(np.float64) - xz_) * xs
    wd = (w.astype(np.float64) - wz_.reshape(per_out if wz_.size > 1 else ())) * ws.reshape(
        per_out if ws.size > 1 else ())  # fmt: skip
    y = conv_nd(xd, wd, a)
    if b is not None:
        y = y + (b.astype(np.float64) * xs * ws).reshape((1, -1) + (1,) * (x.ndim - 2))
    return quantize(y, ys, yz.astype(np.float64), yz.dtype.name)


# -- TE computes: the GEMM and convolution of `ember.ops.matmul` and `ember.ops.conv` ----------------------
def _f64(v):
    return te.cast(te.cast(v, "float32"), "float64")


def _per(p: Tensor, i):
    """A scale or zero point: per tensor, or its entry i (per row / column / output channel)."""
    return p[(i if math.prod(p.shape) > 1 else 0,) * p.ndim] if p.ndim else p[()]


def _requantize(real, ys: Tensor, yz: Tensor):
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


lowering("QLinearMatMul", schedule=T.schedule_nn)(_qlinear_matmul_compute)
lowering("QLinearConv", schedule=T.schedule_nn)(_qlinear_conv_compute)
