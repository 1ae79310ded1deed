"""BlockAttention: softmax(scale * Q @ K + bias) @ V as one operator (`ember.passes.attention` forms it from MatMul, an
optional scale, an optional added mask, Softmax and MatMul), computed in row blocks by `ember.templates.attention`."""

from __future__ import annotations

import numpy as np

from ember.graph.types import TensorType
from ember.ops.common import ShapeError, acc_array
from ember.ops.opdef import Attr, Pattern, op
from ember.ops.te_lib import lowering
from ember.te.tensor import Tensor
from ember.templates.attention import attention_te, schedule_attention


def _attention_infer(a: dict, q: TensorType, k: TensorType, v: TensorType, bias: TensorType | None = None
                     ) -> TensorType:  # fmt: skip
    if q.rank < 2 or not q.rank == k.rank == v.rank or not q.dtype == k.dtype == v.dtype:
        raise ShapeError(f"BlockAttention needs q [..., M, D], k [..., D, N], v [..., N, Dv] of one rank and dtype, "
                         f"got {q}, {k}, {v}")  # fmt: skip
    if q.shape[:-2] != k.shape[:-2] or q.shape[:-2] != v.shape[:-2]:
        raise ShapeError(f"BlockAttention: batch dims of q {q}, k {k} and v {v} differ")
    if q.shape[-1] != k.shape[-2] or k.shape[-1] != v.shape[-2]:
        raise ShapeError(f"BlockAttention: q {q} @ k {k} @ v {v} do not chain (q's last dim = k's rows, "
                         f"k's columns = v's rows)")  # fmt: skip
    scores = (*q.shape[:-1], k.shape[-1])
    if bias is not None and (bias.dtype != q.dtype or not _broadcasts(bias.shape, scores)):
        raise ShapeError(f"BlockAttention: bias {bias} does not broadcast to the scores {list(scores)} "
                         f"of q {q} @ k {k}")
    return TensorType((*q.shape[:-1], v.shape[-1]), q.dtype)


def _broadcasts(shape: tuple, to: tuple) -> bool:
    return len(shape) <= len(to) and all(d in (1, t) for d, t in zip(shape[::-1], to[::-1]))


@op("BlockAttention", Pattern.OPAQUE, infer=_attention_infer, inputs=(3, 4), attrs=[Attr("scale", "float", 1.0)])
def attention(a: dict, q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """softmax(scale * q @ k + bias, last axis) @ v, the bias (a mask) broadcast to the scores (scores and
    probabilities in float64 in this reference)."""
    s = a["scale"] * (acc_array(q) @ acc_array(k))
    s = s + acc_array(bias) if bias is not None else s
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    return (p @ acc_array(v)).astype(q.dtype)


@lowering("BlockAttention", schedule=schedule_attention)
def _attention_compute(a: dict, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None) -> Tensor:
    return attention_te(q, k, v, scale=a["scale"], bias=bias)
