"""Microsoft contrib operators (domain com.microsoft), expanded into standard ONNX operators.

onnxruntime writes these into the models it saves: its graph optimizer fuses Conv+activation into FusedConv,
MatMul+Transpose+Mul into FusedMatMul, the residual add and layer norm into SkipLayerNormalization, erf/tanh
chains into Gelu and FastGelu (`SessionOptions.optimized_model_filepath`, `onnxruntime.transformers.optimizer`),
and its quantizer's operator format (QuantFormat.QOperator) uses QLinearAdd, QGemm, QLinearGlobalAveragePool...
Each is rewritten here as the standard nodes it stands for (a quantized one as DequantizeLinear -> float op ->
QuantizeLinear, which Ember's integer passes match like any QDQ model), imported by the ordinary converters under
opset `OPSET`. Ember fuses these back by its own rules.

`EXPANSIONS` maps op type -> `expand(b: Body)`; `Body` builds the standard nodes from the contrib node's inputs,
attributes and outputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ember.frontend.onnx_importer import MAX_OPSET, NodeContext

DOMAIN = "com.microsoft"
OPSET = min(MAX_OPSET, 21)  # the default-domain opset the expansions are written for


class Body:
    """The standard nodes that replace one contrib node."""

    def __init__(self, ctx: NodeContext):
        self.ctx, self.attrs = ctx, ctx.attrs
        self.nodes: list[onnx.NodeProto] = []
        self.prefix = ctx.importer.unique(ctx.name)
        self.ins = list(ctx.proto.input)
        self.outs = list(ctx.proto.output)
        self.decoders: dict[str, dict] = {}  # output name -> how the model returns it (`Importer.decoded`)

    def input(self, i: int) -> str:
        """Input i's name ('' when absent)."""
        return self.ins[i] if i < len(self.ins) else ""

    def output(self, i: int) -> str:
        return self.outs[i] if i < len(self.outs) else ""

    def rank(self, i: int) -> int:
        return len(self.ctx.type(i).shape)

    def node(self, op: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        """Add a node; its output (a fresh name unless `out`)."""
        out = out or f"{self.prefix}/{op}{len(self.nodes)}"
        self.multi(op, inputs, [out], **attrs)
        return out

    def multi(self, op: str, inputs: list[str], outs: list[str], **attrs) -> None:
        """Add a node of several outputs (trailing unread ones, named '', dropped)."""
        while outs and not outs[-1]:
            outs = outs[:-1]
        self.nodes.append(helper.make_node(op, inputs, outs, name=f"{self.ctx.name}/{op}{len(self.nodes)}", **attrs))

    def const(self, value, dtype=np.float32) -> str:
        name = f"{self.prefix}/c{len(self.nodes)}"
        return self.node("Constant", [], name, value=numpy_helper.from_array(np.asarray(value, dtype), name))

    def dq(self, x: int, scale: int, zero: int, axis: int | None = None) -> str:
        """DequantizeLinear of inputs x, scale and zero point (by index; the zero point may be absent)."""
        inputs = [self.input(x), self.input(scale)] + ([self.input(zero)] if self.input(zero) else [])
        return self.node("DequantizeLinear", inputs, **({} if axis is None else {"axis": axis}))

    def q(self, y: str, scale: int, zero: int, out: str) -> str:
        inputs = [y, self.input(scale)] + ([self.input(zero)] if self.input(zero) else [])
        return self.node("QuantizeLinear", inputs, out)

    def per_axis(self, scale: int, axis: int) -> int | None:
        """The axis of a per-channel scale (None for a per-tensor one)."""
        return axis if len(self.ctx.type(scale).shape) == 1 and self.ctx.type(scale).shape[0] != 1 else None


Expansion = Callable[[Body], None]
EXPANSIONS: dict[str, Expansion] = {}


def expansion(*names: str, table: dict[str, Expansion] = EXPANSIONS) -> Callable[[Expansion], Expansion]:
    """Register an expansion under op types `names` in `table` (this module's, or another domain's)."""

    def wrap(fn: Expansion) -> Expansion:
        for n in names:
            table[n] = fn
        return fn

    return wrap


# onnxruntime's own operators that it registers in the default domain (and writes there in the models it saves)
# op -> the opset from which ONNX has an operator of that name (None: never)
DEFAULT_DOMAIN_OPS: dict[str, int | None] = {"SimplifiedLayerNormalization": None, "LayerNormalization": 17}


def claim_default_domain_ops(proto: onnx.ModelProto) -> bool:
    """Move onnxruntime's default-domain operators (SimplifiedLayerNormalization, LayerNormalization before
    opset 17) to this domain, where `EXPANSIONS` has them; ONNX's checker rejects them where they are. Whether
    any moved."""
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    moved = False

    def walk(g: onnx.GraphProto) -> None:
        nonlocal moved
        for node in g.node:
            if node.domain in ("", "ai.onnx") and node.op_type in DEFAULT_DOMAIN_OPS:
                since = DEFAULT_DOMAIN_OPS[node.op_type]
                if since is None or opset < since:
                    node.domain, moved = DOMAIN, True
            for a in node.attribute:
                for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    walk(sub)

    walk(proto.graph)
    if moved and not any(o.domain == DOMAIN for o in proto.opset_import):
        proto.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return moved


def expand_contrib(ctx: NodeContext) -> None:
    """Import a com.microsoft node as the standard nodes it stands for."""
    expand(ctx, EXPANSIONS)


def expand(ctx: NodeContext, table: dict[str, Expansion], opsets: dict[str, int] | None = None) -> None:
    """Import a node as the nodes its expansion in `table` builds, converted under the default-domain `OPSET` (and
    `opsets` for other domains those nodes use)."""
    b = Body(ctx)
    table[ctx.op_type](b)
    opsets = {**ctx.importer.opsets, "": OPSET, **(opsets or {})}
    for i, node in enumerate(b.nodes):
        ctx.importer.convert(node, i, opsets)
    for name, d in b.decoders.items():
        ctx.importer.decoded[ctx.importer.lookup(name)] = d


# -- activations ---------------------------------------------------------------------------------------------
@expansion("Gelu")
def _gelu(b: Body) -> None:
    b.node("Gelu", [b.input(0)], b.output(0))


@expansion("BiasGelu")
def _bias_gelu(b: Body) -> None:
    b.node("Gelu", [b.node("Add", [b.input(0), b.input(1)])], b.output(0))


@expansion("FastGelu")
def _fast_gelu(b: Body) -> None:
    """The tanh approximation of gelu, of x + bias when a bias is given."""
    x = b.node("Add", [b.input(0), b.input(1)]) if b.input(1) else b.input(0)
    b.node("Gelu", [x], b.output(0), approximate="tanh")


@expansion("QuickGelu")
def _quick_gelu(b: Body) -> None:
    """x * sigmoid(alpha x) (alpha 1: silu)."""
    alpha = b.attrs.get("alpha", 1.702)
    x = b.input(0)
    scaled = b.node("Mul", [x, b.const(alpha)]) if alpha != 1.0 else x
    b.node("Mul", [x, b.node("Sigmoid", [scaled])], b.output(0))


@expansion("BiasAdd")
def _bias_add(b: Body) -> None:
    b.node("Add", [b.node("Add", [b.input(0), b.input(1)]), b.input(2)], b.output(0))


# -- fused convolution and matrix products ----------------------------------------------------------------------
ACTIVATIONS = {"Relu": 0, "Tanh": 0, "Sigmoid": 0, "LeakyRelu": 1, "Clip": 2, "HardSigmoid": 2}


@expansion("FusedConv")
def _fused_conv(b: Body) -> None:
    """activation(Conv(X, W, B) + Z): Z (the fourth input) is a residual onnxruntime summed in."""
    attrs = {k: v for k, v in b.attrs.items() if k not in ("activation", "activation_params")}
    act, params = b.attrs.get("activation", ""), list(b.attrs.get("activation_params", ()))
    if act and act not in ACTIVATIONS:
        raise b.ctx.error(f"FusedConv activation {act!r} is not one Ember knows ({', '.join(ACTIVATIONS)})")
    y = b.node("Conv", [b.input(i) for i in range(3) if b.input(i) or i < 2], None if act or b.input(3) else
               b.output(0), **attrs)  # fmt: skip
    if b.input(3):
        y = b.node("Add", [y, b.input(3)], None if act else b.output(0))
    if act == "Clip":
        b.node("Clip", [y, b.const(params[0]), b.const(params[1])], b.output(0))
    elif act == "LeakyRelu":
        b.node("LeakyRelu", [y], b.output(0), alpha=params[0] if params else 0.01)
    elif act == "HardSigmoid":
        b.node("HardSigmoid", [y], b.output(0), alpha=params[0], beta=params[1])
    elif act:
        b.node(act, [y], b.output(0))


@expansion("FusedMatMul")
def _fused_matmul(b: Body) -> None:
    """alpha * op(A) @ op(B), op a transpose of the last two dims where asked."""
    if b.attrs.get("transBatchA", 0) or b.attrs.get("transBatchB", 0):
        raise b.ctx.error("FusedMatMul with transBatchA/transBatchB (batch dims moved into the product) is not "
                          "supported")  # fmt: skip
    a, w = b.input(0), b.input(1)
    for i, key in ((0, "transA"), (1, "transB")):
        if b.attrs.get(key, 0):
            r = b.rank(i)
            perm = list(range(r - 2)) + [r - 1, r - 2]
            transposed = b.node("Transpose", [b.input(i)], perm=perm)
            a, w = (transposed, w) if i == 0 else (a, transposed)
    alpha = b.attrs.get("alpha", 1.0)
    y = b.node("MatMul", [a, w], None if alpha != 1.0 else b.output(0))
    if alpha != 1.0:
        b.node("Mul", [y, b.const(alpha)], b.output(0))


# -- normalization -----------------------------------------------------------------------------------------------
def _skip_sum(b: Body, bias: int) -> str:
    """input + skip (+ bias), written to the fourth output when the model reads it."""
    s = b.node("Add", [b.input(0), b.input(1)], None if b.input(bias) else b.output(3) or None)
    if b.input(bias):
        s = b.node("Add", [s, b.input(bias)], b.output(3) or None)
    return s


@expansion("SkipLayerNormalization")
def _skip_layer_norm(b: Body) -> None:
    """LayerNormalization over the last axis of input + skip (+ bias); outputs: normalized, mean, inverse standard
    deviation, the sum."""
    s = _skip_sum(b, 4)
    inputs = [s, b.input(2)] + ([b.input(3)] if b.input(3) else [])
    b.multi("LayerNormalization", inputs, [b.output(i) for i in range(3)], axis=-1,
            epsilon=b.attrs.get("epsilon", 1e-5))  # fmt: skip


@expansion("LayerNormalization")
def _layer_norm(b: Body) -> None:
    """onnxruntime's LayerNormalization of the default domain before opset 17: ONNX's own, as it became."""
    b.multi("LayerNormalization", [b.input(i) for i in range(3) if b.input(i)], [b.output(i) for i in range(3)],
            **b.attrs)  # fmt: skip


@expansion("SimplifiedLayerNormalization")
def _rms_norm(b: Body) -> None:
    """RMS normalization (onnxruntime's default-domain operator; ONNX's RMSNormalization since opset 23)."""
    if b.output(1):
        raise b.ctx.error("the inverse RMS output of SimplifiedLayerNormalization is not supported")
    attrs = {"axis": b.attrs.get("axis", -1), "epsilon": b.attrs.get("epsilon", 1e-5)}
    b.node("RMSNormalization", [b.input(0), b.input(1)], b.output(0), **attrs)


@expansion("SkipSimplifiedLayerNormalization")
def _skip_rms_norm(b: Body) -> None:
    """RMS normalization (no mean subtracted) of input + skip (+ bias); outputs: normalized, (unused), inverse
    root mean square, the sum."""
    if b.output(1) or b.output(2):
        raise b.ctx.error("the mean and inverse RMS outputs of SkipSimplifiedLayerNormalization are not supported")
    s = _skip_sum(b, 3)
    b.node("RMSNormalization", [s, b.input(2)], b.output(0), axis=-1, epsilon=b.attrs.get("epsilon", 1e-5))


@expansion("EmbedLayerNormalization")
def _embed_layer_norm(b: Body) -> None:
    """BERT's embeddings: word + position (+ segment) embeddings, then LayerNormalization; the mask index is the
    count of unmasked tokens of each sequence (int32)."""
    ids = b.input(0)
    batch, seq = b.ctx.type(0).shape
    x = b.node("Gather", [b.input(2), ids], axis=0)
    positions = b.input(8) or b.const(np.arange(seq).reshape(1, seq), np.int64)
    x = b.node("Add", [x, b.node("Gather", [b.input(3), positions], axis=0)])
    if b.input(1) and b.input(4):
        x = b.node("Add", [x, b.node("Gather", [b.input(4), b.input(1)], axis=0)])
    if b.output(2):
        x = b.node("Identity", [x], b.output(2))
    b.node("LayerNormalization", [x, b.input(5), b.input(6)], b.output(0), axis=-1,
           epsilon=b.attrs.get("epsilon", 1e-12))  # fmt: skip
    if b.output(1):
        if b.input(7):
            mask = b.node("Cast", [b.input(7)], to=onnx.TensorProto.INT32)
            b.node("ReduceSum", [mask, b.const([1], np.int64)], b.output(1), keepdims=0)
        else:
            b.node("Identity", [b.const(np.zeros(batch), np.int32)], b.output(1))


# -- rotary position embedding ---------------------------------------------------------------------------------
def _rotate(b: Body, x: str, cos: str, sin: str, interleaved: bool) -> str:
    """x's last axis (the rotary dims) rotated by angles whose cos and sin broadcast against its halves: pairs
    (x[i], x[i + d/2]), or (x[2i], x[2i + 1]) where `interleaved`."""
    if interleaved:
        pairs = b.node("Reshape", [x, b.const([0, 0, 0, -1, 2], np.int64)])  # (B, S|N, N|S, d/2, 2)
        x1, x2 = (b.node("Squeeze", [b.node("Slice", [pairs, *(b.const([v], np.int64) for v in (i, i + 1, -1))]),
                                     b.const([-1], np.int64)]) for i in (0, 1))  # fmt: skip
    else:
        x1, x2 = f"{b.prefix}/x1", f"{b.prefix}/x2"
        b.multi("Split", [x], [x1, x2], axis=-1, num_outputs=2)
    o1 = b.node("Sub", [b.node("Mul", [x1, cos]), b.node("Mul", [x2, sin])])
    o2 = b.node("Add", [b.node("Mul", [x2, cos]), b.node("Mul", [x1, sin])])
    if not interleaved:
        return b.node("Concat", [o1, o2], axis=-1)
    both = b.node("Concat", [b.node("Unsqueeze", [o, b.const([-1], np.int64)]) for o in (o1, o2)], axis=-1)
    return b.node("Reshape", [both, b.const([0, 0, 0, -1], np.int64)])


def _rotary_angles(b: Body, positions: int, cos_i: int, sin_i: int, seq_axis_of: str) -> tuple[str, str]:
    """cos and sin of each token's angles, (B or 1, S, d/2): the caches' rows at input `positions`, which is (B, S)
    or one offset (positions offset + 0 .. S-1, S the length of `seq_axis_of`'s axis 1)."""
    pos = b.input(positions)
    if math.prod(b.ctx.type(positions).shape) == 1 and len(b.ctx.type(positions).shape) < 2:
        seq = b.node("Gather", [b.node("Shape", [seq_axis_of]), b.const(1, np.int64)])
        start = b.node("Cast", [b.node("Reshape", [pos, b.const([], np.int64)])], to=onnx.TensorProto.INT64)
        pos = b.node("Unsqueeze", [b.node("Range", [start, b.node("Add", [start, seq]), b.const(1, np.int64)]),
                                   b.const([0], np.int64)])  # fmt: skip
    return b.node("Gather", [b.input(cos_i), pos]), b.node("Gather", [b.input(sin_i), pos])


@expansion("RotaryEmbedding")
def _rotary_embedding(b: Body) -> None:
    """(input, position_ids, cos_cache, sin_cache): rotary position embedding of each head's first
    `rotary_embedding_dim` dims (all: 2 x the caches' width), input (B, S, heads x head) or (B, heads, S, head)."""
    shape = b.ctx.type(0).shape
    half = b.ctx.type(2).shape[1]
    rd = int(b.attrs.get("rotary_embedding_dim", 0)) or 2 * half
    interleaved = bool(b.attrs.get("interleaved", 0))
    if b.attrs.get("is_packed_batching", 0):
        raise b.ctx.error("packed batching is not supported")
    if len(shape) == 3:  # (B, S, N x H) -> (B, S, N, H), the angles (B, S, 1, d/2)
        heads = int(b.attrs.get("num_heads", 0)) or shape[2] // rd
        head = shape[2] // heads
        x = b.node("Reshape", [b.input(0), b.const([0, 0, heads, head], np.int64)])
        seq_first, heads_axis = b.input(0), 2
    else:  # (B, N, S, H): the angles (B, 1, S, d/2)
        x, head = b.input(0), shape[3]
        seq_first, heads_axis = b.node("Transpose", [x], perm=[0, 2, 1, 3]), 1
    cos, sin = (b.node("Unsqueeze", [t, b.const([heads_axis], np.int64)])
                for t in _rotary_angles(b, 1, 2, 3, seq_first))  # fmt: skip
    if rd < head:
        rot = b.node("Slice", [x, b.const([0], np.int64), b.const([rd], np.int64), b.const([-1], np.int64)])
        rest = b.node("Slice", [x, b.const([rd], np.int64), b.const([head], np.int64), b.const([-1], np.int64)])
        y = b.node("Concat", [_rotate(b, rot, cos, sin, interleaved), rest], axis=-1)
    else:
        y = _rotate(b, x, cos, sin, interleaved)
    if len(shape) == 3:
        b.node("Reshape", [y, b.const([0, 0, -1], np.int64)], b.output(0))
    else:
        b.node("Identity", [y], b.output(0))


# -- attention ------------------------------------------------------------------------------------------------------
def _heads(b: Body, x: str, shape: tuple, heads: int, key: bool = False) -> str:
    """(B, S, heads * h) -> (B, heads, S, h), or (B, heads, h, S) for keys."""
    batch, seq, width = shape
    split = b.node("Reshape", [x, b.const([batch, seq, heads, width // heads], np.int64)])
    return b.node("Transpose", [split], perm=[0, 2, 3, 1] if key else [0, 2, 1, 3])


def _attend(b: Body, q: str, k: str, v: str, dims: tuple, heads: int, masks: list[str]) -> None:
    """softmax(Q K^T scale + masks) V over heads, written to output 0. dims: (B, S, L, Dq, Dv)."""
    batch, seq, kv_len, dq, dv = dims
    scale = b.attrs.get("scale", 0.0) or 1.0 / np.sqrt(dq // heads)
    scores = b.node("Mul", [b.node("MatMul", [_heads(b, q, (batch, seq, dq), heads),
                                             _heads(b, k, (batch, kv_len, dq), heads, key=True)]), b.const(scale)])
    for m in masks:
        scores = b.node("Add", [scores, m])
    probs = b.node("Softmax", [scores], axis=-1)
    ctx = b.node("MatMul", [probs, _heads(b, v, (batch, kv_len, dv), heads)])
    merged = b.node("Transpose", [ctx], perm=[0, 2, 1, 3])
    b.node("Reshape", [merged, b.const([batch, seq, dv], np.int64)], b.output(0))


def _padding_mask(b: Body, i: int, batch: int, seq: int, kv_len: int) -> str:
    """An additive mask from input i: a 2-d (B, L) or 3-d (B, S, L) 1/0 mask, or 1-d valid lengths (B,);
    masked scores get mask_filter_value."""
    fill = b.attrs.get("mask_filter_value", -10000.0)
    shape = b.ctx.type(i).shape
    if len(shape) == 1 and shape[0] == batch:  # valid lengths: key positions from each length on are masked
        lengths = b.node("Reshape", [b.node("Cast", [b.input(i)], to=onnx.TensorProto.INT64),
                                     b.const([batch, 1], np.int64)])  # fmt: skip
        keep = b.node("Less", [b.const(np.arange(kv_len).reshape(1, kv_len), np.int64), lengths])
    elif len(shape) in (2, 3):
        keep = b.node("Cast", [b.input(i)], to=onnx.TensorProto.BOOL)
    else:
        raise b.ctx.error(f"a mask of shape {list(shape)} (only (B, L) and (B, S, L) 1/0 masks and (B,) lengths)")
    additive = b.node("Where", [keep, b.const(0.0), b.const(fill)])
    rows = [batch, 1, 1, kv_len] if len(shape) != 3 else [batch, 1, seq, kv_len]
    return b.node("Reshape", [additive, b.const(rows, np.int64)])


def _causal(b: Body, seq: int, kv_len: int) -> str:
    allowed = np.tril(np.ones((seq, kv_len), bool), kv_len - seq)
    return b.const(np.where(allowed, 0.0, b.attrs.get("mask_filter_value", -10000.0)))


@expansion("Attention")
def _attention(b: Body) -> None:
    """BERT's fused attention: (input, weights, bias, mask_index, past, attention_bias); Q, K, V from one
    projection of the input (`qkv_hidden_sizes` when their widths differ)."""
    if b.input(4) or b.output(1) or b.attrs.get("do_rotary", 0):
        raise b.ctx.error("Attention with past/present state or rotary embedding is not supported")
    batch, seq, _ = b.ctx.type(0).shape
    heads = b.attrs["num_heads"]
    width = b.ctx.type(1).shape[1]
    sizes = list(b.attrs.get("qkv_hidden_sizes", ())) or [width // 3] * 3
    qkv = b.node("MatMul", [b.input(0), b.input(1)])
    if b.input(2):
        qkv = b.node("Add", [qkv, b.input(2)])
    q, k, v = (f"{b.prefix}/{n}" for n in "qkv")
    b.multi("Split", [qkv, b.const(sizes, np.int64)], [q, k, v], axis=2)
    masks = [_padding_mask(b, 3, batch, seq, seq)] if b.input(3) else []
    if b.attrs.get("unidirectional", 0):
        masks.append(_causal(b, seq, seq))
    if b.input(5):
        masks.append(b.input(5))
    _attend(b, q, k, v, (batch, seq, seq, sizes[0], sizes[2]), heads, masks)


@expansion("MultiHeadAttention")
def _multi_head_attention(b: Body) -> None:
    """(query, key, value, bias, key_padding_mask, attention_bias): separate Q, K and V of shape (B, S or L, D)."""
    if len(b.ctx.type(0).shape) != 3 or not b.input(1) or not b.input(2) or len(b.ctx.type(1).shape) != 3:
        raise b.ctx.error("MultiHeadAttention with packed or per-head inputs, or past state, is not supported")
    if any(b.input(i) for i in range(6, len(b.ins))) or any(b.output(i) for i in range(1, len(b.outs))):
        raise b.ctx.error("MultiHeadAttention with past/present state is not supported")
    (batch, seq, dq), kv_len, dv = b.ctx.type(0).shape, b.ctx.type(1).shape[1], b.ctx.type(2).shape[2]
    q, k, v = b.input(0), b.input(1), b.input(2)
    if b.input(3):
        parts = [f"{b.prefix}/bias_{n}" for n in "qkv"]
        b.multi("Split", [b.input(3), b.const([dq, dq, dv], np.int64)], parts, axis=0)
        q, k, v = (b.node("Add", [x, p]) for x, p in zip((q, k, v), parts))
    masks = [_padding_mask(b, 4, batch, seq, kv_len)] if b.input(4) else []
    if b.attrs.get("unidirectional", 0):
        masks.append(_causal(b, seq, kv_len))
    if b.input(5):
        masks.append(b.input(5))
    _attend(b, q, k, v, (batch, seq, kv_len, dq, dv), b.attrs["num_heads"], masks)


# -- the quantizer's operator format ---------------------------------------------------------------------------
@expansion("QLinearAdd", "QLinearMul")
def _qlinear_binary(b: Body) -> None:
    """(A, A_scale, A_zero, B, B_scale, B_zero, C_scale, C_zero)."""
    y = b.node(b.ctx.op_type[len("QLinear"):], [b.dq(0, 1, 2), b.dq(3, 4, 5)])
    b.q(y, 6, 7, b.output(0))


@expansion("QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftmax")
def _qlinear_unary(b: Body) -> None:
    """(X, X_scale, X_zero, Y_scale, Y_zero)."""
    op = b.ctx.op_type[len("QLinear"):]
    attrs = {"LeakyRelu": {"alpha": b.attrs.get("alpha", 0.01)}, "Softmax": {"axis": b.attrs.get("axis", -1)}}
    x = b.dq(0, 1, 2)
    if op == "Softmax" and b.attrs.get("opset", 13) < 13:  # the old Softmax: rows are the dims from `axis` on
        shape = b.ctx.type(0).shape
        axis = attrs[op]["axis"] % len(shape)
        flat = b.node("Flatten", [x], axis=axis)
        y = b.node("Reshape", [b.node("Softmax", [flat], axis=1), b.const(shape, np.int64)])
    else:
        y = b.node(op, [x], **attrs.get(op, {}))
    b.q(y, 3, 4, b.output(0))


def _channels_first(b: Body, x: str, rank: int, to_first: bool) -> str:
    perm = [0, rank - 1, *range(1, rank - 1)] if to_first else [0, *range(2, rank), 1]
    return b.node("Transpose", [x], perm=perm)


@expansion("QLinearGlobalAveragePool", "QLinearAveragePool")
def _qlinear_pool(b: Body) -> None:
    """(X, X_scale, X_zero, Y_scale, Y_zero); channels_last: X and Y are NHWC."""
    last, rank = b.attrs.get("channels_last", 0), b.rank(0)
    attrs = {k: v for k, v in b.attrs.items() if k != "channels_last"}
    x = b.dq(0, 1, 2)
    x = _channels_first(b, x, rank, True) if last else x
    y = b.node(b.ctx.op_type[len("QLinear"):], [x], **attrs)
    b.q(_channels_first(b, y, rank, False) if last else y, 3, 4, b.output(0))


@expansion("QLinearConcat")
def _qlinear_concat(b: Body) -> None:
    """(Y_scale, Y_zero, then X, X_scale, X_zero for each input)."""
    parts = [b.dq(i, i + 1, i + 2) for i in range(2, len(b.ins), 3)]
    b.q(b.node("Concat", parts, axis=b.attrs["axis"]), 0, 1, b.output(0))


@expansion("QGemm")
def _qgemm(b: Body) -> None:
    """(A, A_scale, A_zero, B, B_scale, B_zero, C, Y_scale, Y_zero): alpha A' B' + C, C an int32 bias at scale
    A_scale * B_scale; float output without Y_scale."""
    trans_b = b.attrs.get("transB", 0)
    a = b.dq(0, 1, 2)
    w = b.dq(3, 4, 5, b.per_axis(4, 0 if trans_b else 1))
    inputs = [a, w]
    if b.input(6):
        scale = b.node("Mul", [b.input(1), b.input(4)])
        inputs.append(b.node("DequantizeLinear", [b.input(6), scale], axis=0))
    out = b.output(0) if not b.input(7) else None
    y = b.node("Gemm", inputs, out, alpha=b.attrs.get("alpha", 1.0), transA=b.attrs.get("transA", 0), transB=trans_b)
    if b.input(7):
        b.q(y, 7, 8, b.output(0))


def _product(b: Body, a: str, w: str, bias: int) -> None:
    """Output 0 = a @ w, plus input `bias` where the node has it."""
    y = b.node("MatMul", [a, w], None if b.input(bias) else b.output(0))
    if b.input(bias):
        b.node("Add", [y, b.input(bias)], b.output(0))


@expansion("MatMulIntegerToFloat")
def _matmul_integer_to_float(b: Body) -> None:
    """(A, B, A_scale, B_scale, A_zero, B_zero, bias): the float product of the dequantized operands (+ bias)."""
    a = b.dq(0, 2, 4)
    w = b.dq(1, 3, 5, b.per_axis(3, 1))
    _product(b, a, w, 6)


@expansion("DynamicQuantizeMatMul")
def _dynamic_quantize_matmul(b: Body) -> None:
    """(A, B, B_scale, B_zero, bias): A quantized to uint8 at run time (its range), times the dequantized B."""
    q = f"{b.prefix}/a_q"
    b.multi("DynamicQuantizeLinear", [b.input(0)], [q, q + "_scale", q + "_zero"])
    a = b.node("DequantizeLinear", [q, q + "_scale", q + "_zero"])
    w = b.dq(1, 2, 3, b.per_axis(2, 1))
    _product(b, a, w, 4)


# -- weight-only quantization -----------------------------------------------------------------------------------
def unpack_bits(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The first `count` unsigned `bits`-bit values along the last axis of bytes, the lowest bits first (element 2j
    of 4-bit values is byte j's low nibble)."""
    per = 8 // bits
    shifts = np.arange(per, dtype=np.uint8) * bits
    values = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return values.reshape(*packed.shape[:-1], -1)[..., :count]


def matmul_nbits_weight(b_: np.ndarray, scales: np.ndarray, zeros: np.ndarray | None, k: int, n: int, bits: int,
                        block: int) -> np.ndarray:  # fmt: skip
    """MatMulNBits' B as the float32 [K, N] matrix it stands for: B [N, blocks, block * bits / 8] bytes of
    `bits`-bit codes, per (column, block of K) a scale and a zero point (packed codes like B's, or floats; absent:
    2^(bits - 1)); each weight (code - zero point) * scale."""
    blocks = -(-k // block)
    codes = unpack_bits(b_.reshape(n, blocks, -1), bits, block).astype(np.float32)  # [N, blocks, block]
    scale = scales.astype(np.float32).reshape(n, blocks, 1)
    if zeros is None:
        zero = np.float32(1 << (bits - 1))
    elif zeros.dtype == np.uint8:
        zero = unpack_bits(zeros.reshape(n, -1), bits, blocks).astype(np.float32).reshape(n, blocks, 1)
    else:
        zero = zeros.astype(np.float32).reshape(n, blocks, 1)
    return np.ascontiguousarray(((codes - zero) * scale).reshape(n, blocks * block)[:, :k].T)


@expansion("MatMulNBits")
def _matmul_nbits(b: Body) -> None:
    """(A, B, scales, zero_points, g_idx, bias): A times a weight of `bits`-bit codes in blocks of K with a scale
    and zero point each (onnxruntime's weight-only int4/int8 quantization: `matmul_nbits_quantizer`, its GenAI
    model builder). The weight is dequantized to float32 at import and the product runs in float32 (no weight-only
    int4 kernel: 8x the weight's memory)."""
    k, n, block, bits = int(b.attrs["K"]), int(b.attrs["N"]), int(b.attrs["block_size"]), int(b.attrs.get("bits", 4))
    if bits not in (2, 4, 8):
        raise b.ctx.error(f"{bits}-bit weights (2, 4 or 8 are defined)")
    g_idx = b.ctx.const(4) if b.input(4) else np.arange(k) // block
    if g_idx is None or not np.array_equal(g_idx.reshape(-1), np.arange(k) // block):
        raise b.ctx.error("a g_idx that reorders K (act-order), or one read at run time, is not supported")
    parts = [b.ctx.const(i) for i in (1, 2)] + [b.ctx.const(3) if b.input(3) else None]
    if parts[0] is None or parts[1] is None or (b.input(3) and parts[2] is None):
        raise b.ctx.error("weights, scales and zero points must be constants (initializers)")
    w = matmul_nbits_weight(parts[0], parts[1], parts[2], k, n, bits, block)
    _product(b, b.input(0), b.const(w), 5)


__all__ = ["DOMAIN", "EXPANSIONS", "expand", "expand_contrib", "expansion"]
