"""bfloat16 matrix product and convolution on weights packed at compile time: BF16MatMulPacked, BF16ConvPacked.

`ember.passes.integer` rewrites the bf16 models `ember.quantize(..., precision="bf16")` writes (a layer reads its
activation through Cast(float32, Cast(bfloat16, x)) and its weight, stored as bfloat16, through a Cast to float32)
into these. Both compute

    y = float32(sum over k of bf16(x)[k] * W[k, j]) (+ bias[j])

with bf16(x) the activation rounded to bfloat16 on the fly (round to nearest even, as ONNX's Cast), W bfloat16
packed as [Np / nb, K / 2, nb, 2] (`ember.templates.int8.pack_pairs`: per panel of nb columns, pairs of k per
column, the layout AVX-512 BF16's vdpbf16ps reads), K in the order (kh, kw, channel) with the channels padded to
2 for a convolution, and float32 accumulation (`dot_bf16`). Each product of two bfloat16 values is exact in
float32: the result differs from the float product of the rounded operands only in the order of the sums.
"""

from __future__ import annotations

import math

import numpy as np

from ember import te
from ember.graph.types import TensorType, np_dtype
from ember.ops.common import ShapeError, spatial_attrs, window_out_dim
from ember.ops.conv import conv_nd
from ember.ops.opdef import Attr, Pattern, op
from ember.ops.rows import ravel, unravel
from ember.ops.te_lib import lowering
from ember.te.config import CONFIG_ATTR
from ember.te.tensor import Tensor
from ember.templates import int8 as I8
from ember.templates import nn as T

OUT = Pattern.OUT_ELEMWISE_FUSABLE
CONV = [Attr("n", "int"), Attr("kernel_shape", "ints"), Attr("strides", "ints"), Attr("pads", "ints"),
        Attr("dilations", "ints")]  # fmt: skip


def _check(name: str, x: TensorType, wp: TensorType, bias: TensorType | None, n: int, k: int) -> None:
    if x.dtype != "float32" or wp.dtype != "bfloat16" or wp.rank != 4 or wp.shape[3] != 2:
        raise ShapeError(f"{name} needs float32 x and bfloat16 packed weights [Np/nb, K/2, nb, 2], got {x} and {wp}")
    if wp.shape[1] * 2 != k or not (wp.shape[0] - 1) * wp.shape[2] < n <= wp.shape[0] * wp.shape[2]:
        raise ShapeError(f"{name}: packed weights {wp} do not make a [{k}, {n}] matrix")
    if bias is not None and (bias.dtype != "float32" or bias.shape != (n,)):
        raise ShapeError(f"{name}: the bias must be float32[{n}], got {bias}")


