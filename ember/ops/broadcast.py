"""Broadcasting operators: arithmetic, comparisons, logic, Where, variadic Min/Max/Sum/Mean."""

from __future__ import annotations

from functools import reduce

import numpy as np

from ember.graph.types import TensorType
from ember.ops.common import ShapeError, broadcast_shapes, broadcast_type, check_same_dtype
from ember.ops.opdef import Attr, OpDef, Pattern, one_of, op, register

B = Pattern.BROADCAST


def _int_div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Integer division truncating toward zero (C semantics, as ONNX runtimes do)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.floor_divide(x, y)
        fix = (np.remainder(x, y) != 0) & ((x < 0) != (y < 0))
    return np.where(fix, q + 1, q).astype(x.dtype) if np.issubdtype(x.dtype, np.signedinteger) else q


def _div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if np.issubdtype(x.dtype, np.integer):
        return _int_div(x, y)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.divide(x, y)


def _pow(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if np.issubdtype(x.dtype, np.integer):
        return np.power(x.astype(np.int64), y.astype(np.int64)).astype(x.dtype)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return np.power(x, y.astype(x.dtype))


# name -> numpy function; the output dtype is input 0's (arithmetic) or bool (comparisons).
ARITHMETIC = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": _div,
    "BitwiseAnd": np.bitwise_and,
    "BitwiseOr": np.bitwise_or,
    "BitwiseXor": np.bitwise_xor,
}
COMPARISON = {
    "Equal": np.equal,
    "Less": np.less,
    "LessOrEqual": np.less_equal,
    "Greater": np.greater,
    "GreaterOrEqual": np.greater_equal,
    "And": np.logical_and,
    "Or": np.logical_or,
    "Xor": np.logical_xor,
}


def _binary_infer(dtype: str | None):
    def infer(a: dict, x: TensorType, y: TensorType) -> TensorType:
        check_same_dtype(x, y)
        return TensorType(broadcast_shapes(x.shape, y.shape), dtype or x.dtype)

    return infer


def _binary_entry(name: str, fn, dtype: str | None) -> OpDef:
    def reference(a: dict, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray]:
        with np.errstate(over="ignore", invalid="ignore"):
            out = np.asarray(fn(x, y))
        return (out.astype(dtype or x.dtype, copy=False),)

    return OpDef(name, B, (), infer=_binary_infer(dtype), reference=reference, inputs=(2, 2))


for _name, _fn in ARITHMETIC.items():
    register(_binary_entry(_name, _fn, None))
for _name, _fn in COMPARISON.items():
    register(_binary_entry(_name, _fn, "bool"))


@op("Pow", B, infer=lambda a, x, y: TensorType(broadcast_shapes(x.shape, y.shape), x.dtype), inputs=(2, 2))
def pow_(a: dict, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x ** y with the dtype of x (the exponent may have another dtype)."""
    return _pow(x, y).astype(x.dtype, copy=False)


@op("Mod", B, infer=_binary_infer(None), inputs=(2, 2), attrs=[Attr("fmod", "int", 0, **one_of(0, 1))])
def mod(a: dict, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """fmod=0: sign of the divisor (Python %); fmod=1: sign of the dividend (C fmod)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.fmod(x, y) if a["fmod"] else np.mod(x, y)
    return out.astype(x.dtype, copy=False)


@op("BitShift", B, infer=_binary_infer(None), inputs=(2, 2),
    attrs=[Attr("direction", "str", **one_of("LEFT", "RIGHT"))])  # fmt: skip
def bit_shift(a: dict, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    fn = np.left_shift if a["direction"] == "LEFT" else np.right_shift
    return fn(x, y).astype(x.dtype, copy=False)


def _prelu_infer(a: dict, x: TensorType, slope: TensorType) -> TensorType:
    if broadcast_shapes(x.shape, slope.shape) != x.shape:
        raise ShapeError(f"PRelu slope {list(slope.shape)} must broadcast to the input {list(x.shape)}")
    return x


@op("PRelu", B, infer=_prelu_infer, inputs=(2, 2))
def prelu(a: dict, x: np.ndarray, slope: np.ndarray) -> np.ndarray:
    return np.where(x < 0, slope * x, x).astype(x.dtype, copy=False)


def _where_infer(a: dict, c: TensorType, x: TensorType, y: TensorType) -> TensorType:
    if c.dtype != "bool":
        raise ShapeError(f"Where condition must be bool, got {c.dtype}")
    check_same_dtype(x, y)
    return TensorType(broadcast_shapes(c.shape, x.shape, y.shape), x.dtype)


@op("Where", B, infer=_where_infer, inputs=(3, 3))
def where(a: dict, c: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.where(c, x, y).astype(x.dtype, copy=False)


def _variadic_infer(a: dict, *ts: TensorType) -> TensorType:
    check_same_dtype(*ts)
    return broadcast_type()(a, *ts)


def _mean(*xs: np.ndarray) -> np.ndarray:
    return reduce(np.add, xs) / len(xs)


VARIADIC = {
    "Min": lambda *xs: reduce(np.minimum, xs),
    "Max": lambda *xs: reduce(np.maximum, xs),
    "Sum": lambda *xs: reduce(np.add, xs),
    "Mean": _mean,
}


def _variadic_entry(name: str, fn) -> OpDef:
    def reference(a: dict, *xs: np.ndarray) -> tuple[np.ndarray]:
        shape = broadcast_shapes(*(x.shape for x in xs))
        return (np.broadcast_to(fn(*xs), shape).astype(xs[0].dtype),)

    return OpDef(name, B, (), infer=_variadic_infer, reference=reference, inputs=(1, None))


for _name, _fn in VARIADIC.items():
    register(_variadic_entry(_name, _fn))
