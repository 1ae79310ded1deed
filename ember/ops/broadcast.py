"""Broadcasting operators: arithmetic, comparisons, logic, Where, variadic Min/Max/Sum/Mean."""

from __future__ import annotations

from functools import reduce

import numpy as np

from ember import te
from ember.graph.types import TensorType
from ember.ops.common import ShapeError, broadcast_shapes, broadcast_type, check_same_dtype
from ember.ops.elemwise import astype, intrinsic, nan_max, nan_min
from ember.ops.opdef import Attr, OpDef, Pattern, one_of, op, register
from ember.ops.te_lib import NotLowerable, elemwise, lowering
from ember.tir import expr as tx

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


# -- TE computes of the tables: name -> te function of (a, b), operands of one dtype ---------------------------
def _div_te(a: tx.Expr, b: tx.Expr) -> tx.Expr:
    return a / b if a.dtype.is_float else intrinsic("truncdiv", a, b)  # C division truncates, as ONNX wants


def _bitwise(name: str):
    def fn(a: tx.Expr, b: tx.Expr) -> tx.Expr:
        if not a.dtype.is_int:
            raise NotLowerable(f"{name} on {a.dtype}")
        return intrinsic(name, a, b)

    return fn


def _logic(op: str):
    def fn(a: tx.Expr, b: tx.Expr) -> tx.Expr:
        if not a.dtype.is_bool:
            raise NotLowerable(f"logical {op} on {a.dtype}")
        return tx.binop(op, a, b) if op != "xor" else a != b

    return fn


ARITHMETIC_TE = {
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "Div": _div_te,
    "BitwiseAnd": _bitwise("bitwise_and"),
    "BitwiseOr": _bitwise("bitwise_or"),
    "BitwiseXor": _bitwise("bitwise_xor"),
}
COMPARISON_TE = {
    "Equal": lambda a, b: a == b,
    "Less": lambda a, b: a < b,
    "LessOrEqual": lambda a, b: a <= b,
    "Greater": lambda a, b: a > b,
    "GreaterOrEqual": lambda a, b: a >= b,
    "And": _logic("and"),
    "Or": _logic("or"),
    "Xor": _logic("xor"),
}


def _binary_lowering(name: str, fn) -> None:
    def compute(a: dict, x: te.Tensor, y: te.Tensor) -> te.Tensor:
        if name in ARITHMETIC_TE and x.dtype.is_bool:
            raise NotLowerable(f"{name} on bool")
        return elemwise(fn, x, y, name=name.lower())

    lowering(name)(compute)


for _name, _fn in {**ARITHMETIC_TE, **COMPARISON_TE}.items():
    _binary_lowering(_name, _fn)


