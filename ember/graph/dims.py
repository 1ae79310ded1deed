"""Symbolic dims: a tensor dim is an int or an integer expression of named size variables.

    S = size_var("S", 1, 512)          # a size known only at run time, with bounds
    TensorType((1, S + 1, 768), "float32")
    shape_str((2 * S, S // 2))          # "[2*S, S//2]" in the graph printer

The expressions are the loop IR's (`ember.tir.expr`), so a kernel can use a graph dim as a loop
extent unchanged, and the loop IR's simplifier (`ember.tir.arith`, told each variable's bounds)
puts every dim in one canonical form: two dims are equal when their difference simplifies to 0.
A `SizeVar` compares by identity, like every loop IR variable: the frontend makes one per name
(`SizeVars`), so the `S` of two inputs is one variable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from ember.tir.arith import Analyzer, eval_int
from ember.tir.dtype import int64
from ember.tir.expr import BinOp, Const, Expr, Var, binop, const
from ember.tir.functor import walk
from ember.tir.sizevar import DimError, SizeVar, ValueSizeVar

Dim = int | Expr
Shape = tuple[Dim, ...]


def size_var(name: str, lo: int = 0, hi: int | None = None) -> SizeVar:
    """A size variable named `name` with inclusive bounds [lo, hi] (hi None: unbounded)."""
    if not name.isidentifier():
        raise DimError(f"size variable name {name!r} must be an identifier")
    if lo < 0 or (hi is not None and hi < lo):
        raise DimError(f"size variable {name}: bounds ({lo}, {hi}) must satisfy 0 <= lo <= hi")
    return SizeVar(name, int64, int(lo), None if hi is None else int(hi))


# how the run time computes a ValueSizeVar from the int input's values v (flattened), its `index`, and its `dims`
# (dims of another tensor, evaluated at this call's sizes): `ember.runtime.plan.VALUE_RULES` implements each
VALUE_RULES = {
    "element": "v[index]",
    "reshape": "entry index of the Reshape target v of a tensor of shape dims: 0 copies a dim, -1 is inferred",
    "reshape_allowzero": "the same with 0 meaning 0",
    "reduce_out": "dims[index] unless index is in the axes v (then 1)",
    "reduce_kept": "the index-th dim of dims not in the axes v",
    "squeeze": "the index-th dim of dims not in the axes v, each of which must be 1",
    "unsqueeze": "dim index of dims with 1s inserted at the axes v (of the result's rank)",
    "split": "v[index], the sizes v adding up to dims[0]",
    "nonzero": "the number of non-zero elements of v (of any size)",
    "axis_view": "(product of dims before axis v[0], dims[v[0]], product of dims after it)[index]",
    # rules of several operands: v is the list of the values of `operands` (the source is one of them)
    "slice": "the length of axis index of dims sliced by v = [starts, ends, axes or None, steps or None] (ONNX)",
    "pad": "dims[index] plus its begin and end pads in v = [pads, axes or None] (negative pads crop)",
    "range": "the length of Range(start, limit, delta) for v = [start, limit, delta] (read as numbers)",
    "compress": "the number of non-zero elements of the condition v, no longer than dims[0]",
    "resize": "dim index of Resize's output for v = [scales, sizes, roi, axes, (policy code,)] (ONNX)",
    "unique": "the number of distinct values of v (of any size)",
    "unique_slices": "the number of distinct slices along axis 1 of v viewed as dims (before, length, after)",
    "dft_view": "axis_view of a DFT's signal dims (all but the trailing complex one; a negative axis v[0] counts it)",
    "dft_rfft": "dims[index], or n // 2 + 1 of it at the DFT axis v[0] (a onesided transform)",
    "dft_irfft": "dims[index], or 2 * (n - 1) of it at the DFT axis v[0] (an inverse onesided transform)",
}


def value_size_var(name: str, source: object, index: int, rule: str = "element", dims: tuple = (),
                   hi: int | None = None, operands: tuple = ()) -> ValueSizeVar:
    """A size in [0, hi] read at run time from the int graph input `source` (and `operands`) by
    `VALUE_RULES[rule]`; a source or operand may also be a callable that computes it from the inputs' values by
    name (an operand other nodes compute from inputs: `ember.ops.evaluate.ComputedOperand`)."""
    if not name.isidentifier():
        raise DimError(f"size variable name {name!r} must be an identifier")
    if rule not in VALUE_RULES:
        raise DimError(f"size variable {name}: unknown rule {rule!r}; known: {', '.join(VALUE_RULES)}")
    return ValueSizeVar(name, int64, 0, hi, source, int(index), rule, tuple(dims), tuple(operands))


def reads_values(dims: Sequence[Dim]) -> bool:
    """Whether a dim is read from input values at run time (a `ValueSizeVar` in it): relations between such dims
    and others are checked when the run time binds them, not at compile time."""
    return any(isinstance(n, ValueSizeVar) for d in dims if isinstance(d, Expr) for n in walk(d))


class SizeVars:
    """One `SizeVar` per name, made on first use with the bounds given for that name (default [1, inf))."""

    def __init__(self, bounds: Mapping[str, tuple[int, int | None]] | None = None):
        self.bounds = dict(bounds or {})
        self.vars: dict[str, SizeVar] = {}

    def __call__(self, name: str) -> SizeVar:
        if name not in self.vars:
            lo, hi = self.bounds.get(name, (1, None))
            self.vars[name] = size_var(name, lo, hi)
        return self.vars[name]

    def unused_bounds(self) -> list[str]:
        """Names with bounds given that no dim used (a typo in `dynamic_bounds`)."""
        return [n for n in self.bounds if n not in self.vars]


def is_static_dim(d: Dim) -> bool:
    return isinstance(d, int | np.integer)


def is_static(shape: Sequence[Dim]) -> bool:
    return all(is_static_dim(d) for d in shape)


def size_vars(shapes: Iterable[Sequence[Dim]] | Sequence[Dim]) -> list[SizeVar]:
    """The size variables in a shape (or several), in order of first appearance."""
    out: dict[SizeVar, None] = {}
    items = list(shapes)
    flat = [d for s in items for d in s] if items and isinstance(items[0], tuple | list) else items
    for d in flat:
        if isinstance(d, Expr):
            out.update((n, None) for n in walk(d) if isinstance(n, SizeVar))
    return list(out)


def _analyzer(*dims: Dim) -> Analyzer:
    return Analyzer({v: (v.lo, v.hi) for v in size_vars(list(dims))})


def simplify_dim(d: Dim | Expr) -> Dim:
    """The canonical form of a dim: an int when it is constant, else the simplified expression."""
    if is_static_dim(d):
        return int(d)
    if not isinstance(d, Expr) or not (d.dtype.is_int and d.dtype.lanes == 1):
        raise TypeError(f"a dim must be an int or an integer expression of size variables, got {d!r}")
    free = [n for n in walk(d) if isinstance(n, Var) and not isinstance(n, SizeVar)]
    if free:
        raise TypeError(f"dim {d} uses {free[0].name}, which is not a size variable (make it with size_var)")
    s = _analyzer(d).simplify(d)
    if isinstance(s, Const):
        if s.value < 0:
            raise DimError(f"dim {d} is negative ({s.value})")
        return int(s.value)
    return s


def dims_equal(a: Dim, b: Dim) -> bool:
    """Whether two dims are provably equal for every value of their size variables."""
    if is_static_dim(a) and is_static_dim(b):
        return int(a) == int(b)
    diff = _analyzer(a, b).simplify(_expr(a) - _expr(b))
    return isinstance(diff, Const) and diff.value == 0


def decide(op: str, a: Dim, b: Dim) -> bool | None:
    """`a op b` (op: ==, <, <=, > or >=) when it is the same for every value of the size variables, else None;
    decided by the bounds of a - b over the variables' ranges (a size is never -1: a model's `shape == -1` folds)."""
    if is_static_dim(a) and is_static_dim(b):
        a, b = int(a), int(b)
        return {"==": a == b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
    analyzer = _analyzer(a, b)
    lo, hi = analyzer.bounds(analyzer.simplify(_expr(a) - _expr(b)))
    lo = None if lo is None or lo <= -(2**62) else lo
    hi = None if hi is None or hi >= 2**62 else hi
    above = lambda t: lo is not None and lo > t  # noqa: E731  (a - b > t for every value)
    below = lambda t: hi is not None and hi < t  # noqa: E731
    true, false = {"==": (lo == hi == 0, above(0) or below(0)), "<": (below(0), above(-1)), "<=": (below(1), above(0)),
                   ">": (above(0), below(1)), ">=": (above(-1), below(0))}[op]  # fmt: skip
    return True if true else False if false else None


def _expr(d: Dim) -> Expr:
    return const(int(d), int64) if is_static_dim(d) else d  # type: ignore[return-value]


def dim_bounds(d: Dim) -> tuple[int, int | None]:
    """Inclusive [lo, hi] of a dim over its variables' bounds (hi None: unbounded)."""
    if is_static_dim(d):
        return int(d), int(d)
    lo, hi = _analyzer(d).bounds(d)  # type: ignore[arg-type]
    return max(0, lo if lo is not None else 0), hi if hi is not None and hi < 2**62 else None


