"""Graph IR: construction, printer, verifier, topological sort, copy, evaluator input checks."""

import numpy as np
import pytest

from ember.graph import Graph, Node, TensorType, Value
from ember.graph.verify import GraphError
from ember.ops.evaluate import InputError, evaluate
from ember.ops.verify import verify


def f32(*shape):
    return TensorType(shape, "float32")


def small_graph() -> Graph:
    x = Value("x", f32(1, 3, 8, 8))
    w = Value.constant("w", np.ones((4, 3, 3, 3), np.float32))
    b = Value.constant("b", np.zeros(4, np.float32))
    conv = Value("conv", f32(1, 4, 8, 8))
    relu = Value("relu", f32(1, 4, 8, 8))
    nodes = [
        Node("Conv", [x, w, b], [conv], {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1), "group": 1}),
        Node("Relu", [conv], [relu]),
    ]
    return Graph("small", [x], [relu], nodes)


def test_tensor_type_checks_and_prints():
    assert str(f32(1, 64, 56, 56)) == "float32[1, 64, 56, 56]"
    assert TensorType.of(np.zeros((2, 3), np.int64)) == TensorType((2, 3), "int64")
    assert f32(2, 3).size == 6 and f32().size == 1
    with pytest.raises(TypeError, match="unsupported dtype"):
        TensorType((1,), "complex64")
    with pytest.raises(TypeError, match="non-negative"):
        TensorType((-1,), "float32")


def test_printer_shows_ops_attrs_types_and_constants_by_type():
    text = str(small_graph())
    assert "graph small(%x: float32[1, 3, 8, 8]) {" in text
    assert "%conv = Conv(%x, %w, %b) {strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1], group=1} " \
           ": float32[1, 4, 8, 8]" in text  # fmt: skip
    assert "%w = constant : float32[4, 3, 3, 3]" in text
    assert "1.0, 1.0" not in text  # big constants print by type, not data
    assert "return %relu" in text


def test_absent_optional_input_prints_as_underscore():
    x = Value("x", f32(3))
    y = Value("y", f32(3))
    g = Graph("g", [x], [y], [Node("Clip", [x, None, Value.constant("hi", np.float32(1))], [y])])
    assert "Clip(%x, _, %hi)" in str(g)
    verify(g)


def test_verify_accepts_a_good_graph_and_evaluates():
    g = small_graph()
    verify(g)
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    (y,) = evaluate(g, {"x": x}).values()
    assert y.shape == (1, 4, 8, 8) and (y >= 0).all()


def test_verify_reports_use_before_definition_and_bad_types():
    g = small_graph()
    g.nodes.reverse()
    with pytest.raises(GraphError, match="'relu' \\(Relu\\): input 0 %conv is used before it is defined"):
        verify(g)
    g = small_graph()
    g.nodes[1].outputs[0].type = f32(1, 4, 8, 9)
    with pytest.raises(GraphError, match=r"typed float32\[1, 4, 8, 9\] but the shape rule gives float32\[1, 4, 8, 8\]"):
        verify(g)


def test_verify_reports_duplicate_names_and_unknown_ops():
    g = small_graph()
    g.nodes[1].outputs[0].name = "conv"
    g.nodes[0].op = "Convolution"
    with pytest.raises(GraphError) as info:
        verify(g)
    assert "value name %conv is defined twice" in str(info.value)
    assert "no operator 'Convolution'" in str(info.value)


def test_topo_sort_restores_order_and_copy_is_deep():
    g = small_graph()
    g.nodes.reverse()
    g.topo_sort()
    assert [n.op for n in g.nodes] == ["Conv", "Relu"]
    h = g.copy()
    h.nodes[0].attrs["group"] = 2
    h.nodes[1].outputs[0].name = "renamed"
    assert g.nodes[0].attrs["group"] == 1 and g.outputs[0].name == "relu"
    assert h.outputs[0] is h.nodes[1].outputs[0]
    assert h.nodes[0].inputs[1].data is g.nodes[0].inputs[1].data  # constant data is shared


def test_producers_consumers_and_fresh_names():
    g = small_graph()
    conv, relu = g.nodes
    assert g.producers()[relu.outputs[0]] is relu
    assert g.consumers()[conv.outputs[0]] == [relu]
    assert [c.name for c in g.constants()] == ["w", "b"]
    assert g.fresh_name("conv") == "conv_1" and g.fresh_name("new") == "new"


def test_evaluate_validates_inputs():
    g = small_graph()
    good = np.zeros((1, 3, 8, 8), np.float32)
    with pytest.raises(InputError, match="missing input\\(s\\) 'x'"):
        evaluate(g, {})
    with pytest.raises(InputError, match="unknown input\\(s\\) 'y'"):
        evaluate(g, {"x": good, "y": good})
    with pytest.raises(InputError, match="'x' has shape \\[1, 3, 8, 9\\], expected \\[1, 3, 8, 8\\]"):
        evaluate(g, {"x": np.zeros((1, 3, 8, 9), np.float32)})
    with pytest.raises(InputError, match="'x' has dtype float64, expected float32"):
        evaluate(g, {"x": good.astype(np.float64)})


def test_evaluate_keep_all_returns_intermediates():
    out = evaluate(small_graph(), {"x": np.ones((1, 3, 8, 8), np.float32)}, keep_all=True)
    assert set(out) == {"x", "conv", "relu"}


def test_infer_types_recomputes_after_a_rewrite():
    from ember.ops.infer import infer_types

    g = small_graph()
    g.inputs[0].type = f32(2, 3, 10, 10)
    infer_types(g)
    assert g.outputs[0].type == f32(2, 4, 10, 10)
    verify(g)
    g.inputs[0].type = f32(2, 5, 10, 10)
    with pytest.raises(GraphError, match="'conv' \\(Conv\\): ShapeError: Conv weight"):
        infer_types(g)
