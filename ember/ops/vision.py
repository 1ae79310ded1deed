"""Sampling and detection operators: GridSample, RoiAlign, DeformConv, Col2Im, MaxUnpool,
NonMaxSuppression."""

from __future__ import annotations

import itertools

import numpy as np

from ember.graph.types import TensorType
from ember.ops.common import ShapeError
from ember.ops.opdef import Attr, Pattern, one_of, op
from ember.ops.resize import _cubic

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
    return [(base + k, _cubic(frac - k, -0.75)) for k in (-1, 0, 1, 2)]


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
