"""Whole models built with onnx.helper and random weights: import, run the numpy reference
evaluator, compare with onnxruntime on random inputs (float32, rtol 1e-4)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ember.frontend.onnx import from_onnx
from ember.ops.evaluate import evaluate
from ember.zoo import BLOCKS, Builder, random_feeds, resnet_basic_block, transformer_encoder_layer

ort = pytest.importorskip("onnxruntime")
RTOL, ATOL = 1e-4, 1e-5  # atol covers outputs near zero, where relative error is meaningless


def resnet_stem_and_downsample() -> tuple[onnx.ModelProto, dict]:
    """torchvision ResNet layout at small scale: 7x7/2 stem, max pool, a strided block with a
    1x1 projection shortcut, global average pool, flatten, linear."""
    b = Builder(6)
    y = b.conv_bn_relu("x", 3, 16, k=7, stride=2)
    y = b.op("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    main = b.conv_bn_relu(b.conv_bn_relu(y, 16, 32, stride=2), 32, 32, relu=None)
    short = b.conv_bn_relu(y, 16, 32, k=1, stride=2, relu=None)
    y = b.op("Relu", [b.op("Add", [main, short])])
    y = b.op("Flatten", [b.op("GlobalAveragePool", [y])], axis=1)
    y = b.op("Gemm", [y, b.weight((10, 32)), b.weight((10,))], transB=1)
    return b.model({"x": (2, 3, 64, 64)}, y)


MODELS = {**BLOCKS, "resnet_stem_and_downsample": resnet_stem_and_downsample}


def run_ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@pytest.mark.parametrize("name", list(MODELS))
def test_model_matches_onnxruntime(name: str):
    model = MODELS[name]()
    graph = from_onnx(model)
    for seed in range(2):
        feeds = random_feeds(model, seed)
        ours = list(evaluate(graph, feeds).values())
        theirs = run_ort(model, feeds)
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def test_exporter_shape_arithmetic_folds_to_static_shapes():
    model = transformer_encoder_layer()
    graph = from_onnx(model)
    ops = {n.op for n in graph.nodes}
    assert not ops & {"Shape", "Gather", "Concat"}  # folded into the Reshape targets
    targets = [n.attrs["shape"] for n in graph.nodes if n.op == "Reshape"]
    assert targets.count((2, 8, 4, 8)) == 3 and (2, 8, 32) in targets


def test_printed_graph_is_readable():
    model = resnet_basic_block()
    text = str(from_onnx(model))
    assert "= Conv(%x, %w1) {strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1], group=1} : float32[1, 16, 14, 14]" \
        in text  # fmt: skip
    assert "constant : float32[16, 16, 3, 3]" in text


def bert_like_export(vocab: int = 50, d: int = 16) -> onnx.ModelProto:
    """The patterns a PyTorch BERT export has: symbolic batch/sequence dims, int64 token ids,
    embedding Gathers, position ids from Shape -> Range -> Expand, an extended attention
    mask (Unsqueeze, Cast, 1 - m, * float32 min), Erf GELU, LayerNormalization."""
    b = Builder(7)
    i64 = lambda *v: b.const(np.array(v, np.int64), "i")  # noqa: E731
    shape = b.op("Shape", ["input_ids"])
    seq = b.op("Gather", [shape, b.const(np.array(1, np.int64))], axis=0)
    pos = b.op("Range", [b.const(np.array(0, np.int64)), seq, b.const(np.array(1, np.int64))])
    pos = b.op("Expand", [b.op("Unsqueeze", [pos, i64(0)]), shape])
    words = b.op("Gather", [b.weight((vocab, d), 1.0), "input_ids"])
    emb = b.op("Add", [words, b.op("Gather", [b.weight((32, d)), pos])])
    h = b.op("LayerNormalization", [emb, b.weight((d,), positive=True), b.weight((d,))], epsilon=1e-12)
    mask = b.op("Cast", [b.op("Unsqueeze", ["attention_mask", i64(1, 2)])], to=TensorProto.FLOAT)
    lowest = b.const(np.float32(np.finfo(np.float32).min))
    mask = b.op("Mul", [b.op("Sub", [b.const(np.float32(1)), mask]), lowest])
    scores = b.op("Div", [b.op("MatMul", [h, b.op("Transpose", [h], perm=[0, 2, 1])]), b.const(np.float32(4))])
    probs = b.op("Softmax", [b.op("Add", [scores, b.op("Squeeze", [mask, i64(1)])])], axis=-1)
    ctx = b.op("MatMul", [probs, h])
    erf = b.op("Erf", [b.op("Div", [ctx, b.const(np.float32(1.4142135))])])
    gelu = b.op("Mul", [b.op("Mul", [ctx, b.op("Add", [erf, b.const(np.float32(1))])]), b.const(np.float32(0.5))])
    ins = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
           for n in ("input_ids", "attention_mask")]  # fmt: skip
    out = helper.make_tensor_value_info(gelu, TensorProto.FLOAT, ["batch", "sequence", d])
    model = helper.make_model(helper.make_graph(b.nodes, "bert", ins, [out], b.inits),
                              opset_imports=[helper.make_opsetid("", 17)])  # fmt: skip
    onnx.checker.check_model(model)
    return model


def test_bert_like_export_with_symbolic_dims():
    model = bert_like_export()
    shapes = {"input_ids": (2, 7), "attention_mask": (2, 7)}
    graph = from_onnx(model, shapes)
    assert not {n.op for n in graph.nodes} & {"Shape", "Range", "Expand"}  # position ids folded
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 50, (2, 7)).astype(np.int64)
    mask = np.ones((2, 7), np.int64)
    mask[1, 5:] = 0
    feeds = {"input_ids": ids, "attention_mask": mask}
    (ours,) = evaluate(graph, feeds).values()
    (theirs,) = run_ort(model, feeds)
    np.testing.assert_allclose(ours, theirs, rtol=RTOL, atol=ATOL)


def test_external_data_loads_from_the_model_directory(tmp_path):
    model = resnet_basic_block()
    x = random_feeds(model, 1)["x"]
    (expected,) = run_ort(model, {"x": x})
    path = tmp_path / "block.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="block.weights", size_threshold=0)
    assert (tmp_path / "block.weights").stat().st_size > 0
    graph = from_onnx(path)
    (ours,) = evaluate(graph, {"x": x}).values()
    np.testing.assert_allclose(ours, expected, rtol=RTOL, atol=ATOL)
