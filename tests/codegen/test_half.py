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
