"""Control flow: If, Loop, Scan. Bodies are `Graph`s held in attributes.

Closure convention: a body may read Values of the enclosing graph; the node lists those
captured Values as its trailing inputs, in the order `captures_of(attrs)` gives, so data
flow stays explicit for passes and the references stay pure functions of their inputs.
"""

from __future__ import annotations

import numpy as np

from ember.graph.ir import Graph, Value, captured_values
from ember.graph.types import TensorType
from ember.ops.common import norm_axis
from ember.ops.evaluate import evaluate_subgraph
from ember.ops.opdef import Attr, Pattern, ShapeDependsOnData, op


def captures_of(attrs: dict) -> list[Value]:
    """Outer Values the subgraphs in attrs read, in a fixed order (the node's trailing inputs)."""
    seen: dict[Value, None] = {}
    for value in attrs.values():
        if isinstance(value, Graph):
            seen.update(dict.fromkeys(captured_values(value)))
    return list(seen)


def _run_body(graph: Graph, args: list[np.ndarray], attrs: dict, captures: tuple | dict, check: bool = True) -> list:
    """The body's outputs; `captures`: the captured values (a dict by Value, made once per loop, or the node's
    trailing inputs)."""
    bound = captures if isinstance(captures, dict) else dict(zip(captures_of(attrs), captures))
    return evaluate_subgraph(graph, args, bound, check)


# -- If ------------------------------------------------------------------------------------------------
def _if_infer(a: dict, cond: TensorType, *captures: TensorType) -> tuple[TensorType, ...]:
    then_t = [v.type for v in a["then_branch"].outputs]
    else_t = [v.type for v in a["else_branch"].outputs]
    if then_t != else_t:
        raise ShapeDependsOnData(
            f"the branches of If give different types ({', '.join(map(str, then_t))} vs "
            f"{', '.join(map(str, else_t))}), so the output type depends on the condition"
        )
    return tuple(then_t)


@op("If", Pattern.OPAQUE, infer=_if_infer, inputs=(1, None),
    attrs=[Attr("then_branch", "graph"), Attr("else_branch", "graph")])  # fmt: skip
def if_(a: dict, cond: np.ndarray, *captures: np.ndarray) -> tuple[np.ndarray, ...]:
    branch = a["then_branch"] if bool(np.asarray(cond).reshape(-1)[0]) else a["else_branch"]
    return tuple(_run_body(branch, [], a, captures))


# -- Loop ----------------------------------------------------------------------------------------------
def _loop_split(a: dict, rest: tuple) -> tuple[int, int]:
    body = a["body"]
    carried = len(body.inputs) - 2
    return carried, len(body.outputs) - 1 - carried


def _loop_infer(a: dict, trips, cond, *rest: TensorType) -> tuple[TensorType, ...]:
    carried, scans = _loop_split(a, rest)
    body_out = [v.type for v in a["body"].outputs]
    if body_out[1 : 1 + carried] != list(rest[:carried]):
        raise ShapeDependsOnData("Loop-carried values change type between iterations")
    if scans and a["trip_count"] is None:
        raise ShapeDependsOnData("the length of Loop's scan outputs depends on its trip count")
    stacked = tuple(t.with_shape((a["trip_count"],) + t.shape) for t in body_out[1 + carried :])
    return tuple(rest[:carried]) + stacked


@op("Loop", Pattern.OPAQUE, infer=_loop_infer, inputs=(2, None),
    attrs=[Attr("body", "graph"), Attr("trip_count", "int", None)])  # fmt: skip
