"""Whole models on a GPU: the OpenCL and CUDA backends of `ember.compile`.

`build_gpu_model(kernels, plan, weights, target, ...)` takes the compiler's lowered kernels (loop IR with loops
bound to blockIdx/threadIdx) and its run plan (values, steps, liveness):

- each kernel function is cut into device kernels (`codegen.gpu.split_host_device`: one per root stage, with
  its launch extents, shared memory and barriers); all of them go into one source, built once (OpenCL: one
  program for the context's device; CUDA: nvcc to PTX, loaded on the first run);
- memory: each weight is uploaded once; graph inputs and outputs get a device buffer each; intermediates live in
  one device workspace at offsets planned by liveness (`runtime.plan.plan_offsets`, as the CPU executor's, at
  the device's sub-buffer alignment); views
  (Reshape, ...) share their source's buffer; a kernel's own temporaries (a reduction computed at root inside
  a fused kernel) get a buffer each, allocated once;
- a run copies the inputs in, launches every device kernel in plan order on one in-order queue with its
  arguments bound at build time, runs fallback steps (numpy references) on host copies of their inputs and
  copies their outputs back, then copies the graph outputs out.

`GPUCompiledModel` is a `runtime.model.Model` like the CPU models: `m(x)`, `m.run({...})`, `summary()`,
`benchmark()` (with or without the copies), `profile()` (per-kernel device time: OpenCL events, CUDA synchronized
host timers), `profile_table()`, and `save(dir)`: plan, weights, kernel source (PTX for CUDA) and launches, which
`ember.load` runs again without the compiler.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..codegen.gpu import DeviceProgram, split_host_device
from ..target import Target
from ..tir.dtype import numpy_dtype
from ..tir.functor import walk
from ..tir.stmt import PrimFunc, Store
from .model import Fallback, Feeds, Model, latency
from .plan import Plan, Step, plan_offsets


@dataclass
class Launch:
    """One device kernel launch: its kernel, extents and buffer arguments."""

    kernel: str  # device kernel name
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: list[tuple[str, Any]]  # ("value", value id) or ("temp", (program, buffer name))
    model_kernel: str  # the model kernel (compiler Kernel) it belongs to


def device_programs(kernels: Iterable[tuple[str, PrimFunc]]) -> dict[str, DeviceProgram]:
    """Each model kernel's device program. A statement with no bound loop (a scalar output) runs as one thread."""
    return {name: split_host_device(func, allow_serial=True) for name, func in kernels}


def merged(progs: Mapping[str, DeviceProgram]) -> DeviceProgram:
    """One program holding every device kernel (their names are unique: `<kernel>_kernel<k>`)."""
    out = DeviceProgram("model", ())
    for p in progs.values():
        out.kernels += p.kernels
    return out


def serial_kernels(progs: Mapping[str, DeviceProgram]) -> list[str]:
    """Device kernels launched as one thread that write more than one element (a schedule left them unbound)."""
    out = []
    for p in progs.values():
        for k in p.kernels:
            one = k.grid == (1, 1, 1) and k.block == (1, 1, 1)
            if one and any(n.buffer.size > 1 for n in walk(k.body) if isinstance(n, Store)):
                out.append(k.name)
    return out


def gpu_source(progs: Mapping[str, DeviceProgram], target: Target) -> str:
    if target.kind == "opencl":
        from ..codegen.opencl import codegen_opencl

        return codegen_opencl(merged(progs), target)
    from ..codegen.cuda import codegen_cuda

    return codegen_cuda(merged(progs), target)


