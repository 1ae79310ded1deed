"""ONNX frontend: `from_onnx(model) -> Graph`.

What import does, in order:
  1. load the file (or take a ModelProto) and run `onnx.checker`; failures raise `ModelError`
     naming the file and the problem (never a raw protobuf traceback);
  2. inline model-local functions, then scan every node: if any operator is unsupported,
     raise ONE `UnsupportedOperatorError` listing each operator and the nodes using it;
  3. give every graph input a static shape: from the model, else from `input_shapes`.
     A symbolic *leading* dim (the batch) defaults to 1; any other unknown dim is an
     error naming the input and asking for `input_shapes`;
  4. turn initializers into constants and convert nodes one by one. Each converter
     (`ember.frontend.onnx_ops`) maps ONNX's version differences onto Ember's normalized
     attributes (axes, pads, sizes become attributes); ops that ONNX defines as functions
     and Ember lacks are expanded from their function body;
  5. fold constants as it goes: a node whose inputs are all constants is evaluated with
     its numpy reference, so exporters' shape arithmetic (Shape -> Gather -> Concat ->
     Reshape) becomes static shapes.

Ember compiles static shapes. An operand that must be known at compile time (a Reshape
target, Slice bounds, the input of NonZero, ...) but is computed from a graph input raises
`DynamicShapeError`, which names those graph inputs: bind them with `input_values=`.

This module is the entry point; the importer (scopes, names, folding) is `ember.frontend.onnx_importer`,
the converters `ember.frontend.onnx_ops` and `ember.frontend.onnx_functions`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
import onnx

from ember.frontend import onnx_contrib, onnx_ops
from ember.frontend.onnx_importer import (
    MAX_OPSET,
    ONNX_DTYPES,
    DynamicShapeError,
    Importer,
    ModelError,
    NodeContext,
    UnsupportedOperatorError,
    first_line,
)
from ember.graph.dims import SizeVars
from ember.graph.ir import Graph
from ember.ops import OPS
from ember.ops.verify import verify as verify_graph

# Fold a node with constant inputs when its outputs hold at most this many elements, or no
# more than its constant inputs do (a Cast or Transpose of weights), so that folding never
# inflates the model (an Expand of a scalar to a huge shape stays a node).
FOLD_LIMIT = 1 << 20

__all__ = [
    "OPS", "ONNX_DTYPES", "DynamicShapeError", "ModelError", "NodeContext", "UnsupportedOperatorError", "from_onnx",
    "load_model",
]  # fmt: skip


# -- loading --------------------------------------------------------------------------------------
def load_model(model: str | os.PathLike | onnx.ModelProto | bytes) -> tuple[onnx.ModelProto, str]:
    """(checked ModelProto, a name for messages). Raises ModelError on any loading problem."""
    if isinstance(model, onnx.ModelProto):
        proto, source = model, f"model {model.graph.name or '<unnamed>'!r}"
    elif isinstance(model, bytes):
        proto, source = _parse(model, "<bytes>"), "<bytes>"
    else:
        path = os.fspath(model)
        source = path
        if not os.path.isfile(path):
            raise ModelError(f"{path}: no such file")
        try:
            proto = onnx.load_model(path, load_external_data=False)
        except Exception as e:
            raise ModelError(
                f"{path}: not a readable ONNX model (corrupt or truncated file?): {first_line(e)}"
            ) from None
        try:
            onnx.external_data_helper.load_external_data_for_model(proto, os.path.dirname(path) or ".")
        except Exception as e:
            raise ModelError(f"{path}: cannot load external weight data: {first_line(e)}") from None
    if not proto.HasField("graph") or not proto.opset_import:
        raise ModelError(f"{source}: not an ONNX model (no graph or no opset_import; corrupt or truncated file?)")
    retagged = onnx_contrib.claim_default_domain_ops(proto)
    # A graph input or output typed without a shape (`make_tensor_value_info(name, dtype, None)`: rank unknown)
    # fails the checker, yet onnxruntime runs it and the importer infers the shape; the check sees a
    # placeholder shape there, taken off again after it.
    unshaped = [v.type.tensor_type for v in (*proto.graph.input, *proto.graph.output)
                if v.type.HasField("tensor_type") and not v.type.tensor_type.HasField("shape")]
    try:
        if not isinstance(model, onnx.ModelProto | bytes) and not retagged and not unshaped:
            onnx.checker.check_model(os.fspath(model))  # by path: handles external data and > 2 GiB
        elif proto.ByteSize() < 2**31:
            for t in unshaped:
                t.shape.dim.add().dim_param = "unknown"
            try:
                onnx.checker.check_model(proto)
            finally:
                for t in unshaped:
                    t.ClearField("shape")
    except Exception as e:
        raise ModelError(f"{source}: the model fails the ONNX checker: {first_line(e)}") from None
    return proto, source


def _parse(data: bytes, source: str) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as e:
        raise ModelError(f"{source}: not a readable ONNX model (corrupt or truncated?): {first_line(e)}") from None
    return proto


# -- public entry point ---------------------------------------------------------------------------------
def from_onnx(
    model: str | os.PathLike | onnx.ModelProto,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    *,
    input_values: Mapping[str, np.ndarray] | None = None,
    verify: bool = True,
    symbolic: bool = False,
    dynamic_bounds: Mapping[str, tuple[int, int | None]] | None = None,
) -> Graph:
    """Import an ONNX model (path or ModelProto) as an Ember graph.

    input_shapes: shapes for inputs whose dims the model leaves symbolic (this specializes them).
    input_values: graph inputs to bind to fixed values; they become constants (this is how
        operands that must be static, such as a Reshape target fed as an input, are given).
    symbolic: keep the model's symbolic dims as size variables (`ember.graph.dims`), one per dim_param
        name, bounded by `dynamic_bounds` ({"S": (1, 512)}; default [1, inf)). Without it, a symbolic leading
        dim is 1 and any other symbolic dim is an error asking for `input_shapes`.
    """
    proto, source = load_model(model)
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in proto.opset_import}
    opsets[""] = _default_opset(proto, source)
    if proto.functions:
        proto = onnx.inliner.inline_local_functions(proto)
    unsupported = onnx_ops.find_unsupported(proto.graph, opsets)
    if unsupported:
        raise UnsupportedOperatorError(source, unsupported)
    if dynamic_bounds and not symbolic:
        raise ValueError("from_onnx: dynamic_bounds is given but symbolic=False (the dims would be specialized)")
    importer = Importer(source, opsets, dict(input_values or {}), onnx_ops.convert_node, FOLD_LIMIT)
    importer.sizes = SizeVars(_check_bounds(dynamic_bounds)) if symbolic else None
    graph = importer.import_graph(proto.graph, dict(input_shapes or {}), top=True)
    unused = importer.sizes.unused_bounds() if importer.sizes else []
    if unused:
        names = ", ".join(sorted(importer.sizes.vars)) or "none"
        raise ValueError(f"{source}: dynamic_bounds names {', '.join(map(repr, unused))}, which no input dim uses "
                         f"(the model's symbolic dims: {names})")
    if verify:
        verify_graph(graph)
    return graph


def _check_bounds(bounds: Mapping[str, tuple[int, int | None]] | None) -> dict[str, tuple[int, int | None]]:
    out = {}
    for name, b in (bounds or {}).items():
        if not (isinstance(b, tuple | list) and len(b) == 2):
            raise ValueError(f"dynamic_bounds[{name!r}] = {b!r}: give (lo, hi), hi None for unbounded")
        out[name] = (int(b[0]), None if b[1] is None else int(b[1]))
    return out


def _default_opset(proto: onnx.ModelProto, source: str) -> int:
    versions = {o.domain: o.version for o in proto.opset_import}
    opset = versions.get("", versions.get("ai.onnx", 0))
    if opset > MAX_OPSET:
        raise ModelError(f"{source}: opset {opset} is newer than this onnx ({onnx.__version__}) supports ({MAX_OPSET})")
    return opset or MAX_OPSET
