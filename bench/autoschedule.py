"""Template-free auto-scheduling against the template tuner and against today's default schedules.

    python bench/autoschedule.py [--trials 32] [--target "c -threads=1"] [--seed 0] [--only NAMES] [--json]

1. parity: on the tuning bench's workloads (a 512^3 dense and ResNet-18's 3x3 conv at 64 channels in the
   blocked layout), the template tuner (xgb) and the auto-scheduler each get `--trials` measurements; parity is
   the worst over the workloads of (template best time / auto best time): 1.0 = as fast, >= 0.95 is the bar.
2. kernels without a template today (softmax rows, layer norm, pooling, a depthwise 3x3, an attention score matmul +
   softmax group; each op with its first output only, as models use them: MaxPool without Indices, LayerNormalization
   without Mean and InvStdDev): the default schedule (what `ember.compile` runs) against the auto-scheduler's best
   after `--trials` measurements: speedup = default time / auto time; bar 1.5x, or within 10% of the roofline bound
   (`ember.runtime.roofline`: the larger of flops / peak and the bytes each argument must move once / the machine's
   measured bandwidth for a working set of that size, cached per machine and target). The table prints both times
   (the measurer's medians), the speedup, the bound, each kernel's fraction of it, and the verdict: "1.5x" (speedup),
   "bound" (within 10% of the bound), or "below bar". The bound is a time on an idle machine, so the fractions use
   the least time of many short runs of the default and the best schedule, built again in this process and timed in
   turns (`--best-of`; the medians of a shared machine hold its load). "least x" is the speedup on those least times:
   where the medians' speedup and it disagree, the machine's load made the difference. "turns x" is the speedup on
   the medians of those same runs in turns: the search's medians ("speedup") compare one measurement of the default
   with the least of many candidates' medians, each taken at another moment of a shared machine's load (a selection
   bias: depthwise 3.77x by the search's medians, 0.99x by least times, on a loaded machine), so the "1.5x" verdict
   needs "least x" and "turns x". The roofline counts a transcendental call as one operation; the column "special" is
   the least time of the kernel's transcendental calls alone (one per element of each stage whose body calls exp,
   tanh, log or erf, each at the throughput of an Ember kernel that only calls it, vectorized, on a cache-resident
   array): a softmax cannot run faster than its exps, whatever its bytes.

Single-threaded by default, fixed seeds. The last line of `--json` is one JSON object with "parity" and
"untemplated_speedup" (per kernel) and the details.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ember import te  # noqa: E402
from ember.autoschedule.search import EvolutionarySearch  # noqa: E402
from ember.autoschedule.task import AutoTask, extract_auto_tasks  # noqa: E402
from ember.runtime.roofline import limits_for  # noqa: E402
from ember.templates import nn as T  # noqa: E402
from ember.tune import Measurer, Task, tune_task  # noqa: E402

_CB = T.lanes_of("float32", T.host_target())
PARITY = {
    "dense 512x512x512": ("MatMul", [(512, 512), (512, 512)], {}),
    "conv3x3 64ch 56x56": ("ConvNCHWc", [(1, 64 // _CB, 56, 56, _CB), (64 // _CB, 64 // _CB, 3, 3, _CB, _CB)],
                           {"pads": (1, 1, 1, 1), "strides": (1, 1), "dilations": (1, 1)}),
}  # fmt: skip
POOL = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "dilations": [1, 1]}
UNTEMPLATED = {
    "softmax 128x128": ("Softmax", [(128, 128)], {"axis": -1}),
    "softmax 12x197x197": ("Softmax", [(12, 197, 197)], {"axis": -1}),
    "layernorm 128x768": ("LayerNormalization", [(128, 768), (768,), (768,)], {"axis": -1}),
    "avgpool 64ch 56x56": ("AveragePool", [(1, 64, 56, 56)], {**POOL, "count_include_pad": 0}),
    "maxpool 64ch 56x56": ("MaxPool", [(1, 64, 56, 56)], POOL),
    "depthwise3x3 96ch 112x112": ("Conv", [(1, 96, 112, 112), (96, 1, 3, 3)],
                                  {"pads": [1, 1, 1, 1], "strides": [1, 1], "dilations": [1, 1], "group": 96}),
    "attention scores+softmax": None,  # a fused group: from a model
}  # fmt: skip


def attention_task(target: str) -> AutoTask:
    """The largest kernel of MatMul(12x197x64, 12x64x197) -> Mul -> Softmax, as the compiler groups it: the score
    product with its scale fused (60.1 MFLOP: 2 x 12 x 197 x 197 x 64, plus the scale); the Softmax over those
    scores is a kernel of its own, the one of "softmax 12x197x197"."""
    import onnx
    from onnx import TensorProto, helper

    q = helper.make_tensor_value_info("q", TensorProto.FLOAT, [12, 197, 64])
    k = helper.make_tensor_value_info("k", TensorProto.FLOAT, [12, 64, 197])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [12, 197, 197])
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [], [0.125])
    nodes = [helper.make_node("MatMul", ["q", "k"], ["s"]), helper.make_node("Mul", ["s", "scale"], ["t"]),
             helper.make_node("Softmax", ["t"], ["y"], axis=-1)]  # fmt: skip
    g = helper.make_graph(nodes, "attn", [q, k], [y], [scale])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    tasks = extract_auto_tasks(model, target)
    return max(tasks, key=lambda t: t.flops)


SPECIAL = {"exp": te.exp, "tanh": te.tanh, "log": te.log, "erf": te.erf}


def special_calls(task: AutoTask) -> dict[str, int]:
    """Transcendental calls the kernel must make: per stage, its elements times the calls in its body."""
    from ember.te.tensor import ComputeOp
    from ember.tir.expr import Call
    from ember.tir.functor import walk

    outs, _ = task.computes()
    count: dict[str, int] = {}
    for st in te.create_schedule(outs).stages:
        if isinstance(st.op, ComputeOp):
            for n in walk(st.op.body):
                if isinstance(n, Call) and n.name in SPECIAL:
                    count[n.name] = count.get(n.name, 0) + math.prod(st.op.shape)
    return count


def special_seconds(name: str, target: str, runs: int, n: int = 1 << 14) -> float:
    """Least seconds of one `name` call per element: an Ember kernel calling it on n cache-resident floats."""
    import ember
    from ember.templates.nn import host_target, lanes_of

    A = te.placeholder((n,), "float32", name="A")
    B = te.compute((n,), lambda i: SPECIAL[name](A[i]), name="B")
    s = te.create_schedule(B)
    s[B].vectorize(s[B].split(B.op.axis[0], lanes_of("float32", host_target()))[1])
    f = ember.build(s, [A, B], target=target)
    a, b = np.random.default_rng(0).standard_normal(n).astype("float32"), np.zeros(n, "float32")
    return min(f.benchmark(a, b, repeat=1, min_time=0.002)["min"] for _ in range(runs)) / n


def least_times(task: AutoTask, cfgs: dict, target: str, runs: int, medians: dict | None = None) -> dict[str, float]:
    """The least seconds per call of each config's kernel over `runs` short timed runs, the kernels in turns
    (`medians`, when given, receives each one's median over the same runs)."""
    import ember

    fns = {}
    for name, cfg in cfgs.items():
        sch, args = task.instantiate(cfg)
        fns[name] = ember.build(sch, args, target=target)
    arrays = [*task.random_inputs(), *[np.zeros(s, dt) for s, dt in task.arg_types()[-task.n_outputs :]]]
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(runs):
        for name, f in fns.items():
            times[name].append(f.benchmark(*arrays, repeat=1, min_time=0.002, warmup=1)["min"])
    if medians is not None:
        medians.update({name: statistics.median(ts) for name, ts in times.items()})
    return {name: min(ts) for name, ts in times.items()}


def auto_search(task: AutoTask, m: Measurer, trials: int, seed: int, batch: int) -> EvolutionarySearch:
    s = EvolutionarySearch(task, m, seed=seed)
    while s.trials < trials:
        s.round(min(batch, max(1, trials - s.trials)))
    return s


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=32)
    p.add_argument("--target", default="c -threads=1")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--best-of", type=int, default=30, help="short runs of default and best for the bound fraction")
    p.add_argument("--only", default="", help="comma-separated workload names (default: all)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    only = [x.strip() for x in args.only.split(",") if x.strip()]

    def wanted(name: str) -> bool:
        return not only or any(o in name for o in only)

    out: dict = {"target": args.target, "trials": args.trials, "seed": args.seed, "parity_detail": {},
                 "untemplated": {}}  # fmt: skip
    t0 = time.perf_counter()
    with Measurer(n_parallel=2, repeat=3, min_time=0.02, warmup=0.05, seed=args.seed) as m:
        print(f"{'workload':<28} {'template best':>14} {'auto best':>12} {'auto/template perf':>19}  sketch")
        for name, (op, ins, attrs) in PARITY.items():
            if not wanted(name):
                continue
            tt = Task.from_op(op, ins, attrs, target=args.target)
            tr = tune_task(tt, "xgb", args.trials, m, batch_size=args.batch_size, seed=args.seed)
            t_best = tt.flops / (tr.best_gflops * 1e9) if tr.best_gflops else math.inf
            at = AutoTask.from_op(op, ins, attrs, target=args.target)
            s = auto_search(at, m, args.trials, args.seed, args.batch_size)
            a_best = s.best_cost
            ratio = t_best / a_best
            best = s.best
            print(f"{name:<28} {t_best * 1e3:11.3f} ms {a_best * 1e3:9.3f} ms {ratio:18.2f}x  "
                  f"{best[0].sketch if best else '-'}", flush=True)  # fmt: skip
            out["parity_detail"][name] = {"template_s": t_best, "auto_s": a_best, "ratio": ratio,
                                          "template_errors": tr.n_errors, "auto_errors": s.errors}  # fmt: skip
        limits = limits_for(args.target)
        if limits is None:
            raise SystemExit(f"no roofline for target {args.target!r}: the untemplated kernels need a CPU target")
        out["limits"] = limits.to_json()
        print(f"\nroofline: peak {limits.peak_gflops:.0f} GFLOP/s, bandwidth (GB/s by working set) "
              + ", ".join(f"{s >> 10} KiB: {g:.0f}" for s, g in limits.bandwidth_gbs))
        print(f"{'kernel':<28} {'default':>11} {'auto':>11} {'speedup':>8} {'bound':>10} {'by':>7} "
              f"{'bd/default':>10} {'bd/auto':>8} {'least x':>7} {'turns x':>7} {'special':>10}  verdict  sketch")
        for name, spec in UNTEMPLATED.items():
            if not wanted(name):
                continue
            task = attention_task(args.target) if spec is None else AutoTask.from_op(*spec, args.target, outputs=1)
            s = auto_search(task, m, args.trials, args.seed, args.batch_size)
            nbytes = sum(math.prod(shape) * np.dtype(dt).itemsize for shape, dt in task.arg_types())
            bound, by = limits.bound(task.flops, nbytes)
            d, a = s.default_cost, s.best_cost
            speed = d / a
            sk = s.best[0].sketch if s.best and a < d else "default"
            cfgs = {"default": task.space.fallback()}
            if sk != "default":
                cfgs["auto"] = task.config(s.best[0].sketch, s.best[0].decisions)
            turns: dict[str, float] = {}
            least = least_times(task, cfgs, args.target, args.best_of, turns)
            ld, la = least["default"], min(least.values())
            least_speed = ld / least.get("auto", ld)  # the speedup on the least times (1.0: no auto winner)
            turns_speed = turns["default"] / turns.get("auto", turns["default"])  # medians of the same runs
            calls = special_calls(task)
            special = sum(k * special_seconds(name, args.target, args.best_of) for name, k in calls.items())
            fast = min(turns_speed, least_speed) >= 1.5
            verdict = "1.5x" if fast else ("bound" if bound / la >= 0.9 else "below bar")
            print(f"{name:<28} {d * 1e3:8.3f} ms {a * 1e3:8.3f} ms {speed:7.2f}x {bound * 1e3:7.3f} ms {by:>7} "
                  f"{bound / ld:10.2f} {bound / la:8.2f} {least_speed:6.2f}x {turns_speed:6.2f}x "
                  f"{special * 1e3:7.3f} ms  {verdict:<9} {sk}", flush=True)  # fmt: skip
            out["untemplated"][name] = {"default_s": d, "auto_s": a, "speedup": speed, "bound_s": bound,
                                        "bound_by": by, "bytes": nbytes, "flops": task.flops,
                                        "least_default_s": ld, "least_auto_s": la, "least_speedup": least_speed,
                                        "turns_median_s": turns, "turns_speedup": turns_speed,
                                        "special_calls": calls,
                                        "special_s": special,
                                        "default_bound_fraction": bound / ld, "bound_fraction": bound / la,
                                        "verdict": verdict, "errors": s.errors, "sketch": sk}  # fmt: skip
    ratios = [v["ratio"] for v in out["parity_detail"].values()]
    out["parity"] = min(ratios) if ratios else None
    out["untemplated_speedup"] = {k: v["speedup"] for k, v in out["untemplated"].items()}
    out["seconds"] = time.perf_counter() - t0
    print(f"\nparity (worst auto/template perf): {out['parity']}; {out['seconds']:.0f} s")
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