def _bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16 (nearest even), as float64 for exact products."""
    return x.astype(np_dtype("bfloat16")).astype(np.float64)


def _mm_infer(a: dict, x: TensorType, wp: TensorType, bias: TensorType | None = None) -> TensorType:
    if x.rank < 2:
        raise ShapeError(f"BF16MatMulPacked needs x [..., M, K], got {x}")
    _check("BF16MatMulPacked", x, wp, bias, a["n"], -(-x.shape[-1] // 2) * 2)
    return TensorType((*x.shape[:-1], a["n"]), "float32")


@op("BF16MatMulPacked", OUT, infer=_mm_infer, inputs=(2, 3), attrs=[Attr("n", "int"), Attr("tile_rows", "int", 0)])
def bf16_matmul_packed(a: dict, x: np.ndarray, wp: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """x [..., M, K] rounded to bfloat16 times the packed bfloat16 weights [K, n] (+ bias), float32 (module doc)."""
    w = I8.unpack_weight(wp, a["n"])[: x.shape[-1]].astype(np.float64)
    y = _bf16(x) @ w
    return (y if bias is None else y + bias.astype(np.float64)).astype(np.float32)


def _conv_geometry(a: dict, x: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
    strides, pads, dil = spatial_attrs(a, 2)
    out = tuple(window_out_dim(x[2 + i], a["kernel_shape"][i], strides[i], (pads[i], pads[i + 2]), dil[i])
                for i in range(2))  # fmt: skip
    return out, -(-x[1] // 2) * 2


def _conv_infer(a: dict, x: TensorType, wp: TensorType, bias: TensorType | None = None) -> TensorType:
    if x.rank != 4:
        raise ShapeError(f"BF16ConvPacked needs a 4-d x [N, C, H, W], got {x}")
    out, cp = _conv_geometry(a, x.shape)
    _check("BF16ConvPacked", x, wp, bias, a["n"], math.prod(a["kernel_shape"]) * cp)
    return TensorType((x.shape[0], a["n"], *out), "float32")


@op("BF16ConvPacked", OUT, infer=_conv_infer, inputs=(2, 3), attrs=CONV)
def bf16_conv_packed(a: dict, x: np.ndarray, wp: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """2-d convolution (group 1) of x rounded to bfloat16 with packed bfloat16 weights (+ bias), float32."""
    (oh, ow), cp = _conv_geometry(a, x.shape)
    kh, kw = a["kernel_shape"]
    xp = np.zeros((x.shape[0], cp, *x.shape[2:]))
    xp[:, : x.shape[1]] = _bf16(x)
    w = I8.unpack_weight(wp, a["n"]).astype(np.float64).reshape(kh, kw, cp, a["n"]).transpose(3, 2, 0, 1)
    y = conv_nd(xp, w, {**a, "group": 1})
    if bias is not None:
        y = y + bias.astype(np.float64).reshape(1, -1, 1, 1)
    return y.astype(np.float32)


def _to_bf16(v):
    return te.cast(v, "bfloat16")


def _epilogue(acc_at, bias: Tensor | None):
    if bias is None:
        return lambda idx, j: acc_at(idx)
    return lambda idx, j: acc_at(idx) + bias[j]


@lowering("BF16MatMulPacked", schedule=T.schedule_nn)
def _bf16_matmul_compute(a: dict, x: Tensor, wp: Tensor, bias: Tensor | None = None) -> Tensor:
    *batch, m, k = x.shape
    kp = wp.shape[1] * 2

    def row(i, _r, _s, kk):
        v = _to_bf16(x[(*unravel(i, (*batch, m)), kk)])
        return v if kp == k else te.if_then_else(kk < k, v, te.const(0, "bfloat16"))

    A = I8.rows_stage((math.prod(batch) * m, 1, 1, kp), row, "rows_bf16")
    acc = I8.bf16_acc(A, wp, name="bf16_acc", cfg=a.get(CONFIG_ATTR), rows=m, tile_rows=a.get("tile_rows", 0))
    epi = _epilogue(lambda idx: acc[ravel(idx[:-1], (*batch, m)), idx[-1]], bias)
    nd = len(batch) + 2
    attrs = {"template": "int8_gemm", "acc": acc, "row_axes": (nd - 2,), "col_axis": nd - 1}
    return te.compute((*batch, m, a["n"]), lambda *idx: epi(idx, idx[-1]), name="bf16_matmul", attrs=attrs)


@lowering("BF16ConvPacked", schedule=T.schedule_nn)
def _bf16_conv_compute(a: dict, x: Tensor, wp: Tensor, bias: Tensor | None = None) -> Tensor:
    n_, c, h, w = x.shape
    (oh, ow), cp = _conv_geometry(a, x.shape)
    kh, kw = a["kernel_shape"]
    (sh, sw), pads, (dh, dw) = spatial_attrs(a, 2)

    def patch(i, r, s, ch):
        b, p = i // (oh * ow), i % (oh * ow)
        ih, iw = (p // ow) * sh - pads[0] + r * dh, (p % ow) * sw - pads[1] + s * dw
        inside = te.all(ch < c, ih >= 0, ih < h, iw >= 0, iw < w)
        return te.if_then_else(inside, _to_bf16(x[b, ch, ih, iw]), te.const(0, "bfloat16"))

    A = I8.rows_stage((n_ * oh * ow, kh, kw, cp), patch, "im2col_bf16")
    acc = I8.bf16_acc(A, wp, name="bf16_conv_acc", cfg=a.get(CONFIG_ATTR), rows=ow)
    epi = _epilogue(lambda idx: acc[idx[0] * (oh * ow) + idx[2] * ow + idx[3], idx[1]], bias)
    return te.compute((n_, a["n"], oh, ow), lambda *idx: epi(idx, idx[1]), name="bf16_conv",
                      attrs={"template": "int8_gemm", "acc": acc, "row_axes": (3,), "col_axis": 1})  # fmt: skip
