"""Driving a tuning run: tasks x tuner x measurer x log, with progress and a summary.

`tune_task` measures up to `n_trial` configs of one task: configs already in the log for this
workload and target count as trials done and are never measured again (a killed run resumes where
it stopped), except failures that may not happen again (a build worker that died, a time-out:
`MeasureResult.transient`), which are measured first; deterministic errors (a compile error, a
wrong answer, a runner that crashed) stay as logged. Each measured batch is appended to the log
before the tuner learns from it.
`tune_model` extracts a model's tasks and tunes each; `summary_table` and `plot_history` show
the results.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ember.te.config import ConfigEntity, ConfigError
from ember.tune.log import TuningLog, make_record, result_of
from ember.tune.measure import Measurer, MeasureResult
from ember.tune.task import Task
from ember.tune.tuners import Tuner, make_tuner


@dataclass
class TuneResult:
    """What one task's tuning found: per trial, its GFLOP/s (0 for an error) and the best so far."""

    task: Task
    tuner: str
    trials: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    best_config: ConfigEntity | None = None
    best_gflops: float = 0.0
    fallback_gflops: float | None = None
    resumed: int = 0  # trials taken from the log
    seconds: float = 0.0

    @property
    def best_so_far(self) -> list[float]:
        out, best = [], 0.0
        for g in self.trials:
            best = max(best, g)
            out.append(best)
        return out

    @property
    def n_errors(self) -> int:
        return sum(self.errors.values())


Callback = Callable[[TuneResult, list[MeasureResult]], None]


def tune_task(task: Task, tuner: Tuner | str, n_trial: int, measurer: Measurer, log: TuningLog | str | None = None,
              batch_size: int = 8, seed: int = 0, include_fallback: bool = True,
              callbacks: Sequence[Callback] = ()) -> TuneResult:  # fmt: skip
    """Tune one task: up to n_trial configs in all (those in the log included)."""
    t0 = time.perf_counter()
    if isinstance(tuner, str):
        tuner = make_tuner(tuner, task, seed)
    if isinstance(log, str):
        log = TuningLog(log)
    res = TuneResult(task, tuner.name)
    space = task.space
    fallback = space.fallback()
    retry: list[ConfigEntity] = []  # logged failures that may not happen again, measured first
    if log is not None:
        prior = logged_results(log, task)
        retry = [r.config for r in prior if r.transient]
        prior = [r for r in prior if not r.transient]
        if prior:
            _account(res, tuner, prior, task, fallback)
            res.resumed = len(prior)
            for cb in callbacks:
                cb(res, prior)
    while len(res.trials) < n_trial and (retry or tuner.has_next()):
        n = min(batch_size, n_trial - len(res.trials))
        batch, retry = retry[:n], retry[n:]
        taken = {c.index for c in batch + retry}
        if include_fallback and fallback.index not in tuner.visited | taken and not res.trials and len(batch) < n:
            batch.append(fallback)
            taken.add(fallback.index)
        if len(batch) < n:
            batch += [c for c in tuner.next_batch(n - len(batch)) if c.index not in taken]
        if not batch:
            break
        results = measurer.measure(task, batch)
        if log is not None:
            log.append([make_record(task, r) for r in results])
        _account(res, tuner, results, task, fallback)
        for cb in callbacks:
            cb(res, results)
    res.seconds = time.perf_counter() - t0
    return res


def logged_results(log: TuningLog, task: Task) -> list[MeasureResult]:
    """The log's measurements of the task, as results of configs of its space, oldest first (records of
    another version of the template, whose configs the space no longer has, are left out)."""
    prior = []
    for rec in log.measured(task.workload, task.target).values():
        r = result_of(rec)
        try:
            r.config = task.space.entity(r.config.values)
        except ConfigError:
            continue
        prior.append(r)
    return sorted(prior, key=lambda r: r.timestamp)


def _account(res: TuneResult, tuner: Tuner, results: list[MeasureResult], task: Task, fallback: ConfigEntity) -> None:
    tuner.update(results)
    for r in results:
        g = r.gflops(task.flops)
        res.trials.append(g)
        if not r.ok:
            res.errors[r.error or "runtime"] = res.errors.get(r.error or "runtime", 0) + 1
        if r.config.index == fallback.index:
            res.fallback_gflops = g
        if g > res.best_gflops:
            res.best_gflops, res.best_config = g, r.config


