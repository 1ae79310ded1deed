"""GPU lowering shared by the CUDA and OpenCL targets: from a lowered function to kernels plus a host plan.

`split_host_device(func)` cuts the function's body (after the loop passes) into kernels:

- every top-level statement (one root stage's loop nest, with the stages computed inside it) is one kernel;
  a root-level Allocate is a global temporary that the host allocates on the device and passes to the
  kernels that use it;
- a loop bound to a thread axis (`s[C].bind(xo, "blockIdx.x")`) is no loop on the device: its variable is the
  thread's index (`Call("gpu.blockIdx.x")` in the IR, `get_group_id(0)` / `blockIdx.x` in the source). The
  launch size of an axis is the largest extent bound to it; a loop bound to it with a smaller extent (e.g. a
  cooperative load of a 16x8 shared tile by 16x16 threads) runs under `if (threadIdx < extent)`;
- loops that are not bound run serially inside each thread. A kernel with no bound loop at all would run its
  whole loop nest on a single thread: that is refused with an error naming the stage's loop, unless
  `allow_serial=True` (then it is launched as one block of one thread);
- "shared" allocations are per block: they are hoisted to the top of the kernel; other allocations inside a
  kernel (caches in "local" scope, stages computed at a thread's loop) are per-thread private arrays;
- barriers (`Evaluate(Call("gpu.barrier"))`) go between two statements of a sequence where the second one
  reads or writes a shared buffer that the first wrote (or writes one it read), and at the end of a loop
  body that writes and reads the same shared buffer (the next iteration overwrites what this one read).
  A barrier must be reached by every thread of the block, so a barrier under a thread-dependent guard is
  refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..tir.dtype import boolean, int32
from ..tir.expr import BinOp, Call, Cast, Const, Expr, Load, Var, const
from ..tir.functor import transform, walk
from ..tir.stmt import Allocate, Buffer, Evaluate, For, ForKind, IfThenElse, LetStmt, PrimFunc, Seq, Stmt, Store, seq
from ..tir.transform import PIPELINE, optimize
from .c import CodegenError

AXES = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")
BARRIER = Evaluate(Call("gpu.barrier", (), int32))


@dataclass
class Kernel:
    name: str
    params: list[Buffer]  # global buffers it reads or writes, function parameters first, then temporaries
    grid: tuple[int, int, int]  # blocks per axis (x, y, z)
    block: tuple[int, int, int]  # threads per block per axis
    body: Stmt

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


@dataclass
class DeviceProgram:
    """The host side of a GPU function: device temporaries and the kernels to launch, in order."""

    name: str
    params: tuple[Buffer, ...]
    temps: list[Buffer] = field(default_factory=list)
    kernels: list[Kernel] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"device program {self.name}({', '.join(p.name for p in self.params)})"]
        for t in self.temps:
            lines.append(f"  temporary {t.name}: {t.dtype}[{', '.join(map(str, t.shape))}]")
        for k in self.kernels:
            args = ", ".join(p.name for p in k.params)
            lines.append(f"  launch {k.name}<<<grid={k.grid}, block={k.block}>>>({args})")
        return "\n".join(lines)


def _devectorize(func: PrimFunc) -> PrimFunc:
    """GPU threads are the vector lanes: vectorized loops become unrolled scalar loops."""

    def post(n):
        if isinstance(n, For) and n.kind is ForKind.VECTORIZED:
            return For(n.var, n.min, n.extent, ForKind.UNROLLED, n.body, None, n.annotations)
        return None

    return func.with_body(transform(func.body, post))  # type: ignore[arg-type]


GPU_PIPELINE = [("devectorize", _devectorize)] + [p for p in PIPELINE if p[0] != "vectorize"]


def optimize_for_gpu(func: PrimFunc) -> PrimFunc:
    return optimize(func, GPU_PIPELINE)


def thread_index(tag: str) -> Expr:
    return Call(f"gpu.{tag}", (), int32)


def _flatten_root(body: Stmt, temps: list[Buffer]) -> list[Stmt]:
    """Top-level statements, with root allocations taken out as device temporaries."""
    if isinstance(body, Allocate):
        temps.append(body.buffer)
        return _flatten_root(body.body, temps)
    if isinstance(body, Seq):
        return [x for s in body.stmts for x in _flatten_root(s, temps)]
    return [body]


def _launch_extents(stmt: Stmt) -> dict[str, int]:
    ext: dict[str, int] = {}
    for n in walk(stmt):
        if isinstance(n, For) and n.kind is ForKind.THREAD_BINDING and n.thread_tag in AXES:
            if not isinstance(n.extent, Const):
                raise CodegenError(f"loop '{n.var.name}' bound to {n.thread_tag} has a non-constant extent {n.extent}")
            ext[n.thread_tag] = max(ext.get(n.thread_tag, 1), int(n.extent.value))  # type: ignore[arg-type]
    return ext


def _bind_threads(stmt: Stmt, dims: dict[str, int]) -> Stmt:
    """Bound loops -> the thread's index (guarded where the loop is shorter than the launch)."""

    def post(n):
        if not (isinstance(n, For) and n.kind is ForKind.THREAD_BINDING):
            return None
        if n.thread_tag not in AXES:  # vthread: a plain loop in each thread
            return For(n.var, n.min, n.extent, ForKind.SERIAL, n.body, None, n.annotations)
        idx = thread_index(n.thread_tag)
        value: Expr = idx if n.var.dtype == int32 else Cast(n.var.dtype, idx)
        if not (isinstance(n.min, Const) and n.min.value == 0):
            value = n.min + value
        body: Stmt = LetStmt(n.var, value, n.body)
        ext = int(n.extent.value)  # type: ignore[union-attr]
        if ext < dims[n.thread_tag]:
            body = IfThenElse(BinOp("lt", idx, const(ext), boolean), body)
        return body

    return transform(stmt, post)  # type: ignore[return-value]


