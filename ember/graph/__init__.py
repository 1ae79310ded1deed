"""Ember's graph IR: `Graph`, `Node`, `Value`, `TensorType`, the printer and the structural
verifier. It imports nothing from the op library, which sits above it.

    g = ember.frontend.onnx.from_onnx("model.onnx")
    print(g)                                  # readable IR
    verify(g)                                 # structure + each node against its op (ember.ops.verify)
    outs = evaluate(g, {"input": x})          # numpy reference run

What needs the operator registry lives in `ember.ops`: the reference evaluator
(`from ember.ops.evaluate import evaluate`), verification against op rules (`ember.ops.verify`)
and type inference (`ember.ops.infer`).
"""

from ember.graph.ir import Graph, Node, Value, captured_values, format_graph
from ember.graph.types import DTYPES, TensorType, dtype_name, np_dtype

__all__ = [
    "DTYPES", "Graph", "Node", "TensorType", "Value", "captured_values", "dtype_name", "format_graph",
    "np_dtype",
]  # fmt: skip
