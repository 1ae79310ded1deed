"""The llvm target's whole-model code: one LLVM module JIT-compiled by llvmlite (no C compiler).

    kernels (loop IR)      -> LLVM functions `i32 name(ptr, ...)` (codegen.llvm)
    segments (run plan)    -> `i32 ember_segment_N(ptr v)` and `i32 ember_segment_N_profiled(ptr v, ptr t)`
                              (codegen.runners.runner_ir: the C backend's runner functions, in LLVM IR)
    the module             -> `ModelJIT` (machine code cached on disk by a hash of the IR)

The llvm model (`runtime.llvm_model`) calls the segment functions at the engine's addresses as the C model
calls a shared library's. A saved model keeps the LLVM IR (`model.ll`) and the machine code (`model.o` with its
cache key): `ModelJIT.load` puts the code back into the JIT cache where the key still matches (same IR, target,
CPU and llvmlite), so loading needs neither a C compiler nor a new optimization run; elsewhere the IR is
compiled again.
"""

from __future__ import annotations

from pathlib import Path

from ..target import Target
from .llvm import JITEngine, object_key, target_machine


class ModelJIT(JITEngine):
    """A model's module compiled in memory, as the llvm model calls it (`runtime.llvm_model`); its
    parallel loops use the target's threads (default: all cores)."""

    def __init__(self, ir_text: str, target: Target, object_code: bytes | None = None):
        super().__init__(ir_text, target, object_code)
        self.set_num_threads(target.num_cores)

    def save(self, directory: Path) -> None:
        """Write the LLVM IR, and the machine code with the key (IR, target, CPU, llvmlite) it is valid for."""
        (directory / "model.ll").write_text(self.ir_text)
        if self.object_code is not None:
            (directory / "model.o").write_bytes(self.object_code)
            (directory / "model.key").write_text(self.key + "\n")

    @classmethod
    def load(cls, directory: Path, target: str | Target) -> ModelJIT:
        """The engine of a saved model (its files verified by the manifest): its machine code where its key is this
        process's key for the IR (same target, CPU and llvmlite), else its IR compiled again. The saved code serves
        this engine only: it never enters the shared JIT cache, so a saved model cannot change what later compiles
        get."""
        target = Target.parse(target)
        ir_text = (directory / "model.ll").read_text()
        obj, key_file = directory / "model.o", directory / "model.key"
        key = object_key(ir_text, target, target_machine(target))
        if obj.exists() and key_file.exists() and key_file.read_text().strip() == key:
            return cls(ir_text, target, obj.read_bytes())
        return cls(ir_text, target)