def eval_dim(d: Dim, env: Mapping[Var, int]) -> int:
    """The value of a dim once its size variables have values."""
    if is_static_dim(d):
        return int(d)
    v = eval_int(d, dict(env))  # type: ignore[arg-type]
    if v is None:
        missing = [x.name for x in size_vars([d]) if x not in env]
        raise DimError(f"dim {d} cannot be evaluated: no value for {', '.join(missing) or 'its variables'}")
    return int(v)


def eval_shape(shape: Sequence[Dim], env: Mapping[Var, int]) -> tuple[int, ...]:
    return tuple(eval_dim(d, env) for d in shape)


def dim_product(dims: Sequence[Dim]) -> Dim:
    out: Dim = 1
    for d in dims:
        out = simplify_dim(out * d) if not (is_static_dim(out) and is_static_dim(d)) else int(out) * int(d)
    return out


def _factors(d: Dim) -> tuple[int, list[Expr]]:
    """d as a constant times a product of non-constant factors (one level of multiplication)."""
    if is_static_dim(d) or isinstance(d, Const):
        return int(d.value if isinstance(d, Const) else d), []
    if isinstance(d, BinOp) and d.op == "mul":
        ca, fa = _factors(d.a)
        cb, fb = _factors(d.b)
        return ca * cb, fa + fb
    return 1, [d]  # type: ignore[list-item]


