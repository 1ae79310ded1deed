"""Simplify: equivalent replacements, as a table of small rules over nodes.

Each rule looks at one node and either rewrites the graph (returning True) or returns False.
The pass applies the rules until none fires, then drops dead nodes. Rules edit through `Ctx`, whose
use-def index (`ember.graph.ir.Uses`) stays current: one index per pass, not one per rewrite.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ember.graph.ir import Graph, Node, Uses, Value
from ember.ops import Pattern, get_op

from .cleanup import dead_code_elimination
from .util import constant_value, is_scalar_constant

VIEWS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


class Ctx:
    """What rules see: the graph and its use-def index; rules edit through `bypass` and `rewrite`."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.uses = Uses(graph)

    def producer(self, v: Value | None, *ops: str) -> Node | None:
        n = self.uses.producer(v)
        return n if n is not None and (not ops or n.op in ops) else None

    def readers(self, v: Value) -> list[Node]:
        return self.uses.readers(v)

    def is_output(self, v: Value) -> bool:
        return v in self.uses.outputs

    def sole_user(self, v: Value) -> Node | None:
        users = self.uses.readers(v)
        return users[0] if len(users) == 1 and not self.is_output(v) else None

    def bypass(self, node: Node, value: Value) -> bool:
        """Replace node's (first) output by `value`."""
        self.uses.replace_uses(node.outputs[0], value)
        return True

    def rewrite(self, node: Node, op: str, inputs: list[Value | None], attrs: dict) -> bool:
        """Make `node` compute `op(inputs) {attrs}` instead (its outputs unchanged)."""
        node.op, node.attrs = op, attrs
        self.uses.set_inputs(node, inputs)
        return True


def no_op(c: Ctx, n: Node) -> bool:
    """Identity, inference Dropout, Cast to the same dtype, views and copies that change nothing."""
    x = n.inputs[0] if n.inputs else None
    if x is None:
        return False
    if c.is_output(n.outputs[0]) and (x.is_constant or x in c.graph.inputs or c.is_output(x)):
        return False  # the output must keep its own name: nothing to gain
    out = n.outputs[0]
    mask_unused = not any(c.uses.is_used(v) for v in n.outputs[1:])
    if n.op == "Identity" or (n.op == "Dropout" and mask_unused):
        return c.bypass(n, x)
    same = x.type == out.type
    if same and n.op in ("Cast", "Reshape", "Flatten", "Expand", "Squeeze", "Unsqueeze"):
        return c.bypass(n, x)
    if same and n.op == "Transpose" and list(n.attrs["perm"]) == list(range(len(x.shape))):
        return c.bypass(n, x)
    if same and n.op == "Pad" and not any(n.attrs["pads"]):
        return c.bypass(n, x)
    if n.op == "Concat" and len(n.present_inputs) == 1:
        return c.bypass(n, x)
    return False


def arith_identity(c: Ctx, n: Node) -> bool:
    """x + 0, 0 + x, x - 0, x * 1, 1 * x, x / 1 (when the constant does not broadcast x to a new shape)."""
    if n.op not in ("Add", "Sub", "Mul", "Div") or len(n.inputs) != 2:
        return False
    a, b = n.inputs
    unit = 0.0 if n.op in ("Add", "Sub") else 1.0
    for x, k in ((a, b), (b, a)):
        if x is b and n.op in ("Sub", "Div"):
            continue
        if x.type == n.outputs[0].type and is_scalar_constant(k, unit):
            return c.bypass(n, x)
    return False


def transpose_pair(c: Ctx, n: Node) -> bool:
    """Transpose(Transpose(x, p), q) -> Transpose(x, p[q]) (or nothing when that is the identity)."""
    inner = c.producer(n.inputs[0], "Transpose") if n.op == "Transpose" else None
    if inner is None:
        return False
    p, q = inner.attrs["perm"], n.attrs["perm"]
    perm = tuple(p[i] for i in q)
    if perm == tuple(range(len(perm))):
        return c.bypass(n, inner.inputs[0])
    return c.rewrite(n, "Transpose", [inner.inputs[0]], {**n.attrs, "perm": perm})


def view_chain(c: Ctx, n: Node) -> bool:
    """A view (Reshape/Flatten/Squeeze/Unsqueeze) of a view is one Reshape of the first input."""
    inner = c.producer(n.inputs[0], *VIEWS) if n.op in VIEWS else None
    if inner is None:
        return False
    return c.rewrite(n, "Reshape", [inner.inputs[0]], {"shape": tuple(n.outputs[0].shape)})


PRODUCTS = ("MatMul", "Gemm")


