"""ResNet's quantized conv blocks as `ember.quantize` writes them, against onnxruntime on the same QDQ model.

- a bottleneck's residual join, QuantizeLinear(Relu(Add(Conv(...), DequantizeLinear(shortcut)))), becomes one
  QConvPacked with the shortcut as a fused residual input (identity and projection shortcuts);
- strided k x k convolutions with at least `WX_MIN_PIXELS` output pixels run as weights times activations on the
  phase planes of the padded input, smaller ones (and stride-1 k x k ones on small images) on im2col;
- 1 x 1 convolutions run as weights times activations.

Each block ends in a MaxPool of one pixel (it keeps its input's scale), so the model's output is the block's 8-bit
output dequantized: compared in steps of that scale. The fused residual multiplies by scales divided by y_s at
compile time where onnxruntime divides the float sum by y_s: they can differ by one step where the quotient is
within float32 rounding of a tie (on these inputs they are equal).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import int8_reference

import ember
from ember import zoo
from ember.frontend.onnx import from_onnx
from ember.ops.evaluate import evaluate
from ember.ops.int8 import WX_MIN_PIXELS
from ember.passes import run_passes
from ember.quantization import quantize_model
from ember.quantization.ptq import random_samples
from ember.target import Target, host_cpu_flags
from ember.te.intrin import dot_u8s8_isa, isa_features

ort = pytest.importorskip("onnxruntime", reason="onnxruntime runs the quantized models as the reference")
onnx = pytest.importorskip("onnx")

# W x X at any column count (the s8 x u8 dot's last vector masked): AVX-512 VNNI; AVX2 takes whole vectors of 8
VNNI = dot_u8s8_isa(isa_features(Target.parse("c")), 1, a_signed=True) != "c"
AMX = "amx_int8" in host_cpu_flags()


def bottleneck(cin: int, mid: int, size: int, stride: int = 1, projection: bool = False) -> onnx.ModelProto:
    """1 x 1, 3 x 3 (stride), 1 x 1 to 4 * mid channels, plus x (or its 1 x 1 projection), Relu."""
    b = zoo.Builder(4)
    main = b.conv_bn_relu("x", cin, mid, k=1)
    main = b.conv_bn_relu(main, mid, mid, k=3, stride=stride)
    main = b.conv_bn_relu(main, mid, 4 * mid, k=1, relu=None)
    short = b.conv_bn_relu("x", cin, 4 * mid, k=1, stride=stride, relu=None) if projection else "x"
    y = b.op("Relu", [b.op("Add", [main, short])])
    return b.model({"x": (1, cin, size, size)}, b.op("MaxPool", [y], kernel_shape=[1, 1]), "bottleneck")


def conv_block(cin: int, cout: int, size: int, k: int, stride: int) -> onnx.ModelProto:
    """1 x 1 conv (so the tested conv reads an 8-bit activation), then the k x k conv with the stride, Relu."""
    b = zoo.Builder(5)
    y = b.conv_bn_relu("x", cin, cin, k=1)
    y = b.conv_bn_relu(y, cin, cout, k=k, stride=stride)
    return b.model({"x": (1, cin, size, size)}, b.op("MaxPool", [y], kernel_shape=[1, 1]), "conv_block")


def output_step(q: onnx.ModelProto) -> float:
    """The scale of the DequantizeLinear the output MaxPool reads."""
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in q.graph.initializer}
    pool = next(n for n in q.graph.node if n.op_type == "MaxPool")
    dq = next(n for n in q.graph.node if pool.input[0] in n.output)
    assert dq.op_type == "DequantizeLinear"
    return float(inits[dq.input[1]])


def check(model: onnx.ModelProto):
    """Quantize with Ember, compile, compare with onnxruntime and with the rewritten graph's numpy references on
    fresh inputs (in output steps); the rewritten graph and the compiled model."""
    q = quantize_model(model, random_samples(model, 2, seed=1), report_samples=0).model
    g, _ = run_passes(from_onnx(q), opt_level=1, disabled=["fuse_ops"], verify=True)
    m = ember.compile(q, target="c -threads=2")
    sess = int8_reference(q)
    step = output_step(q)
    for feeds in random_samples(model, 2, seed=50):
        got = np.asarray(m(*feeds.values())).astype(np.float64)
        want = sess.run(None, feeds)[0].astype(np.float64)
        ref = evaluate(g, feeds)
        ref = np.asarray(ref[0] if isinstance(ref, list | tuple) else next(iter(ref.values()))).astype(np.float64)
        assert np.abs(got - want).max() <= step * (1 + 1e-3), "more than one step off onnxruntime"
        assert np.abs(got - ref).max() <= step * (1 + 1e-3), "more than one step off the numpy references"
    return g, m


@pytest.mark.parametrize("cin, mid, size, stride, projection", [(32, 8, 8, 1, False), (16, 8, 9, 2, True)])
def test_residual_join_is_the_last_convs_epilogue(cin, mid, size, stride, projection):
    g, m = check(bottleneck(cin, mid, size, stride, projection))
    joined = [n for n in g.nodes if n.op == "QConvPacked" and len(n.inputs) == 5]
    assert len(joined) == 1 and "Add" not in [n.op for n in g.nodes]
    (conv,) = joined
    assert conv.outputs[0].dtype == "uint8" and conv.attrs["y_min"] == conv.attrs["y_zero"]  # Relu: a clamp
    assert conv.inputs[4].dtype == "uint8" and conv.attrs["res_scale"] > 0
    kernels = [k.ops for s in m.plan.steps if s.kind == "segment" for k in s.kernels]
    assert not any("Add" in ops for ops in kernels) and sum("QConvPacked" in ops for ops in kernels) == 3 + projection


@pytest.mark.skipif(not VNNI, reason="W x X packing needs the host's int8 dot-product instructions")
@pytest.mark.parametrize("cin, cout, size, k, stride", [(16, 32, 33, 3, 2), (12, 16, 49, 5, 3)])
def test_strided_conv_on_phase_planes(cin, cout, size, k, stride):
    g, m = check(conv_block(cin, cout, size, k, stride))
    conv = [n for n in g.nodes if n.op == "QConvPacked"][-1]
    assert conv.inputs[1].shape[2] == 1 and not conv.attrs.get("s2d")  # W x X packing, not a stem's
    assert "im2col" not in m.source and "ember_dot_s8u8_" in m.source


@pytest.mark.parametrize("cin, cout, size, k, stride", [(16, 32, 14, 3, 2), (16, 16, 12, 3, 1)])
def test_small_images_run_on_im2col(cin, cout, size, k, stride):
    g, m = check(conv_block(cin, cout, size, k, stride))
    conv = [n for n in g.nodes if n.op == "QConvPacked"][-1]
    out = conv.outputs[0].shape
    assert out[2] * out[3] < WX_MIN_PIXELS and conv.inputs[1].shape[2] > 1 and "im2col" in m.source


@pytest.mark.skipif(not AMX, reason="this CPU has no AMX")
@pytest.mark.parametrize("cin, cout, size", [(64, 64, 14), (64, 32, 7), (64, 48, 28)])
def test_small_images_run_on_amx_rows(cin, cout, size):
    """On AMX, a stride-1 3 x 3 convolution whose padded rows round up to whole tiles of 16 pixels (14 x 14: 16;
    7 x 7: 9 -> 16; 28 x 28: 30 -> 32) runs as weights times activations on AMX tiles of whole rows, not on
    im2col; its values are onnxruntime's and bit-equal to the same model's without AMX (-mattr=-amx-int8)."""
    model = conv_block(cin, cout, size, 3, 1)
    g, m = check(model)
    conv = [n for n in g.nodes if n.op == "QConvPacked"][-1]
    assert conv.inputs[1].shape[2] == 1  # W x X packing
    assert "im2col" not in m.source and "_amx(" in m.source and "ember_dot_s8u8_" in m.source
    q = quantize_model(model, random_samples(model, 2, seed=1), report_samples=0).model
    plain = ember.compile(q, target="c -threads=2 -mattr=-amx-int8")
    assert "_amx(" not in plain.source
    for feeds in random_samples(model, 2, seed=60):
        np.testing.assert_array_equal(np.asarray(m(*feeds.values())), np.asarray(plain(*feeds.values())))


@pytest.mark.skipif(not VNNI, reason="W x X packing needs the host's int8 dot-product instructions")
@pytest.mark.parametrize("cin, cout, size, stride", [(64, 32, 10, 1), (32, 48, 12, 2)])
def test_pointwise_convs_run_as_weights_times_activations(cin, cout, size, stride):
    g, m = check(conv_block(cin, cout, size, 1, stride))
    assert all(n.inputs[1].shape[2] == 1 for n in g.nodes if n.op == "QConvPacked")
    assert "ember_dot_s8u8_" in m.source


@pytest.mark.skipif(not VNNI, reason="W x X packing needs the host's int8 dot-product instructions")
@pytest.mark.parametrize("cin, mid, size, stride, projection, tiles", [
    (64, 16, 14, 1, False, ["8x32"]),  # 2 rows of 14 pixels (2 vectors) by 8 channels
    (64, 16, 7, 1, False, ["4x49_avx512_vnni"]),  # the whole image: 4 vectors of 16 pixels
    (32, 16, 14, 2, True, ["8x32", "4x49_avx512_vnni"]),  # 14 x 14, then 7 x 7 (the strided projection)
])  # fmt: skip
def test_small_images_pointwise_convs_take_the_whole_image(cin, mid, size, stride, projection, tiles):
    """ResNet-50's last stages: a bottleneck at 14 x 14 or 7 x 7 whose 1 x 1 convolutions (the last one with the
    residual join in its epilogue) run as weights times activations, on tiles of 2 image rows by 8 channels at
    14 x 14 (more rows of W per vector of X than the whole image's 2 x 196; the epilogue in vectors of 16 pixels,
    the second one masked, so the accumulator tile runs to its end: 8 x 32), of the whole image at 7 x 7."""
    g, m = check(bottleneck(cin, mid, size, stride, projection))
    pointwise = [n for n in g.nodes if n.op == "QConvPacked" and n.attrs["kernel_shape"] == (1, 1)]
    assert pointwise and all(n.inputs[1].shape[2] == 1 for n in pointwise)
    for tile in tiles:
        assert f"{tile}" in m.source and "_avx512_vnni" in m.source


@pytest.mark.skipif(not VNNI, reason="W x X packing needs the host's int8 dot-product instructions")
def test_half_vectors_where_allowed(monkeypatch):
    """With `WX_HALF_VECTORS` (a CPU that splits 512-bit vpdpbusd), a 7 x 7 image's 1 x 1 convolutions take vectors
    of 8 pixels (`dot_s8u8_256`: 7 of them for 49 pixels), and still equal onnxruntime's."""
    from ember.templates import int8 as I8

    monkeypatch.setattr(I8, "WX_HALF_VECTORS", True)
    monkeypatch.setenv("EMBER_COMPILE_CACHE", "0")  # (the flag is not part of the compiled model's key)
    _, m = check(bottleneck(64, 16, 7, 1, False))
    assert "2x49_avx512_vnni_y" in m.source


