"""A lookup of 8 to 64 bytes in a table of 256 at byte indices (an int8 model's GELU or sigmoid table) as two vpermi2b
and a blend on AVX-512 VBMI, where the generic gather loads lane by lane; the same values as numpy's indexing."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import te
from ember.codegen.c import codegen_c
from ember.target import Target


def lookup(dt: str, n: int = 128, lanes: int = 16):
    X = te.placeholder((n,), "uint8", name="X")
    T = te.placeholder((256,), dt, name="T")
    Y = te.compute((n,), lambda i: T[te.cast(X[i], "int32")], name="Y")
    s = te.create_schedule(Y)
    _, ji = s[Y].split(Y.op.axis[0], lanes)
    s[Y].vectorize(ji)
    return s, [X, T, Y]


@pytest.mark.parametrize("dt,lanes", [("uint8", 16), ("int8", 16), ("uint8", 8), ("int8", 32), ("uint8", 64)])
def test_byte_table_equals_numpy(dt, lanes, rng):
    s, args = lookup(dt, lanes=lanes)
    f = ember.build(s, args, target="c")
    x = np.concatenate([np.array([0, 63, 64, 127, 128, 191, 192, 255], np.uint8), rng.integers(0, 256, 120)])
    x = x.astype(np.uint8)
    table = rng.integers(np.iinfo(dt).min, np.iinfo(dt).max + 1, 256).astype(dt)
    y = np.empty(128, dt)
    f(x, table, y)
    np.testing.assert_array_equal(y, table[x])


@pytest.mark.parametrize("lanes", [8, 16, 64])
def test_byte_table_takes_vpermi2b_on_avx512_vbmi(lanes):
    s, args = lookup("uint8", lanes=lanes)
    vbmi = codegen_c(ember.lower(s, args, "lookup"),
                     Target.parse("c -mcpu=sapphirerapids -mattr=+avx512bw,+avx512vbmi"))  # fmt: skip
    assert "_mm512_permutex2var_epi8" in vbmi
    plain = codegen_c(ember.lower(s, args, "lookup"), Target.parse("c -mcpu=sapphirerapids"))
    assert "_mm512_permutex2var_epi8" not in plain and f"ember_gather_uint8x{lanes}" in plain
