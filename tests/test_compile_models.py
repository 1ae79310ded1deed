"""Whole models through `ember.compile`: native kernels only, compared with onnxruntime on random inputs.

Tolerance: float32 outputs within rtol 1e-4; atol 1e-5 covers outputs near zero, where relative error is
meaningless (the models end in ReLU/softmax/layer norm, so many outputs are 0 or tiny)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import ember
from ember import zoo
from ember.frontend.onnx import ModelError, UnsupportedOperatorError
from ember.runtime.module import ArgumentError

ort = pytest.importorskip("onnxruntime")
RTOL, ATOL = 1e-4, 1e-5


def run_ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@pytest.fixture(scope="module", params=list(zoo.BLOCKS))
def compiled(request):
    model = zoo.BLOCKS[request.param]()
    return model, ember.compile(model, fallback=False)


def test_matches_onnxruntime(compiled):
    model, m = compiled
    for seed in range(2):
        feeds = zoo.random_feeds(model, seed)
        ours = m.run(feeds)
        theirs = run_ort(model, feeds)
        for (name, a), b in zip(ours.items(), theirs):
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=name)


def test_summary_and_native_execution(compiled):
    _, m = compiled
    s = m.summary()
    assert s["fallback_ops"] == [] and s["native_calls_per_run"] == 1
    assert s["nodes"] >= s["kernels"] > 0 and s["compile_seconds"] > 0


def test_positional_call_and_profile(compiled):
    model, m = compiled
    feeds = zoo.random_feeds(model, 3)
    y = m(*feeds.values())
    first = y[0] if isinstance(y, tuple) else y
    np.testing.assert_allclose(first, run_ort(model, feeds)[0], rtol=RTOL, atol=ATOL)
    rows = m.profile(list(feeds.values()), repeat=2)
    assert len(rows) == m.summary()["kernels"] and all(r["seconds"] >= 0 for r in rows)
    assert m.benchmark(list(feeds.values()), repeat=2)["median"] > 0


def test_save_and_load_round_trip(tmp_path):
    model = zoo.resnet_basic_block()
    m = ember.compile(model)
    path = m.save(tmp_path / "block")
    assert {p.name for p in path.iterdir()} >= {"model.so", "model.c", "plan.json", "weights.npz"}
    loaded = ember.load(path)
    feeds = zoo.random_feeds(model, 5)
    (a,) = loaded.run(feeds).values()
    (b,) = m.run(feeds).values()
    np.testing.assert_array_equal(a, b)


def test_wrong_input_shape_dtype_and_names_raise_before_running():
    m = ember.compile(zoo.mlp())
    x = np.zeros((4, 48), np.float32)
    with pytest.raises(ArgumentError, match="shape"):
        m(np.zeros((4, 47), np.float32))
    with pytest.raises(ArgumentError, match="dtype"):
        m(x.astype(np.float64))
    with pytest.raises(ArgumentError, match="missing"):
        m.run({"y": x})
    with pytest.raises(ArgumentError, match="takes 1 inputs"):
        m(x, x)


def test_corrupt_and_truncated_files_raise_model_error(tmp_path):
    good = zoo.mlp().SerializeToString()
    (tmp_path / "trunc.onnx").write_bytes(good[: len(good) // 2])
    (tmp_path / "junk.onnx").write_bytes(b"\x00\xffnot a model at all")
    for name in ("trunc.onnx", "junk.onnx", "missing.onnx"):
        with pytest.raises(ModelError, match=name):
            ember.compile(str(tmp_path / name))


def test_unknown_operators_listed_in_one_error():
    h = onnx.helper
    nodes = [
        h.make_node("OtherOp", ["x"], ["a"], domain="com.example"),
        h.make_node("FancyOp", ["a"], ["b"], domain="com.example"),
        h.make_node("FancyOp", ["b"], ["c"], domain="com.example"),
        h.make_node("Relu", ["c"], ["y"]),
    ]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", 1, [2])], [h.make_tensor_value_info("y", 1, [2])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.example", 1)])
    with pytest.raises(UnsupportedOperatorError) as e:
        ember.compile(model)
    assert "FancyOp" in str(e.value) and "OtherOp" in str(e.value)


def test_bitcast_is_a_view_between_native_kernels():
    """Relu -> BitCast(float32 -> int32) -> BitwiseAnd (clears the low mantissa bits) -> BitCast back -> Add:
    the casts cost nothing (views of the same bytes), the kernels around them read the bytes as their dtype;
    one output is itself a view. Compared with numpy's .view()."""
    from onnx import TensorProto, helper

    mask = np.array([~0xFF], np.int32)
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("BitCast", ["r"], ["bits"], to=TensorProto.INT32),
         helper.make_node("BitwiseAnd", ["bits", "mask"], ["cut"]),
         helper.make_node("BitCast", ["cut"], ["f"], to=TensorProto.FLOAT), helper.make_node("Add", ["f", "x"], ["y"])],
        "bitcast", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (3, 17))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (3, 17)),
         helper.make_tensor_value_info("bits", TensorProto.INT32, (3, 17))],
        [helper.make_tensor("mask", TensorProto.INT32, (1,), mask)])  # fmt: skip
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 26)])
    m = ember.compile(model, fallback=False)
    x = np.random.default_rng(0).standard_normal((3, 17)).astype(np.float32)
    y, bits = m(x)
    r = np.maximum(x, 0)
    np.testing.assert_array_equal(bits, r.view(np.int32))
    np.testing.assert_array_equal(y, (r.view(np.int32) & mask).view(np.float32) + x)
    assert not m.summary()["fallback_ops"]


