"""Transposes fused with the elementwise ops after them (convnext's NHWC -> NCHW, layer scale, residual add; an
attention output's head merge) are copied in tiles like a lone transpose: checked against onnxruntime on random
inputs, with tile-sized, odd (a guarded tail) and symbolic extents, at 1 and 2 threads."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import ember

ort = pytest.importorskip("onnxruntime", reason="the fused transposes are checked against onnxruntime")


def back_transpose(h: int | str, w: int, c: int) -> onnx.ModelProto:
    """x [h*w, c] -> reshape [1, h, w, c] -> NCHW, times a per-channel scale, plus a residual (symbolic h: x is
    [1, h, w, c] already)."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 3, 1, 2]),
             helper.make_node("Mul", ["t", "gamma"], ["m"]),
             helper.make_node("Add", ["m", "res"], ["y"])]  # fmt: skip
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(np.array([1, -1, w, c], np.int64), "shape"),
             numpy_helper.from_array(rng.standard_normal((c, 1, 1)).astype(np.float32), "gamma")]  # fmt: skip
    x_shape = [h * w, c] if isinstance(h, int) else [1, h, w, c]
    f = onnx.TensorProto.FLOAT
    graph = helper.make_graph(nodes, "back", [helper.make_tensor_value_info("x", f, x_shape),
                                              helper.make_tensor_value_info("res", f, [1, c, h, w])],
                              [helper.make_tensor_value_info("y", f, [1, c, h, w])], inits)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def head_merge(b: int, heads: int, s: int, d: int) -> onnx.ModelProto:
    """x [b, heads, s, d] -> [b, s, heads, d] plus a bias over d, then [b, s, heads * d]."""
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Add", ["t", "bias"], ["a"]),
             helper.make_node("Reshape", ["a", "shape"], ["y"])]  # fmt: skip
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.standard_normal(d).astype(np.float32), "bias"),
             numpy_helper.from_array(np.array([b, s, heads * d], np.int64), "shape")]  # fmt: skip
    f = onnx.TensorProto.FLOAT
    graph = helper.make_graph(nodes, "merge", [helper.make_tensor_value_info("x", f, [b, heads, s, d])],
                              [helper.make_tensor_value_info("y", f, [b, s, heads * d])], inits)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], threads: int) -> ember.runtime.model.Model:
    m = ember.compile(model, target=f"c -threads={threads}", fallback=False)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = m.run(feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    return m


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("h,w,c", [(8, 8, 32), (5, 5, 48), (7, 9, 33), (20, 20, 96)])
def test_back_transpose_scale_residual(h: int, w: int, c: int, threads: int):
    rng = np.random.default_rng(h * 100 + c)
    feeds = {"x": rng.standard_normal((h * w, c)).astype(np.float32),
             "res": rng.standard_normal((1, c, h, w)).astype(np.float32)}  # fmt: skip
    m = check(back_transpose(h, w, c), feeds, threads)
    if h * w * c >= 1024:  # tiled: plain loads and stores, no per-lane gather/scatter with division per element
        assert "gather" not in m.source and "scatter" not in m.source


def test_back_transpose_symbolic_rows():
    model = back_transpose("h", 6, 40)
    m = ember.compile(model, target="c -threads=1", fallback=False)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for h in (3, 11):
        rng = np.random.default_rng(h)
        feeds = {"x": rng.standard_normal((1, h, 6, 40)).astype(np.float32),
                 "res": rng.standard_normal((1, 40, h, 6)).astype(np.float32)}  # fmt: skip
        np.testing.assert_allclose(m.run(feeds)["y"], session.run(None, feeds)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("b,heads,s,d", [(1, 4, 16, 32), (2, 3, 10, 24)])
def test_head_merge_with_bias(b: int, heads: int, s: int, d: int):
    x = np.random.default_rng(s).standard_normal((b, heads, s, d)).astype(np.float32)
    check(head_merge(b, heads, s, d), {"x": x}, 1)
