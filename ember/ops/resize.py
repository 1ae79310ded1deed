"""Resize (nearest, linear, cubic; every ONNX coordinate mode; antialias; crop-and-resize).

Resizing is separable: the reference builds one interpolation matrix per resized axis
(out_len x in_len) and applies them one axis at a time."""

from __future__ import annotations

import itertools
import math

import numpy as np

from ember import te
from ember.graph.types import TensorType
from ember.ops.common import ShapeError
from ember.ops.opdef import Attr, Pattern, one_of, op
from ember.ops.te_lib import NotLowerable, keep, lowering, numel, rows
from ember.runtime.plan import RESIZE_POLICIES
from ember.templates.flat import schedule_tables
from ember.tir.expr import Expr

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


def cubic(t: np.ndarray, a: float) -> np.ndarray:
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
            k = cubic((taps - xr) * s, a["cubic_coeff_a"])
        if a["exclude_outside"]:
            inside = (taps >= 0) & (taps < n_in)
            taps, k = taps[inside], k[inside]
        if (a["exclude_outside"] or antialias) and k.sum() != 0:
            k = k / k.sum()
        np.add.at(w[row], np.clip(taps, 0, n_in - 1), k)
    return w, outside


RESIZE_ATTRS = [
    Attr("sizes", "dims"), Attr("scales", "floats", ()), Attr("roi", "floats", ()), Attr("axes", "ints", ()),
    Attr("keep_aspect_ratio_policy", "str", "stretch", **one_of(*RESIZE_POLICIES)),
    Attr("mode", "str", "nearest", **one_of("nearest", "linear", "cubic")),
    Attr("coordinate_transformation_mode", "str", "half_pixel", **one_of(*COORDINATE_MODES)),
    Attr("nearest_mode", "str", "round_prefer_floor", **one_of(*NEAREST_MODES)),
    Attr("cubic_coeff_a", "float", -0.75), Attr("exclude_outside", "int", 0), Attr("extrapolation_value", "float", 0.0),
    Attr("antialias", "int", 0),
]  # fmt: skip


def _resize_infer(a: dict, x: TensorType, roi: TensorType | None = None, scales: TensorType | None = None,
                  sizes: TensorType | None = None) -> TensorType:  # fmt: skip
    if len(a["sizes"]) != x.rank:
        raise ShapeError(f"Resize needs the output sizes of all {x.rank} axes of {x}")
    if scales is None and sizes is None and len(a["scales"]) != x.rank:
        raise ShapeError(f"Resize needs scales for all {x.rank} axes of {x}, or its scales or sizes as an input")
    return x.with_shape(a["sizes"])


