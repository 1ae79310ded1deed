"""The model executor: one native library, a static memory plan, and a value table.

A compiled model is a list of steps over numbered values (graph inputs, weights,
intermediates, outputs). Consecutive native kernels form a *segment*: one generated C
function that calls them in order, reading buffer addresses from a table of pointers, so a
model without fallback steps runs as a single native call per inference. Intermediates live
in one workspace at offsets fixed at compile time (buffers reused by liveness); aliases (views
such as Reshape) share their source's storage.

The executor needs no compiler: `load(path)` reads the library, `plan.json` and the weights. On the llvm
target the segment functions live in memory (`NativeCode`, a JIT engine: codegen.llvm_model) instead of a
library, and a saved model holds their LLVM IR and machine code.
"""

from __future__ import annotations

import ctypes
import json
import shutil
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..tir.dtype import numpy_dtype
from .module import ArgumentError

Fallback = Callable[[str, dict, list[np.ndarray]], list[np.ndarray]]


@dataclass
class ValueInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str  # "input" | "weight" | "temp" | "output" | "alias"
    offset: int = -1  # workspace offset of temps
    alias_of: int = -1  # for aliases: the value whose storage this one shares

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * numpy_dtype(self.dtype).itemsize


@dataclass
class KernelInfo:
    name: str  # C function
    args: list[int]  # value ids, inputs then outputs
    nodes: list[str]  # graph nodes computed by this kernel
    ops: list[str]
    flops: int = 0


@dataclass
class Step:
    kind: str  # "segment" (native kernels) or "fallback" (reference evaluation of one node)
    kernels: list[KernelInfo] = field(default_factory=list)
    function: str = ""  # segment: the generated C function
    op: str = ""  # fallback
    attrs: dict = field(default_factory=dict)
    inputs: list[int | None] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    node: str = ""


@dataclass
class Plan:
    name: str
    values: list[ValueInfo]
    inputs: list[int]
    outputs: list[int]
    steps: list[Step]
    workspace: int
    target: str
    info: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        def step(s: Step) -> dict:
            d = {"kind": s.kind}
            if s.kind == "segment":
                d |= {"function": s.function, "kernels": [vars(k) for k in s.kernels]}
            else:
                d |= {"op": s.op, "attrs": _json_attrs(s.attrs), "inputs": s.inputs, "outputs": s.outputs,
                      "node": s.node}  # fmt: skip
            return d

        return {
            "name": self.name, "values": [vars(v) | {"shape": list(v.shape)} for v in self.values],
            "inputs": self.inputs, "outputs": self.outputs, "steps": [step(s) for s in self.steps],
            "workspace": self.workspace, "target": self.target, "info": self.info,
        }  # fmt: skip

    @staticmethod
    def from_json(d: dict) -> Plan:
        values = [ValueInfo(**(v | {"shape": tuple(v["shape"])})) for v in d["values"]]
        steps = []
        for s in d["steps"]:
            if s["kind"] == "segment":
                steps.append(Step("segment", [KernelInfo(**k) for k in s["kernels"]], s["function"]))
            else:
                steps.append(Step("fallback", op=s["op"], attrs=_unjson_attrs(s["attrs"]), inputs=s["inputs"],
                                  outputs=s["outputs"], node=s["node"]))  # fmt: skip
        return Plan(d["name"], values, d["inputs"], d["outputs"], steps, d["workspace"], d["target"], d["info"])


def _json_attrs(attrs: dict) -> dict:
    out = {}
    for k, v in attrs.items():
        if hasattr(v, "nodes") and hasattr(v, "outputs"):  # a subgraph (control flow on the reference fallback)
            raise NotImplementedError(
                f"cannot save a model whose control-flow node (attribute {k!r}) runs on the reference fallback"
            )
        if isinstance(v, np.ndarray):
            out[k] = {"__ndarray__": v.tolist(), "dtype": v.dtype.name}
        elif isinstance(v, tuple):
            out[k] = {"__tuple__": [_json_attrs({"x": x})["x"] for x in v]}
        else:
            out[k] = v
    return out


def _unjson_attrs(attrs: dict) -> dict:
    out = {}
    for k, v in attrs.items():
        if isinstance(v, dict) and "__ndarray__" in v:
            out[k] = np.asarray(v["__ndarray__"], dtype=v["dtype"])
        elif isinstance(v, dict) and "__tuple__" in v:
            out[k] = tuple(_unjson_attrs({"x": x})["x"] for x in v["__tuple__"])
        else:
            out[k] = v
    return out


