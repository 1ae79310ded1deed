"""Tuners: which configs of a task's space to measure next.

Every tuner proposes batches of unvisited configs (`next_batch`) and learns from their results
(`update`, fed by the driver with fresh measurements and, on resume, with the log's records):

- `RandomTuner`: uniform samples without replacement;
- `GridTuner`: the points in index order (the first knob varies fastest);
- `GATuner`: a steady-state genetic algorithm over the knobs: parents drawn from the best
  measured configs in proportion to their speed, uniform crossover per knob, mutation;
- `XGBTuner`: a gradient-boosted ranking model (XGBoost) on features of each candidate's lowered
  loop IR (`ember.tune.features`), refit on all measurements after each batch; the next batch is
  found by simulated annealing over the space on the model's scores (parallel walkers moving to
  random neighbours) and picked from the best-scored points with a bonus for knob values the batch
  does not have yet (diversity), plus a few random points (exploration).

`make_tuner("xgb", ...)` falls back to the GA tuner, with a warning, when xgboost is not installed.
"""

from __future__ import annotations

import heapq
import math
import random
import warnings
from typing import Any

import numpy as np

from ember.te.config import ConfigEntity
from ember.tune.measure import MeasureResult

TUNERS = ("random", "grid", "ga", "xgb")


class Tuner:
    name = "base"

    def __init__(self, task: Any, seed: int = 0):
        self.task = task
        self.space = task.space
        self.rng = random.Random(seed)
        self.seed = seed
        self.visited: set[int] = set()
        self.configs: list[ConfigEntity] = []
        self.scores: list[float] = []  # GFLOP/s, 0 for errors
        self.best_score = 0.0
        self.best_config: ConfigEntity | None = None

    def has_next(self) -> bool:
        return len(self.visited) < len(self.space)

    def next_batch(self, n: int) -> list[ConfigEntity]:
        raise NotImplementedError

    def update(self, results: list[MeasureResult]) -> None:
        flops = self.task.flops
        for r in results:
            idx = r.config.index
            self.visited.add(idx)
            score = r.gflops(flops)
            self.configs.append(r.config)
            self.scores.append(score)
            if score > self.best_score:
                self.best_score, self.best_config = score, r.config
        self._learn()

    def _learn(self) -> None:
        """Subclasses refit their state after results arrive."""

    def _random(self, n: int, taken: set[int]) -> list[ConfigEntity]:
        return self.space.sample(self.rng, n, self.visited | taken)


class RandomTuner(Tuner):
    name = "random"

    def next_batch(self, n: int) -> list[ConfigEntity]:
        return self._random(n, set())


class GridTuner(Tuner):
    name = "grid"

    def __init__(self, task: Any, seed: int = 0):
        super().__init__(task, seed)
        self._next = 0

    def next_batch(self, n: int) -> list[ConfigEntity]:
        out = []
        while len(out) < n and self._next < len(self.space):
            if self._next not in self.visited:
                out.append(self.space.get(self._next))
            self._next += 1
        return out


class GATuner(Tuner):
    """Steady-state GA: each new candidate is a child of two of the `pop_size` best measured
    configs (chosen in proportion to their speed), each knob from either parent, then mutated
    with probability `mutation` per knob. Random points until a population exists."""

    name = "ga"

    def __init__(self, task: Any, seed: int = 0, pop_size: int = 16, mutation: float = 0.1):
        super().__init__(task, seed)
        self.pop_size = pop_size
        self.mutation = mutation

    def next_batch(self, n: int) -> list[ConfigEntity]:
        good = [(s, c) for s, c in zip(self.scores, self.configs) if s > 0]
        if len(good) < min(self.pop_size, 4):
            return self._random(n, set())
        pop = heapq.nlargest(self.pop_size, good, key=lambda t: t[0])
        weights = [s for s, _ in pop]
        digits = [self.space.digits(c.index) for _, c in pop]
        sizes = [len(k) for k in self.space.knobs.values()]
        out, taken = [], set()
        for _ in range(50 * n):
            if len(out) >= n:
                break
            a, b = self.rng.choices(range(len(pop)), weights=weights, k=2)
            child = [digits[a][i] if self.rng.random() < 0.5 else digits[b][i] for i in range(len(sizes))]
            for i, size in enumerate(sizes):
                if size > 1 and self.rng.random() < self.mutation:
                    child[i] = self.rng.randrange(size)
            idx = self.space.index_of(child)
            if idx not in self.visited and idx not in taken:
                taken.add(idx)
                out.append(self.space.get(idx))
        if len(out) < n:
            out += self._random(n - len(out), taken)
        return out


