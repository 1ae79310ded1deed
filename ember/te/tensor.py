"""Tensor expressions: the algorithm half of the algorithm/schedule split.

A = te.placeholder((M, K), "float32", name="A")
k = te.reduce_axis((0, K), name="k")
C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
"""

from __future__ import annotations

import builtins
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..tir import expr as E
from ..tir import narrow
from ..tir.dtype import DType, boolean, dtype
from ..tir.expr import Expr, Var, convert
from ..tir.functor import walk


class IterVar:
    """A loop axis of a stage: data-parallel (`kind="data"`) or reduction (`kind="reduce"`).

    Root axes have a domain [min, min + extent); axes made by split/fuse get theirs at lowering."""

    def __init__(self, name: str, dom: tuple[int, int] | None, kind: str = "data"):
        self.name = name
        self.dom = dom  # (min, extent) or None for derived axes
        self.kind = kind
        self.var = Var(name)

    def as_expr(self) -> Var:
        return self.var

    # arithmetic on an axis is arithmetic on its variable: `h + rh`
    def __add__(self, o):
        return self.var + o  # noqa: E704

    def __radd__(self, o):
        return o + self.var  # noqa: E704

    def __sub__(self, o):
        return self.var - o  # noqa: E704

    def __rsub__(self, o):
        return o - self.var  # noqa: E704

    def __mul__(self, o):
        return self.var * o  # noqa: E704

    def __rmul__(self, o):
        return o * self.var  # noqa: E704

    def __floordiv__(self, o):
        return self.var // o  # noqa: E704

    def __mod__(self, o):
        return self.var % o  # noqa: E704

    def __lt__(self, o):
        return self.var < o  # noqa: E704

    def __le__(self, o):
        return self.var <= o  # noqa: E704

    def __gt__(self, o):
        return self.var > o  # noqa: E704

    def __ge__(self, o):
        return self.var >= o  # noqa: E704

    def __repr__(self) -> str:
        dom = "" if self.dom is None else f", range({self.dom[0]}, {self.dom[0] + self.dom[1]})"
        return f"IterVar({self.name}{dom}, {self.kind})"


@dataclass(frozen=True, eq=False)
class Reducer:
    """A commutative, associative reduction: combine(x, y) and its identity element."""

    name: str
    combine: Callable[[Expr, Expr], Expr]
    identity: Callable[[DType], Any]

    def __call__(self, source: Any, axis: Any, where: Any = None) -> Expr:
        if not isinstance(axis, IterVar | list | tuple):  # te.max(a, b): the elementwise combination
            a = convert(source)
            return self.combine(a, convert(axis, a.dtype))
        axes = (axis,) if isinstance(axis, IterVar) else tuple(axis)
        if not axes:
            raise ValueError(f"te.{self.name} needs at least one reduce axis")
        for a in axes:
            if not isinstance(a, IterVar) or a.kind != "reduce":
                raise TypeError(f"te.{self.name}: axis {a!r} is not a reduce axis; create it with te.reduce_axis")
        src = convert(source)
        cond = convert(True) if where is None else convert(where)
        if not cond.dtype.is_bool:
            raise TypeError(f"te.{self.name}: `where` must be a boolean expression, got {cond.dtype}")
        return Reduce(self, src, axes, cond)


@dataclass(frozen=True, eq=False)
class Reduce(Expr):
    """reducer(source over axis where condition). Only allowed as the whole body of a compute."""

    reducer: Reducer
    source: Expr
    axis: tuple[IterVar, ...]
    condition: Expr

    @property
    def dtype(self) -> DType:  # type: ignore[override]
        return self.source.dtype

    def format(self) -> str:
        axes = ", ".join(a.name for a in self.axis)
        where = "" if isinstance(self.condition, E.Const) else f", where={self.condition}"
        return f"{self.reducer.name}({self.source}, axis=[{axes}]{where})"

    __hash__ = E.Node.__hash__


@dataclass(frozen=True, eq=False)
class TensorLoad(Expr):
    """Read of a tensor element: `A[i, k]` inside a compute body."""

    tensor: Tensor
    indices: tuple[Expr, ...]

    @property
    def dtype(self) -> DType:  # type: ignore[override]
        return self.tensor.dtype

    def format(self) -> str:
        return f"{self.tensor.name}[{', '.join(str(i) for i in self.indices)}]"

    __hash__ = E.Node.__hash__


