"""Row statistics for operator computes: reductions of a tensor over some axes, and per-row stages
built from them (`RowStats`). Trailing axes use the row template of `ember.templates.nn` (vectorized
partial sums, everything computed per row inside the output's row loop); other axes a keepdims
reduction scheduled on its own. Used by normalizations, softmax, global pooling and matrix-vector
products."""

from __future__ import annotations

import math

from ember import te
from ember.templates import nn as T


def unravel(flat, dims: tuple[int, ...]) -> tuple:
    """Row-major indices into dims of a flat index (the flattened C index simplifies back to it)."""
    out = []
    for n in reversed(dims[1:]):
        out.insert(0, flat % n)
        flat = flat // n
    return (flat, *out) if dims else ()


def ravel(idx, dims: tuple[int, ...]):
    """The row-major flat index of indices `idx` into dims (`unravel`'s inverse)."""
    flat = 0
    for i, n in zip(idx, dims):
        flat = flat * n + i
    return flat


class RowStats:
    """Reductions of x over `axes`, and per-row stages built from them. Trailing axes use the row
    template (vectorized partial sums, everything computed per row inside the output's row loop);
    other axes a keepdims reduction scheduled on its own."""

    def __init__(self, shape: tuple[int, ...], axes: tuple[int, ...], knobs: tuple[int, int] = (1, 1)):
        self.shape, self.axes = shape, tuple(sorted(axes))
        nd = len(shape)
        k = min(self.axes) if self.axes else nd
        self.k = k if self.axes == tuple(range(k, nd)) else None
        self.acc, self.unroll = knobs  # the rows template's knobs (`ember.templates.nn.row_knobs`)

    @property
    def attrs(self) -> dict:
        if self.k is None:
            return {}
        return {"template": "rows", "rows": self.k, **({"unroll": self.unroll} if self.unroll > 1 else {})}

    def reduce(self, at, reducer, dtype, name: str):
        """reader(full index) of reducer over the axes of at(full index)."""
        shape, axes, k = self.shape, self.axes, self.k
        if k is not None:
            inner = shape[k:]
            rd = T.row_reduce(shape[:k], math.prod(inner), lambda r, l: at(tuple(r) + unravel(l, inner)), reducer,
                              dtype, name, acc=self.acc)  # fmt: skip
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
