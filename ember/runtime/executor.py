"""The CPU executor: a model's segment functions called through ctypes over a table of value addresses.

Consecutive native kernels form a *segment* (`runtime.plan`): one generated function that calls them in order,
reading buffer addresses from a table of pointers, so a model without fallback steps runs as a single native
call per inference. Intermediates live in one host workspace at the plan's offsets; aliases (views such as
Reshape) share their source's storage; fallback steps write their numpy results into the same memory.

Calls from several threads at once are safe and run in parallel: each calling thread gets its own value table and
workspace (`Values`, made on its first call; weights are shared and only read), and every call returns fresh
output arrays.

A call does the same work for a symbolic model, at a size it has seen, as for a static one: what depends only on
the sizes is made once per size and kept (`Prepared`: the plan at them, the sizes argument, the outputs to allocate,
the views to point; per thread, `Values`: the table and the views over its workspace, each segment's call with
its arguments bound), found again by the tuple of input shapes (`Model._bind`). What is left per call is pointing
the table at this call's inputs and fresh outputs, and the native calls.

OpenMP keeps its thread count per calling thread: each thread that calls a model gives it the target's
`-threads` on its first call.

Ctrl-C: Python delivers KeyboardInterrupt to the main thread only between bytecodes, so a long native call would
hold it until it returns. On the main thread, a segment of at least `INTERRUPTIBLE_FLOPS` runs on the model's
`NativeCaller` (one daemon thread, so its OpenMP team stays warm between calls) while the main thread waits, and
Ctrl-C interrupts the wait at once; the abandoned call finishes in the background on its own `Values`, which the
next call does not reuse, and the next call gets a fresh caller thread.

`CompiledModel` is the C backend's model: the segment functions come from a shared library (`build_c_model`
compiles the kernels' C and the runners into one). The llvm backend's model (`runtime.llvm_model`) is a small
subclass that finds them in a JIT engine instead. Neither needs the compiler to run or to load.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..codegen.c import assemble_c, codegen_c, codegen_c_parts
from ..codegen.runners import runner_source
from ..codegen.toolchain import compile_units, compiler_for
from ..target import Target
from ..tir.dtype import numpy_dtype
from ..tir.stmt import PrimFunc
from .cross import CrossCompiledModel
from .export import ExportsC
from .model import SIZES_KEPT, Fallback, Model
from .plan import ALIGN, Plan, Step, ValueInfo, alias_view

INTERRUPTIBLE_FLOPS = 1e9  # segments this large run where Ctrl-C reaches them (a thread start is ~1% of them)


def interruptible(plan: Plan) -> dict[str, bool]:
    """Per segment function: whether it is long enough to run where Ctrl-C reaches it (a plan at sizes: at them)."""
    return {s.function: sum(k.flops for k in s.kernels) >= INTERRUPTIBLE_FLOPS
            for s in plan.steps if s.kind == "segment"}  # fmt: skip


def address(a: np.ndarray) -> int:
    """The address of a contiguous array's data: through the buffer protocol where it is writable (a third of what
    `a.ctypes.data` costs, which makes a ctypes object per call), else `a.ctypes.data`."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError):  # read-only, or empty
        return a.ctypes.data


@dataclass(eq=False)
class Prepared:
    """What every call at one set of sizes needs, made once (a symbolic model: at the first call at them; a static
    one: once): the plan at the sizes, the sizes argument of the segment functions, which segments run where Ctrl-C
    reaches them, the outputs a call allocates, and the views a call points at its inputs and outputs."""

    plan: Plan
    sizes: tuple  # () for a static plan, else (the sizes as a pointer to int64s,): the runners' last arguments
    long: dict[str, bool]  # `interruptible`
    fresh: list[tuple[int, tuple[int, ...], np.dtype]]  # (value, shape, dtype): new arrays at each call
    views: list[tuple[int, int, ValueInfo]]  # (alias, its source, its info): aliases of inputs and fresh outputs
    results: list[tuple[int, bool]]  # (value, whether a copy is returned): the graph outputs

    @staticmethod
    def make(plan: Plan, sizes: tuple[int, ...] | None = None) -> Prepared:
        """For `plan`, a static plan or a symbolic plan at `sizes` (`Plan.at`)."""
        args = () if sizes is None else (ctypes.cast((ctypes.c_int64 * max(len(sizes), 1))(*sizes), ctypes.c_void_p),)
        fresh = [(i, plan.values[i].shape, numpy_dtype(plan.values[i].dtype)) for i in plan.outputs
                 if plan.values[i].kind == "output"]  # fmt: skip
        per_call = set(plan.inputs) | {i for i, _, _ in fresh}
        views = [(i, v.alias_of, v) for i, v in enumerate(plan.values) if v.kind == "alias" and v.alias_of in per_call]
        results = [(i, plan.values[i].kind != "output") for i in plan.outputs]
        return Prepared(plan, args, interruptible(plan), fresh, views, results)


