"""The default schedule of fused elementwise groups (`ember.templates.flat`): the same values as numpy for rows of
any length, and vectors that stay inside a row, so that no lane needs its own division and remainder to find its
row and column (a broadcast multiply over 56-column rows ran 20-40x slower that way)."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import te
from ember.codegen.c import codegen_c
from ember.target import Target
from ember.templates.flat import default_schedule


def channel_scale(c: int, w: int, per_row: bool = False):
    """x[1, c, w, w] * s[1, c, 1, 1], then relu: an SE block's rescale (per_row: s[1, c, w, 1], a scale per row)."""
    x = te.placeholder((1, c, w, w), "float32", name="x")
    s = te.placeholder((1, c, w if per_row else 1, 1), "float32", name="s")
    y = te.compute(x.shape, lambda n, k, i, j: te.maximum(x[n, k, i, j] * s[n, k, i if per_row else 0, 0], 0.0),
                   name="y")  # fmt: skip
    return y, [x, s, y]


@pytest.mark.parametrize("w", [56, 28, 14, 7, 64])
@pytest.mark.parametrize("per_row", [False, True])
def test_rows_of_any_length_match_numpy(w, per_row, rng):
    target = Target.parse("c")
    y, args = channel_scale(6, w, per_row)
    f = ember.build(default_schedule([y], target), args, target=target)
    x = rng.standard_normal((1, 6, w, w)).astype(np.float32)
    s = rng.standard_normal((1, 6, w if per_row else 1, 1)).astype(np.float32)
    out = np.empty_like(x)
    f(x, s, out)
    np.testing.assert_array_equal(out, np.maximum(x * s, 0))


@pytest.mark.parametrize("w,per_row,lanes", [(56, True, 8), (28, True, 4), (64, True, 16), (56, False, 16),
                                             (28, False, 16), (14, False, 4)])  # fmt: skip
def test_vectors_stay_inside_a_row(w, per_row, lanes):
    """Inside a row where an operand changes from row to row; inside the channel's plane where it changes only from
    channel to channel (56 x 56 = 196 vectors of 16)."""
    target = Target.parse("c -mcpu=znver4")
    y, args = channel_scale(6, w, per_row)
    code = codegen_c(ember.lower(default_schedule([y], target), args, "scale"), target)
    assert f"float32x{lanes}" in code
    assert "ember_gather" not in code and "ember_scatter" not in code and "floordiv_int32x" not in code
