"""Concatenation and channel splits without copies: which values are slices of another value's storage.

A Concat along an axis with only size-1 axes before it (NCHW channels at batch 1, NCHW[x]c channel blocks
at batch 1, the outer axis of anything) is one contiguous byte range per input. `concat_in_place` turns
such a Concat into `ConcatInPlace` when every input can be written straight into its range of the output
by its producer: the lowering (`ember.kernels`) then makes each input an alias of the output at its byte
offset (`runtime.plan.ValueInfo.view_offset`) and gives the concat no kernel at all. The memory plan needs
nothing more: an alias lives as long as its storage (`runtime.plan.live_ranges`).

An input is written in place when a kernel computes it: not a graph input, a constant, a graph output, a
view of another value (Reshape, a channel slice...), nor the same value twice. Concats are placed from the
last one back, so a Concat's output that is itself an input of a later Concat takes its slot there, and a
Concat whose inputs already sit, in order, at consecutive offsets of one buffer (DenseNet: each layer's
Concat is a prefix of the block's last one) becomes a view of that buffer. An input already placed
elsewhere (used by two Concats at other offsets) makes its Concat keep its copy.

`channel_view` says where a Split's or Slice's outputs start in its input when they are contiguous there
(the same condition: only size-1 axes before the split axis, step 1): the lowering makes them views.

`channel_shuffle` (before the layout pass) makes ShuffleNet's Reshape/Transpose/Reshape one `ChannelShuffle`
reading the parts of the Concat before it, or, where only convolutions read it and its Concat would be written
in place, folds the permutation into their weights and leaves the Concat alone.
"""

from __future__ import annotations

import math

import numpy as np

from ember.graph.ir import Graph, Node, Value, unique_name
from ember.graph.types import np_dtype
from ember.ops.common import norm_axis
from ember.ops.tensor import slice_bounds
from ember.target import Target
from ember.templates.gpu import is_gpu

from .cleanup import dead_code_elimination

VIEW_OPS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "BitCast"}  # outputs share their input's bytes

Slot = tuple[Value, int]  # (the value whose storage holds it, byte offset)


def _static(*vs: Value) -> bool:
    return all(v.type.is_static for v in vs)


def _itemsize(v: Value) -> int:
    return np.dtype(np_dtype(v.dtype)).itemsize


def concat_slots(node: Node) -> list[int] | None:
    """The byte offset of each input of a Concat in its output, or None when the inputs' ranges are not
    contiguous (a non-1 axis before the concat axis) or a shape is symbolic."""
    y = node.outputs[0]
    if not _static(y, *node.inputs) or len(node.outputs) != 1:
        return None
    axis = norm_axis(node.attrs["axis"], len(y.shape))
    if math.prod(y.shape[:axis]) != 1:
        return None
    offsets, off = [], 0
    for x in node.inputs:
        offsets.append(off)
        off += math.prod(x.shape) * _itemsize(x)
    return offsets


def channel_view(node: Node) -> list[int] | None:
    """Byte offsets in its input of each output of a Split or Slice whose outputs are contiguous ranges of the
    input (static shapes, only size-1 axes before the sliced axis, step 1 along it); None otherwise."""
    if node.op not in ("Split", "Slice") or not node.inputs or node.inputs[0] is None:
        return None
    x = node.inputs[0]
    if len(node.present_inputs) != 1 or not _static(x, *node.outputs) or x.dtype == "bool":
        return None
    strides = [math.prod(x.shape[k + 1 :]) * _itemsize(x) for k in range(len(x.shape))]
    if node.op == "Split":
        axis = norm_axis(node.attrs["axis"], len(x.shape))
        if math.prod(x.shape[:axis]) != 1:
            return None
        starts = np.concatenate([[0], np.cumsum(node.attrs["split"])[:-1]]).astype(int)
        return [int(s) * strides[axis] for s in starts]
    y = node.outputs[0]
    bounds = slice_bounds(tuple(x.shape), node.attrs)
    cut = [k for k, b in enumerate(bounds) if b != (0, x.shape[k], 1)]
    if not cut or math.prod(y.shape) == 0:
        return None
    axis = cut[-1]
    if bounds[axis][2] != 1 or math.prod(y.shape[:axis]) != 1:
        return None
    return [sum(b[0] * s for b, s in zip(bounds[: axis + 1], strides))]


