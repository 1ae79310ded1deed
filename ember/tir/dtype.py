"""Data types: the one table that every layer (te, tir, codegen, runtime) reads.

A `DType` is a scalar type plus a lane count, written like numpy names with an optional
`xN` suffix for vectors: "float32", "int64", "bool", "float32x8".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# name -> (kind, bits, C type); kind is "float", "int", "uint" or "bool".
_SCALARS: dict[str, tuple[str, int, str]] = {
    "bool": ("bool", 8, "bool"),
    "int8": ("int", 8, "int8_t"),
    "int16": ("int", 16, "int16_t"),
    "int32": ("int", 32, "int32_t"),
    "int64": ("int", 64, "int64_t"),
    "uint8": ("uint", 8, "uint8_t"),
    "uint16": ("uint", 16, "uint16_t"),
    "uint32": ("uint", 32, "uint32_t"),
    "uint64": ("uint", 64, "uint64_t"),
    "float16": ("float", 16, "uint16_t"),  # storage types: computed in float32, rounded when stored
    "bfloat16": ("float", 16, "uint16_t"),
    "float32": ("float", 32, "float"),
    "float64": ("float", 64, "double"),
}
# The narrow ONNX formats (ember.tir.narrow): one byte per element holding the format's code, laid out as ml_dtypes
# lays out its numpy arrays (int4/uint4/float4 in the low nibble, int2/uint2 in the low two bits). Values of these
# dtypes are codes: only moved, selected, or converted to and from float32/int32 (never computed on).
NARROW_DTYPES = (
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn",
    "int4", "uint4", "int2", "uint2",
)  # fmt: skip
_SCALARS.update({name: ("narrow", 8, "uint8_t") for name in NARROW_DTYPES})


@dataclass(frozen=True, slots=True)
class DType:
    name: str  # scalar name, e.g. "float32"
    lanes: int = 1

    def __post_init__(self):
        if self.name not in _SCALARS:
            raise TypeError(f"unsupported dtype {self.name!r}; supported: {', '.join(_SCALARS)}")

    @property
    def kind(self) -> str:
        return _SCALARS[self.name][0]

    @property
    def bits(self) -> int:
        return _SCALARS[self.name][1]

    @property
    def itemsize(self) -> int:
        return self.bits // 8

    @property
    def c_type(self) -> str:
        return _SCALARS[self.name][2]

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def is_bool(self) -> bool:
        return self.kind == "bool"

    @property
    def scalar(self) -> DType:
        return self if self.lanes == 1 else DType(self.name)

    def with_lanes(self, lanes: int) -> DType:
        return DType(self.name, lanes)

    @property
    def is_narrow(self) -> bool:
        """A narrow ONNX format (float8, float4, int4, int2, ...): a byte holding a code."""
        return self.kind == "narrow"

    @property
    def is_half(self) -> bool:
        """float16/bfloat16: held as 16 bits, computed in float32."""
        return self.kind == "float" and self.bits == 16

    @property
    def numpy(self) -> np.dtype:
        return numpy_dtype(self.name)

    def __str__(self) -> str:
        return self.name if self.lanes == 1 else f"{self.name}x{self.lanes}"

    def __repr__(self) -> str:
        return f"DType({str(self)!r})"


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a scalar type name (bfloat16 and the narrow formats come from ml_dtypes, which onnx
    depends on)."""
    if name == "bfloat16" or name in NARROW_DTYPES:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def dtype(x: str | DType | np.dtype | type) -> DType:
    """Parse anything that names a dtype: "float32", "float32x8", np.float32, np.dtype("int8"), DType."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str):
        if x in _SCALARS:
            return DType(x)
        base, sep, lanes = x.rpartition("x")
        if sep and base in _SCALARS and lanes.isdigit():
            return DType(base, int(lanes))
        if x in ("float", "int"):
            return DType(x + "32")
        raise TypeError(f"unsupported dtype {x!r}; supported: {', '.join(_SCALARS)}")
    try:
        name = np.dtype(x).name
    except TypeError as e:
        raise TypeError(f"cannot interpret {x!r} as a dtype") from e
    return dtype(name)


float32, float64 = DType("float32"), DType("float64")
int8, int32, int64 = DType("int8"), DType("int32"), DType("int64")
boolean = DType("bool")


class NarrowArithmeticError(TypeError):
    """Arithmetic or a comparison on values of a narrow format (codes): kernels must convert them first."""


def promote(a: DType, b: DType) -> DType:
    """Result dtype of a binary arithmetic op on a and b (numpy-like, lanes must agree or be 1)."""
    if a.is_narrow or b.is_narrow:
        narrow = a if a.is_narrow else b
        raise NarrowArithmeticError(f"arithmetic on {narrow.name} values: they are stored codes; convert them to "
                                    "float32 or int32 first (te.cast)")  # fmt: skip
    lanes = max(a.lanes, b.lanes)
    if a.lanes != b.lanes and 1 not in (a.lanes, b.lanes):
        raise TypeError(f"lane mismatch: {a} and {b}")
    if a.scalar == b.scalar:
        return a.with_lanes(lanes)
    name = np.result_type(a.numpy, b.numpy).name
    return DType(name, lanes)
