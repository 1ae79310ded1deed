"""A schedule is data: its steps serialize to JSON and replay on a fresh schedule of the same compute, giving the
same loop IR and the same results."""

from __future__ import annotations

import json

import numpy as np
import pytest

import ember
from ember import te


def matmul():
    A = te.placeholder((13, 9), name="A")
    B = te.placeholder((9, 11), name="B")
    k = te.reduce_axis((0, 9), name="k")
    C = te.compute((13, 11), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return A, B, C


def padded_sum():
    A = te.placeholder((10, 12), name="A")
    P = te.compute((10, 16), lambda i, j: te.if_then_else(te.all(j >= 2, j < 14), A[i, j - 2], 0.0), name="P")
    k = te.reduce_axis((0, 5), name="k")
    B = te.compute((10, 12), lambda i, j: te.sum(P[i, j + k], axis=k), name="B")
    E = te.compute((10, 12), lambda i, j: te.exp(B[i, j] * 0.1), name="E")
    return A, E


def softmax(m: int, n: int):
    X = te.placeholder((m, n), name="X")
    k1, k2 = te.reduce_axis((0, n), name="k1"), te.reduce_axis((0, n), name="k2")
    M = te.compute((m,), lambda i: te.max(X[i, k1], axis=k1), name="M")
    E = te.compute((m, n), lambda i, j: te.exp(X[i, j] - M[i]), name="E")
    S = te.compute((m,), lambda i: te.sum(E[i, k2], axis=k2), name="S")
    return X, te.compute((m, n), lambda i, j: E[i, j] / S[i], name="O")


def padded_sum_ref(a):
    p = np.pad(a, ((0, 0), (2, 2)))
    return np.exp(sum(p[:, k : k + 12] for k in range(5)) * 0.1)


def schedule_matmul(s, A, B, C):
    CL = s.cache_write(C, "local")
    AL = s.cache_read(A, "local", [CL])
    io, jo, ii, ji = s[C].tile(C.op.axis[0], C.op.axis[1], 4, 8)
    s[C].parallel(s[C].fuse(io, jo))
    s[CL].compute_at(s[C], s[C].leaf_iter_vars[0])
    ko, ki = s[CL].split(CL.op.reduce_axis[0], nparts=2)
    s[CL].reorder(ko, CL.op.axis[0], ki, CL.op.axis[1])
    s[CL].vectorize(CL.op.axis[1])
    s[CL].pragma(ki, "unroll", 2)
    s[AL].compute_at(s[CL], ko)
    s[C].unroll(ji)


def schedule_padded_sum(s, A, E):
    B = E.op.inputs[0]
    P = B.op.inputs[0]
    s[P].compute_inline()
    xo, xi = s[E].split(E.op.axis[1], factor=5)
    s[B].compute_at(s[E], xo)
    s[B].vectorize(B.op.axis[1])
    s[E].pragma(xi, "note", True)


WORKLOADS = {
    "matmul": (matmul, schedule_matmul, lambda a, b: a @ b),
    "padded_sum": (padded_sum, schedule_padded_sum, padded_sum_ref),
}


def test_steps_are_recorded_in_order_by_name():
    A, B, C = matmul()
    s = te.create_schedule(C)
    xo, xi = s[C].split(C.op.axis[0], factor=4)
    s[C].vectorize(C.op.axis[1])
    s[C].pragma(xo, "unroll", 2)
    assert [str(step) for step in s.steps] == [
        "split(C, 'i', 4, None)",
        "vectorize(C, 'j')",
        "pragma(C, 'i.outer', 'unroll', 2)",
    ]


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_to_json_round_trips(name):
    make, schedule, _ = WORKLOADS[name]
    args = make()
    s = te.create_schedule(args[-1])
    schedule(s, *args)
    text = s.to_json()
    data = json.loads(text)
    assert [te.Step.from_json(d) for d in data] == s.steps
    assert json.dumps([step.to_json() for step in (te.Step.from_json(d) for d in data)]) == text


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_replay_on_a_fresh_compute_gives_the_same_ir_and_results(check_build, rng, name):
    make, schedule, ref = WORKLOADS[name]
    args = make()
    s = te.create_schedule(args[-1])
    schedule(s, *args)
    fresh = make()  # the same compute definition, new tensor objects
    replayed = te.Schedule.load(fresh[-1], s.to_json())
    assert str(replayed) == str(s)
    assert str(ember.lower(replayed, list(fresh))) == str(ember.lower(s, list(args)))

    f1, f2 = ember.build(s, list(args)), ember.build(replayed, list(fresh))
    assert f1.source == f2.source
    inputs = [rng.standard_normal(t.shape).astype(np.float32) for t in args[:-1]]
    outs = [np.full(args[-1].shape, np.nan, np.float32) for _ in range(2)]
    f1(*inputs, outs[0])
    f2(*inputs, outs[1])
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[0], ref(*inputs), rtol=1e-4, atol=1e-5)


def test_replay_accepts_step_objects_and_dicts():
    A, B, C = matmul()
    steps = [te.Step("split", "C", ("i", 4, None)), {"kind": "fuse", "stage": "C", "args": ["i.inner", "j"]}]
    s = te.create_schedule(C).replay(steps)
    assert [iv.name for iv in s[C].leaf_iter_vars] == ["i.outer", "i.inner.j.fused", "k"]


def test_replay_of_an_illegal_step_names_it():
    A, B, C = matmul()
    with pytest.raises(te.ScheduleError, match="stage 'C': no loop 'x' for split"):
        te.Schedule.load(C, [{"kind": "split", "stage": "C", "args": ["x", 2, None]}])


def test_lowering_does_not_depend_on_object_identity():
    """Regression: the readers of a stage were a set of stages, so the order in which their regions were united
    (`min(a, min(a, 11))` or `min(min(a, 11), a)`) followed memory addresses: the same steps on fresh computes
    gave different IR (and C source, so compile-cache misses)."""
    steps = [
        te.Step("split", "O", ("i", 7, None)),
        te.Step("split", "O", ("j", 1, None)),
        te.Step("reorder", "O", ("i.outer", "i.inner", "j.outer", "j.inner")),
        te.Step("fuse", "O", ("i.outer", "i.inner")),
        te.Step("fuse", "O", ("i.outer.i.inner.fused", "j.outer")),
        te.Step("compute_at", "S", ("O", "i.outer.i.inner.fused.j.outer.fused")),
        te.Step("compute_inline", "E"),
        te.Step("compute_at", "M", ("O", "i.outer.i.inner.fused.j.outer.fused")),
    ]
    texts, alive = set(), []
    for _ in range(40):
        X, O = softmax(12, 7)
        s = te.create_schedule(O).replay(steps)
        alive.append(s)  # distinct objects at distinct addresses
        texts.add(str(ember.lower(s, [X, O])))
    assert len(texts) == 1, "\n\n".join(texts)
