"""Graph verification against the op library: the structural checks of `ember.graph.verify`
plus, for each node, its op's arity, attributes and shape rule (the outputs' types must be
the ones the rule gives)."""

from __future__ import annotations

from ember.graph import verify as structural
from ember.graph.ir import Graph, Node
from ember.ops.opdef import get_op


def verify(graph: Graph) -> None:
    """Check structure and every node against its op; raise GraphError listing the problems."""
    structural.verify(graph, check_node)


def check_node(node: Node, where: str) -> list[str]:
    """Problems with `node` against its op entry: unknown op, arity, attributes, output types."""
    try:
        opdef = get_op(node.op)
    except KeyError as e:
        return [f"{where}: {e.args[0]}"]
    try:
        opdef.check_arity(len(node.inputs), where)
        attrs = opdef.check_attrs(node.attrs, where)
        inferred = opdef.infer(attrs, *[None if v is None else v.type for v in node.inputs])
    except Exception as e:  # a shape rule rejecting its inputs is a verification failure
        return [f"{where}: {type(e).__name__}: {e}"]
    problems = []
    if len(node.outputs) > len(inferred):
        problems.append(f"{where}: has {len(node.outputs)} outputs, the op defines {len(inferred)}")
    for v, t in zip(node.outputs, inferred):
        if v.type != t:
            problems.append(f"{where}: output %{v.name} is typed {v.type} but the shape rule gives {t}")
    return problems


