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
import tempfile

import numpy as np
import pytest

import ember
from ember import zoo
from ember.frontend.onnx import from_onnx
from ember.ops.evaluate import evaluate
from ember.passes import run_passes

ort = pytest.importorskip("onnxruntime", reason="the reference runtime and quantizer")
quantization = pytest.importorskip("onnxruntime.quantization", reason="onnxruntime's quantize_static")
onnx = pytest.importorskip("onnx")


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
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)  # fmt: skip
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


def test_not_rewritten_stays_correct():
    """A grouped (depthwise) convolution is left to the float path; the model still matches."""
    q = quantize(zoo.mobilenet_v2_inverted_residual(channels=8, expand=2, size=6), True)
    g, _ = run_passes(from_onnx(q), opt_level=1, disabled=["fuse_ops"])
    ops = [n.op for n in g.nodes]
    assert "QConvPacked" in ops and "Conv" in ops  # the depthwise one stays float
    m = ember.compile(q, target="c")
    feeds = zoo.random_feeds(zoo.mobilenet_v2_inverted_residual(channels=8, expand=2, size=6), seed=3)
    want = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert np.abs(np.asarray(m(*feeds.values())) - want).max() / output_step(q) <= 1 + 1e-3


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
    assert "x16_neon_dotprod(" in m.source  # sdot micro-kernels on 16-column panels
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


@pytest.mark.parametrize("c, mid, size, k", [(6, 16, 8, 1), (16, 24, 4, 1), (8, 12, 7, 1), (8, 16, 9, 3)])
def test_convs_as_weights_times_activations(c, mid, size, k):
    """Stride-1 convolutions run as W x X (`dot_s8u8`: the accumulator comes out NCHW; a k x k one as k * k shifts
    of the padded image): their weights are packed with one column per panel, and the model equals onnxruntime's,
    0 steps (also with channels padded to 4, tiles of whole image rows that 16 does not divide, and a residual add
    in the epilogue)."""
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
