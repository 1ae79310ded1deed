"""`ember debug`: a kernel perturbed on purpose (an operator's TE compute made to add 0.01) is flagged at the right
node, with the kernel it was fused into, against the numpy and onnxruntime references; an unperturbed model passes."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ember import te
from ember.debug import debug
from ember.ops import OPS


def small_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 3, 3)).astype("float32"), "w")
    b = numpy_helper.from_array(rng.normal(0, 0.1, (4,)).astype("float32"), "b")
    fc = numpy_helper.from_array(rng.normal(0, 0.3, (4, 5)).astype("float32"), "fc")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["conv"], "conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"], "relu"),
        helper.make_node("Sigmoid", ["relu"], ["sig"], "sig"),
        helper.make_node("GlobalAveragePool", ["sig"], ["pool"], "pool"),
        helper.make_node("Flatten", ["pool"], ["flat"], "flat"),
        helper.make_node("MatMul", ["flat", "fc"], ["mm"], "mm"),
        helper.make_node("Softmax", ["mm"], ["y"], "softmax"),
    ]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], [w, b, fc])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def perturbed_sigmoid(monkeypatch):
    opdef = OPS["Sigmoid"]

    def compute(attrs, x):
        y = opdef.compute(attrs, x)
        return te.compute(y.shape, lambda *i: y[i] + te.const(0.01, "float32"), name="perturbed")

    monkeypatch.setitem(OPS, "Sigmoid", dataclasses.replace(opdef, compute=compute))


@pytest.mark.parametrize("reference", ["numpy", "onnxruntime"])
def test_clean_model_passes(reference):
    pytest.importorskip("onnxruntime")
    report = debug(small_model(), reference=reference)
    assert report.first_bad is None, report.table()
    assert sum(r.error is not None for r in report.rows) >= 6


@pytest.mark.parametrize("reference", ["numpy", "onnxruntime"])
def test_perturbed_kernel_is_flagged_at_its_node(reference, perturbed_sigmoid):
    pytest.importorskip("onnxruntime")
    report = debug(small_model(), reference=reference)
    bad = report.first_bad
    assert bad is not None and bad.node == "sig" and bad.op == "Sigmoid", report.table()
    assert bad.error > 1e-3
    ok = {r.node: r for r in report.rows}
    assert ok["conv"].error < 1e-4 and ok["relu"].error < 1e-4  # the nodes before it agree
    assert bad.kernel.startswith(("fused", "conv")), bad.kernel  # Sigmoid fuses into the conv's epilogue
    assert "first past tolerance: node #2 'sig' (Sigmoid)" in report.table()


def test_command_line(tmp_path, capsys, perturbed_sigmoid):
    from ember.cli import main

    onnx.save(small_model(), tmp_path / "small.onnx")
    assert main(["debug", str(tmp_path / "small.onnx"), "--reference", "numpy"]) == 1  # a node is flagged
    out = capsys.readouterr().out
    assert "first past tolerance: node #2 'sig' (Sigmoid)" in out and "<-- first past tolerance" in out
    assert main(["debug", str(tmp_path / "small.onnx"), "--reference", "tvm"]) == 2


class _SmallTorch:
    """A conv -> relu -> sigmoid -> pool -> linear module, built when torch is there."""

    @staticmethod
    def make():
        torch = pytest.importorskip("torch")
        torch.manual_seed(0)
        nn = torch.nn
        return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Sigmoid(), nn.AdaptiveAvgPool2d(1),
                             nn.Flatten(), nn.Linear(4, 5)).eval(), (torch.randn(1, 3, 8, 8),)  # fmt: skip


def test_torch_reference_clean():
    module, args = _SmallTorch.make()
    report = debug(module, reference="torch", example_inputs=args)
    assert report.first_bad is None, report.table()
    assert sum(r.error is not None for r in report.rows) >= 4, report.table()


def test_torch_reference_flags_the_perturbed_node(perturbed_sigmoid):
    module, args = _SmallTorch.make()
    report = debug(module, reference="torch", example_inputs=args)
    bad = report.first_bad
    assert bad is not None and bad.op == "Sigmoid", report.table()
    assert {r.op for r in report.rows if r.error is not None and r.error < 1e-4} >= {"Conv", "Relu"}, report.table()
