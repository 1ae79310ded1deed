"""PyTorch frontend, the converters: one row per core ATen op (`CONVERTERS`: the op's name, every overload)
onto the existing Ember ops. A converter gets a `Ctx` (the FX node's arguments as Values or static Python values,
the node's recorded result `meta["val"]`, and the importer to add nodes) and returns the node's Value, or a list
for ops with several results. `ember.frontend.torch` is the entry point and the importer.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import fx

from ember.frontend.onnx_importer import ModelError
from ember.graph.dims import is_static_dim, range_length
from ember.graph.ir import Value
from ember.graph.types import TensorType

if TYPE_CHECKING:
    from ember.frontend.torch import TorchImporter

INT64_MAX = 2**63 - 1


def torch_dtype_name(dtype: torch.dtype) -> str:
    """The Ember dtype name of a torch dtype ("float32", "int64", "bool", "bfloat16", ...)."""
    return str(dtype).removeprefix("torch.")


def module_path(node: fx.Node) -> str:
    """Where an FX node came from: the innermost module of its `nn_module_stack` ('layers.0.conv1 (Conv2d)')."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return f"{node.name} (top level)"
    path, cls = list(stack.values())[-1]
    cls = cls if isinstance(cls, str) else getattr(cls, "__name__", str(cls))
    return f"{path or '<root>'} ({cls.rsplit('.', 1)[-1]})"


class Ctx:
    """What a converter sees: the node's arguments as Values or Python values, and the importer to add nodes."""

    def __init__(self, imp: TorchImporter, node: fx.Node):
        self.imp, self.node = imp, node
        self.name = imp.fresh(node.name)
        imp.taken.discard(self.name)  # the first output takes the name

    def arg(self, i: int, key: str | None = None, default: Any = None) -> Any:
        """Argument `i` (or keyword `key`) as a Python value (sizes made static); fx nodes stay nodes."""
        args, kwargs = self.node.args, self.node.kwargs
        raw = args[i] if i < len(args) else kwargs.get(key, default) if key else default
        return self.imp.static(raw) if not isinstance(raw, fx.Node) else raw

    def v(self, i: int, dtype: str | None = None, key: str | None = None) -> Value | None:
        raw = self.node.args[i] if i < len(self.node.args) else self.node.kwargs.get(key) if key else None
        return None if raw is None else self.imp.value(raw, dtype)

    @property
    def out(self) -> torch.Tensor:
        return self.node.meta["val"]

    @property
    def out_dtype(self) -> str:
        return torch_dtype_name(self.out.dtype)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return tuple(self.imp.static(list(self.out.shape)))

    def in_shape(self, i: int = 0) -> tuple[int, ...]:
        return self.v(i).shape

    def add(self, op: str, inputs: list[Value | None], attrs: dict | None = None) -> Value:
        return self.imp.add1(op, inputs, attrs, self.name)

    def const(self, data: Any, dtype: str | None = None) -> Value:
        return self.imp.const(data, dtype, f"{self.name}_c")


Converter = Callable[[Ctx], Any]
CONVERTERS: dict[str, Converter] = {}
COMPLEX: dict[str, Converter] = {}  # converters of nodes that read or make complex tensors (`torch_complex`)


def converter(*names: str, table: dict[str, Converter] = CONVERTERS) -> Callable[[Converter], Converter]:
    """Register a converter for ATen ops by name ("convolution", "add", ...): every overload of each (in `table`:
    COMPLEX for the nodes that read or make complex tensors)."""

    def wrap(fn: Converter) -> Converter:
        for n in names:
            table[n] = fn
        return fn

    return wrap


def converter_of(node: fx.Node) -> Converter | None:
    target = node.target
    if target is operator.getitem:
        return _getitem
    if not isinstance(node.meta.get("val"), torch.Tensor | list | tuple):
        return _getitem  # size arithmetic on SymInts and scalar results: evaluated statically by the importer
    if isinstance(target, torch._ops.OpOverload) and target.namespace == "aten":
        table = COMPLEX if touches_complex(node) else CONVERTERS
        return table.get(target.overloadpacket.__name__)
    return None


def is_complex(arg: Any) -> bool:
    """Whether an FX argument is a complex tensor."""
    val = arg.meta.get("val") if isinstance(arg, fx.Node) else None
    return isinstance(val, torch.Tensor) and val.is_complex()


def touches_complex(node: fx.Node) -> bool:
    """Whether a node reads or makes a complex tensor."""
    args = [b for a in (*node.args, *node.kwargs.values()) for b in (a if isinstance(a, list | tuple) else (a,))]
    return is_complex(node) or any(is_complex(b) for b in args)


def _getitem(c: Ctx) -> Any:
    return c.imp.env[c.node.args[0]][c.node.args[1]]


def _norm_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


# -- elementwise -------------------------------------------------------------------------------------------
def _fake(c: Ctx, arg: Any) -> Any:
    return arg.meta["val"] if isinstance(arg, fx.Node) else c.imp.static(arg)


def _binary(op: str, compare: bool = False, attrs: dict | None = None) -> Converter:
    """A broadcasting binary op: operands cast to the dtype torch computes in (the result's, for comparisons
    the promoted operands')."""

    def convert(c: Ctx) -> Value:
        a, b = c.node.args[:2]
        dtype = torch_dtype_name(torch.result_type(_fake(c, a), _fake(c, b))) if compare else c.out_dtype
        x, y = c.imp.value(a, dtype), c.imp.value(b, dtype)
        alpha = c.arg(2, "alpha", 1)
        if op in ("Add", "Sub") and alpha != 1:
            y = c.imp.add1("Mul", [y, c.const(alpha, dtype)], name=f"{c.name}_alpha")
        if op in ("And", "Or", "Xor") and dtype != "bool":  # bitwise_and & co. on integers
            return c.add("Bitwise" + op, [x, y])
        return c.add(op, [x, y], attrs)

    return convert


for _names, _op in [(("add",), "Add"), (("sub",), "Sub"), (("mul",), "Mul"), (("pow",), "Pow"),
                    (("maximum",), "Max"), (("minimum",), "Min"), (("bitwise_and", "logical_and"), "And"),
                    (("bitwise_or", "logical_or"), "Or"), (("logical_xor", "bitwise_xor"), "Xor")]:  # fmt: skip
    converter(*_names)(_binary(_op))
converter("fmod")(_binary("Mod", attrs={"fmod": 1}))  # the sign of the dividend (C fmod)
converter("remainder")(_binary("Mod", attrs={"fmod": 0}))  # the sign of the divisor (Python %)
@converter("ne")
def _ne(c: Ctx) -> Value:
    dtype = torch_dtype_name(torch.result_type(_fake(c, c.node.args[0]), _fake(c, c.node.args[1])))
    eq = c.imp.add1("Equal", [c.v(0, dtype), c.v(1, dtype)], name=f"{c.name}_eq")
    return c.add("Not", [eq])


for _names, _op in [(("eq",), "Equal"), (("lt",), "Less"), (("le",), "LessOrEqual"), (("gt",), "Greater"),
                    (("ge",), "GreaterOrEqual")]:  # fmt: skip
    converter(*_names)(_binary(_op, compare=True))

_UNARY = {"neg": "Neg", "exp": "Exp", "log": "Log", "sqrt": "Sqrt", "tanh": "Tanh", "sigmoid": "Sigmoid",
          "relu": "Relu", "abs": "Abs", "erf": "Erf", "sin": "Sin", "cos": "Cos", "reciprocal": "Reciprocal",
          "floor": "Floor", "ceil": "Ceil", "round": "Round", "sign": "Sign", "logical_not": "Not",
          "hardswish": "HardSwish", "softplus": "Softplus", "mish": "Mish", "tan": "Tan",
          "asin": "Asin", "acos": "Acos", "atan": "Atan", "sinh": "Sinh", "cosh": "Cosh", "isnan": "IsNaN"}  # fmt: skip


