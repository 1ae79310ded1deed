"""Property tests: any sketch of a kernel with any random annotation computes the numpy reference.

Kernels: a matmul, a padded convolution, a softmax, a layer norm, a fused elementwise group and the window
reductions (average and max pooling with its indices, a depthwise convolution: the window sketch) (the compiler's
own computes, through `AutoTask`), on C, LLVM and OpenCL. Hypothesis draws the sketch and the seed of its
annotation; inputs are fresh random arrays per example. Few, small examples: each compiles one kernel.
"""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import ember
from ember import te
from ember.autoschedule import sketch as S
from ember.autoschedule.task import AutoTask
from ember.graph.ir import Graph, Node, Value
from ember.graph.types import TensorType
from ember.target import Target

pytestmark = pytest.mark.property

EXAMPLES = int(os.environ.get("EMBER_PROPERTY_EXAMPLES", "4"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None,
                    derandomize=os.environ.get("EMBER_PROPERTY_RANDOM", "") in ("", "0"),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip


def fused_elementwise(target: str) -> AutoTask:
    """Fused(Add -> Mul -> Sigmoid) over (5, 13) and a broadcast (13,)."""
    x, b = Value("x", TensorType((5, 13), "float32")), Value("b", TensorType((13,), "float32"))
    t1, t2, y = (Value(n, TensorType((5, 13), "float32")) for n in ("t1", "t2", "y"))
    nodes = [Node("Add", [x, b], [t1], {}, "add"), Node("Mul", [t1, x], [t2], {}, "mul"),
             Node("Sigmoid", [t2], [y], {}, "sig")]  # fmt: skip
    body = Graph("fused_add_mul_sigmoid", [x, b], [y], nodes)
    ox, ob, oy = Value("ox", x.type), Value("ob", b.type), Value("oy", y.type)
    return AutoTask.from_node(Node("Fused", [ox, ob], [oy], {"body": body}, "fused"), target)


POOL = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "dilations": [1, 1]}
KERNELS = {
    "matmul": lambda t: AutoTask.from_op("MatMul", [(13, 10), (10, 17)], target=t),
    "conv": lambda t: AutoTask.from_op("Conv", [(1, 3, 7, 7), (5, 3, 3, 3)], {"pads": [1, 1, 1, 1], "strides": [1, 1],
                                       "dilations": [1, 1], "group": 1}, target=t),  # fmt: skip
    "softmax": lambda t: AutoTask.from_op("Softmax", [(6, 45)], {"axis": -1}, target=t),
    "layernorm": lambda t: AutoTask.from_op("LayerNormalization", [(5, 40), (40,), (40,)], {"axis": -1}, target=t),
    "fused": fused_elementwise,
    "avgpool": lambda t: AutoTask.from_op("AveragePool", [(1, 3, 9, 11)], {**POOL, "count_include_pad": 0}, target=t),
    "maxpool": lambda t: AutoTask.from_op("MaxPool", [(1, 3, 10, 9)], {**POOL, "ceil_mode": 1}, target=t),
    "depthwise": lambda t: AutoTask.from_op("Conv", [(1, 5, 7, 19), (5, 1, 3, 3)], {"pads": [1, 1, 1, 1],
                                            "strides": [1, 1], "dilations": [1, 1], "group": 5}, target=t),  # fmt: skip
}

# for the window sketch only: 30 outputs a row, more than a vector and not a multiple (the last vector shifted back)
WINDOW_KERNELS = {**KERNELS, "avgpool_wide": lambda t: AutoTask.from_op(
    "AveragePool", [(1, 2, 5, 60)], {**POOL, "count_include_pad": 0}, target=t)}


def _check(kernel: str, target: str, data, sketch: str | None = None) -> None:
    task = WINDOW_KERNELS[kernel](target)
    sketches = [s for s in task.sketches() if sketch is None or s.name == sketch]
    sk = data.draw(st.sampled_from(sketches), label="sketch")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    outs, args = task.computes()
    sch, dec = S.sample(sk, outs, args, Target.parse(target), random.Random(seed))
    note(f"{sk.name} {dec}\n{sch}")
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(a.shape).astype(a.dtype.name) for a in args[: len(args) - len(outs)]]
    ref = task.reference(xs)
    f = ember.build(sch, args, target=target)
    ys = [np.zeros(o.shape, o.dtype.name) for o in outs]
    f(*xs, *ys)
    for y, r in zip(ys, ref):
        np.testing.assert_allclose(y, r, rtol=1e-4, atol=1e-4)
    again, _ = S.apply(sk, *task.computes()[:1], Target.parse(target), dec)  # the decisions replay exactly
    assert [s.to_json() for s in again.steps] == [s.to_json() for s in sch.steps]


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("target", ["c", "llvm"])
@PROPERTY
@given(data=st.data())
def test_any_sketch_any_annotation_cpu(kernel, target, data):
    _check(kernel, target, data)


