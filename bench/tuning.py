"""Tuners compared: trials each needs to reach 95% of the best kernel any of them found.

    python bench/tuning.py [--trials 48] [--seeds 3] [--tuners random,grid,ga,xgb] [--target "c -threads=1"]
                           [--batch-size 8] [--plot tuning.png] [--json]

Two workloads: a 512x512x512 dense (MatMul, the GEMM template) and ResNet-18's 3x3 convolution at
64 channels on 56x56 in the blocked layout that `ember.compile` gives it (ConvNCHWc, the conv_nchwc
template; channel block = the vector lanes). Each tuner runs `--trials` measurements per workload for
each seed. Every distinct config is built and measured once per workload and its result shared by
all tuners and seeds (so the tuners are compared on the same numbers, not on timing noise; a tuner
still pays one trial for each config it proposes). Printed: the fallback config (the untuned
templates) against the best found, and per tuner the trials to reach 95% of the best found by any
tuner (a run that never gets there counts the whole budget, marked '+'), averaged over seeds; the
bar is xgb at most half of random. `--json` prints one JSON object on the last line.
Single-threaded by default (`--target`): timings on a shared 2-core machine are steadier.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ember.templates import nn as T  # noqa: E402
from ember.tune import Measurer, Task, tune_task  # noqa: E402
from ember.tune.driver import logged_results, plot_history  # noqa: E402
from ember.tune.log import TuningLog, make_record  # noqa: E402

_CB = T.lanes_of("float32", T.host_target())  # the channel block ConvertLayout picks on this machine
WORKLOADS = {
    "dense 512x512x512": ("MatMul", [(512, 512), (512, 512)], {}),
    "conv3x3 64ch 56x56": ("ConvNCHWc", [(1, 64 // _CB, 56, 56, _CB), (64 // _CB, 64 // _CB, 3, 3, _CB, _CB)],
                           {"pads": (1, 1, 1, 1), "strides": (1, 1), "dilations": (1, 1)}),
}  # fmt: skip


class _LoggedCache(dict):
    """The measurement cache, preloaded from a tuning log; each new entry is appended to it."""

    def __init__(self, task: Task, log: TuningLog):
        super().__init__()
        self.task, self.log = task, log
        for r in logged_results(log, task):  # an earlier run's measurements
            dict.__setitem__(self, (task.workload, task.target, r.config.key()), r)

    def __setitem__(self, key, result) -> None:
        super().__setitem__(key, result)
        self.log.append([make_record(self.task, result)])


def trials_to(curve: list[float], goal: float) -> tuple[int, bool]:
    """(trials until best-so-far reaches goal, reached); the whole budget when never."""
    for i, g in enumerate(curve):
        if g >= goal:
            return i + 1, True
    return len(curve), False


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=48, help="measurements per tuner, seed and workload")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--tuners", default="random,grid,ga,xgb")
    p.add_argument("--target", default="c -threads=1")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated names (default: both)")
    p.add_argument("--plot", metavar="PNG", help="best-so-far curves per tuner (needs matplotlib)")
    p.add_argument("--log", metavar="JSONL", help="keep every measurement in this tuning log; a re-run reuses them")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    tuners = [t for t in args.tuners.split(",") if t]
    names = [w for w in args.workloads.split(",") if w]
    t0 = time.perf_counter()
    out: dict = {"budget": args.trials, "seeds": args.seeds, "target": args.target, "workloads": {}}
    curves: dict[str, list[list[float]]] = {t: [] for t in tuners}
    for wname in names:
        op, inputs, attrs = WORKLOADS[wname]
        task = Task.from_op(op, inputs, attrs, target=args.target)
        cache: dict = _LoggedCache(task, TuningLog(args.log)) if args.log else {}
        runs: dict[str, list[list[float]]] = {t: [] for t in tuners}
        errors = 0
        space = task.space
        print(f"{wname}: {task.template} template, {len(space)} configs, "
              f"{task.flops / 1e9:.2f} GFLOP per call", file=sys.stderr, flush=True)  # fmt: skip
        with Measurer(cache=cache) as m:
            fallback = m.measure(task, [task.space.fallback()])[0]
            for tuner in tuners:
                for seed in range(args.seeds):
                    ts = time.perf_counter()
                    r = tune_task(task, tuner, args.trials, m, batch_size=args.batch_size, seed=seed,
                                  include_fallback=False)  # fmt: skip
                    runs[tuner].append(r.best_so_far)
                    errors += r.n_errors
                    print(f"  {tuner:<6} seed {seed}: best {r.best_gflops:7.1f} GFLOP/s  "
                          f"({len(cache)} configs measured so far, {time.perf_counter() - ts:.0f} s)",
                          file=sys.stderr, flush=True)  # fmt: skip
            m.cache = None  # the fallback once more, uncached: its speed is the baseline of the table
            fb = max(fallback.gflops(task.flops), m.measure(task, [space.fallback()])[0].gflops(task.flops))
        best = max(max(c) for rs in runs.values() for c in rs if c)
        per = {}
        for tuner, rs in runs.items():
            hits = [trials_to(c, 0.95 * best) for c in rs]
            per[tuner] = {"trials_to_95": statistics.mean(n for n, _ in hits), "reached": sum(ok for _, ok in hits),
                          "best_gflops": statistics.mean(max(c) for c in rs)}  # fmt: skip
            curves[tuner] += [[g / best for g in c] for c in rs]
        out["workloads"][wname] = {"space": len(task.space), "fallback_gflops": fb, "best_gflops": best,
                                   "speedup_vs_fallback": best / fb if fb else None, "distinct_measured": len(cache),
                                   "errors": errors, "tuners": per}  # fmt: skip
    out["trials_to_95"] = {t: statistics.mean(out["workloads"][w]["tuners"][t]["trials_to_95"] for w in names)
                           for t in tuners}  # fmt: skip
    if "xgb" in tuners and "random" in tuners:
        out["xgb_over_random"] = out["trials_to_95"]["xgb"] / out["trials_to_95"]["random"]
    out["seconds"] = time.perf_counter() - t0
    print_table(out, tuners, names)
    if args.plot:
        ok = plot_history(curves, args.plot, title="best so far / best found by any tuner (both workloads)")
        print(f"plot: {args.plot}" if ok else "plot: matplotlib is not installed")
    if args.json:
        print(json.dumps(out))
    return 0


def print_table(out: dict, tuners: list[str], names: list[str]) -> None:
    print(f"\ntarget '{out['target']}', budget {out['budget']} trials per run, {out['seeds']} seeds")
    print(f"{'workload':<20} {'configs':>7} {'measured':>8} {'fallback':>9} {'best':>9} {'speedup':>8}   GFLOP/s")
    for w in names:
        r = out["workloads"][w]
        sp = f"{r['speedup_vs_fallback']:7.2f}x" if r["speedup_vs_fallback"] else "       -"
        print(f"{w:<20} {r['space']:>7} {r['distinct_measured']:>8} {r['fallback_gflops']:9.1f} "
              f"{r['best_gflops']:9.1f} {sp}")  # fmt: skip
    print("\ntrials to 95% of the best found by any tuner (mean over seeds; '+': some runs never got there)")
    head = f"{'tuner':<8}" + "".join(f"{w:>22}" for w in names) + f"{'mean':>8}   best GFLOP/s per workload"
    print(head)
    for t in tuners:
        cells = ""
        for w in names:
            r = out["workloads"][w]["tuners"][t]
            mark = "+" if r["reached"] < out["seeds"] else " "
            cells += f"{r['trials_to_95']:>21.1f}{mark}"
        bests = "  ".join(f"{out['workloads'][w]['tuners'][t]['best_gflops']:.1f}" for w in names)
        print(f"{t:<8}{cells}{out['trials_to_95'][t]:>8.1f}   {bests}")
    if "xgb_over_random" in out:
        ok = "meets" if out["xgb_over_random"] <= 0.5 else "misses"
        print(f"xgb / random trials: {out['xgb_over_random']:.2f} ({ok} the bar of <= 0.5)")
    print(f"wall time {out['seconds']:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
