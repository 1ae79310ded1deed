"""Vectorize: turn a VECTORIZED loop into vector operations (Ramp indices, vector loads/stores).

The loop variable becomes Ramp(min, 1, lanes); expressions that do not depend on it stay scalar
and are broadcast where they meet vectors. When the body cannot be expressed with vectors (a branch
on the lane, a store to one address from all lanes, an allocation, a lane count that is not a power
of two, ...) the loop stays a scalar loop with an `omp simd` hint and the reason is recorded.
"""

from __future__ import annotations

import logging

from .expr import BinOp, Broadcast, Call, Cast, Const, Expr, Load, Not, Ramp, Select, Var, same
from .functor import map_children, transform, walk
from .stmt import Allocate, Evaluate, For, ForKind, IfThenElse, LetStmt, Seq, Stmt, Store, seq

log = logging.getLogger("ember.lower")

MAX_LANES = 64


class CannotVectorize(Exception):
    pass


def _lanes(e: Expr) -> int:
    return e.dtype.lanes


def broadcast(e: Expr, lanes: int) -> Expr:
    if _lanes(e) == lanes:
        return e
    if _lanes(e) != 1:
        raise CannotVectorize(f"lane mismatch: {e} has {_lanes(e)} lanes, need {lanes}")
    return Broadcast(e, lanes)


def mask_bits(e: Expr) -> int | None:
    """Element width of the integer mask a vector boolean expression becomes in C (None: scalar)."""
    if _lanes(e) == 1:
        return None
    if isinstance(e, BinOp) and e.op in ("eq", "ne", "lt", "le", "gt", "ge"):
        return e.a.dtype.bits
    if isinstance(e, BinOp) and e.op in ("and", "or"):
        a, b = mask_bits(e.a), mask_bits(e.b)
        if a is not None and b is not None and a != b:
            raise CannotVectorize(f"mixed-width vector conditions in {e}")
        return a if a is not None else b
    if isinstance(e, Not):
        return mask_bits(e.a)
    raise CannotVectorize(f"vector boolean {e} has no mask form")


