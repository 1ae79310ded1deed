"""Tensor-expression building blocks for operator computes, and the `lowering` decorator.

An operator's compute has the signature `compute(attrs, *inputs) -> Tensor | list[Tensor]`, where
inputs are `te.Tensor`s (None for absent optional inputs) and outputs follow the op's shape rule.
Its optional schedule is `schedule(attrs, outs, target) -> te.Schedule`. Both are attached to the
op's entry, next to its reference:

    @lowering("Relu")
    def _(a, x):
        return elemwise(lambda v: te.maximum(v, 0), x, name="relu")
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ember import te
from ember.graph.dims import dim_bounds
from ember.graph.types import np_dtype
from ember.ops.opdef import OPS
from ember.te.tensor import Tensor
from ember.tir.dtype import dtype as tir_dtype
from ember.tir.expr import Expr


class NotLowerable(Exception):
    """This op instance (dtype, attribute value) has no native kernel; it runs by reference instead."""


def lowering(name: str, schedule: Callable | None = None) -> Callable[[Callable], Callable]:
    """Attach a TE compute (and optionally a schedule) to operator `name`'s entry."""

    def wrap(fn: Callable) -> Callable:
        opdef = OPS[name]
        object.__setattr__(opdef, "compute", fn)
        if schedule is not None:
            object.__setattr__(opdef, "schedule", schedule)
        return fn

    return wrap


def broadcast_indices(idx: Sequence[Expr], in_shape: Sequence[int], out_ndim: int) -> tuple[Expr, ...]:
    """Index into an input of shape in_shape from an output index (numpy broadcasting, right-aligned)."""
    off = out_ndim - len(in_shape)
    return tuple(te.const(0) if n == 1 else idx[off + d] for d, n in enumerate(in_shape))


def broadcast_shape(*shapes: Sequence[int]) -> tuple[int, ...]:
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for d in range(ndim):
        dims = {s[d - ndim + len(s)] for s in shapes if d - ndim + len(s) >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise ValueError(f"shapes {shapes} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def elemwise(fn: Callable[..., Any], *xs: te.Tensor, name: str = "elemwise", dtype: str | None = None) -> te.Tensor:
    """out[i] = fn(x0[i], x1[i], ...) with numpy broadcasting of the inputs."""
    shape = broadcast_shape(*(x.shape for x in xs))

    def body(*idx):
        vals = [x[broadcast_indices(idx, x.shape, len(shape))] for x in xs]
        out = fn(*vals)
        return te.cast(out, dtype) if dtype is not None else out

    return te.compute(shape, body, name=name)


def normalize_axes(axes: Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    if axes is None:
        return tuple(range(ndim))
    return tuple(sorted({a + ndim if a < 0 else a for a in axes}))


def reduce(
    x: te.Tensor,
    axes: Sequence[int] | None,
    keepdims: bool,
    reducer: te.Reducer,
    pre: Callable[[Expr], Expr] | None = None,
    name: str = "reduce",
) -> te.Tensor:
    """reducer over `axes` of pre(x); output keeps reduced dims as 1 when keepdims."""
    axes = normalize_axes(axes, x.ndim)
    raxes = [te.reduce_axis((0, x.shape[a]), name=f"r{a}") for a in axes]
    kept = [d for d in range(x.ndim) if d not in axes]
    out_shape = (
        tuple(1 if d in axes else x.shape[d] for d in range(x.ndim)) if keepdims else tuple(x.shape[d] for d in kept)
    )

    def body(*idx):
        full: list[Any] = []
        it = iter(idx)
        r = iter(raxes)
        for d in range(x.ndim):
            if d in axes:
                if keepdims:
                    next(it)
                full.append(next(r))
            else:
                full.append(next(it))
        v = x[tuple(full)]
        return reducer(pre(v) if pre else v, axis=raxes)

    if not raxes:  # reducing no axes: identity (through pre)
        return te.compute(out_shape, lambda *idx: pre(x[idx]) if pre else x[idx], name=name)
    return te.compute(out_shape, body, name=name)


def pad(x: te.Tensor, before: Sequence[int], after: Sequence[int], value: float = 0.0, name: str = "pad") -> te.Tensor:
    """Constant padding; a no-op (x itself) when nothing is padded."""
    if not any(before) and not any(after):
        return x
    shape = tuple(n + b + a for n, b, a in zip(x.shape, before, after))

    def body(*idx):
        conds = []
        src = []
        for i, n, b in zip(idx, x.shape, before):
            src.append(i - b)
            if b:
                conds.append(i >= b)
            if b or shape[len(src) - 1] - b > n:
                conds.append(i < b + n)
        inside = te.all(*conds)
        return te.if_then_else(inside, x[tuple(src)], te.const(value, x.dtype))

    return te.compute(shape, body, name=name)


def numel(shape: Sequence[int]) -> int:
    """Elements of a shape; a symbolic one counts at its hint (`te.size_hint`: for heuristics and emptiness
    checks; its size variables are at least 1 unless bounded at 0, and loops of extent 0 run no iteration)."""
    return math.prod(shape) if all(isinstance(d, int) for d in shape) else te.prod_hint(shape)


# -- data-movement building blocks (injective ops: tensor.py, resize.py, vision.py, signal.py) ----------
def index_dtype(v: Expr, dim: int) -> Expr:
    """An index known to lie in [0, dim) as int32 when that holds it (loop variables are int32; kernels
    keep vector index types uniform)."""
    if not isinstance(dim, int):  # a symbolic length: int32 where its sizes' bounds keep it there
        hi = dim_bounds(dim)[1]
        return te.cast(v, "int32") if hi is not None and hi <= 2**31 else te.cast(v, "int64")
    return te.cast(v, "int32") if dim <= 2**31 else te.cast(v, "int64")


def native_dtype(name: str) -> str:
    """`name` if kernels support it, else NotLowerable (float16, bfloat16, float8, int4, ...)."""
    try:
        return tir_dtype(name).name
    except TypeError as e:
        raise NotLowerable(str(e)) from None


def const_of(value: object, dtype: str) -> Expr:
    """A constant converted to `dtype` the numpy way (astype: truncation, wrap-around, != 0 for bool)."""
    with np.errstate(all="ignore"):
        v = np.asarray(value).astype(np_dtype(native_dtype(dtype))).item()
    return te.const(v, dtype)


def keep(value: Expr, *unused: Tensor | None) -> Expr:
    """`value`, with dead reads of tensors the compute does not read otherwise (a zero-size input, an
    input only its shape matters of): lowering needs every kernel argument in the compute's DAG, and
    the simplifier drops the reads."""
    for t in unused:
        if t is not None:
            value = te.if_then_else(te.const(False), te.cast(t[(0,) * t.ndim], value.dtype), value)
    return value


def rows(k: int) -> dict:
    """Compute attrs: the last k axes of the output are contiguous in the input too
    (see `ember.templates.flat.schedule_rows`)."""
    return {"row_axes": k}
