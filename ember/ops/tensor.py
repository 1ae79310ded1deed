"""Data-movement operators: reshape, transpose, slicing, gather/scatter, padding, creation."""

from __future__ import annotations

import numpy as np

from ember.graph.types import TensorType, np_dtype
from ember.ops.common import ShapeError, broadcast_shapes, check_same_dtype, norm_axes, norm_axis
from ember.ops.opdef import Attr, Pattern, ShapeDependsOnData, one_of, op

INJ = Pattern.INJECTIVE


# -- reshaping ---------------------------------------------------------------------------------
def _reshape_infer(a: dict, x: TensorType) -> TensorType:
    shape = a["shape"]
    if any(d < 0 for d in shape) or int(np.prod(shape, dtype=np.int64)) != x.size:
        raise ShapeError(f"cannot reshape {x} ({x.size} elements) to {list(shape)}")
    return x.with_shape(shape)


@op("Reshape", INJ, infer=_reshape_infer, attrs=[Attr("shape", "ints")])
def reshape(a: dict, x: np.ndarray) -> np.ndarray:
    """Reshape to an explicit shape (the frontend resolves ONNX's 0 and -1 entries)."""
    return x.reshape(a["shape"])


def resolve_reshape(in_shape: tuple[int, ...], shape: tuple[int, ...], allowzero: bool) -> tuple[int, ...]:
    """ONNX Reshape target: 0 copies the input dim (unless allowzero), -1 is inferred."""
    out = [in_shape[i] if d == 0 and not allowzero and i < len(in_shape) else d for i, d in enumerate(shape)]
    if out.count(-1) > 1:
        raise ShapeError(f"reshape target {list(shape)} has more than one -1")
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1], dtype=np.int64))
        total = int(np.prod(in_shape, dtype=np.int64))
        if known == 0 or total % known:
            raise ShapeError(f"cannot reshape {list(in_shape)} to {list(shape)}")
        out[out.index(-1)] = total // known
    return tuple(out)


def _flatten_infer(a: dict, x: TensorType) -> TensorType:
    if not -x.rank <= a["axis"] <= x.rank:
        raise ShapeError(f"Flatten axis {a['axis']} is out of range for {x}")
    axis = a["axis"] + x.rank if a["axis"] < 0 else a["axis"]
    outer = int(np.prod(x.shape[:axis], dtype=np.int64))
    return x.with_shape((outer, int(np.prod(x.shape[axis:], dtype=np.int64))))


@op("Flatten", INJ, infer=_flatten_infer, attrs=[Attr("axis", "int", 1)])
def flatten(a: dict, x: np.ndarray) -> np.ndarray:
    return x.reshape(_flatten_infer(a, TensorType.of(x)).shape)


def _transpose_infer(a: dict, x: TensorType) -> TensorType:
    perm = a["perm"]
    if sorted(perm) != list(range(x.rank)):
        raise ShapeError(f"perm {list(perm)} is not a permutation of {x.rank} axes")
    return x.with_shape(tuple(x.shape[p] for p in perm))


@op("Transpose", INJ, infer=_transpose_infer, attrs=[Attr("perm", "ints")])
def transpose(a: dict, x: np.ndarray) -> np.ndarray:
    return np.transpose(x, a["perm"])


def _squeeze_infer(a: dict, x: TensorType) -> TensorType:
    axes = norm_axes(a["axes"], x.rank)
    bad = [ax for ax in axes if x.shape[ax] != 1]
    if bad:
        raise ShapeError(f"cannot squeeze axes {bad} of {x}: their length is not 1")
    return x.with_shape(tuple(d for i, d in enumerate(x.shape) if i not in axes))


@op("Squeeze", INJ, infer=_squeeze_infer, attrs=[Attr("axes", "ints")])
def squeeze(a: dict, x: np.ndarray) -> np.ndarray:
    return x.reshape(_squeeze_infer(a, TensorType.of(x)).shape)


