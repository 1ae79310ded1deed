"""Native kernels of the neural-network operators against onnxruntime (or the op's numpy reference where
onnxruntime lacks the op or the dtype), table driven.

A group of independent nodes is one model, compiled once with `ember.compile(model, fallback=False)`. The
shapes cover each template of `ember.templates.nn`: GEMM with packed panels and tails, with B read in
place (few rows), transposed (few columns); direct convolution with channel vectors (conv_oc) and width vectors
(conv_ow: depthwise, grouped, strided), the 1x1 GEMM path in both orientations; pooling windows with and
without vectors, ceil mode and pads; row reductions with and without the vectorized partial stage and tails,
and their keepdims fallback on non-trailing axes. Float32 sums run in another order than the float64
references: the absolute tolerance scales with the output's magnitude (1e-5 of its largest value)."""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember import te
from ember.frontend.onnx import ONNX_DTYPES, from_onnx
from ember.ops import get_op
from ember.ops.evaluate import evaluate
from ember.ops.matmul import matmul_te
from ember.templates import nn as T
from ember.tir.dtype import dtype as as_dtype

ort = pytest.importorskip("onnxruntime")
RTOL = 1e-4
ELEM = {d: k for k, d in ONNX_DTYPES.items()}


@dataclass(frozen=True)
class R:
    """A random graph input."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    low: float = -2.0
    high: float = 2.0

    def make(self, rng: np.random.Generator) -> np.ndarray:
        if self.dtype.startswith(("int", "uint")):
            return rng.integers(int(self.low), int(self.high), self.shape, endpoint=True).astype(self.dtype)
        return np.asarray(rng.uniform(self.low, self.high, self.shape)).astype(self.dtype)


def f(*shape: int, low: float = -2.0, high: float = 2.0) -> R:
    return R(shape, "float32", low, high)


def u8(*shape: int) -> R:
    return R(shape, "uint8", 0, 255)


def i8(*shape: int) -> R:
    return R(shape, "int8", -128, 127)


@dataclass
class N:
    """One node: inputs are R specs (graph inputs), arrays (initializers) or None (absent optional input)."""

    op: str
    inputs: list
    attrs: dict = field(default_factory=dict)
    outputs: int = 1
    ref: bool = False  # compare with Ember's numpy reference instead of onnxruntime


def build(nodes: list[N], opset: int, keep: list[int] | None = None) -> tuple[onnx.ModelProto, dict[str, R]]:
    inputs, inits, specs, onnx_nodes, outs = [], [], {}, [], []
    for k, n in enumerate(nodes):
        if keep is not None and k not in keep:
            continue
        names = []
        for i, spec in enumerate(n.inputs):
            if spec is None:
                names.append("")
                continue
            names.append(f"n{k}_in{i}")
            if isinstance(spec, R):
                specs[names[-1]] = spec
                inputs.append(helper.make_tensor_value_info(names[-1], ELEM[spec.dtype], list(spec.shape)))
            else:
                inits.append(numpy_helper.from_array(np.asarray(spec), names[-1]))
        node_outs = [f"n{k}_{n.op}_out{j}" for j in range(n.outputs)]
        outs += [(o, n, j) for j, o in enumerate(node_outs)]
        onnx_nodes.append(helper.make_node(n.op, names, node_outs, **n.attrs))
    infos = [helper.make_tensor_value_info(o, 0, None) for o, _, _ in outs]
    graph = helper.make_graph(onnx_nodes, "group", inputs, infos, inits)
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))
    for info, (name, n, j) in zip(model.graph.output, outs):
        if not info.type.tensor_type.HasField("shape"):  # onnx infers no type (newer ops): ask the reference
            t = _reference_output(n, j)
            info.CopyFrom(helper.make_tensor_value_info(name, ELEM[t.dtype.name], list(t.shape)))
    return model, specs


def _reference_output(n: N, j: int) -> np.ndarray:
    opdef = get_op(n.op)
    args = [None if s is None else s.make(np.random.default_rng(0)) if isinstance(s, R) else np.asarray(s)
            for s in n.inputs]  # fmt: skip
    return np.asarray(opdef.reference(opdef.check_attrs(n.attrs), *args)[j])


def check_group(nodes: list[N], opset: int, rng: np.random.Generator, target: str = "c"):
    model, specs = build(nodes, opset)
    feeds = {name: spec.make(rng) for name, spec in specs.items()}
    compiled = ember.compile(model, target=target, fallback=False)
    got = compiled.run(feeds)
    expected = evaluate(from_onnx(model), feeds)
    by_ort = [k for k, n in enumerate(nodes) if not n.ref]
    if by_ort:
        sub, sub_specs = build(nodes, opset, keep=by_ort)
        sess = ort.InferenceSession(sub.SerializeToString(), providers=["CPUExecutionProvider"])
        names = [o.name for o in sub.graph.output]
        expected.update(zip(names, sess.run(names, {name: feeds[name] for name in sub_specs})))
    for out in model.graph.output:
        g, e = got[out.name], np.asarray(expected[out.name])
        assert g.dtype == e.dtype and g.shape == e.shape, f"{out.name}: {g.dtype}{g.shape}, expected {e.dtype}{e.shape}"
        if e.dtype.kind == "f":
            scale = float(np.abs(e).max()) if e.size else 0.0
            np.testing.assert_allclose(g, e, rtol=RTOL, atol=1e-5 * max(1.0, scale), err_msg=out.name)
        else:
            np.testing.assert_array_equal(g, e, err_msg=out.name)
    assert compiled.summary()["fallback_ops"] == []
    return compiled


def seeded(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


P1 = {"pads": [1, 1, 1, 1]}
LSTM_B = np.random.default_rng(0).uniform(-1, 1, (1, 24)).astype(np.float32)

GROUPS: dict[str, tuple[int, list[N]]] = {
    "matmul": (
        18,
        [
            N("MatMul", [f(40, 64), f(64, 96)]),  # packed B, row tail (40 = 3 x 12 + 4)
            N("MatMul", [f(50, 33), f(33, 70)]),  # column tail past the last panel, K % 4 != 0
            N("MatMul", [f(1, 10), f(10, 10)]),  # one row, fewer columns than a vector
            N("MatMul", [f(3, 5), f(5, 40)]),  # few rows: B read in place, shifted last tile
            N("MatMul", [f(100, 24), f(24, 10)]),  # few columns: the transposed product
            N("MatMul", [f(2, 3, 4, 5), f(5, 6)]),  # batch of A only: B packed once
            N("MatMul", [f(2, 1, 7, 9), f(3, 9, 20)]),  # batch broadcasting both ways
            N("MatMul", [f(4), f(4, 5)]),
            N("MatMul", [f(3, 4), f(4)]),
            N("MatMul", [f(6), f(6)]),
            N("MatMul", [f(0, 5), f(5, 3)]),  # size 0
            N("MatMul", [f(2, 3, 0), f(0, 4)]),  # empty reduction: zeros
            N("MatMul", [R((3, 4), "int32", -9, 9), R((4, 37), "int32", -9, 9)]),
            N("MatMul", [R((5, 4), "float64"), R((4, 3), "float64")]),
        ],
    ),  # fmt: skip
    "gemm": (
        13,
        [
            N("Gemm", [f(30, 20), f(30, 40), f(20, 1)], {"transA": 1}),
            N("Gemm", [f(20, 30), f(40, 30), f(40)], {"transB": 1, "alpha": 0.5, "beta": 2.0}),
            N("Gemm", [f(5, 6), f(6, 7), f()], {"beta": -1.0}),
            N("Gemm", [f(5, 6), f(6, 7), f(5, 7)], {"alpha": 0.0}),
            N("Gemm", [f(6, 5), f(7, 6)], {"transA": 1, "transB": 1}),
            N("Gemm", [f(2, 70), f(30, 70), f(30)], {"transB": 1, "alpha": 2.0}),  # a linear layer: dot products
            N("Gemm", [f(40, 3), f(33, 40)], {"transA": 1, "transB": 1}),
            N("Gemm", [R((3, 4), "int32", -9, 9), R((4, 5), "int32", -9, 9), R((5,), "int32", -9, 9)], ref=True),
        ],
    ),  # fmt: skip
    "conv": (
        18,
        [
            N("Conv", [f(1, 32, 9, 10), f(32, 32, 3, 3)], P1),  # conv_oc: 2-vector channel blocks, width tail
            N("Conv", [f(2, 16, 9, 11), f(16, 16, 3, 3), f(16)], {"pads": [1, 0, 2, 1], "strides": [2, 1]}),
            N("Conv", [f(1, 8, 10, 40), f(8, 1, 3, 3)], {"pads": [1, 1, 1, 1], "group": 8}),  # depthwise, wide rows
            N("Conv", [f(1, 6, 11, 12), f(6, 1, 3, 3)], {"pads": [1, 1, 1, 1], "group": 6, "strides": [2, 2]}),
            N("Conv", [f(1, 6, 10, 10), f(4, 3, 3, 3)], {"group": 2, "dilations": [2, 2]}),
            N("Conv", [f(2, 5, 17), f(7, 5, 4)], {"pads": [2, 1], "strides": [3]}),  # 1-d
            N("Conv", [f(1, 3, 5, 6, 7), f(16, 3, 3, 3, 3), f(16)], {"pads": [1, 1, 0, 0, 1, 1]}),  # 3-d
            N("Conv", [f(2, 8, 6, 40), f(24, 8, 1, 1), f(24)]),  # 1x1: GEMM per output row
            N("Conv", [f(1, 8, 5, 7), f(40, 8, 1, 1)]),  # 1x1 with narrow rows: channels in the vectors
            N("Conv", [f(1, 32, 6, 6), f(32, 16, 1, 1)], {"group": 2}),  # grouped 1x1: conv_oc
            N("Conv", [f(1, 4, 5, 5), f(20, 4, 2, 2)], {"strides": [2, 2]}),  # channels not in whole vectors
            N("Conv", [f(0, 3, 5, 5), f(4, 3, 3, 3)]),  # empty batch
        ],
    ),  # fmt: skip
    "conv-transpose": (
        18,
        [
            N("ConvTranspose", [f(1, 3, 5, 5), f(3, 2, 3, 3)]),
            N(
                "ConvTranspose",
                [f(2, 4, 5, 6), f(4, 3, 3, 2), f(6)],
                {"strides": [2, 3], "pads": [1, 0, 0, 1], "output_padding": [1, 1], "group": 2},
            ),
            N("ConvTranspose", [f(1, 2, 7), f(2, 3, 3)], {"strides": [2], "dilations": [2]}),
            N("ConvTranspose", [f(1, 2, 3, 3, 3), f(2, 16, 2, 2, 2)], {"strides": [2, 2, 2]}),
            N("ConvTranspose", [f(1, 2, 3, 3), f(2, 2, 3, 3)], {"strides": [2, 2], "output_shape": [7, 8]}),
        ],
    ),  # fmt: skip
    "pool": (
        19,
        [
            N("MaxPool", [f(1, 3, 10, 11)], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
            N(
                "MaxPool",
                [f(2, 3, 10, 11)],
                {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1], "ceil_mode": 1, "dilations": [2, 1]},
            ),
            N("MaxPool", [f(1, 2, 20, 40)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),  # vectors along the width
            N("MaxPool", [f(1, 2, 9)], {"kernel_shape": [2], "strides": [2]}),
            N("MaxPool", [f(1, 2, 5, 6, 7)], {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2]}),
            N("MaxPool", [u8(1, 2, 8, 70)], {"kernel_shape": [2, 2]}),
            N("MaxPool", [f(1, 2, 7, 8)], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, outputs=2),
            N("MaxPool", [f(2, 2, 7, 8)], {"kernel_shape": [2, 3], "strides": [2, 1], "storage_order": 1}, outputs=2),
            N("AveragePool", [f(1, 3, 10, 11)], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
            N(
                "AveragePool",
                [f(1, 3, 10, 11)],
                {
                    "kernel_shape": [3, 3],
                    "strides": [2, 2],
                    "pads": [1, 1, 1, 1],
                    "count_include_pad": 1,
                    "ceil_mode": 1,
                },
            ),
            N(
                "AveragePool",
                [f(1, 2, 9, 10, 7)],
                {"kernel_shape": [2, 3, 2], "strides": [2, 2, 1], "pads": [1, 1, 0, 0, 1, 1], "count_include_pad": 1},
            ),
            N("AveragePool", [f(1, 2, 6, 40)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
            N("AveragePool", [f(1, 2, 12)], {"kernel_shape": [3], "dilations": [2], "pads": [2, 2]}),
            N("LpPool", [f(1, 3, 10, 11)], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "p": 3}),
            N("LpPool", [f(1, 3, 8, 8)], {"kernel_shape": [2, 2], "p": 1}),
            N("LpPool", [f(1, 3, 8, 40)], {"kernel_shape": [2, 2], "p": 2}),
            N("GlobalAveragePool", [f(2, 8, 7, 9)]),
            N("GlobalAveragePool", [f(1, 3, 2)]),
            N("GlobalMaxPool", [f(2, 8, 7, 9)]),
            N("GlobalLpPool", [f(2, 4, 5, 5)], {"p": 2}),
        ],
    ),  # fmt: skip
    "softmax": (
        18,
        [
            N("Softmax", [f(3, 4, 50)]),  # vectorized partial reductions and a tail
            N("Softmax", [f(2, 64, low=-80, high=80)]),  # large logits: the max is subtracted
            N("Softmax", [f(3, 4, 5)], {"axis": 1}),  # not the last axis: keepdims reductions
            N("Softmax", [f(7)]),
            N("LogSoftmax", [f(3, 4, 50)]),
            N("LogSoftmax", [f(3, 4, 5)], {"axis": 0}),
            N("Hardmax", [f(3, 4, 50)]),
            N("Hardmax", [f(3, 4, 5)], {"axis": 1}),
            N("Hardmax", [R((2, 9), low=0, high=2)]),  # ties: the first maximum wins (integer values)
        ],
    ),  # fmt: skip
    "norm": (
        18,
        [
            N("LayerNormalization", [f(5, 70), f(70), f(70)]),
            N("LayerNormalization", [f(2, 3, 4, 5), f(4, 5)], {"axis": 2, "epsilon": 1e-3}),
            N("LayerNormalization", [f(4, 40), f(40), f(40)], outputs=3),
            N("LayerNormalization", [f(3, 300), f(300), f(300)]),  # 4 vectors of partial sums, and a tail
            N("LayerNormalization", [f(2, 768), f(768), f(768)]),
            N("InstanceNormalization", [f(2, 3, 9, 10), f(3), f(3)]),
            N("LpNormalization", [f(2, 3, 40)], {"axis": -1, "p": 1}),
            N("LpNormalization", [f(2, 3, 40)], {"axis": 1, "p": 2}),
            N("MeanVarianceNormalization", [f(2, 3, 4, 5)]),
            N("MeanVarianceNormalization", [f(2, 3, 4, 5)], {"axes": [2, 3]}),
            N("LRN", [f(2, 7, 4, 5)], {"size": 3}),
            N("BatchNormalization", [f(2, 3, 4, 5), f(3), f(3), f(3), f(3, low=0.5, high=2)], {"epsilon": 1e-3}),
            N("BatchNormalization", [f(4, 6), f(6), f(6), f(6), f(6, low=0.5, high=2)]),
            N(
                "BatchNormalization",
                [f(2, 3, 4, 5), f(3), f(3), f(3), f(3, low=0.5, high=2)],
                {"training_mode": 1, "momentum": 0.8},
                outputs=3,
                ref=True,
            ),  # fmt: skip
            N("Det", [f(2, 2)]),
            N("Det", [f(3, 3, 3)]),
            N("Det", [f(2, 4, 4)]),
            N("LRN", [f(1, 5, 3, 3)], {"size": 4, "alpha": 0.01, "beta": 0.6, "bias": 2.0}, ref=True),  # even size
        ],
    ),  # fmt: skip
    "norm-new": (
        23,
        [
            N("RMSNormalization", [f(2, 3, 40), f(40)], ref=True),
            N("RMSNormalization", [f(2, 300), f(300)], ref=True),
            N("RMSNormalization", [f(2, 3, 4), f(3, 4)], {"axis": 1}, ref=True),
            N("GroupNormalization", [f(2, 6, 9, 10), f(6), f(6)], {"num_groups": 3}, ref=True),
            N("GroupNormalization", [f(1, 4, 30), f(4), f(4)], {"num_groups": 4, "epsilon": 1e-2}, ref=True),
        ],
    ),  # fmt: skip
    "einsum": (
        18,
        [
            N("Einsum", [f(3, 5, 5)], {"equation": "...ii ->...i"}),
            N("Einsum", [f(5, 2, 3), f(5, 3, 4)], {"equation": "bij, bjk -> bik"}),
            N("Einsum", [f(2, 3, 20, 8), f(2, 3, 17, 8)], {"equation": "bhid,bhjd->bhij"}),
            N("Einsum", [f(5), f(5)], {"equation": "i,i"}),
            N("Einsum", [f(3, 4)], {"equation": "ij->ji"}),
            N("Einsum", [f(3, 4)], {"equation": "ij->i"}),
            N("Einsum", [f(3), f(4)], {"equation": "i,j->ij"}),
            N("Einsum", [f(2, 3, 4), f(4, 5)], {"equation": "...j,jk->...k"}),
            N("Einsum", [f(2, 1, 3), f(3, 4)], {"equation": "bij,jk->bik"}),
            N("Einsum", [f(4, 3), f(3, 5), f(5)], {"equation": "ij,jk,k->i"}),
        ],
    ),  # fmt: skip
    "recurrent": (
        18,
        [
            N("RNN", [f(3, 2, 4), f(1, 5, 4), f(1, 5, 5), f(1, 10)], {"hidden_size": 5}, outputs=2),
            N(
                "RNN",
                [f(4, 2, 3), f(2, 3, 3), f(2, 3, 3)],
                {"hidden_size": 3, "direction": "bidirectional", "activations": ["Relu", "Tanh"], "clip": 1.5},
                outputs=2,
            ),
            N(
                "GRU",
                [f(3, 2, 4), f(1, 15, 4), f(1, 15, 5), f(1, 30), R((2,), "int32", 1, 3)],
                {"hidden_size": 5, "direction": "reverse"},
                outputs=2,
            ),
            N(
                "GRU",
                [f(2, 3, 3), f(2, 9, 3), f(2, 9, 3), None, None, f(2, 3, 3)],
                {"hidden_size": 3, "direction": "bidirectional", "linear_before_reset": 1},
                outputs=2,
            ),
            N(  # batchwise layout: onnxruntime has none
                "GRU",
                [f(3, 2, 3), f(2, 9, 3), f(2, 9, 3), None, R((3,), "int32", 1, 2), f(3, 2, 3)],
                {"hidden_size": 3, "direction": "bidirectional", "layout": 1},
                outputs=2,
                ref=True,
            ),
            N("LSTM", [f(3, 2, 3), f(1, 16, 3), f(1, 16, 4), f(1, 32)], {"hidden_size": 4}, outputs=3),
            N(
                "LSTM",
                [f(3, 2, 4), f(1, 12, 4), f(1, 12, 3), LSTM_B, R((2,), "int32", 1, 3), f(1, 2, 3), f(1, 2, 3), f(1, 9)],
                {"hidden_size": 3},
                outputs=3,
            ),
            N(
                "LSTM",
                [f(2, 3, 4), f(1, 12, 4), f(1, 12, 3), LSTM_B, R((2,), "int32", 1, 3), f(2, 1, 3), f(2, 1, 3), f(1, 9)],
                {"hidden_size": 3, "layout": 1},
                outputs=3,
                ref=True,
            ),
            N(
                "LSTM",
                [f(2, 1, 3), f(1, 8, 3), f(1, 8, 2)],
                {
                    "hidden_size": 2,
                    "input_forget": 1,
                    "activations": ["HardSigmoid", "Softsign", "Softplus"],
                    "activation_alpha": [0.3],
                    "activation_beta": [0.4],
                },
                outputs=3,
                ref=True,
            ),
        ],
    ),  # fmt: skip
    "integer": (
        18,
        [
            N("MatMulInteger", [u8(5, 6), u8(6, 40), np.array(3, np.uint8), np.array(7, np.uint8)]),
            N("MatMulInteger", [i8(2, 5, 6), i8(6, 4)]),
            N(
                "MatMulInteger",
                [u8(4, 3), u8(3, 20), np.arange(4, dtype=np.uint8), np.arange(20, dtype=np.uint8)],
                ref=True,
            ),
            N("ConvInteger", [u8(1, 3, 6, 6), u8(16, 3, 3, 3), np.array(5, np.uint8)], {"pads": [1, 1, 1, 1]}),
            N("ConvInteger", [u8(1, 2, 5, 5), u8(4, 2, 1, 1), np.array(1, np.uint8), np.array(2, np.uint8)], ref=True),
            N(
                "QLinearMatMul",
                [
                    u8(3, 40),
                    np.array(0.02, np.float32),
                    np.array(100, np.uint8),
                    u8(40, 20),
                    np.array(0.01, np.float32),
                    np.array(120, np.uint8),
                    np.array(0.5, np.float32),
                    np.array(110, np.uint8),
                ],
            ),
            N(
                "QLinearMatMul",
                [
                    i8(2, 3, 8),
                    np.array(0.05, np.float32),
                    np.array(-3, np.int8),
                    i8(8, 5),
                    np.array(0.03, np.float32),
                    np.array(2, np.int8),
                    np.array(0.2, np.float32),
                    np.array(5, np.int8),
                ],
            ),
            N(
                "QLinearConv",
                [
                    u8(1, 3, 7, 8),
                    np.array(0.02, np.float32),
                    np.array(128, np.uint8),
                    u8(16, 3, 3, 3),
                    np.full(16, 0.01, np.float32),
                    np.full(16, 127, np.uint8),
                    np.array(0.3, np.float32),
                    np.array(100, np.uint8),
                    np.arange(16, dtype=np.int32) * 10,
                ],
                {"pads": [1, 1, 1, 1]},
            ),
            N(
                "QLinearConv",
                [
                    i8(1, 4, 6, 6),
                    np.array(0.05, np.float32),
                    np.array(1, np.int8),
                    i8(4, 1, 3, 3),
                    np.array(0.02, np.float32),
                    np.array(0, np.int8),
                    np.array(0.1, np.float32),
                    np.array(-2, np.int8),
                ],
                {"group": 4},
            ),
        ],
    ),  # fmt: skip
}


@pytest.mark.parametrize("name", list(GROUPS))
def test_group(name: str) -> None:
    opset, nodes = GROUPS[name]
    check_group(nodes, opset, seeded(name))


def test_single_thread_target() -> None:
    """-threads=1: no parallel loops; the same tiles."""
    nodes = [N("Conv", [f(1, 16, 8, 8), f(16, 16, 3, 3)], P1), N("MatMul", [f(30, 20), f(20, 50)]),
             N("Softmax", [f(6, 100)]), N("LayerNormalization", [f(6, 100), f(100), f(100)])]  # fmt: skip
    check_group(nodes, 18, seeded("threads"), target="c -threads=1")


def test_matmul_random_shapes() -> None:
    """GEMM plans across sizes around the tile edges (one model, one compile)."""
    rng = seeded("shapes")
    sizes = [1, 2, 7, 8, 12, 13, 16, 17, 31, 32, 33, 47]
    nodes = [N("MatMul", [f(*map(int, rng.choice(sizes, 2))), f(0)]) for _ in range(16)]
    for n in nodes:
        m, k = n.inputs[0].shape
        n.inputs[1] = f(k, int(rng.choice(sizes)))
    check_group(nodes, 18, rng)


def test_fused_epilogues_and_model() -> None:
    """Conv + Relu + residual Add and MatMul + Add fuse into the templates' output tiles; Softmax after."""
    rng = seeded("fused")
    w = numpy_helper.from_array(rng.standard_normal((32, 16, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b")
    w2 = numpy_helper.from_array(rng.standard_normal((32 * 8 * 8, 10)).astype(np.float32) * 0.05, "w2")
    b2 = numpy_helper.from_array(rng.standard_normal(10).astype(np.float32), "b2")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Add", ["r", "x2"], ["s"]),
             helper.make_node("Flatten", ["s"], ["fl"]),
             helper.make_node("MatMul", ["fl", "w2"], ["m"]), helper.make_node("Add", ["m", "b2"], ["a"]),
             helper.make_node("Softmax", ["a"], ["y"])]  # fmt: skip
    graph = helper.make_graph(
        nodes, "fused",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16, 8, 8]),
         helper.make_tensor_value_info("x2", TensorProto.FLOAT, [2, 32, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 10])], [w, b, w2, b2])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    compiled = ember.compile(model, fallback=False)
    feeds = {"x": rng.standard_normal((2, 16, 8, 8)).astype(np.float32),
             "x2": rng.standard_normal((2, 32, 8, 8)).astype(np.float32)}  # fmt: skip
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(compiled.run(feeds)["y"], expected[0], rtol=RTOL, atol=1e-6)
    assert compiled.summary()["kernels"] <= 3


