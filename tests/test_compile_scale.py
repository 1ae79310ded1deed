"""Compiles that scale: a 10,000-node graph in linear time, and work bounds refusing a model that would run
for ever (a tensor or a kernel loop nest beyond `ember.kernels.Limits`)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from onnx import TensorProto, helper

import ember
from ember import zoo
from ember.graph.ir import Graph, Node, Uses, Value
from ember.graph.types import TensorType
from ember.kernels import MAX_ELEMENTS, MAX_ITERATIONS, Limits, WorkLimitError

CHAIN_BUDGET_S = 60  # 10,000 nodes took 24 minutes with consumers() rebuilt per rewrite; ~15 s now


def _chain_reference(x: np.ndarray, length: int) -> np.ndarray:
    for i in range(length):
        kind = i % 3
        x = np.maximum(x, 0) if kind == 0 else -x if kind == 1 else x + np.float32(0.25 + (i % 7) / 8)
    return x


def test_ten_thousand_node_chain_compiles_in_budget_and_matches_numpy(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))  # cold: every kernel compiled
    model = zoo.elementwise_chain(10_000)
    t0 = time.perf_counter()
    m = ember.compile(model, target="c")
    seconds = time.perf_counter() - t0
    assert seconds < CHAIN_BUDGET_S, f"10,000-node chain compiled in {seconds:.1f} s"
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    np.testing.assert_allclose(m(x), _chain_reference(x, 10_000), rtol=1e-5, atol=1e-4)


def _expand_reduce(dims: list[int]):
    """Expand a [1, 1] input to `dims`, then sum it all: a tiny model whose work is prod(dims)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    shape = helper.make_tensor("shape", TensorProto.INT64, [len(dims)], dims)
    nodes = [helper.make_node("Expand", ["x", "shape"], ["big"], name="expand"),
             helper.make_node("ReduceSum", ["big"], ["y"], name="sum", keepdims=0)]  # fmt: skip
    graph = helper.make_graph(nodes, "bomb", [x], [y], [shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_expand_reduce_bomb_is_refused_at_compile_time():
    t0 = time.perf_counter()
    with pytest.raises(WorkLimitError) as e:
        ember.compile(_expand_reduce([2**31, 2**31]), target="c")
    assert time.perf_counter() - t0 < 30
    msg = str(e.value)
    assert "'expand'" in msg and "Expand" in msg and "%big" in msg and "[2147483648, 2147483648]" in msg
    assert "max_elements" in msg and "EMBER_MAX_ELEMENTS" in msg


def test_loop_nest_bound_names_the_kernel_and_tensor():
    """Tensors allowed, the reduction's loops are not."""
    with pytest.raises(WorkLimitError) as e:
        ember.compile(_expand_reduce([2**31, 2**31]), target="c", max_elements=2**63)
    msg = str(e.value)
    assert "ReduceSum" in msg and "%y" in msg and "%x" in msg and "max_iterations" in msg


def test_bounds_are_configurable_by_argument_and_environment(monkeypatch):
    model = _expand_reduce([64, 64])  # 4096 elements and iterations
    x = np.ones((1, 1), np.float32)
    assert float(ember.compile(model, target="c")(x)) == 4096.0
    with pytest.raises(WorkLimitError, match="max_elements=1000"):
        ember.compile(model, target="c", max_elements=1000)
    with pytest.raises(WorkLimitError, match="max_iterations=1000"):
        ember.compile(model, target="c", max_iterations=1000)
    monkeypatch.setenv("EMBER_MAX_ELEMENTS", "1000")
    with pytest.raises(WorkLimitError, match="max_elements=1000"):
        ember.compile(model, target="c")
    assert float(ember.compile(model, target="c", max_elements=4096)(x)) == 4096.0  # the argument wins
    monkeypatch.setenv("EMBER_MAX_ELEMENTS", "lots")
    with pytest.raises(ValueError, match="EMBER_MAX_ELEMENTS='lots'"):
        ember.compile(model, target="c")


def test_limits_resolve():
    assert Limits.resolve(env={}) == Limits(MAX_ELEMENTS, MAX_ITERATIONS) == Limits()
    assert Limits.resolve(env={"EMBER_MAX_ELEMENTS": "1e6", "EMBER_MAX_ITERATIONS": "7"}) == Limits(10**6, 7)
    assert Limits.resolve(5, 6, env={"EMBER_MAX_ELEMENTS": "1e6"}) == Limits(5, 6)
    with pytest.raises(ValueError, match="max_iterations must be positive"):
        Limits.resolve(max_iterations=0, env={})


def test_uses_index_stays_current_through_edits():
    t = TensorType((4,), "float32")
    x = Value("x", t)
    a, b, c = Value("a", t), Value("b", t), Value("c", t)
    na, nb, nc = Node("Relu", [x], [a]), Node("Neg", [a], [b]), Node("Add", [b, a], [c])
    g = Graph("g", [x], [c], [na, nb, nc])
    uses = Uses(g)
    assert uses.readers(a) == [nb, nc] and uses.producer(b) is nb
    uses.replace_uses(b, a)  # Add(a, a): Neg has no reader left and dies
    assert nc.inputs == [a, a] and uses.readers(a) == [nc] and nb in uses.dead and uses.producer(b) is None
    uses.replace_uses(c, x)  # a graph output read from a graph input: an Identity keeps the name
    assert uses.dead == {na, nb, nc} and g.nodes[-1].op == "Identity" and g.nodes[-1].outputs == [c]
    uses.sweep()
    assert [n.op for n in g.nodes] == ["Identity"] and uses.readers(x) == [g.nodes[0]]
