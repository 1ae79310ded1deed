"""Running CUDA kernels through the CUDA driver API (cuda-python): copies in, launches, copies out.

Building needs only nvcc (`codegen.cuda.compile_cuda` makes PTX); the driver is touched on the first call,
so a module can be built, printed and saved on a machine without a GPU, and calling it there raises
`CUDAUnavailable` with the reason.

Not yet run on a GPU in CI: the machines that run the tests have none (tests skip with the reason).
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from .module import ArgSpec, Function


class CUDAUnavailable(RuntimeError):
    """No cuda-python, no driver, or no CUDA device."""


def cuda_driver():
    try:
        from cuda.bindings import driver  # cuda-python >= 12.6
    except ImportError:
        try:
            from cuda import cuda as driver  # older cuda-python
        except ImportError as e:
            raise CUDAUnavailable("running CUDA kernels needs cuda-python (pip install cuda-python)") from e
    return driver


def check(result: Any) -> Any:
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        drv = cuda_driver()
        _, msg = drv.cuGetErrorString(err)
        raise CUDAUnavailable(f"CUDA driver error {int(err)}: {msg.decode() if msg else err}")
    return rest[0] if len(rest) == 1 else rest


@functools.cache
def context() -> Any:
    """The primary context of device 0 (made current on this thread)."""
    drv = cuda_driver()
    try:
        check(drv.cuInit(0))
        if check(drv.cuDeviceGetCount()) < 1:
            raise CUDAUnavailable("no CUDA device")
    except CUDAUnavailable:
        raise
    except Exception as e:  # pragma: no cover - a driver library that fails to load
        raise CUDAUnavailable(f"no usable CUDA driver: {e}") from e
    dev = check(drv.cuDeviceGet(0))
    ctx = check(drv.cuDevicePrimaryCtxRetain(dev))
    check(drv.cuCtxSetCurrent(ctx))
    return ctx


def available() -> str | None:
    """None when CUDA kernels can run here, else the reason they cannot."""
    try:
        context()
    except CUDAUnavailable as e:
        return str(e)
    return None


class CUDAModule:
    """Kernels compiled to PTX: call like a C module, `f(a, b, c)`; outputs written in place."""

    def __init__(self, prog: Any, source: str, ptx_path: Path, ir: Any = None):
        self.prog, self.source, self.ptx_path, self.ir = prog, source, Path(ptx_path), ir
        written = {n for k in prog.kernels for n in _stores(k.body)}
        self.specs = [ArgSpec(b.name, b.shape, b.dtype.name, b in written) for b in prog.params]
        self.entry = prog.name
        self._checker = SimpleNamespace(name=prog.name, args=self.specs)
        self._functions: list[Any] | None = None

    @property
    def ptx(self) -> str:
        return self.ptx_path.read_text()

    def _load(self) -> list[Any]:
        if self._functions is None:
            drv = cuda_driver()
            context()
            mod = check(drv.cuModuleLoadData(self.ptx_path.read_bytes() + b"\0"))
            self._module = mod
            self._functions = [check(drv.cuModuleGetFunction(mod, k.name.encode())) for k in self.prog.kernels]
        return self._functions

    def __call__(self, *arrays: np.ndarray) -> None:
        Function.check(self._checker, arrays)  # type: ignore[arg-type]
        fns = self._load()
        drv = cuda_driver()
        ptrs: dict[Any, Any] = {}
        try:
            for b, a in zip(self.prog.params, arrays):
                ptrs[b] = check(drv.cuMemAlloc(max(a.nbytes, 1)))
                if a.nbytes:
                    check(drv.cuMemcpyHtoD(ptrs[b], a.ctypes.data, a.nbytes))
            for t in self.prog.temps:
                ptrs[t] = check(drv.cuMemAlloc(max(t.nbytes, 1)))
            for k, fn in zip(self.prog.kernels, fns):
                args = [np.array([int(ptrs[p])], dtype=np.uint64) for p in k.params]
                argv = np.array([a.ctypes.data for a in args], dtype=np.uint64)
                check(drv.cuLaunchKernel(fn, *k.grid, *k.block, 0, 0, argv.ctypes.data, 0))
            check(drv.cuCtxSynchronize())
            for b, a, spec in zip(self.prog.params, arrays, self.specs):
                if spec.written and a.nbytes:
                    check(drv.cuMemcpyDtoH(a.ctypes.data, ptrs[b], a.nbytes))
        finally:
            for p in ptrs.values():
                drv.cuMemFree(p)

    def __repr__(self) -> str:
        return f"CUDAModule({self.entry}: {len(self.prog.kernels)} kernel(s), {self.ptx_path.name})"


def _stores(body: Any) -> set:
    from ..tir.functor import walk
    from ..tir.stmt import Store

    return {n.buffer for n in walk(body) if isinstance(n, Store)}
