"""Scalar and vector expressions of the loop IR.

Every node is a frozen dataclass. Structural equality and hashing are shared by all nodes
(`same`, cached `__hash__`), except `Var`, which is compared by identity: two loops named `i`
are different variables.

`a == b` on expressions builds the comparison node `a == b` (so `te.if_then_else(i == 0, ...)`
works); used as a Python bool, that node answers whether a and b are structurally the same.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any

import numpy as np

from .dtype import DType, boolean, dtype, float32, int32, promote

ARITH_OPS = ("add", "sub", "mul", "div", "floordiv", "floormod", "min", "max")
CMP_OPS = ("eq", "ne", "lt", "le", "gt", "ge")
LOGIC_OPS = ("and", "or")


_FIELDS: dict[type, Callable[[Any], tuple]] = {}  # the field values of a node type, as a tuple


class Node:
    """Base of expressions and statements: generic children, structural hash."""

    __slots__ = ()

    def _values(self) -> tuple:
        get = _FIELDS.get(type(self))
        if get is None:
            names = tuple(f.name for f in fields(self))  # type: ignore[arg-type]
            get = _FIELDS[type(self)] = (
                attrgetter(*names) if len(names) > 1 else (lambda n, g=attrgetter(*names): (g(n),))
            )
        return get(self)

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((type(self).__name__, *(_hash_field(v) for v in self._values())))
            object.__setattr__(self, "_hash", h)
        return h

    def __str__(self) -> str:
        from .printer import format_node

        return format_node(self)

    __repr__ = __str__


def _hash_field(v: Any) -> int:
    if isinstance(v, tuple):
        return hash(tuple(_hash_field(x) for x in v))
    if isinstance(v, float) and math.isnan(v):
        return 0
    return hash(v)


def same(a: Any, b: Any) -> bool:
    """Structural equality of IR nodes (variables and buffers by identity)."""
    if a is b:
        return True
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, Node):
        if type(a) is not type(b) or isinstance(a, Var) or hash(a) != hash(b):
            return False
        return all(same(x, y) for x, y in zip(a._values(), b._values()))
    return bool(a == b)


class Expr(Node):
    """An expression with a dtype. Python operators build new expressions."""

    __slots__ = ()
    dtype: DType

    def __bool__(self):
        raise TypeError(
            f"cannot use the symbolic expression `{self}` as a Python bool; "
            "build conditions with te.all/te.any/te.if_then_else instead"
        )

    # arithmetic
    def __add__(self, o):
        return binop("add", self, o)

    def __radd__(self, o):
        return binop("add", o, self)

    def __sub__(self, o):
        return binop("sub", self, o)

    def __rsub__(self, o):
        return binop("sub", o, self)

    def __mul__(self, o):
        return binop("mul", self, o)

    def __rmul__(self, o):
        return binop("mul", o, self)

    def __truediv__(self, o):
        return binop("div", self, o)

    def __rtruediv__(self, o):
        return binop("div", o, self)

    def __floordiv__(self, o):
        return binop("floordiv", self, o)

    def __rfloordiv__(self, o):
        return binop("floordiv", o, self)

    def __mod__(self, o):
        return binop("floormod", self, o)

    def __rmod__(self, o):
        return binop("floormod", o, self)

    def __neg__(self):
        return binop("sub", const(0, self.dtype), self)

    # comparisons and logic
    def __lt__(self, o):
        return binop("lt", self, o)

    def __le__(self, o):
        return binop("le", self, o)

    def __gt__(self, o):
        return binop("gt", self, o)

    def __ge__(self, o):
        return binop("ge", self, o)

    def __eq__(self, o):  # type: ignore[override]
        if not isinstance(o, Expr | int | float | bool | np.number):
            return NotImplemented
        return binop("eq", self, o)

    def __ne__(self, o):  # type: ignore[override]
        if not isinstance(o, Expr | int | float | bool | np.number):
            return NotImplemented
        return binop("ne", self, o)

    def __and__(self, o):
        return binop("and", self, o)

    def __rand__(self, o):
        return binop("and", o, self)

    def __or__(self, o):
        return binop("or", self, o)

    def __ror__(self, o):
        return binop("or", o, self)

    def __invert__(self):
        return Not(convert(self))

    __hash__ = Node.__hash__


_var_ids = itertools.count()


@dataclass(frozen=True, eq=False)
class Var(Expr):
    """A variable (loop index, let binding). Compared by identity."""

    name: str
    dtype: DType = int32

    def __hash__(self):
        return id(self)


@dataclass(frozen=True, eq=False)
class Const(Expr):
    value: int | float | bool
    dtype: DType

    __hash__ = Node.__hash__


@dataclass(frozen=True, eq=False)
class BinOp(Expr):
    """Binary operation: one of ARITH_OPS, CMP_OPS, LOGIC_OPS. Build with `binop`."""

    op: str
    a: Expr
    b: Expr
    dtype: DType

    __hash__ = Node.__hash__

    def __bool__(self):
        if self.op == "eq":
            return same(self.a, self.b)
        if self.op == "ne":
            return not same(self.a, self.b)
        return Expr.__bool__(self)


@dataclass(frozen=True, eq=False)
class Not(Expr):
    a: Expr

    @property
    def dtype(self) -> DType:  # type: ignore[override]
        return self.a.dtype

    __hash__ = Node.__hash__


@dataclass(frozen=True, eq=False)
class Select(Expr):
    """`cond ? t : f`; both sides may be evaluated."""

    cond: Expr
    t: Expr
    f: Expr

    @property
    def dtype(self) -> DType:  # type: ignore[override]
        return self.t.dtype

    __hash__ = Node.__hash__


@dataclass(frozen=True, eq=False)
class Cast(Expr):
    dtype: DType
    value: Expr

    __hash__ = Node.__hash__


@dataclass(frozen=True, eq=False)
class Call(Expr):
    """A math intrinsic (exp, log, sqrt, ...) or a runtime helper, by name."""

    name: str
    args: tuple[Expr, ...]
    dtype: DType

    __hash__ = Node.__hash__


@dataclass(frozen=True, eq=False)
class Load(Expr):
    """Read of buffer at indices (one per dimension; a single flat index after flattening). A vector load may
    have a `predicate` (a vector boolean): lanes where it is false are not read and hold zero (a masked load)."""

    buffer: Any  # tir.Buffer
    indices: tuple[Expr, ...]
    predicate: Expr | None = None

    @property
    def dtype(self) -> DType:  # type: ignore[override]
        lanes = max((i.dtype.lanes for i in self.indices), default=1)
        return self.buffer.dtype.with_lanes(lanes)

    __hash__ = Node.__hash__


@dataclass(frozen=True, eq=False)
class Ramp(Expr):
    """The vector [base, base + stride, ..., base + (lanes-1)*stride]."""

    base: Expr
    stride: Expr
    lanes: int

    @property
    def dtype(self) -> DType:  # type: ignore[override]
        return self.base.dtype.with_lanes(self.lanes)

    __hash__ = Node.__hash__


@dataclass(frozen=True, eq=False)
class Broadcast(Expr):
    value: Expr
    lanes: int

    @property
    def dtype(self) -> DType:  # type: ignore[override]
        return self.value.dtype.with_lanes(self.lanes)

    __hash__ = Node.__hash__


# ---------------------------------------------------------------------------------------------
# construction helpers


def const(value: Any, dt: str | DType | None = None) -> Const:
    """A constant; dtype inferred from the Python value when not given."""
    if dt is None:
        if isinstance(value, bool | np.bool_):
            dt = boolean
        elif isinstance(value, int | np.integer):
            dt = dtype(np.asarray(value).dtype) if isinstance(value, np.integer) else _int_dtype(value)
        elif isinstance(value, float | np.floating):
            dt = dtype(np.asarray(value).dtype) if isinstance(value, np.floating) else float32
        else:
            raise TypeError(f"cannot make a constant from {value!r}")
    dt = dtype(dt)
    if dt.is_bool:
        value = bool(value)
    elif dt.is_int:
        if isinstance(value, float) and not float(value).is_integer():
            raise TypeError(f"constant {value!r} is not an integer but dtype is {dt}")
        value = int(value)
    else:
        value = float(value)
    return Const(value, dt.scalar)


def _int_dtype(value: int) -> DType:
    return int32 if -(2**31) <= value < 2**31 else dtype("int64")


def convert(x: Any, like: DType | None = None) -> Expr:
    """Turn a Python scalar into a Const (adopting `like`'s dtype where sensible)."""
    if isinstance(x, Expr):
        return x
    if hasattr(x, "as_expr"):  # objects of higher layers that stand for an expression (te.IterVar)
        return x.as_expr()
    if isinstance(x, bool | np.bool_):
        return const(bool(x), boolean)
    if like is not None and not like.is_bool:
        if isinstance(x, float | np.floating) and not like.is_float:
            return const(x, float32)
        if isinstance(x, int) and like.is_int and not min_value(like) <= x <= max_value(like):
            return const(x)  # 2**40 next to an int32 index is an int64 constant (the sum is int64)
        return const(x, like.scalar)
    return const(x)


def binop(op: str, a: Any, b: Any) -> Expr:
    """Build a BinOp, converting Python scalars and checking/promoting dtypes."""
    a = a.as_expr() if hasattr(a, "as_expr") else a
    b = b.as_expr() if hasattr(b, "as_expr") else b
    if not isinstance(a, Expr) and not isinstance(b, Expr):
        a, b = convert(a), convert(b)
    a = convert(a, b.dtype if isinstance(b, Expr) else None)
    b = convert(b, a.dtype)
    if op in LOGIC_OPS:
        if not (a.dtype.is_bool and b.dtype.is_bool):
            raise TypeError(f"logical {op} needs bool operands, got {a.dtype} and {b.dtype}")
        return BinOp(op, a, b, promote(a.dtype, b.dtype))
    t = promote(a.dtype, b.dtype)
    if a.dtype.scalar != t.scalar:
        a = Cast(t.with_lanes(a.dtype.lanes), a)
    if b.dtype.scalar != t.scalar:
        b = Cast(t.with_lanes(b.dtype.lanes), b)
    if op == "div" and not t.is_float:
        raise TypeError(f"`/` on integer operands ({a} / {b}); use `//` for floor division")
    if op in CMP_OPS:
        return BinOp(op, a, b, boolean.with_lanes(t.lanes))
    return BinOp(op, a, b, t)


def is_const(e: Any, value: Any = None) -> bool:
    if not isinstance(e, Const):
        return False
    return value is None or e.value == value


def const_value(e: Expr) -> int | float | bool | None:
    return e.value if isinstance(e, Const) else None


def min_value(dt: DType) -> int | float:
    dt = dt.scalar
    if dt.is_float:
        return -math.inf
    if dt.is_bool:
        return False
    return int(np.iinfo(dt.numpy).min)


def max_value(dt: DType) -> int | float:
    dt = dt.scalar
    if dt.is_float:
        return math.inf
    if dt.is_bool:
        return True
    return int(np.iinfo(dt.numpy).max)
