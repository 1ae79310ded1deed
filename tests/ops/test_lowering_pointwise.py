"""Native kernels of the elementwise and broadcasting operators (elemwise.py, broadcast.py), quantization
(quant.py) and the ai.onnx.ml / TfIdfVectorizer operators (ml.py) against onnxruntime, or against the op's
numpy reference where onnxruntime lacks the op or the dtype, or where ONNX leaves a result to the runtime
(NaN in Max, x / 0).

Table driven: a group is a list of independent nodes compiled as one model (one C compile per group) with
`ember.compile(model, fallback=False)`, so that every node must get a kernel; each output is compared on
fresh random inputs. Float tolerance is 1e-4 relative, 1e-5 absolute; integers and booleans are exact."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.frontend.onnx import ONNX_DTYPES, from_onnx
from ember.ops.evaluate import evaluate

ort = pytest.importorskip("onnxruntime")
RTOL, ATOL = 1e-4, 1e-5
ELEM = {d: k for k, d in ONNX_DTYPES.items()}
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 1e30, -1e30])


@dataclass(frozen=True)
class R:
    """A random graph input; `special` mixes NaN, infinities, signed zeros and halves into a float input."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    low: float = -2.0
    high: float = 2.0
    special: bool = False

    def make(self, rng: np.random.Generator) -> np.ndarray:
        if self.dtype == "bool":
            return rng.random(self.shape) < 0.5
        if self.dtype.startswith(("int", "uint")):
            return rng.integers(int(self.low), int(self.high), self.shape, dtype=self.dtype, endpoint=True)
        x = rng.uniform(self.low, self.high, self.shape).astype(self.dtype)
        if self.special and x.size:
            flat = x.reshape(-1)
            flat[: min(flat.size, SPECIAL.size)] = SPECIAL[: flat.size]
            rng.shuffle(flat)
        return x


@dataclass
class N:
    """One node: inputs are R specs (graph inputs) or arrays (initializers, which the frontend folds)."""

    op: str
    inputs: list
    attrs: dict = field(default_factory=dict)
    ref: bool = False  # compare with Ember's numpy reference instead of onnxruntime
    outputs: int = 1
    domain: str = ""
    out_shape: tuple[int, ...] | None = None  # for ops onnx's shape inference does not know (ai.onnx.ml)


def f(*shape: int, low: float = -2.0, high: float = 2.0, special: bool = False) -> R:
    return R(shape, "float32", low, high, special)


def build(nodes: list[N], opset: int, keep: list[int] | None = None) -> tuple[onnx.ModelProto, dict[str, R]]:
    """A model of the nodes (those in `keep`, by index), and the random specs of its graph inputs by name."""
    inputs, inits, specs, onnx_nodes, outs = [], [], {}, [], []
    for k, n in enumerate(nodes):
        if keep is not None and k not in keep:
            continue
        names = []
        for i, spec in enumerate(n.inputs):
            name = f"n{k}_in{i}" if spec is not None else ""
            names.append(name)
            if isinstance(spec, R):
                specs[name] = spec
                inputs.append(helper.make_tensor_value_info(name, ELEM[spec.dtype], list(spec.shape)))
            elif spec is not None:
                inits.append(numpy_helper.from_array(np.asarray(spec), name))
        outs += [f"n{k}_{n.op}_out{j}" for j in range(n.outputs)]
        onnx_nodes.append(helper.make_node(n.op, names, outs[-n.outputs :], domain=n.domain, **n.attrs))
    out_infos = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs]
    for k, n in enumerate(nodes):
        if n.out_shape is not None:  # an ai.onnx.ml op keeping its input's dtype
            name = f"n{k}_{n.op}_out0"
            info = helper.make_tensor_value_info(name, ELEM[n.inputs[0].dtype], n.out_shape)
            out_infos = [info if o.name == name else o for o in out_infos]
    graph = helper.make_graph(onnx_nodes, "group", inputs, out_infos, inits)
    imports = [helper.make_opsetid("", opset), helper.make_opsetid("ai.onnx.ml", 3)]
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=imports), strict_mode=True)
    return model, specs


def check_group(nodes: list[N], opset: int, rng: np.random.Generator) -> ember.runtime.executor.CompiledModel:
    """Compile the nodes as one model with native kernels only; compare every output with its oracle."""
    model, specs = build(nodes, opset)
    feeds = {name: spec.make(rng) for name, spec in specs.items()}
    compiled = ember.compile(model, fallback=False)
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
            np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL, err_msg=out.name)
        else:
            np.testing.assert_array_equal(g, e, err_msg=out.name)
    return compiled


