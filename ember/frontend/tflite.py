"""TFLite frontend: `from_tflite(path or bytes) -> Graph`.

The flatbuffer is read with the `tflite` package (the schema's generated Python classes; `pip install
ember[tflite]`). What import does:
  1. read the file and scan every operator of the main subgraph: unsupported ones raise ONE
     `UnsupportedOperatorError` naming each and the tensors it writes;
  2. convert operators in order. TFLite's activations are NHWC; Ember's convolutions and pools are NCHW.
     Each 4-d activation is converted once: a convolution's input is transposed to NCHW and its output stays
     NCHW, elementwise ops, concatenations, pads, means and pools keep whichever layout their inputs have,
     and only ops that care about the order of dims (reshape, softmax, matmul...) or a graph output see NHWC
     again. Weights are transposed at import (OHWI -> OIHW, depthwise 1HWC -> C1HW);
  3. int8/uint8 tensors keep their type: a quantized operator becomes DequantizeLinear of its inputs, the float
     operator (with its fused activation) and QuantizeLinear to its output's scale and zero point, which is what
     the quantization passes match. Quantized weights and biases are dequantized at import (per tensor or per
     channel). Results equal TFLite's reference kernels up to the rounding of the requantization (one step).

Graph inputs and outputs keep their TFLite names, dtypes and (NHWC) shapes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ember.frontend.onnx import FOLD_LIMIT
from ember.frontend.onnx_importer import MAX_OPSET, Importer, ModelError, UnsupportedOperatorError
from ember.graph.ir import Graph, Value
from ember.graph.types import TensorType
from ember.ops.common import ShapeError
from ember.ops.tensor import resolve_reshape
from ember.ops.verify import verify as verify_graph

__all__ = ["CONVERTERS", "from_tflite", "import_tflite", "is_tflite"]

# TFLite TensorType -> Ember dtype
DTYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 6: "bool", 7: "int16", 9: "int8",
          10: "float64", 16: "uint32"}  # fmt: skip
TO_NCHW, TO_NHWC = (0, 3, 1, 2), (0, 2, 3, 1)


def is_tflite(model: object) -> bool:
    """A path ending in .tflite, or bytes with the TFLite file identifier ("TFL3")."""
    if isinstance(model, bytes | bytearray):
        return bytes(model[4:8]) == b"TFL3"
    return isinstance(model, str | os.PathLike) and os.fspath(model).lower().endswith(".tflite")


def _tflite():
    try:
        import tflite
    except ImportError:
        raise ImportError("reading .tflite models needs the `tflite` package: pip install 'ember[tflite]'") from None
    return tflite


@dataclass
class Tensor:
    """One TFLite tensor as the importer holds it: its Ember value, and whether that value is the NCHW
    transpose of the (NHWC) TFLite tensor."""

    value: Value
    nchw: bool = False


class TFLiteImporter:
    def __init__(self, data: bytes, source: str):
        tfl = _tflite()
        self.tfl, self.source = tfl, source
        try:
            self.model = tfl.Model.GetRootAsModel(data, 0)
            self.sub = self.model.Subgraphs(0)
            self.sub.TensorsLength()  # reads the subgraph's table: a truncated file fails here
        except Exception as e:
            raise ModelError(f"{source}: not a readable TFLite model (corrupt or truncated?): {e}") from None
        if self.model.SubgraphsLength() != 1:
            raise ModelError(f"{source}: {self.model.SubgraphsLength()} subgraphs; Ember reads models with one "
                             "(control flow such as WHILE/IF is not supported)")  # fmt: skip
        self.data = data
        self.imp = Importer(source, {"": MAX_OPSET}, {}, lambda ctx: None, FOLD_LIMIT)
        self.imp.scopes = [{}]
        self.imp.graph = Graph("tflite", [], [])
        self.tensors: dict[int, Tensor] = {}
        self.views: dict[tuple[int, str], Value] = {}  # (tensor, "nchw"/"nhwc"/"float") -> a converted value
        self.bound: set[Value] = set()  # values that are some TFLite tensor's

    # -- tensors ------------------------------------------------------------------------------------
    def tensor(self, i: int):
        return self.sub.Tensors(i)

    def name(self, i: int) -> str:
        return self.tensor(i).Name().decode() or f"t{i}"

    def short(self, i: int) -> str:
        """A readable name for Ember values: the first of the layers TFLite lists (a fused op names each)."""
        return self.name(i).split(";")[0]

    def shape(self, i: int) -> tuple[int, ...]:
        t = self.tensor(i)
        return tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()

    def signature(self, i: int) -> tuple[int, ...]:
        """The tensor's shape with -1 for the dims the converter left dynamic (its `shape` holds placeholders)."""
        t = self.tensor(i)
        return tuple(int(d) for d in t.ShapeSignatureAsNumpy()) if t.ShapeSignatureLength() else self.shape(i)

    def dtype(self, i: int) -> str:
        code = self.tensor(i).Type()
        if code not in DTYPES:
            raise ModelError(f"{self.source}: tensor {self.name(i)!r} has TFLite type {code}, which Ember lacks")
        return DTYPES[code]

    def quant(self, i: int) -> tuple[np.ndarray, np.ndarray, int] | None:
        """(scales, zero points, quantized dim) of a quantized tensor, else None."""
        q = self.tensor(i).Quantization()
        if q is None or q.ScaleLength() == 0 or self.dtype(i) not in ("int8", "uint8", "int16", "int32"):
            return None
        zp = q.ZeroPointAsNumpy() if q.ZeroPointLength() else np.zeros(q.ScaleLength(), np.int64)
        return q.ScaleAsNumpy().astype(np.float32), np.asarray(zp, np.int64), int(q.QuantizedDimension())

    def array(self, i: int) -> np.ndarray | None:
        """The constant data of tensor i (None for activations)."""
        buf = self.model.Buffers(self.tensor(i).Buffer())
        if buf is None:
            return None
        if buf.Offset() > 1:  # large models keep buffers past the flatbuffer, at a file offset
            raw = np.frombuffer(self.data, np.uint8, buf.Size(), buf.Offset())
        elif buf.DataLength():
            raw = buf.DataAsNumpy()
        else:
            return None
        return raw.view(self.dtype(i)).reshape(self.shape(i)).copy()

    def get(self, i: int) -> Tensor:
        if i not in self.tensors:
            data = self.array(i)
            if data is None:
                raise ModelError(f"{self.source}: tensor {self.name(i)!r} is read before any operator writes it")
            self.tensors[i] = Tensor(self.imp.constant(self.short(i), data))
        return self.tensors[i]

    def const(self, i: int, what: str) -> np.ndarray:
        data = self.array(i)
        if data is None:
            raise ModelError(f"{self.source}: {what} (tensor {self.name(i)!r}) must be a constant")
        return data

    def float_const(self, i: int) -> np.ndarray | None:
        """A constant tensor as float32, dequantized (per tensor or per channel); None for activations."""
        data, q = self.array(i), self.quant(i)
        if data is None or q is None:
            return data
        scale, zp, dim = q
        shape = [1] * data.ndim
        if scale.size > 1:
            shape[dim] = scale.size
        return ((data.astype(np.float64) - zp.reshape(shape)) * scale.reshape(shape)).astype(np.float32)

    # -- emitting nodes -------------------------------------------------------------------------------
    def emit(self, op: str, inputs: list[Value | None], attrs: dict | None = None, name: str = "",
             n_out: int = 1) -> list[Value]:  # fmt: skip
        base = name or op.lower()
        outs = [self.imp.unique(base) for _ in range(n_out)]
        return self.imp.add_node(op, inputs, dict(attrs or {}), outs, outs[0])

    def emit1(self, op: str, inputs: list[Value | None], attrs: dict | None = None) -> Value:
        return self.emit(op, inputs, attrs)[0]

    def layout(self, i: int, nchw: bool) -> Value:
        """Tensor i as stored (4-d activations may be NCHW), converted to the layout asked for."""
        t = self.get(i)
        if t.nchw == nchw or len(t.value.shape) != 4:
            return t.value
        key = (i, "nchw" if nchw else "nhwc")
        if key not in self.views:
            self.views[key] = self.emit1("Transpose", [t.value], {"perm": TO_NCHW if nchw else TO_NHWC})
        return self.views[key]

    def fval(self, i: int, nchw: bool = False) -> Value:
        """Tensor i as float in the layout asked for: constants dequantized here, activations through
        DequantizeLinear."""
        data = self.float_const(i)
        if data is not None and self.quant(i) is not None:
            if nchw and data.ndim == 4:
                data = data.transpose(TO_NCHW)
            return self.imp.constant(self.short(i) + "_f", data)
        v = self.layout(i, nchw)
        q = self.quant(i)
        if q is None:
            return v
        key = (i, f"float{nchw}")
        if key not in self.views:
            scale, zp, _ = q
            self.views[key] = self.emit1("DequantizeLinear", [v, self.imp.constant("scale", scale[0]),
                                                              self.imp.constant("zp", zp[0].astype(v.dtype))])
        return self.views[key]

    def stored_nchw(self, i: int) -> bool:
        return self.get(i).nchw if (i in self.tensors or self.array(i) is None) else False

    def output(self, i: int, v: Value, nchw: bool = False, act: int = 0) -> None:
        """Bind float result `v` to output tensor i: fused activation, then QuantizeLinear if i is quantized."""
        v = self.activation(v, act)
        q = self.quant(i)
        if q is not None:
            scale, zp, _ = q
            dt = self.dtype(i)
            v = self.emit1("QuantizeLinear", [v, self.imp.constant("scale", scale[0]),
                                              self.imp.constant("zp", zp[0].astype(dt))], {"output_dtype": dt})
        elif v.dtype != self.dtype(i):
            v = self.emit1("Cast", [v], {"to": self.dtype(i)})
        want, sig = self.shape(i), self.signature(i)
        got = tuple(v.shape[j] for j in TO_NHWC) if nchw and len(v.shape) == 4 else v.shape
        if -1 in sig and len(sig) == len(got) and all(s in (-1, g) for s, g in zip(sig, got)):
            pass  # dims the converter left dynamic (and recorded as placeholders): the shape Ember computed stands
        elif want and got != want and np.prod(got) == np.prod(want) and not nchw:
            v = self.emit1("Reshape", [v], {"shape": want})
        elif want and got != want:
            raise ModelError(f"{self.source}: tensor {self.name(i)!r}: Ember computed shape {list(got)}, the "
                             f"model declares {list(want)}")  # fmt: skip
        if v in self.imp.producers and v not in self.bound:
            v.name = self.imp.name_for(self.short(i))  # the TFLite tensor's name (ember debug)
            self.imp.producers[v].name = v.name
        self.bound.add(v)
        self.tensors[i] = Tensor(v, nchw and len(v.shape) == 4)

    def activation(self, v: Value, act: int) -> Value:
        if act == 0:
            return v
        if act == 1:
            return self.emit1("Relu", [v])
        if act in (2, 3):  # RELU_N1_TO_1, RELU6
            return self.emit1("Clip", [v], {"min": -1.0 if act == 2 else 0.0, "max": 1.0 if act == 2 else 6.0})
        if act == 4:
            return self.emit1("Tanh", [v])
        raise ModelError(f"{self.source}: fused activation {act} is not supported")

    # -- the model ------------------------------------------------------------------------------------
    def run(self, input_shapes: dict | None) -> Graph:
        graph = self.imp.graph
        ops = [self.sub.Operators(k) for k in range(self.sub.OperatorsLength())]
        names = [self.op_name(op) for op in ops]
        unsupported: dict[str, list[str]] = {}
        for op, name in zip(ops, names):
            if name not in CONVERTERS:
                unsupported.setdefault(name, []).append(self.name(op.Outputs(0)))
        if unsupported:
            raise UnsupportedOperatorError(self.source, unsupported)
        for k in range(self.sub.InputsLength()):
            i = self.sub.Inputs(k)
            shape = tuple(input_shapes.get(self.name(i), self.shape(i))) if input_shapes else self.shape(i)
            sig = self.tensor(i).ShapeSignatureAsNumpy() if self.tensor(i).ShapeSignatureLength() else None
            if sig is not None and any(d < 0 for d in sig[1:]) and not (input_shapes and self.name(i) in input_shapes):
                raise ModelError(f"{self.source}: input {self.name(i)!r} has unknown dims {sig.tolist()}; pass "
                                 f"input_shapes={{{self.name(i)!r}: (...)}}")  # fmt: skip
            v = Value(self.imp.name_for(self.name(i)), _type(self.dtype(i), shape))
            graph.inputs.append(v)
            self.tensors[i] = Tensor(v)
        for k, (op, name) in enumerate(zip(ops, names)):
            ins = [int(x) for x in op.InputsAsNumpy()] if op.InputsLength() else []
            outs = [int(x) for x in op.OutputsAsNumpy()]
            where = f"operator {k} ({name}, writing {self.name(outs[0])!r})"
            try:
                CONVERTERS[name](self, Op(name, ins, outs, self.options(op, name)))
            except ModelError:
                raise
            except Exception as e:
                raise ModelError(f"{self.source}: {where} cannot be imported: {type(e).__name__}: {e}") from e
        for k in range(self.sub.OutputsLength()):
            i = self.sub.Outputs(k)
            v = self.layout(i, False)
            if v in graph.outputs or v in graph.inputs or v.is_constant:
                v = self.emit1("Identity", [v])
            v.name = self.name(i)
            graph.outputs.append(v)
        verify_graph(graph)
        return graph

    def op_name(self, op) -> str:
        code = self.model.OperatorCodes(op.OpcodeIndex())
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        if builtin == self.tfl.BuiltinOperator.CUSTOM:
            return "CUSTOM:" + (code.CustomCode() or b"?").decode()
        return self.tfl.opcode2name(builtin)

    def options(self, op, name: str):
        table = op.BuiltinOptions()
        cls = OPTIONS.get(name)
        if table is None or cls is None:
            return None
        opts = getattr(self.tfl, cls)()
        opts.Init(table.Bytes, table.Pos)
        return opts


