"""Vectorize: turn a VECTORIZED loop into vector operations (Ramp indices, vector loads/stores).

The loop variable becomes Ramp(min, 1, lanes); expressions that do not depend on it stay scalar
and are broadcast where they meet vectors. A branch on the lane around stores (the tail of a tile:
`if lane < n: y[...] = ...`) becomes masked stores, their vector loads masked loads where they may
reach past their buffer, and a per-lane select between loads (padding) masks each side's loads by its
condition. When the body cannot be expressed with vectors (another branch on the lane, a store to one
address from all lanes, an allocation, a lane count that is not a power of two, ...) the loop stays a
scalar loop with an `omp simd` hint and the reason is recorded.
"""

from __future__ import annotations

import logging

from .dtype import DType, boolean
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
        if isinstance(e, Select) and _lanes(e.cond) == 1 and len(parts := _conjuncts(e.cond)) > 1:
            varies = [self.varies(c) for c in parts]
            if any(varies) and not all(varies):  # a uniform part (the padding rows of a fused row loop): a branch
                uniform = _all([c for c, v in zip(parts, varies) if not v])  # on it, around the per-lane select
                lane = _all([c for c, v in zip(parts, varies) if v])
                return self.expr(Select(uniform, Select(lane, e.t, e.f), e.f))
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

    def varies(self, e: Expr) -> bool:
        """Whether e differs between lanes (reads the loop variable, or a let that does)."""
        return any(n is self.var or (isinstance(n, Var) and n in self.lets) for n in walk(e))

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
        bits = mask_bits(e.cond) or 0
        if e.t.dtype.is_bool or (bits != e.t.dtype.bits and bits * L > 512):  # (narrowing a mask that spans
            raise CannotVectorize(f"select of {e.t.dtype} under a {bits}-bit condition")  # registers: slower)
        # a read on one side only (padding, a boundary check): masked by that side's condition
        t = _mask_loads(broadcast(e.t, L), e.cond, read)
        f = _mask_loads(broadcast(e.f, L), Not(e.cond), read)
        return Select(e.cond, t, f)

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
            parts = [(c, self.expr(c)) for c in _conjuncts(s.cond)] if s.else_case is None else []
            lane = [c for c, v in parts if _lanes(v) != 1]
            if lane:  # a guard per lane (a tile's tail): masked stores, within a branch on the uniform part
                uniform = [v for _, v in parts if _lanes(v) == 1]
                body = self.masked(self.expr(_all(lane)), s.then_case, s.cond)
                return IfThenElse(_all(uniform), body) if uniform else body
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


    def masked(self, cond: Expr, body: Stmt, scalar_cond: Expr) -> Stmt:
        """`if cond: body` with cond per lane: body's stores masked by cond (and their vector loads, where they may
        reach past their buffer); only stores (and sequences of them) can be masked. A scalar read (a row's sum,
        broadcast) is made only when some lane is active: under a branch on the first lane, where the condition
        bounds increasing lanes (`lane < n`: the tail of a tile), else not at all (the loop stays scalar)."""
        mask_bits(cond)
        read = [n for n in walk(cond) if isinstance(n, Load)]
        first = _first_lane(cond)
        out = self.stmt(body)
        scalar_reads = False

        def mask(s: Stmt) -> Stmt:
            nonlocal scalar_reads
            if isinstance(s, Seq):
                return Seq(tuple(mask(x) for x in s.stmts))
            if not isinstance(s, Store) or _lanes(s.indices[0]) == 1:
                raise CannotVectorize(f"branch on the vector lane: if {scalar_cond}")
            for n in walk(s):
                if isinstance(n, Load) and _lanes(n) == 1 and not _in_bounds(n) and not any(same(n, r) for r in read):
                    if first is None:
                        raise CannotVectorize(f"a per-lane condition guards a scalar read of {n.buffer.name}")
                    scalar_reads = True
            value = _mask_loads(s.value, cond, read + ([] if first is None else _scalar_loads(s.value)))
            pred = cond if s.predicate is None else BinOp("and", s.predicate, cond, cond.dtype)
            mask_bits(pred)  # conditions of one width (a mask per element), else the loop stays scalar
            return Store(s.buffer, value, s.indices, pred)

        out = mask(out)
        return IfThenElse(first, out) if scalar_reads else out


def _scalar_loads(e: Expr) -> list[Load]:
    return [n for n in walk(e) if isinstance(n, Load) and _lanes(n) == 1]


def _first_lane(cond: Expr) -> Expr | None:
    """Whether any lane of a vector condition holds, as a scalar condition, where each of its conjuncts bounds an
    increasing ramp (`ramp(b, s, L) < broadcast(n)`, s > 0: any lane holds iff the first does); None otherwise."""
    out = []
    for c in _conjuncts(cond):
        if not (isinstance(c, BinOp) and c.op in ("lt", "le") and isinstance(c.b, Broadcast)):
            return None
        a = c.a.value if isinstance(c.a, Cast) and isinstance(c.a.value, Ramp) else c.a  # a lane offset, cast
        if not (isinstance(a, Ramp) and isinstance(a.stride, Const) and a.stride.value > 0):
            return None
        base = Cast(c.b.value.dtype, a.base) if a.base.dtype != c.b.value.dtype else a.base
        out.append(BinOp(c.op, base, c.b.value, c.dtype.with_lanes(1)))
    return _all(out) if out else None


def _conjuncts(c: Expr) -> list[Expr]:
    if isinstance(c, BinOp) and c.op == "and":
        return _conjuncts(c.a) + _conjuncts(c.b)
    return [c]


def _all(cs: list[Expr]) -> Expr:
    out = cs[0]
    for c in cs[1:]:
        out = BinOp("and", out, c, out.dtype)
    return out