def _unary(op: str) -> Converter:
    return lambda c: c.add(op, [c.v(0, c.out_dtype if op not in ("IsNaN",) else None)])


for _name, _op in _UNARY.items():
    converter(_name)(_unary(_op))


@converter("div")
def _div(c: Ctx) -> Value:
    mode = c.arg(2, "rounding_mode")
    dtype = c.out_dtype if mode is None else "float64" if c.out_dtype in ("int32", "int64") else c.out_dtype
    q = c.imp.add1("Div", [c.imp.value(c.node.args[0], dtype), c.imp.value(c.node.args[1], dtype)],
                   name=c.name if mode is None else f"{c.name}_q")  # fmt: skip
    if mode is None:
        return q
    q = c.imp.add1("Floor" if mode == "floor" else "Sign", [q], name=f"{c.name}_r") if mode == "floor" else (
        c.imp.add1("Mul", [c.imp.add1("Sign", [q], name=f"{c.name}_s"),
                           c.imp.add1("Floor", [c.imp.add1("Abs", [q], name=f"{c.name}_a")], name=f"{c.name}_f")],
                   name=f"{c.name}_t"))  # fmt: skip
    return c.add("Cast", [q], {"to": c.out_dtype})


@converter("bitwise_not")
def _bitwise_not(c: Ctx) -> Value:
    return c.add("Not" if c.out_dtype == "bool" else "BitwiseNot", [c.v(0)])


@converter("rsqrt")
def _rsqrt(c: Ctx) -> Value:
    return c.add("Reciprocal", [c.imp.add1("Sqrt", [c.v(0, c.out_dtype)], name=f"{c.name}_sqrt")])


@converter("log1p")
def _log1p(c: Ctx) -> Value:
    return c.add("Log", [c.imp.add1("Add", [c.v(0, c.out_dtype), c.const(1, c.out_dtype)], name=f"{c.name}_1p")])


@converter("expm1")
def _expm1(c: Ctx) -> Value:
    return c.add("Sub", [c.imp.add1("Exp", [c.v(0, c.out_dtype)], name=f"{c.name}_exp"), c.const(1, c.out_dtype)])


@converter("silu")
def _silu(c: Ctx) -> Value:
    return c.add("Swish", [c.v(0)])


@converter("hardsigmoid")
def _hardsigmoid(c: Ctx) -> Value:
    return c.add("HardSigmoid", [c.v(0)], {"alpha": 1 / 6, "beta": 0.5})


@converter("gelu")
def _gelu(c: Ctx) -> Value:
    return c.add("Gelu", [c.v(0)], {"approximate": c.arg(1, "approximate", "none")})


@converter("leaky_relu")
def _leaky_relu(c: Ctx) -> Value:
    return c.add("LeakyRelu", [c.v(0)], {"alpha": c.arg(1, "negative_slope", 0.01)})


@converter("elu")
def _elu(c: Ctx) -> Value:
    if c.arg(2, "scale", 1) != 1 or c.arg(3, "input_scale", 1) != 1:
        raise ModelError(f"elu with scale or input_scale is not supported ({c.node.name})")
    return c.add("Elu", [c.v(0)], {"alpha": c.arg(1, "alpha", 1.0)})


@converter("clamp", "clamp_min", "clamp_max", "hardtanh")
def _clamp(c: Ctx) -> Value:
    packet = c.node.target.overloadpacket.__name__
    lo, hi = {"clamp_min": (c.arg(1, "min"), None), "clamp_max": (None, c.arg(1, "max")),
              "hardtanh": (c.arg(1, "min_val", -1.0), c.arg(2, "max_val", 1.0))}.get(
        packet, (c.arg(1, "min"), c.arg(2, "max")))  # fmt: skip
    x = c.v(0, c.out_dtype)
    if isinstance(lo, fx.Node) or isinstance(hi, fx.Node) or c.out_dtype not in ("float32", "float64", "float16"):
        for bound, op in ((lo, "Max"), (hi, "Min")):  # tensor bounds, or integer data: Max/Min
            if bound is not None:
                x = c.imp.add1(op, [x, c.imp.value(bound, c.out_dtype)], name=f"{c.name}_{op.lower()}")
        return c.add("Identity", [x])
    return c.add("Clip", [x], {"min": lo, "max": hi})


@converter("atan2")
def _atan2(c: Ctx) -> Value:
    return atan2(c, c.v(0, c.out_dtype), c.v(1, c.out_dtype))


def atan2(c: Ctx, y: Value, x: Value) -> Value:
    """The angle of (x, y) in (-pi, pi]: atan(y / x), moved by pi where x < 0 (to y's side), and +-pi/2 or 0 on
    the y axis (where y / x is infinite or NaN)."""
    n, dt = c.name, x.dtype
    base = c.imp.add1("Atan", [c.imp.add1("Div", [y, x], name=f"{n}_q")], name=f"{n}_atan")
    up = c.imp.add1("GreaterOrEqual", [y, c.const(0.0, dt)], name=f"{n}_up")
    turn = c.imp.add1("Where", [up, c.const(math.pi, dt), c.const(-math.pi, dt)], name=f"{n}_turn")
    left = c.imp.add1("Less", [x, c.const(0.0, dt)], name=f"{n}_left")
    r = c.imp.add1("Where", [left, c.imp.add1("Add", [base, turn], name=f"{n}_turned"), base], name=f"{n}_r")
    axis = c.imp.add1("Equal", [x, c.const(0.0, dt)], name=f"{n}_axis")
    half = c.imp.add1("Mul", [c.imp.add1("Sign", [y], name=f"{n}_sign"), c.const(math.pi / 2, dt)], name=f"{n}_pole")
    return c.add("Where", [axis, half, r])


@converter("where")
def _where(c: Ctx) -> Value:
    return c.add("Where", [c.v(0, "bool"), c.v(1, c.out_dtype), c.v(2, c.out_dtype)])


@converter("masked_fill")
def _masked_fill(c: Ctx) -> Value:
    return c.add("Where", [c.v(1, "bool"), c.v(2, c.out_dtype), c.v(0, c.out_dtype)])


@converter("_to_copy", "to", "type_as")
def _to_copy(c: Ctx) -> Value:
    return c.add("Cast", [c.v(0)], {"to": c.out_dtype})


@converter("clone", "alias", "lift_fresh_copy", "contiguous", "detach", "dropout", "_assert_tensor_metadata")
def _identity(c: Ctx) -> Value | None:
    if c.node.target.overloadpacket.__name__ == "_assert_tensor_metadata":
        return None
    return c.add("Identity", [c.v(0)])


# -- constants made from sizes -----------------------------------------------------------------------------
@converter("arange")
def _arange(c: Ctx) -> Value:
    args = [a for a in c.node.args]
    start, end, step = (0, args[0], 1) if len(args) == 1 else (args[0], args[1], args[2] if len(args) > 2 else 1)
    start, end, step = c.imp.static([start, end, c.node.kwargs.get("step", step)])
    if isinstance(step, float) and step.is_integer() and c.out_dtype.startswith("int"):
        step = int(step)  # arange(0, n, 2.0, dtype=int64): XLNet's, Funnel's
    if not all(isinstance(x, int | float | np.number) for x in (start, end, step)):  # bounds from symbolic sizes:
        if not is_static_dim(step) or not c.out_dtype.startswith("int"):  # a Range of their values
            raise ModelError(f"arange({start}, {end}, {step}) of {c.out_dtype}: a symbolic range needs an int step "
                             "and an integer result")  # fmt: skip
        bounds = [c.imp.value(x, c.out_dtype) for x in (start, end, step)]
        return c.add("Range", bounds, {"length": range_length(start, end, int(step))})
    return c.const(np.arange(start, end, step).astype(TensorType((), c.out_dtype).np_dtype))


