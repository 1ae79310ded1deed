"""Reductions and ops that normalize along an axis: Reduce*, Arg*, Softmax family, TopK, Cum*."""

from __future__ import annotations

import numpy as np

from ember.graph.types import TensorType
from ember.ops.common import ShapeError, norm_axes, norm_axis, reduced_shape
from ember.ops.opdef import Attr, OpDef, Pattern, op, register

R = Pattern.REDUCTION
AXES_ATTRS = (Attr("axes", "ints"), Attr("keepdims", "int", 1))


def _reduce_infer(a: dict, x: TensorType) -> TensorType:
    axes = norm_axes(a["axes"], x.rank)
    return x.with_shape(reduced_shape(x.shape, axes, bool(a["keepdims"])))


def _identity_of(x: np.ndarray, kind: str) -> float | int:
    """The value a reduction of an empty set gives."""
    floating = np.issubdtype(x.dtype, np.floating) or x.dtype.name == "bfloat16"
    if x.dtype == np.bool_:
        return kind != "max"
    if kind == "max":
        return -np.inf if floating else np.iinfo(x.dtype).min
    return np.inf if floating else np.iinfo(x.dtype).max


def _log_sum_exp(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    if x.size == 0:
        return np.log(np.sum(np.exp(x), axis=axis, keepdims=keepdims))
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


# name -> f(x, axes, keepdims); accumulation is in float64 for low-precision floats.
REDUCERS = {
    "ReduceSum": lambda x, ax, k: np.sum(x, axis=ax, keepdims=k),
    "ReduceMean": lambda x, ax, k: np.mean(x, axis=ax, keepdims=k),
    "ReduceMax": lambda x, ax, k: np.max(x, axis=ax, keepdims=k, initial=_identity_of(x, "max")),
    "ReduceMin": lambda x, ax, k: np.min(x, axis=ax, keepdims=k, initial=_identity_of(x, "min")),
    "ReduceProd": lambda x, ax, k: np.prod(x, axis=ax, keepdims=k),
    "ReduceL1": lambda x, ax, k: np.sum(np.abs(x), axis=ax, keepdims=k),
    "ReduceL2": lambda x, ax, k: np.sqrt(np.sum(np.square(x), axis=ax, keepdims=k)),
    "ReduceLogSum": lambda x, ax, k: np.log(np.sum(x, axis=ax, keepdims=k)),
    "ReduceLogSumExp": _log_sum_exp,
    "ReduceSumSquare": lambda x, ax, k: np.sum(np.square(x), axis=ax, keepdims=k),
}


def _reduce_entry(name: str, fn) -> OpDef:
    def reference(a: dict, x: np.ndarray) -> tuple[np.ndarray]:
        axes = norm_axes(a["axes"], x.ndim)
        wide = x.astype(np.float32) if x.dtype.name in ("float16", "bfloat16") else x
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            out = fn(wide, axes, bool(a["keepdims"]))
        return (np.asarray(out).astype(x.dtype),)

    return OpDef(name, R, AXES_ATTRS, infer=_reduce_infer, reference=reference)


for _name, _fn in REDUCERS.items():
    register(_reduce_entry(_name, _fn))


# -- ArgMax / ArgMin -------------------------------------------------------------------------
ARG_ATTRS = (Attr("axis", "int", 0), Attr("keepdims", "int", 1), Attr("select_last_index", "int", 0))


def _arg_infer(a: dict, x: TensorType) -> TensorType:
    axis = norm_axis(a["axis"], x.rank)
    return TensorType(reduced_shape(x.shape, (axis,), bool(a["keepdims"])), "int64")


def _arg_entry(name: str, fn) -> OpDef:
    def reference(a: dict, x: np.ndarray) -> tuple[np.ndarray]:
        axis = norm_axis(a["axis"], x.ndim)
        if a["select_last_index"]:
            idx = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis)
        else:
            idx = fn(x, axis=axis)
        if a["keepdims"]:
            idx = np.expand_dims(idx, axis)
        return (np.asarray(idx).astype(np.int64),)

    return OpDef(name, R, ARG_ATTRS, infer=_arg_infer, reference=reference)


