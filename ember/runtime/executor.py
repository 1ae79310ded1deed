"""The CPU executor: a model's segment functions called through ctypes over a table of value addresses.

Consecutive native kernels form a *segment* (`runtime.plan`): one generated function that calls them in order,
reading buffer addresses from a table of pointers, so a model without fallback steps runs as a single native
call per inference. Intermediates live in one host workspace at the plan's offsets; aliases (views such as
Reshape) share their source's storage; fallback steps write their numpy results into the same memory.

Calls from several threads at once are safe and run in parallel: each calling thread gets its own value table and
workspace (`Values`, made on its first call; weights are shared and only read), and every call returns fresh
output arrays.

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
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
from .model import Fallback, Model
from .plan import ALIGN, Plan, Step, alias_view

INTERRUPTIBLE_FLOPS = 1e9  # segments this large run where Ctrl-C reaches them (a thread start is ~1% of them)


def interruptible(plan: Plan) -> dict[str, bool]:
    """Per segment function: whether it is long enough to run where Ctrl-C reaches it (a plan at sizes: at them)."""
    return {s.function: sum(k.flops for k in s.kernels) >= INTERRUPTIBLE_FLOPS
            for s in plan.steps if s.kind == "segment"}  # fmt: skip


@dataclass
class Values:
    """One caller's view of a model's values: the table of addresses the segment functions read, numpy views of
    the same memory (for fallback steps and outputs), and the workspace the intermediates live in."""

    table: Any  # ctypes array of void*
    views: list[np.ndarray | None]
    workspace: np.ndarray

    @staticmethod
    def make(plan: Plan, weights: Mapping[int, np.ndarray]) -> Values:
        n = len(plan.values)
        table = (ctypes.c_void_p * max(n, 1))()
        workspace = np.zeros(max(plan.workspace, 1) + ALIGN, dtype=np.uint8)
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
        return Values(table, views, workspace)


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
        self._local = threading.local()  # .values: the calling thread's Values
        self._caller: NativeCaller | None = None  # runs the main thread's long calls
        self._segments = {}
        # symbolic sizes: one plan per size (`Plan.at`), made on the first call at that size and kept; the runners
        # take the sizes after the table
        self._sized = plan.is_symbolic
        self._plans: dict[tuple[int, ...], Plan] = {}
        self._long_at: dict[tuple[int, ...], dict[str, bool]] = {}  # per size: `interruptible` of its plan
        sizes = (ctypes.POINTER(ctypes.c_int64),) if self._sized else ()
        for s in plan.steps:
            if s.kind == "segment":
                fn = self._function(s.function, ctypes.c_void_p, *sizes)
                prof = self._function(s.function + "_profiled", ctypes.c_void_p, *sizes,
                                      ctypes.POINTER(ctypes.c_double))  # fmt: skip
                self._segments[s.function] = (fn, prof)
        self._long = interruptible(plan)

    def _calls(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # each calling thread has its own Values

    def _values(self) -> Values:
        """The calling thread's value table and workspace (made on its first call, and again at each new size)."""
        values = getattr(self._local, "values", None)
        plan = self._current_plan()
        if values is None or getattr(self._local, "values_plan", None) is not plan:
            if values is None:
                self._set_threads()
            values = self._local.values = Values.make(plan, self._weights)
            self._local.values_plan = plan
        return values

    def _current_plan(self) -> Plan:
        """The plan of the calling thread's current call: the model's, or for symbolic sizes the plan at them."""
        return getattr(self._local, "plan", None) or self.plan if self._sized else self.plan

    def _bind(self, arrays: list[np.ndarray]) -> None:
        """For symbolic sizes: the sizes of this call, its plan (made once per new size) and the sizes argument."""
        sizes = self.plan.bind([a.shape for a in arrays], arrays)
        plan = self._plans.get(sizes)
        if plan is None:
            with self._lock:
                plan = self._plans.setdefault(sizes, self.plan.at(sizes))
                self._long_at.setdefault(sizes, interruptible(plan))
        self._local.plan = plan
        self._local.long = self._long_at[sizes]
        self._local.sizes = (ctypes.c_int64 * max(len(sizes), 1))(*sizes)

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
        """Point the calling thread's table at the inputs, fresh output arrays and the aliases' sources."""
        if self._sized:
            self._bind(arrays)
        plan = self._current_plan()
        values = self._values()
        views, table = values.views, values.table
        for vid, x in zip(plan.inputs, arrays):
            views[vid] = x
            table[vid] = x.ctypes.data
        for vid in plan.outputs:
            v = plan.values[vid]
            if v.kind == "output":
                a = np.empty(v.shape, dtype=numpy_dtype(v.dtype))
                views[vid] = a
                table[vid] = a.ctypes.data
        for i, v in enumerate(plan.values):
            if v.kind == "alias":
                views[i] = alias_view(views[v.alias_of], v)
                table[i] = table[v.alias_of] + v.view_offset if table[v.alias_of] else table[v.alias_of]

    def _execute(self, arrays: list[np.ndarray] | None, times: dict[int, float] | None = None) -> None:
        table = self._values().table
        main = threading.current_thread() is threading.main_thread()
        sized = (self._local.sizes,) if self._sized else ()
        for s in self.plan.steps:
            if s.kind == "segment":
                fn, prof = self._segments[s.function]
                long = (self._local.long if self._sized else self._long)[s.function]
                buf = (ctypes.c_double * len(s.kernels))()
                call = (lambda: fn(table, *sized)) if times is None else (lambda: prof(table, *sized, buf))  # noqa: B023
                if main and long:
                    if self._caller is None:
                        self._caller = NativeCaller(self._set_threads)
                    try:
                        status = self._caller(call)
                    except KeyboardInterrupt:
                        self._local.values = None  # still in use by the abandoned call
                        self._caller.retire()
                        self._caller = None
                        raise
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

    def _run_fallback(self, s: Step) -> None:
        views = self._values().views
        for vid, r in zip(s.outputs, self._reference(s, lambda i: views[i])):
            view = views[vid]
            assert view is not None
            view[...] = r

    def _results(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        views = self._values().views
        plan = self._current_plan()
        outs = []
        for vid in plan.outputs:
            v = plan.values[vid]
            view = views[vid]
            assert view is not None
            outs.append(view if v.kind == "output" else np.array(view, copy=True).reshape(v.shape))
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
            call, done, result = job
            try:
                result.append(call())
            except BaseException as e:  # (ctypes errors) raised again in the caller
                result.append(e)
            done.set()

    def __call__(self, call: Callable[[], int]) -> int:
        done, result = threading.Event(), []
        self._jobs.put((call, done, result))
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
    if not target.runs_here:
        return CrossCompiledModel(lib, plan, weights, source, fallback, {**(summary or {}), "cc": cc})
    return CompiledModel(lib, plan, weights, source, fallback, {**(summary or {}), "cc": os.environ.get("CC", "cc")})
