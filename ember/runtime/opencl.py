"""Running OpenCL kernels through pyopencl: numpy arrays in, copies to the device, launches, copies back.

`OpenCLModule(prog, source)` builds the program for the first OpenCL device found (any platform; PoCL runs
on the CPU), or the one named by EMBER_OPENCL_DEVICE ("platform substring:device substring"). A call checks
the arguments like every Ember module, copies each input to a device buffer, allocates the temporaries,
launches the kernels in order on one in-order queue, and copies back the arguments the kernels write.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from types import SimpleNamespace
from typing import Any

import numpy as np

from .module import ArgSpec, Function


class OpenCLUnavailable(RuntimeError):
    """No OpenCL runtime (pyopencl) or no platform/device to run on."""


@functools.cache
def context() -> tuple[Any, Any]:
    """(context, queue) on the chosen device; raises OpenCLUnavailable with the reason."""
    try:
        import pyopencl as cl
    except ImportError as e:
        raise OpenCLUnavailable("the opencl target needs pyopencl (pip install pyopencl)") from e
    try:
        platforms = cl.get_platforms()
    except cl.Error as e:
        raise OpenCLUnavailable(f"no OpenCL platform: {e} (install one, e.g. apt-get install pocl-opencl-icd)") from e
    want = os.environ.get("EMBER_OPENCL_DEVICE", "")
    want_p, _, want_d = want.partition(":")
    for p in platforms:
        if want_p.lower() not in p.name.lower():
            continue
        for d in p.get_devices():
            if want_d.lower() in d.name.lower():
                ctx = cl.Context([d])
                return ctx, cl.CommandQueue(ctx)
    names = [f"{p.name}: {[d.name for d in p.get_devices()]}" for p in platforms]
    raise OpenCLUnavailable(f"no OpenCL device matches {want!r}; found {names or 'no platform'}")


def device_name() -> str:
    ctx, _ = context()
    d = ctx.devices[0]
    return f"{d.platform.name}: {d.name}"


class OpenCLModule:
    """A built OpenCL program: call it like a C module, `f(a, b, c)`, outputs written in place."""

    def __init__(self, prog: Any, source: str, ir: Any = None):
        import pyopencl as cl

        self.prog = prog  # codegen.gpu.DeviceProgram
        self.source = source
        self.ir = ir
        self.ctx, self.queue = context()
        try:
            self.program = cl.Program(self.ctx, source).build()
        except cl.RuntimeError as e:
            raise RuntimeError(f"OpenCL build failed: {e}\n--- source ---\n{source}") from e
        self.kernels = [getattr(self.program, k.name) for k in prog.kernels]
        written = {b for k in prog.kernels for b in _stores(k.body)}
        self.specs = [ArgSpec(b.name, b.shape, b.dtype.name, b in written) for b in prog.params]
        self.entry = prog.name
        self._checker = SimpleNamespace(name=prog.name, args=self.specs)

    def check(self, arrays: tuple) -> None:
        Function.check(self._checker, arrays)  # type: ignore[arg-type]

    def __call__(self, *arrays: np.ndarray) -> None:
        self.check(arrays)
        self.run(arrays)

    def run(self, arrays: tuple | list) -> None:
        import pyopencl as cl

        mf = cl.mem_flags
        bufs: dict[Any, Any] = {}
        for b, a, spec in zip(self.prog.params, arrays, self.specs):
            flags = (mf.READ_WRITE if spec.written else mf.READ_ONLY) | mf.COPY_HOST_PTR
            if a.nbytes:
                bufs[b] = cl.Buffer(self.ctx, flags, hostbuf=_device_view(a))
            else:
                bufs[b] = cl.Buffer(self.ctx, mf.READ_WRITE, 1)
        for t in self.prog.temps:
            bufs[t] = cl.Buffer(self.ctx, mf.READ_WRITE, max(t.nbytes, 1))
        self.launch(bufs)
        for b, a, spec in zip(self.prog.params, arrays, self.specs):
            if spec.written and a.nbytes:
                cl.enqueue_copy(self.queue, _device_view(a), bufs[b])
        self.queue.finish()

    def launch(self, bufs: dict) -> None:
        for k, kern in zip(self.prog.kernels, self.kernels):
            local = k.block
            global_ = tuple(g * b for g, b in zip(k.grid, k.block))
            kern(self.queue, global_, local, *[bufs[p] for p in k.params])

    def benchmark(self, *arrays: np.ndarray, repeat: int = 7, min_time: float = 0.1, **_: Any) -> dict:
        """Median seconds per call, copies included."""
        self.check(arrays)
        self.run(arrays)
        runs = []
        for _ in range(repeat):
            n, t0 = 0, time.perf_counter()
            while True:
                self.run(arrays)
                n += 1
                if time.perf_counter() - t0 >= min_time:
                    break
            runs.append((time.perf_counter() - t0) / n)
        return {"median": statistics.median(runs), "min": min(runs), "runs": runs}

    def __repr__(self) -> str:
        return f"OpenCLModule({self.entry}: {len(self.kernels)} kernel(s) on {device_name()})"


def _stores(body: Any) -> set:
    from ..tir.functor import walk
    from ..tir.stmt import Store

    return {n.buffer for n in walk(body) if isinstance(n, Store)}


def _device_view(a: np.ndarray) -> np.ndarray:
    """Bool arrays travel as bytes (OpenCL kernels take unsigned char for bool)."""
    return a.view(np.uint8) if a.dtype == np.bool_ else a
