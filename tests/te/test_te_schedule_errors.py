"""Illegal schedules raise `ScheduleError` with a message that names the stage and the loop."""

from __future__ import annotations

import re

import pytest

import ember
from ember import te
from ember.te import ScheduleError


def matmul():
    A = te.placeholder((13, 9), name="A")
    B = te.placeholder((9, 11), name="B")
    k = te.reduce_axis((0, 9), name="k")
    C = te.compute((13, 11), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return A, B, C


def chain():
    A = te.placeholder((13, 11), name="A")
    B = te.compute((13, 11), lambda i, j: A[i, j] + 1.0, name="B")
    C = te.compute((13, 11), lambda i, j: B[i, j] * 2.0, name="C")
    D = te.compute((13, 11), lambda i, j: C[i, j] - B[i, j], name="D")
    return A, B, C, D


def split_twice(s, t):
    s[t].split(t.op.axis[0], factor=4)
    s[t].split(t.op.axis[0], factor=2)


def fuse_not_adjacent(s, t):
    s[t].fuse(t.op.axis[0], t.op.reduce_axis[0])


def fuse_out_of_order(s, t):
    s[t].fuse(t.op.axis[1], t.op.axis[0])


def fuse_data_and_reduce(s, t):
    s[t].reorder(t.op.axis[0], t.op.reduce_axis[0], t.op.axis[1])
    s[t].fuse(t.op.axis[0], t.op.reduce_axis[0])


def cache_write_after_split(s, t):
    s[t].split(t.op.axis[0], factor=4)
    s.cache_write(t, "local")


def vectorize_then_parallel(s, t):
    s[t].vectorize(t.op.axis[1])
    s[t].parallel(t.op.axis[1])


def bind_twice(s, t):
    s[t].bind(t.op.axis[0], "threadIdx.x")
    s[t].bind(t.op.axis[1], "threadIdx.x")


# (id, schedule function on (schedule, matmul output C), message pattern)
MATMUL_ERRORS = [
    ("split of a loop that was split", split_twice, "stage 'C': no loop 'i' for split among its loops "
     r"\[i.outer, i.inner, j, k\]; 'i' was split into 'i.outer' and 'i.inner'"),
    ("split of an unknown loop", lambda s, t: s[t].split("z", factor=2), "stage 'C': no loop 'z' for split"),
    ("split with factor and nparts", lambda s, t: s[t].split(t.op.axis[0], factor=2, nparts=2),
     "stage 'C': split of 'i' needs exactly one of factor= or nparts="),
    ("split by zero", lambda s, t: s[t].split(t.op.axis[0], factor=0),
     "stage 'C': split of 'i': factor/nparts must be a positive integer, got 0"),
    ("fuse of loops that are not adjacent", fuse_not_adjacent, "stage 'C': can only fuse adjacent loops, outer first; "
     "'i' is loop 0 and 'k' is loop 2"),
    ("fuse inner before outer", fuse_out_of_order, "stage 'C': can only fuse adjacent loops, outer first"),
    ("fuse of a data and a reduction loop", fuse_data_and_reduce,
     "stage 'C': cannot fuse reduction and data-parallel loops \\('i', 'k'\\)"),
    ("reorder listing a loop twice", lambda s, t: s[t].reorder(t.op.axis[0], t.op.axis[0]),
     "stage 'C': reorder lists a loop twice"),
    ("vectorize a reduction loop", lambda s, t: s[t].vectorize(t.op.reduce_axis[0]),
     "stage 'C': cannot vectorize reduction loop 'k'"),
    ("parallel a reduction loop", lambda s, t: s[t].parallel(t.op.reduce_axis[0]),
     "stage 'C': cannot parallel reduction loop 'k'"),
    ("bind a reduction loop", lambda s, t: s[t].bind(t.op.reduce_axis[0], "threadIdx.x"),
     "stage 'C': cannot bind reduction loop 'k'"),
    ("two annotations on one loop", vectorize_then_parallel,
     "stage 'C': loop 'j' is already marked vectorized, cannot also parallel it"),
    ("unknown thread tag", lambda s, t: s[t].bind(t.op.axis[0], "threadIdx.w"),
     "stage 'C': bind of 'i': unknown thread axis 'threadIdx.w'"),
    ("one thread tag on two loops", bind_twice, "stage 'C': thread axis threadIdx.x is already bound to loop 'i'"),
    ("inline an output", lambda s, t: s[t].compute_inline(), "stage 'C': an output cannot be inlined"),
    ("compute an output at a loop", lambda s, t: s[t].compute_at(s[t], t.op.axis[0]),
     "stage 'C': an output cannot be computed at another stage"),
    ("cache_write after split", cache_write_after_split,
     "stage 'C': cache_write must come before other primitives on this stage"),
    ("schedule a placeholder", lambda s, t: s["A"].split("i", 2),
     "stage 'A' is a placeholder"),
    ("unknown stage", lambda s, t: s["Z"], "no stage named 'Z'; stages: A, B, C"),
    ("cache_read for a stage that does not read it", lambda s, t: s.cache_read(t, "local", [t]),
     "stage 'C': cache_read: stage 'C' does not read 'C'"),
]  # fmt: skip


@pytest.mark.parametrize("name, fn, message", MATMUL_ERRORS, ids=[e[0] for e in MATMUL_ERRORS])
def test_illegal_primitive_on_matmul(name, fn, message):
    A, B, C = matmul()
    s = te.create_schedule(C)
    with pytest.raises(ScheduleError, match=message):
        fn(s, C)


def test_failed_step_is_not_recorded():
    A, B, C = matmul()
    s = te.create_schedule(C)
    s[C].split(C.op.axis[0], factor=4)
    with pytest.raises(ScheduleError):
        s[C].vectorize(C.op.reduce_axis[0])
    assert [st.kind for st in s.steps] == ["split"]


# -- compute_at / compute_inline on a DAG ----------------------------------------------------------


def test_compute_at_a_stage_that_does_not_read_it():
    X = te.placeholder((5,), name="X")
    P = te.compute((5,), lambda i: X[i] + 1.0, name="P")
    R = te.compute((5,), lambda i: X[i] * 3.0, name="R")
    S = te.compute((5,), lambda i: P[i] + R[i], name="S")
    s = te.create_schedule(S)
    message = "stage 'P': cannot compute at 'R.i': 'R' does not read 'P', so its loops are not an ancestor"
    with pytest.raises(ScheduleError, match=re.escape(message)):
        s[P].compute_at(s[R], R.op.axis[0])


def test_compute_at_a_loop_that_does_not_enclose_every_reader():
    A, B, C, D = chain()  # B is read by C and by D
    s = te.create_schedule(D)
    s[B].compute_at(s[C], C.op.axis[1])
    message = "stage 'B' is computed at 'C.j', but its reader 'D' runs outside that loop"
    with pytest.raises(ScheduleError, match=re.escape(message)):
        ember.lower(s, [A, D])


def test_compute_at_a_loop_of_another_stage():
    A, B, C, D = chain()
    s = te.create_schedule(D)
    message = "stage 'D': no loop 'j.inner' for compute_at of 'B' among its loops [i, j]"
    with pytest.raises(ScheduleError, match=re.escape(message)):
        s[B].compute_at(s[D], "j.inner")  # D has loops i, j only
    with pytest.raises(ScheduleError, match="stage 'B': cannot compute a stage at itself"):
        s[B].compute_at(s[B], B.op.axis[0])


def test_compute_at_an_input():
    A, B, C, D = chain()
    s = te.create_schedule(D)
    with pytest.raises(ScheduleError, match="stage 'A' is a placeholder"):
        s[A].compute_at(s[D], D.op.axis[0])


def test_compute_at_an_inlined_stage():
    A, B, C, D = chain()
    s = te.create_schedule(D)
    s[C].compute_inline()
    with pytest.raises(ScheduleError, match="stage 'B': cannot compute at 'C': it has no loops \\(inlined\\)"):
        s[B].compute_at(s[C], C.op.axis[0])


def test_inline_a_stage_that_others_are_computed_at():
    A, B, C, D = chain()
    s = te.create_schedule(D)
    s[B].compute_at(s[C], C.op.axis[0])
    with pytest.raises(ScheduleError, match="stage 'C': cannot inline: stage 'B' is computed at one of its loops"):
        s[C].compute_inline()


def test_inline_a_reduction():
    A, B, C = matmul()
    D = te.compute((13, 11), lambda i, j: C[i, j] + 1.0, name="D")
    s = te.create_schedule(D)
    with pytest.raises(ScheduleError, match="stage 'C': only elementwise/injective computes can be inlined"):
        s[C].compute_inline()


def test_inline_or_compute_at_an_argument():
    A, B, C, D = chain()
    s = te.create_schedule(D)
    s[C].compute_inline()
    with pytest.raises(ScheduleError, match="tensor 'C' is an argument and cannot be inlined"):
        ember.lower(s, [A, C, D])
    s = te.create_schedule(D)
    s[C].compute_at(s[D], D.op.axis[0])
    with pytest.raises(ScheduleError, match="tensor 'C' is an argument, so it must be computed at root"):
        ember.lower(s, [A, C, D])


def test_the_attach_loop_split_away_by_name_is_followed():
    """compute_at then split of that loop is legal (the stage moves to the inner loop); computing at the old
    loop by name afterwards is not."""
    A, B, C, D = chain()
    s = te.create_schedule(D)
    s[D].split(D.op.axis[1], factor=4)
    with pytest.raises(ScheduleError, match="no loop 'j' for compute_at of 'C'.*'j' was split into 'j.outer'"):
        s[C].compute_at(s[D], "j")


# -- argument lists ---------------------------------------------------------------------------------


def test_missing_input_argument():
    A, B, C = matmul()
    with pytest.raises(ScheduleError, match="placeholder 'B' is read but not in the argument list"):
        ember.lower(te.create_schedule(C), [A, C])


def test_missing_output_argument():
    A, B, C = matmul()
    with pytest.raises(ScheduleError, match="output 'C' is not in the argument list"):
        ember.lower(te.create_schedule(C), [A, B])


def test_argument_listed_twice():
    A, B, C = matmul()
    with pytest.raises(ScheduleError, match="tensor 'A' appears twice in the argument list"):
        ember.lower(te.create_schedule(C), [A, A, B, C])


def test_placeholder_as_output():
    A = te.placeholder((3,), name="A")
    with pytest.raises(ScheduleError, match="output 'A' is a placeholder"):
        te.create_schedule(A)


def test_unknown_step_in_replayed_json():
    A, B, C = matmul()
    with pytest.raises(ScheduleError, match="unknown schedule step 'twist'"):
        te.Schedule.load(C, '[{"kind": "twist", "stage": "C", "args": []}]')