Feeds = Sequence[np.ndarray] | Mapping[str, Any]  # inputs in graph order, or by name


def random_inputs(plan: Plan, seed: int = 0) -> list[np.ndarray]:
    """Random arrays for a plan's inputs: normal floats, fair bools, small non-negative integers."""
    rng = np.random.default_rng(seed)
    out = []
    for vid in plan.inputs:
        v = plan.values[vid]
        dt = numpy_dtype(v.dtype)
        if dt.kind == "f":
            out.append(rng.standard_normal(v.shape).astype(dt))
        elif dt.kind == "b":
            out.append(rng.random(v.shape) < 0.5)
        else:
            out.append(rng.integers(0, 4, v.shape).astype(dt))
    return out


def profile_table(rows: list[dict], top: int = 20) -> str:
    """The `top` rows of a profile (kernel, time, share, GFLOP/s, ops) as a text table."""
    lines = [f"{'kernel':<32} {'ms':>9} {'share':>6} {'GFLOP/s':>8}  ops"]
    for r in rows[:top]:
        g = f"{r['gflops']:.1f}" if r["gflops"] else "-"
        lines.append(f"{r['kernel']:<32} {r['seconds'] * 1e3:>9.3f} {r['share']:>6.1%} {g:>8}  {'+'.join(r['ops'])}")
    return "\n".join(lines)


class NativeCode(Protocol):
    """Compiled code held in memory rather than in a shared library (the llvm target's JIT engine)."""

    def address(self, name: str) -> int: ...  # of an `int32_t name(...)` function

    def save(self, directory: Path) -> None: ...  # the files `load` rebuilds it from


