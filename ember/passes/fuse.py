"""FuseOps: group operators into kernels by their pattern kinds (the TVM rules, on a DAG).

1. Epilogues: from each anchor (out-elementwise-fusable: conv, matmul, gemm; a reduction; or an
   elementwise/broadcast op) the chain of elementwise/broadcast consumers joins its group while the
   chain's value has exactly one reader and the consumer keeps its shape (conv + bias + relu +
   residual add becomes one group). A value with several elementwise readers that meet again in
   one node (SiLU x * sigmoid(x), GELU's polynomial or erf form) takes them all, up to that node, as one
   step of the chain. A consumer whose other operands depend on the group would make a cycle and is not
   taken.
2. Prologues: an elementwise/broadcast/injective op whose only reader is in another group joins
   that group (it is computed inside the reader's kernel: transposes before a softmax, an
   elementwise prologue of a reduction), except into conv/matmul groups, whose inputs stay buffers, and into
   opaque ops other than BlockAttention (which reads its q, k, v through them: the heads' transposes).

A group holds at most `MAX_GROUP` nodes (TVM's max_fuse_depth): a kernel is one expression per output,
and a chain of thousands of elementwise ops would make an expression thousands deep, which every
recursive walk over it (simplifier, code generators, the C compiler) pays for. Longer chains become
several kernels of `MAX_GROUP` ops each.

First, a DequantizeLinear of 8-bit values that several kernels read is copied for each reader that takes
prologues, so the producer writes bytes and each reader widens them (`_dequantize_per_reader`).

Each group of two or more nodes becomes one `Fused` node whose `body` holds the members.
"""

from __future__ import annotations

from ember.graph.ir import Graph, Node, Value
from ember.ops import Pattern, get_op

from .inplace import channel_view

VIEWS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"}
EPILOGUE = (Pattern.ELEMWISE, Pattern.BROADCAST)
PROLOGUE = (Pattern.ELEMWISE, Pattern.BROADCAST, Pattern.INJECTIVE)
ANCHORS = (Pattern.OUT_ELEMWISE_FUSABLE, Pattern.REDUCTION, Pattern.ELEMWISE, Pattern.BROADCAST)
TAKES_PROLOGUES = {"BlockAttention"}  # opaque ops whose kernels read their inputs through inlined prologues
MAX_GROUP = 64  # nodes per fused group
MAX_CONVERGING = 12  # nodes from a value's several elementwise readers to where they meet again


def pattern(node: Node) -> Pattern:
    if node.op in VIEWS:
        return Pattern.INJECTIVE
    if node.subgraphs() or node.op == "BitCast":  # BitCast: a view of its input's bytes, never a kernel
        return Pattern.OPAQUE
    if channel_view(node) is not None:  # a Split/Slice of contiguous ranges: views, kept out of groups
        return Pattern.OPAQUE
    return get_op(node.op).pattern


def fuse_ops(graph: Graph) -> Graph:
    _dequantize_per_reader(graph)
    graph.topo_sort()
    pos = {n: i for i, n in enumerate(graph.nodes)}
    producers, consumers = graph.producers(), graph.consumers()
    outputs = set(graph.outputs)
    group: dict[Node, list[Node]] = {n: [n] for n in graph.nodes}

    def depends_on(v: Value | None, members: set[Node], start: int) -> bool:
        """Whether value v is computed (transitively) from a member of the group."""
        stack, seen = [v], set()
        while stack:
            p = producers.get(stack.pop())
            if p is None or p in seen or pos[p] < start:
                continue
            if p in members:
                return True
            seen.add(p)
            stack.extend(p.present_inputs)
        return False

    def fits_epilogue(c: Node, shape: tuple) -> bool:
        return pattern(c) in EPILOGUE and len(c.outputs) == 1 and c.outputs[0].shape == shape and c not in absorbed

    def converging(v: Value, members: set[Node], start: int) -> list[Node] | None:
        """The elementwise readers of v and the elementwise nodes after them up to the one node where they
        all meet again (its output the only one read elsewhere), in order; None where they do not meet within
        `MAX_CONVERGING` nodes of v's shape, or an operand from elsewhere depends on the group."""
        region: set[Node] = set()
        todo = set(consumers[v])
        while todo:
            if len(region) + len(todo) > MAX_CONVERGING or not all(fits_epilogue(c, v.shape) for c in todo):
                return None
            region |= todo
            escaping = [r for r in region if r.outputs[0] in outputs or
                        not consumers.get(r.outputs[0]) or any(c not in region for c in consumers[r.outputs[0]])]
            if len(escaping) == 1:
                break
            # the earliest reader outside of the region's values, then look again
            todo = {min((c for r in escaping for c in consumers.get(r.outputs[0], []) if c not in region),
                        key=pos.__getitem__, default=None)} - {None}
            if not todo:
                return None
        inside = members | region
        for r in region:
            if any(u is not v and u not in {q.outputs[0] for q in region} and depends_on(u, inside, start)
                   for u in r.present_inputs):
                return None
        ordered = sorted(region, key=pos.__getitem__)
        return ordered if escaping == [ordered[-1]] else None

    # 1. epilogues
    absorbed: set[Node] = set()
    for n in sorted(graph.nodes, key=lambda n: pattern(n) is not Pattern.OUT_ELEMWISE_FUSABLE):  # conv/matmul first
        if n in absorbed or pattern(n) not in ANCHORS or len(n.outputs) != 1:
            continue
        members, tail = [n], n
        while len(members) < MAX_GROUP:
            v = tail.outputs[0]
            users = consumers.get(v, [])
            if v in outputs or not users:
                break
            if len(users) > 1:  # x * sigmoid(x), GELU: readers that meet again join as one step
                region = converging(v, set(members), pos[n])
                if region is None or len(members) + len(region) > MAX_GROUP:
                    break
                members += region
                absorbed.update(region)
                tail = region[-1]
                continue
            c = users[0]
            if pattern(c) not in EPILOGUE or len(c.outputs) != 1 or c.outputs[0].shape != v.shape or c in absorbed:
                break
            others = [u for u in c.present_inputs if u is not v]
            if any(depends_on(u, set(members), pos[n]) for u in others):
                break
            members.append(c)
            absorbed.add(c)
            tail = c
        members = _without_widening_tail(members, consumers, absorbed)
        if len(members) > 1:
            for m in members:
                group[m] = members

    # 2. prologues: a group of elementwise/broadcast/injective ops whose one output has one reader joins it
    for n in reversed(graph.nodes):
        members = group[n]
        if n is not members[-1] or any(pattern(m) not in PROLOGUE or len(m.outputs) != 1 for m in members):
            continue
        v = n.outputs[0]
        users = consumers.get(v, [])
        if len(users) != 1 or v in outputs:
            continue
        target = group[users[0]]
        if target is members or pattern(users[0]) is Pattern.OUT_ELEMWISE_FUSABLE:
            continue
        opaque = pattern(users[0]) is Pattern.OPAQUE and users[0].op not in TAKES_PROLOGUES
        if opaque or len(members) + len(target) > MAX_GROUP:
            continue
        merged = members + target
        for m in merged:
            group[m] = merged

    groups = {id(g): g for g in group.values() if len(g) > 1 and not all(m.op in VIEWS for m in g)}  # views are free
    fused: dict[Node, Node | None] = {}  # member -> its Fused node at the last member's place, None elsewhere
    for members in groups.values():
        members = sorted(members, key=pos.__getitem__)
        fused.update(dict.fromkeys(members))
        fused[members[-1]] = _make_fused(members, consumers, outputs)
    graph.nodes = [fused.get(n, n) for n in graph.nodes if fused.get(n, n) is not None]
    graph.topo_sort()
    return graph


