"""`ember tune MODEL --trials N --log LOG [--tuner xgb|ga|random|grid] [--target T] [--plot PNG]`, measured here, or
on remote devices with `--rpc HOST:PORT[,HOST:PORT...] --key KEY --devices N [--ray ADDRESS]` (the command line
builds that measurer with `ember.rpc.measure.pool_measurer`: this layer only parses the options)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--trials", type=int, default=64, help="measurements per tunable workload (default 64)")
    p.add_argument("--log", required=True, help="JSON-lines tuning log (appended; a re-run resumes from it)")
    p.add_argument("--tuner", default="xgb", choices=["xgb", "ga", "random", "grid"])
    p.add_argument("--target", default="c")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D,D,...")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8, help="candidates built in parallel, then measured")
    p.add_argument("--max-tasks", type=int, default=None, help="tune only the N heaviest workloads")
    p.add_argument("--plot", metavar="PNG", help="plot best GFLOP/s so far vs trials (needs matplotlib)")
    p.add_argument("--run-timeout", type=float, default=20.0, help="seconds before a candidate run is killed")
    p.add_argument("--auto", action="store_true",
                   help="template-free auto-scheduling of every kernel (--trials per kernel on average)")
    p.add_argument("--template-trials", type=int, default=0, metavar="N",
                   help="with --auto: also tune the templated workloads N trials each (the log keeps the faster)")
    p.add_argument("--time-budget", type=float, default=None, metavar="S", help="with --auto: stop after S seconds")
    p.add_argument("--no-cache-flush", dest="cache_flush", action="store_false",
                   help="time candidates on warm caches (default: each timed call of a CPU kernel after the caches "
                   "were flushed, as it runs in the model: its weights come from memory)")
    p.add_argument("--no-algorithms", dest="algorithms", action="store_false",
                   help="keep the compiler's estimate of each 3x3 convolution's algorithm (direct or "
                   "Winograd) instead of measuring them first")
    p.add_argument("--confirm", type=int, default=3, metavar="N",
                   help="with --auto: measure each kernel's best against its default N more times, in turns, and "
                   "keep the faster by their medians (0: off)")
    r = p.add_argument_group("measuring on remote devices (device servers: `ember rpc server`)")
    r.add_argument("--rpc", metavar="HOST:PORT[,...]", help="measure on these device servers (a device pool)")
    r.add_argument("--key", help="with --rpc: the device key to measure on")
    r.add_argument("--devices", type=int, default=None, help="with --rpc: measure on N devices at once (default all)")
    r.add_argument("--token-file", help="with --rpc: a file holding the servers' token")
    r.add_argument("--root-cert", help="with --rpc: connect with TLS, trusting this PEM certificate")
    r.add_argument("--ray", metavar="ADDRESS", help="with --rpc: the pool on Ray: a cluster's address, or 'local' "
                   "for one started here")
    r.add_argument("--repeat", type=int, default=10, help="with --rpc: timed runs per candidate on the device")


def read_tasks(args: argparse.Namespace, extract: Callable[..., list]) -> list | None:
    """The tasks `extract` (a task extractor: the template tuner's or the auto-scheduler's) finds in `args.model`
    for `args.target` at the `--input-shape`s, the first `--max-tasks` of them; None, the error printed, where
    the model cannot be read."""
    from ember.frontend.onnx import ModelError
    from ember.frontend.show import parse_shape

    shapes = dict(parse_shape(x) for x in args.input_shape) or None
    try:
        tasks = extract(args.model, args.target, input_shapes=shapes)
    except (ModelError, FileNotFoundError, ValueError, NotImplementedError) as e:
        print(f"ember tune: {e}", file=sys.stderr)
        return None
    return tasks if args.max_tasks is None else tasks[: args.max_tasks]


def choose_algorithms(args: argparse.Namespace) -> dict[str, str] | None:
    """Each stride-1 3x3 convolution's algorithm measured (`ember.tune.algorithms`), the choices logged
    and printed; None, the error printed, where the model cannot be read."""
    from ember.frontend.onnx import ModelError
    from ember.frontend.show import parse_shape
    from ember.target import Target
    from ember.tune.algorithms import algorithms_table, measure_algorithms

    if not Target.parse(args.target).runs_here:
        print(f"convolution algorithms: the compiler's estimate (target '{args.target}' does not run here)")
        return {}
    shapes = dict(parse_shape(x) for x in args.input_shape) or None
    t0 = time.perf_counter()
    try:
        results = measure_algorithms(args.model, args.target, shapes, args.log)
    except (ModelError, FileNotFoundError, ValueError, NotImplementedError) as e:
        print(f"ember tune: {e}", file=sys.stderr)
        return None
    if results:
        resumed = sum(r.resumed for r in results)
        print(f"convolution algorithms, measured ({time.perf_counter() - t0:.0f} s"
              + (f"; {resumed} from the log" if resumed else "") + "):")  # fmt: skip
        print(algorithms_table(results))
        print()
    return {r.key: r.chosen for r in results}


def run_tune(args: argparse.Namespace, measurer: Any = None) -> int:
    """Tune as `args` say, measuring with `measurer` (a Measurer or another implementation: a remote one) or, by
    default, a local Measurer."""
    from ember.tune.driver import plot_history, summary_table, tune_tasks
    from ember.tune.measure import Measurer
    from ember.tune.task import extract_tasks

    t0 = time.perf_counter()
    chosen = None
    if args.algorithms and measurer is None:  # (measured here: not with a remote device pool)
        chosen = choose_algorithms(args)
        if chosen is None:
            return 1
    tasks = read_tasks(args, partial(extract_tasks, algorithms=chosen))
    if tasks is None:
        return 1
    print(f"ember tune: {args.model}: {len(tasks)} tunable workload(s), target '{args.target}', tuner {args.tuner}, "
          f"{args.trials} trials each, log {args.log}")  # fmt: skip
    for i, t in enumerate(tasks):
        print(f"  [{i + 1}] {t.template:<8} x{t.weight:<3} {len(t.space):>6} configs  "
              f"{t.flops / 1e6:9.1f} MFLOP  {t.name}")  # fmt: skip
    if not tasks:
        return 0
    local = Measurer(run_timeout=args.run_timeout, flush_cache=args.cache_flush) if measurer is None else None
    with nullcontext(measurer) if local is None else local as m:
        results = tune_tasks(tasks, args.tuner, args.trials, args.log, measurer=m, seed=args.seed,
                             batch_size=args.batch_size)  # fmt: skip
    print()
    print(summary_table(results))
    resumed = sum(r.resumed for r in results)
    print(f"{sum(len(r.trials) for r in results) - resumed} measured now, {resumed} from the log; "
          f"{time.perf_counter() - t0:.0f} s")  # fmt: skip
    if args.plot:
        curves = {f"{r.task.template} {r.task.name[:40]}": [r.best_so_far] for r in results}
        if plot_history(curves, args.plot, title=f"{args.tuner}: best GFLOP/s so far per workload"):
            print(f"plot: {args.plot}")
        else:
            print("plot: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
    print(f"apply: ember.compile(model, tuning_log={args.log!r})  or  ember bench MODEL --tuning-log {args.log}")
    return 0
