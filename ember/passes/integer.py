"""IntegerOps: quantized convolutions and matrix products become integer kernels (`ember.ops.int8`).

QDQ form (what quantizers emit; runs before constant folding, which would fold the weights' DequantizeLinear):

    QuantizeLinear(y_s, y_z) <- [Relu | Clip] <- Conv | MatMul | Gemm(DequantizeLinear(x_q, x_s, x_z),
                                                            DequantizeLinear(W_q int8 const, w_s, 0) [, bias])
        ->  QConvPacked | QMatMulPacked(x_q, pack(W_q), bias', scale)

A Conv | MatMul | Gemm of the same two DequantizeLinear whose output is not quantized (a bottleneck's last
convolution, read by the residual Add; a classifier) becomes the same node with a float32 output, the dequantized
product float32(acc + bias') * (x_s * w_s): the float ops after it (DequantizeLinear of the shortcut, Add, Relu,
QuantizeLinear) fuse into its epilogue.

QOperator form: QLinearConv / QLinearMatMul with constant weights, the same rewrite. And
QuantizeLinear(MaxPool(DequantizeLinear(x))) with one scale and zero point is MaxPool on the integers.

The weights are packed once for the `dot_u8s8` intrinsic (stride-1 convolutions: for `dot_s8u8`, weights times
activations, packed with nb = 1 where the target has VNNI or AVX2 for their tile); bias' = the int32 bias
(DequantizeLinear(b_q, x_s * w_s, 0), or a float bias rounded to that scale) minus u(x_z) times W's column sums,
so the kernel multiplies raw activations; scale = x_s * w_s / y_s in float32; a Relu or a Clip with constant
bounds (ReLU6) becomes the clamp's bounds (y_z for Relu). The integer output feeds the next quantized op directly:
activations stay 8-bit between them, and the DequantizeLinear -> Add -> QuantizeLinear of a residual join fuse
into the producer's epilogue (`fuse_ops`).

Left as they were (float convolution between Q/DQ): grouped convolutions, weights with nonzero zero points,
per-tensor activation parameters that are not constants, non-2-d convolutions.
"""

from __future__ import annotations

import math

import numpy as np

from ember.graph.ir import Graph, Node, Value
from ember.graph.types import TensorType, np_dtype
from ember.ops import Pattern, get_op
from ember.ops.common import spatial_attrs
from ember.ops.evaluate import run_node
from ember.ops.int8 import space_to_depth_ok, space_to_depth_weight, wx_columns, wx_conv
from ember.target import Target
from ember.te.intrin import amx_tiles, dot_bf16_isa, dot_u8s8_isa, isa_features
from ember.templates import int8 as I8
from ember.templates.winograd import winograd_gain

from .layout import WINOGRAD_MIN_GAIN
from .util import constant_value, new_constant


def integer_ops(graph: Graph, target: Target | str | None = None) -> Graph:
    target = Target.parse(target or "c")
    if target.kind != "c":  # the intrinsics are C (the llvm and GPU targets run the float path of a QDQ graph)
        return graph
    _integer_moves(graph)
    _lookup_tables(graph)
    producers, consumers = graph.producers(), graph.consumers()
    outputs = set(graph.outputs)
    replaced: dict[Node, Node] = {}  # the node whose output the new node writes -> the new node
    for node in graph.nodes:
        new = None
        if node.op == "QuantizeLinear":
            new = _from_qdq(graph, node, producers, consumers, outputs, target) or _max_pool(node, producers,
                                                                                                consumers, outputs)
        elif node.op in ("QLinearConv", "QLinearMatMul"):
            new = _from_qoperator(graph, node, target)
        if new is not None:
            replaced[node] = new
    taken = {producers.get(v) for n in replaced for v in n.inputs}  # the cores a QuantizeLinear rewrite consumed
    taken |= {producers.get(v) for n in list(taken) if n is not None and n.op == "Relu" for v in n.inputs}
    for node in graph.nodes:  # the rest: float output, for the float ops after it (a residual Add, then Q)
        if node.op in ("Conv", "MatMul", "Gemm") and node not in taken and node not in replaced:
            new = (_float_out(graph, node, producers, target) or _activation_product(node, producers, target)
                   or _bf16_product(graph, node, producers, target))
            if new is not None:
                replaced[node] = new
    if replaced:
        graph.nodes = [replaced.get(n, n) for n in graph.nodes]
        graph.topo_sort()
        _residual_joins(graph)
        from .cleanup import dead_code_elimination

        dead_code_elimination(graph)
    return graph


