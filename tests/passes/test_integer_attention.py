"""The transformer parts of IntegerOps (`ember.passes.integer`) against onnxruntime on the same QDQ model:

- products of two activations (attention's Q x K^T and probabilities x V) as QBatchMatMul: uint8 (or int8) x
  int8 -> int32 on the VNNI micro-kernel, dequantized by x_s * y_s, the float ops after it (the softmax scale,
  the mask) fused. onnxruntime multiplies the dequantized floats: the same products, summed in another order,
  so the outputs agree to float32 rounding (relative 1e-5), far inside one quantization step x_s * y_s;
- moves between a quantized tensor and its QuantizeLinear with the same parameters (the head split) on the 8-bit
  values: equal to onnxruntime's (no arithmetic);
- QuantizeLinear(GELU(DequantizeLinear(x))) as a table of the 256 codes (Lookup): at most one quantization step
  from onnxruntime (its erf is another float32 implementation: a value within rounding of a half-step tie may
  land on the other side), and equal on at least 99% of the elements.
"""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember.frontend.onnx import from_onnx
from ember.passes import run_passes

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime", reason="the reference runtime for QDQ models")
from conftest import int8_reference  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def qdq(nodes: list, inits: list, name: str, scale: float, zero: int, dtype) -> str:
    """Q -> DQ of tensor `name`; returns the dequantized name."""
    zp = np.array(zero, dtype)
    inits += [numpy_helper.from_array(np.array(scale, np.float32), f"{name}_s"),
              numpy_helper.from_array(zp, f"{name}_z")]  # fmt: skip
    params = [f"{name}_s", f"{name}_z"]
    nodes += [helper.make_node("QuantizeLinear", [name, *params], [f"{name}_q"]),
              helper.make_node("DequantizeLinear", [f"{name}_q", *params], [f"{name}_dq"])]  # fmt: skip
    return f"{name}_dq"


def quantize_out(nodes: list, inits: list, value: str, scale: float, zero: int) -> None:
    """QuantizeLinear of `value` to uint8 with this scale and zero point, as the graph output "out"."""
    inits += [numpy_helper.from_array(np.array(scale, np.float32), "out_s"),
              numpy_helper.from_array(np.array(zero, np.uint8), "out_z")]  # fmt: skip
    nodes.append(helper.make_node("QuantizeLinear", [value, "out_s", "out_z"], ["out"]))


def model(nodes, inits, inputs: dict, out: str, shape, out_type=TensorProto.FLOAT) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in
                                           inputs.items()], [helper.make_tensor_value_info(out, out_type, shape)],
                              inits)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def run_both(m: onnx.ModelProto, feeds: dict) -> tuple[np.ndarray, np.ndarray]:
    ours = ember.compile(m, target="c -threads=1").run(feeds)
    ref = int8_reference(m).run(None, feeds)[0]
    return next(iter(ours.values())), ref


def integer_ops_of(m: onnx.ModelProto) -> list[str]:
    g, _ = run_passes(from_onnx(m), opt_level=1, disabled=["fuse_ops"], verify=True)
    return [n.op for n in g.nodes]


def attention_scores(b: int, h: int, s: int, k: int, n: int, x_dtype) -> onnx.ModelProto:
    """(DQ(Q(x)) @ DQ(Q(y))) / sqrt(k) + mask: x asymmetric 8-bit, y int8 symmetric."""
    nodes, inits = [], []
    zero = 131 if x_dtype == np.uint8 else 3
    xd = qdq(nodes, inits, "x", 0.03, zero, x_dtype)
    yd = qdq(nodes, inits, "y", 0.02, 0, np.int8)
    inits += [numpy_helper.from_array(np.float32(np.sqrt(k)), "d"),
              numpy_helper.from_array(np.random.default_rng(1).normal(size=(1, 1, 1, n)).astype(np.float32), "mask")]
    nodes += [helper.make_node("MatMul", [xd, yd], ["p"]), helper.make_node("Div", ["p", "d"], ["sd"]),
              helper.make_node("Add", ["sd", "mask"], ["out"])]  # fmt: skip
    return model(nodes, inits, {"x": (b, h, s, k), "y": (b, h, k, n)}, "out", (b, h, s, n))


@pytest.mark.parametrize("b,h,s,k,n,x_dtype", [(1, 3, 16, 8, 16, np.uint8), (2, 2, 12, 6, 10, np.uint8),
                                               (1, 2, 8, 16, 32, np.int8)])  # fmt: skip
