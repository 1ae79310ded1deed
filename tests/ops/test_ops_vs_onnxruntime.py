"""Each operator's numpy reference against onnxruntime, table driven.

A case is one ONNX node: random graph inputs (`R`) and constant operands (`C`, which the
frontend folds into Ember's normalized attributes). The model is imported with
`from_onnx`, run with the reference evaluator, and compared with onnxruntime."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from ember.frontend.onnx import ONNX_DTYPES, from_onnx
from ember.ops import OPS
from ember.ops.evaluate import evaluate

ort = pytest.importorskip("onnxruntime")
RTOL, ATOL = 1e-4, 1e-5
ELEM = {d: k for k, d in ONNX_DTYPES.items()}


@dataclass(frozen=True)
class R:
    """A random graph input."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    low: float = -2.0
    high: float = 2.0

    def make(self, rng: np.random.Generator) -> np.ndarray:
        if self.dtype == "bool":
            return rng.random(self.shape) < 0.5
        if self.dtype.startswith(("int", "uint")):
            return rng.integers(int(self.low), int(self.high) + 1, self.shape).astype(self.dtype)
        return rng.uniform(self.low, self.high, self.shape).astype(self.dtype)


@dataclass(frozen=True)
class C:
    """A constant operand (an initializer)."""

    value: object
    dtype: str = "int64"

    def make(self, rng: np.random.Generator) -> np.ndarray:
        return np.asarray(self.value, dtype=self.dtype)


@dataclass
class Case:
    op: str
    inputs: list
    attrs: dict = field(default_factory=dict)
    opset: int = 18
    outputs: int = 1
    id: str = ""


def f(*shape: int, low: float = -2.0, high: float = 2.0) -> R:
    return R(shape, "float32", low, high)


def i64(*shape: int, low: int = -5, high: int = 5) -> R:
    return R(shape, "int64", low, high)


UNARY = ["Abs", "Neg", "Exp", "Sin", "Cos", "Tan", "Atan", "Sinh", "Cosh", "Asinh", "Ceil", "Floor", "Round", "Sign",
         "Erf", "Relu", "Sigmoid", "Tanh", "Softsign", "Softplus", "HardSwish", "Mish", "Identity"]  # fmt: skip