@converter("full", "full_like", "zeros", "zeros_like", "ones", "ones_like", "scalar_tensor", "empty", "empty_like",
           "new_zeros", "new_ones", "new_full")  # fmt: skip
def _full(c: Ctx) -> Value:
    packet = c.node.target.overloadpacket.__name__
    fill = {"full": lambda: c.arg(1, "fill_value"), "full_like": lambda: c.arg(1, "fill_value"),
            "scalar_tensor": lambda: c.arg(0, "s"), "new_full": lambda: c.arg(2, "fill_value")}.get(
        packet, lambda: 1 if "ones" in packet else 0)()  # fmt: skip
    return c.const(np.full(c.out_shape, fill, dtype=TensorType((), c.out_dtype).np_dtype))


# -- shapes and data movement ------------------------------------------------------------------------------
@converter("view", "reshape", "_unsafe_view", "flatten", "unflatten")
def _view(c: Ctx) -> Value:
    return c.add("Reshape", [c.v(0)], {"shape": c.out_shape})


@converter("permute")
def _permute(c: Ctx) -> Value:
    rank = len(c.in_shape())
    return c.add("Transpose", [c.v(0)], {"perm": tuple(_norm_axis(d, rank) for d in c.arg(1, "dims"))})


@converter("t", "transpose")
def _transpose(c: Ctx) -> Value:
    rank = len(c.in_shape())
    a, b = (0, 1) if c.node.target.overloadpacket.__name__ == "t" else (c.arg(1), c.arg(2))
    perm = list(range(rank))
    if rank >= 2:
        a, b = _norm_axis(a, rank), _norm_axis(b, rank)
        perm[a], perm[b] = perm[b], perm[a]
    return c.add("Transpose", [c.v(0)], {"perm": tuple(perm)})


@converter("expand", "expand_as", "broadcast_to")
def _expand(c: Ctx) -> Value:
    return c.add("Expand", [c.v(0)], {"shape": c.out_shape})


@converter("unsqueeze")
def _unsqueeze(c: Ctx) -> Value:
    return c.add("Unsqueeze", [c.v(0)], {"axes": (_norm_axis(c.arg(1, "dim"), len(c.in_shape()) + 1),)})


@converter("squeeze")
def _squeeze(c: Ctx) -> Value:
    shape = c.in_shape()
    dims = c.arg(1, "dim")
    dims = range(len(shape)) if dims is None else [dims] if isinstance(dims, int) else dims
    axes = tuple(a for a in (_norm_axis(d, len(shape)) for d in dims) if shape[a] == 1)
    return c.add("Squeeze", [c.v(0)], {"axes": axes}) if axes else c.add("Identity", [c.v(0)])


def slice_range(size: int, start: Any, end: Any) -> tuple[int, int]:
    """A torch slice's start and end clamped into [0, size], negatives counted from the end."""
    start = 0 if start is None else max(0, min(size, start + size if start < 0 else start))
    end = size if end is None or end >= INT64_MAX else max(0, min(size, end + size if end < 0 else end))
    return start, end


@converter("slice")
def _slice(c: Ctx) -> Value:
    shape = c.in_shape()
    dim = _norm_axis(c.arg(1, "dim", 0), len(shape))
    start, end = slice_range(shape[dim], c.arg(2, "start"), c.arg(3, "end"))
    step = c.arg(4, "step", 1)
    return c.add("Slice", [c.v(0)], {"starts": (start,), "ends": (end,), "axes": (dim,), "steps": (step,)})


@converter("select")
def _select(c: Ctx) -> Value:
    shape = c.in_shape()
    dim = _norm_axis(c.arg(1, "dim"), len(shape))
    index = c.arg(2, "index")
    return c.add("Gather", [c.v(0), c.const(index + shape[dim] if index < 0 else index, "int64")], {"axis": dim})


@converter("cat", "concat")
def _cat(c: Ctx) -> Value:
    values = [c.imp.value(a, c.out_dtype) for a in c.node.args[0]]
    values = [v for v in values if len(v.shape) > 1 or not v.type.is_static or v.type.size > 0] or values[:1]
    # (torch skips empty 1-d tensors)
    rank = len(values[0].shape)
    return c.add("Concat", values, {"axis": _norm_axis(c.arg(1, "dim", 0), rank)})


@converter("split_with_sizes", "split")
def _split(c: Ctx) -> list[Value]:
    shape = c.in_shape()
    dim = _norm_axis(c.arg(2, "dim", 0), len(shape))
    sizes = [c.imp.static(t.shape[dim]) for t in c.out]
    return c.imp.add("Split", [c.v(0)], {"axis": dim, "split": tuple(sizes)}, c.name, outputs=len(sizes))


@converter("constant_pad_nd")
def _pad(c: Ctx) -> Value:
    rank = len(c.in_shape())
    pad = list(c.arg(1, "pad"))  # (last dim begin, last dim end, previous dim begin, ...)
    begins, ends = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):
        begins[rank - 1 - i], ends[rank - 1 - i] = pad[2 * i], pad[2 * i + 1]
    return c.add("Pad", [c.v(0)], {"pads": tuple(begins + ends), "mode": "constant", "value": c.arg(2, "value", 0)})


@converter("repeat")
def _repeat(c: Ctx) -> Value:
    repeats, x = tuple(c.arg(1, "repeats")), c.v(0)
    if len(repeats) > len(x.shape):  # torch prepends dims of size 1
        x = c.imp.add1("Reshape", [x], {"shape": (1,) * (len(repeats) - len(x.shape)) + x.shape}, f"{c.name}_r")
    return c.add("Tile", [x], {"repeats": repeats})


@converter("flip")
def _flip(c: Ctx) -> Value:
    shape = c.in_shape()
    axes = tuple(_norm_axis(d, len(shape)) for d in c.arg(1, "dims"))
    return c.add("Slice", [c.v(0)], {"starts": (-1,) * len(axes), "ends": tuple(-shape[a] - 1 for a in axes),
                                     "axes": axes, "steps": (-1,) * len(axes)})  # fmt: skip


_SCATTER_REDUCTIONS = {"sum": "add", "add": "add", "prod": "mul", "multiply": "mul", "amax": "max", "amin": "min",
                       "mean": "add"}  # fmt: skip


