"""Example models built in code with onnx.helper and random weights (no downloads).

Blocks at test scale (ResNet basic block, MobileNetV2 inverted residual, transformer encoder
layer, Conv-BN-ReLU stack, MLP) and whole networks at any scale (ResNet-18, MobileNetV2, a BERT
encoder), written the way PyTorch exports them. Used by the quickstart, the tests and the benches.

    model = zoo.resnet18(batch=1, image=224)     # onnx.ModelProto
    feeds = zoo.random_feeds(model)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


class Builder:
    """A tiny helper over onnx.helper: nodes, random initializers, a typed model."""

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

    def conv(self, x: str, cin: int, cout: int, k: int = 3, stride: int = 1, group: int = 1, bias: bool = False) -> str:
        w = self.weight((cout, cin // group, k, k), scale=(2.0 / (cin // group * k * k)) ** 0.5)
        ins = [x, w] + ([self.weight((cout,))] if bias else [])
        return self.op("Conv", ins, kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4, group=group)

    def conv_bn_relu(self, x: str, cin: int, cout: int, k: int = 3, stride: int = 1, group: int = 1,
                     relu: str | None = "Relu") -> str:  # fmt: skip
        y = self.conv(x, cin, cout, k, stride, group)
        bn = [self.weight((cout,), positive=True), self.weight((cout,)), self.weight((cout,)),
              self.weight((cout,), positive=True)]  # fmt: skip
        y = self.op("BatchNormalization", [y] + bn, epsilon=1e-5)
        if relu == "Relu":
            y = self.op("Relu", [y])
        elif relu == "Clip6":
            y = self.op("Clip", [y, self.const(np.float32(0)), self.const(np.float32(6))])
        return y

    def linear(self, x: str, din: int, dout: int, gemm: bool = False) -> str:
        """y = x W^T + b as exporters write it: Gemm for 2-D inputs, MatMul + Add otherwise."""
        if gemm:
            return self.op("Gemm", [x, self.weight((dout, din), (1.0 / din) ** 0.5), self.weight((dout,))], transB=1)
        return self.op(
            "Add", [self.op("MatMul", [x, self.weight((din, dout), (1.0 / din) ** 0.5)]), self.weight((dout,))]
        )

    def model(
        self, inputs: dict[str, tuple], output: str, name: str = "model", dtypes: dict | None = None
    ) -> onnx.ModelProto:
        dtypes = dtypes or {}
        ins = [helper.make_tensor_value_info(n, dtypes.get(n, TensorProto.FLOAT), list(s)) for n, s in inputs.items()]
        outs = [helper.make_tensor_value_info(output, TensorProto.UNDEFINED, None)]
        graph = helper.make_graph(self.nodes, name, ins, outs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model = onnx.shape_inference.infer_shapes(model)  # types the output
        onnx.checker.check_model(model)
        return model


# -- blocks --------------------------------------------------------------------------------------


def resnet_basic_block(channels: int = 16, size: int = 14, batch: int = 1) -> onnx.ModelProto:
    b = Builder(1)
    y = b.conv_bn_relu("x", channels, channels)
    y = b.conv_bn_relu(y, channels, channels, relu=None)
    y = b.op("Relu", [b.op("Add", [y, "x"])])
    return b.model({"x": (batch, channels, size, size)}, y, "resnet_basic_block")


def mobilenet_v2_inverted_residual(channels: int = 16, expand: int = 6, size: int = 12) -> onnx.ModelProto:
    b = Builder(2)
    hidden = channels * expand
    y = b.conv_bn_relu("x", channels, hidden, k=1, relu="Clip6")  # expand
    y = b.conv_bn_relu(y, hidden, hidden, k=3, group=hidden, relu="Clip6")  # depthwise
    y = b.conv_bn_relu(y, hidden, channels, k=1, relu=None)  # project
    y = b.op("Add", [y, "x"])
    return b.model({"x": (1, channels, size, size)}, y, "mobilenet_v2_inverted_residual")


def conv_bn_relu_stack(layers: int = 5, channels: int = 16, size: int = 16, batch: int = 1) -> onnx.ModelProto:
    """`layers` x (Conv 3x3, BatchNormalization, ReLU) at a fixed channel count."""
    b = Builder(3)
    y = "x"
    for _ in range(layers):
        y = b.conv_bn_relu(y, channels, channels)
    return b.model({"x": (batch, channels, size, size)}, y, "conv_bn_relu_stack")


def mlp(batch: int = 4, features: int = 48, hidden: tuple[int, ...] = (64, 32), classes: int = 10) -> onnx.ModelProto:
    b = Builder(4)
    y = b.op("Flatten", ["x"], axis=1)
    din = features
    for i, h in enumerate(hidden):
        y = b.op("Relu", [b.linear(y, din, h, gemm=i % 2 == 0)])
        din = h
    y = b.op("Softmax", [b.linear(y, din, classes, gemm=True)], axis=-1)
    return b.model({"x": (batch, features)}, y, "mlp")


def _encoder_layer(b: Builder, x: str, batch: int, seq: int, d: int, heads: int, ff: int, mask: str | None) -> str:
    """Post-norm encoder layer as exporters write it: head shapes computed with Shape/Gather/Concat."""
    dh = d // heads
    i64 = lambda *v: b.const(np.array(v, np.int64), "shape")  # noqa: E731

    def heads_split(t: str) -> str:  # [B, S, D] -> [B, H, S, Dh], target shape computed from Shape
        shape = b.op("Shape", [t])
        first = b.op("Gather", [shape, b.const(np.array([0], np.int64))], axis=0)
        target = b.op("Concat", [first, i64(-1, heads, dh)], axis=0)
        return b.op("Transpose", [b.op("Reshape", [t, target])], perm=[0, 2, 1, 3])

    def layer_norm(t: str) -> str:
        return b.op("LayerNormalization", [t, b.weight((d,), positive=True), b.weight((d,))], axis=-1, epsilon=1e-5)

    q, k, v = (heads_split(b.linear(x, d, d)) for _ in range(3))
    scores = b.op("Div", [b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])]),
                          b.const(np.float32(np.sqrt(dh)))])  # fmt: skip
    if mask is not None:
        scores = b.op("Add", [scores, mask])
    attn = b.op("Softmax", [scores], axis=-1)
    ctx = b.op("Transpose", [b.op("MatMul", [attn, v])], perm=[0, 2, 1, 3])
    ctx = b.op("Reshape", [ctx, i64(0, 0, d)])
    h = layer_norm(b.op("Add", [x, b.linear(ctx, d, d)]))
    f = b.linear(h, d, ff)
    erf = b.op("Erf", [b.op("Div", [f, b.const(np.float32(np.sqrt(2)))])])
    gelu = b.op("Mul", [b.op("Mul", [f, b.op("Add", [erf, b.const(np.float32(1))])]), b.const(np.float32(0.5))])
    return layer_norm(b.op("Add", [h, b.linear(gelu, ff, d)]))


def transformer_encoder_layer(
    seq: int = 8, d: int = 32, heads: int = 4, ff: int = 64, batch: int = 2
) -> onnx.ModelProto:
    """One layer with a causal additive mask."""
    b = Builder(5)
    mask = b.op("Where", [b.const(np.tril(np.ones((seq, seq), bool))), b.const(np.float32(0)),
                          b.const(np.float32(-1e4))])  # fmt: skip
    out = _encoder_layer(b, "x", batch, seq, d, heads, ff, mask)
    return b.model({"x": (batch, seq, d)}, out, "transformer_encoder_layer")


def elementwise_chain(length: int = 1000, shape: tuple[int, ...] = (1, 64), seed: int = 9) -> onnx.ModelProto:
    """`length` elementwise nodes in one chain, Relu, Neg and Add of a scalar constant in turn: a graph as long
    as a big model's with nothing to compute (the compile-time benchmark and its tests)."""
    b = Builder(seed)
    y = "x"
    for i in range(length):
        kind = i % 3
        if kind == 0:
            y = b.op("Relu", [y])
        elif kind == 1:
            y = b.op("Neg", [y])
        else:
            y = b.op("Add", [y, b.const(np.float32(0.25 + (i % 7) / 8), "k")])
    return b.model({"x": shape}, y, f"elementwise_chain_{length}")


