"""The narrow ONNX formats in the loop IR: float8 (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz, e8m0fnu), float4_e2m1fn,
int4, uint4, int2 and uint2.

A value of a narrow dtype is its code: one byte per element, laid out as ml_dtypes lays out the numpy arrays that
onnx uses (the sub-byte formats in the low bits), so arrays cross the graph boundary as they are. Kernels move and
select codes; they compute on nothing narrower than float32 or int32. `convert` turns a cast into calls of named
conversions (`Conversion`): a narrow float decodes to float32, a narrow integer to int32, and encoding rounds with
exactly ONNX's semantics (round to nearest even, the `saturate` attribute of Cast and QuantizeLinear, e8m0's
`round_mode`). Each codegen renders a conversion by its name (`ember.codegen.narrow`: one small C function each).
"""

from __future__ import annotations

from dataclasses import dataclass

from .dtype import NARROW_DTYPES, DType, float32, int32
from .expr import Call, Cast, Expr


@dataclass(frozen=True, slots=True)
class FloatFormat:
    """A narrow float: 1 sign bit (none for e8m0), `exp_bits` exponent and `man_bits` mantissa bits, `bias`.

    `special` says what the top codes mean: "ieee" (exponent all ones: infinities and NaNs, like IEEE 754), "fn"
    (finite only; S.1111.111 is NaN), "fnuz" (finite only, no -0: 0x80 is the one NaN) or "none" (finite only,
    no NaN)."""

    exp_bits: int
    man_bits: int
    bias: int
    special: str

    @property
    def sign_bit(self) -> int:
        return 1 << (self.exp_bits + self.man_bits)

    @property
    def emin(self) -> int:
        """The exponent of the smallest normal value."""
        return 1 - self.bias

    @property
    def max_code(self) -> int:
        """The code of the largest finite value."""
        top = self.sign_bit - 1
        return {"ieee": top - (1 << self.man_bits), "fn": top - 1}.get(self.special, top)

    @property
    def max_value(self) -> float:
        e, m = self.max_code >> self.man_bits, self.max_code & ((1 << self.man_bits) - 1)
        return float(((1 << self.man_bits) + m) * 2.0 ** (e - self.bias - self.man_bits))


FLOAT_FORMATS: dict[str, FloatFormat] = {
    "float8_e4m3fn": FloatFormat(4, 3, 7, "fn"),
    "float8_e4m3fnuz": FloatFormat(4, 3, 8, "fnuz"),
    "float8_e5m2": FloatFormat(5, 2, 15, "ieee"),
    "float8_e5m2fnuz": FloatFormat(5, 2, 16, "fnuz"),
    "float4_e2m1fn": FloatFormat(2, 1, 1, "none"),
}
E8M0 = "float8_e8m0fnu"  # exponent only: 2^(code - 127), 0xff is NaN
E8M0_ROUND_MODES = ("up", "down", "nearest")
INT_FORMATS: dict[str, tuple[int, bool]] = {"int4": (4, True), "uint4": (4, False), "int2": (2, True),
                                            "uint2": (2, False)}  # fmt: skip
assert set(FLOAT_FORMATS) | {E8M0} | set(INT_FORMATS) == set(NARROW_DTYPES)


@dataclass(frozen=True, slots=True)
class Conversion:
    """One conversion between a narrow dtype and float32 (floats) or int32 (integers).

    `encode`: to the narrow dtype (rounding as ONNX's Cast with `saturate` and, for e8m0, `round_mode`);
    otherwise from it (exact)."""

    dtype: str
    encode: bool
    saturate: bool = True
    round_mode: str = ""

    @property
    def wide(self) -> DType:
        return int32 if self.dtype in INT_FORMATS else float32

    @property
    def name(self) -> str:
        if not self.encode:
            return f"{self.dtype}_to_{self.wide}"
        mode = f"_{self.round_mode}" if self.round_mode else ""
        sat = "_sat" if self.saturate and self.dtype not in INT_FORMATS else ""
        return f"{self.wide}_to_{self.dtype}{mode}{sat}"


def _all_conversions() -> dict[str, Conversion]:
    convs = [Conversion(name, False) for name in NARROW_DTYPES]
    convs += [Conversion(name, True) for name in INT_FORMATS]
    convs += [Conversion(name, True, sat) for name in FLOAT_FORMATS for sat in (True, False)]
    convs += [Conversion(E8M0, True, sat, mode) for mode in E8M0_ROUND_MODES for sat in (True, False)]
    return {c.name: c for c in convs}


CONVERSIONS: dict[str, Conversion] = _all_conversions()  # by call name


def decode(x: Expr) -> Expr:
    """The value of narrow codes: float32 for the floats, int32 for the integers."""
    conv = Conversion(x.dtype.name, False)
    return Call(conv.name, (x,), conv.wide.with_lanes(x.dtype.lanes))


def encode(x: Expr, to: str, saturate: bool = True, round_mode: str = "up") -> Expr:
    """The codes of `to` for x (any dtype, converted to float32 or int32 first, as C converts)."""
    if to == E8M0 and round_mode not in E8M0_ROUND_MODES:
        raise ValueError(f"round_mode of a cast to {E8M0} must be one of {', '.join(E8M0_ROUND_MODES)}, "
                         f"got {round_mode!r}")  # fmt: skip
    conv = Conversion(to, True, saturate, round_mode if to == E8M0 else "")
    lanes = x.dtype.lanes
    if x.dtype.is_narrow:
        x = decode(x)
    if x.dtype.scalar != conv.wide:
        x = Cast(conv.wide.with_lanes(lanes), x)
    return Call(conv.name, (x,), DType(to, lanes))


def convert(x: Expr, to: DType, saturate: bool = True, round_mode: str = "up") -> Expr:
    """x cast to `to` where either side is narrow: through float32 or int32, rounding once."""
    to = to.with_lanes(x.dtype.lanes)
    if x.dtype == to:
        return x
    if to.is_narrow:
        return encode(x, to.name, saturate, round_mode)
    wide = decode(x)
    return wide if wide.dtype == to else Cast(to, wide)