def _residual_joins(graph: Graph) -> None:
    """QuantizeLinear(y_s, y_z) <- [Relu | Clip] <- Add(QConvPacked with a float32 output, DequantizeLinear(r, r_s,
    r_z)) of equal shapes, per-tensor constant parameters (a bottleneck's last convolution and its shortcut, as
    `ember.quantize` writes them): one QConvPacked with the 8-bit output and r as its fused residual (`ember.ops.
    int8`): scale / y_s and r_s / y_s in float32, so the epilogue multiplies where QuantizeLinear divides (within
    one step of it where the quotient is within float32 rounding of a tie), clamps as integers and writes 8 bits.
    In place; the nodes it absorbs are left to dead code elimination."""
    producers, consumers = graph.producers(), graph.consumers()
    outputs = set(graph.outputs)
    for i, q in enumerate(graph.nodes):
        ys, yz = (_scalar(q.inputs[1]), constant_value(q.inputs[2])) if q.op == "QuantizeLinear" and len(
            q.inputs) > 2 else (None, None)  # fmt: skip
        if ys is None or yz is None or yz.size != 1 or q.attrs.get("block_size", 0) or not ys > 0:
            continue
        yz = yz.reshape(())
        add, clamp = producers.get(q.inputs[0]), None
        if add is not None and add.op in ("Relu", "Clip") and _only_reader(add.outputs[0], consumers, outputs) is q:
            clamp = _clamp(add, np.float32(ys), yz)
            add = producers.get(add.inputs[0]) if clamp is not None else None
        if add is None or add.op != "Add" or _only_reader(add.outputs[0], consumers, outputs) is None:
            continue
        new = None
        for a, b in (add.inputs, add.inputs[::-1]):
            new = new or _join(graph, producers.get(a), b, add, ys, yz, clamp, producers, consumers, outputs)
        if new is not None:
            graph.nodes[i] = Node("QConvPacked", new[0], [q.outputs[0]], new[1], new[2])


def _join(graph: Graph, conv: Node | None, other: Value, add: Node, ys: float, yz: np.ndarray,
          clamp: tuple[int, int] | None, producers: dict, consumers: dict,
          outputs: set) -> tuple[list[Value], dict, str] | None:  # fmt: skip
    """(inputs, attrs, name) of `conv` (a float32-output QConvPacked read only by `add`) with `other` =
    DequantizeLinear(r) as its fused residual, requantized to (ys, yz) and clamped; None if they do not fit."""
    if conv is None or conv.op != "QConvPacked" or conv.attrs["y_dtype"] != "float32" or len(conv.inputs) != 4:
        return None
    if _only_reader(conv.outputs[0], consumers, outputs) is not add:
        return None
    rd = _dq(other, producers)
    if rd is None or rd[1].size != 1 or rd[2].size != 1 or rd[0].dtype not in ("uint8", "int8"):
        return None
    r, rs, rz, _ = rd
    if tuple(r.shape) != tuple(conv.outputs[0].shape) or tuple(other.shape) != tuple(add.outputs[0].shape):
        return None
    x, wp, bias, scale = conv.inputs
    yz_ = np.asarray(yz)
    new_scale = constant_value(scale).astype(np.float32) / np.float32(ys)
    res_scale = float(np.float32(rs.reshape(())) / np.float32(ys))
    bound = _acc_bound(I8.unpack_weight(constant_value(wp), conv.attrs["n"]), constant_value(bias), new_scale)
    attrs = {**conv.attrs, **_requant_attrs(conv.attrs["n"], conv.attrs["x_zero"], ys, yz_, clamp,
                                            bound + 255 * abs(res_scale))}  # fmt: skip
    attrs.update(res_zero=int(rz.reshape(())), res_scale=res_scale)
    scale_q = new_constant(graph, f"{conv.name}_requant_scale_res", new_scale)
    return [x, wp, bias, scale_q, r], attrs, conv.name


MOVES = ("Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity")  # ops that only move values


def _integer_moves(graph: Graph) -> None:
    """QuantizeLinear(move(... move(DequantizeLinear(x)))) with the same per-tensor scale and zero point, the moves
    (Reshape, Transpose, ...) each the only reader of the one before: the moves on x itself (exact: they copy
    values), e.g. attention's head split on the projection's 8-bit output. In place."""
    producers, consumers = graph.producers(), graph.consumers()
    outputs = set(graph.outputs)
    dropped = []
    for q in graph.nodes:
        if q.op != "QuantizeLinear" or len(q.inputs) < 3 or q.attrs.get("block_size", 0):
            continue
        chain, reader, cur = [], q, producers.get(q.inputs[0])
        while cur is not None and cur.op in MOVES and len(cur.outputs) == 1 and _only_reader(
                cur.outputs[0], consumers, outputs) is reader:  # fmt: skip
            chain.append(cur)
            reader, cur = cur, producers.get(cur.inputs[0])
        if not chain or cur is None or cur.op != "DequantizeLinear" or len(cur.inputs) < 3:
            continue
        same = all(_scalar(a) is not None and _scalar(a) == _scalar(b) for a, b in zip(cur.inputs[1:3], q.inputs[1:3]))
        if not same or cur.inputs[0].dtype != q.outputs[0].dtype or cur.attrs.get("block_size", 0):
            continue
        chain.reverse()
        chain[0].inputs[0] = cur.inputs[0]
        for move in chain[:-1]:
            move.outputs[0].type = TensorType(move.outputs[0].shape, q.outputs[0].dtype)
        chain[-1].outputs[0] = q.outputs[0]
        dropped.append(q)
    if dropped:
        gone = {id(n) for n in dropped}
        graph.nodes = [n for n in graph.nodes if id(n) not in gone]