def test_pow_by_a_constant_two_is_a_multiply():
    """An RMS norm as T5 exports it (Pow 2, ReduceMean, Add, Sqrt, Div, Mul): the square is x * x in the kernel
    (a vector powf per element cost more than the rest of the norm), same result as onnxruntime."""
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Pow", ["x", "two"], ["sq"]), helper.make_node("ReduceMean", ["sq", "axes"], ["ms"]),
         helper.make_node("Add", ["ms", "eps"], ["v"]), helper.make_node("Sqrt", ["v"], ["r"]),
         helper.make_node("Div", ["x", "r"], ["n"]), helper.make_node("Mul", ["n", "w"], ["y"])],
        "rms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 5, 40))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 5, 40))],
        [helper.make_tensor("two", TensorProto.FLOAT, (), [2.0]),
         helper.make_tensor("axes", TensorProto.INT64, (1,), [-1]),
         helper.make_tensor("eps", TensorProto.FLOAT, (), [1e-6]),
         helper.make_tensor("w", TensorProto.FLOAT, (40,), np.linspace(0.5, 1.5, 40, dtype=np.float32))])  # fmt: skip
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m = ember.compile(model, fallback=False)
    x = np.random.default_rng(1).standard_normal((2, 5, 40)).astype(np.float32)
    np.testing.assert_allclose(m(x), run_ort(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
    assert "powf" not in m.source and "simd_pow" not in m.source  # (the kernel is still named pow_...)


@pytest.mark.parametrize("k", [0.5, 1.0, 2.0, 3.0])
def test_pow_by_small_constants_matches_numpy_at_the_edges(k):
    """x ** k for the exponents lowered without a pow call, against numpy's power (the reference): exact for 0.5
    (a sqrt, as numpy computes it: -0 stays -0, -inf gives NaN), 1 and 2; within 2 ulps (two roundings) for 3."""
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Pow", ["x", "k"], ["y"])], "pow",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, (40,))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, (40,))],
                          [helper.make_tensor("k", TensorProto.FLOAT, (), [k])])  # fmt: skip
    m = ember.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)]), fallback=False)
    x = np.random.default_rng(2).standard_normal(40).astype(np.float32) * 10
    x[:6] = [-0.0, 0.0, -np.inf, np.inf, np.nan, 1e-30]
    with np.errstate(invalid="ignore"):
        ref = np.power(x, np.float32(k))
    got = m(x)
    if k == 3.0:
        np.testing.assert_allclose(got, ref, rtol=3e-7)
    else:
        np.testing.assert_array_equal(got, ref)
        assert np.array_equal(np.signbit(got), np.signbit(ref))
