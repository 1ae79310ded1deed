"""Integer convolution and matrix product on weights packed at compile time: QConvPacked, QMatMulPacked.

`ember.passes.integer` rewrites quantized graphs (QDQ and QOperator) into these. Both compute

    y = saturate(rint(float32(sum u(x) * W + bias) * scale[j]) + y_zero)  clamped to [y_min, y_max of y's dtype]

with W int8 packed as [Np / nb, K / 4, nb, 4] (`ember.templates.int8.pack_weight`), K in the order
(kh, kw, channel) with the channels padded to 4, u(x) the activation as uint8 (x + 128 for int8 x; the
convolution's padding is u(x_zero), a real zero), int32 accumulation, and bias the int32 bias minus
u(x_zero) times W's column sums (folded by the pass: the product then needs no zero-point terms), rounding
half to even. With y_dtype float32 the output is float32(sum u(x) * W + bias) * scale, the dequantized product
(scale = x_scale * w_scale), for float ops after it. `int_clamp` (set by the pass where it proves
|float32(acc + bias) * scale| + |y_zero| < 2^31 for every accumulator the weights allow) rounds to int32 first
and clamps integers, the same values in fewer instructions than clamping floats. `y_min` above the dtype's
minimum is a fused Relu (max(q, y_zero) is exactly Relu then QuantizeLinear), and `y_max` below the maximum a
fused Clip (ReLU6).
A fifth input, `res` (uint8/int8, the output's shape), is a residual join fused into the epilogue (`ember.passes.
integer` writes QuantizeLinear(Relu(Add(product, DequantizeLinear(r, r_s, r_z)))) so): the sum before rounding is
float32(acc + bias) * scale[j] + float32(r - res_zero) * res_scale, `scale` and `res_scale` already divided by y's
scale (one multiply each, no division per element; the reference divides the float sum by y_s, so the two can
differ by one step where the quotient is within float32 rounding of a tie).
ONNX's QLinearConv divides the real value by y's scale; the pass's `scale` is x_scale * w_scale / y_scale
rounded to float32 once, as onnxruntime's kernels do: the two can differ by one step where the quotient is
within float32 rounding of a tie.
"""

from __future__ import annotations

import math

import numpy as np

from ember import te
from ember.graph.types import TensorType
from ember.ops.common import ShapeError, spatial_attrs, window_out_dim
from ember.ops.conv import conv_nd
from ember.ops.opdef import Attr, Pattern, op
from ember.ops.quant import int_range
from ember.ops.rows import ravel, unravel
from ember.ops.te_lib import lowering
from ember.te.config import CONFIG_ATTR
from ember.te.tensor import Tensor
from ember.templates import int8 as I8
from ember.templates import nn as T

OUT = Pattern.OUT_ELEMWISE_FUSABLE
COMMON = [Attr("n", "int"), Attr("x_zero", "int", 0), Attr("y_zero", "int", 0), Attr("y_dtype", "dtype", "uint8"),
          Attr("y_min", "int", -(2**31)), Attr("y_max", "int", 2**31 - 1), Attr("int_clamp", "int", 0)]  # fmt: skip
CONV = [Attr("kernel_shape", "ints"), Attr("strides", "ints"), Attr("pads", "ints"), Attr("dilations", "ints")]
S2D = [Attr("s2d", "int", 1)]  # QConvPacked's weights packed for its phase planes (`_wx_view`)
AMX = [Attr("amx", "int", 0)]  # QConvPacked: the target has AMX (`ember.templates.int8.amx_wx_tile`), set by the pass
RES = [Attr("res_zero", "int", 0), Attr("res_scale", "float", 0.0)]  # the fused residual's (`res`) parameters


def _check(name: str, x: TensorType, wp: TensorType, bias: TensorType, scale: TensorType, a: dict, k: int) -> None:
    if x.dtype not in ("uint8", "int8") or wp.dtype != "int8" or wp.rank != 4 or wp.shape[3] != 4:
        raise ShapeError(f"{name} needs uint8/int8 x and int8 packed weights [Np/nb, K/4, nb, 4], got {x} and {wp}")
    if wp.shape[1] * 4 != k or not (wp.shape[0] - 1) * wp.shape[2] < a["n"] <= wp.shape[0] * wp.shape[2]:
        raise ShapeError(f"{name}: packed weights {wp} do not make a [{k}, {a['n']}] matrix")
    if bias.dtype != "int32" or scale.dtype != "float32" or bias.shape != (a["n"],) or scale.shape != (a["n"],):
        raise ShapeError(f"{name}: bias must be int32[{a['n']}] and scale float32[{a['n']}], got {bias} and {scale}")