def _lookup_tables(graph: Graph) -> None:
    """QuantizeLinear(f(DequantizeLinear(x))) for an elementwise f of x alone (its other operands scalar constants,
    its intermediate values read only inside it: GELU's Div, Erf, Add, Mul, Mul), per-tensor parameters: Lookup(x,
    table), the table the reference evaluation of the whole chain on the 256 codes (x has no other values). f may
    read x more than once, also through tables made before it: SiLU as quantizers write it, x * sigmoid(x) with
    the sigmoid quantized, Mul(DequantizeLinear(x), DequantizeLinear(Lookup(x))), becomes one table. In place; the
    float chain and the tables no longer read are left to dead code elimination."""
    producers, consumers = graph.producers(), graph.consumers()
    outputs = set(graph.outputs)
    for i, q in enumerate(graph.nodes):
        if q.op != "QuantizeLinear" or len(q.inputs) < 3 or q.attrs.get("block_size", 0) or _scalar(q.inputs[1]) is \
                None or _scalar(q.inputs[2]) is None:  # fmt: skip
            continue
        chain = _elementwise_chain(q, producers, consumers, outputs)
        if chain is None:
            continue
        x, nodes = chain
        if tuple(x.shape) != tuple(q.outputs[0].shape):  # (a constant broadcast the chain to another shape)
            continue
        codes = np.arange(256) - (128 if x.dtype == "int8" else 0)
        env = {x: codes.astype(x.dtype)}
        for node in [*nodes, q]:
            args = [v.data if v is not None and v.is_constant else env.get(v) for v in node.inputs]
            env[node.outputs[0]] = run_node(node, args, check=False)[0]
        table = new_constant(graph, f"{q.name}_table", env[q.outputs[0]].astype(q.outputs[0].dtype).reshape(256))
        graph.nodes[i] = Node("Lookup", [x, table], [q.outputs[0]], {}, q.name)
        producers[q.outputs[0]] = graph.nodes[i]  # (a later chain reads it: SiLU's sigmoid)
        consumers.setdefault(x, []).append(graph.nodes[i])


def _elementwise_chain(q: Node, producers: dict, consumers: dict, outputs: set) -> tuple[Value, list[Node]] | None:
    """(x, the nodes from x to q's input in evaluation order) of a QuantizeLinear's f (see `_lookup_tables`): the
    DequantizeLinear leaves read x, or Lookups of x."""
    body: list[Node] = []
    dqs: list[Node] = []
    todo = [producers.get(q.inputs[0])]
    while todo:
        n = todo.pop()
        if n is None:
            return None
        if n in body or n in dqs:
            continue
        if n.op == "DequantizeLinear":
            params = [_scalar(v) for v in n.inputs[1:3]] if len(n.inputs) >= 3 else [None]
            v = n.inputs[0]
            if None in params or v.dtype not in ("uint8", "int8") or v.is_constant:
                return None
            dqs.append(n)
            continue
        if n.subgraphs() or len(n.outputs) != 1 or get_op(n.op).pattern not in (Pattern.ELEMWISE, Pattern.BROADCAST):
            return None
        body.append(n)
        for v in n.inputs:
            if v is not None and v.is_constant:
                if v.data.size != 1:
                    return None
            elif v is not None:
                todo.append(producers.get(v))
    if not dqs or not body:
        return None
    inside = set(body) | {q}
    for n in body:  # (the DequantizeLinear may have other readers)
        if n.outputs[0] in outputs or any(r not in inside for r in consumers.get(n.outputs[0], [])):
            return None
    tables: list[Node] = []  # the Lookups between x and the leaves, x first
    roots = set()
    for dq in dqs:
        v, path = dq.inputs[0], []
        while (p := producers.get(v)) is not None and p.op == "Lookup" and p.inputs[1].is_constant:
            path.append(p)
            v = p.inputs[0]
        roots.add(v)
        tables += [t for t in reversed(path) if t not in tables]
    if len(roots) != 1:
        return None
    x = roots.pop()
    body.sort(key=_order_key(producers, body))
    return x, [*tables, *dqs, *body]


def _order_key(producers: dict, chain: list[Node]):
    """Topological order of a chain's nodes: by their depth from the chain's source (counted inside the chain
    only: the graph above it may be deeper than Python's recursion limit)."""
    depth: dict[int, int] = {}
    members = {id(n) for n in chain}

    def d(n: Node) -> int:
        if id(n) not in depth:
            ps = [producers.get(v) for v in n.inputs if v is not None and not v.is_constant]
            depth[id(n)] = 1 + max((d(p) for p in ps if p is not None and id(p) in members), default=0)
        return depth[id(n)]

    return d


def _max_pool(q: Node, producers: dict, consumers: dict, outputs: set) -> Node | None:
    """QuantizeLinear(MaxPool(DequantizeLinear(x))) with the same scale and zero point: MaxPool on x itself
    (dequantization is monotonic and the maximum is one of the inputs: exact)."""
    pool = producers.get(q.inputs[0])
    if pool is None or pool.op != "MaxPool" or len(pool.outputs) != 1:
        return None
    if _only_reader(pool.outputs[0], consumers, outputs) is not q:
        return None
    dq = producers.get(pool.inputs[0])
    if dq is None or dq.op != "DequantizeLinear" or len(dq.inputs) < 3 or len(q.inputs) < 3:
        return None
    same = all(_scalar(a) is not None and _scalar(a) == _scalar(b) for a, b in zip(dq.inputs[1:3], q.inputs[1:3]))
    if not same or dq.inputs[0].dtype != q.outputs[0].dtype:
        return None
    return Node("MaxPool", [dq.inputs[0]], [q.outputs[0]], dict(pool.attrs), pool.name)