def view_after_elementwise(c: Ctx, n: Node) -> bool:
    """op(Reshape(x), ...) -> Reshape(op(x, ...)) for an elementwise op of a view that adds dims to x but keeps its
    rows (the same elements, the same last dim) where x is a product or an elementwise result: GPT-2's Gemm ->
    Reshape -> Gelu (or residual Add) then computes in the product's shape and fuses into its epilogue. The
    other operands are viewed alike when they have the op's full shape, kept when they broadcast per column."""
    if len(n.outputs) != 1 or any(k in n.attrs for k in ("axis", "axes", "shape")):
        return False
    if get_op(n.op).pattern not in (Pattern.ELEMWISE, Pattern.BROADCAST):
        return False
    out = n.outputs[0]
    for v in n.present_inputs:
        view = c.producer(v, *VIEWS)
        if view is None or v.shape != out.shape or c.sole_user(v) is not n:
            continue
        x = view.inputs[0]
        src = c.producer(x)
        if (src is None or not x.type.is_static or not out.type.is_static or x.type.size != out.type.size
                or not x.shape or len(x.shape) >= len(out.shape) or x.shape[-1] != out.shape[-1]):  # fmt: skip
            continue  # only towards fewer dims (the product's rows): no rewrite undoes another
        if not (src.op in PRODUCTS or (get_op(src.op).pattern in (Pattern.ELEMWISE, Pattern.BROADCAST)
                                       and len(src.outputs) == 1)):  # fmt: skip
            continue
        ins = []
        for u in n.inputs:
            if u is None or u is v:
                ins.append(x if u is v else None)
            elif u.shape == out.shape:
                ins.append(_viewed(c, u, x.shape))
            elif len(u.shape) <= len(x.shape) and all(d == 1 for d in u.shape[:-1]):
                ins.append(u)  # a scalar or one value per column: broadcasts over x's rows alike
            else:
                break
        else:
            y = Value(c.graph.fresh_name(f"{out.name}_rows"), out.type.with_shape(x.shape))
            c.uses.add(Node(n.op, ins, [y], dict(n.attrs), f"{n.name}_rows"))
            return c.rewrite(n, "Reshape", [y], {"shape": tuple(out.shape)})
    return False


def _viewed(c: Ctx, u: Value, shape: tuple) -> Value:
    if u.is_constant:
        return Value.constant(c.graph.fresh_name(f"{u.name}_rows"), u.data.reshape(shape))
    out = Value(c.graph.fresh_name(f"{u.name}_rows"), u.type.with_shape(shape))
    c.uses.add(Node("Reshape", [u], [out], {"shape": tuple(shape)}, out.name))
    return out


def _operands(c: Ctx, v: Value, op: str) -> list[Value] | None:
    node = c.producer(v, op)
    return None if node is None else list(node.inputs)


def _other(pair: list[Value], v: Value) -> Value | None:
    if len(pair) != 2 or v not in pair:
        return None
    return pair[1] if pair[0] is v else pair[0]


def gelu(c: Ctx, n: Node) -> bool:
    """0.5 * x * (1 + erf(x / sqrt(2))) in the orders exporters write it -> Gelu(x)."""
    if n.op != "Erf":
        return False
    div = c.producer(n.inputs[0], "Div", "Mul")
    if div is None:
        return False
    x, k = div.inputs
    scale = constant_value(k)
    want = np.sqrt(2.0) if div.op == "Div" else 1 / np.sqrt(2.0)
    if scale is None or scale.size != 1 or not np.isclose(float(scale.ravel()[0]), want, rtol=1e-5):
        return False
    return _half_x_one_plus(c, n.outputs[0], x, "none")


def gelu_tanh(c: Ctx, n: Node) -> bool:
    """0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))) (GPT-2's "new GELU") -> Gelu(x, tanh)."""
    if n.op != "Tanh":
        return False
    mul = c.producer(n.inputs[0], "Mul")
    if mul is None or len(mul.inputs) != 2:
        return False
    inner = next((v for v in mul.inputs if _is_scalar(c, _other(mul.inputs, v), np.sqrt(2.0 / np.pi))), None)
    add = c.producer(inner, "Add") if inner is not None else None
    if add is None or len(add.inputs) != 2:
        return False
    for x in add.inputs:
        cubic = c.producer(_other(add.inputs, x), "Mul")
        if cubic is None or len(cubic.inputs) != 2:
            continue
        cube = next((v for v in cubic.inputs if _is_scalar(c, _other(cubic.inputs, v), 0.044715)), None)
        if cube is not None and _is_cube(c, cube, x):
            return _half_x_one_plus(c, n.outputs[0], x, "tanh")
    return False


def _is_scalar(c: Ctx, v: Value | None, want: float) -> bool:
    k = constant_value(v) if v is not None else None
    return k is not None and k.size == 1 and bool(np.isclose(float(k.ravel()[0]), want, rtol=1e-5))


def _is_cube(c: Ctx, v: Value, x: Value) -> bool:
    """v = x ** 3, written as Pow(x, 3), x * (x * x) or (x * x) * x."""
    p = c.producer(v, "Pow", "Mul")
    if p is None or len(p.inputs) != 2:
        return False
    if p.op == "Pow":
        return p.inputs[0] is x and _is_scalar(c, p.inputs[1], 3.0)
    a, b = p.inputs
    sq = b if a is x else a if b is x else None
    q = c.producer(sq, "Mul") if sq is not None else None
    return q is not None and list(q.inputs) == [x, x]


