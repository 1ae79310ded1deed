"""The graph verifier: structure (definitions before use, unique names) and types (each
node's outputs match its op's shape rule). Every problem found is reported at once."""

from __future__ import annotations

from ember.graph.ir import Graph, Node, Value
from ember.ops import get_op


class GraphError(ValueError):
    """A graph that breaks an IR invariant; the message lists each problem with its node."""


MAX_LISTED = 20


def verify(graph: Graph) -> None:
    problems: list[str] = []
    _verify(graph, set(), problems)
    if problems:
        more = f"\n  ... and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
        raise GraphError(f"graph {graph.name!r} is invalid:\n  " + "\n  ".join(problems[:MAX_LISTED]) + more)


def _verify(graph: Graph, outer: set[Value], problems: list[str]) -> None:
    defined: set[Value] = set(outer) | set(graph.inputs)
    names: dict[str, Value] = {}

    def declare(v: Value, where: str) -> None:
        other = names.setdefault(v.name, v)
        if other is not v:
            problems.append(f"{where}: value name %{v.name} is defined twice")

    for v in graph.inputs:
        declare(v, "graph input")
        if v.is_constant:
            problems.append(f"graph input %{v.name} must not hold constant data")
    for c in graph.constants():
        declare(c, "constant")
    for node in graph.nodes:
        where = f"node {node.name!r} ({node.op})"
        for i, v in enumerate(node.inputs):
            if v is not None and not v.is_constant and v not in defined:
                problems.append(f"{where}: input {i} %{v.name} is used before it is defined")
        for sub in node.subgraphs():
            _verify(sub, defined, problems)
        _check_types(node, where, problems)
        for v in node.outputs:
            declare(v, where)
            if v.is_constant:
                problems.append(f"{where}: output %{v.name} must not hold constant data")
            if v in defined:
                problems.append(f"{where}: output %{v.name} is already defined")
            defined.add(v)
    for v in graph.outputs:
        if not v.is_constant and v not in defined:
            problems.append(f"graph output %{v.name} is never defined")


def _check_types(node: Node, where: str, problems: list[str]) -> None:
    try:
        opdef = get_op(node.op)
    except KeyError as e:
        problems.append(f"{where}: {e.args[0]}")
        return
    try:
        opdef.check_arity(len(node.inputs), where)
        attrs = opdef.check_attrs(node.attrs, where)
        inferred = opdef.infer(attrs, *[None if v is None else v.type for v in node.inputs])
    except Exception as e:  # a shape rule rejecting its inputs is a verification failure
        problems.append(f"{where}: {type(e).__name__}: {e}")
        return
    if len(node.outputs) > len(inferred):
        problems.append(f"{where}: has {len(node.outputs)} outputs, the op defines {len(inferred)}")
    for v, t in zip(node.outputs, inferred):
        if v.type != t:
            problems.append(f"{where}: output %{v.name} is typed {v.type} but the shape rule gives {t}")