def is_view(node: Node) -> bool:
    """Whether a node's outputs share its input's storage (no kernel writes them)."""
    if node.op in VIEW_OPS:
        return node.op != "BitCast" or node.outputs[0].dtype != "bool"
    return channel_view(node) is not None


class _Placer:
    """Slots of Concat inputs in their outputs' storage, decided from the last Concat back."""

    def __init__(self, graph: Graph):
        self.producers = graph.producers()
        self.outputs = set(graph.outputs)
        self.placed: dict[Value, Slot] = {}

    def writable(self, v: Value) -> bool:
        """Whether v's producer can write it anywhere we say (a kernel computes it, nothing else pins it)."""
        return _writable(v, self.producers, self.outputs)

    def place(self, node: Node) -> bool:
        """Slots for a Concat's inputs (and its output where its inputs already sit in one buffer); False,
        placing nothing, when some input cannot be written in place."""
        offsets = concat_slots(node)
        if offsets is None:
            return False
        y, parts = node.outputs[0], node.inputs
        if y in self.placed:
            base = self.placed[y]
        elif parts[0] in self.placed and self.writable(y):
            base = self.placed[parts[0]]
        else:
            base = (y, 0)
        want = [(base[0], base[1] + off) for off in offsets]
        if len(set(parts)) != len(parts):
            return False
        if not all(self.placed.get(p) == slot or (p not in self.placed and self.writable(p))
                   for p, slot in zip(parts, want)):  # fmt: skip
            return False
        if base[0] is not y:
            self.placed[y] = base
        self.placed.update(zip(parts, want))
        return True


def place_concats(nodes: list[Node], graph: Graph) -> dict[Value, Slot]:
    """The slots of the inputs (and outputs) of `nodes`, ConcatInPlace nodes in topological order, each of which
    `concat_in_place` found placeable: what the lowering makes into aliases."""
    placer = _Placer(graph)
    for node in reversed(nodes):
        if not placer.place(node):
            raise AssertionError(f"ConcatInPlace {node.name!r}: its inputs cannot be written in place")
    return placer.placed


def _single_reader(v: Value, readers: dict[Value, list[Node]], outputs: set[Value]) -> Node | None:
    users = readers.get(v, [])
    return users[0] if len(users) == 1 and v not in outputs else None


PERMUTABLE = {"Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Identity"}  # per element


def _channelwise(node: Node, v: Value) -> bool:
    """Whether node applies the same function to each channel of v alone (its other inputs scalars)."""
    others = [x for x in node.inputs[1:] if x is not None]
    return node.op in PERMUTABLE and node.inputs[0] is v and all(x.is_constant and x.data.size == 1 for x in others)


def _permuted_readers(y: Value, readers: dict[Value, list[Node]], outputs: set[Value]) -> list[Node] | None:
    """The nodes that a permutation of y's channels would change, when every path from y reaches a dense
    convolution through depthwise convolutions and channelwise ops only (each permutes its output as its input):
    the dense ones absorb it in their weights' input channels. None when some reader is anything else."""
    todo, found = [y], []
    while todo:
        v = todo.pop()
        if v in outputs or not readers.get(v):
            return None
        for r in readers[v]:
            if r in found:
                continue
            conv = r.op == "Conv" and r.inputs[0] is v and len(v.shape) == 4 and v not in r.inputs[1:]
            if conv and all(x is None or x.is_constant for x in r.inputs[1:]):
                depthwise = r.attrs["group"] == v.shape[1] == r.outputs[0].shape[1] and r.attrs["group"] > 1
                if r.attrs["group"] != 1 and not depthwise:
                    return None
                if depthwise:
                    todo.append(r.outputs[0])
            elif _channelwise(r, v) and len(r.outputs) == 1:
                todo.append(r.outputs[0])
            else:
                return None
            found.append(r)
    return found


