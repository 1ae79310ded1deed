"""IntegerOps (`ember.passes.integer`) and the integer kernels it makes, against onnxruntime.

Float models from `ember.zoo` are quantized by onnxruntime's `quantize_static` (per-channel int8 weights, uint8
activations, calibrated on random inputs) in QDQ form and in QOperator form (QLinearConv / QLinearMatMul only:
onnxruntime's other QOperator kernels are com.microsoft contrib operators). Each case checks that the pass made
integer kernels, then compares Ember's output with onnxruntime's on fresh random inputs, in steps of the output's
quantization scale:

- a small CNN (conv, residual add, relu, max-pool): equal, 0 steps. Both multiply the int32 accumulator by one
  float32 scale x_s * w_s / y_s, round half to even and saturate;
- an MLP (Gemm, relu, softmax): at most 1 step;
- a transformer block: at most 3 steps, and never further than the same QDQ model compiled without the pass
  (its float parts between the quantized products, softmax, layer norm and erf, are computed in another order
  than onnxruntime's kernels: a value within float rounding of a half-step tie lands on the other side, and the
  layer norm after it scales that step up).
"""

from __future__ import annotations

import os
import re
import tempfile

import numpy as np
import pytest
from conftest import int8_reference, ort_int8_exact

import ember
from ember import zoo
from ember.frontend.onnx import from_onnx
from ember.ops.evaluate import evaluate
from ember.passes import run_passes
from ember.target import Target
from ember.te.intrin import dot_u8s8_isa, isa_features

ort = pytest.importorskip("onnxruntime", reason="the reference runtime and quantizer")
quantization = pytest.importorskip("onnxruntime.quantization", reason="onnxruntime's quantize_static")
onnx = pytest.importorskip("onnx")

VNNI = dot_u8s8_isa(isa_features(Target.parse("c")), 1, a_signed=True) != "c"


def quantize(model, qdq: bool, seed: int = 0, optimize: bool = True):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    feeds = iter([zoo.random_feeds(model, seed=seed + i) for i in range(4)])

    class Reader(CalibrationDataReader):
        def get_next(self):
            return next(feeds, None)

    with tempfile.TemporaryDirectory() as d:
        src, pre, out = (os.path.join(d, f) for f in ("f.onnx", "p.onnx", "q.onnx"))
        onnx.save(model, src)
        quant_pre_process(src, pre, skip_symbolic_shape=True, skip_optimization=not optimize)  # folds batch norms
        quantize_static(pre, out, Reader(), quant_format=QuantFormat.QDQ if qdq else QuantFormat.QOperator,
                        op_types_to_quantize=None if qdq else ["Conv", "MatMul"], per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        reduce_range=not ort_int8_exact())  # fmt: skip
        return onnx.load(out)


def output_step(q) -> float | None:
    """The scale of the DequantizeLinear that produces the output (None: a float output)."""
    node = next((n for n in q.graph.node if q.graph.output[0].name in n.output), None)
    if node is None or node.op_type != "DequantizeLinear":
        return None
    init = {i.name: i for i in q.graph.initializer}
    return float(onnx.numpy_helper.to_array(init[node.input[1]]).reshape(()))


def integer_nodes(q) -> list[str]:
    g, _ = run_passes(from_onnx(q), opt_level=1, disabled=["fuse_ops"], verify=True)
    return [n.op for n in g.nodes if n.op in ("QConvPacked", "QMatMulPacked")]


MODELS = {  # name: (float model, steps allowed, onnxruntime's graph optimization before quantizing)
    "cnn": (lambda: zoo.resnet_basic_block(channels=16, size=10), 0, True),
    "transformer": (lambda: zoo.transformer_encoder_layer(seq=8, d=32, heads=2, ff=64, batch=1), 3, False),
    "mlp": (lambda: zoo.mlp(batch=8, features=48, hidden=(64, 32)), 1, False),
}
CASES = [("cnn", True), ("cnn", False), ("transformer", True), ("transformer", False), ("mlp", True)]  # mlp: QGemm


def worst_steps(m, sess, model, step: float) -> float:
    worst = 0.0
    for seed in (11, 12, 13):
        feeds = zoo.random_feeds(model, seed=seed)
        want = sess.run(None, feeds)[0].astype(np.float64)
        worst = max(worst, np.abs(np.asarray(m(*feeds.values())).astype(np.float64) - want).max() / step)
    return worst


