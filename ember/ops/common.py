"""Helpers shared by operator entries: shape rules that many ops use, axis handling, the accumulation
dtype of references, the spatial attributes of convolutions and pools."""

from __future__ import annotations

import numpy as np

from ember.graph.dims import clamped_size, dim_bounds, dim_str, is_static_dim, shape_str, simplify_dim
from ember.graph.types import TensorType


class ShapeError(ValueError):
    """Input types that an operator's shape rule rejects."""


class SizeBoundError(ShapeError):
    """Shapes that agree only where a size is at most a bound the model implies (S against min(S, c): a Slice of a
    c-long table by S): `size` and `bound` name it (ember.compile then bounds an unbounded size by it)."""

    def __init__(self, message: str, size: str, bound: int):
        super().__init__(message)
        self.size, self.bound = size, bound


def norm_axis(axis: int, rank: int, what: str = "axis") -> int:
    """A possibly negative axis made non-negative, checked against the rank."""
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"{what} {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def norm_axes(axes: tuple[int, ...], rank: int, what: str = "axes") -> tuple[int, ...]:
    out = tuple(norm_axis(a, rank, what) for a in axes)
    if len(set(out)) != len(out):
        raise ShapeError(f"{what} {axes} repeat an axis")
    return out


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """Numpy (multidirectional) broadcasting of shapes, with a readable error."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dims = {s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0}
        dims.discard(1)
        if len(dims) == 2 and (clamped := clamped_size(*dims)) is not None:
            v, c = clamped
            raise SizeBoundError(f"shapes {', '.join(map(shape_str, shapes))} broadcast only where {v.name} <= {c} "
                                 f"(axis {i}); give it that bound: dynamic_bounds={{{v.name!r}: ({v.lo}, {c})}}",
                                 v.name, c)  # fmt: skip
        if len(dims) > 1:
            raise ShapeError(f"shapes {', '.join(map(shape_str, shapes))} do not broadcast (axis {i})")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def broadcast_type(dtype: str | None = None):
    """Shape rule of broadcasting ops: broadcast shapes; dtype of input 0 unless given."""

    def infer(a: dict, *ts: TensorType | None) -> TensorType:
        present = [t for t in ts if t is not None]
        return TensorType(broadcast_shapes(*(t.shape for t in present)), dtype or present[0].dtype)

    return infer


def check_same_dtype(*ts: TensorType | None, what: str = "inputs") -> None:
    dtypes = {t.dtype for t in ts if t is not None}
    if len(dtypes) > 1:
        raise ShapeError(f"{what} must have one dtype, got {', '.join(sorted(dtypes))}")


def reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def window_out_dim(
    size: int, kernel: int, stride: int, pads: tuple[int, int], dilation: int = 1, ceil: bool = False
) -> int:
    """Output length of a sliding window (conv, pool) along one axis; pads = (begin, end)."""
    span = dilation * (kernel - 1) + 1
    if not is_static_dim(size):  # symbolic: valid where the window fits, checked again with the run-time size
        num = size + (pads[0] + pads[1] - span)
        if dim_bounds(simplify_dim(num + 1))[0] < 1:
            lo = dim_bounds(size)[0]
            raise ShapeError(f"window of size {span} does not fit input length {dim_str(size)} (at least {lo}) "
                             f"padded by {list(pads)}: give it a larger lower bound")  # fmt: skip
        if ceil:
            raise ShapeError(f"ceil_mode windows over a symbolic length ({dim_str(size)}) are not supported")
        return simplify_dim(num // stride + 1)
    num = size + pads[0] + pads[1] - span
    if num < 0:
        raise ShapeError(f"window of size {span} does not fit input length {size} padded by {list(pads)}")
    if not ceil:
        return num // stride + 1
    out = -(-num // stride) + 1
    if (out - 1) * stride >= size + pads[0]:  # last window would start in the end padding: drop it
        out -= 1
    return out


def acc_array(x: np.ndarray) -> np.ndarray:
    """Accumulation dtype of a reference: float64 for floats, int64 for integers."""
    return x.astype(np.int64 if np.issubdtype(x.dtype, np.integer) else np.float64)


def spatial_attrs(a: dict, nd: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """strides, pads and dilations of a convolution or pool over nd spatial axes, checked for length."""
    strides, pads, dil = a["strides"], a["pads"], a["dilations"]
    if len(strides) != nd or len(pads) != 2 * nd or len(dil) != nd:
        raise ShapeError(f"strides/dilations need {nd} entries and pads {2 * nd}, got {strides}, {pads}, {dil}")
    return strides, pads, dil
