"""Softmax and LogSoftmax on the rows template against numpy, at row lengths around the vector width (tails of
every size, a single element, rows of several accumulator vectors), with masked scores (-1e4, -inf) and huge
logits, for every config of the template's knobs, and fused after a scaled, masked score product
(onnxruntime)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import ember
from ember.tune import Task

TARGET = "c -threads=1"


def np_softmax(x: np.ndarray, log: bool = False) -> np.ndarray:
    x = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        s = x - x.max(-1, keepdims=True)
        e = np.exp(s)
        return s - np.log(e.sum(-1, keepdims=True)) if log else e / e.sum(-1, keepdims=True)


def inputs(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Random logits with masked entries (-1e4, -inf, below ln FLT_MIN after the shift) and a few large ones."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    flat = x.reshape(-1, shape[-1])
    for r, row in enumerate(flat):
        if shape[-1] > 2:
            row[rng.integers(shape[-1])] = [-1e4, -np.inf, -95.0][r % 3]
        if r % 5 == 4:
            row[rng.integers(shape[-1])] = 80.0
    return x


def check(op: str, shape: tuple[int, ...], seed: int = 0, knobs: bool = False) -> None:
    """The default schedule, or (knobs) the least and the most of the rows template's knobs too."""
    task = Task.from_op(op, [shape], {"axis": -1}, target=TARGET)
    x = inputs(shape, seed)
    want = np_softmax(x, log=op == "LogSoftmax")
    space = task.space
    for cfg in [None, space.get(0), space.get(len(space) - 1)] if knobs else [None]:
        sch, args = task.instantiate(cfg)
        f = ember.build(sch, args, target=TARGET)
        y = np.zeros(shape, np.float32)
        f(x, y)
        ok = np.isfinite(want)
        assert np.array_equal(np.isfinite(y), ok), (op, shape, str(cfg))
        np.testing.assert_allclose(y[ok], want[ok], rtol=2e-6, atol=2e-6 * max(1.0, np.abs(want[ok]).max()),
                                   err_msg=f"{op} {shape} {cfg}")  # fmt: skip


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("n", [1, 5, 16, 17, 31, 128, 197])
def test_rows_against_numpy(op, n):
    check(op, (3, 4, n), seed=n)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_knobs_keep_the_result(op):
    """row_acc (vectors of partial results) and row_unroll at their extremes, on rows of 12 vectors and a tail."""
    check(op, (2, 3, 197), seed=3, knobs=True)


def test_exp_of_masked_rows_is_zero_and_nan_makes_the_row_nan():
    """exp of a -inf score is 0 (not NaN); a NaN logit makes its row NaN (numpy's answer), the others unharmed."""
    task = Task.from_op("Softmax", [(3, 40)], {"axis": -1}, target=TARGET)
    sch, args = task.instantiate(None)
    f = ember.build(sch, args, target=TARGET)
    x = np.random.default_rng(1).standard_normal((3, 40)).astype(np.float32)
    x[0, ::2] = -np.inf
    x[1, 7] = np.nan
    y = np.zeros_like(x)
    f(x, y)
    assert np.all(y[0, ::2] == 0) and np.all(np.isnan(y[1]))
    np.testing.assert_allclose(y[[0, 2]], np_softmax(x)[[0, 2]], rtol=2e-6, atol=1e-7)


def test_scaled_masked_scores_then_softmax_match_onnxruntime():
    """An attention head's probabilities: (Q K^T) * scale + mask, then Softmax, as a model."""
    ort = pytest.importorskip("onnxruntime", reason="the reference of the fused model")
    b, h, s, d = 1, 2, 37, 16
    q = helper.make_tensor_value_info("q", TensorProto.FLOAT, [b, h, s, d])
    k = helper.make_tensor_value_info("k", TensorProto.FLOAT, [b, h, d, s])
    m = helper.make_tensor_value_info("m", TensorProto.FLOAT, [b, 1, 1, s])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [b, h, s, s])
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [], [d**-0.5])
    nodes = [helper.make_node("MatMul", ["q", "k"], ["qk"]), helper.make_node("Mul", ["qk", "scale"], ["t"]),
             helper.make_node("Add", ["t", "m"], ["u"]),
             helper.make_node("Softmax", ["u"], ["y"], axis=-1)]  # fmt: skip
    model = helper.make_model(helper.make_graph(nodes, "attn", [q, k, m], [y], [scale]),
                              opset_imports=[helper.make_opsetid("", 17)])  # fmt: skip
    rng = np.random.default_rng(2)
    feeds = {"q": rng.standard_normal((b, h, s, d)).astype(np.float32),
             "k": rng.standard_normal((b, h, d, s)).astype(np.float32),
             "m": np.where(rng.random((b, 1, 1, s)) < 0.3, -1e4, 0.0).astype(np.float32)}  # fmt: skip
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = ember.compile(model, target=TARGET, fallback=False).run(feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
