"""Tensor types of the graph IR: a shape and a numpy dtype name.

A dim is an int or a symbolic size (`ember.graph.dims`: an expression of named size variables,
`float32[B, S, 768]`). `ember.ops` imports this module for shape rules; it imports only `dims`
(and through it the loop IR's expressions).

Dtypes are numpy names ("float32", "int64", "bool"). The narrow float and integer formats
that ONNX carries (bfloat16, the float8 family, int4, ...) come from `ml_dtypes`, which
onnx itself depends on; their names are the ml_dtypes names ("bfloat16", "float8_e4m3fn").
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from ember.graph.dims import Dim, is_static, shape_str, simplify_dim

# Dtypes numpy knows natively, then the ml_dtypes formats (looked up lazily).
NUMPY_DTYPES = (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64",
)  # fmt: skip
EXTENDED_DTYPES = (
    "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
    "float4_e2m1fn", "int4", "uint4", "int2", "uint2",
)  # fmt: skip
DTYPES = NUMPY_DTYPES + EXTENDED_DTYPES

FLOAT_DTYPES = frozenset(
    {"float16", "float32", "float64", "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
     "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn"}
)  # fmt: skip
INT_DTYPES = frozenset({"int8", "int16", "int32", "int64", "int4", "int2"})
UINT_DTYPES = frozenset({"uint8", "uint16", "uint32", "uint64", "uint4", "uint2"})


@cache
def np_dtype(name: str) -> np.dtype:
    """The numpy dtype object for an Ember dtype name (ml_dtypes for the narrow formats)."""
    if name in NUMPY_DTYPES:
        return np.dtype(name)
    if name in EXTENDED_DTYPES:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    raise TypeError(f"unsupported dtype {name!r}; Ember dtypes are: {', '.join(DTYPES)}")


def dtype_name(dtype: np.dtype | type | str) -> str:
    """The Ember dtype name of a numpy dtype, checked against the supported list."""
    name = np.dtype(dtype).name
    if name not in DTYPES:
        raise TypeError(f"unsupported dtype {name!r}; Ember dtypes are: {', '.join(DTYPES)}")
    return name


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def is_int(dtype: str) -> bool:
    """Signed or unsigned integer (not bool)."""
    return dtype in INT_DTYPES or dtype in UINT_DTYPES


@dataclass(frozen=True, slots=True)
class TensorType:
    """A tensor's shape and element type, e.g. `float32[1, 3, 224, 224]` or `float32[B, S, 768]`.

    Dims are non-negative ints or symbolic sizes (`ember.graph.dims`), kept in canonical form."""

    shape: tuple[Dim, ...]
    dtype: str

    def __post_init__(self):
        shape = tuple(self.shape)
        if all(isinstance(d, int | np.integer) for d in shape):
            if not all(d >= 0 for d in shape):
                raise TypeError(f"TensorType shape must be non-negative ints, got {self.shape!r}")
            object.__setattr__(self, "shape", tuple(int(d) for d in shape))
        else:
            try:
                object.__setattr__(self, "shape", tuple(simplify_dim(d) for d in shape))
            except (TypeError, ValueError) as e:
                raise TypeError(f"TensorType shape {self.shape!r}: {e}") from None
        if self.dtype not in DTYPES:
            raise TypeError(f"unsupported dtype {self.dtype!r}; Ember dtypes are: {', '.join(DTYPES)}")

    @classmethod
    def of(cls, array: np.ndarray) -> TensorType:
        """The type of a numpy array."""
        return cls(tuple(array.shape), dtype_name(array.dtype))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        """Whether every dim is an int (no symbolic sizes)."""
        return is_static(self.shape)

    @property
    def size(self) -> int:
        """Number of elements (of a static shape: a symbolic one has no fixed count)."""
        if not self.is_static:
            raise TypeError(f"{self} has symbolic dims: its element count is known only at run time")
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def np_dtype(self) -> np.dtype:
        return np_dtype(self.dtype)

    def with_shape(self, shape: tuple[Dim, ...]) -> TensorType:
        return TensorType(tuple(shape), self.dtype)

    def with_dtype(self, dtype: str) -> TensorType:
        return TensorType(self.shape, dtype)

    def __str__(self) -> str:
        return f"{self.dtype}{shape_str(self.shape)}"
