"""Whole models built with onnx.helper and random weights: import, run the numpy reference
evaluator, compare with onnxruntime on random inputs (float32, rtol 1e-4)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ember.frontend.onnx import from_onnx
from ember.graph.evaluate import evaluate

ort = pytest.importorskip("onnxruntime")
RTOL, ATOL = 1e-4, 1e-5  # atol covers outputs near zero, where relative error is meaningless


class Builder:
    """A tiny helper over onnx.helper: nodes, random initializers, a model at opset 17."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, base: str) -> str:
        self.count += 1
        return f"{base}{self.count}"

    def weight(self, shape, scale: float = 0.1, base: str = "w", positive: bool = False) -> str:
        data = self.rng.standard_normal(shape).astype(np.float32) * scale
        if positive:
            data = np.abs(data) + 0.5
        return self.const(data, base)

    def const(self, data: np.ndarray, base: str = "c") -> str:
        n = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(data), n))
        return n

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, **attrs) -> str | list[str]:
        outs = [self.name(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=outs[0], **attrs))
        return outs[0] if n_out == 1 else outs

    def conv_bn_relu(self, x: str, cin: int, cout: int, k: int = 3, stride: int = 1, group: int = 1,
                     relu: str | None = "Relu") -> str:  # fmt: skip
        w = self.weight((cout, cin // group, k, k), scale=(2.0 / (cin // group * k * k)) ** 0.5)
        y = self.op("Conv", [x, w], kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4, group=group)
        bn = [self.weight((cout,), positive=True), self.weight((cout,)), self.weight((cout,)),
              self.weight((cout,), positive=True)]  # fmt: skip
        y = self.op("BatchNormalization", [y] + bn, epsilon=1e-5)
        if relu == "Relu":
            y = self.op("Relu", [y])
        elif relu == "Clip6":
            y = self.op("Clip", [y, self.const(np.float32(0)), self.const(np.float32(6))])
        return y

    def model(self, inputs: dict[str, tuple], output: str, opset: int = 17) -> onnx.ModelProto:
        ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs.items()]
        outs = [helper.make_tensor_value_info(output, TensorProto.UNDEFINED, None)]
        graph = helper.make_graph(self.nodes, "test", ins, outs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model = onnx.shape_inference.infer_shapes(model)  # types the output
        onnx.checker.check_model(model)
        return model


def resnet_basic_block() -> tuple[onnx.ModelProto, dict]:
    b = Builder(1)
    y = b.conv_bn_relu("x", 16, 16)
    y = b.conv_bn_relu(y, 16, 16, relu=None)
    y = b.op("Relu", [b.op("Add", [y, "x"])])
    return b.model({"x": (1, 16, 14, 14)}, y), {"x": (1, 16, 14, 14)}


def mobilenet_v2_inverted_residual() -> tuple[onnx.ModelProto, dict]:
    b = Builder(2)
    y = b.conv_bn_relu("x", 16, 96, k=1, relu="Clip6")  # expand
    y = b.conv_bn_relu(y, 96, 96, k=3, group=96, relu="Clip6")  # depthwise
    y = b.conv_bn_relu(y, 96, 16, k=1, relu=None)  # project
    y = b.op("Add", [y, "x"])
    return b.model({"x": (1, 16, 12, 12)}, y), {"x": (1, 16, 12, 12)}


def conv_bn_relu_stack() -> tuple[onnx.ModelProto, dict]:
    b = Builder(3)
    y, c = "x", 3
    for cout in (8, 16, 16, 32, 32):
        y, c = b.conv_bn_relu(y, c, cout, stride=2 if cout != c and c != 3 else 1), cout
    return b.model({"x": (2, 3, 16, 16)}, y), {"x": (2, 3, 16, 16)}


def mlp() -> tuple[onnx.ModelProto, dict]:
    b = Builder(4)
    y = b.op("Flatten", ["x"], axis=1)
    y = b.op("Relu", [b.op("Gemm", [y, b.weight((64, 48)), b.weight((64,))], transB=1)])
    y = b.op("Relu", [b.op("Add", [b.op("MatMul", [y, b.weight((64, 32))]), b.weight((32,))])])
    y = b.op("Softmax", [b.op("Gemm", [y, b.weight((32, 10)), b.weight((10,))])], axis=-1)
    return b.model({"x": (4, 3, 4, 4)}, y), {"x": (4, 3, 4, 4)}


def transformer_encoder_layer(seq: int = 8, d: int = 32, heads: int = 4, ff: int = 64) -> tuple[onnx.ModelProto, dict]:
    """Post-norm encoder layer as exporters write it: shapes computed with Shape/Gather/Concat."""
    b = Builder(5)
    dh = d // heads
    i64 = lambda *v: b.const(np.array(v, np.int64), "shape")  # noqa: E731

    def heads_split(t: str) -> str:  # [B, S, D] -> [B, H, S, Dh], target shape computed from Shape
        shape = b.op("Shape", [t])
        batch = b.op("Gather", [shape, b.const(np.array([0], np.int64))], axis=0)
        target = b.op("Concat", [batch, i64(-1, heads, dh)], axis=0)
        return b.op("Transpose", [b.op("Reshape", [t, target])], perm=[0, 2, 1, 3])

    def proj(t: str, din: int, dout: int) -> str:
        return b.op("Add", [b.op("MatMul", [t, b.weight((din, dout))]), b.weight((dout,))])

    def layer_norm(t: str) -> str:
        return b.op("LayerNormalization", [t, b.weight((d,), positive=True), b.weight((d,))], axis=-1, epsilon=1e-5)

    q, k, v = (heads_split(proj("x", d, d)) for _ in range(3))
    scores = b.op("Div", [b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])]),
                          b.const(np.float32(np.sqrt(dh)))])  # fmt: skip
    mask = b.op("Where", [b.const(np.tril(np.ones((seq, seq), bool))), b.const(np.float32(0)),
                          b.const(np.float32(-1e4))])  # fmt: skip
    attn = b.op("Softmax", [b.op("Add", [scores, mask])], axis=-1)
    ctx = b.op("Transpose", [b.op("MatMul", [attn, v])], perm=[0, 2, 1, 3])
    ctx = b.op("Reshape", [ctx, i64(0, 0, d)])
    h = layer_norm(b.op("Add", ["x", proj(ctx, d, d)]))
    f = proj(h, d, ff)
    gelu = b.op("Mul", [b.op("Mul", [f, b.op("Add", [b.op("Erf", [b.op("Div", [f, b.const(np.float32(np.sqrt(2)))])]),
                                                     b.const(np.float32(1))])]), b.const(np.float32(0.5))])  # fmt: skip
    out = layer_norm(b.op("Add", [h, proj(gelu, ff, d)]))
    return b.model({"x": (2, seq, d)}, out), {"x": (2, seq, d)}


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
    return b.model({"x": (2, 3, 64, 64)}, y), {"x": (2, 3, 64, 64)}


