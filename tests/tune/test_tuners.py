"""Tuners on a real template space with synthetic measurements (no compiles): distinct proposals,
budgets, learning from history; xgb falls back to GA without xgboost."""

import math
import sys

import pytest

from ember.tune import Task, tune_task
from ember.tune.measure import MeasureResult
from ember.tune.tuners import TUNERS, GATuner, make_tuner


class FakeMeasurer:
    """Cost from the knob values: a smooth bowl with the optimum at one corner of the space."""

    def __init__(self, task):
        self.task, self.calls = task, []

    def cost(self, cfg):
        knobs = list(self.task.space.knobs.values())
        d = self.task.space.digits(cfg.index)
        target = [len(k) - 1 for k in knobs]
        return 1e-3 * (1 + sum((a - b) ** 2 / len(k) for a, b, k in zip(d, target, knobs)))

    def measure(self, task, configs):
        self.calls.append([c.index for c in configs])
        return [MeasureResult(c, costs=(self.cost(c),)) for c in configs]


@pytest.fixture(scope="module")
def task():
    return Task.from_op("MatMul", [(8, 2), (2, 16)])


@pytest.mark.parametrize("name", TUNERS)
def test_tuner_proposes_distinct_configs_within_budget(task, name):
    if name == "xgb":
        pytest.importorskip("xgboost")
    fm = FakeMeasurer(task)
    res = tune_task(task, name, 40, fm, batch_size=8, seed=1, include_fallback=False)
    seen = [i for batch in fm.calls for i in batch]
    assert len(seen) == 40 == len(set(seen)) == len(res.trials)
    assert res.best_gflops == max(res.trials) > 0
    assert res.best_so_far == sorted(res.best_so_far)


def test_model_based_tuners_beat_random_on_a_smooth_space(task):
    pytest.importorskip("xgboost")

    def trials_to_best(name, seed):
        fm = FakeMeasurer(task)
        res = tune_task(task, name, 64, fm, batch_size=8, seed=seed, include_fallback=False)
        best = task.flops / fm.cost(task.space.get(len(task.space) - 1)) / 1e9
        hit = [i for i, g in enumerate(res.best_so_far) if g >= 0.95 * best]
        return hit[0] + 1 if hit else 65

    xgb = sum(trials_to_best("xgb", s) for s in range(2))
    rnd = sum(trials_to_best("random", s) for s in range(2))
    assert xgb <= rnd, (xgb, rnd)


def test_xgb_falls_back_to_ga_without_xgboost(task, monkeypatch):
    monkeypatch.setitem(sys.modules, "xgboost", None)
    with pytest.warns(UserWarning, match="xgboost is not installed"):
        tuner = make_tuner("xgb", task)
    assert isinstance(tuner, GATuner)


def test_unknown_tuner(task):
    with pytest.raises(ValueError, match="unknown tuner"):
        make_tuner("annealing", task)
    assert math.isfinite(FakeMeasurer(task).cost(task.space.get(0)))
