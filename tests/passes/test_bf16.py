"""bfloat16 products (`ember.ops.bf16`, made by `ember.passes.integer` from the models `ember.quantize(...,
precision="bf16")` writes): Cast(float32, Cast(bfloat16, x)) times a bfloat16 weight as one kernel on vdpbf16ps.

Reference: numpy (torch for the convolutions) in float64 on the same bfloat16-rounded operands. Every product of
two bfloat16 values is exact in float32; the kernel's float32 sums differ from the exact ones by at most about
K * 2^-24 times the sum of the |products| (any summation order), so each element is checked within
4 * K * 2^-24 * (|x| @ |W| + |b|). The pass runs where the target has avx512_bf16 (the tests that run the
kernels skip elsewhere); without it the rounded operands go through the float32 kernels, checked the same way.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import ember
from ember.frontend.onnx import from_onnx
from ember.passes import integer, run_passes
from ember.target import host_cpu_flags

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

BF16 = ml_dtypes.bfloat16
needs_bf16 = pytest.mark.skipif("avx512_bf16" not in host_cpu_flags(), reason="this CPU has no avx512_bf16")


def bf16_layer(op: str, x_shape, w: np.ndarray, bias: np.ndarray | None, out_shape, **attrs) -> onnx.ModelProto:
    """x rounded by a Cast pair, w stored as bfloat16 behind a Cast, then `op` (+ its bias), as quantize writes."""
    inits = [numpy_helper.from_array(w.astype(BF16), "w")]
    nodes = [helper.make_node("Cast", ["x"], ["xb"], to=TensorProto.BFLOAT16),
             helper.make_node("Cast", ["xb"], ["xr"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["w"], ["wf"], to=TensorProto.FLOAT)]  # fmt: skip
    inputs = ["xr", "wf"]
    if bias is not None:
        inits.append(numpy_helper.from_array(bias.astype(np.float32), "b"))
        inputs.append("b")
    if op == "MatMul" and bias is not None:
        nodes += [helper.make_node("MatMul", inputs[:2], ["p"]), helper.make_node("Add", ["p", "b"], ["y"])]
    else:
        nodes.append(helper.make_node(op, inputs, ["y"], **attrs))
    graph = helper.make_graph(nodes, "bf16", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], inits)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def rounded(a: np.ndarray) -> np.ndarray:
    return a.astype(BF16).astype(np.float64)


def ops_after_passes(m: onnx.ModelProto, target: str = "c") -> list[str]:
    g, _ = run_passes(from_onnx(m), opt_level=1, disabled=["fuse_ops"], verify=True, target=target)
    return [n.op for n in g.nodes]


def within(y: np.ndarray, exact: np.ndarray, magnitude: np.ndarray, k: int) -> None:
    assert y.shape == exact.shape
    assert np.all(np.abs(y - exact) <= 4 * k * 2.0**-24 * magnitude + 1e-30)


@needs_bf16
@pytest.mark.parametrize("target", ["c -threads=1", "c -threads=2"])
@pytest.mark.parametrize("m, k, n", [(12, 40, 48), (5, 37, 20), (32, 96, 64), (48, 40, 32)])
def test_matmul_in_bf16_matches_numpy(target, m, k, n):
    """(32, 96, 64) and (48, 40, 32): whole AMX tiles of rows and columns (K a multiple of 32, and not: the
    vdpbf16ps kernel inside the AMX call) where the CPU has amx_bf16."""
    rng = np.random.default_rng(k)
    w, b = rng.normal(size=(k, n)), rng.normal(size=n)
    model = bf16_layer("MatMul", (2, m, k), w, b, (2, m, n))
    assert "BF16MatMulPacked" in ops_after_passes(model)
    x = rng.normal(size=(2, m, k)).astype(np.float32)
    compiled = ember.compile(model, target=target)
    amx = "amx_bf16" in host_cpu_flags() and m % 16 == 0 and n >= 32
    assert ("_amx" in compiled.source) == amx
    y = compiled(x)
    wr = rounded(w)
    within(y, rounded(x) @ wr + b.astype(np.float32), np.abs(rounded(x)) @ np.abs(wr) + np.abs(b), k)


@needs_bf16
def test_gemm_trans_b_in_bf16_matches_numpy():
    rng = np.random.default_rng(2)
    w, b = rng.normal(size=(24, 33)), rng.normal(size=24)  # transB: W is [N, K], K odd (a padded pair)
    model = bf16_layer("Gemm", (6, 33), w, b, (6, 24), transB=1)
    assert "BF16MatMulPacked" in ops_after_passes(model)
    x = rng.normal(size=(6, 33)).astype(np.float32)
    y = ember.compile(model, target="c -threads=1")(x)
    wr = rounded(w).T
    within(y, rounded(x) @ wr + b.astype(np.float32), np.abs(rounded(x)) @ np.abs(wr) + np.abs(b), 33)


@needs_bf16
@pytest.mark.parametrize("c, co, size, k, stride, pad", [(20, 24, 9, 3, 2, 1), (17, 32, 7, 1, 1, 0),
                                                         (16, 16, 6, 3, 1, 1)])  # fmt: skip
def test_conv_in_bf16_matches_torch(c, co, size, k, stride, pad, monkeypatch):
    torch = pytest.importorskip("torch", reason="the reference convolution")
    monkeypatch.setattr(integer, "BF16_CONVS", True)  # (off by default: the float kernels are faster)
    monkeypatch.setattr(integer, "BF16_MIN_CHANNELS", 16)  # small layers, to test the kernel quickly
    rng = np.random.default_rng(c * co)
    w, b = rng.normal(size=(co, c, k, k)) / np.sqrt(c * k * k), rng.normal(size=co)
    oh = (size + 2 * pad - k) // stride + 1
    model = bf16_layer("Conv", (1, c, size, size), w, b, (1, co, oh, oh), strides=[stride] * 2, pads=[pad] * 4)
    assert "BF16ConvPacked" in ops_after_passes(model)
    x = rng.normal(size=(1, c, size, size)).astype(np.float32)
    y = ember.compile(model, target="c -threads=1")(x)
    conv = torch.nn.functional.conv2d
    xr, wr = torch.from_numpy(rounded(x)), torch.from_numpy(rounded(w))
    exact = conv(xr, wr, torch.from_numpy(b.astype(np.float32).astype(np.float64)), stride=stride, padding=pad)
    magnitude = conv(xr.abs(), wr.abs(), torch.from_numpy(np.abs(b)), stride=stride, padding=pad)
    within(y, exact.numpy(), magnitude.numpy(), c * k * k)


def test_without_avx512_bf16_the_float_kernels_run_the_rounded_operands():
    rng = np.random.default_rng(4)
    w, b = rng.normal(size=(32, 16)), rng.normal(size=16)
    model = bf16_layer("MatMul", (1, 8, 32), w, b, (1, 8, 16))
    target = "c -mcpu=skylake-avx512"  # AVX-512 without the bf16 extension: this runs on any AVX-512 CPU
    if "avx512f" not in host_cpu_flags():
        target = "c -mcpu=x86-64"
    ops = ops_after_passes(model, target)
    assert "BF16MatMulPacked" not in ops and "MatMul" in ops
    x = rng.normal(size=(1, 8, 32)).astype(np.float32)
    y = ember.compile(model, target=target)(x)
    within(y, rounded(x) @ rounded(w) + b.astype(np.float32), np.abs(rounded(x)) @ np.abs(rounded(w)) + np.abs(b), 32)


@needs_bf16
def test_quantized_bf16_model_agrees_with_onnxruntime():
    """ember.quantize(precision="bf16") on an MLP: its products become bf16 kernels; onnxruntime runs the same
    model (the float products of the rounded operands): relative difference at float32 rounding."""
    ort = pytest.importorskip("onnxruntime", reason="the reference runtime")
    from ember import zoo

    model = zoo.mlp(batch=8, features=48, hidden=(64, 32))
    q = ember.quantize(model, [zoo.random_feeds(model, seed=i) for i in range(2)], precision="bf16",
                       report_samples=0)  # fmt: skip
    assert "BF16MatMulPacked" in ops_after_passes(q)
    feeds = zoo.random_feeds(model, seed=9)
    ours = next(iter(ember.compile(q, target="c -threads=1").run(feeds).values()))
    ref = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert np.linalg.norm(ours - ref) <= 1e-5 * np.linalg.norm(ref)
