"""If / Loop / Scan: kept as nodes with subgraphs when types are static, inlined or unrolled
at import when their controls are constant; compared with onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.frontend.onnx import from_onnx
from ember.ops.evaluate import evaluate
from ember.ops.verify import verify

ort = pytest.importorskip("onnxruntime")
F = TensorProto.FLOAT


def run_both(model: onnx.ModelProto, feeds: dict) -> tuple[list, list, object]:
    onnx.checker.check_model(model)
    graph = from_onnx(model)
    ours = list(evaluate(graph, feeds).values())
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return ours, sess.run(None, feeds), graph


def if_model(cond_is_input: bool) -> onnx.ModelProto:
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", F, [3])],
                               [numpy_helper.from_array(np.float32([2, 2, 2]), "two")])  # fmt: skip
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", F, [3])])  # fmt: skip
    node = helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)
    inputs = [helper.make_tensor_value_info("x", F, [3])]
    inits = []
    if cond_is_input:
        inputs.append(helper.make_tensor_value_info("c", TensorProto.BOOL, []))
    else:
        inits.append(numpy_helper.from_array(np.array(True), "c"))
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", F, [3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_if_with_a_runtime_condition_keeps_both_branches():
    x = np.float32([1, -2, 3])
    for c in (True, False):
        ours, theirs, graph = run_both(if_model(True), {"x": x, "c": np.array(c)})
        np.testing.assert_allclose(ours[0], theirs[0])
    assert [n.op for n in graph.nodes] == ["If"] and graph.nodes[0].inputs[1].name == "x"  # the capture
    assert "then_branch:" in str(graph)
    verify(graph)


def test_if_with_a_constant_condition_is_inlined():
    ours, theirs, graph = run_both(if_model(False), {"x": np.float32([1, -2, 3])})
    np.testing.assert_allclose(ours[0], theirs[0])
    assert [n.op for n in graph.nodes] == ["Mul", "Identity"]


def loop_model(dynamic_body: bool) -> onnx.ModelProto:
    """y <- y + x (or + x[i:i+1] broadcast, a Slice that needs the iteration number) three times,
    also stacking y per iteration."""
    body_nodes = [helper.make_node("Identity", ["cond_in"], ["cond_out"])]
    if dynamic_body:
        body_nodes += [
            helper.make_node("Unsqueeze", ["i", "zero"], ["start"]),
            helper.make_node("Add", ["start", "one"], ["end"]),
            helper.make_node("Slice", ["x", "start", "end"], ["piece"]),
            helper.make_node("Add", ["y_in", "piece"], ["y_out"]),
        ]
    else:
        body_nodes.append(helper.make_node("Add", ["y_in", "x"], ["y_out"]))
    body_nodes.append(helper.make_node("Identity", ["y_out"], ["scan"]))
    vi = helper.make_tensor_value_info
    body = helper.make_graph(
        body_nodes, "body",
        [vi("i", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []), vi("y_in", F, [4])],
        [vi("cond_out", TensorProto.BOOL, []), vi("y_out", F, [4]), vi("scan", F, [4])],
        [numpy_helper.from_array(np.array([k], np.int64), name) for k, name in ((0, "zero"), (1, "one"))],
    )  # fmt: skip
    node = helper.make_node("Loop", ["trips", "cond", "y0"], ["y", "ys"], body=body)
    inits = [numpy_helper.from_array(np.array(3, np.int64), "trips"), numpy_helper.from_array(np.array(True), "cond")]
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", F, [4]), helper.make_tensor_value_info("y0", F, [4])],
        [helper.make_tensor_value_info("y", F, [4]), helper.make_tensor_value_info("ys", F, [3, 4])], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("dynamic_body", [False, True], ids=["static-body", "unrolled"])
def test_loop_matches_onnxruntime(dynamic_body: bool):
    feeds = {"x": np.float32([1, 2, 3, 4]), "y0": np.float32([0, 1, 0, 1])}
    ours, theirs, graph = run_both(loop_model(dynamic_body), feeds)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b)
    verify(graph)  # unrolled iterations got distinct value names
    assert ("Loop" in {n.op for n in graph.nodes}) != dynamic_body


def test_scan_cumulative_sum_matches_onnxruntime():
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]), helper.make_node("Identity", ["s_out"], ["y_t"])],
        "body", [helper.make_tensor_value_info("s_in", F, [2]), helper.make_tensor_value_info("x_t", F, [2])],
        [helper.make_tensor_value_info("s_out", F, [2]), helper.make_tensor_value_info("y_t", F, [2])],
    )  # fmt: skip
    node = helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1,
                            scan_input_directions=[1])  # fmt: skip
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("s0", F, [2]), helper.make_tensor_value_info("xs", F, [5, 2])],
        [helper.make_tensor_value_info("s", F, [2]), helper.make_tensor_value_info("ys", F, [5, 2])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"s0": np.float32([0, 1]), "xs": np.arange(10, dtype=np.float32).reshape(5, 2)}
    ours, theirs, graph = run_both(model, feeds)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b)
    assert [n.op for n in graph.nodes] == ["Scan"]


def test_scan_8_with_a_batch_axis_matches_onnxruntime():
    """Scan before opset 9: states [B, ...] and scan inputs [B, T, ...]; one Scan per batch item, restacked."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]), helper.make_node("Mul", ["s_out", "x_t"], ["y_t"])],
        "body", [helper.make_tensor_value_info("s_in", F, [2]), helper.make_tensor_value_info("x_t", F, [2])],
        [helper.make_tensor_value_info("s_out", F, [2]), helper.make_tensor_value_info("y_t", F, [2])],
    )  # fmt: skip
    node = helper.make_node("Scan", ["", "s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1, directions=[1])
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("s0", F, [3, 2]), helper.make_tensor_value_info("xs", F, [3, 4, 2])],
        [helper.make_tensor_value_info("s", F, [3, 2]), helper.make_tensor_value_info("ys", F, [3, 4, 2])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)])
    rng = np.random.default_rng(0)
    feeds = {"s0": rng.standard_normal((3, 2)).astype(np.float32),
             "xs": rng.standard_normal((3, 4, 2)).astype(np.float32)}
    ours, theirs, _ = run_both(model, feeds)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    compiled = ember.compile(model).run(feeds)
    for a, b in zip(compiled.values(), theirs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)
