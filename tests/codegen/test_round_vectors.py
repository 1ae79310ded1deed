"""Float32 vectors rounded to nearest, ties to even (an int8 epilogue's requantization): one vrndscaleps/vroundps,
and rounded to int32 in one vcvtps2dq, where GCC compiles the lanes' nearbyintf into halves, shuffles and a
truncating conversion; the same values as numpy's rint."""

from __future__ import annotations

import numpy as np
import pytest
from vector_kernels import vectorized

import ember
from ember import te
from ember.codegen.c import codegen_c
from ember.target import Target


def rounding(lanes: int, to_int: bool, n: int = 64):
    if to_int:
        return vectorized((n,), "float32", lambda X, i: te.cast(te.round(X[i] * 0.5), "int32") + 3, lanes)
    return vectorized((n,), "float32", lambda X, i: te.round(X[i] * 0.5) + 3.0, lanes)


@pytest.mark.parametrize("to_int", [True, False])
@pytest.mark.parametrize("lanes", [16, 8, 4])
def test_rounded_vectors_equal_numpy(lanes, to_int, rng):
    s, args = rounding(lanes, to_int)
    f = ember.build(s, args, target="c")
    x = np.concatenate([np.arange(-16, 16, dtype=np.float32), rng.uniform(-300, 300, 32).astype(np.float32)])
    y = np.empty(64, "int32" if to_int else "float32")
    f(x, y)  # x * 0.5 of the integers: ties, rounded to even
    want = np.rint(x * np.float32(0.5))
    np.testing.assert_array_equal(y, want.astype(np.int32) + 3 if to_int else want + 3)


@pytest.mark.parametrize("to_int, insn", [(True, "_mm512_cvtps_epi32"), (False, "_mm512_roundscale_ps")])
def test_rounding_takes_one_instruction_on_avx512(to_int, insn):
    s, args = rounding(16, to_int)
    src = codegen_c(ember.lower(s, args, "rounding"), Target.parse("c -mcpu=sapphirerapids"))
    assert insn in src and "nearbyintf" not in src
    generic = codegen_c(ember.lower(s, args, "rounding"), Target.parse("c -mtriple=aarch64-linux-gnu"))
    assert insn not in generic and "nearbyintf" in generic
