"""Whole models auto-scheduled with a time budget: untuned Ember, tuned Ember and onnxruntime in one run.

    python bench/auto_models.py [--models resnet18,mobilenet_v2,bert4] [--budget 900] [--target "c -threads=1"]
                                [--logdir bench_logs] [--template-trials 0] [--repeat 20] [--json]

Per model (ONNX built by `ember.zoo`, random weights): `ember tune MODEL --auto --time-budget BUDGET` (the
command line, in a subprocess, its output kept in LOGDIR/<model>.out; a log already there is resumed, so a
second run only tunes what the budget left), then untuned Ember, Ember compiled with the tuning log, and
onnxruntime (1 intra-op thread, no spinning) timed in turns (`interleaved_medians`), each checked against
onnxruntime's output. Prints one table (median ms, speedups); the last line of `--json` is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ember  # noqa: E402
from ember import zoo  # noqa: E402
from ember.runtime.compare import interleaved_medians, onnxruntime_session  # noqa: E402

MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    "resnet18": zoo.resnet18,
    "mobilenet_v2": zoo.mobilenet_v2,
    "bert4": lambda: zoo.bert_encoder(layers=4, seq=128),
}


def tune(name: str, path: str, args: argparse.Namespace, log: Path) -> float:
    """Run `ember tune --auto` on the model for the budget; its output goes to LOGDIR/<name>.out. Seconds taken."""
    cmd = [sys.executable, "-m", "ember.cli", "tune", path, "--auto", "--trials", "100000", "--time-budget",
           str(args.budget), "--target", args.target, "--log", str(log), "--seed", str(args.seed),
           "--template-trials", str(args.template_trials)]  # fmt: skip
    t0 = time.perf_counter()
    with open(Path(args.logdir) / f"{name}.out", "a") as out:
        subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=True)
    return time.perf_counter() - t0


def max_rel_diff(got, want) -> float:
    got = got if isinstance(got, tuple) else (got,)
    return max(float(np.max(np.abs(g - w)) / (np.max(np.abs(w)) + 1e-12)) for g, w in zip(got, want))


def compare(model: onnx.ModelProto, feeds: dict, log: Path, args: argparse.Namespace) -> dict:
    """Untuned Ember, Ember with the tuning log and onnxruntime, timed in turns; errors against onnxruntime."""
    sess = onnxruntime_session(model, 1)
    want = sess.run(None, feeds)
    untuned = ember.compile(model, target=args.target)
    tuned = ember.compile(model, target=args.target, tuning_log=str(log))
    ins = [feeds[i.name] for i in model.graph.input if i.name in feeds]
    err = {"untuned": max_rel_diff(untuned(*ins), want), "tuned": max_rel_diff(tuned(*ins), want)}
    t = interleaved_medians({"untuned": lambda: untuned(*ins), "tuned": lambda: tuned(*ins),
                             "onnxruntime": lambda: sess.run(None, feeds)}, args.repeat)  # fmt: skip
    return {"untuned_ms": t["untuned"] * 1e3, "tuned_ms": t["tuned"] * 1e3, "onnxruntime_ms": t["onnxruntime"] * 1e3,
            "vs_untuned": t["untuned"] / t["tuned"], "vs_onnxruntime": t["onnxruntime"] / t["tuned"],
            "max_rel_err": err, "replayed": tuned.summary().get("replayed_workloads")}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--budget", type=float, default=900.0, help="seconds of tuning per model (default 900)")
    p.add_argument("--target", default="c -threads=1")
    p.add_argument("--logdir", default="bench_logs")
    p.add_argument("--template-trials", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--skip-tuning", action="store_true", help="time with the logs already in LOGDIR")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        p.error(f"unknown model(s) {unknown}; known: {list(MODELS)}")
    Path(args.logdir).mkdir(parents=True, exist_ok=True)
    rows = {}
    for name in names:
        model = MODELS[name]()
        feeds = zoo.random_feeds(model)
        log = Path(args.logdir) / f"{name}.jsonl"
        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / f"{name}.onnx")
            onnx.save(model, path)
            seconds = 0.0 if args.skip_tuning else tune(name, path, args, log)
        rows[name] = {"tune_s": seconds, **compare(model, feeds, log, args)}
        print(f"{name}: tuned {seconds:.0f} s; {rows[name]}", flush=True)
    print(f"\ntarget {args.target!r}, tuning budget {args.budget:.0f} s per model, medians of {args.repeat} runs")
    head = (f"{'model':<14} {'untuned':>10} {'tuned':>10} {'onnxruntime':>12} {'tuned vs untuned':>17} "
            f"{'tuned vs ort':>13} {'max rel err':>11}")  # fmt: skip
    print(head)
    print("-" * len(head))
    for name, r in rows.items():
        print(f"{name:<14} {r['untuned_ms']:7.2f} ms {r['tuned_ms']:7.2f} ms {r['onnxruntime_ms']:9.2f} ms "
              f"{r['vs_untuned']:16.2f}x {r['vs_onnxruntime']:12.2f}x {max(r['max_rel_err'].values()):11.1e}")
    if args.json:
        print(json.dumps({"target": args.target, "budget_s": args.budget, "models": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