def _scalar(v: Value | None) -> float | None:
    d = constant_value(v)
    return None if d is None or d.size != 1 else d.reshape(()).item()


def _dq(v: Value, producers: dict) -> tuple[Value, np.ndarray, np.ndarray, int] | None:
    """(x_q, scale, zero point, axis) of a DequantizeLinear that produces v with constant parameters."""
    p = producers.get(v)
    if p is None or p.op != "DequantizeLinear" or p.attrs.get("block_size", 0):
        return None
    s = constant_value(p.inputs[1])
    z = constant_value(p.inputs[2]) if len(p.inputs) > 2 and p.inputs[2] is not None else np.zeros((), np.int8)
    if s is None or z is None:
        return None
    return p.inputs[0], s, z, int(p.attrs.get("axis", 1))


def _only_reader(v: Value, consumers: dict, outputs: set) -> Node | None:
    users = consumers.get(v, [])
    return users[0] if len(users) == 1 and v not in outputs else None


def _from_qdq(graph: Graph, q: Node, producers: dict, consumers: dict, outputs: set, target: Target) -> Node | None:
    ys, yz = _scalar(q.inputs[1]), constant_value(q.inputs[2]) if len(q.inputs) > 2 else None
    if ys is None or yz is None or yz.size != 1 or q.attrs.get("block_size", 0):
        return None
    core = producers.get(q.inputs[0])
    yz = yz.reshape(())
    clamp = None
    if core is not None and core.op in ("Relu", "Clip") and _only_reader(core.outputs[0], consumers, outputs) is q:
        clamp = _clamp(core, np.float32(ys), yz)
        if clamp is None:
            return None
        core = producers.get(core.inputs[0])
    if core is None or core.op not in ("Conv", "MatMul", "Gemm") or len(core.outputs) != 1:
        return None
    if _only_reader(core.outputs[0], consumers, outputs) is None:
        return None
    return _from_core(graph, core, q.outputs[0], float(ys), yz, clamp, producers, target)


def _clamp(act: Node, ys: np.float32, yz: np.ndarray) -> tuple[int, int] | None:
    """The integer bounds a Relu or a Clip with constant bounds puts on QuantizeLinear's output: quantization is
    monotonic, so Q(clip(v, lo, hi)) = clamp(Q(v), Q(lo), Q(hi)) exactly (Relu: lo = 0, Q(0) = y_zero)."""
    info = np.iinfo(yz.dtype)
    if act.op == "Relu":
        return int(yz), int(info.max)
    bounds = [act.attrs.get("min"), act.attrs.get("max")]
    for i, v in enumerate(act.inputs[1:3]):
        if v is not None:
            c = constant_value(v)
            if c is None or c.size != 1:
                return None
            bounds[i] = float(c.reshape(()))
    q = [lim if b is None else int(np.clip(np.rint(np.float32(b) / ys) + int(yz), info.min, info.max))
         for b, lim in zip(bounds, (info.min, info.max))]  # fmt: skip
    return q[0], q[1]


def _from_core(graph: Graph, core: Node, out: Value, ys: float | None, yz: np.ndarray | None,
               clamp: tuple[int, int] | None, producers: dict, target: Target) -> Node | None:
    """The integer node of `core` writing `out`: requantized to (ys, yz), or dequantized (ys None)."""
    xd, wd = _dq(core.inputs[0], producers), _dq(core.inputs[1], producers)
    if xd is None or wd is None or xd[1].size != 1 or xd[2].size != 1:
        return None
    xq, xs, xz, _ = xd
    wq, ws, wz, waxis = wd
    w = constant_value(wq)
    if w is None or w.dtype != np.int8 or np.any(wz != 0):
        return None
    bias = core.inputs[2] if len(core.inputs) > 2 else None
    b_int = _bias(bias, producers, float(xs.reshape(())) * ws.astype(np.float64))
    if bias is not None and b_int is None:
        return None
    if core.op == "Gemm":
        a = core.attrs
        if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0 or w.ndim != 2:
            return None
        if a.get("transB", 0):
            w, waxis = w.T, 1 - waxis
    if core.op != "Conv" and (w.ndim != 2 or (ws.size > 1 and waxis % 2 != 1)):
        return None
    if core.op == "Conv" and ws.size > 1 and (waxis % max(w.ndim, 1) != 0 or ws.size != w.shape[0]):
        return None  # per-channel scales along another axis than the output channels
    return _make(graph, core, xq, float(xs.reshape(())), int(xz.reshape(())), w, ws, ys, yz, b_int, clamp, out,
                 target)