class _Vectorizer:
    def __init__(self, var: Var, base: Expr, lanes: int):
        self.var, self.base, self.lanes = var, base, lanes
        self.lets: dict[Var, Var] = {}

    # -- expressions -------------------------------------------------------------------------
    def expr(self, e: Expr) -> Expr:
        if e is self.var:
            return Ramp(self.base, Const(1, e.dtype), self.lanes)
        if isinstance(e, Var):
            return self.lets.get(e, e)
        if isinstance(e, Const):
            return e
        if isinstance(e, Ramp | Broadcast):
            raise CannotVectorize("nested vectorized loops")
        if isinstance(e, Load):
            idx = tuple(self.expr(i) for i in e.indices)
            if all(_lanes(i) == 1 for i in idx):
                return Load(e.buffer, idx)
            if len(idx) != 1:
                raise CannotVectorize("vector access of a multi-dimensional buffer")
            if e.buffer.dtype.is_bool:
                raise CannotVectorize(f"vector load of bool buffer {e.buffer.name}")
            return Load(e.buffer, (broadcast(idx[0], self.lanes),))
        e2 = map_children(e, lambda c: self.expr(c) if isinstance(c, Expr) else c)
        if all(_lanes(c) == 1 for c in _expr_children(e2)):
            return e2  # type: ignore[return-value]
        if isinstance(e2, BinOp):
            return self.binop(e2)
        if isinstance(e2, Select):
            return self.select(e2)
        if isinstance(e2, Cast):
            if e2.value.dtype.is_bool or e2.dtype.is_bool:
                raise CannotVectorize(f"vector cast involving bool: {e}")
            return Cast(e2.dtype.with_lanes(self.lanes), e2.value)
        if isinstance(e2, Call):
            args = tuple(broadcast(a, self.lanes) for a in e2.args)
            return Call(e2.name, args, e2.dtype.with_lanes(self.lanes))
        if isinstance(e2, Not):
            mask_bits(e2.a)
            return e2
        raise CannotVectorize(f"cannot vectorize {type(e).__name__}")

    def binop(self, e: BinOp) -> Expr:
        a, b, L = e.a, e.b, self.lanes
        if e.dtype.is_int and e.op in ("add", "sub", "mul"):
            ra, rb = isinstance(a, Ramp), isinstance(b, Ramp)
            sa, sb = _lanes(a) == 1, _lanes(b) == 1
            if e.op in ("add", "sub"):
                if ra and sb:
                    return Ramp(BinOp(e.op, a.base, b, b.dtype), a.stride, L)  # type: ignore[union-attr]
                if sa and rb:
                    stride = b.stride if e.op == "add" else BinOp("sub", Const(0, a.dtype), b.stride, a.dtype)  # type: ignore[union-attr]
                    return Ramp(BinOp(e.op, a, b.base, a.dtype), stride, L)  # type: ignore[union-attr]
                if ra and rb:
                    base = BinOp(e.op, a.base, b.base, a.dtype.scalar)  # type: ignore[union-attr]
                    return Ramp(base, BinOp(e.op, a.stride, b.stride, a.dtype.scalar), L)  # type: ignore[union-attr]
            if e.op == "mul":
                if ra and sb:
                    return Ramp(BinOp("mul", a.base, b, b.dtype), BinOp("mul", a.stride, b, b.dtype), L)  # type: ignore[union-attr]
                if sa and rb:
                    return Ramp(BinOp("mul", a, b.base, a.dtype), BinOp("mul", a, b.stride, a.dtype), L)  # type: ignore[union-attr]
        if e.op in ("and", "or"):
            mask_bits(BinOp(e.op, broadcast(a, L), broadcast(b, L), e.dtype.with_lanes(L)))
        return BinOp(e.op, broadcast(a, L), broadcast(b, L), e.dtype.with_lanes(L))

    def select(self, e: Select) -> Expr:
        L = self.lanes
        if _lanes(e.cond) == 1:
            return Select(e.cond, broadcast(e.t, L), broadcast(e.f, L))
        read = [n for n in walk(e.cond) if isinstance(n, Load)]  # evaluated for every lane anyway
        guarded = [n for side in (e.t, e.f) for n in walk(side) if isinstance(n, Load)]
        if any(not any(same(g, r) for r in read) for g in guarded):
            raise CannotVectorize("a per-lane condition guards a memory read (padding/boundary check)")
        bits = mask_bits(e.cond)
        if e.t.dtype.is_bool or bits != e.t.dtype.bits:
            raise CannotVectorize(f"select of {e.t.dtype} under a {bits}-bit condition")
        return Select(e.cond, broadcast(e.t, L), broadcast(e.f, L))

    # -- statements --------------------------------------------------------------------------
    def stmt(self, s: Stmt) -> Stmt:
        if isinstance(s, Store):
            idx = [self.expr(i) for i in s.indices]
            value = self.expr(s.value)
            if all(_lanes(i) == 1 for i in idx):
                if _lanes(value) != 1:
                    raise CannotVectorize(f"all lanes store to the same element of {s.buffer.name}")
                return Store(s.buffer, value, tuple(idx))
            if len(idx) != 1:
                raise CannotVectorize("vector store to a multi-dimensional buffer")
            if s.buffer.dtype.is_bool or value.dtype.is_bool:
                raise CannotVectorize(f"vector store of bool buffer {s.buffer.name}")
            return Store(s.buffer, broadcast(value, self.lanes), (broadcast(idx[0], self.lanes),))
        if isinstance(s, For):
            lo, ext = self.expr(s.min), self.expr(s.extent)
            if _lanes(lo) != 1 or _lanes(ext) != 1:
                raise CannotVectorize(f"inner loop {s.var.name} bounds depend on the vector lane")
            return For(s.var, lo, ext, s.kind, self.stmt(s.body), s.thread_tag, s.annotations)
        if isinstance(s, IfThenElse):
            cond = self.expr(s.cond)
            if _lanes(cond) != 1:
                raise CannotVectorize(f"branch on the vector lane: if {s.cond}")
            other = self.stmt(s.else_case) if s.else_case is not None else None
            return IfThenElse(cond, self.stmt(s.then_case), other)
        if isinstance(s, LetStmt):
            value = self.expr(s.value)
            if _lanes(value) == 1:
                return LetStmt(s.var, value, self.stmt(s.body))
            if value.dtype.is_bool:
                raise CannotVectorize("vector boolean let")
            v = Var(s.var.name, value.dtype)
            self.lets[s.var] = v
            return LetStmt(v, value, self.stmt(s.body))
        if isinstance(s, Seq):
            return Seq(tuple(self.stmt(x) for x in s.stmts))
        if isinstance(s, Evaluate) and isinstance(s.value, Const):
            return s
        if isinstance(s, Allocate):
            raise CannotVectorize(f"allocation of {s.buffer.name} inside the vectorized loop")
        raise CannotVectorize(f"cannot vectorize {type(s).__name__}")


