"""The machinery of ONNX import, under `ember.frontend.onnx.from_onnx`: the errors it raises, the
dtype table, the schema lookups, and `Importer`, which converts ONNX graphs node by node into one
Ember graph (value scopes, unique names, constant folding), handing each node to a converter as a
`NodeContext` (what a converter sees of one ONNX node).

The converters (`ember.frontend.onnx_ops`, `ember.frontend.onnx_functions`) build on this module;
the importer is given their entry point (`convert_node`) when it is made, so nothing here imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ember.graph.dims import (
    Dim,
    SizeVars,
    decide,
    dim_product,
    is_static_dim,
    reads_values,
    simplify_dim,
    size_vars,
    value_size_var,
)
from ember.graph.ir import Graph, Node, Value
from ember.graph.types import TensorType
from ember.ops import AttrError, ShapeDependsOnData, get_op
from ember.ops.evaluate import ComputedOperand, computed_operand

MIN_OPSET = 13
MAX_OPSET = onnx.defs.onnx_opset_version()

# ONNX TensorProto element type -> Ember dtype name
ONNX_DTYPES: dict[int, str] = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
    10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "bfloat16", 17: "float8_e4m3fn",
    18: "float8_e4m3fnuz", 19: "float8_e5m2", 20: "float8_e5m2fnuz", 21: "uint4", 22: "int4",
    23: "float4_e2m1fn", 24: "float8_e8m0fnu", 25: "uint2", 26: "int2",
}  # fmt: skip


# -- errors -------------------------------------------------------------------------------------
class ModelError(ValueError):
    """A model Ember cannot import: unreadable, malformed, or failing the ONNX checker."""


class UnsupportedOperatorError(ModelError):
    """Operators Ember does not support; `unsupported` maps each to the nodes using it."""

    def __init__(self, source: str, unsupported: dict[str, list[str]]):
        self.unsupported = unsupported
        lines = [f"  {op}: used by {_name_list(nodes)}" for op, nodes in sorted(unsupported.items())]
        super().__init__(
            f"{source}: {len(unsupported)} unsupported operator(s):\n" + "\n".join(lines)
            + "\nNo part of the model was imported."
        )  # fmt: skip


# ops whose output holds the input's elements in order (a shape value passes through them unchanged)
SAME_ELEMENTS = ("Cast", "Squeeze", "Unsqueeze", "Reshape", "Flatten", "Identity")
COMPARISONS = {"Equal": "==", "Less": "<", "LessOrEqual": "<=", "Greater": ">", "GreaterOrEqual": ">="}
MAX_VALUE_SIZES = 8  # elements of a graph input read as run-time sizes (a shape operand; floats truncate)


class DynamicShapeError(ModelError):
    """An operand that must be static depends on graph inputs; `inputs` names them."""

    def __init__(self, message: str, inputs: list[str]):
        self.inputs = inputs
        super().__init__(message)


def _name_list(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


# -- schemas ----------------------------------------------------------------------------------------
def normal_domain(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


def get_schema(op_type: str, domain: str, opsets: dict[str, int]):
    """The ONNX schema a node uses under the model's opsets (None if there is none)."""
    domain = normal_domain(domain)
    try:
        return onnx.defs.get_schema(op_type, opsets.get(domain, 1), domain)
    except Exception:
        return None


def is_default_domain(domain: str) -> bool:
    return normal_domain(domain) == ""


def op_version(proto: onnx.NodeProto, opsets: dict[str, int]) -> int:
    """The schema version (since_version) of a node's operator under the model's opsets (0: none)."""
    schema = get_schema(proto.op_type, proto.domain, opsets)
    return schema.since_version if schema is not None else 0


# -- input types --------------------------------------------------------------------------------------
def onnx_dtype(elem_type: int, what: str) -> str:
    if elem_type not in ONNX_DTYPES:
        name = (
            onnx.TensorProto.DataType.Name(elem_type) if elem_type in onnx.TensorProto.DataType.values() else elem_type
        )
        raise ModelError(f"{what} has element type {name}, which Ember does not support")
    return ONNX_DTYPES[elem_type]


