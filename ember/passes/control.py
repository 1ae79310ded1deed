"""UnrollScan: a Scan with a static sequence length becomes its body inlined once per step.

Each step reads its slice of the scan inputs with a Gather at a constant index, threads the
state values from step to step, and the scan outputs are stacked (Unsqueeze + Concat) in the
order the directions say. Nested control flow inside the body is unrolled by the next round.
The unrolled graph runs as ordinary kernels (fused by FuseOps like any other chain).
"""

from __future__ import annotations

import numpy as np

from ember.graph.ir import Graph, Node, Value
from ember.graph.types import TensorType
from ember.ops.common import norm_axis

from .util import replace_uses

MAX_STEPS = 256  # sequence steps unrolled
MAX_NODES = 8192  # body nodes x steps


class _Builder:
    def __init__(self, graph: Graph, prefix: str):
        self.graph, self.prefix, self.nodes = graph, prefix, []
        self.used = {v.name for v in graph.values()}

    def fresh(self, base: str, t: TensorType) -> Value:
        name, k = f"{self.prefix}/{base}", 1
        while name in self.used:
            name, k = f"{self.prefix}/{base}_{k}", k + 1
        self.used.add(name)
        return Value(name, t)

    def node(
        self, op: str, inputs: list[Value | None], out_types: list[TensorType], attrs: dict, base: str
    ) -> list[Value]:
        outs = [self.fresh(f"{base}{i if len(out_types) > 1 else ''}", t) for i, t in enumerate(out_types)]
        self.nodes.append(Node(op, inputs, outs, attrs, outs[0].name))
        return outs

    def const(self, data: np.ndarray, base: str) -> Value:
        v = self.fresh(base, TensorType(tuple(data.shape), data.dtype.name))
        v.data = data
        return v

    def inline(self, body: Graph, args: list[Value], step: int) -> list[Value]:
        vmap: dict[Value, Value] = dict(zip(body.inputs, args))
        for n in body.nodes:
            outs = [self.fresh(f"{step}/{v.name}", v.type) for v in n.outputs]
            vmap.update(zip(n.outputs, outs))
            ins = [None if v is None else vmap.get(v, v) for v in n.inputs]
            self.nodes.append(Node(n.op, ins, outs, dict(n.attrs), outs[0].name if outs else n.name))
        return [vmap.get(v, v) for v in body.outputs]


def _unroll(graph: Graph, node: Node) -> bool:
    a = node.attrs
    body: Graph = a["body"]
    m = a["num_scan_inputs"]
    n = len(body.inputs) - m
    k = len(body.outputs) - n
    states, xs = node.inputs[:n], node.inputs[n : n + m]
    in_axes = [norm_axis(ax, x.type.rank) for ax, x in zip(a["scan_input_axes"] or (0,) * m, xs)]
    in_dirs = a["scan_input_directions"] or (0,) * m
    seq = xs[0].shape[in_axes[0]] if xs else 0
    if seq == 0 or seq > MAX_STEPS or seq * max(len(body.nodes), 1) > MAX_NODES:
        return False
    b = _Builder(graph, node.name)
    collected: list[list[Value]] = [[] for _ in range(k)]
    for t in range(seq):
        slices = []
        for x, ax, d in zip(xs, in_axes, in_dirs):
            idx = b.const(np.array(seq - 1 - t if d else t, np.int64), f"{t}/index")
            t_shape = x.type.shape[:ax] + x.type.shape[ax + 1 :]
            slices.append(b.node("Gather", [x, idx], [x.type.with_shape(t_shape)], {"axis": ax}, f"{t}/slice")[0])
        outs = b.inline(body, [*states, *slices], t)
        states = outs[:n]
        for j, o in enumerate(outs[n:]):
            collected[j].append(o)
    out_axes = a["scan_output_axes"] or (0,) * k
    out_dirs = a["scan_output_directions"] or (0,) * k
    results = []
    for j, (vals, target) in enumerate(zip(collected, node.outputs[n:])):
        ax = norm_axis(out_axes[j], vals[0].type.rank + 1)
        if out_dirs[j]:
            vals = vals[::-1]
        parts = [b.node("Unsqueeze", [v], [v.type.with_shape(v.shape[:ax] + (1,) + v.shape[ax:])], {"axes": (ax,)},
                        f"out{j}/u")[0] for v in vals]  # fmt: skip
        results.append(b.node("Concat", parts, [target.type], {"axis": ax}, f"out{j}")[0])
    index = graph.nodes.index(node)
    graph.nodes[index : index + 1] = b.nodes
    for old, new in zip(node.outputs, [*states, *results]):
        replace_uses(graph, old, new)
    return True


def unroll_scan(graph: Graph) -> Graph:
    """Unroll every Scan whose steps fit the limits (repeatedly, for nested ones)."""
    changed = True
    while changed:
        changed = False
        for node in list(graph.nodes):
            if node.op == "Scan" and node in graph.nodes and _unroll(graph, node):
                changed = True
    graph.topo_sort()
    return graph