@converter("scatter", "scatter_add", "scatter_reduce")
def _scatter(c: Ctx) -> Value:
    """scatter (of a tensor or a value, with an optional reduce), scatter_add and scatter_reduce (sum, prod, amax,
    amin, mean; include_self or not) as ScatterElements. Only src's elements that the index covers are scattered
    (torch allows a larger src); without include_self the scattered-to elements start from the reduction's
    identity, and a mean divides by the count of elements that landed on each (plus one with include_self)."""
    packet, overload = c.node.target.overloadpacket.__name__, c.node.target._overloadname
    x, index, dt = c.v(0, c.out_dtype), c.v(2, "int64"), TensorType((), c.out_dtype).np_dtype
    axis = _norm_axis(c.arg(1, "dim"), max(len(x.shape), 1))
    if "value" in overload:
        src = c.imp.add1("Expand", [c.imp.value(c.arg(3, "value"), c.out_dtype)], {"shape": index.shape},
                         f"{c.name}_value")  # fmt: skip
    else:
        src = c.v(3, c.out_dtype)
        if src.shape != index.shape:
            src = c.imp.add1("Slice", [src], {"starts": (0,) * len(index.shape), "ends": index.shape,
                                              "axes": tuple(range(len(index.shape))), "steps": (1,) * len(index.shape)},
                             f"{c.name}_src")  # fmt: skip
    if packet == "scatter_add":
        reduce = "add"
    elif packet == "scatter_reduce" or "reduce" in overload:  # (scatter.reduce, scatter.value_reduce)
        reduce = c.arg(4, "reduce")
    else:
        return c.add("ScatterElements", [x, index, src], {"axis": axis})
    if reduce not in _SCATTER_REDUCTIONS:
        raise ModelError(f"{c.node.name} at {module_path(c.node)}: scatter reduction {reduce!r}")
    include_self = packet != "scatter_reduce" or bool(c.arg(5, "include_self", True))
    start = x
    if not include_self:
        big = np.inf if np.issubdtype(dt, np.floating) else np.iinfo(dt).max
        identity = {"sum": 0, "mean": 0, "prod": 1, "amax": -big, "amin": big}[reduce]
        fill = c.imp.add1("Expand", [c.const(np.array(identity, dt))], {"shape": index.shape}, f"{c.name}_id")
        start = c.imp.add1("ScatterElements", [x, index, fill], {"axis": axis}, f"{c.name}_start")
    total = c.imp.add1("ScatterElements", [start, index, src], {"axis": axis, "reduction": _SCATTER_REDUCTIONS[reduce]},
                       f"{c.name}_total")  # fmt: skip
    if reduce != "mean":
        return c.add("Identity", [total])
    ones = c.imp.add1("Expand", [c.const(np.array(1, dt))], {"shape": index.shape}, f"{c.name}_ones")
    base = c.imp.add1("Expand", [c.const(np.array(int(include_self), dt))], {"shape": x.shape}, f"{c.name}_base")
    count = c.imp.add1("ScatterElements", [base, index, ones], {"axis": axis, "reduction": "add"}, f"{c.name}_count")
    safe = c.imp.add1("Max", [count, c.const(np.array(1, dt))], name=f"{c.name}_safe")
    return c.add("Div", [total, safe])  # (integers: truncated where torch floors a negative mean)


@converter("slice_scatter", "select_scatter")
def _slice_scatter(c: Ctx) -> Value:
    """x with x[..., start:end:step, ...] (along dim) replaced by src: what in-place slice assignment
    (`x[:, 1:] = y`, `x[:, 0] = y`) becomes after functionalization. A step of 1 concatenates the parts of x
    around src; other steps scatter src's elements to their positions."""
    shape, out_dtype = c.in_shape(), c.out_dtype
    dim = _norm_axis(c.arg(2, "dim", 0), len(shape))
    src = c.v(1, out_dtype)
    if c.node.target.overloadpacket.__name__ == "select_scatter":
        index = c.arg(3, "index")
        index += shape[dim] if index < 0 else 0
        start, end, step = index, index + 1, 1
        src = c.imp.add1("Unsqueeze", [src], {"axes": (dim,)}, f"{c.name}_src")
    else:
        (start, end), step = slice_range(shape[dim], c.arg(3, "start"), c.arg(4, "end")), c.arg(5, "step", 1)
    x = c.v(0, out_dtype)
    if step == 1:
        parts = [src]
        for lo, hi, where in ((0, start, 0), (end, shape[dim], len(parts) + 1)):
            if hi > lo:
                parts.insert(where, c.imp.add1("Slice", [x], {"starts": (lo,), "ends": (hi,), "axes": (dim,)},
                                               f"{c.name}_keep{lo}"))  # fmt: skip
        return c.add("Concat", parts, {"axis": dim}) if len(parts) > 1 else c.add("Identity", parts)
    positions = np.arange(start, end, step, dtype=np.int64).reshape([-1 if d == dim else 1 for d in range(len(shape))])
    idx = c.imp.add1("Expand", [c.const(positions, "int64")], {"shape": src.shape}, f"{c.name}_idx")
    return c.add("ScatterElements", [x, idx, src], {"axis": dim})


def _storage_positions(shape: tuple, strides: tuple, offset: int) -> np.ndarray:
    """The storage position of each element of a strided view, in the view's shape."""
    rank = len(shape)
    return np.broadcast_to(offset + sum(np.arange(n).reshape([-1 if d == k else 1 for d in range(rank)]) * s
                                        for k, (n, s) in enumerate(zip(shape, strides))), shape)  # fmt: skip


@converter("as_strided")
def _as_strided(c: Ctx) -> Value:
    """A view of x's storage by explicit sizes and strides. Ember's tensors have no storage of their own, so the
    view is mapped back through x's own strides (export records them): each element it reads is an element of x,
    gathered from x flattened. A view that reads storage x does not cover is an error."""
    x, src = c.v(0), c.node.args[0].meta["val"]
    size, stride, offset = c.arg(1, "size"), c.arg(2, "stride"), c.arg(3, "storage_offset")
    offset = src.storage_offset() if offset is None else offset
    owner = {int(p): i for i, p in enumerate(_storage_positions(x.shape, src.stride(), src.storage_offset()).ravel())}
    wanted = _storage_positions(tuple(size), stride, offset)
    missing = [int(p) for p in wanted.ravel() if int(p) not in owner]
    if missing:
        raise ModelError(f"{c.imp.name}: {c.node.name} at {module_path(c.node)}: as_strided{tuple(size), tuple(stride)}"
                         f" reads storage position {missing[0]}, outside its input's view")  # fmt: skip
    if list(size) == list(x.shape) and all(owner[int(p)] == i for i, p in enumerate(wanted.ravel())):
        return c.add("Identity", [x])
    flat = c.imp.add1("Reshape", [x], {"shape": (len(owner),)}, f"{c.name}_flat")
    index = np.vectorize(owner.__getitem__, otypes=[np.int64])(wanted) if wanted.size else wanted.astype(np.int64)
    return c.add("Gather", [flat, c.const(index, "int64")], {"axis": 0})


@converter("copy")
def _copy(c: Ctx) -> Value:
    """copy(self, src): src broadcast to self's shape, in self's dtype (what `self.copy_(src)` functionalizes to)."""
    src = c.v(1, c.out_dtype)
    return c.add("Expand", [src], {"shape": c.out_shape}) if src.shape != c.out_shape else c.add("Identity", [src])


@converter("index_select")
def _index_select(c: Ctx) -> Value:
    return c.add("Gather", [c.v(0), c.v(2, "int64")], {"axis": _norm_axis(c.arg(1, "dim"), len(c.in_shape()))})


@converter("upsample_nearest2d", "upsample_bilinear2d", "upsample_nearest1d", "upsample_linear1d",
           "upsample_nearest3d", "upsample_trilinear3d")  # fmt: skip
def _upsample(c: Ctx) -> Value:
    """torch's interpolate as Resize: scales from scale_factor if given (torch computes coordinates from it),
    else from the sizes; nearest is 'asymmetric' + floor, linear 'pytorch_half_pixel' or 'align_corners'."""
    shape, out = c.in_shape(), c.out_shape
    nearest = "nearest" in c.node.target.overloadpacket.__name__
    align = False if nearest else bool(c.arg(2, "align_corners"))
    factors = c.node.kwargs.get("scale_factors", c.node.args[2 if nearest else 3] if len(c.node.args) > (
        2 if nearest else 3) else None)  # fmt: skip
    nd = len(shape) - 2
    scales = (1.0, 1.0) + (tuple(float(f) for f in factors) if factors else
                           tuple(o / i for o, i in zip(out[2:], shape[2:])))  # fmt: skip
    attrs = {"sizes": out, "scales": scales[: 2 + nd], "mode": "nearest" if nearest else "linear",
             "coordinate_transformation_mode": "asymmetric" if nearest else "align_corners" if align else
             "pytorch_half_pixel", "nearest_mode": "floor"}  # fmt: skip
    return c.add("Resize", [c.v(0)], attrs)


