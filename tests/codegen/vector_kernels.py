"""A one-stage elementwise kernel with its last axis vectorized: the shape of the codegen tests that check what one
vector operation (a narrowing, a widening, a rounding, a min/max, a masked tail) becomes in C."""

from __future__ import annotations

from collections.abc import Callable

from ember import te


def vectorized(shape: tuple[int, ...], dtype: str, body: Callable, lanes: int):
    """Y[i] = body(X, i) for X of `shape` and `dtype`, Y's last axis split by `lanes` and the inner loop vectorized:
    (schedule, [X, Y])."""
    X = te.placeholder(shape, dtype, name="X")
    Y = te.compute(shape, lambda *i: body(X, i), name="Y")
    s = te.create_schedule(Y)
    _, ji = s[Y].split(Y.op.axis[-1], lanes)
    s[Y].vectorize(ji)
    return s, [X, Y]
