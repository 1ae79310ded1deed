"""GELU's erf on float32 is a rational function in vector arithmetic (`ember.ops.elemwise.rational_erf`): checked
against erf in float64 and against onnxruntime, over the whole range (the clamp at +-4, the tails, 0, inf, NaN),
as the Gelu op and as the Div/Erf/Add/Mul/Mul pattern exported models carry, fused after a matrix product."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import ember

ort = pytest.importorskip("onnxruntime", reason="GELU is checked against onnxruntime")
F = onnx.TensorProto.FLOAT


def exact_gelu(x: np.ndarray) -> np.ndarray:
    xd = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        return 0.5 * xd * (1.0 + np.vectorize(math.erf, otypes=[np.float64])(xd / math.sqrt(2.0)))


def inputs(n: int = 4000) -> np.ndarray:
    grid = np.linspace(-12.0, 12.0, n, dtype=np.float32)
    return np.concatenate([grid, np.float32([0.0, -0.0, 4.0 * math.sqrt(2), -4.0 * math.sqrt(2), np.inf, np.nan])])


def model(nodes: list, shape: list[int], inits: list | None = None, opset: int = 20) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "gelu", [helper.make_tensor_value_info("x", F, shape)],
                              [helper.make_tensor_value_info("y", F, shape)], inits or [])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_gelu_op_against_float64_and_onnxruntime():
    x = inputs()
    m = model([helper.make_node("Gelu", ["x"], ["y"])], [x.size])
    got = ember.compile(m, fallback=False)(x)
    want = exact_gelu(x)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)  # inf stays inf, NaN stays NaN
    theirs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, theirs, rtol=1e-5, atol=2e-6)


def test_exported_erf_pattern_after_a_matmul():
    """x @ w, then 0.5 * z * (1 + erf(z / sqrt 2)) as torch.onnx writes it: one kernel with the product."""
    rng = np.random.default_rng(0)
    consts = {"w": rng.standard_normal((24, 40)).astype(np.float32), "sq": np.float32(math.sqrt(2)),
              "one": np.float32(1.0), "half": np.float32(0.5)}  # fmt: skip
    nodes = [helper.make_node("MatMul", ["x", "w"], ["z"]), helper.make_node("Div", ["z", "sq"], ["d"]),
             helper.make_node("Erf", ["d"], ["e"]), helper.make_node("Add", ["e", "one"], ["p"]),
             helper.make_node("Mul", ["z", "p"], ["q"]), helper.make_node("Mul", ["q", "half"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "ffn", [helper.make_tensor_value_info("x", F, [33, 24])],
                              [helper.make_tensor_value_info("y", F, [33, 40])],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])  # fmt: skip
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    compiled = ember.compile(m, fallback=False)
    assert compiled.summary()["kernels"] == 1
    x = rng.standard_normal((33, 24)).astype(np.float32)
    theirs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(compiled(x), theirs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(compiled(x), exact_gelu(x.astype(np.float64) @ consts["w"]), rtol=1e-5, atol=1e-5)
