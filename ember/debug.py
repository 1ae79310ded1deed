"""`ember debug`: where do Ember's numbers leave the reference's?

`debug(model, reference=...)` imports the model, runs it compiled by Ember with every node's output kept (the
graph's node outputs made graph outputs, so each is written where a reader can see it), runs a reference beside
it that also gives every intermediate tensor, and reports per imported graph node, in order, the error of its
output against the reference, flagging the first node past the tolerance and naming the kernel the node was
fused into in the normal compile (the one `ember.compile` builds: same target and passes).

References:
  numpy        Ember's own numpy reference of each operator, node by node on the imported graph (any model);
  onnxruntime  ONNX models (and TF/Keras models, through their tf2onnx ONNX), every ONNX value made an output;
  tflite       .tflite models: the TFLite interpreter's reference kernels, all tensors preserved (NHWC tensors
               that Ember keeps NCHW are compared transposed);
  torch        torch.nn.Module / ExportedProgram models: the exported program run node by node (torch.fx
               Interpreter), its values matched to Ember's by name (needs the PyTorch frontend).

Error: max |ours - ref| / max |ref| for floats; for integer tensors (quantized models), max |ours - ref| in
units (steps), flagged past `int_tolerance` (default 1: TFLite and Ember may round a tie apart).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ember.build import default_target
from ember.compiler import compile as ember_compile
from ember.compiler import import_model, lower_model
from ember.graph.ir import Graph, Value
from ember.kernels import VIEW_OPS
from ember.ops.evaluate import evaluate
from ember.runtime.model import random_arrays
from ember.target import Target

__all__ = ["REFERENCES", "DebugReport", "NodeError", "debug", "default_reference"]

REFERENCES = ("numpy", "onnxruntime", "tflite", "torch")


@dataclass
class NodeError:
    """One graph node's output against the reference."""

    index: int  # position in the imported graph
    node: str
    op: str
    value: str
    shape: tuple[int, ...]
    error: float | None  # None: the reference has no such tensor
    integer: bool
    kernel: str
    flagged: bool = False


@dataclass
class DebugReport:
    reference: str
    tolerance: float
    int_tolerance: int
    rows: list[NodeError] = field(default_factory=list)

    @property
    def first_bad(self) -> NodeError | None:
        return next((r for r in self.rows if r.flagged), None)

    def table(self, only_compared: bool = False) -> str:
        rows = [r for r in self.rows if r.error is not None or not only_compared]
        width = min(48, max([len(r.node) for r in rows] + [4]))
        lines = [f"{'#':>4}  {'node':<{width}}  {'op':<18} {'shape':<18} {'error':>10}  kernel"]
        for r in rows:
            if r.error is None:
                err = "-"
            else:
                err = f"{int(r.error)} step" + ("s" if r.error != 1 else "") if r.integer else f"{r.error:.2e}"
            mark = "  <-- first past tolerance" if r.flagged else ""
            name = r.node if len(r.node) <= width else "..." + r.node[-width + 3:]
            shape = "[" + ",".join(map(str, r.shape)) + "]"
            lines.append(f"{r.index:>4}  {name:<{width}}  {r.op:<18} {shape:<18} {err:>10}  {r.kernel}{mark}")
        bad = self.first_bad
        compared = sum(r.error is not None for r in self.rows)
        head = f"{compared} of {len(self.rows)} node outputs compared with {self.reference}"
        if bad is None:
            tail = f"{head}: all within {self.tolerance:g} (integers: {self.int_tolerance} step)"
        else:
            tail = (f"{head}: first past tolerance: node #{bad.index} {bad.node!r} ({bad.op}), in kernel "
                    f"{bad.kernel}")  # fmt: skip
        return "\n".join(lines + [tail])

    def __str__(self) -> str:
        return self.table()