class XGBTuner(Tuner):
    """Model-based: XGBoost ranking model on loop-IR features, simulated annealing, diverse batches."""

    name = "xgb"

    def __init__(self, task: Any, seed: int = 0, min_train: int = 8, plan_size: int = 8, n_walkers: int = 48,
                 sa_iters: int = 80, eps: float = 0.05, diversity: float = 0.2, loss: str = "rank",
                 max_depth: int = 6, rounds: int = 80):  # fmt: skip
        import xgboost  # noqa: F401  (ImportError: make_tuner falls back)

        super().__init__(task, seed)
        self.min_train, self.plan_size = min_train, plan_size
        self.n_walkers, self.sa_iters = n_walkers, sa_iters
        self.eps, self.diversity, self.loss = eps, diversity, loss
        self.max_depth, self.rounds = max_depth, rounds
        self.model = None
        self._feats: dict[int, np.ndarray] = task.feature_cache  # shared by the task's tuners

    # -- features and model -----------------------------------------------------------------------
    def features(self, indices: list[int]) -> np.ndarray:
        from ember.tune.features import candidate_features, config_features, n_features

        rows = []
        for i in indices:
            f = self._feats.get(i)
            if f is None:
                try:
                    f = candidate_features(self.task, self.space.get(i))
                except Exception:  # a config that does not even lower: never proposed by the model
                    f = np.full(n_features() + len(config_features(self.space, self.space.get(i))), -1.0,
                                dtype=np.float32)  # fmt: skip
                self._feats[i] = f
            rows.append(f)
        return np.stack(rows)

    def _learn(self) -> None:
        if len(self.scores) < self.min_train or max(self.scores) <= 0:
            return
        import xgboost as xgb

        x = self.features([c.index for c in self.configs])
        y = np.asarray(self.scores, dtype=np.float32) / max(self.scores)
        params = {"max_depth": self.max_depth, "eta": 0.3, "gamma": 1e-4, "min_child_weight": 1, "subsample": 1.0,
                  "lambda": 1.0, "alpha": 0.0, "nthread": 1, "verbosity": 0, "seed": self.seed,
                  "objective": "rank:pairwise" if self.loss == "rank" else "reg:squarederror"}  # fmt: skip
        self.model = xgb.train(params, xgb.DMatrix(x, label=y), num_boost_round=self.rounds)

    def predict(self, indices: list[int]) -> np.ndarray:
        return self.model.inplace_predict(self.features(indices))

    # -- proposing ----------------------------------------------------------------------------
    def next_batch(self, n: int) -> list[ConfigEntity]:
        if self.model is None:
            return self._random(max(1, min(n, self.min_train - len(self.scores))), set())
        n = min(n, self.plan_size)
        cands = self._anneal(max(3 * n, 16))
        picked = self._diverse(cands, n)
        taken = {c.index for c in picked}
        for i in range(len(picked)):  # exploration: a few random points
            if self.rng.random() < self.eps:
                extra = self._random(1, taken)
                if extra:
                    taken.add(extra[0].index)
                    picked[i] = extra[0]
        if len(picked) < n:
            picked += self._random(n - len(picked), taken)
        return picked

    def _anneal(self, keep: int) -> list[tuple[float, int]]:
        """The `keep` best-scored unvisited points met by simulated annealing (score, index)."""
        space = self.space
        best_measured = sorted(range(len(self.scores)), key=lambda i: -self.scores[i])[: self.n_walkers // 2]
        starts = [self.configs[i].index for i in best_measured]
        starts += [c.index for c in space.sample(self.rng, self.n_walkers - len(starts))]
        cur = list(starts)
        cur_s = self.predict(cur)
        spread = float(np.std(cur_s)) or 1.0
        top: dict[int, float] = {}

        def offer(idx: int, s: float) -> None:
            if idx not in self.visited:
                top[idx] = s

        for i, s in zip(cur, cur_s):
            offer(i, float(s))
        stale = 0
        for it in range(self.sa_iters):
            temp = spread * (1.0 - it / self.sa_iters) + 1e-9
            new = [space.random_neighbour(space.get(i), self.rng).index for i in cur]
            new_s = self.predict(new)
            before = _top_keys(top, keep)
            for w, (i, s) in enumerate(zip(new, new_s)):
                offer(i, float(s))
                if s >= cur_s[w] or self.rng.random() < math.exp((s - cur_s[w]) / temp):
                    cur[w], cur_s[w] = i, s
            stale = stale + 1 if _top_keys(top, keep) == before else 0
            if stale >= 15:
                break
        return sorted(((s, i) for i, s in top.items()), reverse=True)[:keep]

    def _diverse(self, cands: list[tuple[float, int]], n: int) -> list[ConfigEntity]:
        """Greedy: the best score plus a bonus for each knob value the batch does not have yet."""
        if not cands:
            return []
        scores = np.array([s for s, _ in cands], dtype=np.float64)
        lo, hi = scores.min(), scores.max()
        norm = (scores - lo) / (hi - lo) if hi > lo else np.ones_like(scores)
        digits = [self.space.digits(i) for _, i in cands]
        covered: list[set[int]] = [set() for _ in self.space.knobs]
        out, used = [], set()
        nk = max(1, len(covered))
        while len(out) < n and len(used) < len(cands):
            best, gain = None, -1.0
            for j, d in enumerate(digits):
                if j in used:
                    continue
                new = sum(1 for k, v in enumerate(d) if v not in covered[k]) / nk
                g = norm[j] + self.diversity * new
                if g > gain:
                    best, gain = j, g
            used.add(best)
            for k, v in enumerate(digits[best]):
                covered[k].add(v)
            out.append(self.space.get(cands[best][1]))
        return out


def _top_keys(top: dict[int, float], k: int) -> frozenset[int]:
    return frozenset(heapq.nlargest(k, top, key=top.get))


def make_tuner(name: str, task: Any, seed: int = 0) -> Tuner:
    """A tuner by name: random, grid, ga, xgb (xgb without xgboost installed: ga, with a warning)."""
    if name == "random":
        return RandomTuner(task, seed)
    if name == "grid":
        return GridTuner(task, seed)
    if name == "ga":
        return GATuner(task, seed)
    if name == "xgb":
        try:
            return XGBTuner(task, seed)
        except ImportError:
            warnings.warn("xgboost is not installed (pip install 'ember[tune]'): tuning with the GA tuner instead",
                          stacklevel=2)  # fmt: skip
            return GATuner(task, seed)
    raise ValueError(f"unknown tuner {name!r}; choose from {', '.join(TUNERS)}")
