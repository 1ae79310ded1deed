"""Property test: random elementwise expressions over float32/float64/int32/int8/bool inputs, compiled as a scalar
loop and as a vectorized loop (with a tail), agree with numpy evaluating the same expression tree.

An expression is drawn as a tree of typed nodes; each node knows how to build itself as a tensor expression and
how to evaluate itself with numpy. Operations whose C meaning is undefined (signed overflow, float to integer
conversion out of range) are not drawn; int8 values are only loaded, cast and compared (int8 arithmetic is
the subject of an xfail test in tests/te/test_te_expressions.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import scipy.special
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from ember import te

pytestmark = pytest.mark.property

N = 19
EXAMPLES = int(os.environ.get("EMBER_PROPERTY_EXAMPLES", "40"))
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("EMBER_PROPERTY_RANDOM", "") in ("", "0"),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
INPUTS = {"F": "float32", "D": "float64", "I": "int32", "S": "int8", "B": "bool"}


@dataclass(frozen=True)
class Node:
    """An expression node: its dtype, how to build it from the input loads, how numpy computes it."""

    dtype: str
    text: str
    build: Callable[[dict], te.Expr]
    numpy: Callable[[dict], np.ndarray]

    def __repr__(self) -> str:
        return self.text


def leaf(name: str) -> Node:
    return Node(INPUTS[name], name, lambda env: env[name], lambda env: env[name])


def const(value, dt: str) -> Node:
    return Node(dt, f"{dt}({value})", lambda env: te.const(value, dt), lambda env: np.full(N, value, dt))


def unary(name: str, x: Node, te_fn, np_fn, dt: str | None = None) -> Node:
    dt = dt or x.dtype
    return Node(dt, f"{name}({x.text})", lambda env: te_fn(x.build(env)), lambda env: np_fn(x.numpy(env)).astype(dt))


def binary(name: str, a: Node, b: Node, te_fn, np_fn, dt: str | None = None) -> Node:
    dt = dt or a.dtype
    return Node(dt, f"{name}({a.text}, {b.text})", lambda env: te_fn(a.build(env), b.build(env)),
                lambda env: np_fn(a.numpy(env), b.numpy(env)).astype(dt))  # fmt: skip


def cast(x: Node, dt: str) -> Node:
    return unary(f"cast_{dt}", x, lambda e: te.cast(e, dt), lambda v: v.astype(dt), dt)


def select(c: Node, a: Node, b: Node) -> Node:
    return Node(a.dtype, f"select({c.text}, {a.text}, {b.text})",
                lambda env: te.if_then_else(c.build(env), a.build(env), b.build(env)),
                lambda env: np.where(c.numpy(env), a.numpy(env), b.numpy(env)).astype(a.dtype))  # fmt: skip


FLOAT_UNARY = {
    "exp": (lambda x: te.exp(te.min(x, 20.0)), lambda x: np.exp(np.minimum(x, 20))),
    "log1abs": (lambda x: te.log(te.abs(x) + 1.0), lambda x: np.log(np.abs(x) + 1)),
    "sqrtabs": (lambda x: te.sqrt(te.abs(x)), lambda x: np.sqrt(np.abs(x))),
    "tanh": (te.tanh, np.tanh),
    "sigmoid": (te.sigmoid, scipy.special.expit),
    "erf": (te.erf, scipy.special.erf),
    "floor": (te.floor, np.floor),
    "ceil": (te.ceil, np.ceil),
    "round": (te.round, np.round),
    "abs": (te.abs, np.abs),
    "neg": (lambda x: -x, np.negative),
}
FLOAT_BINARY = {
    "add": (lambda a, b: a + b, np.add),
    "sub": (lambda a, b: a - b, np.subtract),
    "mul": (lambda a, b: a * b, np.multiply),
    "div": (lambda a, b: a / (te.abs(b) + 1.0), lambda a, b: a / (np.abs(b) + 1)),
    "min": (te.min, np.minimum),
    "max": (te.max, np.maximum),
}
INT_BINARY = {
    "add": (lambda a, b: a + b, np.add),
    "sub": (lambda a, b: a - b, np.subtract),
    "min": (te.min, np.minimum),
    "max": (te.max, np.maximum),
    "floordiv": (lambda a, b: a // (te.abs(b) % 7 + 1), lambda a, b: a // (np.abs(b) % 7 + 1)),
    "floormod": (lambda a, b: a % (te.abs(b) % 7 + 1), lambda a, b: a % (np.abs(b) % 7 + 1)),
}
COMPARE = {
    "lt": (lambda a, b: a < b, np.less),
    "le": (lambda a, b: a <= b, np.less_equal),
    "eq": (lambda a, b: a == b, np.equal),
    "ne": (lambda a, b: a != b, np.not_equal),
    "gt": (lambda a, b: a > b, np.greater),
}


def comparisons(operand_dtype: str, depth: int) -> st.SearchStrategy[Node]:
    """Bool expressions `a op b` with a and b of operand_dtype."""
    operand = exprs(operand_dtype, depth - 1)
    return st.tuples(st.sampled_from(sorted(COMPARE)), operand, operand).map(
        lambda t: binary(t[0], t[1], t[2], *COMPARE[t[0]], dt="bool")
    )


def exprs(dt: str, depth: int) -> st.SearchStrategy[Node]:
    """Expressions of dtype dt with at most `depth` levels of operations."""
    if dt == "int8":
        options = [st.just(leaf("S"))]
        if depth:
            options.append(exprs("int32", depth - 1).map(lambda x: cast(x, "int8")))  # wraps, as in numpy
        return st.one_of(options)
    leaves = {
        "float32": [st.just(leaf("F")), st.floats(-3, 3, width=32).map(lambda v: const(v, "float32"))],
        "float64": [st.just(leaf("D")), st.floats(-3, 3).map(lambda v: const(v, "float64"))],
        "int32": [st.just(leaf("I")), st.integers(-9, 9).map(lambda v: const(v, "int32"))],
        "bool": [st.just(leaf("B")), st.booleans().map(lambda v: const(v, "bool"))],
    }[dt]
    if depth == 0:
        return st.one_of(leaves)
    sub = exprs(dt, depth - 1)
    ops: list[st.SearchStrategy[Node]] = []
    if dt in ("float32", "float64"):
        ops.append(st.tuples(st.sampled_from(sorted(FLOAT_UNARY)), sub).map(
            lambda t: unary(t[0], t[1], *FLOAT_UNARY[t[0]])))  # fmt: skip
        ops.append(st.tuples(st.sampled_from(sorted(FLOAT_BINARY)), sub, sub).map(
            lambda t: binary(t[0], t[1], t[2], *FLOAT_BINARY[t[0]])))  # fmt: skip
        src = st.sampled_from(["int32", "int8", "bool", "float32" if dt == "float64" else "float64"])
        ops.append(src.flatmap(lambda s: exprs(s, depth - 1)).map(lambda x: cast(x, dt)))
    if dt == "int32":
        ops.append(st.tuples(st.sampled_from(sorted(INT_BINARY)), sub, sub).map(
            lambda t: binary(t[0], t[1], t[2], *INT_BINARY[t[0]])))  # fmt: skip
        ops.append(sub.map(lambda x: unary("abs", x, te.abs, np.abs)))
        ops.append(st.sampled_from(["int8", "bool"]).flatmap(lambda s: exprs(s, depth - 1)).map(
            lambda x: cast(x, "int32")))  # fmt: skip
    if dt == "bool":
        ops.append(st.sampled_from(["float32", "float64", "int32", "int8"]).flatmap(lambda s: comparisons(s, depth)))
        ops.append(st.tuples(sub, sub).map(lambda t: binary("and", t[0], t[1], te.all, np.logical_and)))
        ops.append(st.tuples(sub, sub).map(lambda t: binary("or", t[0], t[1], te.any, np.logical_or)))
        ops.append(sub.map(lambda x: unary("not", x, lambda e: ~e, np.logical_not)))  # fmt: skip
    ops.append(st.tuples(exprs("bool", depth - 1), sub, sub).map(lambda t: select(*t)))
    return st.one_of(*leaves, *ops)


def inputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "F": rng.uniform(-3, 3, N).astype(np.float32),
        "D": rng.uniform(-3, 3, N),
        "I": rng.integers(-50, 51, N).astype(np.int32),
        "S": rng.integers(-128, 128, N).astype(np.int8),
        "B": rng.random(N) < 0.5,
    }


@PROPERTY
@given(st.sampled_from(["float32", "float64", "int32", "bool"]).flatmap(lambda dt: exprs(dt, 3)), st.data())
def test_random_expression_scalar_and_vectorized(check_build, expr: Node, data):
    note(f"expression: {expr.text}")
    tensors = {name: te.placeholder((N,), dt, name=name) for name, dt in INPUTS.items()}
    out = te.compute((N,), lambda i: expr.build({k: t[i] for k, t in tensors.items()}), name="out")
    assert out.dtype.name == expr.dtype
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="input seed"))
    values = inputs(rng)
    with np.errstate(all="ignore"):
        expected = expr.numpy(values)
    args = [*tensors.values(), out]
    ref = lambda *_: expected  # noqa: E731
    # float32 results of a few libm calls and fused multiply-adds differ from numpy's by a few ulps
    for vectorize in (False, True):
        s = te.create_schedule(out)
        if vectorize:
            s[out].vectorize(s[out].split(out.op.axis[0], factor=8)[1])
        check_build(s, args, ref, rng, rtol=1e-4, atol=1e-4, inputs=values)
