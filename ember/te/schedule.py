"""Schedules: how a tensor-expression DAG becomes loops.

A `Schedule` has one `Stage` per operation. Primitives on a stage (split, fuse, reorder, ...) and on
the schedule (cache_read, cache_write) are recorded as `Step`s: a schedule *is* its list of steps,
which serializes to JSON and replays on a fresh schedule of the same compute.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..tir.arith import Analyzer
from ..tir.expr import Const, Var, same
from ..tir.functor import substitute, transform, walk
from ..tir.stmt import ForKind
from .tensor import ComputeOp, IterVar, Operation, PlaceholderOp, Reduce, Tensor, TensorLoad, const

SCOPES = ("global", "local", "shared")
THREAD_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z", "vthread")


class ScheduleError(ValueError):
    """An illegal schedule request; the message names the stage and the axis."""


@dataclass(frozen=True)
class Step:
    """One schedule primitive applied to a stage, by names: replayable and JSON-serializable."""

    kind: str
    stage: str
    args: tuple = ()

    def to_json(self) -> dict:
        return {"kind": self.kind, "stage": self.stage, "args": _jsonable(self.args)}

    @staticmethod
    def from_json(d: dict) -> Step:
        return Step(d["kind"], d["stage"], _tupled(d.get("args", [])))

    def __str__(self) -> str:
        return f"{self.kind}({self.stage}{''.join(', ' + repr(a) for a in self.args)})"


def _jsonable(x: Any) -> Any:
    return [_jsonable(v) for v in x] if isinstance(x, list | tuple) else x


def _tupled(x: Any) -> Any:
    return tuple(_tupled(v) for v in x) if isinstance(x, list | tuple) else x


@dataclass
class Split:
    parent: IterVar
    outer: IterVar
    inner: IterVar
    factor: int | None
    nparts: int | None
    tail: str = "guard"  # a last partial tile: "guard" (bounds checks) or "shift" (moved back to end at the edge)


@dataclass
class Fuse:
    outer: IterVar
    inner: IterVar
    fused: IterVar


@dataclass
class Prefetch:
    """A software prefetch (`Stage.prefetch`): at the start of each iteration of `axis`, the cache lines of
    what the stage reads of `tensor` in that iteration, moved by `offset` along the tensor's dimension `dim`
    (clamped to the tensor); with `spread` (a loop enclosing `axis`, of this stage or of one it is computed at),
    its iterations share the lines: iteration z takes lines z, z + n, ... of n = the spread loop's extent."""

    tensor: Stage
    axis: IterVar
    dim: int
    offset: int
    spread: tuple[Stage, IterVar] | None = None


@dataclass
class IterAttr:
    kind: ForKind = ForKind.SERIAL
    thread_tag: str | None = None
    pragmas: list[tuple[str, Any]] = field(default_factory=list)


