"""Calls of a symbolic model at sizes it has seen: what depends only on the sizes is made once per size and kept for
the SIZES_KEPT last used (`Model._bind`, `executor.Prepared`), and a call still checks its inputs, returns arrays of
its own sizes, and leaves the arrays earlier calls returned alone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.runtime import executor, model
from ember.runtime.model import HUGE_PAGE, gathered_weights
from ember.runtime.module import ArgumentError
from ember.runtime.plan import Plan

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the reference")

F = TensorProto.FLOAT


def mlp_with_views(seed: int = 0):
    """x[N, 8] -> MatMul -> Relu -> MatMul + b = y[N, 4]; also y flattened (a view of an output) and x reshaped
    (a view of an input, returned as a copy), and an Add of a second input u[N, 4] that must have x's N."""
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "w2")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    flat = numpy_helper.from_array(np.array([-1], np.int64), "flat")
    pairs = numpy_helper.from_array(np.array([-1, 2], np.int64), "pairs")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["y"]),
        helper.make_node("Reshape", ["y", "flat"], ["y_flat"]),
        helper.make_node("Reshape", ["x", "pairs"], ["x_pairs"]),
        helper.make_node("Add", ["y", "u"], ["yu"]),
    ]
    ins = [helper.make_tensor_value_info("x", F, ["N", 8]), helper.make_tensor_value_info("u", F, ["N", 4])]
    outs = [helper.make_tensor_value_info(n, F, [None] * r) for n, r in (("y", 2), ("y_flat", 1), ("x_pairs", 2),
                                                                        ("yu", 2))]  # fmt: skip
    graph = helper.make_graph(nodes, "mlp_views", ins, outs, [w1, w2, b, flat, pairs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def feeds_at(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal((n, 8)).astype(np.float32), "u": rng.standard_normal((n, 4)).astype(np.float32)}


@pytest.fixture(scope="module")
def mlp():
    m = mlp_with_views()
    return m, ember.compile(m, target="c", dynamic_bounds={"N": (1, 64)}), ort.InferenceSession(m.SerializeToString())


def test_alternating_sizes_match_onnxruntime_and_keep_earlier_results(mlp, monkeypatch):
    m, cm, sess = mlp
    planned = []
    at = Plan.at
    monkeypatch.setattr(Plan, "at", lambda self, sizes, *a: planned.append(sizes) or at(self, sizes, *a))
    rng = np.random.default_rng(1)
    kept = []
    for n in (3, 5, 3, 1, 3, 5, 1, 3):
        feeds = feeds_at(n, rng)
        want = dict(zip(cm.output_names, sess.run(cm.output_names, feeds)))
        got = cm.run(feeds)
        for name, w in want.items():
            assert got[name].shape == w.shape, (n, name)
            np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-5, err_msg=f"N={n} {name}")
        kept.append((got, {k: v.copy() for k, v in want.items()}))
    assert sorted(set(planned)) == [(1,), (3,), (5,)] and len(planned) == 3  # planned once per size, kept
    for i, (got, want) in enumerate(kept):  # no later call wrote into an earlier call's results
        for name, w in want.items():
            np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-5, err_msg=f"call {i} {name}")
    arrays = [a for got, _ in kept for a in got.values()]
    shared = [(i, j) for i in range(len(arrays)) for j in range(i + 1, len(arrays))
              if np.shares_memory(arrays[i], arrays[j])]  # fmt: skip
    # (a call's y_flat is its y's storage: outputs of one call may share, those of two calls never do)
    assert all(i // 4 == j // 4 for i, j in shared), shared


def test_the_last_sizes_used_are_kept_and_older_ones_planned_again(monkeypatch):
    m = mlp_with_views(2)
    cm = ember.compile(m, target="c", dynamic_bounds={"N": (1, 64)})
    sess = ort.InferenceSession(m.SerializeToString())
    monkeypatch.setattr(model, "SIZES_KEPT", 3)
    monkeypatch.setattr(executor, "SIZES_KEPT", 3)
    planned = []
    at = Plan.at
    monkeypatch.setattr(Plan, "at", lambda self, sizes, *a: planned.append(sizes[0]) or at(self, sizes, *a))
    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 1, 4, 1, 2, 3):  # 4 drops 2 (least recently used), not 1 (oldest first planned)
        feeds = feeds_at(n, rng)
        np.testing.assert_allclose(cm.run(feeds)["yu"], sess.run(["yu"], feeds)[0], rtol=1e-5, atol=1e-5)
        assert len(cm._kept) <= 3 and len(cm._local.memory.values) <= 3
    assert planned == [1, 2, 3, 4, 2, 3]


