"""Bound inference through fused axes: a stage computed at a tile of a consumer whose axes h, w were fused and split
again, read at h * W + w (a flat image, an int8 W x X accumulator), takes the fused loop's range, not whole rows of
the root axes (a tile of 28 pixels of a 14-wide image, read in vectors of 16: 32 elements, not 3 rows of 14)."""

from __future__ import annotations

import re

import numpy as np

import ember
from ember import te


def test_fused_tile_reads_its_own_range(rng):
    h, w = 14, 14
    A = te.placeholder((h * w,), "float32", name="A")
    P = te.compute((h * w,), lambda q: A[q] * 2.0, name="P")
    B = te.compute((h, w), lambda i, j: P[i * w + j] + 1.0, name="B")
    s = te.create_schedule(B)
    po, pi = s[B].split(s[B].fuse(*B.op.axis), 28)
    _, pii = s[B].split(pi, 16)
    s[B].vectorize(pii)
    s[P].compute_at(s[B], po)
    ir = str(ember.lower(s, [A, B]))
    sizes = [int(n) for n in re.findall(r"P = alloc float32\[(\d+)\]", ir)]
    assert sizes == [32], ir  # 28 pixels in two vectors of 16; the root axes' rows would give 42
    f = ember.build(s, [A, B], target="c")
    a, b = rng.standard_normal(h * w).astype("float32"), np.zeros((h, w), "float32")
    f(a, b)
    np.testing.assert_allclose(b, (a * 2 + 1).reshape(h, w), rtol=1e-6)
