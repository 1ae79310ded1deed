"""Ember's graph IR: `Graph`, `Node`, `Value`, `TensorType`, the verifier, the printer,
and the numpy reference evaluator.

    g = ember.frontend.onnx.from_onnx("model.onnx")
    print(g)                                  # readable IR
    g.verify()                                # structure + types against the op library
    outs = evaluate(g, {"input": x})          # numpy reference run

`ember.graph.evaluate` (the evaluator) and `ember.graph.verify` use the op library, which
imports `ember.graph.types`; import them as submodules:
`from ember.graph.evaluate import evaluate`.
"""

from ember.graph.ir import Graph, Node, Value, captured_values, format_graph
from ember.graph.types import DTYPES, TensorType, dtype_name, np_dtype

__all__ = [
    "DTYPES", "Graph", "Node", "TensorType", "Value", "captured_values", "dtype_name", "format_graph",
    "np_dtype",
]  # fmt: skip