# -- whole networks -------------------------------------------------------------------------------


def _resnet(name: str, seed: int, stages: list[int], block, batch: int, image: int, classes: int,
            width: int) -> onnx.ModelProto:
    """torchvision's ResNet layout: conv 7x7/2 and max pool, stages of residual blocks (the first block of each
    stage after the first has stride 2; a 1x1 projection where the shape changes), average pool and fc.
    `block(b, y, cin, width_of_stage, stride)` gives a block's main branch and its output channels."""
    b = Builder(seed)
    y = b.conv_bn_relu("x", 3, width, k=7, stride=2)
    y = b.op("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = width
    for stage, blocks in enumerate(stages):
        for i in range(blocks):
            stride = 2 if stage > 0 and i == 0 else 1
            main, cout = block(b, y, cin, width * 2**stage, stride)
            short = y if stride == 1 and cin == cout else b.conv_bn_relu(y, cin, cout, k=1, stride=stride, relu=None)
            y = b.op("Relu", [b.op("Add", [main, short])])
            cin = cout
    y = b.op("Flatten", [b.op("GlobalAveragePool", [y])], axis=1)
    y = b.linear(y, cin, classes, gemm=True)
    return b.model({"x": (batch, 3, image, image)}, y, name)


def _basic_block(b: Builder, y: str, cin: int, cout: int, stride: int) -> tuple[str, int]:
    return b.conv_bn_relu(b.conv_bn_relu(y, cin, cout, stride=stride), cout, cout, relu=None), cout


def _bottleneck(b: Builder, y: str, cin: int, mid: int, stride: int) -> tuple[str, int]:
    """1x1 reduce, 3x3 with the stride, 1x1 expand to 4x the width."""
    main = b.conv_bn_relu(y, cin, mid, k=1)
    main = b.conv_bn_relu(main, mid, mid, k=3, stride=stride)
    return b.conv_bn_relu(main, mid, 4 * mid, k=1, relu=None), 4 * mid


def resnet18(batch: int = 1, image: int = 224, classes: int = 1000, width: int = 64) -> onnx.ModelProto:
    """torchvision's ResNet-18: 4 stages of 2 basic blocks."""
    return _resnet("resnet18", 6, [2, 2, 2, 2], _basic_block, batch, image, classes, width)


def resnet50(batch: int = 1, image: int = 224, classes: int = 1000, width: int = 64) -> onnx.ModelProto:
    """torchvision's ResNet-50: 3, 4, 6, 3 bottleneck blocks."""
    return _resnet("resnet50", 10, [3, 4, 6, 3], _bottleneck, batch, image, classes, width)


def mobilenet_v2(batch: int = 1, image: int = 224, classes: int = 1000, width: float = 1.0) -> onnx.ModelProto:
    """torchvision's MobileNetV2 layout: inverted residuals with depthwise 3x3 convs and ReLU6."""
    b = Builder(7)

    def ch(c: int) -> int:
        return max(8, int(c * width + 4) // 8 * 8)

    y = b.conv_bn_relu("x", 3, ch(32), k=3, stride=2, relu="Clip6")
    cin = ch(32)
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                       (6, 160, 3, 2), (6, 320, 1, 1)]:  # fmt: skip
        for i in range(n):
            stride, cout, hidden = (s if i == 0 else 1), ch(c), cin * t
            h = y if t == 1 else b.conv_bn_relu(y, cin, hidden, k=1, relu="Clip6")
            h = b.conv_bn_relu(h, hidden, hidden, k=3, stride=stride, group=hidden, relu="Clip6")
            h = b.conv_bn_relu(h, hidden, cout, k=1, relu=None)
            y = b.op("Add", [h, y]) if stride == 1 and cin == cout else h
            cin = cout
    y = b.conv_bn_relu(y, cin, 1280, k=1, relu="Clip6")
    y = b.op("Flatten", [b.op("GlobalAveragePool", [y])], axis=1)
    y = b.linear(y, 1280, classes, gemm=True)
    return b.model({"x": (batch, 3, image, image)}, y, "mobilenet_v2")


def bert_encoder(layers: int = 4, seq: int = 128, d: int = 768, heads: int = 12, ff: int = 3072, batch: int = 1,
                 vocab: int = 1000, dynamic: bool = False) -> onnx.ModelProto:  # fmt: skip
    """A BERT-base-like encoder: token + position embeddings, LayerNorm, `layers` encoder layers with
    an attention mask computed from int64 `attention_mask` as Hugging Face exports it. `dynamic`: the inputs
    are [batch, seq] with symbolic dims and the position embeddings are the first `seq` rows of a table of
    `seq` rows, sliced to the input's length (Shape -> Slice), as exporters write it."""
    b = Builder(8)
    i64 = lambda *v: b.const(np.array(v, np.int64), "i")  # noqa: E731
    words = b.op("Gather", [b.weight((vocab, d), 0.5), "input_ids"])
    if dynamic:
        length = b.op("Shape", ["input_ids"], start=1, end=2)
        table = b.weight((seq, d), 0.5)
        pos = b.op("Unsqueeze", [b.op("Slice", [table, i64(0), length, i64(0)]), i64(0)])
        emb = b.op("Add", [words, pos])
    else:
        pos = b.op("Unsqueeze", [b.const(np.arange(seq, dtype=np.int64)), i64(0)])
        emb = b.op("Add", [words, b.op("Gather", [b.weight((seq, d), 0.5), pos])])
    h = b.op("LayerNormalization", [emb, b.weight((d,), positive=True), b.weight((d,))], axis=-1, epsilon=1e-12)
    mask = b.op("Cast", [b.op("Unsqueeze", ["attention_mask", i64(1, 2)])], to=TensorProto.FLOAT)
    mask = b.op("Mul", [b.op("Sub", [b.const(np.float32(1)), mask]), b.const(np.float32(-1e4))])
    for _ in range(layers):
        h = _encoder_layer(b, h, batch, seq, d, heads, ff, mask)
    ids = {"input_ids": TensorProto.INT64, "attention_mask": TensorProto.INT64}
    shape = ("batch", "seq") if dynamic else (batch, seq)
    return b.model({"input_ids": shape, "attention_mask": shape}, h, "bert_encoder", ids)


BLOCKS: dict[str, Callable[[], onnx.ModelProto]] = {
    "resnet_basic_block": resnet_basic_block,
    "mobilenet_v2_inverted_residual": mobilenet_v2_inverted_residual,
    "conv_bn_relu_x5": conv_bn_relu_stack,
    "mlp": mlp,
    "transformer_encoder_layer": transformer_encoder_layer,
}


def random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for a model's graph inputs (token ids in [0, 100), masks of ones)."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        t = vi.type.tensor_type
        shape = tuple(d.dim_value or 1 for d in t.shape.dim)
        if t.elem_type == TensorProto.INT64:
            feeds[vi.name] = np.ones(shape, np.int64) if "mask" in vi.name else rng.integers(0, 100, shape)
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds
