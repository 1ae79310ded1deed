"""The operator library: one `OpDef` per operator (see `ember.ops.opdef`).

Importing this package registers every operator in `OPS`. Modules group operators by
kind; each operator is defined exactly once, by its table row or `@op` entry, next to its
reference and TE compute. What needs the registry lives here too: the numpy reference
evaluator (`ember.ops.evaluate`), verification of graphs against the op rules
(`ember.ops.verify`) and type inference
(`ember.ops.infer`).
"""

from ember.ops import (  # noqa: F401  (registers operators)
    attention,
    bf16,
    broadcast,
    control,
    conv,
    elemwise,
    fused,
    int8,
    layout,
    matmul,
    ml,
    norm,
    pool,
    qlinear,
    quant,
    reduce,
    resize,
    rnn,
    signal,
    softmax,
    tensor,
    vision,
    winograd,
)
from ember.ops.common import ShapeError
from ember.ops.opdef import (
    OPS,
    REQUIRED,
    Attr,
    AttrError,
    OpDef,
    Pattern,
    ShapeDependsOnData,
    attach,
    get_op,
    op,
    register,
)  # fmt: skip

__all__ = [
    "OPS", "REQUIRED", "Attr", "AttrError", "OpDef", "Pattern", "ShapeDependsOnData", "ShapeError", "attach", "get_op",
    "op", "register",
]  # fmt: skip