@converter("_upsample_bicubic2d_aa", "_upsample_bilinear2d_aa")
def _upsample_aa(c: Ctx) -> Value:
    """Antialiased interpolate (antialias=True: PIL's filters) as Resize with antialias: the cubic's a = -0.5 (as
    PIL; torch's plain bicubic takes -0.75), taps past the border dropped and the rest renormalized
    (exclude_outside). torch places output pixel i at input (i + 0.5) * r - 0.5 with r = in / out, or with
    align_corners r = (in - 1) / (out - 1), or r = 1 / the scale factor interpolate was given: half-pixel
    coordinates at scale 1 / r in every case."""
    shape, out = c.in_shape(), c.out_shape
    align = bool(c.arg(2, "align_corners"))
    if align and any(o == 1 and i > 1 for i, o in zip(shape[2:], out[2:])):
        raise ModelError(f"{c.node.name} at {module_path(c.node)}: antialiased interpolate with align_corners to a "
                         "size of 1")  # fmt: skip
    given = c.node.args[3:] if c.node.target._overloadname != "vec" else (c.arg(3, "scale_factors") or ())
    given = [*given, *[None] * (len(out) - 2 - len(given))]  # scale factors interpolate was called with
    ratio = [((o - 1) / (i - 1) if i > 1 else 1.0) if align else float(f) if f else o / i
             for i, o, f in zip(shape[2:], out[2:], given)]  # fmt: skip
    attrs = {"sizes": out, "scales": (1.0, 1.0, *ratio), "antialias": 1, "exclude_outside": 1,
             "mode": "cubic" if "bicubic" in c.node.target.overloadpacket.__name__ else "linear",
             "cubic_coeff_a": -0.5, "coordinate_transformation_mode": "half_pixel"}
    return c.add("Resize", [c.v(0)], attrs)


@converter("embedding")
def _embedding(c: Ctx) -> Value:
    return c.add("Gather", [c.v(0), c.v(1, "int64")], {"axis": 0})


@converter("gather")
def _gather(c: Ctx) -> Value:
    return c.add("GatherElements", [c.v(0), c.v(2, "int64")], {"axis": _norm_axis(c.arg(1), len(c.in_shape()))})


def _index_tuples(c: Ctx, indices: list) -> tuple[Value, tuple]:
    """The index tensors broadcast together and stacked on a last axis (GatherND's and ScatterND's indices),
    and their broadcast shape."""
    shape = tuple(np.broadcast_shapes(*[c.imp.value(t).shape for t in indices]))
    parts = []
    for k, t in enumerate(indices):
        v = c.imp.value(t, "int64")
        if v.shape != shape:
            v = c.imp.add1("Expand", [v], {"shape": shape}, f"{c.name}_i{k}")
        parts.append(c.imp.add1("Unsqueeze", [v], {"axes": (len(shape),)}, f"{c.name}_u{k}"))
    return (c.imp.add1("Concat", parts, {"axis": len(shape)}, f"{c.name}_idx") if len(parts) > 1 else parts[0]), shape


def _inverse(perm: list[int]) -> list[int]:
    return [perm.index(i) for i in range(len(perm))]


class _Advanced:
    """x[..., i, ..., j, ...] with index tensors at any dims (None: a whole dim). Computed on x transposed so that
    the indexed dims lead (`front`): the index tuples pick rows of it (GatherND, ScatterND), a result of shape
    index shape + the other dims. torch puts the index shape where the indexed dims were if they are adjacent,
    else first: `back` permutes the result into that order."""

    def __init__(self, c: Ctx, what: str):
        self.c, x = c, c.v(0)
        indices = list(c.node.args[1])
        self.present = [i for i, t in enumerate(indices) if t is not None]
        if any(c.imp.value(indices[i]).dtype == "bool" for i in self.present):
            raise ModelError(f"{c.imp.name}: {c.node.name} at {module_path(c.node)}: {what} by a boolean mask has a "
                             "data-dependent shape")  # fmt: skip
        self.others = [d for d in range(len(x.shape)) if d not in self.present]
        self.front = self.present + self.others
        self.stacked, self.index_shape = _index_tuples(c, [indices[i] for i in self.present])
        s, p = len(self.index_shape), self.present
        lead = p[0] if p == list(range(p[0], p[-1] + 1)) else 0
        self.back = [s + i for i in range(lead)] + list(range(s)) + [s + i for i in range(lead, len(self.others))]
        self.rows_shape = self.index_shape + tuple(x.shape[d] for d in self.others)  # GatherND's result

    def transpose(self, v: Value, perm: list[int], tag: str) -> Value:
        if perm == sorted(perm):
            return v
        return self.c.imp.add1("Transpose", [v], {"perm": tuple(perm)}, f"{self.c.name}_{tag}")

    def gather(self) -> Value:
        c = self.c
        rows = c.imp.add1("GatherND", [self.transpose(c.v(0), self.front, "front"), self.stacked], name=f"{c.name}_g")
        return c.add("Identity", [self.transpose(rows, self.back, "back")])

    def scatter(self, values: Value, accumulate: bool) -> Value:
        c = self.c
        result_shape = tuple(self.rows_shape[i] for i in self.back)  # torch's layout, which values broadcast to
        if values.shape != result_shape:
            values = c.imp.add1("Expand", [values], {"shape": result_shape}, f"{c.name}_upd")
        updates = self.transpose(values, _inverse(self.back), "upd_rows")
        x = self.transpose(c.v(0, c.out_dtype), self.front, "front")
        y = c.imp.add1("ScatterND", [x, self.stacked, updates], {"reduction": "add"} if accumulate else {},
                       f"{c.name}_s")  # fmt: skip
        return c.add("Identity", [self.transpose(y, _inverse(self.front), "back")])


@converter("index")
def _index(c: Ctx) -> Value:
    """x[i0, i1, ...] with index tensors: one index is a Gather on its dim, several a GatherND (`_Advanced`)."""
    indices = list(c.node.args[1])
    present = [i for i, t in enumerate(indices) if t is not None]
    if len(present) == 1 and c.imp.value(indices[present[0]]).dtype != "bool":
        (d,) = present
        return c.add("Gather", [c.v(0), c.imp.value(indices[d], "int64")], {"axis": d})
    return _Advanced(c, "indexing").gather()


@converter("index_put")
def _index_put(c: Ctx) -> Value:
    """x[i0, i1, ...] = values (`+=` with accumulate): a ScatterND (`_Advanced`). A boolean mask over some dims
    (`x[x < 0] = 0`) with values that do not depend on how many elements it picks is a Where."""
    indices, accumulate = list(c.node.args[1]), bool(c.arg(3, "accumulate", False))
    present = [i for i, t in enumerate(indices) if t is not None]
    values, x = c.v(2, c.out_dtype), c.v(0, c.out_dtype)
    if len(present) == 1 and c.imp.value(indices[present[0]]).dtype == "bool":
        (d,) = present
        mask = c.imp.value(indices[d])
        rest = len(x.shape) - d - len(mask.shape)  # dims after the masked ones, which values broadcast along
        vshape = values.shape
        if len(vshape) > rest + 1 or (len(vshape) == rest + 1 and vshape[0] != 1):
            raise ModelError(f"{c.imp.name}: {c.node.name} at {module_path(c.node)}: assignment through a boolean "
                             f"mask of values shaped {vshape}: their count depends on the mask")  # fmt: skip
        if len(vshape) == rest + 1:
            values = c.imp.add1("Squeeze", [values], {"axes": (0,)}, f"{c.name}_v")
        if rest:
            mask = c.imp.add1("Unsqueeze", [mask], {"axes": tuple(range(len(mask.shape), len(mask.shape) + rest))},
                              f"{c.name}_m")  # fmt: skip
        if accumulate:
            zero = c.const(0, c.out_dtype)
            return c.add("Add", [x, c.imp.add1("Where", [mask, values, zero], name=f"{c.name}_w")])
        return c.add("Where", [mask, values, x])
    return _Advanced(c, "index assignment").scatter(values, accumulate)