def test_activation_product_matches_onnxruntime(b, h, s, k, n, x_dtype):
    m = attention_scores(b, h, s, k, n, x_dtype)
    assert "QBatchMatMul" in integer_ops_of(m) and "MatMul" not in integer_ops_of(m)
    rng = np.random.default_rng(7)
    feeds = {"x": rng.normal(0, 1.5, (b, h, s, k)).astype(np.float32),
             "y": rng.normal(0, 1, (b, h, k, n)).astype(np.float32)}  # fmt: skip
    ours, ref = run_both(m, feeds)
    assert ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    assert np.abs(ours - ref).max() < 0.03 * 0.02 / np.sqrt(k)  # far inside one step of the product


def test_product_with_nonzero_y_zero_point_stays_float():
    nodes, inits = [], []
    xd = qdq(nodes, inits, "x", 0.03, 128, np.uint8)
    yd = qdq(nodes, inits, "y", 0.02, 5, np.int8)  # not symmetric: the pass leaves it to the float product
    nodes.append(helper.make_node("MatMul", [xd, yd], ["out"]))
    m = model(nodes, inits, {"x": (1, 4, 8), "y": (1, 8, 16)}, "out", (1, 4, 16))
    assert "QBatchMatMul" not in integer_ops_of(m)
    rng = np.random.default_rng(3)
    feeds = {"x": rng.normal(size=(1, 4, 8)).astype(np.float32), "y": rng.normal(size=(1, 8, 16)).astype(np.float32)}
    ours, ref = run_both(m, feeds)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


def test_head_split_moves_8bit_values():
    """Q(Transpose(Reshape(DQ(x_q)))) with x_q's parameters: Reshape and Transpose on the uint8 values."""
    nodes, inits = [], []
    xd = qdq(nodes, inits, "x", 0.05, 120, np.uint8)
    inits.append(numpy_helper.from_array(np.array([1, 6, 2, 4], np.int64), "shape"))
    nodes += [helper.make_node("Reshape", [xd, "shape"], ["r"]), helper.make_node("Transpose", ["r"], ["t"],
                                                                                  perm=[0, 2, 1, 3])]  # fmt: skip
    quantize_out(nodes, inits, "t", 0.05, 120)
    m = model(nodes, inits, {"x": (1, 6, 8)}, "out", (1, 2, 6, 4), TensorProto.UINT8)
    ops = integer_ops_of(m)
    assert ops.count("QuantizeLinear") == 1 and "DequantizeLinear" not in ops  # only x's own quantization left
    feeds = {"x": np.random.default_rng(5).normal(size=(1, 6, 8)).astype(np.float32)}
    ours, ref = run_both(m, feeds)
    assert ours.dtype == np.uint8
    np.testing.assert_array_equal(ours, ref)


def gelu_model(shape, x_dtype) -> onnx.ModelProto:
    """Q(GELU(DQ(Q(x)))) with GELU written as exporters write it (Div, Erf, Add, Mul, Mul)."""
    nodes, inits = [], []
    xd = qdq(nodes, inits, "x", 0.025, 121 if x_dtype == np.uint8 else -7, x_dtype)
    inits += [numpy_helper.from_array(np.float32(v), n) for n, v in (("r2", np.sqrt(2)), ("one", 1), ("half", 0.5))]
    nodes += [helper.make_node("Div", [xd, "r2"], ["a"]), helper.make_node("Erf", ["a"], ["e"]),
              helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", [xd, "e1"], ["g"]),
              helper.make_node("Mul", ["g", "half"], ["gelu"])]  # fmt: skip
    quantize_out(nodes, inits, "gelu", 0.0124, 14)
    return model(nodes, inits, {"x": shape}, "out", shape, TensorProto.UINT8)


@pytest.mark.parametrize("x_dtype", [np.uint8, np.int8])
def test_gelu_as_a_lookup_table(x_dtype):
    m = gelu_model((4, 96), x_dtype)
    ops = integer_ops_of(m)
    assert "Lookup" in ops and "Erf" not in ops
    feeds = {"x": np.random.default_rng(11).normal(0, 2, (4, 96)).astype(np.float32)}
    ours, ref = run_both(m, feeds)
    diff = np.abs(ours.astype(np.int32) - ref.astype(np.int32))
    assert diff.max() <= 1 and np.mean(diff == 0) >= 0.99


def silu_model(shape, x_dtype) -> onnx.ModelProto:
    """SiLU as onnxruntime's quantizer writes it: Q(DQ(x_q) * DQ(Q(Sigmoid(DQ(x_q))))), the sigmoid quantized on
    its own."""
    nodes, inits = [], []
    xd = qdq(nodes, inits, "x", 0.031, 140 if x_dtype == np.uint8 else 12, x_dtype)
    nodes.append(helper.make_node("Sigmoid", [xd], ["sig"]))
    sd = qdq(nodes, inits, "sig", 1 / 255, 0, np.uint8)
    nodes.append(helper.make_node("Mul", [xd, sd], ["silu"]))
    quantize_out(nodes, inits, "silu", 0.021, 13)
    return model(nodes, inits, {"x": shape}, "out", shape, TensorProto.UINT8)