def _expr_children(e: object) -> list[Expr]:
    out: list[Expr] = []
    for v in e._values():  # type: ignore[attr-defined]
        if isinstance(v, Expr):
            out.append(v)
        elif isinstance(v, tuple):
            out.extend(x for x in v if isinstance(x, Expr))
    return out


def vectorize_loop(loop: For) -> Stmt:
    if not isinstance(loop.extent, Const):
        return _fallback(loop, "extent is not a constant")
    lanes = int(loop.extent.value)
    if lanes == 1:
        from .functor import substitute

        return substitute(loop.body, {loop.var: loop.min})  # type: ignore[return-value]
    pieces = lanes & (lanes - 1) and lanes < MAX_LANES and dict(loop.annotations).get("vector_pieces")
    if lanes & (lanes - 1) and not pieces or lanes > MAX_LANES:
        return _fallback(loop, f"{lanes} lanes (needs a power of two <= {MAX_LANES})")
    half = [n for n in walk(loop.body) if isinstance(n, Expr) and n.dtype.is_half]
    if half or any(isinstance(n, Load | Store) and n.buffer.dtype.is_half for n in walk(loop.body)):
        return _fallback(loop, "16-bit floats are converted element by element")
    if pieces:
        return _vector_pieces(loop, lanes)
    try:
        return _Vectorizer(loop.var, loop.min, lanes).stmt(loop.body)
    except CannotVectorize as e:
        return _fallback(loop, str(e))


def _vector_pieces(loop: For, lanes: int) -> Stmt:
    """A loop of `lanes` iterations, not a power of two, as vectors of its binary digits, largest first (15:
    8 + 4 + 2 + 1), where the schedule asks for it (pragma `vector_pieces`: the lanes that a loop partition peeled
    off a vector at a padded border); kept scalar if a piece does not vectorize."""
    from .functor import substitute

    pieces, start = [], 0
    for bit in reversed(range(lanes.bit_length())):
        n = 1 << bit
        if not lanes & n:
            continue
        base = loop.min + start if start else loop.min
        if n == 1:
            pieces.append(substitute(loop.body, {loop.var: base}))
        else:
            try:
                pieces.append(_Vectorizer(loop.var, base, n).stmt(loop.body))
            except CannotVectorize as e:
                return _fallback(loop, f"{lanes} lanes in pieces: {e}")
        start += n
    return seq(*pieces)


def _fallback(loop: For, reason: str) -> For:
    log.info("vectorize %s: kept as a scalar loop: %s", loop.var.name, reason)
    notes = (*loop.annotations, ("vectorize_fallback", reason))
    return For(loop.var, loop.min, loop.extent, ForKind.SERIAL, loop.body, None, notes)


def vectorize_loops(body: Stmt) -> Stmt:
    def post(n):
        if isinstance(n, For) and n.kind is ForKind.VECTORIZED:
            return vectorize_loop(n)
        return None

    return transform(body, post)  # type: ignore[return-value]
