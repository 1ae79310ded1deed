"""TopK and CumSum/CumProd compiled natively (search formulations) vs onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ember

ort = pytest.importorskip("onnxruntime")


def single(op: str, x: np.ndarray, extra: dict, n_out: int = 1, **attrs):
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))]
    inits = [helper.make_tensor(k, TensorProto.INT64, list(v.shape), v.ravel().tolist()) for k, v in extra.items()]
    outs = [helper.make_tensor_value_info(f"y{i}", TensorProto.UNDEFINED, None) for i in range(n_out)]
    node = helper.make_node(op, ["x", *extra], [o.name for o in outs], **attrs)
    graph = helper.make_graph([node], "g", ins, outs, inits)
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    m = ember.compile(model, fallback=False)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    return list(m.run({"x": x}).values()), ref


@pytest.mark.parametrize("largest,axis", [(1, -1), (0, 1), (1, 0)])
def test_topk_values_and_indices_with_ties(largest, axis):
    rng = np.random.default_rng(0)
    x = rng.integers(-3, 4, (5, 9, 4)).astype(np.float32)  # many ties: ONNX keeps the lower index first
    ours, ref = single("TopK", x, {"k": np.array([3])}, 2, largest=largest, axis=axis)
    np.testing.assert_array_equal(ours[0], ref[0])
    np.testing.assert_array_equal(ours[1], ref[1])


@pytest.mark.parametrize("op", ["CumSum"])
@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum_modes(op, exclusive, reverse):
    x = np.random.default_rng(1).standard_normal((3, 7, 5)).astype(np.float32)
    ours, ref = single(op, x, {"axis": np.array(1)}, exclusive=exclusive, reverse=reverse)
    np.testing.assert_allclose(ours[0], ref[0], rtol=1e-5, atol=1e-6)
