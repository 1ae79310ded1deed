"""`ember.compile`: import a model, lower every operator through `ember.te`, build one library.

graph -> kernels (one per node with a TE compute; views like Reshape become aliases)
      -> static memory plan (workspace offsets by liveness)
      -> C source: kernel functions + one runner function per run of native kernels
      -> shared library -> CompiledModel
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .build import _deep_enough, default_target
from .codegen.c import c_symbol, codegen_c, codegen_c_unit
from .codegen.gpu import GPU_PIPELINE
from .codegen.toolchain import compile_units
from .graph.ir import Graph, Node, Value
from .ops import Pattern, get_op
from .ops.te_lib import NotLowerable
from .passes import run_passes
from .passes.fuse import pattern as pattern_of
from .runtime.executor import CompiledModel, KernelInfo, Plan, Step, ValueInfo
from .target import Target, building_for
from .te.config import CONFIG_ATTR, ConfigError, load_best
from .te.lower import lower_schedule
from .te.tensor import ComputeOp, Reduce, Tensor, compute, const, placeholder
from .templates.flat import default_schedule
from .templates.gpu import is_gpu, schedule_gpu
from .tir.transform import optimize

VIEW_OPS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "BitCast"}  # outputs share their input's bytes
ALIGN = 64


LoweringUnsupported = NotLowerable  # an op instance without a native kernel (dtype, attribute value)


def reference_fallback(op: str, attrs: dict, arrays: list[np.ndarray | None]) -> list[np.ndarray]:
    """Run one node with its numpy reference (for operators without a native kernel)."""
    return list(get_op(op).reference(attrs, *arrays))


@dataclass
class Kernel:
    name: str
    func: Any  # PrimFunc
    flops: int
    passed: list[bool]  # per input: passed as an argument (False: a constant baked into the code)


@dataclass
class KernelTE:
    """The tensor expressions of one kernel: arguments (placeholders, then outputs) and its schedule."""

    args: list[Tensor]
    outputs: list[Tensor]
    schedule: Any
    passed: list[bool]  # per node input: an argument (False: a one-element constant baked in)


def anchor_member(node: Node) -> Node | None:
    """The member whose schedule drives a node's kernel: conv/matmul over reductions over injective
    (the first of the highest rank); None when no member has a schedule."""
    members = node.attrs["body"].nodes if node.op == "Fused" else [node]
    anchor = None
    for m in members:
        if get_op(m.op).schedule is not None and (anchor is None or _RANK[pattern_of(m)] > _RANK[pattern_of(anchor)]):
            anchor = m
    return anchor


def workload_key(anchor: Node) -> str:
    """The tuning workload of an anchor node: op, input shapes and dtypes, attributes (JSON)."""
    ins = [None if v is None else [list(v.shape), v.dtype] for v in anchor.inputs]
    attrs = {k: _json_attr(v) for k, v in sorted(anchor.attrs.items()) if k != CONFIG_ATTR}
    return json.dumps([anchor.op, ins, attrs], separators=(",", ":"))


def _json_attr(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return {"ndarray": [x.dtype.name, list(x.shape)]} if x.size > 16 else x.tolist()
    if isinstance(x, Graph):
        return {"graph": x.name}
    if isinstance(x, list | tuple):
        return [_json_attr(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x if isinstance(x, str | int | float | bool | None) else repr(x)


def kernel_te(node: Node, target: Target, cfg: Any = None) -> KernelTE:
    """Build a node's kernel in `ember.te`: its op's compute, or a Fused node's members' computes
    composed (each member reads the tensors its producers computed), scheduled by the first member
    whose op has a schedule (conv, matmul, ...) or the default schedule.

    `cfg` (an `ember.te.config` ConfigSpace or ConfigEntity) goes to the anchor member's compute
    as `attrs[CONFIG_ATTR]`; None leaves every template at its fallback config."""
    if node.op == "Fused":
        body = node.attrs["body"]
        members, params, results = body.nodes, body.inputs, body.outputs
    else:
        members, params, results = [node], _distinct_inputs(node), node.outputs
    outer = _distinct_inputs(node)
    scalars = {p: o.data for p, o in zip(params, outer) if o.is_constant and o.data.size == 1}
    tensors: dict[Value, Tensor] = {}
    try:
        for i, p in enumerate(params):
            tensors[p] = _literal(scalars[p], f"c{i}") if p in scalars else placeholder(p.shape, p.dtype, name=f"in{i}")
    except TypeError as e:
        raise LoweringUnsupported(str(e)) from e
    anchor = anchor_member(node)
    for m in members:
        opdef = get_op(m.op)
        if opdef.compute is None:
            raise LoweringUnsupported(f"{m.op} has no TE compute yet")
        attrs = {**m.attrs, CONFIG_ATTR: cfg} if m is anchor and cfg is not None else m.attrs
        with building_for(target):
            outs = opdef.compute(attrs, *[None if v is None else tensors[v] for v in m.inputs])
        outs = list(outs) if isinstance(outs, list | tuple) else [outs]
        for t, v in zip(outs, m.outputs):
            if tuple(t.shape) != tuple(v.shape) or t.dtype.name != v.dtype:
                got = f"{t.dtype}{list(t.shape)}"
                raise AssertionError(f"{m.op} compute gives {got}, the shape rule says {v.type} (node {m.name})")
            tensors[v] = t
    outs = [tensors[v] for v in results]
    if is_gpu(target):  # the GPU targets' own schedules (threads, shared memory) for the same computes
        sch = schedule_gpu(outs, target)
    elif anchor is not None:
        sch = get_op(anchor.op).schedule(anchor.attrs, outs, target)
    else:
        sch = default_schedule(outs, target)
    args = [tensors[p] for p in params if p not in scalars] + outs
    return KernelTE(args, outs, sch, [p not in scalars for p in params])


_RANK = {Pattern.INJECTIVE: 0, Pattern.ELEMWISE: 0, Pattern.BROADCAST: 0, Pattern.OPAQUE: 1, Pattern.REDUCTION: 2,
         Pattern.OUT_ELEMWISE_FUSABLE: 3}  # fmt: skip


def _distinct_inputs(node: Node) -> list[Value]:
    """A node's present inputs, each once (Mul(x, x) reads one buffer)."""
    return list(dict.fromkeys(v for v in node.inputs if v is not None))


