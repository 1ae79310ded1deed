"""Sampling and detection operators: GridSample, RoiAlign, DeformConv, Col2Im, MaxUnpool,
NonMaxSuppression."""

from __future__ import annotations

import itertools

import numpy as np

from ember import te
from ember.graph.types import TensorType
from ember.ops.common import ShapeError
from ember.ops.opdef import Attr, Pattern, one_of, op
from ember.ops.resize import cubic, cubic_te
from ember.ops.te_lib import NotLowerable, keep, lowering, numel
from ember.templates.flat import schedule_tables
from ember.tir.expr import Expr

# -- GridSample --------------------------------------------------------------------------------------
GRID_ATTRS = [
    Attr("align_corners", "int", 0),
    Attr("mode", "str", "linear", **one_of("linear", "nearest", "cubic", "bilinear", "bicubic")),
    Attr("padding_mode", "str", "zeros", **one_of("zeros", "border", "reflection")),
]  # fmt: skip


def _grid_infer(a: dict, x: TensorType, grid: TensorType) -> TensorType:
    if grid.rank != x.rank or grid.shape[-1] != x.rank - 2 or grid.shape[0] != x.shape[0]:
        raise ShapeError(f"GridSample grid {grid} does not match input {x}")
    return x.with_shape(x.shape[:2] + grid.shape[1:-1])


