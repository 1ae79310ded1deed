"""The numpy reference evaluator: run a graph node by node with each op's reference.

It is the oracle compiled code is checked against, the engine of import-time constant
folding, and a debugging aid (`evaluate(graph, inputs, keep_all=True)` returns every value).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ember.graph.dims import DimError, SizeVar, bind_attrs, bind_sizes, eval_shape
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
            want = v.type if v.type.is_static or not sizes else TensorType(eval_shape(v.type.shape, sizes), v.dtype)
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


def evaluate_subgraph(graph: Graph, args: list[np.ndarray], captures: dict[Value, np.ndarray]) -> list[np.ndarray]:
    """Run a subgraph (a control-flow body) on positional inputs plus captured outer values."""
    env = dict(captures)
    env.update(zip(graph.inputs, args))
    _run(graph, env, True)
    return [_read(v, env) for v in graph.outputs]


def _read(v: Value, env: dict[Value, np.ndarray]) -> np.ndarray:
    return v.data if v.is_constant else env[v]


def _run(graph: Graph, env: dict[Value, np.ndarray], check: bool, sizes: Mapping[SizeVar, int] | None = None) -> None:
    for node in graph.nodes:
        args = [None if v is None else _read(v, env) for v in node.inputs]
        env.update(zip(node.outputs, run_node(node, args, check, sizes)))