def _hoist_shared(stmt: Stmt) -> tuple[Stmt, list[Buffer]]:
    shared: list[Buffer] = []

    def post(n):
        if isinstance(n, Allocate) and n.buffer.scope == "shared":
            if n.buffer not in shared:  # a loop split by partition_loops holds the allocation twice
                shared.append(n.buffer)
            return n.body
        return None

    body = transform(stmt, post)
    return body, shared  # type: ignore[return-value]


def _accesses(s: Stmt, shared: set[Buffer]) -> tuple[set[Buffer], set[Buffer]]:
    reads, writes = set(), set()
    for n in walk(s):
        if isinstance(n, Load) and n.buffer in shared:
            reads.add(n.buffer)
        elif isinstance(n, Store) and n.buffer in shared:
            writes.add(n.buffer)
    return reads, writes


def _insert_barriers(s: Stmt, shared: set[Buffer]) -> Stmt:
    if not shared:
        return s
    if isinstance(s, Seq):
        out: list[Stmt] = []
        written: set[Buffer] = set()
        read: set[Buffer] = set()
        flat = seq(*s.stmts)  # hoisting the allocations leaves sequences nested in sequences
        for x in flat.stmts if isinstance(flat, Seq) else (flat,):
            x = _insert_barriers(x, shared)
            r, w = _accesses(x, shared)
            if (r | w) & written or w & read:
                out.append(BARRIER)
                written, read = set(), set()
            out.append(x)
            written |= w
            read |= r
        return seq(*out)
    if isinstance(s, For):
        body = _insert_barriers(s.body, shared)
        r, w = _accesses(body, shared)
        if r & w:
            body = seq(body, BARRIER)
        return For(s.var, s.min, s.extent, s.kind, body, s.thread_tag, s.annotations)
    if isinstance(s, IfThenElse):
        then = _insert_barriers(s.then_case, shared)
        other = _insert_barriers(s.else_case, shared) if s.else_case is not None else None
        return IfThenElse(s.cond, then, other)
    if isinstance(s, LetStmt):
        return LetStmt(s.var, s.value, _insert_barriers(s.body, shared))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, _insert_barriers(s.body, shared))
    return s