def _fold_shuffle(node: Node, producers: dict[Value, Node], readers: dict[Value, list[Node]], outputs: set[Value],
                  names: set[str]) -> Node | None:
    """A ChannelShuffle whose inputs its Concat can take in place (batch 1, each computed by a kernel) and whose
    readers can absorb the permutation (`_permuted_readers`) as a Concat of its inputs:
    the dense convolutions reading it (or a depthwise one's output...) read the concatenation's channel s where
    they read the shuffle's channel inv[s], their weights permuted to match; depthwise convolutions permute their
    weights and bias, so that their outputs carry the same permutation on. Free at compile time, and the Concat
    is written in place. None where some reader cannot."""
    y, g = node.outputs[0], node.attrs["group"]
    concat = Node("Concat", list(node.inputs), [y], {"axis": 1}, node.name)
    if concat_slots(concat) is None or not all(_writable(x, producers, outputs) for x in set(node.inputs)):
        return None  # the Concat would copy: no better than the shuffle's one copy, which also picks its block
    found = _permuted_readers(y, readers, outputs)
    if found is None:
        return None
    c = y.shape[1]
    src = np.arange(c) % g * (c // g) + np.arange(c) // g  # y[:, k] is the concatenation's channel src[k]
    inv = np.argsort(src)
    for r in found:
        if r.op != "Conv":
            continue
        depthwise = r.attrs["group"] > 1
        for k in range(1, len(r.inputs)):
            w = r.inputs[k]
            if w is None or (k == 2 and not depthwise):
                continue
            data = w.data[inv] if depthwise else w.data[:, inv]
            r.inputs[k] = Value(unique_name(f"{w.name}_unshuffled", names), w.type, np.ascontiguousarray(data))
    return concat


def _writable(v: Value, producers: dict[Value, Node], outputs: set[Value]) -> bool:
    p = producers.get(v)
    return p is not None and v not in outputs and not v.is_constant and not is_view(p)


def channel_shuffle(graph: Graph) -> Graph:
    """ShuffleNet's Reshape [N, g, C/g, H, W] -> Transpose(0, 2, 1, 3, 4) -> Reshape [N, C, H, W] as one
    `ChannelShuffle(group=g)` (its own kernel: one vectorized plane copy per channel), reading the inputs of the
    channel Concat before it where only the shuffle reads that (ShuffleNet v2: concat, then shuffle). Where only
    convolutions read the shuffle (directly, or through depthwise convolutions and channelwise ops), the
    permutation is folded into their weights instead and the shuffle becomes a Concat (`_fold_shuffle`)."""
    producers, readers, outputs = graph.producers(), graph.consumers(), set(graph.outputs)
    names = {v.name for v in graph.values()}
    for k, node in enumerate(graph.nodes):
        t = producers.get(node.inputs[0]) if node.op == "Reshape" and node.inputs else None
        r1 = producers.get(t.inputs[0]) if t is not None and t.op == "Transpose" else None
        if r1 is None or r1.op != "Reshape" or _single_reader(t.outputs[0], readers, outputs) is not node:
            continue
        x, mid, y = r1.inputs[0], r1.outputs[0], node.outputs[0]
        if _single_reader(mid, readers, outputs) is not t or not _static(x, mid, y) or len(x.shape) != 4:
            continue
        n, c, h, w = x.shape
        g = mid.shape[1]
        if tuple(t.attrs["perm"]) != (0, 2, 1, 3, 4) or mid.shape != (n, g, c // g, h, w) or y.shape != x.shape:
            continue
        parts = [x]  # a channel Concat read only by the shuffle: the shuffle reads its inputs (one copy, not two)
        cat = producers.get(x)
        if cat is not None and cat.op == "Concat" and norm_axis(cat.attrs["axis"], 4) == 1 and \
                _single_reader(x, readers, outputs) is r1:  # fmt: skip
            parts = list(cat.inputs)
        shuffle = Node("ChannelShuffle", parts, [y], {"group": g}, node.name)
        graph.nodes[k] = _fold_shuffle(shuffle, producers, readers, outputs, names) or shuffle
    return dead_code_elimination(graph)


def concat_in_place(graph: Graph, target: Target | str | None = None) -> Graph:
    """Each Concat whose inputs can all be written in place becomes `ConcatInPlace` (CPU targets: the GPU
    backends keep their buffers whole)."""
    if is_gpu(Target.parse(target or "c")):
        return graph
    graph.topo_sort()
    placer = _Placer(graph)
    for k in reversed(range(len(graph.nodes))):
        node = graph.nodes[k]
        if node.op == "Concat" and placer.place(node):
            graph.nodes[k] = Node("ConcatInPlace", list(node.inputs), list(node.outputs), dict(node.attrs), node.name)
    return graph


__all__ = ["VIEW_OPS", "channel_shuffle", "channel_view", "concat_in_place", "concat_slots", "is_view", "place_concats"]
