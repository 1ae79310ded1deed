"""Gathers of 32-bit elements at 32-bit indices (a tree walk's node tables, a lookup by computed index): the x86
gather instruction (vpgatherdd, vgatherdps: one of 16 lanes with AVX-512F, pieces of 8 with AVX2) instead of a
load and an insert per lane, the same values as numpy's indexing; other ISAs keep the generic helper."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import te
from ember.codegen.c import codegen_c
from ember.target import Target


def gather(dt: str, lanes: int, n: int = 64, m: int = 1000):
    table = te.placeholder((m,), dt, name="table")
    idx = te.placeholder((n,), "int32", name="idx")
    out = te.compute((n,), lambda i: table[idx[i]] * 2, name="out")
    s = te.create_schedule(out)
    _, inner = s[out].split(out.op.axis[0], lanes)
    s[out].vectorize(inner)
    return s, [table, idx, out]


@pytest.mark.parametrize("dt", ["float32", "int32"])
@pytest.mark.parametrize("lanes", [8, 16, 4])
def test_gathers_equal_numpy(dt, lanes, rng):
    s, args = gather(dt, lanes)
    f = ember.build(s, args, target="c")
    table = rng.integers(-1000, 1000, 1000).astype(dt)
    idx = rng.integers(0, 1000, 64).astype(np.int32)
    y = np.empty(64, dt)
    f(table, idx, y)
    np.testing.assert_array_equal(y, table[idx] * 2)
    flags = Target.parse("c").simd_features()
    hw = (lanes == 16 and "avx512f" in flags) or (lanes % 8 == 0 and "avx2" in flags)
    assert ("i32gather" in f.source) == hw


@pytest.mark.parametrize("target, lanes, insn", [("c -mcpu=skylake-avx512", 16, "_mm512_i32gather_ps"),
                                                 ("c -mcpu=haswell", 16, "_mm256_i32gather_ps"),
                                                 ("c -mcpu=haswell", 8, "_mm256_i32gather_ps")])  # fmt: skip
def test_the_instruction_by_isa(target, lanes, insn):
    s, args = gather("float32", lanes)
    src = codegen_c(ember.lower(s, args, "gather"), Target.parse(target))
    assert insn in src
    assert "i32gather" not in codegen_c(ember.lower(s, args, "gather"), Target.parse("c -mcpu=x86-64"))
