"""Whole models on a GPU: the OpenCL and CUDA backends of `ember.compile`.

`build_gpu_model(kernels, plan, weights, target, ...)` takes the compiler's lowered kernels (loop IR with loops
bound to blockIdx/threadIdx) and its run plan (values, steps, liveness):

- each kernel function is cut into device kernels (`codegen.gpu.split_host_device`: one per root stage, with
  its launch extents, shared memory and barriers); all of them go into one source, built once (OpenCL: one
  program for the context's device; CUDA: nvcc to PTX, loaded on the first run);
- memory: each weight is uploaded once; graph inputs and outputs get a device buffer each; intermediates live in
  one device workspace at offsets planned by liveness (as the CPU executor's, aligned for sub-buffers); views
  (Reshape, ...) share their source's buffer; a kernel's own temporaries (a reduction computed at root inside
  a fused kernel) get a buffer each, allocated once;
- a run copies the inputs in, launches every device kernel in plan order on one in-order queue with its
  arguments bound at build time, runs fallback steps (numpy references) on host copies of their inputs and
  copies their outputs back, then copies the graph outputs out.

`GPUCompiledModel` answers like `CompiledModel`: `m(x)`, `m.run({...})`, `summary()`, `benchmark()`,
`profile()` (per-kernel device time: OpenCL events, CUDA synchronized host timers), `profile_table()`, and
`save(dir)`: plan, weights, kernel source (PTX for CUDA) and launches, which `ember.load` runs again without the
compiler.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..codegen.gpu import DeviceProgram, split_host_device
from ..target import Target
from ..tir.dtype import numpy_dtype
from ..tir.functor import walk
from ..tir.stmt import PrimFunc, Store
from .executor import Fallback, Feeds, Plan, Step, profile_table, random_inputs
from .module import ArgumentError


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


# -- memory ---------------------------------------------------------------------------------------------
def plan_offsets(plan: Plan, align: int) -> tuple[dict[int, int], int]:
    """Workspace offsets of the plan's temporaries, each aligned to `align` bytes, reused by liveness (the
    compiler's plan, re-made for a device whose sub-buffers need a coarser alignment)."""
    values = plan.values

    def root(i: int) -> int:
        return values[i].alias_of if values[i].kind == "alias" else i

    events: list[list[int]] = []
    for s in plan.steps:
        if s.kind == "segment":
            events += [k.args for k in s.kernels]
        else:
            events.append([i for i in s.inputs if i is not None] + s.outputs)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for t, args in enumerate(events):
        for i in args:
            first.setdefault(root(i), t)
            last[root(i)] = t
    for i in plan.outputs:
        last[root(i)] = len(events)
    live: list[tuple[int, int, int]] = []
    offsets: dict[int, int] = {}
    total = 0
    for i in sorted((i for i, v in enumerate(values) if v.kind == "temp"), key=lambda i: (first.get(i, 0), i)):
        t = first.get(i, 0)
        live = [b for b in live if b[2] >= t]
        need = -(-max(values[i].nbytes, 1) // align) * align
        offset = 0
        for off, size, _ in sorted(live):
            if off - offset >= need:
                break
            offset = max(offset, off + size)
        offsets[i] = offset
        live.append((offset, need, last.get(i, t)))
        total = max(total, offset + need)
    return offsets, total


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


class GPUCompiledModel:
    """A model compiled for a GPU target: call it with numpy arrays, or `run` a dict by input name.

    `launches` (per plan step, per kernel call, the device launches) and `temps` (each kernel's own device
    temporaries, by (kernel, buffer) name: bytes) are plain data: a saved model needs neither the compiler nor
    the loop IR. `programs` (the device programs with their loop IR) is there when compiled in this process."""

    def __init__(self, plan: Plan, weights: Mapping[int, np.ndarray], launches: list[list[list[Launch]]],
                 temps: Mapping[tuple[str, str], int], source: str, target: Target, make_device: Callable[[], Any],
                 fallback: Fallback | None = None, summary: dict | None = None,
                 programs: Mapping[str, DeviceProgram] | None = None):  # fmt: skip
        self.plan = plan
        self.source = source
        self.target = target
        self.programs = dict(programs or {})
        self.temps = dict(temps)
        self._weights = {i: np.ascontiguousarray(w) for i, w in weights.items()}
        self._fallback = fallback
        self._summary = dict(summary or {})
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
    @property
    def input_names(self) -> list[str]:
        return [self.plan.values[i].name for i in self.plan.inputs]

    @property
    def output_names(self) -> list[str]:
        return [self.plan.values[i].name for i in self.plan.outputs]

    def summary(self) -> dict:
        kernels = [k for s in self.plan.steps if s.kind == "segment" for k in s.kernels]
        return {
            **self._summary,
            "kernels": len(kernels),
            "distinct_kernels": len({k.name for k in kernels}),
            "device_launches_per_run": sum(len(c) for _, calls in self.launches for c in calls),
            "native_calls_per_run": sum(1 for s in self.plan.steps if s.kind == "segment"),
            "fallback_ops": [s.op for s in self.plan.steps if s.kind == "fallback"],
            "workspace_bytes": self.plan.workspace,
            "target": self.plan.target,
        }

    # -- running ------------------------------------------------------------------------------------------
    def _inputs(self, feeds: Feeds) -> list[np.ndarray]:
        plan = self.plan
        if isinstance(feeds, Mapping):
            missing = [n for n in self.input_names if n not in feeds]
            extra = [n for n in feeds if n not in self.input_names]
            if missing or extra:
                raise ArgumentError(f"model {plan.name}: inputs are {self.input_names}"
                                    + (f"; missing {missing}" if missing else "")
                                    + (f"; unknown {extra}" if extra else ""))  # fmt: skip
            feeds = [feeds[n] for n in self.input_names]
        if len(feeds) != len(plan.inputs):
            raise ArgumentError(
                f"model {plan.name} takes {len(plan.inputs)} inputs ({', '.join(self.input_names)}), got {len(feeds)}"
            )
        arrays = []
        for vid, x in zip(plan.inputs, feeds):
            v = plan.values[vid]
            x = np.asarray(x)
            if x.dtype != numpy_dtype(v.dtype):
                raise ArgumentError(f"input '{v.name}' has dtype {x.dtype}, expected {v.dtype}")
            if x.shape != v.shape:
                raise ArgumentError(f"input '{v.name}' has shape {x.shape}, expected {v.shape}")
            arrays.append(np.ascontiguousarray(x))
        return arrays

    def _host(self, vid: int) -> np.ndarray:
        """A host copy of a value (synchronizes)."""
        v = self.plan.values[vid]
        if v.kind == "weight" or (v.kind == "alias" and self.plan.values[v.alias_of].kind == "weight"):
            src = vid if v.kind == "weight" else v.alias_of
            return self._weights[src].reshape(v.shape).copy()
        a = np.empty(v.shape, numpy_dtype(v.dtype))
        self._device.download(self._bufs[vid], a)
        return a

    def _run(self, inputs: list[np.ndarray] | None, times: dict[int, float] | None = None) -> None:
        """Copy the inputs in (None: they are on the device already), run every step, wait for the device."""
        dev = self.device()
        for vid, x in zip(self.plan.inputs, inputs or []):
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
        if self._fallback is None:
            raise RuntimeError(f"node {s.node} ({s.op}) needs the reference fallback, which is not available")
        args = [None if i is None else self._host(i) for i in s.inputs]
        for vid, r in zip(s.outputs, self._fallback(s.op, s.attrs, args)):
            v = self.plan.values[vid]
            a = np.ascontiguousarray(np.asarray(r, numpy_dtype(v.dtype)).reshape(v.shape))
            self._device.upload(self._bufs[vid], a)

    def _outputs(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        by_input = dict(zip(self.plan.inputs, inputs))
        outs = []
        for vid in self.plan.outputs:
            v = self.plan.values[vid]
            src = v.alias_of if v.kind == "alias" else vid
            outs.append(by_input[src].reshape(v.shape).copy() if src in by_input else self._host(vid))
        return outs

    def __call__(self, *inputs: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        arrays = self._inputs(inputs)
        self._run(arrays)
        outs = self._outputs(arrays)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Inputs by graph input name in, outputs by graph output name out."""
        arrays = self._inputs(feeds)
        self._run(arrays)
        return dict(zip(self.output_names, self._outputs(arrays)))

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        return random_inputs(self.plan, seed)

    def benchmark(self, inputs: Feeds | None = None, repeat: int = 20, warmup: int = 3, copies: bool = True) -> dict:
        """Latency of whole inferences: median, mean, min (seconds). With `copies` (the default) a run copies the
        inputs in and the outputs out, as a call does; without, the inputs stay on the device and a run is the
        kernel launches (and fallback steps) until the device is done: what PyTorch eager on resident tensors does."""
        arrays = self._inputs(inputs if inputs is not None else self.random_inputs())
        self._run(arrays)
        for _ in range(warmup):
            self._run(arrays if copies else None)
        runs = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            self._run(arrays if copies else None)
            if copies:
                self._outputs(arrays)
            runs.append(time.perf_counter() - t0)
        return {"median": statistics.median(runs), "mean": statistics.fmean(runs), "min": min(runs), "runs": runs}

    def profile(self, inputs: Feeds | None = None, repeat: int = 10) -> list[dict]:
        """Per model kernel (its device launches together) and fallback step: median device time, slowest first."""
        arrays = self._inputs(inputs if inputs is not None else self.random_inputs())
        self._run(arrays)
        samples = []
        for _ in range(repeat):
            times: dict[int, float] = {}
            self._run(arrays, times)
            samples.append(times)
        rows, n = [], 0
        for s, calls in self.launches:
            entries: Sequence[Any] = s.kernels if s.kind == "segment" else [None]
            for k, launches in zip(entries, calls if s.kind == "segment" else [[]]):
                med = statistics.median(t[n] for t in samples)
                if k is None:
                    rows.append({"kernel": f"fallback:{s.op}", "ops": [s.op], "nodes": [s.node], "seconds": med,
                                 "flops": 0, "launches": 0})  # fmt: skip
                else:
                    rows.append({"kernel": k.name, "ops": k.ops, "nodes": k.nodes, "seconds": med, "flops": k.flops,
                                 "launches": len(launches)})  # fmt: skip
                n += 1
        total = sum(r["seconds"] for r in rows) or 1.0
        for r in rows:
            r["share"] = r["seconds"] / total
            r["gflops"] = r["flops"] / r["seconds"] / 1e9 if r["seconds"] > 0 and r["flops"] else 0.0
        return sorted(rows, key=lambda r: -r["seconds"])

    def profile_table(self, inputs: Feeds | None = None, top: int = 20) -> str:
        return profile_table(self.profile(inputs), top)

    def save(self, path: str | Path) -> Path:
        """A directory holding the plan, the weights, the kernels' source (and PTX for CUDA) and the launches:
        `ember.load` runs it again without the compiler (OpenCL builds the source, CUDA loads the PTX)."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        (out / "plan.json").write_text(json.dumps(self.plan.to_json(), indent=1) + "\n")
        (out / "summary.json").write_text(json.dumps(self._summary, indent=1, default=str) + "\n")
        np.savez(out / "weights.npz", **{f"v{i}": w for i, w in self._weights.items()})
        (out / ("model.cl" if self.target.kind == "opencl" else "model.cu")).write_text(self.source)
        if self.target.kind == "cuda":
            shutil.copyfile(self._summary["ptx"], out / "model.ptx")
        launches = [[[vars(la) for la in call] for call in calls] for _, calls in self.launches]
        temps = [[k, name, n] for (k, name), n in self.temps.items()]
        gpu = {"target": str(self.target), "launches": launches, "temps": temps}
        (out / "gpu.json").write_text(json.dumps(gpu, indent=1) + "\n")
        return out

    def export_c(self, directory: Any, prefix: str = "ember_model") -> None:
        raise NotImplementedError(f"export_c makes C for CPUs; this model was compiled for {self.target.kind}")

    def __repr__(self) -> str:
        s = self.summary()
        return f"GPUCompiledModel({self.plan.name}: {s['kernels']} kernels, target '{self.plan.target}')"


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


def load(path: str | Path, fallback: Fallback | None = None) -> GPUCompiledModel:
    """A GPU model saved by `GPUCompiledModel.save` (no compiler needed; OpenCL builds the saved source)."""
    d = Path(path)
    plan = Plan.from_json(json.loads((d / "plan.json").read_text()))
    gpu = json.loads((d / "gpu.json").read_text())
    with np.load(d / "weights.npz") as z:
        weights = {int(k[1:]): z[k] for k in z.files}
    summary = json.loads((d / "summary.json").read_text()) if (d / "summary.json").exists() else {}
    target = Target.parse(gpu["target"])

    def launch(la: dict) -> Launch:
        args = [(kind, a if kind == "value" else tuple(a)) for kind, a in la["args"]]
        return Launch(la["kernel"], tuple(la["grid"]), tuple(la["block"]), args, la["model_kernel"])  # type: ignore[arg-type]

    launches = [[[launch(la) for la in call] for call in calls] for calls in gpu["launches"]]
    temps = {(k, name): n for k, name, n in gpu["temps"]}
    if target.kind == "opencl":
        source = (d / "model.cl").read_text()
        dev = OpenCLDevice(source)
        summary["device"] = dev.name

        def make_device() -> Any:
            return dev
    else:
        source = (d / "model.cu").read_text()
        ptx = d / "model.ptx"
        summary["ptx"] = str(ptx)

        def make_device() -> Any:
            return CUDADevice(ptx)

    return GPUCompiledModel(plan, weights, launches, temps, source, target, make_device, fallback, summary)