# -- plans: which template serves which shape ---------------------------------------------------------------
def test_gemm_plans() -> None:
    lanes = T.lanes_of("float32", T.host_target())
    assert T.gemm_plan(128, 768, 768, as_dtype("float32")).packed
    few_rows = T.gemm_plan(1, 768, 768, as_dtype("float32"))
    assert not few_rows.packed and few_rows.mr == 1 and few_rows.nr % lanes == 0
    # a B that fits the L2 is read whole by every row tile (rows outside: each thread writes whole rows of C, the
    # ones the next product reads on that thread); a larger one streams panel by panel (panels outside)
    assert T.gemm_plan(3136, 96, 96, as_dtype("float32")).order == "ij"
    assert T.gemm_plan(128, 3072, 768, as_dtype("float32")).order == "ji"
    x, y = te.placeholder((100, 24), "float32"), te.placeholder((24, lanes // 2 + 1), "float32")
    out = matmul_te(x, y)
    assert (out.op.attrs["i_axis"], out.op.attrs["j_axis"]) == (1, 0)  # transposed: vectors along the rows
    out = matmul_te(x, te.placeholder((24, lanes), "float32"))
    assert (out.op.attrs["i_axis"], out.op.attrs["j_axis"]) == (0, 1)  # a whole vector of columns: as it is


def test_gemm_tile_rows_avoid_l1_set_aliasing() -> None:
    """A's rows one L1 way apart (4 KiB in a 32 KiB 8-way L1, or a multiple) share one set: the register tile
    takes at most the ways less ALIAS_SPARE_WAYS of them (6 of 8, 10 of a 48 KiB 12-way L1's); rows at other
    strides spread over the sets and keep the full tile. The host's L1 (sysfs) sets the limit of a native target."""
    from ember.target import Cache, Target, host_l1d

    f32 = as_dtype("float32")
    eight, twelve = Cache(32 << 10, 8), Cache(48 << 10, 12)
    assert T.alias_free_rows(12, 3072 * 4, eight) == 6  # 12 KiB apart: every row in one set
    assert T.alias_free_rows(12, 3072 * 4, twelve) == 10
    assert T.alias_free_rows(12, 2048 * 4, eight) == 6
    assert T.alias_free_rows(12, 1536 * 4, eight) == 12  # 6 KiB: two sets, six rows each
    assert T.alias_free_rows(12, 1536 * 4, twelve) == 12  # 6 KiB of a 4 KiB period: two sets
    assert T.alias_free_rows(12, 768 * 4, eight) == 12 and T.alias_free_rows(12, 1020 * 4, eight) == 12
    host = T.host_target()
    limit = host.l1d.ways - T.ALIAS_SPARE_WAYS
    assert host.l1d == (host_l1d() or T.DEFAULT_L1D)
    aliasing, spread = (T.gemm_plan(128, 768, k, f32, fixed_nr=32).mr for k in (3072, 768))
    assert aliasing <= limit
    # the full tile where the rows spread: 12 with 32 vector registers (AVX-512), 6 with 16
    assert spread == (12 if T.vector_regs(host) >= 32 else 6)
    cross = Target.parse("c -mtriple=aarch64-linux-gnu")
    assert cross.l1d == T.DEFAULT_L1D  # another machine's code: the common 32 KiB 8-way L1


def test_host_l1d_reads_sysfs(tmp_path) -> None:
    """The L1 data cache from a sysfs tree (instruction caches and other levels skipped); None without one."""
    from ember.target import Cache, host_l1d

    for name, level, kind, size, ways in (("index0", 1, "Instruction", "32K", 8), ("index1", 1, "Data", "48K", 12),
                                          ("index2", 2, "Unified", "2048K", 16)):  # fmt: skip
        d = tmp_path / name
        d.mkdir()
        for f, v in (("level", level), ("type", kind), ("size", size), ("ways_of_associativity", ways),
                     ("coherency_line_size", 64)):  # fmt: skip
            (d / f).write_text(f"{v}\n")
    assert host_l1d.__wrapped__(str(tmp_path)) == Cache(48 << 10, 12, 64)
    assert host_l1d.__wrapped__(str(tmp_path / "missing")) is None


@pytest.mark.parametrize("m", [13, 64])
def test_matmul_with_aliasing_rows_matches_numpy(m: int) -> None:
    """A product with K = 1024 (tile rows capped; 13 rows: a partial last tile) against numpy, the weight a
    constant (packed at compile time, as in a model)."""
    rng = np.random.default_rng(m)
    a = rng.standard_normal((m, 1024)).astype("float32")
    b = rng.standard_normal((1024, 40)).astype("float32")
    g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "mm",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, 40])],
                          [numpy_helper.from_array(b, "b")])  # fmt: skip
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    got = ember.compile(model, target="c").run({"a": a})["y"]
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-3)  # float32 sums of 1024 products of N(0,1)


