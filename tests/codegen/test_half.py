"""float16 / bfloat16: 16-bit storage, float32 arithmetic rounded per operation like numpy, exact conversions."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import ember
from ember import te


@pytest.mark.parametrize("dt,npdt", [("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16)])
def test_arithmetic_math_and_casts_match_numpy(dt, npdt):
    A = te.placeholder((67,), dt, name="A")
    B = te.placeholder((67,), dt, name="B")
    C = te.compute((67,), lambda i: A[i] * B[i] + te.exp(A[i]) - A[i] / B[i], name="C")
    D = te.compute((67,), lambda i: te.cast(A[i], "float32") * 2, name="D")
    E = te.compute((67,), lambda i: te.cast(te.cast(A[i], "float32") * 3.3, dt), name="E")
    s = te.create_schedule([C, D, E])
    _, xi = s[C].split(C.op.axis[0], 8)
    s[C].vectorize(xi)  # falls back to a scalar loop: 16-bit floats convert element by element
    f = ember.build(s, [A, B, C, D, E])
    rng = np.random.default_rng(0)
    a = (rng.standard_normal(67) * 3).astype(npdt)
    b = (rng.standard_normal(67) + 3).astype(npdt)
    c, d, e = np.zeros(67, npdt), np.zeros(67, np.float32), np.zeros(67, npdt)
    f(a, b, c, d, e)
    ref_c = a * b + np.exp(a) - a / b
    np.testing.assert_array_equal(c.astype(np.float32), ref_c.astype(np.float32))
    np.testing.assert_array_equal(d, a.astype(np.float32) * 2)
    np.testing.assert_array_equal(
        e.astype(np.float32), (a.astype(np.float32) * np.float32(3.3)).astype(npdt).astype(np.float32)
    )
    assert "uint16_t* restrict A" in f.source


def test_float32_to_float16_conversion_is_bit_exact():
    n = 1 << 16
    A = te.placeholder((n,), "float32", name="A")
    C = te.compute((n,), lambda i: te.cast(A[i], "float16"), name="C")
    f = ember.build(te.create_schedule(C), [A, C])
    rng = np.random.default_rng(1)
    every_half = np.arange(n, dtype=np.uint16).view(np.float16).astype(np.float32)
    wide = rng.standard_normal(n).astype(np.float32) * np.exp2(rng.integers(-30, 20, n)).astype(np.float32)
    for x in (every_half, wide):
        y = np.zeros(n, np.float16)
        f(x, y)
        with np.errstate(over="ignore"):
            ref = x.astype(np.float16)
        same = (y.view(np.uint16) == ref.view(np.uint16)) | (np.isnan(y) & np.isnan(ref))
        assert same.all(), x[~same][:5]


def test_float16_model_accumulates_in_float32_like_numpy():
    """MatMul -> Softmax and a Conv in float16: products and sums accumulate in float32 and are rounded once (as
    numpy's float16 matmul and sum do); each elementwise step rounds to float16. The references compute the
    same way in numpy, so the only differences left are summation order: rtol 2e-3 (two float16 ulps)."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 6, 48)).astype(np.float16)
    w = (rng.standard_normal((48, 40)) / 7).astype(np.float16)
    img = rng.standard_normal((1, 4, 9, 9)).astype(np.float16)
    k = (rng.standard_normal((8, 4, 3, 3)) / 6).astype(np.float16)
    f16 = TensorProto.FLOAT16
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["s"]), helper.make_node("Softmax", ["s"], ["p"], axis=-1),
         helper.make_node("Conv", ["img", "k"], ["c"], pads=[1, 1, 1, 1])],
        "half",
        [helper.make_tensor_value_info("x", f16, x.shape), helper.make_tensor_value_info("img", f16, img.shape)],
        [helper.make_tensor_value_info("p", f16, (2, 6, 40)), helper.make_tensor_value_info("c", f16, (1, 8, 9, 9))],
        [helper.make_tensor("w", f16, w.shape, w.tobytes(), raw=True),
         helper.make_tensor("k", f16, k.shape, k.tobytes(), raw=True)])  # fmt: skip
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    p, c = ember.compile(model, fallback=False)(x, img)
    s = np.matmul(x, w)  # float16 in and out, float32 inside
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(p.astype(np.float32), (e / e.sum(axis=-1, keepdims=True)).astype(np.float32), rtol=2e-3)
    pad = np.pad(img.astype(np.float32), ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.zeros((1, 8, 9, 9), np.float32)
    for dy in range(3):
        for dx in range(3):
            ref += np.einsum("nchw,oc->nohw", pad[:, :, dy : dy + 9, dx : dx + 9], k[:, :, dy, dx].astype(np.float32))
    np.testing.assert_allclose(c.astype(np.float32), ref.astype(np.float16).astype(np.float32), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("dt,npdt", [("bfloat16", ml_dtypes.bfloat16), ("float16", np.float16)])
def test_rounding_through_a_16_bit_float_stays_vectorized(dt, npdt):
    """float32(half(x)) of float32 values (an activation rounded to bfloat16 between float32 kernels, as
    quantize(precision="bf16") writes it) keeps its loop vectorized: bfloat16 in integer operations on the vector
    (to nearest even, NaN kept a NaN), float16 lane by lane; the values ml_dtypes'/numpy's, ties, infinities,
    NaN, subnormals and the float16 overflow included."""
    n = 100
    X = te.placeholder((n,), "float32", name="X")
    Y = te.compute((n,), lambda i: te.cast(te.cast(X[i], dt), "float32") * 2.0, name="Y")
    s = te.create_schedule(Y)
    _, xi = s[Y].split(Y.op.axis[0], 16)
    s[Y].vectorize(xi)
    f = ember.build(s, [X, Y])
    assert f"ember_round_{'bf16' if dt == 'bfloat16' else 'f16'}_float32x16(" in f.source
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(n) * 1e3).astype(np.float32)
    ties = np.array([0x3F808000, 0x3F818000, 0x477FF000, 0x00008000], np.uint32).view(np.float32)  # bf16 ties
    x[: ties.size] = ties
    x[10:16] = [np.inf, -np.inf, np.nan, 1e-40, 7e4, -0.0]
    y = np.zeros(n, np.float32)
    f(x, y)
    with np.errstate(over="ignore"):
        want = x.astype(npdt).astype(np.float32) * np.float32(2.0)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    np.testing.assert_array_equal(y[~np.isnan(y)], want[~np.isnan(want)])