def _activation_product(core: Node, producers: dict, target: Target) -> Node | None:
    """MatMul(DequantizeLinear(x_q, x_s, x_z), DequantizeLinear(y_q int8, y_s, 0)) of two activations (attention's
    Q x K^T, probabilities x V), per-tensor parameters, the same batch dims: QBatchMatMul, the int32 product
    dequantized by x_s * y_s (float32), for the float ops after it (the softmax scale, the mask)."""
    if core.op != "MatMul" or len(core.outputs) != 1 or core.outputs[0].dtype != "float32":
        return None
    xd, yd = _dq(core.inputs[0], producers), _dq(core.inputs[1], producers)
    if xd is None or yd is None or any(p.size != 1 for p in (*xd[1:3], *yd[1:3])):
        return None
    (xq, xs, xz, _), (yq, ys, yz, _) = xd, yd
    if constant_value(yq) is not None or xq.dtype not in ("uint8", "int8") or yq.dtype != "int8" or yz.any():
        return None
    shapes = (tuple(xq.shape), tuple(yq.shape))
    if not all(isinstance(d, int) for s in shapes for d in s) or len(shapes[0]) < 2 or shapes[0][:-2] != \
            shapes[1][:-2] or len(shapes[0]) != len(shapes[1]):  # fmt: skip
        return None
    scale = float(np.float32(xs.reshape(())) * np.float32(ys.reshape(())))
    attrs = {"x_zero": int(xz.reshape(())), "scale": scale}
    tile_rows = I8.amx_tile_rows(target, shapes[0][-2], shapes[1][-1]) if -shapes[0][-1] % 64 == 0 else 0
    if tile_rows:  # (a K of whole 64-byte steps: the tiles' calls run on AMX)
        attrs["tile_rows"] = tile_rows
    return Node("QBatchMatMul", [xq, yq], [core.outputs[0]], attrs, core.name)


STEM_CHANNELS = 16  # fewer input channels (an image's stem): the float NCHWc convolution beats im2col in bfloat16
# a bfloat16 convolution gathers its NCHW input into rows of channels (im2col): below this many input or output
# channels that gather costs more than the blocked float32 kernel saves (MobileNetV2 at 1 thread: 33.2 ms in bf16
# with every convolution converted, 9.5 ms from 64 channels, 7.6 ms from 128; float32 6.5 ms; ResNet-50 unchanged)
BF16_MIN_CHANNELS = 128
# Whether bfloat16 convolutions become BF16ConvPacked (im2col, then vdpbf16ps) at all: off, because the float32
# NCHWc kernels on the rounded operands were faster on every model measured (Xeon with avx512_bf16 and AMX, whole
# models with all other convolutions float: ResNet-50 76.8 -> 56.3 ms, ResNet-18 25.2 -> 23.0, 1 thread; an EPYC
# measured ResNet-50 no faster either). The rounding stays in the float kernels' epilogues, vectorized.
BF16_CONVS = False


def _bf16_activation(v: Value, producers: dict) -> Value | None:
    """x of Cast(float32, Cast(bfloat16, x float32)): an activation rounded to bfloat16."""
    p = producers.get(v)
    q = producers.get(p.inputs[0]) if p is not None and p.op == "Cast" and v.dtype == "float32" else None
    if q is None or q.op != "Cast" or q.outputs[0].dtype != "bfloat16" or q.inputs[0].dtype != "float32":
        return None
    return q.inputs[0]


def _bf16_weight(v: Value, producers: dict) -> np.ndarray | None:
    """W as bfloat16: a constant bfloat16 W read through a Cast to float32, or a float32 constant whose every value
    is a bfloat16 (that Cast folded by the importer: rounding it again changes nothing)."""
    p = producers.get(v)
    if p is not None and p.op == "Cast" and v.dtype == "float32" and p.inputs[0].dtype == "bfloat16":
        return constant_value(p.inputs[0])
    w = constant_value(v)
    if w is None or w.dtype != np.float32:
        return None
    wb = w.astype(np_dtype("bfloat16"))
    return wb if np.array_equal(wb.astype(np.float32), w) else None


