"""Modules compiled in memory by LLVM (the llvm target): the same calling, checking and timing as
`runtime.module.Module`, with function pointers from a JIT engine instead of a shared library."""

from __future__ import annotations

import ctypes
from typing import Any

from .module import ArgSpec, Function, Module


class _JITLib:
    """Looks like a ctypes.CDLL to `Function`: one C function pointer attribute per name."""

    def __init__(self, jit: Any, names: list[str]):
        for n in names:
            setattr(self, n, ctypes.CFUNCTYPE(ctypes.c_int32)(jit.address(n)))


class JITModule(Module):
    """Functions of an in-memory LLVM module (`codegen.llvm.JITEngine`); `source` is its LLVM IR."""

    def __init__(self, jit: Any, functions: dict[str, list[ArgSpec]], source: str, ir: Any = None):
        self.lib_path = None  # type: ignore[assignment]
        self.source = source
        self.ir = ir
        self.jit = jit  # keeps the machine code alive
        self._lib = _JITLib(jit, list(functions))
        self.functions = {n: Function(self._lib, n, specs) for n, specs in functions.items()}  # type: ignore[arg-type]
        self.entry = next(iter(self.functions))

    def set_num_threads(self, n: int) -> None:
        self.jit.set_num_threads(n)

    @property
    def assembly(self) -> str:
        return self.jit.assembly()

    def __repr__(self) -> str:
        return f"JITModule({', '.join(self.functions)}, llvm)"
