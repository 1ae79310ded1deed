"""TensorFlow and Keras frontend: `from_tensorflow(keras_model or SavedModel directory) -> Graph`.

The model is traced to a TF graph and converted to ONNX by tf2onnx (`pip install ember[tf]`), a converter made
and kept for the job, then imported by the ONNX frontend. A TF op that tf2onnx cannot convert is named in one
`UnsupportedOperatorError` (its TF op type and the TF nodes using it), as is an op it converted to something the
ONNX import does not know.

Inputs whose leading (batch) dim is unknown get 1, or the shape given in `input_shapes`; other unknown dims must
be given there. The graph's inputs and outputs are named after the Keras model's inputs and outputs (or the
SavedModel signature's keys).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ember.frontend.onnx import from_onnx
from ember.frontend.onnx_importer import MAX_OPSET, ModelError, UnsupportedOperatorError, first_line
from ember.graph.ir import Graph

__all__ = ["OPSET", "from_tensorflow", "is_tensorflow", "to_onnx"]

OPSET = min(18, MAX_OPSET)  # the newest opset tf2onnx 1.17 writes well


def is_tensorflow(model: object) -> bool:
    """A Keras model or tf.Module (checked without importing TensorFlow), or a SavedModel directory."""
    if isinstance(model, str | os.PathLike):
        return os.path.isfile(os.path.join(os.fspath(model), "saved_model.pb"))
    root = type(model).__module__.split(".")[0]
    return root in ("keras", "tf_keras", "tensorflow")


def _modules():
    try:
        import tensorflow as tf
        import tf2onnx
    except ImportError as e:
        raise ImportError(f"TensorFlow/Keras models need tensorflow and tf2onnx ({e}): "
                          "pip install 'ember[tf]'") from None
    return tf, tf2onnx


def _spec(tf, name: str, shape, dtype, input_shapes: Mapping[str, tuple]) -> Any:
    dims = list(shape)
    if name in input_shapes:
        dims = list(input_shapes[name])
    elif dims and dims[0] is None:
        dims[0] = 1
    if any(d is None for d in dims):
        raise ModelError(f"input {name!r} has unknown dims {list(shape)}: pass input_shapes={{{name!r}: (...)}}")
    return tf.TensorSpec(dims, dtype, name=name)


def _keras_function(tf, model: Any, input_shapes: Mapping[str, tuple]):
    inputs = list(model.inputs)
    names = [t.name.split(":")[0] for t in inputs]
    specs = [_spec(tf, n, t.shape, t.dtype, input_shapes) for n, t in zip(names, inputs)]
    outputs = [t.name.split(":")[0] for t in model.outputs] if getattr(model, "outputs", None) else None

    @tf.function
    def call(*args):
        y = model(list(args) if len(args) > 1 else args[0], training=False)
        return list(y) if isinstance(y, list | tuple) else [y]

    return call, specs, outputs


def _saved_model_function(tf, path: str, input_shapes: Mapping[str, tuple]):
    loaded = tf.saved_model.load(path)
    if "serving_default" not in loaded.signatures:
        raise ModelError(f"{path}: the SavedModel has no 'serving_default' signature "
                         f"(it has {sorted(loaded.signatures)})")  # fmt: skip
    sig = loaded.signatures["serving_default"]
    kwargs = sig.structured_input_signature[1]
    names = sorted(kwargs)
    specs = [_spec(tf, n, kwargs[n].shape, kwargs[n].dtype, input_shapes) for n in names]
    out_names = sorted(sig.structured_outputs)

    @tf.function
    def call(*args):
        result = sig(**dict(zip(names, args)))
        return [result[k] for k in out_names]

    call.loaded = loaded  # keep the variables alive while tracing
    return call, specs, out_names


def to_onnx(model: Any, input_shapes: Mapping[str, tuple] | None = None):
    """A Keras model or SavedModel directory as an ONNX ModelProto (through tf2onnx), with its unconverted TF ops
    named in one error."""
    tf, tf2onnx = _modules()
    input_shapes = dict(input_shapes or {})
    source = os.fspath(model) if isinstance(model, str | os.PathLike) else f"{type(model).__name__} model"
    if isinstance(model, str | os.PathLike):
        fn, specs, outputs = _saved_model_function(tf, source, input_shapes)
    else:
        fn, specs, outputs = _keras_function(tf, model, input_shapes)
    try:
        proto = _convert(tf, tf2onnx, fn, specs)
    except Exception as e:
        raise ModelError(f"{source}: tf2onnx could not convert the model: {type(e).__name__}: {first_line(e)}") from e
    _expand_tf_ops(proto)
    unknown = _unconverted(proto)
    if unknown:
        raise UnsupportedOperatorError(f"{source} (TensorFlow ops tf2onnx left unconverted)", unknown)
    if outputs and len(outputs) == len(proto.graph.output):
        _rename_outputs(proto, outputs)
    return proto


_NO_INLINE = ("_XlaMustCompile", "_noinline")  # function attributes that keep grappler from inlining a call


def _convert(tf, tf2onnx, fn, specs):
    """The traced function frozen (variables and captured tensors made constants), then converted. tf2onnx's
    from_function takes every non-resource input of the concrete function for a model input, so a tensor the
    model captures (Keras' Normalization layer's mean and variance) became an input the caller had to feed."""
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    frozen = convert_variables_to_constants_v2(fn.get_concrete_function(*specs))
    inputs = [t.name for t in frozen.inputs if t.dtype != tf.resource]
    graph_def = frozen.graph.as_graph_def()
    for holder in (*graph_def.library.function, *graph_def.node):  # functions marked for XLA (Keras 3's grouped
        for key in _NO_INLINE:  # conv) are never inlined, and tf2onnx cannot convert a call: let grappler inline them
            if key in holder.attr:
                del holder.attr[key]
    proto, _ = tf2onnx.convert.from_graph_def(graph_def, input_names=inputs,
                                              output_names=[t.name for t in frozen.outputs], opset=OPSET)
    _rename(proto, {i: s.name for i, s in zip(inputs, specs)})  # 'pixels:0' -> 'pixels', the spec's name
    return proto


def _rename(proto, renames: dict[str, str]) -> None:
    """Rename values of the graph (its inputs, outputs, nodes and their subgraphs)."""

    def walk(g) -> None:
        for v in (*g.input, *g.output):
            v.name = renames.get(v.name, v.name)
        for node in g.node:
            node.output[:] = [renames.get(o, o) for o in node.output]
            node.input[:] = [renames.get(i, i) for i in node.input]
            for a in node.attribute:
                for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    walk(sub)

    walk(proto.graph)


def _expand_tf_ops(proto) -> None:
    """Rewrite the TF ops tf2onnx 1.17 leaves unconverted that have a plain ONNX form: Erfc(x) = 1 - Erf(x)
    (Keras's exact gelu)."""
    import onnx
    from onnx import helper

    nodes = []
    for node in proto.graph.node:
        if node.op_type == "Erfc" and node.domain in ("", "ai.onnx"):
            one, erf = node.name + "/one", node.name + "/erf"
            dtype = onnx.TensorProto.FLOAT
            nodes.append(helper.make_node("Constant", [], [one], node.name + "/one",
                                          value=helper.make_tensor(one, dtype, [], [1.0])))  # fmt: skip
            nodes.append(helper.make_node("Erf", [node.input[0]], [erf], node.name + "/Erf"))
            nodes.append(helper.make_node("Sub", [one, erf], [node.output[0]], node.name))
        else:
            nodes.append(node)
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)


def _unconverted(proto) -> dict[str, list[str]]:
    """TF op type -> TF node names, for the nodes tf2onnx left as they were (not an ONNX op of their domain)."""
    import onnx

    found: dict[str, list[str]] = {}
    for node in proto.graph.node:
        if node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type):
            found.setdefault(node.op_type, []).append(node.name)
    return found


def _rename_outputs(proto, names: list[str]) -> None:
    """Name the graph outputs after the model's (tf2onnx names them after TF tensors: 'Identity:0')."""
    renames = {o.name: n for o, n in zip(proto.graph.output, names) if n not in {i.name for i in proto.graph.input}}
    if len(set(renames.values())) != len(renames):
        return
    _rename(proto, renames)


def from_tensorflow(model: Any, input_shapes: Mapping[str, tuple] | None = None) -> Graph:
    """Import a Keras model (or tf.Module with inputs) or a SavedModel directory as an Ember graph."""
    return from_onnx(to_onnx(model, input_shapes))