@pytest.mark.parametrize("kernel", ["avgpool", "avgpool_wide", "maxpool", "depthwise"])
@pytest.mark.parametrize("target", ["c", "llvm"])
@settings(PROPERTY, max_examples=max(1, EXAMPLES // 2))
@given(data=st.data())
def test_window_sketch_any_annotation(kernel, target, data):
    _check(kernel, target, data, "window")


@pytest.mark.parametrize("kernel", ["avgpool", "avgpool_wide", "maxpool"])
@pytest.mark.parametrize("target", ["c", "llvm"])
@settings(PROPERTY, max_examples=max(1, EXAMPLES // 2))
@given(data=st.data())
def test_separated_window_sketch_any_annotation(kernel, target, data):
    _check(kernel, target, data, "window.sep")


@pytest.mark.parametrize("kernel", ["avgpool_wide", "maxpool"])
def test_separated_window_either_tap(kernel):
    """The separated tap is a decision: column sums (the first tap) or row sums; both compute the reference, and
    the partial stage reduces the chosen tap only."""
    task = WINDOW_KERNELS[kernel]("c")
    outs, args = task.computes()
    sk = next(s for s in task.sketches() if s.name == "window.sep")
    _, first = S.apply(sk, outs, Target.parse("c"))
    keys = [k for k in first if k.endswith(".separate")]
    assert keys
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(a.shape).astype(a.dtype.name) for a in args[: len(args) - len(outs)]]
    ref = task.reference(xs)
    stages = te.create_schedule(list(outs))
    taps = {k: [iv.name for iv in stages[k.removesuffix(".separate")].op.reduce_axis] for k in keys}
    assert all(first[k] == taps[k][0] for k in keys)
    for i in range(2):
        outs, args = task.computes()
        sch, _ = S.apply(sk, outs, Target.parse("c"), {k: taps[k][i] for k in keys})
        seps = [st for st in sch.stages if st.name.endswith(".sep")]
        assert len(seps) == len(keys) and all([iv.name for iv in p.op.reduce_axis] == [taps[k][i]]
                                              for p, k in zip(seps, keys)), sch  # fmt: skip
        ys = [np.zeros(o.shape, o.dtype.name) for o in outs]
        ember.build(sch, args, target="c")(*xs, *ys)
        for y, r in zip(ys, ref):
            np.testing.assert_allclose(y, r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@PROPERTY
@given(data=st.data())
def test_any_sketch_any_annotation_opencl(kernel, data):
    from tests.conftest import opencl_missing

    why = opencl_missing()
    if why:
        pytest.skip(f"OpenCL: {why}")
    _check(kernel, "opencl", data)


def row_sum(n: int = 300):
    A = te.placeholder((4, n), "float32", name="A")
    k = te.reduce_axis((0, n), name="k")
    return A, te.compute((4,), lambda i: te.sum(A[i, k], axis=k), name="S")


def test_sketches_follow_the_rules():
    def names(task):
        return [s.name for s in task.sketches()]

    # the compute has its own write cache: no second one; a register tile as the GEMM template has
    assert names(KERNELS["matmul"]("c")) == ["tile", "tile.reg"]
    assert names(KERNELS["fused"]("c")) == ["rows"]
    assert names(KERNELS["conv"]("opencl")) == ["gpu.flat", "gpu.tile", "gpu.tile.shared"]
    _, S_ = row_sum()
    assert [s.name for s in S.sketches([S_], Target.parse("c"))] == ["rows", "rows.rfactor"]
    assert [s.name for s in S.sketches([row_sum(20)[1]], Target.parse("c"))] == ["rows"]  # short: no rfactor
    # window reductions (a few taps at position x stride + tap): the window sketch, on CPUs only
    # ... and where a window's taps are independent (pooling, not a depthwise convolution's weighted window) the
    # window separated into column (or row) sums and a pass over them (`Schedule.separate`)
    assert names(KERNELS["avgpool"]("c")) == ["rows", "window", "window.sep"]
    assert names(KERNELS["maxpool"]("llvm")) == ["rows", "window", "window.sep"]
    assert "window" in names(KERNELS["depthwise"]("c")) and "window" not in names(KERNELS["depthwise"]("opencl"))
    assert "window.sep" not in names(KERNELS["depthwise"]("c"))


@pytest.mark.parametrize("target", ["c", "llvm"])
@pytest.mark.parametrize("pad", ["inline", "root", "tile"])
def test_window_sketch(target, pad):
    """window: the depthwise accumulation a local tile (channels x rows x width) at the output's width loop, its
    width in vectors, the taps outside and unrolled, the padded input inlined, at root or per channel tile."""
    task = KERNELS["depthwise"](target)
    outs, args = task.computes()
    tgt = Target.parse(target)
    lanes = S.lanes_of("float32", tgt)
    dec = {"conv_pad.inline": pad == "inline", "conv_pad.at": pad, "conv.width": lanes, "conv.rows": 2,
           "conv.block": 2, "conv_acc.unroll_window": True}  # fmt: skip
    sch, taken = S.apply(task.sketch("window"), outs, tgt, dec)
    assert {k: taken[k] for k in dec if k in taken} == {k: v for k, v in dec.items() if k in taken}
    text = str(S.check(sch, args, tgt))
    assert f"conv_acc = alloc float32[1, 2, 2, {lanes}], local" in text, text
    assert f"vectorized({lanes})" in text and "unrolled(" in text, text
    assert ("conv_pad = alloc" in text) == (pad != "inline"), text
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal((1, 5, 7, 19)).astype("float32"), rng.standard_normal((5, 1, 3, 3)).astype("float32")
    out = np.zeros((1, 5, 7, 19), "float32")
    ember.build(sch, args, target=target)(x, w, out)
    torch = pytest.importorskip("torch", reason="the reference depthwise convolution is torch's")
    ref = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1, groups=5).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", ["c", "llvm"])
@pytest.mark.parametrize("materialize", [False, True])
def test_register_tile_sketch(target, materialize):
    """tile.reg: the accumulator a local tile of whole vectors, the reduction's inner steps and the tile
    unrolled, the packed operand materialized or inlined; against numpy."""
    task = AutoTask.from_op("MatMul", [(13, 10), (10, 37)], target=target)
    outs, args = task.computes()
    tgt = Target.parse(target)
    lanes = S.lanes_of("float32", tgt)
    sch, dec = S.apply(task.sketch("tile.reg"), outs, tgt, {"matmul_acc.nr": lanes, "matmul_acc.k.1": 2,
                                                           "matmul_acc_packed_b.inline": not materialize})
    text = str(S.check(sch, args, tgt))  # the loop nest before loop passes
    assert f"alloc float32[{dec['matmul_acc.i0.reg']}, {lanes}], local" in text, text
    assert "unrolled(" in text and f"vectorized({lanes})" in text, text
    assert ("matmul_acc_packed_b = alloc" in text) == materialize, text
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((13, 10)).astype("float32"), rng.standard_normal((10, 37)).astype("float32")
    out = np.zeros((13, 37), "float32")
    ember.build(sch, args, target=target)(a, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)


def test_shared_elementwise_stage_may_be_kept():
    """The softmax's exp (read by the row sum and the output) is inlined or computed once, by decision."""
    task = KERNELS["softmax"]("c")
    outs, args = task.computes()
    names = {}
    for keep in (False, True):
        sch, dec = S.apply(task.sketch("rows"), outs, Target.parse("c"), {"sm_exp.inline": not keep})
        assert dec["sm_exp.inline"] is (not keep)
        names[keep] = {st.name for st in sch.stages if st.attach != "inline"}
    assert "sm_exp" in names[True] and "sm_exp" not in names[False]


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_rfactor_sketch_vectorizes_partial_sums(target):
    A, S_ = row_sum()
    decisions = {"S.rfactor": 8, "S.rf.at": 0}
    sch, _ = S.apply(S.Sketch("rows.rfactor", rfactor=True), [S_], Target.parse(target), decisions)
    assert [s.kind for s in sch.steps].count("rfactor") == 1, sch
    assert "ramp" in str(ember.lower(sch, [A, S_]))  # the partial sums are one vector
    a = np.random.default_rng(3).standard_normal((4, 300)).astype("float32")
    out = np.zeros(4, "float32")
    ember.build(sch, [A, S_], target=target)(a, out)
    np.testing.assert_allclose(out, a.sum(1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", ["c", "llvm"])
@PROPERTY
@given(seed=st.integers(0, 2**16))
def test_row_sum_any_annotation(target, seed):
    A, S_ = row_sum(70)
    for sk in S.sketches([S_], Target.parse(target)):
        sch, dec = S.sample(sk, [S_], [A, S_], Target.parse(target), random.Random(seed))
        note(f"{sk.name} {dec}")
        a = np.random.default_rng(seed).standard_normal((4, 70)).astype("float32")
        out = np.zeros(4, "float32")
        ember.build(sch, [A, S_], target=target)(a, out)
        np.testing.assert_allclose(out, a.sum(1), rtol=1e-4, atol=1e-4)


# -- tails: extents that are no multiple of any tile -----------------------------------------------------------
def scaled_scores(b: int, m: int, n: int, k: int, target: str) -> AutoTask:
    """The kernel of MatMul(b x m x k, b x k x n) -> Mul(0.125), as the compiler groups attention scores."""
    pytest.importorskip("onnx", reason="the scores are built as an ONNX model")
    from onnx import TensorProto, helper

    from ember.autoschedule.task import extract_auto_tasks

    q = helper.make_tensor_value_info("q", TensorProto.FLOAT, [b, m, k])
    kt = helper.make_tensor_value_info("k", TensorProto.FLOAT, [b, k, n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [b, m, n])
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [], [0.125])
    nodes = [helper.make_node("MatMul", ["q", "k"], ["s"]), helper.make_node("Mul", ["s", "scale"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "scores", [q, kt], [y], [scale]),
                              opset_imports=[helper.make_opsetid("", 17)])  # fmt: skip
    (task,) = extract_auto_tasks(model, target)
    return task


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("target", ["c", "llvm"])
@PROPERTY
@given(data=st.data())
def test_any_sketch_any_annotation_any_extents(target, data):
    """Scaled scores (batched, a fused epilogue) and softmax rows at extents drawn from 1 to a few vectors past
    a tile (primes, one past a vector, smaller than one): every sketch and annotation, exact and masked tails
    included, computes numpy's result."""
    kind = data.draw(st.sampled_from(["scores", "softmax"]), label="kernel")
    m, n = data.draw(st.integers(1, 29), label="rows"), data.draw(st.integers(1, 53), label="columns")
    if kind == "scores":
        b, k = data.draw(st.integers(1, 3), label="batch"), data.draw(st.integers(1, 19), label="reduction")
        task = scaled_scores(b, m, n, k, target)
    else:
        task = AutoTask.from_op("Softmax", [(m, n)], {"axis": -1}, target=target)
    sk = data.draw(st.sampled_from(task.sketches()), label="sketch")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    outs, args = task.computes()
    sch, dec = S.sample(sk, outs, args, Target.parse(target), random.Random(seed))
    note(f"{kind} {sk.name} {dec}")
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(a.shape).astype("float32") for a in args[: len(args) - len(outs)]]
    ref = np.matmul(xs[0].astype(np.float64), xs[1]) * 0.125 if kind == "scores" else _softmax(xs[0])
    y = np.zeros(outs[0].shape, "float32")
    ember.build(sch, args, target=target)(*xs, y)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)


def _lane_updates(s, name: str) -> int:
    """Lanes stored to buffer `name` by a loop nest (loops at their constant extents)."""
    from ember.tir.stmt import Allocate, For, IfThenElse, LetStmt, Seq, Store

    if isinstance(s, Store):
        return s.value.dtype.lanes if s.buffer.name == name else 0
    if isinstance(s, Seq):
        return sum(_lane_updates(x, name) for x in s.stmts)
    if isinstance(s, For):
        return s.extent.value * _lane_updates(s.body, name)
    if isinstance(s, IfThenElse):
        return _lane_updates(s.then_case, name) + (_lane_updates(s.else_case, name) if s.else_case else 0)
    return _lane_updates(s.body, name) if isinstance(s, Allocate | LetStmt) else 0


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_register_tile_computes_exact_tails(target):
    """tile.reg on 2 x 13 x 37 scores with 3-row tiles of two vectors: the last row tile computes its one row
    (not a tile shifted back over the previous one), the last column tile one vector (not two, nor the whole
    padded panel): the accumulator is updated (k + 1) times (init and k steps) per row and per column rounded up
    to whole vectors, no more; against numpy."""
    task = scaled_scores(2, 13, 37, 5, target)
    tgt = Target.parse(target)
    lanes = S.lanes_of("float32", tgt)
    outs, args = task.computes()
    dec = {"matmul_acc.nr": 2 * lanes, "matmul_acc.i1.reg": 3, "matmul_acc.i0.reg": 1, "mul.swap": False,
           "matmul_acc.k.1": 1, "matmul_acc_packed_b.inline": False}  # fmt: skip
    sch, _ = S.apply(task.sketch("tile.reg"), outs, tgt, dec)
    f = ember.build(sch, args, target=target)
    assert _lane_updates(f.ir.body, "matmul_acc") == 2 * 13 * (-(-37 // lanes) * lanes) * (5 + 1), f.ir
    rng = np.random.default_rng(11)
    q, k = rng.standard_normal((2, 13, 5)).astype("float32"), rng.standard_normal((2, 5, 37)).astype("float32")
    y = np.zeros((2, 13, 37), "float32")
    f(q, k, y)
    np.testing.assert_allclose(y, q @ k * 0.125, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", ["c", "llvm"])
@pytest.mark.parametrize("kernel", ["avgpool", "maxpool", "depthwise"])
def test_window_rule_candidates(kernel, target):
    """The window sketch's rule candidates (tried first by the search): one vector wide, a width that is not a
    multiple of the vector ends in a shifted whole vector (no scalar tail), and they compute the reference."""
    task = KERNELS[kernel](target)
    outs, args = task.computes()
    tgt = Target.parse(target)
    sk = task.sketch("window")
    cands = S.rule_candidates(sk, outs, tgt)
    assert len(cands) == 2 and {c[k] for c in cands for k in c if k.endswith(".inline")} == {False, True}
    assert S.rule_candidates(task.sketches()[0], outs, tgt) == []  # none for the other sketches
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(a.shape).astype(a.dtype.name) for a in args[: len(args) - len(outs)]]
    ref = task.reference(xs)
    for dec in cands:
        sch, taken = S.apply(sk, outs, tgt, dec)
        assert all(dec[k] == v for k, v in taken.items())
        n_w, lanes = outs[0].shape[-1], S.lanes_of("float32", tgt)
        shifted = {st.stage for st in sch.steps if st.kind == "split" and st.args[3:] == ("shift",)}
        # (the output's width; a padded input copied in vectors may end in a shifted one of its own)
        assert (outs[0].op.name in shifted) == (n_w > lanes and n_w % lanes != 0), sch.steps  # depthwise: 19 wide
        ys = [np.zeros(o.shape, o.dtype.name) for o in outs]
        ember.build(sch, args, target=target)(*xs, *ys)
        for y, r in zip(ys, ref):
            np.testing.assert_allclose(y, r, rtol=1e-4, atol=1e-4)


def test_lane_trees_are_not_inlined_into_exponential_expressions():
    """A softmax's row max is combined in a lane tree whose steps read their input four times each (max(a, b) is
    a < b ? b : a); inlined all the way, 64 lanes made statements of 4^6 loads and C files of 40 MB that took
    gcc minutes. With the inlining bound, no statement of any candidate reads more than 64 elements of the tree
    (and a few more of the row)."""
    from ember.build import lower
    from ember.tir.expr import Load
    from ember.tir.functor import walk
    from ember.tir.stmt import Store

    task = AutoTask.from_op("Softmax", [(4, 197)], {"axis": -1}, target="c -threads=1")
    outs, args = task.computes()
    rng, target = random.Random(0), Target.parse(task.target)
    for _ in range(12):
        sch, _ = S.apply(rng.choice(task.sketches()), outs, target, None, rng)
        func = lower(sch, args, "k")
        worst = max(sum(isinstance(n, Load) for n in walk(st.value)) for st in walk(func.body) if isinstance(st, Store))
        assert worst <= 80, f"a statement reads {worst} elements"