def loop(a: dict, trips, cond, *rest: np.ndarray) -> tuple[np.ndarray, ...]:
    """Run the body while i < trip count and the condition holds; stack the scan outputs.
    `trip_count` is set by the frontend when the iteration count is known statically."""
    carried, scans = _loop_split(a, rest)
    values, captures = list(rest[:carried]), dict(zip(captures_of(a), rest[carried:]))
    limit = int(np.asarray(trips).reshape(())) if trips is not None else None
    keep = bool(np.asarray(cond).reshape(())) if cond is not None else True
    stacked: list[list[np.ndarray]] = [[] for _ in range(scans)]
    i = 0
    while keep and (limit is None or i < limit):
        outs = _run_body(a["body"], [np.array(i, np.int64), np.array(keep), *values], a, captures, i == 0)
        keep = bool(np.asarray(outs[0]).reshape(()))
        values = outs[1 : 1 + carried]
        for j, s in enumerate(outs[1 + carried :]):
            stacked[j].append(s)
        i += 1
    body_out = a["body"].outputs[1 + carried :]
    scan_out = [
        np.stack(s) if s else np.zeros((0,) + v.type.shape, v.type.np_dtype) for s, v in zip(stacked, body_out)
    ]
    return tuple(values) + tuple(scan_out)


# -- Scan ----------------------------------------------------------------------------------------------
SCAN_ATTRS = [
    Attr("body", "graph"), Attr("num_scan_inputs", "int"), Attr("scan_input_axes", "ints", ()),
    Attr("scan_input_directions", "ints", ()), Attr("scan_output_axes", "ints", ()),
    Attr("scan_output_directions", "ints", ()),
]  # fmt: skip


def _scan_layout(a: dict) -> tuple[int, int, int]:
    """(state count, scan input count, scan output count)."""
    body = a["body"]
    m = a["num_scan_inputs"]
    n = len(body.inputs) - m
    return n, m, len(body.outputs) - n


def _axis_list(values: tuple[int, ...], count: int) -> list[int]:
    return list(values) if values else [0] * count


def _scan_infer(a: dict, *ts: TensorType) -> tuple[TensorType, ...]:
    n, m, k = _scan_layout(a)
    in_axes = _axis_list(a["scan_input_axes"], m)
    lengths = {t.shape[norm_axis(ax, t.rank)] for t, ax in zip(ts[n : n + m], in_axes)}
    if len(lengths) != 1:
        raise ShapeDependsOnData(f"Scan inputs have different sequence lengths {sorted(lengths)}")
    seq = lengths.pop()
    out_axes = _axis_list(a["scan_output_axes"], k)
    outs = []
    for v, ax in zip(a["body"].outputs[n:], out_axes):
        shape = list(v.type.shape)
        shape.insert(norm_axis(ax, len(shape) + 1), seq)
        outs.append(v.type.with_shape(tuple(shape)))
    return tuple(ts[:n]) + tuple(outs)


@op("Scan", Pattern.OPAQUE, infer=_scan_infer, inputs=(1, None), attrs=SCAN_ATTRS)
def scan(a: dict, *args: np.ndarray) -> tuple[np.ndarray, ...]:
    """Iterate the body over slices of the scan inputs, threading the state values."""
    n, m, k = _scan_layout(a)
    states, xs, captures = list(args[:n]), args[n : n + m], dict(zip(captures_of(a), args[n + m :]))
    in_axes = [norm_axis(ax, x.ndim) for ax, x in zip(_axis_list(a["scan_input_axes"], m), xs)]
    in_dirs = _axis_list(a["scan_input_directions"], m)
    seq = xs[0].shape[in_axes[0]] if xs else 0
    collected: list[list[np.ndarray]] = [[] for _ in range(k)]
    for t in range(seq):
        slices = [np.take(x, seq - 1 - t if d else t, axis=ax) for x, ax, d in zip(xs, in_axes, in_dirs)]
        outs = _run_body(a["body"], states + slices, a, captures, t == 0)
        states = outs[:n]
        for j, o in enumerate(outs[n:]):
            collected[j].append(o)
    results = []
    for j, (vals, v) in enumerate(zip(collected, a["body"].outputs[n:])):
        ax = norm_axis(_axis_list(a["scan_output_axes"], k)[j], v.type.rank + 1)
        if _axis_list(a["scan_output_directions"], k)[j]:
            vals = vals[::-1]
        results.append(np.stack(vals, axis=ax) if vals else np.zeros((0,) + v.type.shape, v.type.np_dtype))
    return tuple(states) + tuple(results)