def test_bad_shapes_raise_at_seen_and_unseen_sizes(mlp):
    _, cm, _ = mlp
    rng = np.random.default_rng(4)
    cm.run(feeds_at(3, rng))
    for _ in range(2):  # a refused shape is not kept: it raises again
        with pytest.raises(ArgumentError, match=r"input 'u' has shape \(4, 4\), wants \[N, 4\] = \(3, 4\) with N=3"):
            cm(np.zeros((3, 8), np.float32), np.zeros((4, 4), np.float32))
        with pytest.raises(ArgumentError, match=r"input 'x' has shape \(3,\), wants rank 2"):
            cm(np.zeros(3, np.float32), np.zeros((3, 4), np.float32))
        with pytest.raises(ArgumentError, match=r"size N = 65 is outside its bounds \[1, 64\]"):
            cm(np.zeros((65, 8), np.float32), np.zeros((65, 4), np.float32))
        with pytest.raises(ArgumentError, match=r"input 'x' has dtype float64"):
            cm(np.zeros((3, 8)), np.zeros((3, 4), np.float32))
    assert cm.run(feeds_at(3, rng))["y"].shape == (3, 4)


def test_sizes_read_from_values_are_read_at_every_call():
    """A Reshape whose target is an input: the same input shapes give other sizes, so the shapes are no key."""
    ins = [helper.make_tensor_value_info("x", F, [2, 3, 4]), helper.make_tensor_value_info("s", TensorProto.INT64, [3])]
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["y"])], "reshape", ins,
                              [helper.make_tensor_value_info("y", F, [None] * 3)])  # fmt: skip
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    cm = ember.compile(m, target="c", fallback=False)
    x = np.random.default_rng(5).standard_normal((2, 3, 4)).astype(np.float32)
    for target in ([4, 3, 2], [6, 2, 2], [4, 3, 2], [-1, 1, 2]):
        got = cm(x, np.array(target, np.int64))
        np.testing.assert_array_equal(got, x.reshape(target))


def test_threads_at_alternating_sizes_get_what_sequential_calls_get(mlp):
    _, cm, _ = mlp
    rng = np.random.default_rng(6)
    feeds = [feeds_at(n, rng) for n in (2, 7, 2, 1, 7, 2) * 12]
    want = [cm.run(f) for f in feeds]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(cm.run, feeds))
    for i, (g, w) in enumerate(zip(got, want)):
        for name in w:
            np.testing.assert_array_equal(g[name], w[name], err_msg=f"call {i} {name}")


def test_weights_gathered_at_a_huge_page_boundary():
    rng = np.random.default_rng(7)
    big = rng.standard_normal((600, 1024)).astype(np.float32)  # 2.4 MB: with the rest, over a huge page
    weights = {3: big, 5: np.float16(1.5) * np.ones((3, 5), np.float16), 8: np.array(2.5, np.float64),
               9: rng.random((7, 3)) < 0.5, 11: np.asfortranarray(rng.standard_normal((5, 6))),
               12: np.array(["a", "bc"], object)}  # fmt: skip
    got = gathered_weights(weights)
    assert set(got) == set(weights)
    for i, w in weights.items():
        assert got[i].dtype == w.dtype and got[i].shape == w.shape and got[i].flags.c_contiguous
        np.testing.assert_array_equal(got[i], w)
    numeric = [got[i] for i in (3, 5, 8, 9, 11)]
    if hasattr(__import__("mmap"), "MADV_HUGEPAGE"):
        assert got[3].ctypes.data % HUGE_PAGE == 0
        assert all(a.ctypes.data % 64 == 0 for a in numeric)
        assert all(a.base is not None and not a.flags.owndata for a in numeric)
    small = gathered_weights({0: np.ones((4, 4), np.float32)})  # under a huge page: numpy's memory as it was
    assert small[0].flags.owndata


def test_a_model_over_a_huge_page_of_weights_runs_from_gathered_weights():
    rng = np.random.default_rng(8)
    w = rng.standard_normal((64, 9000)).astype(np.float32)  # 2.3 MB
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "wide",
                              [helper.make_tensor_value_info("x", F, ["N", 64])],
                              [helper.make_tensor_value_info("y", F, ["N", 9000])],
                              [numpy_helper.from_array(w, "w")])  # fmt: skip
    cm = ember.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), target="c")
    for n in (1, 3):
        x = rng.standard_normal((n, 64)).astype(np.float32)
        np.testing.assert_allclose(cm(x), x @ w, rtol=1e-4, atol=1e-4)