class Operation:
    name: str
    shape: tuple[int, ...]
    dtype: DType

    def output(self, index: int = 0) -> Tensor:
        if index != 0:
            raise IndexError(f"operation {self.name} has one output")
        return self._tensor

    @property
    def inputs(self) -> list[Tensor]:
        return []


class PlaceholderOp(Operation):
    def __init__(self, name: str, shape: tuple[int, ...], dt: DType):
        self.name, self.shape, self.dtype = name, shape, dt
        self._tensor = Tensor(self)

    def __repr__(self) -> str:
        return f"placeholder {self.name}: {self.dtype}{list(self.shape)}"


class ComputeOp(Operation):
    def __init__(self, name: str, axis: list[IterVar], body: Expr, tag: str = "", attrs: dict | None = None):
        self.name = name
        self.axis = list(axis)
        self.body = body
        self.reduce_axis = list(body.axis) if isinstance(body, Reduce) else []
        self.shape = tuple(iv.dom[1] for iv in self.axis)  # type: ignore[index]
        self.dtype = body.dtype
        self.tag = tag
        self.attrs = dict(attrs or {})
        self._tensor = Tensor(self)

    @property
    def inputs(self) -> list[Tensor]:
        seen: dict[int, Tensor] = {}
        for n in walk(self.body):
            if isinstance(n, TensorLoad):
                seen.setdefault(id(n.tensor.op), n.tensor)
        return list(seen.values())

    def __repr__(self) -> str:
        axes = ", ".join(iv.name for iv in self.axis)
        return f"{self.name}[{axes}] = {self.body}"


class Tensor:
    """The output of an operation; index it to read an element in a compute body."""

    def __init__(self, op: Operation):
        self.op = op

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def shape(self) -> tuple[int, ...]:
        return self.op.shape

    @property
    def dtype(self) -> DType:
        return self.op.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, idx: Any) -> TensorLoad:
        idx = idx if isinstance(idx, tuple) else (idx,)
        if len(idx) != self.ndim:
            raise IndexError(f"tensor {self.name} has {self.ndim} dimensions, indexed with {len(idx)}")
        out = []
        for i in idx:
            i = i.var if isinstance(i, IterVar) else convert(i)
            if not i.dtype.is_int or i.dtype.lanes != 1:
                raise TypeError(f"index of {self.name} must be an integer expression, got {i} of type {i.dtype}")
            out.append(i)
        return TensorLoad(self, tuple(out))

    def __repr__(self) -> str:
        return f"Tensor({self.name}: {self.dtype}{list(self.shape)})"


# ---------------------------------------------------------------------------------------------
# user API


def _check_shape(shape: Sequence[Any], what: str) -> tuple[int | Expr, ...]:
    """Non-negative ints, or integer expressions of size variables (`te.var("n")`): a kernel of any size,
    which takes each size variable as an argument."""
    shape = tuple(shape) if isinstance(shape, list | tuple) else (shape,)
    out: list[int | Expr] = []
    for s in shape:
        if isinstance(s, IterVar):
            raise TypeError(f"{what}: shape entry {s.name} is a loop axis, not a size; use te.var for a size")
        if isinstance(s, Expr):
            if not (s.dtype.is_int and s.dtype.lanes == 1):
                raise TypeError(f"{what}: symbolic size {s} must be an integer expression, got {s.dtype}")
            out.append(s)
            continue
        if int(s) != s or int(s) < 0:
            raise ValueError(f"{what}: shape entries must be non-negative integers, got {shape}")
        out.append(int(s))
    return tuple(out)


def placeholder(shape: Sequence[int] | int, dtype_: str | DType = "float32", name: str = "placeholder") -> Tensor:
    """An input tensor."""
    return PlaceholderOp(name, _check_shape(shape, f"placeholder {name}"), dtype(dtype_)).output()


def reduce_axis(dom: tuple[int, int] | int, name: str = "rv") -> IterVar:
    """A reduction axis over range(lo, hi) (or range(n))."""
    lo, hi = (0, dom) if isinstance(dom, int | Expr) else dom
    if isinstance(hi, Expr) or isinstance(lo, Expr):  # a symbolic extent (a size variable)
        if isinstance(lo, Expr) and not isinstance(lo, E.Const):
            raise ValueError(f"reduce_axis {name}: a symbolic range must start at a constant, got {lo}")
        lo = int(lo.value) if isinstance(lo, E.Const) else int(lo)
        return IterVar(name, (lo, hi - lo if lo else hi), "reduce")
    if int(hi) < int(lo):
        raise ValueError(f"reduce_axis {name}: empty range ({lo}, {hi})")
    return IterVar(name, (int(lo), int(hi) - int(lo)), "reduce")


