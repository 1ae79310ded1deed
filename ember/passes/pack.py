"""PackWeights: the constant B of a MatMul or Gemm packed into the GEMM template's panels at compile time.

The GEMM template (`ember.ops.nn_templates.gemm_acc`) reads B in panels [N / nr, K, nr] (nr columns
of one k contiguous, zeros past N): the register tile then loads whole vectors of B in order. When B
is a weight, packing it inside the kernel would redo a copy of the whole matrix at every call (for
a batch-64 MLP layer that copy costs as much as the product). This pass packs it once:

    MatMul(x, W)              ->  MatMulPackedB(x, pack(W))           n = N
    Gemm(x, W, c, transB=1)   ->  MatMulPackedB(x, pack(W^T), c)      alpha, beta kept

for a float x of at least `MIN_ROWS` rows (fewer rows take the unpacked plans: a fully connected
layer on one row reads W's rows directly) and a B with enough columns to fill a vector. The panel
width is `nn_templates.packed_width` for the target, the one the template picks for that B itself.
CPU targets only (GPU schedules read B as it is).
"""

from __future__ import annotations

import numpy as np

from ember.graph.ir import Graph, Node, Value
from ember.ops import nn_templates as T
from ember.ops.nn import pack_b
from ember.target import Target

MIN_ROWS = 8  # the GEMM template packs B from this many rows of A (`gemm_plan`)
FLOATS = ("float32", "float64")


def _packable(x: Value, b: np.ndarray, target: Target) -> bool:
    if x.dtype not in FLOATS or b.dtype != np.dtype(x.dtype) or len(x.shape) < 2 or b.ndim != 2:
        return False
    m, n = x.shape[-2], b.shape[1]
    lanes = T.lanes_of(x.dtype, target)
    return m >= MIN_ROWS and not n < lanes <= m // 2  # matmul_te computes few-column products transposed


def pack_weights(graph: Graph, target: Target | str | None = None) -> Graph:
    """Rewrite MatMul/Gemm nodes whose B is a constant into MatMulPackedB with B packed (see module doc)."""
    target = Target.parse(target or "c")
    if target.kind not in ("c", "llvm"):
        return graph
    names = {v.name for v in graph.values()}
    packed: dict[tuple[int, bool], Value] = {}  # (id of the weight, transposed) -> its packed constant
    nodes = []
    for node in graph.nodes:
        new = _rewrite(node, target, names, packed)
        nodes.append(new or node)
    graph.nodes = nodes
    return graph


def _rewrite(node: Node, target: Target, names: set[str], packed: dict) -> Node | None:
    if node.op == "MatMul":
        x, w = node.inputs
        c, attrs, trans = None, {"alpha": 1.0, "beta": 1.0}, False
    elif node.op == "Gemm" and not node.attrs["transA"]:
        x, w = node.inputs[:2]
        c = node.inputs[2] if len(node.inputs) > 2 else None
        attrs, trans = {"alpha": node.attrs["alpha"], "beta": node.attrs["beta"]}, bool(node.attrs["transB"])
    else:
        return None
    if x is None or w is None or not w.is_constant or w.data.ndim != 2:
        return None
    b = w.data.T if trans else w.data
    if not _packable(x, b, target):
        return None
    key = (id(w), trans)
    if key not in packed:
        name, i = f"{w.name}_packed", 0
        while name in names:
            i += 1
            name = f"{w.name}_packed_{i}"
        names.add(name)
        packed[key] = Value.constant(name, pack_b(np.ascontiguousarray(b), T.packed_width(b.shape[1], x.dtype, target)))
    inputs = [x, packed[key]] + ([c] if c is not None else [])
    return Node("MatMulPackedB", inputs, list(node.outputs), {"n": b.shape[1], **attrs}, node.name)


__all__ = ["pack_weights"]