@pytest.mark.skipif(not VNNI, reason="W x X packing needs the host's int8 dot-product instructions")
def test_few_long_tiles_run_in_parallel():
    """A 1 x 1 convolution at 7 x 7 over many channels (ResNet-50's 2048 -> 512) has few tiles, each one micro-kernel
    call over all of K: counted by its dot products, not as one store, its loop is split over the threads."""
    import re

    g, m = check(conv_block(1024, 64, 7, 1, 1))
    regions = re.findall(r"static void (qconvpacked\w*)_par\d+\(.*?\n}\n", m.source, re.S)
    bodies = re.findall(r"static void qconvpacked\w*_par\d+\(.*?\n}\n", m.source, re.S)
    with_dot = {name for name, body in zip(regions, bodies) if "ember_dot_s8u8_" in body}
    assert len(with_dot) == sum(n.op == "QConvPacked" for n in g.nodes) == 2


def test_bad_residual_names_the_problem():
    from ember.graph.types import TensorType
    from ember.ops import get_op
    from ember.ops.common import ShapeError

    a = {"n": 8, "x_zero": 0, "y_zero": 0, "y_dtype": "uint8", "kernel_shape": (1, 1), "strides": (1, 1),
         "pads": (0, 0, 0, 0), "dilations": (1, 1)}  # fmt: skip
    args = [TensorType((1, 4, 5, 5), "uint8"), TensorType((1, 1, 8, 4), "int8"), TensorType((8,), "int32"),
            TensorType((8,), "float32")]  # fmt: skip
    with pytest.raises(ShapeError, match="fused residual"):
        get_op("QConvPacked").infer(a, *args, TensorType((1, 8, 4, 5), "uint8"))