def default_reference(model: Any) -> str:
    """tflite for .tflite files, torch for torch modules, onnxruntime for ONNX and TF/Keras, else numpy."""
    from ember.frontend.tensorflow import is_tensorflow
    from ember.frontend.tflite import is_tflite

    if is_tflite(model):
        return "tflite"
    if type(model).__module__.split(".")[0] == "torch":
        return "torch"
    if isinstance(model, Graph):
        return "numpy"
    return "onnxruntime" if not is_tensorflow(model) or _has("tf2onnx") else "numpy"


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# -- references: every intermediate tensor, by the Ember value it matches ----------------------------------
def _numpy_values(graph: Graph, feeds: dict) -> dict[str, np.ndarray]:
    return evaluate(graph, feeds, keep_all=True)


def _onnx_values(model: Any, feeds: dict, input_shapes: Mapping | None) -> dict[str, np.ndarray]:
    import onnx
    import onnxruntime as ort

    from ember.frontend.onnx import load_model
    from ember.frontend.tensorflow import is_tensorflow, to_onnx

    proto = to_onnx(model, input_shapes) if is_tensorflow(model) else load_model(model)[0]
    proto = onnx.shape_inference.infer_shapes(proto)
    have = {o.name for o in proto.graph.output}
    for vi in proto.graph.value_info:
        if vi.name not in have and vi.type.tensor_type.elem_type:
            proto.graph.output.append(vi)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep every value
    sess = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    wanted = {i.name for i in sess.get_inputs()}
    return dict(zip(names, sess.run(names, {k: v for k, v in feeds.items() if k in wanted})))


