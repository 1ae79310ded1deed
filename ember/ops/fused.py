"""`Fused`: a group of operators that compiles to one kernel, made by the FuseOps pass.

The node's inputs are the group's external inputs; attribute `body` is a Graph whose inputs
stand for them (same order and types) and whose outputs are the node's outputs. The group's
pattern kinds decided the fusion; the body keeps the original nodes for printing, the
reference and the lowering (which composes the members' tensor expressions).
"""

from __future__ import annotations

import numpy as np

from ember.graph.ir import Graph
from ember.graph.types import TensorType
from ember.ops.evaluate import evaluate_subgraph
from ember.ops.opdef import Attr, Pattern, op


def _infer(a: dict, *types: TensorType) -> tuple[TensorType, ...]:
    body: Graph = a["body"]
    if len(types) != len(body.inputs):
        raise ValueError(f"Fused takes {len(body.inputs)} inputs, got {len(types)}")
    for t, v in zip(types, body.inputs):
        if t != v.type:
            raise ValueError(f"Fused input {v.name} is {v.type}, given {t}")
    return tuple(v.type for v in body.outputs)


@op("Fused", Pattern.OPAQUE, infer=_infer, inputs=(0, None), attrs=[Attr("body", "graph")], foldable=False)
def fused(a: dict, *xs: np.ndarray) -> tuple[np.ndarray, ...]:
    """Evaluate the body with the reference evaluator."""
    return tuple(evaluate_subgraph(a["body"], list(xs), {}))
