"""Winograd F(4x4, 3x3) and F(2x2, 3x3) convolution in NCHWc (`ember.templates.winograd`, op ConvWinogradNCHWc,
chosen by `ember.passes.layout`).

Numerics against onnxruntime on fresh random inputs. Tolerance: Winograd F(4x4, 3x3) in float32 rounds
the transformed input (B^T d B sums up to 16 terms with coefficients up to 25), the 36 products and the
output transform (coefficients up to 64); measured errors are 2e-6..2e-5 of the output's largest magnitude
(bench/winograd.py, up to 512 channels), so the tests allow 1e-4 of it (the direct template's tests
allow 1e-5). F(2x2, 3x3)'s transforms have coefficients +-1 only (G's 1/2 is exact in binary): its errors are
those of a direct convolution's sum, 2e-7..1e-6, and the tests allow it 1e-5."""

from __future__ import annotations

import re
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.frontend.onnx import from_onnx
from ember.graph.types import TensorType
from ember.ops import ShapeError
from ember.ops.conv import conv
from ember.ops.layout import relayout
from ember.ops.winograd import _infer, conv_winograd_nchwc
from ember.passes import layout, run_passes
from ember.templates import winograd as W
from ember.templates.winograd import AT, BT, TILES, G, fused_plan, winograd_gain, winograd_tile, winograd_weight
from ember.tir.dtype import DType

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the reference")


