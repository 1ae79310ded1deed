"""Native kernels of the reductions (Reduce*, ArgMax, ArgMin, CumSum, CumProd, TopK) against onnxruntime, or
against the op's numpy reference where onnxruntime lacks the dtype or ONNX leaves the answer open (NaN, empty
reductions).

Table driven like test_lowering_pointwise: a group of independent nodes is one model, compiled once with
`ember.compile(model, fallback=False)`. The shapes cover each schedule of `ember.ops.reduce.schedule_reduce`:
rows (trailing axes) with and without the vectorized partial-result stage and with tails, columns (inner axes
kept, vectorized, in parallel chunks), mixed axes, keepdims, all axes, size 0 and rank 0. Inputs are positive
where sums are long, so that float32 accumulation in another order stays within 1e-4 relative."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.frontend.onnx import ONNX_DTYPES, from_onnx
from ember.ops.evaluate import evaluate
from ember.ops.reduce import RF_LANES

ort = pytest.importorskip("onnxruntime")
RTOL, ATOL = 1e-4, 1e-5
ELEM = {d: k for k, d in ONNX_DTYPES.items()}


@dataclass(frozen=True)
class R:
    """A random graph input; `nans` puts that many NaNs in; `ties` draws small integers (equal values)."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    low: float = 0.5
    high: float = 1.5
    nans: int = 0
    ties: bool = False

    def make(self, rng: np.random.Generator) -> np.ndarray:
        if self.dtype == "bool":
            return rng.random(self.shape) < 0.5
        if self.dtype.startswith(("int", "uint")) or self.ties:
            x = rng.integers(int(self.low), int(self.high), self.shape, endpoint=True).astype(self.dtype)
        else:
            x = rng.uniform(self.low, self.high, self.shape).astype(self.dtype)
        if self.nans and x.size:
            x.reshape(-1)[rng.choice(x.size, min(self.nans, x.size), replace=False)] = np.nan
        return x


@dataclass
class N:
    op: str
    inputs: list  # R specs (graph inputs) or arrays (initializers: axes)
    attrs: dict = field(default_factory=dict)
    ref: bool = False  # compare with Ember's numpy reference instead of onnxruntime
    outputs: int = 1


def build(nodes: list[N], opset: int, keep: list[int] | None = None) -> tuple[onnx.ModelProto, dict[str, R]]:
    inputs, inits, specs, onnx_nodes, outs = [], [], {}, [], []
    for k, n in enumerate(nodes):
        if keep is not None and k not in keep:
            continue
        names = []
        for i, spec in enumerate(n.inputs):
            names.append(f"n{k}_in{i}")
            if isinstance(spec, R):
                specs[names[-1]] = spec
                inputs.append(helper.make_tensor_value_info(names[-1], ELEM[spec.dtype], list(spec.shape)))
            else:
                inits.append(numpy_helper.from_array(np.asarray(spec), names[-1]))
        outs += [f"n{k}_{n.op}_out{j}" for j in range(n.outputs)]
        onnx_nodes.append(helper.make_node(n.op, names, outs[-n.outputs :], **n.attrs))
    out_infos = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs]
    graph = helper.make_graph(onnx_nodes, "group", inputs, out_infos, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(model, strict_mode=True), specs


def check_group(nodes: list[N], opset: int, rng: np.random.Generator) -> ember.runtime.executor.CompiledModel:
    model, specs = build(nodes, opset)
    feeds = {name: spec.make(rng) for name, spec in specs.items()}
    compiled = ember.compile(model, fallback=False)
    got = compiled.run(feeds)
    expected = evaluate(from_onnx(model), feeds)
    by_ort = [k for k, n in enumerate(nodes) if not n.ref]
    if by_ort:
        sub, sub_specs = build(nodes, opset, keep=by_ort)
        sess = ort.InferenceSession(sub.SerializeToString(), providers=["CPUExecutionProvider"])
        names = [o.name for o in sub.graph.output]
        expected.update(zip(names, sess.run(names, {name: feeds[name] for name in sub_specs})))
    for out in model.graph.output:
        g, e = got[out.name], np.asarray(expected[out.name])
        assert g.dtype == e.dtype and g.shape == e.shape, f"{out.name}: {g.dtype}{g.shape}, expected {e.dtype}{e.shape}"
        if e.dtype.kind == "f":
            np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL, err_msg=out.name)
        else:
            np.testing.assert_array_equal(g, e, err_msg=out.name)
    assert compiled.summary()["fallback_ops"] == []
    return compiled


REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
          "ReduceLogSumExp", "ReduceSumSquare"]  # fmt: skip
# (shape, axes): rows with a partial-result stage and a tail, without a tail, short rows, several trailing
# axes, all axes, columns (inner axes kept; 1000 columns run in parallel chunks), mixed axes
SHAPES = [((5, 77), [1]), ((3, 2, 64), [-1]), ((6, 9), [1]), ((2, 3, 5, 7), [2, 3]), ((3, 45), [0, 1]),
          ((40, 1000), [0]), ((4, 37, 6), [1]), ((3, 4, 50), [0, 2]), ((2, 50, 3, 2), [1, 2])]  # fmt: skip


def _reduce_nodes(ops: list[str], shapes: list) -> list[N]:
    """Each op on each shape, keepdims alternating."""
    nodes = []
    for op in ops:
        low, high = (0.9, 1.1) if op == "ReduceProd" else (0.5, 1.5)
        for i, (shape, axes) in enumerate(shapes):
            nodes.append(N(op, [R(shape, low=low, high=high), np.array(axes, np.int64)], {"keepdims": i % 2}))
    return nodes


GROUPS: dict[str, tuple[int, list[N]]] = {
    "sum-max-all-shapes": (18, _reduce_nodes(["ReduceSum", "ReduceMax"], SHAPES)),
    "reduce-ops": (18, _reduce_nodes(REDUCE, [SHAPES[0], SHAPES[5], SHAPES[7]])),
    "signed-values": (18, [N(op, [R((4, 70), low=-2, high=2), np.array([1], np.int64)]) for op in
                           ("ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2", "ReduceLogSumExp", "ReduceSumSquare")]
                      + [N("ReduceLogSumExp", [R((4, 70), low=50, high=90), np.array([1], np.int64)]),
                         N("ReduceLogSumExp", [R((60, 3), low=-90, high=-50), np.array([0], np.int64)])]),
    "defaults-and-opset13": (13, [
        N("ReduceMean", [R((2, 3, 40))], {"axes": [1]}),
        N("ReduceMax", [R((2, 3, 40))]),
        N("ReduceSum", [R((2, 3, 40)), np.array([], np.int64)], {"noop_with_empty_axes": 1}),
        N("ReduceSum", [R((2, 3, 40)), np.array([], np.int64)]),
        N("ReduceL2", [R((2, 3, 40))], {"axes": [0, 2], "keepdims": 0}),
    ]),
    "float64": (18, [N(op, [R((3, 70), "float64"), np.array([1], np.int64)]) for op in
                     ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceProd", "ReduceLogSumExp")]),
    "integers": (18, [
        *[N(op, [R((3, 70), dt, -9, 9), np.array([ax], np.int64)], {"keepdims": 0}, ref=True)
          for i, op in enumerate(("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2",
                                  "ReduceSumSquare"))
          for dt, ax in (("int32", i % 2), ("int64", 1 - i % 2))],
        N("ReduceProd", [R((3, 70), "int64", -2, 2), np.array([1], np.int64)], ref=True),
        N("ReduceSum", [R((3, 70), "int8", -100, 100), np.array([1], np.int64)], ref=True),  # wraps
        N("ReduceMax", [R((3, 70), "uint8", 0, 255), np.array([1], np.int64)], ref=True),
        N("ReduceLogSum", [R((3, 70), "int32", 1, 9), np.array([1], np.int64)], ref=True),
    ]),
    # numpy's max/min propagate NaN (ONNX does not say)
    "nan": (18, [N(op, [R(shape, low=-2, high=2, nans=2), np.array(axes, np.int64)], ref=True)
                 for op in ("ReduceMax", "ReduceMin", "ReduceSum", "ReduceLogSumExp")
                 for shape, axes in (((4, 70), [1]), ((70, 4), [0]), ((3, 9), [1]))]),
    # bool max/min (opset 20), size 0 (identities), rank 0
    "edges": (20, [
        N("ReduceMax", [R((3, 70), "bool"), np.array([1], np.int64)], ref=True),
        N("ReduceMin", [R((70, 3), "bool"), np.array([0], np.int64)], ref=True),
        *[N(op, [R((3, 0)), np.array([1], np.int64)], ref=True) for op in REDUCE],
        *[N(op, [R((0, 50)), np.array([1], np.int64)]) for op in ("ReduceSum", "ReduceMax")],
        N("ReduceSum", [R((3, 0, 40)), np.array([2], np.int64)]),
        N("ReduceSum", [R((), "float32"), np.array([], np.int64)], {"keepdims": 1}),
        N("ReduceMean", [R((1, 1, 1))]),
    ]),
    # CumSum/CumProd (a reduction under a window condition) and TopK (ranks, then the index of each rank)
    "scans-topk": (18, [
        *[N("CumSum", [R(shape, low=-2, high=2), np.array(axis, np.int64)], {"exclusive": ex, "reverse": rev})
          for shape, axis in (((7,), 0), ((3, 40), 1), ((3, 40), 0), ((2, 3, 4), -2))
          for ex, rev in ((0, 0), (1, 0), (0, 1), (1, 1))],
        N("CumSum", [R((4, 9), "int32", -9, 9), np.array(1, np.int64)], {"exclusive": 1}),
        N("CumSum", [R((0, 3)), np.array(0, np.int64)]),
        *[N("TopK", [R(shape, low=0, high=3, ties=ties), np.array([k], np.int64)], {"axis": ax, "largest": lg},
            outputs=2) for shape, ax, k, lg, ties in (((3, 40), 1, 5, 1, True), ((3, 40), 1, 7, 0, False),
                                                      ((6, 5, 4), 0, 6, 1, False), ((6, 5, 4), -1, 0, 1, True))],
        N("TopK", [R((2, 9), "int64", -3, 3), np.array([4], np.int64)], outputs=2),
        N("TopK", [R((2, 9), "uint64", 0, 3), np.array([4], np.int64)], {"largest": 0}, outputs=2, ref=True),
        N("TopK", [R((3, 9), nans=4), np.array([9], np.int64)], outputs=2, ref=True),
        N("TopK", [R((3, 9), nans=4), np.array([9], np.int64)], {"largest": 0}, outputs=2, ref=True),
    ]),
    "cumprod": (26, [N("CumProd", [R((3, 20), low=0.8, high=1.2), np.array(ax, np.int64)],
                       {"exclusive": ex, "reverse": rev}, ref=True)
                     for ax, ex, rev in ((1, 0, 0), (1, 1, 1), (0, 1, 0), (0, 0, 1))]),
    "arg": (13, [
        N(op, [R(shape, low=0, high=3, ties=True)], {"axis": axis, "keepdims": kd, "select_last_index": last})
        for op in ("ArgMax", "ArgMin") for shape in ((3, 37), (2, 5, 70)) for axis in range(-1, len(shape))
        for kd, last in ((0, 0), (1, 1)) if (kd + axis + len(shape)) % 2 or op == "ArgMax"
    ]),
    "arg-nan-int-f64": (13, [
        *[N(op, [R((4, 70), low=0, high=3, ties=True, nans=3)], {"axis": ax, "select_last_index": last}, ref=True)
          for op in ("ArgMax", "ArgMin") for ax, last in ((0, 0), (1, 1))],
        *[N(op, [R((4, 70), dt, -9, 9)], {"axis": ax}) for op, ax in (("ArgMax", 0), ("ArgMin", 1))
          for dt in ("int32", "int64", "float64")],
        N("ArgMax", [R((4, 70), "uint8", 0, 3)], {"axis": 1, "select_last_index": 1}, ref=True),
        N("ArgMin", [R((4, 70), "int8", -3, 3)], {"axis": 0}, ref=True),
    ]),
}  # fmt: skip


@pytest.mark.parametrize("group", GROUPS)
def test_group_matches_oracle(group: str, rng: np.random.Generator):
    opset, nodes = GROUPS[group]
    check_group(nodes, opset, rng)


def test_rows_accumulate_in_vector_registers():
    """ReduceMean over the last axis of [64, 768]: partial sums of RF_LANES lanes in one vector register per
    row, rows in parallel; not one sequential add per element."""
    model, _ = build([N("ReduceMean", [R((64, 768)), np.array([-1], np.int64)])], 18)
    source = ember.compile(model, fallback=False).source
    assert f"float32x{RF_LANES} " in source and "ember_vload_float32x" in source
    assert "ember_parallel_for(" in source


def test_columns_vectorize_the_kept_inner_axis():
    model, _ = build([N("ReduceMax", [R((300, 64)), np.array([0], np.int64)])], 18)
    source = ember.compile(model, fallback=False).source
    assert "ember_vload_float32x" in source and "not vectorized" not in source
