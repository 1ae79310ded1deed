"""Elementwise operators: math, activations, logic, casts. One table row per operator."""

from __future__ import annotations

import math

import numpy as np

from ember.graph.types import TensorType, np_dtype
from ember.ops.common import ShapeError
from ember.ops.opdef import Attr, OpDef, Pattern, one_of, op, register

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


@op("IsNaN", E, infer=lambda a, x: x.with_dtype("bool"))
def is_nan(a: dict, x: np.ndarray) -> np.ndarray:
    return np.isnan(x)


@op("IsInf", E, infer=lambda a, x: x.with_dtype("bool"),
    attrs=[Attr("detect_negative", "int", 1), Attr("detect_positive", "int", 1)])  # fmt: skip
def is_inf(a: dict, x: np.ndarray) -> np.ndarray:
    return (np.isposinf(x) & bool(a["detect_positive"])) | (np.isneginf(x) & bool(a["detect_negative"]))


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


# -- Cast ----------------------------------------------------------------------------------
_FLOAT8_NO_INF = {"float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2fnuz", "float4_e2m1fn"}
_SMALL_INTS = {"int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1), "uint2": (0, 3)}


def _to_e8m0(x: np.ndarray, round_mode: str) -> np.ndarray:
    """float8_e8m0fnu holds powers of two: round the exponent up, down or to nearest."""
    wide = np.abs(x.astype(np.float64))
    e = np.log2(np.where(wide > 0, wide, 1.0))
    e = {"up": np.ceil, "down": np.floor}.get(round_mode, np.rint)(e)
    y = np.where(wide > 0, 2.0 ** np.clip(e, -127, 127), 2.0**-127)
    return np.where(np.isfinite(wide), y, np.nan).astype(np_dtype("float8_e8m0fnu"))


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
        ints = np.rint(wide).astype(np.int64) if wide.dtype == np.float64 else wide
        wrapped = ((ints - lo) % (1 << bits)) + lo  # two's complement wrap-around
        return wrapped.astype(target)
    if to == "bool":
        return (x.astype(np.float64) != 0) if src not in ("bool",) else x.copy()
    if to == "float8_e8m0fnu":
        return _to_e8m0(x, round_mode)
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


# -- Dropout (inference: identity; the mask output is all true) ------------------------------
def _dropout_infer(a: dict, x: TensorType, ratio=None, training=None) -> tuple[TensorType, TensorType]:
    return x, x.with_dtype("bool")


@op("Dropout", E, infer=_dropout_infer, inputs=(1, 3), attrs=[Attr("seed", "int", 0)])
def dropout(a: dict, x: np.ndarray, ratio=None, training=None) -> tuple[np.ndarray, np.ndarray]:
    """Inference Dropout; the frontend rejects training_mode=true."""
    return x.copy(), np.ones(x.shape, dtype=bool)