@op("Resize", Pattern.INJECTIVE, infer=_resize_infer, inputs=(1, 4), attrs=RESIZE_ATTRS)
def resize(a: dict, x: np.ndarray, roi: np.ndarray | None = None, scales: np.ndarray | None = None,
           sizes: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """Resize to explicit `sizes`; `scales` drive the coordinate transform (ONNX semantics). The scales or sizes
    (and the roi) of `axes` may instead be tensors read at run time, ONNX's inputs."""
    if scales is not None or sizes is not None:
        a = dict(a, **_runtime_resize(a, x.shape, roi, scales, sizes))
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


def _runtime_resize(a: dict, shape: tuple[int, ...], roi: np.ndarray | None, scales: np.ndarray | None,
                    sizes: np.ndarray | None) -> dict:  # fmt: skip
    """The static attributes (full-rank sizes, scales, roi) of a Resize whose scales or sizes are tensors."""
    rank = len(shape)
    axes = tuple(a["axes"]) or tuple(range(rank))
    full_roi = list(a["roi"] or (0.0,) * rank + (1.0,) * rank)
    if roi is not None and roi.size == 2 * len(axes):
        for k, ax in enumerate(axes):
            full_roi[ax], full_roi[ax + rank] = float(roi[k]), float(roi[k + len(axes)])
    crop = a["coordinate_transformation_mode"] == "tf_crop_and_resize"
    out, sc = resize_output(shape, axes, None if scales is None else [float(v) for v in scales.reshape(-1)],
                            None if sizes is None else tuple(int(v) for v in sizes.reshape(-1)),
                            a["keep_aspect_ratio_policy"], tuple(full_roi) if crop else None)  # fmt: skip
    return {"sizes": out, "scales": sc, "roi": tuple(full_roi)}


# -- TE compute -------------------------------------------------------------------------------------
# Per resized axis, small tables of (input index, weight) per output index and tap are computed
# first (the same float64 arithmetic as the reference, in the same order, so nearest-neighbour
# rounding ties fall the same way); the output sums its taps' products over the resized axes.
# Where that product is large (cubic over three axes or more, antialiased downsampling), the axes are resized one
# after another instead: each pass but the last a sum over its own taps, in float64, and the output the last
# axis's taps over it.
MAX_TAPS = 256  # taps per output element along one axis beyond which it runs by reference
FUSED_TAPS = 16  # taps per output element (product over the resized axes) up to which the axes resize in one stage


def _f64(v: float | Expr) -> Expr:
    return te.const(float(v), "float64") if not isinstance(v, Expr) else te.cast(v, "float64")


def _coordinate_te(o: Expr, scale: float | Expr, n_in: int, n_out: int | Expr, mode: str,
                   roi: tuple[float | Expr, float | Expr]) -> Expr:  # fmt: skip
    """`_coordinates` for one output index, in float64 (the scale, output length and roi may be read at run time)."""
    o = te.cast(o, "float64")
    zero = te.const(0.0, "float64")

    def many(value, single: Expr) -> Expr:  # `value()` where the output has more than one element, else `single`
        if isinstance(n_out, Expr):
            return te.if_then_else(n_out > 1, value(), single)
        return value() if n_out > 1 else single

    if mode == "half_pixel":
        return (o + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return many(lambda: (o + 0.5) / scale - 0.5, zero)
    if mode == "half_pixel_symmetric":
        adjust = _f64(n_out) / (scale * n_in)
        return n_in / 2 * (1 - adjust) + (o + 0.5) / scale - 0.5
    if mode == "align_corners":
        return many(lambda: o * (n_in - 1) / (n_in * scale - 1), zero)
    if mode == "asymmetric":
        return o / scale
    if mode == "tf_half_pixel_for_nn":
        return (o + 0.5) / scale
    start, end = _f64(roi[0]), _f64(roi[1])  # tf_crop_and_resize
    return many(lambda: start * (n_in - 1) + o * (end - start) * (n_in - 1) / (_f64(n_out) - 1.0),
                0.5 * (start + end) * (n_in - 1))


def _nearest_te(x: Expr, mode: str) -> Expr:
    if mode == "round_prefer_floor":
        return te.ceil(x - 0.5)
    if mode == "round_prefer_ceil":
        return te.floor(x + 0.5)
    return te.floor(x) if mode == "floor" else te.ceil(x)


def cubic_te(t: Expr, a: float) -> Expr:
    t = te.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return te.if_then_else(t <= 1.0, near, te.if_then_else(t < 2.0, far, te.const(0.0, "float64")))


class _Axis:
    """One resized axis: its taps per output index, as (index table, weight table or None)."""

    def __init__(self, ax: int, n_in: int, n_out: int, scale: float, a: dict, roi: tuple[float, float]):
        self.ax, self.n_in, self.n_out, self.scale, self.a, self.roi = ax, n_in, n_out, scale, a, roi
        self.mode = a["coordinate_transformation_mode"]
        if a["mode"] == "nearest":
            self.taps, self.radius, self.s = 1, 0.0, 1.0
        else:
            if a["antialias"] and isinstance(scale, Expr):
                raise NotLowerable("antialiasing by a scale read at run time (its taps are not known)")
            antialias = bool(a["antialias"]) and scale < 1
            self.s = scale if antialias else 1.0
            self.radius = (1.0 if a["mode"] == "linear" else 2.0) / self.s
            self.taps = math.ceil(2 * self.radius)  # floor(x + r) - floor(x - r) is at most this
            self.normalize = bool(a["exclude_outside"]) or antialias

    def coord(self, o: Expr) -> Expr:
        return _coordinate_te(o, self.scale, self.n_in, self.n_out, self.mode, self.roi)

    def outside(self, o: Expr) -> Expr | None:
        if self.mode != "tf_crop_and_resize":
            return None
        x = self.coord(o)
        return te.any(x < 0.0, x > float(self.n_in - 1))

    def tables(self) -> tuple[te.Tensor, te.Tensor | None]:
        n_in, name = self.n_in, f"resize_ax{self.ax}"
        if self.a["mode"] == "nearest":
            near = lambda o: _nearest_te(self.coord(o), self.a["nearest_mode"])  # noqa: E731
            clipped = lambda o: te.minimum(te.maximum(near(o), 0.0), float(n_in - 1))  # noqa: E731
            return te.compute((self.n_out,), lambda o: te.cast(clipped(o), "int32"), name=name + "_index"), None

        def tap(o: Expr, k: Expr) -> Expr:  # int64 position of tap k (may lie outside the axis)
            return te.cast(te.floor(self.coord(o) - self.radius), "int64") + 1 + k

        def raw(o: Expr, k: Expr) -> Expr:
            x = self.coord(o)
            t = (te.cast(tap(o, k), "float64") - x) * self.s
            if self.a["mode"] == "linear":
                w = te.maximum(1.0 - te.abs(t), 0.0)
            else:
                w = cubic_te(t, self.a["cubic_coeff_a"])
            real = [tap(o, k) <= te.cast(te.floor(x + self.radius), "int64")]  # the tap exists for this x
            if self.a["exclude_outside"]:
                real += [tap(o, k) >= 0, tap(o, k) < n_in]
            return te.if_then_else(te.all(*real), w, te.const(0.0, "float64"))

        index = te.compute((self.n_out, self.taps),
                           lambda o, k: te.cast(te.minimum(te.maximum(tap(o, k), 0), n_in - 1), "int32"),
                           name=name + "_index")  # fmt: skip
        if not self.normalize:
            return index, te.compute((self.n_out, self.taps), raw, name=name + "_weight")

        def total_body(o):
            k = te.reduce_axis((0, self.taps), name="k")
            return te.sum(raw(o, k.var), axis=k)

        total = te.compute((self.n_out,), total_body, name=name + "_total")

        def weight(o, k):
            t = total[o]
            return raw(o, k) / te.if_then_else(t != 0.0, t, te.const(1.0, "float64"))

        return index, te.compute((self.n_out, self.taps), weight, name=name + "_weight")


def _runtime_axes(a: dict, x: te.Tensor, roi_in: te.Tensor | None, scales: te.Tensor | None,
                  sizes: te.Tensor | None) -> list[_Axis]:  # fmt: skip
    """The resized axes when the kernel reads the scales or sizes (and roi): every axis of `axes`, its scale read
    from the scales, or the ratio of its size to its length (the least or greatest ratio for a policy)."""
    rank, axes = x.ndim, tuple(a["axes"]) or tuple(range(x.ndim))
    if not all(isinstance(d, int) for d in x.shape) or 0 in x.shape:
        raise NotLowerable("Resize by scales or sizes read at run time takes an input of static, non-empty shape")
    roi = list(a["roi"] or (0.0,) * rank + (1.0,) * rank)
    if roi_in is not None and roi_in.shape[0] == 2 * len(axes):
        for k, ax in enumerate(axes):
            roi[ax], roi[ax + rank] = te.cast(roi_in[(k,)], "float64"), te.cast(roi_in[(k + len(axes),)], "float64")
    if scales is not None:
        ratio = [te.cast(scales[(k,)], "float64") for k in range(len(axes))]
    else:
        ratio = [te.cast(sizes[(k,)], "float64") / float(x.shape[ax]) for k, ax in enumerate(axes)]
        if a["keep_aspect_ratio_policy"] != "stretch":
            pick = te.minimum if a["keep_aspect_ratio_policy"] == "not_larger" else te.maximum
            r = ratio[0]
            for q in ratio[1:]:
                r = pick(r, q)
            ratio = [r] * len(axes)
    return [_Axis(ax, x.shape[ax], a["sizes"][ax], ratio[k], a, (roi[ax], roi[ax + rank])) for k, ax in enumerate(axes)]


def _resize_pass(src: te.Tensor, ra: _Axis, index: te.Tensor, weight: te.Tensor) -> te.Tensor:
    """`src` resized along one axis, in float64: a sum over the axis's taps (a reduction, so that a fused
    consumer does not inline it: its taps would multiply with the next axis's)."""
    shape = tuple(ra.n_out if d == ra.ax else n for d, n in enumerate(src.shape))

    def body(*o):
        k = te.reduce_axis((0, ra.taps), name=f"k{ra.ax}")
        idx = tuple(index[o[ra.ax], k.var] if d == ra.ax else o[d] for d in range(len(o)))
        v = src[idx] if src.dtype == "float64" else te.cast(src[idx], "float64")
        return te.sum(weight[o[ra.ax], k.var] * v, axis=k)

    return te.compute(shape, body, name=f"resize_ax{ra.ax}_pass")


@lowering("Resize", schedule=schedule_tables("resize"))
def _resize_te(a: dict, x: te.Tensor, roi_in: te.Tensor | None = None, scales: te.Tensor | None = None,
               sizes: te.Tensor | None = None) -> te.Tensor:  # fmt: skip
    rank, shape = x.ndim, tuple(a["sizes"])
    roi = a["roi"] or (0.0,) * rank + (1.0,) * rank
    crop = a["coordinate_transformation_mode"] == "tf_crop_and_resize"
    axes = []
    for ax in range(rank) if scales is None and sizes is None else ():
        n_in, n_out, scale = x.shape[ax], shape[ax], a["scales"][ax]
        if n_in == n_out and scale == 1.0 and not (crop and (roi[ax], roi[ax + rank]) != (0.0, 1.0)):
            continue
        if n_in == 0 and n_out:
            raise NotLowerable(f"Resize of an empty axis {ax}")
        axes.append(_Axis(ax, n_in, n_out, scale, a, (roi[ax], roi[ax + rank])))
    if scales is not None or sizes is not None:
        axes = _runtime_axes(a, x, roi_in, scales, sizes)
    if any(ra.taps > MAX_TAPS for ra in axes):
        raise NotLowerable(f"more than {MAX_TAPS} interpolation taps per output element along one axis")
    if isinstance(numel(shape), int) and not numel(shape) or not axes:
        value = (lambda *i: x[i]) if numel(shape) else (lambda *i: keep(te.const(0, x.dtype), x))
        return te.compute(shape, value, name="resize", tag="resize")
    tables = [ra.tables() for ra in axes]
    src, summed = x, axes  # what the output stage reads, and the axes whose taps it sums
    if a["mode"] != "nearest" and math.prod(ra.taps for ra in axes) > FUSED_TAPS:
        for ra, (index, weight) in zip(axes[:-1], tables[:-1]):
            src = _resize_pass(src, ra, index, weight)
        summed = axes[-1:]
    dt = x.dtype
    if dt.is_int:
        info = np.iinfo(dt.name)
    extrapolate = te.const(a["extrapolation_value"], "float64")

    def finish(v: Expr) -> Expr:  # float64 -> the data type: round half to even and saturate for integers
        if not dt.is_int:
            return te.cast(v, dt)
        return te.cast(te.minimum(te.maximum(te.round(v), float(info.min)), float(info.max)), dt)

    def body(*o):
        outside = [c for ra in axes if (c := ra.outside(o[ra.ax])) is not None]
        if a["mode"] == "nearest":
            idx = list(o)
            for ra, (index, _) in zip(axes, tables):
                idx[ra.ax] = index[o[ra.ax]]
            v = x[tuple(idx)]
            if not outside:
                return v
            return te.if_then_else(te.any(*outside), finish(extrapolate), v)
        terms = []
        for combo in itertools.product(*[range(ra.taps) for ra in summed]):
            idx, w = list(o), None
            for ra, (index, weight), k in zip(summed, tables[len(axes) - len(summed):], combo):
                idx[ra.ax] = index[o[ra.ax], k]
                w = weight[o[ra.ax], k] if w is None else w * weight[o[ra.ax], k]
            v = src[tuple(idx)]
            terms.append(w * (v if src is not x else te.cast(v, "float64")))
        while len(terms) > 1:  # pairwise: a shallow expression even for many antialiasing taps
            terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i] for i in range(0, len(terms), 2)]
        total = terms[0]
        if outside:
            total = te.if_then_else(te.any(*outside), extrapolate, total)
        return finish(total)

    same = rank - 1 - max(ra.ax for ra in axes)  # trailing axes that are not resized
    return te.compute(shape, body, name="resize", tag="resize", attrs=rows(same))