def _reflect(coord: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Reflect coordinates into [lo, hi] (repeatedly, like a mirror)."""
    span = hi - lo
    if span <= 0:
        return np.zeros_like(coord)
    d = np.abs(coord - lo) % (2 * span)
    return lo + np.where(d > span, 2 * span - d, d)


def _fix_index(idx: np.ndarray, size: int, padding: str, align: bool) -> tuple[np.ndarray, np.ndarray]:
    """(index to read, validity) for integer tap positions under the padding mode."""
    if padding == "zeros":
        return np.clip(idx, 0, size - 1), (idx >= 0) & (idx < size)
    if padding == "border":
        return np.clip(idx, 0, size - 1), np.ones(idx.shape, bool)
    lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
    return np.clip(np.round(_reflect(idx.astype(np.float64), lo, hi)).astype(np.int64), 0, size - 1), np.ones(
        idx.shape, bool)  # fmt: skip


def _taps(coord: np.ndarray, mode: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """(integer positions, weights) of the interpolation taps along one axis."""
    if mode == "nearest":
        return [(np.rint(coord).astype(np.int64), np.ones_like(coord))]
    base = np.floor(coord).astype(np.int64)
    frac = coord - base
    if mode == "linear":
        return [(base, 1 - frac), (base + 1, frac)]
    return [(base + k, cubic(frac - k, -0.75)) for k in (-1, 0, 1, 2)]


@op("GridSample", Pattern.OPAQUE, infer=_grid_infer, inputs=(2, 2), attrs=GRID_ATTRS)
def grid_sample(a: dict, x: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Sample x at normalized grid coordinates (last grid axis ordered x, y[, z])."""
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(a["mode"], a["mode"])
    align, padding = bool(a["align_corners"]), a["padding_mode"]
    n, c = x.shape[:2]
    spatial = x.shape[2:]
    nd = len(spatial)
    g = grid.astype(np.float64)
    coords = []
    for d in range(nd):  # grid component d indexes spatial axis nd-1-d
        size = spatial[nd - 1 - d]
        u = g[..., d]
        u = (u + 1) / 2 * (size - 1) if align else ((u + 1) * size - 1) / 2
        if padding == "border":
            u = np.clip(u, 0, size - 1)
        elif padding == "reflection":
            u = _reflect(u, 0.0, size - 1.0) if align else _reflect(u, -0.5, size - 0.5)
        coords.append(u)
    coords = coords[::-1]  # now ordered like the spatial axes
    out = np.zeros((n, c) + grid.shape[1:-1])
    xd = x.astype(np.float64)
    batch = np.arange(n).reshape((n,) + (1,) * (grid.ndim - 2))
    for combo in itertools.product(*[_taps(u, mode) for u in coords]):
        weight, valid, index = 1.0, True, []
        for axis, (pos, w) in enumerate(combo):
            fixed, ok = _fix_index(pos, spatial[axis], padding, align)
            weight, valid = weight * w, valid & ok
            index.append(fixed)
        vals = np.moveaxis(xd[(batch, slice(None), *index)], -1, 1)  # (N, *out, C) -> (N, C, *out)
        out += vals * (weight * valid)[:, None]
    return out.astype(x.dtype)


# -- RoiAlign ----------------------------------------------------------------------------------------
ROI_ATTRS = [
    Attr("coordinate_transformation_mode", "str", "half_pixel", **one_of("half_pixel", "output_half_pixel")),
    Attr("mode", "str", "avg", **one_of("avg", "max")), Attr("output_height", "int", 1),
    Attr("output_width", "int", 1), Attr("sampling_ratio", "int", 0), Attr("spatial_scale", "float", 1.0),
]  # fmt: skip


def _roi_infer(a: dict, x: TensorType, rois: TensorType, idx: TensorType) -> TensorType:
    return x.with_shape((rois.shape[0], x.shape[1], a["output_height"], a["output_width"]))


def _bilinear_terms(img: np.ndarray, y: float, x: float) -> list[np.ndarray]:
    """The four weighted corner terms (C,) of a bilinear sample; empty outside the image."""
    h, w = img.shape[1:]
    if y < -1.0 or y > h or x < -1.0 or x > w:
        return []
    y, x = max(y, 0.0), max(x, 0.0)
    y0, x0 = int(y), int(x)
    if y0 >= h - 1:
        y0 = y1 = h - 1
        y = float(y0)
    else:
        y1 = y0 + 1
    if x0 >= w - 1:
        x0 = x1 = w - 1
        x = float(x0)
    else:
        x1 = x0 + 1
    ly, lx = y - y0, x - x0
    hy, hx = 1 - ly, 1 - lx
    return [hy * hx * img[:, y0, x0], hy * lx * img[:, y0, x1], ly * hx * img[:, y1, x0], ly * lx * img[:, y1, x1]]


@op("RoiAlign", Pattern.OPAQUE, infer=_roi_infer, inputs=(3, 3), attrs=ROI_ATTRS)
def roi_align(a: dict, x: np.ndarray, rois: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Average (or max) of bilinear samples on a regular grid inside each region's bins."""
    oh, ow, scale = a["output_height"], a["output_width"], a["spatial_scale"]
    offset = 0.5 if a["coordinate_transformation_mode"] == "half_pixel" else 0.0
    out = np.zeros((rois.shape[0], x.shape[1], oh, ow))
    for r, (roi, b) in enumerate(zip(rois.astype(np.float64), idx.astype(np.int64))):
        img = x[b].astype(np.float64)
        x0, y0, x1, y1 = roi * scale - offset
        rw, rh = x1 - x0, y1 - y0
        if not offset:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / oh, rw / ow
        gh = a["sampling_ratio"] or int(np.ceil(rh / oh))
        gw = a["sampling_ratio"] or int(np.ceil(rw / ow))
        for ph, pw in itertools.product(range(oh), range(ow)):
            acc = np.zeros(x.shape[1]) if a["mode"] == "avg" else np.full(x.shape[1], -np.inf)
            for iy, ix in itertools.product(range(gh), range(gw)):
                yy = y0 + ph * bh + (iy + 0.5) * bh / gh
                xx = x0 + pw * bw + (ix + 0.5) * bw / gw
                terms = _bilinear_terms(img, yy, xx)
                if a["mode"] == "avg":
                    acc = acc + (sum(terms) if terms else 0.0)
                else:
                    acc = np.maximum(acc, np.max(terms, axis=0) if terms else 0.0)
            out[r, :, ph, pw] = acc / max(gh * gw, 1) if a["mode"] == "avg" else acc
    return out.astype(x.dtype)


# -- DeformConv --------------------------------------------------------------------------------------
DEFORM_ATTRS = [Attr("strides", "ints"), Attr("pads", "ints"), Attr("dilations", "ints"), Attr("group", "int", 1),
                Attr("offset_group", "int", 1)]  # fmt: skip


def _deform_infer(a: dict, x: TensorType, w: TensorType, offset: TensorType, *rest) -> TensorType:
    return x.with_shape((x.shape[0], w.shape[0]) + offset.shape[2:])


def _sample_zero_padded(img: np.ndarray, y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Bilinear samples of img (C, H, W) at arrays y, x; corners outside the image read 0."""
    h, w = img.shape[1:]
    y0, x0 = np.floor(y).astype(np.int64), np.floor(x).astype(np.int64)
    out = np.zeros((img.shape[0],) + y.shape)
    for dy, dx in itertools.product((0, 1), (0, 1)):
        yy, xx = y0 + dy, x0 + dx
        wgt = (1 - np.abs(y - yy)) * (1 - np.abs(x - xx))
        ok = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
        out += img[:, np.clip(yy, 0, h - 1), np.clip(xx, 0, w - 1)] * (wgt * ok)
    return out


@op("DeformConv", Pattern.OPAQUE, infer=_deform_infer, inputs=(3, 5), attrs=DEFORM_ATTRS)
def deform_conv(a: dict, x, w, offset, b=None, mask=None) -> np.ndarray:
    """2-d deformable convolution: each kernel tap samples at its position plus a learned offset."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    oh, ow = offset.shape[2:]
    sh, sw = a["strides"]
    dh, dw = a["dilations"]
    ph, pw = a["pads"][:2]
    og = a["offset_group"]
    off = offset.reshape(n, og, kh * kw, 2, oh, ow).astype(np.float64)
    msk = np.ones((n, og, kh * kw, oh, ow)) if mask is None else mask.reshape(n, og, kh * kw, oh, ow)
    base_y = (np.arange(oh) * sh - ph)[:, None]
    base_x = (np.arange(ow) * sw - pw)[None, :]
    cols = np.zeros((n, c, kh * kw, oh, ow))
    per_group = c // og
    for bi, gi, k in itertools.product(range(n), range(og), range(kh * kw)):
        y = base_y + (k // kw) * dh + off[bi, gi, k, 0]
        xx = base_x + (k % kw) * dw + off[bi, gi, k, 1]
        chans = slice(gi * per_group, (gi + 1) * per_group)
        cols[bi, chans, k] = _sample_zero_padded(x[bi, chans].astype(np.float64), y, xx) * msk[bi, gi, k]
    g = a["group"]
    cols = cols.reshape(n, g, (c // g) * kh * kw, oh * ow)
    out = np.matmul(w.astype(np.float64).reshape(g, m // g, -1)[None], cols).reshape(n, m, oh, ow)
    if b is not None:
        out = out + b.reshape(1, -1, 1, 1)
    return out.astype(x.dtype)


# -- Col2Im ------------------------------------------------------------------------------------------
COL2IM_ATTRS = [Attr("image_shape", "ints"), Attr("block_shape", "ints"), Attr("strides", "ints", ()),
                Attr("pads", "ints", ()), Attr("dilations", "ints", ())]  # fmt: skip


def _col2im_infer(a: dict, x: TensorType) -> TensorType:
    blocks = int(np.prod(a["block_shape"]))
    return x.with_shape((x.shape[0], x.shape[1] // blocks) + tuple(a["image_shape"]))


@op("Col2Im", Pattern.OPAQUE, infer=_col2im_infer, attrs=COL2IM_ATTRS)
def col2im(a: dict, x: np.ndarray) -> np.ndarray:
    """Sum sliding blocks (N, C*prod(block), L) back into an image (inverse of im2col)."""
    image, block = tuple(a["image_shape"]), tuple(a["block_shape"])
    nd = len(image)
    strides = a["strides"] or (1,) * nd
    dil = a["dilations"] or (1,) * nd
    pads = a["pads"] or (0,) * (2 * nd)
    n, c = x.shape[0], x.shape[1] // int(np.prod(block))
    padded = tuple(image[i] + pads[i] + pads[i + nd] for i in range(nd))
    counts = [(padded[i] - dil[i] * (block[i] - 1) - 1) // strides[i] + 1 for i in range(nd)]
    out = np.zeros((n, c) + padded, dtype=np.float64)
    cols = x.reshape((n, c) + block + tuple(counts)).astype(np.float64)
    for kidx in np.ndindex(*block):
        index = tuple(slice(k * d, k * d + s * (o - 1) + 1, s) for k, d, s, o in zip(kidx, dil, strides, counts))
        out[(Ellipsis,) + index] += cols[(slice(None), slice(None)) + kidx]
    crop = tuple(slice(pads[i], pads[i] + image[i]) for i in range(nd))
    return out[(Ellipsis,) + crop].astype(x.dtype)


# -- MaxUnpool ---------------------------------------------------------------------------------------
def _unpool_infer(a: dict, x: TensorType, idx: TensorType) -> TensorType:
    return x.with_shape(tuple(a["output_shape"]))


@op("MaxUnpool", Pattern.OPAQUE, infer=_unpool_infer, inputs=(2, 2),
    attrs=[Attr("unpooled_shape", "ints"), Attr("output_shape", "ints")])  # fmt: skip
def max_unpool(a: dict, x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Scatter pooled values to the flat positions MaxPool's Indices recorded (positions in
    `unpooled_shape`, the shape the pooling inverts), then pad at the ends to `output_shape`."""
    base = np.zeros(int(np.prod(a["unpooled_shape"])), x.dtype)
    base[idx.reshape(-1)] = x.reshape(-1)
    base = base.reshape(a["unpooled_shape"])
    return np.pad(base, [(0, o - b) for o, b in zip(a["output_shape"], a["unpooled_shape"])])


# -- NonMaxSuppression -------------------------------------------------------------------------------
def _iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    lo = np.maximum(box[:2], others[:, :2])
    hi = np.minimum(box[2:], others[:, 2:])
    inter = np.prod(np.clip(hi - lo, 0, None), axis=1)
    area = lambda b: np.prod(b[..., 2:] - b[..., :2], axis=-1)  # noqa: E731
    union = area(box) + area(others) - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def _corners(boxes: np.ndarray, center: bool) -> np.ndarray:
    """Boxes as (y1, x1, y2, x2) with y1 <= y2 and x1 <= x2."""
    if center:
        xc, yc, w, h = boxes.T
        return np.stack([yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2], axis=1)
    y1, x1, y2, x2 = boxes.T
    return np.stack([np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2), np.maximum(x1, x2)], axis=1)


def _nms_infer(a: dict, *ts) -> TensorType:
    from ember.ops.opdef import ShapeDependsOnData

    raise ShapeDependsOnData("the number of boxes NonMaxSuppression keeps depends on the data")


@op("NonMaxSuppression", Pattern.OPAQUE, infer=_nms_infer, inputs=(2, 5), attrs=[Attr("center_point_box", "int", 0)])
def non_max_suppression(a: dict, boxes, scores, max_out=None, iou_thr=None, score_thr=None) -> np.ndarray:
    """Greedy per-class selection by score; returns rows (batch, class, box index)."""
    limit = int(max_out.reshape(-1)[0]) if max_out is not None and max_out.size else 0
    iou_t = float(iou_thr.reshape(-1)[0]) if iou_thr is not None and iou_thr.size else 0.0
    score_t = float(score_thr.reshape(-1)[0]) if score_thr is not None and score_thr.size else None
    picked = []
    for b in range(boxes.shape[0]):
        corners = _corners(boxes[b].astype(np.float64), bool(a["center_point_box"]))
        for c in range(scores.shape[1]):
            s = scores[b, c].astype(np.float64)
            order = [i for i in np.argsort(-s, kind="stable") if score_t is None or s[i] > score_t]
            keep: list[int] = []
            for i in order:
                if len(keep) >= limit:
                    break
                if not keep or np.all(_iou(corners[i], corners[keep]) <= iou_t):
                    keep.append(int(i))
            picked += [(b, c, i) for i in keep]
    return np.array(picked, dtype=np.int64).reshape(-1, 3)


# -- TE computes -------------------------------------------------------------------------------------
# The samplers mirror the references' float64 arithmetic; taps outside the image read a clamped
# (in-bounds) element and get weight 0, so no load needs a guard.
def _f64(v: Expr) -> Expr:
    return te.cast(v, "float64")


def _clamp_index(pos: Expr, size: int) -> Expr:
    """A float64 position clamped into [0, size) and made an integer index."""
    return te.cast(te.minimum(te.maximum(pos, 0.0), float(size - 1)), "int32" if size <= 2**31 else "int64")


def _reflect_te(u: Expr, lo: float, hi: float) -> Expr:
    span = hi - lo
    if span <= 0:
        return te.const(0.0, "float64")
    d = te.abs(u - lo) % (2 * span)
    return lo + te.if_then_else(d > span, 2 * span - d, d)


def _grid_taps(u: Expr, mode: str) -> list[tuple[Expr, Expr]]:
    """(float64 integer-valued position, weight) of the taps along one axis (`_taps`)."""
    if mode == "nearest":
        return [(te.round(u), te.const(1.0, "float64"))]
    base = te.floor(u)
    frac = u - base
    if mode == "linear":
        return [(base, 1.0 - frac), (base + 1.0, frac)]
    return [(base + float(k), cubic_te(frac - float(k), -0.75)) for k in (-1, 0, 1, 2)]


@lowering("GridSample", schedule=schedule_tables("grid_sample"))
def _grid_sample_te(a: dict, x: te.Tensor, grid: te.Tensor) -> te.Tensor:
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(a["mode"], a["mode"])
    align, padding = bool(a["align_corners"]), a["padding_mode"]
    n, c, spatial = x.shape[0], x.shape[1], x.shape[2:]
    nd, out_sp = len(spatial), grid.shape[1:-1]
    shape = (n, c) + out_sp
    if not all(spatial) and numel(shape):
        raise NotLowerable("GridSample of an empty image")

    def coordinate(d: int) -> te.Tensor:
        """Input position along spatial axis d for each output point (grid component nd - 1 - d)."""
        size = spatial[d]

        def body(*i):
            u = _f64(grid[i + (nd - 1 - d,)])
            u = (u + 1) / 2 * (size - 1) if align else ((u + 1) * size - 1) / 2
            if padding == "border":
                return te.minimum(te.maximum(u, 0.0), float(size - 1))
            if padding == "reflection":
                return _reflect_te(u, 0.0, size - 1.0) if align else _reflect_te(u, -0.5, size - 0.5)
            return u

        return te.compute((n,) + out_sp, body, name=f"grid_coord{d}")

    coords = [coordinate(d) for d in range(nd)]
    ntaps = {"nearest": 1, "linear": 2, "cubic": 4}[mode]

    def fix(pos: Expr, size: int) -> tuple[Expr, Expr | None]:  # (index, validity) as `_fix_index`
        if padding == "zeros":
            return _clamp_index(pos, size), te.all(pos >= 0.0, pos < float(size))
        if padding == "border":
            return _clamp_index(pos, size), None
        lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
        return _clamp_index(te.round(_reflect_te(pos, lo, hi)), size), None

    def taps(d: int) -> tuple[te.Tensor, te.Tensor]:
        """Tables [tap, n, *out] of the index along axis d and its weight (0 where the tap is outside and
        padding reads zeros: weight * valid of the reference, one axis at a time)."""

        def pick(t: Expr, b: Expr, p: tuple, want_index: bool) -> Expr:
            size, out = spatial[d], None
            for k, (pos, w) in reversed(list(enumerate(_grid_taps(coords[d][(b,) + p], mode)))):
                index, ok = fix(pos, size)
                if ok is not None:
                    w = w * te.if_then_else(ok, te.const(1.0, "float64"), te.const(0.0, "float64"))
                v = index if want_index else w
                out = v if out is None else te.if_then_else(t == k, v, out)
            return out

        tshape = (ntaps, n) + out_sp
        index = te.compute(tshape, lambda *i: pick(i[0], i[1], i[2:], True), name=f"grid_index{d}")
        weight = te.compute(tshape, lambda *i: pick(i[0], i[1], i[2:], False), name=f"grid_weight{d}")
        return index, weight

    tables = [taps(d) for d in range(nd)]

    def body(*i):
        b, ch, p = i[0], i[1], i[2:]
        total = None
        for combo in itertools.product(range(ntaps), repeat=nd):
            weight = None
            for (_, w), k in zip(tables, combo):
                weight = w[(k, b) + p] if weight is None else weight * w[(k, b) + p]
            index = tuple(ix[(k, b) + p] for (ix, _), k in zip(tables, combo))
            term = _f64(x[(b, ch) + index]) * weight
            total = term if total is None else total + term
        return te.cast(total, x.dtype)

    return te.compute(shape, body, name="grid_sample", tag="grid_sample")


@lowering("RoiAlign")
def _roi_align_te(a: dict, x: te.Tensor, rois: te.Tensor, idx: te.Tensor) -> te.Tensor:
    if a["sampling_ratio"] <= 0:
        raise NotLowerable("adaptive sampling_ratio: the number of samples per bin depends on the roi sizes (data)")
    if x.ndim != 4:
        raise NotLowerable("RoiAlign of a non-4-D input")
    oh, ow, scale, g = a["output_height"], a["output_width"], a["spatial_scale"], a["sampling_ratio"]
    offset = 0.5 if a["coordinate_transformation_mode"] == "half_pixel" else 0.0
    n, c, h, w = x.shape
    shape = (rois.shape[0], c, oh, ow)
    if not (n and h and w) and numel(shape):
        raise NotLowerable("RoiAlign of an empty image")

    def sample(r: Expr, ch: Expr, yy: Expr, xx: Expr) -> Expr:
        """`_bilinear_terms` summed (avg) or maxed (max); 0 outside the image."""
        img = te.minimum(te.maximum(idx[r], 0), n - 1)
        outside = te.any(yy < -1.0, yy > float(h), xx < -1.0, xx > float(w))
        corners = []
        for v, size in ((yy, h), (xx, w)):
            v = te.maximum(v, 0.0)
            last = te.floor(v) >= float(size - 1)  # int(v) == floor(v) for v >= 0
            lo = te.if_then_else(last, float(size - 1), te.floor(v))
            v = te.if_then_else(last, lo, v)
            hi = te.if_then_else(last, lo, lo + 1.0)
            frac = v - lo
            corners.append(((lo, 1 - frac), (hi, frac)))
        terms = [wy * wx * _f64(x[img, ch, te.cast(py, "int64"), te.cast(px, "int64")])
                 for (py, wy), (px, wx) in itertools.product(*corners)]  # fmt: skip
        if a["mode"] == "avg":
            value = terms[0] + terms[1] + terms[2] + terms[3]
        else:
            value = te.maximum(te.maximum(terms[0], terms[1]), te.maximum(terms[2], terms[3]))
        return te.if_then_else(outside, te.const(0.0, "float64"), value)

    def acc_body(r, ch, ph, pw):
        iy, ix = te.reduce_axis((0, g), name="iy"), te.reduce_axis((0, g), name="ix")
        x0, y0, x1, y1 = (_f64(rois[r, k]) * scale - offset for k in range(4))
        rw, rh = x1 - x0, y1 - y0
        if not offset:
            rw, rh = te.maximum(rw, 1.0), te.maximum(rh, 1.0)
        bh, bw = rh / oh, rw / ow
        yy = y0 + _f64(ph) * bh + (_f64(iy.var) + 0.5) * bh / g
        xx = x0 + _f64(pw) * bw + (_f64(ix.var) + 0.5) * bw / g
        reducer = te.sum if a["mode"] == "avg" else te.max
        return reducer(sample(r, ch, yy, xx), axis=[iy, ix])

    acc = te.compute(shape, acc_body, name="roi_align_acc")
    if a["mode"] == "avg":
        return te.compute(shape, lambda *o: te.cast(acc[o] / float(g * g), x.dtype), name="roi_align")
    return te.compute(shape, lambda *o: te.cast(acc[o], x.dtype), name="roi_align")


@lowering("DeformConv", schedule=schedule_tables("deform_conv"))
def _deform_conv_te(a: dict, x: te.Tensor, w: te.Tensor, offset: te.Tensor, b: te.Tensor | None = None,
                    mask: te.Tensor | None = None) -> te.Tensor:  # fmt: skip
    if x.ndim != 4:
        raise NotLowerable("DeformConv of a non-2-D image")
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    oh, ow = offset.shape[2:]
    (sh, sw), (dh, dw), (ph, pw) = a["strides"], a["dilations"], a["pads"][:2]
    og, groups = a["offset_group"], a["group"]
    per_group, taps = c // og, kh * kw
    if not (h and wd) and numel((n, m, oh, ow)):
        raise NotLowerable("DeformConv of an empty image")

    def cols_body(bi, ch, k, oy, ox):
        """Channel ch of the input sampled at kernel tap k of output position (oy, ox), times the mask."""
        gi = ch // per_group
        y = _f64(oy * sh - ph + k // kw * dh) + _f64(offset[bi, (gi * taps + k) * 2, oy, ox])
        xx = _f64(ox * sw - pw + k % kw * dw) + _f64(offset[bi, (gi * taps + k) * 2 + 1, oy, ox])
        y0, x0 = te.floor(y), te.floor(xx)
        total = None
        for dy, dx in itertools.product((0.0, 1.0), (0.0, 1.0)):
            yy, xc = y0 + dy, x0 + dx
            wgt = (1.0 - te.abs(y - yy)) * (1.0 - te.abs(xx - xc))
            ok = te.all(yy >= 0.0, yy < float(h), xc >= 0.0, xc < float(wd))
            v = _f64(x[bi, ch, _clamp_index(yy, h), _clamp_index(xc, wd)])
            term = v * (wgt * te.if_then_else(ok, te.const(1.0, "float64"), te.const(0.0, "float64")))
            total = term if total is None else total + term
        if mask is not None:
            total = total * _f64(mask[bi, gi * taps + k, oy, ox])
        return total

    cols = te.compute((n, c, taps, oh, ow), cols_body, name="deform_cols")
    per_out = m // groups

    def acc_body(bi, o, oy, ox):
        ci, k = te.reduce_axis((0, cg), name="ci"), te.reduce_axis((0, taps), name="k")
        src = o // per_out * cg + ci.var
        return te.sum(_f64(w[o, ci.var, k.var // kw, k.var % kw]) * cols[bi, src, k.var, oy, ox], axis=[ci, k])

    acc = te.compute((n, m, oh, ow), acc_body, name="deform_acc")

    def out_body(bi, o, oy, ox):
        v = acc[bi, o, oy, ox]
        return te.cast(v + _f64(b[o]) if b is not None else v, x.dtype)

    return te.compute((n, m, oh, ow), out_body, name="deform_conv", tag="deform_conv")


@lowering("Col2Im")
def _col2im_te(a: dict, x: te.Tensor) -> te.Tensor:
    image, block = tuple(a["image_shape"]), tuple(a["block_shape"])
    nd = len(image)
    strides, dil = a["strides"] or (1,) * nd, a["dilations"] or (1,) * nd
    pads = a["pads"] or (0,) * (2 * nd)
    n, c = x.shape[0], x.shape[1] // numel(block)
    padded = tuple(image[i] + pads[i] + pads[i + nd] for i in range(nd))
    counts = [(padded[i] - dil[i] * (block[i] - 1) - 1) // strides[i] + 1 for i in range(nd)]
    shape = (n, c) + image
    if numel(block) == 0 or min(counts, default=1) <= 0:
        raise NotLowerable("Col2Im with no blocks")

    def acc_body(*o):
        ks = [te.reduce_axis((0, k), name=f"k{d}") for d, k in enumerate(block)]
        conds, pos = [], []
        for d in range(nd):
            q = o[2 + d] + pads[d] - ks[d].var * dil[d]  # where the block's tap k lands, in block steps * stride
            conds += [q >= 0, q % strides[d] == 0, q // strides[d] < counts[d]]
            pos.append(te.minimum(te.maximum(q // strides[d], 0), counts[d] - 1))
        kflat, lflat = te.const(0), te.const(0)
        for d in range(nd):
            kflat = kflat * block[d] + ks[d].var
            lflat = lflat * counts[d] + pos[d]
        v = _f64(x[o[0], o[1] * numel(block) + kflat, lflat])
        return te.sum(v, axis=ks, where=te.all(*conds))

    acc = te.compute(shape, acc_body, name="col2im_acc")
    return te.compute(shape, lambda *o: te.cast(acc[o], x.dtype), name="col2im")


MAX_UNPOOL_SEARCH = 1 << 26  # output elements x input elements: above this, the search costs too much


@lowering("MaxUnpool")
def _max_unpool_te(a: dict, x: te.Tensor, idx: te.Tensor) -> te.Tensor:
    """A scatter to data-given positions, lowered as a search: each output element looks for the last
    input whose index names it, so it costs output x input comparisons (fine for small tensors only)."""
    unpooled, shape = tuple(a["unpooled_shape"]), tuple(a["output_shape"])
    total, size = numel(unpooled), numel(x.shape)
    if numel(shape) * size > MAX_UNPOOL_SEARCH:
        raise NotLowerable(f"a scatter lowered as a search would take {numel(shape) * size} comparisons")
    if size == 0 or numel(shape) == 0:
        return te.compute(shape, lambda *o: keep(te.const(0, x.dtype), x, idx), name="max_unpool")

    def slot_body(*o):
        js = [te.reduce_axis((0, d), name=f"j{k}") for k, d in enumerate(x.shape)]
        flat, jflat = te.const(0, "int64"), te.const(0)
        for v, d in zip(o, unpooled):
            flat = flat * d + v
        for j, d in zip(js, x.shape):
            jflat = jflat * d + j.var
        inside = te.all(*(v < d for v, d in zip(o, unpooled)))
        names = te.if_then_else(idx[tuple(j.var for j in js)] < 0, idx[tuple(j.var for j in js)] + total,
                                idx[tuple(j.var for j in js)])  # fmt: skip
        return te.max(jflat, axis=js, where=te.all(inside, names == flat))

    slot = te.compute(shape, slot_body, name="unpool_slot")  # the last input that lands here, or < 0

    def body(*o):
        f = te.maximum(slot[o], 0)
        src = []
        for d in reversed(x.shape):
            src.append(f % d)
            f = f // d
        return te.if_then_else(slot[o] >= 0, x[tuple(reversed(src))], te.const(0, x.dtype))

    return te.compute(shape, body, name="max_unpool")
