"""Elementwise operators: math, activations, logic, casts. One table row per operator."""

from __future__ import annotations

import math

import numpy as np

from ember import te
from ember.graph.types import TensorType, np_dtype
from ember.ops.common import ShapeError
from ember.ops.opdef import Attr, OpDef, Pattern, one_of, op, register
from ember.ops.te_lib import NotLowerable, elemwise, lowering
from ember.tir import expr as tx
from ember.tir.dtype import NARROW_DTYPES, DType, dtype

E = Pattern.ELEMWISE

_erf = np.vectorize(math.erf, otypes=[np.float64])


def erf(x: np.ndarray) -> np.ndarray:
    return _erf(x.astype(np.float64)).astype(x.dtype) if x.size else x.copy()


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (1 / (1 + np.exp(-x))).astype(x.dtype)


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(np.zeros((), x.dtype), x).astype(x.dtype)


def _gelu(a: dict, x: np.ndarray) -> np.ndarray:
    if a["approximate"] == "tanh":
        inner = np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)
        return 0.5 * x * (1 + np.tanh(inner))
    return 0.5 * x * (1 + erf(x / np.sqrt(2).astype(x.dtype)))


def _reciprocal(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.reciprocal(x)


def _log(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(x)


def _sqrt(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.sqrt(x)


# name -> (numpy function of x, attributes (name, default), dtype kinds allowed)
# Functions with attributes take (attrs, x); those without take x.
UNARY: dict[str, object] = {
    "Abs": np.abs,
    "Neg": np.negative,
    "Reciprocal": _reciprocal,
    "Sqrt": _sqrt,
    "Exp": np.exp,
    "Log": _log,
    "Sin": np.sin,
    "Cos": np.cos,
    "Tan": np.tan,
    "Asin": np.arcsin,
    "Acos": np.arccos,
    "Atan": np.arctan,
    "Sinh": np.sinh,
    "Cosh": np.cosh,
    "Asinh": np.arcsinh,
    "Acosh": np.arccosh,
    "Atanh": np.arctanh,
    "Ceil": np.ceil,
    "Floor": np.floor,
    "Round": np.round,  # halves to even, as ONNX specifies
    "Sign": np.sign,
    "Erf": erf,
    "Relu": lambda x: np.maximum(x, 0),
    "Sigmoid": _sigmoid,
    "Tanh": np.tanh,
    "Softsign": lambda x: x / (1 + np.abs(x)),
    "Softplus": _softplus,
    "HardSwish": lambda x: x * np.clip(x / 6 + 0.5, 0, 1),
    "Mish": lambda x: x * np.tanh(_softplus(x)),
    "Not": np.logical_not,
    "BitwiseNot": np.invert,
    "Identity": lambda x: x.copy(),
}

# name -> (attributes, function of (attrs, x))
UNARY_WITH_ATTRS: dict[str, tuple[tuple[Attr, ...], object]] = {
    "Elu": ((Attr("alpha", "float", 1.0),), lambda a, x: np.where(x > 0, x, a["alpha"] * (np.exp(x) - 1))),
    "Selu": (
        (Attr("alpha", "float", 1.67326319217681884765625), Attr("gamma", "float", 1.05070102214813232421875)),
        lambda a, x: a["gamma"] * np.where(x > 0, x, a["alpha"] * (np.exp(x) - 1)),
    ),
    "Celu": (
        (Attr("alpha", "float", 1.0),),
        lambda a, x: np.maximum(x, 0) + np.minimum(0, a["alpha"] * (np.exp(x / a["alpha"]) - 1)),
    ),
    "LeakyRelu": ((Attr("alpha", "float", 0.01),), lambda a, x: np.where(x >= 0, x, a["alpha"] * x)),
    "ThresholdedRelu": ((Attr("alpha", "float", 1.0),), lambda a, x: np.where(x > a["alpha"], x, 0)),
    "HardSigmoid": (
        (Attr("alpha", "float", 0.2), Attr("beta", "float", 0.5)),
        lambda a, x: np.clip(a["alpha"] * x + a["beta"], 0, 1),
    ),
    "Gelu": ((Attr("approximate", "str", "none", **one_of("none", "tanh")),), _gelu),
    "Shrink": (
        (Attr("bias", "float", 0.0), Attr("lambd", "float", 0.5)),
        lambda a, x: np.where(x < -a["lambd"], x + a["bias"], np.where(x > a["lambd"], x - a["bias"], 0)),
    ),
    "Swish": ((Attr("alpha", "float", 1.0),), lambda a, x: x * _sigmoid(a["alpha"] * x)),
}


def _unary_entry(name: str, attrs: tuple[Attr, ...], fn) -> OpDef:
    def reference(a: dict, x: np.ndarray) -> tuple[np.ndarray]:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            y = fn(a, x) if attrs else fn(x)
        return (np.asarray(y).astype(x.dtype, copy=False),)

    return OpDef(name, E, attrs, infer=lambda a, x: (x,), reference=reference)


for _name, _fn in UNARY.items():
    register(_unary_entry(_name, (), _fn))
for _name, (_attrs, _fn) in UNARY_WITH_ATTRS.items():
    register(_unary_entry(_name, _attrs, _fn))


# == TE computes ====================================================================================
# Scalar building blocks shared by the elementwise, broadcast and reduction computes. NaN handling follows
# the numpy references: C's `a > b ? a : b` (Ember's max) returns b when either side is NaN, so a max or
# min with a constant puts the constant first to let a NaN operand through.
TE_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "bfloat16",
             "float32", "float64")  # fmt: skip


def intrinsic(name: str, *args: tx.Expr) -> tx.Expr:
    """A call of a codegen intrinsic (a libm function, or an integer helper of ember.codegen.c), typed like its
    first argument."""
    args = tuple(tx.convert(a) for a in args)
    return tx.Call(name, args, args[0].dtype)


def fcall(name: str, x: tx.Expr) -> tx.Expr:
    if not x.dtype.is_float:
        raise NotLowerable(f"{name} needs a float operand, got {x.dtype}")
    return intrinsic(name, x)


def const_like(value: float | int | bool, x: tx.Expr) -> tx.Expr:
    """`value` converted to x's dtype as numpy's astype would (float bounds truncate for integers)."""
    return te.const(np.asarray(value).astype(x.dtype.numpy).item(), x.dtype)


def max_with(c: float | int, x: tx.Expr) -> tx.Expr:
    """max(c, x) with a NaN x propagated."""
    return tx.binop("max", const_like(c, x), x)


def min_with(c: float | int, x: tx.Expr) -> tx.Expr:
    return tx.binop("min", const_like(c, x), x)


def _nan_of(a: tx.Expr) -> tx.Expr:
    """NaN where a is NaN, else 0: adding it carries a's NaN without a select over loaded values, which the
    vectorizer refuses."""
    return te.if_then_else(a != a, te.const(np.nan, a.dtype), te.const(0.0, a.dtype))


def nan_max(a: tx.Expr, b: tx.Expr) -> tx.Expr:
    """np.maximum: NaN if either side is NaN (`max` gives b, NaN, when b is; the added term covers a)."""
    m = tx.binop("max", a, b)
    return m + _nan_of(a) if a.dtype.is_float else m


def nan_min(a: tx.Expr, b: tx.Expr) -> tx.Expr:
    m = tx.binop("min", a, b)
    return m + _nan_of(a) if a.dtype.is_float else m


def astype(x: tx.Expr, to: str | DType, saturate: bool = True, round_mode: str = "up") -> tx.Expr:
    """numpy's `astype` for te dtypes: to bool is `!= 0`; float to a narrow integer goes through int32 (or int64
    for uint32), as numpy's C casts do on x86, so out-of-range values wrap the same way. The float8/float4/int4/int2
    formats convert as ONNX's Cast (`saturate`, `round_mode`: ember.tir.narrow)."""
    to = dtype(to) if not isinstance(to, DType) else to
    src = x.dtype
    if src.scalar == to.scalar:
        return x
    if to.is_narrow:
        return te.cast(x, to, saturate, round_mode)
    if src.is_narrow:  # its value (float32 or int32), then as any other cast
        return astype(te.cast(x, "float32" if src.name.startswith("float") else "int32"), to)
    if to.is_bool:
        return x != tx.convert(0, src)
    if src.is_float and to.is_int and to.bits < 32:
        return te.cast(te.cast(x, "int32"), to)
    if src.is_float and to.name == "uint32":
        return te.cast(te.cast(x, "int64"), to)
    return te.cast(x, to)


def _sign(x: tx.Expr) -> tx.Expr:
    one, zero = te.const(1, x.dtype), te.const(0, x.dtype)
    if x.dtype.kind == "uint":
        return te.if_then_else(x > zero, one, zero)
    rest = x if x.dtype.is_float else zero  # 0 stays 0 (and -0.0, NaN stay themselves)
    return te.if_then_else(x > zero, one, te.if_then_else(x < zero, te.const(-1, x.dtype), rest))


def softplus(x: tx.Expr) -> tx.Expr:
    """log(1 + exp(x)) without overflow: max(x, 0) + log1p(exp(-|x|)), as np.logaddexp."""
    return max_with(0, x) + fcall("log1p", te.exp(-te.abs(x)))


def sigmoid(x: tx.Expr) -> tx.Expr:
    return fcall("sigmoid", x)


# erf on float32 as a rational function: x * P(x^2) / Q(x^2), x clamped to [-4, 4] (erf rounds to +-1 beyond), the
# minimax coefficients of the fast float erf in Eigen and XLA. About 4e-7 from the exact value (7 ulp near 1), in
# plain vector arithmetic: 13 multiply-adds and a division per vector, where libmvec's erff costs about twice that
# and libm's runs once per lane. GELU uses it (its inputs are activations, its error absolute); Erf keeps the library.
ERF_P = (-1.60960333262415e-02, -2.95459980854025e-03, -7.34990630326855e-04, -5.69250639462346e-05,
         -2.10102402082508e-06, 2.77068142495902e-08, -2.72614225801306e-10)  # fmt: skip
ERF_Q = (-1.42647390514189e-02, -7.37332916720468e-03, -1.68282697438203e-03, -2.13374055278905e-04,
         -1.45660718464996e-05)  # fmt: skip


def rational_erf(x: tx.Expr) -> tx.Expr:
    """erf(x) for float32 x in arithmetic (see ERF_P); NaN stays NaN (the clamps propagate it)."""
    c = min_with(4.0, max_with(-4.0, x))
    x2 = c * c

    def horner(coeffs: tuple[float, ...]) -> tx.Expr:
        acc = const_like(coeffs[-1], x)
        for k in reversed(coeffs[:-1]):
            acc = acc * x2 + const_like(k, x)
        return acc

    return c * horner(ERF_P) / horner(ERF_Q)


def _erf_gelu(x: tx.Expr) -> tx.Expr:
    if x.dtype.name == "float32":
        return 0.5 * x * (1.0 + rational_erf(x * float(np.float32(1 / np.sqrt(2)))))
    return 0.5 * x * (1.0 + fcall("erf", x / float(np.sqrt(2))))


def _gelu_te(a: dict, x: tx.Expr) -> tx.Expr:
    if a["approximate"] == "tanh":
        inner = float(np.sqrt(2 / np.pi)) * (x + 0.044715 * (x * x * x))
        return 0.5 * x * (1.0 + fcall("tanh", inner))
    return _erf_gelu(x)


def _float_op(name: str):
    return lambda x: fcall(name, x)


def _rounding(name: str):
    return lambda x: fcall(name, x) if x.dtype.is_float else x


_LIBM = ("Sqrt", "Exp", "Log", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh",
         "Atanh", "Erf", "Tanh")  # fmt: skip

# name -> te function of x (an Expr of the input's dtype), next to UNARY. Ops in INT_OK also take integers,
# BitwiseNot only integers, Not only bool; the others need a float input.
UNARY_TE = {
    "Abs": te.abs,
    "Neg": lambda x: -x,
    "Reciprocal": lambda x: 1.0 / x,
    **{n: _float_op(n.lower()) for n in _LIBM},
    **{n: _rounding(n.lower()) for n in ("Ceil", "Floor", "Round")},  # nearbyint: halves to even
    "Sign": _sign,
    "Relu": lambda x: max_with(0, x),
    "Sigmoid": sigmoid,
    "Softsign": lambda x: x / (1.0 + te.abs(x)),
    "Softplus": softplus,
    "HardSwish": lambda x: x * min_with(1, max_with(0, x / 6.0 + 0.5)),
    "Mish": lambda x: x * fcall("tanh", softplus(x)),
    "Not": lambda x: ~x,
    "BitwiseNot": lambda x: intrinsic("bitwise_not", x),
    "Identity": lambda x: x,
}
INT_OK = {"Abs", "Neg", "Sign", "Relu", "Ceil", "Floor", "Round", "Shrink"}


def _elu_like(alpha: float, x: tx.Expr) -> tx.Expr:
    return te.if_then_else(x > 0.0, x, alpha * (fcall("exp", x) - 1.0))


def _shrink_te(a: dict, x: tx.Expr) -> tx.Expr:
    w = x if x.dtype.is_float else te.cast(x, "float64")  # numpy: integers meet Python floats in float64
    lam = a["lambd"]
    y = te.if_then_else(w < -lam, w + a["bias"], te.if_then_else(w > lam, w - a["bias"], tx.convert(0.0, w.dtype)))
    return astype(y, x.dtype)


UNARY_WITH_ATTRS_TE = {
    "Elu": lambda a, x: _elu_like(a["alpha"], x),
    "Selu": lambda a, x: a["gamma"] * _elu_like(a["alpha"], x),
    "Celu": lambda a, x: max_with(0, x) + min_with(0, a["alpha"] * (fcall("exp", x / a["alpha"]) - 1.0)),
    "LeakyRelu": lambda a, x: te.if_then_else(x >= 0.0, x, a["alpha"] * x),
    "ThresholdedRelu": lambda a, x: te.if_then_else(x > a["alpha"], x, tx.convert(0.0, x.dtype)),
    "HardSigmoid": lambda a, x: min_with(1, max_with(0, a["alpha"] * x + a["beta"])),
    "Gelu": _gelu_te,
    "Shrink": _shrink_te,
    "Swish": lambda a, x: x * sigmoid(a["alpha"] * x),
}


def _accepts(name: str, dt: DType) -> bool:
    special = {"Identity": True, "Not": dt.is_bool, "BitwiseNot": dt.is_int}
    return special.get(name, dt.is_float or (dt.is_int and name in INT_OK))


def _unary_lowering(name: str, fn, with_attrs: bool) -> None:
    def compute(a: dict, x: te.Tensor) -> te.Tensor:
        if not _accepts(name, x.dtype):
            raise NotLowerable(f"{name} on {x.dtype} has no native kernel")
        return elemwise((lambda v: fn(a, v)) if with_attrs else fn, x, name=name.lower())

    lowering(name)(compute)


for _name, _fn in UNARY_TE.items():
    _unary_lowering(_name, _fn, False)
for _name, _fn in UNARY_WITH_ATTRS_TE.items():
    _unary_lowering(_name, _fn, True)


@op("IsNaN", E, infer=lambda a, x: x.with_dtype("bool"))
def is_nan(a: dict, x: np.ndarray) -> np.ndarray:
    return np.isnan(x)


@lowering("IsNaN")
def _(a: dict, x: te.Tensor) -> te.Tensor:
    if not x.dtype.is_float:
        raise NotLowerable(f"IsNaN on {x.dtype}")
    return elemwise(lambda v: v != v, x, name="isnan")


@op("IsInf", E, infer=lambda a, x: x.with_dtype("bool"),
    attrs=[Attr("detect_negative", "int", 1), Attr("detect_positive", "int", 1)])  # fmt: skip
def is_inf(a: dict, x: np.ndarray) -> np.ndarray:
    return (np.isposinf(x) & bool(a["detect_positive"])) | (np.isneginf(x) & bool(a["detect_negative"]))


@lowering("IsInf")
def _(a: dict, x: te.Tensor) -> te.Tensor:
    if not x.dtype.is_float:
        raise NotLowerable(f"IsInf on {x.dtype}")

    def fn(v: tx.Expr) -> tx.Expr:
        pos = v == te.const(np.inf, v.dtype) if a["detect_positive"] else te.const(False)
        neg = v == te.const(-np.inf, v.dtype) if a["detect_negative"] else te.const(False)
        return te.any(pos, neg)

    return elemwise(fn, x, name="isinf")


# -- Clip: bounds as attributes when constant (the frontend folds them), else as inputs ----
def _clip_infer(a: dict, x: TensorType, lo: TensorType | None = None, hi: TensorType | None = None) -> TensorType:
    for t in (lo, hi):
        if t is not None and (t.shape not in ((), (1,)) or t.dtype != x.dtype):
            raise ShapeError(f"Clip bounds must be scalars of dtype {x.dtype}, got {t}")
    return x


@op("Clip", E, infer=_clip_infer, inputs=(1, 3), attrs=[Attr("min", "float", None), Attr("max", "float", None)])
def clip(a: dict, x: np.ndarray, lo: np.ndarray | None = None, hi: np.ndarray | None = None) -> np.ndarray:
    """Clip to [min, max]: an attribute bound applies, then a bound given as an input."""
    y = x
    for bound, fn in ((a["min"], np.maximum), (a["max"], np.minimum), (lo, np.maximum), (hi, np.minimum)):
        if bound is not None:
            y = fn(y, np.asarray(bound).astype(x.dtype).reshape(()))
    return y.astype(x.dtype, copy=False)


@lowering("Clip")
def _(a: dict, x: te.Tensor, lo: te.Tensor | None = None, hi: te.Tensor | None = None) -> te.Tensor:
    def fn(v: tx.Expr) -> tx.Expr:
        for bound, is_max in ((a["min"], True), (a["max"], False), (lo, True), (hi, False)):
            if bound is None:
                continue
            b = bound[(0,) * bound.ndim] if isinstance(bound, te.Tensor) else const_like(bound, v)
            v = tx.binop("max" if is_max else "min", b, v)  # the bound first: a NaN v stays NaN
        return v

    return elemwise(fn, x, name="clip")


# -- Cast ----------------------------------------------------------------------------------
_FLOAT8_NO_INF = {"float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2fnuz", "float4_e2m1fn"}
_SMALL_INTS = {"int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1), "uint2": (0, 3)}


def _to_e8m0(x: np.ndarray, saturate: bool, round_mode: str) -> np.ndarray:
    """float8_e8m0fnu holds powers of two: the float32 exponent, rounded up, down or to nearest on the float32
    bits as onnx.numpy_helper.to_float8e8m0 does (the sign is ignored; NaN and infinities give 0xff; a saturating
    cast never rounds past 2^127)."""
    bits = np.asarray(x, np.float32).view(np.uint32)
    e = ((bits >> 23) & 0xFF).astype(np.uint16)
    if round_mode == "up":
        up = (bits & 0x7FFFFF) != 0
    elif round_mode == "nearest":  # guard bit, and round, sticky or a nonzero exponent, as onnx's rule
        up = ((bits & 0x400000) != 0) & (((bits & 0x200000) != 0) | ((bits & 0x1FFFFF) != 0) | (e > 0))
    else:
        up = np.zeros(bits.shape, bool)
    if saturate:
        up &= e < 0xFE
    e = np.where(e == 0xFF, 0xFF, e + up).astype(np.uint8)
    return e.view(np_dtype("float8_e8m0fnu"))


def cast_array(x: np.ndarray, to: str, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
    """ONNX Cast semantics: float8 saturation, narrow integer wrap, NaN/inf handling."""
    target = np_dtype(to)
    if x.dtype == target:
        return x.copy()
    src = x.dtype.name
    if to in _SMALL_INTS:
        lo, hi = _SMALL_INTS[to]
        wide = x.astype(np.float64) if not np.issubdtype(x.dtype, np.integer) else x.astype(np.int64)
        bits = {"int4": 4, "uint4": 4, "int2": 2, "uint2": 2}[to]
        if wide.dtype == np.float64:  # truncation toward zero as ml_dtypes (onnx's reference); NaN, inf and values
            # past int32 give 0, the low bits of C's out-of-range conversion on x86
            ok = np.abs(wide) < 2.0**31
            wide = np.where(ok, np.trunc(np.where(ok, wide, 0.0)), 0.0)
        ints = wide.astype(np.int64)
        wrapped = ((ints - lo) % (1 << bits)) + lo  # two's complement wrap-around
        return wrapped.astype(target)
    if to == "bool":
        return (x.astype(np.float64) != 0) if src not in ("bool",) else x.copy()
    if to == "float8_e8m0fnu":
        return _to_e8m0(x, saturate, round_mode)
    if to.startswith(("float8", "float4")) and saturate:  # out-of-range values and inf become +-max
        import ml_dtypes

        big = float(ml_dtypes.finfo(target).max)
        wide = x.astype(np.float32)
        return np.where(np.isnan(wide), wide, np.clip(wide, -big, big)).astype(target)
    if src.startswith(("float8", "float4", "bfloat16")) or to.startswith(("float8", "float4", "bfloat16")):
        return x.astype(np.float32).astype(target) if not np.issubdtype(x.dtype, np.integer) else x.astype(target)
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(target)


@op("Cast", E, infer=lambda a, x: x.with_dtype(a["to"]),
    attrs=[Attr("to", "dtype"), Attr("saturate", "int", 1), Attr("round_mode", "str", "up")])  # fmt: skip
def cast(a: dict, x: np.ndarray) -> np.ndarray:
    return cast_array(x, a["to"], bool(a["saturate"]), a["round_mode"])


@lowering("Cast")
def _(a: dict, x: te.Tensor) -> te.Tensor:
    if a["to"] not in TE_DTYPES + NARROW_DTYPES:
        raise NotLowerable(f"Cast to {a['to']} (no te dtype)")
    return elemwise(lambda v: astype(v, a["to"], bool(a["saturate"]), a["round_mode"]), x, name="cast")


# -- Dropout (inference: identity; the mask output is all true) ------------------------------
def _dropout_infer(a: dict, x: TensorType, ratio=None, training=None) -> tuple[TensorType, TensorType]:
    return x, x.with_dtype("bool")


@op("Dropout", E, infer=_dropout_infer, inputs=(1, 3), attrs=[Attr("seed", "int", 0)])
def dropout(a: dict, x: np.ndarray, ratio=None, training=None) -> tuple[np.ndarray, np.ndarray]:
    """Inference Dropout; the frontend rejects training_mode=true."""
    return x.copy(), np.ones(x.shape, dtype=bool)


@lowering("Dropout")
def _(a: dict, x: te.Tensor, ratio=None, training=None) -> list[te.Tensor]:
    mask = te.compute(x.shape, lambda *i: te.const(True), name="mask")
    return [elemwise(lambda v: v, x, name="dropout"), mask]
