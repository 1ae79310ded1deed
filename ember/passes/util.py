"""Small graph-editing helpers shared by the passes."""

from __future__ import annotations

import numpy as np

from ember.graph.ir import Graph, Node, Value, replace_in_nodes


def replace_uses(graph: Graph, old: Value, new: Value) -> None:
    """Make every reader of `old` (nodes, subgraph nodes, graph outputs) read `new` instead.

    A graph output keeps its name: when `new` is a plain intermediate it takes `old`'s name,
    otherwise an Identity node keeps the output named as before."""
    replace_in_nodes(graph.nodes, old, new)
    if old in graph.outputs:
        producers = graph.producers()
        if new in producers and new not in graph.outputs and not new.is_constant:
            new.name = old.name
            graph.outputs = [new if v is old else v for v in graph.outputs]
        else:
            ident = Node("Identity", [new], [old], {}, f"{old.name}_identity")
            graph.nodes.append(ident)


def constant_value(v: Value | None) -> np.ndarray | None:
    return None if v is None or not v.is_constant else v.data


def is_scalar_constant(v: Value | None, value: float) -> bool:
    """v is a constant whose every element equals `value`."""
    data = constant_value(v)
    return data is not None and data.size > 0 and bool(np.all(data == value))


def single_consumer(graph: Graph, v: Value, consumers: dict[Value, list[Node]]) -> Node | None:
    users = consumers.get(v, [])
    if len(users) != 1 or v in graph.outputs:
        return None
    return users[0]


def new_constant(graph: Graph, base: str, data: np.ndarray) -> Value:
    return Value.constant(graph.fresh_name(base), np.ascontiguousarray(data))
