"""Statements of the loop IR, buffers and functions."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

from .dtype import DType, dtype
from .expr import Const, Expr, Node, Var, const


def _product(dims: tuple) -> Expr:
    out: Any = 1
    for d in dims:
        out = d * out if isinstance(d, Expr) else out * d
    return out


def size_params(buffers: Any) -> list[Var]:
    """The size variables in the buffers' shapes, in order of first appearance: a kernel's size arguments."""
    from .functor import walk

    out: dict[Var, None] = {}
    for b in buffers:
        for d in b.shape:
            if isinstance(d, Expr):
                out.update((n, None) for n in walk(d) if isinstance(n, Var))
    return list(out)


class Buffer:
    """A named n-d array in a memory scope ("global", "local", "shared"). Compared by identity."""

    def __init__(self, name: str, shape: tuple[int | Expr, ...], dt: str | DType, scope: str = "global"):
        self.name = name
        self.shape = tuple(s if isinstance(s, Expr) and not isinstance(s, Const) else int(getattr(s, "value", s))
                           for s in shape)  # fmt: skip
        self.dtype = dtype(dt)
        self.scope = scope

    @property
    def is_static(self) -> bool:
        """Whether every dim is an int (else some are expressions of size variables, kernel arguments)."""
        return all(isinstance(s, int) for s in self.shape)

    @property
    def size(self) -> int | Expr:
        return math.prod(self.shape) if self.is_static else _product(self.shape)

    @property
    def nbytes(self) -> int | Expr:
        return self.size * self.dtype.itemsize

    @property
    def strides(self) -> tuple[int, ...]:
        out, acc = [], 1
        for s in reversed(self.shape):
            out.append(acc)
            acc *= s
        return tuple(reversed(out))

    def __getitem__(self, idx) -> Expr:
        from .expr import Load, convert

        idx = idx if isinstance(idx, tuple) else (idx,)
        return Load(self, tuple(convert(i) for i in idx))

    def __repr__(self) -> str:
        dims = ", ".join(map(str, self.shape))
        scope = "" if self.scope == "global" else f", scope={self.scope}"
        return f"Buffer({self.name}: {self.dtype}[{dims}]{scope})"


class ForKind(enum.Enum):
    SERIAL = "serial"
    PARALLEL = "parallel"
    VECTORIZED = "vectorized"
    UNROLLED = "unrolled"
    THREAD_BINDING = "thread_binding"


class Stmt(Node):
    __slots__ = ()

    def __eq__(self, other):
        from .expr import same

        return same(self, other)

    __hash__ = Node.__hash__


@dataclass(frozen=True, eq=False)
class For(Stmt):
    var: Var
    min: Expr
    extent: Expr
    kind: ForKind
    body: Stmt
    thread_tag: str | None = None  # for THREAD_BINDING: "blockIdx.x", "threadIdx.y", ...
    annotations: tuple[tuple[str, Any], ...] = ()  # pragmas: (("unroll_explicit", 1), ...)


@dataclass(frozen=True, eq=False)
class Store(Stmt):
    """Write of value at indices; a vector store with a `predicate` (a vector boolean) writes only the lanes where
    it is true (a masked store: the tail of a vector tile)."""

    buffer: Buffer
    value: Expr
    indices: tuple[Expr, ...]
    predicate: Expr | None = None


@dataclass(frozen=True, eq=False)
class Allocate(Stmt):
    """Storage for `buffer` (its scope says where) live while `body` runs."""

    buffer: Buffer
    body: Stmt


@dataclass(frozen=True, eq=False)
class IfThenElse(Stmt):
    cond: Expr
    then_case: Stmt
    else_case: Stmt | None = None


@dataclass(frozen=True, eq=False)
class LetStmt(Stmt):
    var: Var
    value: Expr
    body: Stmt


@dataclass(frozen=True, eq=False)
class Seq(Stmt):
    stmts: tuple[Stmt, ...]


@dataclass(frozen=True, eq=False)
class Evaluate(Stmt):
    value: Expr


def seq(*stmts: Stmt | None) -> Stmt:
    """A Seq that flattens nested Seqs and drops empty parts (NOP when nothing is left)."""
    out: list[Stmt] = []
    for s in stmts:
        if s is None:
            continue
        if isinstance(s, Seq):
            out.extend(s.stmts)
        elif not (isinstance(s, Evaluate) and isinstance(s.value, Expr) and _is_noop(s)):
            out.append(s)
    if len(out) == 1:
        return out[0]
    if not out:  # everything dropped: a no-op, so that loops around it are recognized as empty
        return NOP
    return Seq(tuple(out))


def _is_noop(s: Evaluate) -> bool:
    from .expr import Const

    return isinstance(s.value, Const)


NOP = Evaluate(const(0))


@dataclass(eq=False)
class PrimFunc:
    """A lowered function: buffers in, loop nest body, no return value."""

    name: str
    params: tuple[Buffer, ...]
    body: Stmt
    attrs: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        from .printer import format_func

        return format_func(self)

    __repr__ = __str__

    def with_body(self, body: Stmt) -> PrimFunc:
        return PrimFunc(self.name, self.params, body, dict(self.attrs))
