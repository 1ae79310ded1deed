"""FoldBatchNorm: inference BatchNormalization (and constant per-channel scale/shift) folded into the
weights and bias of the Conv or Gemm before it; a BatchNormalization with nothing to fold into becomes
a per-channel Mul and Add (which fuse with their neighbours). Each round edits through one use-def index."""

from __future__ import annotations

import numpy as np

from ember.graph.ir import Graph, Node, Uses, Value

from .cleanup import dead_code_elimination
from .util import new_constant


def _bn_scale_shift(bn: Node) -> tuple[np.ndarray, np.ndarray] | None:
    params = bn.inputs[1:5]
    if bn.attrs.get("training_mode", 0) or any(v is None or not v.is_constant for v in params):
        return None
    scale, bias, mean, var = (v.data.astype(np.float64) for v in params)  # type: ignore[union-attr]
    s = scale / np.sqrt(var + bn.attrs.get("epsilon", 1e-5))
    return s, bias - mean * s


def _channel_vector(k: np.ndarray, channels: int, rank: int) -> np.ndarray | None:
    """A constant that multiplies/adds per channel of a [N, C, ...] tensor, as a [C] vector."""
    if k.size == 1:
        return np.full(channels, float(k.ravel()[0]))
    shape = k.shape
    if len(shape) > rank:
        return None
    full = (1,) * (rank - len(shape)) + tuple(shape)
    if full[1] != channels or any(d != 1 for i, d in enumerate(full) if i != 1):
        return None
    return k.reshape(channels).astype(np.float64)


def _fold_into(uses: Uses, producer: Node, scale: np.ndarray | None, shift: np.ndarray) -> bool:
    """Rewrite producer (Conv, or a 2-D Gemm) to compute scale * y + shift per output channel."""
    w = producer.inputs[1] if len(producer.inputs) > 1 else None
    b = producer.inputs[2] if len(producer.inputs) > 2 else None
    if w is None or not w.is_constant or (b is not None and not b.is_constant):
        return False
    channels = shift.size
    wd = w.data.astype(np.float64)
    if producer.op == "Conv":
        axis_shape = (-1,) + (1,) * (wd.ndim - 1)
        old_b = np.zeros(channels) if b is None else b.data.astype(np.float64)
    elif producer.op == "Gemm" and len(producer.outputs[0].shape) == 2:
        axis_shape = (-1, 1) if producer.attrs.get("transB", 0) else (1, -1)
        wd = wd * producer.attrs.get("alpha", 1.0)
        if b is None:
            old_b = np.zeros(channels)
        elif b.data.size in (1, channels) and b.data.ndim <= 2 and b.data.shape[:-1] in ((), (1,)):
            beta = producer.attrs.get("beta", 1.0)
            old_b = np.broadcast_to(b.data.astype(np.float64).reshape(-1), (channels,)) * beta
        else:
            return False
        producer.attrs = {**producer.attrs, "alpha": 1.0, "beta": 1.0}
    else:
        return False
    if scale is not None:
        wd = wd * scale.reshape(axis_shape)
        old_b = old_b * scale
    dtype, graph = w.data.dtype, uses.graph
    uses.set_inputs(producer, [producer.inputs[0], new_constant(graph, "folded_w", wd.astype(dtype)),
                               new_constant(graph, "folded_b", (old_b + shift).astype(dtype))])  # fmt: skip
    return True


def _single_user_producer(uses: Uses, v: Value) -> Node | None:
    node = uses.producer(v)
    if node is None or len(uses.readers(v)) != 1 or v in uses.outputs or len(node.outputs) != 1:
        return None
    return node


def fold_batchnorm(graph: Graph) -> Graph:
    changed = True
    while changed:
        changed = False
        uses = Uses(graph)
        for node in list(graph.nodes):
            if node in uses.dead:
                continue
            if node.op == "BatchNormalization" and len(node.outputs) == 1:
                ss = _bn_scale_shift(node)
                if ss is None:
                    continue
                prod = _single_user_producer(uses, node.inputs[0])
                if prod is not None and _fold_into(uses, prod, *ss):
                    uses.replace_uses(node.outputs[0], prod.outputs[0])
                else:
                    _to_scale_shift(uses, node, *ss)
                changed = True
            elif node.op in ("Mul", "Add") and len(node.inputs) == 2:
                changed |= _fold_affine(uses, node)
        uses.sweep()
        graph.topo_sort()
        dead_code_elimination(graph)
    return graph


def _fold_affine(uses: Uses, node: Node) -> bool:
    """Conv/Gemm output times or plus a per-channel constant."""
    for x, k in (node.inputs, node.inputs[::-1]):
        if not k.is_constant or x.is_constant or node.outputs[0].type != x.type or len(x.shape) < 2:
            continue
        if not isinstance(x.shape[1], int):
            continue  # symbolic channels: no per-channel vector to fold
        vec = _channel_vector(k.data, x.shape[1], len(x.shape))
        prod = _single_user_producer(uses, x)
        if vec is None or prod is None:
            continue
        scale, shift = (vec, np.zeros_like(vec)) if node.op == "Mul" else (None, vec)
        if _fold_into(uses, prod, scale, shift):
            uses.replace_uses(node.outputs[0], prod.outputs[0])
            return True
    return False


def _to_scale_shift(uses: Uses, bn: Node, scale: np.ndarray, shift: np.ndarray) -> None:
    x, graph = bn.inputs[0], uses.graph
    shape = (-1,) + (1,) * (len(x.shape) - 2)
    dtype = x.type.np_dtype
    mid = Value(graph.fresh_name(bn.outputs[0].name + "_scaled"), x.type)
    mul = Node("Mul", [x, new_constant(graph, "bn_scale", scale.reshape(shape).astype(dtype))], [mid], {},
               bn.name + "_scale")  # fmt: skip
    uses.add(mul)  # appended: the round ends with a topological sort
    bn.op, bn.attrs = "Add", {}
    uses.set_inputs(bn, [mid, new_constant(graph, "bn_shift", shift.reshape(shape).astype(dtype))])