UNARY = ["Abs", "Neg", "Exp", "Sin", "Cos", "Tan", "Atan", "Sinh", "Cosh", "Asinh", "Ceil", "Floor", "Round", "Sign",
         "Erf", "Relu", "Sigmoid", "Tanh", "Softsign", "Softplus", "HardSwish", "Mish", "Identity"]  # fmt: skip
POSITIVE = ["Sqrt", "Log", "Reciprocal"]
UNIT = ["Asin", "Acos", "Atanh"]
NO_ORT_F64 = {"Tan", "Atan", "Sinh", "Cosh", "Asinh", "Erf", "Softsign", "Softplus", "HardSwish", "Mish"}
SHAPE = (5, 67)  # vector loops with a tail
TFIDF = {"mode": "TF", "min_gram_length": 1, "max_gram_length": 2, "max_skip_count": 3, "ngram_counts": [0, 3],
         "ngram_indexes": [0, 1, 2, 3, 4, 5, 6], "pool_int64s": [2, 3, 5, 5, 6, 7, 8, 6, 7, 3, 3]}  # fmt: skip

GROUPS: dict[str, tuple[int, list[N]]] = {
    "unary-float32": (22, [N(op, [f(*SHAPE, low=-3, high=3)]) for op in UNARY]
                      + [N(op, [f(*SHAPE, low=0.05, high=3)]) for op in POSITIVE]
                      + [N(op, [f(*SHAPE, low=-0.95, high=0.95)]) for op in UNIT]
                      + [N("Acosh", [f(*SHAPE, low=1.05, high=4)])]),
    "unary-float64": (22, [N(op, [R(SHAPE, "float64", -3, 3)], ref=op in NO_ORT_F64) for op in
                           ("Exp", "Tan", "Sinh", "Round", "Sigmoid", "Erf", "Softplus", "Mish")]
                      + [N(op, [R(SHAPE, "float64", 0.05, 3)]) for op in POSITIVE]),
    "activations": (22, [
        N("Elu", [f(*SHAPE)], {"alpha": 0.7}),
        N("Selu", [f(*SHAPE)]),
        N("Selu", [f(*SHAPE)], {"alpha": 1.5, "gamma": 0.5}),
        N("Celu", [f(*SHAPE)], {"alpha": 1.5}),
        N("LeakyRelu", [f(*SHAPE)], {"alpha": 0.2}),
        N("ThresholdedRelu", [f(*SHAPE)], {"alpha": 0.5}),
        N("HardSigmoid", [f(*SHAPE, low=-6, high=6)], {"alpha": 0.3, "beta": 0.4}),
        N("HardSwish", [f(*SHAPE, low=-6, high=6)]),
        N("Gelu", [f(*SHAPE, low=-4, high=4)]),
        N("Gelu", [f(*SHAPE, low=-4, high=4)], {"approximate": "tanh"}),
        N("Shrink", [f(*SHAPE)], {"bias": 0.2, "lambd": 0.6}),
        N("Shrink", [R(SHAPE, "int8", -9, 9)], {"bias": 1.5, "lambd": 2.0}),
        N("Softplus", [f(*SHAPE, low=-100, high=100)]),
        N("Sigmoid", [f(*SHAPE, low=-100, high=100)]),
    ]),
    "opset-24": (24, [N("Swish", [f(*SHAPE)], {"alpha": 0.8}, ref=True), N("Swish", [f(*SHAPE)], ref=True)]),
    # NaN, infinities, signed zeros and halves (Round halves to even); ONNX leaves NaN in Relu/Clip/Max to the
    # runtime, so those compare with the numpy references, which propagate it
    "special-values": (22, [
        *[N(op, [f(4, 8, special=True)]) for op in ("Abs", "Neg", "Ceil", "Floor", "Round", "Sign", "IsNaN", "Exp",
                                                     "Sigmoid", "Tanh", "Softsign")],
        *[N("IsInf", [f(4, 8, special=True)], a) for a in ({}, {"detect_negative": 0}, {"detect_positive": 0})],
        N("Relu", [f(4, 8, special=True)], ref=True),
        N("LeakyRelu", [f(4, 8, special=True)], ref=True),
        N("Clip", [f(4, 8, special=True), np.float32(-1), np.float32(1)], ref=True),
        N("Max", [f(4, 8, special=True), f(4, 8, special=True)], ref=True),
        N("Min", [f(4, 8, special=True), f(8, special=True)], ref=True),
        N("Max", [f(4, 8), f(4, 8, special=True), f(1, 8, special=True)], ref=True),
    ]),
    "unary-int": (22, [
        *[N(op, [R(SHAPE, dt, -100, 100)]) for op in ("Abs", "Neg", "Sign") for dt in ("int8", "int32", "int64")],
        N("Relu", [R(SHAPE, "int32", -100, 100)]),
        N("Relu", [R(SHAPE, "int8", -100, 100)]),
        N("Abs", [R(SHAPE, "uint8", 0, 255)]),
        N("Sign", [R(SHAPE, "uint16", 0, 3)]),
        N("Neg", [R(SHAPE, "int8", -128, 127)], ref=True),  # -(-128) wraps
        *[N("BitwiseNot", [R(SHAPE, dt, lo, hi)]) for dt, lo, hi in (("int32", -99, 99), ("uint8", 0, 255),
                                                                     ("uint64", 0, 10**6), ("int16", -999, 999))],
        N("Not", [R(SHAPE, "bool")]),
        N("Identity", [R(SHAPE, "int64", -5, 5)]),
    ]),
    "cast": (21, [
        *[N("Cast", [f(*SHAPE, low=-100, high=100)], {"to": ELEM[dt]}) for dt in
          ("int8", "int16", "int32", "int64", "float64", "bool")],
        *[N("Cast", [f(*SHAPE, low=0, high=250)], {"to": ELEM[dt]}) for dt in ("uint8", "uint16", "uint32", "uint64")],
        N("Cast", [f(*SHAPE, special=True)], {"to": TensorProto.BOOL}),
        N("Cast", [R(SHAPE, "float64", -1e40, 1e40)], {"to": TensorProto.FLOAT}),
        N("Cast", [R(SHAPE, "int64", -300, 300)], {"to": TensorProto.INT8}),  # wraps
        N("Cast", [R(SHAPE, "int64", -2**40, 2**40)], {"to": TensorProto.FLOAT}),
        N("Cast", [R(SHAPE, "uint8", 0, 255)], {"to": TensorProto.INT8}),
        N("Cast", [R(SHAPE, "int32", -3, 3)], {"to": TensorProto.BOOL}),
        N("Cast", [R(SHAPE, "bool")], {"to": TensorProto.FLOAT}),
        N("Cast", [R(SHAPE, "bool")], {"to": TensorProto.INT64}),
        N("Cast", [f(*SHAPE, low=-300, high=300)], {"to": TensorProto.UINT8}, ref=True),  # wraps like numpy on x86
        N("CastLike", [R(SHAPE, "int32", -9, 9), np.zeros(1, np.float64)]),
    ]),
    "binary-float": (18, [
        *[N(op, [f(3, 1, 67), f(4, 1)]) for op in ("Add", "Sub", "Mul", "Div", "Equal", "Less", "LessOrEqual",
                                                    "Greater", "GreaterOrEqual", "Max", "Min", "Sum", "Mean")],
        N("Equal", [R((3, 67), "float32", -2, 2), R((67,), "float32", -2, 2)]),
        N("Pow", [f(3, 67, low=0.1, high=3), f(67, low=-2, high=2)]),
        N("Pow", [f(3, 67), R((3, 67), "int64", -3, 3)]),
        N("Pow", [f(3, 67), np.float32(2.0)]),
        N("Mod", [f(3, 67, low=-9, high=9), f(67, low=0.5, high=3)], {"fmod": 1}),
        N("Mod", [f(3, 67, low=-9, high=9), f(67, low=-3, high=3)], {"fmod": 1}),
        N("Mod", [R((3, 67), "float64", -9, 9), R((67,), "float64", -3, 3)], {"fmod": 1}),
        N("Sum", [f(2, 3, 67), f(67), f(3, 1), f(1)]),
        N("Mean", [f(2, 3, 67), f(3, 67), f(1, 1, 1)]),
        N("Max", [f(2, 3, 67), f(67), f(3, 1)]),
        N("Min", [f(3, 67)]),
        N("PRelu", [f(2, 3, 67), f(3, 1)]),
        N("PRelu", [f(2, 3, 67), f(1)]),
        N("Where", [R((3, 67), "bool"), f(2, 3, 67), f(67)]),
        N("Where", [R((3, 1), "bool"), R((67,), "int64", -9, 9), R((), "int64", -9, 9)]),
        N("Add", [R((), "float32"), R((), "float32")]),
        N("Mul", [f(0, 67), f(67)]),
        N("Sub", [R((2, 3), "float64"), R((3,), "float64")]),
    ]),
    "binary-int": (18, [
        *[N(op, [R((3, 67), dt, -100, 100), R((67,), dt, -100, 100)]) for op, dt in
          (("Add", "int8"), ("Sub", "int32"), ("Mul", "int64"))],
        N("Add", [R((3, 67), "uint16", 0, 65535), R((67,), "uint16", 0, 65535)]),
        *[N("Div", [R((3, 67), dt, -100, 100), R((67,), dt, 1, 9)]) for dt in ("int8", "int64")],
        N("Div", [R((3, 67), "int32", -100, 100), R((67,), "int32", -9, -1)]),
        N("Div", [R((3, 67), "uint32", 0, 2**32 - 1), R((67,), "uint32", 1, 99)]),
        N("Mod", [R((3, 67), "int32", -100, 100), R((67,), "int32", -9, 9)], {"fmod": 0}, ref=True),  # x % 0: 0
        N("Mod", [R((3, 67), "int64", -100, 100), R((67,), "int64", 1, 9)], {"fmod": 0}),
        N("Mod", [R((3, 67), "int32", -100, 100), R((67,), "int32", -9, -1)], {"fmod": 0}),
        N("Mod", [R((3, 67), "int32", -100, 100), R((67,), "int32", 1, 9)], {"fmod": 1}),
        N("Mod", [R((3, 67), "int8", -100, 100), R((67,), "int8", -9, 9)], {"fmod": 1}, ref=True),
        N("Mod", [R((3, 67), "uint8", 0, 255), R((67,), "uint8", 0, 9)], {"fmod": 0}, ref=True),
        N("Div", [R((3, 67), "int64", -100, 100), R((67,), "int64", -2, 2)], ref=True),  # x / 0 gives 0 as numpy
        N("Div", [np.array([-2**31, -7, 7, 5], np.int32), R((4,), "int32", -1, 1)], ref=True),  # INT_MIN / -1 wraps
        N("Pow", [R((3, 67), "int32", -5, 5), R((67,), "int32", 0, 5)]),
        N("Pow", [R((3, 67), "int64", -5, 5), R((67,), "int64", 0, 9)], ref=True),
        N("Pow", [R((3, 67), "int32", -5, 5), f(67, low=0, high=4)], ref=True),
        *[N(op, [R((3, 67), dt, lo, hi), R((67,), dt, lo, hi)]) for op in ("Less", "Greater", "Max")
          for dt, lo, hi in (("int32", -2**31, 2**31 - 1), ("uint32", 0, 2**32 - 1), ("int64", -2**62, 2**62))],
        N("Equal", [R((3, 67), "int32", -3, 3), R((67,), "int32", -3, 3)]),
        N("Min", [R((3, 67), "uint32", 0, 2**32 - 1), R((67,), "uint32", 0, 2**32 - 1)]),
        N("LessOrEqual", [R((3, 67), "uint8", 0, 255), R((3, 1), "uint8", 0, 255)]),
        N("GreaterOrEqual", [R((3, 67), "uint64", 0, 2**64 - 1), R((67,), "uint64", 0, 2**64 - 1)]),
        N("Max", [R((3, 67), "int8", -100, 100), R((67,), "int8", -100, 100), R((3, 1), "int8", -100, 100)]),
        N("Sum", [R((3, 67), "int32", -100, 100), R((67,), "int32", -100, 100)], ref=True),
        N("Mean", [R((3, 67), "int32", -100, 100), R((67,), "int32", -100, 100)], ref=True),
        N("PRelu", [R((3, 67), "int32", -100, 100), R((67,), "int32", -3, 3)]),
    ]),
    "bitwise": (18, [
        *[N(op, [R((3, 67), dt, 0, hi), R((67,), dt, 0, hi)]) for op, dt, hi in
          (("BitwiseAnd", "uint8", 255), ("BitwiseOr", "int32", 2**31 - 1), ("BitwiseXor", "uint64", 2**64 - 1))],
        N("BitwiseAnd", [R((3, 67), "int16", -999, 999), R((67,), "int16", -999, 999)]),
        *[N("BitShift", [R((3, 67), dt, 0, 200), R((67,), dt, 0, bits + 2)], {"direction": d}, ref=bits < 32)
          for dt, bits, d in (("uint8", 8, "LEFT"), ("uint16", 16, "RIGHT"), ("uint32", 32, "LEFT"),
                              ("uint64", 64, "RIGHT"))],
        *[N("BitShift", [R((3, 67), "int8", -100, 100), R((67,), "int8", -9, 9)], {"direction": d}, ref=True)
          for d in ("LEFT", "RIGHT")],
    ]),
    "logic": (18, [
        *[N(op, [R((3, 67), "bool"), R((67,), "bool")]) for op in ("And", "Or", "Xor", "Equal")],
        N("Not", [R((2, 3, 67), "bool")]),
        N("Where", [R((3, 67), "bool"), R((3, 67), "bool"), R((67,), "bool")], ref=True),  # not in onnxruntime
        N("Equal", [R((3, 67), "int64", -2, 2), R((67,), "int64", -2, 2)]),
    ]),
    "clip": (13, [
        N("Clip", [f(3, 67, low=-3, high=3), np.float32(-1), np.float32(0.5)]),
        N("Clip", [f(3, 67, low=-3, high=3), None, np.float32(0.5)]),
        N("Clip", [f(3, 67, low=-3, high=3), np.float32(-0.5)]),
        N("Clip", [f(3, 67, low=-3, high=3), R((), "float32", -1, 0), R((), "float32", 0, 1)]),
        N("Clip", [f(3, 67, low=-3, high=3), None, R((), "float32", 0, 1)]),
        N("Clip", [f(3, 67)]),
        N("Clip", [R((3, 67), "int32", -100, 100), np.int32(-5), np.int32(7)]),
        N("Clip", [R((3, 67), "uint8", 0, 255), R((), "uint8", 0, 50), R((), "uint8", 100, 200)]),
        N("Clip", [R((3, 67), "int64", -2**60, 2**60), np.int64(-2**55 - 1), np.int64(2**55 + 1)]),
        N("Clip", [f(3, 67), np.float32(0.5), np.float32(-0.5)]),  # min > max: max wins
    ]),
    "quantize-ml": (21, [
        N("QuantizeLinear", [f(2, 3, 40, low=-4, high=4), np.float32(0.02), np.uint8(128)]),
        N("QuantizeLinear", [f(2, 3, 40, low=-4, high=4), np.float32(0.02), np.int8(-3)]),
        N("QuantizeLinear", [f(2, 3, 40, low=-4, high=4), np.float32(0.05)]),
        N("QuantizeLinear", [f(2, 3, 40), np.array([0.02, 0.03, 0.01], np.float32), np.array([1, -2, 3], np.int8)],
          {"axis": 1}),
        N("QuantizeLinear", [f(2, 3, 40), R((2, 3, 10), "float32", 0.01, 0.1), R((2, 3, 10), "int8", -5, 5)],
          {"axis": 2, "block_size": 4}),
        N("QuantizeLinear", [f(2, 3, 40), np.float32(0.0002), np.int16(-3)]),
        N("QuantizeLinear", [f(2, 3, 40, low=-2, high=2), np.float32(0.01), np.uint16(3)]),
        N("QuantizeLinear", [R((2, 3, 40), "int32", -999, 999), np.float32(3.0), np.int8(2)], ref=True),
        N("QuantizeLinear", [np.array([-1.5, -0.5, 0.5, 1.5, 2.5], np.float32), np.float32(1.0), np.int8(0)]),
        N("DequantizeLinear", [R((2, 3, 40), "uint8", 0, 255), np.float32(0.02), np.uint8(128)]),
        N("DequantizeLinear", [R((2, 3, 40), "int8", -128, 127), np.array([0.02, 0.03, 0.01], np.float32),
                               np.array([1, 2, 3], np.int8)], {"axis": 1}),
        N("DequantizeLinear", [R((2, 3, 40), "int32", -999, 999), np.float32(0.5)]),
        N("DequantizeLinear", [R((2, 3, 40), "int16", -999, 999), np.float32(0.5), np.int16(-7)]),
        N("DequantizeLinear", [R((2, 3, 40), "int8", -128, 127), R((2, 3, 10), "float32", 0.01, 0.1),
                               R((2, 3, 10), "int8", -5, 5)], {"axis": 2, "block_size": 4}),
        N("Binarizer", [f(3, 67)], {"threshold": 0.3}, domain="ai.onnx.ml"),
        N("Binarizer", [R((3, 67), "int32", -9, 9)], {"threshold": 1.5}, domain="ai.onnx.ml", ref=True),
        N("DynamicQuantizeLinear", [f(3, 67)], outputs=3),
        N("DynamicQuantizeLinear", [f(3, 67, low=0.1, high=3)], outputs=3),  # the range still includes 0
        N("ArrayFeatureExtractor", [f(3, 67), R((2, 2), "int64", 0, 66)], domain="ai.onnx.ml", out_shape=(3, 4)),
        N("ArrayFeatureExtractor", [f(3, 67), R((3,), "int64", -67, 66)], domain="ai.onnx.ml", out_shape=(3, 3),
          ref=True),  # negative indices: onnxruntime rejects them, np.take counts from the end
        N("ArrayFeatureExtractor", [f(67), R((3,), "int64", 0, 66)], domain="ai.onnx.ml", out_shape=(1, 3)),
        N("TfIdfVectorizer", [R((2, 12), "int32", 1, 8)], TFIDF),
        N("TfIdfVectorizer", [R((12,), "int64", 1, 8)], {**TFIDF, "mode": "IDF", "weights": [0.5, 1, 2, 3, 4, 5, 6]}),
        N("TfIdfVectorizer", [R((12,), "int64", 1, 8)], {**TFIDF, "mode": "TFIDF", "min_gram_length": 2}),
        N("Dropout", [f(3, 67)], outputs=2),
        N("Dropout", [f(3, 67), np.float32(0.3), np.bool_(False)]),
    ]),
}  # fmt: skip