# -- reductions --------------------------------------------------------------------------------------------
def _axes(c: Ctx, i: int, key: str = "dim") -> tuple[int, ...]:
    rank = len(c.in_shape())
    dims = c.arg(i, key)
    dims = range(rank) if dims is None or dims == [] else [dims] if isinstance(dims, int) else dims
    return tuple(sorted(_norm_axis(d, rank) for d in dims))


def _reduce(op: str) -> Converter:
    def convert(c: Ctx) -> Value:
        keep = int(bool(c.arg(2, "keepdim", False)))
        dtype = c.out_dtype if c.out_dtype != "bool" else "int32"
        y = c.imp.add1(op, [c.v(0, dtype)], {"axes": _axes(c, 1), "keepdims": keep}, f"{c.name}_r")
        return c.add("Cast", [y], {"to": c.out_dtype}) if c.out_dtype != dtype else c.add("Identity", [y])

    return convert


for _name, _op in [("mean", "ReduceMean"), ("sum", "ReduceSum"), ("amax", "ReduceMax"), ("amin", "ReduceMin"),
                   ("any", "ReduceMax"), ("all", "ReduceMin"), ("prod", "ReduceProd")]:  # fmt: skip
    converter(_name)(_reduce(_op))


@converter("linalg_vector_norm")
def _vector_norm(c: Ctx) -> Value:
    """torch.linalg.vector_norm (weight norm, F.normalize): 2 and 1 are ReduceL2/ReduceL1, inf and -inf the
    largest and smallest |x|, 0 the count of nonzeros, any other p (sum |x|^p)^(1/p)."""
    p, dtype = float(c.arg(1, "ord", 2)), c.out_dtype
    x = c.v(0, dtype)
    attrs = {"axes": _axes(c, 2), "keepdims": int(bool(c.arg(3, "keepdim", False)))}
    if p in (1.0, 2.0):
        return c.add("ReduceL2" if p == 2 else "ReduceL1", [x], attrs)
    if p == 0:
        nonzero = c.imp.add1("Not", [c.imp.add1("Equal", [x, c.const(0, dtype)], name=f"{c.name}_zero")],
                             name=f"{c.name}_nz")  # fmt: skip
        return c.add("ReduceSum", [c.imp.add1("Cast", [nonzero], {"to": dtype}, f"{c.name}_count")], attrs)
    mag = c.imp.add1("Abs", [x], name=f"{c.name}_abs")
    if np.isinf(p):
        return c.add("ReduceMax" if p > 0 else "ReduceMin", [mag], attrs)
    powered = c.imp.add1("Pow", [mag, c.const(p, dtype)], name=f"{c.name}_pow")
    total = c.imp.add1("ReduceSum", [powered], attrs, f"{c.name}_sum")
    return c.add("Pow", [total, c.const(1.0 / p, dtype)])


@converter("var")
def _var(c: Ctx) -> Value:
    axes = _axes(c, 1)
    keep = int(bool(c.node.kwargs.get("keepdim", False)))
    correction = c.node.kwargs.get("correction", 1)
    correction = 1 if correction is None else correction
    x = c.v(0)
    mean = c.imp.add1("ReduceMean", [x], {"axes": axes, "keepdims": 1}, f"{c.name}_mean")
    d = c.imp.add1("Sub", [x, mean], name=f"{c.name}_d")
    ss = c.imp.add1("ReduceSum", [c.imp.add1("Mul", [d, d], name=f"{c.name}_sq")], {"axes": axes, "keepdims": keep},
                    f"{c.name}_ss")  # fmt: skip
    n = int(np.prod([x.shape[a] for a in axes]))
    return c.add("Div", [ss, c.const(max(n - correction, 0), c.out_dtype)])


@converter("cumsum")
def _cumsum(c: Ctx) -> Value:
    return c.add("CumSum", [c.v(0, c.out_dtype)], {"axis": _norm_axis(c.arg(1, "dim"), len(c.in_shape()))})


@converter("max", "min")
def _max_dim(c: Ctx) -> Any:
    """max.dim / min.dim: (values, indices); max.default / min.default: the reduction over everything."""
    packet = c.node.target.overloadpacket.__name__
    x = c.v(0)
    if len(c.node.args) == 1 or isinstance(c.node.args[1], fx.Node):
        if len(c.node.args) > 1:  # max.other: elementwise
            return _binary("Max" if packet == "max" else "Min")(c)
        return c.add("ReduceMax" if packet == "max" else "ReduceMin", [x],
                     {"axes": tuple(range(len(x.shape))), "keepdims": 0})  # fmt: skip
    axis, keep = _norm_axis(c.arg(1, "dim"), len(x.shape)), int(bool(c.arg(2, "keepdim", False)))
    values = c.add("ReduceMax" if packet == "max" else "ReduceMin", [x], {"axes": (axis,), "keepdims": keep})
    indices = c.imp.add1("ArgMax" if packet == "max" else "ArgMin", [x], {"axis": axis, "keepdims": keep},
                         f"{c.name}_indices")  # fmt: skip
    return [values, indices]


@converter("topk")
def _topk(c: Ctx) -> list[Value]:
    x = c.v(0)
    attrs = {"k": c.arg(1, "k"), "axis": _norm_axis(c.arg(2, "dim", -1), len(x.shape)),
             "largest": int(bool(c.arg(3, "largest", True))), "sorted": int(bool(c.arg(4, "sorted", True)))}
    return c.imp.add("TopK", [x], attrs, c.name, outputs=2)


@converter("sort")
def _sort(c: Ctx) -> list[Value]:
    """sort (and sort.stable) as a TopK of every element: ascending unless descending; equal elements keep their
    order (TopK's rule), as a stable sort."""
    x = c.v(0)
    stable = c.node.target._overloadname == "stable"  # sort.stable(self, *, stable, dim, descending)
    dim = c.node.kwargs.get("dim", -1) if stable else c.arg(1, "dim", -1)
    descending = c.node.kwargs.get("descending", False) if stable else c.arg(2, "descending", False)
    axis = _norm_axis(dim, len(x.shape))
    if not x.shape:
        return [c.imp.add1("Identity", [x], name=c.name), c.const(np.int64(0))]
    attrs = {"k": x.shape[axis], "axis": axis, "largest": int(bool(descending)), "sorted": 1}
    return c.imp.add("TopK", [x], attrs, c.name, outputs=2)


