"""The numpy reference evaluator: run a graph node by node with each op's reference.

It is the oracle compiled code is checked against, the engine of import-time constant
folding, and a debugging aid (`evaluate(graph, inputs, keep_all=True)` returns every value).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ember.graph.dims import DimError, SizeVar, bind_attrs, bind_sizes, eval_shape, size_vars
from ember.graph.ir import Graph, Node, Value
from ember.graph.types import TensorType
from ember.ops.opdef import get_op


class InputError(ValueError):
    """Inputs that do not match the graph's inputs (names, shapes, dtypes)."""


class EvaluationError(RuntimeError):
    """An operator reference failed or produced a value of the wrong type."""


def check_inputs(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Inputs as arrays, checked against the graph's input names, shapes and dtypes."""
    expected = {v.name: v for v in graph.inputs}
    missing = [n for n in expected if n not in inputs]
    unknown = [n for n in inputs if n not in expected]
    problems = []
    if missing:
        problems.append("missing input(s) " + ", ".join(f"{n!r} ({expected[n].type})" for n in missing))
    if unknown:
        problems.append(f"unknown input(s) {', '.join(map(repr, unknown))}; the graph takes {', '.join(expected)}")
    arrays = {}
    for name, v in expected.items():
        if name not in inputs:
            continue
        x = np.asarray(inputs[name])
        got = x.dtype.name
        if got != v.type.dtype:
            problems.append(f"input {name!r} has dtype {got}, expected {v.type.dtype} (convert with .astype)")
        elif v.type.is_static and tuple(x.shape) != v.type.shape:
            problems.append(f"input {name!r} has shape {list(x.shape)}, expected {list(v.type.shape)}")
        arrays[name] = x
    if not problems:
        try:
            input_sizes(graph, arrays)
        except DimError as e:
            problems.append(str(e))
    if problems:
        raise InputError(f"graph {graph.name!r}: " + "; ".join(problems))
    return arrays


def input_sizes(graph: Graph, arrays: Mapping[str, np.ndarray]) -> dict[SizeVar, int]:
    """The values of a symbolic graph's size variables, read from its inputs (empty for a static graph)."""
    pending = [(f"input {v.name!r}", v.type.shape, arrays[v.name].shape) for v in graph.inputs
               if not v.type.is_static and v.name in arrays]  # fmt: skip
    return bind_sizes(pending) if pending else {}


def run_node(node: Node, args: list[np.ndarray | None], check: bool = True,
             sizes: Mapping[SizeVar, int] | None = None) -> list[np.ndarray]:  # fmt: skip
    """Evaluate one node with its reference; check the results against the node's outputs. `sizes` are the
    values of the size variables in the node's attributes and types (a symbolic graph at one size)."""
    opdef = get_op(node.op)
    attrs = bind_attrs(node.attrs, sizes) if sizes else node.attrs
    try:
        with np.errstate(all="ignore"):
            results = opdef.reference(attrs, *args)
    except Exception as e:
        raise EvaluationError(f"node {node.name!r} ({node.op}) failed in its reference: {type(e).__name__}: {e}") from e
    if len(results) < len(node.outputs):
        raise EvaluationError(f"node {node.name!r} ({node.op}) returned {len(results)} outputs for {len(node.outputs)}")
    results = [np.asarray(r) for r in results[: len(node.outputs)]]
    if check:
        for v, r in zip(node.outputs, results):
            got = TensorType.of(r)
            if not v.type.is_static and not (sizes and all(d in sizes for d in size_vars(v.type.shape))):
                continue  # (sizes this graph's inputs do not give: one a node reads from values)
            want = v.type if v.type.is_static else TensorType(eval_shape(v.type.shape, sizes), v.dtype)
            if got != want:
                raise EvaluationError(f"node {node.name!r} ({node.op}) produced {got} for %{v.name}, typed {v.type}")
    return results


def evaluate(
    graph: Graph, inputs: Mapping[str, np.ndarray], *, check: bool = True, keep_all: bool = False
) -> dict[str, np.ndarray]:
    """Run `graph` on named numpy inputs; return its outputs by name (every value if keep_all)."""
    arrays = check_inputs(graph, inputs)
    env: dict[Value, np.ndarray] = {v: arrays[v.name] for v in graph.inputs}
    _run(graph, env, check, input_sizes(graph, arrays))
    values = env if keep_all else dict.fromkeys(graph.outputs)
    return {v.name: _read(v, env) for v in values}


def evaluate_subgraph(graph: Graph, args: list[np.ndarray], captures: dict[Value, np.ndarray],
                      check: bool = True) -> list[np.ndarray]:  # fmt: skip
    """Run a subgraph (a control-flow body) on positional inputs plus captured outer values; `check`: each
    result against its value's type (a loop checks its first iteration: the types are the same in every one)."""
    env = dict(captures)
    env.update(zip(graph.inputs, args))
    sizes = None
    if check:  # (a body typed in the outer graph's size variables: their values from the arguments)
        pending = [(f"{v.name!r}", v.type.shape, np.shape(a)) for v, a in env.items()
                   if not v.is_constant and not v.type.is_static]  # fmt: skip
        try:
            sizes = bind_sizes(pending) if pending else None
        except DimError as e:
            raise EvaluationError(f"subgraph {graph.name!r}: {e}") from None
    _run(graph, env, check, sizes)
    return [_read(v, env) for v in graph.outputs]


def _read(v: Value, env: dict[Value, np.ndarray]) -> np.ndarray:
    return v.data if v.is_constant else env[v]


def _run(graph: Graph, env: dict[Value, np.ndarray], check: bool, sizes: Mapping[SizeVar, int] | None = None) -> None:
    for node in graph.nodes:
        args = [None if v is None else _read(v, env) for v in node.inputs]
        env.update(zip(node.outputs, run_node(node, args, check, sizes)))


SHAPE_READERS = ("Shape", "Size")  # ops that read only their input's shape


@dataclass(frozen=True, eq=False)
class ComputedOperand:
    """An operand that nodes compute from graph inputs (`Pad`'s pads from a `shape` input, a window's length from
    its size), re-evaluated on the host from the inputs' values by the nodes' references: what the run time reads
    sizes from (`ember.graph.dims.ValueSizeVar.operands`); the nodes also stay in the graph for the kernels."""

    value: Value
    nodes: tuple[Node, ...]  # in graph order, each reading graph inputs, constants or an earlier node
    inputs: tuple[Value, ...]  # the graph inputs they read

    def __str__(self) -> str:
        return f"{self.value.name} (computed from {', '.join(repr(v.name) for v in self.inputs)})"

    @property
    def needs(self) -> list[SizeVar]:
        """The size variables whose values it reads (the dims of the symbolic values whose shape it takes)."""
        return size_vars([n.inputs[0].type.shape for n in self.nodes
                          if n.op in SHAPE_READERS and not n.inputs[0].type.is_static])  # fmt: skip

    def __call__(self, arrays: Mapping[str, np.ndarray], sizes: Mapping[SizeVar, int] | None = None) -> np.ndarray:
        """The operand's value from the inputs' values by name, and the values of the size variables bound so far
        (a Shape of a symbolic value reads its dims)."""
        env: dict[Value, np.ndarray] = {}
        for node in self.nodes:
            if node.op in SHAPE_READERS and not node.inputs[0].type.is_static:
                shape = eval_shape(node.inputs[0].type.shape, sizes or {})
                env[node.inputs[0]] = np.broadcast_to(np.zeros((), node.inputs[0].type.np_dtype), shape)
        for v in self.inputs:
            if v.name not in arrays:
                raise ValueError(f"{self} reads input '{v.name}', which the model does not take")
            env[v] = np.asarray(arrays[v.name])
        try:
            for node in self.nodes:
                env.update(zip(node.outputs, run_node(node, [None if v is None else _read(v, env) for v in node.inputs],
                                                      check=False)))  # fmt: skip
        except EvaluationError as e:
            raise ValueError(f"{self}: {e}") from None
        return _read(self.value, env)


def computed_operand(value: Value, producers: Mapping[Value, Node], inputs: list[Value],
                     max_elements: int = 1024) -> ComputedOperand | None:  # fmt: skip
    """`value` as a `ComputedOperand` when the nodes behind it read only constants and graph `inputs` of static
    shape and at most `max_elements` elements in all, and every value they make has a static type; else None."""
    nodes: dict[Node, None] = {}
    reads: dict[Value, None] = {}
    stack, seen = [value], set()
    while stack:
        v = stack.pop()
        if v in seen or v.is_constant:
            continue
        seen.add(v)
        node = producers.get(v)
        if node is None:
            if v not in inputs or not v.type.is_static:
                return None
            reads[v] = None
            continue
        if not all(o.type.is_static for o in node.outputs) or any(isinstance(a, Graph) for a in node.attrs.values()):
            return None
        nodes[node] = None
        if node.op not in SHAPE_READERS or node.inputs[0].type.is_static:
            stack.extend(node.present_inputs)  # (the shape of a symbolic value is read from the sizes)
    if not nodes or sum(v.type.size for v in reads) > max_elements:
        return None
    order = {v: i for i, v in enumerate(inputs)}
    depth: dict[Node, int] = {}

    def position(node: Node) -> int:  # a topological order: every node after those it reads
        if node not in depth:
            deps = [producers[v] for v in node.present_inputs if producers.get(v) in nodes]
            depth[node] = 1 + max((position(d) for d in deps), default=0)
        return depth[node]

    ranked = sorted(nodes, key=position)
    return ComputedOperand(value, tuple(ranked), tuple(sorted(reads, key=order.__getitem__)))
