"""Import mechanics: constant folding rules, type-only ops, opset versions, function expansion."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember.frontend.onnx as frontend
from ember.frontend.onnx import ModelError, from_onnx
from ember.ops.evaluate import evaluate

F = TensorProto.FLOAT


def model_of(nodes, inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_folding_keeps_weight_casts_but_not_blowups(monkeypatch):
    monkeypatch.setattr(frontend, "FOLD_LIMIT", 10)
    w16 = numpy_helper.from_array(np.arange(100, dtype=np.float16), "w16")
    scalar = numpy_helper.from_array(np.float32(1.5), "s")
    shape = numpy_helper.from_array(np.array([100], np.int64), "shape")
    nodes = [
        helper.make_node("Cast", ["w16"], ["w"], to=F),  # as big as its input: folded
        helper.make_node("Expand", ["s", "shape"], ["big"]),  # a scalar grown to 100: kept
        helper.make_node("Add", ["x", "w"], ["a"]),
        helper.make_node("Add", ["a", "big"], ["y"]),
    ]
    model = model_of(nodes, [helper.make_tensor_value_info("x", F, [100])],
                     [helper.make_tensor_value_info("y", F, [100])], [w16, scalar, shape])  # fmt: skip
    graph = from_onnx(model)
    assert [n.op for n in graph.nodes] == ["Expand", "Add", "Add"]
    (y,) = evaluate(graph, {"x": np.zeros(100, np.float32)}).values()
    np.testing.assert_allclose(y, np.arange(100) + 1.5)


def test_shape_and_size_of_runtime_tensors_are_constants():
    nodes = [helper.make_node("Shape", ["x"], ["s"], start=1), helper.make_node("Size", ["x"], ["n"])]
    model = model_of(nodes, [helper.make_tensor_value_info("x", F, [2, 3, 4])],
                     [helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
                      helper.make_tensor_value_info("n", TensorProto.INT64, [])])  # fmt: skip
    graph = from_onnx(model)
    assert graph.nodes == [] and graph.outputs[0].data.tolist() == [3, 4] and graph.outputs[1].data == 24


def test_old_softmax_flattens_to_two_dims():
    node = helper.make_node("Softmax", ["x"], ["y"], axis=1)
    model = model_of([node], [helper.make_tensor_value_info("x", F, [2, 3, 4])],
                     [helper.make_tensor_value_info("y", F, [2, 3, 4])], opset=11)  # fmt: skip
    graph = from_onnx(model)
    assert [n.op for n in graph.nodes] == ["Flatten", "Softmax", "Reshape"]
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    (y,) = evaluate(graph, {"x": x}).values()
    np.testing.assert_allclose(y.reshape(2, 12).sum(axis=1), 1, rtol=1e-6)


def test_opset_newer_than_onnx_is_refused():
    model = model_of([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", F, [2])],
                     [helper.make_tensor_value_info("y", F, [2])])  # fmt: skip
    model.opset_import[0].version = frontend.MAX_OPSET + 1
    with pytest.raises(ModelError, match="opset .* is newer than"):
        from_onnx(model)


def test_operator_without_an_entry_is_expanded_from_its_onnx_function():
    # RotaryEmbedding has no Ember entry; ONNX defines it by a function body.
    assert "RotaryEmbedding" not in frontend.OPS
    b, s, h, d = 1, 3, 2, 4
    inputs = [helper.make_tensor_value_info("x", F, [b, s, h * d]),
              helper.make_tensor_value_info("pos", TensorProto.INT64, [b, s])]  # fmt: skip
    rng = np.random.default_rng(0)
    cache = [numpy_helper.from_array(rng.standard_normal((8, d // 2)).astype(np.float32), n) for n in ("cos", "sin")]
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"], num_heads=h)
    model = model_of([node], inputs, [helper.make_tensor_value_info("y", F, [b, s, h * d])], cache, opset=23)
    graph = from_onnx(model)
    assert "RotaryEmbedding" not in {n.op for n in graph.nodes}
    x = rng.standard_normal((b, s, h * d)).astype(np.float32)
    pos = np.array([[0, 3, 7]], np.int64)
    (y,) = evaluate(graph, {"x": x, "pos": pos}).values()
    # rotate halves: [x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin], per head
    cos, sin = (numpy_helper.to_array(c)[pos] for c in cache)
    xh = x.reshape(b, s, h, d)
    x1, x2 = xh[..., : d // 2], xh[..., d // 2 :]
    c, sn = cos[:, :, None, :], sin[:, :, None, :]
    expected = np.concatenate([x1 * c - x2 * sn, x2 * c + x1 * sn], axis=-1).reshape(b, s, h * d)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
