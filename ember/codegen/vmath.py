"""Vector math in plain arithmetic, for the renderers of targets without a vector math library.

A kernel's compute says `exp`; the renderer decides how a vector of them is computed: glibc's libmvec
(`_ZGV..._expf`) on C targets that can link it, the native exp on GPUs, and elsewhere (LLVM, C without
libmvec) the arithmetic float32 exp of `ember.templates.nn.exp`, whose 2^n factors come from a constant
table (`EXP2_TABLE`, a gather), so that it vectorizes where the C library's expf runs once per lane.

`vector_exp(x)` gives that arithmetic as a tir expression over the vector `x`; the renderer emits it like
any other expression and defines `EXP2_TABLE` once per module as constant data (`exp2_table_values`).
"""

from __future__ import annotations

import numpy as np

from ..templates.nn import exp as arithmetic_exp
from ..tir.dtype import float32
from ..tir.expr import BinOp, Broadcast, Call, Cast, Const, Expr, Load, Select, Var
from ..tir.stmt import Buffer

EXP2_TABLE = Buffer("ember_exp2_table", (280,), "float32")  # 2^(k - 151): see templates.nn.exp_table


def exp2_table_values() -> np.ndarray:
    """The contents of EXP2_TABLE (exact powers of two; the smallest round to 0, the largest is inf)."""
    with np.errstate(over="ignore"):
        return np.ldexp(np.float32(1.0), np.arange(280) - 151).astype(np.float32)


class _Table:
    """Indexing as `arithmetic_exp` does with a te table, giving loads of EXP2_TABLE."""

    def __getitem__(self, index: Expr) -> Expr:
        return Load(EXP2_TABLE, (index,))


def wants_arithmetic_exp(name: str, dt) -> bool:
    """Whether a call is a vector float32 exp (the one the arithmetic replaces)."""
    return name == "exp" and dt.lanes > 1 and dt.scalar == float32


def vector_exp(x: Expr) -> Expr:
    """exp of the float32 vector x in arithmetic and selects, reading 2^n from EXP2_TABLE."""
    lanes = x.dtype.lanes
    scalar = Var("x", float32)
    return _lift(arithmetic_exp(scalar, _Table()), scalar, x, lanes, {})


def _lift(e: Expr, var: Var, value: Expr, lanes: int, memo: dict[int, Expr]) -> Expr:
    """The scalar expression e of var, computed on every lane of value (shared subexpressions stay shared)."""
    if e is var:
        return value
    if id(e) in memo:
        return memo[id(e)]

    def lift(c: Expr) -> Expr:
        return _lift(c, var, value, lanes, memo)

    if isinstance(e, Const):
        out: Expr = Broadcast(e, lanes)
    elif isinstance(e, BinOp):
        out = BinOp(e.op, lift(e.a), lift(e.b), e.dtype.with_lanes(lanes))
    elif isinstance(e, Select):
        out = Select(lift(e.cond), lift(e.t), lift(e.f))
    elif isinstance(e, Cast):
        out = Cast(e.dtype.with_lanes(lanes), lift(e.value))
    elif isinstance(e, Load):
        out = Load(e.buffer, tuple(lift(i) for i in e.indices))
    elif isinstance(e, Call):
        out = Call(e.name, tuple(lift(a) for a in e.args), e.dtype.with_lanes(lanes))
    else:
        raise TypeError(f"vector_exp: cannot lift {type(e).__name__}")
    memo[id(e)] = out
    return out