MODELS = {
    "resnet_stem_and_downsample": resnet_stem_and_downsample,
    "resnet_basic_block": resnet_basic_block,
    "mobilenet_v2_inverted_residual": mobilenet_v2_inverted_residual,
    "conv_bn_relu_x5": conv_bn_relu_stack,
    "mlp": mlp,
    "transformer_encoder_layer": transformer_encoder_layer,
}


def run_ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@pytest.mark.parametrize("name", list(MODELS))
def test_model_matches_onnxruntime(name: str):
    model, shapes = MODELS[name]()
    graph = from_onnx(model)
    rng = np.random.default_rng(42)
    for _ in range(2):
        feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
        ours = list(evaluate(graph, feeds).values())
        theirs = run_ort(model, feeds)
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def test_exporter_shape_arithmetic_folds_to_static_shapes():
    model, _ = transformer_encoder_layer()
    graph = from_onnx(model)
    ops = {n.op for n in graph.nodes}
    assert not ops & {"Shape", "Gather", "Concat"}  # folded into the Reshape targets
    targets = [n.attrs["shape"] for n in graph.nodes if n.op == "Reshape"]
    assert targets.count((2, 8, 4, 8)) == 3 and (2, 8, 32) in targets


def test_printed_graph_is_readable():
    model, _ = resnet_basic_block()
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
    model, shapes = resnet_basic_block()
    x = np.random.default_rng(1).standard_normal(shapes["x"]).astype(np.float32)
    (expected,) = run_ort(model, {"x": x})
    path = tmp_path / "block.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="block.weights", size_threshold=0)
    assert (tmp_path / "block.weights").stat().st_size > 0
    graph = from_onnx(path)
    (ours,) = evaluate(graph, {"x": x}).values()
    np.testing.assert_allclose(ours, expected, rtol=RTOL, atol=ATOL)