@pytest.mark.parametrize("group", GROUPS)
def test_group_matches_oracle(group: str, rng: np.random.Generator):
    opset, nodes = GROUPS[group]
    compiled = check_group(nodes, opset, rng)
    assert compiled.summary()["fallback_ops"] == []


def test_shapes_scalars_and_empty(rng: np.random.Generator):
    """Rank 0, size 0, and a size that takes the parallel path with a vector tail."""
    nodes = [
        N("Relu", [R((), "float32")]),
        N("Add", [R((), "float32"), R((3, 1), "float32")]),
        N("Exp", [R((0, 5), "float32")]),
        N("Where", [R((0, 1), "bool"), R((5,), "float32"), R((), "float32")]),
        N("Cast", [R((3, 0), "float32")], {"to": TensorProto.INT32}),
        N("Tanh", [R((257, 129), "float32")]),
        N("Mul", [R((257, 129), "float32"), R((129,), "float32")]),
        N("Less", [R((257, 129), "int32", -9, 9), R((257, 1), "int32", -9, 9)]),
    ]
    check_group(nodes, 18, rng)


def test_math_functions_te_lacked_are_libm_calls():
    """The inverse and hyperbolic functions are intrinsics that C renders with libm, in float and double."""
    model, _ = build([N("Asinh", [f(8)]), N("Atan", [R((8,), "float64")])], 18)
    source = ember.compile(model, fallback=False).source
    assert "asinhf(" in source and "atan(" in source


def test_integer_division_never_traps():
    """x / 0, x % 0 and INT_MIN / -1 would trap in C: they give numpy's answers instead."""
    x = np.array([7, -7, -(2**31), 5, -(2**31), 0], np.int32)
    y = np.array([0, 0, -1, -1, 3, 0], np.int32)
    nodes = [N("Div", [x, R((6,), "int32", 0, 0)]), N("Mod", [x, R((6,), "int32", 0, 0)], {"fmod": 1})]
    model, _ = build(nodes, 18)
    compiled = ember.compile(model, fallback=False)
    with np.errstate(all="ignore"):
        out = compiled.run({"n0_in1": y, "n1_in1": y})
        div = np.where(y == 0, 0, np.trunc(x.astype(np.float64) / np.where(y == 0, 1, y)))
    np.testing.assert_array_equal(out["n0_Div_out0"], np.where((x == -(2**31)) & (y == -1), x, div).astype(np.int32))
    np.testing.assert_array_equal(out["n1_Mod_out0"], np.fmod(x, np.where(y == 0, 1, y)) * (y != 0))
