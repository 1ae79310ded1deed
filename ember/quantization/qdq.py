"""ONNX rewriting for quantization: batch norm folded into convolutions, the quantizable layers found, and the QDQ
(or bf16) model written.

A *layer* is one Conv, MatMul or Gemm plus the elementwise ops that follow it and run in its integer epilogue:
Relu, Clip, a bias Add (a constant of the output channels) and one residual Add. The layer's input activations,
the residual and the layer's last output get a QuantizeLinear -> DequantizeLinear pair; its weight is stored as
int8 with a DequantizeLinear (per output channel, symmetric, [-127, 127]); its bias as int32 with scale
input_scale * weight_scale (zero point 0), as onnxruntime's quantizer writes it. The epilogue's intermediate
tensors are not rounded, so that a fused integer kernel (requantization after bias, residual and relu) and the
QDQ model compute the same thing.

Ops that only move or select values (MaxPool, Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Identity) keep
their input's scale and zero point: activations stay 8-bit through them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

QUANTIZED_OPS = ("Conv", "MatMul", "Gemm")
PASS_THROUGH = ("MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity")
ACTIVATION_DTYPES = {"uint8": (TensorProto.UINT8, 0, 255), "int8": (TensorProto.INT8, -128, 127)}
MIN_OPSET = 13  # per-axis DequantizeLinear


class QuantizeError(ValueError):
    """A model or an option that quantization cannot handle; the message names the node, tensor or option."""


def constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The model's constant tensors by name: initializers and Constant nodes with a `value`."""
    out = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            out[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    return out


def consumers(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    out: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            if i:
                out.setdefault(i, []).append(n)
    return out


def attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def prepare(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy at opset >= 13, node names unique and present, Conv -> BatchNormalization folded into the Conv."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        raise QuantizeError("the model imports no default-domain (ai.onnx) opset")
    if opset < MIN_OPSET:
        from onnx import version_converter

        model = version_converter.convert_version(model, MIN_OPSET)
    seen: set[str] = set()
    for i, n in enumerate(model.graph.node):
        if not n.name or n.name in seen:
            n.name = f"{n.op_type.lower()}_{i}"
        seen.add(n.name)
    fold_batch_norms(model)
    return model


def fold_batch_norms(model: onnx.ModelProto) -> None:
    """Fold each BatchNormalization (inference form, constant statistics) that is the only reader of a Conv's
    output into the Conv's weight and bias, in place."""
    consts, readers = constants(model), consumers(model)
    inits = {t.name: t for t in model.graph.initializer}
    outputs = {o.name for o in model.graph.output}
    producer = {o: n for n in model.graph.node for o in n.output}
    dropped = []
    for bn in model.graph.node:
        if bn.op_type != "BatchNormalization" or len(bn.output) > 1 and any(bn.output[1:]):
            continue
        conv = producer.get(bn.input[0])
        params = [consts.get(x) for x in bn.input[1:5]]
        if (conv is None or conv.op_type != "Conv" or conv.input[1] not in inits or any(p is None for p in params)
                or len(readers.get(conv.output[0], [])) != 1 or conv.output[0] in outputs):  # fmt: skip
            continue
        gamma, beta, mean, var = (p.astype(np.float64) for p in params)
        k = gamma / np.sqrt(var + attr(bn, "epsilon", 1e-5))
        w = consts[conv.input[1]].astype(np.float64)
        b = consts[conv.input[2]].astype(np.float64) if len(conv.input) > 2 and conv.input[2] else 0.0
        dtype = consts[conv.input[1]].dtype
        w_name, b_name = f"{conv.name}/folded_w", f"{conv.name}/folded_b"
        new_w = (w * k.reshape(-1, *[1] * (w.ndim - 1))).astype(dtype)
        model.graph.initializer.extend(
            [
                numpy_helper.from_array(new_w, w_name),
                numpy_helper.from_array(((b - mean) * k + beta).astype(dtype), b_name),
            ]
        )
        del conv.input[1:]
        conv.input.extend([w_name, b_name])
        conv.output[0] = bn.output[0]
        dropped.append(bn)
    for bn in dropped:
        model.graph.node.remove(bn)


@dataclass
class Layer:
    """One quantizable op and its epilogue (see the module docstring)."""

    node: onnx.NodeProto
    inputs: list[str]  # activation inputs quantized with the activation dtype
    weight: str | None  # constant weight input, quantized per channel (None: a MatMul of two activations)
    weight_axis: int
    signed_input: str | None  # MatMul of two activations: the second, quantized int8 symmetric per tensor
    epilogue: list[onnx.NodeProto] = field(default_factory=list)
    bias: tuple[onnx.NodeProto, int] | None = None  # (node, input index) of a constant bias to store as int32
    residual: str | None = None  # the other operand of an absorbed residual Add, quantized as an activation
    residual_add: str | None = None  # that Add's node name
    output: str = ""  # the last tensor of the layer: quantized unless it is a graph output

    @property
    def name(self) -> str:
        return self.node.name

    def activations(self) -> list[str]:
        """Tensors whose ranges the layer needs (its output included)."""
        return [*self.inputs, *filter(None, [self.signed_input, self.residual]), self.output]


def find_layers(model: onnx.ModelProto) -> list[Layer]:
    """Every Conv, MatMul and Gemm that can be quantized, with its epilogue, in graph order."""
    consts, readers = constants(model), consumers(model)
    outputs = {o.name for o in model.graph.output}
    layers, taken = [], set()
    for n in model.graph.node:
        layer = _layer_of(n, consts)
        if layer is None:
            continue
        cur, adds = n.output[0], 0
        while cur not in outputs and len(readers.get(cur, [])) == 1:
            nxt = readers[cur][0]
            if nxt.name in taken or not _absorbs(layer, nxt, cur, consts, adds):
                break
            if nxt.op_type == "Add":
                adds += 1
                other = nxt.input[1] if nxt.input[0] == cur else nxt.input[0]
                if other in consts:
                    layer.bias = (nxt, list(nxt.input).index(other))
                else:
                    layer.residual, layer.residual_add = other, nxt.name
            layer.epilogue.append(nxt)
            taken.add(nxt.name)
            cur = nxt.output[0]
        layer.output = cur
        layers.append(layer)
    return layers


def _layer_of(n: onnx.NodeProto, consts: dict[str, np.ndarray]) -> Layer | None:
    if n.op_type not in QUANTIZED_OPS or len(n.input) < 2:
        return None
    x, w = n.input[0], n.input[1]
    if x in consts or w in consts and consts[w].dtype.kind != "f":
        return None
    if n.op_type == "Conv":
        return Layer(n, [x], w, 0, None) if w in consts else None
    if n.op_type == "Gemm":
        if attr(n, "transA", 0) or w not in consts:
            return None
        return Layer(n, [x], w, 0 if attr(n, "transB", 0) else 1, None)
    if w in consts:
        return Layer(n, [x], w, consts[w].ndim - 1, None) if consts[w].ndim >= 2 else None
    return Layer(n, [x], None, 0, w)


def _absorbs(layer: Layer, nxt: onnx.NodeProto, cur: str, consts: dict[str, np.ndarray], adds: int) -> bool:
    """Whether `nxt`, the only reader of the layer's current tensor, joins its epilogue."""
    if nxt.op_type == "Relu":
        return True
    if nxt.op_type == "Clip":
        return all(i in consts for i in nxt.input[1:] if i)
    if nxt.op_type != "Add" or len(nxt.input) != 2 or adds >= 2 or nxt.input[0] == nxt.input[1]:
        return False
    other = nxt.input[1] if nxt.input[0] == cur else nxt.input[0]
    if other not in consts:
        return layer.residual is None
    # a bias: one value per output channel of a MatMul/Gemm with per-channel weights, none absorbed yet
    b = consts[other]
    channels = consts[layer.weight].shape[layer.weight_axis] if layer.weight else -1
    return (layer.bias is None and layer.node.op_type != "Conv" and layer.weight is not None
            and b.ndim >= 1 and b.shape[-1] == channels and b.size == channels and not layer.epilogue)  # fmt: skip


# -- parameters -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QParams:
    scale: float
    zero_point: int
    dtype: str  # "uint8" or "int8"


def activation_params(lo: float, hi: float, dtype: str, symmetric: bool = False) -> QParams:
    """Scale and zero point mapping [lo, hi] (widened to hold 0, so that 0 is exact) onto the dtype's range."""
    _, qmin, qmax = ACTIVATION_DTYPES[dtype]
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if symmetric:
        bound = max(-lo, hi)
        scale = bound / ((qmax - qmin) / 2) if bound > 0 else 1.0
        return QParams(float(np.float32(scale)), 0 if qmin < 0 else 128, dtype)
    scale = float(np.float32((hi - lo) / (qmax - qmin))) if hi > lo else 1.0
    zp = int(np.clip(np.rint(qmin - lo / scale), qmin, qmax))
    return QParams(scale, zp, dtype)


def quantize_weight(w: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-channel int8 along `axis` in [-127, 127]: (int8 weight, float32 scales)."""
    reduce = tuple(i for i in range(w.ndim) if i != axis)
    bound = np.abs(w).max(axis=reduce) if reduce else np.abs(w)
    scale = np.where(bound > 0, bound / 127.0, 1.0).astype(np.float32)
    shape = [-1 if i == axis else 1 for i in range(w.ndim)]
    q = np.clip(np.rint(w / scale.reshape(shape)), -127, 127).astype(np.int8)
    return q, scale


# -- writing ----------------------------------------------------------------------------------------------------
class Writer:
    """Adds Q/DQ (or Cast) nodes and initializers to a model; a tensor is quantized once, whatever reads it."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.graph = model.graph
        self.consts = constants(model)
        self.new_nodes: dict[str, list[onnx.NodeProto]] = {}  # inserted after the producer of the key tensor
        self.done: dict[str, str] = {}

    def initializer(self, array: np.ndarray, name: str) -> str:
        self.graph.initializer.append(numpy_helper.from_array(array, name))
        return name

    def qdq(self, tensor: str, p: QParams) -> str:
        """Q -> DQ of an activation (once per tensor); returns the dequantized tensor's name."""
        if tensor in self.done:
            return self.done[tensor]
        elem, _, _ = ACTIVATION_DTYPES[p.dtype]
        np_dt = np.uint8 if elem == TensorProto.UINT8 else np.int8
        s = self.initializer(np.array(p.scale, np.float32), f"{tensor}/scale")
        z = self.initializer(np.array(p.zero_point, np_dt), f"{tensor}/zero_point")
        dq = f"{tensor}/dequantized"
        self.new_nodes.setdefault(tensor, []).extend([
            helper.make_node("QuantizeLinear", [tensor, s, z], [f"{tensor}/quantized"], name=f"{tensor}/Q"),
            helper.make_node("DequantizeLinear", [f"{tensor}/quantized", s, z], [dq], name=f"{tensor}/DQ"),
        ])  # fmt: skip
        self.done[tensor] = dq
        return dq

    def dequantized_constant(self, name: str, q: np.ndarray, scale: np.ndarray, axis: int) -> str:
        """An integer constant (weight or bias) with its per-axis DequantizeLinear (`scale`: one per index along
        `axis`, zero points 0); returns the float tensor's name."""
        qn = self.initializer(q, f"{name}/quantized")
        s = self.initializer(scale.astype(np.float32), f"{name}/scale")
        z = self.initializer(np.zeros(scale.shape, q.dtype), f"{name}/zero_point")
        out = f"{name}/dequantized"
        node = helper.make_node("DequantizeLinear", [qn, s, z], [out], name=f"{name}/DQ", axis=axis)
        self.new_nodes.setdefault("", []).append(node)
        return out

    def cast_pair(self, tensor: str) -> str:
        """float32 -> bfloat16 -> float32 of a tensor (rounded to bf16); returns the rounded tensor's name."""
        if tensor in self.done:
            return self.done[tensor]
        out = f"{tensor}/bf16"
        self.new_nodes.setdefault(tensor, []).extend([
            helper.make_node("Cast", [tensor], [f"{tensor}/to_bf16"], name=f"{tensor}/to_bf16",
                             to=TensorProto.BFLOAT16),
            helper.make_node("Cast", [f"{tensor}/to_bf16"], [out], name=f"{tensor}/from_bf16", to=TensorProto.FLOAT),
        ])  # fmt: skip
        self.done[tensor] = out
        return out

    def finish(self) -> onnx.ModelProto:
        """Insert the new nodes after their tensors' producers (constants and graph inputs first) and drop the
        float constants no node reads any more."""
        nodes = list(self.graph.node)
        del self.graph.node[:]
        produced = {o for n in nodes for o in n.output}
        head = self.new_nodes.pop("", [])
        for t in list(self.new_nodes):
            if t not in produced:
                head += self.new_nodes.pop(t)
        ordered = head
        for n in nodes:
            ordered.append(n)
            for o in n.output:
                ordered += self.new_nodes.pop(o, [])
        self.graph.node.extend(ordered)
        used = {i for n in self.graph.node for i in n.input} | {o.name for o in self.graph.output}
        keep = [t for t in self.graph.initializer if t.name in used]
        del self.graph.initializer[:]
        self.graph.initializer.extend(keep)
        return self.model


def rename_input(node: onnx.NodeProto, old: str, new: str) -> None:
    for i, name in enumerate(node.input):
        if name == old:
            node.input[i] = new


def source_tensor(producer: dict[str, onnx.NodeProto], tensor: str, params: dict[str, QParams]) -> str:
    """The tensor whose quantization parameters `tensor` shares: through pass-through ops back to a tensor with
    parameters (activations stay 8-bit through MaxPool, Reshape...), else `tensor` itself."""
    cur = tensor
    while cur not in params and cur in producer and producer[cur].op_type in PASS_THROUGH:
        cur = producer[cur].input[0]
    return cur if cur in params else tensor


def producers_of(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    """tensor -> a copy of the node that writes it."""
    return {o: onnx.NodeProto.FromString(n.SerializeToString()) for n in model.graph.node for o in n.output}


def write_qdq(model: onnx.ModelProto, layers: Iterable[Layer], params: dict[str, QParams],
              producers: dict[str, onnx.NodeProto] | None = None) -> onnx.ModelProto:  # fmt: skip
    """The QDQ model of `model` (prepared) with `layers` quantized by the activation `params` (tensor -> QParams).
    `producers` (default: the model's own) decides which tensors share parameters through pass-through ops."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    w = Writer(model)
    by_name = {n.name: n for n in model.graph.node}
    outputs = {o.name for o in model.graph.output}
    readers = consumers(model)
    producers = producers_of(model) if producers is None else producers
    for layer in layers:
        node = by_name[layer.node.name]
        x_params = None
        for x in layer.inputs:
            src = source_tensor(producers, x, params)
            x_params = params[src]
            rename_input(node, x, w.qdq(x, x_params))
        if layer.signed_input is not None:
            rename_input(node, layer.signed_input, w.qdq(layer.signed_input, params[layer.signed_input]))
        if layer.weight is not None:
            q, scale = quantize_weight(w.consts[layer.weight], layer.weight_axis)
            rename_input(node, layer.weight, w.dequantized_constant(f"{node.name}/weight", q, scale,
                                                                   layer.weight_axis))  # fmt: skip
            bias = (node, 2) if layer.node.op_type in ("Conv", "Gemm") and len(node.input) > 2 else None
            if layer.bias is not None:
                bias = (by_name[layer.bias[0].name], layer.bias[1])
            gemm_scaled = layer.node.op_type == "Gemm" and (attr(node, "alpha", 1.0), attr(node, "beta", 1.0)) != (1, 1)
            b = w.consts.get(bias[0].input[bias[1]]) if bias is not None and not gemm_scaled else None
            if b is not None and b.size == scale.size and b.shape[-1] == scale.size:
                bscale = (x_params.scale * scale.astype(np.float64)).astype(np.float32)
                bscale = np.where(bscale > 0, bscale, 1.0).astype(np.float32)
                bq = np.clip(np.rint(b.reshape(-1) / bscale), -(2**31), 2**31 - 1).astype(np.int32).reshape(b.shape)
                bias[0].input[bias[1]] = w.dequantized_constant(f"{node.name}/bias", bq, bscale, b.ndim - 1)
        if layer.residual is not None:
            res_params = params[source_tensor(producers, layer.residual, params)]
            rename_input(by_name[layer.residual_add], layer.residual, w.qdq(layer.residual, res_params))
        if layer.output not in outputs:
            dq = w.qdq(layer.output, params[layer.output])
            for r in readers.get(layer.output, []):
                if r.name != f"{layer.output}/Q":
                    rename_input(by_name[r.name], layer.output, dq)
    return w.finish()


def write_bf16(model: onnx.ModelProto, layers: Iterable[Layer], params=None, producers=None) -> onnx.ModelProto:
    """The bf16 model: each layer's weight stored as bfloat16 (a Cast to float reads it) and its activation inputs
    rounded to bfloat16 (Cast pairs); products accumulate in float32, as avx512_bf16's vdpbf16ps computes them.
    (`params` and `producers` are unused: the signature is write_qdq's.)"""
    import ml_dtypes

    model = onnx.ModelProto.FromString(model.SerializeToString())
    w = Writer(model)
    by_name = {n.name: n for n in model.graph.node}
    for layer in layers:
        node = by_name[layer.node.name]
        for x in [*layer.inputs, *filter(None, [layer.signed_input])]:
            rename_input(node, x, w.cast_pair(x))
        if layer.weight is not None:
            stored = w.consts[layer.weight].astype(ml_dtypes.bfloat16)
            name = w.initializer(stored, f"{node.name}/weight/bf16")
            out = f"{node.name}/weight/float"
            w.new_nodes.setdefault("", []).append(helper.make_node("Cast", [name], [out], name=f"{name}/Cast",
                                                                   to=TensorProto.FLOAT))  # fmt: skip
            rename_input(node, layer.weight, out)
    return w.finish()


def layer_model(model: onnx.ModelProto, layer: Layer) -> onnx.ModelProto:
    """The layer alone: its node and epilogue, the constants they read, the layer's activations as inputs (their
    types left empty: the model is spliced into another, never checked or run by itself)."""
    consts = constants(model)
    nodes = [layer.node, *layer.epilogue]
    read = {i for n in nodes for i in n.input if i}
    inits = [numpy_helper.from_array(consts[i], i) for i in sorted(read & consts.keys())]
    inputs = [helper.make_empty_tensor_value_info(x) for x in sorted(read - consts.keys()) if x not in
              {o for n in nodes for o in n.output}]  # fmt: skip
    graph = helper.make_graph([onnx.NodeProto.FromString(n.SerializeToString()) for n in nodes], layer.name,
                              inputs, [], inits)  # fmt: skip
    return helper.make_model(graph, opset_imports=list(model.opset_import))


def with_isolated_layers(model: onnx.ModelProto, layers: list[Layer], write, params: dict[str, QParams],
                         shapes: dict[str, tuple[int, ...]]) -> tuple[onnx.ModelProto, dict[str, str]]:  # fmt: skip
    """The float model plus, for every layer, a quantized copy of that layer alone reading the float model's
    tensors: layer name -> the copy's output (a graph output, beside the float output `layer.output`). The
    difference between the two is the error the layer itself adds (its sensitivity)."""
    from onnx import compose

    out = onnx.ModelProto.FromString(model.SerializeToString())
    graph_outputs = {o.name for o in model.graph.output}
    producers = producers_of(model)
    del out.graph.output[:]
    names: dict[str, str] = {}
    wanted: list[tuple[str, str]] = []
    for layer in layers:
        sub = write(layer_model(model, layer), [layer], params, producers)
        prefix = f"{layer.name}::"
        inputs = {prefix + vi.name: vi.name for vi in sub.graph.input}
        sub = compose.add_prefix(sub, prefix)
        for n in sub.graph.node:
            for i, name in enumerate(n.input):
                n.input[i] = inputs.get(name, name)
        out.graph.node.extend(sub.graph.node)
        out.graph.initializer.extend(sub.graph.initializer)
        q_out = layer.output if layer.output in graph_outputs or write is write_bf16 else f"{layer.output}/dequantized"
        names[layer.name] = prefix + q_out
        wanted += [(layer.output, layer.output), (prefix + q_out, layer.output)]
    for name, tensor in dict.fromkeys(wanted):
        out.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shapes[tensor]))
    return out, names
