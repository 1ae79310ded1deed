"""The task scheduler: a model's trial budget spent where the expected end-to-end gain is largest.

Every task first gets one round (its default schedule and a batch of candidates). Then, round after round,
the task with the largest expected gain gets the next batch: its weight (kernels that use it) times its best
time so far is its share of the model's latency, and the gain expected from one more round is that share times
its recent rate of improvement (how much its best dropped over its last rounds, plus a small floor so that
a task never measured much is still explored). A task whose best has not improved for `patience` rounds is
stopped. Each round prints one progress line; `summary_table` and `plot_progress` show the outcome.

A best found once can be a lucky measurement (on a shared machine, the best of many noisy timings is biased low):
when the budget is spent, `confirm` measures each task's best against its default schedule again, in turns,
`confirm_rounds` times, and logs both with their median as records marked "confirmed", which the log reader
prefers for that workload (`ember.te.config.load_tuned`): a kernel keeps its default unless the best is faster
in that fair comparison.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ember.tune.log import TuningLog, make_record
from ember.tune.measure import Measurer, MeasureResult

from .search import EvolutionarySearch
from .task import AutoTask


@dataclass
class TaskState:
    search: EvolutionarySearch
    bests: list[float] = field(default_factory=list)  # best time after each round
    stopped: bool = False

    @property
    def task(self) -> AutoTask:
        return self.search.task

    def share(self) -> float:
        best = self.search.best_cost
        return self.task.weight * best if math.isfinite(best) else 0.0

    def expected_gain(self, floor: float = 0.02) -> float:
        """Latency the next round is expected to save: share x recent relative improvement per round."""
        if len(self.bests) < 2:
            return self.share()
        window = self.bests[-3:]
        rate = (window[0] - window[-1]) / max(window[0], 1e-12) / (len(window) - 1)
        return self.share() * (max(rate, 0.0) + floor)


@dataclass
class ScheduleResult:
    states: list[TaskState]
    curve: list[tuple[int, float, float]]  # (trials so far, time of the kernels measured so far: tuned, default)
    seconds: float


def estimated_latency(states: Sequence[TaskState]) -> tuple[float, float]:
    """(tuned, default) time of the kernels measured so far, each weighted by its occurrences."""
    done = [s for s in states if s.search.default_cost is not None and math.isfinite(s.search.default_cost)]
    return sum(s.share() for s in done), sum(s.task.weight * s.search.default_cost for s in done)  # type: ignore[misc]


def tune_auto(tasks: Sequence[AutoTask], n_trials: int, measurer: Measurer, log: str | None = None,
              batch_size: int = 8, patience: int = 3, seed: int = 0, time_budget: float | None = None,
              confirm_rounds: int = 3, out=sys.stdout) -> ScheduleResult:  # fmt: skip
    """Auto-schedule `tasks` with `n_trials` measurements in all (see the module doc); records go to `log`."""
    t0 = time.perf_counter()
    tlog = TuningLog(log) if log else None
    states = [TaskState(EvolutionarySearch(t, measurer, seed=seed + i, log=tlog)) for i, t in enumerate(tasks)]
    curve: list[tuple[int, float, float]] = []
    used = 0

    def run_round(i: int) -> None:
        nonlocal used
        st = states[i]
        before = st.search.trials
        st.search.round(batch_size)
        used += st.search.trials - before
        st.bests.append(st.search.best_cost)
        if len(st.bests) > patience and st.bests[-1] >= st.bests[-1 - patience] * 0.995:
            st.stopped = True
        curve.append((used, *estimated_latency(states)))
        d, b = st.search.default_cost, st.search.best_cost
        print(f"[{i + 1}/{len(states)}] {st.task.name[:48]:<48} trials {st.search.trials:>4}  default {_us(d)}  "
              f"best {_us(b)}  errors {st.search.errors}{'  (stopped)' if st.stopped else ''}  "
              f"[{used}/{n_trials}, {time.perf_counter() - t0:.0f} s]", file=out, flush=True)  # fmt: skip

    def out_of_budget() -> bool:
        late = time_budget is not None and time.perf_counter() - t0 > time_budget
        return used >= n_trials or late

    for i in range(len(states)):
        if out_of_budget():
            break
        run_round(i)
    while not out_of_budget():
        live = [i for i, s in enumerate(states) if not s.stopped and s.bests]
        if not live:
            break
        run_round(max(live, key=lambda i: states[i].expected_gain()))
    if confirm_rounds > 0:
        for st in states:
            confirm(st, measurer, tlog, confirm_rounds, out)
    return ScheduleResult(states, curve, time.perf_counter() - t0)


def confirm(st: TaskState, measurer: Measurer, tlog: TuningLog | None, rounds: int, out=sys.stdout) -> None:
    """Measure the task's best and its default again, in turns, `rounds` times; log each one's median as a
    "confirmed" record, and keep the median times as the task's default and best."""
    search, best = st.search, st.search.best
    if best is None or search.default_cost is None or not best[1].cost < search.default_cost:
        return
    task = st.task
    configs = [task.space.fallback(), task.config(best[0].sketch, best[0].decisions)]
    runs: list[list[MeasureResult]] = [[], []]
    for _ in range(rounds):
        for i, r in enumerate(measurer.measure(task, configs)):
            runs[i].append(r)
    medians = []
    for rs in runs:
        ok = sorted((r for r in rs if r.ok), key=lambda r: r.cost)
        if len(ok) < len(rs):  # the pair is not comparable: leave the records as they are
            return
        medians.append(ok[len(ok) // 2])
    if tlog is not None:
        tlog.append([{**make_record(task, r), "confirmed": True} for r in medians])  # type: ignore[attr-defined]
    d, b = medians[0].cost, medians[1].cost
    print(f"confirm {task.name[:48]:<48} default {_us(d)}  best {_us(b)}  ({d / b:.2f}x, medians of {rounds}: "
          f"{'kept' if b < d else 'the default wins'})", file=out, flush=True)  # fmt: skip
    search.default_cost = d
    search.measured[best[0].key] = search.confirmed = (best[0], medians[1])


def _us(cost: float | None) -> str:
    return f"{cost * 1e6:9.1f} us" if cost is not None and math.isfinite(cost) else "        - us"


def summary_table(result: ScheduleResult) -> str:
    """One row per task: weight, trials, errors, default and best time, speedup, the winning sketch."""
    head = f"{'task':<48} {'w':>3} {'trials':>6} {'err':>4} {'default':>12} {'best':>12} {'speedup':>7}  sketch"
    lines = [head, "-" * len(head)]
    tot_d = tot_b = 0.0
    for s in result.states:
        d, b = s.search.default_cost, s.search.best_cost
        best = s.search.best
        won = best[0].sketch if best is not None and d is not None and best[1].cost < d else "default"
        speed = f"{d / b:6.2f}x" if d and math.isfinite(d) and math.isfinite(b) else "      -"
        lines.append(f"{s.task.name[:48]:<48} {s.task.weight:>3} {s.search.trials:>6} {s.search.errors:>4} "
                     f"{_us(d)} {_us(b)} {speed}  {won}")  # fmt: skip
        if d and math.isfinite(d) and math.isfinite(b):
            tot_d += s.task.weight * d
            tot_b += s.task.weight * b
    if tot_b:
        lines.append(f"estimated time in these kernels: {tot_d * 1e3:.3f} ms by default, {tot_b * 1e3:.3f} ms tuned "
                     f"({tot_d / tot_b:.2f}x)")  # fmt: skip
    return "\n".join(lines)


def plot_progress(result: ScheduleResult, path: str) -> bool:
    """PNG of the time of the kernels measured so far (weighted by occurrences), tuned and by default, against
    trials (a kernel enters the curves with its first round); False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [x for x, _, _ in result.curve]
    ax.plot(xs, [t * 1e3 for _, t, _ in result.curve], lw=2, label="tuned")
    ax.plot(xs, [d * 1e3 for _, _, d in result.curve], lw=1, ls="--", label="default schedules")
    ax.set_xlabel("trials")
    ax.set_ylabel("time of the kernels measured so far (ms)")
    ax.legend()
    ax.set_title("auto-scheduling: latency against trials")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