def test_conv_plans() -> None:
    dt = as_dtype("float32")
    lanes = T.lanes_of(dt, T.host_target())
    dense = T.conv_plan(64, 64, 56, 1, dt)
    assert dense.kind == "conv_oc" and dense.block % lanes == 0 and 56 % dense.width == 0
    assert T.conv_plan(32, 1, 112, 1, dt).kind == "conv_ow"  # depthwise
    assert T.conv_plan(3, 3, 10, 2, dt).kind == "conv_ow"


@pytest.mark.parametrize("c, hw, rows_outside", [(16, 29, True), (256, 7, False)])
def test_blocked_conv_parallel_loop_order(monkeypatch, c: int, hw: int, rows_outside: bool) -> None:
    """At 2 threads the blocked convolution's parallel loop takes chunks of rows outside its channel tiles where
    the activations outweigh the weights (each thread then writes all channels of its rows, which the next layer
    reads on the same core), channel tiles outside where the weights do (256 channels at 7 x 7); onnxruntime's
    result either way (29 rows: chunks of uneven height)."""
    from ember import zoo

    monkeypatch.setattr("ember.passes.layout.WINOGRAD_MIN_GAIN", float("inf"))  # the direct template
    b = zoo.Builder(0)
    model = b.model({"x": (1, c, hw, hw)}, b.conv_bn_relu(b.conv_bn_relu("x", c, c), c, c))
    compiled = ember.compile(model, target="c -threads=2", fallback=False)
    fused = re.findall(r"for \(int32_t (\w+_fused) = \(int32_t\)ember_begin", compiled.source)
    assert fused and all(("i2_outer_outer_fused_i1" in f) == rows_outside for f in fused), fused
    feeds = zoo.random_feeds(model, 1)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(list(compiled.run(feeds).values())[0], expected[0], rtol=RTOL, atol=1e-5)