def compute(
    shape: Sequence[int] | int,
    fcompute: Callable[..., Any],
    name: str = "compute",
    tag: str = "",
    attrs: dict | None = None,
) -> Tensor:
    """A tensor whose element at (i, j, ...) is fcompute(i, j, ...)."""
    shape = _check_shape(shape, f"compute {name}")
    params = [p for p in inspect.signature(fcompute).parameters.values() if p.default is inspect.Parameter.empty]
    if len(params) == 1 and params[0].kind is inspect.Parameter.VAR_POSITIONAL:
        names = [f"i{d}" for d in range(len(shape))]
    else:
        names = [p.name for p in params]
        if len(names) != len(shape):
            raise ValueError(f"compute {name}: shape has {len(shape)} dimensions but fcompute takes {len(names)}")
    axis = [IterVar(n, (0, s), "data") for n, s in zip(names, shape)]
    body = convert(fcompute(*[iv.var for iv in axis]))
    _check_body(name, axis, body)
    return ComputeOp(name, axis, body, tag, attrs).output()


def _check_body(name: str, axis: list[IterVar], body: Expr) -> None:
    reduces = [n for n in walk(body) if isinstance(n, Reduce)]
    if reduces and not (len(reduces) == 1 and reduces[0] is body):
        raise ValueError(f"compute {name}: a reduction (te.sum/max/min/...) must be the whole body, not part of it")
    raxes = list(body.axis) if isinstance(body, Reduce) else []
    names = [iv.name for iv in axis + raxes]
    dups = {n for n in names if names.count(n) > 1}
    if dups:
        raise ValueError(f"compute {name}: axis names must be distinct, {sorted(dups)} used twice")
    known = {iv.var for iv in axis + raxes}
    shapes = [iv.dom[1] for iv in axis + raxes] + [d for n in walk(body) if isinstance(n, TensorLoad)
                                                   for d in n.tensor.shape]  # fmt: skip
    known |= {v for d in shapes if isinstance(d, Expr) for v in walk(d) if isinstance(v, Var)}  # size variables
    for n in walk(body):
        if isinstance(n, Var) and n not in known:
            raise ValueError(f"compute {name}: variable {n.name} is not an axis of this compute (missing reduce axis?)")


def comm_reducer(
    combine: Callable[[Expr, Expr], Expr], identity: Callable[[DType], Any], name: str = "reduce"
) -> Reducer:
    """A custom commutative reducer, e.g. product: comm_reducer(lambda x, y: x * y, lambda t: 1, "prod")."""
    return Reducer(name, combine, identity)


sum = Reducer("sum", lambda x, y: x + y, lambda t: 0)  # noqa: A001
max = Reducer("max", lambda x, y: E.binop("max", x, y), E.min_value)  # noqa: A001
min = Reducer("min", lambda x, y: E.binop("min", x, y), E.max_value)  # noqa: A001


def const(value: Any, dtype_: str | DType | None = None) -> Expr:
    return E.const(value, dtype_)


def var(name: str, dtype_: str | DType = "int32") -> Var:
    return Var(name, dtype(dtype_))


def cast(x: Any, dtype_: str | DType, saturate: bool = True, round_mode: str = "up") -> Expr:
    """x converted to dtype_. To and from the narrow formats (float8, float4, int4, ...) this rounds as ONNX's Cast
    with `saturate` and `round_mode` (ember.tir.narrow); they do nothing for other dtypes."""
    x = convert(x)
    t = dtype(dtype_).with_lanes(x.dtype.lanes)
    if x.dtype == t:
        return x
    if t.is_narrow or x.dtype.is_narrow:
        return narrow.convert(x, t, saturate, round_mode)
    return E.Cast(t, x)


