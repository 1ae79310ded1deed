"""Generic traversal of IR nodes: one mechanism for every node type, driven by dataclass fields."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from .expr import BinOp, Call, Cast, Expr, Node, Var


def _map_tuple(t: tuple, fn: Callable[[Node], Node]) -> tuple:
    out = None
    for j, x in enumerate(t):
        if isinstance(x, Node):
            nx = fn(x)
        elif type(x) is tuple and x:
            nx = _map_tuple(x, fn)
        else:
            continue
        if nx is not x:
            if out is None:
                out = list(t)
            out[j] = nx
    return t if out is None else tuple(out)


def map_children(node: Node, fn: Callable[[Node], Node]) -> Node:
    """Apply fn to each direct child node; rebuild the node only if a child changed."""
    old = node._values()
    new = None
    for i, v in enumerate(old):
        if isinstance(v, Node):
            nv = fn(v)
        elif type(v) is tuple and v:
            nv = _map_tuple(v, fn)
        else:
            continue
        if nv is not v:
            if new is None:
                new = list(old)
            new[i] = nv
    return node if new is None else rebuild(node, tuple(new))


def rebuild(node: Node, values: tuple) -> Node:
    """Construct a node of node's type from field values, keeping vector lanes consistent."""
    out = type(node)(*values)
    if isinstance(out, BinOp):
        lanes = max(out.a.dtype.lanes, out.b.dtype.lanes)
        if lanes != out.dtype.lanes:
            out = BinOp(out.op, out.a, out.b, out.dtype.with_lanes(lanes))
    elif isinstance(out, Cast) and out.value.dtype.lanes != out.dtype.lanes:
        out = Cast(out.dtype.with_lanes(out.value.dtype.lanes), out.value)
    elif isinstance(out, Call):
        lanes = max((a.dtype.lanes for a in out.args), default=1)
        if lanes != out.dtype.lanes:
            out = Call(out.name, out.args, out.dtype.with_lanes(lanes))
    return out


def children(node: Node) -> Iterator[Node]:
    for v in node._values():
        if isinstance(v, Node):
            yield v
        elif isinstance(v, tuple):
            stack = list(reversed(v))
            while stack:
                x = stack.pop()
                if isinstance(x, Node):
                    yield x
                elif isinstance(x, tuple):
                    stack.extend(reversed(x))


def walk(node: Node, unique: bool = False) -> Iterator[Node]:
    """All nodes under (and including) node, pre-order. `unique`: a node object shared in the tree (a DAG: an
    inlined stage read several times) is visited once, for searches that need not count its uses."""
    stack = [node]
    seen: set[int] = set()
    while stack:
        n = stack.pop()
        if unique:
            if id(n) in seen:
                continue
            seen.add(id(n))
        yield n
        stack.extend(reversed(list(children(n))))


def transform(
    node: Node, post: Callable[[Node], Node | None], pre: Callable[[Node], Node | None] | None = None
) -> Node:
    """Bottom-up rewrite. `pre(n)` may return a replacement that is not visited further;
    `post(n)` sees n with rewritten children and returns a replacement or None to keep it.

    Iterative (an explicit stack), so an expression's depth is not bounded by Python's recursion limit;
    a node shared in the tree (a DAG) is rewritten once."""
    memo: dict[int, Node] = {}
    stack: list[tuple[Node, bool]] = [(node, False)]
    while stack:
        n, children_done = stack.pop()
        key = id(n)
        if key in memo:
            continue
        if not children_done:
            r = pre(n) if pre is not None else None
            if r is not None:
                memo[key] = r
                continue
            stack.append((n, True))
            stack.extend((c, False) for c in reversed(list(children(n))) if id(c) not in memo)  # left first
            continue
        m = map_children(n, lambda c: memo[id(c)])
        r = post(m)
        memo[key] = m if r is None else r
    return memo[id(node)]


def substitute(node: Node, mapping: dict[Var, Expr]) -> Node:
    """Replace variables by expressions."""
    if not mapping:
        return node
    return transform(node, lambda n: mapping.get(n) if isinstance(n, Var) else None)


def free_vars(node: Node) -> set[Var]:
    """Variables used in node (including loop/let variables bound inside it)."""
    return {n for n in walk(node) if isinstance(n, Var)}


def uses_var(node: Node, var: Var | set[Var]) -> bool:
    vs = var if isinstance(var, set) else {var}
    return any(isinstance(n, Var) and n in vs for n in walk(node))
