"""rfactor: a reduction split into a stage of partial results (data-parallel over the split's inner part) and the
original stage reducing them; checked against numpy for sum and max, with factors that do not divide."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import te


@pytest.mark.parametrize("target", ["c", "llvm"])
@pytest.mark.parametrize("reducer", ["sum", "max"])
@pytest.mark.parametrize("factor", [1, 8, 50])
def test_rfactor_matches_numpy(target, reducer, factor):
    A = te.placeholder((5, 37), "float32", name="A")
    k = te.reduce_axis((0, 37), name="k")
    R = te.compute((5,), lambda i: getattr(te, reducer)(A[i, k], axis=k), name="R")
    T = te.compute((5,), lambda i: R[i] * 2.0, name="T")
    s = te.create_schedule(T)
    rf = s.rfactor(R, "k", factor)
    assert rf.shape == (5, factor) and s[rf].name == "R.rf"
    s[R].compute_at(s[T], s[T].op.axis[0])
    s[rf].compute_at(s[R], s[R].op.axis[0])
    s[rf].reorder(s[rf].op.reduce_axis[0], s[rf].op.axis[1])
    s[rf].vectorize(s[rf].op.axis[1])
    a = np.random.default_rng(factor).standard_normal((5, 37)).astype("float32")
    t = np.zeros(5, "float32")
    ember.build(s, [A, T], target=target)(a, t)
    np.testing.assert_allclose(t, getattr(np, reducer)(a, axis=1) * 2, rtol=1e-5, atol=1e-5)
    again = te.Schedule.from_record(T, s.record())
    assert str(ember.lower(again, [A, T])) == str(ember.lower(s, [A, T]))


def test_rfactor_errors_name_the_stage_and_axis():
    A = te.placeholder((5, 37), "float32", name="A")
    k = te.reduce_axis((0, 37), name="k")
    R = te.compute((5,), lambda i: te.sum(A[i, k], axis=k), name="R")
    E = te.compute((5,), lambda i: R[i] + 1.0, name="E")
    s = te.create_schedule(E)
    with pytest.raises(te.ScheduleError, match="stage 'R': rfactor: no reduction axis 'j' among \\[k\\]"):
        s.rfactor(R, "j", 4)
    with pytest.raises(te.ScheduleError, match="stage 'E': rfactor needs a reduction"):
        s.rfactor(E, "k", 4)
    with pytest.raises(te.ScheduleError, match="factor must be a positive integer"):
        s.rfactor(R, "k", 0)
    s[R].split(R.op.axis[0], 2)
    with pytest.raises(te.ScheduleError, match="rfactor must come before other primitives"):
        s.rfactor(R, "k", 4)
