"""The graph IR: `Value`, `Node`, `Graph`.

A `Value` is an edge: a named tensor with a static `TensorType`. A constant is a Value
that holds numpy `data` and has no producer. A `Node` applies one operator of `ember.ops`
to input Values (`None` marks an absent optional input) and defines its output Values.
A `Graph` lists its input Values, its output Values and its nodes in topological order.

Values and nodes compare by identity, so they can key dicts; names are for people and for
the printer. Graphs are mutable: passes rewrite `graph.nodes` and node inputs in place.
Subgraphs (the bodies of If/Loop/Scan) are Graph objects stored in a node's attrs; a node
of a subgraph may read Values of the enclosing graph directly.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ember.graph.types import TensorType


@dataclass(eq=False)
class Value:
    """A named tensor edge. `data` is set for constants (weights, folded shapes)."""

    name: str
    type: TensorType
    data: np.ndarray | None = None

    def __post_init__(self):
        if self.data is not None:
            self.data = np.asarray(self.data)
            got = TensorType.of(self.data)
            if got != self.type:
                raise TypeError(f"constant %{self.name}: data is {got} but the declared type is {self.type}")

    @classmethod
    def constant(cls, name: str, data: np.ndarray) -> Value:
        data = np.asarray(data)
        return cls(name, TensorType.of(data), data)

    @property
    def is_constant(self) -> bool:
        return self.data is not None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype

    def __repr__(self) -> str:
        kind = "const " if self.is_constant else ""
        return f"Value(%{self.name}: {kind}{self.type})"


@dataclass(eq=False)
class Node:
    """One operator application: `outputs = op(inputs) {attrs}`."""

    op: str
    inputs: list[Value | None]
    outputs: list[Value]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""

    def __post_init__(self):
        self.inputs = list(self.inputs)
        self.outputs = list(self.outputs)
        if not self.name:
            self.name = self.outputs[0].name if self.outputs else self.op

    @property
    def present_inputs(self) -> list[Value]:
        return [v for v in self.inputs if v is not None]

    def subgraphs(self) -> list[Graph]:
        """Graphs held in attrs (bodies of control-flow operators)."""
        return [a for a in self.attrs.values() if isinstance(a, Graph)]

    def __repr__(self) -> str:
        return f"Node({self.name!r}: {self.op})"


@dataclass(eq=False)
class Graph:
    """Inputs, outputs, and nodes in topological order."""

    name: str
    inputs: list[Value]
    outputs: list[Value]
    nodes: list[Node] = field(default_factory=list)
    # outputs the model returns decoded on the host, by output index: {"kind": "labels", "labels": [...]} (an
    # index tensor standing for the labels it picks: string class labels) or {"kind": "zipmap", "labels": [...]}
    # (a [N, C] float tensor returned as N dicts label -> value: ONNX-ML's ZipMap)
    decoders: dict[int, dict] = field(default_factory=dict)

    # -- structure ---------------------------------------------------------------------
    def producers(self) -> dict[Value, Node]:
        """Value -> the node that defines it (graph inputs and constants have none)."""
        return {out: node for node in self.nodes for out in node.outputs}

    def consumers(self) -> dict[Value, list[Node]]:
        """Value -> the nodes that read it, in order (a node reading it twice appears once).

        Reads from inside subgraphs count for the node that owns the subgraph."""
        users: dict[Value, list[Node]] = {}
        for node in self.nodes:
            for v in node_reads(node):
                users.setdefault(v, [])
                if not users[v] or users[v][-1] is not node:
                    users[v].append(node)
        return users

    def constants(self) -> list[Value]:
        """Constant Values read by nodes or returned as outputs, in first-use order."""
        seen: dict[Value, None] = {}
        for node in self.nodes:
            for v in node_reads(node):
                if v.is_constant:
                    seen[v] = None
        for v in self.outputs:
            if v.is_constant:
                seen[v] = None
        return list(seen)

    def values(self) -> Iterator[Value]:
        """Every Value of this graph (not of subgraphs) once: inputs, constants, node outputs."""
        yield from self.inputs
        yield from self.constants()
        for node in self.nodes:
            yield from node.outputs

    def topo_sort(self) -> None:
        """Reorder `nodes` so that each node follows the producers of its inputs (stable)."""
        producers = self.producers()
        order: list[Node] = []
        state: dict[Node, int] = {}  # 1 = visiting, 2 = done
        for root in self.nodes:
            stack = [(root, iter(node_reads(root)))]
            if state.get(root):
                continue
            state[root] = 1
            while stack:
                node, it = stack[-1]
                for v in it:
                    dep = producers.get(v)
                    if dep is not None and state.get(dep) != 2:
                        if state.get(dep) == 1:
                            raise ValueError(f"graph {self.name!r} has a cycle through node {dep.name!r} ({dep.op})")
                        state[dep] = 1
                        stack.append((dep, iter(node_reads(dep))))
                        break
                else:
                    stack.pop()
                    state[node] = 2
                    order.append(node)
        self.nodes = order

    def copy(self) -> Graph:
        """A copy with fresh Value and Node objects (constant data shared, it is never written)."""
        return _copy_graph(self, {})

    def fresh_name(self, base: str) -> str:
        """A value name not yet used in this graph, derived from `base`."""
        return unique_name(base, {v.name for v in self.values()})

    def __str__(self) -> str:
        return format_graph(self)


def unique_name(base: str, taken: set[str]) -> str:
    """`base`, or `base_1`, `base_2`... the first not in `taken`; added to `taken` (for callers that name many
    values in a row and keep the set)."""
    name, i = base, 0
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    taken.add(name)
    return name


class Uses:
    """Who defines and who reads each Value of a graph, kept current by the edits made through it.

    `graph.consumers()` walks the whole graph; a pass that asked it again after every rewrite was quadratic.
    A pass builds one `Uses` (linear) and edits through it: each edit costs what it touches (a value's
    readers, a node's inputs). Nodes left without readers are marked dead (`dead`) and leave `graph.nodes`
    at `sweep()`; nodes added through `add` go at the end of `graph.nodes` (the pass sorts the graph after).
    Readers are kept per value in first-read order (a node reading a value twice is listed once)."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.producers: dict[Value, Node] = {}
        self._readers: dict[Value, dict[Node, None]] = {}
        self.outputs: set[Value] = set(graph.outputs)
        self.dead: set[Node] = set()
        for node in graph.nodes:
            self._register(node)

    def readers(self, v: Value) -> list[Node]:
        return list(self._readers.get(v, ()))

    def producer(self, v: Value | None) -> Node | None:
        return None if v is None else self.producers.get(v)

    def is_used(self, v: Value) -> bool:
        return bool(self._readers.get(v)) or v in self.outputs

    def _register(self, node: Node) -> None:
        for out in node.outputs:
            self.producers[out] = node
        for v in node_reads(node):
            self._readers.setdefault(v, {})[node] = None

    def _unregister_reads(self, node: Node) -> list[Value]:
        reads = node_reads(node)
        for v in reads:
            self._readers.get(v, {}).pop(node, None)
        return reads

    def add(self, node: Node) -> None:
        """Append a new node to the graph."""
        self.graph.nodes.append(node)
        self._register(node)

    def set_inputs(self, node: Node, inputs: list[Value | None]) -> None:
        """Give `node` new inputs; producers of the inputs it no longer reads may die."""
        old = self._unregister_reads(node)
        node.inputs = list(inputs)
        self._register(node)
        self._drop_unused(old)

    def replace_uses(self, old: Value, new: Value) -> None:
        """Make every reader of `old` (nodes, their subgraphs, graph outputs) read `new` instead, as
        `ember.passes.util.replace_uses` does; the producer of `old` dies when nothing reads it."""
        for node in self.readers(old):
            self._unregister_reads(node)
            replace_in_nodes([node], old, new)
            self._register(node)
        g, prev = self.graph, self.producers.get(old)
        if old in self.outputs:
            if new in self.producers and new not in self.outputs and not new.is_constant:
                new.name = old.name
                g.outputs = [new if v is old else v for v in g.outputs]
                self.outputs = set(g.outputs)
            else:
                self.add(Node("Identity", [new], [old], {}, f"{old.name}_identity"))  # now defines `old`
        self._drop_dead([prev] if prev is not None else [])

    def _drop_unused(self, values: list[Value]) -> None:
        """Mark dead the producers of `values` whose outputs nothing reads any more, and so on upwards."""
        self._drop_dead([p for p in map(self.producers.get, values) if p is not None])

    def _drop_dead(self, stack: list[Node]) -> None:
        while stack:
            node = stack.pop()
            mine = [v for v in node.outputs if self.producers.get(v) is node]
            if node in self.dead or any(self.is_used(v) for v in mine):
                continue
            self.dead.add(node)
            for out in mine:
                del self.producers[out]
            stack.extend(p for p in map(self.producers.get, self._unregister_reads(node)) if p is not None)

    def sweep(self) -> None:
        """Remove the dead nodes from `graph.nodes`."""
        if self.dead:
            self.graph.nodes = [n for n in self.graph.nodes if n not in self.dead]
            self.dead = set()


def replace_in_nodes(nodes: list[Node], old: Value, new: Value) -> None:
    """Replace `old` by `new` in the inputs of `nodes` and of the nodes of their subgraphs (and subgraph outputs)."""
    for node in nodes:
        node.inputs = [new if v is old else v for v in node.inputs]
        for sub in node.subgraphs():
            replace_in_nodes(sub.nodes, old, new)
            sub.outputs = [new if v is old else v for v in sub.outputs]


def node_reads(node: Node) -> list[Value]:
    """Values a node reads: its present inputs, plus outer Values its subgraphs capture."""
    reads = node.present_inputs
    for g in node.subgraphs():
        reads = reads + captured_values(g)
    return reads


def captured_values(graph: Graph) -> list[Value]:
    """Values a (sub)graph reads that it does not define itself (outer-scope captures)."""
    defined = set(graph.inputs)
    captured: dict[Value, None] = {}
    for node in graph.nodes:
        for v in node_reads(node):
            if v not in defined and not v.is_constant:
                captured[v] = None
        defined.update(node.outputs)
    for v in graph.outputs:
        if v not in defined and not v.is_constant:
            captured[v] = None
    return list(captured)


def _copy_graph(graph: Graph, vmap: dict[Value, Value]) -> Graph:
    def cp(v: Value | None) -> Value | None:
        if v is None:
            return None
        if v not in vmap:
            vmap[v] = Value(v.name, v.type, v.data)
        return vmap[v]

    inputs = [cp(v) for v in graph.inputs]
    nodes = []
    for n in graph.nodes:
        attrs = {k: (_copy_graph(a, vmap) if isinstance(a, Graph) else a) for k, a in n.attrs.items()}
        nodes.append(Node(n.op, [cp(v) for v in n.inputs], [cp(v) for v in n.outputs], attrs, n.name))
    return Graph(graph.name, inputs, [cp(v) for v in graph.outputs], nodes, dict(graph.decoders))


# -- printer ---------------------------------------------------------------------------
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9_.:/\-]+$")
SMALL_CONSTANT = 8  # constants with at most this many elements print their values


