"""Pooling kept in the blocked layout inside models (PoolNCHWc made by `ember.passes.layout`): ceil_mode,
padding and dilation after a convolution, as in SqueezeNet's fire modules; compiled outputs against
onnxruntime on fresh random inputs (pooling selects or averages exactly: the tolerance is the conv's)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.frontend.onnx import from_onnx
from ember.passes import run_passes

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the reference")

POOLS = [  # op, attrs (input: [2, 32, 13, 15] after a 1x1 conv)
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),  # SqueezeNet
    ("MaxPool", {"kernel_shape": [2, 2], "strides": [1, 2], "dilations": [2, 2], "pads": [1, 0, 1, 1]}),
    ("MaxPool", {"kernel_shape": [3, 2], "strides": [2, 2], "dilations": [2, 1], "ceil_mode": 1}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 1, 1, 0], "count_include_pad": 1}),
]


def conv_pool_model(op: str, attrs: dict, seed: int, out_shape=("n", "c", "h", "w")):
    """1x1 conv, relu, the pool; out_shape: the output's declared dims (symbolic until onnxruntime gave them)."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((32, 16, 1, 1)) / 4).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node(op, ["r"], ["y"], **attrs)]  # fmt: skip
    g = helper.make_graph(nodes, "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16, 13, 15])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))],
                          [numpy_helper.from_array(w, "w")])  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])


@pytest.mark.parametrize("op, attrs", POOLS, ids=[f"{p[0]}-{i}" for i, p in enumerate(POOLS)])
def test_pool_stays_blocked_and_matches_onnxruntime(monkeypatch, op, attrs):
    monkeypatch.setattr("ember.passes.layout.MIN_MACS", 0)  # the small conv starts a blocked region
    feeds = {"x": np.random.default_rng(7).standard_normal((2, 16, 13, 15)).astype(np.float32)}
    model = conv_pool_model(op, attrs, seed=len(attrs))
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    model = conv_pool_model(op, attrs, seed=len(attrs), out_shape=ref.shape)
    g, _ = run_passes(from_onnx(model), opt_level=3, disabled=["fuse_ops"], verify=True)
    ops = Counter(n.op for n in g.nodes)
    assert ops["PoolNCHWc"] == 1 and ops[op] == 0
    got = ember.compile(model, fallback=False).run(feeds)["y"]
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))
