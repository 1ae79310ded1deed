"""The structural graph verifier: definitions before use, unique value names, no constant
data on defined values, graph outputs defined. Every problem found is reported at once.

Checking each node against its operator's rules (arity, attributes, shape rule) needs the op
library, which sits above the graph IR: `ember.ops.verify.verify` passes its `check_node` to
this verifier.
"""

from __future__ import annotations

from collections.abc import Callable

from ember.graph.ir import Graph, Node, Value


class GraphError(ValueError):
    """A graph that breaks an IR invariant; the message lists each problem with its node."""


MAX_LISTED = 20

# (node, "node 'name' (Op)") -> problems found with that node
NodeCheck = Callable[[Node, str], list[str]]


def verify(graph: Graph, check_node: NodeCheck | None = None) -> None:
    """Check `graph`'s structure, and each node with `check_node` if given; raise GraphError listing problems."""
    problems: list[str] = []
    _verify(graph, set(), check_node, problems)
    if problems:
        more = f"\n  ... and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
        raise GraphError(f"graph {graph.name!r} is invalid:\n  " + "\n  ".join(problems[:MAX_LISTED]) + more)


def _verify(graph: Graph, outer: set[Value], check_node: NodeCheck | None, problems: list[str]) -> None:
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
            _verify(sub, defined, check_node, problems)
        if check_node is not None:
            problems.extend(check_node(node, where))
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