@pytest.mark.parametrize("x_dtype", [np.uint8, np.int8])
def test_silu_through_its_quantized_sigmoid_is_one_table(x_dtype):
    """x * sigmoid(x) reads x twice, once through the sigmoid's table: one Lookup of x for the whole, equal to
    onnxruntime's (both evaluate the same float ops on each code)."""
    m = silu_model((2, 8, 40), x_dtype)
    ops = integer_ops_of(m)
    assert ops.count("Lookup") == 1 and "Mul" not in ops and "Sigmoid" not in ops, ops
    feeds = {"x": np.random.default_rng(12).normal(0, 2.5, (2, 8, 40)).astype(np.float32)}
    ours, ref = run_both(m, feeds)
    np.testing.assert_array_equal(ours, ref)


def test_a_dequantized_output_read_by_several_kernels_stays_8_bit():
    """An int8 squeeze-excitation: a quantized convolution's output, dequantized, is read by the global pooling and
    by the rescaling Mul (two kernels). Each reader widens the bytes itself: the convolution's kernel writes uint8,
    not float32; the result equals onnxruntime's within one step."""
    rng = np.random.default_rng(4)
    c = 16
    nodes, inits = [], []
    xd = qdq(nodes, inits, "x", 0.04, 128, np.uint8)
    w = rng.integers(-127, 128, (c, c, 3, 3)).astype(np.int8)
    inits += [numpy_helper.from_array(w, "w_q"), numpy_helper.from_array(np.float32(0.004), "w_s"),
              numpy_helper.from_array(np.int8(0), "w_z")]  # fmt: skip
    nodes += [helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w"]),
              helper.make_node("Conv", [xd, "w"], ["conv"], pads=[1, 1, 1, 1])]  # fmt: skip
    yd = qdq(nodes, inits, "conv", 0.05, 120, np.uint8)
    nodes += [helper.make_node("GlobalAveragePool", [yd], ["gap"]), helper.make_node("Sigmoid", ["gap"], ["s"]),
              helper.make_node("Mul", [yd, "s"], ["se"])]  # fmt: skip
    quantize_out(nodes, inits, "se", 0.03, 110)
    m = model(nodes, inits, {"x": (1, c, 12, 12)}, "out", (1, c, 12, 12), TensorProto.UINT8)
    g, _ = run_passes(from_onnx(m), opt_level=1, verify=True)
    conv = next(n for n in g.nodes if n.op == "QConvPacked" or (n.op == "Fused" and any(
        b.op == "QConvPacked" for b in n.attrs["body"].nodes)))  # fmt: skip
    assert [v.dtype for v in conv.outputs] == ["uint8"], conv
    feeds = {"x": rng.normal(0, 2, (1, c, 12, 12)).astype(np.float32)}
    ours, ref = run_both(m, feeds)
    assert np.abs(ours.astype(np.int32) - ref.astype(np.int32)).max() <= 1


def test_lookup_needs_a_function_of_one_tensor():
    """Q(DQ(a) + DQ(b)) (two variable operands) stays as it was."""
    nodes, inits = [], []
    ad, bd = qdq(nodes, inits, "a", 0.02, 128, np.uint8), qdq(nodes, inits, "b", 0.03, 128, np.uint8)
    nodes.append(helper.make_node("Add", [ad, bd], ["s"]))
    quantize_out(nodes, inits, "s", 0.04, 128)
    m = model(nodes, inits, {"a": (2, 16), "b": (2, 16)}, "out", (2, 16), TensorProto.UINT8)
    assert "Lookup" not in integer_ops_of(m)


def test_lookup_keeps_the_shape_a_constant_broadcasts_to():
    """Q(DQ(x) * c) with c of shape [1, 1, 1] (x [2, 16]: the product is [1, 2, 16]): left to the float ops, and
    still onnxruntime's answer."""
    nodes, inits = [], []
    xd = qdq(nodes, inits, "x", 0.02, 128, np.uint8)
    inits.append(numpy_helper.from_array(np.full((1, 1, 1), 1.5, np.float32), "c"))
    nodes.append(helper.make_node("Mul", [xd, "c"], ["s"]))
    quantize_out(nodes, inits, "s", 0.04, 128)
    m = model(nodes, inits, {"x": (2, 16)}, "out", (1, 2, 16), TensorProto.UINT8)
    assert "Lookup" not in integer_ops_of(m)
    ours, ref = run_both(m, {"x": np.random.default_rng(2).normal(size=(2, 16)).astype(np.float32)})
    np.testing.assert_array_equal(ours, ref)
