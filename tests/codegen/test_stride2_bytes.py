"""Every other byte of a row (a stride-2 pooling window over uint8 values) as one masked load of 2n - 1 bytes and a
narrowing of 16-bit words to their low bytes on AVX-512BW/VL (GCC compiled the generic two-vector shuffle of bytes
lane by lane, and an int8 SqueezeNet's max pools ran at 2% of their roofline); the same values as numpy, with the
last vector ending at the buffer's last byte."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import te
from ember.codegen.c import codegen_c
from ember.target import Target


def every_other(n: int, lanes: int, offset: int, dtype: str = "uint8"):
    x = te.placeholder((2 * n - 1 + offset,), dtype, name="X")  # the last element read is the buffer's last
    y = te.compute((n,), lambda i: x[i * 2 + offset], name="Y")
    s = te.create_schedule(y)
    _, inner = s[y].split(y.op.axis[0], lanes)
    s[y].vectorize(inner)
    return s, [x, y]


@pytest.mark.parametrize("lanes", [8, 16, 32])
@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_stride2_bytes_equal_numpy(lanes, offset, dtype, rng):
    n = 4 * lanes
    s, args = every_other(n, lanes, offset, dtype)
    f = ember.build(s, args, target="c")
    x = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1, 2 * n - 1 + offset).astype(dtype)
    y = np.empty(n, dtype)
    f(x, y)
    np.testing.assert_array_equal(y, x[offset::2])


def test_stride2_bytes_take_a_masked_load_and_a_narrowing_on_avx512bw():
    s, args = every_other(64, 16, 1)
    code = codegen_c(ember.lower(s, args, "g"), Target.parse("c -mcpu=znver4 -mattr=+avx512bw,+avx512vl"))
    assert "_mm256_maskz_loadu_epi8(0x7fffffffULL" in code and "_mm256_cvtepi16_epi8" in code
    plain = codegen_c(ember.lower(s, args, "g"), Target.parse("c -mcpu=haswell"))
    assert "cvtepi16_epi8" not in plain and "ember_vload_stride2_uint8x16" in plain