@op("Pow", B, infer=lambda a, x, y: TensorType(broadcast_shapes(x.shape, y.shape), x.dtype), inputs=(2, 2))
def pow_(a: dict, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x ** y with the dtype of x (the exponent may have another dtype)."""
    return _pow(x, y).astype(x.dtype, copy=False)


def _literal_value(e: tx.Expr) -> float | None:
    """The value of e when it is a constant: a literal, or a read of a compute whose body is one (the
    compiler passes one-element constants to kernels that way)."""
    if isinstance(e, tx.Const):
        return float(e.value)
    op = getattr(getattr(e, "tensor", None), "op", None)
    body = getattr(op, "body", None)
    return float(body.value) if isinstance(body, tx.Const) else None


@lowering("Pow")
def _(a: dict, x: te.Tensor, y: te.Tensor) -> te.Tensor:
    if x.dtype.is_bool or y.dtype.is_bool:
        raise NotLowerable("Pow on bool")

    def fn(u: tx.Expr, v: tx.Expr) -> tx.Expr:
        if u.dtype.is_float:
            k = _literal_value(v)
            if k == 2.0:  # x ** 2 (variances, RMS norms): one multiply, exact like pow, not a pow call per element
                return u * u
            if k == 3.0:  # x ** 3 (tanh GELU): two multiplies, within an ulp of pow (onnxruntime does the same)
                return u * u * u
            if k == 0.5:  # sqrt, as numpy's power does for 0.5 (-0 stays -0, -inf gives NaN)
                return te.sqrt(u)
            if k == 1.0:
                return u
            return te.pow(u, astype(v, u.dtype))
        return astype(intrinsic("pow", astype(u, "int64"), astype(v, "int64")), u.dtype)  # as numpy: in int64

    return elemwise(fn, x, y, name="pow")


@op("Mod", B, infer=_binary_infer(None), inputs=(2, 2), attrs=[Attr("fmod", "int", 0, **one_of(0, 1))])
def mod(a: dict, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """fmod=0: sign of the divisor (Python %); fmod=1: sign of the dividend (C fmod)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.fmod(x, y) if a["fmod"] else np.mod(x, y)
    return out.astype(x.dtype, copy=False)


def _floor_mod_te(a: tx.Expr, b: tx.Expr) -> tx.Expr:
    """np.mod: the sign of the divisor; x % 0 is 0 for integers, NaN for floats."""
    if a.dtype.is_float:
        r = intrinsic("fmod", a, b)
        return te.if_then_else(te.all(r != 0.0, (r < 0.0) != (b < 0.0)), r + b, r)
    zero = tx.convert(0, b.dtype)
    unsafe = b == zero if a.dtype.kind == "uint" else te.any(b == zero, b == tx.convert(-1, b.dtype))
    safe = te.if_then_else(unsafe, tx.convert(1, b.dtype), b)  # x % 1 == x % -1 == 0; never divide by 0
    return te.if_then_else(unsafe, zero, a % safe)


@lowering("Mod")
def _(a: dict, x: te.Tensor, y: te.Tensor) -> te.Tensor:
    if x.dtype.is_bool:
        raise NotLowerable("Mod on bool")

    def fn(u: tx.Expr, v: tx.Expr) -> tx.Expr:
        if not a["fmod"]:
            return _floor_mod_te(u, v)
        return intrinsic("fmod" if u.dtype.is_float else "truncmod", u, v)

    return elemwise(fn, x, y, name="mod")


@op("BitShift", B, infer=_binary_infer(None), inputs=(2, 2),
    attrs=[Attr("direction", "str", **one_of("LEFT", "RIGHT"))])  # fmt: skip
def bit_shift(a: dict, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    fn = np.left_shift if a["direction"] == "LEFT" else np.right_shift
    return fn(x, y).astype(x.dtype, copy=False)


@lowering("BitShift")
def _(a: dict, x: te.Tensor, y: te.Tensor) -> te.Tensor:
    if not x.dtype.is_int:
        raise NotLowerable(f"BitShift on {x.dtype}")
    name = "shift_left" if a["direction"] == "LEFT" else "shift_right"
    return elemwise(lambda u, v: intrinsic(name, u, v), x, y, name="bitshift")


def _prelu_infer(a: dict, x: TensorType, slope: TensorType) -> TensorType:
    if broadcast_shapes(x.shape, slope.shape) != x.shape:
        raise ShapeError(f"PRelu slope {list(slope.shape)} must broadcast to the input {list(x.shape)}")
    return x


@op("PRelu", B, infer=_prelu_infer, inputs=(2, 2))
def prelu(a: dict, x: np.ndarray, slope: np.ndarray) -> np.ndarray:
    return np.where(x < 0, slope * x, x).astype(x.dtype, copy=False)


@lowering("PRelu")
def _(a: dict, x: te.Tensor, slope: te.Tensor) -> te.Tensor:
    return elemwise(lambda u, s: te.if_then_else(u < tx.convert(0, u.dtype), s * u, u), x, slope, name="prelu")


def _where_infer(a: dict, c: TensorType, x: TensorType, y: TensorType) -> TensorType:
    if c.dtype != "bool":
        raise ShapeError(f"Where condition must be bool, got {c.dtype}")
    check_same_dtype(x, y)
    return TensorType(broadcast_shapes(c.shape, x.shape, y.shape), x.dtype)


@op("Where", B, infer=_where_infer, inputs=(3, 3))
def where(a: dict, c: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.where(c, x, y).astype(x.dtype, copy=False)


@lowering("Where")
def _(a: dict, c: te.Tensor, x: te.Tensor, y: te.Tensor) -> te.Tensor:
    return elemwise(te.if_then_else, c, x, y, name="where")


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


def _mean_te(*xs: tx.Expr) -> tx.Expr:
    total = _fold(lambda a, b: a + b, xs)
    if total.dtype.is_float:
        return total / float(len(xs))
    return astype(te.cast(total, "float64") / float(len(xs)), total.dtype)  # numpy: true division, then astype


def _fold(fn, xs):
    out = xs[0]
    for x in xs[1:]:
        out = fn(out, x)
    return out


VARIADIC_TE = {
    "Min": lambda *xs: _fold(nan_min, xs),
    "Max": lambda *xs: _fold(nan_max, xs),
    "Sum": lambda *xs: _fold(lambda a, b: a + b, xs),
    "Mean": _mean_te,
}


def _variadic_lowering(name: str, fn) -> None:
    def compute(a: dict, *xs: te.Tensor) -> te.Tensor:
        if xs[0].dtype.is_bool:
            raise NotLowerable(f"{name} on bool")
        return elemwise(fn, *xs, name=name.lower())

    lowering(name)(compute)


for _name, _fn in VARIADIC_TE.items():
    _variadic_lowering(_name, _fn)