def _unsqueeze_infer(a: dict, x: TensorType) -> TensorType:
    rank = x.rank + len(a["axes"])
    axes = norm_axes(a["axes"], rank)
    dims = iter(x.shape)
    return x.with_shape(tuple(1 if i in axes else next(dims) for i in range(rank)))


@op("Unsqueeze", INJ, infer=_unsqueeze_infer, attrs=[Attr("axes", "ints")])
def unsqueeze(a: dict, x: np.ndarray) -> np.ndarray:
    return x.reshape(_unsqueeze_infer(a, TensorType.of(x)).shape)


# -- joining and splitting ----------------------------------------------------------------------
def _concat_infer(a: dict, *ts: TensorType) -> TensorType:
    check_same_dtype(*ts)
    rank = ts[0].rank
    axis = norm_axis(a["axis"], rank)
    for t in ts:
        if t.rank != rank or any(d != e for i, (d, e) in enumerate(zip(t.shape, ts[0].shape)) if i != axis):
            raise ShapeError(f"Concat inputs {', '.join(map(str, ts))} differ outside axis {axis}")
    shape = list(ts[0].shape)
    shape[axis] = sum(t.shape[axis] for t in ts)
    return ts[0].with_shape(tuple(shape))


@op("Concat", INJ, infer=_concat_infer, inputs=(1, None), attrs=[Attr("axis", "int")])
def concat(a: dict, *xs: np.ndarray) -> np.ndarray:
    return np.concatenate(xs, axis=norm_axis(a["axis"], xs[0].ndim))


def _split_infer(a: dict, x: TensorType) -> tuple[TensorType, ...]:
    axis = norm_axis(a["axis"], x.rank)
    if sum(a["split"]) != x.shape[axis] or any(s < 0 for s in a["split"]):
        raise ShapeError(f"split sizes {list(a['split'])} do not add up to axis {axis} of {x}")
    return tuple(x.with_shape(x.shape[:axis] + (s,) + x.shape[axis + 1 :]) for s in a["split"])


@op("Split", INJ, infer=_split_infer, attrs=[Attr("axis", "int", 0), Attr("split", "ints")])
def split(a: dict, x: np.ndarray) -> tuple[np.ndarray, ...]:
    """Split into pieces of explicit sizes (the frontend computes sizes for num_outputs)."""
    axis = norm_axis(a["axis"], x.ndim)
    return tuple(np.split(x, np.cumsum(a["split"])[:-1], axis=axis))