@dataclass
class Values:
    """One caller's view of a model's values at one set of sizes: the table of addresses the segment functions
    read, numpy views of the same memory (for fallback steps and outputs), the workspace the intermediates live in,
    and each segment's call over them (its function with the table and the sizes bound)."""

    table: Any  # ctypes array of void*
    views: list[np.ndarray | None]
    workspace: np.ndarray
    prepared: Prepared
    calls: dict[str, Callable[[], int]] = field(default_factory=dict)

    @staticmethod
    def make(at: Prepared, weights: Mapping[int, np.ndarray], workspace: np.ndarray) -> Values:
        """The values of `at`'s plan over `workspace` (at least its workspace and ALIGN bytes)."""
        plan = at.plan
        n = len(plan.values)
        table = (ctypes.c_void_p * max(n, 1))()
        base = workspace.ctypes.data
        pad = (-base) % ALIGN
        views: list[np.ndarray | None] = [None] * n
        for i, v in enumerate(plan.values):
            if v.kind == "temp":
                start = pad + v.offset
                views[i] = workspace[start : start + v.nbytes].view(numpy_dtype(v.dtype)).reshape(v.shape)
                table[i] = base + start
            elif v.kind == "weight":
                views[i] = weights[i]
                table[i] = weights[i].ctypes.data
        values = Values(table, views, workspace, at)
        per_call = {i for i, _, _ in at.views}
        for i, v in enumerate(plan.values):  # views of temporaries and weights: the same at every call
            if v.kind == "alias" and i not in per_call:
                values.point_alias(i, v.alias_of, v)
        return values

    def point_alias(self, i: int, src: int, v: ValueInfo) -> None:
        """Value i, a view `v` of value `src`: its numpy view and its address in the table (null stays null)."""
        self.views[i] = alias_view(self.views[src], v)
        self.table[i] = self.table[src] + v.view_offset if self.table[src] else self.table[src]


class CallerMemory:
    """One calling thread's memory: a workspace as large as the largest plan it has run needs, and the `Values` of
    the sizes it ran at last (at most SIZES_KEPT, all over that workspace: a thread runs one call at a time)."""

    def __init__(self) -> None:
        self.workspace = np.zeros(0, np.uint8)
        self.values: OrderedDict[Prepared, Values] = OrderedDict()

    def values_of(self, at: Prepared, weights: Mapping[int, np.ndarray]) -> Values:
        values = self.values.get(at)
        if values is not None:
            self.values.move_to_end(at)
            return values
        if self.workspace.size < at.plan.workspace + ALIGN:  # a larger plan: a larger workspace, the old views go
            self.workspace = np.zeros(at.plan.workspace + ALIGN, np.uint8)
            self.values.clear()
        values = self.values[at] = Values.make(at, weights, self.workspace)
        while len(self.values) > SIZES_KEPT:
            self.values.popitem(last=False)
        return values