def _conv_geometry(a: dict, x: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
    """(output spatial shape, padded channels) of a QConvPacked."""
    strides, pads, dil = spatial_attrs(a, 2)
    out = tuple(window_out_dim(x[2 + i], a["kernel_shape"][i], strides[i], (pads[i], pads[i + 2]), dil[i])
                for i in range(2))  # fmt: skip
    return out, -(-x[1] // 4) * 4


def _conv_infer(a: dict, x: TensorType, wp: TensorType, bias: TensorType, scale: TensorType,
                res: TensorType | None = None) -> TensorType:  # fmt: skip
    if x.rank != 4:
        raise ShapeError(f"QConvPacked needs a 4-d x [N, C, H, W], got {x}")
    out, cp = _conv_geometry(a, x.shape)
    view, shape, _ = _wx_view(a, x.shape)
    _check("QConvPacked", x, wp, bias, scale, a, math.prod(view["kernel_shape"]) * -(-shape[1] // 4) * 4)
    y = TensorType((x.shape[0], a["n"], *out), a["y_dtype"])
    _check_res("QConvPacked", y, res)
    return y


def _check_res(name: str, y: TensorType, res: TensorType | None) -> None:
    if res is None:
        return
    if res.dtype not in ("uint8", "int8") or tuple(res.shape) != tuple(y.shape) or y.dtype == "float32":
        raise ShapeError(f"{name}: the fused residual must be uint8/int8 of the output's shape {y.shape} with an "
                         f"8-bit output, got {res} and output {y.dtype}")  # fmt: skip


def _requant_np(acc: np.ndarray, bias: np.ndarray, scale: np.ndarray, a: dict, axis: int,
                res: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    shape = [1] * acc.ndim
    shape[axis] = -1
    v = (acc + bias.reshape(shape).astype(np.int64)).astype(np.float32) * scale.reshape(shape)
    if res is not None:  # the fused residual, float32 as the kernel computes it
        v = v + (res.astype(np.int32) - a.get("res_zero", 0)).astype(np.float32) * np.float32(a["res_scale"])
    if a["y_dtype"] == "float32":
        return v
    lo, hi = int_range(a["y_dtype"])
    lo, hi = max(lo, a.get("y_min", lo)), min(hi, a.get("y_max", hi))
    return np.clip(np.rint(v).astype(np.float64) + a["y_zero"], lo, hi).astype(a["y_dtype"])


def _as_u8(x: np.ndarray) -> np.ndarray:
    return x.astype(np.int64) + (128 if x.dtype == np.int8 else 0)


@op("QConvPacked", OUT, infer=_conv_infer, inputs=(4, 5), attrs=COMMON + CONV + S2D + RES + AMX)
def qconv_packed(a: dict, x: np.ndarray, wp: np.ndarray, bias: np.ndarray, scale: np.ndarray,
                 res: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """Quantized 2-d convolution (group 1) on packed int8 weights, requantized, with a fused residual `res` if
    given (see the module doc)."""
    (oh, ow), cp = _conv_geometry(a, x.shape)
    xu = np.full((x.shape[0], cp, *x.shape[2:]), a["x_zero"] + (128 if x.dtype == np.int8 else 0), np.int64)
    xu[:, : x.shape[1]] = _as_u8(x)
    zp = float(a["x_zero"] + (128 if x.dtype == np.int8 else 0))
    pads = a["pads"]
    xp = np.pad(xu.astype(np.float64), [(0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])], constant_values=zp)
    conv_a = {**a, "pads": (0, 0, 0, 0), "group": 1}
    if a.get("s2d", 1) > 1:  # the phase planes of the padded input (`_wx_view`), a stride-1 convolution on them
        conv_a, shape, st = _wx_view(a, x.shape)
        planes = np.full((x.shape[0], cp, shape[2] * st, shape[3] * st), zp)
        planes[:, :, : xp.shape[2], : xp.shape[3]] = xp
        n_, _, h2, w2 = shape
        xp = planes.reshape(n_, cp, h2, st, w2, st).transpose(0, 3, 5, 1, 2, 4).reshape(n_, st * st * cp, h2, w2)
        cp = st * st * cp
    kh, kw = conv_a["kernel_shape"]
    w = I8.unpack_weight(wp, a["n"]).astype(np.int64).reshape(kh, kw, cp, a["n"]).transpose(3, 2, 0, 1)
    acc = conv_nd(xp, w.astype(np.float64), {**conv_a, "pads": (0, 0, 0, 0), "group": 1})[:, :, :oh, :ow]
    return _requant_np(np.rint(acc).astype(np.int64), bias, scale, a, 1, res)


def _mm_infer(a: dict, x: TensorType, wp: TensorType, bias: TensorType, scale: TensorType) -> TensorType:
    if x.rank < 2:
        raise ShapeError(f"QMatMulPacked needs x [..., M, K], got {x}")
    _check("QMatMulPacked", x, wp, bias, scale, a, -(-x.shape[-1] // 4) * 4)
    return TensorType((*x.shape[:-1], a["n"]), a["y_dtype"])


@op("QMatMulPacked", OUT, infer=_mm_infer, inputs=(4, 4), attrs=[*COMMON, Attr("tile_rows", "int", 0)])
def qmatmul_packed(a: dict, x: np.ndarray, wp: np.ndarray, bias: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Quantized x [..., M, K] times packed int8 weights [K, n], requantized (see the module doc)."""
    w = I8.unpack_weight(wp, a["n"])[: x.shape[-1]].astype(np.int64)
    return _requant_np(_as_u8(x) @ w, bias, scale, a, -1)


# -- TE computes: A stage, int32 accumulation (template `ember.templates.int8`), requantizing epilogue -------
def _u8(v, signed: bool):
    return te.cast(te.cast(v, "int32") + 128, "uint8") if signed else v


def _epilogue(acc_at, bias: Tensor, scale: Tensor, a: dict, res: Tensor | None = None):
    if a["y_dtype"] == "float32":  # dequantized: the float ops after it fuse here
        return lambda idx, j: te.cast(acc_at(idx) + bias[j], "float32") * scale[j]
    lo, hi = int_range(a["y_dtype"])
    lo, hi = max(lo, a.get("y_min", lo)), min(hi, a.get("y_max", hi))
    rs = float(np.float32(a.get("res_scale", 0.0)))

    def f(idx, j):
        v = te.cast(acc_at(idx) + bias[j], "float32") * scale[j]
        if res is not None:  # the residual join: r - r_z exact in int32, scaled in float32
            v = v + te.cast(te.cast(res[tuple(idx)], "int32") - a.get("res_zero", 0), "float32") * rs
        if a.get("int_clamp"):  # |v| + |y_zero| < 2^31 proven by the pass: rounded to int32, clamped as integers
            q = te.cast(te.round(v), "int32") + a["y_zero"]
            return te.cast(te.minimum(te.maximum(q, lo), hi), a["y_dtype"])
        q = te.round(v) + float(a["y_zero"])
        clamped = te.minimum(te.maximum(q, float(lo)), float(hi))  # by way of int32: one vector conversion in C
        return te.cast(te.cast(clamped, "int32"), a["y_dtype"])

    return f


def _wx_view(a: dict, x_shape: tuple[int, ...]) -> tuple[dict, tuple[int, ...], int]:
    """(attrs, x shape, sampling stride) of a convolution seen as stride 1: a strided 1 x 1 convolution without
    padding is a 1 x 1 one on every s-th pixel (the W x X copy of the input samples them); one marked `s2d` (by
    the pass, which packed its weights so) is a ceil(k / s) x ceil(k / s) one on the s x s phase planes of the
    padded input, s * s * Cp channels (space to depth: no im2col of a stem's few channels)."""
    (sh, sw), pads, _ = spatial_attrs(a, 2)
    if a.get("s2d", 1) > 1:
        st = a["s2d"]
        kh, kw = (-(-k // st) for k in a["kernel_shape"])
        hp, wp = x_shape[2] + pads[0] + pads[2], x_shape[3] + pads[1] + pads[3]
        view = {**a, "kernel_shape": (kh, kw), "strides": (1, 1), "pads": (0, 0, 0, 0), "dilations": (1, 1)}
        return view, (x_shape[0], st * st * (-(-x_shape[1] // 4) * 4), -(-hp // st), -(-wp // st)), st
    if tuple(a["kernel_shape"]) == (1, 1) and sh == sw > 1 and not any(pads):
        (oh, ow), _ = _conv_geometry(a, x_shape)
        return {**a, "strides": (1, 1)}, (*x_shape[:2], oh, ow), sh
    return a, x_shape, 1


def space_to_depth_ok(a: dict, x_shape: tuple[int, ...]) -> bool:
    """Whether a strided convolution's output is the stride-1 convolution's on its phase planes (`_wx_view`)."""
    (sh, sw), _, dil = spatial_attrs(a, 2)
    if sh != sw or sh < 2 or dil != (1, 1):
        return False
    view, shape, _ = _wx_view({**a, "s2d": sh}, x_shape)
    return _conv_geometry(view, shape)[0] == _conv_geometry(a, x_shape)[0]


def space_to_depth_weight(w: np.ndarray, st: int) -> np.ndarray:
    """W [Co, Cp, KH, KW] as the weights of the phase-plane convolution: [Co, st * st * Cp, ceil(KH / st),
    ceil(KW / st)], channel (pr * st + pc) * Cp + c, tap (r, s) = W's (r * st + pr, s * st + pc), zero past KH, KW."""
    co, cp, kh, kw = w.shape
    k2h, k2w = -(-kh // st), -(-kw // st)
    full = np.zeros((co, cp, k2h * st, k2w * st), w.dtype)
    full[:, :, :kh, :kw] = w
    return np.ascontiguousarray(full.reshape(co, cp, k2h, st, k2w, st).transpose(0, 3, 5, 1, 2, 4)
                                .reshape(co, st * st * cp, k2h, k2w))  # fmt: skip


def wx_conv(a: dict, x_shape: tuple[int, ...]) -> bool:
    """Whether a QConvPacked runs as weights times activations (`ember.templates.int8.int8_acc_wx`): stride 1 (or a
    strided 1 x 1 without padding), or strided on phase planes (`_phase_grid`), with a tile of at least 16 pixels;
    the pass then packs its weights with nb = 1."""
    a, x_shape, _ = _wx_view(a, x_shape)
    (sh, sw), pads, _ = spatial_attrs(a, 2)
    if (sh, sw) != (1, 1) and _phase_grid(a, x_shape) is None:
        return False
    (oh, ow), _ = _conv_geometry(a, x_shape)
    few = oh * ow < WX_MIN_PIXELS and not _amx_rows(a, x_shape)  # (AMX tiles of whole rows beat im2col there too)
    if a.get("s2d", 1) == 1 and math.prod(a["kernel_shape"]) > 1 and few:
        return False
    return _wx_tile(a, x_shape)[1] >= 16


def _amx_rows(a: dict, x_shape: tuple[int, ...]) -> bool:
    """Whether a stride-1 convolution on a padded grid runs on AMX tiles of whole rows (`ember.templates.int8.
    amx_wx_tile`)."""
    if not a.get("amx") or _phase_grid(a, x_shape) is not None:
        return False
    _, oh, wpad = _wx_grid(a, x_shape)
    (_, ow), cp = _conv_geometry(a, x_shape)
    return wpad != ow and I8.amx_wx_tile(oh, wpad, a["n"], False, cp)[0] > 0


def wx_columns(a: dict, x_shape: tuple[int, ...]) -> int:
    """The pixel columns of one micro-kernel call of a W x X convolution: its tile's rows on the padded grid, but
    for the last row's padding columns."""
    a, x_shape, _ = _wx_view(a, x_shape)
    _, _, wpad = _wx_rows(a, x_shape)
    return _wx_tile(a, x_shape)[1] - wpad + _conv_geometry(a, x_shape)[0][1]


def _wx_tile(a: dict, x_shape: tuple[int, ...]) -> tuple[int, int]:
    """`ember.templates.int8.wx_tile` of a convolution seen as stride 1 (`_wx_view`), as `int8_acc_wx` picks it."""
    _, oh, wpad = _wx_rows(a, x_shape)
    flat = _phase_grid(a, x_shape) is None and wpad == _conv_geometry(a, x_shape)[0][1]
    return I8.wx_tile(oh, wpad, a["n"], flat, -(-x_shape[1] // 4) * 4, bool(a.get("amx", 0)))


def _wx_rows(a: dict, x_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(rows, OH, row length) of the grid a W x X accumulator runs on: the padded image, or one phase plane."""
    grid = _phase_grid(a, x_shape)
    return (grid[1], _conv_geometry(a, x_shape)[0][0], grid[2]) if grid else _wx_grid(a, x_shape)


PHASE_MIN_TAPS = 4  # a strided convolution of at least this many taps runs on phase planes (1 x 1: `_wx_view`)
# A convolution of several taps (but a stem's on phase planes, `s2d`) with fewer output pixels runs on im2col: a
# 14 x 14 or 7 x 7 image wastes the padding columns of its grid (12% and 22%) and fills few vectors per tile,
# where the im2col product's tiles of 64 channels use the registers well and its copy is small. ResNet-50 at 1
# thread (loaded machine): its 3 x 3 convolutions at 14 x 14 3.55 -> 3.00 ms (5 layers), at 7 x 7 1.60 -> 1.13 (2);
# stride 2 on phase planes at 28 x 28 outputs 0.89 -> 0.70 ms, but 14 x 14 0.63 -> 0.73 and 7 x 7 0.57 -> 0.87.
# (1 x 1 convolutions, no padding columns, stay W x X at every size: im2col was slower for them.)
WX_MIN_PIXELS = 256


def _phase_grid(a: dict, x_shape: tuple[int, ...]) -> tuple[int, int, int, int] | None:
    """(stride S, plane rows, plane width W2, pixels per plane) of a strided convolution run as weights times
    activations on the S x S phase planes of the padded image (plane (pr, pc) holds the padded pixels (i * S + pr,
    j * S + pc)): tap (r, s) of output pixel (oh, ow) reads plane (r % S, s % S) at (oh + r // S, ow + s // S), so
    each tap is one shift of one plane, as a stride-1 tap is one shift of the image (no im2col: the copy is the
    input's size, not k * k times it). A plane has OH + (KH - 1) // S + 1 rows (the last one: the overrun of the
    columns past OW). None where it does not apply (stride 1, unequal strides, dilation, fewer taps or output
    pixels, `s2d`)."""
    (sh, sw), pads, dil = spatial_attrs(a, 2)
    if sh != sw or sh < 2 or dil != (1, 1) or a.get("s2d", 1) > 1 or math.prod(a["kernel_shape"]) < PHASE_MIN_TAPS:
        return None
    (oh, ow), _ = _conv_geometry(a, x_shape)
    if oh * ow < WX_MIN_PIXELS:
        return None
    w2 = -(-(x_shape[3] + pads[1] + pads[3]) // sh)
    rows = oh + (a["kernel_shape"][0] - 1) // sh + 1
    return sh, rows, w2, rows * w2


def _wx_grid(a: dict, x_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(Hp, OH, Wp) of a stride-1 convolution: the padded image's rows, the output rows, the padded row length
    (on AMX, for a kernel of several taps, widened to whole tiles of 16 pixels: `ember.templates.int8.
    amx_grid_width`; the extra columns are zeros, their outputs computed and dropped)."""
    (oh, ow), cp = _conv_geometry(a, x_shape)
    pads = spatial_attrs(a, 2)[1]
    wpad = x_shape[3] + pads[1] + pads[3]
    if a.get("amx") and a.get("s2d", 1) == 1 and math.prod(a["kernel_shape"]) > 1 and wpad != ow:
        wpad = I8.amx_grid_width(wpad, cp)
    return x_shape[2] + pads[0] + pads[2], oh, wpad


def _qconv_wx(a: dict, x: Tensor, wp: Tensor, bias: Tensor, scale: Tensor, res: Tensor | None) -> Tensor:
    real = a
    a, shape, st = _wx_view(a, tuple(x.shape))
    n_, c, h, w = shape
    cp = wp.shape[1] * 4 // math.prod(a["kernel_shape"])
    (oh, ow), _ = _conv_geometry(a, shape)
    hp, _, wpad = _wx_grid(a, shape)
    _, pads, (dh, dw) = spatial_attrs(a, 2)
    signed = x.dtype.name == "int8"
    zero = te.const(a["x_zero"] + (128 if signed else 0), "uint8")

    def interleave(b, c4, p, kk):  # the padded image (and one row of zeros after it: the last taps' overrun)
        ih, iw = p // wpad - pads[0], p % wpad - pads[1]
        inside = te.all(c4 * 4 + kk < c, ih >= 0, ih < h, iw >= 0, iw < w)
        return te.if_then_else(inside, _u8(x[b, c4 * 4 + kk, ih * st, iw * st], signed), zero)

    def phases(b, c4, p, kk):  # space to depth: channel group c4 = (phase, channels of the phase)
        groups = -(-x.shape[1] // 4)
        ph, ch = c4 // groups, (c4 % groups) * 4 + kk
        real_pads = spatial_attrs(real, 2)[1]
        ih = (p // wpad) * st + ph // st - real_pads[0]
        iw = (p % wpad) * st + ph % st - real_pads[1]
        inside = te.all(ch < x.shape[1], ih >= 0, ih < x.shape[2], iw >= 0, iw < x.shape[3])
        return te.if_then_else(inside, _u8(x[b, ch, ih, iw], signed), zero)


    grid = _phase_grid(a, shape)
    if grid is not None:  # strided: the phase planes of the padded image, plane after plane
        ps, _, wpad, plane = grid

        def planes(b, c4, p, kk):
            ph, pp = p // plane, p % plane
            ih, iw = (pp // wpad) * ps + ph // ps - pads[0], (pp % wpad) * ps + ph % ps - pads[1]
            inside = te.all(c4 * 4 + kk < c, ih >= 0, ih < h, iw >= 0, iw < w)
            return te.if_then_else(inside, _u8(x[b, c4 * 4 + kk, ih, iw], signed), zero)

        X4 = I8.rows_stage((n_, cp // 4, ps * ps * plane, 4), planes, "x4")
        geometry = (*a["kernel_shape"], dh, dw, oh, ow, wpad, ps, plane)
    else:
        fill = phases if real.get("s2d", 1) > 1 else interleave
        X4 = I8.rows_stage((n_, cp // 4, (hp + 1) * wpad, 4), fill, "x4")
        geometry = (*a["kernel_shape"], dh, dw, oh, ow, wpad)
    acc = I8.int8_acc_wx(wp, X4, geometry, name="qconv_acc", cfg=a.get(CONFIG_ATTR), amx=bool(a.get("amx", 0)))
    epi = _epilogue(lambda idx: acc[idx[0], idx[1], idx[2] * wpad + idx[3]], bias, scale, a, res)
    return te.compute((n_, a["n"], oh, ow), lambda *idx: epi(idx, idx[1]), name="qconv",
                      attrs={"template": "int8_gemm", "acc": acc, "wx": True})  # fmt: skip


@lowering("QConvPacked", schedule=T.schedule_nn)
def _qconv_compute(a: dict, x: Tensor, wp: Tensor, bias: Tensor, scale: Tensor, res: Tensor | None = None) -> Tensor:
    if wp.shape[2] == 1 and wx_conv(a, x.shape):
        return _qconv_wx(a, x, wp, bias, scale, res)
    n_, c, h, w = x.shape
    (oh, ow), cp = _conv_geometry(a, x.shape)
    kh, kw = a["kernel_shape"]
    (sh, sw), pads, (dh, dw) = spatial_attrs(a, 2)
    signed = x.dtype.name == "int8"
    zero = te.const(a["x_zero"] + (128 if signed else 0), "uint8")

    def patch(i, r, s, ch):
        b, p = i // (oh * ow), i % (oh * ow)
        ih, iw = (p // ow) * sh - pads[0] + r * dh, (p % ow) * sw - pads[1] + s * dw
        inside = te.all(ch < c, ih >= 0, ih < h, iw >= 0, iw < w)
        return te.if_then_else(inside, _u8(x[b, ch, ih, iw], signed), zero)

    A = I8.rows_stage((n_ * oh * ow, kh, kw, cp), patch, "im2col")
    acc = I8.int8_acc(A, wp, name="qconv_acc", cfg=a.get(CONFIG_ATTR), rows=ow)  # row tiles within one output row
    epi = _epilogue(lambda idx: acc[idx[0] * (oh * ow) + idx[2] * ow + idx[3], idx[1]], bias, scale, a, res)
    return te.compute((n_, a["n"], oh, ow), lambda *idx: epi(idx, idx[1]), name="qconv",
                      attrs={"template": "int8_gemm", "acc": acc, "row_axes": (3,), "col_axis": 1})  # fmt: skip


@lowering("QMatMulPacked", schedule=T.schedule_nn)
def _qmatmul_compute(a: dict, x: Tensor, wp: Tensor, bias: Tensor, scale: Tensor) -> Tensor:
    *batch, m, k = x.shape
    kp = wp.shape[1] * 4
    rows = math.prod(batch) * m
    signed = x.dtype.name == "int8"

    def row(i, _r, _s, kk):
        v = _u8(x[(*unravel(i, (*batch, m)), kk)], signed)
        return v if kp == k else te.if_then_else(kk < k, v, te.const(0, "uint8"))

    A = I8.rows_stage((rows, 1, 1, kp), row, "rows")
    acc = I8.int8_acc(A, wp, name="qmatmul_acc", cfg=a.get(CONFIG_ATTR), rows=m, tile_rows=a.get("tile_rows", 0))
    epi = _epilogue(lambda idx: acc[ravel(idx[:-1], (*batch, m)), idx[-1]], bias, scale, a)
    nd = len(batch) + 2
    attrs = {"template": "int8_gemm", "acc": acc, "row_axes": (nd - 2,), "col_axis": nd - 1}
    return te.compute((*batch, m, a["n"]), lambda *idx: epi(idx, idx[-1]), name="qmatmul", attrs=attrs)


# -- depthwise convolution: one 3 x 3 (any) filter per channel, vectorized along the pixels ----------------
def dw_grid(a: dict, x_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(stride S, plane width W2, plane rows) of a QConvDepthwise: the padded image split into S x S phase planes
    (plane (pr, pc) holds the padded pixels (i * S + pr, j * S + pc)), each W2 = ceil(Wp / S) wide, with rows for
    the taps of the last output rows and zeros after them (the pixels of the accumulator past OH * W2)."""
    (oh, _), _ = _conv_geometry(a, x_shape)
    (sh, sw), pads, (dh, dw) = spatial_attrs(a, 2)
    if sh != sw:
        raise ShapeError(f"QConvDepthwise needs equal strides, got {(sh, sw)}")
    kh, kw = a["kernel_shape"]
    w2 = -(-(x_shape[3] + pads[1] + pads[3]) // sh)
    q = dw_pixels(oh, w2)
    rows = -(-(q + ((kh - 1) * dh // sh) * w2 + (kw - 1) * dw // sh) // w2)
    return sh, w2, rows


DW_CHAINS = 4  # vectors of 16 pixels accumulated side by side (an FMA's latency covered by independent chains)


def dw_pixels(oh: int, w2: int) -> int:
    """The accumulator's pixels of a QConvDepthwise: OH rows of the plane width W2 rounded up to whole vectors of
    16, and to groups of DW_CHAINS vectors (`ember.templates.int8.schedule_int8_dw` accumulates them together)."""
    vectors = -(-oh * w2 // 16)
    chains = min(DW_CHAINS, vectors)
    return -(-vectors // chains) * chains * 16


def _dw_infer(a: dict, x: TensorType, w: TensorType, bias: TensorType, scale: TensorType) -> TensorType:
    if x.rank != 4 or x.dtype not in ("uint8", "int8"):
        raise ShapeError(f"QConvDepthwise needs a 4-d uint8/int8 x [N, C, H, W], got {x}")
    c = x.shape[1]
    if w.dtype != "float32" or w.shape != (c, math.prod(a["kernel_shape"])) or a["n"] != c:
        raise ShapeError(f"QConvDepthwise: weights must be float32 [C, KH * KW] = [{c}, "
                         f"{math.prod(a['kernel_shape'])}] with n = C, got {w} and n = {a['n']}")  # fmt: skip
    if bias.dtype != "int32" or scale.dtype != "float32" or bias.shape != (c,) or scale.shape != (c,):
        raise ShapeError(f"QConvDepthwise: bias must be int32[{c}] and scale float32[{c}], got {bias} and {scale}")
    out, _ = _conv_geometry(a, x.shape)
    return TensorType((x.shape[0], c, *out), a["y_dtype"])


@op("QConvDepthwise", OUT, infer=_dw_infer, inputs=(4, 4), attrs=COMMON + CONV)
def qconv_depthwise(a: dict, x: np.ndarray, w: np.ndarray, bias: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Quantized depthwise convolution (group = channels, one filter each), requantized as QConvPacked. The weights
    are the int8 filter values as float32 [C, KH * KW] (exact): the kernel accumulates u(x) * w in float32, exact
    for KH * KW * 255 * 128 < 2^24, and converts the sum to int32 before the bias."""
    (oh, ow), _ = _conv_geometry(a, x.shape)
    kh, kw = a["kernel_shape"]
    (sh, sw), pads, (dh, dw) = spatial_attrs(a, 2)
    zp = a["x_zero"] + (128 if x.dtype == np.int8 else 0)
    xp = np.pad(_as_u8(x), [(0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])], constant_values=zp)
    wk = w.astype(np.int64).reshape(x.shape[1], kh, kw)
    acc = np.zeros((x.shape[0], x.shape[1], oh, ow), np.int64)
    for r in range(kh):
        for s in range(kw):
            win = xp[:, :, r * dh : r * dh + (oh - 1) * sh + 1 : sh, s * dw : s * dw + (ow - 1) * sw + 1 : sw]
            acc += win * wk[None, :, r, s, None, None]
    return _requant_np(acc, bias, scale, a, 1)


@lowering("QConvDepthwise", schedule=T.schedule_nn)
def _qconv_dw_compute(a: dict, x: Tensor, w: Tensor, bias: Tensor, scale: Tensor) -> Tensor:
    n_, c, h, wd = x.shape
    (oh, ow), _ = _conv_geometry(a, x.shape)
    kh, kw = a["kernel_shape"]
    _, pads, (dh, dw) = spatial_attrs(a, 2)
    st, w2, rows = dw_grid(a, x.shape)
    signed = x.dtype.name == "int8"
    zero = float(a["x_zero"] + (128 if signed else 0))

    def plane(b, ch, pr, pc, p):  # phase planes of the padded image as float32, the padding u(x_zero)
        ih, iw = (p // w2) * st + pr - pads[0], (p % w2) * st + pc - pads[1]
        inside = te.all(ih >= 0, ih < h, iw >= 0, iw < wd)
        v = te.cast(te.cast(_u8(x[b, ch, ih, iw], signed), "int32"), "float32")  # by way of int32: vectorized
        return te.if_then_else(inside, v, te.const(zero, "float32"))

    xs = I8.rows_stage((n_, c, st, st, rows * w2), plane, "planes")
    q = dw_pixels(oh, w2)
    r = te.reduce_axis((0, kh), name="r")
    s = te.reduce_axis((0, kw), name="s")

    def body(b, ch, p):
        dr, ds = r * dh, s * dw
        return te.sum(xs[b, ch, dr % st, ds % st, p + (dr // st) * w2 + ds // st] * w[ch, r * kw + s], axis=[r, s])

    acc = te.compute((n_, c, q), body, name="qdw_acc", tag="int8_dw",
                     attrs={"plane_width": w2, "chains": min(DW_CHAINS, q // 16)})  # fmt: skip
    epi = _epilogue(lambda idx: te.cast(acc[idx], "int32"), bias, scale, a)
    grid = te.compute((n_, c, q), lambda *idx: epi(idx, idx[1]), name="qdw_grid")  # requantized in vectors
    return te.compute((n_, c, oh, ow), lambda b, ch, i, j: grid[b, ch, i * w2 + j], name="qconv_dw",
                      attrs={"template": "int8_dw", "acc": acc, "grid": grid})  # fmt: skip


# -- products of two activations (attention's Q x K^T and probabilities x V) ------------------------------
def _bmm_infer(a: dict, x: TensorType, y: TensorType) -> TensorType:
    if x.dtype not in ("uint8", "int8") or y.dtype != "int8":
        raise ShapeError(f"QBatchMatMul needs uint8/int8 x and int8 y (symmetric, zero point 0), got {x} and {y}")
    if x.rank < 2 or y.rank != x.rank or x.shape[:-2] != y.shape[:-2] or x.shape[-1] != y.shape[-2]:
        raise ShapeError(f"QBatchMatMul needs x [..., M, K] and y [..., K, N] with the same batch dims, got {x} "
                         f"and {y}")  # fmt: skip
    return TensorType((*x.shape[:-1], y.shape[-1]), "float32")


@op("QBatchMatMul", OUT, infer=_bmm_infer, inputs=(2, 2), attrs=[Attr("x_zero", "int", 0), Attr("scale", "float"),
                                                                  Attr("tile_rows", "int", 0)])  # fmt: skip
def qbatch_matmul(a: dict, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The dequantized product of two quantized activations, float32((u(x) - u(x_zero)) @ y) * scale: x
    [..., M, K] uint8 (or int8, shifted to uint8), y [..., K, N] int8 with zero point 0, int32 accumulation,
    `scale` = x_scale * y_scale (float32)."""
    zu = a["x_zero"] + (128 if x.dtype == np.int8 else 0)
    acc = np.matmul(_as_u8(x) - zu, y.astype(np.int64))
    return acc.astype(np.float32) * np.float32(a["scale"])


@lowering("QBatchMatMul", schedule=T.schedule_nn)
def _qbatch_matmul_compute(a: dict, x: Tensor, y: Tensor) -> Tensor:
    *batch, m, k = x.shape
    n = y.shape[-1]
    signed = x.dtype.name == "int8"
    zu = a["x_zero"] + (128 if signed else 0)
    kp = -(-k // 4) * 4
    nb = I8.AMX_PANEL if a.get("tile_rows", 0) else I8.choose_nb(n)  # (AMX: panels of 32, `amx_tile_rows`)
    groups, bt = math.prod(batch), tuple(batch)  # a flat batch index g is the batch dims' unravel(g, bt)

    def row(i, _r, _s, kk):
        v = _u8(x[(*unravel(i // m, bt), i % m, kk)], signed)
        return v if kp == k else te.if_then_else(kk < k, v, te.const(0, "uint8"))

    def panel(g, jp, k4, jj, kk):  # y packed per batch as the intrinsic reads it, zeros past K and N
        kk_, j = k4 * 4 + kk, jp * nb + jj
        return te.if_then_else(te.all(kk_ < k, j < n), y[(*unravel(g, bt), kk_, j)], te.const(0, "int8"))

    A = I8.rows_stage((groups * m, 1, 1, kp), row, "rows")
    W = I8.rows_stage((groups, -(-n // nb), kp // 4, nb, 4), panel, "panels")
    acc = I8.int8_acc_batched(A, W, m, name="qbmm_acc", tile_rows=a.get("tile_rows", 0))
    kr = te.reduce_axis((0, k), name="k")
    sums = te.compute((groups, n), lambda g, j: te.sum(te.cast(y[(*unravel(g, bt), kr, j)], "int32"), axis=kr),
                      name="y_sums")  # zu * (y's column sums): the x zero point's share, subtracted once
    nd = len(batch) + 2

    def out(*idx):
        g = 0
        for i, d in zip(idx[: nd - 2], batch):
            g = g * d + i
        v = acc[g, idx[-2], idx[-1]] - sums[g, idx[-1]] * zu if zu else acc[g, idx[-2], idx[-1]]
        return te.cast(v, "float32") * float(np.float32(a["scale"]))

    attrs = {"template": "int8_gemm", "acc": acc, "row_axes": (nd - 2,), "col_axis": nd - 1}
    return te.compute((*batch, m, n), out, name="qbmm", attrs=attrs)


# -- a function of one 8-bit tensor as a table of its 256 values -------------------------------------------
def _lookup_infer(a: dict, x: TensorType, table: TensorType) -> TensorType:
    if x.dtype not in ("uint8", "int8") or table.shape != (256,):
        raise ShapeError(f"Lookup needs uint8/int8 x and a table of 256 values, got {x} and {table}")
    return TensorType(x.shape, table.dtype)


@op("Lookup", Pattern.BROADCAST, infer=_lookup_infer, inputs=(2, 2))
def lookup(a: dict, x: np.ndarray, table: np.ndarray) -> np.ndarray:
    """table[u(x)]: x uint8 (or int8, shifted to uint8: table[x + 128]), the table one value per 8-bit code (the
    pass `integer_ops` writes QuantizeLinear(f(DequantizeLinear(x))) of an elementwise f, GELU, as one)."""
    return table[_as_u8(x)]


@lowering("Lookup", schedule=T.schedule_nn)
def _lookup_compute(a: dict, x: Tensor, table: Tensor) -> Tensor:
    signed = x.dtype.name == "int8"
    return te.compute(x.shape, lambda *i: table[te.cast(_u8(x[i], signed), "int32")], name="lookup")