class CompiledModel:
    """A compiled model: call it with numpy arrays (positional, in graph input order) or `run` a dict."""

    def __init__(
        self,
        lib: Path | str | NativeCode,
        plan: Plan,
        weights: Mapping[int, np.ndarray],
        source: str = "",
        fallback: Fallback | None = None,
        summary: dict | None = None,
    ):
        """`lib`: the path of a shared library (C backend) or in-memory code (`NativeCode`: a JIT engine)."""
        self.lib_path = Path(lib) if isinstance(lib, str | Path) else None
        self.plan = plan
        self.source = source
        self._fallback = fallback
        self._summary = dict(summary or {})
        self._lib = ctypes.CDLL(str(self.lib_path)) if self.lib_path is not None else lib
        n = len(plan.values)
        self._table = (ctypes.c_void_p * max(n, 1))()
        self._workspace = np.zeros(max(plan.workspace, 1) + 64, dtype=np.uint8)
        base = self._workspace.ctypes.data
        pad = (-base) % 64
        self._views: list[np.ndarray | None] = [None] * n
        self._weights = {i: np.ascontiguousarray(w) for i, w in weights.items()}
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
        if plan.target and self.lib_path is not None:  # (NativeCode sets its own threads)
            threads = _threads_of(plan.target)
            if threads and hasattr(self._lib, "ember_set_num_threads"):
                self._lib.ember_set_num_threads(ctypes.c_int32(threads))

    def _function(self, name: str, *argtypes: Any) -> Any:
        """A segment function `int32_t name(argtypes...)` of the library or the in-memory code."""
        if self.lib_path is None:
            return ctypes.CFUNCTYPE(ctypes.c_int32, *argtypes)(self._lib.address(name))
        fn = getattr(self._lib, name)
        fn.argtypes = list(argtypes)
        fn.restype = ctypes.c_int32
        return fn

    # -- metadata -----------------------------------------------------------------------------
    @property
    def input_names(self) -> list[str]:
        return [self.plan.values[i].name for i in self.plan.inputs]

    @property
    def output_names(self) -> list[str]:
        return [self.plan.values[i].name for i in self.plan.outputs]

    def summary(self) -> dict:
        kernels = [k for s in self.plan.steps if s.kind == "segment" for k in s.kernels]
        fallbacks = [s.op for s in self.plan.steps if s.kind == "fallback"]
        return {
            **self._summary,
            "kernels": len(kernels),
            "distinct_kernels": len({k.name for k in kernels}),
            "fallback_ops": fallbacks,
            "native_calls_per_run": sum(1 for s in self.plan.steps if s.kind == "segment"),
            "workspace_bytes": self.plan.workspace,
            "target": self.plan.target,
        }

    # -- running ------------------------------------------------------------------------------
    def _ordered(self, feeds: Mapping[str, Any]) -> list[Any]:
        """Inputs given by name, in the graph's input order; missing or unknown names raise."""
        missing = [n for n in self.input_names if n not in feeds]
        extra = [n for n in feeds if n not in self.input_names]
        if missing or extra:
            raise ArgumentError(
                f"model {self.plan.name}: inputs are {self.input_names}"
                + (f"; missing {missing}" if missing else "")
                + (f"; unknown {extra}" if extra else "")
            )
        return [feeds[n] for n in self.input_names]

    def _bind_inputs(self, feeds: Sequence[Any] | Mapping[str, Any]) -> list[np.ndarray]:
        plan = self.plan
        if isinstance(feeds, Mapping):
            feeds = self._ordered(feeds)
        if len(feeds) != len(plan.inputs):
            raise ArgumentError(
                f"model {plan.name} takes {len(plan.inputs)} inputs ({', '.join(self.input_names)}), got {len(feeds)}"
            )
        arrays = []
        for vid, x in zip(plan.inputs, feeds):
            v = plan.values[vid]
            if not isinstance(x, np.ndarray):
                x = np.asarray(x)
            if x.dtype != numpy_dtype(v.dtype):
                raise ArgumentError(f"input '{v.name}' has dtype {x.dtype}, expected {v.dtype}")
            if x.shape != v.shape:
                raise ArgumentError(f"input '{v.name}' has shape {x.shape}, expected {v.shape}")
            x = np.ascontiguousarray(x)
            arrays.append(x)
            self._views[vid] = x
            self._table[vid] = x.ctypes.data
        return arrays

    def _bind_outputs(self) -> list[np.ndarray]:
        outs = []
        for vid in self.plan.outputs:
            v = self.plan.values[vid]
            if v.kind == "output":
                a = np.empty(v.shape, dtype=numpy_dtype(v.dtype))
                self._views[vid] = a
                self._table[vid] = a.ctypes.data
            outs.append(None)
        for i, v in enumerate(self.plan.values):
            if v.kind == "alias":
                src = self._views[v.alias_of]
                self._views[i] = None if src is None else src.view(numpy_dtype(v.dtype)).reshape(v.shape)
                self._table[i] = self._table[v.alias_of]
        return outs  # type: ignore[return-value]

    def _run(self, times: list[float] | None = None) -> None:
        for s in self.plan.steps:
            if s.kind == "segment":
                fn, prof = self._segments[s.function]
                if times is None:
                    status = fn(self._table)
                else:
                    buf = (ctypes.c_double * len(s.kernels))()
                    status = prof(self._table, buf)
                    times.extend(buf)
                if status != 0:
                    raise MemoryError(f"model {self.plan.name}: native code failed (status {status})")
            else:
                t0 = time.perf_counter()
                self._run_fallback(s)
                if times is not None:
                    times.append(time.perf_counter() - t0)

    def _run_fallback(self, s: Step) -> None:
        if self._fallback is None:
            raise RuntimeError(f"node {s.node} ({s.op}) needs the reference fallback, which is not available")
        args = [None if i is None else self._views[i] for i in s.inputs]
        results = self._fallback(s.op, s.attrs, args)
        for vid, r in zip(s.outputs, results):
            view = self._views[vid]
            assert view is not None
            view[...] = r

    def _collect(self) -> list[np.ndarray]:
        outs = []
        for vid in self.plan.outputs:
            v = self.plan.values[vid]
            view = self._views[vid]
            assert view is not None
            outs.append(view if v.kind == "output" else np.array(view, copy=True).reshape(v.shape))
        return outs

    def __call__(self, *inputs: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        self._bind_inputs(inputs)
        self._bind_outputs()
        self._run()
        outs = self._collect()
        return outs[0] if len(outs) == 1 else tuple(outs)

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Inputs by graph input name in, outputs by graph output name out."""
        self._bind_inputs(self._ordered(feeds))
        self._bind_outputs()
        self._run()
        return dict(zip(self.output_names, self._collect()))

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        return random_inputs(self.plan, seed)

    def benchmark(self, inputs: Feeds | None = None, repeat: int = 20, warmup: int = 3) -> dict:
        """Latency of whole inferences: median, mean, min (seconds) over `repeat` runs."""
        self._bind_inputs(inputs if inputs is not None else self.random_inputs())
        self._bind_outputs()
        for _ in range(warmup):
            self._run()
        runs = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            self._run()
            runs.append(time.perf_counter() - t0)
        return {"median": statistics.median(runs), "mean": statistics.fmean(runs), "min": min(runs), "runs": runs}

    def profile(self, inputs: Feeds | None = None, repeat: int = 10) -> list[dict]:
        """Per-kernel (and per-fallback) median time over `repeat` runs, slowest first."""
        self._bind_inputs(inputs if inputs is not None else self.random_inputs())
        self._bind_outputs()
        self._run()
        samples: list[list[float]] = []
        for _ in range(repeat):
            times: list[float] = []
            self._run(times)
            samples.append(times)
        rows = []
        idx = 0
        for s in self.plan.steps:
            entries = s.kernels if s.kind == "segment" else [None]
            for k in entries:
                med = statistics.median(t[idx] for t in samples)
                if k is None:
                    rows.append(
                        {"kernel": f"fallback:{s.op}", "ops": [s.op], "nodes": [s.node], "seconds": med, "flops": 0}
                    )
                else:
                    rows.append({"kernel": k.name, "ops": k.ops, "nodes": k.nodes, "seconds": med, "flops": k.flops})
                idx += 1
        total = sum(r["seconds"] for r in rows) or 1.0
        for r in rows:
            r["share"] = r["seconds"] / total
            r["gflops"] = r["flops"] / r["seconds"] / 1e9 if r["seconds"] > 0 and r["flops"] else 0.0
        return sorted(rows, key=lambda r: -r["seconds"])

    def profile_table(self, inputs: Feeds | None = None, top: int = 20) -> str:
        return profile_table(self.profile(inputs), top)

    # -- persistence --------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """A directory holding the library and its C source (llvm: `NativeCode.save`), the plan and the weights."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        if self.lib_path is None:
            self._lib.save(out)
        else:
            shutil.copyfile(self.lib_path, out / "model.so")
            (out / "model.c").write_text(self.source)
        (out / "plan.json").write_text(json.dumps(self.plan.to_json(), indent=1) + "\n")
        (out / "summary.json").write_text(json.dumps(self._summary, indent=1, default=str) + "\n")
        np.savez(out / "weights.npz", **{f"v{i}": w for i, w in self._weights.items()})
        return out

    def export_c(self, directory: str | Path, prefix: str = "ember_model") -> Path:
        """Write a standalone C library (source, header, weights) a C program can link: see runtime.export."""
        from .export import export_c

        if self.lib_path is None:
            raise ValueError(f"export_c writes the model's C source, and this model was compiled for target "
                             f"'{self.plan.target}': compile it with target='c' to export it")  # fmt: skip
        return export_c(self, directory, prefix)

    def __repr__(self) -> str:
        s = self.summary()
        return f"CompiledModel({self.plan.name}: {s['kernels']} kernels, target '{self.plan.target}')"


def load(path: str | Path, fallback: Fallback | None = None) -> CompiledModel:
    """Load a model saved by `CompiledModel.save` (no compiler needed)."""
    d = Path(path)
    if not (d / "plan.json").exists():
        raise FileNotFoundError(f"{d} is not a saved Ember model (no plan.json)")
    if (d / "gpu.json").exists():  # targets opencl and cuda: runtime.gpu_model
        from .gpu_model import load as load_gpu

        return load_gpu(d, fallback)  # type: ignore[return-value]
    plan = Plan.from_json(json.loads((d / "plan.json").read_text()))
    with np.load(d / "weights.npz") as z:
        weights = {int(k[1:]): z[k] for k in z.files}
    summary = json.loads((d / "summary.json").read_text()) if (d / "summary.json").exists() else {}
    if (d / "model.ll").exists() and not (d / "model.so").exists():  # target llvm: JIT-compiled here
        from ..codegen.llvm_model import ModelJIT

        jit = ModelJIT.load(d, plan.target)
        return CompiledModel(jit, plan, weights, jit.ir_text, fallback, summary)
    source = (d / "model.c").read_text() if (d / "model.c").exists() else ""
    return CompiledModel(d / "model.so", plan, weights, source, fallback, summary)


def _threads_of(target: str) -> int | None:
    for part in target.split():
        if part.startswith("-threads="):
            return int(part.split("=", 1)[1])
    return None