def _bf16_product(graph: Graph, core: Node, producers: dict, target: Target) -> Node | None:
    """Conv | MatMul | Gemm of an activation rounded to bfloat16 and a bfloat16 weight (the model `ember.quantize`
    writes with precision="bf16"): BF16ConvPacked | BF16MatMulPacked (`ember.ops.bf16`), the weight packed in
    pairs for vdpbf16ps, the activation rounded in the kernel. Targets with avx512_bf16 only (elsewhere the float
    product of the rounded operands is the faster portable path)."""
    if core.op not in ("Conv", "MatMul", "Gemm") or len(core.outputs) != 1 or len(core.inputs) < 2:
        return None
    x, w = _bf16_activation(core.inputs[0], producers), _bf16_weight(core.inputs[1], producers)
    if x is None or w is None or not all(isinstance(d, int) for d in x.shape):
        return None
    bias = core.inputs[2] if len(core.inputs) > 2 else None
    b = constant_value(bias) if bias is not None else None
    if bias is not None and (b is None or b.dtype != np.float32):
        return None
    if core.op == "Conv":
        if w.ndim != 4 or len(x.shape) != 4 or core.attrs.get("group", 1) != 1:
            return None
        co, c, kh, kw = w.shape
        small = min(c, co) < BF16_MIN_CHANNELS
        if not BF16_CONVS or small or _winograd_wins(core, x, co, tuple(core.outputs[0].shape)):
            return None  # the float layout pass's kernels are faster for these
        cp = -(-c // 2) * 2
        wpad = np.zeros((co, cp, kh, kw), w.dtype)
        wpad[:, :c] = w
        w_kn = wpad.transpose(2, 3, 1, 0).reshape(kh * kw * cp, co)
    else:
        if core.op == "Gemm":
            a = core.attrs
            if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0 or w.ndim != 2:
                return None
            w = w.T if a.get("transB", 0) else w
        if w.ndim != 2 or len(x.shape) < 2:
            return None
        co = w.shape[1]
        w_kn = np.zeros((-(-w.shape[0] // 2) * 2, co), w.dtype)
        w_kn[: w.shape[0]] = w
    if b is not None and b.size != co:
        return None
    nb = I8.choose_nb(co, target, _row_block(core, x, w.shape[3]) if core.op == "Conv" else 0)
    if dot_bf16_isa(isa_features(target), nb) != "avx512_bf16":
        return None
    tile_rows = 0 if core.op == "Conv" else I8.amx_tile_rows(target, x.shape[-2], co, "bf16")
    if tile_rows:  # AMX's tiles: panels of 32 columns, tiles of 32 or 16 rows (as an int8 MatMul's)
        nb = I8.AMX_PANEL
    inputs = [x, new_constant(graph, f"{core.name}_packed_bf16", I8.pack_pairs(w_kn, nb))]
    if b is not None:
        inputs.append(new_constant(graph, f"{core.name}_bias", b.reshape(-1).astype(np.float32)))
    attrs: dict = {"n": co}
    if core.op == "Conv":
        attrs.update(kernel_shape=(kh, kw), strides=tuple(core.attrs.get("strides") or (1, 1)),
                     pads=tuple(core.attrs.get("pads") or (0, 0, 0, 0)),
                     dilations=tuple(core.attrs.get("dilations") or (1, 1)))  # fmt: skip
        return Node("BF16ConvPacked", inputs, list(core.outputs), attrs, core.name)
    if tile_rows:
        attrs["tile_rows"] = tile_rows
    return Node("BF16MatMulPacked", inputs, list(core.outputs), attrs, core.name)


def _winograd_wins(core: Node, x: Value, co: int, out: tuple) -> bool:
    """Whether the float layout pass would run this convolution as Winograd F(4x4, 3x3) (`ember.passes.layout`):
    it does about a quarter of the multiplications, faster than the direct bfloat16 product on this kind of
    CPU; the bfloat16-rounded operands then go through it as float32."""
    (sh, sw), _, dil = spatial_attrs(core.attrs, 2)
    w = core.inputs[1]
    if tuple(w.shape[2:]) != (3, 3) or {sh, sw, *dil} != {1} or not all(isinstance(d, int) for d in out):
        return False
    return winograd_gain(out[0], x.shape[1], co, tuple(out[2:])) >= WINOGRAD_MIN_GAIN


def _float_out(graph: Graph, core: Node, producers: dict, target: Target) -> Node | None:
    """Conv | MatMul | Gemm(DequantizeLinear(x_q), DequantizeLinear(W_q) [, bias]) whose output is not quantized
    (a bottleneck's last convolution before the residual Add, a classifier): the integer product with the
    dequantizing epilogue float32(acc + bias') * x_s * w_s, so the float ops after it fuse into the kernel."""
    if len(core.outputs) != 1 or core.outputs[0].dtype != "float32":
        return None
    return _from_core(graph, core, core.outputs[0], None, None, None, producers, target)


def _bias(bias: Value | None, producers: dict, bscale: np.ndarray) -> np.ndarray | None:
    """The int32 bias at scale x_s * w_s: DequantizeLinear(b_q int32, that scale, 0), or a float constant rounded."""
    if bias is None:
        return np.zeros(1, np.int64)
    bd = _dq(bias, producers)
    if bd is not None:
        bq = constant_value(bd[0])
        if bq is not None and bq.dtype == np.int32 and not np.any(bd[2] != 0):
            return bq.astype(np.int64)
        return None
    b = constant_value(bias)
    return None if b is None else np.rint(b.astype(np.float64) / bscale).astype(np.int64)


def _from_qoperator(graph: Graph, node: Node, target: Target) -> Node | None:
    x, xs, xz, w, ws, wz, ys, yz = node.inputs[:8]
    params = [_scalar(xs), _scalar(xz), _scalar(ys)]
    wv, wsv, wzv, yzv = (constant_value(v) for v in (w, ws, wz, yz))
    if any(p is None for p in params) or wv is None or wsv is None or yzv is None or wv.dtype != np.int8:
        return None
    if wzv is not None and np.any(wzv != 0):
        return None
    b = node.inputs[8] if len(node.inputs) > 8 else None
    b_int = np.zeros(1, np.int64) if b is None else constant_value(b)
    if b_int is None:
        return None
    return _make(graph, node, x, float(params[0]), int(params[1]), wv, wsv, float(params[2]), yzv.reshape(()),
                 b_int.astype(np.int64), None, node.outputs[0], target)  # fmt: skip


def _make(graph: Graph, core: Node, xq: Value, xs: float, xz: int, w: np.ndarray, ws: np.ndarray,
          ys: float | None, yz: np.ndarray | None, b_int: np.ndarray, clamp: tuple[int, int] | None, out: Value,
          target: Target) -> Node | None:  # fmt: skip
    """ys None: a float32 output (dequantized: no y_s, y_zero or rounding)."""
    if xq.dtype not in ("uint8", "int8") or (yz is not None and yz.dtype not in (np.uint8, np.int8)):
        return None
    conv = core.op in ("Conv", "QLinearConv")
    if conv and _depthwise(core, w, xq):
        return _make_depthwise(graph, core, xq, xs, xz, w, ws, ys, yz, b_int, clamp, out)
    s2d = 1
    if conv:
        if w.ndim != 4 or core.attrs.get("group", 1) != 1 or len(xq.shape) != 4:
            return None
        co, c, kh, kw = w.shape
        cp = -(-c // 4) * 4
        wpad = np.zeros((co, cp, kh, kw), np.int8)
        wpad[:, :c] = w
        s2d = _space_to_depth(core, xq, w.shape, target)
        if s2d > 1:  # a stem (few channels, strided): its phase planes' convolution, W x X, no im2col
            wpad = space_to_depth_weight(wpad, s2d)
            kh, kw, cp = wpad.shape[2], wpad.shape[3], wpad.shape[1]
        w_kn = wpad.transpose(2, 3, 1, 0).reshape(kh * kw * cp, co)
    else:
        k, co = w.shape
        w_kn = np.zeros((-(-k // 4) * 4, co), np.int8)
        w_kn[:k] = w
    rows = math.prod(xq.shape[:-1]) if not conv and all(isinstance(d, int) for d in xq.shape) else 0
    nb = I8.choose_nb(co, target, _row_block(core, xq, w.shape[3]) if conv else 0, product_rows=rows)
    tile_rows = I8.amx_tile_rows(target, xq.shape[-2] if rows else 0, co)  # (the template's rows: one matrix's)
    if tile_rows:
        nb = I8.AMX_PANEL
    xzu = xz + (128 if xq.dtype == "int8" else 0)
    folded = _bias_and_scale(b_int, xzu * w_kn.astype(np.int64).sum(axis=0), xs, ws, ys)
    if folded is None:
        return None
    bias, scale = folded
    attrs = _requant_attrs(co, xz, ys, yz, clamp, _acc_bound(w_kn, bias, scale))
    if conv:
        nd = 2
        attrs.update(kernel_shape=tuple(w.shape[2:]), strides=tuple(core.attrs.get("strides") or (1,) * nd),
                     pads=tuple(core.attrs.get("pads") or (0,) * 2 * nd),
                     dilations=tuple(core.attrs.get("dilations") or (1,) * nd))  # fmt: skip
        if s2d > 1:
            attrs["s2d"] = s2d
        if amx_tiles(isa_features(target), 16, 16):
            attrs["amx"] = 1  # W x X tiles on AMX: flat images, padded rows of whole tiles (`I8.amx_wx_tile`)
        static = all(isinstance(d, int) for d in xq.shape)
        wx = static and wx_conv(attrs, tuple(xq.shape))
        if wx and dot_u8s8_isa(isa_features(target), wx_columns(attrs, tuple(xq.shape)), True) != "c":
            nb = 1  # weights times activations: W's rows as they are (`ember.templates.int8.int8_acc_wx`)
    consts = [new_constant(graph, f"{core.name}_{what}", data) for what, data in
              (("packed_w", I8.pack_weight(w_kn, nb)), ("bias_q", bias.astype(np.int32)),
               ("requant_scale", scale.astype(np.float32)))]  # fmt: skip
    if tile_rows:
        attrs["tile_rows"] = tile_rows
    return Node("QConvPacked" if conv else "QMatMulPacked", [xq, *consts], [out], attrs, core.name)


def _row_block(core: Node, xq: Value, k: int) -> int:
    """The output row width of a convolution with kernel width k (the im2col template's row tiles stay within one
    row), 0 if unknown."""
    if len(xq.shape) != 4 or not isinstance(xq.shape[3], int):
        return 0
    s = (core.attrs.get("strides") or (1, 1))[-1]
    pads = core.attrs.get("pads") or (0, 0, 0, 0)
    d = (core.attrs.get("dilations") or (1, 1))[-1]
    return (xq.shape[3] + pads[1] + pads[3] - d * (k - 1) - 1) // s + 1


def _space_to_depth(core: Node, xq: Value, w_shape: tuple[int, ...], target: Target) -> int:
    """The stride of a strided convolution on at most 4 channels (an image's stem: im2col would copy each pixel
    k * k times for a K of a few channels) that runs as the stride-1 convolution of its phase planes (`ember.ops.
    int8.space_to_depth_ok`) on the target's W x X micro-kernel; 1 otherwise."""
    shape = tuple(xq.shape)
    if len(shape) != 4 or not all(isinstance(d, int) for d in shape) or shape[1] > 4:
        return 1
    attrs = {"n": w_shape[0], "kernel_shape": tuple(w_shape[2:]),
             "strides": tuple(core.attrs.get("strides") or (1, 1)), "pads": tuple(core.attrs.get("pads") or (0,) * 4),
             "dilations": tuple(core.attrs.get("dilations") or (1, 1))}  # fmt: skip
    if not space_to_depth_ok(attrs, shape):
        return 1
    st = attrs["strides"][0]
    ok = wx_conv({**attrs, "s2d": st}, shape) and dot_u8s8_isa(
        isa_features(target), wx_columns({**attrs, "s2d": st}, shape), True) != "c"  # fmt: skip
    return st if ok else 1


def _depthwise(core: Node, w: np.ndarray, xq: Value) -> bool:
    """A 2-d convolution with one filter per channel (group = C = output channels), static shapes, equal strides."""
    group = core.attrs.get("group", 1)
    strides = tuple(core.attrs.get("strides") or (1, 1))
    return (w.ndim == 4 and len(xq.shape) == 4 and all(isinstance(d, int) for d in xq.shape) and group > 1
            and w.shape[0] == group == xq.shape[1] and w.shape[1] == 1 and strides[0] == strides[1]
            and w.shape[2] * w.shape[3] * 255 * 128 < 2**24)  # fmt: skip


def _bias_and_scale(b_int: np.ndarray, zero_sums: np.ndarray, xs: float, ws: np.ndarray,
                    ys: float | None) -> tuple[np.ndarray, np.ndarray] | None:  # fmt: skip
    """Per output channel: the int32 bias with the input zero point's share (`zero_sums`: u(x_z) x each filter's sum)
    folded in, and the requantization scale x_s * w_s / y_s (float32, as the reference computes it); None when the
    bias leaves int32."""
    n = len(zero_sums)
    bias = np.broadcast_to(b_int, (n,)) - zero_sums
    if np.any(np.abs(bias) >= 2**31):
        return None
    scale = np.float32(xs) * np.broadcast_to(ws.astype(np.float32).reshape(-1), (n,))
    return bias, scale if ys is None else scale / np.float32(ys)


def _acc_bound(w_kn: np.ndarray, bias: np.ndarray, scale: np.ndarray) -> float:
    """The largest |float32(acc + bias) * scale| any uint8 input allows, per output column j at most
    255 * sum |W[:, j]| + |bias[j]|, times scale[j] (with a margin for float32 rounding)."""
    acc = 255.0 * np.abs(w_kn.astype(np.float64)).sum(axis=0) + np.abs(bias.astype(np.float64))
    return float(np.max(acc * np.abs(scale.astype(np.float64)))) * (1 + 1e-6)


def _requant_attrs(co: int, xz: int, ys: float | None, yz: np.ndarray | None, clamp: tuple[int, int] | None,
                   bound: float = np.inf) -> dict:  # fmt: skip
    """`bound`: the largest |requantized value| before rounding (`_acc_bound`); below 2^31 with the zero point,
    the kernel rounds to int32 and clamps integers (`int_clamp`)."""
    if ys is None or yz is None:
        return {"n": co, "x_zero": xz, "y_zero": 0, "y_dtype": "float32"}
    attrs = {"n": co, "x_zero": xz, "y_zero": int(yz), "y_dtype": yz.dtype.name}
    if clamp is not None:
        attrs.update(y_min=clamp[0], y_max=clamp[1])
    if bound + abs(int(yz)) + 1 < 2**31:
        attrs["int_clamp"] = 1
    return attrs


def _make_depthwise(graph: Graph, core: Node, xq: Value, xs: float, xz: int, w: np.ndarray, ws: np.ndarray,
                    ys: float | None, yz: np.ndarray | None, b_int: np.ndarray, clamp: tuple[int, int] | None,
                    out: Value) -> Node | None:  # fmt: skip
    """QConvDepthwise: the filters as float32 [C, KH * KW] (exact), bias' = bias - u(x_z) * each filter's sum."""
    c, _, kh, kw = w.shape
    xzu = xz + (128 if xq.dtype == "int8" else 0)
    wf = w.reshape(c, kh * kw)
    folded = _bias_and_scale(b_int, xzu * wf.astype(np.int64).sum(axis=1), xs, ws, ys)
    if folded is None:
        return None
    bias, scale = folded
    attrs = _requant_attrs(c, xz, ys, yz, clamp, _acc_bound(wf.T, bias, scale))
    attrs.update(kernel_shape=(kh, kw), strides=tuple(core.attrs.get("strides") or (1, 1)),
                 pads=tuple(core.attrs.get("pads") or (0, 0, 0, 0)),
                 dilations=tuple(core.attrs.get("dilations") or (1, 1)))  # fmt: skip
    consts = [new_constant(graph, f"{core.name}_{what}", data) for what, data in
              (("dw_w", wf.astype(np.float32)), ("bias_q", bias.astype(np.int32)),
               ("requant_scale", scale.astype(np.float32)))]  # fmt: skip
    return Node("QConvDepthwise", [xq, *consts], [out], attrs, core.name)
