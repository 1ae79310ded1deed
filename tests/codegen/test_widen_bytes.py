"""Vectors of 8-bit integers widened to 32 bits (a quantized activation read by an int32 or float32 epilogue): one
vpmovzxbd/vpmovsxbd on AVX-512, two vectorizable steps through 16 bits elsewhere (GCC 12 compiles the one-step
__builtin_convertvector lane by lane), the same values as numpy's conversion."""

from __future__ import annotations

import numpy as np
import pytest
from vector_kernels import vectorized

import ember
from ember import te
from ember.codegen.c import codegen_c
from ember.target import Target


def widen(dt: str, out: str, lanes: int, n: int = 64):
    return vectorized((n,), dt, lambda X, i: te.cast(te.cast(X[i], "int32"), out) * 3 - 7, lanes)


@pytest.mark.parametrize("dt", ["uint8", "int8"])
@pytest.mark.parametrize("out, lanes", [("int32", 16), ("float32", 16), ("int32", 8), ("float32", 4)])
def test_widened_bytes_equal_numpy(dt, out, lanes, rng):
    s, args = widen(dt, out, lanes)
    f = ember.build(s, args, target="c")
    info = np.iinfo(dt)
    x = rng.integers(info.min, info.max + 1, 64).astype(dt)
    y = np.empty(64, out)
    f(x, y)
    np.testing.assert_array_equal(y, (x.astype(np.int32).astype(out) * 3 - 7).astype(out))
    assert f"ember_widen_{dt}x{lanes}" in f.source and f"__builtin_convertvector(a, int32x{lanes})" not in f.source


@pytest.mark.parametrize("dt, insn", [("uint8", "_mm512_cvtepu8_epi32"), ("int8", "_mm512_cvtepi8_epi32")])
def test_sixteen_bytes_take_one_instruction_on_avx512(dt, insn):
    s, args = widen(dt, "int32", 16)
    src = codegen_c(ember.lower(s, args, "widen"), Target.parse("c -mcpu=sapphirerapids"))
    assert insn in src
    portable = codegen_c(ember.lower(s, args, "widen"), Target.parse("c -mcpu=haswell"))
    assert insn not in portable and "__builtin_convertvector(__builtin_convertvector(a, " in portable
