"""Sequences of tensors whose length and positions are known at import time (SplitToSequence read back by
SequenceAt: torch.onnx's export of split / chunk / unbind), against onnxruntime on fresh random inputs; a sequence
where a tensor must be (a graph output) is refused by name, and so is an invalid Tile the same exporter writes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import ember
from ember.frontend.onnx import ModelError

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the reference")


def ints(name: str, v) -> helper.NodeProto:
    shape = [] if np.ndim(v) == 0 else [len(v)]
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, shape,
                                                                              np.atleast_1d(v).tolist()))  # fmt: skip


def test_sequences_resolved_at_import_match_onnxruntime():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 7, 3])
    names = ("last_chunk", "relu_part", "stacked", "reinserted", "pair")
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names]
    outs.append(helper.make_tensor_value_info("length", TensorProto.INT64, None))
    nodes = [ints("three", 3), ints("sizes", [2, 4, 1]), ints("one", 1), ints("minus_one", -1), ints("zero", 0),
             helper.make_node("SplitToSequence", ["x", "three"], ["chunks"], axis=1),  # 3, 3, 1 (the last shorter)
             helper.make_node("SplitToSequence", ["x", "sizes"], ["parts"], axis=1),
             helper.make_node("SplitToSequence", ["x"], ["columns"], axis=2, keepdims=0),  # three (2, 7)
             helper.make_node("SequenceAt", ["chunks", "minus_one"], ["last_chunk"]),
             helper.make_node("SequenceAt", ["parts", "one"], ["part"]),
             helper.make_node("Relu", ["part"], ["relu_part"]),
             helper.make_node("ConcatFromSequence", ["columns"], ["stacked"], axis=-1, new_axis=1),
             helper.make_node("SequenceInsert", ["parts", "last_chunk", "zero"], ["inserted"]),
             helper.make_node("SequenceErase", ["inserted", "minus_one"], ["erased"]),
             helper.make_node("ConcatFromSequence", ["erased"], ["reinserted"], axis=1),
             helper.make_node("SequenceConstruct", ["last_chunk", "relu_part"], ["built"]),
             helper.make_node("ConcatFromSequence", ["built"], ["pair"], axis=1),
             helper.make_node("SequenceLength", ["erased"], ["length"])]  # fmt: skip
    model = helper.make_model(helper.make_graph(nodes, "sequences", [x], outs),
                              opset_imports=[helper.make_opsetid("", 17)])  # fmt: skip
    xv = np.random.default_rng(0).standard_normal((2, 7, 3)).astype("float32")
    refs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": xv})
    ours = ember.compile(model)(xv)
    for name, a, b in zip((*names, "length"), ours, refs, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        np.testing.assert_array_equal(a, b, err_msg=name)  # (moves elements only)


def test_sequence_output_is_refused():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 7, 3])
    seq = helper.make_value_info("s", helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT,
                                                                                                    None)))  # fmt: skip
    model = helper.make_model(helper.make_graph([helper.make_node("SplitToSequence", ["x"], ["s"], axis=1)], "g",
                                                [x], [seq]), opset_imports=[helper.make_opsetid("", 17)])  # fmt: skip
    with pytest.raises(ModelError, match="output 's' .* is a sequence"):
        ember.compile(model)


def test_tile_repeats_must_be_one_dimensional():
    """A (1, 1) repeats tensor is invalid ONNX (onnxruntime refuses it too), not a vector to flatten."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    reps = helper.make_tensor("reps", TensorProto.INT64, [1, 1], [2])
    model = helper.make_model(helper.make_graph([helper.make_node("Tile", ["x", "reps"], ["y"])], "g", [x], [y],
                                                [reps]), opset_imports=[helper.make_opsetid("", 17)])  # fmt: skip
    with pytest.raises(ModelError, match="repeats must be a 1-D tensor"):
        ember.compile(model)
