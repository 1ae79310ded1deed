"""FuseAttention: MatMul -> [scale] -> [+ mask] -> Softmax(last axis) -> MatMul as one BlockAttention node.

    s = MatMul(q, k); s = Mul(s, c) or Div(s, c)   (c a constant scalar, optional)
    s = Add(s, mask)                               (mask broadcast to the scores, optional: BERT's padding mask)
    s = Reshape(Add(Reshape(s), c))                (a constant added through views of the scores, optional:
                                                    Swin's shifted-window mask; folded into the mask)
    p = Softmax(s, axis=-1); o = MatMul(p, v)      ->  o = BlockAttention(q, k, v[, mask]) {scale}

BlockAttention computes the scores of a block of query rows, their softmax and their product with V before the
next block (`ember.templates.attention`), so the [*batch, M, N] score and probability tensors are never written
to memory: for long sequences (Whisper's 750 or 1500 frames) they are several times the cache. Taken where q, k
and v are float32 with the same batch dims (per-head products as exported by transformers), static or symbolic
(a sequence length S: the kernel's score panel is S rounded up to whole vectors, -inf past S), and the scores and
probabilities are read by nothing else. CPU targets only (the GPU schedules do not have the
template). A mask chosen by Where (GPT-2's causal mask) is not taken yet.
"""

from __future__ import annotations

import numpy as np

from ember.graph.ir import Graph, Node, Value
from ember.passes.util import new_constant
from ember.target import Target
from ember.te.tensor import size_hint

MIN_COLUMNS = 8  # scores narrower than this: the unfused kernels are as good


def _scale(node: Node, s: Value) -> float | None:
    """The factor of a Mul/Div of s by a constant scalar, None for another node."""
    if node.op not in ("Mul", "Div") or len(node.inputs) != 2:
        return None
    other = node.inputs[1] if node.inputs[0] is s else node.inputs[0]
    if other is s or not other.is_constant or other.data.size != 1 or other.data.dtype != np.float32:
        return None
    if node.op == "Div" and node.inputs[1] is not other:
        return None
    c = float(other.data.reshape(()))
    return c if node.op == "Mul" else (1.0 / c if c != 0.0 else None)


def _mask(node: Node, scores: tuple, producers: dict) -> tuple[Value | None, Value | None]:
    """(scores, mask) of an Add of a float32 mask that broadcasts to the scores' shape (static) to the output of
    a product or its scale, else (None, None)."""
    if len(node.inputs) != 2:
        return None, None
    for s, m in (node.inputs, node.inputs[::-1]):
        shape, made = m.shape, producers.get(s)
        fits = len(shape) <= len(scores) and all(d in (1, t) for d, t in zip(shape[::-1], scores[::-1]))
        by_product = made is not None and made.op in ("MatMul", "Mul", "Div")
        if by_product and s.shape == scores and m.dtype == "float32" and fits:
            return s, m
    return None, None


def _reshaped_mask(r2: Node, scores: Value, producers: dict, only_reader) -> tuple[Value, np.ndarray, list] | None:
    """Reshape -> Add(constant) -> Reshape back, the scores' producer chain of Swin's shifted windows (the scores
    viewed as [batch / windows, windows, heads, N, N] to add a mask per window): (the scores before the views, the
    constant as a mask of their shape, the three nodes), else None. The views keep the elements' order, so adding
    the constant broadcast to the viewed shape and viewed back is the same sum."""
    if r2.op != "Reshape":
        return None
    y = r2.inputs[0]
    add = producers.get(y)
    if add is None or add.op != "Add" or len(add.inputs) != 2 or not only_reader(y, r2):
        return None
    x, c = add.inputs if add.inputs[1].is_constant else add.inputs[::-1]
    r1 = producers.get(x)
    if x.is_constant or not c.is_constant or r1 is None or r1.op != "Reshape" or not only_reader(x, add):
        return None
    raw = r1.inputs[0]
    shapes = (raw.shape, x.shape, y.shape, scores.shape)
    if any(not isinstance(d, int) for sh in shapes for d in sh) or raw.shape != scores.shape or x.shape != y.shape:
        return None
    try:
        mask = np.broadcast_to(c.data, x.shape)
    except ValueError:
        return None
    return raw, mask.reshape(raw.shape).astype(np.float32), [r1, add, r2]


def fuse_attention(graph: Graph, target: Target | str | None = None) -> Graph:
    """Rewrite each MatMul -> [scale] -> Softmax -> MatMul chain of the module doc into one BlockAttention node."""
    target = Target.parse(target or "c")
    if target.kind not in ("c", "llvm"):
        return graph
    producers, consumers = graph.producers(), graph.consumers()
    outputs = set(graph.outputs)

    def only_reader(v: Value, reader: Node) -> bool:
        return v not in outputs and consumers.get(v, []) == [reader]

    replaced: dict[Node, Node] = {}
    dropped: set[Node] = set()
    for node in graph.nodes:
        if node.op != "MatMul" or node in dropped:
            continue
        p, v = node.inputs
        sm = producers.get(p)
        if sm is None or sm.op != "Softmax" or not only_reader(p, node):
            continue
        s = sm.inputs[0]
        if sm.attrs.get("axis", -1) not in (-1, len(s.shape) - 1):
            continue
        first, scale, chain, bias = producers.get(s), 1.0, [sm], None
        viewed = _reshaped_mask(first, s, producers, only_reader) if first is not None and only_reader(s, sm) else None
        if viewed is not None:  # a constant added through views of the scores (Swin's shifted windows)
            s, extra, views = viewed
            chain, first = [*views, sm], producers.get(s)
            bias = new_constant(graph, "attention_mask", extra)
        if first is not None and first.op == "Add" and only_reader(s, chain[0]):
            raw, mask = _mask(first, s.shape, producers)
            if raw is None or (viewed is not None and not mask.is_constant):
                continue
            if viewed is not None:  # both constant: one mask of the scores' shape
                mask = new_constant(graph, "attention_mask", np.broadcast_to(mask.data, s.shape) + viewed[1])
            chain, s, first, bias = [first, *chain], raw, producers.get(raw), mask
        if first is not None and first.op in ("Mul", "Div") and only_reader(s, chain[0]):
            raw = first.inputs[0] if first.inputs[1].is_constant else first.inputs[1]
            factor = _scale(first, raw)
            if factor is None:
                continue
            scale, chain, s, first = factor, [first, *chain], raw, producers.get(raw)
        if first is None or first.op != "MatMul" or not only_reader(s, chain[0]):
            continue
        q, k = first.inputs
        vals = (q, k, v)
        if not all(x.dtype == "float32" and len(x.shape) == len(q.shape) >= 2 for x in vals):
            continue
        if not q.shape[:-2] == k.shape[:-2] == v.shape[:-2] or size_hint(k.shape[-1]) < MIN_COLUMNS:
            continue
        inputs = [q, k, v] + ([bias] if bias is not None else [])
        replaced[node] = Node("BlockAttention", inputs, list(node.outputs), {"scale": scale}, node.name)
        dropped.update([first, *chain])
    if replaced:
        graph.nodes = [replaced.get(n, n) for n in graph.nodes if n not in dropped]
    return graph


__all__ = ["fuse_attention"]
