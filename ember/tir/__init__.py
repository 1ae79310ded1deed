"""The loop IR: expressions, statements, the arithmetic simplifier and the loop passes."""

from .arith import Analyzer, simplify
from .dtype import DType, dtype
from .expr import BinOp, Broadcast, Call, Cast, Const, Expr, Load, Not, Ramp, Select, Var, const, same
from .stmt import Allocate, Buffer, Evaluate, For, ForKind, IfThenElse, LetStmt, PrimFunc, Seq, Stmt, Store, seq

__all__ = [
    "Allocate", "Analyzer", "BinOp", "Broadcast", "Buffer", "Call", "Cast", "Const", "DType", "Evaluate", "Expr",
    "For", "ForKind", "IfThenElse", "LetStmt", "Load", "Not", "PrimFunc", "Ramp", "Select", "Seq", "Stmt", "Store",
    "Var", "const", "dtype", "same", "seq", "simplify",
]  # fmt: skip