def _tflite_values(model: Any, feeds: dict, where: dict[str, tuple[str, bool]]) -> dict[str, np.ndarray]:
    import tensorflow as tf

    if isinstance(model, bytes | bytearray):
        kwargs = {"model_content": bytes(model)}
    else:
        kwargs = {"model_path": os.fspath(model)}
    it = tf.lite.Interpreter(**kwargs, experimental_preserve_all_tensors=True,
                             experimental_op_resolver_type=tf.lite.experimental.OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    for d in it.get_input_details():
        it.set_tensor(d["index"], feeds[d["name"]])
    it.invoke()
    out = {}
    for d in it.get_tensor_details():
        if d["name"] in where:
            name, nchw = where[d["name"]]
            try:
                x = it.get_tensor(d["index"])
            except ValueError:
                continue
            out[name] = x.transpose(0, 3, 1, 2) if nchw and x.ndim == 4 else x
    return out


def _torch_values(model: Any, feeds: dict, graph: Graph) -> dict[str, np.ndarray]:
    """Every tensor of the program the PyTorch frontend imports (exported, then decomposed as it decomposes: the
    FX node names are the graph's value names), run by torch on `feeds`."""
    import torch

    from ember.frontend.torch import decompositions, export

    args = tuple(torch.from_numpy(feeds[v.name]) for v in graph.inputs)
    program = model if isinstance(model, torch.export.ExportedProgram) else export(model, args)
    gm = program.run_decompositions(decompositions()).module()
    values: dict[str, np.ndarray] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            result = super().run_node(n)
            if isinstance(result, torch.Tensor):
                values[n.name] = result.detach().cpu().numpy()
            return result

    Recorder(gm).run(*[torch.from_numpy(feeds[v.name]) for v in graph.inputs])
    return values


# -- the comparison ---------------------------------------------------------------------------------------
def _error(ours: np.ndarray, ref: np.ndarray) -> tuple[float, bool]:
    integer = ours.dtype.kind in "iub" and ref.dtype.kind in "iub"
    if integer:
        diff = np.abs(ours.astype(np.int64) - ref.astype(np.int64))
        return float(diff.max()) if diff.size else 0.0, True
    a, b = ours.astype(np.float64), ref.astype(np.float64)
    if not np.isfinite(a).all() or not np.isfinite(b).all():
        same = np.array_equal(np.isnan(a), np.isnan(b)) and np.array_equal(a[~np.isnan(a)], b[~np.isnan(b)])
        if not same:
            return float("inf"), False
        a, b = np.nan_to_num(a), np.nan_to_num(b)
    scale = np.abs(b).max() if b.size else 0.0
    diff = np.abs(a - b).max() if a.size else 0.0
    return float(diff / scale) if scale > 0 else float(diff), False


def _kernel_of(graph: Graph, target: Target, opt_level: int, disabled: Sequence[str]) -> dict[str, str]:
    """Node name -> the kernel (or fallback step) that computes it in the normal compile."""
    lowered = lower_model(graph, target, opt_level=opt_level, disabled_passes=disabled)
    where: dict[str, str] = {}
    for step in lowered.plan.steps:
        if step.kind == "segment":
            for k in step.kernels:
                where.update(dict.fromkeys(k.nodes, k.name))
        else:
            where[step.node] = f"(reference fallback: {step.op})"
    return where


def debug(model: Any, inputs: Mapping[str, np.ndarray] | None = None, reference: str | None = None,
          target: str | Target | None = None, tolerance: float = 1e-4, int_tolerance: int = 1,
          input_shapes: Mapping[str, tuple] | None = None, opt_level: int = 3,
          disabled_passes: Sequence[str] = (), seed: int = 0, example_inputs: Any = None) -> DebugReport:  # fmt: skip
    """Run `model` compiled by Ember beside `reference` (one of REFERENCES; default `default_reference`) on
    `inputs` (random ones from `seed` when not given) and compare every graph node's output; see the module doc.
    A torch module is exported on `example_inputs` (as `ember.compile` takes them)."""
    reference = reference or default_reference(model)
    if reference not in REFERENCES:
        raise ValueError(f"unknown reference {reference!r}: use one of {', '.join(REFERENCES)}")
    where_tflite: dict[str, tuple[str, bool]] = {}
    if reference == "tflite":
        from ember.frontend.tflite import import_tflite

        graph, where_tflite = import_tflite(model, dict(input_shapes or {}))
    else:
        graph = import_model(model, dict(input_shapes or {}), example_inputs)
    specs = [(v.name, np.dtype(v.dtype), v.shape) for v in graph.inputs]
    feeds = dict(zip([n for n, _, _ in specs], random_arrays(specs, seed)))
    feeds.update({k: np.asarray(v) for k, v in (inputs or {}).items()})

    if reference == "numpy":
        ref = _numpy_values(graph, feeds)
    elif reference == "onnxruntime":
        ref = _onnx_values(model, feeds, input_shapes)
    elif reference == "tflite":
        ref = _tflite_values(model, feeds, where_tflite)
    else:
        ref = _torch_values(model, feeds, graph)

    target = Target.parse(target) if target is not None else None
    kernels = _kernel_of(graph, target or Target.parse(default_target()), opt_level, disabled_passes)
    probed = graph.copy()
    outs: dict[str, Value] = {}
    for node in probed.nodes:
        for v in node.outputs:
            if v.name in ref and not v.is_constant:
                outs.setdefault(v.name, v)
    for v in probed.outputs:
        outs.setdefault(v.name, v)
    probed.outputs = list(outs.values())
    ours = ember_compile(probed, target=target, opt_level=opt_level, disabled_passes=disabled_passes).run(feeds)

    report = DebugReport(reference, tolerance, int_tolerance)
    for index, node in enumerate(graph.nodes):
        for v in node.outputs:
            err, integer = (None, False)
            if v.name in ref and v.name in ours and np.shape(ref[v.name]) == ours[v.name].shape:
                err, integer = _error(ours[v.name], np.asarray(ref[v.name]))
            kernel = kernels.get(node.name, "(a view: no kernel)" if node.op in VIEW_OPS else "(folded or rewritten)")
            row = NodeError(index, node.name, node.op, v.name, v.shape, err, integer, kernel)
            limit = int_tolerance if integer else tolerance
            row.flagged = err is not None and err > limit and report.first_bad is None
            report.rows.append(row)
    return report
