"""Tensor-expression bodies against numpy: math intrinsics, min/max, if_then_else, integer division, logic and
casts between every pair of supported dtypes, each as a scalar loop and as a vectorized loop."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special

from ember import te

N = 21  # not a multiple of the vector width: vectorized main part plus a scalar tail


def unary_schedule(fn, dt: str, vectorize: bool, n: int = N):
    A = te.placeholder((n,), dt, name="A")
    B = te.compute((n,), lambda i: fn(A[i]), name="B")
    s = te.create_schedule(B)
    if vectorize:
        _, inner = s[B].split(B.op.axis[0], factor=8)
        s[B].vectorize(inner)
    return s, A, B


# name -> (numpy reference, input range)
INTRINSICS = {
    "exp": (np.exp, (-5, 5)),
    "log": (np.log, (0.01, 10)),
    "sqrt": (np.sqrt, (0, 10)),
    "rsqrt": (lambda x: 1 / np.sqrt(x), (0.01, 10)),
    "tanh": (np.tanh, (-4, 4)),
    "erf": (scipy.special.erf, (-3, 3)),
    "sigmoid": (scipy.special.expit, (-10, 10)),
    "abs": (np.abs, (-3, 3)),
    "floor": (np.floor, (-3, 3)),
    "ceil": (np.ceil, (-3, 3)),
    "round": (np.round, (-3, 3)),
    "sin": (np.sin, (-4, 4)),
    "cos": (np.cos, (-4, 4)),
}
TIES = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.0]  # numpy rounds half to even


@pytest.mark.parametrize("vectorize", [False, True], ids=["scalar", "vector"])
@pytest.mark.parametrize("dt", ["float32", "float64"])
@pytest.mark.parametrize("name", list(INTRINSICS))
def test_math_intrinsic(check_build, rng, name, dt, vectorize):
    ref, (lo, hi) = INTRINSICS[name]
    s, A, B = unary_schedule(getattr(te, name), dt, vectorize)
    a = rng.uniform(lo, hi, N).astype(dt)
    a[: len(TIES)] = np.clip(TIES, lo, hi)
    # libm and numpy differ by an ulp or two (erf, tanh in float32)
    tol = {"float32": 2e-6, "float64": 1e-13}[dt]
    check_build(s, [A, B], lambda a: ref(a).astype(dt), rng, rtol=tol, atol=tol, inputs={"A": a})


@pytest.mark.parametrize("vectorize", [False, True], ids=["scalar", "vector"])
def test_round_is_half_to_even(check_build, rng, vectorize):
    s, A, B = unary_schedule(te.round, "float32", vectorize, n=len(TIES))
    f = check_build(s, [A, B], np.round, rng, inputs={"A": np.array(TIES, np.float32)})
    b = np.zeros(len(TIES), np.float32)
    f(np.array(TIES, np.float32), b)
    assert b.tolist() == [0.0, 2.0, 2.0, -0.0, -2.0, -2.0, 3.0]


@pytest.mark.parametrize("vectorize", [False, True], ids=["scalar", "vector"])
@pytest.mark.parametrize("dt", ["float32", "float64"])
def test_pow(check_build, rng, dt, vectorize):
    A = te.placeholder((N,), dt, name="A")
    E = te.placeholder((N,), dt, name="E")
    B = te.compute((N,), lambda i: te.pow(A[i], E[i]) + te.pow(A[i], 2), name="B")
    s = te.create_schedule(B)
    if vectorize:
        s[B].vectorize(s[B].split(B.op.axis[0], factor=4)[1])
    a = rng.uniform(0.1, 3, N).astype(dt)
    check_build(s, [A, E, B], lambda a, e: np.power(a, e) + a * a, rng, inputs={"A": a}, rtol=1e-5)


@pytest.mark.parametrize("vectorize", [False, True], ids=["scalar", "vector"])
@pytest.mark.parametrize("dt", ["int8", "int32", "int64", "float32", "float64"])
def test_abs_min_max(check_build, rng, dt, vectorize):
    A = te.placeholder((N,), dt, name="A")
    B = te.placeholder((N,), dt, name="B")
    C = te.compute(
        (N,), lambda i: te.abs(A[i]) + te.max(A[i], B[i]) - te.min(A[i], B[i]) + te.maximum(A[i], 1), name="C"
    )
    s = te.create_schedule(C)
    if vectorize:
        s[C].vectorize(s[C].split(C.op.axis[0], factor=4)[1])

    def ref(a, b):
        return (np.abs(a) + np.maximum(a, b) - np.minimum(a, b) + np.maximum(a, 1)).astype(dt)

    check_build(s, [A, B, C], ref, rng)


@pytest.mark.parametrize("vectorize", [False, True], ids=["scalar", "vector"])
@pytest.mark.parametrize("dt", ["int8", "int32", "int64", "float32", "float64"])
def test_floor_division_and_modulo_follow_python_signs(check_build, rng, dt, vectorize):
    n = 32
    A = te.placeholder((n,), dt, name="A")
    B = te.placeholder((n,), dt, name="B")
    C = te.compute((n,), lambda i: A[i] // B[i] + A[i] % B[i] * 3, name="C")
    s = te.create_schedule(C)
    if vectorize:
        s[C].vectorize(s[C].split(C.op.axis[0], factor=8)[1])
    b = rng.integers(1, 7, n) * rng.choice([-1, 1], n)
    a = rng.integers(-20, 21, n)
    # float rounding of a % b differs from numpy's fmod-based one by an ulp
    check_build(s, [A, B, C], lambda a, b: (a // b + a % b * 3).astype(dt), rng,
                inputs={"A": a.astype(dt), "B": b.astype(dt)}, atol=1e-5)  # fmt: skip


def test_integer_arithmetic_wraps_like_numpy_in_int8(check_build, rng):
    A = te.placeholder((9, 40), "int8", name="A")
    k = te.reduce_axis((0, 40), name="k")
    B = te.compute((9,), lambda i: te.sum(A[i, k], axis=k), name="B")
    a = rng.integers(-128, 128, (9, 40)).astype(np.int8)
    check_build(te.create_schedule(B), [A, B], lambda a: a.sum(axis=1, dtype=np.int8), rng, inputs={"A": a})


# C computes int8/int16/uint8 arithmetic in promoted int: the codegen wraps results back to the narrow type, so
# a compare or a widening cast sees int8(100 + 100) = -56 as numpy does (vector code wraps by itself).
@pytest.mark.parametrize(
    "vectorize",
    [False, True],
    ids=["scalar", "vector"],
)
@pytest.mark.parametrize("dt", ["int8", "uint8"])
def test_narrow_integer_arithmetic_wraps_before_it_is_widened(check_build, rng, dt, vectorize):
    s, A, B = unary_schedule(lambda x: te.cast(x + x, "int32") + te.cast(x * x, "int32"), dt, vectorize, n=16)
    a = (np.arange(16) * 15).astype(dt)
    check_build(s, [A, B], lambda a: (a + a).astype(np.int32) + (a * a).astype(np.int32), rng, inputs={"A": a})


def test_narrow_integer_arithmetic_wraps_before_it_is_compared(check_build, rng):
    A = te.placeholder((4,), "int8", name="A")
    B = te.compute((4,), lambda i: A[i] + A[i] > 0, name="B")
    a = np.array([100, -100, 50, 1], np.int8)
    check_build(te.create_schedule(B), [A, B], lambda a: (a + a) > 0, rng, inputs={"A": a})


# te.max/te.min propagate NaN from either side, as numpy's maximum/minimum: a reduction's result does not
# depend on where the NaN comes.
@pytest.mark.parametrize("reducer, ref", [(te.max, np.max), (te.min, np.min)])
def test_max_and_min_reductions_propagate_nan(check_build, rng, reducer, ref):
    A = te.placeholder((3, 5), name="A")
    k = te.reduce_axis((0, 5), name="k")
    B = te.compute((3,), lambda i: reducer(A[i, k], axis=k), name="B")
    a = rng.standard_normal((3, 5)).astype(np.float32)
    a[1, 2] = np.nan
    check_build(te.create_schedule(B), [A, B], lambda a: ref(a, axis=1), rng, inputs={"A": a})


def test_int64_constants_beyond_int32(check_build, rng):
    A = te.placeholder((N,), "int64", name="A")
    B = te.compute((N,), lambda i: A[i] * 3_000_000_000 + (2**40 + i), name="B")
    check_build(te.create_schedule(B), [A, B], lambda a: a * 3_000_000_000 + 2**40 + np.arange(N), rng)


def test_int8_matmul_accumulates_in_int32(check_build, rng):
    A = te.placeholder((7, 19), "int8", name="A")
    B = te.placeholder((19, 5), "int8", name="B")
    k = te.reduce_axis((0, 19), name="k")
    C = te.compute((7, 5), lambda i, j: te.sum(te.cast(A[i, k], "int32") * te.cast(B[k, j], "int32"), axis=k),
                   name="C")  # fmt: skip
    s = te.create_schedule(C)
    s[C].vectorize(C.op.axis[1])
    a, b = (rng.integers(-128, 128, sh).astype(np.int8) for sh in ((7, 19), (19, 5)))
    check_build(s, [A, B, C], lambda a, b: a.astype(np.int32) @ b.astype(np.int32), rng, inputs={"A": a, "B": b})


# -- casts ----------------------------------------------------------------------------------------

DTYPES = ["float32", "float64", "int8", "int32", "int64", "bool"]


def cast_input(rng, src: str, dst: str) -> np.ndarray:
    if src == "bool":
        return rng.random(N) < 0.5
    if src.startswith("float"):
        a = rng.uniform(-100, 100, N).astype(src)  # in range of every destination (float -> int8 out of range is UB)
        a[:5] = [0.0, -0.0, 0.7, -0.7, 99.5]  # truncation toward zero; any nonzero is True
        return a
    info = np.iinfo(src)
    if dst in ("int8", "int32") and info.bits > np.iinfo(dst).bits:
        return rng.integers(-(2**40), 2**40, N).astype(src)  # wraps (modular) in C as in numpy
    return rng.integers(info.min, info.max, N, endpoint=True).astype(src)


@pytest.mark.parametrize("vectorize", [False, True], ids=["scalar", "vector"])
@pytest.mark.parametrize("dst", DTYPES)
@pytest.mark.parametrize("src", DTYPES)
def test_cast(check_build, rng, src, dst, vectorize):
    s, A, B = unary_schedule(lambda x: te.cast(x, dst), src, vectorize)
    check_build(s, [A, B], lambda a: a.astype(dst), rng, inputs={"A": cast_input(rng, src, dst)})


def test_mixed_dtype_arithmetic_promotes_like_numpy(check_build, rng):
    A = te.placeholder((N,), "int32", name="A")
    B = te.placeholder((N,), "float64", name="B")
    C = te.placeholder((N,), "int8", name="C")
    D = te.compute((N,), lambda i: A[i] * B[i] + C[i], name="D")
    assert D.dtype.name == "float64"
    check_build(te.create_schedule(D), [A, B, C, D], lambda a, b, c: a * b + c, rng)


# -- conditions -----------------------------------------------------------------------------------


@pytest.mark.parametrize("vectorize", [False, True], ids=["scalar", "vector"])
def test_if_then_else_reads_only_the_chosen_side(check_build, rng, vectorize):
    """A zero-padding shift: the out-of-bounds read A[i - 2] is never performed where i < 2."""
    A = te.placeholder((N,), name="A")
    B = te.compute((N + 4,), lambda i: te.if_then_else(te.all(i >= 2, i < N + 2), A[i - 2], -1.0), name="B")
    s = te.create_schedule(B)
    if vectorize:
        s[B].vectorize(s[B].split(B.op.axis[0], factor=8)[1])
    check_build(s, [A, B], lambda a: np.pad(a, 2, constant_values=-1), rng)


@pytest.mark.parametrize("vectorize", [False, True], ids=["scalar", "vector"])
@pytest.mark.parametrize("dt", ["float32", "float64", "int32", "int8"])
def test_if_then_else_on_the_index(check_build, rng, dt, vectorize):
    A = te.placeholder((32,), dt, name="A")
    B = te.compute((32,), lambda i: te.if_then_else(i % 3 == 0, i * 2, 7) + A[i], name="B")
    s = te.create_schedule(B)
    if vectorize:
        s[B].vectorize(s[B].split(B.op.axis[0], factor=8)[1])
    i = np.arange(32)
    check_build(s, [A, B], lambda a: (np.where(i % 3 == 0, i * 2, 7) + a).astype(dt), rng)


@pytest.mark.parametrize("vectorize", [False, True], ids=["scalar", "vector"])
def test_boolean_logic(check_build, rng, vectorize):
    A = te.placeholder((32,), "bool", name="A")
    X = te.placeholder((32,), "float32", name="X")
    B = te.compute((32,), lambda i: (te.any(A[i], X[i] > 0.0) & ~A[i]) | te.all(X[i] < -1.0, i > 3), name="B")
    s = te.create_schedule(B)
    if vectorize:
        s[B].vectorize(s[B].split(B.op.axis[0], factor=8)[1])
    check_build(s, [A, X, B], lambda a, x: ((a | (x > 0)) & ~a) | ((x < -1) & (np.arange(32) > 3)), rng)


def elementwise_of(A: te.Tensor, op):
    return lambda i: op(A[i])


def test_comparisons_give_bool_tensors(check_build, rng):
    A = te.placeholder((N,), "float32", name="A")
    ops = [lambda x: x < 0.5, lambda x: x <= 0.5, lambda x: x > 0.5, lambda x: x >= 0.5, lambda x: x == 0.5,
           lambda x: x != 0.5]  # fmt: skip
    for op in ops:
        B = te.compute((N,), elementwise_of(A, op), name="B")
        assert B.dtype.name == "bool"
        a = rng.uniform(0, 1, N).astype(np.float32)
        a[:3] = 0.5
        check_build(te.create_schedule(B), [A, B], op, rng, inputs={"A": a})


def test_select_between_float_and_int_promotes(check_build, rng):
    A = te.placeholder((N,), "float64", name="A")
    B = te.compute((N,), lambda i: te.if_then_else(i % 2 == 0, A[i], 1), name="B")
    assert B.dtype.name == "float64"
    check_build(te.create_schedule(B), [A, B], lambda a: np.where(np.arange(N) % 2 == 0, a, 1.0), rng)


# -- expression errors ------------------------------------------------------------------------------


def test_float_intrinsics_refuse_integers():
    A = te.placeholder((4,), "int32", name="A")
    with pytest.raises(TypeError, match="te.exp needs a float operand"):
        te.compute((4,), lambda i: te.exp(A[i]), name="B")


def test_true_division_of_integers_is_refused():
    A = te.placeholder((4,), "int32", name="A")
    with pytest.raises(TypeError, match="use `//` for floor division"):
        te.compute((4,), lambda i: A[i] / 2, name="B")


def test_a_reduction_must_be_the_whole_body():
    A = te.placeholder((4, 4), name="A")
    k = te.reduce_axis((0, 4), name="k")
    with pytest.raises(ValueError, match="must be the whole body"):
        te.compute((4,), lambda i: te.sum(A[i, k], axis=k) + 1.0, name="B")


def test_a_free_reduce_axis_is_reported():
    A = te.placeholder((4, 4), name="A")
    k = te.reduce_axis((0, 4), name="k")
    with pytest.raises(ValueError, match="variable k is not an axis of this compute"):
        te.compute((4,), lambda i: A[i, k], name="B")


def test_wrong_number_of_indices_is_reported():
    A = te.placeholder((4, 4), name="A")
    with pytest.raises(IndexError, match="tensor A has 2 dimensions, indexed with 1"):
        te.compute((4,), lambda i: A[i], name="B")
