"""Measured implementation choices: which algorithm each stride-1 3x3 convolution of a model runs (direct,
Winograd F(2x2, 3x3) or F(4x4, 3x3)), decided by timing them here rather than by the compiler's estimate.

`ember.passes.layout` picks an implementation by a cost model (`winograd_gain`), calibrated on one machine: on
another its threshold can fall on the wrong side (on a Zen 4 core, ResNet's 512-channel 7x7 layers run 1.4x
faster as Winograd F(2x2) than direct, where the estimate says 1.07x and keeps them direct). TVM tunes each
implementation of an op as a task of its own and compiles the fastest; here each such convolution, alone in a
graph of its own (its input, weights and bias as in the model after the passes before ConvertLayout), is
compiled once per algorithm and its convolution kernels timed in turns (`rounds` profiles of `repeat` runs
each, the median). The fastest is logged (one record per convolution, workload "algo:<key>", template
"algorithm", marked confirmed) unless the compiler's own choice is within `margin` of it: the log then says the
compiler's choice, so that noise does not move a layer. `ember.compile(..., tuning_log=...)` hands the logged
choices to the layout pass (`ember.te.config.algorithms`); `ember tune` (templates, and `--auto`) runs this before
it extracts the kernels to search, so that it tunes the kernels the model will run.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

from ember.graph.ir import Graph, Node
from ember.ops.common import spatial_attrs
from ember.passes import PASSES
from ember.passes.layout import CONV_ALGORITHMS, AlgorithmChoices, algorithm_choices, conv_algorithm_key
from ember.target import Target
from ember.te.config import ALGORITHM, ALGORITHM_PREFIX
from ember.tune.log import VERSION, TuningLog
from ember.tune.task import passed_graph

MARGIN = 0.03  # another algorithm replaces the compiler's choice only when it measured this much faster


@dataclass
class AlgorithmResult:
    key: str  # `conv_algorithm_key`
    default: str  # the compiler's choice (its estimate)
    times: dict[str, float]  # median seconds of the convolution kernels per algorithm
    chosen: str
    uses: int = 1  # convolutions of the model with this key
    resumed: bool = False  # taken from the log (measured by an earlier run)

    @property
    def speedup(self) -> float:
        return self.times[self.default] / self.times[self.chosen]


def conv_workloads(model: Any, target: Target, input_shapes: dict | None = None) -> dict[str, tuple[str, Node, int]]:
    """The convolutions of `model` with a choice of algorithm: key -> (the compiler's choice, one such
    convolution node as ConvertLayout meets it, how many share the key)."""
    layout = next(i for i, p in enumerate(PASSES) if p.name == "convert_layout")
    before = passed_graph(model, target, input_shapes, passes=PASSES[:layout])
    seen = AlgorithmChoices()
    passed_graph(before, target, passes=PASSES[layout : layout + 1], algorithms=seen)  # (on a copy)
    if not seen.seen:
        return {}
    out: dict[str, tuple[str, Node, int]] = {}
    for node in before.nodes:
        if node.op != "Conv" or len(node.inputs[0].shape) != 4:
            continue
        _, pads, _ = spatial_attrs(node.attrs, 2)
        key = conv_algorithm_key(node.inputs[0].type, node.outputs[0].shape[1], tuple(pads))
        if key in seen.seen:
            default, first, uses = out.get(key, (seen.seen[key], node, 0))
            out[key] = (default, first, uses + 1)
    return out


def _alone(node: Node, i: int) -> Graph:
    x = node.inputs[0]
    return Graph(f"algo{i}", [x], list(node.outputs[:1]), [Node(node.op, node.inputs, node.outputs[:1],
                                                                  dict(node.attrs), node.name)])  # fmt: skip


def _conv_seconds(model: Any, repeat: int) -> float:
    return sum(r["seconds"] for r in model.profile(repeat=repeat) if any(op.startswith("Conv") for op in r["ops"]))


def measure_algorithms(model: Any, target: str | Target, input_shapes: dict | None = None, log: str | None = None,
                       rounds: int = 5, repeat: int = 10, margin: float = MARGIN,
                       progress: Any = None) -> list[AlgorithmResult]:  # fmt: skip
    """Time every algorithm of every convolution of `model` that has a choice (see the module doc); log the
    choices to `log` (a convolution it already holds a choice for, with its times, is not measured again).
    `progress(result)` is called after each convolution."""
    import ember

    target = Target.parse(target)
    if not target.runs_here:
        raise ValueError(f"measuring algorithms needs a target that runs here, not {target}")
    tlog = TuningLog(log) if log else None
    logged = {r["workload"]: r for r in (tlog.records(target=str(target)) if tlog else [])
              if r.get("template") == ALGORITHM and isinstance(r.get("alternatives"), dict)}  # fmt: skip
    results = []
    for i, (key, (default, node, uses)) in enumerate(conv_workloads(model, target, input_shapes).items()):
        rec = logged.get(ALGORITHM_PREFIX + key)
        if rec is not None and set(rec["alternatives"]) == set(CONV_ALGORITHMS):  # measured by an earlier run
            chosen = rec["config"]["knobs"].get(ALGORITHM, default)
            results.append(AlgorithmResult(key, default, dict(rec["alternatives"]), chosen, uses, resumed=True))
            if progress is not None:
                progress(results[-1])
            continue
        t0 = time.perf_counter()
        compiled = {}
        for alg in CONV_ALGORITHMS:
            with algorithm_choices({key: alg}):
                compiled[alg] = ember.compile(_alone(node, i), target=target)
        samples: dict[str, list[float]] = {alg: [] for alg in compiled}
        for _ in range(rounds):
            for alg, m in compiled.items():
                samples[alg].append(_conv_seconds(m, repeat))
        times = {alg: statistics.median(ts) for alg, ts in samples.items()}
        fastest = min(times, key=times.__getitem__)
        chosen = default if times[default] <= times[fastest] * (1 + margin) else fastest
        res = AlgorithmResult(key, default, times, chosen, uses)
        results.append(res)
        if tlog is not None:
            tlog.append([{
                "workload": ALGORITHM_PREFIX + key, "template": ALGORITHM, "task": f"Conv 3x3 {key}",
                "target": str(target), "config": {"index": CONV_ALGORITHMS.index(chosen), "knobs": {ALGORITHM: chosen}},
                "cost": times[chosen], "costs": samples[chosen], "gflops": 0.0, "error": None,
                "build_s": round(time.perf_counter() - t0, 4), "timestamp": time.time(), "version": VERSION,
                "schedule": None, "confirmed": True, "alternatives": times,
            }])  # fmt: skip
        if progress is not None:
            progress(res)
    return results


def algorithms_table(results: list[AlgorithmResult]) -> str:
    """One line per convolution: each algorithm's time, the compiler's choice, the measured choice."""
    head = f"{'convolution':<44} {'uses':>4} " + " ".join(f"{a:>10}" for a in CONV_ALGORITHMS)
    lines = [head + f"  {'estimate':<10} {'chosen':<10} speedup", "-" * (len(head) + 38)]
    for r in results:
        cells = " ".join(f"{r.times[a] * 1e3:7.3f} ms" for a in CONV_ALGORITHMS)
        lines.append(f"{r.key[:44]:<44} {r.uses:>4} {cells}  {r.default:<10} {r.chosen:<10} {r.speedup:6.2f}x")
    return "\n".join(lines)