# -- devices --------------------------------------------------------------------------------------------
class OpenCLDevice:
    """Buffers and launches on the OpenCL device of `runtime.opencl.context()` (a profiling queue of its own)."""

    kind = "opencl"

    def __init__(self, source: str):
        import pyopencl as cl

        from .opencl import context, device_name

        self.cl = cl
        self.ctx, _ = context()
        self.queue = cl.CommandQueue(self.ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
        try:
            self.program = cl.Program(self.ctx, source).build()
        except cl.RuntimeError as e:
            raise RuntimeError(f"OpenCL build of the model failed: {e}") from e
        self.align = max(64, self.ctx.devices[0].mem_base_addr_align // 8)
        self.name = device_name()

    def alloc(self, nbytes: int) -> Any:
        return self.cl.Buffer(self.ctx, self.cl.mem_flags.READ_WRITE, max(nbytes, 1))

    def sub(self, buf: Any, offset: int, nbytes: int) -> Any:
        return buf.get_sub_region(offset, max(nbytes, 1))

    def upload(self, buf: Any, a: np.ndarray) -> None:
        if a.nbytes:
            self.cl.enqueue_copy(self.queue, buf, _bytes_view(a))

    def download(self, buf: Any, a: np.ndarray) -> None:
        if a.nbytes:
            self.cl.enqueue_copy(self.queue, _bytes_view(a), buf)

    def prepare(self, launch: Launch, bufs: list[Any]) -> Any:
        kern = self.cl.Kernel(self.program, launch.kernel)
        kern.set_args(*bufs)
        glob = tuple(g * b for g, b in zip(launch.grid, launch.block))
        return kern, glob, launch.block

    def launch(self, prepared: Any) -> Any:
        kern, glob, local = prepared
        return self.cl.enqueue_nd_range_kernel(self.queue, kern, glob, local)

    def finish(self) -> None:
        self.queue.finish()

    def seconds(self, events: list[Any]) -> float:
        return sum((e.profile.end - e.profile.start) * 1e-9 for e in events)


class CUDADevice:
    """Buffers and launches through the CUDA driver API (`runtime.cuda`); PTX loaded when first needed."""

    kind = "cuda"
    align = 256

    def __init__(self, ptx_path: Any):
        from .cuda import check, context, cuda_driver

        context()  # raises CUDAUnavailable with the reason where there is no GPU or driver
        self.drv, self.check = cuda_driver(), check
        self.module = check(self.drv.cuModuleLoadData(ptx_path.read_bytes() + b"\0"))
        self.functions: dict[str, Any] = {}
        self.allocations: list[Any] = []
        self.name = "CUDA device 0"

    def alloc(self, nbytes: int) -> int:
        ptr = self.check(self.drv.cuMemAlloc(max(nbytes, 1)))
        self.allocations.append(ptr)
        return int(ptr)

    def __del__(self) -> None:
        for ptr in getattr(self, "allocations", []):
            try:
                self.drv.cuMemFree(ptr)
            except Exception:  # interpreter shutdown: the driver may be gone already
                break

    def sub(self, buf: int, offset: int, nbytes: int) -> int:
        return buf + offset

    def upload(self, buf: int, a: np.ndarray) -> None:
        if a.nbytes:
            self.check(self.drv.cuMemcpyHtoD(self.drv.CUdeviceptr(buf), a.ctypes.data, a.nbytes))

    def download(self, buf: int, a: np.ndarray) -> None:
        if a.nbytes:
            self.check(self.drv.cuMemcpyDtoH(a.ctypes.data, self.drv.CUdeviceptr(buf), a.nbytes))

    def prepare(self, launch: Launch, bufs: list[int]) -> Any:
        name = launch.kernel
        if name not in self.functions:
            self.functions[name] = self.check(self.drv.cuModuleGetFunction(self.module, name.encode()))
        cells = [np.array([b], dtype=np.uint64) for b in bufs]
        argv = np.array([c.ctypes.data for c in cells], dtype=np.uint64)
        return self.functions[launch.kernel], launch.grid, launch.block, cells, argv

    def launch(self, prepared: Any) -> Any:
        fn, grid, block, _, argv = prepared
        self.check(self.drv.cuLaunchKernel(fn, *grid, *block, 0, 0, argv.ctypes.data, 0))
        return None

    def finish(self) -> None:
        self.check(self.drv.cuCtxSynchronize())

    def seconds(self, events: list[Any]) -> float:
        raise NotImplementedError  # timed by the host around a synchronized launch (see GPUCompiledModel._run)


def _bytes_view(a: np.ndarray) -> np.ndarray:
    """Bool arrays travel as bytes (kernels take unsigned char for bool)."""
    return a.view(np.uint8) if a.dtype == np.bool_ else a


# -- the model -------------------------------------------------------------------------------------------
def launch_plan(plan: Plan, progs: Mapping[str, DeviceProgram]) -> list[list[list[Launch]]]:
    """Per plan step, per model kernel call: its device launches (a kernel with an empty grid is none)."""
    out = []
    for s in plan.steps:
        calls = []
        for k in s.kernels if s.kind == "segment" else []:
            prog = progs[k.name]
            vids = dict(zip(prog.params, k.args))

            def arg(b: Any, k: Any = k, vids: dict = vids) -> tuple[str, Any]:
                return ("value", vids[b]) if b in vids else ("temp", (k.name, b.name))

            calls.append([Launch(dk.name, dk.grid, dk.block, [arg(b) for b in dk.params], k.name)
                          for dk in prog.kernels if all(dk.grid) and all(dk.block)])  # fmt: skip
        out.append(calls)
    return out


class GPUCompiledModel(Model):
    """A model compiled for a GPU target: call it with numpy arrays, or `run` a dict by input name.

    `launches` (per plan step, per kernel call, the device launches) and `temps` (each kernel's own device
    temporaries, by (kernel, buffer) name: bytes) are plain data: a saved model needs neither the compiler nor
    the loop IR. `programs` (the device programs with their loop IR) is there when compiled in this process."""

    backend = "gpu"

    def __init__(self, plan: Plan, weights: Mapping[int, np.ndarray], launches: list[list[list[Launch]]],
                 temps: Mapping[tuple[str, str], int], source: str, target: Target, make_device: Callable[[], Any],
                 fallback: Fallback | None = None, summary: dict | None = None,
                 programs: Mapping[str, DeviceProgram] | None = None):  # fmt: skip
        super().__init__(plan, weights, fallback, summary)
        self.source = source
        self.target = target
        self.programs = dict(programs or {})
        self.temps = dict(temps)
        self._make_device = make_device
        self._device: Any = None
        self.launches = list(zip(plan.steps, launches))

    # -- device state, made on the first run --------------------------------------------------------------
    def device(self) -> Any:
        if self._device is None:
            dev = self._make_device()
            plan = self.plan
            offsets, size = plan_offsets(plan, dev.align)
            workspace = dev.alloc(size)
            bufs: dict[int, Any] = {}
            for i, v in enumerate(plan.values):
                if v.kind == "temp":
                    bufs[i] = dev.sub(workspace, offsets[i], v.nbytes)
                elif v.kind in ("input", "output"):
                    bufs[i] = dev.alloc(v.nbytes)
                elif v.kind == "weight":
                    bufs[i] = dev.alloc(v.nbytes)
                    dev.upload(bufs[i], self._weights[i])
            for i, v in enumerate(plan.values):
                if v.kind == "alias":
                    bufs[i] = bufs[v.alias_of]
            temps = {key: dev.alloc(nbytes) for key, nbytes in self.temps.items()}
            prepared = []
            for _, calls in self.launches:
                prepared.append([[dev.prepare(la, [bufs[a] if kind == "value" else temps[a] for kind, a in la.args])
                                  for la in call] for call in calls])  # fmt: skip
            dev.finish()
            self._bufs, self._workspace, self._temps, self._prepared = bufs, workspace, temps, prepared
            self._device = dev
        return self._device

    # -- metadata -----------------------------------------------------------------------------------------
    def _summary_extra(self) -> dict:
        return {"device_launches_per_run": sum(len(c) for _, calls in self.launches for c in calls)}

    def _profile_extra(self, step: int, call: int | None) -> dict:
        return {"launches": 0 if call is None else len(self.launches[step][1][call])}

    # -- running ------------------------------------------------------------------------------------------
    def _host(self, vid: int) -> np.ndarray:
        """A host copy of a value (synchronizes)."""
        v = self.plan.values[vid]
        if v.kind == "weight" or (v.kind == "alias" and self.plan.values[v.alias_of].kind == "weight"):
            src = vid if v.kind == "weight" else v.alias_of
            return self._weights[src].reshape(v.shape).copy()
        a = np.empty(v.shape, numpy_dtype(v.dtype))
        self._device.download(self._bufs[vid], a)
        return a

    def _execute(self, arrays: list[np.ndarray] | None, times: dict[int, float] | None = None) -> None:
        """Copy the inputs in (None: they are on the device already), run every step, wait for the device."""
        dev = self.device()
        for vid, x in zip(self.plan.inputs, arrays or []):
            dev.upload(self._bufs[vid], x)
        cuda_timed = times is not None and dev.kind == "cuda"
        if cuda_timed:
            dev.finish()
        events: list[tuple[int, list[Any]]] = []
        n = 0  # profile row: one per model kernel call or fallback step
        for (s, _), prepared in zip(self.launches, self._prepared):
            if s.kind != "segment":
                t0 = time.perf_counter()
                self._run_fallback(s)
                if times is not None:
                    times[n] = time.perf_counter() - t0
                n += 1
                continue
            for call in prepared:
                t0 = time.perf_counter()
                evs = [dev.launch(p) for p in call]
                if cuda_timed:
                    dev.finish()
                    times[n] = time.perf_counter() - t0  # type: ignore[index]
                elif times is not None:
                    events.append((n, evs))
                n += 1
        dev.finish()
        for row, evs in events:
            times[row] = dev.seconds(evs)  # type: ignore[index]

    def _run_fallback(self, s: Step) -> None:
        for vid, r in zip(s.outputs, self._reference(s, self._host)):
            v = self.plan.values[vid]
            a = np.ascontiguousarray(np.asarray(r, numpy_dtype(v.dtype)).reshape(v.shape))
            self._device.upload(self._bufs[vid], a)

    def _results(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        by_input = dict(zip(self.plan.inputs, arrays))
        outs = []
        for vid in self.plan.outputs:
            v = self.plan.values[vid]
            src = v.alias_of if v.kind == "alias" else vid
            outs.append(by_input[src].reshape(v.shape).copy() if src in by_input else self._host(vid))
        return outs

    def benchmark(self, inputs: Feeds | None = None, repeat: int = 20, warmup: int = 3, copies: bool = True) -> dict:
        """Latency of whole inferences: median, mean, min (seconds). With `copies` (the default) a run copies the
        inputs in and the outputs out, as a call does; without, the inputs stay on the device and a run is the
        kernel launches (and fallback steps) until the device is done: what PyTorch eager on resident tensors does."""
        arrays = self._check(inputs if inputs is not None else self.random_inputs())

        def once() -> None:
            self._execute(arrays if copies else None)
            if copies:
                self._results(arrays)

        with self._calls():
            self._execute(arrays)
            for _ in range(warmup):
                self._execute(arrays if copies else None)
            return latency(once, repeat)

    # -- persistence --------------------------------------------------------------------------------------
    def _save_files(self, out: Path) -> None:
        """The kernels' source (and PTX for CUDA) and the launches (gpu.json): `ember.load` runs it again without
        the compiler (OpenCL builds the source, CUDA loads the PTX)."""
        (out / ("model.cl" if self.target.kind == "opencl" else "model.cu")).write_text(self.source)
        if self.target.kind == "cuda":
            shutil.copyfile(self._summary["ptx"], out / "model.ptx")
        launches = [[[vars(la) for la in call] for call in calls] for _, calls in self.launches]
        temps = [[k, name, n] for (k, name), n in self.temps.items()]
        gpu = {"target": str(self.target), "launches": launches, "temps": temps}
        (out / "gpu.json").write_text(json.dumps(gpu, indent=1) + "\n")

    @classmethod
    def from_files(cls, directory: Path, plan: Plan, weights: Mapping[int, np.ndarray], summary: dict,
                   fallback: Fallback | None = None) -> GPUCompiledModel:  # fmt: skip
        """A GPU model saved by `save` (gpu.json, the source, PTX for CUDA), given the files every saved model
        has. OpenCL builds the saved source now."""
        gpu = json.loads((directory / "gpu.json").read_text())
        target = Target.parse(gpu["target"])

        def launch(la: dict) -> Launch:
            args = [(kind, a if kind == "value" else tuple(a)) for kind, a in la["args"]]
            return Launch(la["kernel"], tuple(la["grid"]), tuple(la["block"]), args, la["model_kernel"])  # type: ignore[arg-type]

        launches = [[[launch(la) for la in call] for call in calls] for calls in gpu["launches"]]
        temps = {(k, name): n for k, name, n in gpu["temps"]}
        if target.kind == "opencl":
            source = (directory / "model.cl").read_text()
            dev = OpenCLDevice(source)
            summary["device"] = dev.name

            def make_device() -> Any:
                return dev
        else:
            source = (directory / "model.cu").read_text()
            ptx = directory / "model.ptx"
            summary["ptx"] = str(ptx)

            def make_device() -> Any:
                return CUDADevice(ptx)

        return cls(plan, weights, launches, temps, source, target, make_device, fallback, summary)

    def export_c(self, directory: Any, prefix: str = "ember_model") -> None:
        raise NotImplementedError(f"export_c makes C for CPUs; this model was compiled for {self.target.kind}")

    def export(self, directory: Any, build: bool = True, openmp: bool = True, extra_cflags: Any = ()) -> None:
        raise NotImplementedError(f"export makes C for CPUs; this model was compiled for {self.target.kind}")


def build_gpu_model(
    kernels: Iterable[tuple[str, PrimFunc]],
    plan: Plan,
    weights: Mapping[int, np.ndarray],
    target: Target,
    fallback: Fallback | None = None,
    summary: dict | None = None,
) -> GPUCompiledModel:
    """Device programs, one source and its build for every kernel of a lowered model (see the module's doc).

    OpenCL builds the program now (on the device of `runtime.opencl.context()`); CUDA compiles the source with
    nvcc now and touches the driver on the first run, so a CUDA model compiles on a machine without a GPU
    (running it there raises `runtime.cuda.CUDAUnavailable`)."""
    t0 = time.perf_counter()
    progs = device_programs(kernels)
    source = gpu_source(progs, target)
    info = {"device_kernels": sum(len(p.kernels) for p in progs.values()), "serial_kernels": serial_kernels(progs)}
    if target.kind == "opencl":
        dev = OpenCLDevice(source)
        info["device"] = dev.name

        def make_device() -> Any:
            return dev
    else:
        from ..codegen.cuda import compile_cuda

        ptx = compile_cuda(source, target)
        info["ptx"] = str(ptx)

        def make_device() -> Any:
            return CUDADevice(ptx)

    info["codegen_seconds"] = time.perf_counter() - t0
    temps = {(name, t.name): t.nbytes for name, p in progs.items() for t in p.temps}
    return GPUCompiledModel(plan, weights, launch_plan(plan, progs), temps, source, target, make_device, fallback,
                            {**(summary or {}), **info}, progs)  # fmt: skip
