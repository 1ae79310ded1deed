"""PyTorch frontend: `from_torch(module, example_inputs)` and `from_exported_program(ep) -> Graph`.

What import does, in order:
  1. `torch.export.export` the module (in eval mode) on the example inputs, then `run_decompositions()` to
     the core ATen opset: one flat FX graph of ATen calls whose placeholders are the weights (parameters,
     buffers, lifted constants) and the user inputs;
  2. scan every call: if any ATen op has no converter, raise ONE `UnsupportedOperatorError` listing each op
     with the module paths (`nn_module_stack`) that use it;
  3. weights become constants, user inputs become graph inputs (named as in `forward`);
  4. convert the calls one by one with the table `CONVERTERS` (ATen op name -> converter, in
     `ember.frontend.torch_ops`), onto the existing Ember ops: convolution -> Conv, addmm -> Gemm,
     native_layer_norm -> LayerNormalization, index -> Gather or GatherND, ... Scalars become constants of the
     dtype torch computes in (type promotion follows the result dtypes that export recorded on every node,
     `node.meta["val"]`).

A dim declared dynamic with `torch.export.Dim` is bound to a size: the one `input_shapes` gives for that input,
else the example's, with a warning that says so; every size expression of the program (view sizes, expand sizes,
...) is evaluated under that binding. With `symbolic=True` (ember.compile's `dynamic=True` or `dynamic_bounds=`)
it stays symbolic instead: each of export's size symbols becomes an Ember size variable (`ember.graph.dims`)
named after its `Dim` (or `<input>_<axis>`), within the range export recorded for it (narrowed by
`dynamic_bounds`), and the program's size expressions become expressions of them.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import sympy
import torch
from torch import fx

from ember.frontend import torch_complex  # noqa: F401  (registers the converters of complex tensors)
from ember.frontend.onnx_importer import ModelError, UnsupportedOperatorError
from ember.frontend.torch_ops import (
    CONVERTERS,
    Ctx,
    converter_of,
    is_complex,
    module_path,
    torch_dtype_name,
    touches_complex,
)
from ember.graph.dims import Dim, SizeVar, SizeVars, simplify_dim, size_vars
from ember.graph.ir import Graph, Node, Value, unique_name
from ember.graph.types import TensorType
from ember.ops import get_op
from ember.ops.verify import verify as verify_graph
from ember.tir.expr import Expr, binop

__all__ = ["CONVERTERS", "ModelError", "UnsupportedOperatorError", "export", "from_exported_program", "from_torch"]

def export(module: torch.nn.Module, example_inputs: Any, dynamic_shapes: Any = None) -> torch.export.ExportedProgram:
    """`torch.export` of `module` in eval mode (its mode is restored after) on `example_inputs`: a tensor, a tuple
    of positional arguments, or a dict of keyword arguments."""
    if isinstance(example_inputs, Mapping):
        args, kwargs = (), dict(example_inputs)
    elif isinstance(example_inputs, torch.Tensor):
        args, kwargs = (example_inputs,), {}
    elif isinstance(example_inputs, Sequence):
        args, kwargs = tuple(example_inputs), {}
    else:
        raise TypeError("ember.compile(module, example_inputs): example_inputs must be a tensor, a tuple of "
                        f"arguments or a dict of keyword arguments, got {type(example_inputs).__name__}")
    training = module.training
    module.eval()
    try:
        with torch.no_grad():
            return torch.export.export(module, args, kwargs, dynamic_shapes=dynamic_shapes)
    finally:
        module.train(training)


def from_torch(module: torch.nn.Module, example_inputs: Any, dynamic_shapes: Any = None,
               input_shapes: Mapping[str, tuple[int, ...]] | None = None, symbolic: bool = False,
               dynamic_bounds: Mapping[str, tuple[int, int | None]] | None = None) -> Graph:  # fmt: skip
    """Import an `nn.Module` through `torch.export` (see `export`) as an Ember graph; `symbolic` keeps the dims
    `dynamic_shapes` declares (`torch.export.Dim`) symbolic, named as their Dims."""
    if example_inputs is None:
        raise TypeError(f"ember.compile: a {type(module).__name__} module needs example inputs: "
                        "ember.compile(module, example_inputs) (a tensor, a tuple or a dict of keyword arguments)")
    return from_exported_program(export(module, example_inputs, dynamic_shapes), input_shapes,
                                 name=type(module).__name__, symbolic=symbolic, dynamic_bounds=dynamic_bounds,
                                 dim_names=dim_names(example_inputs, dynamic_shapes))  # fmt: skip


def from_exported_program(ep: torch.export.ExportedProgram, input_shapes: Mapping[str, tuple[int, ...]] | None = None,
                          name: str = "torch", frozen_inputs: Mapping[int, torch.Tensor] | None = None,
                          verify: bool = True, symbolic: bool = False,
                          dynamic_bounds: Mapping[str, tuple[int, int | None]] | None = None,
                          dim_names: Mapping[tuple[int, int], str] | None = None) -> Graph:  # fmt: skip
    """Import an ExportedProgram (decomposed to the core ATen opset here) as an Ember graph.

    input_shapes: sizes for the dims declared dynamic (`torch.export.Dim`), by input name.
    frozen_inputs: user inputs (by position) to import as constants of these values (the weights that
        torch.compile passes as graph inputs).
    symbolic: dynamic dims stay symbolic (size variables within export's ranges and `dynamic_bounds`, by name);
        `dim_names` names them by (user input position, axis), else they are named `<input>_<axis>`."""
    ep = ep.run_decompositions(decompositions())
    sizes = SymbolicSizes(ep, dynamic_bounds, dim_names) if symbolic else None
    return TorchImporter(ep, name, dict(input_shapes or {}), dict(frozen_inputs or {}), sizes).run(verify)


def dim_names(example_inputs: Any, dynamic_shapes: Any) -> dict[tuple[int, int], str]:
    """(user input position, axis) -> the name of the `torch.export.Dim` that `dynamic_shapes` gives it (a tuple or
    list per positional argument, or a dict by argument name in the order of the example's keywords)."""
    names: dict[tuple[int, int], str] = {}
    for position, spec in enumerate(_tensor_specs(dynamic_shapes)):
        items = spec.items() if isinstance(spec, Mapping) else enumerate(spec or ())
        for axis, dim in items:
            name = getattr(dim, "__name__", None)
            if name is not None and name.isidentifier():
                names[(position, int(axis))] = name
    return names


def _tensor_specs(spec: Any) -> list:
    """`dynamic_shapes` flattened to one spec per tensor input, as export flattens the inputs: a tensor's spec is
    None, a dict {axis: Dim} or a sequence of Dims/None; anything else nests (a tuple of *args, a dict by name)."""
    if spec is None or isinstance(spec, Mapping) and all(isinstance(k, int) for k in spec):
        return [spec]
    if isinstance(spec, list | tuple) and all(d is None or hasattr(d, "__name__") for d in spec):
        return [spec]
    items = spec.values() if isinstance(spec, Mapping) else spec
    return [leaf for s in items for leaf in _tensor_specs(s)]


class SymbolicSizes:
    """Export's size symbols as Ember size variables: one per symbol, named by `names` (or `<input>_<axis>` of the
    first input dim that is the bare symbol), bounded by export's range (its lower bound is what the program was
    traced for: 0/1 specialization makes it 2 for most dims) narrowed by `bounds` (by name)."""

    def __init__(self, ep: torch.export.ExportedProgram, bounds: Mapping | None, names: Mapping | None):
        self.ranges = ep.range_constraints
        self.vars = SizeVars(dict(bounds or {}))
        self.names = dict(names or {})
        self.of: dict[sympy.Symbol, SizeVar] = {}

    def declare(self, symbol: sympy.Symbol, position: int, axis: int, input_name: str) -> None:
        if symbol in self.of:
            return
        name = self.names.get((position, axis), f"{input_name}_{axis}")
        r = self.ranges.get(symbol)
        lo = int(r.lower) if r is not None and r.lower.is_integer else 0
        hi = int(r.upper) if r is not None and r.upper.is_integer and r.upper.is_finite else None
        if name in self.vars.bounds:
            blo, bhi = self.vars.bounds[name]
            if blo < lo:
                raise ModelError(f"dynamic_bounds[{name!r}] = ({blo}, {bhi}): torch.export traced the program for "
                                 f"{name} >= {lo} (it specializes sizes 0 and 1); give {name} a Dim with min={blo} "
                                 f"or a lower bound of at least {lo}")  # fmt: skip
            lo, hi = blo, bhi if hi is None else hi if bhi is None else min(hi, bhi)
        self.vars.bounds[name] = (lo, hi)
        self.of[symbol] = self.vars(name)

    def dim(self, expr: sympy.Expr) -> Dim:
        """A sympy size expression of declared symbols as an Ember dim."""
        return simplify_dim(_sympy_dim(sympy.sympify(expr), self.of))


def _sympy_dim(e: sympy.Expr, of: Mapping[sympy.Symbol, SizeVar]) -> Any:
    from torch.utils._sympy import functions as fn

    args = [_sympy_dim(a, of) for a in e.args]
    if e.is_Integer:
        return int(e)
    if e.is_Symbol:
        if e not in of:
            raise ModelError(f"the size {e} is no input's dim (a size computed from data?)")
        return of[e]
    if isinstance(e, sympy.Add):
        return sum(args[1:], args[0])
    if isinstance(e, sympy.Mul):
        out = args[0]
        for a in args[1:]:
            out = out * a
        return out
    if isinstance(e, fn.FloorDiv):
        return args[0] // args[1]
    if isinstance(e, fn.CeilDiv):
        return (args[0] + args[1] - 1) // args[1]
    if isinstance(e, fn.Mod | fn.PythonMod | sympy.Mod):
        return args[0] % args[1]
    if isinstance(e, fn.Max | fn.Min | sympy.Max | sympy.Min):
        op = "max" if isinstance(e, fn.Max | sympy.Max) else "min"
        out = args[0]
        for a in args[1:]:
            out = binop(op, out, a)
        return out
    raise ModelError(f"the size expression {e} ({type(e).__name__}) has no Ember equivalent")


def decompositions() -> dict:
    """torch.export's table to the core ATen opset, less scaled_dot_product_attention: `torch_ops` decomposes
    that one itself (torch's decomposition of it breaks models that `view` its output, such as GPT-2)."""
    table = torch.export.default_decompositions()
    for op in list(table):
        if "scaled_dot_product" in str(op):
            del table[op]
    return table


# -- the importer ----------------------------------------------------------------------------------------
class TorchImporter:
    """One ExportedProgram to one Graph: `env` maps each FX node to its Value (a list of Values for ops with
    several results, a Python value for size arithmetic and constant arguments)."""

    def __init__(self, ep: torch.export.ExportedProgram, name: str, input_shapes: dict, frozen: dict,
                 sizes: SymbolicSizes | None = None):  # fmt: skip
        self.ep, self.name, self.input_shapes, self.frozen, self.sizes = ep, name, input_shapes, frozen, sizes
        self.graph = Graph(name, [], [])
        self.env: dict[fx.Node, Any] = {}
        self.bindings: dict[Any, int] = {}  # sympy symbol of a dynamic dim -> its size
        self.taken: set[str] = set()

    # -- values ----------------------------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        return unique_name(base, self.taken)

    def const(self, data: Any, dtype: str | None = None, name: str = "const") -> Value:
        array = np.asarray(data, dtype=dtype)
        return Value(self.fresh(name), TensorType.of(array), array)

    def static(self, x: Any) -> Any:
        """A size, or a list of sizes, as Python ints: symbolic ones evaluated under the bound dims."""
        if isinstance(x, list | tuple):
            return type(x)(self.static(v) for v in x)
        if isinstance(x, torch.SymInt | torch.SymFloat | torch.SymBool):
            value = sympy.sympify(x.node.expr).xreplace(self.bindings)
            if not value.is_number and self.sizes is not None and isinstance(x, torch.SymInt):
                try:
                    return self.sizes.dim(value)  # a symbolic size: an Ember dim
                except ModelError as e:
                    raise ModelError(f"{self.name}: {e}") from None
            if not value.is_number:
                raise ModelError(f"{self.name}: the size {x.node.expr} depends on dims that no input binds")
            return {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(x)](value)
        if isinstance(x, fx.Node):
            return self.static(self.env[x])
        return x

    def value(self, arg: Any, dtype: str | None = None) -> Value:
        """The Value of an FX argument: a node's, or a Python scalar as a constant of `dtype`."""
        if isinstance(arg, fx.Node):
            v = self.env[arg]
            if isinstance(v, Value):
                return v if dtype is None or v.dtype == dtype else self.cast(v, dtype)
            arg = v
        if isinstance(arg, bool | int | float | torch.SymInt | torch.SymFloat | Expr):
            arg = self.static(arg)
            if isinstance(arg, Expr):  # a symbolic size used as data: computed from the sizes at run time
                return self.cast(self.size_value(arg), dtype or "int64")
            return self.const(arg, dtype or ("bool" if isinstance(arg, bool) else
                                             "int64" if isinstance(arg, int) else "float32"))  # fmt: skip
        raise ModelError(f"{self.name}: expected a tensor or a number, got {arg!r}")

    def size_value(self, dim: Expr) -> Value:
        """A 0-d int64 tensor holding a symbolic size's value, read from the shapes of the inputs that hold its
        size variables."""
        holders = []
        for var in size_vars([dim]):
            holder = next((v for v in self.graph.inputs if var in size_vars(v.shape)), None)
            if holder is None:
                raise ModelError(f"{self.name}: the size {dim} uses {var.name}, which no input's shape holds")
            if holder not in holders:
                holders.append(holder)
        return self.add1("SizeValue", holders, {"values": (dim,), "shape": ()}, "size")

    def add(self, op: str, inputs: list[Value | None], attrs: dict | None = None, name: str = "v",
            outputs: int = 1) -> list[Value]:  # fmt: skip
        """Append one Ember node (its output types from the op's shape rule) and return its outputs."""
        opdef = get_op(op)
        where = f"node {name!r} ({op})"
        attrs = opdef.check_attrs(dict(attrs or {}), where)
        try:
            types = opdef.infer(attrs, *[None if v is None else v.type for v in inputs])
        except Exception as e:
            raise ModelError(f"{self.name}: {where}: {type(e).__name__}: {e}") from None
        outs = [Value(self.fresh(name if i == 0 else f"{name}_{i}"), t) for i, t in enumerate(types[:outputs])]
        self.graph.nodes.append(Node(op, inputs, outs, attrs, outs[0].name))
        return outs

    def add1(self, op: str, inputs: list[Value | None], attrs: dict | None = None, name: str = "v") -> Value:
        return self.add(op, inputs, attrs, name)[0]

    def cast(self, v: Value, dtype: str) -> Value:
        return v if v.dtype == dtype else self.add1("Cast", [v], {"to": dtype}, f"{v.name}_{dtype}")

    # -- the program -----------------------------------------------------------------------------------
    def run(self, verify: bool) -> Graph:
        gm = self.ep.graph_module
        self.check_supported(gm.graph)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        specs = self.ep.graph_signature.input_specs
        if len(specs) != len(placeholders):
            raise ModelError(f"{self.name}: {len(placeholders)} placeholders but {len(specs)} input specs")
        user = 0
        for node, spec in zip(placeholders, specs):
            kind = spec.kind.name
            if kind in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR"):
                t = self.ep.state_dict[spec.target] if spec.target in self.ep.state_dict else self.ep.constants[
                    spec.target]
                self.env[node] = self.weight(t, spec.target)
            elif kind == "USER_INPUT":
                self.user_input(node, spec, user)
                user += 1
            else:
                raise ModelError(f"{self.name}: input {node.name!r} of kind {kind} is not supported")
        for node in gm.graph.nodes:
            if node.op == "call_function":
                self.call(node)
            elif node.op == "output":
                self.outputs(node)
        if verify:
            verify_graph(self.graph)
        return self.graph

    def weight(self, t: torch.Tensor, target: str) -> Value:
        array = t.detach().cpu().contiguous().numpy().copy() if t.dtype != torch.bfloat16 else (
            t.detach().float().numpy().astype(TensorType((), "bfloat16").np_dtype))  # fmt: skip
        return Value(self.fresh(target.replace(".", "_")), TensorType.of(array), array)

    def user_input(self, node: fx.Node, spec, position: int) -> None:
        arg = spec.arg
        if not hasattr(arg, "name") or not isinstance(node.meta.get("val"), torch.Tensor):
            self.env[node] = getattr(arg, "value", node.meta.get("val"))  # a constant argument (use_cache=False)
            return
        if position in self.frozen:
            self.env[node] = self.weight(self.frozen[position], node.name)
            return
        fake = node.meta["val"]
        if fake.is_complex():
            raise ModelError(f"{self.name}: input {node.name!r} is complex ({fake.dtype}); pass "
                             "torch.view_as_real of it and torch.view_as_complex it in the model")  # fmt: skip
        given = self.input_shapes.get(node.name)
        if given is not None and len(given) != fake.dim():
            raise ModelError(f"{self.name}: input_shapes[{node.name!r}] has rank {len(given)}, the input has "
                             f"rank {fake.dim()}")  # fmt: skip
        for i, d in enumerate(fake.shape):
            if isinstance(d, torch.SymInt) and given is None and self.sizes is not None:
                if d.node.expr.is_Symbol:
                    self.sizes.declare(d.node.expr, position, i, node.name)  # stays symbolic
            elif isinstance(d, torch.SymInt):
                size = int(given[i]) if given is not None else int(d.node.hint)
                if d.node.expr.is_Symbol and d.node.expr not in self.bindings:
                    self.bindings[d.node.expr] = sympy.Integer(size)
                    warnings.warn(f"ember: dim {i} of input {node.name!r} is dynamic ({d.node.expr}); Ember graphs "
                                  f"have static shapes, so it is bound to {size} (input_shapes= picks another size)",
                                  stacklevel=4)  # fmt: skip
        shape = tuple(self.static(list(fake.shape)))
        v = Value(self.fresh(node.name), TensorType(shape, torch_dtype_name(fake.dtype)))
        self.graph.inputs.append(v)
        self.env[node] = v

    def outputs(self, node: fx.Node) -> None:
        user = [arg for spec, arg in zip(self.ep.graph_signature.output_specs, node.args[0])
                if spec.kind.name == "USER_OUTPUT"]  # fmt: skip
        names = output_names(self.ep, len(user))
        for arg, name in zip(user, names):
            if is_complex(arg):
                raise ModelError(f"{self.name}: output {name or arg.name!r} is complex ({arg.meta['val'].dtype}); "
                                 "return torch.view_as_real of it")  # fmt: skip
            v = self.value(arg)
            if v.is_constant or v in self.graph.inputs or v in self.graph.outputs:
                v = self.add1("Identity", [v], name=f"{v.name}_out")
            if name is not None and name not in self.taken:
                self.taken.discard(v.name)
                v.name = self.fresh(name)
            self.graph.outputs.append(v)

    def check_supported(self, graph: fx.Graph) -> None:
        """Raise one error listing every ATen op without a converter and the module paths that use it."""
        missing: dict[str, list[str]] = {}
        for node in graph.nodes:
            if node.op == "call_function" and converter_of(node) is None:
                where = module_path(node)
                users = missing.setdefault(str(node.target) + (" on complex tensors" if touches_complex(node) else ""),
                                           [])  # fmt: skip
                if where not in users:
                    users.append(where)
        if missing:
            raise UnsupportedOperatorError(f"{self.name} (torch.export, core ATen)", missing)

    def call(self, node: fx.Node) -> None:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor | list | tuple) and node.target is not operator.getitem:
            self.env[node] = self.static(val)  # size arithmetic (sym_size, operator.mul on sizes) or a scalar
            return
        fn = converter_of(node)
        assert fn is not None, node.target
        try:
            result = fn(Ctx(self, node))
        except ModelError:
            raise
        except Exception as e:
            raise ModelError(f"{self.name}: converting {node.name!r} ({node.target}) at {module_path(node)}: "
                             f"{type(e).__name__}: {e}") from e  # fmt: skip
        self.env[node] = result


def output_names(ep: torch.export.ExportedProgram, count: int) -> list[str | None]:
    """Names for the flat outputs from the structure `forward` returns: 'logits', 'last_hidden_state',
    'output_0'... (None where the structure cannot be rebuilt)."""
    from torch.utils import _pytree as pytree

    try:
        tree = pytree.tree_unflatten(list(range(count)), ep.call_spec.out_spec)
        paths = [path for path, _ in pytree.tree_flatten_with_path(tree)[0]]
    except Exception:
        return [None] * count
    names = []
    for path in paths:
        keys = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", "")))) for k in path]
        names.append("_".join(keys) if keys and not keys[0].isdigit() else "output_" + "_".join(keys or ["0"]))
    return names if len(names) == count else [None] * count
