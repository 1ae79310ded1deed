"""`ember tune MODEL --auto`: template-free auto-scheduling of every kernel of a model (the template tuner too,
for `--template-trials` per templated workload: the log keeps both, and compile replays the faster)."""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial


def run_auto(args: argparse.Namespace) -> int:
    from ember.frontend.show import parse_shape
    from ember.tune.cli import choose_algorithms, read_tasks
    from ember.tune.measure import Measurer

    from .scheduler import plot_progress, summary_table, tune_auto
    from .task import extract_auto_tasks

    t0 = time.perf_counter()
    chosen = None
    if args.algorithms:
        chosen = choose_algorithms(args)
        if chosen is None:
            return 1
    tasks = read_tasks(args, partial(extract_auto_tasks, algorithms=chosen))
    if tasks is None:
        return 1
    budget = args.trials * len(tasks)
    print(f"ember tune --auto: {args.model}: {len(tasks)} kernel(s), target '{args.target}', {budget} trials in all "
          f"({args.trials} per kernel on average), log {args.log}")  # fmt: skip
    for i, t in enumerate(tasks):
        print(f"  [{i + 1}] x{t.weight:<3} {t.flops / 1e6:9.1f} MFLOP  {', '.join(t.space.sketches):<28} {t.name}")
    if not tasks:
        return 0
    with Measurer(run_timeout=args.run_timeout, flush_cache=args.cache_flush) as m:
        if args.template_trials:
            from ember.tune.driver import tune_tasks
            from ember.tune.task import extract_tasks

            shapes = dict(parse_shape(x) for x in args.input_shape) or None
            templated = extract_tasks(args.model, args.target, input_shapes=shapes, algorithms=chosen)
            tune_tasks(templated, args.tuner, args.template_trials, args.log, measurer=m, seed=args.seed,
                       batch_size=args.batch_size)  # fmt: skip
        result = tune_auto(tasks, budget, m, args.log, batch_size=args.batch_size, seed=args.seed,
                           time_budget=args.time_budget, confirm_rounds=args.confirm)  # fmt: skip
    print()
    print(summary_table(result))
    errors = sum(s.search.errors for s in result.states)
    print(f"{sum(s.search.trials for s in result.states)} trials, {errors} failed; {time.perf_counter() - t0:.0f} s")
    if args.plot:
        if plot_progress(result, args.plot):
            print(f"plot: {args.plot}")
        else:
            print("plot: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
    print(f"apply: ember.compile(model, tuning_log={args.log!r})  or  ember bench MODEL --tuning-log {args.log}")
    return 0
