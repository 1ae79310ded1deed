"""The Softmax family, which normalizes along one axis: Softmax, LogSoftmax, Hardmax (entries,
references, TE computes). The computes subtract the row max before exp (numerically stable) and
run on the row template of `ember.templates.nn` through `ember.ops.rows`."""

from __future__ import annotations

import numpy as np

from ember import te
from ember.graph.types import TensorType
from ember.ops.common import norm_axis
from ember.ops.opdef import Attr, Pattern, op
from ember.ops.rows import RowStats
from ember.ops.te_lib import NotLowerable, lowering
from ember.te.config import CONFIG_ATTR
from ember.te.tensor import Tensor
from ember.templates import nn as T


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


# -- TE computes: the row template (`ember.ops.rows`), as the normalizations ------------------------------
# The row max as a compare and a select: one vector blend a step where te.max propagates NaN in four (the max
# chain of a row is the latency of its first pass). A NaN it skips still makes the row NaN, as in numpy: the
# sum of exp(x - max) takes it in, and every element is divided by that sum (LogSoftmax: subtracts its log).
ROW_MAX = te.comm_reducer(lambda a, b: te.if_then_else(a < b, b, a), te.max.identity, "row_max")


def _softmax_family(kind: str, a: dict, x: Tensor) -> Tensor:
    """Numerically stable: the row max is subtracted before exp. Per row: the max (in `acc` vectors of partial
    maxima, combined in a lane tree), exp(x - max) into a row buffer, its sum, one reciprocal, the scaled output;
    the rows template's knobs (`row_knobs`: acc, unroll) come from a tuning config. The exp is the intrinsic: the
    renderer picks how a vector of them is computed (inline arithmetic on C, with a 2^n table on LLVM:
    `ember.codegen.vmath`)."""
    if not x.dtype.is_float:
        raise NotLowerable(f"{kind} on {x.dtype}")
    axis = norm_axis(a["axis"], x.ndim)
    knobs = T.row_knobs(a.get(CONFIG_ATTR), x.shape[axis], x.dtype) if axis == x.ndim - 1 else (1, 1)
    st = RowStats(x.shape, (axis,), knobs)
    m = st.reduce(lambda i: x[i], te.max if kind == "Hardmax" else ROW_MAX, x.dtype, "sm_max")  # argmax: NaN wins
    if kind == "Hardmax":
        first = st.reduce(lambda i: te.if_then_else(x[i] == m(i), i[axis], te.const(x.shape[axis])), te.min,
                          x.dtype, "hm_first")  # fmt: skip
        return te.compute(x.shape, lambda *i: te.cast(i[axis] == first(i), x.dtype), name="hardmax", attrs=st.attrs)
    n, lanes = x.shape[axis], T.lanes_of(x.dtype, T.host_target())
    tail = st.k is not None and axis == x.ndim - 1 and isinstance(n, int) and n > lanes and n % lanes and lanes > 1
    if kind == "LogSoftmax":  # (a row with a tail: its exps in a buffer, so that the tail's are a vector too)
        at = _exp_row_with_vector_tail(x, m, n, lanes)[1] if tail else (lambda i: te.exp(x[i] - m(i)))
        total = st.reduce(at, te.sum, x.dtype, "lsm_sum")
        shift = st.stage(lambda i: m(i) + te.log(total(i)), "lsm_shift")
        return te.compute(x.shape, lambda *i: x[i] - shift(i), name="log_softmax", attrs=st.attrs)
    if tail:
        e, at = _exp_row_with_vector_tail(x, m, n, lanes)
    elif st.k is not None:
        e = T.row_buffer(x.shape, lambda *i: te.exp(x[i] - m(i)), "sm_exp")
        at = e.__getitem__
    else:
        e = te.compute(x.shape, lambda *i: te.exp(x[i] - m(i)), name="sm_exp", attrs={"materialize": True})
        at = e.__getitem__
    if x.dtype.is_half:  # as numpy: the sum accumulated in float32 and rounded once, then one division per element
        wide = st.reduce(lambda i: te.cast(at(i), "float32"), te.sum, "float32", "sm_sum")
        total = st.stage(lambda i: te.cast(wide(i), x.dtype), "sm_total")
        return te.compute(x.shape, lambda *i: at(i) / total(i), name="softmax", attrs=st.attrs)
    total = st.reduce(at, te.sum, x.dtype, "sm_sum")
    rcp = st.stage(lambda i: te.const(1.0, x.dtype) / total(i), "sm_rcp")
    return te.compute(x.shape, lambda *i: at(i) * rcp(i), name="softmax", attrs=st.attrs)


def _exp_row_with_vector_tail(x: Tensor, m, n: int, lanes: int):
    """The row buffer of exp(x - max) for rows of n elements, n not a multiple of the lanes: whole vectors, then
    one more vector for the last `lanes` elements of the row (it overlaps the one before), so that every exp is a
    vector one (a scalar tail would call the C library's expf per element). Returns the buffer and the reader of
    element l of a row (before the tail: itself; in it: its place in the last vector)."""
    full = n // lanes * lanes
    shift = full + lanes - n  # element l >= full sits at l + shift

    def column(i):  # the x column of buffer position i[-1]
        return (*i[:-1], te.if_then_else(i[-1] < full, i[-1], i[-1] - shift))

    e = T.row_buffer((*x.shape[:-1], full + lanes), lambda *i: te.exp(x[column(i)] - m(i)), "sm_exp")
    return e, lambda i: e[(*i[:-1], te.if_then_else(i[-1] < full, i[-1], i[-1] + shift))]


for _kind in ("Softmax", "LogSoftmax", "Hardmax"):
    lowering(_kind, schedule=T.schedule_nn)(lambda a, x, _kind=_kind: _softmax_family(_kind, a, x))