def input_type(vi: onnx.ValueInfoProto, given: tuple[int, ...] | None, source: str,
               sizes: SizeVars | None = None) -> TensorType | str:  # fmt: skip
    """The type of a graph input, or a message saying which dims are unknown. With `sizes`, a symbolic dim
    becomes that size variable (an unnamed one gets the name `<input>_<axis>`); without, a symbolic leading dim
    is 1 and any other makes the message."""
    if not vi.type.HasField("tensor_type"):
        raise ModelError(f"{source}: input {vi.name!r} is a {vi.type.WhichOneof('value')}; Ember takes tensors only")
    tt = vi.type.tensor_type
    dtype = onnx_dtype(tt.elem_type, f"{source}: input {vi.name!r}")
    dims: list[int | str | None] = (
        [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
        if tt.HasField("shape") else None
    )  # fmt: skip
    if given is not None:
        given = tuple(int(d) for d in given)
        if dims is not None and (len(dims) != len(given) or any(
                isinstance(d, int) and d != g for d, g in zip(dims, given))):  # fmt: skip
            raise ModelError(f"{source}: input_shapes[{vi.name!r}] = {list(given)} contradicts the model's shape "
                             f"{_dims_text(dims)}")  # fmt: skip
        return TensorType(given, dtype)
    if dims is None:
        return f"{vi.name!r} (rank unknown)"
    if sizes is not None:  # symbolic dims stay symbolic: one size variable per dim_param name
        shape = [d if isinstance(d, int) else sizes(d or f"{vi.name}_{i}") for i, d in enumerate(dims)]
        return TensorType(tuple(shape), dtype)
    if dims and not isinstance(dims[0], int):
        dims[0] = 1  # documented default: a symbolic leading (batch) dim is 1
    if all(isinstance(d, int) for d in dims):
        return TensorType(tuple(dims), dtype)
    return f"{vi.name!r} {_dims_text(dims)}"


def _dims_text(dims: list) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def first_line(e: Exception) -> str:
    """The gist of an exception's message (protobuf and onnx errors run to many lines)."""
    text = str(e).strip() or type(e).__name__
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[0] if len(lines) == 1 else " ".join(lines[:3])[:400]


# operators that only move the elements of their first input: they pass on what a string tensor stands for
STRING_MOVERS = frozenset({"Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose", "Gather",
                           "GatherElements", "GatherND", "ArrayFeatureExtractor", "Slice", "Expand", "Tile"})


# -- the importer ---------------------------------------------------------------------------------------
@dataclass
class Importer:
    """Converts ONNX graphs node by node into one Ember Graph, folding constants. Each ONNX node goes
    to `convert_node` (`ember.frontend.onnx_ops.convert_node`), which adds its Ember nodes."""

    source: str
    opsets: dict[str, int]  # domain ("" for ai.onnx) -> version
    input_values: dict[str, np.ndarray]
    convert_node: Callable[[NodeContext], None]
    fold_limit: int  # nodes with constant inputs fold when their outputs hold at most this many elements
    scopes: list[dict[str, Value]] = field(default_factory=list)
    graph: Graph | None = None
    counter: int = 0
    reserved: set[str] = field(default_factory=set)  # the top graph's ONNX value names
    taken: set[str] = field(default_factory=set)  # names given to Values so far
    nested: int = 0  # > 0 while importing a subgraph or inlining a body
    top: Graph | None = None  # the top graph (inlined bodies add their nodes to it)
    producers: dict[Value, Node] = field(default_factory=dict)  # across all graphs being built
    sizes: SizeVars | None = None  # symbolic input dims: one size variable per name (None: static import)
    # int64 values computed from symbolic shapes (Shape -> Gather -> Concat): their elements as dims, so that a
    # Reshape target built from them is known at import; the nodes stay in the graph for run-time readers
    shape_values: dict[Value, np.ndarray] = field(default_factory=dict)
    # values that stand for what Ember has no tensors of (string labels, ZipMap's maps): an index or score tensor
    # and its `Graph.decoders` entry. Identity passes one on; a graph output returns it decoded; other readers fail
    decoded: dict[Value, dict] = field(default_factory=dict)

    # -- names ------------------------------------------------------------------------------------
    def lookup(self, name: str) -> Value:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        raise ModelError(f"{self.source}: value {name!r} is used but never defined")

    def bind(self, name: str, value: Value) -> None:
        self.scopes[-1][name] = value

    def unique(self, base: str) -> str:
        self.counter += 1
        return f"{base}__{self.counter}"

    def name_for(self, onnx_name: str) -> str:
        """The Value name for an ONNX name: itself, unless taken already (an inlined body
        runs once per unrolled iteration) or reserved by the top graph while nested."""
        name = onnx_name
        if name in self.taken or (self.nested and name in self.reserved):
            name = self.unique(onnx_name)
        self.taken.add(name)
        return name

    def constant(self, onnx_name: str, data: np.ndarray) -> Value:
        return Value.constant(self.name_for(onnx_name), np.asarray(data))

    # -- graphs -----------------------------------------------------------------------------------
    def import_graph(self, gp: onnx.GraphProto, input_shapes: dict[str, tuple], top: bool = False,
                     sub_inputs: list[TensorType] | None = None) -> Graph:  # fmt: skip
        outer_graph = self.graph
        self.scopes.append({})
        graph = Graph(gp.name or "main", [], [])
        self.graph = graph
        if top:
            self.top = graph
            self.reserved = {vi.name for vi in gp.input} | {t.name for t in gp.initializer}
            self.reserved.update(o for n in gp.node for o in n.output)
        else:
            self.nested += 1
        try:
            self._bind_initializers(gp)
            if top:
                self._bind_top_inputs(gp, input_shapes)
            else:
                for vi, t in zip(gp.input, sub_inputs or []):
                    v = Value(self.name_for(vi.name), t)
                    graph.inputs.append(v)
                    self.bind(vi.name, v)
            for index, node in enumerate(gp.node):
                self.convert(node, index)
            graph.outputs = [self.lookup(o.name) for o in gp.output]
            for o, v in zip(gp.output, graph.outputs):
                if not isinstance(v, Value):  # a sequence resolved at import time (`onnx_ops.StaticSequence`)
                    raise ModelError(f"{self.source}: output {o.name!r} of graph {graph.name!r} is a sequence: Ember "
                                     "graphs take and give tensors only (ConcatFromSequence makes one tensor)")
            if top:
                graph.decoders = {i: self.decoded[v] for i, v in enumerate(graph.outputs) if v in self.decoded}
        finally:
            self.scopes.pop()
            self.graph = outer_graph
            self.nested -= 0 if top else 1
        return graph

    def inline_graph(self, gp: onnx.GraphProto, args: list[Value] = ()) -> list[Value]:
        """Convert a subgraph's nodes into the current graph, its inputs bound to `args`
        (an If with a constant condition, one unrolled Loop iteration)."""
        self.scopes.append({})
        self.nested += 1
        try:
            for vi, v in zip(gp.input, args):
                self.bind(vi.name, v)
            self._bind_initializers(gp)
            for index, node in enumerate(gp.node):
                self.convert(node, index)
            return [self.lookup(o.name) for o in gp.output]
        finally:
            self.scopes.pop()
            self.nested -= 1

    def _bind_initializers(self, gp: onnx.GraphProto) -> None:
        for init in gp.initializer:
            if init.data_type == onnx.TensorProto.STRING:
                self.bind(init.name, self.strings(init.name, [b.decode("utf-8", "replace") for b in init.string_data],
                                                  tuple(init.dims)))  # fmt: skip
            else:
                self.bind(init.name, self.constant(init.name, tensor_to_array(init, self.source)))
        for sparse in gp.sparse_initializer:
            name = sparse.values.name
            self.bind(name, self.constant(name, sparse_to_array(sparse, self.source)))

    def strings(self, onnx_name: str, labels: list[str], shape: tuple[int, ...]) -> Value:
        """A constant string tensor: the indices of its elements into `labels`, which nodes that only move
        elements (`STRING_MOVERS`) pass on and the model returns decoded."""
        v = self.constant(onnx_name, np.arange(len(labels), dtype=np.int64).reshape(shape))
        self.decoded[v] = {"kind": "labels", "labels": labels}
        return v

    def _string_constant(self, proto: onnx.NodeProto) -> bool:
        """Bind a Constant node of strings (`strings`); False for any other node."""
        if proto.op_type != "Constant" or proto.domain not in ("", "ai.onnx"):
            return False
        for a in proto.attribute:
            if a.name == "value" and a.t.data_type == onnx.TensorProto.STRING:
                labels, shape = [b.decode("utf-8", "replace") for b in a.t.string_data], tuple(a.t.dims)
            elif a.name in ("value_string", "value_strings"):
                labels = [b.decode("utf-8", "replace") for b in ([a.s] if a.name == "value_string" else a.strings)]
                shape = () if a.name == "value_string" else (len(labels),)
            else:
                continue
            self.bind(proto.output[0], self.strings(proto.output[0], labels, shape))
            return True
        return False

    def _bind_top_inputs(self, gp: onnx.GraphProto, input_shapes: dict[str, tuple]) -> None:
        names = [vi.name for vi in gp.input]
        unknown = [n for n in list(input_shapes) + list(self.input_values) if n not in names]
        if unknown:
            raise ModelError(f"{self.source}: input_shapes/input_values name unknown input(s) {_name_list(unknown)}; "
                             f"the model's inputs are {_name_list(names, 20)}")  # fmt: skip
        missing = []
        for vi in gp.input:
            if vi.name in self.scopes[-1]:
                continue  # an initializer listed as an input (old IR): a constant with a default
            if vi.name in self.input_values:
                data = np.asarray(self.input_values[vi.name])
                self.bind(vi.name, self.constant(vi.name, data))
                continue
            t = input_type(vi, input_shapes.get(vi.name), self.source, self.sizes)
            if isinstance(t, str):
                missing.append(t)
                continue
            v = Value(self.name_for(vi.name), t)
            self.graph.inputs.append(v)
            self.bind(vi.name, v)
        if missing:
            example = ", ".join(f"{m.split()[0]}: (...)" for m in missing)
            raise ModelError(f"{self.source}: input(s) with unknown dims: {', '.join(missing)}. Ember compiles "
                             f"static shapes: pass input_shapes={{{example}}}")  # fmt: skip

    # -- nodes ------------------------------------------------------------------------------------
    @property
    def opset(self) -> int:
        """The default-domain (ai.onnx) opset version."""
        return self.opsets[""]

    def convert(self, proto: onnx.NodeProto, index: int, opsets: dict[str, int] | None = None) -> None:
        name = proto.name or f"{proto.op_type}_{index}"
        inputs = [self.lookup(n) if n else None for n in proto.input]
        while inputs and inputs[-1] is None:
            inputs.pop()
        if self._string_constant(proto):
            return
        version = op_version(proto, opsets or self.opsets)
        passed = [self.decoded[v] for v in inputs if v in self.decoded]
        if passed:
            proto = self._moving_strings(proto, name, inputs, passed)
        ctx = NodeContext(self, proto, name, inputs, decode_attrs(proto, self), version)
        try:
            self.convert_node(ctx)
        except ModelError:
            raise
        except Exception as e:  # a converter meeting a model it does not expect: say where
            raise ModelError(f"{self.source}: node {name!r} ({proto.op_type}) cannot be imported: "
                             f"{type(e).__name__}: {e}") from e  # fmt: skip
        if passed and proto.output:
            self.decoded[self.lookup(proto.output[0])] = passed[0]

    def _moving_strings(self, proto: onnx.NodeProto, name: str, inputs: list[Value | None],
                        passed: list[dict]) -> onnx.NodeProto:  # fmt: skip
        """A node reading values that stand for strings or maps (`decoded`): one that only moves the elements of
        its first input (`STRING_MOVERS`) moves the indices (a Cast to string is an Identity); others raise."""
        reads = [i for i, v in enumerate(inputs) if v in self.decoded]
        cast = proto.op_type == "Cast" and any(a.name == "to" and a.i == onnx.TensorProto.STRING
                                                for a in proto.attribute)  # fmt: skip
        if passed[0]["kind"] == "zipmap":
            ok, what = proto.op_type == "Identity", "a ZipMap's maps"
        else:
            ok, what = reads == [0] and (proto.op_type in STRING_MOVERS or cast), "strings"
        if not ok:
            raise ModelError(f"{self.source}: node {name!r} ({proto.op_type}) reads {what}, which Ember returns as "
                             "graph outputs and otherwise only moves (Identity, Reshape, Gather ...): it has no "
                             "string or map tensors")  # fmt: skip
        if cast:
            proto = onnx.helper.make_node("Identity", list(proto.input[:1]), list(proto.output[:1]), name=proto.name)
        return proto

    def add_node(self, op: str, inputs: list[Value | None], attrs: dict[str, Any], out_names: list[str],
                 name: str) -> list[Value]:  # fmt: skip
        """Add one Ember node (or fold it into constants); bind and return its outputs."""
        opdef = get_op(op)
        where = f"node {name!r} ({op})"
        try:
            opdef.check_arity(len(inputs), where)
            attrs = opdef.check_attrs(attrs, where)
        except AttrError as e:
            raise ModelError(f"{self.source}: {e}") from None
        present = [v for v in inputs if v is not None]
        all_const = all(v.is_constant for v in present)
        try:
            types = opdef.infer(attrs, *[None if v is None else v.type for v in inputs])
        except ShapeDependsOnData as e:
            if not (all_const and opdef.foldable):
                raise self._dynamic(where, str(e), present) from None
            types = None
        except Exception as e:
            if any(reads_values(v.type.shape) for v in present):  # sizes read at run time: unrelated at compile time
                raise self._dynamic(where, f"{type(e).__name__}: {e}; its input dims are read from values at run "
                                    "time, which the shape rule cannot relate", present) from None  # fmt: skip
            raise ModelError(f"{self.source}: {where}: {type(e).__name__}: {e}") from None
        if len(out_names) > (len(types) if types is not None else len(out_names)):
            raise ModelError(f"{self.source}: {where} has {len(out_names)} outputs, {op} defines {len(types)}")
        if types is not None and any(not t.is_static for t in types) or any(
                not v.type.is_static or v in self.shape_values for v in present):  # fmt: skip
            return self._add_symbolic(opdef, attrs, inputs, out_names, types, name)
        out_size = None if types is None else sum(t.size for t in types[: len(out_names)])
        in_size = sum(v.type.size for v in present if v.is_constant)
        keep = op == "DequantizeLinear"  # quantized weights stay integer for `passes.integer` (fold_constant: the rest)
        if opdef.foldable and not keep and (all_const or not opdef.reads_data) and (
                out_size is None or out_size <= max(self.fold_limit, in_size)):  # fmt: skip
            outs = self._fold(opdef, attrs, inputs, out_names, where)
        else:
            outs = [Value(self.name_for(n), t) for n, t in zip(out_names, types)]
            node = Node(op, inputs, outs, attrs, name)
            self.graph.nodes.append(node)
            self.producers.update(dict.fromkeys(outs, node))
        for n, v in zip(out_names, outs):
            self.bind(n, v)
        return outs

    def _add_symbolic(self, opdef, attrs: dict, inputs: list[Value | None], out_names: list[str],
                      types: tuple[TensorType, ...], name: str) -> list[Value]:  # fmt: skip
        """A node that reads or makes symbolic shapes: a node of the graph, unless it computes an int tensor whose
        elements are all known ints (a constant); its value in dims is kept in `shape_values` when known."""
        values = self._shape_value(opdef, attrs, inputs, types) if len(out_names) == 1 else None
        if values is not None and all(is_static_dim(d) for d in values.flat):
            outs = [self.constant(out_names[0], values.astype(types[0].np_dtype))]
        else:
            outs = [Value(self.name_for(n), t) for n, t in zip(out_names, types)]
            node = Node(opdef.name, inputs, outs, attrs, name)
            self.graph.nodes.append(node)
            self.producers.update(dict.fromkeys(outs, node))
            if values is not None:
                self.shape_values[outs[0]] = values
        for n, v in zip(out_names, outs):
            self.bind(n, v)
        return outs

    def _shape_value(self, opdef, attrs: dict, inputs: list[Value | None],
                     types: tuple[TensorType, ...]) -> np.ndarray | None:  # fmt: skip
        """The output of a shape computation as an object array of dims, or None when it is not one."""
        if not types or not types[0].is_static or not opdef.foldable:
            return None
        compare = COMPARISONS.get(opdef.name) if types[0].dtype == "bool" else None
        if compare is None and types[0].dtype not in ("int64", "int32"):
            return None
        if opdef.name == "Shape":
            dims = inputs[0].type.shape[attrs["start"] : attrs["end"]]
            return _dims_array(dims, (len(dims),))
        if opdef.name == "Size":
            return _dims_array([dim_product(inputs[0].type.shape)], ())
        args = []
        for v in inputs:
            if v is not None and not v.is_constant and v not in self.shape_values:
                return None
            args.append(None if v is None else self.shape_values.get(v, v.data))
        if compare is not None:
            return _decided(compare, args, types[0].shape)
        if opdef.name in SAME_ELEMENTS:
            out = args[0]  # the elements in order, reshaped to the output's shape below
        else:
            try:
                with np.errstate(all="ignore"):
                    out = np.asarray(opdef.reference(attrs, *[a if a is None else a.astype(object) for a in args])[0])
            except Exception:
                return None  # not shape arithmetic this importer can follow: the node computes it at run time
        try:
            return _dims_array(list(out.reshape(-1)), types[0].shape)
        except (TypeError, ValueError):
            return None

    def dims_of(self, v: Value) -> tuple[Dim, ...] | None:
        """The elements of an int tensor as dims: a constant's values or a symbolic shape value; None if unknown."""
        if v.is_constant:
            return tuple(int(x) for x in v.data.reshape(-1))
        values = self.shape_values.get(v)
        return None if values is None else tuple(values.reshape(-1))

    def value_sizes(self, v: Value, rule: str = "element", dims: tuple = (), count: int | None = None,
                    tag: str = "v", hi: int | None = None,
                    operands: list[Value | None] = ()) -> tuple[Dim, ...] | None:  # fmt: skip
        """Size variables read at run time from the values of `v` when it is a numeric graph input with a few
        elements (a shape operand fed as an input), by `ember.graph.dims.VALUE_RULES[rule]` against `dims`
        (`count` of them; default one per element; at most `hi`); None when `v` is no such input. A rule of
        several operands reads `operands` (`v` among them), each a graph input like `v`, a constant or None."""
        if rule == "element" and v in self.producers:
            known = self.symbolic_dims(v)
            if known is not None:
                return known
        source = self._readable(v, rule in ("nonzero", "compress", "unique", "unique_slices"))
        if source is None:
            return None
        read: list = []
        for o in operands:
            r = None if o is None or o.is_constant else source if o is v else self._readable(o, False)
            if o is not None and not o.is_constant and r is None:
                return None
            read.append(None if o is None else tuple(o.data.reshape(-1).tolist()) if o.is_constant else r)
        t = v.type
        if rule == "element" and v in self.shape_values:
            return tuple(self.shape_values[v].reshape(-1))
        base = "".join(c if c.isalnum() else "_" for c in v.name).lstrip("0123456789_") or "v"
        name = f"{base}_{tag}" if rule == "element" else self.unique(f"{base}_{tag}") + "_"
        n = t.size if count is None else count
        out = tuple(value_size_var(f"{name}{i}", source, i, rule, dims, hi, tuple(read)) for i in range(n))
        if rule == "element":
            self.shape_values[v] = _dims_array(list(out), t.shape)
        return out

    def symbolic_dims(self, v: Value) -> tuple[Dim, ...] | None:
        """The elements of an int value as dims: `dims_of`, or for one that nodes compute from small int inputs
        (`ComputedOperand`), those nodes followed with each input element a size read at run time (so that a size
        taken from one input element is one variable wherever the model uses it); None if unknown."""
        known = self.dims_of(v)
        if known is not None or v not in self.producers or not v.type.dtype.startswith("int"):
            return known
        computed = self._readable(v, False)
        if not isinstance(computed, ComputedOperand):
            return None
        env: dict[Value, np.ndarray] = {}
        for x in computed.inputs:
            if not x.type.dtype.startswith("int") or self.value_sizes(x) is None:
                return None
            env[x] = self.shape_values[x]
        for node in computed.nodes:
            opdef = get_op(node.op)
            args = [None if a is None else a.data.astype(object) if a.is_constant else env.get(a) for a in node.inputs]
            if any(a is None and x is not None for a, x in zip(args, node.inputs)) or not opdef.foldable:
                return None
            try:
                with np.errstate(all="ignore"):
                    outs = [args[0]] if node.op == "Cast" else opdef.reference(node.attrs, *args)
                env.update((o, _dims_array(list(np.asarray(r).reshape(-1)), o.type.shape))
                           for o, r in zip(node.outputs, outs))  # fmt: skip
            except Exception:
                return None  # not shape arithmetic on dims: the run time evaluates it (ComputedOperand)
        return tuple(env[v].reshape(-1)) if v in env else None

    def _readable(self, v: Value, count_of: bool) -> str | ComputedOperand | None:
        """What the run time reads `v`'s values from, when it can: the name of a numeric graph input of the top graph
        with a few elements (a count, `count_of`, reads any number of elements of any dtype), or the nodes that
        compute `v` from such inputs (`ember.ops.evaluate.ComputedOperand`); None when it cannot."""
        t = v.type
        if self.graph is not self.top or v.is_constant or t.dtype.startswith("str"):
            return None  # (a subgraph's values: the run time binds sizes once per call, before any body runs)
        if t.dtype == "bool" and not count_of or not all(is_static_dim(d) for d in t.shape):
            return None
        if not 0 < t.size <= (t.size if count_of else MAX_VALUE_SIZES):
            return None
        if v not in self.producers:
            return v.name if v in self.top.inputs else None
        return computed_operand(v, self.producers, self.top.inputs)

    def _fold(self, opdef, attrs: dict, inputs: list[Value | None], out_names: list[str], where: str) -> list[Value]:
        args = [None if v is None else (v.data if v.is_constant else _dummy(v.type)) for v in inputs]
        try:
            with np.errstate(all="ignore"):
                results = opdef.reference(attrs, *args)
        except Exception as e:
            raise ModelError(f"{self.source}: {where}: evaluating it on constant inputs failed: "
                             f"{type(e).__name__}: {e}") from None  # fmt: skip
        return [self.constant(n, np.array(r)) for n, r in zip(out_names, results)]

    def _dynamic(self, where: str, why: str, operands: list[Value]) -> DynamicShapeError:
        sources = sorted(set(self.graph_inputs_behind(operands)) | set(_value_sources(operands)))
        names = ", ".join(repr(s) for s in sources) or "(none)"
        return DynamicShapeError(
            f"{self.source}: {where}: {why}, and it is computed from graph input(s) {names}. Ember compiles "
            f"static shapes: bind those inputs with input_values={{name: array}}",
            sources,
        )

    def require_constant(self, ctx: NodeContext, index: int, what: str) -> np.ndarray:
        v = ctx.inputs[index] if index < len(ctx.inputs) else None
        if v is None:
            raise ModelError(f"{self.source}: node {ctx.name!r} ({ctx.op_type}) needs input {index} ({what})")
        if not v.is_constant:
            raise self._dynamic(f"node {ctx.name!r} ({ctx.op_type})", f"its {what} (input {index}) must be constant",
                                [v])  # fmt: skip
        return v.data

    def graph_inputs_behind(self, values: list[Value]) -> list[str]:
        """Names of the graph inputs (or body inputs) the given values are computed from."""
        seen, stack, found = set(), list(values), []
        while stack:
            v = stack.pop()
            if v in seen:
                continue
            seen.add(v)
            node = self.producers.get(v)
            if node is not None:
                stack.extend(node.present_inputs)
            elif not v.is_constant and v.name not in found:
                found.append(v.name)
        return sorted(found)


def _value_sources(values: list[Value]) -> list[str]:
    """The graph inputs that the sizes read at run time in the values' dims are read from."""
    out: dict[str, None] = {}
    for v in values:
        for var in size_vars(v.type.shape):
            for src in [getattr(var, "source", None), *getattr(var, "operands", ())]:
                names = [src] if isinstance(src, str) else [x.name for x in getattr(src, "inputs", ())]
                out.update(dict.fromkeys(n for n in names if n))
    return list(out)


def _decided(op: str, args: list, shape: tuple) -> np.ndarray | None:
    """A comparison of shape values (`shape == -1` before a Where, in exported Expand and Reshape targets), when
    every element's outcome holds for all sizes (`decide`); None otherwise."""
    if len(args) != 2 or any(x is None for x in args):
        return None
    a, b = np.broadcast_arrays(*[np.asarray(x, object) for x in args])
    out = [decide(op, x, y) for x, y in zip(a.reshape(-1), b.reshape(-1))]
    return None if None in out else np.array(out, object).reshape(shape)


def _dims_array(dims: list, shape: tuple) -> np.ndarray:
    out = np.empty(len(dims), object)
    out[:] = [simplify_dim(d) if not is_static_dim(d) else int(d) for d in dims]
    return out.reshape(shape)


def _dummy(t: TensorType) -> np.ndarray:
    """A zero-stride stand-in array with the right shape and dtype (for type-only ops)."""
    return np.broadcast_to(np.zeros((), t.np_dtype), t.shape)


@dataclass
class NodeContext:
    """What a converter sees of one ONNX node."""

    importer: Importer
    proto: onnx.NodeProto
    name: str
    inputs: list[Value | None]
    attrs: dict[str, Any]
    version: int  # the operator's schema version (since_version) used by this model

    @property
    def op_type(self) -> str:
        return self.proto.op_type

    @property
    def out_names(self) -> list[str]:
        outs = list(self.proto.output)
        while outs and not outs[-1]:
            outs.pop()
        return [o or f"{self.name}:unused{i}" for i, o in enumerate(outs)]

    def input(self, i: int) -> Value | None:
        return self.inputs[i] if i < len(self.inputs) else None

    def type(self, i: int) -> TensorType:
        v = self.input(i)
        if v is None:
            raise ModelError(f"{self.importer.source}: node {self.name!r} ({self.op_type}) lacks input {i}")
        return v.type

    def const(self, i: int) -> np.ndarray | None:
        """The value of input i when it is a constant, else None (also when absent)."""
        v = self.input(i)
        return v.data if v is not None and v.is_constant else None

    def need(self, i: int, what: str) -> np.ndarray:
        """The value of input i, which must be a constant (else DynamicShapeError)."""
        return self.importer.require_constant(self, i, what)

    def need_dims(self, i: int, what: str, runtime: bool = False) -> tuple[Dim, ...]:
        """The elements of int input i as dims: a constant, or computed from symbolic shapes (Shape -> Concat);
        with `runtime`, a graph input's elements as sizes read at run time (`Importer.value_sizes`)."""
        v = self.input(i)
        dims = None if v is None else self.importer.symbolic_dims(v)
        if dims is None and v is not None and runtime:
            dims = self.importer.value_sizes(v)
        return dims if dims is not None else tuple(int(x) for x in self.need(i, what).reshape(-1))

    def emit(self, op: str, inputs: list[Value | None], attrs: dict | None = None, n_out: int = 1) -> list[Value]:
        """Add a helper node (for multi-node conversions); returns its outputs."""
        names = [self.importer.unique(f"{self.name}/{op}") for _ in range(n_out)]
        return self.importer.add_node(op, inputs, attrs or {}, names, f"{self.name}/{op}")

    def error(self, message: str) -> ModelError:
        return ModelError(f"{self.importer.source}: node {self.name!r} ({self.op_type}): {message}")


# -- attributes and tensors ---------------------------------------------------------------------------
def tensor_to_array(t: onnx.TensorProto, source: str) -> np.ndarray:
    onnx_dtype(t.data_type, f"{source}: tensor {t.name!r}")
    try:
        return np.array(numpy_helper.to_array(t))
    except Exception as e:
        raise ModelError(f"{source}: tensor {t.name!r} cannot be read: {first_line(e)}") from None


def sparse_to_array(sp: onnx.SparseTensorProto, source: str) -> np.ndarray:
    values = tensor_to_array(sp.values, source)
    indices = tensor_to_array(sp.indices, source).astype(np.int64)
    dense = np.zeros(tuple(sp.dims), values.dtype)
    if indices.ndim == 1:
        dense.reshape(-1)[indices] = values
    else:
        dense[tuple(indices.T)] = values
    return dense


def decode_attrs(proto: onnx.NodeProto, importer: Importer) -> dict[str, Any]:
    A = onnx.AttributeProto
    out: dict[str, Any] = {}
    for a in proto.attribute:
        if a.ref_attr_name:
            raise ModelError(f"{importer.source}: node {proto.name!r}: unresolved attribute reference {a.name!r}")
        if a.type == A.INT:
            out[a.name] = int(a.i)
        elif a.type == A.FLOAT:
            out[a.name] = float(a.f)
        elif a.type == A.STRING:
            out[a.name] = a.s.decode("utf-8", "replace")
        elif a.type == A.INTS:
            out[a.name] = tuple(int(i) for i in a.ints)
        elif a.type == A.FLOATS:
            out[a.name] = tuple(float(f) for f in a.floats)
        elif a.type == A.STRINGS:
            out[a.name] = tuple(s.decode("utf-8", "replace") for s in a.strings)
        elif a.type == A.TENSOR:
            out[a.name] = tensor_to_array(a.t, importer.source)
        elif a.type == A.SPARSE_TENSOR:
            out[a.name] = sparse_to_array(a.sparse_tensor, importer.source)
        elif a.type == A.GRAPH:
            out[a.name] = a.g  # converters that take subgraphs import them with their input types
        elif a.type == A.TYPE_PROTO:
            out[a.name] = a.tp
        else:
            raise ModelError(f"{importer.source}: node {proto.name!r}: attribute {a.name!r} has an unsupported kind")
    return out
