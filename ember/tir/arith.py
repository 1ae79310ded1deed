"""Integer analysis and the arithmetic simplifier.

`Analyzer` knows constant bounds of variables (loop ranges) and offers:
  * `bounds(e)`: a constant interval [lo, hi] (None = unbounded) for an integer expression;
  * `simplify(e)`: constant folding, canonical affine forms (sum of coefficient * term + constant),
    floordiv/floormod rules that use the bounds, min/max and comparisons decided by the bounds;
  * `can_prove(cond)`.

Integer expressions are put in a linear form `Lin = (terms: {atom: coeff}, const)`; an atom is any
expression that is not a sum or a product by a constant (a variable, a floordiv, a load, ...).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from .dtype import DType, boolean
from .expr import (
    CMP_OPS,
    BinOp,
    Broadcast,
    Call,
    Cast,
    Const,
    Expr,
    Not,
    Ramp,
    Select,
    Var,
    const,
    max_value,
    min_value,
    same,
)
from .functor import map_children
from .functor import walk as _walk
from .printer import format_expr

Bound = tuple[int | None, int | None]
Lin = tuple[dict[Expr, int], int]


def _add(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a + b


def _scale(b: Bound, c: int) -> Bound:
    lo, hi = b
    lo2 = None if lo is None else lo * c
    hi2 = None if hi is None else hi * c
    return (lo2, hi2) if c >= 0 else (hi2, lo2)


def _union(a: Bound, b: Bound) -> Bound:
    lo = None if a[0] is None or b[0] is None else min(a[0], b[0])
    hi = None if a[1] is None or b[1] is None else max(a[1], b[1])
    return lo, hi


def _mul_bounds(a: Bound, b: Bound) -> Bound:
    if None in a or None in b:
        if a == (0, 0) or b == (0, 0):
            return (0, 0)
        if a[0] is not None and a[0] >= 0 and b[0] is not None and b[0] >= 0:
            return (a[0] * b[0], None)
        return (None, None)
    prods = [x * y for x in a for y in b]  # type: ignore[operator]
    return min(prods), max(prods)


def _is_index(dt: DType) -> bool:
    return dt.is_int and dt.lanes == 1


class Analyzer:
    """Bounds of variables plus the simplifier that uses them. Bounds are inclusive."""

    def __init__(self, ranges: dict[Var, tuple[int, int]] | None = None):
        self.ranges: dict[Var, Bound] = dict(ranges or {})
        self._cache: dict[Expr, Expr] = {}

    # -- context ---------------------------------------------------------------------------
    def bind(self, var: Var, lo: int | None, hi: int | None) -> None:
        self.ranges[var] = (lo, hi)
        self._cache.clear()

    @contextmanager
    def scope(self, var: Var, lo: int | None, hi: int | None) -> Iterator[None]:
        old = self.ranges.get(var, "missing")
        self.bind(var, lo, hi)
        try:
            yield
        finally:
            if old == "missing":
                del self.ranges[var]
            else:
                self.ranges[var] = old  # type: ignore[assignment]
            self._cache.clear()

    def bind_sizes(self, sizes) -> None:
        """Bind the size variables among `sizes` (variables with `lo`/`hi`, ember.graph.dims.SizeVar) to their
        bounds, so that a kernel's passes know every size is at least its lower bound."""
        for v in sizes:
            if isinstance(v, Var) and hasattr(v, "lo"):
                self.bind(v, v.lo, v.hi)

    def bind_loop(self, var: Var, lo: Expr, extent: Expr) -> Bound:
        """Constant bounds for a loop variable running over [lo, lo + extent)."""
        lb = self.bounds(lo)
        eb = self.bounds(extent)
        hi = None if lb[1] is None or eb[1] is None else lb[1] + eb[1] - 1
        return lb[0], hi

    # -- bounds ----------------------------------------------------------------------------
    def bounds(self, e: Expr) -> Bound:
        """Constant interval of an integer (or bool) expression."""
        dt = e.dtype
        if dt.is_bool:
            if isinstance(e, Const):
                return int(e.value), int(e.value)
            return 0, 1
        if not _is_index(dt):
            return None, None
        default = (min_value(dt), max_value(dt))
        b = self._bounds(e)
        lo = default[0] if b[0] is None else max(b[0], default[0])
        hi = default[1] if b[1] is None else min(b[1], default[1])
        return lo, hi

    def _bounds(self, e: Expr) -> Bound:
        linear = (
            isinstance(e, BinOp)
            and e.op in ("add", "sub")
            or (isinstance(e, BinOp) and e.op == "mul" and (isinstance(e.a, Const) or isinstance(e.b, Const)))
        )
        if linear and e.dtype.lanes == 1:
            return self._lin_bounds(*self._lin(e))
        return self._atom_bounds(e)

    def _atom_bounds(self, e: Expr) -> Bound:
        if isinstance(e, Const):
            return int(e.value), int(e.value)
        if isinstance(e, Var):
            return self.ranges.get(e, (None, None))
        if isinstance(e, BinOp):
            op = e.op
            a, b = self._bounds(e.a), self._bounds(e.b)
            if op == "mul":
                return _mul_bounds(a, b)
            if op == "floordiv":
                if b[0] is not None and b[0] == b[1] and b[0] > 0:
                    c = b[0]
                    return (None if a[0] is None else a[0] // c, None if a[1] is None else a[1] // c)
                if b[0] is not None and b[0] > 0 and a[0] is not None and a[0] >= 0:
                    return 0, a[1]
                return None, None
            if op == "floormod":
                if b[0] is not None and b[0] == b[1] and b[0] > 0:
                    c = b[0]
                    if a[0] is not None and a[1] is not None and a[0] // c == a[1] // c:
                        return a[0] % c, a[1] % c
                    return 0, c - 1
                if b[0] is not None and b[0] > 0 and b[1] is not None:
                    return 0, b[1] - 1
                return None, None
            if op == "min":
                return (
                    None if a[0] is None or b[0] is None else min(a[0], b[0]),
                    b[1] if a[1] is None else (a[1] if b[1] is None else min(a[1], b[1])),
                )
            if op == "max":
                return (
                    b[0] if a[0] is None else (a[0] if b[0] is None else max(a[0], b[0])),
                    None if a[1] is None or b[1] is None else max(a[1], b[1]),
                )
            return None, None
        if isinstance(e, Select):
            return _union(self._bounds(e.t), self._bounds(e.f))
        if isinstance(e, Cast) and e.value.dtype.lanes == 1 and (e.value.dtype.is_int or e.value.dtype.is_bool):
            return self.bounds(e.value)
        return None, None

    def can_prove(self, cond: Expr) -> bool:
        c = self.simplify(cond)
        return isinstance(c, Const) and bool(c.value)

    def can_prove_false(self, cond: Expr) -> bool:
        c = self.simplify(cond)
        return isinstance(c, Const) and not bool(c.value)

    def const_upper_bound(self, e: Expr) -> int | None:
        return self.bounds(self.simplify(e))[1]

    # -- symbolic intervals ------------------------------------------------------------------
    def interval(self, e: Expr, env: dict[Var, tuple[Expr, Expr]]) -> tuple[Expr, Expr] | None:
        """Symbolic [lo, hi] of integer expression e when each var in env ranges over its (lo, hi)
        and other vars are fixed; None when e cannot be bounded (e.g. a data-dependent index)."""
        if not any(isinstance(n, Var) and n in env for n in _walk(e)):
            return e, e
        if isinstance(e, Var):
            return env[e]
        if isinstance(e, BinOp) and e.op in ("add", "sub", "mul"):
            if e.op != "mul" or isinstance(e.a, Const) or isinstance(e.b, Const):
                s = self.simplify(e)  # merged div/mod pairs (a flattened unravel) bound as the index they are
                if not same(s, e):
                    return self.interval(s, env)
                terms, c = self._lin(e)
                lo: Expr = const(c, e.dtype)
                hi: Expr = lo
                for t, k in terms.items():
                    it = self.interval(t, env)
                    if it is None:
                        return None
                    tl, th = (it[0] * k, it[1] * k) if k > 0 else (it[1] * k, it[0] * k)
                    lo, hi = lo + tl, hi + th
                return self.simplify(lo), self.simplify(hi)
            ia, ib = self.interval(e.a, env), self.interval(e.b, env)
            if ia is None or ib is None:
                return None
            ends = [self.simplify(x) for x in (*ia, *ib)]
            if not all(isinstance(x, Const) for x in ends):
                return None
            b = _mul_bounds((ends[0].value, ends[1].value), (ends[2].value, ends[3].value))  # type: ignore[union-attr]
            return const(b[0], e.dtype), const(b[1], e.dtype)
        if isinstance(e, BinOp) and e.op in ("floordiv", "floormod") and isinstance(e.b, Const) and e.b.value > 0:
            ia = self.interval(e.a, env)
            if ia is None:
                return None
            c = e.b
            if e.op == "floordiv":
                return self.simplify(ia[0] // c), self.simplify(ia[1] // c)
            if same(ia[0], ia[1]):
                return (self.simplify(ia[0] % c),) * 2  # type: ignore[return-value]
            if is_zero(self.simplify(ia[1] // c - ia[0] // c)):
                return self.simplify(ia[0] % c), self.simplify(ia[1] % c)
            return const(0, e.dtype), const(int(c.value) - 1, e.dtype)
        if isinstance(e, BinOp) and e.op in ("min", "max"):
            ia, ib = self.interval(e.a, env), self.interval(e.b, env)
            if ia is None or ib is None:
                return None
            return self.simplify(BinOp(e.op, ia[0], ib[0], e.dtype)), self.simplify(BinOp(e.op, ia[1], ib[1], e.dtype))
        if isinstance(e, Select):
            ia, ib = self.interval(e.t, env), self.interval(e.f, env)
            if ia is None or ib is None:
                return None
            return self.union(ia, ib)
        if isinstance(e, Cast) and e.dtype.is_int and e.value.dtype.is_int:
            return self.interval(e.value, env)
        return None

    def union(self, a: tuple[Expr, Expr], b: tuple[Expr, Expr]) -> tuple[Expr, Expr]:
        dt = a[0].dtype
        return self.simplify(BinOp("min", a[0], b[0], dt)), self.simplify(BinOp("max", a[1], b[1], dt))

    def max_over_loops(self, e: Expr, limit: int = 4096) -> int | None:
        """Exact maximum of integer e over all values of its variables (their bound ranges) when there
        are at most `limit` combinations; otherwise the interval upper bound."""
        e = self.simplify(e)
        vs = sorted({n for n in _walk(e) if isinstance(n, Var)}, key=lambda v: v.name)
        ranges = [self.ranges.get(v, (None, None)) for v in vs]
        if all(lo is not None and hi is not None for lo, hi in ranges):
            count = 1
            for lo, hi in ranges:
                count *= hi - lo + 1  # type: ignore[operator]
            if count <= limit:
                axes = np.ix_(*[np.arange(lo, hi + 1, dtype=np.int64) for lo, hi in ranges])  # type: ignore[operator]
                got = eval_grid(e, dict(zip(vs, axes)))
                if got is not None and not got[1].any():
                    return int(np.max(got[0]))
        return self.bounds(e)[1]

    # -- linear forms ----------------------------------------------------------------------
    def lin(self, e: Expr) -> Lin:
        """Linear form of an integer expression: ({atom: coefficient}, constant)."""
        return self._lin(e)

    def _lin(self, e: Expr) -> Lin:
        if isinstance(e, Const):
            return {}, int(e.value)
        if isinstance(e, BinOp):
            if e.op in ("add", "sub"):
                ta, ca = self._lin(e.a)
                tb, cb = self._lin(e.b)
                sign = 1 if e.op == "add" else -1
                terms = dict(ta)
                for t, k in tb.items():
                    terms[t] = terms.get(t, 0) + sign * k
                return {t: k for t, k in terms.items() if k != 0}, ca + sign * cb
            if e.op == "mul":
                if isinstance(e.b, Const):
                    t, c = self._lin(e.a)
                    k = int(e.b.value)
                    return ({x: v * k for x, v in t.items() if v * k != 0}, c * k)
                if isinstance(e.a, Const):
                    t, c = self._lin(e.b)
                    k = int(e.a.value)
                    return ({x: v * k for x, v in t.items() if v * k != 0}, c * k)
        return {e: 1}, 0

    def _from_lin(self, terms: dict[Expr, int], c: int, dt: DType) -> Expr:
        items = sorted(terms.items(), key=lambda kv: (-abs(kv[1]), format_expr(kv[0])))
        pos = [kv for kv in items if kv[1] > 0]
        neg = [kv for kv in items if kv[1] < 0]
        out: Expr | None = None
        for t, k in pos:
            term = t if k == 1 else BinOp("mul", t, const(k, dt), dt)
            out = term if out is None else BinOp("add", out, term, dt)
        for t, k in neg:
            term = t if k == -1 else BinOp("mul", t, const(-k, dt), dt)
            out = BinOp("sub", const(0, dt) if out is None else out, term, dt)
        if out is None:
            return const(c, dt)
        if c > 0:
            out = BinOp("add", out, const(c, dt), dt)
        elif c < 0:
            out = BinOp("sub", out, const(-c, dt), dt)
        return out

    def _lin_bounds(self, terms: dict[Expr, int], c: int) -> Bound:
        lo = hi = c
        for t, k in terms.items():
            tb = _scale(self._atom_bounds(t), k)
            lo, hi = _add(lo, tb[0]), _add(hi, tb[1])
        return lo, hi

    def _merge_divmod(self, terms: dict[Expr, int]) -> tuple[dict[Expr, int], int]:
        """k*(x // c)*c + k*(x % c) -> k*x, k*((x // a) % b) + k*b*(x // (a*b)) -> k*(x // a) (an index
        unravelled into several dims and flattened again: x // 49 * 784 + x // 7 % 7 * 112 + x % 7 * 16 is
        x * 16), and k*c*((x // c) % d) + k*(x % c) -> k*(x % (c*d)) (a row and a column of one plane: x // 56 % 56
        * 56 + x % 56 is x % 3136); returns the new terms and a constant to add."""
        extra = 0
        changed = True
        while changed:
            changed = False
            for t, k in list(terms.items()):
                if (isinstance(t, BinOp) and t.op == "floormod" and isinstance(t.b, Const) and isinstance(t.a, BinOp)
                        and t.a.op == "floordiv" and isinstance(t.a.b, Const)):  # fmt: skip
                    a, b = int(t.a.b.value), int(t.b.value)
                    outer = BinOp("floordiv", t.a.a, const(a * b, t.a.b.dtype), t.dtype)
                    if a > 0 and b > 0 and terms.get(outer) == k * b:
                        del terms[t], terms[outer]
                        terms[t.a] = terms.get(t.a, 0) + k
                        terms = {x: v for x, v in terms.items() if v != 0}
                        changed = True
                        break
                if (isinstance(t, BinOp) and t.op == "floormod" and isinstance(t.b, Const) and isinstance(t.a, BinOp)
                        and t.a.op == "floordiv" and isinstance(t.a.b, Const)):  # fmt: skip
                    c, d = int(t.a.b.value), int(t.b.value)  # k*c*((x // c) % d) + k*(x % c) -> k*(x % (c*d))
                    low = BinOp("floormod", t.a.a, t.a.b, t.dtype)
                    if c > 0 and d > 0 and k % c == 0 and terms.get(low) == k // c:
                        del terms[t], terms[low]
                        mt, mc = self._lin(self.simplify(BinOp("floormod", t.a.a, const(c * d, t.a.b.dtype), t.dtype)))
                        for x, v in mt.items():
                            terms[x] = terms.get(x, 0) + v * (k // c)
                        terms = {x: v for x, v in terms.items() if v != 0}
                        extra += mc * (k // c)
                        changed = True
                        break
                if isinstance(t, BinOp) and t.op == "floormod" and isinstance(t.b, Const):
                    c = int(t.b.value)
                    div = BinOp("floordiv", t.a, t.b, t.dtype)
                    if terms.get(div) == k * c:
                        del terms[t], terms[div]
                        xt, xc = self._lin(t.a)
                        for x, v in xt.items():
                            terms[x] = terms.get(x, 0) + v * k
                        terms = {x: v for x, v in terms.items() if v != 0}
                        extra += xc * k
                        changed = True
                        break
        return terms, extra

    # -- simplifier ------------------------------------------------------------------------
    def simplify(self, e: Expr) -> Expr:
        hit = self._cache.get(e)
        if hit is not None:
            return hit
        out = self._simplify(e)
        self._cache[e] = out
        return out

    def _simplify(self, e: Expr) -> Expr:
        if isinstance(e, Var):  # bounded to one value (a size with bounds (1, 1), the variable of a 1-trip loop)
            lo, hi = self.ranges.get(e, (None, None))
            return const(lo, e.dtype) if lo is not None and lo == hi and _is_index(e.dtype) else e
        if isinstance(e, Const):
            return e
        e = map_children(e, lambda c: self.simplify(c) if isinstance(c, Expr) else c)  # type: ignore[assignment]
        if isinstance(e, BinOp):
            return self._simplify_binop(e)
        if isinstance(e, Not):
            return self._simplify_not(e)
        if isinstance(e, Select):
            if isinstance(e.cond, Const):
                return e.t if e.cond.value else e.f
            if same(e.t, e.f):
                return e.t
            return e
        if isinstance(e, Cast):
            return self._simplify_cast(e)
        if isinstance(e, Call):
            if all(isinstance(a, Const) for a in e.args) and e.dtype.lanes == 1:
                folded = _fold_call(e)
                if folded is not None:
                    return folded
            return e
        if isinstance(e, Ramp):
            if isinstance(e.stride, Const) and e.stride.value == 0:
                return Broadcast(e.base, e.lanes)
            return e
        return e

    def _simplify_cast(self, e: Cast) -> Expr:
        v = e.value
        if v.dtype == e.dtype:
            return v
        if isinstance(v, Const) and e.dtype.lanes == 1:
            return const(np.asarray(v.value, dtype=v.dtype.numpy).astype(e.dtype.numpy).item(), e.dtype)
        if isinstance(v, Ramp | Broadcast) and v.dtype.is_int and e.dtype.is_int and e.dtype.bits >= v.dtype.bits \
                and (e.dtype.kind == v.dtype.kind):  # fmt: skip
            # widening a ramp lane by lane is a ramp of the widened base (a contiguous vector index stays one)
            scalar = e.dtype.with_lanes(1)
            if isinstance(v, Broadcast):
                return Broadcast(self.simplify(Cast(scalar, v.value)), v.lanes)
            return Ramp(self.simplify(Cast(scalar, v.base)), self.simplify(Cast(scalar, v.stride)), v.lanes)
        if isinstance(v, Cast) and v.dtype.is_int and v.value.dtype.is_int and e.dtype.is_int:
            lo, hi = self.bounds(v.value)
            if lo is not None and hi is not None and min_value(v.dtype) <= lo and hi <= max_value(v.dtype):
                return self._simplify_cast(Cast(e.dtype, v.value))
        return e

    def _simplify_not(self, e: Not) -> Expr:
        a = e.a
        if isinstance(a, Const):
            return const(not a.value, boolean)
        if isinstance(a, Not):
            return a.a
        if isinstance(a, BinOp) and a.op in CMP_OPS and a.dtype.lanes == 1:
            neg = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "eq": "ne", "ne": "eq"}[a.op]
            if a.a.dtype.is_int:  # negation is exact for integers (not for NaN floats)
                return self.simplify(BinOp(neg, a.a, a.b, a.dtype))
        return e

    def _simplify_binop(self, e: BinOp) -> Expr:
        op, a, b, dt = e.op, e.a, e.b, e.dtype
        if dt.lanes > 1 or a.dtype.lanes > 1:
            if op == "add" and dt.is_int and {type(a), type(b)} == {Ramp, Broadcast}:  # x + ramp: one ramp
                r, c = (a, b) if isinstance(a, Ramp) else (b, a)
                return Ramp(self.simplify(r.base + c.value), r.stride, r.lanes)  # type: ignore[union-attr]
            return e
        if op in ("and", "or"):
            return _simplify_logic(op, a, b)
        if isinstance(a, Const) and isinstance(b, Const):
            folded = _fold_binop(op, a, b, dt)
            if folded is not None:
                return folded
        if a.dtype.is_int:
            return self._simplify_int(op, a, b, dt)
        if a.dtype.is_float:
            return _simplify_float(e)
        return e

    def _simplify_int(self, op: str, a: Expr, b: Expr, dt: DType) -> Expr:
        if op in ("add", "sub", "mul"):
            terms, c = self._lin(BinOp(op, a, b, dt))
            if op == "mul" and not isinstance(a, Const) and not isinstance(b, Const):
                return BinOp("mul", *sorted((a, b), key=format_expr), dt)
            terms, extra = self._merge_divmod(terms)
            return self._from_lin(terms, c + extra, dt)
        if op in ("floordiv", "floormod"):
            return self._simplify_divmod(op, a, b, dt)
        if op in ("min", "max"):
            if op == "min" and (self._mod_below(a, b) or self._mod_below(b, a)):
                return a if self._mod_below(a, b) else b
            for x, y in ((a, b), (b, a)):  # min(min(p, q), q) is min(p, q): clamps applied twice
                if isinstance(x, BinOp) and x.op == op and (same(x.a, y) or same(x.b, y)):
                    return x
            picked = self._minmax_of_quotients(op, a, b)
            if picked is not None:
                return picked
            d_lo, d_hi = self._lin_bounds(*self._diff(a, b))
            if op == "min":
                if d_hi is not None and d_hi <= 0:
                    return a
                if d_lo is not None and d_lo >= 0:
                    return b
            else:
                if d_hi is not None and d_hi <= 0:
                    return b
                if d_lo is not None and d_lo >= 0:
                    return a
            return self._minmax_factored(op, a, b, dt)
        if op in CMP_OPS:
            return self._simplify_cmp(op, a, b)
        return BinOp(op, a, b, dt)

    def _minmax_factored(self, op: str, a: Expr, b: Expr, dt: DType) -> Expr:
        """min/max(g * x, g * y) as g * min/max(x, y) for the largest common constant factor g > 1 of both linear
        forms: a tile clamped back from the end, min(v * 32, (S + 31) // 32 * 32 - 32), stays a multiple of the tile
        (32 * min(v, ...)), so `(that + j) % 32` is j and its panel loads stay contiguous vectors, not gathers."""
        (ta, ca), (tb, cb) = self._lin(a), self._lin(b)
        common = {t: k for t, k in ta.items() if tb.get(t) == k}
        if common and len(common) < max(len(ta), len(tb)):
            # min/max(s + x, s + y) as s + min/max(x, y): a region's end over two readers' tiles from one start s
            # keeps its extent max(x, y) - not an expression in s, whose bound over every s is the whole axis
            x = self._from_lin({t: k for t, k in ta.items() if t not in common}, ca, dt)
            y = self._from_lin({t: k for t, k in tb.items() if t not in common}, cb, dt)
            return self.simplify(BinOp("add", self._from_lin(common, 0, dt), BinOp(op, x, y, dt), dt))
        g = math.gcd(ca, cb, *ta.values(), *tb.values())
        if g <= 1 or not (ta or tb):
            return BinOp(op, a, b, dt)
        x = self._from_lin({t: k // g for t, k in ta.items()}, ca // g, dt)
        y = self._from_lin({t: k // g for t, k in tb.items()}, cb // g, dt)
        return self.simplify(BinOp("mul", BinOp(op, x, y, dt), const(g, dt), dt))

    def _minmax_of_quotients(self, op: str, a: Expr, b: Expr) -> Expr | None:
        """min/max of x // c and y // c where y - x has constant bounds of one sign: floor division by a positive
        constant is monotone (min(S // 12, (S + 11) // 12) is S // 12: a symbolic loop's main part and its extent)."""
        if not all(isinstance(t, BinOp) and t.op == "floordiv" and isinstance(t.b, Const) for t in (a, b)):
            return None
        if a.b.value != b.b.value or a.b.value <= 0:  # type: ignore[attr-defined]
            return None
        lo, hi = self._lin_bounds(*self._diff(a.a, b.a))  # type: ignore[attr-defined]
        if hi is not None and hi <= 0:  # a <= b
            return a if op == "min" else b
        if lo is not None and lo >= 0:
            return b if op == "min" else a
        return None

    def _mod_below(self, m: Expr, other: Expr) -> bool:
        """Whether m is x % y with y >= 1 and other >= y - 1, so min(m, other) is m: the rule a symbolic divisor
        needs (min(i % S, S - 1) is i % S; with a constant divisor the bounds already show it)."""
        if not (isinstance(m, BinOp) and m.op == "floormod") or isinstance(m.b, Const):
            return False
        lo_y = self.bounds(m.b)[0]
        d_lo = self._lin_bounds(*self._diff(other, m.b))[0]
        return lo_y is not None and lo_y >= 1 and d_lo is not None and d_lo >= -1

    def _diff(self, a: Expr, b: Expr) -> Lin:
        ta, ca = self._lin(a)
        tb, cb = self._lin(b)
        terms = dict(ta)
        for t, k in tb.items():
            terms[t] = terms.get(t, 0) - k
        return {t: k for t, k in terms.items() if k != 0}, ca - cb

    def _simplify_cmp(self, op: str, a: Expr, b: Expr) -> Expr:
        given = BinOp(op, a, b, boolean)
        if op in ("gt", "ge"):
            op, a, b = {"gt": "lt", "ge": "le"}[op], b, a
        terms, c = self._diff(a, b)  # compare (a - b) with 0
        lo, hi = self._lin_bounds(terms, c)
        truth = {
            "lt": (hi is not None and hi < 0, lo is not None and lo >= 0),
            "le": (hi is not None and hi <= 0, lo is not None and lo > 0),
            "eq": (lo == 0 and hi == 0, (lo is not None and lo > 0) or (hi is not None and hi < 0)),
            "ne": ((lo is not None and lo > 0) or (hi is not None and hi < 0), lo == 0 and hi == 0),
        }[op]
        if truth[0]:
            return const(True, boolean)
        if truth[1]:
            return const(False, boolean)
        index_like = Var | Const | BinOp | Cast | Select | Not
        data = any(not isinstance(n, index_like) for t in terms for n in _walk(t))  # loads, calls
        if (
            a.dtype.kind == "uint"
            or data
            or (lo is not None and lo < min_value(a.dtype))
            or (hi is not None and hi > max_value(a.dtype))
        ):
            return given  # a - b may wrap around (unsigned, or data values rather than indices): keep it as is
        if op == "le":  # integers: x <= 0  <=>  x < 1
            op, c = "lt", c - 1
        g = math.gcd(*terms.values()) if terms else 1
        dt = a.dtype
        if not terms:
            return BinOp(op, a, b, boolean)
        lead = max(terms.items(), key=lambda kv: (abs(kv[1]), -len(format_expr(kv[0]))))[1]
        if lead < 0:  # flip to keep a positive leading coefficient: -x + c < 0  <=>  x - c > 0
            terms = {t: -k for t, k in terms.items()}
            c = -c
            op = {"lt": "gt", "eq": "eq", "ne": "ne"}[op]
        # now: sum(terms) + c  op  0, i.e. sum(terms) op -c
        rhs = -c
        if op == "lt":  # S < rhs  <=>  S/g < ceil(rhs/g)
            rhs = -((-rhs) // g)
        elif op == "gt":  # S > rhs  <=>  S/g > floor(rhs/g)  <=> S/g >= floor(rhs/g) + 1
            rhs = rhs // g + 1
            op = "ge"
        elif rhs % g:
            return const(op == "ne", boolean)
        else:
            rhs //= g
        terms = {t: k // g for t, k in terms.items()}
        return BinOp(op, self._from_lin(terms, 0, dt), const(rhs, dt), boolean)

    def _simplify_divmod(self, op: str, a: Expr, b: Expr, dt: DType) -> Expr:
        if not isinstance(b, Const) or b.value <= 0:
            if isinstance(b, Const) and b.value == 0:
                raise ZeroDivisionError(f"integer division by zero in {format_expr(BinOp(op, a, b, dt))}")
            return BinOp(op, a, b, dt)
        c = int(b.value)
        if c == 1:
            return a if op == "floordiv" else const(0, dt)
        # nested: (x // c1) // c2 -> x // (c1*c2); (x % c1) % c2 -> x % c2 when c2 divides c1
        if isinstance(a, BinOp) and isinstance(a.b, Const) and a.b.value > 0:
            if op == "floordiv" and a.op == "floordiv":
                return self._simplify_divmod("floordiv", a.a, const(int(a.b.value) * c, dt), dt)
            if op == "floormod" and a.op == "floormod" and int(a.b.value) % c == 0:
                return self._simplify_divmod("floormod", a.a, b, dt)
        terms, k0 = self._lin(a)
        q_terms = {t: k // c for t, k in terms.items() if k % c == 0}
        r_terms = {t: k for t, k in terms.items() if k % c != 0}
        q_const, r_const = divmod(k0, c)
        lo, hi = self._lin_bounds(r_terms, r_const)
        if lo is not None and hi is not None and lo // c == hi // c:
            k = lo // c
            if op == "floordiv":
                return self._from_lin(q_terms, q_const + k, dt)
            return self._from_lin(r_terms, r_const - k * c, dt)
        # (a*x + y) // c  ->  x // (c/a)  when a divides c and 0 <= y < a
        for a_coef in sorted({abs(k) for k in r_terms.values()}, reverse=True):
            if a_coef <= 1 or c % a_coef:
                continue
            hi_terms = {t: k // a_coef for t, k in r_terms.items() if k % a_coef == 0}
            lo_terms = {t: k for t, k in r_terms.items() if k % a_coef != 0}
            hq, lr = divmod(r_const, a_coef)
            llo, lhi = self._lin_bounds(lo_terms, lr)
            if llo is None or lhi is None or llo < 0 or lhi >= a_coef:
                continue
            inner = self._from_lin(hi_terms, hq, dt)
            sub = self._simplify_divmod(op, inner, const(c // a_coef, dt), dt)
            if op == "floordiv":
                return self.simplify(self._from_lin(q_terms, q_const, dt) + sub)
            return self.simplify(sub * a_coef + self._from_lin(lo_terms, lr, dt))
        rest = self._from_lin(r_terms, r_const, dt)
        if op == "floormod":
            return BinOp("floormod", rest, b, dt)
        if not q_terms and q_const == 0:
            return BinOp("floordiv", rest, b, dt)
        return self.simplify(self._from_lin(q_terms, q_const, dt) + BinOp("floordiv", rest, b, dt))


def _simplify_logic(op: str, a: Expr, b: Expr) -> Expr:
    for x, y in ((a, b), (b, a)):
        if isinstance(x, Const):
            if op == "and":
                return y if x.value else const(False, boolean)
            return const(True, boolean) if x.value else y
    if same(a, b):
        return a
    return BinOp(op, a, b, a.dtype)


def _simplify_float(e: BinOp) -> Expr:
    op, a, b = e.op, e.a, e.b
    if op == "add":
        if isinstance(b, Const) and b.value == 0:
            return a
        if isinstance(a, Const) and a.value == 0:
            return b
    if op == "sub" and isinstance(b, Const) and b.value == 0:
        return a
    if op == "mul":
        if isinstance(b, Const) and b.value == 1:
            return a
        if isinstance(a, Const) and a.value == 1:
            return b
    if op == "div" and isinstance(b, Const) and b.value == 1:
        return a
    return e


_NP_BINOPS = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "floordiv": np.floor_divide, "floormod": np.mod, "min": np.minimum, "max": np.maximum,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
}  # fmt: skip


def _fold_binop(op: str, a: Const, b: Const, dt: DType) -> Const | None:
    if op in ("floordiv", "floormod") and b.value == 0:
        return None
    x = np.asarray(a.value, dtype=a.dtype.numpy)
    y = np.asarray(b.value, dtype=b.dtype.numpy)
    with np.errstate(all="ignore"):
        r = _NP_BINOPS[op](x, y)
    return const(np.asarray(r).astype(dt.numpy).item(), dt)


_NP_CALLS = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh, "abs": np.abs, "floor": np.floor,
    "ceil": np.ceil, "round": np.round, "sin": np.sin, "cos": np.cos,
}  # fmt: skip


def _fold_call(e: Call) -> Const | None:
    fn = _NP_CALLS.get(e.name)
    if fn is None:
        return None
    with np.errstate(all="ignore"):
        r = fn(*[np.asarray(a.value, dtype=a.dtype.numpy) for a in e.args])  # type: ignore[union-attr]
    return const(np.asarray(r).astype(e.dtype.numpy).item(), e.dtype)


def simplify(e: Expr, ranges: dict[Var, tuple[int, int]] | None = None) -> Expr:
    """Simplify an expression given inclusive constant ranges of its variables."""
    return Analyzer(ranges).simplify(e)


def is_zero(e: Expr) -> bool:
    return isinstance(e, Const) and e.value == 0


_EVAL_OPS = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "floordiv": lambda a, b: a // b, "floormod": lambda a, b: a % b, "min": min, "max": max,
    "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "and": lambda a, b: a and b, "or": lambda a, b: a or b,
}  # fmt: skip


_GRID_OPS = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "floordiv": np.floor_divide, "floormod": np.mod,
    "min": np.minimum, "max": np.maximum, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "eq": np.equal, "ne": np.not_equal, "and": np.logical_and, "or": np.logical_or,
}  # fmt: skip


def eval_grid(e: Expr, env: dict[Var, np.ndarray], memo: dict | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """`eval_int` at every point of a grid at once: the variables are integer arrays that broadcast together
    (`np.ix_`). Gives (values, undefined): undefined marks the points where `eval_int` gives None (a division
    by zero on the branch a Select takes there); None where some node cannot be evaluated anywhere."""
    memo = {} if memo is None else memo
    if id(e) in memo:
        return memo[id(e)]
    out: tuple[np.ndarray, np.ndarray] | None = None
    if isinstance(e, Const) and not e.dtype.is_float:
        out = np.asarray(int(e.value), np.int64), np.asarray(False)
    elif isinstance(e, Var):
        out = None if e not in env else (env[e], np.asarray(False))
    elif isinstance(e, BinOp) and e.a.dtype.lanes == 1 and not e.a.dtype.is_float and e.op in _GRID_OPS:
        a, b = eval_grid(e.a, env, memo), eval_grid(e.b, env, memo)
        if a is not None and b is not None:
            bad = a[1] | b[1]
            rhs = b[0]
            if e.op in ("floordiv", "floormod"):
                bad = bad | (rhs == 0)
                rhs = np.where(rhs == 0, 1, rhs)
            out = _GRID_OPS[e.op](a[0], rhs).astype(np.int64), bad
    elif isinstance(e, Select):
        c, t, f = (eval_grid(x, env, memo) for x in (e.cond, e.t, e.f))
        if c is not None and t is not None and f is not None:
            pick = c[0].astype(bool)
            out = np.where(pick, t[0], f[0]), c[1] | np.where(pick, t[1], f[1])
    elif isinstance(e, Not):
        a = eval_grid(e.a, env, memo)
        out = None if a is None else (np.logical_not(a[0]).astype(np.int64), a[1])
    elif isinstance(e, Cast) and not e.dtype.is_float and not e.value.dtype.is_float:
        out = eval_grid(e.value, env, memo)
    memo[id(e)] = out
    return out


def eval_int(e: Expr, env: dict[Var, int]) -> int | None:
    """Value of an integer/boolean expression with all variables given; None if it cannot be evaluated."""
    if isinstance(e, Const):
        return e.value  # type: ignore[return-value]
    if isinstance(e, Var):
        return env.get(e)
    if isinstance(e, BinOp) and e.a.dtype.lanes == 1 and not e.a.dtype.is_float:
        a, b = eval_int(e.a, env), eval_int(e.b, env)
        if a is None or b is None or (e.op in ("floordiv", "floormod") and b == 0):
            return None
        return _EVAL_OPS[e.op](a, b)
    if isinstance(e, Select):
        c = eval_int(e.cond, env)
        return None if c is None else eval_int(e.t if c else e.f, env)
    if isinstance(e, Not):
        a = eval_int(e.a, env)
        return None if a is None else (not a)
    if isinstance(e, Cast) and not e.dtype.is_float and not e.value.dtype.is_float:
        return eval_int(e.value, env)
    return None
