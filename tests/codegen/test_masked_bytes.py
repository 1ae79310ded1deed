"""A vector's tail of bytes (an int8 epilogue's last, partial vector of pixels) read and written under a mask in one
masked move on AVX-512 (avx512bw, avx512vl), where the portable helper loops over the lanes with a branch each; the
same values as numpy's, nothing past the row touched."""

from __future__ import annotations

import numpy as np
import pytest
from vector_kernels import vectorized

import ember
from ember import te
from ember.codegen.c import codegen_c
from ember.target import Target


def tail(dt: str, rows: int = 5, n: int = 28, lanes: int = 16):
    return vectorized((rows, n), dt, lambda X, i: te.cast(te.cast(X[i], "int32") * 3 - 7, dt), lanes)


@pytest.mark.parametrize("dt", ["uint8", "int8", "int16"])
def test_masked_tails_equal_numpy(dt, rng):
    s, args = tail(dt)
    f = ember.build(s, args, target="c")
    info = np.iinfo(dt)
    x = rng.integers(info.min, info.max + 1, (5, 28)).astype(dt)
    y = np.full((5, 28), 77, dt)
    f(x, y)
    np.testing.assert_array_equal(y, (x.astype(np.int32) * 3 - 7).astype(dt))


def test_masked_bytes_take_one_instruction_on_avx512():
    s, args = tail("uint8")
    flags = "-mattr=+avx512bw,+avx512vl"
    src = codegen_c(ember.lower(s, args, "tail"), Target.parse(f"c -mcpu=sapphirerapids {flags}"))
    assert "_mm_mask_storeu_epi8(" in src and "_mm_maskz_loadu_epi8(" in src
    portable = codegen_c(ember.lower(s, args, "tail"), Target.parse("c -mcpu=sapphirerapids"))
    assert "_mm_mask_storeu_epi8(" not in portable and "if (m[l])" in portable


def test_bytes_under_int32_lane_masks_take_one_masked_move(rng):
    """Bytes stored and loaded under a mask of int32 lanes (an int8 epilogue's pixel test `p < 196`, under a
    parallel loop the loop partition leaves whole): one masked byte move whose mask is tested from the int32
    lanes, not a branch per lane; the values numpy's, nothing past the row touched."""
    X = te.placeholder((5, 28), "uint8", name="X")
    Y = te.compute((5, 28), lambda i, j: te.cast(te.cast(X[i, j], "int32") * 3 - 7, "uint8"), name="Y")
    s = te.create_schedule(Y)
    jo, ji = s[Y].split(Y.op.axis[1], 16)
    s[Y].parallel(s[Y].fuse(Y.op.axis[0], jo))
    s[Y].vectorize(ji)
    src = codegen_c(ember.lower(s, [X, Y], "tail"), Target.parse("c -mcpu=sapphirerapids -mattr=+avx512bw,+avx512vl"))
    assert "_mm512_test_epi32_mask(" in src and "_mm_mask_storeu_epi8(" in src and "if (m[l])" not in src
    f = ember.build(s, [X, Y], target="c")
    x = rng.integers(0, 256, (5, 28)).astype(np.uint8)
    y = np.full((5, 28), 77, np.uint8)
    f(x, y)
    np.testing.assert_array_equal(y, (x.astype(np.int32) * 3 - 7).astype(np.uint8))
