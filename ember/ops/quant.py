"""Quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear (QLinearMatMul and
QLinearConv: `ember.ops.qlinear`).

Scales and zero points are per tensor (scalars), per axis (1-d along `axis`) or blocked
(same rank as the input, each entry covering `block_size` elements along `axis`)."""

from __future__ import annotations

import numpy as np

from ember import te
from ember.graph.types import TensorType, is_float, np_dtype
from ember.ops.common import ShapeError, norm_axis
from ember.ops.elemwise import TE_DTYPES, cast_array
from ember.ops.opdef import Attr, Pattern, op
from ember.ops.reduce import reduce_te, schedule_reduce
from ember.ops.te_lib import NotLowerable, lowering
from ember.tir import expr as tx
from ember.tir.dtype import NARROW_DTYPES

_INT_RANGES = {"int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1), "uint2": (0, 3)}


def int_range(dtype: str) -> tuple[int, int]:
    if dtype in _INT_RANGES:
        return _INT_RANGES[dtype]
    info = np.iinfo(np_dtype(dtype))
    return int(info.min), int(info.max)


def expand_param(p: np.ndarray, shape: tuple[int, ...], axis: int, block: int) -> np.ndarray:
    """A scale or zero point broadcast to the input shape (per tensor, per axis or blocked)."""
    if p.size == 1 and p.ndim <= 1:
        return p.reshape(())
    if block:
        return np.take(np.repeat(p, block, axis=axis), np.arange(shape[axis]), axis=axis)
    return p.reshape([-1 if i == axis else 1 for i in range(len(shape))])


def quantize(x: np.ndarray, scale: np.ndarray, zp: np.ndarray | float, dtype: str, saturate: bool = True) -> np.ndarray:
    """round(x / scale) + zero point, saturated to dtype (no rounding for float targets)."""
    q = (x.astype(np.float32) / scale.astype(np.float32)).astype(np.float64)  # float32, as runtimes do
    if is_float(dtype):
        return cast_array((q + np.asarray(zp, np.float64)).astype(np.float32), dtype, saturate)
    lo, hi = int_range(dtype)
    return np.clip(np.rint(q) + np.asarray(zp).astype(np.float64), lo, hi).astype(np_dtype(dtype))


QUANT_ATTRS = [Attr("axis", "int", 1), Attr("block_size", "int", 0), Attr("output_dtype", "dtype", None),
               Attr("saturate", "int", 1), Attr("precision", "int", 0)]  # fmt: skip


def _axis(a: dict, x: np.ndarray, scale: np.ndarray) -> int:
    """The quantization axis; it matters only when the scale is not a scalar."""
    return 0 if scale.size == 1 and scale.ndim <= 1 else norm_axis(a["axis"], x.ndim)


def _check_param(name: str, x: TensorType, p: TensorType, a: dict) -> None:
    if p.size == 1 and p.rank <= 1:
        return
    axis = norm_axis(a["axis"], x.rank)
    if a["block_size"]:
        want = tuple(-(-d // a["block_size"]) if i == axis else d for i, d in enumerate(x.shape))
        if p.shape != want:
            raise ShapeError(f"blocked {name} must have shape {list(want)} for {x}, got {p}")
    elif p.shape != (x.shape[axis],):
        raise ShapeError(f"per-axis {name} must have shape [{x.shape[axis]}] for axis {axis} of {x}, got {p}")


def _quantize_infer(a: dict, x: TensorType, scale: TensorType, zp: TensorType | None = None) -> TensorType:
    _check_param("scale", x, scale, a)
    dtype = zp.dtype if zp is not None else (a["output_dtype"] or "uint8")
    return x.with_dtype(dtype)


@op("QuantizeLinear", Pattern.ELEMWISE, infer=_quantize_infer, inputs=(2, 3), attrs=QUANT_ATTRS)
def quantize_linear(a: dict, x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None = None) -> np.ndarray:
    axis = _axis(a, x, scale)
    dtype = zp.dtype.name if zp is not None else (a["output_dtype"] or "uint8")
    s = expand_param(scale, x.shape, axis, a["block_size"])
    z = 0.0 if zp is None else expand_param(zp.astype(np.float64), x.shape, axis, a["block_size"])
    return quantize(x, s, z, dtype, bool(a["saturate"]))


def param_at(p: te.Tensor, idx: tuple, x: te.Tensor, a: dict) -> tx.Expr:
    """The scale or zero point that applies to element idx of x (per tensor, per axis or blocked)."""
    if int(np.prod(p.shape)) == 1 and p.ndim <= 1:
        return p[(0,) * p.ndim]
    axis = norm_axis(a["axis"], x.ndim)
    if a["block_size"]:
        return p[tuple(i // a["block_size"] if d == axis else i for d, i in enumerate(idx))]
    return p[idx[axis]]


def _f64(v: tx.Expr) -> tx.Expr:
    """v in float64 by way of float32, as the references widen their operands (8- and 16-bit integers by way of int32:
    the same value, and C converts those vectors in one instruction where uint8 -> float goes lane by lane)."""
    if v.dtype.name in ("int8", "uint8", "int16", "uint16"):
        return te.cast(te.cast(v, "int32"), "float64")
    return te.cast(te.cast(v, "float32"), "float64")


@lowering("QuantizeLinear")
def _(a: dict, x: te.Tensor, scale: te.Tensor, zp: te.Tensor | None = None) -> te.Tensor:
    dtype = zp.dtype.name if zp is not None else (a["output_dtype"] or "uint8")
    if dtype not in TE_DTYPES + NARROW_DTYPES or dtype == "bool" or (is_float(dtype) and dtype not in NARROW_DTYPES):
        raise NotLowerable(f"QuantizeLinear to {dtype}")
    if is_float(dtype):
        return _quantize_float(a, x, scale, zp, dtype)
    lo, hi = int_range(dtype)

    def body(*i):
        q = te.cast(x[i], "float32") / te.cast(param_at(scale, i, x, a), "float32")  # float32, as runtimes do
        # 8 and 16 bits: float32 is exact up to 2^24, past which the clip saturates anyway; C converts and compares
        # float32 vectors in one instruction each (float64 compares and float -> 8 bits go lane by lane)
        small = dtype in ("int8", "uint8", "int16", "uint16")
        wide = "float32" if small else "float64"
        r = te.cast(te.round(q), wide)
        if zp is not None:
            r = r + te.cast(te.cast(param_at(zp, i, x, a), "int32") if small else param_at(zp, i, x, a), wide)
        clipped = tx.binop("min", te.const(float(hi), wide), tx.binop("max", te.const(float(lo), wide), r))
        return te.cast(te.cast(clipped, "int32"), dtype) if small else te.cast(clipped, dtype)

    return te.compute(x.shape, body, name="quantize")


def _quantize_float(a: dict, x: te.Tensor, scale: te.Tensor, zp: te.Tensor | None, dtype: str) -> te.Tensor:
    """x / scale in float32 converted to a float8/float4 format: no rounding to integers, `saturate` as Cast's;
    the zero point is added for float4 only (onnx's reference ignores float8 zero points, which must be 0)."""

    def body(*i):
        q = te.cast(x[i], "float32") / te.cast(param_at(scale, i, x, a), "float32")
        if zp is not None and dtype == "float4_e2m1fn":
            q = q + te.cast(param_at(zp, i, x, a), "float32")
        return te.cast(q, dtype, saturate=bool(a["saturate"]))

    return te.compute(x.shape, body, name="quantize")


def _dequantize_infer(a: dict, x: TensorType, scale: TensorType, zp: TensorType | None = None) -> TensorType:
    _check_param("scale", x, scale, a)
    return x.with_dtype(a["output_dtype"] or scale.dtype)


@op("DequantizeLinear", Pattern.ELEMWISE, infer=_dequantize_infer, inputs=(2, 3), attrs=QUANT_ATTRS)
def dequantize_linear(a: dict, x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None = None) -> np.ndarray:
    """(x - zero_point) * scale, in the scale's dtype (or output_dtype)."""
    axis = _axis(a, x, scale)
    xf = x.astype(np.float32).astype(np.float64)
    if zp is not None and not is_float(x.dtype.name):  # float8/float4 zero points are ignored, as onnx's reference
        xf = xf - expand_param(zp.astype(np.float32).astype(np.float64), x.shape, axis, a["block_size"])
    s = expand_param(scale.astype(np.float64), x.shape, axis, a["block_size"])
    return (xf * s).astype(np_dtype(a["output_dtype"] or scale.dtype.name))


@lowering("DequantizeLinear")
def _(a: dict, x: te.Tensor, scale: te.Tensor, zp: te.Tensor | None = None) -> te.Tensor:
    dtype = a["output_dtype"] or scale.dtype.name
    if dtype not in TE_DTYPES:
        raise NotLowerable(f"DequantizeLinear to {dtype}")

    # 8 and 16 bits to float32 with a float32 scale: x - zp is exact in float32 (below 2^17) and so is the product
    # in float64 (41 bits), so float32 arithmetic rounds the one product exactly as the float64 reference does
    small = x.dtype.name in ("int8", "uint8", "int16", "uint16") and scale.dtype.name == dtype == "float32"
    wide = "float32" if small else "float64"

    def body(*i):
        v = te.cast(te.cast(x[i], "int32"), "float32") if small else _f64(x[i])
        if zp is not None and not is_float(x.dtype.name):  # float8/float4: ignored, as in the reference
            v = v - (te.cast(te.cast(param_at(zp, i, x, a), "int32"), "float32") if small else
                     _f64(param_at(zp, i, x, a)))  # fmt: skip
        return te.cast(v * te.cast(param_at(scale, i, x, a), wide), dtype)

    return te.compute(x.shape, body, name="dequantize")


def _dyn_quant_infer(a: dict, x: TensorType) -> tuple[TensorType, TensorType, TensorType]:
    return x.with_dtype("uint8"), TensorType((), "float32"), TensorType((), "uint8")


@op("DynamicQuantizeLinear", Pattern.OPAQUE, infer=_dyn_quant_infer)
def dynamic_quantize_linear(a: dict, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """uint8 quantization with the scale and zero point computed from the data range (incl. 0)."""
    lo, hi = min(0.0, float(x.min(initial=0))), max(0.0, float(x.max(initial=0)))
    scale = np.float32((hi - lo) / 255)
    zp = np.clip(np.rint(-lo / scale), 0, 255) if scale else 0.0
    y = quantize(x, np.array(scale), zp, "uint8") if scale else np.zeros(x.shape, np.uint8)
    return y, np.array(scale, np.float32), np.array(zp, np.uint8)


@lowering("DynamicQuantizeLinear", schedule=schedule_reduce)
def _(a: dict, x: te.Tensor) -> list[te.Tensor]:
    """The data range (with 0) in float64 as the reference, scale = range / 255 rounded to float32, then
    QuantizeLinear's arithmetic; a zero range gives zeros."""
    if x.dtype.name != "float32":
        raise NotLowerable(f"DynamicQuantizeLinear on {x.dtype}")
    axes = tuple(range(x.ndim))
    lo = tx.binop("min", te.const(0.0, "float32"), reduce_te(x, axes, False, te.min, name="dql_min")[()])
    hi = tx.binop("max", te.const(0.0, "float32"), reduce_te(x, axes, False, te.max, name="dql_max")[()])
    scale = te.compute((), lambda: te.cast((te.cast(hi, "float64") - te.cast(lo, "float64")) / 255.0, "float32"),
                       name="dql_scale")  # fmt: skip

    def clip255(v: tx.Expr) -> tx.Expr:
        return tx.binop("min", te.const(255.0, "float64"), tx.binop("max", te.const(0.0, "float64"), v))

    s = scale[()]
    zp_f = te.if_then_else(s == 0.0, te.const(0.0, "float64"),
                           clip255(te.round(-te.cast(lo, "float64") / te.cast(s, "float64"))))  # fmt: skip
    zp = te.compute((), lambda: te.cast(zp_f, "uint8"), name="dql_zero_point")

    def body(*i):
        q = te.cast(te.round(x[i] / s), "float64") + te.cast(zp[()], "float64")
        return te.if_then_else(s == 0.0, te.const(0, "uint8"), te.cast(clip255(q), "uint8"))

    return [te.compute(x.shape, body, name="dql_y"), scale, zp]
