"""Property tests: random legal schedules of a matmul, a padded 2-D convolution and a softmax agree with numpy.

A schedule is drawn step by step with hypothesis (`st.data()`): optional cache_write/cache_read, then for each
stage, consumers first, where it is computed (root, inline, or at a loop of a stage that reads it, directly or
through other stages, such that every reader runs inside that loop), random splits (factor or nparts, often not
dividing), a reorder, fuses of adjacent loops, and vectorize/unroll/parallel annotations; finally, sometimes, a
split of a loop that a producer is attached to. Sizes are small and not powers of two so that tails occur.

Each example compiles one C file. By default the examples are derandomized (the same schedules on every run,
so CI re-runs hit the compile cache); for a bug hunt run with EMBER_PROPERTY_RANDOM=1 and, say,
EMBER_PROPERTY_EXAMPLES=500.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import ember
from ember import te

pytestmark = pytest.mark.property

EXAMPLES = int(os.environ.get("EMBER_PROPERTY_EXAMPLES", "40"))
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("EMBER_PROPERTY_RANDOM", "") in ("", "0"),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SIZES = st.integers(7, 24)


class RandomScheduler:
    """Draws a random legal schedule for every stage of `s`, consumers first."""

    def __init__(self, data: st.DataObject, s: te.Schedule):
        self.data, self.s = data, s
        self.extent: dict[tuple[str, str], int] = {}  # (stage, loop) -> extent (an upper bound when attached)

    def draw(self, strategy: st.SearchStrategy, label: str):
        return self.data.draw(strategy, label=label)

    # -- schedule-level steps --------------------------------------------------------------------
    def maybe_cache_write(self, t: te.Tensor) -> None:
        if self.draw(st.booleans(), f"cache_write {t.name}"):
            self.s.cache_write(t, "local")

    def maybe_cache_read(self, t: te.Tensor) -> None:
        if self.draw(st.booleans(), f"cache_read {t.name}"):
            readers = [r.name for r in self.s.stages if any(self.s[i] is self.s[t] for i in r.op.inputs)]
            self.s.cache_read(t, self.draw(st.sampled_from(["local", "global"]), "scope"), readers)

    # -- per stage -------------------------------------------------------------------------------
    def schedule_all(self) -> None:
        for stage in reversed([x for x in self.s.stages if not x.is_placeholder]):
            self.attach(stage)
            if stage.attach != "inline":
                self.loops(stage)
                self.annotate(stage)
        self.split_an_attach_loop()
        note(f"schedule:\n{self.s}")

    def readers(self, p: te.Stage) -> list[te.Stage]:
        """Stages that read p once inlined stages are substituted into their readers."""
        out: list[te.Stage] = []
        for r in self.s.stages:
            if r.is_placeholder or not any(self.s[t] is p for t in r.op.inputs):
                continue
            out += self.readers(r) if r.attach == "inline" else [r]
        return out

    @staticmethod
    def runs_inside(r: te.Stage, target: te.Stage, pos: int) -> bool:
        while r is not target:
            if r.attach != "at":
                return False
            if r.attach_stage is target:
                return target.leaf_iter_vars.index(r.attach_axis) >= pos
            r = r.attach_stage
        return True

    def attach(self, p: te.Stage) -> None:
        if p.is_output:
            return
        readers = self.readers(p)
        options: list[tuple] = [("root",)]
        if not isinstance(p.op.body, te.Reduce):
            options.append(("inline",))
        for t in self.s.stages:
            if t is p or t.is_placeholder or t.attach == "inline" or p not in t._producers():
                continue
            for pos, iv in enumerate(t.leaf_iter_vars):
                if all(self.runs_inside(r, t, pos) for r in readers):
                    options.append(("at", t, iv))
        choice = self.draw(st.sampled_from(options), f"attach {p.name}")
        if choice[0] == "inline":
            p.compute_inline()
        elif choice[0] == "at":
            p.compute_at(choice[1], choice[2])

    def loops(self, stage: te.Stage) -> None:
        name = stage.name
        for iv in stage.leaf_iter_vars:
            self.extent[name, iv.name] = iv.dom[1]
        for _ in range(self.draw(st.integers(0, 3), f"{name}: number of splits")):
            iv = self.draw(st.sampled_from(stage.leaf_iter_vars), f"{name}: split")
            n = self.extent[name, iv.name]
            by = self.draw(st.sampled_from(["factor", "nparts"]), "by")
            k = self.draw(st.integers(1, n + 2), by)
            outer, inner = stage.split(iv, **{by: k})
            inner_n = max(1, min(k, n)) if by == "factor" else max(1, -(-n // k))
            self.extent[name, inner.name], self.extent[name, outer.name] = inner_n, -(-n // inner_n)
        if self.draw(st.booleans(), f"{name}: reorder"):
            stage.reorder(*self.draw(st.permutations(stage.leaf_iter_vars), f"{name}: order"))
        for _ in range(self.draw(st.integers(0, 2), f"{name}: number of fuses")):
            leaves = list(stage.leaf_iter_vars)
            pairs = [i for i in range(len(leaves) - 1) if leaves[i].kind == leaves[i + 1].kind]
            if not pairs:
                break
            i = self.draw(st.sampled_from(pairs), f"{name}: fuse")
            fused = stage.fuse(leaves[i], leaves[i + 1])
            self.extent[name, fused.name] = self.extent[name, leaves[i].name] * self.extent[name, leaves[i + 1].name]

    def annotate(self, stage: te.Stage) -> None:
        for iv in list(stage.leaf_iter_vars):
            kinds = ["none", "none", "unroll"] if iv.kind == "reduce" else ["none", "unroll", "vectorize", "parallel"]
            kind = self.draw(st.sampled_from(kinds), f"{stage.name}: annotate {iv.name}")
            if kind == "unroll" and self.extent[stage.name, iv.name] > 16:
                continue  # keep the C file small
            if kind != "none":
                getattr(stage, kind)(iv)

    def split_an_attach_loop(self) -> None:
        attached = [p for p in self.s.stages if p.attach == "at" and p.attach_axis in p.attach_stage.leaf_iter_vars]
        if attached and self.draw(st.booleans(), "split an attach loop"):
            p = self.draw(st.sampled_from(attached), "stage")
            p.attach_stage.split(p.attach_axis, factor=self.draw(st.integers(1, 5), "factor"))


def assert_replays_to_the_same_ir(s: te.Schedule, fresh_args: tuple, ir) -> None:
    """The schedule's JSON replayed on a fresh copy of the compute lowers to the same loop IR."""
    replayed = te.Schedule.load(fresh_args[-1], s.to_json())
    assert str(ember.lower(replayed, list(fresh_args))) == str(ir)