def lane_mask(pred: Expr) -> list[bool] | None:
    """The lanes of a mask that is a constant (comparisons of constant ramps and broadcasts, as unrolling leaves
    them), or None."""
    if isinstance(pred, Ramp) and isinstance(pred.base, Const) and isinstance(pred.stride, Const):
        return [pred.base.value + pred.stride.value * i for i in range(pred.lanes)]  # type: ignore[return-value]
    if isinstance(pred, Broadcast) and isinstance(pred.value, Const):
        return [pred.value.value] * pred.lanes
    if isinstance(pred, Cast):
        return lane_mask(pred.value)
    if isinstance(pred, Not):
        a = lane_mask(pred.a)
        return None if a is None else [not x for x in a]
    if isinstance(pred, BinOp) and pred.op in _LANE_OPS:
        a, b = lane_mask(pred.a), lane_mask(pred.b)
        if a is None or b is None:
            return None
        return [_LANE_OPS[pred.op](x, y) for x, y in zip(a, b)]
    return None


_LANE_OPS = {"lt": lambda x, y: x < y, "le": lambda x, y: x <= y, "gt": lambda x, y: x > y, "ge": lambda x, y: x >= y,
             "eq": lambda x, y: x == y, "ne": lambda x, y: x != y, "and": lambda x, y: bool(x and y),
             "or": lambda x, y: bool(x or y), "add": lambda x, y: x + y, "sub": lambda x, y: x - y}  # fmt: skip


def _in_bounds(n: Load) -> bool:
    """A load at constant offsets (a scalar, or a contiguous ramp) within its buffer's static size."""
    idx = n.indices[0] if len(n.indices) == 1 else None
    size = getattr(n.buffer, "size", None)
    if idx is None or not isinstance(size, int):
        return False
    if isinstance(idx, Const):
        return 0 <= idx.value < size
    return (isinstance(idx, Ramp) and isinstance(idx.base, Const) and isinstance(idx.stride, Const)
            and idx.base.value >= 0 and idx.base.value + idx.stride.value * (idx.lanes - 1) < size)  # fmt: skip


def _mask_loads(e: Expr, cond: Expr, read: list[Load]) -> Expr:
    """e with its vector loads masked by cond (lanes where it is false are not read), except those that cannot
    fault (within their buffer at constant offsets) and those the condition itself reads; a scalar load there
    (read whatever the lanes) must be within its buffer."""

    def post(n):
        if not isinstance(n, Load) or any(same(n, r) for r in read) or _in_bounds(n):
            return None
        if _lanes(n) == 1:
            raise CannotVectorize(f"a per-lane condition guards a scalar read of {n.buffer.name}")
        pred = cond if n.predicate is None else BinOp("and", n.predicate, cond, cond.dtype)
        mask_bits(pred)
        return Load(n.buffer, n.indices, pred)

    return transform(e, post)  # type: ignore[return-value]


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
    loop = _half_round_trips(loop)
    half = [n for n in walk(loop.body) if isinstance(n, Expr) and n.dtype.is_half]
    if half or any(isinstance(n, Load | Store) and n.buffer.dtype.is_half for n in walk(loop.body)):
        return _fallback(loop, "16-bit floats are converted element by element")
    if lanes > MAX_LANES:
        return _fallback(loop, f"{lanes} lanes (needs a power of two <= {MAX_LANES})")
    if lanes & (lanes - 1) and dict(loop.annotations).get("vector_pieces"):
        return _vector_pieces(loop, lanes)
    if lanes & (lanes - 1):  # the next power of two, the lanes past the extent masked off (a tile's tail)
        try:
            return _Vectorizer(loop.var, loop.min, 1 << lanes.bit_length()).stmt(_lane_guard(loop, lanes))
        except CannotVectorize as e:
            return _fallback(loop, f"{lanes} lanes (not a power of two) and no masked form: {e}")
    try:
        return _Vectorizer(loop.var, loop.min, lanes).stmt(loop.body)
    except CannotVectorize as e:
        return _fallback(loop, str(e))


HALF_ROUND = {"bfloat16": "round_bf16", "float16": "round_f16"}  # Call names: float32 rounded to a 16-bit float


def _half_round_trips(loop: For) -> For:
    """float32(half(x)) of a float32 x (an activation rounded to bfloat16 between two float32 kernels, as
    `ember.quantize(precision="bf16")` writes it) as Call("round_bf16" | "round_f16", x): a float32 operation
    the vector code does in registers (C: integer bit operations on the lanes), where the 16-bit value itself
    would send the loop to scalar code."""

    def post(e):
        if (isinstance(e, Cast) and e.dtype.name == "float32" and isinstance(e.value, Cast)
                and e.value.dtype.name in HALF_ROUND and e.value.value.dtype.name == "float32"):  # fmt: skip
            return Call(HALF_ROUND[e.value.dtype.name], (e.value.value,), e.dtype)
        return None

    body = transform(loop.body, post)
    return loop if body is loop.body else For(loop.var, loop.min, loop.extent, loop.kind, body, loop.thread_tag,
                                              loop.annotations)  # fmt: skip


def _lane_guard(loop: For, lanes: int) -> Stmt:
    """The loop's body under `var - min < lanes`, the comparison in integers as wide as the elements it stores
    (a mask that selects whole elements)."""
    stores = [n for n in walk(loop.body) if isinstance(n, Store)]
    bits = stores[0].buffer.dtype.bits if stores and stores[0].buffer.dtype.bits in (8, 16, 32, 64) else 32
    it = DType(f"int{bits}")
    lane = Cast(it, BinOp("sub", loop.var, loop.min, loop.var.dtype))
    return IfThenElse(BinOp("lt", lane, Const(lanes, it), boolean), loop.body)


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
