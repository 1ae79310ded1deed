"""A readable, Python-like text form of the loop IR."""

from __future__ import annotations

from .expr import BinOp, Broadcast, Call, Cast, Const, Expr, Load, Node, Not, Ramp, Select, Var
from .stmt import Allocate, Evaluate, For, ForKind, IfThenElse, LetStmt, PrimFunc, Seq, Stmt, Store

_INFIX = {
    "or": ("or", 1), "and": ("and", 2),
    "eq": ("==", 4), "ne": ("!=", 4), "lt": ("<", 4), "le": ("<=", 4), "gt": (">", 4), "ge": (">=", 4),
    "add": ("+", 5), "sub": ("-", 5),
    "mul": ("*", 6), "div": ("/", 6), "floordiv": ("//", 6), "floormod": ("%", 6),
}  # fmt: skip


def format_const(c: Const) -> str:
    if c.dtype.is_bool:
        return "True" if c.value else "False"
    if c.dtype.is_float:
        v = repr(float(c.value))
        return v + "f" if c.dtype.bits == 32 else v
    return str(c.value)


def format_expr(e: Expr, prec: int = 0) -> str:
    """Expression text with only the parentheses that precedence needs."""
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Const):
        s = format_const(e)
        return f"({s})" if s.startswith("-") and prec > 5 else s
    if isinstance(e, BinOp):
        if e.op in ("min", "max"):
            return f"{e.op}({format_expr(e.a)}, {format_expr(e.b)})"
        sym, p = _INFIX[e.op]
        # left-associative: the right operand of a same-precedence op needs parentheses
        s = f"{format_expr(e.a, p)} {sym} {format_expr(e.b, p + 1)}"
        return f"({s})" if p < prec else s
    if isinstance(e, Not):
        s = f"not {format_expr(e.a, 3)}"
        return f"({s})" if prec > 3 else s
    if isinstance(e, Select):
        return f"select({format_expr(e.cond)}, {format_expr(e.t)}, {format_expr(e.f)})"
    if isinstance(e, Cast):
        return f"{e.dtype}({format_expr(e.value)})"
    if isinstance(e, Call):
        return f"{e.name}({', '.join(format_expr(a) for a in e.args)})"
    if isinstance(e, Load):
        s = f"{e.buffer.name}[{', '.join(format_expr(i) for i in e.indices)}]"
        return s if e.predicate is None else f"masked({s}, {format_expr(e.predicate)})"
    if isinstance(e, Ramp):
        return f"ramp({format_expr(e.base)}, {format_expr(e.stride)}, {e.lanes})"
    if isinstance(e, Broadcast):
        return f"broadcast({format_expr(e.value)}, {e.lanes})"
    # nodes from higher layers (te) print themselves
    return e.format() if hasattr(e, "format") else object.__repr__(e)


def _range(f: For) -> str:
    if isinstance(f.min, Const) and f.min.value == 0:
        return format_expr(f.extent)
    if isinstance(f.min, Const) and isinstance(f.extent, Const):
        return f"{f.min.value}, {f.min.value + f.extent.value}"
    return f"{format_expr(f.min)}, {format_expr(f.min + f.extent)}"


def format_stmt(s: Stmt, indent: int = 0) -> list[str]:
    pad = "  " * indent
    if isinstance(s, For):
        kind = {ForKind.SERIAL: "range", ForKind.PARALLEL: "parallel", ForKind.VECTORIZED: "vectorized",
                ForKind.UNROLLED: "unrolled", ForKind.THREAD_BINDING: "thread_binding"}[s.kind]  # fmt: skip
        tag = f', "{s.thread_tag}"' if s.thread_tag else ""
        notes = "".join(f"  # {k}={v}" for k, v in s.annotations)
        return [f"{pad}for {s.var.name} in {kind}({_range(s)}{tag}):{notes}", *format_stmt(s.body, indent + 1)]
    if isinstance(s, Store):
        idx = ", ".join(format_expr(i) for i in s.indices)
        mask = "" if s.predicate is None else f"  # lanes where {format_expr(s.predicate)}"
        return [f"{pad}{s.buffer.name}[{idx}] = {format_expr(s.value)}{mask}"]
    if isinstance(s, Allocate):
        b = s.buffer
        return [
            f"{pad}{b.name} = alloc {b.dtype}[{', '.join(map(str, b.shape))}], {b.scope}",
            *format_stmt(s.body, indent),
        ]
    if isinstance(s, IfThenElse):
        out = [f"{pad}if {format_expr(s.cond)}:", *format_stmt(s.then_case, indent + 1)]
        if s.else_case is not None:
            out += [f"{pad}else:", *format_stmt(s.else_case, indent + 1)]
        return out
    if isinstance(s, LetStmt):
        return [f"{pad}{s.var.name} = {format_expr(s.value)}", *format_stmt(s.body, indent)]
    if isinstance(s, Seq):
        return [line for st in s.stmts for line in format_stmt(st, indent)]
    if isinstance(s, Evaluate):
        return [f"{pad}{format_expr(s.value)}"]
    raise TypeError(f"cannot print {type(s).__name__}")


def unshadow(s: Stmt) -> Stmt:
    """Rename loop and let variables that shadow an enclosing one of the same name (`i` inside `i` becomes
    `i_1`), so that the text says which variable each use refers to."""
    from .functor import children, substitute, walk

    taken = {n.name for n in walk(s) if isinstance(n, Var)}
    renames: dict[Var, Var] = {}
    todo: list[tuple[Node, dict[str, Var]]] = [(s, {})]
    while todo:
        n, bound = todo.pop()
        if isinstance(n, For | LetStmt):
            v = n.var
            if bound.get(v.name, v) is not v and v not in renames:
                k = 1
                while f"{v.name}_{k}" in taken:
                    k += 1
                taken.add(f"{v.name}_{k}")
                renames[v] = Var(f"{v.name}_{k}", v.dtype)
            bound = {**bound, v.name: v}
        todo.extend((c, bound) for c in children(n) if isinstance(c, Stmt))
    return substitute(s, renames) if renames else s  # type: ignore[return-value]


def format_func(f: PrimFunc) -> str:
    params = ", ".join(f"{b.name}: {b.dtype}[{', '.join(map(str, b.shape))}]" for b in f.params)
    return "\n".join([f"def {f.name}({params}):", *format_stmt(unshadow(f.body), 1)])


def format_node(n: Node) -> str:
    if isinstance(n, Expr):
        return format_expr(n)
    if isinstance(n, Stmt):
        return "\n".join(format_stmt(unshadow(n)))
    return object.__repr__(n)