def seeded_rng(data: st.DataObject) -> np.random.Generator:
    return np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="input seed"))


# ---------------------------------------------------------------------------------------------
# the workloads


def matmul(m: int, n: int, k: int):
    A = te.placeholder((m, k), "float32", name="A")
    B = te.placeholder((k, n), "float32", name="B")
    r = te.reduce_axis((0, k), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    return A, B, C


def conv2d(ci: int, co: int, h: int, w: int, kh: int, kw: int, pad: int, stride: int):
    X = te.placeholder((ci, h, w), "float32", name="X")
    W = te.placeholder((co, ci, kh, kw), "float32", name="W")
    hp, wp = h + 2 * pad, w + 2 * pad
    P = te.compute(
        (ci, hp, wp),
        lambda c, y, x: te.if_then_else(
            te.all(y >= pad, y < h + pad, x >= pad, x < w + pad), X[c, y - pad, x - pad], 0.0
        ),
        name="P",
    )
    oh, ow = (hp - kh) // stride + 1, (wp - kw) // stride + 1
    rc = te.reduce_axis((0, ci), name="rc")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    Y = te.compute(
        (co, oh, ow),
        lambda f, y, x: te.sum(P[rc, y * stride + ry, x * stride + rx] * W[f, rc, ry, rx], axis=[rc, ry, rx]),
        name="Y",
    )
    return X, W, Y


def conv2d_ref(x: np.ndarray, w: np.ndarray, pad: int, stride: int) -> np.ndarray:
    p = np.pad(x, ((0, 0), (pad, pad), (pad, pad)))
    co, _, kh, kw = w.shape
    oh, ow = (p.shape[1] - kh) // stride + 1, (p.shape[2] - kw) // stride + 1
    out = np.zeros((co, oh, ow), np.float64)
    for ry in range(kh):
        for rx in range(kw):
            win = p[:, ry : ry + stride * (oh - 1) + 1 : stride, rx : rx + stride * (ow - 1) + 1 : stride]
            out += np.einsum("cyx,fc->fyx", win, w[:, :, ry, rx])
    return out.astype(np.float32)


def softmax(m: int, n: int):
    X = te.placeholder((m, n), "float32", name="X")
    k1 = te.reduce_axis((0, n), name="k1")
    M = te.compute((m,), lambda i: te.max(X[i, k1], axis=k1), name="M")
    E = te.compute((m, n), lambda i, j: te.exp(X[i, j] - M[i]), name="E")
    k2 = te.reduce_axis((0, n), name="k2")
    S = te.compute((m,), lambda i: te.sum(E[i, k2], axis=k2), name="S")
    O = te.compute((m, n), lambda i, j: E[i, j] / S[i], name="O")
    return X, O


def softmax_ref(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


# ---------------------------------------------------------------------------------------------
# the properties


@PROPERTY
@given(st.data())
def test_random_schedule_of_matmul(check_build, data):
    sizes = [data.draw(SIZES, label=d) for d in "MNK"]
    A, B, C = matmul(*sizes)
    s = te.create_schedule(C)
    r = RandomScheduler(data, s)
    r.maybe_cache_write(C)
    r.maybe_cache_read(A)
    r.maybe_cache_read(B)
    r.schedule_all()
    f = check_build(s, [A, B, C], lambda a, b: a @ b, seeded_rng(data))
    assert_replays_to_the_same_ir(s, matmul(*sizes), f.ir)


@PROPERTY
@given(st.data())
def test_random_schedule_of_conv2d_with_padding(check_build, data):
    ci, co = data.draw(st.integers(1, 3), label="ci"), data.draw(st.integers(1, 4), label="co")
    h, w = data.draw(st.integers(5, 11), label="h"), data.draw(st.integers(5, 11), label="w")
    kh, kw = data.draw(st.integers(1, 3), label="kh"), data.draw(st.integers(1, 3), label="kw")
    pad, stride = data.draw(st.integers(0, 2), label="pad"), data.draw(st.integers(1, 2), label="stride")
    X, W, Y = conv2d(ci, co, h, w, kh, kw, pad, stride)
    s = te.create_schedule(Y)
    r = RandomScheduler(data, s)
    r.maybe_cache_write(Y)
    r.schedule_all()
    # sums of at most 27 products of values in [-2, 2]: float32 rounding stays well below 1e-4
    f = check_build(s, [X, W, Y], lambda x, w: conv2d_ref(x, w, pad, stride), seeded_rng(data), atol=1e-4)
    assert_replays_to_the_same_ir(s, conv2d(ci, co, h, w, kh, kw, pad, stride), f.ir)


@PROPERTY
@given(st.data())
def test_random_schedule_of_softmax(check_build, data):
    m, n = data.draw(SIZES, label="rows"), data.draw(SIZES, label="cols")
    X, O = softmax(m, n)
    s = te.create_schedule(O)
    RandomScheduler(data, s).schedule_all()
    f = check_build(s, [X, O], softmax_ref, seeded_rng(data))
    assert_replays_to_the_same_ir(s, softmax(m, n), f.ir)


def test_the_scheduler_draws_legal_schedules_of_every_kind():
    """The generator itself, without compiling: every schedule it draws lowers without a ScheduleError, and
    over a few hundred draws it uses every attach kind and annotation (else the properties above would
    silently test less than they claim)."""
    seen: set[str] = set()

    @settings(max_examples=300, deadline=None, derandomize=True, database=None)
    @given(st.data())
    def draw(data):
        A, B, C = matmul(9, 11, 13)
        s = te.create_schedule(C)
        r = RandomScheduler(data, s)
        r.maybe_cache_write(C)
        r.maybe_cache_read(A)
        r.schedule_all()
        ember.lower(s, [A, B, C])
        X, O = softmax(9, 11)
        s2 = te.create_schedule(O)
        RandomScheduler(data, s2).schedule_all()
        ember.lower(s2, [X, O])
        for stage in s.stages + s2.stages:
            seen.add(stage.attach)
            seen.update(a.kind.value for a in stage.iter_attrs.values())
            seen.update(type(r).__name__ for r in stage.relations)
            seen.add(stage.scope)

    draw()
    assert {"root", "inline", "at", "vectorized", "parallel", "unrolled", "Split", "Fuse", "local"} <= seen
