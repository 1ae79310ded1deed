"""Bad input gives one clear error that names the file, node, operator or input."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ember.frontend.onnx import DynamicShapeError, ModelError, UnsupportedOperatorError, from_onnx
from ember.ops.evaluate import InputError, evaluate


def tiny_model(dims=(1, 3, 4, 4), opset: int = 17) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((2, 3, 3, 3), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["y"], ["z"], name="relu")]  # fmt: skip
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(dims))],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [dims[0], 2, dims[2], dims[3]])], [w],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_model(), str(path))
    return path


def test_truncated_file_names_the_file(model_file):
    data = model_file.read_bytes()
    bad = model_file.with_name("truncated.onnx")
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match=r"truncated\.onnx: .*(truncated|not an ONNX model|checker)"):
        from_onnx(bad)


def test_corrupt_file_names_the_file(tmp_path):
    bad = tmp_path / "corrupt.onnx"
    bad.write_bytes(bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)))
    with pytest.raises(ModelError, match=r"corrupt\.onnx: "):
        from_onnx(bad)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(ModelError, match="nothere.onnx: no such file"):
        from_onnx(tmp_path / "nothere.onnx")
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(ModelError, match="empty.onnx: not an ONNX model"):
        from_onnx(empty)


def test_model_failing_the_checker():
    model = tiny_model()
    model.graph.node[1].input[0] = "undefined_value"
    with pytest.raises(ModelError, match="fails the ONNX checker"):
        from_onnx(model)


def test_output_typed_without_a_shape_is_accepted(tmp_path):
    """An output made by make_tensor_value_info(name, dtype, None) (rank unknown) fails onnx's checker, but
    onnxruntime runs such models: Ember infers the shape, on a file and on a proto, and leaves the proto as it was;
    the checker still runs on the rest of it."""
    model = tiny_model()
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    path = tmp_path / "unshaped.onnx"
    onnx.save(model, str(path))
    for m in (model, path):
        g = from_onnx(m)
        assert tuple(g.outputs[0].shape) == (1, 2, 4, 4)
    assert not model.graph.output[0].type.tensor_type.HasField("shape")
    model.graph.node[1].input[0] = "undefined_value"
    with pytest.raises(ModelError, match="fails the ONNX checker"):
        from_onnx(model)


def test_unknown_operators_are_all_listed_in_one_error():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    nodes = [
        helper.make_node("FancyOp", ["x"], ["a"], name="first", domain="com.example"),
        helper.make_node("Relu", ["a"], ["b"], name="fine"),
        helper.make_node("FancyOp", ["b"], ["c"], name="second", domain="com.example"),
        helper.make_node("OtherOp", ["c"], ["y"], name="third", domain="com.example"),
    ]
    graph = helper.make_graph(nodes, "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    with pytest.raises(UnsupportedOperatorError) as info:
        from_onnx(model)
    text = str(info.value)
    assert "2 unsupported operator(s)" in text
    assert "com.example.FancyOp" in text and "'first', 'second'" in text
    assert "com.example.OtherOp" in text and "'third'" in text
    assert "Relu" not in text
    assert set(info.value.unsupported) == {k for k in info.value.unsupported if "com.example" in k}


def test_wrong_input_shape_and_dtype_at_run_time():
    graph = from_onnx(tiny_model())
    with pytest.raises(InputError, match=r"'x' has shape \[1, 3, 5, 4\], expected \[1, 3, 4, 4\]"):
        evaluate(graph, {"x": np.zeros((1, 3, 5, 4), np.float32)})
    with pytest.raises(InputError, match="'x' has dtype int64, expected float32"):
        evaluate(graph, {"x": np.zeros((1, 3, 4, 4), np.int64)})


def test_symbolic_batch_defaults_to_one_and_other_dims_need_input_shapes():
    assert from_onnx(tiny_model(("N", 3, 4, 4))).inputs[0].shape == (1, 3, 4, 4)
    with pytest.raises(ModelError, match=r"'x' \[1, 3, H, W\].*pass input_shapes=\{'x': \(\.\.\.\)\}"):
        from_onnx(tiny_model(("N", 3, "H", "W")))
    graph = from_onnx(tiny_model(("N", 3, "H", "W")), {"x": (2, 3, 6, 5)})
    assert graph.inputs[0].shape == (2, 3, 6, 5) and graph.outputs[0].shape == (2, 2, 6, 5)


def test_input_shapes_must_agree_with_the_model():
    with pytest.raises(ModelError, match=r"input_shapes\['x'\] = \[1, 3, 5, 5\] contradicts"):
        from_onnx(tiny_model(), {"x": (1, 3, 5, 5)})
    with pytest.raises(ModelError, match="unknown input\\(s\\) 'nope'"):
        from_onnx(tiny_model(), {"nope": (1,)})


def stft_model() -> onnx.ModelProto:
    """STFT of a 16-sample signal in frames of 4, its frame step a graph input (a shape operand read only at
    compile time so far)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 1])
    step = helper.make_tensor_value_info("step", TensorProto.INT64, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b", "c", 2])
    length = helper.make_tensor("length", TensorProto.INT64, [], [4])
    node = helper.make_node("STFT", ["x", "step", "", "length"], ["y"], name="stft")
    graph = helper.make_graph([node], "g", [x, step], [y], [length])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_shape_operand_from_a_graph_input_names_it_and_can_be_bound():
    model = stft_model()
    expected = r"'stft' \(STFT\): its frame_step .* graph input\(s\) 'step'"
    with pytest.raises(DynamicShapeError, match=expected) as info:
        from_onnx(model)
    assert info.value.inputs == ["step"]
    graph = from_onnx(model, input_values={"step": np.array(4)})
    assert [v.name for v in graph.inputs] == ["x"] and graph.outputs[0].shape == (1, 4, 3, 2)


def test_reshape_target_from_a_graph_input_is_read_at_run_time():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])
    shape = helper.make_tensor_value_info("target", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])
    node = helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape")
    graph = from_onnx(helper.make_model(helper.make_graph([node], "g", [x, shape], [y])))
    assert [v.name for v in graph.inputs] == ["x", "target"]
    assert all(getattr(d, "source", None) == "target" for d in graph.outputs[0].shape)


def test_bad_attribute_names_the_node():
    model = tiny_model()
    model.graph.node[1].attribute.append(helper.make_attribute("bogus", 1))
    with pytest.raises(ModelError, match="fails the ONNX checker: Unrecognized attribute: bogus .* Name: relu"):
        from_onnx(model)


def test_unsupported_element_type_is_named():
    x = helper.make_tensor_value_info("s", TensorProto.STRING, [2])
    y = helper.make_tensor_value_info("t", TensorProto.STRING, [2])
    model = helper.make_model(helper.make_graph([helper.make_node("Identity", ["s"], ["t"])], "g", [x], [y]))
    with pytest.raises(ModelError, match="input 's' has element type STRING, which Ember does not support"):
        from_onnx(model)
