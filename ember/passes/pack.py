"""PackWeights: the constant B of a MatMul or Gemm packed into the GEMM template's panels at compile time.

The GEMM template (`ember.templates.nn.gemm_acc`) reads B in panels [N / nr, K, nr] (nr columns
of one k contiguous, zeros past N): the register tile then loads whole vectors of B in order. When B
is a weight, packing it inside the kernel would redo a copy of the whole matrix at every call (for
a batch-64 MLP layer that copy costs as much as the product). This pass packs it once:

    MatMul(x, W)              ->  MatMulPackedB(x, pack(W))           n = N
    Gemm(x, W, c, transB=1)   ->  MatMulPackedB(x, pack(W^T), c)      alpha, beta kept

for a float x of at least `MIN_ROWS` rows, its batch dims counted (`_fold_rows` makes them rows of one
2-d product), and a B with enough columns to fill a vector. The panel width is
`ember.templates.nn.packed_width` for the target, the one the template picks for that B itself. Fewer rows
(a fully connected layer at batch 1..7) with a B of at least `SKINNY_MIN_WEIGHT` elements make a skinny
product: B is packed in the wider panels of the template's skinny plan (`ember.templates.nn.skinny_plan`),
which stream it once at memory bandwidth whatever its transposition.
CPU targets only (GPU schedules read B as it is).
"""

from __future__ import annotations

import numpy as np

from ember.graph.dims import dim_product
from ember.graph.ir import Graph, Node, Value, unique_name
from ember.ops import Pattern
from ember.ops.matmul import pack_b
from ember.target import Target
from ember.te.tensor import prod_hint, prod_low
from ember.templates import nn as T

from .fuse import pattern

MIN_ROWS = 8  # the GEMM template packs B from this many rows of A (`gemm_plan`)
SKINNY_MIN_WEIGHT = 1 << 16  # fewer rows: B packed for the skinny plan from this many elements (below: in cache)
FLOATS = ("float32", "float64")


def _packable(x: Value, b: np.ndarray, target: Target) -> bool:
    if x.dtype not in FLOATS or b.dtype != np.dtype(x.dtype) or len(x.shape) < 2 or b.ndim != 2:
        return False
    m, n = prod_hint(x.shape[:-1]), b.shape[1]  # batch dims fold into the rows (`_fold_rows`); symbolic: hint
    lanes = T.lanes_of(x.dtype, target)
    if m < MIN_ROWS:  # a skinny product: packed when B is large enough to be worth streaming in panels
        return n >= lanes and b.size >= SKINNY_MIN_WEIGHT
    return not n < lanes <= m // 2  # matmul_te computes few-column products transposed


def _rows(x: Value) -> int:
    return prod_hint(x.shape[:-1])


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
    _fold_rows(graph, names)
    return graph


def _fold_rows(graph: Graph, names: set[str]) -> None:
    """x [*batch, M, K] @ B packed: one product of prod(batch) * M rows (the GEMM's row tiles then span the
    batch: ConvNeXt's last stage multiplies 1 x 7 x 7 x 768 by its weights, 7 rows per batch index). x is
    viewed as [R, K] and the product computed as [R, N]; the elementwise ops that follow it alone (bias,
    activation, residual add) move to the 2-d view too, so that they still fuse into the product, and one
    view gives the last of them its original shape back."""
    consumers = graph.consumers()
    outputs = set(graph.outputs)
    replaced: dict[Node, list[Node]] = {}
    dropped: set[Node] = set()
    for node in graph.nodes:
        if node.op != "MatMulPackedB" or len(node.inputs) != 2 or len(node.inputs[0].shape) <= 2:
            continue
        x, wp = node.inputs
        shape = node.outputs[0].shape
        rows = (dim_product(shape[:-1]), shape[-1])
        new: list[Node] = []
        x2 = _view(x, (rows[0], x.shape[-1]), f"{x.name}_rows", names, new)
        cur = node.outputs[0]
        cur2 = Value(unique_name(f"{cur.name}_rows", names), cur.type.with_shape(rows))
        new.append(Node("MatMulPackedB", [x2, wp], [cur2], dict(node.attrs), node.name))
        while cur not in outputs and len(consumers.get(cur, [])) == 1:
            c = consumers[cur][0]
            if (c in dropped or pattern(c) not in (Pattern.ELEMWISE, Pattern.BROADCAST) or len(c.outputs) != 1
                    or c.outputs[0].shape != shape):  # fmt: skip
                break
            others = [u for u in c.inputs if u is not None and u is not cur]
            if not all(u.shape == shape or _per_column(u.shape, shape[-1]) for u in others):
                break
            ins = []
            for u in c.inputs:
                if u is None or u is cur:
                    ins.append(cur2 if u is cur else None)
                elif u.shape == shape:
                    ins.append(_view(u, rows, f"{u.name}_rows", names, new))
                else:
                    ins.append(u if len(u.shape) <= 1 else _view(u, u.shape[-1:], f"{u.name}_row", names, new))
            out2 = Value(unique_name(f"{c.outputs[0].name}_rows", names), c.outputs[0].type.with_shape(rows))
            new.append(Node(c.op, ins, [out2], dict(c.attrs), c.name))
            dropped.add(c)
            cur, cur2 = c.outputs[0], out2
        new.append(Node("Reshape", [cur2], [cur], {"shape": shape}, unique_name(f"{cur.name}_view", names)))
        replaced[node] = new
    if replaced:
        graph.nodes = [m for n in graph.nodes if n not in dropped for m in replaced.get(n, [n])]
        graph.topo_sort()


def _per_column(shape: tuple[int, ...], n: int) -> bool:
    """Whether an operand of this shape broadcasts along the rows only (a scalar, or one value per column)."""
    return all(d == 1 for d in shape[:-1]) and (not shape or shape[-1] in (1, n))


def _view(v: Value, to: tuple[int, ...], base: str, names: set[str], new: list[Node]) -> Value:
    """v reshaped to `to`: a constant re-shaped, else a Reshape node (a view) appended to `new`."""
    if v.is_constant:
        return Value.constant(unique_name(base, names), v.data.reshape(to))
    out = Value(unique_name(base, names), v.type.with_shape(to))
    new.append(Node("Reshape", [v], [out], {"shape": to}, out.name))
    return out


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
    # a skinny product's panels are wider, as are those of symbolic rows that may be skinny
    width = T.packed_width(b.shape[1], x.dtype, target, rows=_rows(x), rows_low=prod_low(x.shape[:-1]))
    key = (id(w), trans, width)
    if key not in packed:
        panels = pack_b(np.ascontiguousarray(b), width)
        packed[key] = Value.constant(unique_name(f"{w.name}_packed", names), panels)
    inputs = [x, packed[key]] + ([c] if c is not None else [])
    return Node("MatMulPackedB", inputs, list(node.outputs), {"n": b.shape[1], **attrs}, node.name)


__all__ = ["pack_weights"]