def _dequantize_per_reader(graph: Graph) -> None:
    """A DequantizeLinear of a computed 8-bit value that several kernels read (an int8 SE block: the pooling and
    the rescaling both read the depthwise convolution's output) gets a copy for each reader that takes prologues
    (elementwise, broadcast, injective, reduction): each widens the bytes as it reads them, and the producer
    writes 1 byte per element, not 4 that every reader reads again. Readers that keep their inputs as buffers
    (convolutions, products, opaque ops) share the original. In place."""
    producers, consumers, outputs = graph.producers(), graph.consumers(), set(graph.outputs)
    takes = (Pattern.ELEMWISE, Pattern.BROADCAST, Pattern.INJECTIVE, Pattern.REDUCTION)
    nodes: list[Node] = []
    for n in graph.nodes:
        nodes.append(n)
        v = n.outputs[0] if n.op == "DequantizeLinear" else None
        if v is None or v in outputs or producers.get(n.inputs[0]) is None or n.inputs[0].dtype not in ("uint8",
                                                                                                        "int8"):
            continue
        readers = list(dict.fromkeys(consumers.get(v, [])))
        split = [r for r in readers if pattern(r) in takes]
        if len(readers) < 2 or not split:
            continue
        keep = len(split) == len(readers)  # every reader has a copy: the first keeps the original
        for k, r in enumerate(split[1:] if keep else split):
            copy = Value(f"{v.name}_r{k}", v.type)
            r.inputs = [copy if x is v else x for x in r.inputs]
            nodes.append(Node(n.op, list(n.inputs), [copy], dict(n.attrs), f"{n.name}_r{k}"))
    graph.nodes = nodes


def _without_widening_tail(members: list[Node], consumers: dict[Value, list[Node]], absorbed: set[Node]) -> list[Node]:
    """An epilogue that ends in DequantizeLinear whose reader is in another group (an integer convolution's output
    dequantized for the residual Add of another convolution's epilogue) is left to that reader, as its prologue:
    the kernel then writes the 8-bit value, not 4 bytes per element, and the reader widens it as it reads."""
    while len(members) > 1 and members[-1].op == "DequantizeLinear":
        users = consumers.get(members[-1].outputs[0], [])
        if len(users) != 1 or users[0] not in absorbed:
            break
        absorbed.discard(members[-1])
        members = members[:-1]
    return members


def _make_fused(members: list[Node], consumers: dict[Value, list[Node]], outputs: set[Value]) -> Node:
    """The Fused node of a group (members in topological order); the caller puts it in the graph."""
    inside = {v: None for m in members for v in m.outputs}  # in order
    ext_inputs = list(dict.fromkeys(v for m in members for v in m.present_inputs if v not in inside))
    member_set = set(members)
    outs = [v for v in inside if v in outputs or any(c not in member_set for c in consumers.get(v, []))]
    vmap: dict[Value, Value] = {v: Value(f"in{i}_{v.name}", v.type) for i, v in enumerate(ext_inputs)}
    for m in members:
        for v in m.outputs:
            vmap[v] = Value(v.name, v.type)
    body_nodes = [Node(m.op, [None if v is None else vmap[v] for v in m.inputs], [vmap[v] for v in m.outputs],
                       dict(m.attrs), m.name) for m in members]  # fmt: skip
    name = "fused_" + "_".join(m.op.lower() for m in members)
    body = Graph(name, [vmap[v] for v in ext_inputs], [vmap[v] for v in outs], body_nodes)
    return Node("Fused", list(ext_inputs), outs, {"body": body}, name)