def _check_barriers(s: Stmt, kernel: str) -> None:
    """Every thread must reach a barrier: none under a condition or loop that depends on the thread."""

    def thread_dependent(e: Expr, lets: dict[Var, bool]) -> bool:
        return any((isinstance(n, Call) and n.name.startswith("gpu.")) or (isinstance(n, Var) and lets.get(n, False))
                   for n in walk(e))  # fmt: skip

    def go(s: Stmt, lets: dict[Var, bool], divergent: str | None) -> None:
        if isinstance(s, Evaluate) and s is BARRIER and divergent:
            raise CodegenError(
                f"kernel {kernel}: a shared-memory barrier would sit under {divergent}, which not every thread "
                "of the block reaches; make the loops bound to threadIdx have the launch's extent"
            )
        if isinstance(s, LetStmt):
            lets = {**lets, s.var: thread_dependent(s.value, lets)}
            go(s.body, lets, divergent)
        elif isinstance(s, IfThenElse):
            d = divergent or (f"`if {s.cond}`" if thread_dependent(s.cond, lets) else None)
            go(s.then_case, lets, d)
            if s.else_case is not None:
                go(s.else_case, lets, d)
        elif isinstance(s, For):
            dep = thread_dependent(s.min, lets) or thread_dependent(s.extent, lets)
            go(s.body, lets, divergent or (f"loop '{s.var.name}'" if dep else None))
        elif isinstance(s, Seq):
            for x in s.stmts:
                go(x, lets, divergent)
        elif isinstance(s, Allocate):
            go(s.body, lets, divergent)

    go(s, {}, None)


def _first_loop(s: Stmt) -> str:
    for n in walk(s):
        if isinstance(n, For):
            return f"loop '{n.var.name}'"
        if isinstance(n, Store):
            return f"the store to '{n.buffer.name}'"
    return "a statement"


def split_host_device(func: PrimFunc, allow_serial: bool = False) -> DeviceProgram:
    """Kernels and the host's launch plan for an optimized function (see the module's doc)."""
    prog = DeviceProgram(func.name, func.params)
    stmts = _flatten_root(func.body, prog.temps)
    order = list(func.params) + prog.temps
    for k, stmt in enumerate(stmts):
        if isinstance(stmt, Evaluate) and isinstance(stmt.value, Const):
            continue
        dims = _launch_extents(stmt)
        if not dims and not allow_serial:
            written = sorted({n.buffer.name for n in walk(stmt) if isinstance(n, Store)})
            raise CodegenError(
                f"{func.name}: {_first_loop(stmt)} (writing {', '.join(written)}) is not bound to a GPU thread axis, "
                "so one thread would run it all; bind its loops, e.g. "
                "`bx, tx = s[T].split(axis, 64); s[T].bind(bx, 'blockIdx.x'); s[T].bind(tx, 'threadIdx.x')`"
            )
        body = _bind_threads(stmt, dims)
        body, shared = _hoist_shared(body)
        body = _insert_barriers(body, set(shared))
        name = f"{func.name}_kernel{k}"
        _check_barriers(body, name)
        for b in reversed(shared):
            body = Allocate(b, body)
        used = {n.buffer for n in walk(body) if isinstance(n, Load | Store)}
        params = [b for b in order if b in used]
        grid = tuple(dims.get(f"blockIdx.{a}", 1) for a in "xyz")
        block = tuple(dims.get(f"threadIdx.{a}", 1) for a in "xyz")
        prog.kernels.append(Kernel(name, params, grid, block, body))  # type: ignore[arg-type]
    return prog
