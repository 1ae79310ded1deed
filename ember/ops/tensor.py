"""Data-movement operators: reshape, transpose, slicing, gather/scatter, padding, creation."""

from __future__ import annotations

import math

import numpy as np

from ember import te
from ember.graph.dims import (
    dim_product,
    dim_str,
    dims_equal,
    divide_dims,
    is_static,
    is_static_dim,
    reads_values,
    shape_str,
    simplify_dim,
)  # fmt: skip
from ember.graph.types import TensorType, np_dtype
from ember.ops.common import ShapeError, broadcast_shapes, check_same_dtype, norm_axes, norm_axis
from ember.ops.opdef import Attr, Pattern, ShapeDependsOnData, one_of, op
from ember.ops.te_lib import (
    NotLowerable,
    broadcast_indices,
    const_of,
    index_dtype,
    keep,
    lowering,
    native_dtype,
    numel,
    rows,
)
from ember.target import Target
from ember.templates.flat import default_schedule, row_lanes, schedule_injective, standalone
from ember.tir import expr as tx
from ember.tir.dtype import dtype as tir_dtype
from ember.tir.expr import Expr

INJ = Pattern.INJECTIVE


# -- helpers of the TE computes -------------------------------------------------------------------
def data_index(v: Expr, dim: int) -> Expr:
    """An index read from a tensor, made non-negative the ONNX way (v < 0 counts from the end) and
    clamped into [0, dim): where the reference raises on an out-of-range index, a kernel cannot
    report an error, so it reads the nearest element instead of memory outside the tensor."""
    v = te.if_then_else(v < 0, v + dim, v)
    return index_dtype(te.minimum(te.maximum(v, 0), dim - 1), dim)


def wrapped(v: Expr, dim: int | Expr) -> Expr:
    """v < 0 counts from the end (no clamping: for comparisons, never for addressing)."""
    return te.if_then_else(v < 0, v + dim, v)


def copy_compute(x: te.Tensor, name: str = "copy", unused: tuple = ()) -> te.Tensor:
    return te.compute(x.shape, lambda *i: keep(x[i], *unused), name=name, tag=name, attrs=rows(x.ndim))


def _with(idx: tuple, axis: int, value: Expr) -> tuple:
    """idx with entry `axis` replaced."""
    return idx[:axis] + (value,) + idx[axis + 1 :]


# -- reshaping ---------------------------------------------------------------------------------
def _reshape_infer(a: dict, x: TensorType) -> TensorType:
    shape = a["shape"]
    if not (x.is_static and is_static(shape)):
        if not dims_equal(dim_product(shape), dim_product(x.shape)) and not reads_values((*shape, *x.shape)):
            raise ShapeError(f"cannot reshape {x} to {shape_str(shape)}: the element counts are not provably equal")
        return x.with_shape(shape)
    if any(d < 0 for d in shape) or int(np.prod(shape, dtype=np.int64)) != x.size:
        raise ShapeError(f"cannot reshape {x} ({x.size} elements) to {list(shape)}")
    return x.with_shape(shape)


@op("Reshape", INJ, infer=_reshape_infer, attrs=[Attr("shape", "dims")])
def reshape(a: dict, x: np.ndarray) -> np.ndarray:
    """Reshape to an explicit shape (the frontend resolves ONNX's 0 and -1 entries)."""
    return x.reshape(a["shape"])


def reshape_compute(x: te.Tensor, shape: tuple[int, ...], name: str = "reshape") -> te.Tensor:
    """Row-major reinterpretation of x with another shape (same number of elements)."""
    if numel(shape) == 0:
        return te.compute(shape, lambda *i: keep(te.const(0, x.dtype), x), name=name)

    groups = _reshape_groups(tuple(shape), tuple(x.shape))

    def unravel(i, out_dims, in_dims):
        flat = te.const(0)
        for j, n in zip(i, out_dims):
            flat = flat * n + j
        idx = []
        # dims of 1 take index 0 (no division: [S, N] read as [1, S, N] indexes (0, i), not (i // S, i % S), whose
        # division by a size variable the tiles' loops cannot drop); the outermost other index is below its dim
        # already: no modulo
        outer = min((d for d, n in enumerate(in_dims) if not _is_one(n)), default=-1)
        for d in reversed(range(len(in_dims))):
            n = in_dims[d]
            if _is_one(n):
                idx.append(te.const(0))
                continue
            idx.append(flat if d == outer else flat % n)
            flat = flat // n
        return list(reversed(idx))

    def body(*i):
        idx = []
        for (a, b), (c, d) in groups:  # dims [a, b) of the output hold dims [c, d) of the input
            idx += unravel(i[a:b], shape[a:b], x.shape[c:d])
        return x[tuple(idx)]

    return te.compute(shape, body, name=name)


def _is_one(n: int | Expr) -> bool:
    return _dim_factors(n) == ({}, 1)


def _dim_factors(n: int | Expr) -> tuple[dict[str, int], int]:
    """A dim as a product: its symbolic factors (by name, with multiplicity) and its constant factor."""
    if isinstance(n, tx.BinOp) and n.op == "mul":
        (fa, ca), (fb, cb) = _dim_factors(n.a), _dim_factors(n.b)
        return {k: fa.get(k, 0) + fb.get(k, 0) for k in fa.keys() | fb.keys()}, ca * cb
    if isinstance(n, tx.Const):
        return {}, int(n.value)
    return ({str(n): 1}, 1) if isinstance(n, Expr) else ({}, int(n))


def _reshape_groups(out: tuple, inp: tuple) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Runs of output and input dims with equal products ([B * S, 128] -> [B, S, 4, 32]: (B, S) hold B * S, and
    (4, 32) hold 128), so that each run unravels on its own: no division by a symbolic size across the runs.
    One run of everything when the products do not line up."""
    everything = [((0, len(out)), (0, len(inp)))]
    if not out or not inp or 0 in out or 0 in inp:
        return everything

    def covers(a: tuple[dict, int], b: tuple[dict, int]) -> bool:  # b is a multiple of a
        return all(b[0].get(k, 0) >= v for k, v in a[0].items()) and b[1] % a[1] == 0

    groups, i, j = [], 0, 0
    while i < len(out) and j < len(inp):
        a, c = i, j
        po, pi = _dim_factors(out[i]), _dim_factors(inp[j])
        i, j = i + 1, j + 1
        while not (covers(po, pi) and covers(pi, po)):
            if covers(po, pi) and i < len(out):
                po = _mul_factors(po, _dim_factors(out[i]))
                i += 1
            elif covers(pi, po) and j < len(inp):
                pi = _mul_factors(pi, _dim_factors(inp[j]))
                j += 1
            else:
                return everything
        groups.append(((a, i), (c, j)))
    if i < len(out) or j < len(inp):  # trailing dims of 1
        if any(_dim_factors(n) != ({}, 1) for n in out[i:] + inp[j:]):
            return everything
        (a, _), (c, _) = groups[-1]
        groups[-1] = ((a, len(out)), (c, len(inp)))
    return groups


def _mul_factors(a: tuple[dict, int], b: tuple[dict, int]) -> tuple[dict, int]:
    return {k: a[0].get(k, 0) + b[0].get(k, 0) for k in a[0].keys() | b[0].keys()}, a[1] * b[1]


@lowering("Reshape")
def _reshape_te(a: dict, x: te.Tensor) -> te.Tensor:
    return reshape_compute(x, a["shape"])


def resolve_reshape(in_shape: tuple[int, ...], shape: tuple[int, ...], allowzero: bool) -> tuple[int, ...]:
    """ONNX Reshape target: 0 copies the input dim (unless allowzero), -1 is inferred."""
    out = [in_shape[i] if is_static_dim(d) and d == 0 and not allowzero and i < len(in_shape) else d
           for i, d in enumerate(shape)]  # fmt: skip
    minus = [i for i, d in enumerate(out) if is_static_dim(d) and d == -1]
    if len(minus) > 1:
        raise ShapeError(f"reshape target {shape_str(shape)} has more than one -1")
    if not (is_static(in_shape) and is_static(out)):
        if minus:
            d = divide_dims(in_shape, [d for i, d in enumerate(out) if i != minus[0]])
            if d is None:
                raise ShapeError(f"cannot reshape {shape_str(in_shape)} to {shape_str(shape)}: the -1 is not a "
                                 "whole dim for every value of the sizes")  # fmt: skip
            out[minus[0]] = d
        return tuple(out)
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
    return x.with_shape((dim_product(x.shape[:axis]), dim_product(x.shape[axis:])))


@op("Flatten", INJ, infer=_flatten_infer, attrs=[Attr("axis", "int", 1)])
def flatten(a: dict, x: np.ndarray) -> np.ndarray:
    return x.reshape(_flatten_infer(a, TensorType.of(x)).shape)


@lowering("Flatten")
def _flatten_te(a: dict, x: te.Tensor) -> te.Tensor:
    return reshape_compute(x, _flatten_infer(a, TensorType(x.shape, x.dtype.name)).shape, name="flatten")


def _transpose_infer(a: dict, x: TensorType) -> TensorType:
    perm = a["perm"]
    if sorted(perm) != list(range(x.rank)):
        raise ShapeError(f"perm {list(perm)} is not a permutation of {x.rank} axes")
    return x.with_shape(tuple(x.shape[p] for p in perm))


@op("Transpose", INJ, infer=_transpose_infer, attrs=[Attr("perm", "ints")])
def transpose(a: dict, x: np.ndarray) -> np.ndarray:
    return np.transpose(x, a["perm"])


def _tile(n, limit: int = 16) -> int:
    """A tile of axis extent `n`: the largest divisor of n up to `limit` (no tail to guard), else `limit`."""
    if not isinstance(n, int):
        return limit
    best = max(d for d in range(1, min(n, limit) + 1) if n % d == 0)
    return best if best >= 4 or n <= limit else limit


def _reads_through_reshapes(op: te.ComputeOp) -> bool:
    """Whether every tensor an op reads is an input of the kernel, or a reshape of one: its contiguous axis is
    the transpose's input's (a layout transform before it would move that axis)."""
    return all(isinstance(t.op, te.PlaceholderOp) or (t.op.name.startswith(("reshape", "flatten"))
                                                     and _reads_through_reshapes(t.op)) for t in op.inputs)


def _transpose_schedule(a: dict, outs: list[te.Tensor], target: Target) -> te.Schedule:
    """When the innermost axis moves, copy in square tiles: one side of each tile is read along
    contiguous input rows, the other written along contiguous output rows. The same holds for a fused
    group that ends in elementwise or broadcast ops of the transpose's shape (convnext's NHWC -> NCHW,
    layer scale and residual add): its other inputs are read along the output's rows."""
    perm = a["perm"]
    rank = len(perm)
    s = te.create_schedule(outs)
    inner = [st for st in s.stages if not (st.is_placeholder or st.is_output)]
    transposes = [st for st in s.stages if not st.is_placeholder and st.op.tag == "transpose"]
    tileable = (len(outs) == 1 and len(transposes) == 1 and rank >= 2 and perm[-1] != rank - 1
                and tuple(transposes[0].op.shape) == tuple(outs[0].shape) and numel(outs[0].shape) >= 1024
                and _reads_through_reshapes(transposes[0].op)
                and not any(isinstance(st.op.body, te.Reduce) for st in inner))  # fmt: skip
    if not tileable:
        if standalone(outs, "transpose"):
            return schedule_injective("transpose")(a, outs, target)
        return default_schedule(outs, target)
    (out,) = outs
    for other in inner:  # reshapes before the transpose, elementwise ops after it: index arithmetic, not copies
        other.compute_inline()
    st = s[out]
    axes = list(st.op.axis)
    p = perm.index(rank - 1)  # the output axis that walks the input's contiguous axis
    limit = 16 if out.dtype.bits <= 32 else 8
    po, pi = st.split(axes[p], _tile(out.shape[p], limit))
    lo, li = st.split(axes[-1], _tile(out.shape[-1], limit))
    outer = [ax for d, ax in enumerate(axes[:-1]) if d != p]
    st.reorder(*outer, po, lo, pi, li)
    if any(isinstance(d, Expr) for d in out.shape):  # symbolic: loops kept apart, for the tail's partition
        fused = outer[0] if outer else po
    else:
        fused = st.fuse(*outer, po, lo)
    if numel(out.shape) >= 1 << 15 and target.num_cores > 1:
        st.parallel(fused)
    st.unroll(pi)
    return s


