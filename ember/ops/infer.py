"""Type inference over a graph, driven by the op entries' shape rules.

Passes that rewrite a graph call `infer_types(graph)` to recompute every node's output
types in place (inputs and constants keep theirs). A shape rule that rejects its inputs
raises GraphError naming the node."""

from __future__ import annotations

from ember.graph.ir import Graph
from ember.graph.verify import GraphError
from ember.ops.opdef import get_op


def infer_types(graph: Graph) -> None:
    for node in graph.nodes:
        where = f"node {node.name!r} ({node.op})"
        for sub in node.subgraphs():
            infer_types(sub)
        opdef = get_op(node.op)
        try:
            attrs = opdef.check_attrs(node.attrs, where)
            types = opdef.infer(attrs, *[None if v is None else v.type for v in node.inputs])
        except Exception as e:
            raise GraphError(f"graph {graph.name!r}: {where}: {type(e).__name__}: {e}") from e
        if len(types) < len(node.outputs):
            raise GraphError(f"{where} has {len(node.outputs)} outputs, {node.op} defines {len(types)}")
        for v, t in zip(node.outputs, types):
            v.type = t