class Stage:
    """The schedule of one operation: its loops (leaf axes), how they derive from the root axes,
    their annotations, and where the stage is computed (root, inline, or at a consumer's loop)."""

    def __init__(self, sch: Schedule, op: Operation, name: str):
        self.sch = sch
        self.name = name
        self.op = op
        self.is_output = False
        self.scope = "global"
        self.relations: list[Split | Fuse] = []
        self.iter_attrs: dict[IterVar, IterAttr] = {}
        self.attach: str = "root"  # "root" | "inline" | "at"
        self.attach_stage: Stage | None = None
        self.attach_axis: IterVar | None = None
        self.double_buffered = False  # two copies of the buffer: the next iteration's filled during this one
        self.row_align = 1  # the buffer's last dimension allocated in multiples of this (`storage_align`)
        self.prefetches: list[Prefetch] = []  # software prefetches issued in its loops (`prefetch`)
        self.leaf_iter_vars: list[IterVar] = self.root_iter_vars

    @property
    def is_placeholder(self) -> bool:
        return isinstance(self.op, PlaceholderOp)

    @property
    def root_iter_vars(self) -> list[IterVar]:
        if isinstance(self.op, ComputeOp):
            return list(self.op.axis) + list(self.op.reduce_axis)
        return []

    @property
    def all_iter_vars(self) -> list[IterVar]:
        out = list(self.root_iter_vars)
        for r in self.relations:
            out += [r.outer, r.inner] if isinstance(r, Split) else [r.fused]
        return out

    def __repr__(self) -> str:
        where = {"root": "root", "inline": "inline"}.get(self.attach)
        if where is None:
            where = f"at {self.attach_stage.name}.{self.attach_axis.name}"  # type: ignore[union-attr]
        return f"Stage({self.name}, loops=[{', '.join(iv.name for iv in self.leaf_iter_vars)}], {where})"

    # -- public primitives: each records a Step ---------------------------------------------
    def split(self, parent: IterVar | str, factor: int | None = None, nparts: int | None = None,
              tail: str = "guard"):  # fmt: skip
        """Split a loop into (outer, inner) with inner extent `factor`, or outer extent `nparts`. Where the factor
        does not divide the extent, the last tile is guarded (`tail="guard"`: bounds checks, partitioned off by
        the loop passes) or, as Halide's ShiftInwards, shifted back to end at the extent (`tail="shift"`: it
        recomputes a few elements of the tile before, and every tile is whole, so it vectorizes; only for a
        stage whose reduction loops, if any, run inside the split)."""
        args = (_name(parent), factor, nparts) + ((tail,) if tail != "guard" else ())
        return self.sch._apply(Step("split", self.name, args))

    def tile(self, x: IterVar | str, y: IterVar | str, x_factor: int, y_factor: int):
        """Split x and y and order the loops as (x.outer, y.outer, x.inner, y.inner)."""
        xo, xi = self.split(x, x_factor)
        yo, yi = self.split(y, y_factor)
        self.reorder(xo, yo, xi, yi)
        return xo, yo, xi, yi

    def fuse(self, *axes: IterVar | str) -> IterVar:
        """Fuse adjacent loops (outer first) into one."""
        if len(axes) < 2:
            if len(axes) == 1:
                return self._leaf(_name(axes[0]))
            raise ScheduleError(f"stage '{self.name}': fuse needs at least one axis")
        fused = axes[0]
        for ax in axes[1:]:
            fused = self.sch._apply(Step("fuse", self.name, (_name(fused), _name(ax))))
        return fused  # type: ignore[return-value]

    def reorder(self, *axes: IterVar | str) -> None:
        """Put the given loops in this relative order (other loops keep their places)."""
        self.sch._apply(Step("reorder", self.name, tuple(_name(a) for a in axes)))

    def vectorize(self, axis: IterVar | str) -> None:
        self.sch._apply(Step("vectorize", self.name, (_name(axis),)))

    def unroll(self, axis: IterVar | str) -> None:
        self.sch._apply(Step("unroll", self.name, (_name(axis),)))

    def parallel(self, axis: IterVar | str) -> None:
        self.sch._apply(Step("parallel", self.name, (_name(axis),)))

    def bind(self, axis: IterVar | str, thread: str) -> None:
        """Bind a loop to a GPU thread axis ("blockIdx.x", "threadIdx.x", ...)."""
        self.sch._apply(Step("bind", self.name, (_name(axis), thread)))

    def pragma(self, axis: IterVar | str, key: str, value: Any = True) -> None:
        self.sch._apply(Step("pragma", self.name, (_name(axis), key, value)))

    def tensorize(self, axis: IterVar | str, intrin: str) -> None:
        """Replace the loop nest under `axis` by one call to intrinsic `intrin` (`ember.te.intrin`), matched
        after lowering; the loops inside must be exactly the intrinsic's."""
        self.sch._apply(Step("tensorize", self.name, (_name(axis), intrin)))

    def compute_at(self, parent: Stage | Tensor | str, axis: IterVar | str) -> None:
        """Compute this stage inside loop `axis` of consumer stage `parent`, only the part it needs."""
        self.sch._apply(Step("compute_at", self.name, (self.sch[parent].name, _name(axis))))

    def compute_inline(self) -> None:
        """Substitute this stage's expression into its consumers."""
        self.sch._apply(Step("compute_inline", self.name))

    def compute_root(self) -> None:
        self.sch._apply(Step("compute_root", self.name))

    def set_scope(self, scope: str) -> None:
        """Where the stage's buffer lives when it is computed inside a loop: "global", "local" (per thread)
        or "shared" (per GPU block: filled cooperatively by the threads that bind its loops)."""
        self.sch._apply(Step("set_scope", self.name, (scope,)))

    def double_buffer(self) -> None:
        """Keep two copies of this stage's buffer (it must be computed at a loop of a consumer): before the loop,
        the first iteration's part is filled; in each iteration, the next iteration's part is filled into the
        other copy before this iteration computes from its own (prefetch while computing)."""
        self.sch._apply(Step("double_buffer", self.name))

    def prefetch(self, tensor: Tensor | Stage | str, axis: IterVar | str, dim: int = 0, offset: int = 1,
                 spread: tuple[Stage | Tensor | str, IterVar | str] | None = None) -> None:  # fmt: skip
        """Prefetch (into the L2 cache, on CPUs) what a later iteration will read of `tensor`: at the start of each
        iteration of loop `axis`, the cache lines of the elements this stage reads of `tensor` in that iteration,
        moved by `offset` along the tensor's dimension `dim` (the next panel of a packed matrix while this one is
        computed). `spread=(stage, loop)`: a loop enclosing `axis` whose iterations divide those lines among
        themselves (iteration z prefetches lines z, z + n, ...), one or a few per iteration instead of all in
        each. Computes nothing: every schedule with prefetches computes what it computes without them; targets
        without prefetch instructions (GPUs) drop them."""
        where = (self.sch[spread[0]].name, _name(spread[1])) if spread is not None else None
        self.sch._apply(Step("prefetch", self.name, (self.sch[tensor].name, _name(axis), int(dim), int(offset), where)))

    def storage_align(self, factor: int) -> None:
        """Allocate this stage's buffer with its last dimension rounded up to a multiple of `factor` elements
        (it must be computed at a loop of a consumer): its rows then start `factor`-aligned apart, and a tensorized
        call may compute a whole row of tiles where the stage needs fewer columns (an AMX tile of 32 columns where a
        tile of two padded image rows needs 30)."""
        self.sch._apply(Step("storage_align", self.name, (int(factor),)))

    # -- helpers ---------------------------------------------------------------------------
    def _err(self, msg: str) -> ScheduleError:
        return ScheduleError(f"stage '{self.name}': {msg}")

    def _leaf(self, name: str, what: str = "") -> IterVar:
        if self.is_placeholder:
            raise self._err("placeholders have no loops to schedule")
        for iv in self.leaf_iter_vars:
            if iv.name == name:
                return iv
        loops = ", ".join(iv.name for iv in self.leaf_iter_vars)
        hint = ""
        for r in self.relations:
            if isinstance(r, Split) and r.parent.name == name:
                hint = f"; '{name}' was split into '{r.outer.name}' and '{r.inner.name}'"
            elif isinstance(r, Fuse) and name in (r.outer.name, r.inner.name):
                hint = f"; '{name}' was fused into '{r.fused.name}'"
        return_what = f" for {what}" if what else ""
        raise self._err(f"no loop '{name}'{return_what} among its loops [{loops}]{hint}")

    def _fresh_name(self, name: str) -> str:
        taken = {iv.name for iv in self.all_iter_vars}
        out, n = name, 1
        while out in taken:
            out, n = f"{name}_{n}", n + 1
        return out

    def _attr(self, iv: IterVar) -> IterAttr:
        return self.iter_attrs.setdefault(iv, IterAttr())

    def _annotate(self, name: str, kind: ForKind, what: str) -> None:
        iv = self._leaf(name, what)
        if iv.kind == "reduce" and kind in (ForKind.VECTORIZED, ForKind.PARALLEL, ForKind.THREAD_BINDING):
            raise self._err(f"cannot {what} reduction loop '{name}': iterations would race on the same output")
        attr = self._attr(iv)
        if attr.kind not in (ForKind.SERIAL, kind):
            raise self._err(f"loop '{name}' is already marked {attr.kind.value}, cannot also {what} it")
        attr.kind = kind

    def _producers(self) -> set[Stage]:
        """Every stage this stage reads, transitively."""
        out: set[Stage] = set()
        todo = [self]
        while todo:
            st = todo.pop()
            for t in st.op.inputs:
                p = self.sch[t]
                if p not in out:
                    out.add(p)
                    todo.append(p)
        return out


