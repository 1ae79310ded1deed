"""Int32 vector min/max (an int8 epilogue's clamp) in one instruction on x86 (vpminsd/vpmaxsd, vpminud/vpmaxud),
where GCC compiles the lane loop on 16 lanes as two 256-bit halves and shuffles; the same values as numpy's."""

from __future__ import annotations

import numpy as np
import pytest
from vector_kernels import vectorized

import ember
from ember import te
from ember.codegen.c import codegen_c
from ember.target import Target


def clamp(dt: str, lanes: int, n: int = 64):
    top = te.const(3000000000 if dt == "uint32" else 1000, dt)
    return vectorized((n,), dt, lambda X, i: te.minimum(te.maximum(X[i], te.const(5, dt)), top + X[i] % 7), lanes)


@pytest.mark.parametrize("dt", ["int32", "uint32"])
@pytest.mark.parametrize("lanes", [16, 8, 4])
def test_int_min_max_equal_numpy(dt, lanes, rng):
    s, args = clamp(dt, lanes)
    f = ember.build(s, args, target="c")
    info = np.iinfo(dt)
    x = rng.integers(info.min, info.max, 64, dtype=np.int64).astype(dt)
    y = np.empty(64, dt)
    f(x, y)
    bound = np.array(3000000000 if dt == "uint32" else 1000, dt) + np.fmod(x, np.array(7, dt))
    np.testing.assert_array_equal(y, np.minimum(np.maximum(x, np.array(5, dt)), bound))


@pytest.mark.parametrize("dt, insn", [("int32", "_mm512_min_epi32"), ("uint32", "_mm512_max_epu32")])
def test_int_min_max_take_one_instruction_on_avx512(dt, insn):
    s, args = clamp(dt, 16)
    assert insn in codegen_c(ember.lower(s, args, "clamp"), Target.parse("c -mcpu=sapphirerapids"))
    assert insn not in codegen_c(ember.lower(s, args, "clamp"), Target.parse("c -mtriple=aarch64-linux-gnu"))
