"""split(..., tail="shift"): the last partial tile moved back to end at the extent (Halide's ShiftInwards), and
the `vector_pieces` pragma: a loop of lanes that is not a power of two as vectors of 8, 4, 2 and 1."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import te
from ember.te.schedule import Schedule, ScheduleError


def scaled(rows: int, n: int):
    A = te.placeholder((rows, n), "float32", name="A")
    B = te.compute((rows, n), lambda i, j: A[i, j] * 2.0 + 1.0, name="B")
    return A, B


@pytest.mark.parametrize("target", ["c", "llvm"])
@pytest.mark.parametrize("n, factor", [(28, 16), (57, 16), (19, 8), (16, 16), (9, 16)])
def test_shifted_tail_is_whole_vectors(check_build, rng, target, n, factor):
    A, B = scaled(3, n)
    s = te.create_schedule(B)
    jo, ji = s[B].split(B.op.axis[1], factor, tail="shift")
    s[B].vectorize(ji)
    f = check_build(s, [A, B], lambda a: a * 2 + 1, rng, target=target)
    ir = str(f.ir)
    if n > factor:  # every tile a whole vector, no guard and no scalar tail
        assert f"{factor})] = " in ir and "vectorize_fallback" not in ir and "if " not in ir, ir


def test_shift_is_recorded_and_replays():
    A, B = scaled(2, 28)
    s = te.create_schedule(B)
    s[B].split(B.op.axis[1], 16, tail="shift")
    assert s.steps[-1].args == ("j", 16, None, "shift")
    again = Schedule.load(B, s.to_json())
    assert str(ember.lower(again, [A, B])) == str(ember.lower(s, [A, B]))
    plain = te.create_schedule(B)
    plain[B].split(B.op.axis[1], 16)
    assert plain.steps[-1].args == ("j", 16, None)  # the default records as before


def test_shift_needs_the_reduction_inside_the_split():
    A = te.placeholder((4, 28), "float32", name="A")
    k = te.reduce_axis((0, 4), name="k")
    C = te.compute((28,), lambda j: te.sum(A[k, j], axis=k), name="C")
    s = te.create_schedule(C)
    jo, ji = s[C].split(C.op.axis[0], 16, tail="shift")
    s[C].reorder(k, jo, ji)  # accumulated across tiles: a shifted tile would add its overlap twice
    with pytest.raises(ScheduleError, match="tail='shift' needs every reduction loop inside"):
        ember.lower(s, [A, C])
    s2 = te.create_schedule(C)
    jo, ji = s2[C].split(C.op.axis[0], 16, tail="shift")  # k inside: each tile computed whole
    s2[C].vectorize(ji)
    f = ember.build(s2, [A, C], target="c")
    a, c = np.random.default_rng(0).standard_normal((4, 28)).astype("float32"), np.zeros(28, "float32")
    f(a, c)
    np.testing.assert_allclose(c, a.sum(0), rtol=1e-5, atol=1e-6)


def test_bad_tail_is_refused():
    A, B = scaled(2, 28)
    s = te.create_schedule(B)
    with pytest.raises(ScheduleError, match="tail must be 'guard' or 'shift'"):
        s[B].split(B.op.axis[1], 16, tail="wrap")
    with pytest.raises(ScheduleError, match="tail must be"):
        s[B].split(B.op.axis[1], nparts=2, tail="shift")


@pytest.mark.parametrize("target", ["c", "llvm"])
@pytest.mark.parametrize("lanes", [3, 7, 15])
def test_vector_pieces_pragma(check_build, rng, target, lanes):
    A, B = scaled(5, lanes)
    s = te.create_schedule(B)
    s[B].vectorize(B.op.axis[1])
    s[B].pragma(B.op.axis[1], "vector_pieces", 1)
    f = check_build(s, [A, B], lambda a: a * 2 + 1, rng, target=target)
    ir = str(f.ir)
    assert "vectorize_fallback" not in ir, ir
    for bit in (8, 4, 2):
        assert (f", 1, {bit})]" in ir) == bool(lanes & bit and bit > 1), ir