register(_arg_entry("ArgMax", np.argmax))
register(_arg_entry("ArgMin", np.argmin))


# -- Softmax family (normalize along one axis) --------------------------------------------------
def _axis_infer(a: dict, x: TensorType) -> TensorType:
    norm_axis(a["axis"], x.rank)
    return x


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


@op("Softmax", Pattern.OPAQUE, infer=_axis_infer, attrs=[Attr("axis", "int", -1)])
def softmax(a: dict, x: np.ndarray) -> np.ndarray:
    return _softmax(x, norm_axis(a["axis"], x.ndim)).astype(x.dtype)


@op("LogSoftmax", Pattern.OPAQUE, infer=_axis_infer, attrs=[Attr("axis", "int", -1)])
def log_softmax(a: dict, x: np.ndarray) -> np.ndarray:
    axis = norm_axis(a["axis"], x.ndim)
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return (shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))).astype(x.dtype)


@op("Hardmax", Pattern.OPAQUE, infer=_axis_infer, attrs=[Attr("axis", "int", -1)])
def hardmax(a: dict, x: np.ndarray) -> np.ndarray:
    axis = norm_axis(a["axis"], x.ndim)
    idx = np.expand_dims(np.argmax(x, axis=axis), axis)
    out = np.zeros_like(x)
    np.put_along_axis(out, idx, 1, axis=axis)
    return out


# -- TopK ----------------------------------------------------------------------------------------
def _topk_infer(a: dict, x: TensorType) -> tuple[TensorType, TensorType]:
    axis = norm_axis(a["axis"], x.rank)
    if not 0 <= a["k"] <= x.shape[axis]:
        raise ShapeError(f"TopK k={a['k']} is out of range for axis {axis} of length {x.shape[axis]}")
    shape = tuple(a["k"] if i == axis else d for i, d in enumerate(x.shape))
    return TensorType(shape, x.dtype), TensorType(shape, "int64")


def stable_argsort(x: np.ndarray, axis: int, descending: bool) -> np.ndarray:
    """Argsort with ties broken by lower index first, in either direction."""
    if not descending:
        return np.argsort(x, axis=axis, kind="stable")
    n = x.shape[axis]
    return n - 1 - np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)


@op("TopK", Pattern.OPAQUE, infer=_topk_infer,
    attrs=[Attr("k", "int"), Attr("axis", "int", -1), Attr("largest", "int", 1), Attr("sorted", "int", 1)])  # fmt: skip
def topk(a: dict, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The k largest (or smallest) along axis, sorted; ties keep the lower index first."""
    axis = norm_axis(a["axis"], x.ndim)
    order = stable_argsort(x, axis, bool(a["largest"]))
    idx = np.take(order, np.arange(a["k"]), axis=axis)
    return np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)


# -- CumSum / CumProd --------------------------------------------------------------------------
CUM_ATTRS = (Attr("axis", "int"), Attr("exclusive", "int", 0), Attr("reverse", "int", 0))


def _cum_entry(name: str, fn, unit: int) -> OpDef:
    def reference(a: dict, x: np.ndarray) -> tuple[np.ndarray]:
        axis = norm_axis(a["axis"], x.ndim)
        y = np.flip(x, axis) if a["reverse"] else x
        out = fn(y, axis=axis, dtype=x.dtype)
        if a["exclusive"]:
            pad = np.full_like(np.take(out, [0], axis=axis), unit)
            out = np.concatenate([pad, np.take(out, np.arange(out.shape[axis] - 1), axis=axis)], axis=axis)
        return (np.flip(out, axis) if a["reverse"] else out,)

    return OpDef(name, Pattern.OPAQUE, CUM_ATTRS, infer=_axis_infer_cum, reference=reference)


def _axis_infer_cum(a: dict, x: TensorType) -> TensorType:
    norm_axis(a["axis"], x.rank)
    return x


register(_cum_entry("CumSum", np.cumsum, 0))
register(_cum_entry("CumProd", np.cumprod, 1))