@pytest.mark.parametrize("name, qdq", CASES, ids=[f"{n}-{'qdq' if q else 'qoperator'}" for n, q in CASES])
def test_quantized_model_matches_onnxruntime(name, qdq):
    build, steps, optimize = MODELS[name]
    model = build()
    q = quantize(model, qdq, optimize=optimize)
    assert integer_nodes(q), "no convolution or product became an integer kernel"
    m = ember.compile(q, target="c -threads=2")
    sess = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
    step = output_step(q)
    if step is None:  # a float output (a float layer after the last quantized one)
        feeds = zoo.random_feeds(model, seed=11)
        want = sess.run(None, feeds)[0]
        np.testing.assert_allclose(m(*feeds.values()), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
        return
    worst = worst_steps(m, sess, model, step)
    assert worst <= steps + 1e-3, f"{name}: {worst:.2f} steps off onnxruntime"
    if steps:  # the differences come from the float ops: the model without integer kernels is as far off
        plain = ember.compile(q, target="c -threads=2", disabled_passes=["integer_ops"])
        assert worst <= worst_steps(plain, sess, model, step) + 1e-3


def test_reference_evaluator_agrees():
    """The integer ops' numpy references (the rewritten graph, evaluated) give onnxruntime's outputs too."""
    model = zoo.resnet_basic_block(channels=8, size=6)
    q = quantize(model, True)
    g, _ = run_passes(from_onnx(q), opt_level=1, disabled=["fuse_ops"], verify=True)
    assert any(n.op == "QConvPacked" for n in g.nodes)
    feeds = zoo.random_feeds(model, seed=5)
    got = evaluate(g, feeds)
    got = np.asarray(got[0] if isinstance(got, list | tuple) else next(iter(got.values())))
    want = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_array_equal(got, want)


def test_activations_stay_integer():
    """Between two quantized convolutions the tensor is uint8: no float round trip in the graph."""
    q = quantize(zoo.resnet_basic_block(channels=8, size=6), True)
    g, _ = run_passes(from_onnx(q), opt_level=1, disabled=["fuse_ops"], verify=True)
    convs = [n for n in g.nodes if n.op == "QConvPacked"]
    assert len(convs) == 2
    assert convs[1].inputs[0] is convs[0].outputs[0] and convs[0].outputs[0].dtype == "uint8"


def test_depthwise_and_unquantized_outputs_become_integer():
    """An inverted residual block (1 x 1 conv + ReLU6, depthwise 3 x 3 + ReLU6, 1 x 1 projection + residual Add),
    quantized by `ember.quantize`, whose projection's output is not quantized (the Add reads it as float): every
    convolution becomes an integer kernel (the ReLU6 Clips folded into their clamps, the projection with a float
    output), no float convolution is left, and the output is within 1 step of onnxruntime's (the depthwise and
    ReLU6 kernels requantize with one float32 scale x_s * w_s / y_s; onnxruntime's QDQ kernels may round the
    other way at a tie)."""
    model = zoo.mobilenet_v2_inverted_residual(channels=8, expand=2, size=6)
    q = ember.quantize(model, [zoo.random_feeds(model, seed=i) for i in range(4)], report_samples=0)
    g, _ = run_passes(from_onnx(q), opt_level=1, disabled=["fuse_ops"], verify=True)
    ops = [n.op for n in g.nodes]
    assert ops.count("QConvPacked") == 2 and ops.count("QConvDepthwise") == 1
    assert "Conv" not in ops and "Clip" not in ops
    assert [n.outputs[0].dtype for n in g.nodes if n.op == "QConvPacked"] == ["uint8", "float32"]
    m = ember.compile(q, target="c")
    sess = int8_reference(q)
    step = float(np.max([onnx.numpy_helper.to_array(i) for i in q.graph.initializer
                         if i.name.endswith("scale") and i.dims == []]))  # fmt: skip
    for seed in (3, 4):
        feeds = zoo.random_feeds(model, seed=seed)
        want = sess.run(None, feeds)[0]
        assert np.abs(np.asarray(m(*feeds.values())) - want).max() <= step * (1 + 1e-3)


def depthwise_model(c: int, size: int, stride: int, dilation: int, k: int, xdtype: int, clip: bool, ys: float = 0.3):
    """DequantizeLinear(x) -> Conv(group = c, k x k, int32 bias) -> [Clip(0, 6)] -> QuantizeLinear, per-channel
    weights."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(c + size + stride)
    zero = 128 if xdtype == TensorProto.UINT8 else -3
    inits = [numpy_helper.from_array(rng.integers(-127, 128, (c, 1, k, k)).astype(np.int8), "w"),
             numpy_helper.from_array(rng.uniform(0.005, 0.02, c).astype(np.float32), "ws"),
             numpy_helper.from_array(np.zeros(c, np.int8), "wz"),
             numpy_helper.from_array(rng.integers(-300, 300, c).astype(np.int32), "b"),
             numpy_helper.from_array(np.array(0.05, np.float32), "xs"),
             numpy_helper.from_array(np.array(zero, np.uint8 if zero == 128 else np.int8), "xz"),
             numpy_helper.from_array(np.array(ys, np.float32), "ys"),
             numpy_helper.from_array(np.array(5, np.uint8), "yz"),
             numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
             numpy_helper.from_array(np.array(6.0, np.float32), "hi")]  # fmt: skip
    ws = numpy_helper.to_array(inits[1])
    inits += [numpy_helper.from_array(np.float32(0.05) * ws, "bs"),
              numpy_helper.from_array(np.zeros(c, np.int32), "bz")]
    pad = dilation * (k - 1) // 2
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], axis=0),
             helper.make_node("DequantizeLinear", ["b", "bs", "bz"], ["bf"], axis=0),
             helper.make_node("Conv", ["xf", "wf", "bf"], ["cf" if clip else "yf"], group=c, kernel_shape=[k, k],
                              strides=[stride] * 2, dilations=[dilation] * 2, pads=[pad, pad, pad + 1, pad]),
             helper.make_node("QuantizeLinear", ["yf", "ys", "yz"], ["y"])]  # fmt: skip
    if clip:
        nodes.insert(4, helper.make_node("Clip", ["cf", "lo", "hi"], ["yf"]))
    oh = (size + 2 * pad + 1 - dilation * (k - 1) - 1) // stride + 1
    ow = (size + 1 + 2 * pad - dilation * (k - 1) - 1) // stride + 1
    g = helper.make_graph(nodes, "dw", [helper.make_tensor_value_info("x", xdtype, [1, c, size, size + 1])],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, c, oh, ow])], inits)  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])


DW_CASES = [(16, 9, 1, 1, 3, True, True), (24, 12, 2, 1, 3, True, False), (8, 7, 1, 2, 3, False, True),
            (40, 5, 2, 1, 5, False, False), (3, 20, 3, 1, 3, True, True)]  # fmt: skip


@pytest.mark.parametrize("c, size, stride, dilation, k, unsigned, clip", DW_CASES)
def test_depthwise_matches_onnxruntime(c, size, stride, dilation, k, unsigned, clip):
    """QConvDepthwise (strides 1-3, dilation, 3 x 3 and 5 x 5, uneven padding, uint8 and int8 inputs, ReLU6 folded
    into the clamp) against onnxruntime on the same QDQ model: within 1 step (a tie rounded the other way), and
    equal to the op's numpy reference."""
    from onnx import TensorProto

    model = depthwise_model(c, size, stride, dilation, k, TensorProto.UINT8 if unsigned else TensorProto.INT8, clip)
    g, _ = run_passes(from_onnx(model), opt_level=1, disabled=["fuse_ops"], verify=True)
    assert [n.op for n in g.nodes] == ["QConvDepthwise"]
    m = ember.compile(model, target="c -threads=2")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(size)
    for _ in range(2):
        x = rng.integers(0, 256, (1, c, size, size + 1)).astype(np.uint8).view(np.uint8 if unsigned else np.int8)
        got = np.asarray(m(x))
        want = sess.run(None, {"x": x})[0]
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
        ref = evaluate(g, {"x": x})
        np.testing.assert_array_equal(got, np.asarray(ref[0] if isinstance(ref, list | tuple) else
                                                      next(iter(ref.values()))))  # fmt: skip


def test_aarch64_dotprod_under_emulation(tmp_path):
    """Built for an aarch64 CPU with sdot (the NEON implementation of dot_u8s8), run under qemu: the same integers
    as this machine's build."""
    import shutil

    from ember.runtime.standalone import emulator, run_exported

    if shutil.which("aarch64-linux-gnu-gcc") is None or shutil.which("qemu-aarch64") is None:
        pytest.skip("no aarch64 cross compiler or qemu-aarch64 (apt-get install gcc-aarch64-linux-gnu qemu-user)")
    model = zoo.resnet_basic_block(channels=16, size=6)
    q = quantize(model, True)
    feeds = zoo.random_feeds(model, seed=4)
    want = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    m = ember.compile(q, "c -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1")
    assert re.search(r"x16_neon_dotprod(_set)?\(", m.source)  # sdot micro-kernels on 16-column panels
    outputs, _ = run_exported(m.export(tmp_path / "board"), feeds, launcher=emulator(m.plan.target))
    np.testing.assert_array_equal(next(iter(outputs.values())), want)


def pointwise_block(c: int, mid: int, size: int, k: int = 1) -> onnx.ModelProto:
    """x -> k x k conv (c -> mid, padded to keep the size) -> relu -> 1 x 1 conv (mid -> c) -> + x -> relu."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n) for n, s in
             (("w1", (mid, c, k, k)), ("b1", (mid,)), ("w2", (c, mid, 1, 1)), ("b2", (c,)))]  # fmt: skip
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[k // 2] * 4),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"]), helper.make_node("Add", ["c2", "x"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]  # fmt: skip
    shape = [1, c, size, size]
    g = helper.make_graph(nodes, "pointwise", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("c, mid, size, k", [(6, 16, 8, 1), (16, 24, 4, 1), (8, 12, 7, 1), (8, 16, 17, 3),
                                             (256, 32, 14, 1)])  # fmt: skip
def test_convs_as_weights_times_activations(c, mid, size, k):
    """Stride-1 convolutions run as W x X (`dot_s8u8`: the accumulator comes out NCHW; a k x k one as k * k shifts
    of the padded image): their weights are packed with one column per panel, and the model equals onnxruntime's,
    0 steps (also with channels padded to 4, tiles of whole image rows that 16 does not divide, a residual add
    in the epilogue, and 256 channels at 14 x 14: tiles of 2 rows, stored in vectors of 4 bytes)."""
    from ember.ops.int8 import wx_columns
    from ember.target import Target
    from ember.te.intrin import dot_u8s8_isa, isa_features

    model = pointwise_block(c, mid, size, k)
    q = quantize(model, True)
    g, _ = run_passes(from_onnx(q), opt_level=1, disabled=["fuse_ops"], verify=True)
    convs = [n for n in g.nodes if n.op == "QConvPacked"]
    assert len(convs) == 2
    features = isa_features(Target.parse("c"))
    wx = [dot_u8s8_isa(features, wx_columns(n.attrs, (1, c, size, size)), True) != "c" for n in convs]
    assert [n.inputs[1].shape[2] == 1 for n in convs] == wx, "W x X packing where the host has the instructions"
    m = ember.compile(q, target="c -threads=2")
    assert ("ember_dot_s8u8_" in m.source) == any(wx)
    sess = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
    assert worst_steps(m, sess, model, output_step(q)) == 0


def conv_relu(c: int, co: int, size: int, k: int, stride: int, pad: int, seed: int):
    """Conv (bias) -> Relu on a [1, c, size, size] image with random weights."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((co, c, k, k)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array((rng.standard_normal(co) * 0.1).astype(np.float32), "b")]  # fmt: skip
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["cv"], strides=[stride] * 2, pads=[pad] * 4),
             helper.make_node("Relu", ["cv"], ["y"])]  # fmt: skip
    out = (size + 2 * pad - k) // stride + 1
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, size, size])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, co, out, out])
    g = helper.make_graph(nodes, "conv_relu", [x], [y], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.skipif(not VNNI, reason="W x X at any column count needs AVX-512 VNNI (AVX2: whole vectors of 8)")
@pytest.mark.parametrize("c, co, size, stride", [(16, 32, 12, 2), (8, 24, 11, 2), (12, 16, 15, 3)])
def test_strided_pointwise_conv_as_weights_times_activations(c, co, size, stride):
    """A strided 1 x 1 convolution without padding (ResNet's downsampling shortcut) runs as W x X on every s-th
    pixel (the copy of the input samples them): packed with one column per panel, equal to onnxruntime's output."""
    model = conv_relu(c, co, size, 1, stride, 0, seed=c)
    q = quantize(model, True)
    g, _ = run_passes(from_onnx(q), opt_level=1, disabled=["fuse_ops"], verify=True)
    (conv,) = [n for n in g.nodes if n.op == "QConvPacked"]
    assert conv.inputs[1].shape[2] == 1  # W x X packing
    m = ember.compile(q, target="c -threads=2")
    assert "ember_dot_s8u8_" in m.source
    sess = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
    assert worst_steps(m, sess, model, output_step(q)) == 0


STEMS = [(3, 16, 20, 7, 2, 3), (3, 8, 17, 3, 2, 1), (4, 16, 13, 5, 2, 1), (1, 16, 18, 3, 3, 0)]


@pytest.mark.skipif(not VNNI, reason="W x X at any column count needs AVX-512 VNNI (AVX2: whole vectors of 8)")
@pytest.mark.parametrize("c, co, size, k, stride, pad", STEMS)
def test_stem_conv_on_phase_planes(c, co, size, k, stride, pad):
    """A strided convolution of an image's few channels (ResNet's 7 x 7 / 2 stem) runs as the stride-1 convolution
    of its s x s phase planes (space to depth, W x X: no im2col), equal to onnxruntime's output, and its numpy
    reference (on the packed phase-plane weights) agrees."""
    model = conv_relu(c, co, size, k, stride, pad, seed=k)
    q = quantize(model, True)
    g, _ = run_passes(from_onnx(q), opt_level=1, disabled=["fuse_ops"], verify=True)
    (conv,) = [n for n in g.nodes if n.op == "QConvPacked"]
    assert conv.attrs.get("s2d") == stride and conv.inputs[1].shape[2] == 1
    m = ember.compile(q, target="c -threads=2")
    sess = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
    assert worst_steps(m, sess, model, output_step(q)) == 0
    feeds = zoo.random_feeds(model, seed=5)
    got = evaluate(g, feeds)
    got = np.asarray(got[0] if isinstance(got, list | tuple) else next(iter(got.values())))
    np.testing.assert_array_equal(got, sess.run(None, feeds)[0])


def test_grouped_conv_stays_float_and_correct():
    """A grouped convolution that is not depthwise (group 2) is left to the float path; the model still matches
    onnxruntime within 1 step."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 4, 3, 3)) * 0.3).astype(np.float32), "w")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["cv"], group=2, pads=[1] * 4),
             helper.make_node("Relu", ["cv"], ["y"])]  # fmt: skip
    g = helper.make_graph(nodes, "grouped", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 6, 6])], inits)  # fmt: skip
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    q = quantize(model, True)
    g, _ = run_passes(from_onnx(q), opt_level=1, disabled=["fuse_ops"])
    assert "Conv" in [n.op for n in g.nodes]
    m = ember.compile(q, target="c")
    sess = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
    assert worst_steps(m, sess, model, output_step(q)) <= 1 + 1e-3


def bottleneck_with_projection(cin: int, mid: int, size: int):
    """ResNet-50's first block of a stage: 1 x 1, 3 x 3, 1 x 1 to 4 * mid channels, plus a 1 x 1 projection of x,
    added, Relu."""
    b = zoo.Builder(4)
    main = b.conv_bn_relu("x", cin, mid, k=1)
    main = b.conv_bn_relu(main, mid, mid, k=3)
    main = b.conv_bn_relu(main, mid, 4 * mid, k=1, relu=None)
    short = b.conv_bn_relu("x", cin, 4 * mid, k=1, relu=None)
    y = b.op("Relu", [b.op("Add", [main, short])])
    return b.model({"x": (1, cin, size, size)}, y, "bottleneck")


def test_projection_shortcut_stays_8_bit_and_small_images_run_on_two_threads():
    """The projection's output is dequantized for the residual Add of the other branch's kernel: that kernel reads
    the 8-bit value (the DequantizeLinear is its prologue, not the projection's epilogue, which would write float32).
    On a 7 x 7 image (one tile of pixels) the two threads share the channel tiles. Equal to onnxruntime, 0 steps."""
    model = bottleneck_with_projection(128, 64, 7)
    q = quantize(model, True)
    m = ember.compile(q, target="c -threads=2")
    kernels = [k.ops for s in m.plan.steps if s.kind == "segment" for k in s.kernels]
    assert ["QConvPacked", "DequantizeLinear"] not in kernels, kernels
    assert sum("QConvPacked" in ops for ops in kernels) == 4
    assert "ember_parallel_for" in m.source
    sess = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
    assert worst_steps(m, sess, model, output_step(q)) == 0


@pytest.mark.parametrize("ys, int_clamp", [(0.3, 1), (1e-9, 0)])
def test_requantization_clamps_integers_where_the_range_is_proven(ys, int_clamp):
    """Where every accumulator the weights allow, requantized, stays far inside int32 (the usual case), the kernel
    rounds to int32 and clamps integers; an output scale so small that it might not (1e-9: the values saturate)
    keeps the float clamp. Both equal onnxruntime's output within 1 step (a tie rounded the other way)."""
    from onnx import TensorProto

    model = depthwise_model(16, 9, 1, 1, 3, TensorProto.UINT8, False, ys=ys)
    g, _ = run_passes(from_onnx(model), opt_level=1, disabled=["fuse_ops"], verify=True)
    (conv,) = g.nodes
    assert conv.attrs.get("int_clamp", 0) == int_clamp
    m = ember.compile(model, target="c")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).integers(0, 256, (1, 16, 9, 10)).astype(np.uint8)
    got, want = np.asarray(m(x)).astype(int), sess.run(None, {"x": x})[0].astype(int)
    assert np.abs(got - want).max() <= 1
    if not int_clamp:
        assert (got == 255).mean() > 0.3 and (got == 0).mean() > 0.3  # saturated both ways


@pytest.mark.parametrize("height, width, rows, flat", [(56, 56, 256, True), (56, 58, 64, False), (28, 28, 512, True),
                                                       (28, 30, 128, False), (14, 14, 1024, True), (14, 16, 256, False),
                                                       (7, 7, 2048, True), (7, 9, 512, False), (112, 112, 96, True),
                                                       (56, 56, 144, True)])  # fmt: skip
def test_wx_tiles_fit_the_registers(height, width, rows, flat):
    """A W x X tile (ResNet-50's and MobileNetV2's images): whole rows of pixels, its micro-kernel (accumulators plus
    its vectors of X and a broadcast, or its broadcasts and a vector of X) within the 32 vector registers (a tile
    past them reloads X for every row), mr dividing the output channels, and no single-row tile where two rows fit;
    a 1 x 1 convolution's epilogue in vectors."""
    from ember.templates.int8 import WX_REGISTERS, wx_epilogue_width, wx_registers, wx_tile

    mr, nb = wx_tile(height, width, rows, flat)
    nv = -(-nb // 16)
    assert nb % width == 0 and height % (nb // width) == 0 and rows % mr == 0
    assert wx_registers(mr, nv, flat and nb == height * width) <= WX_REGISTERS and mr >= 2
    if flat:
        assert wx_epilogue_width(nb, nb == height * width, True) > 0


@pytest.mark.parametrize("height, rows, channels", [(28, 128, 512), (14, 256, 1024), (14, 1024, 256), (56, 64, 256)])
def test_wx_tiles_keep_x_in_l1(height, rows, channels):
    """A 1 x 1 convolution's W x X tile reads its pixels x channels of X once per tile of output channels: where
    the image's X is past the L1 cache, a tile of fewer rows whose X fits (ResNet-50's 512 -> 128 at 28 x 28: 2 x
    112 -> 8 x 28 tiles, 1.5x faster)."""
    from ember.templates.int8 import WX_L1_BYTES, wx_tile

    mr, nb = wx_tile(height, height, rows, True, channels)
    assert nb * channels <= WX_L1_BYTES and mr * nb >= 128