@converter("unfold")
def _unfold(c: Ctx) -> Value:
    """Tensor.unfold(dim, size, step): the windows x[.., w*step : w*step + size, ..] along dim, each window's
    elements on a new last axis (a Gather of a (windows, size) index table, then that axis moved last)."""
    x = c.v(0)
    rank = len(x.shape)
    axis, size, step = _norm_axis(c.arg(1, "dimension"), max(rank, 1)), c.arg(2, "size"), c.arg(3, "step")
    if rank == 0:
        return c.add("Reshape", [x], {"shape": (1,)})
    n = x.shape[axis]
    if not is_static_dim(n):
        raise ModelError(f"{c.node.name} at {module_path(c.node)}: unfold along a dimension of symbolic size {n}")
    windows = (n - size) // step + 1
    table = np.arange(windows)[:, None] * step + np.arange(size)[None, :]
    g = c.imp.add1("Gather", [x, c.const(table.astype(np.int64))], {"axis": axis}, f"{c.name}_windows")
    perm = (*range(axis + 1), *range(axis + 2, rank + 1), axis + 1)  # (.., windows, size, ..) -> size last
    return c.add("Transpose", [g], {"perm": perm})


@converter("argmax", "argmin")
def _argmax(c: Ctx) -> Value:
    op = "ArgMax" if c.node.target.overloadpacket.__name__ == "argmax" else "ArgMin"
    dim, keep = c.arg(1, "dim"), int(bool(c.arg(2, "keepdim", False)))
    x = c.v(0)
    if dim is None:
        x = c.imp.add1("Reshape", [x], {"shape": (math.prod(x.shape),)}, f"{c.name}_flat")
        dim = 0
    return c.add(op, [x], {"axis": _norm_axis(dim, len(x.shape)), "keepdims": keep})


@converter("_softmax", "softmax", "_log_softmax", "log_softmax")
def _softmax(c: Ctx) -> Value:
    op = "LogSoftmax" if "log" in c.node.target.overloadpacket.__name__ else "Softmax"
    return c.add(op, [c.v(0, c.out_dtype)], {"axis": _norm_axis(c.arg(1, "dim"), len(c.in_shape()))})


# -- linear algebra ----------------------------------------------------------------------------------------
@converter("mm", "bmm", "matmul")
def _matmul(c: Ctx) -> Value:
    return c.add("MatMul", [c.v(0), c.v(1)])


@converter("addmm")
def _addmm(c: Ctx) -> Value:
    return c.add("Gemm", [c.v(1), c.v(2), c.v(0)], {"beta": c.arg(3, "beta", 1), "alpha": c.arg(4, "alpha", 1)})


@converter("linear")
def _linear(c: Ctx) -> Value:
    return c.add("Gemm" if len(c.in_shape()) == 2 else "MatMul", [c.v(0), c.v(1), c.v(2)] if len(c.in_shape()) == 2
                 else [c.v(0), c.imp.add1("Transpose", [c.v(1)], {"perm": (1, 0)}, f"{c.name}_wt")],
                 {"transB": 1} if len(c.in_shape()) == 2 else {})  # fmt: skip


# -- convolution, pooling, normalization -------------------------------------------------------------------
def _expand_ints(x: Any, n: int) -> tuple[int, ...]:
    x = [x] if isinstance(x, int) else list(x)
    return tuple(x * n if len(x) == 1 else x)


@converter("convolution")
def _convolution(c: Ctx) -> Value:
    nd = len(c.in_shape()) - 2
    stride, padding, dilation = (_expand_ints(c.arg(i), nd) for i in (3, 4, 5))
    transposed, output_padding, groups = c.arg(6), _expand_ints(c.arg(7), nd), c.arg(8)
    attrs = {"strides": stride, "pads": padding + padding, "dilations": dilation, "group": groups}
    if transposed:
        return c.add("ConvTranspose", [c.v(0), c.v(1), c.v(2)], dict(attrs, output_padding=output_padding))
    return c.add("Conv", [c.v(0), c.v(1), c.v(2)], attrs)


def _window(c: Ctx, nd: int, kernel: Any, stride: Any, padding: Any) -> dict:
    kernel = _expand_ints(kernel, nd)
    stride = _expand_ints(stride or kernel, nd)
    padding = _expand_ints(padding, nd)
    return {"kernel_shape": kernel, "strides": stride, "pads": padding + padding, "dilations": (1,) * nd}


@converter("max_pool2d_with_indices", "max_pool2d", "max_pool1d", "max_pool3d", "max_pool3d_with_indices")
def _max_pool(c: Ctx) -> Any:
    nd = len(c.in_shape()) - 2
    attrs = _window(c, nd, c.arg(1), c.arg(2, "stride"), c.arg(3, "padding", 0))
    attrs.update(dilations=_expand_ints(c.arg(4, "dilation", 1), nd), ceil_mode=int(bool(c.arg(5, "ceil_mode"))))
    y = c.add("MaxPool", [c.v(0)], attrs)
    return [y, None] if "indices" in c.node.target.overloadpacket.__name__ else y


@converter("avg_pool2d", "avg_pool1d", "avg_pool3d")
def _avg_pool(c: Ctx) -> Value:
    nd = len(c.in_shape()) - 2
    if c.arg(6, "divisor_override") is not None:
        raise ModelError(f"{c.imp.name}: {c.node.name} at {module_path(c.node)}: avg_pool with divisor_override "
                         "is not supported")  # fmt: skip
    attrs = _window(c, nd, c.arg(1), c.arg(2, "stride"), c.arg(3, "padding", 0))
    attrs.update(ceil_mode=int(bool(c.arg(4, "ceil_mode"))), count_include_pad=int(bool(c.arg(5, "count_include_pad",
                                                                                                True))))  # fmt: skip
    return c.add("AveragePool", [c.v(0)], attrs)


@converter("_adaptive_avg_pool2d", "adaptive_avg_pool2d", "_adaptive_avg_pool1d", "adaptive_avg_pool1d",
           "_adaptive_avg_pool3d")  # fmt: skip
