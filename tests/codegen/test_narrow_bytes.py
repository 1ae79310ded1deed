"""Vectors of 32-bit integers narrowed to 8 bits (an int8 epilogue's store): one vpmovdb on AVX-512 (GCC 12 compiles
__builtin_convertvector's narrowing lane by lane), truncating as C converts, the same values as numpy's."""

from __future__ import annotations

import numpy as np
import pytest
from vector_kernels import vectorized

import ember
from ember import te
from ember.codegen.c import codegen_c
from ember.target import Target


def narrow(out: str, lanes: int, n: int = 64):
    return vectorized((n,), "int32", lambda X, i: te.cast(X[i] * 3 - 7, out), lanes)


@pytest.mark.parametrize("out", ["uint8", "int8"])
@pytest.mark.parametrize("lanes", [16, 8, 4])
def test_narrowed_ints_equal_numpy(out, lanes, rng):
    s, args = narrow(out, lanes)
    f = ember.build(s, args, target="c")
    x = rng.integers(-1000, 1000, 64).astype(np.int32)  # past the 8-bit range: truncated, as C and numpy do
    y = np.empty(64, out)
    f(x, y)
    np.testing.assert_array_equal(y, (x * 3 - 7).astype(out))


@pytest.mark.parametrize("lanes, insn", [(16, "_mm512_cvtepi32_epi8"), (8, "_mm256_cvtepi32_epi8"),
                                         (4, "_mm_cvtepi32_epi8")])  # fmt: skip
def test_narrowing_takes_one_instruction_on_avx512(lanes, insn):
    s, args = narrow("uint8", lanes)
    src = codegen_c(ember.lower(s, args, "narrow"), Target.parse("c -mcpu=sapphirerapids -mattr=+avx512vl"))
    assert insn in src
    portable = codegen_c(ember.lower(s, args, "narrow"), Target.parse("c -mcpu=haswell"))
    assert insn not in portable and "__builtin_convertvector(" in portable