POSITIVE = ["Sqrt", "Log", "Reciprocal"]
BINARY = ["Add", "Sub", "Mul", "Div", "Min", "Max", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"]

CASES: list[Case] = (
    [Case(op, [f(2, 3, 4)]) for op in UNARY]
    + [Case(op, [f(2, 3, 4, low=0.1, high=3.0)]) for op in POSITIVE]
    + [Case(op, [f(2, 1, 4), f(3, 1)]) for op in BINARY]
    + [
        Case("Asin", [f(3, 4, low=-0.9, high=0.9)]),
        Case("Acos", [f(3, 4, low=-0.9, high=0.9)]),
        Case("Atanh", [f(3, 4, low=-0.9, high=0.9)]),
        Case("Acosh", [f(3, 4, low=1.1, high=3.0)]),
        Case("Not", [R((3, 4), "bool")]),
        Case("And", [R((3, 4), "bool"), R((4,), "bool")]),
        Case("Or", [R((3, 4), "bool"), R((4,), "bool")]),
        Case("Xor", [R((3, 4), "bool"), R((4,), "bool")]),
        Case("Add", [i64(3, 4), i64(4)], id="int"),
        Case("Div", [i64(3, 4, low=-20, high=20), R((3, 4), "int64", 1, 6)], id="int-truncates"),
        Case("Mod", [i64(3, 4, low=-20, high=20), R((3, 4), "int64", 1, 6)]),
        Case("Mod", [f(3, 4), f(3, 4, low=0.5, high=2)], {"fmod": 1}, id="fmod"),
        Case("Pow", [f(3, 4, low=0.1, high=2), f(4, low=-2, high=2)]),
        Case("Pow", [f(3, 4), C(2.0, "float32")], id="square"),
        Case("Where", [R((3, 4), "bool"), f(3, 4), f(4)]),
        Case("Elu", [f(3, 4)], {"alpha": 0.7}),
        Case("Selu", [f(3, 4)]),
        Case("Celu", [f(3, 4)], {"alpha": 1.5}),
        Case("LeakyRelu", [f(3, 4)], {"alpha": 0.2}),
        Case("ThresholdedRelu", [f(3, 4)], {"alpha": 0.5}),
        Case("HardSigmoid", [f(3, 4)], {"alpha": 0.3, "beta": 0.4}),
        Case("Shrink", [f(3, 4)], {"bias": 0.2, "lambd": 0.6}),
        Case("Gelu", [f(3, 4)], opset=20),
        Case("Gelu", [f(3, 4)], {"approximate": "tanh"}, opset=20, id="tanh"),
        Case("PRelu", [f(2, 3, 4), f(3, 1)]),
        Case("Clip", [f(3, 4), C(-0.5, "float32"), C(0.7, "float32")]),
        Case("Clip", [f(3, 4), f(), f()], id="dynamic-bounds"),
        Case("Clip", [f(3, 4)], {"min": -0.5, "max": 0.5}, opset=6, id="opset6"),
        Case("IsNaN", [f(3, 4)]),
        Case("IsInf", [f(3, 4)]),
        Case("Cast", [f(3, 4, low=-9, high=9)], {"to": onnx.TensorProto.INT32}),
        Case("Cast", [i64(3, 4)], {"to": onnx.TensorProto.FLOAT}, id="to-float"),
        Case("Cast", [f(3, 4)], {"to": onnx.TensorProto.BOOL}, id="to-bool"),
        Case("CastLike", [f(3, 4), R((1,), "float16")]),
        Case("Sum", [f(3, 4), f(4), f(3, 1)]),
        Case("Mean", [f(3, 4), f(4)]),
        Case("Max", [f(3, 4), f(4), f(3, 1)], id="variadic"),
        Case("BitShift", [R((3, 4), "uint32", 0, 100), R((3, 4), "uint32", 0, 4)], {"direction": "LEFT"}),
        Case("BitwiseAnd", [i64(3, 4, high=50), i64(3, 4, high=50)]),
        # matrix products and convolution
        Case("MatMul", [f(2, 3, 4, 5), f(5, 6)]),
        Case("MatMul", [f(5), f(2, 5, 3)], id="vector"),
        Case("Gemm", [f(4, 5), f(6, 5), f(6)], {"transB": 1, "alpha": 0.5, "beta": 2.0}),
        Case("Gemm", [f(5, 4), f(5, 6)], {"transA": 1}, id="no-C"),
        Case("Einsum", [f(2, 3, 4), f(2, 4, 5)], {"equation": "bij,bjk->bik"}),
        Case("Conv", [f(1, 3, 9, 9), f(4, 3, 3, 3), f(4)], {"pads": [1, 1, 1, 1]}),
        Case("Conv", [f(2, 4, 9, 8), f(8, 2, 3, 2)], {"strides": [2, 1], "dilations": [2, 1], "group": 2},
             id="strided-dilated-grouped"),  # fmt: skip
        Case("Conv", [f(1, 6, 7, 7), f(6, 1, 3, 3)], {"group": 6, "auto_pad": "SAME_UPPER"}, id="depthwise-same"),
        Case("Conv", [f(1, 2, 7, 7), f(3, 2, 4, 4)], {"strides": [2, 2], "auto_pad": "SAME_LOWER"}, id="same-lower"),
        Case("Conv", [f(1, 2, 9), f(3, 2, 3)], {"pads": [2, 0]}, id="1d"),
        Case("Conv", [f(1, 2, 5, 5, 5), f(2, 2, 3, 3, 3)], {"pads": [1] * 6}, id="3d"),
        Case("ConvTranspose", [f(1, 3, 5, 5), f(3, 2, 3, 3), f(2)], {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
        Case("ConvTranspose", [f(1, 4, 4, 4), f(4, 1, 3, 3)],
             {"strides": [2, 2], "group": 2, "output_padding": [1, 1]}, id="grouped"),  # fmt: skip
        Case("ConvTranspose", [f(1, 2, 3, 3), f(2, 2, 3, 3)], {"strides": [2, 2], "output_shape": [7, 8]},
             id="output-shape"),  # fmt: skip
        # pooling and normalization
        Case("MaxPool", [f(1, 2, 8, 8)], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        Case("MaxPool", [f(1, 2, 7, 7)], {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, id="ceil"),
        Case("MaxPool", [f(1, 2, 6, 6)], {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER"}, outputs=2,
             id="indices"),  # fmt: skip
        Case("AveragePool", [f(1, 2, 8, 8)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
        Case("AveragePool", [f(1, 2, 8, 8)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1},
             id="count-pad"),  # fmt: skip
        Case("AveragePool", [f(1, 2, 7, 7)], {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, id="ceil"),
        Case("LpPool", [f(1, 2, 6, 6)], {"kernel_shape": [2, 2], "strides": [2, 2], "p": 2}),
        Case("GlobalAveragePool", [f(2, 3, 5, 4)]),
        Case("GlobalMaxPool", [f(2, 3, 5, 4)]),
        Case("BatchNormalization", [f(2, 3, 4, 4), f(3), f(3), f(3), f(3, low=0.5, high=2)], {"epsilon": 1e-3}),
        Case("InstanceNormalization", [f(2, 3, 4, 4), f(3), f(3)]),
        Case("LayerNormalization", [f(2, 5, 8), f(8), f(8)], opset=17),
        Case("LayerNormalization", [f(2, 5, 8), f(5, 8)], {"axis": 1}, opset=17, id="axis1-no-bias"),
        Case("GroupNormalization", [f(2, 6, 4, 4), f(6), f(6)], {"num_groups": 3}, opset=21),
        Case("LpNormalization", [f(3, 4)], {"axis": 1}),
        Case("LRN", [f(1, 5, 4, 4)], {"size": 3}),
        Case("MeanVarianceNormalization", [f(2, 3, 4, 4)]),
        Case("Softmax", [f(2, 3, 5)], {"axis": 1}),
        Case("LogSoftmax", [f(2, 3, 5)]),
        Case("Hardmax", [f(2, 3, 5)]),
        Case("Dropout", [f(3, 4)]),
        # reductions
        Case("ReduceSum", [f(2, 3, 4), C([1])], {"keepdims": 0}),
        Case("ReduceMean", [f(2, 3, 4), C([0, 2])]),
        Case("ReduceMax", [f(2, 3, 4), C([-1])]),
        Case("ReduceMin", [f(2, 3, 4)], id="all-axes"),
        Case("ReduceProd", [f(2, 3, 4, low=0.5, high=1.5), C([1])]),
        Case("ReduceL1", [f(2, 3, 4), C([1])]),
        Case("ReduceL2", [f(2, 3, 4), C([1])]),
        Case("ReduceLogSum", [f(2, 3, 4, low=0.1, high=2), C([1])]),
        Case("ReduceLogSumExp", [f(2, 3, 4), C([1])]),
        Case("ReduceSumSquare", [f(2, 3, 4), C([1])]),
        Case("ReduceMean", [f(2, 3, 4)], {"axes": [1]}, opset=13, id="opset13-attr"),
        Case("ArgMax", [f(3, 4, 5)], {"axis": 1}),
        Case("ArgMin", [f(3, 4, 5)], {"axis": -1, "keepdims": 0}),
        Case("TopK", [f(3, 6), C([3])], {"axis": 1}, outputs=2),
        Case("TopK", [f(3, 6), C([2])], {"largest": 0}, outputs=2, id="smallest"),
        Case("CumSum", [f(3, 4), C(1)]),
        Case("CumSum", [f(3, 4), C(0)], {"exclusive": 1, "reverse": 1}, id="exclusive-reverse"),
        # shapes and data movement
        Case("Reshape", [f(2, 3, 4), C([0, -1])]),
        Case("Flatten", [f(2, 3, 4)], {"axis": 2}),
        Case("Transpose", [f(2, 3, 4)], {"perm": [2, 0, 1]}),
        Case("Squeeze", [f(2, 1, 4, 1), C([1, 3])]),
        Case("Unsqueeze", [f(2, 4), C([0, 3])]),
        Case("Concat", [f(2, 3), f(2, 5), f(2, 1)], {"axis": 1}),
        Case("Split", [f(2, 6), C([2, 4])], {"axis": 1}, outputs=2),
        Case("Split", [f(6, 2)], {"num_outputs": 3}, outputs=3, id="num-outputs"),
        Case("Slice", [f(5, 6), C([1, -1]), C([4, -6]), C([0, 1]), C([2, -2])]),
        Case("Slice", [f(5, 6), C([-100]), C([100]), C([1])], id="clamped"),
        Case("Gather", [f(5, 4), R((2, 3), "int64", -5, 4)], {"axis": 0}),
        Case("Gather", [f(3, 5), C([[0, -1], [2, 1]])], {"axis": 1}, id="const-indices"),
        Case("GatherElements", [f(3, 4), R((3, 2), "int64", 0, 3)], {"axis": 1}),
        Case("GatherND", [f(3, 4, 2), R((5, 2), "int64", 0, 2)]),
        Case("ScatterElements", [f(3, 4), C([[0, 2], [1, 3], [3, 0]]), f(3, 2)], {"axis": 1}),
        Case("ScatterND", [f(4, 3), C([[1], [3]]), f(2, 3)]),
        Case("Expand", [f(3, 1), C([2, 3, 4])]),
        Case("Tile", [f(2, 3), C([2, 2])]),
        Case("Pad", [f(2, 3), C([1, 0, 0, 2])], {"mode": "constant"}),
        Case("Pad", [f(1, 3, 4, 4), C([0, 0, 1, 1, 0, 0, 1, 1])], {"mode": "reflect"}, id="reflect"),
        Case("Pad", [f(1, 3, 4, 4), C([0, 0, 2, 1, 0, 0, 1, 2])], {"mode": "edge"}, id="edge"),
        Case("Pad", [f(2, 3), C([1, 1, 1, 1]), C(1.5, "float32")], id="value"),
        Case("Shape", [f(2, 3, 4)], {"start": 1}),
        Case("Size", [f(2, 3, 4)]),
        Case("ConstantOfShape", [C([2, 3])], {"value": numpy_helper.from_array(np.array([7], np.int64))}),
        Case("Range", [C(1.0, "float32"), C(5.0, "float32"), C(0.5, "float32")]),
        Case("OneHot", [R((3,), "int64", 0, 4), C([5]), C([0.0, 1.0], "float32")]),
        Case("EyeLike", [f(3, 4)], {"k": 1}),
        Case("Trilu", [f(4, 5), C(1)]),
        Case("DepthToSpace", [f(1, 8, 2, 3)], {"blocksize": 2, "mode": "CRD"}),
        Case("SpaceToDepth", [f(1, 2, 4, 6)], {"blocksize": 2}),
        Case("Resize", [f(1, 2, 3, 4), C([], "float32"), C([1.0, 1.0, 2.0, 1.5], "float32")], {"mode": "nearest"}),
        Case("Resize", [f(1, 2, 4, 4), C([], "float32"), C([1.0, 1.0, 0.6, 1.7], "float32")], {"mode": "linear"},
             id="linear"),  # fmt: skip
        Case("Resize", [f(1, 2, 4, 4), C([], "float32"), C([], "float32"), C([1, 2, 7, 3])],
             {"mode": "linear", "coordinate_transformation_mode": "align_corners"}, id="sizes-align-corners"),
        Case("Resize", [f(1, 1, 4, 4), C([], "float32"), C([1.0, 1.0, 2.0, 2.0], "float32")],
             {"mode": "cubic", "coordinate_transformation_mode": "asymmetric"}, id="cubic"),
        Case("NonZero", [C([[1, 0, 2], [0, 3, 0]], "float32")]),
        Case("Compress", [f(3, 4), C([True, False, True], "bool")], {"axis": 0}),
        # quantization and recurrence
        Case("QuantizeLinear", [f(3, 4), C(0.05, "float32"), C(10, "uint8")]),
        Case("DequantizeLinear", [R((3, 4), "uint8", 0, 255), C([0.1, 0.2, 0.3], "float32"), C([1, 2, 3], "uint8")],
             {"axis": 0}, id="per-axis"),  # fmt: skip
        Case("DynamicQuantizeLinear", [f(3, 4)], outputs=3),
        Case("LSTM", [f(4, 2, 3), f(1, 20, 3), f(1, 20, 5)], {"hidden_size": 5}, outputs=3),
        Case("GRU", [f(4, 2, 3), f(2, 15, 3), f(2, 15, 5)], {"hidden_size": 5, "direction": "bidirectional"},
             outputs=2),  # fmt: skip
        Case("RNN", [f(4, 2, 3), f(1, 5, 3), f(1, 5, 5)], {"hidden_size": 5}, outputs=2),
        Case("GridSample", [f(1, 2, 4, 5), f(1, 3, 3, 2, low=-1.1, high=1.1)], opset=20),
        Case("RoiAlign", [f(1, 2, 8, 8), C([[0.5, 1.0, 6.0, 5.5], [2.0, 2.0, 3.0, 7.0]], "float32"), C([0, 0])],
             {"output_height": 2, "output_width": 3}, opset=16),
    ]
)


def case_id(case: Case) -> str:
    return case.op + (f"-{case.id}" if case.id else "")


def build(case: Case, rng: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    inputs, inits, feeds, names = [], [], {}, []
    for i, spec in enumerate(case.inputs):
        name = f"in{i}"
        data = spec.make(rng)
        names.append(name)
        if isinstance(spec, C):
            inits.append(numpy_helper.from_array(data, name))
        else:
            inputs.append(helper.make_tensor_value_info(name, ELEM[data.dtype.name], list(data.shape)))
            feeds[name] = data
    outs = [f"out{i}" for i in range(case.outputs)]
    node = helper.make_node(case.op, names, outs, **case.attrs)
    out_infos = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outs]
    graph = helper.make_graph([node], case_id(case), inputs, out_infos, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)])
    model = onnx.shape_inference.infer_shapes(model)  # fills in the output types
    for out in model.graph.output:  # ops onnx cannot infer here produce the type of their first input
        if not out.type.tensor_type.elem_type or not out.type.tensor_type.HasField("shape"):
            out.type.CopyFrom(inputs[0].type)
    return model, feeds


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_reference_matches_onnxruntime(case: Case):
    model, feeds = build(case, np.random.default_rng(7))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = sess.run(None, feeds)
    got = list(evaluate(from_onnx(model), feeds).values())
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape, f"{g.dtype}{g.shape} vs {e.dtype}{e.shape}"
        if np.issubdtype(e.dtype, np.floating):
            np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL)
        else:
            np.testing.assert_array_equal(g, e)


ISSUE_OPS = """Conv ConvTranspose BatchNormalization Relu LeakyRelu Clip Sigmoid HardSigmoid HardSwish Tanh Gelu Erf Elu
Softplus Add Sub Mul Div Pow Sqrt Exp Log Neg Abs Reciprocal Min Max Where Equal Less Greater Not And Cast MatMul Gemm
Softmax LogSoftmax LayerNormalization ReduceMean ReduceSum ReduceMax ReduceMin ReduceProd MaxPool AveragePool
GlobalAveragePool GlobalMaxPool Flatten Reshape Transpose Squeeze Unsqueeze Concat Split Slice Gather Expand Shape
ConstantOfShape Range Pad Resize Identity Dropout Tile ArgMax TopK""".split()


def test_every_operator_of_the_issue_has_an_entry():
    assert [op for op in ISSUE_OPS if op not in OPS] == []


def test_every_case_op_is_tested_against_its_entry():
    tested = {c.op for c in CASES} - {"CastLike"}
    assert tested <= set(OPS)
    assert set(ISSUE_OPS) - {"Constant"} <= tested
