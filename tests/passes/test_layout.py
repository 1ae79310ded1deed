"""ConvertLayout (`ember.passes.layout`): the graph before and after, and the function kept.

Each case builds a small ONNX model, runs the pipeline up to (not including) fuse_ops, checks which ops the
blocked region holds and where the layout transforms are, then checks numerics against onnxruntime twice: the
rewritten graph through the numpy reference evaluator, and the compiled model (native kernels only).
Tolerance rtol 1e-4, atol 1e-5 of the output's scale."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest

import ember
from ember import zoo
from ember.frontend.onnx import from_onnx
from ember.graph.ir import Graph, Node, Value
from ember.graph.types import TensorType
from ember.ops.evaluate import evaluate
from ember.passes import run_passes
from ember.passes.layout import MIN_MACS, NARROW_MACS_DIVISOR, block_of, cancel_transforms, convert_layout

ort = pytest.importorskip("onnxruntime")


@pytest.fixture(autouse=True)
def direct_convolutions(monkeypatch):
    """These cases check the direct blocked template (ConvNCHWc); Winograd's choice of 3x3 layers is
    tested in tests/ops/test_winograd.py."""
    monkeypatch.setattr("ember.passes.layout.WINOGRAD_MIN_GAIN", float("inf"))


AVX512 = "c -mcpu=skylake-avx512"  # the layouts below are those of 16 float lanes, whatever this machine has


def passes(model: onnx.ModelProto, target: str | None = AVX512) -> Graph:
    g, _ = run_passes(from_onnx(model), opt_level=3, disabled=["fuse_ops"], verify=True, target=target)
    return g


def ops(g: Graph) -> Counter:
    return Counter(n.op for n in g.nodes)


def transforms(g: Graph) -> list[tuple[str, str]]:
    return [(n.attrs["src_layout"], n.attrs["dst_layout"]) for n in g.nodes if n.op == "LayoutTransform"]


def check(model: onnx.ModelProto, g: Graph, compile_too: bool = True) -> None:
    feeds = zoo.random_feeds(model, 0)
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    results = [list(evaluate(g, feeds).values())]
    if compile_too:
        results.append(list(ember.compile(model, fallback=False).run(feeds).values()))
    for ours in results:
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * max(float(np.abs(b).max()), 1.0))


def test_block_of():
    assert [block_of(c, 16) for c in (64, 96, 24, 40, 12, 3, 6, 18)] == [16, 16, 8, 8, 4, None, None, None]
    assert block_of(64, 8) == 8


def test_conv_chain_stays_blocked_between_convs():
    """Conv-BN-ReLU, a residual block, pooling and a classifier: one transform in, none between the ops of
    the chain, the pooled features back through a view; weights re-laid out once, at compile time."""
    b = zoo.Builder(0)
    y = b.conv_bn_relu("x", 16, 32)
    y = b.op("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    r = b.conv_bn_relu(y, 32, 32)
    r = b.conv_bn_relu(r, 32, 32, relu=None)
    y = b.op("Relu", [b.op("Add", [r, y])])
    y = b.op("AveragePool", [y], kernel_shape=[2, 2], strides=[2, 2])
    y = b.op("Flatten", [b.op("GlobalAveragePool", [y])])
    y = b.linear(y, 32, 10, gemm=True)
    model = b.model({"x": (1, 16, 32, 32)}, y)
    before = ops(from_onnx(model))
    assert before["Conv"] == 3 and before["BatchNormalization"] == 3
    g = passes(model)
    assert ops(g) == Counter({"ConvNCHWc": 3, "Relu": 3, "Add": 1, "PoolNCHWc": 2, "GlobalPoolNCHWc": 1,
                              "LayoutTransform": 1, "Reshape": 1, "Flatten": 1, "Gemm": 1})  # fmt: skip
    assert [src for src, _ in transforms(g)] == ["NCHW"]  # the input in; the output back is a view
    assert g.nodes[0].op == "LayoutTransform" and g.nodes[0].inputs[0] is g.inputs[0]
    for n in g.nodes:
        if n.op == "ConvNCHWc":
            assert n.inputs[1].is_constant and n.inputs[1].shape == (2, n.inputs[0].shape[1], 3, 3, 16, 16)
    check(model, g)


def test_transform_back_once_for_every_nchw_reader():
    """A blocked value read by an op without a blocked form (Softmax over channels) is transformed back once,
    before its first reader; an elementwise op with an operand computed in NCHW stays NCHW too."""
    b = zoo.Builder(1)
    c = b.op("Relu", [b.conv("x", 16, 32)])
    s = b.op("Softmax", [c], axis=1)
    y = b.op("Add", [s, c])
    model = b.model({"x": (1, 16, 24, 24)}, y)
    g = passes(model)
    assert ops(g)["ConvNCHWc"] == 1 and ops(g)["Softmax"] == 1 and ops(g)["Add"] == 1
    assert transforms(g) == [("NCHW", "NCHW16c"), ("NCHW16c", "NCHW")]
    back = next(n for n in g.nodes if n.attrs.get("dst_layout") == "NCHW")
    softmax = next(n for n in g.nodes if n.op == "Softmax")
    assert g.nodes.index(back) < g.nodes.index(softmax) and softmax.inputs[0] is back.outputs[0]
    assert g.outputs[0].name == y
    check(model, g)


def test_broadcast_operands_follow_the_layout():
    """Per-channel constants ([C, 1, 1]), a channel-less map ([1, 1, H, W]), a scalar, and a squeeze-and-excite
    gate ([N, C, 1, 1], computed from the blocked map) all combine with the blocked map in its layout."""
    b = zoo.Builder(2)
    rng = np.random.default_rng(0)
    y = b.op("Relu", [b.conv("x", 16, 32)])
    y = b.op("Add", [y, b.const(rng.standard_normal((32, 1, 1)).astype(np.float32))])
    y = b.op("Mul", [y, b.const(rng.standard_normal((1, 1, 20, 20)).astype(np.float32))])
    y = b.op("Mul", [y, b.const(np.float32(0.5))])
    gate = b.op("Sigmoid", [b.conv(b.op("GlobalAveragePool", [y]), 32, 32, k=1, bias=True)])
    y = b.op("Mul", [y, gate])
    y = b.op("Relu", [b.conv(y, 32, 32)])
    model = b.model({"x": (1, 16, 20, 20)}, y)
    g = passes(model)
    assert ops(g)["ConvNCHWc"] == 3 and "Conv" not in ops(g)
    assert ops(g)["Mul"] == 3 and ops(g)["Add"] == 1 and ops(g)["Sigmoid"] == 1
    assert transforms(g) == [("NCHW", "NCHW16c"), ("NCHW16c", "NCHW")]  # in, and the output back
    assert all(len(v.shape) == 5 for n in g.nodes if n.op in ("Mul", "Add") for v in n.inputs if v.type.size > 1)
    check(model, g)


def test_depthwise_and_blocks_of_eight():
    """An inverted residual at 24 channels (blocks of 8) with a depthwise convolution, stride 2 and 1."""
    b = zoo.Builder(3)
    y = b.conv_bn_relu("x", 24, 144, k=1, relu="Clip6")
    y = b.conv_bn_relu(y, 144, 144, k=3, stride=2, group=144, relu="Clip6")
    y = b.conv_bn_relu(y, 144, 24, k=1, relu=None)
    z = b.conv_bn_relu(y, 24, 144, k=1, relu="Clip6")
    z = b.conv_bn_relu(z, 144, 144, k=3, group=144, relu="Clip6")
    z = b.conv_bn_relu(z, 144, 24, k=1, relu=None)
    y = b.op("Add", [y, z])
    model = b.model({"x": (1, 24, 28, 28)}, y)
    g = passes(model)
    assert ops(g)["ConvNCHWc"] == 6 and ops(g)["Clip"] == 4 and ops(g)["Add"] == 1
    assert transforms(g) == [("NCHW", "NCHW8c"), ("NCHW8c", "NCHW")]
    dw = [n for n in g.nodes if n.op == "ConvNCHWc" and n.attrs["group"] > 1]
    assert len(dw) == 2 and all(n.inputs[1].shape == (9, 1, 3, 3, 1, 16) for n in dw)
    check(model, g)


def test_narrow_depthwise_conv_is_blocked_below_min_macs():
    """A depthwise 7x7 on a 5x5 image (convnext's last stage) is below MIN_MACS, but its NCHW kernel would
    vectorize along rows of 5: it takes the blocked layout; the same on a 32x32 image stays NCHW."""
    for side, blocked in ((5, True), (32, False)):
        b = zoo.Builder(6)
        channels = 128 if blocked else 16
        y = b.conv("x", channels, channels, k=7, group=channels, bias=True)
        model = b.model({"x": (1, channels, side, side)}, b.op("Relu", [y]))
        macs = channels * side * side * 49
        assert (MIN_MACS // NARROW_MACS_DIVISOR <= macs < MIN_MACS) if blocked else macs < MIN_MACS
        g = passes(model)
        assert ops(g)["ConvNCHWc"] == int(blocked) and ops(g)["Conv"] == int(not blocked)
        check(model, g)


def test_image_input_is_a_view_and_small_or_unsupported_convs_stay_nchw():
    """An RGB input enters its convolution as [N, 3, H, W, 1] (a reshape); a convolution too small to pay
    for transforms, a grouped one whose groups are narrower than a 128-bit vector (2 channels), and one whose
    channels have no block stay NCHW."""
    b = zoo.Builder(4)
    y = b.op("Relu", [b.conv("x", 3, 32, k=3, stride=2)])  # blocked, input through a view
    y = b.conv(y, 32, 32, group=16)  # groups of 2 channels, blocks of 16: NCHW
    y = b.conv(y, 32, 6, k=1)  # 6 channels: no block
    small = b.conv("s", 16, 16)  # input not blocked, too small
    model = b.model({"x": (1, 3, 96, 96), "s": (1, 16, 8, 8)}, b.op("Add", [b.op("ReduceSum", [y]), b.op(
        "ReduceSum", [small])]))  # fmt: skip
    assert MIN_MACS > 16 * 16 * 9 * 64
    g = passes(model)
    assert ops(g)["ConvNCHWc"] == 1 and ops(g)["Conv"] == 3
    first = g.nodes[0]
    assert first.op == "Reshape" and first.outputs[0].shape == (1, 3, 96, 96, 1)
    assert transforms(g) == [("NCHW16c", "NCHW")]
    check(model, g)


GROUPED = [  # channels, groups, kernel, stride, target, groups after merging: groups of 8 channels (narrower than
    # blocks of 16), 16, 32, 16 -> 32 (a 1x1), 40 channels padded to 48 (a sixth group, of zero
    # weights, in blocks of 16), 8 in blocks of 8 (AVX2), 4 (ResNeXt's first stage), 8 -> 16
    # (a 1x1: merged in pairs into blocks of 16)
    (32, 4, 3, 1, None, 4), (64, 4, 3, 2, None, 4), (64, 2, 3, 1, None, 2), (48, 3, 1, 1, None, 3),
    (40, 5, 3, 1, None, 6), (32, 4, 3, 1, "c -mcpu=haswell", 4), (32, 8, 3, 2, None, 8), (32, 4, 1, 1, None, 2),
]


@pytest.mark.parametrize("case", GROUPED, ids=[f"c{c[0]}g{c[1]}k{c[2]}s{c[3]}{'x' if c[4] else ''}" for c in GROUPED])
def test_grouped_convolutions_run_blocked(case):
    """A grouped convolution (RegNet, ResNeXt) between blocked ones stays blocked: each output block reads
    the input blocks of its group; groups narrower than a block run in whole vectors, each input channel of a group
    one shuffle of the block's vector (as many channels in as out), or are merged in pairs, their weights zero between
    the groups. Checked against onnxruntime
    (reference evaluator and compiled)."""
    c, group, k, stride, target, merged = case
    b = zoo.Builder(9)
    y = b.conv_bn_relu("x", 32, c, k=1)  # large enough to start a blocked region
    out = c * 2 if k == 1 else c
    y = b.conv_bn_relu(y, c, out, k=k, stride=stride, group=group)
    y = b.conv_bn_relu(y, out, 32, k=1)
    model = b.model({"x": (1, 32, 32, 32)}, y)
    g = passes(model, target or AVX512)
    grouped = [n for n in g.nodes if n.op == "ConvNCHWc" and n.attrs["group"] > 1]
    assert ops(g)["ConvNCHWc"] == 3 and ops(g)["Conv"] == 0 and len(grouped) == 1
    assert grouped[0].attrs["group"] == merged
    assert len(transforms(g)) == 2  # into the blocked region and back, none around the grouped convolution
    feeds = zoo.random_feeds(model, 0)
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    results = [list(evaluate(g, feeds).values())]
    results.append(list(ember.compile(model, target=target or "c", fallback=False).run(feeds).values()))
    for ours in results:
        np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-4, atol=1e-5 * max(float(np.abs(theirs[0]).max()), 1))


def test_target_picks_the_block():
    """The block is the target's vector lanes: 8 floats for an AVX2 target, 16 for AVX-512."""
    b = zoo.Builder(5)
    model = b.model({"x": (1, 32, 16, 16)}, b.op("Relu", [b.conv("x", 32, 64)]))
    for target, block in (("c -mcpu=haswell", 8), ("c -mcpu=skylake-avx512", 16)):
        g = passes(model, target=target)
        conv = next(n for n in g.nodes if n.op == "ConvNCHWc")
        assert conv.outputs[0].shape[-1] == block and conv.inputs[0].shape[-1] == block
        check(model, g, compile_too=False)


def test_cancel_adjacent_transforms():
    x = Value("x", TensorType((1, 32, 4, 4), "float32"))
    t1 = Value("t1", TensorType((1, 2, 4, 4, 16), "float32"))
    t2 = Value("t2", TensorType((1, 32, 4, 4), "float32"))
    t3 = Value("t3", TensorType((1, 32, 4, 4), "float32"))
    y = Value("y", TensorType((1, 32, 4, 4), "float32"))
    nodes = [Node("LayoutTransform", [x], [t1], {"src_layout": "NCHW", "dst_layout": "NCHW16c"}),
             Node("LayoutTransform", [t1], [t2], {"src_layout": "NCHW16c", "dst_layout": "NCHW"}),
             Node("LayoutTransform", [t2], [t3], {"src_layout": "NCHW", "dst_layout": "NCHW"}),
             Node("Relu", [t3], [y])]  # fmt: skip
    g = cancel_transforms(Graph("g", [x], [y], nodes))
    assert [n.op for n in g.nodes] == ["Relu"] and g.nodes[0].inputs[0] is x


def test_convert_layout_keeps_models_without_convolutions():
    model = zoo.mlp()
    g = from_onnx(model)
    before = [n.op for n in g.nodes]
    assert [n.op for n in convert_layout(g).nodes] == before


def test_1d_convolutions_run_blocked():
    """1-d convolutions (Whisper's front end: k3, then k3 stride 2, an activation between) run as 2-d ones of
    height 1, blocked from one to the next; the elementwise op between them reads NCHW."""
    b = zoo.Builder(12)
    w1, w2 = b.weight((64, 16, 3), (2 / 48) ** 0.5), b.weight((64, 64, 3), (2 / 192) ** 0.5)
    y = b.op("Conv", ["x", w1, b.weight((64,))], kernel_shape=[3], strides=[1], pads=[1, 1])
    y = b.op("Conv", [y, w2], kernel_shape=[3], strides=[2], pads=[1, 1])
    y = b.op("Conv", [b.op("Relu", [y]), w2], kernel_shape=[3], strides=[1], pads=[2, 2], dilations=[2])
    model = b.model({"x": (1, 16, 400)}, b.op("Relu", [y]))
    g = passes(model)
    assert ops(g)["ConvNCHWc"] == 3 and ops(g)["Conv"] == 0
    assert transforms(g) == [("NCHW", "NCHW16c"), ("NCHW16c", "NCHW"), ("NCHW", "NCHW16c"), ("NCHW16c", "NCHW")]
    check(model, g)


@pytest.mark.parametrize("op, keepdims", [("ReduceMean", 0), ("ReduceMean", 1), ("ReduceMax", 1)])
def test_spatial_reduce_of_blocked_value_is_global_pooling(op, keepdims):
    """torchvision's `x.mean([2, 3])` after a conv: GlobalPoolNCHWc on the blocked value, no LayoutTransform back to
    NCHW (without keepdims the pooled [N, C/b, 1, 1, b] is read as [N, C], a view)."""
    b = zoo.Builder(0)
    y = b.conv_bn_relu("x", 8, 32)
    y = b.op(op, [y], axes=[2, -1], keepdims=keepdims)
    model = b.model({"x": (2, 8, 16, 16)}, y)
    g = passes(model)
    assert ops(g)["GlobalPoolNCHWc"] == 1 and ops(g)[op] == 0
    assert [src for src, _ in transforms(g)] == ["NCHW"]  # the input in; the output back is a view
    check(model, g)


def regnet_y_stage(c_in: int, width: int, group_width: int, blocks: int, size: int, batch: int = 1):
    """RegNet-Y blocks as torchvision builds them: 1x1 conv, grouped 3x3 conv (stride 2 in the first block), a
    squeeze-excitation (global average pool, 1x1 conv, relu, 1x1 conv, sigmoid, channel multiply), 1x1 conv, residual
    add (a projection in the first block) and relu; then the classifier head (pool, flatten, Gemm)."""
    b = zoo.Builder(16)
    x, c = "x", c_in
    for i in range(blocks):
        stride = 2 if i == 0 else 1
        y = b.conv_bn_relu(x, c, width, k=1)
        y = b.conv_bn_relu(y, width, width, k=3, stride=stride, group=width // group_width)
        s = b.op("GlobalAveragePool", [y])
        s = b.op("Relu", [b.conv(s, width, c_in // 4, k=1, bias=True)])
        s = b.op("Sigmoid", [b.conv(s, c_in // 4, width, k=1, bias=True)])
        y = b.conv_bn_relu(b.op("Mul", [y, s]), width, width, k=1, relu=None)
        short = b.conv_bn_relu(x, c, width, k=1, stride=stride, relu=None) if i == 0 else x
        x, c = b.op("Relu", [b.op("Add", [short, y])]), width
    head = b.linear(b.op("Flatten", [b.op("GlobalAveragePool", [x])]), width, 10, gemm=True)
    return b.model({"x": (batch, c_in, size, size)}, head, "regnet_y_stage")


@pytest.mark.parametrize("c_in, width, group_width, batch", [(32, 56, 8, 1), (16, 40, 8, 2), (32, 72, 4, 1)])
def test_regnet_blocks_padded_to_whole_vectors(monkeypatch, c_in, width, group_width, batch):
    """RegNet-Y's widths without a block of 16 (RegNet-Y-400MF: 104, 440; here 56, 40 and 72) are computed
    zero-padded to whole vectors through the whole stage: the grouped conv takes the padding as whole groups of
    zero weights (its groups narrower than a block: shuffles of the block), the squeeze-excitation's pool,
    sigmoid and channel multiply and the residual adds run on padded values, and only the pooled features are
    sliced for the classifier. Checked against onnxruntime."""
    monkeypatch.setattr("ember.passes.layout.MIN_MACS", 0)  # small maps: the first conv starts the blocked region
    model = regnet_y_stage(c_in, width, group_width, blocks=2, size=10, batch=batch)
    g = passes(model)
    pad = -(-width // 16) * 16
    blocked = [n.outputs[0].shape for n in g.nodes if n.op in ("ConvNCHWc", "Mul", "Add", "GlobalPoolNCHWc", "Sigmoid")]
    wide = [s for s in blocked if s[1] * s[-1] >= width]  # 8 a block, the projection, the pool: not the SE middle
    assert len(wide) == 8 * 2 + 2 and all(s[-1] == 16 and s[1] * 16 == pad for s in wide)  # no block of 8 (or 4)
    grouped = [n for n in g.nodes if n.op == "ConvNCHWc" and n.attrs["group"] > 1]
    assert len(grouped) == 2 and all(n.inputs[1].shape[-2] == group_width for n in grouped)  # narrow, not merged
    assert all(n.attrs["group"] == pad // group_width for n in grouped)  # the padding is whole groups more
    assert ops(g)["Conv"] == 0 and ops(g)["Slice"] == 1 and len(transforms(g)) == 1  # the input into the blocks only
    check(model, g)


def test_grouped_conv_whose_padding_would_not_be_whole_vectors_out(monkeypatch):
    """40 channels in 5 groups of 8 -> 1: padded to 48, its output would be 6 channels, not whole vectors, so the
    conv before it is not padded (blocks of 8) and the grouped one (8 -> 1 per group) stays NCHW."""
    monkeypatch.setattr("ember.passes.layout.MIN_MACS", 0)
    b = zoo.Builder(17)
    y = b.conv_bn_relu("x", 32, 40, k=1)
    y = b.conv_bn_relu(y, 40, 5, k=3, group=5)
    model = b.model({"x": (1, 32, 8, 8)}, y)
    g = passes(model)
    assert [n.outputs[0].shape[-1] for n in g.nodes if n.op == "ConvNCHWc"] == [8] and ops(g)["Conv"] == 1
    check(model, g)
