"""Vector loads whose lanes stay inside one aligned block (`ember.codegen.lanes`): one load of the block and a
constant shuffle on C and LLVM, the same values as numpy's indexing; loads that leave the block, or read a buffer
whose length is not a multiple of the block, keep the gather."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import te
from ember.codegen.lanes import aligned_lanes
from ember.tir.dtype import DType
from ember.tir.expr import BinOp, Broadcast, Ramp, Var, const


def repeat_in_groups(rows: int, lanes: int, group: int, rc: int, shift: int = 0):
    """out[p, l] = x[p, l // group * group + rc + shift]: a grouped convolution's input lanes (rc < group)."""
    x = te.placeholder((rows * lanes + shift,), "float32", name="x")
    out = te.compute((rows, lanes), lambda p, l: x[p * lanes + l // group * group + rc + shift] * 2, name="out")
    s = te.create_schedule(out)
    s[out].vectorize(out.op.axis[1])
    return s, [x, out]


def run(s, args, target, rows, lanes, shift):
    f = ember.build(s, args, target=target)
    x = np.random.default_rng(0).standard_normal(rows * lanes + shift).astype(np.float32)
    y = np.empty((rows, lanes), np.float32)
    f(x, y)
    return f, x, y


@pytest.mark.parametrize("target", ["c", "llvm"])
@pytest.mark.parametrize("lanes, group, rc", [(16, 4, 0), (16, 4, 3), (16, 8, 5), (8, 2, 1), (4, 2, 0), (16, 1, 0)])
def test_lanes_of_one_block_are_a_shuffle(target, lanes, group, rc):
    if target == "llvm":
        pytest.importorskip("llvmlite")
    rows = 5
    s, args = repeat_in_groups(rows, lanes, group, rc)
    f, x, y = run(s, args, target, rows, lanes, 0)
    lane = np.arange(lanes)
    expected = 2 * x[np.arange(rows)[:, None] * lanes + lane // group * group + rc]
    np.testing.assert_array_equal(y, expected)
    if target == "c":
        src = f.source
        assert "gather" not in src
        if group > 1:  # group 1: the contiguous row itself
            order = "_".join(str(v // group * group + rc) for v in lane)
            assert f"ember_vload_float32x{lanes}_{order}" in src


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_lanes_across_blocks_keep_the_gather(target):
    """Shifted by 3, the lanes of a row span two blocks: no single aligned load holds them (a gather, the same
    values)."""
    if target == "llvm":
        pytest.importorskip("llvmlite")
    rows, lanes, group = 4, 16, 4
    s, args = repeat_in_groups(rows, lanes, group, 1, shift=3)
    f, x, y = run(s, args, target, rows, lanes, 3)
    lane = np.arange(lanes)
    np.testing.assert_array_equal(y, 2 * x[np.arange(rows)[:, None] * lanes + lane // group * group + 4])
    if target == "c":
        assert "gather" in f.source


def test_aligned_lanes_needs_a_proven_multiple_and_a_whole_buffer():
    i32 = DType("int32")
    p = Var("p", i32)
    lanes = Ramp(const(0, i32), const(1, i32), 8)
    pattern = BinOp("mul", BinOp("floordiv", lanes, Broadcast(const(4, i32), 8), lanes.dtype),
                    Broadcast(const(4, i32), 8), lanes.dtype)  # fmt: skip
    idx = BinOp("add", Broadcast(BinOp("mul", p, const(8, i32), i32), 8), pattern, lanes.dtype)
    base, order = aligned_lanes(idx, 64)
    assert order == [0, 0, 0, 0, 4, 4, 4, 4]
    assert aligned_lanes(idx, 60) is None  # 60 elements: the last block is not whole
    odd = BinOp("add", Broadcast(BinOp("mul", p, const(6, i32), i32), 8), pattern, lanes.dtype)
    assert aligned_lanes(odd, 48) is None  # p * 6 is not a multiple of 8
    assert aligned_lanes(Ramp(BinOp("mul", p, const(8, i32), i32), const(1, i32), 8), 64) is None  # contiguous
