"""The CPU executor: a model's segment functions called through ctypes over a table of value addresses.

Consecutive native kernels form a *segment* (`runtime.plan`): one generated function that calls them in order,
reading buffer addresses from a table of pointers, so a model without fallback steps runs as a single native
call per inference. Intermediates live in one host workspace at the plan's offsets; aliases (views such as
Reshape) share their source's storage; fallback steps write their numpy results into the same memory.

`CompiledModel` is the C backend's model: the segment functions come from a shared library (`build_c_model`
compiles the kernels' C and the runners into one). The llvm backend's model (`runtime.llvm_model`) is a small
subclass that finds them in a JIT engine instead. Neither needs the compiler to run or to load.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..codegen.c import codegen_c, codegen_c_unit
from ..codegen.runners import runner_source
from ..codegen.toolchain import compile_units, compiler_for
from ..target import Target
from ..tir.dtype import numpy_dtype
from ..tir.stmt import PrimFunc
from .cross import CrossCompiledModel
from .export import export_c
from .model import Fallback, Model
from .plan import ALIGN, Plan, Step


class CompiledModel(Model):
    """A model on a CPU: its segment functions in a shared library (C backend), called over a value table."""

    def __init__(self, lib: Any, plan: Plan, weights: Mapping[int, np.ndarray], source: str = "",
                 fallback: Fallback | None = None, summary: dict | None = None):  # fmt: skip
        """`lib`: the path of the shared library (a subclass takes its own kind of code)."""
        super().__init__(plan, weights, fallback, summary)
        self.source = source
        self.lib_path: Path | None = None
        self._lib = self._open(lib)
        n = len(plan.values)
        self._table = (ctypes.c_void_p * max(n, 1))()
        self._workspace = np.zeros(max(plan.workspace, 1) + ALIGN, dtype=np.uint8)
        base = self._workspace.ctypes.data
        pad = (-base) % ALIGN
        self._views: list[np.ndarray | None] = [None] * n
        for i, v in enumerate(plan.values):
            if v.kind == "temp":
                start = pad + v.offset
                buf = self._workspace[start : start + v.nbytes]
                self._views[i] = buf.view(numpy_dtype(v.dtype)).reshape(v.shape)
                self._table[i] = base + start
            elif v.kind == "weight":
                self._views[i] = self._weights[i]
                self._table[i] = self._weights[i].ctypes.data
        self._segments = {}
        for s in plan.steps:
            if s.kind == "segment":
                fn = self._function(s.function, ctypes.c_void_p)
                prof = self._function(s.function + "_profiled", ctypes.c_void_p, ctypes.POINTER(ctypes.c_double))
                self._segments[s.function] = (fn, prof)

    # -- the code -------------------------------------------------------------------------------------------
    def _open(self, lib: Path | str) -> Any:
        """Load the shared library, and give its thread pool the target's thread count."""
        self.lib_path = Path(lib)
        handle = ctypes.CDLL(str(self.lib_path))
        threads = _threads_of(self.plan.target) if self.plan.target else None
        if threads and hasattr(handle, "ember_set_num_threads"):
            handle.ember_set_num_threads(ctypes.c_int32(threads))
        return handle

    def _function(self, name: str, *argtypes: Any) -> Any:
        """A segment function `int32_t name(argtypes...)` of the code."""
        fn = getattr(self._lib, name)
        fn.argtypes = list(argtypes)
        fn.restype = ctypes.c_int32
        return fn

    # -- running --------------------------------------------------------------------------------------------
    def _start(self, arrays: list[np.ndarray]) -> None:
        """Point the table at the inputs, fresh output arrays and the aliases' sources."""
        for vid, x in zip(self.plan.inputs, arrays):
            self._views[vid] = x
            self._table[vid] = x.ctypes.data
        for vid in self.plan.outputs:
            v = self.plan.values[vid]
            if v.kind == "output":
                a = np.empty(v.shape, dtype=numpy_dtype(v.dtype))
                self._views[vid] = a
                self._table[vid] = a.ctypes.data
        for i, v in enumerate(self.plan.values):
            if v.kind == "alias":
                src = self._views[v.alias_of]
                self._views[i] = None if src is None else src.view(numpy_dtype(v.dtype)).reshape(v.shape)
                self._table[i] = self._table[v.alias_of]

    def _execute(self, arrays: list[np.ndarray] | None, times: dict[int, float] | None = None) -> None:
        for s in self.plan.steps:
            if s.kind == "segment":
                fn, prof = self._segments[s.function]
                if times is None:
                    status = fn(self._table)
                else:
                    buf = (ctypes.c_double * len(s.kernels))()
                    status = prof(self._table, buf)
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
        for vid, r in zip(s.outputs, self._reference(s, lambda i: self._views[i])):
            view = self._views[vid]
            assert view is not None
            view[...] = r

    def _results(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        outs = []
        for vid in self.plan.outputs:
            v = self.plan.values[vid]
            view = self._views[vid]
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

    def export_c(self, directory: str | Path, prefix: str = "ember_model") -> Path:
        """Write a standalone C library (source, header, weights) a C program can link: see runtime.export."""
        return export_c(self.plan, self._weights, self.source, directory, prefix)


def build_c_model(
    kernels: Sequence[tuple[str, PrimFunc]],
    plan: Plan,
    weights: Mapping[int, np.ndarray],
    target: Target,
    fallback: Fallback | None = None,
    summary: dict | None = None,
) -> CompiledModel | CrossCompiledModel:
    """The C backend: one C unit per kernel plus the segment runners, compiled and linked into one library by the
    target's compiler (`compiler_for`: a cross compiler for another machine, whose model is not run here)."""
    units, protos = [], []
    for _, func in kernels:
        src, proto = codegen_c_unit(func, target, threads_api=False)
        units.append(src)
        protos += proto
    units.append(codegen_c([], target) + "\n" + "\n".join(protos) + "\n\n" + runner_source(plan.steps))
    cc = compiler_for(target)
    lib = compile_units(units, target.cflags(), name="model", cc=cc)
    source = lib.with_suffix(".c").read_text()
    if not target.runs_here:
        return CrossCompiledModel(lib, plan, weights, source, fallback, {**(summary or {}), "cc": cc})
    return CompiledModel(lib, plan, weights, source, fallback, {**(summary or {}), "cc": os.environ.get("CC", "cc")})


def _threads_of(target: str) -> int | None:
    for part in target.split():
        if part.startswith("-threads="):
            return int(part.split("=", 1)[1])
    return None
