"""Constant folding, common subexpression elimination, dead code elimination."""

from __future__ import annotations

import functools
import hashlib

import numpy as np

from ember.graph.ir import Graph, Node, Uses, Value, node_reads
from ember.ops import get_op

NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                    "Bernoulli"}  # fmt: skip
FOLD_LIMIT = 1 << 22  # elements: larger results stay nodes (a broadcast to a huge shape is cheaper computed)


def fold_constant(graph: Graph) -> Graph:
    """Evaluate every node whose inputs are all constants and replace its outputs by constants."""
    kept = []
    for node in graph.nodes:
        opdef = get_op(node.op)
        present = node.present_inputs
        foldable = opdef.foldable and not node.subgraphs() and all(v.is_constant for v in present)
        if foldable and present and all(v.type.is_static for v in node.outputs) and (
                sum(v.type.size for v in node.outputs) <= max(FOLD_LIMIT, sum(v.type.size for v in present))):
            with np.errstate(all="ignore"):
                results = opdef.reference(node.attrs, *[None if v is None else v.data for v in node.inputs])
            for v, r in zip(node.outputs, results):
                v.data = np.asarray(r, dtype=v.type.np_dtype).reshape(v.type.shape)
            continue
        kept.append(node)
    graph.nodes = kept
    return graph


def _attr_key(value) -> object:
    if isinstance(value, np.ndarray):
        return ("nd", value.dtype.name, value.shape, hashlib.sha1(value.tobytes()).hexdigest())
    if isinstance(value, list | tuple):
        return tuple(_attr_key(v) for v in value)
    if isinstance(value, Graph):
        return ("graph", id(value))
    return value


def _const_key(v: Value) -> tuple:
    assert v.data is not None
    return (v.dtype, v.shape, hashlib.sha1(np.ascontiguousarray(v.data).tobytes()).hexdigest())


def eliminate_common_subexpr(graph: Graph) -> Graph:
    """Merge constants with equal data, then nodes with the same op, attributes and inputs (one pass in
    topological order: a node's inputs are merged before the node is looked at)."""
    uses = Uses(graph)
    canon: dict[tuple, Value] = {}
    for c in graph.constants():
        if c in uses.outputs:
            continue
        first = canon.setdefault(_const_key(c), c)
        if first is not c:
            uses.replace_uses(c, first)
    seen: dict[tuple, Node] = {}
    for node in list(graph.nodes):
        if node in uses.dead:
            continue
        key = (node.op, tuple(sorted((k, _attr_key(v)) for k, v in node.attrs.items())),
               tuple(id(v) for v in node.inputs), len(node.outputs))  # fmt: skip
        other = seen.setdefault(key, node)
        if other is node or node.op in NONDETERMINISTIC:
            continue
        for mine, theirs in zip(node.outputs, other.outputs):
            uses.replace_uses(mine, theirs)
        uses.dead.add(node)
    uses.sweep()
    graph.topo_sort()  # an Identity kept a merged graph output's name: it went at the end
    return dead_code_elimination(graph)


def dead_code_elimination(graph: Graph) -> Graph:
    """Keep only nodes that (transitively) produce graph outputs, and drop the unused optional outputs at the end
    of an ONNX operator's outputs (a LayerNormalization's mean and inverse deviation, a MaxPool's indices, a
    Dropout's mask): an operator computes what it is asked for, and those cost more than the result itself (the
    layer norm over 128 x 768: 0.099 ms with its three outputs, 0.026 with one)."""
    producers = graph.producers()
    live: set[Node] = set()
    stack = [producers[v] for v in graph.outputs if v in producers]
    while stack:
        node = stack.pop()
        if node in live:
            continue
        live.add(node)
        stack.extend(producers[v] for v in node_reads(node) if v in producers)
    graph.nodes = [n for n in graph.nodes if n in live]
    used = {id(v) for n in graph.nodes for v in node_reads(n)} | {id(v) for v in graph.outputs}
    for node in graph.nodes:
        required = _required_outputs(node.op)
        while len(node.outputs) > required and id(node.outputs[-1]) not in used:
            node.outputs.pop()
    return graph


@functools.cache
def _required_outputs(op: str) -> int:
    """How many leading outputs of ONNX operator `op` are not optional (all of them for an operator with variadic
    outputs, whose count means something, and for one that onnx does not define, such as Ember's own)."""
    from onnx import defs

    try:
        outputs = defs.get_schema(op).outputs
    except defs.SchemaError:
        return 1 << 30
    option = defs.OpSchema.FormalParameterOption
    if any(p.option == option.Variadic for p in outputs):  # a Split's outputs: their count is the split
        return 1 << 30
    return next((i for i, p in enumerate(outputs) if p.option == option.Optional), len(outputs))
