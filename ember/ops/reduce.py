"""Reductions along axes: Reduce*, Arg*, TopK, Cum*."""

from __future__ import annotations

import math

import numpy as np

from ember import te
from ember.graph.dims import is_static_dim
from ember.graph.types import TensorType
from ember.ops.common import ShapeError, norm_axes, norm_axis, reduced_shape
from ember.ops.elemwise import astype, fcall, nan_max, nan_min
from ember.ops.opdef import Attr, OpDef, Pattern, op, register
from ember.ops.te_lib import NotLowerable, lowering
from ember.target import Target
from ember.templates.flat import schedule_flat
from ember.tir import expr as tx

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


# -- TE computes: a reducer, what it reduces (pre) and what becomes of the result (post) ------------------
RF_LANES = 16  # partial results per row of a row reduction: one AVX-512 vector of float32, two of AVX2


def reduce_te(
    x: te.Tensor, axes: tuple[int, ...], keepdims: bool, reducer: te.Reducer, pre=None, name: str = "reduce"
) -> te.Tensor:
    """reducer(pre(x)) over `axes`, built for `schedule_reduce`."""
    return reduce_source(x.shape, axes, keepdims, reducer, lambda idx: pre(x[idx]) if pre else x[idx], name)


def reduce_source(
    shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool, reducer: te.Reducer, source, name: str = "reduce"
) -> te.Tensor:
    """reducer of source(index) over the `axes` of an index space of `shape`, built for `schedule_reduce`.

    A reduction over trailing axes of at least 2 * RF_LANES elements per output (a row) is computed in two
    stages: `{name}_rf[o, l]` combines the elements l, l + RF_LANES, ... of row o (a vector loop), and
    `{name}[o]` combines those partial results and the row's tail. Other reductions are one stage; its
    `inner_axes` attribute counts the output axes behind the last reduced axis (the loops to vectorize)."""
    nd = len(shape)
    axes = tuple(sorted({a % nd for a in axes})) if nd else ()
    nred = len(axes)
    kept = tuple(shape[d] for d in range(nd) if d not in axes)
    out_shape = tuple(1 if d in axes else shape[d] for d in range(nd)) if keepdims else kept
    static = all(isinstance(shape[a], int | np.integer) for a in axes)
    row = int(np.prod([shape[a] for a in axes], dtype=np.int64)) if static else 0  # symbolic: one stage
    if not axes or axes != tuple(range(nd - nred, nd)) or row < 2 * RF_LANES:
        raxes = {a: te.reduce_axis((0, shape[a]), name=f"r{a}") for a in axes}

        def body(*i):
            kept_idx = iter(i[d] for d in range(nd) if d not in axes) if keepdims else iter(i)
            idx = tuple(raxes[d] if d in axes else next(kept_idx) for d in range(nd))
            return reducer(source(idx), axis=list(raxes.values())) if raxes else source(idx)

        inner = nd - 1 - max(axes) if axes else 0
        return te.compute(out_shape, body, name=name, tag="reduce", attrs={"inner_axes": inner})
    L, red_shape = RF_LANES, shape[nd - nred :]
    main = row // L * L

    def at(o: tuple, k: tx.Expr) -> tx.Expr:
        """source(o..., the k-th element of the row)"""
        idx = []
        for d in reversed(range(nred)):
            idx.append(k if d == 0 else k % red_shape[d])
            k = k // red_shape[d]
        return source(tuple(o) + tuple(reversed(idx)))

    ko = te.reduce_axis((0, main // L), name="ko")
    partial = te.compute(kept + (L,), lambda *i: reducer(at(i[:-1], ko * L + i[-1]), axis=ko), name=name + "_rf",
                         tag="reduce_rf")  # fmt: skip
    t = te.reduce_axis((0, L + row - main), name="t")

    def final(*i):
        o = i[: len(kept)]
        part = partial[o + (tx.binop("min", t.var, L - 1),)]
        if row == main:
            return reducer(part, axis=t)
        tail = at(o, main + tx.binop("max", t - L, 0))  # both sides in bounds: either may be read
        return reducer(te.if_then_else(t < L, part, tail), axis=t)

    return te.compute(out_shape, final, name=name, tag="reduce", attrs={"inner_axes": 0})


def schedule_reduce(attrs: dict, outs: list[te.Tensor], target: Target) -> te.Schedule:
    """Schedule of reductions made by `reduce_te` (and of elementwise stages around them).

    Rows (every reduction over trailing axes): one parallel loop over the outputs computes each row's
    reductions, their partial-result stages vectorized along RF_LANES. Otherwise each reduction runs at root
    with the reduced loops outside the output's inner axes, which are vectorized, and the outer output axes
    (or chunks of the inner ones) in parallel."""
    s = te.create_schedule(outs)
    for st in s.stages:
        if not st.is_placeholder and not st.is_output and not isinstance(st.op.body, te.Reduce):
            st.compute_inline()
    if any(0 in t.shape for t in outs):
        return s  # nothing to compute (and fusing a loop of extent 0 would divide by 0)
    reductions = [st for st in s.stages if not st.is_placeholder and st.op.tag == "reduce"]
    rfs = [st for st in s.stages if not st.is_placeholder and st.op.tag == "reduce_rf"]
    roots = [st for st in s.stages if not st.is_placeholder and st.attach == "root"]
    work = max((te.prod_hint(st.op.shape) for st in s.stages), default=0)
    parallel = work >= 1 << 15 and target.num_cores > 1
    if len(outs) == 1 and reductions and all(st.op.attrs.get("inner_axes") == 0 for st in reductions):
        out = s[outs[0]]
        caches = [s[s.cache_write(st.op.output(), "local")] for st in rfs]  # accumulators in registers
        if out.op.axis:
            loop = out.fuse(*out.op.axis) if len(out.op.axis) > 1 else out.op.axis[0]
            for st in s.stages:
                if getattr(st.op, "tag", "") in ("reduce", "reduce_rf") and st is not out and st.attach != "inline":
                    st.compute_at(out, loop)
            if parallel:
                out.parallel(loop)
        for st in caches:
            _vectorize_rf(st)
        for st in rfs:
            st.vectorize(st.op.axis[-1])
        return s
    for st in roots:
        if st in reductions:
            _schedule_columns(st, target, parallel)
        elif st in rfs:
            _vectorize_rf(st)
        else:
            schedule_flat(st, target)
    return s


def _vectorize_rf(st: te.Stage) -> None:
    lane, ko = st.op.axis[-1], st.op.reduce_axis[0]
    st.reorder(ko, lane)
    st.vectorize(lane)


def _schedule_columns(st: te.Stage, target: Target, parallel: bool) -> None:
    """Loops (outer output axes, reduced axes, inner output axes): the inner ones read consecutive elements."""
    op = st.op
    n_inner = op.attrs.get("inner_axes", 0) if op.tag == "reduce" else 0
    outer, inner = op.axis[: len(op.axis) - n_inner], op.axis[len(op.axis) - n_inner :]
    st.reorder(*outer, *op.reduce_axis, *inner)
    fo = st.fuse(*outer) if len(outer) > 1 else (outer[0] if outer else None)
    fi = st.fuse(*inner) if len(inner) > 1 else (inner[0] if inner else None)
    n_outer = te.prod_hint([iv.dom[1] for iv in outer])
    n_in = te.prod_hint([iv.dom[1] for iv in inner])
    lanes = target.vector_lanes(max(op.dtype.bits, 8))
    if fi is not None and n_in >= lanes:
        jo, ji = st.split(fi, lanes)
        st.vectorize(ji)
        n_vec = -(-n_in // lanes)
        if parallel and n_outer < 2 * target.num_cores and n_vec >= 2 * target.num_cores:
            # too few outer rows: run chunks of columns in parallel (4 per core, so that a tail chunk is small)
            jc, jo = st.split(jo, -(-n_vec // (4 * target.num_cores)))
            st.reorder(jc, *op.reduce_axis, jo)
            fo = st.fuse(fo, jc) if fo is not None else jc
    if parallel and fo is not None:
        st.parallel(fo)


def _nan_reducer(name: str, combine, identity) -> te.Reducer:
    """max/min that keep a NaN once met (as numpy's); the update is combine(accumulator, element)."""
    return te.comm_reducer(combine, identity, name)


NAN_MAX = _nan_reducer("nan_max", lambda acc, v: nan_max(acc, v), tx.min_value)
NAN_MIN = _nan_reducer("nan_min", lambda acc, v: nan_min(acc, v), tx.max_value)
PROD = te.comm_reducer(lambda a, b: a * b, lambda t: 1, "prod")


def _wide(v: tx.Expr) -> tx.Expr:
    """numpy's float64 result of sqrt/log/mean on integers."""
    return v if v.dtype.is_float else te.cast(v, "float64")


# name -> (reducer for floats, reducer for other dtypes, pre(x), post(y, n)) where n is the reduced count
REDUCERS_TE = {
    "ReduceSum": (te.sum, te.sum, None, None),
    "ReduceMean": (te.sum, te.sum, _wide, lambda y, n: y / (float(n) if isinstance(n, int) else te.cast(n, y.dtype))),
    "ReduceMax": (NAN_MAX, te.max, None, None),
    "ReduceMin": (NAN_MIN, te.min, None, None),
    "ReduceProd": (PROD, PROD, None, None),
    "ReduceL1": (te.sum, te.sum, te.abs, None),
    "ReduceL2": (te.sum, te.sum, lambda v: v * v, lambda y, n: fcall("sqrt", _wide(y))),
    "ReduceLogSum": (te.sum, te.sum, None, lambda y, n: fcall("log", _wide(y))),
    "ReduceSumSquare": (te.sum, te.sum, lambda v: v * v, None),
}


def _reduce_lowering(name: str, float_reducer, other_reducer, pre, post) -> None:
    def compute(a: dict, x: te.Tensor) -> te.Tensor:
        if x.dtype.is_bool and name not in ("ReduceMax", "ReduceMin"):
            raise NotLowerable(f"{name} on bool")
        reducer = float_reducer if x.dtype.is_float else other_reducer
        y = reduce_te(x, a["axes"], bool(a["keepdims"]), reducer, pre=pre, name=name.lower())
        if post is None:
            return y
        n = math.prod(x.shape[d] for d in a["axes"])
        return te.compute(y.shape, lambda *i: astype(post(y[i], n), x.dtype), name=name.lower() + "_out")

    lowering(name, schedule=schedule_reduce)(compute)


for _name, _row in REDUCERS_TE.items():
    _reduce_lowering(_name, *_row)


@lowering("ReduceLogSumExp", schedule=schedule_reduce)
def _(a: dict, x: te.Tensor) -> te.Tensor:
    """log(sum(exp(x - m))) + m with m the max (0 where it is not finite), as the reference."""
    if not x.dtype.is_float:
        raise NotLowerable(f"ReduceLogSumExp on {x.dtype}")
    axes, keep = a["axes"], bool(a["keepdims"])
    m = reduce_te(x, axes, True, te.max, name="lse_max")

    def shift(idx) -> tx.Expr:
        v = m[tuple(0 if d in axes else i for d, i in enumerate(idx))]
        return te.if_then_else(te.all(v == v, te.abs(v) != te.const(np.inf, v.dtype)), v, te.const(0, v.dtype))

    e = te.compute(x.shape, lambda *i: te.exp(x[i] - shift(i)), name="lse_exp")
    s = reduce_te(e, axes, keep, te.sum, name="lse_sum")

    def out(*i):
        full, it = [], iter(i)
        for d in range(x.ndim):
            full.append((next(it) if keep else 0) if d in axes else next(it))
        return te.log(s[i]) + shift(tuple(full))

    return te.compute(s.shape, out, name="reducelogsumexp")


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


def _arg_lowering(name: str, reducer_float, reducer_int) -> None:
    def compute(a: dict, x: te.Tensor) -> te.Tensor:
        """The extreme value m along the axis, then the least (or greatest) index holding m or a NaN (numpy's
        argmax/argmin take the first NaN). Indices are computed in integers as wide as x, so that the select
        vectorizes under x's comparison mask, and widened to int64 at the end."""
        if x.dtype.is_bool:
            raise NotLowerable(f"{name} on bool")
        axis, keep = norm_axis(a["axis"], x.ndim), bool(a["keepdims"])
        n = x.shape[axis]
        m = reduce_te(x, (axis,), True, reducer_float if x.dtype.is_float else reducer_int, name=name.lower() + "_m")
        idt = "int32" if x.dtype.bits <= 32 else "int64"
        last = bool(a["select_last_index"])

        def source(idx: tuple) -> tx.Expr:
            v = x[idx]
            hit = v == m[idx[:axis] + (0,) + idx[axis + 1 :]]
            if x.dtype.is_float:
                hit = te.any(hit, v != v)
            return te.if_then_else(hit, te.cast(idx[axis], idt), te.const(-1 if last else n, idt))

        i = reduce_source(x.shape, (axis,), keep, te.max if last else te.min, source, name=name.lower() + "_index")
        return te.compute(i.shape, lambda *j: te.cast(i[j], "int64"), name=name.lower())

    lowering(name, schedule=schedule_reduce)(compute)


_arg_lowering("ArgMax", NAN_MAX, te.max)
_arg_lowering("ArgMin", NAN_MIN, te.min)


# -- TopK ----------------------------------------------------------------------------------------
def _topk_infer(a: dict, x: TensorType) -> tuple[TensorType, TensorType]:
    axis = norm_axis(a["axis"], x.rank)
    if is_static_dim(a["k"]) and is_static_dim(x.shape[axis]) and not 0 <= a["k"] <= x.shape[axis]:
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
    attrs=[Attr("k", "dim"), Attr("axis", "int", -1), Attr("largest", "int", 1), Attr("sorted", "int", 1)])  # fmt: skip
def topk(a: dict, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The k largest (or smallest) along axis, sorted; ties keep the lower index first."""
    axis = norm_axis(a["axis"], x.ndim)
    order = stable_argsort(x, axis, bool(a["largest"]))
    idx = np.take(order, np.arange(a["k"]), axis=axis)
    return np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)


QUADRATIC_LIMIT = 1 << 26  # element pairs a quadratic compute (TopK ranks, CumSum windows) may visit


def _precedes(u: tx.Expr, v: tx.Expr, iu: tx.Expr, iv: tx.Expr, largest: bool) -> tx.Expr:
    """Whether (value u at index iu) comes before (v at iv) in the reference's order: by value, NaN as the
    greatest, ties by index."""
    better = u > v if largest else u < v
    tie = u == v
    if u.dtype.is_float:
        nan_u, nan_v = u != u, v != v
        better = te.any(better, te.all(nan_u, ~nan_v) if largest else te.all(~nan_u, nan_v))
        tie = te.any(tie, te.all(nan_u, nan_v))
    return te.any(better, te.all(tie, iu < iv))


@lowering("TopK")
def _(a: dict, x: te.Tensor) -> list[te.Tensor]:
    """The rank of each element (how many precede it), then for output position j the index ranked j, and
    its value: quadratic in the axis length, which suits the short axes TopK meets in models."""
    if x.dtype.is_bool:
        raise NotLowerable("TopK on bool")
    axis, k, largest = norm_axis(a["axis"], x.ndim), a["k"], bool(a["largest"])
    n = x.shape[axis]
    if te.prod_hint(x.shape) * te.size_hint(n) > QUADRATIC_LIMIT:
        raise NotLowerable(f"TopK over an axis of {n}: the quadratic compute would be too slow")

    def along(i: tuple, j) -> tuple:
        return i[:axis] + (j,) + i[axis + 1 :]

    m = te.reduce_axis((0, n), name="m")
    rank = te.compute(x.shape, lambda *i: te.sum(te.cast(_precedes(x[along(i, m)], x[i], m.var, i[axis], largest),
                                                         "int64"), axis=m), name="topk_rank")  # fmt: skip
    r = te.reduce_axis((0, n), name="r")
    shape = along(x.shape, k)
    index = te.compute(shape, lambda *i: te.sum(te.if_then_else(rank[along(i, r)] == te.cast(i[axis], "int64"),
                                                                te.cast(r.var, "int64"), te.const(0, "int64")),
                                                axis=r), name="topk_index")  # fmt: skip
    values = te.compute(shape, lambda *i: x[along(i, index[i])], name="topk_values")
    return [values, index]


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


def _cum_lowering(name: str, reducer: te.Reducer) -> None:
    def compute(a: dict, x: te.Tensor) -> te.Tensor:
        """out[.., j, ..] combines the x[.., k, ..] with k <= j (k < j exclusive; k >= j reversed, from the
        end): a reduction over the whole axis under a condition, quadratic in its length."""
        if x.dtype.is_bool:
            raise NotLowerable(f"{name} on bool")
        axis = norm_axis(a["axis"], x.ndim)
        n = x.shape[axis]
        if te.prod_hint(x.shape) * te.size_hint(n) > QUADRATIC_LIMIT:
            raise NotLowerable(f"{name} over an axis of {n}: the quadratic compute would be too slow")
        r = te.reduce_axis((0, n), name="r")

        def body(*i):
            j = i[axis]
            k = n - 1 - r.var if a["reverse"] else r.var  # the reference's order of summation
            if a["reverse"]:
                inside = k > j if a["exclusive"] else k >= j
            else:
                inside = k < j if a["exclusive"] else k <= j
            return reducer(x[i[:axis] + (k,) + i[axis + 1 :]], axis=r, where=inside)

        return te.compute(x.shape, body, name=name.lower())

    lowering(name)(compute)


_cum_lowering("CumSum", te.sum)
_cum_lowering("CumProd", PROD)