@lowering("Transpose", schedule=_transpose_schedule)
def _transpose_te(a: dict, x: te.Tensor) -> te.Tensor:
    perm = a["perm"]
    inv = [perm.index(d) for d in range(x.ndim)]
    shape = tuple(x.shape[p] for p in perm)
    kept = next((k for k in range(x.ndim) if perm[x.ndim - 1 - k] != x.ndim - 1 - k), x.ndim)  # identity suffix
    return te.compute(shape, lambda *i: x[tuple(i[inv[d]] for d in range(x.ndim))], name="transpose",
                      tag="transpose", attrs=rows(kept))  # fmt: skip


def _squeeze_infer(a: dict, x: TensorType) -> TensorType:
    axes = norm_axes(a["axes"], x.rank)
    bad = [ax for ax in axes if x.shape[ax] != 1]
    if bad:
        raise ShapeError(f"cannot squeeze axes {bad} of {x}: their length is not 1")
    return x.with_shape(tuple(d for i, d in enumerate(x.shape) if i not in axes))


@op("Squeeze", INJ, infer=_squeeze_infer, attrs=[Attr("axes", "ints")])
def squeeze(a: dict, x: np.ndarray) -> np.ndarray:
    return x.reshape(_squeeze_infer(a, TensorType.of(x)).shape)


@lowering("Squeeze")
def _squeeze_te(a: dict, x: te.Tensor) -> te.Tensor:
    axes = norm_axes(a["axes"], x.ndim)
    kept = [d for d in range(x.ndim) if d not in axes]

    def body(*i):
        pos = dict(zip(kept, i))
        return x[tuple(pos.get(d, 0) for d in range(x.ndim))]

    return te.compute(tuple(x.shape[d] for d in kept), body, name="squeeze")


def _unsqueeze_infer(a: dict, x: TensorType) -> TensorType:
    rank = x.rank + len(a["axes"])
    axes = norm_axes(a["axes"], rank)
    dims = iter(x.shape)
    return x.with_shape(tuple(1 if i in axes else next(dims) for i in range(rank)))


@op("Unsqueeze", INJ, infer=_unsqueeze_infer, attrs=[Attr("axes", "ints")])
def unsqueeze(a: dict, x: np.ndarray) -> np.ndarray:
    return x.reshape(_unsqueeze_infer(a, TensorType.of(x)).shape)


@lowering("Unsqueeze")
def _unsqueeze_te(a: dict, x: te.Tensor) -> te.Tensor:
    shape = _unsqueeze_infer(a, TensorType(x.shape, x.dtype.name)).shape
    axes = norm_axes(a["axes"], len(shape))
    kept = [d for d in range(len(shape)) if d not in axes]
    return te.compute(shape, lambda *i: x[tuple(i[d] for d in kept)], name="unsqueeze")


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


def _concat_schedule(a: dict, outs: list[te.Tensor], target: Target) -> te.Schedule:
    """Loops (axes before the concat axis fused, the concat axis, axes after it fused): the choice of
    input depends on the middle loop only, so the inner loop is a plain vectorized copy, and loop
    partitioning peels the first input's range off the middle loop."""
    if not standalone(outs, "concat") or numel(outs[0].shape) == 0:
        return default_schedule(outs, target)
    (out,) = outs
    axis = norm_axis(a["axis"], out.ndim)
    s = te.create_schedule(outs)
    st = s[out]
    axes = list(st.op.axis)
    inner = axes[axis + 1 :]
    if inner:
        fi = st.fuse(*inner)
        lanes = row_lanes(numel(out.shape[axis + 1 :]), target.vector_lanes(max(out.dtype.bits, 8)))
        if lanes >= 4:
            _, vi = st.split(fi, lanes)
            st.vectorize(vi)
    outer = st.fuse(*axes[:axis]) if axis else axes[axis]
    if numel(out.shape) >= 1 << 15 and target.num_cores > 1:
        st.parallel(outer)
    return s


@lowering("Concat", schedule=_concat_schedule)
def _concat_te(a: dict, *xs: te.Tensor) -> te.Tensor:
    axis = norm_axis(a["axis"], xs[0].ndim)
    shape = _concat_infer(a, *[TensorType(x.shape, x.dtype.name) for x in xs]).shape
    parts, off = [], 0
    for x in xs:  # a symbolic length may be 0 at run time: its range of the axis is then empty
        if not is_static_dim(x.shape[axis]) or x.shape[axis]:
            parts.append((off, x))
        off += x.shape[axis]
    empty = [x for x in xs if is_static_dim(x.shape[axis]) and not x.shape[axis]]
    if not parts:
        return te.compute(shape, lambda *i: keep(te.const(0, xs[0].dtype), *xs), name="concat")

    def body(*i):
        last_off, last = parts[-1]
        out = last[_with(i, axis, i[axis] - last_off)]
        for start, x in reversed(parts[:-1]):
            out = te.if_then_else(i[axis] < start + x.shape[axis], x[_with(i, axis, i[axis] - start)], out)
        return keep(out, *empty)

    return te.compute(shape, body, name="concat", tag="concat")


def _split_infer(a: dict, x: TensorType, sizes: TensorType | None = None) -> tuple[TensorType, ...]:
    axis = norm_axis(a["axis"], x.rank)
    static = sizes is None and not reads_values((*a["split"], x.shape[axis]))  # else checked at run time
    if static and (sum(a["split"]) != x.shape[axis] or any(s < 0 for s in a["split"])):
        raise ShapeError(f"split sizes {list(a['split'])} do not add up to axis {axis} of {x}")
    return tuple(x.with_shape(x.shape[:axis] + (s,) + x.shape[axis + 1 :]) for s in a["split"])


