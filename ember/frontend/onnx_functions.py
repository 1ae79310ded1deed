"""Expansion of ONNX functions: operators that ONNX defines by a function body (Celu,
LayerNormalization's reference, Attention, FlexAttention, ...) and that Ember has no entry
for are imported by inlining that body, with names made unique and `@attribute`
references resolved."""

from __future__ import annotations

import itertools

import onnx

from ember.frontend.onnx_importer import ONNX_DTYPES, NodeContext, get_schema, normal_domain


def elem_of(dtype: str) -> int:
    """The ONNX element type of an Ember dtype."""
    return next(k for k, d in ONNX_DTYPES.items() if d == dtype)


def expand_function(ctx: NodeContext) -> None:
    """Inline the ONNX function body of an operator Ember has no entry for."""
    imp = ctx.importer
    schema = get_schema(ctx.op_type, ctx.proto.domain, imp.opsets)
    fn = _function_body(ctx, schema)
    if fn is None:
        raise ctx.error("operator has no Ember implementation and no ONNX function body")
    body_opsets = dict(imp.opsets)
    body_opsets.update({normal_domain(o.domain): o.version for o in fn.opset_import})
    prefix = imp.unique(ctx.name)
    rename: dict[str, str] = {}
    for formal, actual in zip(fn.input, ctx.proto.input):
        rename[formal] = actual
    for formal in list(fn.input)[len(ctx.proto.input) :]:
        rename[formal] = ""
    for formal, actual in itertools.zip_longest(fn.output, ctx.proto.output, fillvalue=""):
        if formal:
            rename[formal] = actual or f"{prefix}/{formal}"
    attr_values = _function_attrs(ctx, fn)
    for i, node in enumerate(fn.node):
        inner = onnx.NodeProto()
        inner.CopyFrom(node)
        inner.name = f"{ctx.name}/{node.name or node.op_type + str(i)}"
        for j, n in enumerate(inner.input):
            inner.input[j] = rename.get(n, f"{prefix}/{n}" if n else "")
        for j, n in enumerate(inner.output):
            rename.setdefault(n, f"{prefix}/{n}")
            inner.output[j] = rename[n]
        _resolve_attr_refs(inner, attr_values)
        for attr in inner.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                _rename_outer_refs(sub, rename)
        imp.convert(inner, i, body_opsets)


def _rename_outer_refs(graph: onnx.GraphProto, rename: dict[str, str]) -> None:
    """Apply a function's renaming to the names a subgraph of its body reads from outside."""
    local = {vi.name for vi in graph.input} | {t.name for t in graph.initializer}
    for node in graph.node:
        for j, n in enumerate(node.input):
            if n and n not in local and n in rename:
                node.input[j] = rename[n]
        local.update(node.output)
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                _rename_outer_refs(sub, {k: v for k, v in rename.items() if k not in local})
    for vo in graph.output:
        if vo.name not in local and vo.name in rename:
            vo.name = rename[vo.name]


def _function_body(ctx: NodeContext, schema) -> onnx.FunctionProto | None:
    opset = ctx.importer.opsets.get(normal_domain(ctx.proto.domain), 1)
    if schema.has_context_dependent_function:
        types = []
        for v in ctx.inputs:
            tp = onnx.TypeProto()
            if v is not None:
                tp = onnx.helper.make_tensor_type_proto(elem_of(v.dtype), list(v.shape))
            types.append(tp.SerializeToString())
        try:
            data = schema.get_context_dependent_function_with_opset_version(
                opset, ctx.proto.SerializeToString(), types)  # fmt: skip
        except Exception:
            data = schema.get_context_dependent_function(ctx.proto.SerializeToString(), types)
        fn = onnx.FunctionProto()
        fn.ParseFromString(data)
        return fn if fn.node else None
    if schema.has_function:
        try:
            data = schema.get_function_with_opset_version(opset)
            fn = onnx.FunctionProto()
            fn.ParseFromString(data)
            return fn
        except Exception:
            return schema.function_body
    return None


def _function_attrs(ctx: NodeContext, fn: onnx.FunctionProto) -> dict[str, onnx.AttributeProto]:
    """Attribute values for `@ref` attributes in a body: the node's, else the defaults."""
    schema = get_schema(ctx.op_type, ctx.proto.domain, ctx.importer.opsets)
    values = {name: a.default_value for name, a in schema.attributes.items() if a.default_value.name}
    values.update({a.name: a for a in fn.attribute_proto})
    values.update({a.name: a for a in ctx.proto.attribute})
    return values


def _resolve_attr_refs(node: onnx.NodeProto, values: dict[str, onnx.AttributeProto]) -> None:
    kept = []
    for a in node.attribute:
        if a.ref_attr_name:
            if a.ref_attr_name not in values:
                continue
            resolved = onnx.AttributeProto()
            resolved.CopyFrom(values[a.ref_attr_name])
            resolved.name = a.name
            kept.append(resolved)
        else:
            kept.append(a)
    del node.attribute[:]
    node.attribute.extend(kept)