def _adaptive_avg_pool(c: Ctx) -> Value:
    """Output 1: a global pool; sizes dividing the input: a plain average pool; else one mean per output
    window (torch's windows: [floor(i*n/o), ceil((i+1)*n/o))), concatenated."""
    x, shape = c.v(0), c.in_shape()
    nd = len(shape) - 2
    out = c.out_shape[-nd:]
    if all(o == 1 for o in out):
        return c.add("GlobalAveragePool", [x])
    spatial = shape[-nd:]
    if all(n % o == 0 for n, o in zip(spatial, out)):
        kernel = tuple(n // o for n, o in zip(spatial, out))
        return c.add("AveragePool", [x], {"kernel_shape": kernel, "strides": kernel, "pads": (0,) * 2 * nd,
                                          "dilations": (1,) * nd})  # fmt: skip
    for d, (n, o) in enumerate(zip(spatial, out)):  # one spatial axis at a time: means of its windows
        axis = len(shape) - nd + d
        parts = []
        for i in range(o):
            lo, hi = (i * n) // o, -(-((i + 1) * n) // o)
            piece = c.imp.add1("Slice", [x], {"starts": (lo,), "ends": (hi,), "axes": (axis,), "steps": (1,)},
                               f"{c.name}_s{d}_{i}")  # fmt: skip
            parts.append(c.imp.add1("ReduceMean", [piece], {"axes": (axis,), "keepdims": 1}, f"{c.name}_m{d}_{i}"))
        x = c.imp.add1("Concat", parts, {"axis": axis}, f"{c.name}_{d}")
    return c.add("Identity", [x])


@converter("_native_batch_norm_legit_no_training", "_native_batch_norm_legit", "native_batch_norm",
           "batch_norm", "_native_batch_norm_legit_functional")  # fmt: skip
def _batch_norm(c: Ctx) -> list:
    """Inference batch norm by its running statistics. In training mode the batch's own statistics normalize
    (what functional uses without running statistics do: timm's weight-standardized convolutions normalize their
    weights so); a module with running statistics in training mode is refused (it was meant to run in eval mode,
    and its call would also update them)."""
    packet = c.node.target.overloadpacket.__name__
    channels = c.in_shape()[1]
    if packet == "_native_batch_norm_legit_no_training":
        x, w, b, mean, var, eps = c.v(0), c.v(1), c.v(2), c.v(3), c.v(4), c.arg(6)
    elif c.node.target._overloadname == "no_stats":  # (x, weight, bias, training, momentum, eps)
        x, w, b, mean, var, eps = c.v(0), c.v(1), c.v(2), None, None, c.arg(5)
    else:
        x, w, b, mean, var, eps = c.v(0), c.v(1), c.v(2), c.v(3), c.v(4), c.arg(7)
        if c.arg(5) and (mean is not None or var is not None):  # training, with running statistics
            raise ModelError(f"{c.imp.name}: {c.node.name} at {module_path(c.node)}: batch norm in training mode "
                             "(compile the module in eval mode)")  # fmt: skip
    w = w if w is not None else c.const(np.ones(channels, x.dtype))
    b = b if b is not None else c.const(np.zeros(channels, x.dtype))
    y = _batch_stats_norm(c, x, w, b, eps) if mean is None else \
        c.add("BatchNormalization", [x, w, b, mean, var], {"epsilon": eps})  # fmt: skip
    if packet == "_native_batch_norm_legit_functional":  # (and the running statistics, unchanged)
        return [y, None, None, mean, var]
    return [y, None, None] if packet != "batch_norm" else y


def _batch_stats_norm(c: Ctx, x: Value, w: Value, b: Value, eps: float) -> Value:
    """(x - mean) / sqrt(var + eps) * w + b with the mean and biased variance of each channel over the batch and
    every spatial position (axis 1 is the channel)."""
    rank = len(c.in_shape())
    axes = (0, *range(2, rank))
    n = f"{c.name}_bn"
    mean = c.imp.add1("ReduceMean", [x], {"axes": axes, "keepdims": 1}, f"{n}_mean")
    d = c.imp.add1("Sub", [x, mean], name=f"{n}_d")
    var = c.imp.add1("ReduceMean", [c.imp.add1("Mul", [d, d], name=f"{n}_sq")], {"axes": axes, "keepdims": 1},
                     f"{n}_var")  # fmt: skip
    std = c.imp.add1("Sqrt", [c.imp.add1("Add", [var, c.const(eps, x.dtype)], name=f"{n}_veps")], name=f"{n}_std")
    per_channel = {"shape": (c.in_shape()[1], *([1] * (rank - 2)))}
    scale = c.imp.add1("Reshape", [w], per_channel, f"{n}_w")
    shift = c.imp.add1("Reshape", [b], per_channel, f"{n}_b")
    normed = c.imp.add1("Div", [d, std], name=f"{n}_norm")
    return c.add("Add", [c.imp.add1("Mul", [normed, scale], name=f"{n}_scaled"), shift])


@converter("native_layer_norm", "layer_norm")
def _layer_norm(c: Ctx) -> Any:
    x, shape = c.v(0), c.arg(1, "normalized_shape")
    w, b = c.v(2), c.v(3)
    eps = c.arg(4, "eps", 1e-5)
    norm = tuple(c.imp.static(list(shape)))
    w = w if w is not None else c.const(np.ones(norm, x.dtype))
    b = b if b is not None else c.const(np.zeros(norm, x.dtype))
    y = c.add("LayerNormalization", [x, w, b], {"axis": -len(norm), "epsilon": eps})
    return [y, None, None] if c.node.target.overloadpacket.__name__ == "native_layer_norm" else y


@converter("native_group_norm", "group_norm")
def _group_norm(c: Ctx) -> Any:
    packet = c.node.target.overloadpacket.__name__
    x, w, b = c.v(0), c.v(1), c.v(2)
    groups, eps = (c.arg(6), c.arg(7)) if packet == "native_group_norm" else (c.arg(1), c.arg(4, "eps", 1e-5))
    if packet == "group_norm":
        w, b = c.v(2), c.v(3)
    channels = c.in_shape()[1]
    w = w if w is not None else c.const(np.ones(channels, x.dtype))
    b = b if b is not None else c.const(np.zeros(channels, x.dtype))
    y = c.add("GroupNormalization", [x, w, b], {"num_groups": groups, "epsilon": eps})
    return [y, None, None] if packet == "native_group_norm" else y


# -- attention ---------------------------------------------------------------------------------------------
def _repeat_heads(c: Ctx, t: Value, heads: int, name: str) -> Value:
    """Keys or values (..., H, L, D) for `heads` query heads, H dividing them: each head repeated in place, as
    torch's enable_gqa (query head h reads key head h // (heads / H))."""
    h = t.shape[-3]
    if not isinstance(h, int) or not isinstance(heads, int) or heads % h:
        raise ModelError(f"{c.node.name} at {module_path(c.node)}: grouped-query attention with {heads} query "
                         f"heads and {h} key heads (the key heads must divide the query heads)")  # fmt: skip
    lead, rest = t.shape[:-2], t.shape[-2:]
    u = c.imp.add1("Unsqueeze", [t], {"axes": (len(lead),)}, f"{name}_u")
    e = c.imp.add1("Expand", [u], {"shape": (*lead, heads // h, *rest)}, f"{name}_e")
    return c.imp.add1("Reshape", [e], {"shape": (*lead[:-1], heads, *rest)}, f"{name}_heads")


@converter("scaled_dot_product_attention")
def _sdpa(c: Ctx) -> Value:
    """softmax(q @ k^T * scale + mask) @ v, decomposed here (torch's own decomposition leaves a strided result
    that some models' `view` then rejects): a boolean mask (or is_causal) keeps the True positions, a float
    mask is added to the scores."""
    q, k, v = c.v(0), c.v(1), c.v(2)
    mask, dropout, causal = c.node.args[3] if len(c.node.args) > 3 else c.node.kwargs.get("attn_mask"), \
        c.arg(4, "dropout_p", 0.0), c.arg(5, "is_causal", False)  # fmt: skip
    if dropout:
        raise ModelError(f"{c.node.name} at {module_path(c.node)}: attention dropout {dropout} (compile in eval mode)")
    if len(q.shape) >= 3 and q.shape[-3] != k.shape[-3]:  # grouped-query attention (enable_gqa)
        k, v = (_repeat_heads(c, t, q.shape[-3], f"{c.name}_{n}") for t, n in ((k, "k"), (v, "v")))
    scale = c.node.kwargs.get("scale")
    scale = 1.0 / float(np.sqrt(q.shape[-1])) if scale is None else float(scale)
    rank, name = len(k.shape), c.name
    kt = c.imp.add1("Transpose", [k], {"perm": (*range(rank - 2), rank - 1, rank - 2)}, f"{name}_kt")
    scores = c.imp.add1("MatMul", [q, kt], name=f"{name}_qk")
    scores = c.imp.add1("Mul", [scores, c.const(scale, q.dtype)], name=f"{name}_scaled")
    masks = [c.imp.value(mask)] if mask is not None else []
    if causal:
        lq, lk = q.shape[-2], k.shape[-2]
        masks.append(c.const(np.tril(np.ones((lq, lk), bool))))
    for i, m in enumerate(masks):
        if m.dtype == "bool":
            scores = c.imp.add1("Where", [m, scores, c.const(-np.inf, q.dtype)], name=f"{name}_masked{i}")
        else:
            scores = c.imp.add1("Add", [scores, c.imp.cast(m, q.dtype)], name=f"{name}_masked{i}")
    probs = c.imp.add1("Softmax", [scores], {"axis": -1}, f"{name}_probs")
    return c.add("MatMul", [probs, v])