def divide_dims(num: Sequence[Dim], den: Sequence[Dim]) -> Dim | None:
    """prod(num) / prod(den) when it divides exactly (cancelling common symbolic factors), else None:
    the inferred -1 of a Reshape of [B, S, 768] to [B, -1, 12, 64] is S."""
    cn, fn = 1, []
    for d in num:
        c, f = _factors(d)
        cn, fn = cn * c, fn + f
    cd, fd = 1, []
    for d in den:
        c, f = _factors(d)
        cd, fd = cd * c, fd + f
    for f in list(fd):
        match = next((g for g in fn if dims_equal(f, g)), None)
        if match is None:
            return None
        fn.remove(match)
        fd.remove(f)
    if cd == 0 or cn % cd:
        return None
    return dim_product([cn // cd, *fn])


def broadcast_dim(a: Dim, b: Dim) -> Dim | None:
    """The numpy broadcast of two dims, None when they provably or possibly differ (a symbolic dim
    broadcasts only with 1 or an equal dim)."""
    if is_static_dim(a) and int(a) == 1:
        return b
    if is_static_dim(b) and int(b) == 1:
        return a
    return a if dims_equal(a, b) else None


def clamped_size(a: Dim, b: Dim) -> tuple[SizeVar, int] | None:
    """(S, c) where one dim is the size S and the other min(S, c) (a Slice of a c-long table by S): they are equal
    exactly when S <= c, which the model then needs. None for any other pair."""
    for x, y in ((a, b), (b, a)):
        if isinstance(x, SizeVar) and isinstance(y, BinOp) and y.op == "min":
            for u, v in ((y.a, y.b), (y.b, y.a)):
                if u is x and isinstance(v, Const):
                    return x, int(v.value)
    return None


def dim_str(d: Dim) -> str:
    return str(int(d)) if is_static_dim(d) else str(d).replace(" ", "")


def shape_str(shape: Sequence[Dim]) -> str:
    return "[" + ", ".join(dim_str(d) for d in shape) + "]"


def bind_sizes(shapes: Sequence[tuple[str, Sequence[Dim], Sequence[int]]]) -> dict[SizeVar, int]:
    """The size variables' values given (what, declared shape, actual shape) triples, e.g. a model's inputs:
    a dim that is a bare variable binds it, then every dim is checked against its actual length. Raises
    DimError naming the tensor, the dim and the variable's bounds."""
    env: dict[SizeVar, int] = {}
    for what, shape, actual in shapes:
        if len(shape) != len(actual):
            raise DimError(f"{what} has shape {list(actual)}, expected rank {len(shape)} {shape_str(shape)}")
        for d, n in zip(shape, actual):
            if isinstance(d, SizeVar) and d not in env:
                d.check(int(n), f"{what}: ")
                env[d] = int(n)
    for what, shape, actual in shapes:
        for axis, (d, n) in enumerate(zip(shape, actual)):
            try:
                want = eval_dim(d, env)
            except DimError:
                raise DimError(f"{what}: dim {axis} ({dim_str(d)}) has no bare size variable among the inputs to "
                               "bind it") from None  # fmt: skip
            if want != int(n):
                raise DimError(f"{what} has shape {list(actual)}, expected {shape_str(shape)} = "
                               f"{list(eval_shape(shape, env))} with {_env_str(env)}")  # fmt: skip
    return env


def _env_str(env: Mapping[SizeVar, int]) -> str:
    return ", ".join(f"{v.name}={n}" for v, n in env.items()) or "no sizes"


def bind_value(value: object, env: Mapping[Var, int]) -> object:
    """An attribute value with its symbolic dims evaluated (tuples and lists element-wise)."""
    if isinstance(value, Expr):
        return eval_dim(value, env)
    if isinstance(value, tuple | list) and any(isinstance(x, Expr) for x in value):
        return type(value)(bind_value(x, env) for x in value)
    return value


def bind_attrs(attrs: Mapping[str, object], env: Mapping[Var, int]) -> dict[str, object]:
    return {k: bind_value(v, env) for k, v in attrs.items()}


def range_length(start: Dim, limit: Dim, delta: int) -> Dim:
    """The number of elements of range(start, limit, delta) as a dim (0 when empty): ONNX Range's length when its
    bounds are computed from symbolic shapes (`Range(0, S, 1)` has S elements, `Range(P, P + S, 1)` too)."""
    if delta == 0:
        raise DimError("a range with step 0 has no length")
    if is_static_dim(start) and is_static_dim(limit):
        return max(-(-(int(limit) - int(start)) // int(delta)), 0)
    step = abs(int(delta))
    span = _expr(limit) - _expr(start) if delta > 0 else _expr(start) - _expr(limit)
    n = (span + (step - 1)) // step if step > 1 else span
    lo = _analyzer(n).bounds(n)[0]
    return simplify_dim(n if lo is not None and lo >= 0 else binop("max", n, 0))
