"""Loop passes: a flat list of named functions PrimFunc -> PrimFunc (see `PIPELINE`)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from . import expr as E
from .arith import Analyzer
from .dtype import boolean
from .expr import BinOp, Cast, Const, Expr, Load, Select, Var, const, same
from .functor import children, map_children, substitute, transform, uses_var, walk
from .stmt import (
    NOP,
    Allocate,
    Evaluate,
    For,
    ForKind,
    IfThenElse,
    LetStmt,
    PrimFunc,
    Seq,
    Stmt,
    Store,
    seq,
    size_params,
)
from .vectorize import lane_mask, vectorize_loops

log = logging.getLogger("ember.lower")


def _is_nop(s: Stmt) -> bool:
    return isinstance(s, Evaluate) and isinstance(s.value, Const)


def _split_and(c: Expr) -> list[Expr]:
    if isinstance(c, BinOp) and c.op == "and":
        return _split_and(c.a) + _split_and(c.b)
    return [c]


# ---------------------------------------------------------------------------------------------
# simplify


class _Simplifier:
    """Simplify every expression with the loop ranges in scope; drop decided branches and empty loops."""

    def __init__(self, ana: Analyzer):
        self.ana = ana

    def expr(self, e: Expr) -> Expr:
        return self.ana.simplify(e)

    def stmt(self, s: Stmt) -> Stmt:
        ana = self.ana
        if isinstance(s, For):
            lo, ext = self.expr(s.min), self.expr(s.extent)
            if isinstance(ext, Const) and ext.value <= 0:
                return NOP
            if isinstance(ext, Const) and ext.value == 1 and s.kind is not ForKind.THREAD_BINDING:
                return self.stmt(substitute(s.body, {s.var: lo}))  # type: ignore[arg-type]
            lb, hb = ana.bind_loop(s.var, lo, ext)
            with ana.scope(s.var, lb, hb):
                body = self.stmt(s.body)
            if _is_nop(body):
                return NOP
            return For(s.var, lo, ext, s.kind, body, s.thread_tag, s.annotations)
        if isinstance(s, Store):
            pred = self.expr(s.predicate) if s.predicate is not None else None
            lanes = lane_mask(pred) if pred is not None else None
            if lanes is not None and not any(lanes):
                return NOP  # a masked store of no lane (a tail tile's vectors past its end, once unrolled)
            if lanes is not None and all(lanes):
                pred = None
            return Store(s.buffer, _unmask_loads(self.expr(s.value)), tuple(self.expr(i) for i in s.indices), pred)
        if isinstance(s, IfThenElse):
            cond = self.expr(s.cond)
            if isinstance(cond, Const):
                if cond.value:
                    return self.stmt(s.then_case)
                return self.stmt(s.else_case) if s.else_case is not None else NOP
            then = self._refined(cond, s.then_case)
            other = self.stmt(s.else_case) if s.else_case is not None else None
            if other is not None and _is_nop(other):
                other = None
            if _is_nop(then) and other is None:
                return NOP
            return IfThenElse(cond, then, other)
        if isinstance(s, LetStmt):
            value = self.expr(s.value)
            if isinstance(value, Const | Var):
                return self.stmt(substitute(s.body, {s.var: value}))  # type: ignore[arg-type]
            lo, hi = ana.bounds(value) if value.dtype.is_int else (None, None)
            with ana.scope(s.var, lo, hi):
                body = self.stmt(s.body)
            return LetStmt(s.var, value, body)
        if isinstance(s, Allocate):
            body = self.stmt(s.body)
            if not any(isinstance(n, Load | Store) and n.buffer is s.buffer for n in walk(body)):
                return body
            return Allocate(s.buffer, body)
        if isinstance(s, Seq):
            return seq(*[self.stmt(x) for x in s.stmts])
        if isinstance(s, Evaluate):
            return Evaluate(self.expr(s.value))
        raise TypeError(f"simplify: unexpected statement {type(s).__name__}")

    def _refined(self, cond: Expr, body: Stmt) -> Stmt:
        """Simplify body knowing cond holds: narrow ranges for `v < c` / `v >= c` conjuncts."""
        narrowed: list[tuple[Var, tuple]] = []
        for c in _split_and(cond):
            if isinstance(c, BinOp) and isinstance(c.a, Var) and isinstance(c.b, Const) and c.op in ("lt", "ge"):
                v, k = c.a, int(c.b.value)
                lo, hi = self.ana.ranges.get(v, (None, None))
                if c.op == "lt":
                    hi = k - 1 if hi is None else min(hi, k - 1)
                else:
                    lo = k if lo is None else max(lo, k)
                narrowed.append((v, self.ana.ranges.get(v, (None, None))))
                self.ana.bind(v, lo, hi)
        try:
            return self.stmt(body)
        finally:
            for v, old in reversed(narrowed):
                self.ana.bind(v, *old)


def _unmask_loads(e: Expr) -> Expr:
    """Masked loads whose mask is constant: plain loads where every lane is read (zero where none is)."""

    def post(n):
        if isinstance(n, Load) and n.predicate is not None:
            lanes = lane_mask(n.predicate)
            if lanes is not None and all(lanes):
                return Load(n.buffer, n.indices)
            if lanes is not None and not any(lanes):
                return E.Broadcast(E.convert(0, n.buffer.dtype), n.dtype.lanes)
        return None

    return transform(e, post) if any(isinstance(n, Load) and n.predicate is not None for n in walk(e)) else e  # type: ignore[return-value]


def simplify(func: PrimFunc) -> PrimFunc:
    return func.with_body(_Simplifier(_analyzer(func)).stmt(func.body))


# ---------------------------------------------------------------------------------------------
# loop partition: split a loop where guards are provably true, so the hot part has no branch


def _inner_loop_ranges(s: Stmt, ana: Analyzer) -> dict[Var, tuple[int | None, int | None]]:
    out = {}
    for n in walk(s):
        if isinstance(n, For):
            out[n.var] = ana.bind_loop(n.var, n.min, n.extent)
    return out


def _conditions(s: Stmt) -> list[Expr]:
    out: list[Expr] = []
    for n in walk(s):
        if isinstance(n, IfThenElse | Select):
            out.extend(_split_and(n.cond))
    return out


def _direction(t: Expr, v: Var, ana: Analyzer) -> int | None:
    """+1/-1 if integer term t is non-decreasing/non-increasing in v, 0 if it does not use v, None if unknown."""
    if t is v:
        return 1
    if not any(n is v for n in walk(t)):
        return 0
    if isinstance(t, BinOp) and t.op == "floordiv" and isinstance(t.b, Const) and t.b.value > 0:
        terms, _ = ana.lin(t.a)
        dirs = set()
        for x, k in terms.items():
            d = _direction(x, v, ana)
            if d is None:
                return None
            if d:
                dirs.add(d if k > 0 else -d)
        return dirs.pop() if len(dirs) == 1 else None
    return None


def _monotone_in(c: Expr, v: Var, ana: Analyzer) -> bool:
    """c is an integer comparison that is monotone in v (v linear, or inside floor divisions)."""
    if not (isinstance(c, BinOp) and c.op in E.CMP_OPS and c.op not in ("eq", "ne") and c.a.dtype.is_int):
        return False
    terms, _ = ana.lin(c.a - c.b)
    dirs = set()
    for t, k in terms.items():
        d = _direction(t, v, ana)
        if d is None:
            return False
        if d:
            dirs.add(d if k > 0 else -d)
    return len(dirs) == 1


SMALL_VARIANTS = 16  # a symbolic tail below one tile of at most this many gets a variant per size (`_small_variants`)


class _Partitioner:
    def __init__(self, ana: Analyzer, budget: int = 64):
        self.ana = ana
        self.budget = budget

    def stmt(self, s: Stmt) -> Stmt:
        if isinstance(s, For):
            pieces = self.partition(s) if self.budget > 0 else None
            if pieces is not None:
                return seq(*pieces)
            lb, hb = self.ana.bind_loop(s.var, s.min, s.extent)
            with self.ana.scope(s.var, lb, hb):
                body = self.stmt(s.body)
            return For(s.var, s.min, s.extent, s.kind, body, s.thread_tag, s.annotations)
        if isinstance(s, LetStmt):
            lo, hi = self.ana.bounds(s.value) if s.value.dtype.is_int else (None, None)
            with self.ana.scope(s.var, lo, hi):
                return LetStmt(s.var, s.value, self.stmt(s.body))
        return map_children(s, lambda c: self.stmt(c) if isinstance(c, Stmt) else c)  # type: ignore[return-value]

    def partition(self, loop: For) -> list[Stmt] | None:
        if loop.kind in (ForKind.THREAD_BINDING, ForKind.UNROLLED, ForKind.PARALLEL):
            return None  # a parallel loop stays one parallel region (its pieces would be one each, or serial)
        if isinstance(loop.min, Const) and loop.min.value == 0 and not isinstance(loop.extent, Const):
            return self.partition_symbolic(loop)
        if not (isinstance(loop.min, Const) and isinstance(loop.extent, Const)):
            return None
        m, n = int(loop.min.value), int(loop.extent.value)
        last = m + n - 1
        ana, v = self.ana, loop.var
        atoms = [c for c in _conditions(loop.body) if _monotone_in(c, v, ana)]
        if not atoms:
            return None
        saved = dict(ana.ranges)
        for var, r in _inner_loop_ranges(loop.body, ana).items():
            ana.ranges[var] = r
        try:
            a, b = m, last + 1
            useful = False
            for c in atoms:
                span = self._true_span(c, v, m, last)
                if span is None:
                    continue
                useful = True
                a, b = max(a, span[0]), min(b, span[1])
        finally:
            ana.ranges.clear()
            ana.ranges.update(saved)
            ana._cache.clear()
        if not useful or a >= b or (a == m and b == last + 1):
            return None
        pieces = []
        for lo, hi in ((m, a), (a, b), (b, last + 1)):
            if hi <= lo:
                continue
            self.budget -= 1
            with ana.scope(v, lo, hi - 1):
                body = _Simplifier(ana).stmt(loop.body)
                body = self.stmt(body)
            if loop.kind == ForKind.VECTORIZED and (lo, hi) != (a, b) and not _is_nop(body):
                # a vector loop whose guards stay on a piece: one masked vector, not a peeled odd-width piece
                # (a 16-pixel tile's 15 lanes were scalar code where only the first lane's guard was known)
                return None
            if not _is_nop(body):
                pieces.append(
                    For(
                        v,
                        const(lo, v.dtype),
                        const(hi - lo, v.dtype),
                        loop.kind,
                        body,
                        loop.thread_tag,
                        loop.annotations,
                    )
                )
        return pieces

    def partition_symbolic(self, loop: For) -> list[Stmt] | None:
        """A loop of symbolic extent whose guards (or clamps, min/max) hold on a prefix of its range: the tail
        tests of tiles that may not divide a size. Pieces: the main part [0, T), where they hold for every value
        of the inner loops and are dropped (T from the guards themselves: `v * 12 + i < S` with 0 <= i < 12 holds
        for v < S // 12), then the guarded tail [T, extent), whose guarded loops are not unrolled."""
        ana, v = self.ana, loop.var
        local = {n.var for n in walk(loop.body) if isinstance(n, For | LetStmt)}
        saved = dict(ana.ranges)
        for var, r in _inner_loop_ranges(loop.body, ana).items():
            ana.ranges[var] = r
        try:
            cuts: list[Expr] = []
            for c in _atoms(loop.body):
                t = self._threshold(c, v, local)
                if t is not None and not any(same(t, x) for x in cuts):
                    cuts.append(t)
            main = loop.extent
            for t in cuts:
                main = ana.simplify(BinOp("min", main, t, v.dtype))
            if not cuts or (isinstance(main, Const) and main.value <= 0):
                return None
            facts = _lower_bounds_when_positive(cuts, ana)
            body = transform(loop.body, lambda n: self._assumed(n, v, local, cuts, facts))
        finally:
            ana.ranges.clear()
            ana.ranges.update(saved)
            ana._cache.clear()
        self.budget -= 2
        tightened: dict[Var, int] = {}
        for x, lo in facts:  # the strongest bound of each size (S >= 32 and S >= 1 from two cuts: S >= 32)
            if isinstance(x, Var):
                tightened[x] = max(lo, tightened.get(x, lo))
        old = {s: ana.ranges.get(s, (None, None)) for s in tightened}
        for s, lo in tightened.items():
            ana.bind(s, max(lo, old[s][0] if old[s][0] is not None else lo), old[s][1])
        try:
            with ana.scope(v, *ana.bind_loop(v, const(0, v.dtype), main)):
                body = self.stmt(_Simplifier(ana).stmt(body))
        finally:
            for s, r in old.items():
                ana.bind(s, *r)
        pieces: list[Stmt] = [For(v, loop.min, main, loop.kind, body, loop.thread_tag, loop.annotations)]
        rest = ana.simplify(loop.extent - main)
        if isinstance(rest, Const) and rest.value <= 0:
            return pieces
        with ana.scope(v, *ana.bind_loop(v, main, rest)):
            tail = _no_guarded_unroll(self.stmt(_Simplifier(ana).stmt(loop.body)))
        pieces.append(For(v, main, rest, loop.kind, tail, loop.thread_tag, loop.annotations))
        if not facts:
            return pieces
        # after at least one full tile (main >= 1) the tail's tile clamps are decided (min(S, 12) is 12): a tail of
        # its own for that case, its tile in registers, and the general one for sizes below one tile
        after = transform(loop.body, lambda n: self._assumed(n, v, local, [], facts))
        for s, lo in tightened.items():
            ana.bind(s, max(lo, old[s][0] if old[s][0] is not None else lo), old[s][1])
        try:
            with ana.scope(v, *ana.bind_loop(v, main, rest)):
                after = _no_guarded_unroll(self.stmt(_Simplifier(ana).stmt(after)))
        finally:
            for s, r in old.items():
                ana.bind(s, *r)
        if same(after, tail):  # nothing decided: a full tile has always run before (or the tile has no clamps)
            runs = ana.simplify(main >= 1)
            if isinstance(runs, Const) and runs.value:
                pieces[-1] = self._remainder_variants(loop, facts, pieces[-1])
                return pieces
            small = self._small_variants(loop, main, rest, facts, pieces[-1])
            after_full = self._remainder_variants(loop, facts, pieces[-1])
            # a tile whose rows are clamped per tile (min(12, S - 12 * v)): sizes past one tile get the
            # remainder variants too (a tail of S % 12 rows in registers), sizes below it the small ones
            pieces[-1] = small if after_full is pieces[-1] else IfThenElse(runs, after_full, small)
            return pieces
        general = self._small_variants(loop, main, rest, facts, pieces[-1])
        full = For(v, main, rest, loop.kind, after, loop.thread_tag, loop.annotations)
        full = self._remainder_variants(loop, facts, full)
        pieces[-1] = IfThenElse(ana.simplify(main >= 1), full, general)
        return pieces

    def _variant_ok(self, loop: For, facts: list[tuple[Expr, int]]) -> bool:
        """Whether the tail of `loop` gets variants by size: one size x with a tile lo <= SMALL_VARIANTS, a small
        local tile (registers once its loops unroll) computed inside, and no guard of another loop (a column tail's
        per-lane tests keep the tile in memory in every variant: they would only cost compile time)."""
        if len(facts) != 1 or not 2 <= facts[0][1] <= SMALL_VARIANTS:
            return False
        if any(not uses_var(c, loop.var) for c in _conditions(loop.body)):
            return False
        return any(isinstance(n, Allocate) and n.buffer.scope == "local" for n in walk(loop.body))

    def _variant(self, loop: For, x: Expr, value: Expr, bounds: dict[Var, tuple[int, int]]) -> For | None:
        """The tail of `loop` with x replaced by `value` (its new variables bounded by `bounds`), simplified; None
        when its extent is not one constant run (or empty)."""
        ana, v = self.ana, loop.var

        def put(n):
            return value if isinstance(n, Expr) and same(n, x) else None

        old = {q: ana.ranges.get(q, (None, None)) for q in bounds}
        for q, (lo, hi) in bounds.items():
            ana.bind(q, lo, hi)
        try:
            main, rest = self._cut(loop, put)
            if main is None or not isinstance(rest, Const) or rest.value <= 0:
                return None
            body = transform(loop.body, put)
            if rest.value == 1:  # one tile: its index is `main` (a tile's rows min(12, S - 12 * v) become r)
                body = substitute(body, {v: main})
            with ana.scope(v, *ana.bind_loop(v, main, rest)):
                body = self.stmt(_Simplifier(ana).stmt(body))
        finally:
            for q, r in old.items():
                ana.bind(q, *r)
        return For(v, main, rest, loop.kind, body, loop.thread_tag, loop.annotations)

    def _cut(self, loop: For, put) -> tuple[Expr | None, Expr]:
        """The tail's start and trip count of `loop` once x is replaced (`put`): the main part's end, recomputed."""
        ana, v = self.ana, loop.var
        local = {n.var for n in walk(loop.body) if isinstance(n, For | LetStmt)}
        body, extent = transform(loop.body, put), ana.simplify(transform(loop.extent, put))
        saved = dict(ana.ranges)
        for var, r in _inner_loop_ranges(body, ana).items():
            ana.ranges[var] = r
        try:
            main = extent
            for c in _atoms(body):
                t = self._threshold(c, v, local)
                if t is not None:
                    main = ana.simplify(BinOp("min", main, t, v.dtype))
        finally:
            ana.ranges.clear()
            ana.ranges.update(saved)
            ana._cache.clear()
        return main, ana.simplify(extent - main)

    def _remainder_variants(self, loop: For, facts: list[tuple[Expr, int]], full: Stmt) -> Stmt:
        """The tail after at least one full tile as a chain of variants `x % lo == r` (r = 1 .. lo - 1), x written
        q * lo + r with q = x // lo: the tail is the one tile q, of min(lo, x - q * lo) = r rows (`te.lower`'s
        region of a symbolic axis), so its loops are constant, unroll, and keep the tile in registers, as in a
        kernel specialized to r rows; `full` stays for r = 0."""
        if not self._variant_ok(loop, facts):
            return full
        x, lo = facts[0]
        lo_x, hi_x = self.ana.bounds(x)
        if hi_x is None or hi_x < lo:
            return full
        q = Var(f"{loop.var.name}_full", x.dtype)
        qb = (max(1, (lo_x or 0) // lo), hi_x // lo)
        out = full
        for r in range(lo - 1, 0, -1):
            variant = self._variant(loop, x, q * lo + r, {q: qb})
            if variant is not None:
                out = IfThenElse(self.ana.simplify(BinOp("eq", x % lo, const(r, x.dtype), boolean)), variant, out)
        return out if out is full else LetStmt(q, self.ana.simplify(x // lo), out)

    def _small_variants(self, loop: For, main: Expr, rest: Expr, facts: list[tuple[Expr, int]], general: Stmt) -> Stmt:
        """The tail for sizes below one tile (x < lo for the one fact x >= lo of a main part that runs) as a chain
        of constant-size variants `x == r` (r = 1 .. lo - 1), x replaced by r: their tile loops have constant
        extents, unroll and keep a register tile (`local` scope) in registers, as a specialized kernel's do; the
        general tail stays for any other value. Only where the loop computes a small local tile."""
        if not self._variant_ok(loop, facts):
            return general
        x, lo = facts[0]
        ana, v = self.ana, loop.var
        out = general
        for r in range(lo - 1, 0, -1):
            k = const(r, x.dtype)

            def put(n, k=k):
                return k if isinstance(n, Expr) and same(n, x) else None

            m, n = ana.simplify(transform(main, put)), ana.simplify(transform(rest, put))
            cond = ana.simplify(BinOp("eq", x, k, boolean))
            if not (isinstance(n, Const) and isinstance(m, Const)) or n.value <= 0 or isinstance(cond, Const):
                continue  # (a size that cannot be r here)
            body = transform(loop.body, put)
            with ana.scope(v, *ana.bind_loop(v, m, n)):
                body = self.stmt(_Simplifier(ana).stmt(body))
            out = IfThenElse(cond, For(v, m, n, loop.kind, body, loop.thread_tag,
                                                             loop.annotations), out)  # fmt: skip
        return out

    def _threshold(self, c: Expr, v: Var, local: set[Var]) -> Expr | None:
        """T such that integer comparison c holds for v < T and every value of the loops inside (`local`, bound in
        the analyzer); c must be `a * v + rest < 0` (or an equivalent form) with a > 0 and v nowhere else. None
        when there is no such form."""
        if not (isinstance(c, BinOp) and c.op in ("lt", "le", "gt", "ge") and c.a.dtype == v.dtype):
            return None
        lhs, rhs = (c.a, c.b) if c.op in ("lt", "le") else (c.b, c.a)
        terms, k0 = self.ana.lin(lhs - rhs)
        k0 -= 1 if c.op in ("le", "ge") else 0  # d <= 0  <=>  d - 1 < 0
        a = terms.pop(v, 0)
        if a <= 0 or any(uses_var(t, v) for t in terms):
            return None
        inner = [t * k for t, k in terms.items() if uses_var(t, local)]
        outer = [t * k for t, k in terms.items() if not uses_var(t, local)]
        if any(not isinstance(n, Var | Const | BinOp | Cast) for t in outer for n in walk(t)):
            return None  # a term read from memory: no loop bound
        hi = self.ana.bounds(sum(inner[1:], inner[0]))[1] if inner else 0
        if hi is None:
            return None
        num: Expr = const(a - 1 - k0 - hi, v.dtype)
        for t in outer:
            num = num - t
        return self.ana.simplify(num // a if a > 1 else num)

    def _assumed(self, n, v: Var, local: set[Var], cuts: list[Expr], facts: list[tuple[Expr, int]]):
        """n rewritten for the main part of a symbolic partition, where every comparison whose threshold is one of
        `cuts` holds, as does every comparison `x >= lo` that follows from `facts` (x >= lo): such a guard is
        true and such a clamp (min/max) picks its side."""

        def holds(c: Expr) -> bool:
            t = self._threshold(c, v, local)
            if t is not None:
                return any(same(t, x) for x in cuts)
            if not (isinstance(c, BinOp) and c.op in ("lt", "le", "gt", "ge") and c.a.dtype.is_int):
                return False
            lhs, rhs = (c.a, c.b) if c.op in ("lt", "le") else (c.b, c.a)
            terms, k0 = self.ana.lin(lhs - rhs)  # c: sum(terms) + k0 < 0 (or <= 0)
            k0 -= 1 if c.op in ("le", "ge") else 0
            if len(terms) != 1:
                return False
            ((x, k),) = terms.items()
            return k < 0 and any(same(x, y) and k * lo + k0 < 0 for y, lo in facts)

        if not isinstance(n, BinOp) or n.dtype.lanes != 1:
            return None
        if n.op in ("lt", "le", "gt", "ge") and holds(n):
            return const(True, boolean)
        if n.op in ("min", "max") and n.dtype.is_int:
            for keep, other in ((n.a, n.b), (n.b, n.a)):
                if holds(BinOp("le", keep, other, boolean) if n.op == "min" else BinOp("le", other, keep, boolean)):
                    return keep
        return None

    def _true_span(self, c: Expr, v: Var, m: int, last: int) -> tuple[int, int] | None:
        """[start, end) of v in [m, last] where c holds for every value of the other loop variables."""

        def truth(x: int) -> bool:
            with self.ana.scope(v, x, x):
                return self.ana.can_prove(c)

        lo_t, hi_t = truth(m), truth(last)
        if lo_t == hi_t:
            return None
        if lo_t:  # true on a prefix: find the last x where it holds
            good, bad = m, last
            while bad - good > 1:
                mid = (good + bad) // 2
                good, bad = (mid, bad) if truth(mid) else (good, mid)
            return m, good + 1
        bad, good = m, last  # true on a suffix: find the first x where it holds
        while good - bad > 1:
            mid = (good + bad) // 2
            bad, good = (bad, mid) if truth(mid) else (mid, good)
        return good, last + 1


def _atoms(s: Stmt) -> list[Expr]:
    """The guards' conjuncts and, for each integer min/max, the comparisons that decide it."""
    out = _conditions(s)
    for n in walk(s):
        if isinstance(n, BinOp) and n.op in ("min", "max") and n.dtype.is_int and n.dtype.lanes == 1:
            out += [BinOp("le", n.a, n.b, boolean), BinOp("le", n.b, n.a, boolean)]
    return out


def _lower_bounds_when_positive(cuts: list[Expr], ana: Analyzer) -> list[tuple[Expr, int]]:
    """Lower bounds (x, lo) implied by every cut being at least 1 (a main part that runs): a cut (k * x + c) // a
    >= 1 gives x >= ceil((a - c) / k), so min(S, 12) is 12 in the main part of S // 12 (x: a size or a product)."""
    out: list[tuple[Expr, int]] = []
    for t in cuts:
        num, a = (t.a, int(t.b.value)) if isinstance(t, BinOp) and t.op == "floordiv" and isinstance(t.b, Const) \
            else (t, 1)  # fmt: skip
        terms, c = ana.lin(num)
        if len(terms) == 1:
            ((x, k),) = terms.items()
            if k > 0:
                out.append((x, -(-(a - c) // k)))
    return out


def _no_guarded_unroll(s: Stmt) -> Stmt:
    """Unrolled loops that still hold a guard become serial loops (a tail's copies would each carry it)."""

    def post(n):
        if isinstance(n, For) and n.kind is ForKind.UNROLLED and any(isinstance(x, IfThenElse | Select)
                                                                      for x in walk(n.body)):  # fmt: skip
            return For(n.var, n.min, n.extent, ForKind.SERIAL, n.body, n.thread_tag, n.annotations)
        return None

    return transform(s, post)  # type: ignore[return-value]


def _analyzer(func: PrimFunc) -> Analyzer:
    """An analyzer that knows the bounds of the function's size arguments."""
    ana = Analyzer()
    ana.bind_sizes(size_params(func.params))
    return ana


def partition_loops(func: PrimFunc) -> PrimFunc:
    return func.with_body(_Partitioner(_analyzer(func)).stmt(func.body))


# ---------------------------------------------------------------------------------------------
# flatten: n-d buffer indices to one flat index


def flatten(func: PrimFunc) -> PrimFunc:
    def flat(buffer, indices: tuple[Expr, ...]) -> tuple[Expr, ...]:
        if len(indices) == 1 and len(buffer.shape) <= 1:
            return indices
        if len(indices) != len(buffer.shape):
            raise ValueError(f"buffer {buffer.name} has {len(buffer.shape)} dims, indexed with {len(indices)}")
        if not indices:
            return (const(0),)
        out: Expr = const(0, indices[0].dtype)
        for i, st in zip(indices, buffer.strides):
            out = out + i * st
        return (out,)

    def post(n):
        if isinstance(n, Load):
            return Load(n.buffer, flat(n.buffer, n.indices), n.predicate)
        if isinstance(n, Store):
            return Store(n.buffer, n.value, flat(n.buffer, n.indices), n.predicate)
        return None

    return func.with_body(transform(func.body, post))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# unroll


def _stmt_count(s: Stmt) -> int:
    """Statements in s (not descending into expressions: a walk of every index would cost more than the unroll)."""
    count, stack = 0, [s]
    while stack:
        n = stack.pop()
        count += 1
        stack.extend(c for c in children(n) if isinstance(c, Stmt))
    return count


def unroll_loops(func: PrimFunc, max_extent: int = 64, max_stmts: int = 512) -> PrimFunc:
    """Replace UNROLLED loops with constant extent by copies of their body (bigger ones keep a pragma)."""

    def post(n):
        if not (isinstance(n, For) and n.kind is ForKind.UNROLLED):
            return None
        if not (isinstance(n.min, Const) and isinstance(n.extent, Const)):
            return None
        ext = int(n.extent.value)
        size = _stmt_count(n.body)
        if ext > max_extent or ext * size > max_stmts:
            return None
        lo = int(n.min.value)
        return seq(*[substitute(n.body, {n.var: const(lo + i, n.var.dtype)}) for i in range(ext)])

    return func.with_body(transform(func.body, post))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# the pipeline

Pass = Callable[[PrimFunc], PrimFunc]

PIPELINE: list[tuple[str, Pass]] = [
    ("simplify", simplify),
    ("partition_loops", partition_loops),
    ("flatten", flatten),
    ("simplify", simplify),
    ("vectorize", lambda f: f.with_body(vectorize_loops(f.body))),
    ("unroll", unroll_loops),
    ("simplify", simplify),
]


def optimize(func: PrimFunc, passes: list[tuple[str, Pass]] | None = None, trace: bool = False) -> PrimFunc:
    for name, fn in passes or PIPELINE:
        func = fn(func)
        if trace or log.isEnabledFor(logging.DEBUG):
            log.debug("after %s:\n%s", name, func)
            if trace:
                print(f"# after {name}\n{func}\n")
    return func


__all__ = ["PIPELINE", "flatten", "optimize", "partition_loops", "simplify", "unroll_loops"]