def conv_model(n, c, k, h, w, pads, residual=False, bias=True, seed=0):
    rng = np.random.default_rng(seed)
    wt = (rng.standard_normal((k, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    inits = [numpy_helper.from_array(wt, "w")]
    ins = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(k).astype(np.float32), "b"))
        ins.append("b")
    oh, ow = h + pads[0] + pads[2] - 2, w + pads[1] + pads[3] - 2
    nodes = [helper.make_node("Conv", ins, ["c"], pads=list(pads), kernel_shape=[3, 3])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, h, w])]
    last = "c"
    if residual:
        nodes.append(helper.make_node("Add", ["c", "r"], ["a"]))
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [n, k, oh, ow]))
        last = "a"
    nodes.append(helper.make_node("Relu", [last], ["y"]))
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, k, oh, ow])
    g = helper.make_graph(nodes, "conv", inputs, [out], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def always_winograd(monkeypatch):
    """Every eligible convolution takes Winograd, even small ones (tests use small shapes)."""
    monkeypatch.setattr(layout, "WINOGRAD_MIN_GAIN", 0.0)
    monkeypatch.setattr(layout, "MIN_MACS", 0)


TOLERANCE = {2: 1e-5, 4: 1e-4}  # of the output's largest magnitude, per output tile (see the module's docstring)


def test_transform_matrices_compute_a_correlation():
    """A^T [(G g) . (B^T d)] is the 1-d correlation of d (a = m + 2) with g (3), exactly (rationals), for each tile;
    the F(4x4) matrices keep their paper's names."""
    assert (TILES[4].bt, TILES[4].g, TILES[4].at) == (BT, G, AT)
    rng = np.random.default_rng(0)
    for m, t in TILES.items():
        a = t.alpha
        d = [Fraction(int(v)) for v in rng.integers(-9, 10, a)]
        g = [Fraction(int(v)) for v in rng.integers(-9, 10, 3)]
        gg = [sum(Fraction(t.g[p][i]) * g[i] for i in range(3)) for p in range(a)]
        dd = [sum(t.bt[p][i] * d[i] for i in range(a)) for p in range(a)]
        y = [sum(t.at[o][p] * gg[p] * dd[p] for p in range(a)) for o in range(m)]
        assert y == [sum(d[o + i] * g[i] for i in range(3)) for o in range(m)], f"F({m}x{m}, 3x3)"


@pytest.mark.parametrize("m", [2, 4])
def test_reference_matches_direct_convolution(m):
    rng = np.random.default_rng(1)
    x, w, b = rng.standard_normal((2, 8, 9, 7)), rng.standard_normal((8, 8, 3, 3)), rng.standard_normal(8)
    pads = (1, 0, 2, 1)
    u = winograd_weight(relayout(w, "OIHW", "OIHW4i8o"), m)
    assert u.shape[0] == (m + 2) ** 2
    y = conv_winograd_nchwc({"pads": pads}, relayout(x, "NCHW", "NCHW4c"), u, b)
    ref = conv({"strides": (1, 1), "pads": pads, "dilations": (1, 1), "group": 1}, x, w, b)
    np.testing.assert_allclose(relayout(y, "NCHW8c", "NCHW"), ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize(
    "n, c, k, h, w, pads, residual",
    [
        (1, 16, 16, 8, 8, (1, 1, 1, 1), False),  # whole tiles
        (2, 20, 24, 9, 11, (1, 1, 1, 1), True),  # batch 2, channels in blocks of 4 and 8, partial tiles
        (1, 12, 32, 7, 13, (0, 1, 2, 0), False),  # asymmetric padding, no bias below
        (1, 32, 16, 5, 5, (0, 0, 0, 0), True),  # unpadded: a 3x3 output, one partial tile
        # the small maps of late CNN stages, odd input channels (taken as [N, C, H, W, 1])
        (1, 13, 16, 7, 7, (1, 1, 1, 1), False),
        (2, 9, 24, 7, 7, (1, 1, 1, 1), True),
        (2, 7, 32, 9, 9, (1, 1, 1, 1), False),
        (1, 17, 48, 14, 14, (1, 1, 1, 1), True),
        (2, 5, 16, 14, 14, (1, 1, 1, 1), False),
    ],
)
def test_winograd_matches_onnxruntime(always_winograd, monkeypatch, m, n, c, k, h, w, pads, residual):
    monkeypatch.setattr(layout, "WINOGRAD_TILE", m)
    model = conv_model(n, c, k, h, w, pads, residual=residual, bias=c != 12, seed=n * c + k)
    g, _ = run_passes(from_onnx(model), opt_level=3, disabled=["fuse_ops"], verify=True)
    wino = [nd for nd in g.nodes if nd.op == "ConvWinogradNCHWc"]
    assert len(wino) == 1 and wino[0].inputs[1].shape[0] == (m + 2) ** 2
    rng = np.random.default_rng(k + h)
    feeds = {"x": rng.standard_normal((n, c, h, w)).astype(np.float32)}
    if residual:
        oh, ow = h + pads[0] + pads[2] - 2, w + pads[1] + pads[3] - 2
        feeds["r"] = rng.standard_normal((n, k, oh, ow)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = ember.compile(model, fallback=False).run(feeds)["y"]
    np.testing.assert_allclose(got, ref, rtol=0, atol=TOLERANCE[m] * float(np.abs(ref).max()))


def test_odd_output_channels_stay_direct(always_winograd):
    """Output channels without a channel block (an odd count) keep the convolution in NCHW, still correct."""
    model = conv_model(2, 16, 15, 7, 7, (1, 1, 1, 1), seed=3)
    g, _ = run_passes(from_onnx(model), opt_level=3, disabled=["fuse_ops"], verify=True)
    assert Counter(nd.op for nd in g.nodes)["ConvWinogradNCHWc"] == 0
    feeds = {"x": np.random.default_rng(4).standard_normal((2, 16, 7, 7)).astype(np.float32)}
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = ember.compile(model, fallback=False).run(feeds)["y"]
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * float(np.abs(ref).max()))


def test_layout_pass_chooses_by_cost():
    """ResNet-like 3x3 layers take Winograd; an RGB-like 4-channel input, stride 2 and 1x1 do not. F(4x4) on 28x28
    maps and up, F(2x2) at 14x14 (ResNet-18 whole, 1 thread: F(4x4) there 0.95x), direct at 7x7: the weights,
    streamed from memory each call inside a model for only 4 tiles, outweigh the saved products (ResNet-18/34's
    512-channel layers as F(4x4): 2.8 ms where direct takes 1.4; GoogLeNet's 48 -> 128 layer ran 2x slower)."""
    assert winograd_gain(1, 64, 64, (56, 56)) > layout.WINOGRAD_MIN_GAIN
    assert winograd_gain(1, 4, 16, (32, 32)) < layout.WINOGRAD_MIN_GAIN
    for hw, cs in ((56, (64, 128, 256, 512)), (28, (64, 128, 256, 512))):
        for c in cs:
            assert winograd_tile(1, c, c, (hw, hw)) == 4 and winograd_gain(1, c, c, (hw, hw)) > 1.5, (c, hw)
    for c in (128, 256, 512):
        assert winograd_tile(1, c, c, (14, 14)) == 2 and winograd_gain(1, c, c, (14, 14)) > 1.5, c
    for c in (64, 256, 512):
        assert winograd_gain(1, c, c, (7, 7)) < layout.WINOGRAD_MIN_GAIN, c
    assert winograd_gain(1, 48, 128, (7, 7)) < layout.WINOGRAD_MIN_GAIN
    assert winograd_gain(1, 32, 128, (7, 7)) < layout.WINOGRAD_MIN_GAIN
    assert winograd_tile(1, 256, 256, (6, 6)) == 2
    assert winograd_gain(1, 256, 256, (6, 6), 2) > winograd_gain(1, 256, 256, (6, 6), 4)

    def chosen(model):
        g, _ = run_passes(from_onnx(model), opt_level=3, disabled=["fuse_ops"], verify=True)
        return Counter(nd.op for nd in g.nodes)

    assert chosen(conv_model(1, 64, 64, 20, 20, (1, 1, 1, 1)))["ConvWinogradNCHWc"] == 1
    ops = chosen(conv_model(1, 4, 16, 64, 64, (1, 1, 1, 1)))
    assert ops["ConvWinogradNCHWc"] == 0 and ops["ConvNCHWc"] == 1
    strided = conv_model(1, 64, 64, 20, 20, (1, 1, 1, 1))
    strided.graph.node[0].attribute.append(helper.make_attribute("strides", [2, 2]))
    strided.graph.output[0].type.tensor_type.shape.dim[2].dim_value = 10
    strided.graph.output[0].type.tensor_type.shape.dim[3].dim_value = 10
    assert chosen(strided)["ConvWinogradNCHWc"] == 0


def test_bad_operands_are_named():
    x = TensorType((1, 2, 8, 8, 8), "float32")
    with pytest.raises(ShapeError, match="weight"):
        _infer({"pads": (1, 1, 1, 1)}, x, TensorType((36, 2, 4, 4, 8), "float32"))
    with pytest.raises(ShapeError, match=r"F\(2x2, 3x3\)"):  # 25 points: no tile has them
        _infer({"pads": (1, 1, 1, 1)}, x, TensorType((25, 2, 2, 8, 8), "float32"))
    with pytest.raises(ValueError, match="tile 3"):
        winograd_weight(np.zeros((1, 1, 3, 3, 4, 4), np.float32), 3)
    with pytest.raises(ShapeError, match="bias"):
        _infer({"pads": (1, 1, 1, 1)}, x, TensorType((36, 2, 2, 8, 8), "float32"), TensorType((8,), "float32"))
    with pytest.raises(ValueError, match="3, 3"):
        winograd_weight(np.zeros((1, 1, 5, 5, 4, 4), np.float32))


@pytest.mark.parametrize("target", ["llvm", "c -threads=2"])
def test_winograd_on_llvm_and_threads(target):
    """The default choice (a 32-channel layer of 20x22 takes Winograd) on the LLVM backend and with parallel loops."""
    model = conv_model(2, 32, 32, 20, 22, (1, 1, 1, 1), residual=True, seed=5)
    g, _ = run_passes(from_onnx(model), opt_level=3, disabled=["fuse_ops"], verify=True)
    assert Counter(nd.op for nd in g.nodes)["ConvWinogradNCHWc"] == 1
    rng = np.random.default_rng(6)
    feeds = {"x": rng.standard_normal((2, 32, 20, 22)).astype(np.float32),
             "r": rng.standard_normal((2, 32, 20, 22)).astype(np.float32)}  # fmt: skip
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = ember.compile(model, target=target, fallback=False).run(feeds)["y"]
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4 * float(np.abs(ref).max()))


def test_fused_plan_blocks_small_channel_layers():
    """The products go through a cache-sized block buffer where the layer's would not fit in L2 and the weights of
    a channel-vector tile do (SqueezeNet's 16 -> 64 expand layer at 55x55, ResNet's 64-channel stage); blocks are
    whole tile rows of one image (a divisor of the rows) and fill the register tile; small layers and wide ones
    keep the product of all tiles at once."""
    f32 = DType("float32")
    sq = fused_plan(16, 4, 16, (14, 14), 36, f32)  # 16 -> 64 channels, 55x55 output: 14x14 tiles of F(4x4)
    assert sq is not None and sq.kbt == 2 and 14 % sq.rows == 0 and sq.rows * 14 >= sq.owt
    rn = fused_plan(64, 4, 16, (14, 14), 36, f32)
    assert rn is not None and 36 * 64 * rn.kbt * 16 * 4 <= W.FUSED_WEIGHT_BYTES
    assert fused_plan(48, 12, 16, (4, 4), 36, f32) is None  # 13x13 map: its products (442 KB) stay in L2
    assert fused_plan(512, 32, 16, (14, 14), 36, f32) is None  # a tile's weights (1.2 MB) would not stay in L2


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize(
    "n, c, k, h, w, pads, residual, target",
    [
        (1, 16, 64, 23, 23, (1, 1, 1, 1), False, "c"),  # squeeze width, partial tiles at the border
        (2, 8, 32, 13, 10, (1, 0, 1, 1), True, "c -threads=2"),  # batch 2 (blocks stay in an image), parallel
        (1, 16, 48, 9, 17, (0, 0, 0, 0), False, "llvm"),  # unpadded, 3 channel blocks (one per block tile)
    ],
)
def test_fused_product_matches_onnxruntime(always_winograd, monkeypatch, fused, n, c, k, h, w, pads, residual,
                                           target):  # fmt: skip
    """The fused product (forced on small shapes by a small L2) and the product of all tiles at once against
    onnxruntime, F(4x4, 3x3)."""
    monkeypatch.setattr(layout, "WINOGRAD_TILE", 4)
    monkeypatch.setattr(W, "L2_BYTES", 0 if fused else 1 << 40)
    oh, ow = h + pads[0] + pads[2] - 2, w + pads[1] + pads[3] - 2
    model = conv_model(n, c, k, h, w, pads, residual=residual, seed=c + k)
    rng = np.random.default_rng(n + k)
    feeds = {"x": rng.standard_normal((n, c, h, w)).astype(np.float32)}
    if residual:
        feeds["r"] = rng.standard_normal((n, k, oh, ow)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    cm = ember.compile(model, target=target, fallback=False)
    if target.startswith("c"):  # the product buffer: one block's tiles, or all tiles of the batch
        tiles = {int(t) for t in re.findall(r"conv_wino_gemm: float32\[36, \d+, 1, (\d+),", cm.source)}
        assert tiles and (max(tiles) < n * -(-oh // 4) * -(-ow // 4)) == fused, tiles
    got = cm.run(feeds)["y"]
    np.testing.assert_allclose(got, ref, rtol=0, atol=TOLERANCE[4] * float(np.abs(ref).max()))