def split_sizes(length: int, parts: int) -> tuple[int, ...]:
    """ONNX num_outputs rule: equal chunks of ceil(length / parts), the last one smaller."""
    chunk = -(-length // parts)
    sizes = [min(chunk, max(length - i * chunk, 0)) for i in range(parts)]
    return tuple(sizes)


# -- slicing ------------------------------------------------------------------------------------
def slice_bounds(shape: tuple[int, ...], a: dict) -> list[tuple[int, int, int]]:
    """(start, stop, step) per axis of the input with ONNX clamping; stop -1 means 'before 0'."""
    bounds = [(0, d, 1) for d in shape]
    axes = a["axes"] if a["axes"] else tuple(range(len(a["starts"])))
    steps = a["steps"] if a["steps"] else (1,) * len(axes)
    if not len(a["starts"]) == len(a["ends"]) == len(axes) == len(steps):
        raise ShapeError("Slice starts, ends, axes and steps must have the same length")
    for ax, start, end, step in zip(norm_axes(axes, len(shape)), a["starts"], a["ends"], steps):
        dim = shape[ax]
        if step == 0:
            raise ShapeError("Slice step cannot be 0")
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
        bounds[ax] = (start, end, step)
    return bounds


def _slice_len(start: int, end: int, step: int) -> int:
    return max(0, -(-(end - start) // step))


SLICE_ATTRS = [Attr("starts", "ints"), Attr("ends", "ints"), Attr("axes", "ints", ()), Attr("steps", "ints", ())]


def _slice_infer(a: dict, x: TensorType) -> TensorType:
    return x.with_shape(tuple(_slice_len(*b) for b in slice_bounds(x.shape, a)))


@op("Slice", INJ, infer=_slice_infer, attrs=SLICE_ATTRS)
def slice_(a: dict, x: np.ndarray) -> np.ndarray:
    """ONNX Slice with starts/ends/axes/steps as attributes (clamped like ONNX)."""
    index = tuple(slice(s, None if e < 0 else e, st) for s, e, st in slice_bounds(x.shape, a))
    return x[index].copy()


# -- gather / scatter ---------------------------------------------------------------------------
def _gather_infer(a: dict, x: TensorType, idx: TensorType) -> TensorType:
    axis = norm_axis(a["axis"], x.rank)
    return x.with_shape(x.shape[:axis] + idx.shape + x.shape[axis + 1 :])


def _fix_indices(idx: np.ndarray, dim: int, what: str) -> np.ndarray:
    idx = idx.astype(np.int64)
    if idx.size and (idx.min() < -dim or idx.max() >= dim):
        raise IndexError(f"{what}: index out of range for axis of length {dim}")
    return np.where(idx < 0, idx + dim, idx)


@op("Gather", INJ, infer=_gather_infer, inputs=(2, 2), attrs=[Attr("axis", "int", 0)])
def gather(a: dict, x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    axis = norm_axis(a["axis"], x.ndim)
    return np.take(x, _fix_indices(idx, x.shape[axis], "Gather"), axis=axis)


def _gather_elements_infer(a: dict, x: TensorType, idx: TensorType) -> TensorType:
    norm_axis(a["axis"], x.rank)
    return x.with_shape(idx.shape)


@op("GatherElements", INJ, infer=_gather_elements_infer, inputs=(2, 2), attrs=[Attr("axis", "int", 0)])
def gather_elements(a: dict, x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    axis = norm_axis(a["axis"], x.ndim)
    return np.take_along_axis(x, _fix_indices(idx, x.shape[axis], "GatherElements"), axis=axis)


def _gather_nd_infer(a: dict, x: TensorType, idx: TensorType) -> TensorType:
    b, k = a["batch_dims"], idx.shape[-1]
    if k > x.rank - b:
        raise ShapeError(f"GatherND index depth {k} exceeds data rank {x.rank} minus batch_dims {b}")
    return x.with_shape(idx.shape[:-1] + x.shape[b + k :])


@op("GatherND", INJ, infer=_gather_nd_infer, inputs=(2, 2), attrs=[Attr("batch_dims", "int", 0)])
def gather_nd(a: dict, x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    b = a["batch_dims"]
    out_shape = _gather_nd_infer(a, TensorType.of(x), TensorType.of(idx)).shape
    xb = x.reshape((-1,) + x.shape[b:])
    ib = idx.reshape((xb.shape[0], -1, idx.shape[-1])) if b else idx.reshape((1, -1, idx.shape[-1]))
    xb = xb if b else x[None]
    k = idx.shape[-1]
    pieces = []
    for n in range(xb.shape[0]):
        ind = np.where(ib[n] < 0, ib[n] + np.array(xb.shape[1 : 1 + k]), ib[n])
        pieces.append(xb[n][tuple(ind.T)])
    return np.stack(pieces).reshape(out_shape)


_SCATTER_REDUCE = {"none": None, "add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter_infer(a: dict, x: TensorType, idx: TensorType, upd: TensorType) -> TensorType:
    return x


@op("ScatterElements", INJ, infer=_scatter_infer, inputs=(3, 3),
    attrs=[Attr("axis", "int", 0), Attr("reduction", "str", "none", **one_of(*_SCATTER_REDUCE))])  # fmt: skip
def scatter_elements(a: dict, x: np.ndarray, idx: np.ndarray, upd: np.ndarray) -> np.ndarray:
    axis = norm_axis(a["axis"], x.ndim)
    idx = _fix_indices(idx, x.shape[axis], "ScatterElements")
    out = x.copy()
    full = list(np.indices(idx.shape, sparse=True))
    full[axis] = idx
    fn = _SCATTER_REDUCE[a["reduction"]]
    if fn is None:
        out[tuple(full)] = upd
    else:
        fn.at(out, tuple(np.broadcast_arrays(*full)), upd)
    return out


@op("ScatterND", INJ, infer=_scatter_infer, inputs=(3, 3),
    attrs=[Attr("reduction", "str", "none", **one_of(*_SCATTER_REDUCE))])  # fmt: skip
def scatter_nd(a: dict, x: np.ndarray, idx: np.ndarray, upd: np.ndarray) -> np.ndarray:
    out = x.copy()
    k = idx.shape[-1]
    flat_idx = idx.reshape(-1, k)
    flat_upd = upd.reshape((flat_idx.shape[0],) + x.shape[k:])
    fn = _SCATTER_REDUCE[a["reduction"]]
    for i, upd_i in zip(flat_idx, flat_upd):
        key = tuple(i)
        out[key] = upd_i if fn is None else fn(out[key], upd_i)
    return out


# -- broadcasting copies -------------------------------------------------------------------------
def _expand_infer(a: dict, x: TensorType) -> TensorType:
    return x.with_shape(broadcast_shapes(x.shape, a["shape"]))


@op("Expand", Pattern.BROADCAST, infer=_expand_infer, attrs=[Attr("shape", "ints")])
def expand(a: dict, x: np.ndarray) -> np.ndarray:
    return np.broadcast_to(x, broadcast_shapes(x.shape, a["shape"])).copy()


def _tile_infer(a: dict, x: TensorType) -> TensorType:
    if len(a["repeats"]) != x.rank:
        raise ShapeError(f"Tile repeats {list(a['repeats'])} must have one entry per axis of {x}")
    return x.with_shape(tuple(d * r for d, r in zip(x.shape, a["repeats"])))


@op("Tile", INJ, infer=_tile_infer, attrs=[Attr("repeats", "ints")])
def tile(a: dict, x: np.ndarray) -> np.ndarray:
    return np.tile(x, a["repeats"])


# -- padding -------------------------------------------------------------------------------------
def _pad_infer(a: dict, x: TensorType, value: TensorType | None = None) -> TensorType:
    pads = a["pads"]
    if len(pads) != 2 * x.rank:
        raise ShapeError(f"Pad needs {2 * x.rank} pads for {x}, got {list(pads)}")
    shape = tuple(d + pads[i] + pads[i + x.rank] for i, d in enumerate(x.shape))
    if any(d < 0 for d in shape):
        raise ShapeError(f"pads {list(pads)} remove more than {x} holds")
    return x.with_shape(shape)


@op("Pad", INJ, infer=_pad_infer, inputs=(1, 2),
    attrs=[Attr("pads", "ints"), Attr("mode", "str", "constant", **one_of("constant", "reflect", "edge", "wrap")),
           Attr("value", "float", 0.0)])  # fmt: skip
def pad(a: dict, x: np.ndarray, value: np.ndarray | None = None) -> np.ndarray:
    """Pad with begin/end amounts per axis (ONNX order); negative pads crop."""
    rank = x.ndim
    pads = a["pads"]
    crop = tuple(slice(max(-pads[i], 0), x.shape[i] - max(-pads[i + rank], 0)) for i in range(rank))
    x = x[crop]
    widths = [(max(pads[i], 0), max(pads[i + rank], 0)) for i in range(rank)]
    if a["mode"] == "constant":
        fill = value.reshape(()) if value is not None and value.size else np.asarray(a["value"])
        return np.pad(x, widths, mode="constant", constant_values=fill.astype(x.dtype))
    return np.pad(x, widths, mode={"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[a["mode"]])


# -- creation from types or attributes ------------------------------------------------------------
@op("Shape", INJ, infer=lambda a, x: TensorType((len(range(x.rank)[a["start"] : a["end"]]),), "int64"),
    attrs=[Attr("start", "int", 0), Attr("end", "int", None)], reads_data=False)  # fmt: skip
def shape(a: dict, x: np.ndarray) -> np.ndarray:
    """The input's shape (a constant: the frontend folds it, types are static)."""
    return np.array(x.shape[a["start"] : a["end"]], dtype=np.int64)


@op("Size", INJ, infer=lambda a, x: TensorType((), "int64"), reads_data=False)
def size(a: dict, x: np.ndarray) -> np.ndarray:
    return np.array(x.size, dtype=np.int64)


def _const_of_shape_infer(a: dict) -> TensorType:
    return TensorType(a["shape"], a["value"].dtype.name)


@op("ConstantOfShape", INJ, infer=_const_of_shape_infer, inputs=(0, 0),
    attrs=[Attr("shape", "ints"), Attr("value", "tensor", np.zeros(1, np.float32))])  # fmt: skip
def constant_of_shape(a: dict) -> np.ndarray:
    return np.full(a["shape"], a["value"].reshape(-1)[0], dtype=a["value"].dtype)


def _eye_like_infer(a: dict, x: TensorType) -> TensorType:
    if x.rank != 2:
        raise ShapeError(f"EyeLike needs a 2-D input, got {x}")
    return x.with_dtype(a["dtype"] or x.dtype)


@op("EyeLike", INJ, infer=_eye_like_infer, attrs=[Attr("dtype", "dtype", None), Attr("k", "int", 0)], reads_data=False)
def eye_like(a: dict, x: np.ndarray) -> np.ndarray:
    return np.eye(x.shape[0], x.shape[1], k=a["k"], dtype=np_dtype(a["dtype"]) if a["dtype"] else x.dtype)


def _range_infer(a: dict, start: TensorType, limit: TensorType, delta: TensorType) -> TensorType:
    raise ShapeDependsOnData("the length of Range depends on the values of start, limit and delta")


@op("Range", INJ, infer=_range_infer, inputs=(3, 3))
def range_(a: dict, start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> np.ndarray:
    n = max(int(np.ceil((limit.item() - start.item()) / delta.item())), 0)
    return (start + np.arange(n, dtype=np.int64).astype(start.dtype) * delta).astype(start.dtype)


def _one_hot_infer(a: dict, idx: TensorType, values: TensorType) -> TensorType:
    rank = idx.rank + 1
    axis = norm_axis(a["axis"], rank)
    shape = list(idx.shape)
    shape.insert(axis, a["depth"])
    return values.with_shape(tuple(shape))


@op("OneHot", INJ, infer=_one_hot_infer, inputs=(2, 2), attrs=[Attr("depth", "int"), Attr("axis", "int", -1)])
def one_hot(a: dict, idx: np.ndarray, values: np.ndarray) -> np.ndarray:
    """values[1] where the index hits, values[0] elsewhere; depth is an attribute."""
    depth = a["depth"]
    axis = norm_axis(a["axis"], idx.ndim + 1)
    idx = idx.astype(np.int64)
    idx = np.where(idx < 0, idx + depth, idx)
    hot = np.expand_dims(idx, axis) == np.arange(depth).reshape([-1 if i == axis else 1 for i in range(idx.ndim + 1)])
    return np.where(hot, values[1], values[0]).astype(values.dtype)


@op("Trilu", INJ, infer=lambda a, x: x, attrs=[Attr("upper", "int", 1), Attr("k", "int", 0)])
def trilu(a: dict, x: np.ndarray) -> np.ndarray:
    return np.triu(x, a["k"]) if a["upper"] else np.tril(x, a["k"])


# -- data-dependent shapes (the frontend evaluates them when their inputs are constant) ------------
def _data_dependent(what: str):
    def infer(a: dict, *ts: TensorType | None) -> TensorType:
        raise ShapeDependsOnData(what)

    return infer


@op("NonZero", Pattern.OPAQUE, infer=_data_dependent("the number of non-zero elements depends on the data"))
def non_zero(a: dict, x: np.ndarray) -> np.ndarray:
    return np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)


@op("Compress", Pattern.OPAQUE, infer=_data_dependent("the output length depends on the condition values"),
    inputs=(2, 2), attrs=[Attr("axis", "int", None)])  # fmt: skip
def compress(a: dict, x: np.ndarray, cond: np.ndarray) -> np.ndarray:
    return np.compress(cond.astype(bool), x, axis=a["axis"])


@op("Unique", Pattern.OPAQUE, infer=_data_dependent("the number of unique elements depends on the data"),
    attrs=[Attr("axis", "int", None), Attr("sorted", "int", 1)])  # fmt: skip
def unique(a: dict, x: np.ndarray) -> tuple[np.ndarray, ...]:
    """Unique values, first indices, inverse indices, counts (ONNX order when unsorted)."""
    axis = a["axis"]
    _, first, inverse, counts = np.unique(x, axis=axis, return_index=True, return_inverse=True, return_counts=True)
    order = np.arange(len(first)) if a["sorted"] else np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    first = first[order]
    values = np.take(x, first, axis=axis) if axis is not None else x.reshape(-1)[first]
    inverse = rank[inverse.reshape(-1)]
    return values, first.astype(np.int64), inverse.astype(np.int64), counts[order].astype(np.int64)


# -- moving data between axes ---------------------------------------------------------------------
def _d2s_infer(a: dict, x: TensorType) -> TensorType:
    b = a["blocksize"]
    n, c, h, w = x.shape
    if c % (b * b):
        raise ShapeError(f"DepthToSpace channels {c} are not divisible by blocksize^2 = {b * b}")
    return x.with_shape((n, c // (b * b), h * b, w * b))


@op("DepthToSpace", INJ, infer=_d2s_infer,
    attrs=[Attr("blocksize", "int"), Attr("mode", "str", "DCR", **one_of("DCR", "CRD"))])  # fmt: skip
def depth_to_space(a: dict, x: np.ndarray) -> np.ndarray:
    b = a["blocksize"]
    n, c, h, w = x.shape
    if a["mode"] == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


def _s2d_infer(a: dict, x: TensorType) -> TensorType:
    b = a["blocksize"]
    n, c, h, w = x.shape
    if h % b or w % b:
        raise ShapeError(f"SpaceToDepth spatial dims {h}x{w} are not divisible by blocksize {b}")
    return x.with_shape((n, c * b * b, h // b, w // b))


@op("SpaceToDepth", INJ, infer=_s2d_infer,
    attrs=[Attr("blocksize", "int"), Attr("mode", "str", "DCR", **one_of("DCR", "CRD"))])  # fmt: skip
def space_to_depth(a: dict, x: np.ndarray) -> np.ndarray:
    """Inverse of DepthToSpace; DCR puts the block offset before the channel, CRD after."""
    b = a["blocksize"]
    n, c, h, w = x.shape
    perm = (0, 3, 5, 1, 2, 4) if a["mode"] == "DCR" else (0, 1, 3, 5, 2, 4)
    y = x.reshape(n, c, h // b, b, w // b, b).transpose(perm)
    return y.reshape(n, c * b * b, h // b, w // b)


@op("ReverseSequence", INJ, infer=lambda a, x, lens: x, inputs=(2, 2),
    attrs=[Attr("batch_axis", "int", 1), Attr("time_axis", "int", 0)])  # fmt: skip
def reverse_sequence(a: dict, x: np.ndarray, lens: np.ndarray) -> np.ndarray:
    out = x.copy()
    b_ax, t_ax = a["batch_axis"], a["time_axis"]
    for b, n in enumerate(lens.astype(np.int64)):
        src = [slice(None)] * x.ndim
        src[b_ax] = b
        src[t_ax] = slice(0, n)
        out[tuple(src)] = np.flip(x[tuple(src)], axis=t_ax - (1 if b_ax < t_ax else 0))
    return out


def _center_crop_pad_infer(a: dict, x: TensorType) -> TensorType:
    axes = norm_axes(a["axes"] or tuple(range(x.rank)), x.rank)
    shape = list(x.shape)
    for ax, s in zip(axes, a["shape"]):
        shape[ax] = s
    return x.with_shape(tuple(shape))


@op("CenterCropPad", INJ, infer=_center_crop_pad_infer, attrs=[Attr("shape", "ints"), Attr("axes", "ints", ())])
def center_crop_pad(a: dict, x: np.ndarray) -> np.ndarray:
    axes = norm_axes(a["axes"] or tuple(range(x.ndim)), x.ndim)
    out = np.zeros(_center_crop_pad_infer(a, TensorType.of(x)).shape, x.dtype)
    src, dst = [slice(None)] * x.ndim, [slice(None)] * x.ndim
    for ax, s in zip(axes, a["shape"]):
        d = x.shape[ax]
        if s <= d:
            off = (d - s) // 2
            src[ax] = slice(off, off + s)
        else:
            off = (s - d) // 2
            dst[ax] = slice(off, off + d)
    out[tuple(dst)] = x[tuple(src)]
    return out


# -- bit-level and cache updates ------------------------------------------------------------------
def _bitcast_infer(a: dict, x: TensorType) -> TensorType:
    if np_dtype(a["to"]).itemsize != x.np_dtype.itemsize or a["to"].endswith(("int4", "int2", "e2m1fn")):
        raise ShapeError(f"BitCast needs dtypes of one bit width, got {x.dtype} -> {a['to']}")
    return x.with_dtype(a["to"])


@op("BitCast", INJ, infer=_bitcast_infer, attrs=[Attr("to", "dtype")])
def bitcast(a: dict, x: np.ndarray) -> np.ndarray:
    """Reinterpret the bits (little endian) as another dtype of the same width."""
    return x.copy(order="C").view(np_dtype(a["to"]))


def _tensor_scatter_infer(a: dict, cache: TensorType, update: TensorType, idx: TensorType | None = None) -> TensorType:
    axis = norm_axis(a["axis"], cache.rank)
    if update.rank != cache.rank or any(u != c for i, (u, c) in enumerate(zip(update.shape, cache.shape)) if i != axis):
        raise ShapeError(f"TensorScatter update {update} must match cache {cache} outside axis {axis}")
    return cache


@op("TensorScatter", INJ, infer=_tensor_scatter_infer, inputs=(2, 3),
    attrs=[Attr("axis", "int", -2), Attr("mode", "str", "linear", **one_of("linear", "circular"))])  # fmt: skip
def tensor_scatter(a: dict, cache: np.ndarray, update: np.ndarray, idx: np.ndarray | None = None) -> np.ndarray:
    """Write `update` into the cache along `axis` from each batch entry's write index."""
    axis = norm_axis(a["axis"], cache.ndim)
    out = cache.copy()
    size, steps = cache.shape[axis], update.shape[axis]
    starts = np.zeros(cache.shape[0], np.int64) if idx is None else idx.astype(np.int64).reshape(-1)
    for b in range(cache.shape[0]):
        pos = starts[b] + np.arange(steps)
        if a["mode"] == "circular":
            pos = pos % size
        if axis == 0:
            raise ShapeError("TensorScatter writes along a sequence axis after the batch axis")
        np.moveaxis(out[b], axis - 1, 0)[pos] = np.moveaxis(update[b], axis - 1, 0)
    return out
