"""Importing models with symbolic dims: size variables, shapes propagated as expressions, shape arithmetic
(Shape -> Gather -> Concat -> Reshape) resolved to symbolic Reshape targets."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ember import zoo
from ember.frontend.onnx import ModelError, from_onnx
from ember.graph.dims import SizeVar, eval_shape, shape_str
from ember.ops.evaluate import InputError, evaluate

F = TensorProto.FLOAT


def heads_model() -> onnx.ModelProto:
    """x[B, S, 8] -> Reshape(x, concat(shape(x)[0:1], [-1, 2, 4])) -> Transpose -> * 2, as exporters write it."""
    inits = [numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([-1, 2, 4], np.int64), "rest"),
             numpy_helper.from_array(np.float32(2), "two")]  # fmt: skip
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Concat", ["batch", "rest"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Mul", ["t", "two"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", F, ["B", "S", 8])
    y = helper.make_tensor_value_info("y", F, ["B", 2, "S", 4])
    graph = helper.make_graph(nodes, "heads", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_shape_arithmetic_becomes_a_symbolic_reshape():
    g = from_onnx(heads_model(), symbolic=True, dynamic_bounds={"S": (1, 64)})
    (x,) = g.inputs
    B, S = x.type.shape[:2]
    assert isinstance(B, SizeVar) and (S.name, S.bounds) == ("S", (1, 64)) and B.bounds == (1, None)
    assert str(g.outputs[0].type) == "float32[B, 2, S, 4]"
    reshape = next(n for n in g.nodes if n.op == "Reshape")
    assert shape_str(reshape.attrs["shape"]) == "[B, S, 2, 4]"
    # the reference evaluator runs the symbolic graph at any size (read from its inputs)
    rng = np.random.default_rng(0)
    for b, s in ((1, 1), (3, 7)):
        a = rng.standard_normal((b, s, 8)).astype(np.float32)
        got = evaluate(g, {"x": a})[g.outputs[0].name]
        np.testing.assert_allclose(got, a.reshape(b, s, 2, 4).transpose(0, 2, 1, 3) * 2)
        assert eval_shape(g.outputs[0].type.shape, {B: b, S: s}) == got.shape
    with pytest.raises(InputError, match=r"has shape \[2, 3, 9\], expected \[B, S, 8\]"):
        evaluate(g, {"x": np.zeros((2, 3, 9), np.float32)})


def test_static_import_is_unchanged_and_input_shapes_specialize():
    g = from_onnx(heads_model(), input_shapes={"x": (2, 3, 8)})
    assert str(g.outputs[0].type) == "float32[2, 2, 3, 4]"
    g = from_onnx(heads_model(), symbolic=True, input_shapes={"x": (2, 3, 8)})
    assert g.inputs[0].type.is_static
    with pytest.raises(ModelError, match="input_shapes"):
        from_onnx(heads_model())  # S is symbolic and not leading: static import asks for input_shapes


def test_dynamic_bounds_are_checked():
    with pytest.raises(ValueError, match="'T', which no input dim uses"):
        from_onnx(heads_model(), symbolic=True, dynamic_bounds={"T": (1, 4)})
    with pytest.raises(ValueError, match="symbolic=False"):
        from_onnx(heads_model(), dynamic_bounds={"S": (1, 4)})


def test_models_with_a_symbolic_batch():
    m = zoo.resnet18(image=32, width=8)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    g = from_onnx(m, symbolic=True, dynamic_bounds={"N": (1, 8)})
    assert str(g.inputs[0].type) == "float32[N, 3, 32, 32]" and str(g.outputs[0].type) == "float32[N, 1000]"
    m = zoo.transformer_encoder_layer(seq=8, batch=2)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "B"
    g = from_onnx(m, symbolic=True)
    assert str(g.outputs[0].type) == "float32[B, 8, 32]"


def test_symbolic_image_size_propagates_through_convolutions():
    m = zoo.mobilenet_v2(image=32)
    for i, name in ((2, "H"), (3, "W")):
        m.graph.input[0].type.tensor_type.shape.dim[i].dim_param = name
    g = from_onnx(m, symbolic=True, dynamic_bounds={"H": (32, 1024), "W": (32, 1024)})
    conv = next(n for n in g.nodes if n.op == "Conv")
    assert str(conv.outputs[0].type) == "float32[1, 32, (H+1)//2, (W+1)//2]"
    assert str(g.outputs[0].type) == "float32[1, 1000]"