@op("Split", INJ, infer=_split_infer, inputs=(1, 2), attrs=[Attr("axis", "int", 0), Attr("split", "dims")])
def split(a: dict, x: np.ndarray, sizes: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """Split into pieces of explicit sizes (the frontend computes sizes for num_outputs); with a second input,
    the sizes are its values (read at run time; `split` then holds them as size variables)."""
    axis = norm_axis(a["axis"], x.ndim)
    split = a["split"] if sizes is None else sizes.astype(np.int64).reshape(-1)
    return tuple(np.split(x, np.cumsum(split)[:-1], axis=axis))


@lowering("Split", schedule=schedule_injective("split"))
def _split_te(a: dict, x: te.Tensor, sizes: te.Tensor | None = None) -> list[te.Tensor]:
    axis = norm_axis(a["axis"], x.ndim)

    def piece(k: int, start) -> te.Tensor:
        shape = _with(x.shape, axis, a["split"][k])
        return te.compute(shape, lambda *i: x[_with(i, axis, i[axis] + start(i[axis]))], name=f"split{k}",
                          tag="split", attrs=rows(x.ndim - axis - 1))  # fmt: skip

    if sizes is not None:  # the sizes fed as an input: each piece's start is read by the kernel
        def start_at(k: int):
            return lambda j: sum((te.cast(sizes[(m,)], j.dtype) for m in range(k)), te.const(0, j.dtype))

        return [piece(k, start_at(k)) for k in range(len(a["split"]))]
    starts = np.concatenate([[0], np.cumsum(a["split"])[:-1]]).astype(int)
    return [piece(k, lambda j, s=int(start): s) for k, start in enumerate(starts)]


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
        if not (is_static_dim(dim) and is_static_dim(start) and is_static_dim(end)):
            bounds[ax] = _symbolic_slice(dim, start, end, step)
            continue
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
        bounds[ax] = (start, end, step)
    return bounds


def _symbolic_slice(dim, start, end, step: int) -> tuple:
    """(start, stop, 1) of a slice with a symbolic dim or end (from Shape): step 1, a constant start, an end that is
    a non-negative size expression or a constant (negative: from the end); clamped to the dim with the bounds."""
    if step != 1 or not is_static_dim(start):
        raise ShapeError(f"Slice with a symbolic dim or end ({dim_str(dim)}, {dim_str(end)}) takes step 1 and a "
                         "constant start")  # fmt: skip
    start = start + dim if start < 0 else start
    if is_static_dim(end) and end < 0:
        end = end + dim
    end = simplify_dim(tx.binop("min", _as_expr(end), _as_expr(dim)))
    start = simplify_dim(tx.binop("min", _as_expr(start), _as_expr(end))) if not is_static_dim(start) or \
        not is_static_dim(end) else min(start, end)  # fmt: skip
    return start, end, 1


def _as_expr(d):
    return d if not is_static_dim(d) else tx.const(int(d), "int64")


def _slice_len(start: int, end: int, step: int) -> int:
    if not (is_static_dim(start) and is_static_dim(end)):
        return simplify_dim(tx.binop("max", _as_expr(end) - _as_expr(start), tx.const(0, "int64")))
    return max(0, -(-(end - start) // step))


SLICE_ATTRS = [Attr("starts", "ints", ()), Attr("ends", "dims", ()), Attr("axes", "ints", ()),
               Attr("steps", "ints", ()), Attr("lengths", "dims", None)]  # fmt: skip


def _slice_infer(a: dict, x: TensorType, *operands: TensorType) -> TensorType:
    if operands:  # starts, ends, axes, steps read at run time: the lengths are sizes read from them
        if len(operands) != 4 or a["lengths"] is None or len(a["lengths"]) != x.rank:
            raise ShapeError(f"Slice of {x} with starts, ends, axes and steps as inputs takes the {x.rank} lengths")
        if any(not t.dtype.startswith("int") or t.rank != 1 or t.shape != operands[0].shape for t in operands):
            raise ShapeError(f"Slice starts, ends, axes and steps must be 1-D int tensors of one length, got "
                             f"{', '.join(map(str, operands))}")  # fmt: skip
        return x.with_shape(a["lengths"])
    return x.with_shape(tuple(_slice_len(*b) for b in slice_bounds(x.shape, a)))


@op("Slice", INJ, infer=_slice_infer, inputs=(1, 5), attrs=SLICE_ATTRS)
def slice_(a: dict, x: np.ndarray, *operands: np.ndarray) -> np.ndarray:
    """ONNX Slice with starts/ends/axes/steps as attributes (clamped like ONNX), or as the int tensors
    (starts, ends, axes, steps) read at run time, the output lengths then given as `lengths`."""
    if operands:
        index = [slice(None)] * x.ndim
        for s, e, ax, st in zip(*(o.astype(np.int64).tolist() for o in operands)):
            index[ax + x.ndim if ax < 0 else ax] = slice(s, e, st)
        return x[tuple(index)].copy()
    index = tuple(slice(s, None if e < 0 else e, st) for s, e, st in slice_bounds(x.shape, a))
    return x[index].copy()


def _index(v: Expr, dim) -> Expr:
    """An index into an axis of length dim (int64 when the length is symbolic)."""
    return index_dtype(v, dim) if is_static_dim(dim) else te.cast(v, "int64")


def _runtime_slice_index(x: te.Tensor, o: tuple, starts, ends, axes, steps) -> tuple:
    """The input index an output index copies when starts, axes and steps are tensors read by the kernel: per
    input axis the start (made non-negative and clamped the ONNX way) and step of the entry naming that axis."""
    n = starts.shape[0]
    out = []
    for d, dim in enumerate(x.shape):
        start, step = te.const(0, "int64"), te.const(1, "int64")
        for k in reversed(range(n)):
            ax, s, st = (te.cast(t[(k,)], "int64") for t in (axes, starts, steps))
            s = te.if_then_else(s < 0, s + dim, s)
            s = te.if_then_else(st > 0, te.minimum(te.maximum(s, 0), dim), te.minimum(te.maximum(s, 0), dim - 1))
            hit = te.any(ax == d, ax == d - x.ndim)
            start, step = te.if_then_else(hit, s, start), te.if_then_else(hit, st, step)
        out.append(_index(start + te.cast(o[d], "int64") * step, dim))
    return tuple(out)


@lowering("Slice", schedule=schedule_injective("slice"))
def _slice_te(a: dict, x: te.Tensor, *operands: te.Tensor) -> te.Tensor:
    if operands:
        return te.compute(tuple(a["lengths"]), lambda *o: x[_runtime_slice_index(x, o, *operands)], name="slice",
                          tag="slice")  # fmt: skip
    bounds = slice_bounds(x.shape, a)
    shape = tuple(_slice_len(*b) for b in bounds)
    whole = next((k for k in range(x.ndim) if bounds[x.ndim - 1 - k] != (0, x.shape[x.ndim - 1 - k], 1)), x.ndim)
    return te.compute(shape, lambda *i: x[tuple(b[0] + j * b[2] for j, b in zip(i, bounds))], name="slice",
                      tag="slice", attrs=rows(whole))  # fmt: skip


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


def _check_gather_source(dim: int, out_shape: tuple[int, ...], what: str) -> None:
    if dim == 0 and numel(out_shape):
        raise NotLowerable(f"{what} reads from an empty axis (every index is out of range)")


@lowering("Gather", schedule=schedule_injective("gather"))
def _gather_te(a: dict, x: te.Tensor, idx: te.Tensor) -> te.Tensor:
    axis, r = norm_axis(a["axis"], x.ndim), idx.ndim
    shape = x.shape[:axis] + idx.shape + x.shape[axis + 1 :]
    _check_gather_source(x.shape[axis], shape, "Gather")

    def body(*i):
        j = data_index(idx[i[axis : axis + r]], x.shape[axis])
        return x[i[:axis] + (j,) + i[axis + r :]]

    return te.compute(shape, body, name="gather", tag="gather", attrs=rows(x.ndim - axis - 1))


def _gather_elements_infer(a: dict, x: TensorType, idx: TensorType) -> TensorType:
    norm_axis(a["axis"], x.rank)
    return x.with_shape(idx.shape)


@op("GatherElements", INJ, infer=_gather_elements_infer, inputs=(2, 2), attrs=[Attr("axis", "int", 0)])
def gather_elements(a: dict, x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    axis = norm_axis(a["axis"], x.ndim)
    return np.take_along_axis(x, _fix_indices(idx, x.shape[axis], "GatherElements"), axis=axis)


@lowering("GatherElements", schedule=schedule_injective("gather_elements"))
def _gather_elements_te(a: dict, x: te.Tensor, idx: te.Tensor) -> te.Tensor:
    axis = norm_axis(a["axis"], x.ndim)
    _check_gather_source(x.shape[axis], idx.shape, "GatherElements")
    return te.compute(idx.shape, lambda *i: x[_with(i, axis, data_index(idx[i], x.shape[axis]))],
                      name="gather_elements", tag="gather_elements")  # fmt: skip


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


@lowering("GatherND", schedule=schedule_injective("gather_nd"))
def _gather_nd_te(a: dict, x: te.Tensor, idx: te.Tensor) -> te.Tensor:
    b, k = a["batch_dims"], idx.shape[-1]
    shape = _gather_nd_infer(a, TensorType(x.shape, x.dtype.name), TensorType(idx.shape, idx.dtype.name)).shape
    for t in range(k):
        _check_gather_source(x.shape[b + t], shape, "GatherND")
    m = idx.ndim - 1  # output dims that walk the index tuples (batch dims first)

    def body(*i):
        picked = tuple(data_index(idx[i[:m] + (t,)], x.shape[b + t]) for t in range(k))
        return keep(x[i[:b] + picked + i[m:]], idx if k == 0 else None)

    return te.compute(shape, body, name="gather_nd", tag="gather_nd", attrs=rows(x.ndim - b - k))


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


# A scatter is lowered as a search: each output element reduces over the updates that land on it
# (last one wins without a reduction, as numpy's assignment does), then combines with the input.
_PROD = te.comm_reducer(lambda x, y: x * y, lambda t: 1, "prod")
_SCATTER_TE = {"add": (te.sum, lambda x, r: x + r), "mul": (_PROD, lambda x, r: x * r),
               "max": (te.max, te.maximum), "min": (te.min, te.minimum)}  # fmt: skip


def _check_scatter(a: dict, x: te.Tensor) -> None:
    if a["reduction"] != "none" and x.dtype.is_bool:
        raise NotLowerable(f"reduction {a['reduction']!r} on bool data")


@lowering("ScatterElements", schedule=schedule_injective("scatter_elements"))
def _scatter_elements_te(a: dict, x: te.Tensor, idx: te.Tensor, upd: te.Tensor) -> te.Tensor:
    axis = norm_axis(a["axis"], x.ndim)
    dim, n = x.shape[axis], idx.shape[axis]
    _check_scatter(a, x)
    if numel(idx.shape) == 0 or numel(x.shape) == 0:
        return copy_compute(x, "scatter_elements", (idx, upd))

    def at(i: tuple, j: Expr) -> tuple:
        """The position in idx/upd whose update may land on element i, clamped inside idx/upd."""
        return tuple(j if d == axis else te.minimum(i[d], idx.shape[d] - 1) if idx.shape[d] < x.shape[d] else i[d]
                     for d in range(x.ndim))  # fmt: skip

    def lands(i: tuple, j: Expr) -> Expr:
        inside = [i[d] < idx.shape[d] for d in range(x.ndim) if d != axis and idx.shape[d] < x.shape[d]]
        return te.all(*inside, wrapped(idx[at(i, j)], dim) == i[axis])

    if a["reduction"] == "none":

        def last_body(*i):
            j = te.reduce_axis((0, n), name="j")
            return te.max(j.var, axis=j, where=lands(i, j.var))

        last = te.compute(x.shape, last_body, name="scatter_last")

        def body(*i):
            j = last[i]
            return te.if_then_else(j >= 0, upd[at(i, te.maximum(j, 0))], x[i])

        return te.compute(x.shape, body, name="scatter_elements", tag="scatter_elements")
    reducer, combine = _SCATTER_TE[a["reduction"]]

    def acc_body(*i):
        j = te.reduce_axis((0, n), name="j")
        return reducer(upd[at(i, j.var)], axis=j, where=lands(i, j.var))

    acc = te.compute(x.shape, acc_body, name="scatter_acc")
    return te.compute(x.shape, lambda *i: combine(x[i], acc[i]), name="scatter_elements", tag="scatter_elements")


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


@lowering("ScatterND", schedule=schedule_injective("scatter_nd"))
def _scatter_nd_te(a: dict, x: te.Tensor, idx: te.Tensor, upd: te.Tensor) -> te.Tensor:
    k, tuples = idx.shape[-1], idx.shape[:-1]
    _check_scatter(a, x)
    if k > x.ndim:
        raise NotLowerable(f"index tuples of length {k} for data of rank {x.ndim}")
    if numel(tuples) == 0 or numel(x.shape) == 0:
        return copy_compute(x, "scatter_nd", (idx, upd))
    dims = tuples or (1,)  # one index tuple: a reduction over one dummy axis

    def axes() -> list:
        return [te.reduce_axis((0, n), name=f"m{d}") for d, n in enumerate(dims)]

    def lands(p: tuple, ms: tuple) -> Expr:
        at = ms if tuples else ()
        return te.all(*(wrapped(idx[at + (t,)], x.shape[t]) == p[t] for t in range(k)))

    if a["reduction"] == "none":
        big = numel(dims) >= 2**31

        def slot_body(*p):
            ms = axes()
            flat = te.const(0, "int64" if big else "int32")
            for m, n in zip(ms, dims):
                flat = flat * n + m.var
            return te.max(flat, axis=ms, where=lands(p, tuple(m.var for m in ms)))

        slot = te.compute(x.shape[:k], slot_body, name="scatter_slot")  # the last tuple that names p, or < 0

        def body(*i):
            f = te.maximum(slot[i[:k]], 0)
            at = []
            for n in reversed(tuples):
                at.append(f % n)
                f = f // n
            return te.if_then_else(slot[i[:k]] >= 0, upd[tuple(reversed(at)) + i[k:]], x[i])

        return te.compute(x.shape, body, name="scatter_nd", tag="scatter_nd", attrs=rows(x.ndim - k))
    reducer, combine = _SCATTER_TE[a["reduction"]]

    def acc_body(*i):
        ms = axes()
        at = tuple(m.var for m in ms) if tuples else ()
        return reducer(upd[at + i[k:]], axis=ms, where=lands(i[:k], tuple(m.var for m in ms)))

    acc = te.compute(x.shape, acc_body, name="scatter_acc")
    return te.compute(x.shape, lambda *i: combine(x[i], acc[i]), name="scatter_nd", tag="scatter_nd")


# -- broadcasting copies -------------------------------------------------------------------------
def _expand_infer(a: dict, x: TensorType) -> TensorType:
    return x.with_shape(broadcast_shapes(x.shape, a["shape"]))


@op("Expand", Pattern.BROADCAST, infer=_expand_infer, attrs=[Attr("shape", "dims")])
def expand(a: dict, x: np.ndarray) -> np.ndarray:
    return np.broadcast_to(x, broadcast_shapes(x.shape, a["shape"])).copy()


@lowering("Expand", schedule=schedule_injective("expand"))
def _expand_te(a: dict, x: te.Tensor) -> te.Tensor:
    shape = broadcast_shapes(x.shape, a["shape"])
    same = next((k for k in range(x.ndim) if x.shape[x.ndim - 1 - k] != shape[len(shape) - 1 - k]), x.ndim)
    return te.compute(shape, lambda *i: x[broadcast_indices(i, x.shape, len(shape))], name="expand", tag="expand",
                      attrs=rows(same))  # fmt: skip


def _tile_infer(a: dict, x: TensorType) -> TensorType:
    if len(a["repeats"]) != x.rank:
        raise ShapeError(f"Tile repeats {list(a['repeats'])} must have one entry per axis of {x}")
    return x.with_shape(tuple(simplify_dim(d * r) for d, r in zip(x.shape, a["repeats"])))


@op("Tile", INJ, infer=_tile_infer, attrs=[Attr("repeats", "dims")])
def tile(a: dict, x: np.ndarray) -> np.ndarray:
    return np.tile(x, a["repeats"])


@lowering("Tile", schedule=schedule_injective("tile"))
def _tile_te(a: dict, x: te.Tensor) -> te.Tensor:
    shape = tuple(simplify_dim(d * r) for d, r in zip(x.shape, a["repeats"]))
    untiled = next((k for k, r in enumerate(reversed(a["repeats"])) if r != 1), x.ndim)
    return te.compute(shape, lambda *i: x[tuple(j if r == 1 else j % d for j, d, r in zip(i, x.shape, a["repeats"]))],
                      name="tile", tag="tile", attrs=rows(untiled))  # fmt: skip


# -- padding -------------------------------------------------------------------------------------
def _pad_infer(a: dict, x: TensorType, value: TensorType | None = None, pads: TensorType | None = None,
               axes: TensorType | None = None) -> TensorType:  # fmt: skip
    if pads is not None:  # pads (and axes) read at run time: the padded dims are sizes read from them
        if a["lengths"] is None or len(a["lengths"]) != x.rank:
            raise ShapeError(f"Pad of {x} with the pads as an input takes the {x.rank} padded dims")
        if any(t is not None and (not t.dtype.startswith("int") or t.rank != 1) for t in (pads, axes)):
            raise ShapeError(f"Pad's pads and axes must be 1-D int tensors, got {pads} and {axes}")
        return x.with_shape(a["lengths"])
    pads = a["pads"]
    if len(pads) != 2 * x.rank:
        raise ShapeError(f"Pad needs {2 * x.rank} pads for {x}, got {list(pads)}")
    shape = tuple(d + pads[i] + pads[i + x.rank] for i, d in enumerate(x.shape))
    if any(d < 0 for d in shape):
        raise ShapeError(f"pads {list(pads)} remove more than {x} holds")
    return x.with_shape(shape)


@op("Pad", INJ, infer=_pad_infer, inputs=(1, 4),
    attrs=[Attr("pads", "ints", ()), Attr("mode", "str", "constant", **one_of("constant", "reflect", "edge", "wrap")),
           Attr("value", "float", 0.0), Attr("lengths", "dims", None)])  # fmt: skip
def pad(a: dict, x: np.ndarray, value: np.ndarray | None = None, pads: np.ndarray | None = None,
        axes: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """Pad with begin/end amounts per axis (ONNX order); negative pads crop. The pads (and the axes they apply
    to) are an attribute, or int tensors read at run time with the padded dims given as `lengths`."""
    rank = x.ndim
    pads = a["pads"] if pads is None else full_pads(pads.astype(np.int64).tolist(), axes, rank)
    crop = tuple(slice(max(-pads[i], 0), x.shape[i] - max(-pads[i + rank], 0)) for i in range(rank))
    x = x[crop]
    widths = [(max(pads[i], 0), max(pads[i + rank], 0)) for i in range(rank)]
    if a["mode"] == "constant":
        fill = value.reshape(()) if value is not None and value.size else np.asarray(a["value"])
        return np.pad(x, widths, mode="constant", constant_values=fill.astype(x.dtype))
    return np.pad(x, widths, mode={"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[a["mode"]])


def full_pads(pads: list[int], axes: np.ndarray | None, rank: int) -> tuple[int, ...]:
    """Begin and end pads of every axis from the pads of `axes` (None: all of them)."""
    if axes is None:
        return tuple(pads)
    axes = norm_axes(tuple(int(v) for v in axes.reshape(-1)), rank)
    full = [0] * (2 * rank)
    for i, ax in enumerate(axes):
        full[ax], full[ax + rank] = pads[i], pads[i + len(axes)]
    return tuple(full)


def _pad_schedule(a: dict, outs: list[te.Tensor], target: Target) -> te.Schedule:
    """Padded axes keep their own loops, so loop partitioning splits each into its border parts and
    an interior without bounds checks or index folding (the interior conditions are monotone in the
    loop variable); the axes before the first padded one are fused (parallel), those after the last
    fused and vectorized."""
    if a["lengths"] is not None:  # pads read at run time
        return schedule_injective("pad")(a, outs, target)
    if not standalone(outs, "pad") or numel(outs[0].shape) == 0:
        return default_schedule(outs, target)
    (out,) = outs
    pads, rank = a["pads"], out.ndim
    padded = [d for d in range(rank) if pads[d] > 0 or pads[d + rank] > 0]
    if not padded:
        return schedule_injective("pad")(a, outs, target)
    s = te.create_schedule(outs)
    st = s[out]
    axes = list(st.op.axis)
    first, last = padded[0], padded[-1]
    if last + 1 < rank:
        fi = st.fuse(*axes[last + 1 :])
        lanes = target.vector_lanes(max(out.dtype.bits, 8))
        n_inner = numel(out.shape[last + 1 :])
        if n_inner >= lanes and n_inner % lanes == 0:
            _, vi = st.split(fi, lanes)
            st.vectorize(vi)
    if first > 0:
        outer = st.fuse(*axes[:first])
        if numel(out.shape) >= 1 << 15 and target.num_cores > 1:
            st.parallel(outer)
    return s


def _runtime_pad_te(a: dict, x: te.Tensor, fill: Expr, pads: te.Tensor, axes: te.Tensor | None) -> te.Tensor:
    """Pad by pads read by the kernel (a tensor, for `axes` or all axes): per axis, the begin and end amounts of
    the entry naming it; negative ones crop. Reflect and wrap fold any distance, edge clamps."""
    rank, mode, n_pads = x.ndim, a["mode"], pads.shape[0]
    if numel(x.shape) == 0:
        raise NotLowerable("Pad of an empty tensor by pads read at run time")

    def amounts(d: int) -> tuple[Expr, Expr]:
        if axes is None:
            return te.cast(pads[(d,)], "int64"), te.cast(pads[(d + rank,)], "int64")
        k_axes = n_pads // 2
        b, e = te.const(0, "int64"), te.const(0, "int64")
        for k in reversed(range(k_axes)):
            ax = te.cast(axes[(k,)], "int64")
            hit = te.any(ax == d, ax == d - rank)
            b = te.if_then_else(hit, te.cast(pads[(k,)], "int64"), b)
            e = te.if_then_else(hit, te.cast(pads[(k + k_axes,)], "int64"), e)
        return b, e

    def body(*o):
        src, inside = [], []
        for d in range(rank):
            b, e = amounts(d)
            crop = te.maximum(-b, 0)
            kept = x.shape[d] - crop - te.maximum(-e, 0)  # the axis's length after cropping
            t = te.cast(o[d], "int64") - te.maximum(b, 0)
            last = te.maximum(kept - 1, 0)
            if mode == "wrap":
                t = t % te.maximum(kept, 1)
            elif mode == "reflect":
                period = te.maximum(2 * last, 1)
                r = t % period
                t = te.if_then_else(r < kept, r, period - r)
            else:
                inside += [t >= 0, t < kept]
            at = te.minimum(te.maximum(t, 0), last) + crop  # never outside the input, whatever the pads
            src.append(_index(te.minimum(at, x.shape[d] - 1), x.shape[d]))
        v = x[tuple(src)]
        return te.if_then_else(te.all(*inside), v, fill) if mode == "constant" else v

    return te.compute(tuple(a["lengths"]), body, name="pad", tag="pad")


@lowering("Pad", schedule=_pad_schedule)
def _pad_te(a: dict, x: te.Tensor, value: te.Tensor | None = None, pads_in: te.Tensor | None = None,
            axes: te.Tensor | None = None) -> te.Tensor:  # fmt: skip
    if pads_in is not None:
        fill = (te.cast(value[(0,) * value.ndim], x.dtype) if value is not None and numel(value.shape)
                else keep(const_of(a["value"], x.dtype.name), value))  # fmt: skip
        return _runtime_pad_te(a, x, fill, pads_in, axes)
    rank, pads, mode = x.ndim, a["pads"], a["mode"]
    shape = _pad_infer(a, TensorType(x.shape, x.dtype.name)).shape
    before = [max(pads[d], 0) for d in range(rank)]
    after = [max(pads[d + rank], 0) for d in range(rank)]
    crop = [max(-pads[d], 0) for d in range(rank)]
    kept = [x.shape[d] - crop[d] - max(-pads[d + rank], 0) for d in range(rank)]  # length after cropping
    if mode != "constant" and numel(shape) and any((b or e) and n <= 0 for b, e, n in zip(before, after, kept)):
        raise NotLowerable(f"{mode} padding of an empty axis")
    if value is not None and numel(value.shape):
        fill = te.cast(value[(0,) * value.ndim], x.dtype)
    else:
        fill = keep(const_of(a["value"], x.dtype.name), value)

    def source(d: int, o: Expr) -> Expr:
        """The index into the cropped axis d that output index o copies (constant mode: unchecked)."""
        t, n, b, e = o - before[d], kept[d], before[d], after[d]
        if not (b or e) or mode == "constant":
            return t
        fold = {"edge": max(b, e), "wrap": n, "reflect": n - 1}[mode]  # the widest border one fold covers
        if max(b, e) <= fold:  # t < 0 and t >= n are the border parts, each folded once
            below, beyond = {"edge": (0, n - 1), "wrap": (t + n, t - n), "reflect": (-t, 2 * (n - 1) - t)}[mode]
            inner = te.if_then_else(t < n, t, beyond) if e else t
            return te.if_then_else(t >= 0, inner, below) if b else inner
        if mode == "wrap":
            return t % n
        period = 2 * (n - 1)
        if period == 0:  # reflect of a single element
            return te.const(0)
        r = t % period  # reflect: a triangle wave over 0 .. n-1 .. 1
        return te.if_then_else(r < n, r, period - r)

    def body(*o):
        src = tuple(source(d, o[d]) + crop[d] for d in range(rank))
        if mode != "constant":
            return x[src]
        conds = []
        for d in range(rank):
            if before[d]:
                conds.append(o[d] >= before[d])
            if after[d]:
                conds.append(o[d] < before[d] + kept[d])
        return te.if_then_else(te.all(*conds), x[src], fill) if conds else x[src]

    return te.compute(shape, body, name="pad", tag="pad")


# -- creation from types or attributes ------------------------------------------------------------
@op("Shape", INJ, infer=lambda a, x: TensorType((len(range(x.rank)[a["start"] : a["end"]]),), "int64"),
    attrs=[Attr("start", "int", 0), Attr("end", "int", None)], reads_data=False)  # fmt: skip
def shape(a: dict, x: np.ndarray) -> np.ndarray:
    """The input's shape (a constant: the frontend folds it, types are static)."""
    return np.array(x.shape[a["start"] : a["end"]], dtype=np.int64)


@lowering("Shape")
def _shape_te(a: dict, x: te.Tensor) -> te.Tensor:
    dims = x.shape[a["start"] : a["end"]]

    def dim(d) -> Expr:  # a symbolic dim is read from the kernel's size arguments
        return te.const(d, "int64") if is_static_dim(d) else te.cast(d, "int64")

    def body(i):
        out = dim(dims[-1] if dims else 0)
        for k in reversed(range(len(dims) - 1)):
            out = te.if_then_else(i == k, dim(dims[k]), out)
        return keep(out, x)

    return te.compute((len(dims),), body, name="shape")


def _size_value_infer(a: dict, *xs: TensorType) -> TensorType:
    shape = (len(a["values"]),) if a["shape"] is None else a["shape"]
    if math.prod(shape) != len(a["values"]):
        raise ShapeError(f"SizeValue: {len(a['values'])} values do not fill shape {list(shape)}")
    return TensorType(shape, a["dtype"])


@op("SizeValue", INJ, infer=_size_value_infer, inputs=(0, None), reads_data=False,
    attrs=[Attr("values", "dims"), Attr("shape", "ints", None), Attr("dtype", "dtype", "int64")])  # fmt: skip
def size_value(a: dict, *xs: np.ndarray) -> np.ndarray:
    """A tensor of dims (sizes of this call, for symbolic ones): a frontend's size arithmetic used as data (torch's
    `arange(past, past + seq)`, a SymInt added to a tensor). The inputs are tensors whose shapes hold the size
    variables the values use (only their types matter: as for Shape, the kernel takes its sizes from them)."""
    return np.array([int(v) for v in a["values"]], np_dtype(a["dtype"])).reshape(_size_value_infer(a).shape)


@lowering("SizeValue")
def _size_value_te(a: dict, *xs: te.Tensor) -> te.Tensor:
    shape, dtype = _size_value_infer(a).shape, native_dtype(a["dtype"])
    values = [te.const(v, dtype) if is_static_dim(v) else te.cast(v, dtype) for v in a["values"]]

    def body(*i):
        flat = 0
        for k, n in zip(i, shape):
            flat = flat * n + k
        out = values[-1]
        for k in reversed(range(len(values) - 1)):
            out = te.if_then_else(flat == k, values[k], out)
        return keep(out, *xs)

    return te.compute(shape, body, name="size_value")


@op("Size", INJ, infer=lambda a, x: TensorType((), "int64"), reads_data=False)
def size(a: dict, x: np.ndarray) -> np.ndarray:
    return np.array(x.size, dtype=np.int64)


@lowering("Size")
def _size_te(a: dict, x: te.Tensor) -> te.Tensor:
    n = math.prod(x.shape) if all(isinstance(d, int) for d in x.shape) else None
    count = te.const(n, "int64") if n is not None else te.cast(math.prod(x.shape), "int64")  # symbolic: from sizes
    return te.compute((), lambda: keep(count, x), name="size")


def _const_of_shape_infer(a: dict) -> TensorType:
    return TensorType(a["shape"], a["value"].dtype.name)


@op("ConstantOfShape", INJ, infer=_const_of_shape_infer, inputs=(0, 0),
    attrs=[Attr("shape", "dims"), Attr("value", "tensor", np.zeros(1, np.float32))])  # fmt: skip
def constant_of_shape(a: dict) -> np.ndarray:
    return np.full(a["shape"], a["value"].reshape(-1)[0], dtype=a["value"].dtype)


@lowering("ConstantOfShape", schedule=schedule_injective("constant_of_shape"))
def _constant_of_shape_te(a: dict) -> te.Tensor:
    dtype = native_dtype(a["value"].dtype.name)
    value = const_of(a["value"].reshape(-1)[0], dtype)
    return te.compute(a["shape"], lambda *i: value, name="constant_of_shape", tag="constant_of_shape")


def _eye_like_infer(a: dict, x: TensorType) -> TensorType:
    if x.rank != 2:
        raise ShapeError(f"EyeLike needs a 2-D input, got {x}")
    return x.with_dtype(a["dtype"] or x.dtype)


@op("EyeLike", INJ, infer=_eye_like_infer, attrs=[Attr("dtype", "dtype", None), Attr("k", "int", 0)], reads_data=False)
def eye_like(a: dict, x: np.ndarray) -> np.ndarray:
    return np.eye(x.shape[0], x.shape[1], k=a["k"], dtype=np_dtype(a["dtype"]) if a["dtype"] else x.dtype)


@lowering("EyeLike", schedule=schedule_injective("eye_like"))
def _eye_like_te(a: dict, x: te.Tensor) -> te.Tensor:
    dtype = native_dtype(a["dtype"] or x.dtype.name)
    one, zero = const_of(1, dtype), const_of(0, dtype)
    return te.compute(x.shape, lambda i, j: keep(te.if_then_else(j - i == a["k"], one, zero), x), name="eye_like",
                      tag="eye_like")  # fmt: skip


def _range_infer(a: dict, start: TensorType, limit: TensorType, delta: TensorType) -> TensorType:
    if a["length"] is None:
        raise ShapeDependsOnData("the length of Range depends on the values of start, limit and delta")
    if any(not t.is_static or t.size != 1 or t.dtype != start.dtype for t in (start, limit, delta)):
        raise ShapeError(f"Range takes three scalars of one dtype, got {start}, {limit}, {delta}")
    return TensorType((a["length"],), start.dtype)


@op("Range", INJ, infer=_range_infer, inputs=(3, 3), attrs=[Attr("length", "dim", None)])
def range_(a: dict, start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """start, start + delta, ... up to limit (excluded); `length` is their number when the frontend knows it as a
    dim (bounds computed from symbolic shapes) or the run time reads it from the values
    (`ember.graph.dims.ValueSizeVar`), None when only the data tells."""
    n = max(int(np.ceil((limit.item() - start.item()) / delta.item())), 0)
    return (start + np.arange(n, dtype=np.int64).astype(start.dtype) * delta).astype(start.dtype)


@lowering("Range", schedule=schedule_injective("range"))
def _range_te(a: dict, start: te.Tensor, limit: te.Tensor, delta: te.Tensor) -> te.Tensor:
    if a["length"] is None:
        raise NotLowerable("Range without a length computed at run time")
    dtype = native_dtype(start.dtype.name)
    first, step = start[(0,) * start.ndim], delta[(0,) * delta.ndim]
    return te.compute((a["length"],), lambda i: keep(first + te.cast(i, dtype) * step, limit), name="range",
                      tag="range")  # fmt: skip


def _one_hot_infer(a: dict, idx: TensorType, values: TensorType) -> TensorType:
    rank = idx.rank + 1
    axis = norm_axis(a["axis"], rank)
    shape = list(idx.shape)
    shape.insert(axis, a["depth"])
    return values.with_shape(tuple(shape))


@op("OneHot", INJ, infer=_one_hot_infer, inputs=(2, 2), attrs=[Attr("depth", "dim"), Attr("axis", "int", -1)])
def one_hot(a: dict, idx: np.ndarray, values: np.ndarray) -> np.ndarray:
    """values[1] where the index hits, values[0] elsewhere; depth is an attribute."""
    depth = a["depth"]
    axis = norm_axis(a["axis"], idx.ndim + 1)
    idx = idx.astype(np.int64)
    idx = np.where(idx < 0, idx + depth, idx)
    hot = np.expand_dims(idx, axis) == np.arange(depth).reshape([-1 if i == axis else 1 for i in range(idx.ndim + 1)])
    return np.where(hot, values[1], values[0]).astype(values.dtype)


@lowering("OneHot", schedule=schedule_injective("one_hot"))
def _one_hot_te(a: dict, idx: te.Tensor, values: te.Tensor) -> te.Tensor:
    depth = a["depth"]
    axis = norm_axis(a["axis"], idx.ndim + 1)
    shape = _one_hot_infer(a, TensorType(idx.shape, idx.dtype.name), TensorType(values.shape, values.dtype.name)).shape

    def body(*o):
        v = te.cast(idx[o[:axis] + o[axis + 1 :]], "int64")  # astype(int64): floats truncate
        return te.if_then_else(wrapped(v, depth) == o[axis], values[1], values[0])

    return te.compute(shape, body, name="one_hot", tag="one_hot")


def _trilu_infer(a: dict, x: TensorType, k: TensorType | None = None) -> TensorType:
    if k is not None and (not k.is_static or k.size != 1 or not k.dtype.startswith("int")):
        raise ShapeError(f"Trilu's k input must hold one integer, got {k}")
    return x


@op("Trilu", INJ, infer=_trilu_infer, inputs=(1, 2), attrs=[Attr("upper", "int", 1), Attr("k", "int", 0)])
def trilu(a: dict, x: np.ndarray, k: np.ndarray | None = None) -> np.ndarray:
    """Keeps the upper (or lower) triangle from diagonal k (the attribute, plus the input k read at run time)."""
    k = a["k"] + (int(k.reshape(-1)[0]) if k is not None else 0)
    return np.triu(x, k) if a["upper"] else np.tril(x, k)


@lowering("Trilu", schedule=schedule_injective("trilu"))
def _trilu_te(a: dict, x: te.Tensor, k_in: te.Tensor | None = None) -> te.Tensor:
    if x.ndim < 2:
        raise NotLowerable("Trilu needs a matrix (rank >= 2)")
    zero = te.const(0, x.dtype)
    k = te.const(a["k"], "int64")
    if k_in is not None:  # the diagonal fed as an input: read by the kernel
        k = k + te.cast(k_in[(0,) * k_in.ndim], "int64")

    def body(*o):
        diag = te.cast(o[-1] - o[-2], "int64")
        return te.if_then_else(diag >= k if a["upper"] else diag <= k, x[o], zero)

    return te.compute(x.shape, body, name="trilu", tag="trilu")


# -- data-dependent shapes (the frontend evaluates them when their inputs are constant) ------------
def _data_dependent(what: str):
    def infer(a: dict, *ts: TensorType | None) -> TensorType:
        raise ShapeDependsOnData(what)

    return infer


def _non_zero_infer(a: dict, x: TensorType) -> TensorType:
    if a["count"] is None:
        raise ShapeDependsOnData("the number of non-zero elements depends on the data")
    return TensorType((x.rank, a["count"]), "int64")


@op("NonZero", Pattern.OPAQUE, infer=_non_zero_infer, attrs=[Attr("count", "dim", None)])
def non_zero(a: dict, x: np.ndarray) -> np.ndarray:
    """The indices of the non-zero elements, one row per axis; `count` is their number when the run time
    computes it from the input's values (`ember.graph.dims.ValueSizeVar`), None when only the data tells."""
    return np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)


NONZERO_LIMIT = 1 << 26  # element pairs the quadratic NonZero compute may visit


@lowering("NonZero")
def _non_zero_te(a: dict, x: te.Tensor) -> te.Tensor:
    """prefix[m] counts the non-zero elements before flat index m; output column j holds the coordinates of
    the element that is non-zero with prefix j: quadratic in the element count, for the small tensors
    NonZero meets."""
    if a["count"] is None:
        raise NotLowerable("NonZero without a count computed at run time")
    n = numel(x.shape)
    if not isinstance(n, int) or n * n > NONZERO_LIMIT:
        raise NotLowerable(f"NonZero over {n} elements: the quadratic compute would be too slow")

    def coords(m: Expr) -> tuple:
        out = []
        for d in reversed(x.shape):
            out.append(m % d)
            m = m // d
        return tuple(reversed(out))

    def hit(m: Expr) -> Expr:
        v = x[coords(m)]
        return v != te.const(0, x.dtype) if not x.dtype.is_bool else v

    q = te.reduce_axis((0, n), name="q")
    prefix = te.compute((n,), lambda m: te.sum(te.cast(hit(q.var), "int64"), axis=q, where=q.var < m), name="nz_prefix")
    r = te.reduce_axis((0, n), name="r")

    def body(d, j):
        at = te.all(hit(r.var), prefix[(r.var,)] == te.cast(j, "int64"))
        coord = sum((te.if_then_else(d == k, te.cast(c, "int64"), te.const(0, "int64"))
                     for k, c in enumerate(coords(r.var))), te.const(0, "int64"))  # fmt: skip
        return te.sum(coord, axis=r, where=at)

    return te.compute((x.ndim, a["count"]), body, name="non_zero", tag="non_zero")


@op("Compress", Pattern.OPAQUE, infer=_data_dependent("the output length depends on the condition values"),
    inputs=(2, 2), attrs=[Attr("axis", "int", None)])  # fmt: skip
def compress(a: dict, x: np.ndarray, cond: np.ndarray) -> np.ndarray:
    return np.compress(cond.astype(bool), x, axis=a["axis"])


def _unique_infer(a: dict, x: TensorType) -> tuple[TensorType, ...]:
    if a["count"] is None:
        raise ShapeDependsOnData("the number of unique elements depends on the data")
    n = a["count"]
    if a["axis"] is not None:  # slices along axis 1 of a (before, length, after) view
        if a["axis"] != 1 or x.rank != 3:
            raise ShapeError(f"Unique with a count read at run time and an axis takes a 3-D view and axis 1, got {x}")
        b, length, after = x.shape
        return (x.with_shape((b, n, after)), TensorType((n,), "int64"), TensorType((length,), "int64"),
                TensorType((n,), "int64"))  # fmt: skip
    if x.rank != 1:
        raise ShapeError(f"Unique with a count read at run time takes a 1-D input and no axis, got {x}")
    return x.with_shape((n,)), TensorType((n,), "int64"), TensorType(x.shape, "int64"), TensorType((n,), "int64")


@op("Unique", Pattern.OPAQUE, infer=_unique_infer,
    attrs=[Attr("axis", "int", None), Attr("sorted", "int", 1), Attr("count", "dim", None)])  # fmt: skip
def unique(a: dict, x: np.ndarray) -> tuple[np.ndarray, ...]:
    """Unique values, first indices, inverse indices, counts (ONNX order when unsorted); `count` is the number of
    unique values when the run time computes it from the input's values, None when only the data tells."""
    axis = a["axis"]
    _, first, inverse, counts = np.unique(x, axis=axis, return_index=True, return_inverse=True, return_counts=True)
    order = np.arange(len(first)) if a["sorted"] else np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    first = first[order]
    values = np.take(x, first, axis=axis) if axis is not None else x.reshape(-1)[first]
    inverse = rank[inverse.reshape(-1)]
    return values, first.astype(np.int64), inverse.astype(np.int64), counts[order].astype(np.int64)


@lowering("Unique")
def _unique_te(a: dict, x: te.Tensor) -> list[te.Tensor]:
    """Quadratic in the element count, like NonZero: an element is a first occurrence when no earlier one equals
    it; its rank counts the first occurrences of smaller values (sorted) or before its own first occurrence; each
    output slot j sums over the first occurrence of rank j (one term)."""
    if a["count"] is None:
        raise NotLowerable("Unique without a count computed at run time")
    if a["axis"] is not None:
        return _unique_slices_te(a, x)
    (n,) = x.shape
    if not isinstance(n, int) or n * n > NONZERO_LIMIT:
        raise NotLowerable(f"Unique of {n} elements: the quadratic compute would be too slow")
    native_dtype(x.dtype.name)
    i64 = lambda v: te.cast(v, "int64")  # noqa: E731

    def count(cond) -> te.Tensor:  # (n,): for each element i, how many m satisfy cond(m, i)
        def body(i):
            m = te.reduce_axis((0, n), name="m")
            return te.sum(te.const(1, "int64"), axis=m, where=cond(m.var, i))

        return body

    dups = te.compute((n,), count(lambda m, i: te.all(m < i, x[m] == x[i])), name="unique_dups")
    first = lambda m: dups[m] == 0  # noqa: E731
    m0 = te.reduce_axis((0, n), name="m")
    first_at = te.compute((n,), lambda i: te.sum(i64(m0.var), axis=m0, where=te.all(first(m0.var), x[m0.var] == x[i])),
                          name="unique_first")  # fmt: skip
    if a["sorted"]:
        rank = te.compute((n,), count(lambda m, i: te.all(first(m), x[m] < x[i])), name="unique_rank")
    else:
        rank = te.compute((n,), count(lambda m, i: te.all(first(m), i64(m) < first_at[i])), name="unique_rank")

    def slot(value):  # output slot j: value(i) of the first occurrence of rank j
        def body(j):
            r = te.reduce_axis((0, n), name="r")
            return te.sum(value(r.var), axis=r, where=te.all(first(r.var), rank[r.var] == i64(j)))

        return body

    k = a["count"]
    values = te.compute((k,), slot(lambda i: x[i]), name="unique_values")
    indices = te.compute((k,), slot(lambda i: i64(i)), name="unique_indices")
    inverse = te.compute((n,), lambda i: rank[i], name="unique_inverse")
    c = te.reduce_axis((0, n), name="c")
    counts = te.compute((k,), lambda j: te.sum(te.const(1, "int64"), axis=c, where=rank[c.var] == i64(j)),
                        name="unique_counts")  # fmt: skip
    return [values, indices, inverse, counts]


def _unique_slices_te(a: dict, x: te.Tensor) -> list[te.Tensor]:
    """Unique along axis 1 of x (before, n, after): slice i is x[:, i, :], its S = before * after elements in C
    order. For each pair of slices, the first element where they differ (S: equal) decides equality and the
    lexicographic order numpy's unique(axis=) sorts by; then as `_unique_te` for single values."""
    b, n, after = x.shape
    size = b * after
    if not all(isinstance(d, int) for d in x.shape) or n * n * max(size, 1) > NONZERO_LIMIT:
        raise NotLowerable(f"Unique of {n} slices of {size} elements: the quadratic compute would be too slow")
    native_dtype(x.dtype.name)
    i64 = lambda v: te.cast(v, "int64")  # noqa: E731

    def at(slice_: Expr, p: Expr) -> Expr:  # element p of slice `slice_`
        return x[p // after, slice_, p % after]

    def first_difference(m, i):
        p = te.reduce_axis((0, size), name="p")
        return te.min(i64(p.var), axis=p, where=at(m, p.var) != at(i, p.var))

    diff = te.compute((n, n), first_difference, name="unique_diff")  # >= size: the slices are equal
    same = lambda m, i: diff[m, i] >= size  # noqa: E731

    def less(m, i):  # slice m before slice i in numpy's (lexicographic) order
        d = te.minimum(diff[m, i], te.const(max(size - 1, 0), "int64"))
        return te.all(diff[m, i] < size, at(m, d) < at(i, d))

    def count(cond):
        def body(i):
            m = te.reduce_axis((0, n), name="m")
            return te.sum(te.const(1, "int64"), axis=m, where=cond(m.var, i))

        return body

    dups = te.compute((n,), count(lambda m, i: te.all(m < i, same(m, i))), name="unique_dups")
    first = lambda m: dups[m] == 0  # noqa: E731
    m0 = te.reduce_axis((0, n), name="m")
    first_at = te.compute((n,), lambda i: te.sum(i64(m0.var), axis=m0, where=te.all(first(m0.var), same(m0.var, i))),
                          name="unique_first")  # fmt: skip
    if a["sorted"]:
        rank = te.compute((n,), count(lambda m, i: te.all(first(m), less(m, i))), name="unique_rank")
    else:
        rank = te.compute((n,), count(lambda m, i: te.all(first(m), i64(m) < first_at[i])), name="unique_rank")
    k = a["count"]

    def slot_value(bi, j, ai):
        r = te.reduce_axis((0, n), name="r")
        return te.sum(x[bi, r.var, ai], axis=r, where=te.all(first(r.var), rank[r.var] == i64(j)))

    def slot_index(j):
        r = te.reduce_axis((0, n), name="r")
        return te.sum(i64(r.var), axis=r, where=te.all(first(r.var), rank[r.var] == i64(j)))

    values = te.compute((b, k, after), slot_value, name="unique_values")
    indices = te.compute((k,), slot_index, name="unique_indices")
    inverse = te.compute((n,), lambda i: rank[i], name="unique_inverse")
    c = te.reduce_axis((0, n), name="c")
    counts = te.compute((k,), lambda j: te.sum(te.const(1, "int64"), axis=c, where=rank[c.var] == i64(j)),
                        name="unique_counts")  # fmt: skip
    return [values, indices, inverse, counts]


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


@lowering("DepthToSpace", schedule=schedule_injective("depth_to_space"))
def _depth_to_space_te(a: dict, x: te.Tensor) -> te.Tensor:
    b = a["blocksize"]
    n, c, h, w = x.shape
    cc = c // (b * b)

    def body(i, ch, y, z):
        by, bx = y % b, z % b
        src = (by * b + bx) * cc + ch if a["mode"] == "DCR" else ch * (b * b) + by * b + bx
        return x[i, src, y // b, z // b]

    return te.compute((n, cc, h * b, w * b), body, name="depth_to_space", tag="depth_to_space")


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


@lowering("SpaceToDepth", schedule=schedule_injective("space_to_depth"))
def _space_to_depth_te(a: dict, x: te.Tensor) -> te.Tensor:
    b = a["blocksize"]
    n, c, h, w = x.shape

    def body(i, o, y, z):
        if a["mode"] == "DCR":  # o = (by * b + bx) * c + ch
            ch, blk = o % c, o // c
        else:  # o = ch * b * b + by * b + bx
            ch, blk = o // (b * b), o % (b * b)
        return x[i, ch, y * b + blk // b, z * b + blk % b]

    return te.compute((n, c * b * b, h // b, w // b), body, name="space_to_depth", tag="space_to_depth")


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


@lowering("ReverseSequence", schedule=schedule_injective("reverse_sequence"))
def _reverse_sequence_te(a: dict, x: te.Tensor, lens: te.Tensor) -> te.Tensor:
    b_ax, t_ax = a["batch_axis"], a["time_axis"]
    steps = x.shape[t_ax]

    def body(*o):
        n = lens[o[b_ax]]  # the reference slices [0:n]: a negative n counts from the end
        n = te.if_then_else(n < 0, te.maximum(n + steps, 0), te.minimum(n, steps))
        t = o[t_ax]
        return x[_with(o, t_ax, index_dtype(te.if_then_else(t < n, n - 1 - t, te.cast(t, n.dtype)), steps))]

    return te.compute(x.shape, body, name="reverse_sequence", tag="reverse_sequence",
                      attrs=rows(x.ndim - max(b_ax, t_ax) - 1))  # fmt: skip


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


@lowering("CenterCropPad", schedule=schedule_injective("center_crop_pad"))
def _center_crop_pad_te(a: dict, x: te.Tensor) -> te.Tensor:
    shape = _center_crop_pad_infer(a, TensorType(x.shape, x.dtype.name)).shape
    zero = te.const(0, x.dtype)

    def body(*o):
        src, conds = [], []
        for d, (n_in, n_out) in enumerate(zip(x.shape, shape)):
            if n_out <= n_in:
                src.append(o[d] + (n_in - n_out) // 2)
            else:
                off = (n_out - n_in) // 2
                src.append(o[d] - off)
                conds += [o[d] >= off, o[d] < off + n_in]
        return te.if_then_else(te.all(*conds), x[tuple(src)], zero) if conds else x[tuple(src)]

    same = next((k for k in range(x.ndim) if x.shape[x.ndim - 1 - k] != shape[x.ndim - 1 - k]), x.ndim)
    return te.compute(shape, body, name="center_crop_pad", tag="center_crop_pad", attrs=rows(same))


# -- bit-level and cache updates ------------------------------------------------------------------
def _bitcast_infer(a: dict, x: TensorType) -> TensorType:
    if np_dtype(a["to"]).itemsize != x.np_dtype.itemsize or a["to"].endswith(("int4", "int2", "e2m1fn")):
        raise ShapeError(f"BitCast needs dtypes of one bit width, got {x.dtype} -> {a['to']}")
    return x.with_dtype(a["to"])


@op("BitCast", INJ, infer=_bitcast_infer, attrs=[Attr("to", "dtype")])
def bitcast(a: dict, x: np.ndarray) -> np.ndarray:
    """Reinterpret the bits (little endian) as another dtype of the same width."""
    return x.copy(order="C").view(np_dtype(a["to"]))


@lowering("BitCast", schedule=schedule_injective("bitcast"))
def _bitcast_te(a: dict, x: te.Tensor) -> te.Tensor:
    """A kernel only where BitCast is fused or is not a plain view (`ember.compiler` runs it as a view of its
    input's bytes otherwise): between integer types of one width (and bool to 8-bit integers) a C
    conversion keeps the bits; reinterpreting float bits, or bytes as bools, has no te expression."""
    to = native_dtype(a["to"])
    src, dst = x.dtype, tir_dtype(to)
    if src.is_float or dst.is_float or dst.is_bool:
        raise NotLowerable(f"BitCast {src} -> {to} as a kernel: only a view reinterprets these bits")
    return te.compute(x.shape, lambda *i: te.cast(x[i], to), name="bitcast", tag="bitcast")


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


@lowering("TensorScatter", schedule=schedule_injective("tensor_scatter"))
def _tensor_scatter_te(a: dict, cache: te.Tensor, update: te.Tensor, idx: te.Tensor | None = None) -> te.Tensor:
    axis = norm_axis(a["axis"], cache.ndim)
    size, steps = cache.shape[axis], update.shape[axis]
    if axis == 0 or (idx is not None and idx.ndim != 1):
        raise NotLowerable("TensorScatter writes along an axis after the batch axis, from a 1-D index")
    if steps == 0 or numel(cache.shape) == 0:
        return copy_compute(cache, "tensor_scatter", (update, idx))

    def body(*o):
        start = idx[o[0]] if idx is not None else te.const(0)
        s = o[axis]
        if a["mode"] == "linear":
            t = s - start
            hit = te.all(t >= 0, t < steps)
        else:  # circular: of the steps t with (start + t) % size == s, the last one wins
            t0 = (s - start) % size
            hit = t0 < steps
            t = t0 + (steps - 1 - t0) // size * size
        src = _with(o, axis, index_dtype(te.minimum(te.maximum(t, 0), steps - 1), steps))
        return te.if_then_else(hit, update[src], cache[o])

    return te.compute(cache.shape, body, name="tensor_scatter", tag="tensor_scatter", attrs=rows(cache.ndim - axis - 1))