def _encloses(outer: Stage, st: Stage) -> bool:
    """Whether `st` is computed (directly or through other stages) at a loop of `outer`."""
    while st.attach == "at" and st.attach_stage is not None:
        st = st.attach_stage
        if st is outer:
            return True
    return False


def _name(x: IterVar | str) -> str:
    if isinstance(x, IterVar):
        return x.name
    if isinstance(x, str):
        return x
    raise TypeError(f"expected a loop axis (IterVar) or its name, got {x!r}")


class Schedule:
    """Stages of all operations reachable from `outputs`, in topological order (producers first)."""

    def __init__(self, outputs: Sequence[Tensor]):
        self.outputs = list(outputs)
        self.stages: list[Stage] = []
        self._by_op: dict[int, Stage] = {}
        self.steps: list[Step] = []
        names: set[str] = set()
        for op in topo_ops([t.op for t in self.outputs]):
            name, n = op.name, 1
            while name in names:
                name, n = f"{op.name}_{n}", n + 1
            names.add(name)
            st = Stage(self, op, name)
            self.stages.append(st)
            self._by_op[id(op)] = st
        for t in self.outputs:
            st = self[t]
            if st.is_placeholder:
                raise ScheduleError(f"output '{t.name}' is a placeholder; outputs must be computed tensors")
            st.is_output = True

    def __getitem__(self, key: Tensor | Operation | Stage | str) -> Stage:
        if isinstance(key, Stage):
            return key
        if isinstance(key, str):
            for st in self.stages:
                if st.name == key:
                    return st
            raise ScheduleError(f"no stage named '{key}'; stages: {', '.join(s.name for s in self.stages)}")
        op = key.op if isinstance(key, Tensor) else key
        st = self._by_op.get(id(op))
        if st is None:
            raise ScheduleError(f"tensor '{op.name}' is not part of this schedule")
        return st

    def __str__(self) -> str:
        lines = [repr(st) for st in self.stages]
        if self.steps:
            lines += ["steps:"] + [f"  {s}" for s in self.steps]
        return "\n".join(lines)

    # -- schedule-level primitives -----------------------------------------------------------
    def cache_read(self, tensor: Tensor, scope: str, readers: Iterable[Tensor | Stage | str] | Tensor) -> Tensor:
        """A copy of `tensor` in `scope` that `readers` read instead of it."""
        readers = [readers] if isinstance(readers, Tensor | Stage | str) else list(readers)
        names = tuple(self[r].name for r in readers)
        st = self._apply(Step("cache_read", self[tensor].name, (scope, names)))
        return st.op.output()

    def cache_write(self, tensor: Tensor, scope: str) -> Tensor:
        """Compute `tensor` into a buffer in `scope`, then copy it out; returns the cache tensor."""
        st = self._apply(Step("cache_write", self[tensor].name, (scope,)))
        return st.op.output()

    def rfactor(self, tensor: Tensor, axis: IterVar | str, factor: int) -> Tensor:
        """Split reduction `axis` of `tensor` by `factor` and make the inner part data-parallel: a new stage
        `<name>.rf` reduces the outer part into `factor` partial results per output element (its last axis,
        which can be vectorized or bound to threads), and `tensor` reduces those. Returns the partial tensor."""
        st = self._apply(Step("rfactor", self[tensor].name, (_name(axis), factor)))
        return st.op.output()

    def separate(self, tensor: Tensor, axes: IterVar | str | Sequence[IterVar | str]) -> Tensor:
        """Split a window reduction in two: a new stage `<name>.sep` reduces over `axes` only (a pooling window's
        columns), once for every input position of the other taps (every input row), and `tensor` reduces the
        other taps over those partial results. Each partial result then serves every window that covers it: a 3x3
        sum at stride 1 costs 3 + 3 additions per output instead of 9, and at stride 2 the outer reduction reads
        whole vectors. The body must read one tensor at one index (under elementwise functions: a cast, a power),
        and each index that uses another tap must be affine in those taps and in one output axis that nothing
        else reads. Returns the partial tensor."""
        names = tuple(_name(a) for a in (axes if isinstance(axes, list | tuple) else [axes]))
        st = self._apply(Step("separate", self[tensor].name, (names,)))
        return st.op.output()

    # -- steps -------------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps([s.to_json() for s in self.steps])

    def replay(self, steps: Iterable[Step | dict]) -> Schedule:
        for s in steps:
            self._apply(s if isinstance(s, Step) else Step.from_json(s))
        return self

    def record(self) -> dict:
        """The schedule as data for a log: the stages of its compute before any step, and its steps."""
        return {"stages": [st.name for st in Schedule(self.outputs).stages], "steps": [s.to_json() for s in self.steps]}

    @classmethod
    def from_record(cls, outputs: Sequence[Tensor] | Tensor, record: dict) -> Schedule:
        """A fresh schedule of `outputs` with a `record()`'s steps replayed; `ScheduleError` unless the compute
        has exactly the record's stages (the steps were made for another compute)."""
        sch = cls([outputs] if isinstance(outputs, Tensor) else list(outputs))
        names = [st.name for st in sch.stages]
        if names != list(record.get("stages", ())):
            raise ScheduleError(f"the record's steps are for stages {record.get('stages')}, this compute has {names}")
        return sch.replay(record.get("steps", ()))

    @classmethod
    def load(cls, outputs: Sequence[Tensor] | Tensor, data: str | list) -> Schedule:
        """A fresh schedule of `outputs` with the steps of `data` (JSON text or a list) replayed."""
        outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
        steps = json.loads(data) if isinstance(data, str) else data
        return cls(outputs).replay(steps)

    def _apply(self, step: Step) -> Any:
        fn = getattr(self, f"_do_{step.kind}", None)
        if fn is None:
            raise ScheduleError(f"unknown schedule step '{step.kind}'")
        stage = self[step.stage]
        if step.kind not in ("cache_read",) and stage.is_placeholder:
            raise ScheduleError(f"stage '{stage.name}' is a placeholder (an input); it has no loops to schedule")
        out = fn(stage, *step.args)
        self.steps.append(step)
        return out

    # -- implementations (arguments by name) ---------------------------------------------------
    def _do_split(self, st: Stage, name: str, factor: int | None, nparts: int | None, tail: str = "guard"):
        parent = st._leaf(name, "split")
        if (factor is None) == (nparts is None):
            raise st._err(f"split of '{name}' needs exactly one of factor= or nparts=")
        if tail not in ("guard", "shift") or (tail == "shift" and factor is None):
            raise st._err(f"split of '{name}': tail must be 'guard' or 'shift' (with factor=), got {tail!r}")
        n = factor if factor is not None else nparts
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise st._err(f"split of '{name}': factor/nparts must be a positive integer, got {n!r}")
        outer = IterVar(st._fresh_name(f"{name}.outer"), None, parent.kind)
        inner = IterVar(st._fresh_name(f"{name}.inner"), None, parent.kind)
        st.relations.append(Split(parent, outer, inner, factor, nparts, tail))
        i = st.leaf_iter_vars.index(parent)
        st.leaf_iter_vars[i : i + 1] = [outer, inner]
        attr = st.iter_attrs.pop(parent, None)
        if attr is not None and attr.kind is not ForKind.SERIAL:
            st.iter_attrs[outer] = attr  # keep e.g. `parallel` on the outer part
        return outer, inner

    def _do_fuse(self, st: Stage, outer_name: str, inner_name: str) -> IterVar:
        a, b = st._leaf(outer_name, "fuse"), st._leaf(inner_name, "fuse")
        ia, ib = st.leaf_iter_vars.index(a), st.leaf_iter_vars.index(b)
        if ib != ia + 1:
            raise st._err(
                f"can only fuse adjacent loops, outer first; '{outer_name}' is loop {ia} "
                f"and '{inner_name}' is loop {ib} of [{', '.join(iv.name for iv in st.leaf_iter_vars)}]"
            )
        if a.kind != b.kind:
            raise st._err(f"cannot fuse reduction and data-parallel loops ('{outer_name}', '{inner_name}')")
        fused = IterVar(st._fresh_name(f"{outer_name}.{inner_name}.fused"), None, a.kind)
        st.relations.append(Fuse(a, b, fused))
        st.leaf_iter_vars[ia : ib + 1] = [fused]
        return fused

    def _do_reorder(self, st: Stage, *names: str) -> None:
        ivs = [st._leaf(n, "reorder") for n in names]
        if len({id(iv) for iv in ivs}) != len(ivs):
            raise st._err(f"reorder lists a loop twice: {list(names)}")
        pos = sorted(st.leaf_iter_vars.index(iv) for iv in ivs)
        for p, iv in zip(pos, ivs):
            st.leaf_iter_vars[p] = iv

    def _do_vectorize(self, st: Stage, name: str) -> None:
        st._annotate(name, ForKind.VECTORIZED, "vectorize")

    def _do_unroll(self, st: Stage, name: str) -> None:
        st._annotate(name, ForKind.UNROLLED, "unroll")

    def _do_parallel(self, st: Stage, name: str) -> None:
        st._annotate(name, ForKind.PARALLEL, "parallel")

    def _do_bind(self, st: Stage, name: str, tag: str) -> None:
        if tag not in THREAD_TAGS:
            raise st._err(f"bind of '{name}': unknown thread axis {tag!r}; use one of {', '.join(THREAD_TAGS)}")
        for iv, attr in st.iter_attrs.items():
            if attr.thread_tag == tag and iv.name != name and tag != "vthread":
                raise st._err(f"thread axis {tag} is already bound to loop '{iv.name}'")
        st._annotate(name, ForKind.THREAD_BINDING, "bind")
        st._attr(st._leaf(name)).thread_tag = tag

    def _do_pragma(self, st: Stage, name: str, key: str, value: Any) -> None:
        st._attr(st._leaf(name, "pragma")).pragmas.append((key, value))

    def _do_tensorize(self, st: Stage, name: str, intrin: str) -> None:
        from .intrin import TENSORIZE, get_intrinsic

        try:
            get_intrinsic(intrin)
        except ValueError as e:
            raise st._err(str(e)) from None
        st._attr(st._leaf(name, "tensorize")).pragmas.append((TENSORIZE, intrin))

    def _do_compute_at(self, st: Stage, parent_name: str, axis_name: str) -> None:
        parent = self[parent_name]
        if st.is_output:
            raise st._err("an output cannot be computed at another stage; it must be computed at root")
        if parent is st:
            raise st._err("cannot compute a stage at itself")
        if parent.is_placeholder or parent.attach == "inline":
            why = "an input" if parent.is_placeholder else "inlined"
            raise st._err(f"cannot compute at '{parent.name}': it has no loops ({why})")
        axis = parent._leaf(axis_name, f"compute_at of '{st.name}'")
        if st not in parent._producers():
            raise st._err(
                f"cannot compute at '{parent.name}.{axis.name}': '{parent.name}' does not read '{st.name}', "
                "so its loops are not an ancestor of this stage's consumer"
            )
        if st.attach == "inline":
            raise st._err("stage is inlined; compute_root it first")
        st.attach, st.attach_stage, st.attach_axis = "at", parent, axis

    def _do_compute_inline(self, st: Stage) -> None:
        if st.is_output:
            raise st._err("an output cannot be inlined")
        if not isinstance(st.op, ComputeOp) or isinstance(st.op.body, Reduce):
            raise st._err("only elementwise/injective computes can be inlined, not reductions")
        for other in self.stages:
            if other.attach == "at" and other.attach_stage is st:
                raise st._err(f"cannot inline: stage '{other.name}' is computed at one of its loops")
        st.attach, st.attach_stage, st.attach_axis = "inline", None, None

    def _do_compute_root(self, st: Stage) -> None:
        st.attach, st.attach_stage, st.attach_axis = "root", None, None

    def _do_double_buffer(self, st: Stage) -> None:
        if st.is_output:
            raise st._err("an output cannot be double-buffered: it is computed at root")
        st.double_buffered = True

    def _do_prefetch(self, st: Stage, tensor: str, axis: str, dim: int, offset: int, spread=None) -> None:
        src = self[tensor]
        if not any(self[t] is src for t in st.op.inputs):
            raise st._err(f"prefetch of '{tensor}': this stage does not read it")
        if not 0 <= dim < len(src.op.shape):
            raise st._err(f"prefetch of '{tensor}': dim {dim} out of range for its {len(src.op.shape)} dimensions")
        iv = st._leaf(axis, "prefetch")
        where = None
        if spread is not None:
            sp = self[spread[0]]
            ivs = [v for v in sp.all_iter_vars if v.name == spread[1]]
            if not ivs:
                raise sp._err(f"prefetch spread: no loop '{spread[1]}'")
            if sp is not st and not _encloses(sp, st):
                raise st._err(f"prefetch spread: '{sp.name}' is not a stage this one is computed in")
            where = (sp, ivs[0])
        st.prefetches.append(Prefetch(src, iv, dim, offset, where))

    def _do_storage_align(self, st: Stage, factor: int) -> None:
        if st.is_output or st.is_placeholder:
            raise st._err("storage_align applies to a stage computed inside a loop, not an input or output")
        if factor < 1:
            raise st._err(f"storage_align factor must be positive, got {factor}")
        st.row_align = factor

    def _do_set_scope(self, st: Stage, scope: str) -> None:
        if scope not in SCOPES:
            raise st._err(f"unknown scope {scope!r}; use one of {', '.join(SCOPES)}")
        st.scope = scope

    def _do_cache_read(self, st: Stage, scope: str, reader_names: tuple[str, ...]) -> Stage:
        tensor = st.op.output()
        readers = [self[n] for n in reader_names]
        if not readers:
            raise st._err("cache_read needs at least one reader")
        for r in readers:
            if r.is_placeholder or not any(self[t] is st for t in r.op.inputs):
                raise st._err(f"cache_read: stage '{r.name}' does not read '{st.name}'")
        axis = [IterVar(f"ax{d}", (0, n), "data") for d, n in enumerate(tensor.shape)]
        cache_op = ComputeOp(f"{st.name}.{scope}", axis, tensor[tuple(iv.var for iv in axis)])
        cache = self._add_stage(cache_op, after=st)
        cache.scope = scope
        for r in readers:
            r.op = _replace_inputs(r.op, st, cache.op.output(), self)
            self._by_op[id(r.op)] = r
        return cache

    def _do_cache_write(self, st: Stage, scope: str) -> Stage:
        op = st.op
        if not isinstance(op, ComputeOp):
            raise st._err("cache_write needs a computed tensor")
        self._unscheduled(st, "cache_write")
        if st.attach == "inline":
            raise st._err("cannot cache_write an inlined stage")
        cache_op = ComputeOp(f"{st.name}.{scope}", op.axis, op.body, op.tag, op.attrs)
        cache = self._add_before(cache_op, st)
        cache.scope = scope
        axis = [IterVar(iv.name, iv.dom, "data") for iv in op.axis]
        new_op = ComputeOp(op.name, axis, cache_op.output()[tuple(iv.var for iv in axis)], op.tag, op.attrs)
        self._replace_op(st, new_op)
        return cache

    def _do_rfactor(self, st: Stage, axis_name: str, factor: int) -> Stage:
        op = st.op
        if not isinstance(op, ComputeOp) or not isinstance(op.body, Reduce):
            raise st._err("rfactor needs a reduction")
        self._unscheduled(st, "rfactor")
        k = next((iv for iv in op.reduce_axis if iv.name == axis_name), None)
        if k is None:
            names = ", ".join(iv.name for iv in op.reduce_axis)
            raise st._err(f"rfactor: no reduction axis '{axis_name}' among [{names}]")
        if not isinstance(factor, int) or isinstance(factor, bool) or factor < 1:
            raise st._err(f"rfactor of '{axis_name}': factor must be a positive integer, got {factor!r}")
        body = op.body
        lo, n = k.dom  # type: ignore[misc]
        kr = IterVar(f"{axis_name}.r", (0, factor), "data")
        ko = IterVar(f"{axis_name}.o", (0, -(-n // factor)), "reduce")
        flat = ko.var * factor + kr.var
        sub = {k.var: flat + lo}
        cond = substitute(body.condition, sub)
        if (-(-n // factor)) * factor != n:
            cond = (flat < n) & cond if not (isinstance(cond, Const) and cond.value) else flat < n
        axes = [ko if iv is k else iv for iv in body.axis]
        rf_axis = [IterVar(iv.name, iv.dom, "data") for iv in op.axis] + [kr]
        rf_sub = {**sub, **{a.var: b.var for a, b in zip(op.axis, rf_axis)}}
        rf_body = Reduce(body.reducer, substitute(body.source, rf_sub), tuple(axes), substitute(cond, rf_sub))
        rf_op = ComputeOp(f"{st.name}.rf", rf_axis, rf_body, op.tag, {})
        rf = self._add_before(rf_op, st)
        kk = IterVar(f"{axis_name}.v", (0, factor), "reduce")
        axis = [IterVar(iv.name, iv.dom, "data") for iv in op.axis]
        red = Reduce(body.reducer, rf_op.output()[tuple(iv.var for iv in axis) + (kk.var,)], (kk,), const(True))
        new_op = ComputeOp(op.name, axis, red, op.tag, op.attrs)
        self._replace_op(st, new_op)
        return rf

    def _do_separate(self, st: Stage, names: tuple[str, ...]) -> Stage:
        op = st.op
        if not isinstance(op, ComputeOp) or not isinstance(op.body, Reduce):
            raise st._err("separate needs a reduction")
        self._unscheduled(st, "separate")
        body = op.body
        known = [iv.name for iv in op.reduce_axis]
        if not names or any(n not in known for n in names):
            raise st._err(f"separate: axes {list(names)} must be some of the reduction axes [{', '.join(known)}]")
        inner = [iv for iv in op.reduce_axis if iv.name in names]
        outer = [iv for iv in op.reduce_axis if iv.name not in names]
        if not outer:
            raise st._err("separate: leave at least one reduction axis to the outer reduction")
        if not (isinstance(body.condition, Const) and body.condition.value):
            raise st._err("separate: the reduction has a condition (`where`); its taps are not independent")
        loads = [n for n in walk(body.source) if isinstance(n, TensorLoad)]
        if not loads or any(n.tensor.op is not loads[0].tensor.op or not same(n.indices, loads[0].indices)
                            for n in loads):  # fmt: skip
            raise st._err("separate: the reduction must read one tensor at one index")
        load = loads[0]
        data = {iv.var: iv for iv in op.axis}
        outer_vars, inner_vars = {iv.var for iv in outer}, {iv.var for iv in inner}
        doms = {iv.var: iv.dom for iv in [*op.axis, *op.reduce_axis]}
        merged: dict[Var, tuple[int, int, int]] = {}  # output axis -> (index position, lowest, highest index)
        index_vars = [{v for v in walk(idx) if isinstance(v, Var)} for idx in load.indices]
        for j, (idx, used) in enumerate(zip(load.indices, index_vars)):
            if not used & outer_vars:
                continue
            if used & inner_vars:
                raise st._err(f"separate: index {j} ({idx}) mixes the separated taps with the others")
            terms, c = Analyzer().lin(idx)
            axes_in = [v for v in terms if v in data]
            if any(not isinstance(v, Var) or v not in doms for v in terms) or len(axes_in) != 1:
                raise st._err(f"separate: index {j} ({idx}) is not one output axis plus taps (affine)")
            lo = hi = c
            for v, k in terms.items():
                a, n = doms[v]  # type: ignore[misc]
                lo, hi = lo + min(k * a, k * (a + n - 1)), hi + max(k * a, k * (a + n - 1))
            merged[axes_in[0]] = (j, lo, hi)
        if not merged:
            raise st._err("separate: no index reads the other taps; nothing to share")
        outside = transform(body.source, lambda n: const(0, n.dtype) if isinstance(n, TensorLoad) else None)
        for v in merged:
            if sum(v in used for used in index_vars) > 1 or any(u is v for u in walk(outside)):
                raise st._err(f"separate: output axis '{data[v].name}' is read by more than one index")
        # the partial stage: the merged output axes become the input positions they read
        sep_axis = [IterVar(iv.name, (0, merged[iv.var][2] - merged[iv.var][1] + 1) if iv.var in merged else iv.dom,
                            "data") for iv in op.axis]  # fmt: skip
        to_sep = {a.var: b.var for a, b in zip(op.axis, sep_axis) if a.var not in merged}
        at = {merged[a.var][0]: b.var + merged[a.var][1] for a, b in zip(op.axis, sep_axis) if a.var in merged}
        new_idx = tuple(at[j] if j in at else substitute(i, to_sep) for j, i in enumerate(load.indices))
        src = transform(body.source, lambda n: TensorLoad(n.tensor, new_idx) if isinstance(n, TensorLoad) else None)
        sep_op = ComputeOp(f"{st.name}.sep", sep_axis, Reduce(body.reducer, substitute(src, to_sep), tuple(inner),
                                                              const(True)), op.tag, {})  # fmt: skip
        sep = self._add_before(sep_op, st)
        # the outer reduction: over the other taps, of the partial results at the positions they read
        axis = [IterVar(iv.name, iv.dom, "data") for iv in op.axis]
        sub = {a.var: b.var for a, b in zip(op.axis, axis)}
        read = tuple(substitute(load.indices[merged[a.var][0]] - merged[a.var][1], sub) if a.var in merged else b.var
                     for a, b in zip(op.axis, axis))  # fmt: skip
        new_op = ComputeOp(op.name, axis, Reduce(body.reducer, sep_op.output()[read], tuple(outer), const(True)),
                           op.tag, op.attrs)  # fmt: skip
        self._replace_op(st, new_op)
        return sep

    @staticmethod
    def _unscheduled(st: Stage, what: str) -> None:
        """For primitives that replace a stage's loops: none may have been split, fused or annotated yet."""
        if st.relations or any(a.kind is not ForKind.SERIAL or a.pragmas for a in st.iter_attrs.values()):
            raise st._err(f"{what} must come before other primitives on this stage (it replaces its loops)")

    def _add_before(self, op: ComputeOp, st: Stage) -> Stage:
        """A new stage for `op`, right before st in the stage order (st's producer of it)."""
        idx = self.stages.index(st)
        return self._add_stage(op, after=self.stages[idx - 1] if idx else None)

    def _replace_op(self, st: Stage, new_op: ComputeOp) -> None:
        """st computes `new_op` from now on, with fresh loops; readers keep reading the old op's tensor, which maps
        to this stage too."""
        st.op = new_op
        st.leaf_iter_vars = st.root_iter_vars
        st.iter_attrs = {}
        self._by_op[id(new_op)] = st

    def _add_stage(self, op: ComputeOp, after: Stage | None) -> Stage:
        if any(s.name == op.name for s in self.stages):
            raise ScheduleError(f"a stage named '{op.name}' already exists; cache the tensor once per scope")
        st = Stage(self, op, op.name)
        self.stages.insert(0 if after is None else self.stages.index(after) + 1, st)
        self._by_op[id(op)] = st
        return st


def _replace_inputs(op: Operation, old: Stage, new: Tensor, sch: Schedule) -> ComputeOp:
    """A copy of compute op `op` reading `new` wherever it read the tensor of stage `old`."""
    assert isinstance(op, ComputeOp)

    def post(n):
        if isinstance(n, TensorLoad) and sch[n.tensor] is old:
            return TensorLoad(new, n.indices)
        return None

    body = transform(op.body, post)
    out = ComputeOp(op.name, op.axis, body, op.tag, op.attrs)
    out.reduce_axis = list(op.reduce_axis)
    return out


def topo_ops(roots: list[Operation]) -> list[Operation]:
    order: list[Operation] = []
    seen: set[int] = set()

    def visit(op: Operation) -> None:
        stack: list[tuple[Operation, bool]] = [(op, False)]
        while stack:
            o, done = stack.pop()
            if done:
                order.append(o)
                continue
            if id(o) in seen:
                continue
            seen.add(id(o))
            stack.append((o, True))
            for t in reversed(o.inputs):
                if id(t.op) not in seen:
                    stack.append((t.op, False))

    for r in roots:
        visit(r)
    return order


def create_schedule(outputs: Tensor | Sequence[Tensor]) -> Schedule:
    """A default schedule (every stage at root, loops in axis order) for the given output tensors."""
    outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    for o in outs:
        if not isinstance(o, Tensor):
            raise TypeError(f"create_schedule expects tensors, got {o!r}")
    return Schedule(outs)


def reads(op: Operation) -> list[TensorLoad]:
    """All tensor reads in an operation's body."""
    if not isinstance(op, ComputeOp):
        return []
    return [n for n in walk(op.body) if isinstance(n, TensorLoad)]