@pytest.mark.parametrize("c, hw, rows", [(32, 41, True), (256, 7, False)])
def test_window_op_threads_split_blocks(c: int, hw: int, rows: bool) -> None:
    """At 2 threads a depthwise convolution (a window op) with 4 or more channel blocks per thread splits its blocks
    across the threads (256 channels at 7 x 7): blocks are independent, split rows read their neighbours' rows from
    the other core. With fewer blocks (32 channels) it splits rows. onnxruntime's result either way."""
    from ember import zoo

    b = zoo.Builder(2)
    y = b.conv_bn_relu("x", c, c, k=1)
    model = b.model({"x": (1, c, hw, hw)}, b.conv_bn_relu(y, c, c, k=3, group=c))
    compiled = ember.compile(model, target="c -threads=2", fallback=False)
    plan = compiled.plan
    (dw,) = [k.name for st in plan.steps for k in getattr(st, "kernels", None) or []
             if any(len(plan.values[a].shape) == 6 and plan.values[a].shape[4] == 1 for a in k.args)]  # fmt: skip
    region = compiled.source.split(f"static void {dw}_par1(", 1)[1].split("\n}\n", 1)[0]
    (fused,) = re.findall(r"for \(int32_t (\w+_fused) = \(int32_t\)ember_begin", region)
    assert ("i2_outer_outer_fused_i1" in fused) == rows, fused  # rows outside the channel blocks, or inside
    feeds = zoo.random_feeds(model, 1)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(list(compiled.run(feeds).values())[0], expected[0], rtol=RTOL, atol=1e-5)