def tune_tasks(tasks: Sequence[Task], tuner: str, n_trial: int, log: str | None, measurer: Measurer | None = None,
               seed: int = 0, batch_size: int = 8, progress: bool = True) -> list[TuneResult]:  # fmt: skip
    """Tune each task in turn with a fresh tuner of kind `tuner` (a tqdm progress bar per task)."""
    own = measurer is None
    measurer = measurer or Measurer()
    out = []
    try:
        for i, task in enumerate(tasks):
            bar = _progress(task, i, len(tasks), n_trial) if progress else None
            cbs = [bar.update_from] if bar else []
            try:
                out.append(tune_task(task, tuner, n_trial, measurer, log, batch_size=batch_size, seed=seed,
                                     callbacks=cbs))  # fmt: skip
            finally:
                if bar:
                    bar.close()
    finally:
        if own:
            measurer.close()
    return out


class _Bar:
    """tqdm bar for one task: trials done, best GFLOP/s so far, errors (plain lines without tqdm)."""

    def __init__(self, label: str, total: int):
        self.label, self.total, self.done = label, total, 0
        try:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=label, unit="trial", dynamic_ncols=True, leave=True)
        except ImportError:
            self.bar = None

    def update_from(self, res: TuneResult, batch: list[MeasureResult]) -> None:
        n = len(res.trials) - self.done
        self.done = len(res.trials)
        post = {"best": f"{res.best_gflops:.1f} GFLOP/s", "errors": res.n_errors}
        if self.bar is not None:
            self.bar.set_postfix(post, refresh=False)
            self.bar.update(n)
        else:
            print(f"{self.label}: {self.done}/{self.total} trials, best {res.best_gflops:.1f} GFLOP/s, "
                  f"{res.n_errors} errors", flush=True)  # fmt: skip

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _progress(task: Task, i: int, n: int, total: int) -> _Bar:
    return _Bar(f"[{i + 1}/{n}] {task.template} {_short_name(task)}", total)


def _short_name(task: Task, width: int = 40) -> str:
    name = task.name.replace("float32", "f32")
    return name if len(name) <= width else name[: width - 3] + "..."


def summary_table(results: Sequence[TuneResult]) -> str:
    """One row per task: weight, trials, errors, fallback and best GFLOP/s, speedup, time share."""
    head = (f"{'task':<44} {'template':<8} {'w':>3} {'trials':>6} {'err':>4} {'fallback':>9} {'tuned':>9} "
            f"{'speedup':>7}")  # fmt: skip
    lines = [head, "-" * len(head)]
    tot_fb = tot_best = 0.0
    for r in results:
        fb, best = r.fallback_gflops, r.best_gflops
        speed = f"{best / fb:6.2f}x" if fb and best else "      -"
        fbs = f"{fb:9.1f}" if fb else "        -"
        lines.append(f"{_short_name(r.task, 44):<44} {r.task.template:<8} {r.task.weight:>3} {len(r.trials):>6} "
                     f"{r.n_errors:>4} {fbs} {best:9.1f} {speed}")  # fmt: skip
        if fb and best:
            w = r.task.weight * r.task.flops
            tot_fb += w / fb
            tot_best += w / best
    if tot_fb and tot_best:
        lines.append(f"estimated time in tuned kernels: {tot_best / tot_fb:.2f}x of the fallback's "
                     f"({tot_fb / tot_best:.2f}x faster), GFLOP/s columns per kernel call")  # fmt: skip
    return "\n".join(lines)


def plot_history(curves: dict[str, list[list[float]]], path: str, title: str = "best so far") -> bool:
    """PNG of best-so-far GFLOP/s vs trials, one line per tuner (mean over runs, the runs faint).
    Returns False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (name, runs) in enumerate(curves.items()):
        color = f"C{i}"
        n = max((len(r) for r in runs), default=0)
        if not n:
            continue
        padded = [r + [r[-1]] * (n - len(r)) if r else [0.0] * n for r in runs]
        for r in padded:
            ax.plot(range(1, n + 1), r, color=color, alpha=0.2, lw=0.8)
        mean = [sum(col) / len(col) for col in zip(*padded)]
        ax.plot(range(1, n + 1), mean, color=color, lw=2, label=name)
    ax.set_xlabel("trials")
    ax.set_ylabel("best GFLOP/s so far")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def tune_model(model: Any, target: str = "c", n_trial: int = 64, log: str | None = None, tuner: str = "xgb",
               input_shapes: dict | None = None, measurer: Measurer | None = None, seed: int = 0,
               progress: bool = True) -> list[TuneResult]:  # fmt: skip
    """Extract a model's tasks and tune each (see `tune_task`)."""
    from ember.tune.task import extract_tasks

    tasks = extract_tasks(model, target, input_shapes=input_shapes)
    return tune_tasks(tasks, tuner, n_trial, log, measurer=measurer, seed=seed, progress=progress)
