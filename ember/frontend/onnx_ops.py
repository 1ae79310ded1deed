"""ONNX operator converters: ONNX node (any supported version) -> normalized Ember node(s).

An ONNX operator maps to the Ember operator of the same name unless `CONVERTERS` has a
row for it. Converters read ONNX's version differences (axes as inputs or attributes,
Clip bounds, Pad amounts, Resize scales/sizes, ...) and emit Ember's normalized form:
static operands become attributes, defaults become explicit. Operators that Ember lacks
but ONNX defines as a function are expanded from the function body (`expand_function`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx

from ember.frontend import onnx_contrib, onnx_ml
from ember.frontend.onnx_functions import expand_function
from ember.frontend.onnx_importer import (
    MIN_OPSET,
    DynamicShapeError,
    NodeContext,
    get_schema,
    is_default_domain,
    normal_domain,
    onnx_dtype,
)
from ember.graph.dims import DimError, dim_product, is_static_dim, range_length, reads_values, simplify_dim
from ember.graph.ir import Graph, Value
from ember.graph.types import TensorType
from ember.ops import OPS
from ember.ops.common import norm_axes
from ember.ops.control import captures_of
from ember.ops.tensor import resolve_reshape, split_sizes

Converter = Callable[[NodeContext], None]
CONVERTERS: dict[str, Converter] = {}

# Models older than opset 13: an operator version from opset 7 on is accepted when it is the
# version opset 13 uses, or when the converters map its differences (attributes that later
# became inputs, Softmax's 2-d coercion, ...). Unknown legacy attributes fail loudly in
# OpDef.check_attrs. These versions are not mapped:
OLDEST_VERSION = 1
MIN_VERSION = {"Resize": 11, "Upsample": 9, "Scan": 8}


def converter(*names: str) -> Callable[[Converter], Converter]:
    def wrap(fn: Converter) -> Converter:
        for n in names:
            CONVERTERS[n] = fn
        return fn

    return wrap


def emit(ctx: NodeContext, op: str | None = None, inputs=None, attrs: dict | None = None) -> None:
    """Add the Ember node for this ONNX node, under the ONNX output names."""
    ctx.importer.add_node(
        op or ctx.op_type, ctx.inputs if inputs is None else inputs, ctx.attrs if attrs is None else attrs,
        ctx.out_names, ctx.name,
    )  # fmt: skip


# -- support checks ------------------------------------------------------------------------------
# ai.onnx.ml operators with an Ember entry of the same name
ML_OPS = {"Binarizer", "ArrayFeatureExtractor"}


def has_ember_entry(op_type: str, domain: str) -> bool:
    domain = normal_domain(domain)
    if domain == "":
        return op_type in CONVERTERS or op_type in OPS
    return domain == "ai.onnx.ml" and op_type in ML_OPS


def support_problem(op_type: str, domain: str, opsets: dict[str, int]) -> str | None:
    """None if Ember can import this operator under these opsets, else a short reason."""
    if normal_domain(domain) == onnx_contrib.DOMAIN:
        return None if op_type in onnx_contrib.EXPANSIONS else "a Microsoft contrib operator Ember does not expand"
    if normal_domain(domain) == onnx_ml.DOMAIN and op_type in onnx_ml.EXPANSIONS:
        return None
    schema = get_schema(op_type, domain, opsets)
    if schema is None:
        return "not an ONNX operator" if is_default_domain(domain) else f"unknown operator of domain {domain!r}"
    opset = opsets.get("", MIN_OPSET)
    if has_ember_entry(op_type, domain) and not is_default_domain(domain):
        return None
    if has_ember_entry(op_type, domain):
        if opset >= MIN_OPSET:
            return None
        try:
            current = onnx.defs.get_schema(op_type, MIN_OPSET, "").since_version
        except Exception:
            current = -1
        version = schema.since_version
        if current == version or version >= max(OLDEST_VERSION, MIN_VERSION.get(op_type, 0)):
            return None
        return f"version {version} is older than Ember maps"
    if schema.has_function or schema.has_context_dependent_function:
        return None
    return "no Ember implementation"


def find_unsupported(graph: onnx.GraphProto, opsets: dict[str, int]) -> dict[str, list[str]]:
    """Every unsupported operator (with its reason) -> the nodes using it, subgraphs included."""
    found: dict[str, list[str]] = {}
    for index, node in enumerate(graph.node):
        problem = support_problem(node.op_type, node.domain, opsets)
        if problem is not None:
            key = f"{node.domain + '.' if node.domain else ''}{node.op_type} ({problem})"
            found.setdefault(key, []).append(node.name or f"{node.op_type}_{index}")
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                for key, names in find_unsupported(sub, opsets).items():
                    found.setdefault(key, []).extend(names)
    return found


def convert_node(ctx: NodeContext) -> None:
    fn = CONVERTERS.get(ctx.op_type)
    if normal_domain(ctx.proto.domain) == onnx_contrib.DOMAIN:
        onnx_contrib.expand_contrib(ctx)
    elif normal_domain(ctx.proto.domain) == onnx_ml.DOMAIN and ctx.op_type in onnx_ml.EXPANSIONS:
        onnx_ml.expand_ml(ctx)
    elif fn is not None:
        fn(ctx)
    elif has_ember_entry(ctx.op_type, ctx.proto.domain):
        emit(ctx)
    else:
        expand_function(ctx)


# -- helpers ---------------------------------------------------------------------------------------
def _ints(x: np.ndarray | None) -> tuple[int, ...]:
    return () if x is None else tuple(int(v) for v in np.asarray(x).reshape(-1))


def _without(attrs: dict, *names: str) -> dict:
    return {k: v for k, v in attrs.items() if k not in names}


# -- constants -------------------------------------------------------------------------------------
@converter("Constant")
def _constant(ctx: NodeContext) -> None:
    (key, value), *_ = ctx.attrs.items() if ctx.attrs else [(None, None)]
    if key in ("value", "sparse_value"):
        data = value
    elif key == "value_float" or key == "value_floats":
        data = np.array(value, np.float32)
    elif key == "value_int" or key == "value_ints":
        data = np.array(value, np.int64)
    else:
        raise ctx.error(f"Constant with {key or 'no value'} is not supported (string constants are not)")
    name = ctx.out_names[0]
    ctx.importer.bind(name, ctx.importer.constant(name, np.array(data)))


# -- convolution and pooling -----------------------------------------------------------------------
def _auto_pads(auto_pad: str, in_sp, kernel, strides, dilations) -> tuple[int, ...] | None:
    """Explicit pads for SAME_UPPER / SAME_LOWER / VALID; None for NOTSET."""
    nd = len(in_sp)
    if auto_pad in ("NOTSET", ""):
        return None
    if auto_pad == "VALID":
        return (0,) * (2 * nd)
    begins, ends = [], []
    for i in range(nd):
        out = -(-in_sp[i] // strides[i])
        total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - in_sp[i])
        small, big = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else big)
        ends.append(big if auto_pad == "SAME_UPPER" else small)
    return tuple(begins + ends)


def _window_attrs(ctx: NodeContext, kernel: tuple[int, ...]) -> dict:
    nd = len(kernel)
    a = ctx.attrs
    strides = a.get("strides") or (1,) * nd
    dilations = a.get("dilations") or (1,) * nd
    pads = _auto_pads(a.get("auto_pad", "NOTSET"), ctx.type(0).shape[2:], kernel, strides, dilations)
    if pads is None:
        pads = a.get("pads") or (0,) * (2 * nd)
    return {"strides": strides, "pads": pads, "dilations": dilations}


@converter("Conv", "ConvInteger", "QLinearConv")
def _conv(ctx: NodeContext) -> None:
    weight = 3 if ctx.op_type == "QLinearConv" else 1
    kernel = ctx.attrs.get("kernel_shape") or ctx.type(weight).shape[2:]
    emit(ctx, attrs=dict(_window_attrs(ctx, kernel), group=ctx.attrs.get("group", 1)))


@converter("ConvTranspose")
def _conv_transpose(ctx: NodeContext) -> None:
    a = ctx.attrs
    w = ctx.type(1)
    kernel = a.get("kernel_shape") or w.shape[2:]
    nd = len(kernel)
    strides = a.get("strides") or (1,) * nd
    dil = a.get("dilations") or (1,) * nd
    opad = a.get("output_padding") or (0,) * nd
    in_sp = ctx.type(0).shape[2:]
    auto = a.get("auto_pad", "NOTSET")
    out_shape = a.get("output_shape")
    if out_shape and len(out_shape) > nd:
        out_shape = out_shape[-nd:]
    if not out_shape and auto in ("SAME_UPPER", "SAME_LOWER"):
        out_shape = tuple(in_sp[i] * strides[i] for i in range(nd))
    if out_shape:
        total = [strides[i] * (in_sp[i] - 1) + opad[i] + (kernel[i] - 1) * dil[i] + 1 - out_shape[i] for i in range(nd)]
        opad = tuple(o + max(-t, 0) for o, t in zip(opad, total))  # a larger output_shape adds end padding
        total = [max(t, 0) for t in total]
        if auto == "SAME_UPPER":
            pads = tuple(t // 2 for t in total) + tuple(t - t // 2 for t in total)
        else:
            pads = tuple(t - t // 2 for t in total) + tuple(t // 2 for t in total)
    elif auto == "VALID":
        pads = (0,) * (2 * nd)
    else:
        pads = a.get("pads") or (0,) * (2 * nd)
    attrs = {"strides": strides, "pads": pads, "dilations": dil, "group": a.get("group", 1), "output_padding": opad}
    emit(ctx, attrs=attrs)


@converter("MaxPool", "AveragePool", "LpPool")
def _pool(ctx: NodeContext) -> None:
    kernel = ctx.attrs["kernel_shape"]
    attrs = dict(_without(ctx.attrs, "auto_pad"), **_window_attrs(ctx, kernel))
    if ctx.attrs.get("auto_pad") in ("SAME_UPPER", "SAME_LOWER"):
        attrs["ceil_mode"] = 0
    emit(ctx, attrs=attrs)


# -- reductions --------------------------------------------------------------------------------------
_AXES_INPUT_SINCE = {"ReduceSum": 13}  # other Reduce* take axes as an input from opset 18


@converter("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")  # fmt: skip
def _reduce(ctx: NodeContext) -> None:
    a = ctx.attrs
    if ctx.version >= _AXES_INPUT_SINCE.get(ctx.op_type, 18):
        v = ctx.input(1)
        if v is not None and not v.is_constant and v.type.size and _reduce_runtime_axes(ctx, v):
            return
        axes = _ints(ctx.need(1, "axes")) if v is not None and v.type.size else ()
    else:
        axes = tuple(a.get("axes", ()))
    rank = ctx.type(0).rank
    if not axes:
        if a.get("noop_with_empty_axes", 0):
            emit(ctx, "Identity", ctx.inputs[:1], {})
            return
        axes = tuple(range(rank))
    emit(ctx, inputs=ctx.inputs[:1], attrs={"axes": norm_axes(axes, rank), "keepdims": a.get("keepdims", 1)})


def _reduce_runtime_axes(ctx: NodeContext, v: Value) -> bool:
    """A reduction over axes fed as an input: each dim d splits into (out, extent), (d, 1) where it is kept and
    (1, d) where it is reduced, `out` read from the axes at run time (extent = d + 1 - out); the Reshape to the
    interleaved dims is a view, a static reduction over the extents gives the keepdims result, a Reshape drops
    the reduced dims."""
    x = ctx.type(0)
    dims = x.shape
    if not dims or v.type.size > len(dims) or not all(is_static_dim(d) for d in dims):
        return False
    out = ctx.importer.value_sizes(v, "reduce_out", dims, len(dims), tag="o")
    if out is None:
        return False
    if 0 in dims:  # an empty input: every output is the reduction of nothing
        with np.errstate(all="ignore"):
            (empty,) = OPS[ctx.op_type].reference({"axes": (0,), "keepdims": 0}, np.zeros(0, x.np_dtype))
        keep = ctx.attrs.get("keepdims", 1)
        shape = out if keep else ctx.importer.value_sizes(v, "reduce_kept", dims, len(dims) - v.type.size, tag="k")
        emit(ctx, "ConstantOfShape", [], {"shape": shape, "value": np.asarray(empty).reshape(1)})
        return True
    extent = tuple(simplify_dim(d + 1 - o) for d, o in zip(dims, out))  # d where out is 1, 1 where out is d
    (split,) = ctx.emit("Reshape", ctx.inputs[:1], {"shape": tuple(d for pair in zip(out, extent) for d in pair)})
    axes = tuple(range(1, 2 * len(dims), 2))
    if ctx.attrs.get("keepdims", 1):
        emit(ctx, inputs=[split], attrs={"axes": axes, "keepdims": 0})
        return True
    (y,) = ctx.emit(ctx.op_type, [split], {"axes": axes, "keepdims": 0})
    kept = ctx.importer.value_sizes(v, "reduce_kept", dims, len(dims) - v.type.size, tag="k")
    emit(ctx, "Reshape", [y], {"shape": kept})
    return True


@converter("CumSum", "CumProd")
def _cumulative(ctx: NodeContext) -> None:
    dims, v = ctx.type(0).shape, ctx.input(1)
    if dims and all(is_static_dim(d) for d in dims) and not v.is_constant and v.type.size == 1:
        # an axis fed as an input: the input viewed as (before, along, after) the axis, sizes read at run time
        view = ctx.importer.value_sizes(v, "axis_view", dims, 3, tag="a", hi=max(1, math.prod(dims)))
        if view is not None:
            (x3,) = ctx.emit("Reshape", ctx.inputs[:1], {"shape": view})
            (y3,) = ctx.emit(ctx.op_type, [x3], dict(ctx.attrs, axis=1))
            emit(ctx, "Reshape", [y3], {"shape": dims})
            return
    axis = int(ctx.need(1, "axis").reshape(()))
    emit(ctx, inputs=ctx.inputs[:1], attrs=dict(ctx.attrs, axis=axis))


@converter("TopK")
def _topk(ctx: NodeContext) -> None:
    if ctx.version < 10:
        k = ctx.attrs["k"]
    else:  # k fed as an input: a size read at run time, at most the axis length
        x, v = ctx.type(0), ctx.input(1)
        n = x.shape[norm_axes((ctx.attrs.get("axis", -1),), x.rank)[0]]
        k = None if v.is_constant or not is_static_dim(n) else ctx.importer.value_sizes(v, hi=n)
        k = k[0] if k else int(ctx.need(1, "k").reshape(-1)[0])
    emit(ctx, inputs=ctx.inputs[:1], attrs=dict(_without(ctx.attrs, "k"), k=k))


@converter("Softmax", "LogSoftmax", "Hardmax")
def _softmax(ctx: NodeContext) -> None:
    if ctx.version >= 13:
        emit(ctx)
        return
    # before opset 13: flatten to 2-d at `axis` (default 1), normalize rows, restore the shape
    x = ctx.type(0)
    axis = norm_axes((ctx.attrs.get("axis", 1),), x.rank)[0]
    (flat,) = ctx.emit("Flatten", ctx.inputs[:1], {"axis": axis})
    (y,) = ctx.emit(ctx.op_type, [flat], {"axis": -1})
    emit(ctx, "Reshape", [y], {"shape": x.shape})


# -- shape manipulation --------------------------------------------------------------------------------
@converter("Reshape")
def _reshape(ctx: NodeContext) -> None:
    if ctx.version < 5:
        shape = ctx.attrs["shape"]
    else:
        v, allowzero = ctx.input(1), bool(ctx.attrs.get("allowzero", 0))
        known = v is None or v.is_constant or ctx.importer.symbolic_dims(v) is not None
        # a target fed as an input: its entries are sizes read at run time, 0 and -1 resolved there
        rule = "reshape_allowzero" if allowzero else "reshape"
        runtime = None if known else ctx.importer.value_sizes(v, rule, ctx.type(0).shape, tag="r")
        shape = runtime if runtime is not None else ctx.need_dims(1, "target shape")
    try:
        target = resolve_reshape(ctx.type(0).shape, shape, bool(ctx.attrs.get("allowzero", 0)))
    except ValueError as e:
        raise ctx.error(str(e)) from None
    emit(ctx, inputs=ctx.inputs[:1], attrs={"shape": target})


@converter("Transpose")
def _transpose(ctx: NodeContext) -> None:
    perm = ctx.attrs.get("perm") or tuple(reversed(range(ctx.type(0).rank)))
    emit(ctx, attrs={"perm": perm})


def _reshape_by_axes(ctx: NodeContext, rule: str, rank: int) -> bool:
    """Squeeze/Unsqueeze with the axes fed as an input (opset 13): a Reshape to `rank` dims read at run time."""
    v, dims = ctx.input(1), ctx.type(0).shape
    if ctx.version < 13 or v is None or v.is_constant or not v.type.size or not all(is_static_dim(d) for d in dims):
        return False
    shape = ctx.importer.value_sizes(v, rule, dims, rank, tag="s" if rule == "squeeze" else "u")
    if shape is None:
        return False
    emit(ctx, "Reshape", ctx.inputs[:1], {"shape": shape})
    return True


@converter("Squeeze")
def _squeeze(ctx: NodeContext) -> None:
    x = ctx.type(0)
    if _reshape_by_axes(ctx, "squeeze", x.rank - (ctx.input(1).type.size if ctx.input(1) is not None else 0)):
        return
    if ctx.version >= 13:
        axes = _ints(ctx.need(1, "axes")) if ctx.input(1) is not None else None
    else:
        axes = ctx.attrs.get("axes")
    if axes is None:
        axes = tuple(i for i, d in enumerate(x.shape) if d == 1)
    emit(ctx, inputs=ctx.inputs[:1], attrs={"axes": norm_axes(axes, x.rank)})


@converter("Unsqueeze")
def _unsqueeze(ctx: NodeContext) -> None:
    if _reshape_by_axes(ctx, "unsqueeze", ctx.type(0).rank + (ctx.input(1).type.size if ctx.input(1) else 0)):
        return
    axes = _ints(ctx.need(1, "axes")) if ctx.version >= 13 else ctx.attrs["axes"]
    emit(ctx, inputs=ctx.inputs[:1], attrs={"axes": tuple(axes)})


@converter("Split")
def _split(ctx: NodeContext) -> None:
    x = ctx.type(0)
    axis = norm_axes((ctx.attrs.get("axis", 0),), x.rank)[0]
    if ctx.version >= 13:
        v, n = ctx.input(1), x.shape[axis]
        runtime = None if v is None or v.is_constant else ctx.importer.value_sizes(v, "split", (n,), tag="p", hi=n)
        if runtime is not None:  # sizes fed as an input: read at run time, by the kernel for the offsets
            emit(ctx, inputs=[ctx.input(0), v], attrs={"axis": axis, "split": runtime})
            return
        split = _ints(ctx.need(1, "split sizes")) if v is not None else None
    else:
        split = ctx.attrs.get("split")
    if not split:
        parts = ctx.attrs.get("num_outputs") or len(ctx.proto.output)
        split = split_sizes(x.shape[axis], parts)
    emit(ctx, inputs=ctx.inputs[:1], attrs={"axis": axis, "split": tuple(split)})


@converter("Slice")
def _slice(ctx: NodeContext) -> None:
    if ctx.version < 10:
        a = ctx.attrs
        attrs = {"starts": a["starts"], "ends": a["ends"], "axes": a.get("axes", ())}
    elif _runtime_slice(ctx):
        return
    else:
        attrs = {
            "starts": _ints(ctx.need(1, "starts")),
            "ends": ctx.need_dims(2, "ends"),
            "axes": _ints(ctx.need(3, "axes")) if ctx.input(3) is not None else (),
            "steps": _ints(ctx.need(4, "steps")) if ctx.input(4) is not None else (),
        }
    emit(ctx, inputs=ctx.inputs[:1], attrs=attrs)


def _runtime_slice(ctx: NodeContext) -> bool:
    """Slice with starts, ends, axes or steps fed as inputs: the kernel reads them, the output lengths are sizes
    the run time reads from them (rule 'slice'); absent axes and steps become constants."""
    x, operands = ctx.type(0), [ctx.input(i) for i in range(1, 5)]
    fed = [v for v in operands if v is not None and not v.is_constant]
    static = [v is None or v.is_constant for v in operands]
    if not fed or static[0] and all(static[2:]) and ctx.importer.dims_of(operands[1]) is not None:
        return False  # only the end is computed from symbolic shapes: the static rule follows it
    hi = max(x.shape) if all(is_static_dim(d) for d in x.shape) and x.shape else None
    lengths = ctx.importer.value_sizes(fed[0], "slice", x.shape, x.rank, tag="sl", hi=hi, operands=operands)
    if lengths is None:
        return False
    n = operands[0].type.size
    if operands[2] is None:
        operands[2] = ctx.importer.constant(f"{ctx.name}/axes", np.arange(n, dtype=np.int64))
    if operands[3] is None:
        operands[3] = ctx.importer.constant(f"{ctx.name}/steps", np.ones(n, np.int64))
    emit(ctx, inputs=[ctx.input(0), *operands], attrs={"lengths": lengths})
    return True


@converter("Expand")
def _expand(ctx: NodeContext) -> None:
    x, shape = ctx.type(0), ctx.need_dims(1, "shape", runtime=True)
    # a size read at run time broadcasts against a static dim > 1 of the input: that dim (ONNX's broadcasting)
    lead = len(shape) - x.rank
    shape = tuple(x.shape[k - lead] if k >= lead and reads_values((d,)) and is_static_dim(x.shape[k - lead])
                  and x.shape[k - lead] != 1 else d for k, d in enumerate(shape))  # fmt: skip
    emit(ctx, inputs=ctx.inputs[:1], attrs={"shape": shape})


@converter("Tile")
def _tile(ctx: NodeContext) -> None:
    if ctx.type(1).rank != 1:  # (as onnxruntime: torch.onnx's legacy export of Mamba writes (1, 1) repeats)
        raise ctx.error(f"repeats must be a 1-D tensor, got shape {list(ctx.type(1).shape)}")
    emit(ctx, inputs=ctx.inputs[:1], attrs={"repeats": ctx.need_dims(1, "repeats", runtime=True)})


@converter("ConstantOfShape")
def _constant_of_shape(ctx: NodeContext) -> None:
    value = ctx.attrs.get("value", np.zeros(1, np.float32))
    emit(ctx, inputs=[], attrs={"shape": ctx.need_dims(0, "shape", runtime=True), "value": value})


@converter("OneHot")
def _one_hot(ctx: NodeContext) -> None:
    v = ctx.input(1)
    depth = None if v.is_constant else ctx.importer.value_sizes(v)  # fed as an input: a size read at run time
    depth = depth[0] if depth else int(np.asarray(ctx.need(1, "depth")).reshape(-1)[0])
    emit(ctx, inputs=[ctx.input(0), ctx.input(2)], attrs={"depth": depth, "axis": ctx.attrs.get("axis", -1)})


@converter("NonZero")
def _non_zero(ctx: NodeContext) -> None:
    v = ctx.input(0)
    # an input's non-zero count is computed by the run time from its values before the kernels run
    count = None if v.is_constant else ctx.importer.value_sizes(v, "nonzero", count=1, tag="nz", hi=v.type.size)
    emit(ctx, attrs={"count": count[0]} if count else {})


@converter("Trilu")
def _trilu(ctx: NodeContext) -> None:
    v = ctx.input(1)
    if v is not None and not v.is_constant:  # k fed as an input: the kernel reads it
        emit(ctx, inputs=ctx.inputs[:2], attrs={"upper": ctx.attrs.get("upper", 1)})
        return
    k = int(ctx.need(1, "k").reshape(())) if v is not None else 0
    emit(ctx, inputs=ctx.inputs[:1], attrs={"upper": ctx.attrs.get("upper", 1), "k": k})


@converter("Range")
def _range(ctx: NodeContext) -> None:
    operands = ctx.inputs[:3]
    fed = [v for v in operands if not v.is_constant]
    dims = [ctx.importer.symbolic_dims(v) if fed and v.type.dtype.startswith("int") else None for v in operands]
    if fed and all(d is not None and len(d) == 1 for d in dims) and is_static_dim(dims[2][0]):
        # bounds computed from symbolic shapes and a constant delta (Range(0, S, 1) of a causal mask,
        # Range(P, P + S, 1) of positions after a cache): the length is a dim
        try:
            length = range_length(dims[0][0], dims[1][0], int(dims[2][0]))
        except DimError as e:
            raise ctx.error(str(e)) from None
        emit(ctx, attrs={"length": length})
        return
    # start, limit or delta fed as an input: the length is a size the run time reads from them
    length = ctx.importer.value_sizes(fed[0], "range", count=1, tag="rg", operands=operands) if fed else None
    emit(ctx, attrs={"length": length[0]} if length else {})


@converter("CenterCropPad")
def _center_crop_pad(ctx: NodeContext) -> None:
    if not ctx.input(1).is_constant:  # the shape fed at run time: its function body (a Pad and a Slice read it)
        expand_function(ctx)
        return
    emit(ctx, inputs=ctx.inputs[:1], attrs={"shape": _ints(ctx.need(1, "shape")), "axes": ctx.attrs.get("axes", ())})


@converter("Pad")
def _pad(ctx: NodeContext) -> None:
    x = ctx.type(0)
    a = ctx.attrs
    if ctx.version < 11:
        pads, value_input, value = a["pads"], None, a.get("value", 0.0)
    else:
        value_input = ctx.input(2)
        if _runtime_pad(ctx, value_input):
            return
        pads = _ints(ctx.need(1, "pads"))
        value = 0.0
        axes = _ints(ctx.need(3, "axes")) if ctx.input(3) is not None else None
        if axes is not None:
            axes = norm_axes(axes, x.rank)
            full = [0] * (2 * x.rank)
            for i, ax in enumerate(axes):
                full[ax], full[ax + x.rank] = pads[i], pads[i + len(axes)]
            pads = tuple(full)
    if value_input is not None and value_input.is_constant:
        value = float(value_input.data.reshape(-1)[0]) if value_input.data.size else 0.0
        if np.issubdtype(value_input.data.dtype, np.integer) and abs(value) > 2**52:
            raise ctx.error("integer pad values beyond 2**52 are not supported")
        value_input = None
    inputs = [ctx.input(0)] + ([value_input] if value_input is not None else [])
    emit(ctx, inputs=inputs, attrs={"pads": tuple(pads), "mode": a.get("mode", "constant"), "value": value})


def _runtime_pad(ctx: NodeContext, value: Value | None) -> bool:
    """Pad with the pads (or axes) fed as an input: the kernel reads them, the padded dims are sizes the run time
    reads from them (rule 'pad')."""
    x, pads, axes = ctx.type(0), ctx.input(1), ctx.input(3)
    fed = [v for v in (pads, axes) if v is not None and not v.is_constant]
    if not fed or not all(is_static_dim(d) for d in x.shape):
        return False
    lengths = ctx.importer.value_sizes(fed[0], "pad", x.shape, x.rank, tag="pd", operands=[pads, axes])
    if lengths is None:
        return False
    emit(ctx, inputs=[ctx.input(0), value, pads, axes], attrs={"mode": ctx.attrs.get("mode", "constant"),
                                                              "lengths": lengths})  # fmt: skip
    return True


# -- elementwise ---------------------------------------------------------------------------------------
@converter("Clip")
def _clip(ctx: NodeContext) -> None:
    if ctx.version < 11:
        emit(ctx, attrs={"min": ctx.attrs.get("min"), "max": ctx.attrs.get("max")})
        return
    attrs: dict = {}
    inputs: list = [ctx.input(0), None, None]
    for i, key in ((1, "min"), (2, "max")):
        v = ctx.input(i)
        if v is None:
            continue
        if v.is_constant:
            attrs[key] = float(v.data.reshape(-1)[0])
            if np.issubdtype(v.data.dtype, np.integer) and abs(int(v.data.reshape(-1)[0])) > 2**52:
                inputs[i] = v  # beyond float64 precision: keep the exact integer as an input
                attrs.pop(key)
        else:
            inputs[i] = v
    while inputs[-1] is None:
        inputs.pop()
    emit(ctx, inputs=inputs, attrs=attrs)


def _dtype_attr(ctx: NodeContext, key: str) -> dict:
    """ctx.attrs with the ONNX element type in `key` replaced by an Ember dtype name."""
    if key not in ctx.attrs or ctx.attrs[key] is None:
        return dict(ctx.attrs)
    return dict(ctx.attrs, **{key: onnx_dtype(ctx.attrs[key], f"{ctx.importer.source}: node {ctx.name!r} {key}")})


@converter("Cast")
def _cast(ctx: NodeContext) -> None:
    emit(ctx, attrs=_dtype_attr(ctx, "to"))


@converter("QuantizeLinear", "DequantizeLinear")
def _quantize(ctx: NodeContext) -> None:
    attrs = dict(ctx.attrs)
    if not attrs.get("output_dtype"):
        attrs.pop("output_dtype", None)
    ctx.attrs = attrs
    emit(ctx, attrs=_dtype_attr(ctx, "output_dtype"))


@converter("BitCast")
def _bitcast(ctx: NodeContext) -> None:
    emit(ctx, attrs=_dtype_attr(ctx, "to"))


@converter("EyeLike")
def _eye_like(ctx: NodeContext) -> None:
    emit(ctx, attrs=_dtype_attr(ctx, "dtype"))


@converter("CastLike")
def _cast_like(ctx: NodeContext) -> None:
    attrs = {"to": ctx.type(1).dtype, **_without(ctx.attrs, "to")}
    emit(ctx, "Cast", ctx.inputs[:1], attrs)


@converter("Dropout")
def _dropout(ctx: NodeContext) -> None:
    if ctx.input(2) is not None and bool(ctx.need(2, "training_mode").reshape(())):
        ratio = float(ctx.need(1, "ratio").reshape(())) if ctx.input(1) is not None else 0.5
        if ratio != 0.0:
            raise ctx.error("Dropout in training mode is random; Ember supports inference (training_mode=false)")
    emit(ctx, inputs=ctx.inputs[:1], attrs={})


@converter("BatchNormalization")
def _batch_norm(ctx: NodeContext) -> None:
    attrs = {k: v for k, v in ctx.attrs.items() if k in ("epsilon", "momentum", "training_mode")}
    if ctx.version < 14 and len(ctx.proto.output) > 1:
        raise ctx.error("BatchNormalization before opset 14 with training outputs is not supported")
    emit(ctx, attrs=attrs)


@converter("GroupNormalization")
def _group_norm(ctx: NodeContext) -> None:
    if ctx.version >= 21:
        emit(ctx)
        return
    # opset 18: scale and bias are per group; repeat them per channel
    channels = ctx.type(0).shape[1]
    groups = ctx.attrs["num_groups"]
    per_channel = []
    for i in (1, 2):
        (rep,) = ctx.emit("Reshape", [ctx.input(i)], {"shape": (groups, 1)})
        (exp,) = ctx.emit("Expand", [rep], {"shape": (groups, channels // groups)})
        per_channel += ctx.emit("Reshape", [exp], {"shape": (channels,)})
    emit(ctx, inputs=[ctx.input(0)] + per_channel, attrs=ctx.attrs)


@converter("Compress")
def _compress(ctx: NodeContext) -> None:
    """Compress is a Gather of the selected positions: a constant condition's, or those NonZero finds in a
    condition fed as an input (their number read by the run time, rule 'compress')."""
    cond = ctx.const(1)
    axis = ctx.attrs.get("axis")
    data = ctx.input(0)
    if cond is None:
        v, x = ctx.input(1), ctx.type(0)
        n = dim_product(x.shape) if axis is None else x.shape[norm_axes((axis,), x.rank)[0]]
        count = ctx.importer.value_sizes(v, "compress", (n,), 1, tag="cp", hi=n if is_static_dim(n) else None)
        if count is None or v.type.rank != 1:
            emit(ctx)
            return
        (at,) = ctx.emit("NonZero", [v], {"count": count[0]})
        (index,) = ctx.emit("Reshape", [at], {"shape": count})
    if axis is None:
        (data,) = ctx.emit("Reshape", [data], {"shape": (dim_product(ctx.type(0).shape),)})
        axis = 0
    if cond is None:
        emit(ctx, "Gather", [data, index], {"axis": axis})
        return
    picked = np.flatnonzero(cond.reshape(-1).astype(bool)).astype(np.int64)
    index = ctx.importer.constant(f"{ctx.name}/indices", picked)
    emit(ctx, "Gather", [data, index], {"axis": axis})


@converter("Unique")
def _unique(ctx: NodeContext) -> None:
    v, x = ctx.input(0), ctx.type(0)
    axis = ctx.attrs.get("axis")
    if axis is not None and not v.is_constant and x.is_static and x.rank:
        # along an axis, of an input: the run time counts the distinct slices of the (before, length, after) view
        a = norm_axes((axis,), x.rank)[0]
        view = (math.prod(x.shape[:a]), x.shape[a], math.prod(x.shape[a + 1 :]))
        count = ctx.importer.value_sizes(v, "unique_slices", view, count=1, tag="uq", hi=x.shape[a])
        if count:
            (x3,) = ctx.emit("Reshape", [v], {"shape": view})
            names = ctx.out_names + [f"{ctx.name}:unused{i}" for i in range(len(ctx.out_names), 4)]
            attrs = {"sorted": ctx.attrs.get("sorted", 1), "axis": 1, "count": count[0]}
            y3, *_ = ctx.importer.add_node("Unique", [x3], attrs, [ctx.importer.unique(f"{ctx.name}/values")]
                                           + names[1:4], ctx.name)  # fmt: skip
            shape = x.shape[:a] + (count[0],) + x.shape[a + 1 :]
            ctx.importer.add_node("Reshape", [y3], {"shape": shape}, names[:1], f"{ctx.name}/Reshape")
            return
    # without an axis, of an input: the run time counts the distinct values before the kernels run
    count = None if v.is_constant or axis is not None or not x.is_static else \
        ctx.importer.value_sizes(v, "unique", count=1, tag="uq", hi=x.size)  # fmt: skip
    if not count:
        emit(ctx)
        return
    (flat,) = ctx.emit("Reshape", [v], {"shape": (x.size,)}) if x.rank != 1 else (v,)
    emit(ctx, inputs=[flat], attrs={"sorted": ctx.attrs.get("sorted", 1), "count": count[0]})


@converter("Scatter")
def _scatter(ctx: NodeContext) -> None:
    emit(ctx, "ScatterElements")


# -- Resize / Upsample ----------------------------------------------------------------------------------
@converter("Resize")
def _resize(ctx: NodeContext) -> None:
    from ember.ops.resize import resize_output

    a = dict(ctx.attrs)
    x = ctx.type(0)
    rank = x.rank
    axes = norm_axes(a.pop("axes", None) or tuple(range(rank)), rank)
    crop = a.get("coordinate_transformation_mode") == "tf_crop_and_resize"
    if _runtime_resize(ctx, a, axes, crop):
        return
    roi = ctx.need(1, "roi") if crop and ctx.input(1) is not None else None
    scales = ctx.need(2, "scales") if ctx.input(2) is not None and ctx.type(2).size else None
    sizes = ctx.need(3, "sizes") if ctx.input(3) is not None else None
    full_roi = [0.0] * rank + [1.0] * rank
    if roi is not None and roi.size:
        roi = [float(v) for v in roi.reshape(-1)]
        for i, ax in enumerate(axes):
            full_roi[ax], full_roi[ax + rank] = roi[i], roi[i + len(axes)]
    try:
        out_sizes, out_scales = resize_output(
            x.shape, axes, None if scales is None else [float(s) for s in scales.reshape(-1)],
            None if sizes is None else _ints(sizes), a.pop("keep_aspect_ratio_policy", "stretch"),
            tuple(full_roi) if crop else None,
        )  # fmt: skip
    except ValueError as e:
        raise ctx.error(str(e)) from None
    attrs = dict(a, sizes=out_sizes, scales=out_scales, roi=tuple(full_roi))
    emit(ctx, "Resize", ctx.inputs[:1], attrs)


def _runtime_resize(ctx: NodeContext, attrs: dict, axes: tuple[int, ...], crop: bool) -> bool:
    """Resize with its scales or sizes (or roi) fed as inputs: the kernel reads them, the output dims are sizes the
    run time reads from them (rule 'resize')."""
    x = ctx.type(0)
    roi, scales, sizes = (ctx.input(i) for i in (1, 2, 3))
    if scales is not None and not scales.type.size:
        scales = None  # (an empty scales input: the sizes are given)
    roi = roi if crop else None
    fed = [v for v in (roi, scales, sizes) if v is not None and not v.is_constant]
    if not fed or not all(is_static_dim(d) for d in x.shape) or (scales is None) == (sizes is None):
        return False
    imp = ctx.importer
    policy = attrs.pop("keep_aspect_ratio_policy", "stretch")
    rule = [scales, sizes, roi, imp.constant(f"{ctx.name}/axes", np.array(axes, np.int64)),
            imp.constant(f"{ctx.name}/policy", np.array([("stretch", "not_larger", "not_smaller").index(policy)]))]
    lengths = imp.value_sizes(fed[0], "resize", x.shape, rank := x.rank, tag="rs", operands=rule)
    if lengths is None:
        return False
    attrs = dict(attrs, sizes=lengths, axes=axes, keep_aspect_ratio_policy=policy)
    if not crop:
        attrs["roi"] = ()
    elif roi is None:
        attrs["roi"] = (0.0,) * rank + (1.0,) * rank
    emit(ctx, "Resize", [ctx.input(0), roi, scales, sizes], attrs)
    return True


@converter("Upsample")
def _upsample(ctx: NodeContext) -> None:
    x = ctx.type(0)
    if ctx.version >= 9 and not ctx.input(1).is_constant:  # scales fed as an input: a Resize reads them
        attrs = {"mode": ctx.attrs.get("mode", "nearest"), "coordinate_transformation_mode": "asymmetric",
                 "nearest_mode": "floor"}  # fmt: skip
        ctx.inputs = [ctx.input(0), None, ctx.input(1)]
        if _runtime_resize(ctx, attrs, tuple(range(x.rank)), False):
            return
    scales = [float(s) for s in (ctx.attrs["scales"] if ctx.version < 9 else ctx.need(1, "scales").reshape(-1))]
    sizes = tuple(int(np.floor(d * s)) for d, s in zip(x.shape, scales))
    mode = ctx.attrs.get("mode", "nearest")
    attrs = {"sizes": sizes, "scales": tuple(scales), "mode": mode, "coordinate_transformation_mode": "asymmetric",
             "nearest_mode": "floor"}  # fmt: skip
    emit(ctx, "Resize", ctx.inputs[:1], attrs)


# -- signal ---------------------------------------------------------------------------------------------
def _scalar_input(ctx: NodeContext, i: int, what: str) -> int | None:
    return int(ctx.need(i, what).reshape(-1)[0]) if ctx.input(i) is not None else None


@converter("DFT")
def _dft(ctx: NodeContext) -> None:
    attrs = {"inverse": ctx.attrs.get("inverse", 0), "onesided": ctx.attrs.get("onesided", 0),
             "dft_length": _scalar_input(ctx, 1, "dft_length")}  # fmt: skip
    v, x = ctx.input(2), ctx.type(0)
    if ctx.version >= 20 and v is not None and not v.is_constant and x.is_static and attrs["dft_length"] is None:
        # an axis fed as an input: the signal viewed as (before, along, after) the axis, sizes read at run time
        dims = x.shape[:-1]
        view = ctx.importer.value_sizes(v, "dft_view", dims, 3, tag="a", hi=max(1, math.prod(dims)))
        if view is not None:
            (x4,) = ctx.emit("Reshape", [ctx.input(0)], {"shape": view + x.shape[-1:]})
            (y4,) = ctx.emit("DFT", [x4], dict(attrs, axis=1))
            out = dims
            if attrs["onesided"]:  # the axis's length changes: each output dim read at run time
                rule = "dft_irfft" if attrs["inverse"] else "dft_rfft"
                out = ctx.importer.value_sizes(v, rule, dims, len(dims), tag="o", hi=2 * max(dims, default=1))
            last = 1 if attrs["inverse"] and attrs["onesided"] else 2
            emit(ctx, "Reshape", [y4], {"shape": tuple(out) + (last,)})
            return
    if ctx.version >= 20:
        axis = _scalar_input(ctx, 2, "axis")
        attrs["axis"] = -2 if axis is None else axis
    else:
        attrs["axis"] = ctx.attrs.get("axis", 1)
    emit(ctx, inputs=ctx.inputs[:1], attrs=attrs)


@converter("STFT")
def _stft(ctx: NodeContext) -> None:
    window = ctx.input(2)
    length = _scalar_input(ctx, 3, "frame_length")
    if length is None:
        length = window.shape[0] if window is not None else ctx.type(0).shape[1]
    attrs = {"frame_step": _scalar_input(ctx, 1, "frame_step"), "frame_length": length,
             "onesided": ctx.attrs.get("onesided", 1)}  # fmt: skip
    emit(ctx, inputs=[ctx.input(0)] + ([window] if window is not None else []), attrs=attrs)


@converter("MelWeightMatrix")
def _mel(ctx: NodeContext) -> None:
    emit(ctx, attrs=_dtype_attr(ctx, "output_datatype"))


# -- vision ---------------------------------------------------------------------------------------------
@converter("DeformConv")
def _deform_conv(ctx: NodeContext) -> None:
    kernel = ctx.attrs.get("kernel_shape") or ctx.type(1).shape[2:]
    attrs = dict(_window_attrs(ctx, kernel), group=ctx.attrs.get("group", 1),
                 offset_group=ctx.attrs.get("offset_group", 1))  # fmt: skip
    emit(ctx, attrs=attrs)


@converter("Col2Im")
def _col2im(ctx: NodeContext) -> None:
    shapes = {"image_shape": _ints(ctx.need(1, "image_shape")), "block_shape": _ints(ctx.need(2, "block_shape"))}
    attrs = dict(ctx.attrs, **shapes)
    emit(ctx, inputs=ctx.inputs[:1], attrs=attrs)


@converter("MaxUnpool")
def _max_unpool(ctx: NodeContext) -> None:
    x = ctx.type(0)
    kernel = ctx.attrs["kernel_shape"]
    nd = len(kernel)
    strides = ctx.attrs.get("strides") or (1,) * nd
    pads = ctx.attrs.get("pads") or (0,) * (2 * nd)
    default = x.shape[:2] + tuple(
        (x.shape[2 + i] - 1) * strides[i] + kernel[i] - pads[i] - pads[i + nd] for i in range(nd))  # fmt: skip
    shape = _ints(ctx.need(2, "output_shape")) if ctx.input(2) is not None else default
    emit(ctx, inputs=ctx.inputs[:2], attrs={"unpooled_shape": default, "output_shape": shape})


@converter("RoiAlign")
def _roi_align(ctx: NodeContext) -> None:
    attrs = dict(ctx.attrs)
    if ctx.version < 16:
        attrs["coordinate_transformation_mode"] = "output_half_pixel"  # opset 10 had no half-pixel shift
    emit(ctx, attrs=attrs)


# -- control flow --------------------------------------------------------------------------------------
def _subgraph(ctx: NodeContext, key: str, input_types: list[TensorType]) -> Graph:
    return ctx.importer.import_graph(ctx.attrs[key], {}, sub_inputs=input_types)


@converter("If")
def _if(ctx: NodeContext) -> None:
    cond = ctx.const(0)
    if cond is not None:  # a constant condition: inline the branch taken
        branch = ctx.attrs["then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"]
        outs = ctx.importer.inline_graph(branch)
        for name, v in zip(ctx.out_names, outs):
            ctx.importer.add_node("Identity", [v], {}, [name], ctx.name)
        return
    attrs = {"then_branch": _subgraph(ctx, "then_branch", []), "else_branch": _subgraph(ctx, "else_branch", [])}
    emit(ctx, inputs=[ctx.input(0), *captures_of(attrs)], attrs=attrs)


MAX_UNROLL = 10_000  # iterations an import-time unrolled Loop may run


@converter("Loop")
def _loop(ctx: NodeContext) -> None:
    """A Loop node when its body has static types; else, with a constant trip count and
    condition, the loop is unrolled at import (each iteration's body inlined)."""
    carried = ctx.inputs[2:]
    if any(v is None for v in carried):
        raise ctx.error("Loop with absent loop-carried inputs is not supported")
    types = [TensorType((), "int64"), TensorType((), "bool")] + [v.type for v in carried]
    try:
        attrs = {"body": _subgraph(ctx, "body", types)}
        attrs["trip_count"] = _static_trip_count(ctx, attrs["body"])
        emit(ctx, inputs=[ctx.input(0), ctx.input(1), *carried, *captures_of(attrs)], attrs=attrs)
    except DynamicShapeError:
        controls = [v for v in ctx.inputs[:2] if v is not None]
        if not all(v.is_constant for v in controls):
            imp = ctx.importer
            raise imp._dynamic(f"node {ctx.name!r} (Loop)", "its body needs static shapes or a constant trip count",
                               [*controls, *carried]) from None  # fmt: skip
        _unroll_loop(ctx, carried)


def _static_trip_count(ctx: NodeContext, body: Graph) -> int | None:
    """The iteration count when it is known: a constant trip count, and a condition that
    starts true and that the body passes through unchanged (or sets to constant true)."""
    trips, cond = ctx.const(0), ctx.const(1)
    if trips is None or (ctx.input(1) is not None and (cond is None or not bool(cond.reshape(())))):
        return None
    out = body.outputs[0]
    producer = body.producers().get(out)
    if producer is not None and producer.op == "Identity":
        out = producer.inputs[0]
    if out is body.inputs[1] or (out.is_constant and bool(out.data.reshape(()))):
        return int(trips.reshape(()))
    return None


def _unroll_loop(ctx: NodeContext, carried: list) -> None:
    imp = ctx.importer
    trips = ctx.const(0)
    limit = int(trips.reshape(())) if trips is not None else MAX_UNROLL
    keep = bool(ctx.const(1).reshape(())) if ctx.input(1) is not None else True
    values, scans, i = list(carried), [], 0
    while keep and i < limit:
        it = imp.constant(f"{ctx.name}/iter", np.array(i, np.int64))
        cond = imp.constant(f"{ctx.name}/cond", np.array(keep))
        outs = imp.inline_graph(ctx.attrs["body"], [it, cond, *values])
        if not outs[0].is_constant:
            raise ctx.error("cannot unroll: the loop condition depends on non-constant values")
        keep, values = bool(outs[0].data.reshape(())), outs[1 : 1 + len(carried)]
        scans.append(outs[1 + len(carried) :])
        i += 1
    if i >= MAX_UNROLL:
        raise ctx.error(f"the loop ran past {MAX_UNROLL} iterations while unrolling")
    names = ctx.out_names
    for name, v in zip(names, values):
        imp.add_node("Identity", [v], {}, [name], ctx.name)
    for j, name in enumerate(names[len(carried) :]):
        parts = [ctx.emit("Unsqueeze", [s[j]], {"axes": (0,)})[0] for s in scans]
        if not parts:
            raise ctx.error("a Loop that runs zero times with scan outputs is not supported")
        imp.add_node("Concat", parts, {"axis": 0}, [name], ctx.name)


@converter("Scan")
def _scan(ctx: NodeContext) -> None:
    if ctx.version < 9:
        _scan8(ctx)
        return
    a = dict(ctx.attrs)
    m = a["num_scan_inputs"]
    n = len(ctx.inputs) - m
    axes = a.get("scan_input_axes") or (0,) * m
    types = [v.type for v in ctx.inputs[:n]]
    for v, ax in zip(ctx.inputs[n:], axes):
        ax = norm_axes((ax,), v.type.rank)[0]
        types.append(v.type.with_shape(v.type.shape[:ax] + v.type.shape[ax + 1 :]))
    a["body"] = _subgraph(ctx, "body", types)
    emit(ctx, inputs=[*ctx.inputs, *captures_of(a)], attrs=a)


def _scan8(ctx: NodeContext) -> None:
    """Scan before opset 9: (sequence_lens, states..., scan inputs...), each with a leading batch axis (scan inputs
    [B, T, ...]). One Scan of today's form per batch item, on its slices; the results stacked back on the batch
    axis. sequence_lens must be absent or all T (variable lengths would need masking)."""
    a = dict(ctx.attrs)
    m = a["num_scan_inputs"]
    values = [ctx.input(i) for i in range(1, len(ctx.proto.input))]
    n = len(values) - m
    if any(v is None for v in values) or not values:
        raise ctx.error("Scan-8 needs its state and scan inputs")
    batch, steps = (values[n].shape[0], values[n].shape[1]) if m else (values[0].shape[0], None)
    lens = ctx.const(0)
    if ctx.input(0) is not None and (lens is None or not np.all(lens == steps)):
        raise ctx.error("Scan-8 with sequence_lens other than the full length is not supported")
    if not is_static_dim(batch):
        raise ctx.error("Scan-8 with a symbolic batch is not supported")
    attrs = {"num_scan_inputs": m, "scan_input_directions": tuple(a.get("directions") or (0,) * m)}
    per_item: list[list[Value]] = []
    for b in range(batch):
        index = ctx.importer.constant(ctx.importer.unique(f"{ctx.name}/b{b}"), np.array(b, np.int64))
        items = [ctx.emit("Gather", [v, index], {"axis": 0})[0] for v in values]
        item_attrs = {**attrs, "body": _subgraph(ctx, "body", [v.type for v in items[:n]] +
                                                 [v.type.with_shape(v.shape[1:]) for v in items[n:]])}  # fmt: skip
        outs = ctx.emit("Scan", [*items, *captures_of(item_attrs)], item_attrs, n_out=len(ctx.out_names))
        per_item.append([ctx.emit("Unsqueeze", [o], {"axes": (0,)})[0] for o in outs])
    for j, name in enumerate(ctx.out_names):
        parts = [outs[j] for outs in per_item]
        ctx.importer.add_node("Concat" if len(parts) > 1 else "Identity", parts, {"axis": 0} if len(parts) > 1 else {},
                              [name], ctx.name)  # fmt: skip


# -- sequences of tensors known at import time ---------------------------------------------------------------
# Exporters write torch.split / chunk / unbind as SplitToSequence read back by SequenceAt at constant positions
# (torch.onnx's legacy exporter on Mamba, for one). Such a sequence is a Python list of Values while importing:
# its length and positions must be constants, and it cannot cross a graph's inputs or outputs or a Loop.
class StaticSequence(list):
    """A sequence value of the ONNX graph, resolved at import time into its tensors."""

    __hash__ = object.__hash__  # (the importer looks values up in dicts)


def _sequence(ctx: NodeContext, i: int) -> StaticSequence:
    v = ctx.input(i)
    if not isinstance(v, StaticSequence):
        raise ctx.error(f"input {i} is not a sequence known at import time (Ember graphs carry tensors only)")
    return v


def _position(ctx: NodeContext, i: int, length: int, insert: bool = False) -> int:
    p = int(ctx.need(i, "the sequence position").reshape(-1)[0])
    p = p + length if p < 0 else p
    if not 0 <= p <= length - (0 if insert else 1):
        raise ctx.error(f"position {p} is outside a sequence of {length}")
    return p


def _bind_sequence(ctx: NodeContext, items: list) -> None:
    ctx.importer.bind(ctx.proto.output[0], StaticSequence(items))


@converter("SplitToSequence")
def _split_to_sequence(ctx: NodeContext) -> None:
    x = ctx.type(0)
    axis = norm_axes((ctx.attrs.get("axis", 0),), x.rank)[0]
    n = x.shape[axis]
    if not is_static_dim(n):
        raise ctx.error(f"splitting a dimension of symbolic size {n} into a sequence")
    split = None if ctx.input(1) is None else ctx.need(1, "split sizes")
    if split is None:
        sizes = (1,) * n
    elif split.ndim == 0:  # pieces of that size, the last one shorter
        step = int(split)
        sizes = tuple(min(step, n - s) for s in range(0, n, step))
    else:
        sizes = _ints(split)
    parts = ctx.emit("Split", [ctx.input(0)], {"axis": axis, "split": sizes}, n_out=len(sizes))
    if split is None and not ctx.attrs.get("keepdims", 1):
        parts = [ctx.emit("Squeeze", [p], {"axes": (axis,)})[0] for p in parts]
    _bind_sequence(ctx, parts)


@converter("SequenceConstruct")
def _sequence_construct(ctx: NodeContext) -> None:
    _bind_sequence(ctx, list(ctx.inputs))


@converter("SequenceEmpty")
def _sequence_empty(ctx: NodeContext) -> None:
    _bind_sequence(ctx, [])


@converter("SequenceInsert")
def _sequence_insert(ctx: NodeContext) -> None:
    items = list(_sequence(ctx, 0))
    at = len(items) if ctx.input(2) is None else _position(ctx, 2, len(items), insert=True)
    _bind_sequence(ctx, items[:at] + [ctx.input(1)] + items[at:])


@converter("SequenceErase")
def _sequence_erase(ctx: NodeContext) -> None:
    items = list(_sequence(ctx, 0))
    at = len(items) - 1 if ctx.input(1) is None else _position(ctx, 1, len(items))
    _bind_sequence(ctx, items[:at] + items[at + 1 :])


@converter("SequenceAt")
def _sequence_at(ctx: NodeContext) -> None:
    items = _sequence(ctx, 0)
    emit(ctx, "Identity", [items[_position(ctx, 1, len(items))]], {})


@converter("SequenceLength")
def _sequence_length(ctx: NodeContext) -> None:
    name = ctx.proto.output[0]
    ctx.importer.bind(name, ctx.importer.constant(name, np.array(len(_sequence(ctx, 0)), np.int64)))


@converter("ConcatFromSequence")
def _concat_from_sequence(ctx: NodeContext) -> None:
    items = _sequence(ctx, 0)
    if not items:
        raise ctx.error("concatenating an empty sequence")
    new_axis = ctx.attrs.get("new_axis", 0)
    axis = norm_axes((ctx.attrs["axis"],), items[0].type.rank + (1 if new_axis else 0))[0]
    if new_axis:  # a stack: each item gets the axis first
        items = [ctx.emit("Unsqueeze", [v], {"axes": (axis,)})[0] for v in items]
    emit(ctx, "Concat", list(items), {"axis": axis})


__all__ = ["CONVERTERS", "convert_node", "find_unsupported", "support_problem"]