@pytest.mark.parametrize("table", [False, True])
def test_vector_exp(table: bool) -> None:
    """The arithmetic exp of the softmax kernels (powers of two by digits or from a table): about 1 ulp,
    and the special values."""
    x = te.placeholder((4096,), "float32", name="x")
    tab = T.exp_table() if table else None
    y = te.compute((4096,), lambda i: T.exp(x[i], tab), name="y")
    s = te.create_schedule(y)
    _, inner = s[y].split(y.op.axis[0], 16)
    s[y].vectorize(inner)
    fn = ember.build(s, [x, y])
    special = [np.nan, -np.inf, np.inf, 0.0, -0.0, 88.7, 88.72, 88.73, -87.3, -103.0, -104.0, -149.0]
    xs = np.concatenate([np.linspace(-110, 95, 4096 - len(special)), special]).astype(np.float32)
    out = np.empty_like(xs)
    fn(xs, out)
    with np.errstate(over="ignore"):
        ref = np.exp(xs.astype(np.float64)).astype(np.float32)
    normal = np.isfinite(ref) & (ref > np.finfo(np.float32).tiny)
    np.testing.assert_allclose(out[normal], ref[normal], rtol=3e-7)
    np.testing.assert_array_equal(np.isinf(out), np.isinf(ref))
    np.testing.assert_array_equal(np.isnan(out), np.isnan(xs))
    assert np.all(np.abs(out[~normal & np.isfinite(ref)]) <= 2 * np.finfo(np.float32).tiny)


def test_long_recurrence_runs_by_reference() -> None:
    """The time loop is unrolled up to MAX_STEPS step-directions; longer sequences fall back (and say why)."""
    from ember.ops.rnn import MAX_STEPS

    nodes = [N("RNN", [f(MAX_STEPS + 1, 1, 2), f(1, 3, 2), f(1, 3, 3)], {"hidden_size": 3}, outputs=2)]
    model, _ = build(nodes, 18)
    with pytest.raises(Exception, match="unrolled"):
        ember.compile(model, fallback=False)
    compiled = ember.compile(model)
    assert compiled.summary()["fallback_ops"] == ["RNN"]
