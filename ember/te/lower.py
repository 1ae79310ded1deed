"""Lowering a schedule to the loop IR.

1. inline: substitute inlined stages into their consumers;
2. bound inference: consumers first, each stage computed at a consumer's loop gets the region
   that consumer reads inside that loop (symbolic in the outer loop variables);
3. loop nests: each stage's leaf loops, split/fuse relations turned into index arithmetic,
   guards for splits that do not divide, reduction init placed before the first reduction loop,
   stages computed-at nested at their attach loops with their buffers allocated there;
4. the loop passes of `tir.transform` (simplify, partition, flatten, vectorize, unroll).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..tir import expr as E
from ..tir.arith import Analyzer
from ..tir.dtype import int32, int64
from ..tir.expr import Expr, Var, const
from ..tir.functor import substitute, transform, walk
from ..tir.stmt import Allocate, Buffer, Evaluate, For, ForKind, IfThenElse, PrimFunc, Stmt, Store, seq
from .intrin import PREFETCH, tensorize_loops
from .schedule import Fuse, Prefetch, Schedule, ScheduleError, Split, Stage
from .tensor import ComputeOp, IterVar, PlaceholderOp, Reduce, Tensor, TensorLoad


@dataclass
class Loops:
    """The loop structure of one stage once its root ranges are known."""

    root_min: dict[IterVar, Expr] = field(default_factory=dict)
    extent: dict[IterVar, int | Expr] = field(default_factory=dict)  # of every iter var (zero-based ranges)
    var: dict[IterVar, Var] = field(default_factory=dict)  # loop variable of each leaf
    value: dict[IterVar, Expr] = field(default_factory=dict)  # zero-based value of every iter var
    preds: list[Expr] = field(default_factory=list)  # guards of non-dividing splits


class Lowering:
    def __init__(self, sch: Schedule, args: Sequence[Tensor], name: str):
        self.sch = sch
        self.name = name
        self.args = list(args)
        self.ana = Analyzer()
        self.stages = [st for st in sch.stages if st.attach != "inline"]
        self.arg_stages = [self.arg_stage(t) for t in self.args]
        # symbolic sizes (size variables in shapes: kernel arguments) index in int64, as do large tensors
        self.symbolic = any(isinstance(d, Expr) for st in sch.stages for d in st.op.shape)
        big = self.symbolic or max((math.prod(st.op.shape) for st in sch.stages), default=0) >= 2**31
        self.index_dtype = int64 if big else int32
        for st in sch.stages:  # size variables with bounds (ember.graph.dims.SizeVar): the analyzer knows them
            for d in st.op.shape:
                for v in walk(d) if isinstance(d, Expr) else ():
                    if isinstance(v, Var) and hasattr(v, "lo"):
                        self.ana.bind(v, v.lo, v.hi)
        self.bodies: dict[Stage, Expr] = {}
        self.loops: dict[Stage, Loops] = {}
        self.region_min: dict[Stage, list[Expr]] = {}
        self.buffers: dict[Stage, Buffer] = {}
        self.attached: dict[tuple[Stage, IterVar], list[Stage]] = {}
        self.readers: dict[Stage, dict[Stage, None]] = {}  # ordered sets: the IR must not depend on object ids
        self.exact_dims: dict[Stage, set[int]] = {}  # stages computed with exact tails: their axes that have one

    def arg_stage(self, t: Tensor) -> Stage:
        """The stage of argument t; an input that the computation does not read is an unused parameter."""
        if isinstance(t.op, PlaceholderOp) and all(st.op is not t.op for st in self.sch.stages):
            return Stage(self.sch, t.op, t.name)
        return self.sch[t]

    # -- 1. inline ---------------------------------------------------------------------------
    def inline(self) -> None:
        inlined: dict[Stage, tuple[list[Var], Expr]] = {}
        for st in self.sch.stages:
            if st.is_placeholder:
                continue
            op = st.op
            assert isinstance(op, ComputeOp)

            def post(n, inlined=inlined):
                if isinstance(n, TensorLoad):
                    src = self.sch[n.tensor]
                    if src in inlined:
                        params, body = inlined[src]
                        return substitute(body, dict(zip(params, n.indices)))
                return None

            body = transform(op.body, post) if inlined else op.body
            if st.attach == "inline":
                inlined[st] = ([iv.var for iv in op.axis], body)
            else:
                self.bodies[st] = body

    # -- checks ------------------------------------------------------------------------------
    def check(self) -> None:
        arg_set = set(self.arg_stages)
        for t, st in zip(self.args, self.arg_stages):
            if st.attach == "inline":
                raise ScheduleError(f"tensor '{t.name}' is an argument and cannot be inlined")
            if st.attach == "at":
                raise ScheduleError(f"tensor '{t.name}' is an argument, so it must be computed at root")
        readers = self.readers
        for st, body in self.bodies.items():
            for n in walk(body):
                if isinstance(n, TensorLoad):
                    readers.setdefault(self.sch[n.tensor], {})[st] = None
        for st in self.sch.stages:
            if st.is_placeholder and st in readers and st not in arg_set:
                raise ScheduleError(f"placeholder '{st.name}' is read but not in the argument list")
            if st.is_output and st not in arg_set:
                raise ScheduleError(f"output '{st.name}' is not in the argument list")
            if st.attach != "at":
                continue
            target, axis = st.attach_stage, self.attach_axis(st)
            assert target is not None and axis is not None
            if target.attach == "inline":
                raise ScheduleError(f"stage '{st.name}' is computed at '{target.name}', which is inlined")
            if axis not in target.leaf_iter_vars:
                raise ScheduleError(
                    f"stage '{st.name}' is computed at loop '{axis.name}' of '{target.name}', "
                    f"which is no longer one of its loops [{', '.join(iv.name for iv in target.leaf_iter_vars)}]"
                )
            pos = target.leaf_iter_vars.index(axis)
            for r in readers.get(st, {}):
                if not self.inside(r, target, pos):
                    raise ScheduleError(
                        f"stage '{st.name}' is computed at '{target.name}.{axis.name}', but its reader '{r.name}' "
                        "runs outside that loop; compute it at a loop that encloses all its readers, or at root"
                    )
            self.attached.setdefault((target, axis), []).append(st)

    @staticmethod
    def attach_axis(st: Stage) -> IterVar:
        """The loop st is computed in: its compute_at axis, or where that axis went when it was later
        split (the inner part: the same loop body) or fused (the fused loop)."""
        target, axis = st.attach_stage, st.attach_axis
        assert target is not None and axis is not None
        moved = True
        while axis not in target.leaf_iter_vars and moved:
            moved = False
            for r in target.relations:
                if isinstance(r, Split) and r.parent is axis:
                    axis, moved = r.inner, True
                elif isinstance(r, Fuse) and axis in (r.outer, r.inner):
                    axis, moved = r.fused, True
        return axis

    @staticmethod
    def inside(r: Stage, target: Stage, pos: int) -> bool:
        """Whether stage r runs inside loop `pos` of target (is target, or is computed within it)."""
        while r is not target:
            if r.attach != "at":
                return False
            if r.attach_stage is target:
                return target.leaf_iter_vars.index(Lowering.attach_axis(r)) >= pos
            r = r.attach_stage  # type: ignore[assignment]
        return True

    # -- 2. bounds ---------------------------------------------------------------------------
    def infer_bounds(self) -> None:
        for st in reversed(self.stages):
            if st.is_placeholder:
                self.region_min[st] = [const(0, self.index_dtype)] * len(st.op.shape)
                continue
            op = st.op
            assert isinstance(op, ComputeOp)
            zero = const(0, self.index_dtype)
            if st.attach == "at":
                ranges = self.region(st)
            else:
                ranges = [(zero, n) for n in op.shape]
            loops = Loops()
            for iv, (lo, ext) in zip(op.axis, ranges):
                loops.root_min[iv], loops.extent[iv] = lo, ext
            for iv in op.reduce_axis:
                loops.root_min[iv], loops.extent[iv] = const(iv.dom[0], self.index_dtype), iv.dom[1]  # type: ignore[index]
                if isinstance(iv.dom[1], Expr):  # type: ignore[index]
                    self.symbolic = True
            self.region_min[st] = [lo for lo, _ in ranges]
            self.make_loops(st, loops)
            self.loops[st] = loops

    def make_loops(self, st: Stage, L: Loops) -> None:
        for r in st.relations:
            if isinstance(r, Split):
                n = L.extent[r.parent]
                if isinstance(n, Expr):  # a symbolic extent: the factor as given, a guarded tail
                    inner = r.factor if r.factor is not None else self.ana.simplify((n + (r.nparts - 1)) // r.nparts)
                    L.extent[r.inner] = inner
                    L.extent[r.outer] = self.ana.simplify((n + (inner - 1)) // inner)
                    continue
                if r.factor is not None:
                    inner = max(1, min(r.factor, n))
                else:
                    inner = max(1, -(-n // r.nparts))  # type: ignore[operator]
                L.extent[r.inner], L.extent[r.outer] = inner, -(-n // inner)
            else:
                ext = L.extent[r.outer] * L.extent[r.inner]
                L.extent[r.fused] = self.ana.simplify(ext) if isinstance(ext, Expr) else ext
        for iv in st.leaf_iter_vars:
            v = Var(iv.name, self.index_dtype)
            L.var[iv] = L.value[iv] = v
            ext = L.extent[iv]
            self.ana.bind(v, 0, ext - 1 if not isinstance(ext, Expr) else self.ana.const_upper_bound(ext - 1))
        exact = {st.op.axis[d]: d for d in self.exact_dims.get(st, ())}
        for r in reversed(st.relations):
            if isinstance(r, Split):
                inner = L.extent[r.inner]
                L.value[r.parent] = L.value[r.outer] * inner + L.value[r.inner]
                if self.same_extent(L.extent[r.outer] * inner, L.extent[r.parent]):
                    continue
                if r.tail == "shift" and not isinstance(L.extent[r.parent], Expr):
                    self.check_shift(st, r)  # the last tile moved back to end at the extent: no guard
                    last = const(L.extent[r.parent] - inner, self.index_dtype)
                    L.value[r.parent] = E.binop("min", L.value[r.outer] * inner, last) + L.value[r.inner]
                    continue
                L.preds.append(self.split_guard(st, L, r.parent, exact.get(r.parent)))
            else:
                inner_ext = self.index(L.extent[r.inner])
                L.value[r.outer] = L.value[r.fused] // inner_ext
                L.value[r.inner] = L.value[r.fused] % inner_ext

    def split_guard(self, st: Stage, L: Loops, parent: IterVar, exact_dim: int | None) -> Expr:
        """The guard of a split that does not divide `parent`: its value within the extent. An axis with an exact
        tail (a region of min(tile, what the readers need) elements) computes its last inner tile whole instead,
        as far as its buffer (allocated at the full tile) and its own shape allow: the lanes of a vector past
        the tail cost nothing more than masking them, and read only what the stage's compute defines."""
        value, ext = L.value[parent], L.extent[parent]
        bound = self.ana.const_upper_bound(ext) if exact_dim is not None and isinstance(ext, Expr) else None
        if bound is None:
            return value < ext
        shape = st.op.shape[exact_dim]
        return (value < bound) & (L.root_min[parent] + value < shape)

    @staticmethod
    def check_shift(st: Stage, r: Split) -> None:
        """A shifted tail recomputes elements: only sound where each tile computes its elements whole, every
        reduction loop inside the split's outer loop (not a reduction accumulated across tiles)."""
        leaves = st.leaf_iter_vars
        outer = Lowering.leaf_of(st, r.outer)
        if outer is None:
            return
        pos = leaves.index(outer)
        if any(iv.kind == "reduce" for iv in leaves[: pos + 1]):
            raise ScheduleError(
                f"stage '{st.name}': split of '{r.parent.name}' with tail='shift' needs every reduction loop inside "
                f"'{r.outer.name}' (a shifted tile recomputes its elements); reorder, or use tail='guard'"
            )

    @staticmethod
    def leaf_of(st: Stage, iv: IterVar) -> IterVar | None:
        """The leaf loop that iv became (itself, the outer part of a later split, or a fused loop)."""
        while iv not in st.leaf_iter_vars:
            nxt = None
            for r in st.relations:
                if isinstance(r, Split) and r.parent is iv:
                    nxt = r.outer
                elif isinstance(r, Fuse) and iv in (r.outer, r.inner):
                    nxt = r.fused
            if nxt is None:
                return None
            iv = nxt
        return iv

    def index(self, n: int | Expr) -> Expr:
        """An extent as an index expression."""
        return const(n, self.index_dtype) if not isinstance(n, Expr) else E.Cast(self.index_dtype, n) \
            if n.dtype != self.index_dtype else n  # fmt: skip

    def same_extent(self, a: int | Expr, b: int | Expr) -> bool:
        if not isinstance(a, Expr) and not isinstance(b, Expr):
            return a == b
        d = self.ana.simplify(self.index(a) - self.index(b))
        return isinstance(d, E.Const) and d.value == 0

    def relax(self, it: tuple[Expr, Expr], st: Stage, first: int) -> tuple[Expr, Expr] | None:
        """Widen an interval over the loops of `st` from leaf position `first` inward."""
        loops = self.loops[st]
        env = {loops.var[iv]: (const(0, self.index_dtype), self.index(loops.extent[iv] - 1))
               for iv in st.leaf_iter_vars[first:]}  # fmt: skip
        lo, hi = self.ana.interval(it[0], env), self.ana.interval(it[1], env)
        return None if lo is None or hi is None else (lo[0], hi[1])

    def root_intervals(self, st: Stage, first: int, clamp: bool = False) -> dict[Var, tuple[Expr, Expr]]:
        """Interval of each root axis of st while its leaf loops from position `first` inward run; `clamp`:
        its upper end clamped to the axis's range (a min(), exact at a split's tail)."""
        loops = self.loops[st]
        op = st.op
        assert isinstance(op, ComputeOp)
        out = {}
        for iv in op.axis + op.reduce_axis:
            # not clamped to the axis domain by default: split tails over-approximate, and the producer's region
            # is clamped to its own shape in `region` (clamping here would lose the extent's constancy)
            v = loops.root_min[iv] + loops.value[iv]
            dom = (loops.root_min[iv], loops.root_min[iv] + (loops.extent[iv] - 1))
            lo, hi = self.relax((v, v), st, first) or dom
            if clamp:
                hi = self.ana.simplify(E.binop("min", hi, self.index(dom[1])))
            out[iv.var] = (lo, hi)
        return out

    def exact_tail(self, st: Stage) -> bool:
        """Whether st is computed at a loop with pragma `exact_tail`: its region at a tile that does not divide
        the extent is only what the tile reads (from the tile's own start, not shifted back to end at the
        extent), a min() that the loop partition makes constant in the full tiles and in the tail."""
        target = st.attach_stage
        attr = target.iter_attrs.get(self.attach_axis(st)) if target is not None else None
        return attr is not None and any(k == "exact_tail" and v for k, v in attr.pragmas)

    def relax_threads(self, it: tuple[Expr, Expr], st: Stage) -> tuple[Expr, Expr] | None:
        """Widen an interval over the threadIdx-bound loops of st and of the stages it is computed in: a
        "shared" buffer is filled once for all the threads of a block (as TVM's bound inference does)."""
        env: dict[Var, tuple[Expr, Expr]] = {}
        s: Stage | None = st
        while s is not None:
            loops = self.loops[s]
            for iv in s.leaf_iter_vars:
                attr = s.iter_attrs.get(iv)
                if attr is not None and (attr.thread_tag or "").startswith("threadIdx"):
                    env[loops.var[iv]] = (const(0, self.index_dtype), self.index(loops.extent[iv] - 1))
            s = s.attach_stage if s.attach == "at" else None
        if not env:
            return it
        lo, hi = self.ana.interval(it[0], env), self.ana.interval(it[1], env)
        return None if lo is None or hi is None else (lo[0], hi[1])

    def region(self, st: Stage) -> list[tuple[Expr, int]]:
        """The part of st's output read inside the loop it is computed at, as (min, extent) per dim:
        each reader's loops (and those of the stages between it and the attach loop) are relaxed."""
        target, axis = st.attach_stage, self.attach_axis(st)
        assert target is not None
        pos = target.leaf_iter_vars.index(axis)
        shape = st.op.shape
        acc: list[tuple[Expr, Expr] | None] = [None] * len(shape)  # clamped to the shape
        raw: list[tuple[Expr, Expr] | None] = [None] * len(shape)  # unclamped: often a constant extent
        unbounded = [False] * len(shape)
        exact = self.exact_tail(st)
        tight: list[Expr | None] = [None] * len(shape)  # exact tails: the last element the readers' domains need
        untight = [False] * len(shape)
        for reader in self.readers.get(st, ()):
            first = pos + 1 if reader is target else 0
            root_env = self.root_intervals(reader, first)
            clamped_env = self.root_intervals(reader, first, clamp=True) if exact else {}
            # each distinct index tuple once: an inlined stage read several times repeats its loads (a softmax's
            # inlined row max read 128 times over was 8192 loads of 64 distinct tuples)
            reads = dict.fromkeys(tuple(n.indices) for n in walk(self.bodies[reader], unique=True)
                                  if isinstance(n, TensorLoad) and self.sch[n.tensor] is st)  # fmt: skip
            for indices in reads:
                for d, idx in enumerate(indices):
                    it = self.relaxed(self.ana.interval(idx, root_env), reader, target, pos)
                    through = self.through_leaves(idx, reader, first)
                    if through is not None and it is not None:
                        it = self.tighter(it, self.relaxed(through, reader, target, pos))
                    if exact and it is not None and not untight[d]:
                        tight[d] = self.tight_end(idx, clamped_env, reader, target, pos, tight[d])
                        untight[d] = tight[d] is None
                    if it is not None and st.scope == "shared":
                        it = self.relax_threads(it, target)
                    if it is None:
                        unbounded[d] = True
                        continue
                    raw[d] = it if raw[d] is None else self.ana.union(raw[d], it)  # type: ignore[arg-type]
                    lo, hi = E.binop("max", it[0], 0), E.binop("min", it[1], self.index(shape[d] - 1))
                    it = self.ana.simplify(lo), self.ana.simplify(hi)
                    acc[d] = it if acc[d] is None else self.ana.union(acc[d], it)  # type: ignore[arg-type]
        out = []
        for d, n in enumerate(shape):
            it = acc[d]
            ext = None
            if not unbounded[d] and it is not None:
                exts = [self.ana.max_over_loops(b[1] - b[0] + 1) for b in (it, raw[d])]  # type: ignore[index]
                ext = min((x for x in exts if x is not None), default=None)
            if ext is None or (not isinstance(n, Expr) and ext >= n):
                out.append((const(0, self.index_dtype), n))
                continue
            ext = max(ext, 1)
            if isinstance(n, Expr) and ext > 1:
                # a tile of a symbolic axis: from its own start, min(ext, n - start) rows. The last tile is not
                # shifted back to end at n (that recomputes up to ext - 1 rows: at n = 16 a 12-row tile does 24);
                # the loop partition gives the full tiles the constant extent and the tail a variant per size
                start = self.ana.simplify(E.binop("max", it[0], 0))  # type: ignore[index]
                rows = E.binop("min", const(ext, self.index_dtype), self.index(n) - start)
                out.append((start, self.ana.simplify(rows)))
                continue
            if isinstance(n, Expr) and not self.ana.can_prove(self.index(n) >= ext):
                # a symbolic n that may be smaller than the tile: min(ext, n) rows, from max(0, ...)
                sym_ext = self.ana.simplify(E.binop("min", self.index(n), const(ext, self.index_dtype)))
                lo = E.binop("max", E.binop("min", E.binop("max", it[0], 0), self.index(n - ext)), 0)  # type: ignore[index]
                out.append((self.ana.simplify(lo), sym_ext))
                continue
            if exact and tight[d] is not None and not untight[d]:
                # the tile from its own start, as many elements as its readers need (the loop partition cuts the
                # tiles that hold all `ext` from the tail); its buffer is allocated at `ext`
                start = self.ana.simplify(E.binop("max", it[0], 0))  # type: ignore[index]
                end = E.binop("min", tight[d], self.index(n - 1))
                rows = self.ana.simplify(E.binop("min", const(ext, self.index_dtype), end - start + 1))
                if not isinstance(rows, E.Const) or rows.value == ext:
                    self.exact_dims.setdefault(st, set()).add(d)
                    out.append((start, rows))
                    continue
            lo = E.binop("min", E.binop("max", it[0], 0), self.index(n - ext))  # type: ignore[index]
            out.append((self.ana.simplify(lo), ext))
        return out

    def relaxed(self, it: tuple[Expr, Expr] | None, reader: Stage, target: Stage, pos: int):
        """An interval over the reader's loops widened over those of the stages between it and the target."""
        s = reader
        while it is not None and s is not target:
            s = s.attach_stage  # type: ignore[assignment]
            it = self.relax(it, s, pos + 1 if s is target else 0)
        return it

    def through_leaves(self, idx: Expr, reader: Stage, first: int) -> tuple[Expr, Expr] | None:
        """The interval of `idx` with the reader's root axes written in its leaf loops, simplified first: an index
        h * W + w of axes fused and split again is the fused loop's range (a tile of 28 pixels of a 14-wide image
        read in vectors of 16: 32 pixels), where the root axes' intervals take whole rows (3 rows: 42)."""
        loops = self.loops[reader]
        op = reader.op
        assert isinstance(op, ComputeOp)
        sub = {iv.var: loops.root_min[iv] + loops.value[iv] for iv in op.axis + op.reduce_axis}
        flat = self.ana.simplify(substitute(idx, sub))  # type: ignore[arg-type]
        return self.relax((flat, flat), reader, first)

    def tighter(self, a: tuple[Expr, Expr], b: tuple[Expr, Expr]) -> tuple[Expr, Expr]:
        """Of two intervals that both hold the index, the one of the fewer elements at most (a where unknown)."""
        ea, eb = (self.ana.max_over_loops(self.ana.simplify(x[1] - x[0] + 1)) for x in (a, b))
        return b if ea is not None and eb is not None and eb < ea else a

    def tight_end(self, idx: Expr, env: dict[Var, tuple[Expr, Expr]], reader: Stage, target: Stage, pos: int,
                  prev: Expr | None) -> Expr | None:
        """The last element index `idx` reaches when the reader's axes stay within their ranges (a tile's
        end clamped to the axis); None where that is unknown."""
        it = self.ana.interval(idx, env)
        s = reader
        while it is not None and s is not target:
            s = s.attach_stage  # type: ignore[assignment]
            it = self.relax(it, s, pos + 1 if s is target else 0)
        if it is None:
            return None
        return it[1] if prev is None else self.ana.simplify(E.binop("max", prev, it[1]))

    # -- 3. loop nests -----------------------------------------------------------------------
    def make_buffers(self) -> list[Buffer]:
        params = []
        for t, st in zip(self.args, self.arg_stages):
            if st in self.buffers:
                raise ScheduleError(f"tensor '{t.name}' appears twice in the argument list")
            self.buffers[st] = Buffer(st.name, t.shape, t.dtype)
            params.append(self.buffers[st])
        for st in self.stages:
            if st not in self.buffers:
                if st.is_placeholder:
                    continue
                shape = tuple(self.buffer_extent(self.loops[st].extent[iv]) for iv in st.op.axis)  # type: ignore[attr-defined]
                if st.row_align > 1 and shape and isinstance(shape[-1], int):  # (`Stage.storage_align`)
                    shape = (*shape[:-1], -(-shape[-1] // st.row_align) * st.row_align)
                scope = st.scope if st.attach == "at" else "global"
                self.buffers[st] = Buffer(st.name, shape, st.op.dtype, scope)
        return params

    def buffer_extent(self, ext: int | Expr) -> int | Expr:
        """A symbolic extent with a constant bound (a tile's min(8, n)) allocates that bound: a static buffer."""
        if not isinstance(ext, Expr):
            return ext
        hi = self.ana.const_upper_bound(ext)
        return hi if hi is not None and hi < 2**20 else ext

    def load(self, n: TensorLoad, env: dict[Var, Expr]) -> Expr:
        st = self.sch[n.tensor]
        mins = self.region_min[st]
        idx = tuple(self.expr(i, env) - m for i, m in zip(n.indices, mins))  # type: ignore[operator]
        return E.Load(self.buffers[st], idx)

    def expr(self, e: Expr, env: dict[Var, Expr]) -> Expr:
        def post(n):
            return env.get(n) if isinstance(n, Var) else None

        def pre(n):
            return self.load(n, env) if isinstance(n, TensorLoad) else None

        return transform(e, post, pre)  # type: ignore[return-value]

    def nest(self, st: Stage) -> Stmt:
        op = st.op
        assert isinstance(op, ComputeOp)
        L = self.loops[st]
        buf = self.buffers[st]
        env = {iv.var: L.root_min[iv] + L.value[iv] for iv in op.axis + op.reduce_axis}
        out_idx = tuple(L.value[iv] for iv in op.axis)
        body = self.bodies[st]
        leaves = st.leaf_iter_vars
        if isinstance(body, Reduce):
            cur = E.Load(buf, out_idx)
            update: Stmt = Store(buf, body.reducer.combine(cur, self.expr(body.source, env)), out_idx)
            cond = self.expr(body.condition, env)
            if not (isinstance(cond, E.Const) and cond.value):
                update = IfThenElse(cond, update)
            inner = self.guard(update, L.preds)
            first_reduce = next(i for i, iv in enumerate(leaves) if iv.kind == "reduce") if leaves else 0
        else:
            inner = self.guard(Store(buf, self.expr(body, env), out_idx), L.preds)
            first_reduce = -1
        stmt = inner
        for pos in reversed(range(len(leaves))):
            iv = leaves[pos]
            fetch = [self.prefetch(st, p, pos) for p in st.prefetches if self.leaf_of(st, p.axis) is iv]
            if fetch:
                stmt = seq(*fetch, stmt)
            if any(p.double_buffered for p in self.attached.get((st, iv), ())):
                stmt = self.double_buffered_loop(st, iv, stmt)
            else:
                stmt = self.wrap_attached(st, iv, stmt)
                stmt = self.loop(st, iv, L.var[iv], stmt)
            if pos == first_reduce:
                stmt = seq(self.init_nest(st, body, pos), stmt)  # type: ignore[arg-type]
        if not leaves and isinstance(body, Reduce):
            stmt = seq(self.init_nest(st, body, 0), stmt)
        return stmt

    def prefetch(self, st: Stage, p: Prefetch, pos: int) -> Stmt:
        """The prefetch statements of `p` in one iteration of loop `pos` of st (`Stage.prefetch`): the box of
        elements st reads of the tensor inside that iteration, moved along its dimension and clamped to it, as
        cache lines (runs of whole inner dimensions are contiguous); with a spread loop, its iteration's share."""
        src = p.tensor
        if src.attach != "root" and not src.is_placeholder:
            raise ScheduleError(f"stage '{st.name}': prefetch of '{src.name}' needs a tensor computed at root")
        attr = st.iter_attrs.get(st.leaf_iter_vars[pos])
        if attr is not None and attr.kind in (ForKind.VECTORIZED, ForKind.THREAD_BINDING):
            raise ScheduleError(f"stage '{st.name}': cannot prefetch in a vectorized or thread-bound loop")
        op = st.op
        assert isinstance(op, ComputeOp)
        L = self.loops[st]
        env = {iv.var: L.root_min[iv] + L.value[iv] for iv in op.axis + op.reduce_axis}
        shape = src.op.shape
        if any(isinstance(n, Expr) for n in shape):
            return seq()  # a symbolic shape: no constant box (prefetching is an optimization only)
        box: list[tuple[Expr, Expr] | None] = [None] * len(shape)
        for n in walk(self.bodies[st], unique=True):
            if isinstance(n, TensorLoad) and self.sch[n.tensor] is src:
                for d, i in enumerate(n.indices):
                    e = self.ana.simplify(self.expr(i, env))
                    it = self.relax((e, e), st, pos + 1)
                    if it is None:
                        return seq()
                    box[d] = it if box[d] is None else self.ana.union(box[d], it)  # type: ignore[arg-type]
        if any(b is None for b in box):
            return seq()
        ext = [self.ana.max_over_loops(self.ana.simplify(b[1] - b[0] + 1)) for b in box]  # type: ignore[index]
        if any(x is None for x in ext):
            return seq()
        ext = [max(1, min(int(x), n)) for x, n in zip(ext, shape)]  # type: ignore[arg-type]
        lo = []
        for d, (b, x, n) in enumerate(zip(box, ext, shape)):
            start = b[0] + p.offset if d == p.dim else b[0]  # type: ignore[index]
            lo.append(self.ana.simplify(E.binop("max", E.binop("min", start, self.index(n - x)), 0)))
        d0 = len(shape) - 1  # the contiguous run: the last partial dimension and the whole ones inside it
        while d0 > 0 and ext[d0] == shape[d0]:
            d0 -= 1
        strides = [math.prod(shape[d + 1 :]) for d in range(len(shape))]
        per_line = max(1, 512 // max(1, src.op.dtype.bits))  # elements of a 64-byte line
        run = ext[d0] * strides[d0]
        lines = -(-run // per_line)
        rows = math.prod(ext[:d0])
        total = rows * lines
        if total > 256:
            raise ScheduleError(f"stage '{st.name}': prefetch of '{src.name}' takes {total} cache lines per iteration "
                                f"of '{st.leaf_iter_vars[pos].name}'; prefetch in an inner loop")  # fmt: skip
        buf = self.buffers[src]
        last = const(total - 1, self.index_dtype)

        def fetch(t: Expr) -> Stmt:
            row, off = t // lines, (t % lines) * per_line
            idx = []
            for d in range(len(shape)):
                if d < d0:
                    inner = math.prod(ext[d + 1 : d0])
                    idx.append(lo[d] + (row // inner) % ext[d])
                elif d == d0:
                    idx.append(lo[d] + off // strides[d])
                else:
                    idx.append((off // strides[d]) % shape[d])
            load = E.Load(buf, tuple(self.ana.simplify(i) for i in idx))
            return Evaluate(E.Call(PREFETCH, (load,), int32))

        if p.spread is None:
            return seq(*[fetch(const(t, self.index_dtype)) for t in range(total)])
        sp, siv = p.spread
        if sp is not st and not (sp in self.loops and self.inside(st, sp, 0)):
            raise ScheduleError(f"stage '{st.name}': its prefetch spread loop is in '{sp.name}', which it is not "
                                "computed in")  # fmt: skip
        z, n = self.loops[sp].value[siv], self.loops[sp].extent[siv]
        if isinstance(n, Expr):
            return seq()
        return seq(*[fetch(E.binop("min", z + k * n, last)) for k in range(-(-total // n))])

    def loop(self, st: Stage, iv: IterVar, v: Var, body: Stmt) -> Stmt:
        attr = st.iter_attrs.get(iv)
        kind = attr.kind if attr else ForKind.SERIAL
        tag = attr.thread_tag if attr else None
        notes = tuple(attr.pragmas) if attr else ()
        ext = self.loops[st].extent[iv]
        return For(v, const(0, self.index_dtype), self.index(ext), kind, body, tag, notes)

    def init_nest(self, st: Stage, body: Reduce, first_reduce: int) -> Stmt:
        """Stores of the reduction identity, over the data-parallel loops inside the first reduction loop."""
        L = self.loops[st]
        inner = [iv for iv in st.leaf_iter_vars[first_reduce:] if iv.kind != "reduce"]
        fresh = {L.var[iv]: Var(L.var[iv].name, self.index_dtype) for iv in inner}
        op = st.op
        assert isinstance(op, ComputeOp)
        idx = tuple(substitute(L.value[iv], fresh) for iv in op.axis)
        ident = E.convert(body.reducer.identity(body.dtype), body.dtype)
        if ident.dtype != body.dtype:
            ident = E.Cast(body.dtype, ident)
        preds = [substitute(p, fresh) for p in L.preds if not _uses_reduce(p, st, L)]
        stmt = self.guard(Store(self.buffers[st], ident, idx), preds)  # type: ignore[arg-type]
        for iv in reversed(inner):
            stmt = self.loop(st, iv, fresh[L.var[iv]], stmt)  # type: ignore[arg-type]
        return stmt

    def guard(self, stmt: Stmt, preds: list[Expr]) -> Stmt:
        conds = [p for p in (self.ana.simplify(p) for p in preds) if not (isinstance(p, E.Const) and p.value)]
        if not conds:
            return stmt
        cond = conds[0]
        for c in conds[1:]:
            cond = cond & c
        return IfThenElse(cond, stmt)

    def wrap_attached(self, st: Stage, iv: IterVar, stmt: Stmt) -> Stmt:
        for p in reversed(self.attached.get((st, iv), [])):
            stmt = Allocate(self.buffers[p], seq(self.nest(p), stmt))
        return stmt

    def double_buffered_loop(self, st: Stage, iv: IterVar, body: Stmt) -> Stmt:
        """Loop iv of st with its double-buffered attached stages: each gets a buffer of two slots; the slot of
        iteration 0 is filled before the loop, and iteration v fills slot (v+1)%2 for iteration v+1 (when there
        is one) before it computes from slot v%2. The other attached stages are computed in the loop as usual."""
        v, n = self.loops[st].var[iv], self.loops[st].extent[iv]
        attached = self.attached.get((st, iv), [])
        for p in reversed([p for p in attached if not p.double_buffered]):
            body = Allocate(self.buffers[p], seq(self.nest(p), body))
        pro, pre = [], []
        slots = []
        for p in [p for p in attached if p.double_buffered]:
            buf = self.buffers[p]
            two = Buffer(buf.name, (2, *buf.shape), buf.dtype, buf.scope)
            slots.append(two)
            fill = self.nest(p)
            body = _to_slot(body, buf, two, v % 2)
            zero = const(0, self.index_dtype)
            nxt = _to_slot(_fresh_loops(substitute(fill, {v: v + 1})), buf, two, (v + 1) % 2)
            pre.append(IfThenElse(v + 1 < n, nxt) if n > 1 else None)
            pro.append(_to_slot(_fresh_loops(substitute(fill, {v: zero})), buf, two, zero))
        body = seq(*[x for x in pre if x is not None], body)
        stmt = seq(*pro, self.loop(st, iv, v, body))
        for two in reversed(slots):
            stmt = Allocate(two, stmt)
        return stmt

    def run(self) -> PrimFunc:
        self.inline()
        self.check()
        self.infer_bounds()
        params = self.make_buffers()
        roots = [st for st in self.stages if not st.is_placeholder and st.attach == "root"]
        body = seq(*[self.nest(st) for st in roots])
        arg_set = set(self.arg_stages)
        for st in reversed(roots):
            if st not in arg_set:
                body = Allocate(self.buffers[st], body)
        return PrimFunc(self.name, tuple(params), body)


def _fresh_loops(stmt: Stmt) -> Stmt:
    """A copy of stmt whose loops bind new variables (of the same names): a nest emitted twice stays unique."""
    loop_vars = [n.var for n in walk(stmt) if isinstance(n, For)]
    return substitute(stmt, {x: Var(x.name, x.dtype) for x in loop_vars})  # type: ignore[return-value]


def _to_slot(stmt: Stmt, buf: Buffer, two: Buffer, slot: Expr) -> Stmt:
    """stmt with its loads and stores of buf going to slot `slot` of the two-slot buffer `two`."""

    def post(n):
        if isinstance(n, E.Load) and n.buffer is buf:
            return E.Load(two, (slot, *n.indices))
        if isinstance(n, Store) and n.buffer is buf:
            return Store(two, n.value, (slot, *n.indices))
        return None

    return transform(stmt, post)  # type: ignore[return-value]


def _uses_reduce(p: Expr, st: Stage, L: Loops) -> bool:
    reduce_vars = {L.var[iv] for iv in st.leaf_iter_vars if iv.kind == "reduce"}
    return any(isinstance(n, Var) and n in reduce_vars for n in walk(p))


def lower_schedule(sch: Schedule, args: Sequence[Tensor], name: str = "default_function") -> PrimFunc:
    """The loop nest a schedule describes, before loop passes."""
    for a in args:
        if not isinstance(a, Tensor):
            raise TypeError(f"arguments must be tensors, got {a!r}")
    return tensorize_loops(Lowering(sch, args, name).run())
