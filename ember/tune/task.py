"""Tuning tasks: one per distinct tunable workload of a model, built by the compiler's own lowering.

A `Task` knows how to build its kernel for any config of its space (`instantiate`), how many
floating-point operations one call does, and how to compute the right answer (`reference`):
the numpy references of the operators it lowers. Tasks of a model come from `extract_tasks`, which
runs the compiler's import and graph passes and calls `ember.kernels.kernel_te` with a
`ConfigSpace` on each kernel: a kernel whose anchor template declares knobs is tunable. Kernels with
the same anchor workload (op, input shapes and dtypes, attributes) are one task, whatever epilogue
was fused after the anchor; the task's weight counts them. `Task.from_op` makes a task for one
operator without a model (benches, tests), `Task.from_template` one for a template function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ember.graph.ir import Graph, Node, Value
from ember.graph.types import TensorType
from ember.kernels import VIEW_OPS, LoweringUnsupported, anchor_member, distinct_inputs, kernel_te, workload_key
from ember.kernels import flops as count_flops
from ember.ops import get_op
from ember.target import Target
from ember.te.config import ConfigBase, ConfigSpace

TemplateFn = Callable[[ConfigBase], tuple[Any, list]]  # cfg -> (schedule, args: inputs then outputs)


@dataclass
class Task:
    """One tunable workload on one target. Exactly one of `node` (a graph node, maybe Fused, lowered
    by `kernel_te`) and `template_fn` (cfg -> (schedule, args)) says how to build it."""

    name: str
    workload: str
    target: str
    node: Node | None = None
    template_fn: TemplateFn | None = None
    reference_fn: Callable[[list[np.ndarray]], list[np.ndarray]] | None = None
    weight: int = 1
    template: str = ""
    n_outputs: int = 1
    _space: ConfigSpace | None = field(default=None, repr=False)
    _flops: int | None = field(default=None, repr=False)
    feature_cache: dict = field(default_factory=dict, repr=False)  # config index -> loop-IR features

    def __getstate__(self) -> dict:
        return {**self.__dict__, "feature_cache": {}}  # candidates travel to build workers without it

    # -- building ------------------------------------------------------------------------------
    def instantiate(self, cfg: ConfigBase | None) -> tuple[Any, list]:
        """(schedule, argument tensors) of the kernel for cfg (None: the fallback config)."""
        if self.template_fn is not None:
            return self.template_fn(cfg if cfg is not None else ConfigSpace())
        k = kernel_te(self.node, Target.parse(self.target), cfg)
        return k.schedule, k.args

    @property
    def space(self) -> ConfigSpace:
        if self._space is None:
            space = ConfigSpace()
            _, args = self.instantiate(space)
            self._space = space
            self.template = self.template or space.template
            if self._flops is None:
                self._flops = count_flops(args[len(args) - self.n_outputs :])
        return self._space

    @property
    def flops(self) -> int:
        if self._flops is None:
            _, args = self.instantiate(None)
            self._flops = count_flops(args[len(args) - self.n_outputs :])
        return self._flops

    def arg_types(self) -> list[tuple[tuple[int, ...], str]]:
        """(shape, dtype) of each kernel argument, inputs then outputs."""
        _, args = self.instantiate(None)
        return [(tuple(int(d) for d in t.shape), t.dtype.name) for t in args]

    # -- checking ------------------------------------------------------------------------------
    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        out = []
        for shape, dt in self.arg_types()[: -self.n_outputs]:
            if np.issubdtype(np.dtype(dt), np.floating):
                out.append(rng.standard_normal(shape).astype(dt))
            elif dt == "bool":
                out.append(rng.integers(0, 2, shape).astype(bool))
            else:
                out.append(rng.integers(-4, 5, shape).astype(dt))
        return out

    def reference(self, inputs: list[np.ndarray]) -> list[np.ndarray] | None:
        """The right outputs for inputs (numpy references of the lowered ops); None when unknown
        (then the fallback config's output is the reference)."""
        if self.reference_fn is not None:
            return [np.asarray(y) for y in self.reference_fn(inputs)]
        if self.node is None:
            return None
        try:
            return _node_reference(self.node, inputs)
        except Exception:  # an op without a numpy reference for these inputs: use the fallback's output
            return None

    def to_json(self) -> dict:
        return {"name": self.name, "workload": self.workload, "template": self.template, "target": self.target,
                "weight": self.weight, "flops": self.flops, "space": len(self.space)}  # fmt: skip

    # -- constructors --------------------------------------------------------------------------
    @staticmethod
    def from_node(node: Node, target: str | Target, weight: int = 1) -> Task:
        anchor = anchor_member(node)
        if anchor is None:
            raise ValueError(f"node {node.name} ({node.op}) has no scheduled operator to tune")
        node = portable_node(node)
        ins = ", ".join(f"{v.dtype}{list(v.shape)}" for v in anchor.inputs if v is not None)
        name = f"{anchor.op}({ins})"
        return Task(name, workload_key(anchor), str(Target.parse(target)), node=node, weight=weight,
                    n_outputs=len(node.outputs))  # fmt: skip

    @staticmethod
    def from_op(op: str, inputs: Sequence[tuple[Sequence[int], str] | Sequence[int]], attrs: dict | None = None,
                target: str | Target = "c", outputs: int | None = None) -> Task:  # fmt: skip
        """A task for one operator on inputs given as shapes (float32) or (shape, dtype) pairs; `outputs`: how
        many of its outputs the kernel computes (default all; 1 for a MaxPool without Indices, a
        LayerNormalization without Mean and InvStdDev, as models mostly use them)."""
        return Task.from_node(op_node(op, inputs, attrs, outputs), target)

    @staticmethod
    def from_template(name: str, template_fn: TemplateFn, target: str | Target = "c",
                      reference_fn: Callable | None = None, n_outputs: int = 1) -> Task:  # fmt: skip
        """A task for a template function cfg -> (schedule, args); give it a module-level function
        (measurement builds candidates in other processes)."""
        return Task(name, f"template:{name}", str(Target.parse(target)), template_fn=template_fn,
                    reference_fn=reference_fn, n_outputs=n_outputs)  # fmt: skip


def op_node(op: str, inputs: Sequence[tuple[Sequence[int], str] | Sequence[int]], attrs: dict | None = None,
            outputs: int | None = None) -> Node:  # fmt: skip
    """A graph node of one operator on inputs given as shapes (float32) or (shape, dtype) pairs, with its first
    `outputs` outputs (default: all of them; ONNX's optional outputs are the trailing ones)."""
    opdef = get_op(op)
    a = opdef.check_attrs(dict(attrs or {}))
    vals = []
    for i, spec in enumerate(inputs):
        shape, dt = (spec, "float32") if spec and isinstance(spec[0], int) else spec
        vals.append(Value(f"x{i}", TensorType(tuple(shape), dt)))
    outs = opdef.infer(a, *[v.type for v in vals])
    if outputs is not None and not 1 <= outputs <= len(outs):
        raise ValueError(f"{op} has {len(outs)} output(s); asked for {outputs}")
    return Node(op, vals, [Value(f"y{i}", t) for i, t in enumerate(outs[:outputs])], a, name=op.lower())


def portable_node(node: Node) -> Node:
    """A copy of a node whose inputs keep shapes and one-element constants only (kernel_te bakes
    those in); large constants (weights) become plain arguments, so the task pickles small."""

    def strip(v: Value | None) -> Value | None:
        if v is None or not v.is_constant or v.data.size == 1:
            return v
        return Value(v.name, v.type)

    return Node(node.op, [strip(v) for v in node.inputs], list(node.outputs), dict(node.attrs), node.name)


def _node_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Run a (Fused) node's members with their numpy references on the kernel's input arrays."""
    if node.op == "Fused":
        body = node.attrs["body"]
        params, members, results = body.inputs, body.nodes, body.outputs
    else:
        params, members, results = distinct_inputs(node), [node], node.outputs
    outer = distinct_inputs(node)
    env: dict[Value, np.ndarray] = {}
    it = iter(arrays)
    for p, o in zip(params, outer):
        env[p] = o.data if o.is_constant and o.data.size == 1 else next(it)
    for m in members:
        outs = get_op(m.op).reference(m.attrs, *[None if v is None else env.get(v, v.data) for v in m.inputs])
        env.update(zip(m.outputs, outs))
    return [np.asarray(env[v]) for v in results]


def passed_graph(model: Any, target: Target, input_shapes: dict | None = None, opt_level: int = 3,
                 disabled_passes: Sequence[str] = (), algorithms: Any = None, passes: Sequence | None = None,
                 ) -> Graph:  # fmt: skip
    """The graph the compiler lowers for `model` (ONNX path / ModelProto / ember Graph): after its passes, each
    convolution's implementation taken from `algorithms` where it names one (`ember.passes.layout.algorithm_choices`:
    a dict, or an `AlgorithmChoices` that also collects the convolutions met); `passes`: these instead of all."""
    from ember.passes import run_passes
    from ember.passes.layout import algorithm_choices

    if isinstance(model, Graph):
        graph = model.copy()
    else:
        from ember.frontend.onnx import from_onnx

        graph = from_onnx(model, input_shapes=input_shapes)
    with algorithm_choices(algorithms):
        return run_passes(graph, opt_level=opt_level, disabled=disabled_passes, target=target, passes=passes)[0]


def extract_tasks(model: Any, target: str | Target = "c", input_shapes: dict | None = None, opt_level: int = 3,
                  disabled_passes: Sequence[str] = (), algorithms: dict | None = None) -> list[Task]:  # fmt: skip
    """One Task per distinct tunable workload of a model (ONNX path / ModelProto / ember Graph),
    from the graph the compiler lowers (after its passes; `algorithms`: measured convolution implementations),
    with its weight (kernels that use it). Tasks are ordered by their share of the model's arithmetic, largest
    first."""
    target = Target.parse(target)
    graph = passed_graph(model, target, input_shapes, opt_level, disabled_passes, algorithms)
    tasks: dict[str, Task] = {}
    for node in graph.nodes:
        if node.op in VIEW_OPS or (node.op != "Fused" and get_op(node.op).compute is None):
            continue
        anchor = anchor_member(node)
        if anchor is None:
            continue
        key = workload_key(anchor)
        if key in tasks:
            tasks[key].weight += 1
            continue
        task = Task.from_node(node, target)
        try:
            space = task.space
        except (LoweringUnsupported, NotImplementedError, TypeError, ValueError):
            continue  # not lowered natively here: nothing to tune
        if space.knobs:
            tasks[key] = task
    return sorted(tasks.values(), key=lambda t: -t.flops * t.weight)
