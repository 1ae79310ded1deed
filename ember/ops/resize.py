"""Resize (nearest, linear, cubic; every ONNX coordinate mode; antialias; crop-and-resize).

Resizing is separable: the reference builds one interpolation matrix per resized axis
(out_len x in_len) and applies them one axis at a time."""

from __future__ import annotations

import numpy as np

from ember.graph.types import TensorType
from ember.ops.common import ShapeError
from ember.ops.opdef import Attr, Pattern, one_of, op

COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                    "tf_crop_and_resize", "tf_half_pixel_for_nn")  # fmt: skip
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def resize_output(
    shape: tuple[int, ...], axes: tuple[int, ...], scales: list[float] | None, sizes: tuple[int, ...] | None,
    policy: str = "stretch", roi: tuple[float, ...] | None = None,
) -> tuple[tuple[int, ...], tuple[float, ...]]:  # fmt: skip
    """Full-rank output sizes and scales from ONNX's scales or sizes (given for `axes`)."""
    rank = len(shape)
    out, sc = list(shape), [1.0] * rank
    if scales is not None:
        if len(scales) != len(axes):
            raise ValueError(f"Resize has {len(scales)} scales for {len(axes)} axes")
        for ax, s in zip(axes, scales):
            extent = (roi[ax + rank] - roi[ax]) if roi is not None else 1.0
            sc[ax], out[ax] = s, int(np.floor(shape[ax] * extent * s + 1e-9))
        return tuple(out), tuple(sc)
    if sizes is None or len(sizes) != len(axes):
        raise ValueError("Resize needs scales or sizes (one per resized axis)")
    ratios = [sz / shape[ax] for ax, sz in zip(axes, sizes)]
    if policy in ("not_larger", "not_smaller"):
        r = min(ratios) if policy == "not_larger" else max(ratios)
        for ax in axes:
            sc[ax], out[ax] = r, int(np.floor(shape[ax] * r + 0.5))
    else:
        for ax, sz, r in zip(axes, sizes, ratios):
            sc[ax], out[ax] = r, int(sz)
    return tuple(out), tuple(sc)


def _coordinates(o: np.ndarray, scale: float, n_in: int, n_out: int, mode: str, roi: tuple[float, float]) -> np.ndarray:
    """Input coordinate of each output index (ONNX coordinate_transformation_mode)."""
    if mode == "half_pixel":
        return (o + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adjust = n_out / (scale * n_in)
        return n_in / 2 * (1 - adjust) + (o + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (o + 0.5) / scale - 0.5 if n_out > 1 else np.zeros_like(o)
    if mode == "align_corners":  # the resized length is the unrounded n_in * scale
        return o * (n_in - 1) / (n_in * scale - 1) if n_out > 1 else np.zeros_like(o)
    if mode == "asymmetric":
        return o / scale
    if mode == "tf_half_pixel_for_nn":
        return (o + 0.5) / scale
    start, end = roi  # tf_crop_and_resize
    if n_out > 1:
        return start * (n_in - 1) + o * (end - start) * (n_in - 1) / (n_out - 1)
    return np.full_like(o, 0.5 * (start + end) * (n_in - 1))


def _cubic(t: np.ndarray, a: float) -> np.ndarray:
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def _nearest(x: np.ndarray, mode: str) -> np.ndarray:
    if mode == "round_prefer_floor":
        return np.ceil(x - 0.5)
    if mode == "round_prefer_ceil":
        return np.floor(x + 0.5)
    return np.floor(x) if mode == "floor" else np.ceil(x)


def axis_weights(
    n_in: int, n_out: int, scale: float, a: dict, roi: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray]:
    """(W, outside): out = W @ in along the axis; outside marks crop-and-resize extrapolation."""
    o = np.arange(n_out, dtype=np.float64)
    x = _coordinates(o, scale, n_in, n_out, a["coordinate_transformation_mode"], roi)
    outside = (x < 0) | (x > n_in - 1) if a["coordinate_transformation_mode"] == "tf_crop_and_resize" else x < -np.inf
    w = np.zeros((n_out, n_in))
    if a["mode"] == "nearest":
        idx = np.clip(_nearest(x, a["nearest_mode"]), 0, n_in - 1).astype(np.int64)
        w[np.arange(n_out), idx] = 1.0
        return w, outside
    antialias = bool(a["antialias"]) and scale < 1
    s = scale if antialias else 1.0
    radius = (1.0 if a["mode"] == "linear" else 2.0) / s
    for row, xr in enumerate(x):
        taps = np.arange(int(np.floor(xr - radius)) + 1, int(np.floor(xr + radius)) + 1)
        if a["mode"] == "linear":
            k = np.maximum(0.0, 1 - np.abs((taps - xr) * s))
        else:
            k = _cubic((taps - xr) * s, a["cubic_coeff_a"])
        if a["exclude_outside"]:
            inside = (taps >= 0) & (taps < n_in)
            taps, k = taps[inside], k[inside]
        if (a["exclude_outside"] or antialias) and k.sum() != 0:
            k = k / k.sum()
        np.add.at(w[row], np.clip(taps, 0, n_in - 1), k)
    return w, outside


RESIZE_ATTRS = [
    Attr("sizes", "ints"), Attr("scales", "floats"), Attr("roi", "floats", ()),
    Attr("mode", "str", "nearest", **one_of("nearest", "linear", "cubic")),
    Attr("coordinate_transformation_mode", "str", "half_pixel", **one_of(*COORDINATE_MODES)),
    Attr("nearest_mode", "str", "round_prefer_floor", **one_of(*NEAREST_MODES)),
    Attr("cubic_coeff_a", "float", -0.75), Attr("exclude_outside", "int", 0), Attr("extrapolation_value", "float", 0.0),
    Attr("antialias", "int", 0),
]  # fmt: skip


def _resize_infer(a: dict, x: TensorType) -> TensorType:
    if len(a["sizes"]) != x.rank or len(a["scales"]) != x.rank:
        raise ShapeError(f"Resize needs sizes and scales for all {x.rank} axes of {x}")
    return x.with_shape(a["sizes"])


@op("Resize", Pattern.INJECTIVE, infer=_resize_infer, attrs=RESIZE_ATTRS)
def resize(a: dict, x: np.ndarray) -> np.ndarray:
    """Resize to explicit `sizes`; `scales` drive the coordinate transform (ONNX semantics)."""
    rank = x.ndim
    roi = a["roi"] or (0.0,) * rank + (1.0,) * rank
    y = x.astype(np.float64)
    outside_all = np.zeros(a["sizes"], dtype=bool)
    crop = a["coordinate_transformation_mode"] == "tf_crop_and_resize"
    for ax in range(rank):
        n_in, n_out, scale = x.shape[ax], a["sizes"][ax], a["scales"][ax]
        if n_in == n_out and scale == 1.0 and not (crop and (roi[ax], roi[ax + rank]) != (0.0, 1.0)):
            continue
        w, outside = axis_weights(n_in, n_out, scale, a, (roi[ax], roi[ax + rank]))
        y = np.moveaxis(np.tensordot(y, w, axes=([ax], [1])), -1, ax)
        shape = [1] * rank
        shape[ax] = n_out
        outside_all |= outside.reshape(shape)
    y = np.where(outside_all, a["extrapolation_value"], y)
    if np.issubdtype(x.dtype, np.integer):
        info = np.iinfo(x.dtype)
        y = np.clip(np.rint(y), info.min, info.max)
    return y.astype(x.dtype)