class CompiledModel(ExportsC, Model):
    """A model on a CPU: its segment functions in a shared library (C backend), called over a value table."""

    backend = "c"

    def __init__(self, lib: Any, plan: Plan, weights: Mapping[int, np.ndarray], source: str = "",
                 fallback: Fallback | None = None, summary: dict | None = None):  # fmt: skip
        """`lib`: the path of the shared library (a subclass takes its own kind of code)."""
        super().__init__(plan, weights, fallback, summary)
        self.source = source
        self.lib_path: Path | None = None
        self._threads = plan.threads
        self._lib = self._open(lib)
        # per calling thread: .memory (its CallerMemory), .at (a symbolic model: the Prepared of its call's sizes,
        # set by `_bind`), .values (the Values of its current call, set by `_start`)
        self._local = threading.local()
        self._caller: NativeCaller | None = None  # runs the main thread's long calls
        self._segments = {}
        # symbolic sizes: the runners take the sizes after the table; a Prepared per size (`Model._bind`)
        sizes = (ctypes.c_void_p,) if self._symbolic else ()
        for s in plan.steps:
            if s.kind == "segment":
                fn = self._function(s.function, ctypes.c_void_p, *sizes)
                prof = self._function(s.function + "_profiled", ctypes.c_void_p, *sizes,
                                      ctypes.POINTER(ctypes.c_double))  # fmt: skip
                self._segments[s.function] = (fn, prof)
        self._static = None if self._symbolic else Prepared.make(plan)

    def _calls(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # each calling thread has its own Values

    def _at(self, sizes: tuple[int, ...]) -> Prepared:
        return Prepared.make(self.plan.at(sizes), sizes)

    def _bind(self, arrays: list[np.ndarray]) -> Prepared:
        at = self._local.at = super()._bind(arrays)
        return at

    def _values(self, at: Prepared) -> Values:
        """The calling thread's values at `at`'s sizes (its memory made on its first call)."""
        memory = getattr(self._local, "memory", None)
        if memory is None:
            self._set_threads()
            memory = self._local.memory = CallerMemory()
        values = memory.values_of(at, self._weights)
        if not values.calls:
            table = ctypes.cast(values.table, ctypes.c_void_p)
            values.calls = {name: partial(fn, table, *at.sizes) for name, (fn, _) in self._segments.items()}
        return values

    def _current_plan(self) -> Plan:
        """The plan of the calling thread's current call: the model's, or for symbolic sizes the plan at them."""
        values = getattr(self._local, "values", None)
        return values.prepared.plan if values is not None else self.plan

    def _set_threads(self) -> None:
        """Give the library's thread pool (and OpenMP, which keeps it per thread) the target's thread count."""
        if self._threads and hasattr(self._lib, "ember_set_num_threads"):
            self._lib.ember_set_num_threads(ctypes.c_int32(self._threads))

    # -- the code -------------------------------------------------------------------------------------------
    def _open(self, lib: Path | str) -> Any:
        """Load the shared library."""
        self.lib_path = Path(lib)
        return ctypes.CDLL(str(self.lib_path))

    def _function(self, name: str, *argtypes: Any) -> Any:
        """A segment function `int32_t name(argtypes...)` of the code."""
        fn = getattr(self._lib, name)
        fn.argtypes = list(argtypes)
        fn.restype = ctypes.c_int32
        return fn

    # -- running --------------------------------------------------------------------------------------------
    def _start(self, arrays: list[np.ndarray]) -> None:
        """Point the calling thread's table at the inputs, fresh output arrays and the views of them."""
        at = self._local.at if self._symbolic else self._static
        values = self._local.values = self._values(at)
        views, table = values.views, values.table
        for vid, x in zip(at.plan.inputs, arrays):
            views[vid] = x
            table[vid] = address(x)
        for vid, shape, dtype in at.fresh:
            a = views[vid] = np.empty(shape, dtype)
            table[vid] = address(a)
        for i, src, v in at.views:
            values.point_alias(i, src, v)

    def _execute(self, arrays: list[np.ndarray] | None, times: dict[int, float] | None = None) -> None:
        values = self._local.values
        at = values.prepared
        for s in self.plan.steps:
            if s.kind == "segment":
                call = values.calls[s.function]
                if times is not None:
                    buf = (ctypes.c_double * len(s.kernels))()
                    call = partial(self._segments[s.function][1], *call.args, buf)
                if at.long[s.function] and threading.current_thread() is threading.main_thread():
                    status = self._call_interruptibly(call, values)
                else:
                    status = call()
                if times is not None:
                    for t in buf:
                        times[len(times)] = t
                if status != 0:
                    raise MemoryError(f"model {self.plan.name}: native code failed (status {status})")
            else:
                t0 = time.perf_counter()
                self._run_fallback(s)
                if times is not None:
                    times[len(times)] = time.perf_counter() - t0

    def _call_interruptibly(self, call: Callable[[], int], values: Values) -> int:
        """A long call on the main thread: made on the model's caller thread while this one waits (Ctrl-C reaches
        it); interrupted, the call goes on in the background over `values`, which the caller keeps until it ends and
        this thread no longer uses."""
        if self._caller is None:
            self._caller = NativeCaller(self._set_threads)
        try:
            return self._caller(call, values)
        except KeyboardInterrupt:
            self._local.memory = None  # (its workspace is still in use by the abandoned call)
            self._caller.retire()
            self._caller = None
            raise

    def _run_fallback(self, s: Step) -> None:
        views = self._local.values.views
        for vid, r in zip(s.outputs, self._reference(s, lambda i: views[i])):
            view = views[vid]
            assert view is not None
            view[...] = r

    def _results(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        values = self._local.values
        views, plan = values.views, values.prepared.plan
        outs = []
        for vid, copy in values.prepared.results:
            view = views[vid]
            assert view is not None
            outs.append(np.array(view, copy=True).reshape(plan.values[vid].shape) if copy else view)
        return outs

    # -- persistence ----------------------------------------------------------------------------------------
    def _save_files(self, out: Path) -> None:
        """The library and its C source."""
        assert self.lib_path is not None
        shutil.copyfile(self.lib_path, out / "model.so")
        (out / "model.c").write_text(self.source)

    @classmethod
    def from_files(cls, directory: Path, plan: Plan, weights: Mapping[int, np.ndarray], summary: dict,
                   fallback: Fallback | None = None) -> CompiledModel:  # fmt: skip
        """A model saved by `save` (model.so, model.c), given the files every saved model has."""
        source = (directory / "model.c").read_text() if (directory / "model.c").exists() else ""
        return cls(directory / "model.so", plan, weights, source, fallback, summary)


class NativeCaller:
    """A daemon thread that makes native calls for the main thread, which waits for each in short slices so that
    KeyboardInterrupt reaches it at once (`setup` runs first on the thread: the model's thread count)."""

    def __init__(self, setup: Callable[[], None]):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, args=(setup,), name="ember-native-call", daemon=True).start()

    def _serve(self, setup: Callable[[], None]) -> None:
        setup()
        while (job := self._jobs.get()) is not None:
            call, _, done, result = job  # (the job holds the memory the call uses until it ends)
            try:
                result.append(call())
            except BaseException as e:  # (ctypes errors) raised again in the caller
                result.append(e)
            done.set()
            del job, call

    def __call__(self, call: Callable[[], int], keep: object = None) -> int:
        """`call()` made on the thread; `keep` (the memory it works in) is held until it returns."""
        done, result = threading.Event(), []
        self._jobs.put((call, keep, done, result))
        while not done.wait(0.1):
            pass
        if isinstance(result[0], BaseException):
            raise result[0]
        return result[0]

    def retire(self) -> None:
        """The thread ends after the call it is making (an interrupted caller's)."""
        self._jobs.put(None)


def build_c_model(
    kernels: Sequence[tuple[str, PrimFunc]],
    plan: Plan,
    weights: Mapping[int, np.ndarray],
    target: Target,
    fallback: Fallback | None = None,
    summary: dict | None = None,
) -> CompiledModel | CrossCompiledModel:
    """The C backend: one C unit per kernel plus the segment runners, compiled and linked into one library by the
    target's compiler (`compiler_for`: a cross compiler for another machine, whose model is not run here).

    The model's `source` is the same code as one translation unit (each helper once, then every kernel, then the
    runners): what `save` keeps beside the library and what the standalone export compiles."""
    parts = [codegen_c_parts(func, target) for _, func in kernels]
    protos = [p for part in parts for p in part.protos]
    runners = runner_source(plan.steps, sized=plan.is_symbolic)
    units = [assemble_c([part], threads_api=False) for part in parts]
    units.append(codegen_c([], target) + "\n" + "\n".join(protos) + "\n\n" + runners)
    cc = compiler_for(target)
    lib = compile_units(units, target.cflags(), name="model", cc=cc)
    source = assemble_c(parts) + "\n" + runners
    if not target.executes_here:
        return CrossCompiledModel(lib, plan, weights, source, fallback, {**(summary or {}), "cc": cc})
    return CompiledModel(lib, plan, weights, source, fallback, {**(summary or {}), "cc": os.environ.get("CC", "cc")})