def _half_x_one_plus(c: Ctx, f: Value, x: Value, approximate: str) -> bool:
    """0.5 * x * (1 + f) in the orders exporters write it: its last node becomes Gelu(x, approximate)."""
    add = c.sole_user(f)
    if add is None or add.op != "Add" or not is_scalar_constant(_other(add.inputs, f), 1.0):
        return False
    m1 = c.sole_user(add.outputs[0])
    if m1 is None or m1.op != "Mul":
        return False
    o1 = _other(m1.inputs, add.outputs[0])
    final = None
    if o1 is x:  # (x * (1 + f)) * 0.5
        m2 = c.sole_user(m1.outputs[0])
        if m2 is not None and m2.op == "Mul" and is_scalar_constant(_other(m2.inputs, m1.outputs[0]), 0.5):
            final = m2
    elif is_scalar_constant(o1, 0.5):  # x * ((1 + f) * 0.5)
        m2 = c.sole_user(m1.outputs[0])
        if m2 is not None and m2.op == "Mul" and _other(m2.inputs, m1.outputs[0]) is x:
            final = m2
    else:  # (x * 0.5) * (1 + f)
        half = _operands(c, o1, "Mul")
        if half is not None and x in half and is_scalar_constant(_other(half, x), 0.5):
            final = m1
    if final is None or final.outputs[0].type != x.type:
        return False
    return c.rewrite(final, "Gelu", [x], {"approximate": approximate})


def layer_norm(c: Ctx, n: Node) -> bool:
    """(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) [* gamma] [+ beta] over the last axis."""
    if n.op != "Div":
        return False
    d, s = n.inputs
    sub = c.producer(d, "Sub")
    sqrt = c.producer(s, "Sqrt")
    if sub is None or sqrt is None:
        return False
    x, m = sub.inputs
    rank = len(x.shape)
    last = lambda node: node is not None and node.attrs.get("keepdims", 1) == 1 and tuple(node.attrs["axes"]) in (
        (-1,), (rank - 1,))  # noqa: E731  # fmt: skip
    mean = c.producer(m, "ReduceMean")
    add = c.producer(sqrt.inputs[0], "Add")
    if not (last(mean) and mean.inputs[0] is x and add is not None):
        return False
    var_v = next((v for v in add.inputs if not v.is_constant), None)
    eps = constant_value(_other(add.inputs, var_v)) if var_v is not None else None
    var = c.producer(var_v, "ReduceMean")
    if eps is None or eps.size != 1 or not last(var):
        return False
    sq = c.producer(var.inputs[0], "Pow", "Mul")
    if sq is None or sq.inputs[0] is not d or (sq.op == "Pow" and not is_scalar_constant(sq.inputs[1], 2.0)) or (
            sq.op == "Mul" and sq.inputs[1] is not d):  # fmt: skip
        return False
    if any(len(c.readers(v.outputs[0])) != k for v, k in ((sub, 2), (sqrt, 1), (add, 1), (var, 1))):
        return False
    dim, dtype = x.shape[-1], x.type.np_dtype
    final, gamma, beta = n, None, None
    mul = c.sole_user(n.outputs[0])
    if mul is not None and mul.op == "Mul":
        g = _other(mul.inputs, n.outputs[0])
        if g is not None and g.is_constant and g.data.shape in ((dim,),):
            final, gamma = mul, g
    plus = c.sole_user(final.outputs[0])
    if plus is not None and plus.op == "Add":
        b = _other(plus.inputs, final.outputs[0])
        if b is not None and b.is_constant and b.data.shape == (dim,):
            final, beta = plus, b
    if gamma is None:
        gamma = Value.constant(c.graph.fresh_name("ln_gamma"), np.ones(dim, dtype))
    inputs = [x, gamma] + ([beta] if beta is not None else [])
    return c.rewrite(final, "LayerNormalization", inputs, {"axis": -1, "epsilon": float(eps.ravel()[0]),
                                                            "stash_type": 1})  # fmt: skip


RULES: list[Callable[[Ctx, Node], bool]] = [no_op, arith_identity, transpose_pair, view_chain, gelu, gelu_tanh,
                                            layer_norm, view_after_elementwise]  # fmt: skip


def simplify(graph: Graph, max_rounds: int = 20) -> Graph:
    dead_code_elimination(graph)
    ctx = Ctx(graph)
    for _ in range(max_rounds):
        changed = False
        for node in list(graph.nodes):
            if node in ctx.uses.dead:
                continue
            if any(rule(ctx, node) for rule in RULES):
                changed = True
        ctx.uses.sweep()
        if not changed:
            break
    graph.topo_sort()
    return dead_code_elimination(graph)