def _literal(data: np.ndarray, name: str) -> Tensor:
    """A one-element constant as a tensor whose reads become a literal once inlined."""
    value = data.reshape(()).item()
    return compute(data.shape, lambda *i: const(value, data.dtype.name), name=name)


@dataclass
class GraphLowering:
    graph: Graph
    target: Target
    allow_fallback: bool = True
    values: list[ValueInfo] = field(default_factory=list)
    ids: dict[Value, int] = field(default_factory=dict)
    weights: dict[int, np.ndarray] = field(default_factory=dict)
    kernels: dict[Any, Kernel] = field(default_factory=dict)  # dedup key -> kernel
    steps: list[Step] = field(default_factory=list)
    fallback_reasons: dict[str, str] = field(default_factory=dict)
    configs: Mapping[str, Any] = field(default_factory=dict)  # workload key -> tuned config (ember.te.config)

    def vid(self, v: Value, kind: str = "temp") -> int:
        if v not in self.ids:
            self.ids[v] = len(self.values)
            self.values.append(ValueInfo(v.name, tuple(v.shape), v.dtype, kind))
            if kind == "weight":
                self.weights[self.ids[v]] = np.ascontiguousarray(v.data)
        return self.ids[v]

    def run(self) -> None:
        g = self.graph
        for v in g.inputs:
            self.vid(v, "input")
        for v in g.constants():
            self.vid(v, "weight")
        for node in g.nodes:
            self.lower_node(node)
        if self.fallback_reasons and not self.allow_fallback:
            lines = [f"  {n}: {why}" for n, why in self.fallback_reasons.items()]
            head = f"{len(lines)} node(s) have no native kernel (fallback=False):\n"
            raise LoweringUnsupported(head + "\n".join(lines))
        for v in g.outputs:
            i = self.vid(v)
            if self.values[i].kind == "temp":
                self.values[i].kind = "output"

    def lower_node(self, node: Node) -> None:
        opdef = get_op(node.op)
        data = node.inputs[0] if node.inputs else None
        to_bool = node.op == "BitCast" and node.outputs[0].dtype == "bool"  # bytes other than 0/1 are no bools
        if node.op in VIEW_OPS and data is not None and len(node.outputs) == 1 and not to_bool:
            src = self.vid(data)
            out = self.vid(node.outputs[0], "alias")
            self.values[out].alias_of = self.values[src].alias_of if self.values[src].kind == "alias" else src
            return
        kernel = None
        if opdef.compute is not None or node.op == "Fused":
            try:
                kernel = self.kernel(node)
            except LoweringUnsupported as e:
                self.fallback_reasons[node.name] = str(e)
        else:
            self.fallback_reasons[node.name] = f"{node.op} has no TE compute yet"
        if kernel is None and node.op == "Fused":  # lower the members one by one: most may still be native
            self.fallback_reasons.pop(node.name, None)
            body = node.attrs["body"]
            vmap = dict(zip(body.inputs, node.inputs)) | dict(zip(body.outputs, node.outputs))
            for m in body.nodes:
                ins = [None if v is None else vmap.get(v, v) for v in m.inputs]
                self.lower_node(Node(m.op, ins, [vmap.get(v, v) for v in m.outputs], m.attrs, m.name))
            return
        if kernel is None:
            self.steps.append(Step("fallback", op=node.op, attrs=dict(node.attrs), node=node.name,
                                   inputs=[None if v is None else self.vid(v) for v in node.inputs],
                                   outputs=[self.vid(v) for v in node.outputs]))  # fmt: skip
            return
        ins = _distinct_inputs(node)
        args = [self.vid(v) for v, passed in zip(ins, kernel.passed) if passed] + [self.vid(v) for v in node.outputs]
        body = node.attrs["body"].nodes if node.op == "Fused" else [node]
        info = KernelInfo(kernel.name, args, [m.name for m in body], [m.op for m in body], kernel.flops)
        if self.steps and self.steps[-1].kind == "segment":
            self.steps[-1].kernels.append(info)
        else:
            self.steps.append(Step("segment", [info], f"ember_segment_{len(self.steps)}"))

    def kernel(self, node: Node) -> Kernel:
        """The kernel of a node: its op's TE compute, or for a Fused node its members' computes composed."""
        outer = _distinct_inputs(node)
        members = node.attrs["body"].nodes if node.op == "Fused" else [node]
        baked = [v.data.tobytes() if v.is_constant and v.data.size == 1 else None for v in outer]
        key = (
            tuple((m.op, _attr_key(m.attrs)) for m in members),
            tuple((v.shape, v.dtype) for v in outer),
            tuple(baked),
            tuple((v.shape, v.dtype) for v in node.outputs),  # optional outputs (Dropout's mask) change the kernel
        )
        if key in self.kernels:
            return self.kernels[key]
        te_kernel = self._kernel_te(node)
        label = node.attrs["body"].name.removeprefix("fused_") if node.op == "Fused" else node.op.lower()
        name = c_symbol(f"{label[:48]}_{len(self.kernels)}")
        passes = GPU_PIPELINE if is_gpu(self.target) else None
        func = optimize(lower_schedule(te_kernel.schedule, te_kernel.args, name), passes)
        kernel = Kernel(name, func, _flops(te_kernel.outputs), te_kernel.passed)
        self.kernels[key] = kernel
        return kernel

    def _kernel_te(self, node: Node) -> KernelTE:
        """kernel_te with the tuned config of the node's anchor workload, if the log has one."""
        anchor = anchor_member(node) if self.configs else None
        cfg = self.configs.get(workload_key(anchor)) if anchor is not None else None
        if cfg is None:
            return kernel_te(node, self.target)
        try:
            return kernel_te(node, self.target, cfg)
        except ConfigError as e:
            warnings.warn(f"tuning log: config for {node.name} ({anchor.op}) does not apply: {e}; using the fallback",
                          stacklevel=2)  # fmt: skip
            return kernel_te(node, self.target)

    def plan(self) -> int:
        """Assign workspace offsets to temps by liveness; returns the workspace size."""
        first: dict[int, int] = {}
        last: dict[int, int] = {}

        def root(i: int) -> int:
            return self.values[i].alias_of if self.values[i].kind == "alias" else i

        events: list[list[int]] = []  # the buffers each kernel call / fallback step touches, in order
        for s in self.steps:
            if s.kind == "segment":
                events += [k.args for k in s.kernels]
            else:
                events.append([i for i in s.inputs if i is not None] + s.outputs)
        for t, args in enumerate(events):
            for i in args:
                r = root(i)
                first.setdefault(r, t)
                last[r] = t
        for v in self.graph.outputs:
            last[root(self.ids[v])] = len(events)
        live: list[tuple[int, int, int]] = []  # (offset, size, last step)
        size_total = 0
        order = sorted((i for i, v in enumerate(self.values) if v.kind == "temp"), key=lambda i: (first.get(i, 0), i))
        for i in order:
            t = first.get(i, 0)
            live = [b for b in live if b[2] >= t]
            need = -(-max(self.values[i].nbytes, 1) // ALIGN) * ALIGN
            offset = 0
            for off, sz, _ in sorted(live):
                if off - offset >= need:
                    break
                offset = max(offset, off + sz)
            self.values[i].offset = offset
            live.append((offset, need, last.get(i, t)))
            size_total = max(size_total, offset + need)
        return size_total


def _attr_key(attrs: dict) -> tuple:
    def norm(x: Any) -> Any:
        if isinstance(x, np.ndarray):
            return ("nd", x.dtype.name, x.shape, x.tobytes())
        if isinstance(x, list | tuple):
            return tuple(norm(y) for y in x)
        if isinstance(x, Graph):
            return ("graph", id(x))
        return x

    return tuple(sorted((k, norm(v)) for k, v in attrs.items()))


def _flops(outs: list[Tensor]) -> int:
    """Arithmetic estimate: 2 per multiply-accumulate of reductions, 1 per element otherwise."""
    from .te.schedule import _topo_ops

    total = 0
    for op in _topo_ops([t.op for t in outs]):
        if isinstance(op, ComputeOp):
            n = int(np.prod(op.shape, dtype=np.int64))
            if isinstance(op.body, Reduce):
                n *= 2 * int(np.prod([iv.dom[1] for iv in op.reduce_axis], dtype=np.int64))
            total += n
    return total


def runner_source(steps: list[Step]) -> str:
    """C functions that call each segment's kernels in order (plain and timed variants)."""
    out = [
        "#include <time.h>",
        "static double ember_now(void) {",
        "  struct timespec ts;",
        "  clock_gettime(CLOCK_MONOTONIC, &ts);",
        "  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;",
        "}",
    ]
    for s in steps:
        if s.kind != "segment":
            continue
        for timed in (False, True):
            sig = f"int32_t {s.function}{'_profiled' if timed else ''}(void* const* v{', double* t' if timed else ''})"
            out += ["", sig + " {", "  int32_t status;"]
            for j, k in enumerate(s.kernels):
                call = f"{k.name}({', '.join(f'v[{a}]' for a in k.args)})"
                out.append(f"  // {', '.join(k.nodes)}")
                if timed:
                    out.append("  double t0 = ember_now();" if j == 0 else "  t0 = ember_now();")
                out.append(f"  if ((status = {call}) != 0) return status;")
                if timed:
                    out.append(f"  t[{j}] = ember_now() - t0;")
            out += ["  return 0;", "}"]
    return "\n".join(out) + "\n"


def compile(  # noqa: A001
    model: Any,
    target: str | Target | None = None,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    fallback: bool = True,
    opt_level: int = 3,
    disabled_passes: Sequence[str] = (),
    tuning_log: str | os.PathLike | None = None,
) -> CompiledModel:
    """Compile a model (ONNX path or ModelProto, or an ember Graph) for `target` (default: "c", or "llvm"
    where no C compiler is installed, as `ember.build`).

    `opt_level` 0..3 and `disabled_passes` choose the graph passes (`ember.passes.PASSES`); with
    `fallback=False` every node must get a native kernel (else one error lists those that do not).
    `tuning_log` (JSON lines written by `ember tune`) gives each tuned workload its best config;
    the others keep their templates' fallback configs."""
    t0 = time.perf_counter()
    target = Target.parse(target if target is not None else default_target())
    if target.kind not in BACKENDS:
        have = ", ".join(sorted(BACKENDS))
        raise NotImplementedError(f"ember.compile: no model backend for target {target.kind!r} yet (have: {have})")
    lowered = lower_model(model, target, input_shapes, fallback, opt_level, disabled_passes, tuning_log, t0)
    return BACKENDS[target.kind](lowered)


@dataclass
class LoweredModel:
    """A model after import, graph passes and lowering, before code generation: the kernels in loop IR
    (`gl.kernels`), the run plan (`plan`: values, steps, workspace offsets) and the summary so far."""

    graph: Graph
    target: Target
    gl: GraphLowering
    plan: Plan
    summary: dict
    t0: float  # when compile started (perf_counter)
    t_lower: float  # when lowering ended


def lower_model(model: Any, target: Target, input_shapes: dict | None = None, fallback: bool = True,
                opt_level: int = 3, disabled_passes: Sequence[str] = (), tuning_log: str | os.PathLike | None = None,
                t0: float | None = None) -> LoweredModel:  # fmt: skip
    """The target-independent half of `compile`: import, passes, kernels lowered to loop IR, memory plan."""
    t0 = time.perf_counter() if t0 is None else t0
    if isinstance(model, Graph):
        graph = model
    else:
        from .frontend.onnx import from_onnx

        graph = from_onnx(model, input_shapes=input_shapes)
    nodes = len(graph.nodes)
    t_import = time.perf_counter()
    graph = graph.copy()
    graph, pass_report = run_passes(graph, opt_level=opt_level, disabled=disabled_passes, target=target)
    t_passes = time.perf_counter()
    _deep_enough()
    configs = load_best(tuning_log, str(target)) if tuning_log else {}
    gl = GraphLowering(graph, target, allow_fallback=fallback, configs=configs)
    gl.run()
    workspace = gl.plan()
    t_lower = time.perf_counter()
    name = graph.name or "model"
    inputs = [gl.ids[v] for v in graph.inputs]
    outputs = [gl.ids[v] for v in graph.outputs]
    plan = Plan(name, gl.values, inputs, outputs, gl.steps, workspace, str(target))
    summary = {
        "name": name,
        "nodes": nodes,
        "nodes_after_passes": len(graph.nodes),
        "opt_level": opt_level,
        "import_seconds": t_import - t0,
        "passes_seconds": t_passes - t_import,
        "passes": pass_report,
        "lower_seconds": t_lower - t_passes,
        "fallback_reasons": gl.fallback_reasons,
        "tuned_workloads": len(configs),
    }
    return LoweredModel(graph, target, gl, plan, summary, t0, t_lower)


def _build_c(m: LoweredModel) -> CompiledModel:
    """C backend: one C unit per kernel plus the segment runners, compiled and linked into one library."""
    units, protos = [], []
    for k in m.gl.kernels.values():
        src, proto = codegen_c_unit(k.func, m.target, threads_api=False)
        units.append(src)
        protos += proto
    units.append(codegen_c([], m.target) + "\n" + "\n".join(protos) + "\n\n" + runner_source(m.gl.steps))
    lib = compile_units(units, m.target.cflags(), name="model")
    source = lib.with_suffix(".c").read_text()
    t_build = time.perf_counter()
    summary = {**m.summary, "compile_seconds": t_build - m.t0, "build_seconds": t_build - m.t_lower,
               "cc": os.environ.get("CC", "cc")}  # fmt: skip
    return CompiledModel(lib, m.plan, m.gl.weights, source, reference_fallback, summary)


def _build_llvm(m: LoweredModel) -> CompiledModel:
    """LLVM backend: the kernels and segment runners in one LLVM module, JIT-compiled (codegen.llvm_model)."""
    from .codegen.llvm_model import build_llvm_model

    return build_llvm_model(m)


def _build_gpu(m: LoweredModel) -> Any:
    """OpenCL and CUDA backends: device kernels of every kernel, one source, a GPU runtime (runtime.gpu_model)."""
    from .runtime.gpu_model import build_gpu_model

    kernels = [(k.name, k.func) for k in m.gl.kernels.values()]
    model = build_gpu_model(kernels, m.plan, m.gl.weights, m.target, reference_fallback, m.summary)
    t_build = time.perf_counter()
    model._summary.update(compile_seconds=t_build - m.t0, build_seconds=t_build - m.t_lower)
    return model


# target kind -> code generation and runtime for a lowered model
BACKENDS: dict[str, Callable[[LoweredModel], Any]] = {"c": _build_c, "llvm": _build_llvm, "opencl": _build_gpu,
                                                      "cuda": _build_gpu}  # fmt: skip


def load(path: str) -> CompiledModel:
    """Load a compiled model saved with `CompiledModel.save` (no compiler needed)."""
    from .runtime.executor import load as _load

    return _load(path, fallback=reference_fallback)