@dataclass
class Op:
    name: str
    inputs: list[int]  # tensor indices (-1: absent)
    outputs: list[int]
    opts: object


def _type(dtype: str, shape: tuple[int, ...]) -> TensorType:
    return TensorType(tuple(shape), dtype)


# -- converters ---------------------------------------------------------------------------------------
OPTIONS = {
    "CONV_2D": "Conv2DOptions", "DEPTHWISE_CONV_2D": "DepthwiseConv2DOptions", "AVERAGE_POOL_2D": "Pool2DOptions",
    "MAX_POOL_2D": "Pool2DOptions", "FULLY_CONNECTED": "FullyConnectedOptions", "SOFTMAX": "SoftmaxOptions",
    "CONCATENATION": "ConcatenationOptions", "ADD": "AddOptions", "SUB": "SubOptions", "MUL": "MulOptions",
    "DIV": "DivOptions", "MEAN": "ReducerOptions", "SUM": "ReducerOptions", "REDUCE_MAX": "ReducerOptions",
    "REDUCE_MIN": "ReducerOptions", "REDUCE_PROD": "ReducerOptions", "BATCH_MATMUL": "BatchMatMulOptions",
    "GATHER": "GatherOptions",
    "STRIDED_SLICE": "StridedSliceOptions", "LEAKY_RELU": "LeakyReluOptions", "GELU": "GeluOptions",
    "RESIZE_BILINEAR": "ResizeBilinearOptions", "RESIZE_NEAREST_NEIGHBOR": "ResizeNearestNeighborOptions",
    "SPLIT": "SplitOptions", "SPLIT_V": "SplitVOptions", "PACK": "PackOptions", "UNPACK": "UnpackOptions",
}  # fmt: skip
Converter = Callable[[TFLiteImporter, Op], None]
CONVERTERS: dict[str, Converter] = {}


