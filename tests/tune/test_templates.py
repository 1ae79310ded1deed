"""Every point of a small GEMM space and a small conv space computes the right answer (numpy reference)."""

import numpy as np
import pytest

from ember.templates import nn as T
from ember.tune import Measurer, Task

LANES = T.lanes_of("float32", T.host_target())

CASES = [
    ("MatMul", [(8, 1), (1, LANES)], {}),  # GEMM: 7 row tiles x 2 orders x packed or not x 4 tile unrolls
    ("Conv", [(1, 3, 1, 2), (LANES, 3, 3, 3)],
     {"pads": (1, 1, 1, 1), "strides": (1, 1), "dilations": (1, 1)}),  # conv_oc: widths x orders x unrolls
    ("Conv", [(1, 4, 3, 2 * LANES + 3), (4, 1, 3, 3)],
     {"pads": (1, 1, 1, 1), "strides": (1, 1), "dilations": (1, 1), "group": 4}),  # conv_ow: channels x widths
    ("ConvNCHWc", [(1, 2, 1, 3, LANES), (2, 2, 3, 3, LANES, LANES)],
     {"pads": (1, 1, 1, 1), "strides": (1, 2), "dilations": (1, 1)}),  # conv_nchwc: blocks x widths x orders x unroll
    ("ConvNCHWc", [(1, 2, 3, 5, LANES), (2, 1, 3, 3, 1, LANES)],
     {"pads": (1, 1, 1, 1), "strides": (1, 1), "dilations": (1, 1), "group": 2 * LANES}),  # window_nchwc: tiles
]  # fmt: skip


@pytest.mark.parametrize("op,inputs,attrs", CASES, ids=["gemm", "conv", "depthwise", "conv_nchwc", "depthwise_nchwc"])
def test_every_point_is_correct(op, inputs, attrs):
    task = Task.from_op(op, inputs, attrs)
    space = task.space
    assert 6 <= len(space) <= 120, space
    with Measurer(n_parallel=2, repeat=0, run_timeout=20.0) as m:  # repeat=0: check the answer, skip timing
        results = m.measure(task, list(space))
    bad = [(r.config, r.error, r.detail) for r in results if not r.ok]
    assert not bad, bad[:3]


def test_conv1x1_tunes_through_the_gemm_template():
    task = Task.from_op("Conv", [(1, 3, 4, 2 * LANES), (12, 3, 1, 1)],
                        {"pads": (0, 0, 0, 0), "strides": (1, 1), "dilations": (1, 1)})  # fmt: skip
    assert task.space.template == "gemm"
    space = task.space
    pts = [space.get(i) for i in range(0, len(space), max(1, len(space) // 6))]
    pts += [space.entity({"tile_k": (-1, 2), "tile_m": (-1, 5), "pack_b": pb}) for pb in (True, False)]  # 3 % 2
    with Measurer(n_parallel=2, repeat=0) as m:
        results = m.measure(task, pts)
    assert all(r.ok for r in results), [(r.error, r.detail) for r in results if not r.ok]


def test_conv_row_tiles_and_partial_width_tiles():
    task = Task.from_op("Conv", [(1, 3, 5, 5), (2 * LANES, 3, 3, 3)],
                        {"pads": (1, 1, 1, 1), "strides": (1, 1), "dilations": (1, 1)})  # fmt: skip
    space = task.space
    pts = [space.entity({"tile_oh": (-1, 2), "tile_ow": (-1, w), "tile_oc": (-1, oc), "reduce_order": o})
           for w, oc, o in [(2, LANES, "k_rc"), (3, 2 * LANES, "kh_rc_kw"), (4, LANES, "rc_k")]]  # fmt: skip
    pts.append(space.entity({"tile_oh": (-1, 2), "unroll_tile": ("none", "none"), "unroll_kw": True}))
    with Measurer(n_parallel=2, repeat=0) as m:
        results = m.measure(task, pts)
    assert all(r.ok for r in results), [(r.error, r.detail) for r in results if not r.ok]


@pytest.mark.parametrize("op,inputs,attrs", CASES, ids=["gemm", "conv", "depthwise", "conv_nchwc", "depthwise_nchwc"])
def test_template_schedules_replay_from_their_records(op, inputs, attrs):
    """A template's schedule is data: its record replayed on a fresh compute lowers to the same loops, for
    configs spread over the space (what a tuning log stores and ember.compile replays)."""
    from ember import lower
    from ember.te.schedule import Schedule

    task = Task.from_op(op, inputs, attrs)
    space = task.space
    for i in sorted({0, len(space) // 3, len(space) // 2, len(space) - 1}):
        sch, args = task.instantiate(space.get(i))
        _, fresh = task.instantiate(space.get(i))
        n_out = task.n_outputs
        replayed = Schedule.from_record(fresh[len(fresh) - n_out :], sch.record())
        assert str(lower(replayed, fresh, "k")) == str(lower(sch, args, "k")), space.get(i)


def test_from_op_keeps_the_outputs_asked_for():
    """A MaxPool task of one output computes Y alone (a model's MaxPool without Indices); the kernel equals a
    numpy max over the padded windows. Asking for more outputs than the op has names the op."""
    import ember

    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "dilations": [1, 1]}
    both = Task.from_op("MaxPool", [(1, 4, 9, 10)], attrs, target="c")
    one = Task.from_op("MaxPool", [(1, 4, 9, 10)], attrs, target="c", outputs=1)
    assert (both.n_outputs, one.n_outputs) == (2, 1)
    assert [t for _, t in one.arg_types()] == ["float32", "float32"]
    sch, args = one.instantiate(None)
    f = ember.build(sch, args, target="c")
    x = np.random.default_rng(1).standard_normal((1, 4, 9, 10)).astype("float32")
    y = np.zeros((1, 4, 5, 5), "float32")
    f(x, y)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    want = np.max([xp[:, :, i : i + 9 : 2, j : j + 9 : 2] for i in range(3) for j in range(3)], axis=0)
    np.testing.assert_array_equal(y, want)
    with pytest.raises(ValueError, match="MaxPool has 2 output"):
        Task.from_op("MaxPool", [(1, 4, 9, 10)], attrs, outputs=3)