def if_then_else(cond: Any, t: Any, f: Any) -> Expr:
    """cond ? t : f. Only the chosen side's loads are performed."""
    cond = convert(cond)
    if not cond.dtype.is_bool:
        raise TypeError(f"if_then_else: condition must be boolean, got {cond} of type {cond.dtype}")
    t, f = convert(t), convert(f)
    t = convert(t, f.dtype) if not isinstance(t, Expr) else t
    if t.dtype != f.dtype:
        common = E.binop("add", t, f).dtype if not (t.dtype.is_bool or f.dtype.is_bool) else boolean
        t, f = cast(t, common), cast(f, common)
    return E.Select(cond, t, f)


def all(*conds: Any) -> Expr:  # noqa: A001
    out: Expr = convert(True)
    for c in conds:
        out = E.binop("and", out, convert(c))
    return out


def any(*conds: Any) -> Expr:  # noqa: A001
    out: Expr = convert(False)
    for c in conds:
        out = E.binop("or", out, convert(c))
    return out


def _float_call(name: str) -> Callable[[Any], Expr]:
    def f(x: Any) -> Expr:
        x = convert(x)
        if not x.dtype.is_float:
            raise TypeError(f"te.{name} needs a float operand, got {x} of type {x.dtype}; cast it first")
        return E.Call(name, (x,), x.dtype)

    f.__name__ = name
    f.__doc__ = f"Elementwise {name} of a float expression."
    return f


exp, log, sqrt, rsqrt, tanh, erf, sigmoid = (
    _float_call(n) for n in ("exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid")
)
floor, ceil, round, sin, cos = (_float_call(n) for n in ("floor", "ceil", "round", "sin", "cos"))  # noqa: A001


def abs(x: Any) -> Expr:  # noqa: A001
    x = convert(x)
    return E.Call("abs", (x,), x.dtype)


def pow(x: Any, y: Any) -> Expr:  # noqa: A001
    x = convert(x)
    y = convert(y, x.dtype)
    if not x.dtype.is_float:
        raise TypeError(f"te.pow needs a float base, got {x.dtype}")
    return E.Call("pow", (x, cast(y, x.dtype)), x.dtype)


def maximum(a: Any, b: Any) -> Expr:
    return E.binop("max", a, b)


def minimum(a: Any, b: Any) -> Expr:
    return E.binop("min", a, b)


# ---------------------------------------------------------------------------------------------
# symbolic sizes in schedule heuristics
HINT_UNBOUNDED = 256  # the size a heuristic assumes for a size variable without an upper bound


def size_hint(x: int | Expr) -> int:
    """A size for heuristics (parallelize? which tile?): an int as is; a symbolic size evaluated with each size
    variable at its upper bound (`hi`, where it has one, capped at 4096) or HINT_UNBOUNDED. Never for correctness:
    the lowering guards every symbolic extent."""
    if not isinstance(x, Expr):
        return int(x)
    from ..tir.arith import eval_int

    env = {}
    for n in walk(x):
        if isinstance(n, Var):
            hi = getattr(n, "hi", None)
            env[n] = builtins.min(int(hi), 4096) if hi is not None else HINT_UNBOUNDED
    v = eval_int(x, env)
    return builtins.max(1, int(v)) if v is not None else HINT_UNBOUNDED


def multiple_of(x: int | Expr, k: int) -> bool:
    """Whether size x is a multiple of k for every value of its size variables (a symbolic panel width
    (S + 31) // 32 * 32 is one of 16: its rows are whole vectors)."""
    if not isinstance(x, Expr):
        return int(x) % k == 0
    from ..tir.arith import Analyzer

    r = Analyzer().simplify(E.binop("floormod", x, k))
    return isinstance(r, E.Const) and int(r.value) == 0


def prod_hint(dims: Any) -> int:
    """The product of sizes (`size_hint` for the symbolic ones)."""
    out = 1
    for d in dims:
        out *= size_hint(d)
    return out


def prod_low(dims: Any) -> int:
    """The least product of sizes: each size variable at its lower bound (at least 1). A heuristic's other end
    (`prod_hint` is the upper): rows that may be 1 at run time and 384 at the hint span a skinny and a full GEMM."""
    from ..tir.arith import eval_int

    out = 1
    for d in dims:
        if isinstance(d, Expr):
            env = {n: builtins.max(1, int(getattr(n, "lo", 1) or 1)) for n in walk(d) if isinstance(n, Var)}
            v = eval_int(d, env)
            d = builtins.max(1, int(v)) if v is not None else 1
        out *= int(d)
    return out