def converter(*names: str):
    def register(fn: Converter) -> Converter:
        for n in names:
            CONVERTERS[n] = fn
        return fn

    return register


def _same_pads(size: int, k: int, stride: int, dilation: int, padding: int) -> tuple[int, int]:
    """TF's SAME (padding 0) and VALID (1) as explicit (begin, end) pads."""
    if padding == 1:
        return 0, 0
    out = -(-size // stride)
    total = max((out - 1) * stride + (k - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


def _window_attrs(x: Value, kh: int, kw: int, o) -> dict:
    dh, dw = (o.DilationHFactor(), o.DilationWFactor()) if hasattr(o, "DilationHFactor") else (1, 1)
    ph = _same_pads(x.shape[2], kh, o.StrideH(), dh, o.Padding())
    pw = _same_pads(x.shape[3], kw, o.StrideW(), dw, o.Padding())
    return {"strides": (o.StrideH(), o.StrideW()), "pads": (ph[0], pw[0], ph[1], pw[1]), "dilations": (dh, dw)}


@converter("CONV_2D", "DEPTHWISE_CONV_2D")
def _conv(ti: TFLiteImporter, op: Op) -> None:
    x = ti.fval(op.inputs[0], nchw=True)
    w = ti.float_const(op.inputs[1])
    if w is None:
        raise ModelError(f"{ti.source}: {op.name} with non-constant weights is not supported")
    cin = x.shape[1]
    if op.name == "CONV_2D":
        w = w.transpose(TO_NCHW)  # OHWI -> OIHW
        group = cin // w.shape[1]
    else:
        w = w.transpose(3, 0, 1, 2)  # 1HW(C*M) -> (C*M)1HW
        group = cin
    attrs = _window_attrs(x, w.shape[2], w.shape[3], op.opts) | {"group": group}
    b = ti.float_const(op.inputs[2]) if len(op.inputs) > 2 and op.inputs[2] >= 0 else None
    wv = ti.imp.constant(ti.short(op.inputs[1]) + "_oihw", np.ascontiguousarray(w, np.float32))
    bv = None if b is None else ti.imp.constant(ti.short(op.inputs[2]) + "_f", b.astype(np.float32))
    y = ti.emit1("Conv", [x, wv, bv], attrs)
    ti.output(op.outputs[0], y, nchw=True, act=op.opts.FusedActivationFunction())


@converter("AVERAGE_POOL_2D", "MAX_POOL_2D")
def _pool(ti: TFLiteImporter, op: Op) -> None:
    o = op.opts
    x = ti.fval(op.inputs[0], nchw=True)
    attrs = _window_attrs(x, o.FilterHeight(), o.FilterWidth(), o) | {"kernel_shape": (o.FilterHeight(),
                                                                                         o.FilterWidth())}
    if op.name == "MAX_POOL_2D":
        y = ti.emit1("MaxPool", [x], attrs)
    else:
        y = ti.emit1("AveragePool", [x], attrs | {"count_include_pad": 0})
    ti.output(op.outputs[0], y, nchw=True, act=o.FusedActivationFunction())


@converter("FULLY_CONNECTED")
def _fully_connected(ti: TFLiteImporter, op: Op) -> None:
    x = ti.fval(op.inputs[0])
    w = ti.float_const(op.inputs[1])
    wv = ti.imp.constant(ti.short(op.inputs[1]) + "_f", w) if w is not None else ti.fval(op.inputs[1])
    k = wv.shape[1]
    if len(x.shape) != 2 or x.shape[1] != k:
        x = ti.emit1("Reshape", [x], {"shape": (x.type.size // k, k)})
    b = ti.float_const(op.inputs[2]) if len(op.inputs) > 2 and op.inputs[2] >= 0 else None
    bv = None if b is None else ti.imp.constant(ti.short(op.inputs[2]) + "_f", b.astype(np.float32))
    y = ti.emit1("Gemm", [x, wv, bv], {"transB": 1})
    ti.output(op.outputs[0], y, act=op.opts.FusedActivationFunction())


@converter("BATCH_MATMUL")
def _batch_matmul(ti: TFLiteImporter, op: Op) -> None:
    xs = []
    for i, adj in zip(op.inputs[:2], (op.opts.AdjX(), op.opts.AdjY())):
        v = ti.fval(i)
        if adj:
            perm = tuple(range(len(v.shape) - 2)) + (len(v.shape) - 1, len(v.shape) - 2)
            v = ti.emit1("Transpose", [v], {"perm": perm})
        xs.append(v)
    ti.output(op.outputs[0], ti.emit1("MatMul", xs))


def _broadcast_nchw(ti: TFLiteImporter, i: int) -> Value:
    """A constant operand of an elementwise op whose other operand is NCHW: its NHWC broadcast shape moved to
    NCHW (a per-channel (C,) becomes (C, 1, 1))."""
    data = ti.float_const(i)
    data = data.reshape((1,) * (4 - data.ndim) + data.shape).transpose(TO_NCHW)
    return ti.imp.constant(ti.short(i) + "_nchw", np.ascontiguousarray(data))


def _elementwise_inputs(ti: TFLiteImporter, ins: list[int]) -> tuple[list[Value], bool]:
    """Float operands of an elementwise op, and whether they (and so its result) are NCHW: they are when a
    4-d activation operand is stored NCHW and every other operand is 4-d or constant."""
    shapes = [ti.shape(i) for i in ins]
    consts = [ti.array(i) is not None for i in ins]
    nchw = any(ti.stored_nchw(i) for i in ins) and all(len(s) == 4 or c for s, c in zip(shapes, consts))
    vals = [_broadcast_nchw(ti, i) if nchw and c and len(s) < 4 else ti.fval(i, nchw)
            for i, s, c in zip(ins, shapes, consts)]  # fmt: skip
    return vals, nchw


def _binary(onnx_op: str):
    def convert(ti: TFLiteImporter, op: Op) -> None:
        (a, b), nchw = _elementwise_inputs(ti, op.inputs[:2])
        act = op.opts.FusedActivationFunction() if op.opts is not None else 0
        if onnx_op == "SquaredDifference":
            d = ti.emit1("Sub", [a, b])
            y = ti.emit1("Mul", [d, d])
        else:
            y = ti.emit1(onnx_op, [a, b])
        ti.output(op.outputs[0], y, nchw=nchw, act=act)

    return convert


for _name, _onnx in [("ADD", "Add"), ("SUB", "Sub"), ("MUL", "Mul"), ("DIV", "Div"), ("MAXIMUM", "Max"),
                     ("MINIMUM", "Min"), ("POW", "Pow"), ("SQUARED_DIFFERENCE", "SquaredDifference")]:  # fmt: skip
    CONVERTERS[_name] = _binary(_onnx)


def _compare(onnx_op: str, negate: bool = False):
    def convert(ti: TFLiteImporter, op: Op) -> None:
        y = ti.emit1(onnx_op, [ti.fval(i) for i in op.inputs])
        ti.output(op.outputs[0], ti.emit1("Not", [y]) if negate else y)

    return convert


for _name, _onnx in [("LESS", "Less"), ("LESS_EQUAL", "LessOrEqual"), ("GREATER", "Greater"),
                     ("GREATER_EQUAL", "GreaterOrEqual"), ("EQUAL", "Equal"), ("LOGICAL_AND", "And"),
                     ("LOGICAL_OR", "Or"), ("LOGICAL_NOT", "Not"), ("SELECT", "Where"), ("SELECT_V2", "Where")]:
    CONVERTERS[_name] = _compare(_onnx)
CONVERTERS["NOT_EQUAL"] = _compare("Equal", negate=True)


def _unary(build: Callable[[TFLiteImporter, Value, Op], Value]):
    def convert(ti: TFLiteImporter, op: Op) -> None:
        (x,), nchw = _elementwise_inputs(ti, op.inputs[:1])
        ti.output(op.outputs[0], build(ti, x, op), nchw=nchw)

    return convert


_UNARY = {
    "RELU": lambda ti, x, op: ti.emit1("Relu", [x]),
    "RELU6": lambda ti, x, op: ti.emit1("Clip", [x], {"min": 0.0, "max": 6.0}),
    "RELU_N1_TO_1": lambda ti, x, op: ti.emit1("Clip", [x], {"min": -1.0, "max": 1.0}),
    "LOGISTIC": lambda ti, x, op: ti.emit1("Sigmoid", [x]),
    "TANH": lambda ti, x, op: ti.emit1("Tanh", [x]),
    "HARD_SWISH": lambda ti, x, op: ti.emit1("HardSwish", [x]),
    "EXP": lambda ti, x, op: ti.emit1("Exp", [x]),
    "LOG": lambda ti, x, op: ti.emit1("Log", [x]),
    "SQRT": lambda ti, x, op: ti.emit1("Sqrt", [x]),
    "RSQRT": lambda ti, x, op: ti.emit1("Reciprocal", [ti.emit1("Sqrt", [x])]),
    "NEG": lambda ti, x, op: ti.emit1("Neg", [x]),
    "ABS": lambda ti, x, op: ti.emit1("Abs", [x]),
    "FLOOR": lambda ti, x, op: ti.emit1("Floor", [x]),
    "SQUARE": lambda ti, x, op: ti.emit1("Mul", [x, x]),
    "LEAKY_RELU": lambda ti, x, op: ti.emit1("LeakyRelu", [x], {"alpha": op.opts.Alpha()}),
    "GELU": lambda ti, x, op: ti.emit1("Gelu", [x], {"approximate": "tanh" if op.opts.Approximate() else "none"}),
    "DEQUANTIZE": lambda ti, x, op: x if x.dtype == "float32" else ti.emit1("Cast", [x], {"to": "float32"}),
    "QUANTIZE": lambda ti, x, op: x,  # dequantized input, quantized to the output's parameters by `output`
    "CAST": lambda ti, x, op: x,  # `output` casts to the output tensor's dtype
}
for _name, _build in _UNARY.items():
    CONVERTERS[_name] = _unary(_build)


@converter("PRELU")
def _prelu(ti: TFLiteImporter, op: Op) -> None:
    (x, alpha), nchw = _elementwise_inputs(ti, op.inputs[:2])
    ti.output(op.outputs[0], ti.emit1("PRelu", [x, alpha]), nchw=nchw)


def _axis_in(ti: TFLiteImporter, i: int, axis: int, nchw: bool) -> int:
    axis = axis % len(ti.shape(i))
    return TO_NCHW.index(axis) if nchw else axis


@converter("MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD")
def _reduce(ti: TFLiteImporter, op: Op) -> None:
    x_i = op.inputs[0]
    axes = [int(a) % len(ti.shape(x_i)) for a in np.atleast_1d(ti.const(op.inputs[1], "the reduction axes"))]
    keep = bool(op.opts.KeepDims())
    rest = [a for a in range(len(ti.shape(x_i))) if a not in axes]
    # stay NCHW when the dims kept come out in the same order in both layouts
    nchw = ti.stored_nchw(x_i) and (keep or sorted(rest, key=TO_NCHW.index) == rest)
    x = ti.fval(x_i, nchw)
    onnx_op = {"MEAN": "ReduceMean", "SUM": "ReduceSum", "REDUCE_MAX": "ReduceMax", "REDUCE_MIN": "ReduceMin",
               "REDUCE_PROD": "ReduceProd"}
    axes = tuple(sorted(_axis_in(ti, x_i, a, nchw) for a in axes))
    y = ti.emit1(onnx_op[op.name], [x], {"axes": axes, "keepdims": int(keep)})
    ti.output(op.outputs[0], y, nchw=nchw and keep)


@converter("CONCATENATION")
def _concat(ti: TFLiteImporter, op: Op) -> None:
    ins = op.inputs
    nchw = all(ti.stored_nchw(i) or ti.array(i) is not None for i in ins) and any(map(ti.stored_nchw, ins))
    nchw = nchw and len(ti.shape(ins[0])) == 4
    axis = _axis_in(ti, ins[0], op.opts.Axis(), nchw)
    y = ti.emit1("Concat", [ti.fval(i, nchw) for i in ins], {"axis": axis})
    ti.output(op.outputs[0], y, nchw=nchw, act=op.opts.FusedActivationFunction())


@converter("PAD", "PADV2")
def _pad(ti: TFLiteImporter, op: Op) -> None:
    x_i = op.inputs[0]
    nchw = ti.stored_nchw(x_i)
    pads = ti.const(op.inputs[1], "the paddings").astype(np.int64).reshape(-1, 2)
    if nchw:
        pads = pads[list(TO_NCHW)]
    value = 0.0
    if op.name == "PADV2" and len(op.inputs) > 2:
        value = float(ti.float_const(op.inputs[2]).reshape(-1)[0])
    y = ti.emit1("Pad", [ti.fval(x_i, nchw)], {"pads": tuple(pads[:, 0]) + tuple(pads[:, 1]), "value": value})
    ti.output(op.outputs[0], y, nchw=nchw)


@converter("RESHAPE", "SQUEEZE", "EXPAND_DIMS")
def _reshape(ti: TFLiteImporter, op: Op) -> None:
    """To the output's recorded shape, or to the shape input where it is known at import (constant, or computed
    from static shapes: TF's Tensordot packs products of SHAPE slices, and the converter then records a
    placeholder shape such as [1, 1] for an output whose dims it left dynamic)."""
    x = ti.fval(op.inputs[0])
    shape = ti.shape(op.outputs[0])
    given = ti.get(op.inputs[1]).value.data if op.name == "RESHAPE" and len(op.inputs) > 1 and op.inputs[1] >= 0 \
        else None  # fmt: skip
    if given is not None and given.ndim == 1:
        try:  # TFLite's 0 is a dim of 0, not ONNX's "copy the input dim"
            dims = resolve_reshape(x.shape, tuple(int(d) for d in given), allowzero=True)
        except ShapeError:
            dims = None
        if dims is not None and math.prod(dims) == math.prod(x.shape):
            shape = dims
    ti.output(op.outputs[0], ti.emit1("Reshape", [x], {"shape": tuple(shape)}))


@converter("SOFTMAX")
def _softmax(ti: TFLiteImporter, op: Op) -> None:
    x = ti.fval(op.inputs[0])
    beta = op.opts.Beta()
    if beta != 1.0:
        x = ti.emit1("Mul", [x, ti.imp.constant("beta", np.float32(beta))])
    ti.output(op.outputs[0], ti.emit1("Softmax", [x], {"axis": -1}))


@converter("TRANSPOSE")
def _transpose(ti: TFLiteImporter, op: Op) -> None:
    perm = tuple(int(p) for p in ti.const(op.inputs[1], "the permutation"))
    ti.output(op.outputs[0], ti.emit1("Transpose", [ti.fval(op.inputs[0])], {"perm": perm}))


@converter("GATHER")
def _gather(ti: TFLiteImporter, op: Op) -> None:
    if op.opts.BatchDims():
        raise ModelError(f"{ti.source}: GATHER with batch_dims={op.opts.BatchDims()} is not supported")
    x, idx = ti.fval(op.inputs[0]), ti.get(op.inputs[1]).value
    ti.output(op.outputs[0], ti.emit1("Gather", [x, idx], {"axis": op.opts.Axis()}))


@converter("STRIDED_SLICE")
def _strided_slice(ti: TFLiteImporter, op: Op) -> None:
    o = op.opts
    if o.EllipsisMask() or o.NewAxisMask():
        raise ModelError(f"{ti.source}: STRIDED_SLICE with an ellipsis or new-axis mask is not supported")
    shape = ti.shape(op.inputs[0])
    begin, end, steps = (ti.const(i, "a slice bound").astype(np.int64) for i in op.inputs[1:4])
    starts, ends = [], []
    for a in range(len(begin)):
        lo, hi, step = int(begin[a]), int(end[a]), int(steps[a])
        if o.Offset():
            hi = lo + hi
        if o.BeginMask() >> a & 1:
            lo = 0 if step > 0 else shape[a] - 1
        if o.EndMask() >> a & 1:
            hi = shape[a] if step > 0 else -(2**62)
        if o.ShrinkAxisMask() >> a & 1:
            lo = lo % shape[a]
            hi, step = lo + 1, 1
        starts.append(lo)
        ends.append(hi)
    attrs = {"starts": tuple(starts), "ends": tuple(ends), "axes": tuple(range(len(begin))),
             "steps": tuple(int(s) if not (o.ShrinkAxisMask() >> a & 1) else 1 for a, s in enumerate(steps))}
    ti.output(op.outputs[0], ti.emit1("Slice", [ti.fval(op.inputs[0])], attrs))


@converter("SLICE")
def _slice(ti: TFLiteImporter, op: Op) -> None:
    shape = ti.shape(op.inputs[0])
    begin = ti.const(op.inputs[1], "the slice begin").astype(np.int64)
    size = ti.const(op.inputs[2], "the slice size").astype(np.int64)
    ends = tuple(shape[a] if s < 0 else int(b + s) for a, (b, s) in enumerate(zip(begin, size)))
    attrs = {"starts": tuple(int(b) for b in begin), "ends": ends, "axes": tuple(range(len(begin)))}
    ti.output(op.outputs[0], ti.emit1("Slice", [ti.fval(op.inputs[0])], attrs))


@converter("SPLIT", "SPLIT_V")
def _split(ti: TFLiteImporter, op: Op) -> None:
    x_i, axis_i = (op.inputs[1], op.inputs[0]) if op.name == "SPLIT" else (op.inputs[0], op.inputs[2])
    axis = int(ti.const(axis_i, "the split axis").reshape(-1)[0]) % len(ti.shape(x_i))
    sizes = tuple(ti.shape(o)[axis] for o in op.outputs)
    ys = ti.emit("Split", [ti.fval(x_i)], {"axis": axis, "split": sizes}, n_out=len(sizes))
    for o, y in zip(op.outputs, ys):
        ti.output(o, y)


@converter("PACK")
def _pack(ti: TFLiteImporter, op: Op) -> None:
    axis = op.opts.Axis() % (len(ti.shape(op.inputs[0])) + 1)
    parts = []
    for i in op.inputs:
        s = list(ti.shape(i))
        parts.append(ti.emit1("Reshape", [ti.fval(i)], {"shape": tuple(s[:axis] + [1] + s[axis:])}))
    ti.output(op.outputs[0], ti.emit1("Concat", parts, {"axis": axis}))


@converter("UNPACK")
def _unpack(ti: TFLiteImporter, op: Op) -> None:
    axis = op.opts.Axis() % len(ti.shape(op.inputs[0]))
    ys = ti.emit("Split", [ti.fval(op.inputs[0])], {"axis": axis, "split": (1,) * len(op.outputs)},
                 n_out=len(op.outputs))  # fmt: skip
    for o, y in zip(op.outputs, ys):
        ti.output(o, ti.emit1("Reshape", [y], {"shape": ti.shape(o)}))


@converter("TILE", "BROADCAST_TO")
def _tile(ti: TFLiteImporter, op: Op) -> None:
    x = ti.fval(op.inputs[0])
    reps = tuple(int(r) for r in ti.const(op.inputs[1], "the repeats or shape"))
    y = ti.emit1("Tile", [x], {"repeats": reps}) if op.name == "TILE" else ti.emit1("Expand", [x], {"shape": reps})
    ti.output(op.outputs[0], y)


@converter("SHAPE")
def _shape(ti: TFLiteImporter, op: Op) -> None:
    data = np.array(ti.shape(op.inputs[0]), ti.dtype(op.outputs[0]))
    ti.tensors[op.outputs[0]] = Tensor(ti.imp.constant(ti.short(op.outputs[0]), data))


@converter("RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR")
def _resize(ti: TFLiteImporter, op: Op) -> None:
    o = op.opts
    x = ti.fval(op.inputs[0], nchw=True)
    h, w = (int(s) for s in ti.const(op.inputs[1], "the output size"))
    linear = op.name == "RESIZE_BILINEAR"
    if o.AlignCorners():
        mode, nearest = "align_corners", "round_prefer_ceil"
    elif o.HalfPixelCenters():
        mode, nearest = ("half_pixel" if linear else "tf_half_pixel_for_nn"), "floor"
    else:
        mode, nearest = "asymmetric", "floor"
    attrs = {"sizes": (x.shape[0], x.shape[1], h, w), "scales": (1.0, 1.0, h / x.shape[2], w / x.shape[3]),
             "mode": "linear" if linear else "nearest", "coordinate_transformation_mode": mode,
             "nearest_mode": nearest}  # fmt: skip
    ti.output(op.outputs[0], ti.emit1("Resize", [x], attrs), nchw=True)


@converter("ARG_MAX", "ARG_MIN")
def _argmax(ti: TFLiteImporter, op: Op) -> None:
    x_i = op.inputs[0]
    axis = int(ti.const(op.inputs[1], "the axis").reshape(-1)[0]) % len(ti.shape(x_i))
    y = ti.emit1("ArgMax" if op.name == "ARG_MAX" else "ArgMin", [ti.fval(x_i)], {"axis": axis, "keepdims": 0})
    ti.output(op.outputs[0], y)


# -- entry point --------------------------------------------------------------------------------------
def from_tflite(model: str | os.PathLike | bytes, input_shapes: dict[str, tuple[int, ...]] | None = None) -> Graph:
    """Import a TFLite flatbuffer (a path or its bytes) as an Ember graph (float32 or int8/uint8 quantized)."""
    return import_tflite(model, input_shapes)[0]


def import_tflite(model: str | os.PathLike | bytes, input_shapes: dict[str, tuple[int, ...]] | None = None
                  ) -> tuple[Graph, dict[str, tuple[str, bool]]]:  # fmt: skip
    """`from_tflite`, and where each TFLite activation tensor went: its name -> (the Ember value's name, whether
    that value is its NCHW transpose)."""
    if isinstance(model, bytes | bytearray):
        data, source = bytes(model), "<tflite bytes>"
    else:
        source = os.fspath(model)
        if not os.path.isfile(source):
            raise ModelError(f"{source}: no such file")
        with open(source, "rb") as f:
            data = f.read()
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise ModelError(f"{source}: not a TFLite model (no 'TFL3' file identifier; corrupt or truncated?)")
    ti = TFLiteImporter(data, source)
    graph = ti.run(input_shapes)
    graph.name = os.path.splitext(os.path.basename(source))[0].strip("<>") or "tflite"
    where = {ti.name(i): (t.value.name, t.nchw) for i, t in ti.tensors.items() if not t.value.is_constant}
    return graph, where
