"""The llvm backend's model: the CPU executor with its segment functions in a JIT engine, not a library.

`build_llvm_model` puts every kernel (codegen.llvm) and the segment runners (codegen.runners.runner_ir) in one
LLVM module and JIT-compiles it (`codegen.llvm_model.ModelJIT`, no C compiler). A saved model holds the LLVM IR
and the machine code with its cache key (`ModelJIT.save`/`load`) instead of model.so and model.c.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..codegen.llvm import codegen_llvm, refuse_missing_features, shared_library
from ..codegen.llvm_model import ModelJIT
from ..codegen.runners import runner_ir
from ..target import Target
from ..tir.stmt import PrimFunc
from .cross import CrossCompiledModel
from .executor import CompiledModel
from .model import Fallback
from .plan import Plan


class LLVMCompiledModel(CompiledModel):
    """A model on a CPU whose segment functions live in memory (`lib` is a `ModelJIT`; `lib_path` is None)."""

    backend = "llvm"

    def _open(self, lib: ModelJIT) -> ModelJIT:
        return lib  # (the engine has set its own threads)

    def _function(self, name: str, *argtypes: Any) -> Any:
        return ctypes.CFUNCTYPE(ctypes.c_int32, *argtypes)(self._lib.address(name))

    def _save_files(self, out: Path) -> None:
        """The LLVM IR and the machine code (`ModelJIT.save`)."""
        self._lib.save(out)

    @classmethod
    def from_files(cls, directory: Path, plan: Plan, weights: Mapping[int, np.ndarray], summary: dict,
                   fallback: Fallback | None = None) -> LLVMCompiledModel:  # fmt: skip
        jit = ModelJIT.load(directory, plan.target)
        return cls(jit, plan, weights, jit.ir_text, fallback, summary)


def build_llvm_model(
    kernels: Sequence[tuple[str, PrimFunc]],
    plan: Plan,
    weights: Mapping[int, np.ndarray],
    target: Target,
    fallback: Fallback | None = None,
    summary: dict | None = None,
) -> LLVMCompiledModel | CrossCompiledModel:
    """The model backend of target kind "llvm": every kernel and the segment runners in one LLVM module, JIT-compiled,
    or for another machine compiled to its shared library (`codegen.llvm.shared_library`), not run here."""
    runners = runner_ir(plan.steps, sized=plan.is_symbolic)
    source = codegen_llvm([f for _, f in kernels], target) + "\n" + runners  # (ImportError: llvmlite)
    if not target.runs_here:
        return CrossCompiledModel(shared_library(source, target), plan, weights, source, fallback, summary)
    refuse_missing_features(target)
    jit = ModelJIT(source, target)
    import llvmlite

    info = {"llvmlite": llvmlite.__version__, "jit_cache_hit": jit.from_cache}
    return LLVMCompiledModel(jit, plan, weights, source, fallback, {**(summary or {}), **info})
