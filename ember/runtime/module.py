"""Loaded native modules: argument checking, calling, timing."""

from __future__ import annotations

import ctypes
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..tir.arith import eval_int
from ..tir.dtype import numpy_dtype
from ..tir.expr import Expr, Var
from ..tir.stmt import size_params


class ArgumentError(ValueError):
    """A call with arguments that do not match the compiled function (raised before native code runs)."""


@dataclass(frozen=True)
class ArgSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    written: bool = False

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "written": self.written}

    @staticmethod
    def from_json(d: dict) -> ArgSpec:
        return ArgSpec(d["name"], tuple(d["shape"]), d["dtype"], d.get("written", False))


class Function:
    """One native function taking one contiguous numpy array per parameter. Where the shapes hold size
    variables (a kernel of any size), their values are read from the arrays' shapes and passed after them."""

    def __init__(self, lib: ctypes.CDLL, name: str, args: list[ArgSpec]):
        self.name = name
        self.args = list(args)
        self.sizes: list[Var] = size_params(self.args)
        self._fn = getattr(lib, name)
        self._fn.argtypes = [ctypes.c_void_p] * len(args) + [ctypes.c_int64] * len(self.sizes)
        self._fn.restype = ctypes.c_int32

    def size_values(self, arrays: tuple[Any, ...] | list[Any]) -> list[int]:
        """The size variables' values for these arrays (a bare variable dim binds it; every dim is then checked)."""
        if not self.sizes:
            return []
        env: dict[Var, int] = {}
        for spec, a in zip(self.args, arrays):
            for d, n in zip(spec.shape, np.shape(a)):
                if isinstance(d, Var) and d not in env:
                    env[d] = int(n)
        missing = [v.name for v in self.sizes if v not in env]
        if missing:
            raise ArgumentError(f"{self.name}: size(s) {', '.join(missing)} appear in no argument's shape as a bare "
                                "dim, so no argument gives their value")  # fmt: skip
        return [env[v] for v in self.sizes]

    def _shape(self, spec: ArgSpec, env: dict[Var, int]) -> tuple[int, ...]:
        return tuple(int(eval_int(d, env)) if isinstance(d, Expr) else d for d in spec.shape)  # type: ignore[arg-type]

    def check(self, arrays: tuple[Any, ...]) -> None:
        names = ", ".join(a.name for a in self.args)
        if len(arrays) != len(self.args):
            raise ArgumentError(f"{self.name} expects {len(self.args)} arguments ({names}), got {len(arrays)}")
        for spec, a in zip(self.args, arrays):
            where = f"{self.name}: argument '{spec.name}'"
            if not isinstance(a, np.ndarray):
                raise ArgumentError(f"{where} must be a numpy array, got {type(a).__name__}")
            if a.dtype != numpy_dtype(spec.dtype):
                raise ArgumentError(f"{where} has dtype {a.dtype}, expected {spec.dtype}")
            if getattr(self, "sizes", None) and len(a.shape) == len(spec.shape):  # (GPU modules reuse this check)
                env = dict(zip(self.sizes, self.size_values(arrays)))
                if a.shape != self._shape(spec, env):
                    dims = ", ".join(map(str, spec.shape))
                    sizes = ", ".join(f"{v.name}={n}" for v, n in env.items())
                    raise ArgumentError(f"{where} has shape {a.shape}, expected [{dims}] = {self._shape(spec, env)} "
                                        f"with {sizes}")  # fmt: skip
            elif a.shape != spec.shape:
                raise ArgumentError(f"{where} has shape {a.shape}, expected {spec.shape}")
            if not a.flags.c_contiguous:
                raise ArgumentError(f"{where} is not C-contiguous; pass np.ascontiguousarray(...)")
            if spec.written and not a.flags.writeable:
                raise ArgumentError(f"{where} is written by the function but the array is read-only")
        for i, (si, ai) in enumerate(zip(self.args, arrays)):
            for sj, aj in list(zip(self.args, arrays))[i + 1 :]:
                if (si.written or sj.written) and ai.size and aj.size and np.may_share_memory(ai, aj):
                    raise ArgumentError(f"{self.name}: arguments '{si.name}' and '{sj.name}' overlap in memory")

    def __call__(self, *arrays: np.ndarray) -> None:
        self.check(arrays)
        self.call_unchecked(arrays)

    def call_unchecked(self, arrays: tuple[np.ndarray, ...] | list[np.ndarray]) -> None:
        self.bind(arrays)()

    def bind(self, arrays: tuple[np.ndarray, ...] | list[np.ndarray]) -> Callable[[], None]:
        """A call of this function on `arrays` (unchecked), their addresses taken once: numpy's `.ctypes` costs
        about 1 us an array, which a timing loop would add to every call (2.7 us a call of a two-argument
        kernel here, 0.26 us bound)."""
        values = [a.ctypes.data for a in arrays] + self.size_values(arrays)
        fn, name = self._fn, self.name

        def call() -> None:
            status = fn(*values)
            if status != 0:
                raise MemoryError(f"{name}: native code failed (status {status}): could not allocate a buffer")

        return call

    def benchmark(self, *arrays: np.ndarray, repeat: int = 7, min_time: float = 0.1, warmup: int = 1) -> dict:
        """Median seconds per call over `repeat` timed runs of at least `min_time` seconds each."""
        self.check(arrays)
        call = self.bind(arrays)
        for _ in range(warmup):
            call()
        number = 1
        while True:
            t0 = time.perf_counter()
            for _ in range(number):
                call()
            dt = time.perf_counter() - t0
            if dt >= min_time or number >= 1 << 20:
                break
            number = max(number * 2, int(number * min_time / max(dt, 1e-9)))
        runs = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            for _ in range(number):
                call()
            runs.append((time.perf_counter() - t0) / number)
        return {"median": statistics.median(runs), "min": min(runs), "runs": runs, "number": number}


class Module:
    """A built library: its functions by name, the generated source and (when built here) the loop IR."""

    def __init__(self, lib_path: Path | str, functions: dict[str, list[ArgSpec]], source: str, ir: Any = None):
        self.lib_path = Path(lib_path)
        self.source = source
        self.ir = ir
        self._lib = ctypes.CDLL(str(self.lib_path))
        self.functions = {n: Function(self._lib, n, specs) for n, specs in functions.items()}
        self.entry = next(iter(self.functions))

    def __getitem__(self, name: str) -> Function:
        return self.functions[name]

    def __call__(self, *arrays: np.ndarray) -> None:
        self.functions[self.entry](*arrays)

    def benchmark(self, *arrays: np.ndarray, **kw: Any) -> dict:
        return self.functions[self.entry].benchmark(*arrays, **kw)

    def set_num_threads(self, n: int) -> None:
        self._lib.ember_set_num_threads(ctypes.c_int32(n))

    def __repr__(self) -> str:
        return f"Module({', '.join(self.functions)} from {self.lib_path})"