def ref(v: Value | None) -> str:
    """How a value is written in printed IR: %name (quoted when it has odd characters)."""
    if v is None:
        return "_"
    return f"%{v.name}" if _PLAIN_NAME.match(v.name) else f'%"{v.name}"'


def format_attr(value: Any) -> str:
    if isinstance(value, Graph):
        return f"<graph {value.name}>"
    if isinstance(value, np.ndarray):
        return f"<{TensorType.of(value)}>" if value.size > SMALL_CONSTANT else repr(value.tolist())
    if isinstance(value, tuple | list):
        return "[" + ", ".join(format_attr(x) for x in value) + "]"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def format_node(node: Node) -> str:
    outs = ", ".join(ref(v) for v in node.outputs)
    args = ", ".join(ref(v) for v in node.inputs)
    attrs = ", ".join(f"{k}={format_attr(v)}" for k, v in node.attrs.items())
    types = ", ".join(str(v.type) for v in node.outputs)
    return f"{outs} = {node.op}({args})" + (f" {{{attrs}}}" if attrs else "") + f" : {types}"


def format_constant(v: Value) -> str:
    assert v.data is not None
    text = f"{ref(v)} = constant : {v.type}"
    if v.data.size <= SMALL_CONSTANT:
        text += f" = {v.data.tolist()!r}"
    return text


def format_graph(graph: Graph, indent: str = "") -> str:
    params = ", ".join(f"{ref(v)}: {v.type}" for v in graph.inputs)
    lines = [f"{indent}graph {graph.name}({params}) {{"]
    inner = indent + "  "
    lines += [inner + format_constant(c) for c in graph.constants()]
    for node in graph.nodes:
        lines.append(inner + format_node(node))
        for key, sub in node.attrs.items():
            if isinstance(sub, Graph):
                lines.append(f"{inner}  {key}:")
                lines.append(format_graph(sub, inner + "    "))
    lines.append(f"{inner}return {', '.join(ref(v) for v in graph.outputs)}")
    lines.append(indent + "}")
    return "\n".join(lines)
