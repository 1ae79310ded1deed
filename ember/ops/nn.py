"""Neural-network operators: convolution, pooling, normalization, matrix products.

References accumulate in float64 for float inputs: they are the oracle the compiled code
is checked against, so they favour accuracy over speed."""

from __future__ import annotations

import numpy as np

from ember.graph.types import TensorType
from ember.ops.common import ShapeError, broadcast_shapes, norm_axes, norm_axis, window_out_dim
from ember.ops.opdef import Attr, Pattern, op

OUT = Pattern.OUT_ELEMWISE_FUSABLE
CONV_ATTRS = [Attr("strides", "ints"), Attr("pads", "ints"), Attr("dilations", "ints"), Attr("group", "int", 1)]


def _acc(x: np.ndarray) -> np.ndarray:
    """Accumulation dtype of a reference: float64 for floats, int64 for integers."""
    return x.astype(np.int64 if np.issubdtype(x.dtype, np.integer) else np.float64)


def _spatial(a: dict, nd: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    strides, pads, dil = a["strides"], a["pads"], a["dilations"]
    if len(strides) != nd or len(pads) != 2 * nd or len(dil) != nd:
        raise ShapeError(f"strides/dilations need {nd} entries and pads {2 * nd}, got {strides}, {pads}, {dil}")
    return strides, pads, dil


# -- convolution -------------------------------------------------------------------------------------
def _conv_infer(a: dict, x: TensorType, w: TensorType, b: TensorType | None = None, *zp) -> TensorType:
    nd = x.rank - 2
    strides, pads, dil = _spatial(a, nd)
    g = a["group"]
    if w.rank != x.rank or x.shape[1] != w.shape[1] * g or w.shape[0] % g:
        raise ShapeError(f"Conv weight {w} does not match input {x} with group={g}")
    if b is not None and b.shape != (w.shape[0],):
        raise ShapeError(f"Conv bias {b} must have shape [{w.shape[0]}]")
    sp = tuple(
        window_out_dim(x.shape[2 + i], w.shape[2 + i], strides[i], (pads[i], pads[i + nd]), dil[i]) for i in range(nd)
    )
    return TensorType((x.shape[0], w.shape[0]) + sp, x.dtype)


def conv_nd(x: np.ndarray, w: np.ndarray, a: dict) -> np.ndarray:
    """Grouped N-d correlation by im2col + matmul, in the dtype of x (float64/int64 given)."""
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    ks = w.shape[2:]
    nd = len(ks)
    strides, pads, dil = _spatial(a, nd)
    g = a["group"]
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + nd]) for i in range(nd)])
    out_sp = [window_out_dim(x.shape[2 + i], ks[i], strides[i], (pads[i], pads[i + nd]), dil[i]) for i in range(nd)]
    xg = xp.reshape((n, g, cg) + xp.shape[2:])
    cols = []
    for kidx in np.ndindex(*ks):
        index = tuple(slice(k * d, k * d + s * (o - 1) + 1, s) for k, d, s, o in zip(kidx, dil, strides, out_sp))
        cols.append(xg[(Ellipsis,) + index].reshape(n, g, cg, -1))
    col = np.stack(cols, axis=3).reshape(n, g, cg * len(cols), -1)  # N, G, Cg*K, P
    wg = w.reshape(g, m // g, cg * len(cols))
    out = np.matmul(wg[None], col)  # N, G, Mg, P
    return out.reshape((n, m) + tuple(out_sp))


@op("Conv", OUT, infer=_conv_infer, inputs=(2, 3), attrs=CONV_ATTRS)
def conv(a: dict, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """Convolution with explicit strides, pads (begins then ends), dilations and group."""
    y = conv_nd(_acc(x), _acc(w), a)
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * (x.ndim - 2))
    return y.astype(x.dtype)


def _conv_integer_infer(a: dict, x: TensorType, w: TensorType, *zps: TensorType | None) -> TensorType:
    return _conv_infer(a, x, w).with_dtype("int32")


@op("ConvInteger", OUT, infer=_conv_integer_infer, inputs=(2, 4), attrs=CONV_ATTRS)
def conv_integer(a: dict, x: np.ndarray, w: np.ndarray, x_zp=None, w_zp=None) -> np.ndarray:
    xi = x.astype(np.int64) - (0 if x_zp is None else x_zp.astype(np.int64).reshape(()))
    wz = 0 if w_zp is None else w_zp.astype(np.int64).reshape((-1,) + (1,) * (w.ndim - 1))
    return conv_nd(xi, w.astype(np.int64) - wz, a).astype(np.int32)


def _conv_t_infer(a: dict, x: TensorType, w: TensorType, b: TensorType | None = None) -> TensorType:
    nd = x.rank - 2
    strides, pads, dil = _spatial(a, nd)
    g = a["group"]
    if w.rank != x.rank or w.shape[0] != x.shape[1]:
        raise ShapeError(f"ConvTranspose weight {w} does not match input {x}")
    op_ = a["output_padding"] or (0,) * nd
    sp = tuple(
        strides[i] * (x.shape[2 + i] - 1) + op_[i] + (w.shape[2 + i] - 1) * dil[i] + 1 - pads[i] - pads[i + nd]
        for i in range(nd)
    )
    return TensorType((x.shape[0], w.shape[1] * g) + sp, x.dtype)


@op("ConvTranspose", OUT, infer=_conv_t_infer, inputs=(2, 3), attrs=CONV_ATTRS + [Attr("output_padding", "ints", ())])
def conv_transpose(a: dict, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """Transposed convolution: scatter each input pixel times the kernel, then crop pads."""
    n, c = x.shape[:2]
    g = a["group"]
    cg, mg = c // g, w.shape[1]
    ks = w.shape[2:]
    nd = len(ks)
    strides, pads, dil = _spatial(a, nd)
    opad = a["output_padding"] or (0,) * nd
    ins = x.shape[2:]
    full = [strides[i] * (ins[i] - 1) + opad[i] + (ks[i] - 1) * dil[i] + 1 for i in range(nd)]
    out = np.zeros((n, g, mg) + tuple(full))
    xg = _acc(x).reshape(n, g, cg, -1)
    wg = _acc(w).reshape((g, cg, mg) + ks)
    for kidx in np.ndindex(*ks):
        contrib = np.matmul(np.swapaxes(wg[(Ellipsis,) + kidx], 1, 2)[None], xg).reshape((n, g, mg) + ins)
        index = tuple(slice(k * d, k * d + s * (i - 1) + 1, s) for k, d, s, i in zip(kidx, dil, strides, ins))
        out[(Ellipsis,) + index] += contrib
    crop = tuple(slice(pads[i], full[i] - pads[i + nd]) for i in range(nd))
    y = out[(Ellipsis,) + crop].reshape((n, g * mg) + tuple(f - pads[i] - pads[i + nd] for i, f in enumerate(full)))
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * nd)
    return y.astype(x.dtype)


# -- pooling ----------------------------------------------------------------------------------------
POOL_ATTRS = [
    Attr("kernel_shape", "ints"), Attr("strides", "ints"), Attr("pads", "ints"), Attr("dilations", "ints"),
    Attr("ceil_mode", "int", 0),
]  # fmt: skip


def _pool_dims(a: dict, shape: tuple[int, ...]) -> list[int]:
    nd = len(a["kernel_shape"])
    strides, pads, dil = _spatial(a, nd)
    ceil, kernel = bool(a["ceil_mode"]), a["kernel_shape"]
    return [window_out_dim(shape[2 + i], kernel[i], strides[i], (pads[i], pads[i + nd]), dil[i], ceil)
            for i in range(nd)]  # fmt: skip


def _pool_infer(a: dict, x: TensorType) -> TensorType:
    if x.rank != len(a["kernel_shape"]) + 2:
        raise ShapeError(f"pool kernel {list(a['kernel_shape'])} does not fit input {x}")
    return x.with_shape(x.shape[:2] + tuple(_pool_dims(a, x.shape)))


def pool_windows(x: np.ndarray, a: dict, fill: float) -> tuple[np.ndarray, list[int]]:
    """All windows stacked on a new leading axis K: (K, N, C, *out); outside cells hold `fill`."""
    nd = len(a["kernel_shape"])
    strides, pads, dil = _spatial(a, nd)
    out = _pool_dims(a, x.shape)
    # room for ceil-mode windows that run past the end padding
    extra = [max(0, (out[i] - 1) * strides[i] + dil[i] * (a["kernel_shape"][i] - 1) + 1 - x.shape[2 + i]
                 - pads[i] - pads[i + nd]) for i in range(nd)]  # fmt: skip
    widths = [(0, 0), (0, 0)] + [(pads[i], pads[i + nd] + extra[i]) for i in range(nd)]
    xp = np.pad(x, widths, constant_values=fill)
    wins = []
    for kidx in np.ndindex(*a["kernel_shape"]):
        index = tuple(slice(k * d, k * d + s * (o - 1) + 1, s) for k, d, s, o in zip(kidx, dil, strides, out))
        wins.append(xp[(Ellipsis,) + index])
    return np.stack(wins), extra


def _max_pool_infer(a: dict, x: TensorType) -> tuple[TensorType, TensorType]:
    y = _pool_infer(a, x)
    return y, y.with_dtype("int64")


@op("MaxPool", Pattern.OPAQUE, infer=_max_pool_infer, attrs=POOL_ATTRS + [Attr("storage_order", "int", 0)])
def max_pool(a: dict, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Max over windows; Indices flatten (N, C, *spatial) row-major, or column-major spatially."""
    low = -np.inf if np.issubdtype(x.dtype, np.floating) else np.iinfo(x.dtype).min
    wins, _ = pool_windows(x, a, low)
    y = wins.max(axis=0).astype(x.dtype)
    sp = x.shape[2:]
    if a["storage_order"]:
        flat = np.arange(int(np.prod(sp))).reshape(sp[::-1]).T
    else:
        flat = np.arange(int(np.prod(sp))).reshape(sp)
    base = (np.arange(x.shape[0] * x.shape[1]) * int(np.prod(sp))).reshape(x.shape[:2] + (1,) * len(sp))
    idx_wins, _ = pool_windows(np.broadcast_to(flat + base, x.shape).astype(np.int64), a, -1)
    arg = np.argmax(np.where(idx_wins >= 0, wins, low), axis=0)
    return y, np.take_along_axis(idx_wins, arg[None], axis=0)[0]


@op("AveragePool", Pattern.OPAQUE, infer=_pool_infer, attrs=POOL_ATTRS + [Attr("count_include_pad", "int", 0)])
def average_pool(a: dict, x: np.ndarray) -> np.ndarray:
    """Mean over windows; count_include_pad counts explicit pads, never the ceil-mode overhang."""
    nd = len(a["kernel_shape"])
    pads = a["pads"]
    wins, extra = pool_windows(_acc(x), a, 0.0)
    ones = np.ones((1, 1) + x.shape[2:])
    if a["count_include_pad"]:
        ones = np.pad(ones, [(0, 0), (0, 0)] + [(pads[i], pads[i + nd]) for i in range(nd)], constant_values=1)
        counted = dict(a, pads=(0,) * nd + tuple(extra))
        mask, _ = pool_windows(ones, dict(counted, ceil_mode=0), 0.0)
    else:
        mask, _ = pool_windows(ones, a, 0.0)
    return (wins.sum(axis=0) / mask.sum(axis=0)).astype(x.dtype)


@op("LpPool", Pattern.OPAQUE, infer=_pool_infer, attrs=POOL_ATTRS + [Attr("p", "int", 2)])
def lp_pool(a: dict, x: np.ndarray) -> np.ndarray:
    wins, _ = pool_windows(np.abs(_acc(x)), a, 0.0)
    return (np.sum(wins ** a["p"], axis=0) ** (1.0 / a["p"])).astype(x.dtype)


def _global_infer(a: dict, x: TensorType) -> TensorType:
    return x.with_shape(x.shape[:2] + (1,) * (x.rank - 2))


def _spatial_axes(x: np.ndarray) -> tuple[int, ...]:
    return tuple(range(2, x.ndim))


@op("GlobalAveragePool", Pattern.REDUCTION, infer=_global_infer)
def global_average_pool(a: dict, x: np.ndarray) -> np.ndarray:
    return np.mean(_acc(x), axis=_spatial_axes(x), keepdims=True).astype(x.dtype)


@op("GlobalMaxPool", Pattern.REDUCTION, infer=_global_infer)
def global_max_pool(a: dict, x: np.ndarray) -> np.ndarray:
    return np.max(x, axis=_spatial_axes(x), keepdims=True)


@op("GlobalLpPool", Pattern.REDUCTION, infer=_global_infer, attrs=[Attr("p", "int", 2)])
def global_lp_pool(a: dict, x: np.ndarray) -> np.ndarray:
    p = a["p"]
    return (np.sum(np.abs(_acc(x)) ** p, axis=_spatial_axes(x), keepdims=True) ** (1.0 / p)).astype(x.dtype)


# -- normalization ----------------------------------------------------------------------------------
def _bn_infer(a: dict, x: TensorType, *params: TensorType) -> tuple[TensorType, ...]:
    c = x.shape[1] if x.rank > 1 else 1
    for p in params:
        if p.shape != (c,):
            raise ShapeError(f"BatchNormalization parameters must have shape [{c}] for input {x}, got {p}")
    stat = params[2] if len(params) > 2 else TensorType((c,), x.dtype)
    return (x, stat, stat) if a["training_mode"] else (x,)


@op("BatchNormalization", Pattern.BROADCAST, infer=_bn_infer, inputs=(5, 5),
    attrs=[Attr("epsilon", "float", 1e-5), Attr("momentum", "float", 0.9), Attr("training_mode", "int", 0)])
def batch_norm(a: dict, x, scale, bias, mean, var) -> tuple[np.ndarray, ...]:
    """Inference: normalize with the running statistics; training_mode: batch statistics,
    and also return the updated running mean and variance."""
    shape = (1, -1) + (1,) * (x.ndim - 2)
    xd = _acc(x)
    if a["training_mode"]:
        axes = (0,) + tuple(range(2, x.ndim))
        bmean, bvar = xd.mean(axis=axes), xd.var(axis=axes)
        y = (xd - bmean.reshape(shape)) / np.sqrt(bvar.reshape(shape) + a["epsilon"])
        y = y * scale.reshape(shape) + bias.reshape(shape)
        m = a["momentum"]
        run_mean = mean * m + bmean * (1 - m)
        run_var = var * m + bvar * (1 - m)
        return y.astype(x.dtype), run_mean.astype(mean.dtype), run_var.astype(var.dtype)
    y = (xd - mean.reshape(shape)) / np.sqrt(_acc(var).reshape(shape) + a["epsilon"])
    return (y * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype)


@op("InstanceNormalization", Pattern.OPAQUE, infer=lambda a, x, s, b: x, inputs=(3, 3),
    attrs=[Attr("epsilon", "float", 1e-5)])  # fmt: skip
def instance_norm(a: dict, x, scale, bias) -> np.ndarray:
    axes = tuple(range(2, x.ndim))
    xd = _acc(x)
    y = (xd - xd.mean(axis=axes, keepdims=True)) / np.sqrt(xd.var(axis=axes, keepdims=True) + a["epsilon"])
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return (y * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype)


def _ln_infer(a: dict, x: TensorType, scale: TensorType, bias: TensorType | None = None) -> tuple[TensorType, ...]:
    axis = norm_axis(a["axis"], x.rank)
    stat_dtype = "float32" if a["stash_type"] == 1 else x.dtype
    stat = TensorType(x.shape[:axis] + (1,) * (x.rank - axis), stat_dtype)
    for p in (scale, bias):
        if p is not None and broadcast_shapes(x.shape, p.shape) != x.shape:
            raise ShapeError(f"LayerNormalization scale/bias {p} must broadcast to {x}")
    return x, stat, stat


@op("LayerNormalization", Pattern.OPAQUE, infer=_ln_infer, inputs=(2, 3),
    attrs=[Attr("axis", "int", -1), Attr("epsilon", "float", 1e-5), Attr("stash_type", "int", 1)])  # fmt: skip
def layer_norm(a: dict, x, scale, bias=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Normalize over axes [axis, rank); outputs Y, Mean and InvStdDev."""
    axes = tuple(range(norm_axis(a["axis"], x.ndim), x.ndim))
    xd = _acc(x)
    mean = xd.mean(axis=axes, keepdims=True)
    inv = 1 / np.sqrt(((xd - mean) ** 2).mean(axis=axes, keepdims=True) + a["epsilon"])
    y = (xd - mean) * inv * scale
    if bias is not None:
        y = y + bias
    stat = np.float32 if a["stash_type"] == 1 else x.dtype
    return y.astype(x.dtype), mean.astype(stat), inv.astype(stat)


@op("RMSNormalization", Pattern.OPAQUE, infer=lambda a, x, s: (x,), inputs=(2, 2),
    attrs=[Attr("axis", "int", -1), Attr("epsilon", "float", 1e-5), Attr("stash_type", "int", 1)])  # fmt: skip
def rms_norm(a: dict, x, scale) -> np.ndarray:
    axes = tuple(range(norm_axis(a["axis"], x.ndim), x.ndim))
    xd = _acc(x)
    rms = np.sqrt(np.mean(xd * xd, axis=axes, keepdims=True) + a["epsilon"])
    return (xd / rms * scale).astype(x.dtype)


@op("GroupNormalization", Pattern.OPAQUE, infer=lambda a, x, s, b: x, inputs=(3, 3),
    attrs=[Attr("num_groups", "int"), Attr("epsilon", "float", 1e-5), Attr("stash_type", "int", 1)])  # fmt: skip
def group_norm(a: dict, x, scale, bias) -> np.ndarray:
    """Normalize over groups of channels; scale and bias are per channel (opset 21)."""
    n, c = x.shape[:2]
    g = a["num_groups"]
    xg = _acc(x).reshape(n, g, -1)
    y = (xg - xg.mean(axis=2, keepdims=True)) / np.sqrt(xg.var(axis=2, keepdims=True) + a["epsilon"])
    shape = (1, c) + (1,) * (x.ndim - 2)
    return (y.reshape(x.shape) * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype)


@op("LpNormalization", Pattern.OPAQUE, infer=lambda a, x: x, attrs=[Attr("axis", "int", -1), Attr("p", "int", 2)])
def lp_norm(a: dict, x: np.ndarray) -> np.ndarray:
    axis = norm_axis(a["axis"], x.ndim)
    xd = _acc(x)
    norm = (
        np.sum(np.abs(xd), axis=axis, keepdims=True)
        if a["p"] == 1
        else np.sqrt(np.sum(xd * xd, axis=axis, keepdims=True))
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norm == 0, 0, xd / norm).astype(x.dtype)


@op("MeanVarianceNormalization", Pattern.OPAQUE, infer=lambda a, x: x, attrs=[Attr("axes", "ints", (0, 2, 3))])
def mvn(a: dict, x: np.ndarray) -> np.ndarray:
    axes = norm_axes(a["axes"], x.ndim)
    xd = _acc(x)
    mean = xd.mean(axis=axes, keepdims=True)
    return ((xd - mean) / (np.sqrt(((xd - mean) ** 2).mean(axis=axes, keepdims=True)) + 1e-9)).astype(x.dtype)


@op("LRN", Pattern.OPAQUE, infer=lambda a, x: x,
    attrs=[Attr("size", "int"), Attr("alpha", "float", 1e-4), Attr("beta", "float", 0.75), Attr("bias", "float", 1.0)])
def lrn(a: dict, x: np.ndarray) -> np.ndarray:
    """Local response normalization across channels."""
    size = a["size"]
    sq = np.square(_acc(x))
    lo = (size - 1) // 2
    hi = size - 1 - lo
    padded = np.pad(sq, [(0, 0), (lo, hi)] + [(0, 0)] * (x.ndim - 2))
    total = sum(padded[:, i : i + x.shape[1]] for i in range(size))
    return (x / (a["bias"] + a["alpha"] / size * total) ** a["beta"]).astype(x.dtype)


# -- matrix products ---------------------------------------------------------------------------------
def matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """numpy.matmul output shape (1-d operands promoted and the added axis removed)."""
    if not a or not b:
        raise ShapeError("MatMul operands must have rank >= 1")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ShapeError(f"MatMul inner dims differ: {list(a)} @ {list(b)}")
    out = broadcast_shapes(a2[:-2], b2[:-2]) + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def _matmul_infer(a: dict, x: TensorType, y: TensorType) -> TensorType:
    if x.dtype != y.dtype:
        raise ShapeError(f"MatMul operands must have one dtype, got {x.dtype} and {y.dtype}")
    return TensorType(matmul_shape(x.shape, y.shape), x.dtype)


@op("MatMul", OUT, infer=_matmul_infer, inputs=(2, 2))
def matmul(a: dict, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.matmul(_acc(x), _acc(y)).astype(x.dtype)


def _matmul_int_infer(a: dict, x: TensorType, y: TensorType, *zps) -> TensorType:
    return TensorType(matmul_shape(x.shape, y.shape), "int32")


@op("MatMulInteger", OUT, infer=_matmul_int_infer, inputs=(2, 4))
def matmul_integer(a: dict, x, y, x_zp=None, y_zp=None) -> np.ndarray:
    """Integer matmul with zero points (per tensor, per row of A or per column of B)."""
    xz = 0 if x_zp is None else x_zp.astype(np.int64)
    xz = xz.reshape(-1, 1) if np.ndim(xz) and np.size(xz) > 1 else xz
    yz = 0 if y_zp is None else y_zp.astype(np.int64)
    xi, yi = x.astype(np.int64) - xz, y.astype(np.int64) - yz
    return np.matmul(xi, yi).astype(np.int32)


def _gemm_infer(a: dict, x: TensorType, y: TensorType, c: TensorType | None = None) -> TensorType:
    if x.rank != 2 or y.rank != 2:
        raise ShapeError(f"Gemm needs 2-d operands, got {x} and {y}")
    m, k = x.shape[::-1] if a["transA"] else x.shape
    k2, n = y.shape[::-1] if a["transB"] else y.shape
    if k != k2:
        raise ShapeError(f"Gemm inner dims differ: {x} (transA={a['transA']}) and {y} (transB={a['transB']})")
    if c is not None and broadcast_shapes(c.shape, (m, n)) != (m, n):
        raise ShapeError(f"Gemm C {c} does not broadcast to [{m}, {n}]")
    return TensorType((m, n), x.dtype)


@op("Gemm", OUT, infer=_gemm_infer, inputs=(2, 3),
    attrs=[Attr("alpha", "float", 1.0), Attr("beta", "float", 1.0), Attr("transA", "int", 0), Attr("transB", "int", 0)])
def gemm(a: dict, x, y, c=None) -> np.ndarray:
    """alpha * op(A) @ op(B) + beta * C."""
    xa = _acc(x).T if a["transA"] else _acc(x)
    yb = _acc(y).T if a["transB"] else _acc(y)
    out = a["alpha"] * (xa @ yb)
    if c is not None:
        out = out + a["beta"] * _acc(c)
    return out.astype(x.dtype)


def _einsum_infer(a: dict, *ts: TensorType) -> TensorType:
    dummies = [np.broadcast_to(np.zeros((), np.float32), t.shape) for t in ts]
    return TensorType(np.einsum(a["equation"], *dummies).shape, ts[0].dtype)


@op("Einsum", OUT, infer=_einsum_infer, inputs=(1, None), attrs=[Attr("equation", "str")])
def einsum(a: dict, *xs: np.ndarray) -> np.ndarray:
    return np.einsum(a["equation"], *[_acc(x) for x in xs]).astype(xs[0].dtype)


def _det_infer(a: dict, x: TensorType) -> TensorType:
    if x.rank < 2 or x.shape[-1] != x.shape[-2]:
        raise ShapeError(f"Det needs square matrices, got {x}")
    return x.with_shape(x.shape[:-2])


@op("Det", Pattern.OPAQUE, infer=_det_infer)
def det(a: dict, x: np.ndarray) -> np.ndarray:
    return np.linalg.det(_acc(x)).astype(x.dtype)

