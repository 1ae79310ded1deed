"""separate: a window reduction split into a stage of partial reductions over some taps, indexed by the input
positions the other taps read (row sums per input row), and the original stage reducing those; checked against
numpy for sum and max windows with strides and dilations, a power under the sum, and the errors."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import te


def _windows(x: np.ndarray, k: int, s: int, d: int, out: int) -> np.ndarray:
    """[rows, cols, out, out] of x's windows (no padding)."""
    idx = np.arange(out)[:, None] * s + np.arange(k)[None, :] * d  # [out, k]
    return x[idx[:, :, None, None], idx[None, None, :, :]].transpose(1, 3, 0, 2)


@pytest.mark.parametrize("target", ["c", "llvm"])
@pytest.mark.parametrize("reducer, stride, dil", [("sum", 1, 1), ("sum", 2, 1), ("max", 2, 2), ("square", 3, 1)])
def test_separate_matches_numpy(target, reducer, stride, dil):
    n, k, c = 23, 3, 5
    out = (n - dil * (k - 1) - 1) // stride + 1
    X = te.placeholder((c, n, n), "float32", name="X")
    rh, rw = te.reduce_axis((0, k), name="rh"), te.reduce_axis((0, k), name="rw")

    def body(ch, i, j):
        v = X[ch, i * stride + rh * dil, j * stride + rw * dil]
        return te.max(v, axis=[rh, rw]) if reducer == "max" else te.sum(v * v if reducer == "square" else v,
                                                                         axis=[rh, rw])  # fmt: skip

    R = te.compute((c, out, out), body, name="R")
    s = te.create_schedule(R)
    sep = s.separate(R, "rw")
    assert s[sep].name == "R.sep" and sep.shape == (c, (out - 1) * stride + dil * (k - 1) + 1, out)
    assert [iv.name for iv in s[R].op.reduce_axis] == ["rh"]
    s[sep].compute_at(s[R], s[R].op.axis[0])  # a channel's row sums, then its outputs
    s[sep].vectorize(s[sep].op.axis[2])
    x = np.random.default_rng(stride).standard_normal((c, n, n)).astype("float32")
    y = np.zeros((c, out, out), "float32")
    ember.build(s, [X, R], target=target)(x, y)
    win = np.stack([_windows(x[ch], k, stride, dil, out) for ch in range(c)])
    ref = win.max(axis=(1, 2)) if reducer == "max" else (win * win if reducer == "square" else win).sum(axis=(1, 2))
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    again = te.Schedule.from_record(R, s.record())  # the step replays from its record
    assert str(ember.lower(again, [X, R])) == str(ember.lower(s, [X, R]))


def test_separate_errors_name_the_stage():
    X = te.placeholder((8, 8), "float32", name="X")
    W = te.placeholder((3, 3), "float32", name="W")
    rh, rw = te.reduce_axis((0, 3), name="rh"), te.reduce_axis((0, 3), name="rw")
    D = te.compute((6, 6), lambda i, j: te.sum(X[i + rh, j + rw] * W[rh, rw], axis=[rh, rw]), name="D")
    s = te.create_schedule(D)
    with pytest.raises(te.ScheduleError, match="stage 'D': separate: the reduction must read one tensor"):
        s.separate(D, "rw")  # a weighted window (a convolution): its taps do not factor
    ah, aw = te.reduce_axis((0, 3), name="ah"), te.reduce_axis((0, 3), name="aw")
    M = te.compute((6, 6), lambda i, j: te.sum(X[i + ah + aw, j], axis=[ah, aw]), name="M")
    E = te.compute((6, 6), lambda i, j: M[i, j] + 1.0, name="E")
    s = te.create_schedule(E)
    with pytest.raises(te.ScheduleError, match="stage 'M': separate: index 0 .* mixes the separated taps"):
        s.separate(M, "aw")
    with pytest.raises(te.ScheduleError, match="must be some of the reduction axes"):
        s.separate(M, "j")
    with pytest.raises(te.ScheduleError, match="leave at least one reduction axis"):
        s.separate(M, ["ah", "aw"])
    with pytest.raises(te.ScheduleError, match="stage 'E': separate needs a reduction"):
        s.separate(E, "aw")
    bh, bw = te.reduce_axis((0, 3), name="bh"), te.reduce_axis((0, 3), name="bw")
    B = te.compute((6, 6), lambda i, j: te.sum(X[i + bh, i + bw], axis=[bh, bw]), name="B")
    with pytest.raises(te.ScheduleError, match="output axis 'i' is read by more than one index"):
        te.create_schedule(B).separate(B, "bw")
