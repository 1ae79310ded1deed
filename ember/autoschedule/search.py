"""Evolutionary search over sketch annotations, scored by the learned cost model, measured in rounds.

Each round of `EvolutionarySearch.round(n)`:

1. a population: the best measured candidates so far and fresh random annotations of every sketch;
2. evolution for a few generations: parents drawn in proportion to the cost model's score; a child is a
   mutation (one decision drawn afresh: a tile size, parallel, vectorize, unroll, a compute location, an
   rfactor width) or a crossover of two parents of the same sketch (each decision from either); invalid children
   (a schedule that does not lower, or does not fit a GPU block) are dropped;
3. the `n` best by the model that were never measured (a few random ones for exploration) are measured, and
   the model is retrained on every measurement so far.

The cost model is the template tuner's: XGBoost (pairwise ranking) on `ember.tune.features.featurize` of the
candidate's loop IR, plus the sketch's index. Before it has enough data, candidates are random.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

import numpy as np

from ember.target import Target
from ember.te.schedule import ScheduleError
from ember.tune.features import featurize, n_features
from ember.tune.measure import Measurer, MeasureResult

from . import sketch as S
from .task import AutoTask

MIN_TRAIN = 8


@dataclass
class Candidate:
    sketch: str
    decisions: dict
    features: np.ndarray | None = None
    score: float = 0.0

    @property
    def key(self) -> str:
        return json.dumps([self.sketch, self.decisions], sort_keys=True)


class CostModel:
    """XGBoost ranking model on loop-IR features (the template tuner's model and parameters)."""

    def __init__(self, seed: int = 0, rounds: int = 60, max_depth: int = 6):
        self.seed, self.rounds, self.max_depth = seed, rounds, max_depth
        self.booster = None

    def fit(self, x: np.ndarray, y: np.ndarray) -> None:
        try:
            import xgboost as xgb
        except ImportError:  # no model: the search stays random
            return
        params = {"max_depth": self.max_depth, "eta": 0.3, "gamma": 1e-4, "min_child_weight": 1, "subsample": 1.0,
                  "lambda": 1.0, "alpha": 0.0, "nthread": 1, "verbosity": 0, "seed": self.seed,
                  "objective": "rank:pairwise"}  # fmt: skip
        self.booster = xgb.train(params, xgb.DMatrix(x, label=y), num_boost_round=self.rounds)

    def predict(self, x: np.ndarray) -> np.ndarray:
        if self.booster is None:
            return np.zeros(len(x), dtype=np.float32)
        return self.booster.inplace_predict(x)


@dataclass
class EvolutionarySearch:
    """The search state of one task (rounds can interleave with other tasks' rounds)."""

    task: AutoTask
    measurer: Measurer
    seed: int = 0
    population: int = 48
    generations: int = 3
    eps: float = 0.1
    log: object | None = None  # a TuningLog
    measured: dict[str, tuple[Candidate, MeasureResult]] = field(default_factory=dict)
    history: list[float] = field(default_factory=list)  # cost of each measurement (inf: an error), in order
    default_cost: float | None = None
    errors: int = 0
    confirmed: tuple[Candidate, MeasureResult] | None = None  # the best, measured again in turns with the default

    def __post_init__(self):
        self.rng = random.Random(self.seed)
        self.target = Target.parse(self.task.target)
        self.sketches = self.task.sketches()
        self.model = CostModel(self.seed)
        self.outs, self.args = self.task.computes()

    # -- candidates --------------------------------------------------------------------------
    def _make(self, sketch: S.Sketch, decisions: dict | None) -> Candidate | None:
        """A valid candidate (its decisions completed at random where missing), with its features."""
        try:
            sch, dec = S.apply(sketch, self.outs, self.target, decisions, self.rng)
            feats = featurize(S.check(sch, self.args, self.target))
        except (S.SketchError, ScheduleError):
            return None
        index = [s.name for s in self.sketches].index(sketch.name)
        return Candidate(sketch.name, dec, np.concatenate([feats, [float(index)]]).astype(np.float32))

    def random_candidates(self, n: int) -> list[Candidate]:
        out = []
        for _ in range(n * 3):
            if len(out) >= n:
                break
            c = self._make(self.rng.choice(self.sketches), None)
            if c is not None:
                out.append(c)
        return out

    def mutate(self, c: Candidate) -> Candidate | None:
        dec = dict(c.decisions)
        if dec:
            dec.pop(self.rng.choice(sorted(dec)))
        return self._make(self.task.sketch(c.sketch), dec)

    def crossover(self, a: Candidate, b: Candidate) -> Candidate | None:
        keys = set(a.decisions) | set(b.decisions)
        dec = {k: (a if self.rng.random() < 0.5 else b).decisions.get(k) for k in sorted(keys)}
        return self._make(self.task.sketch(a.sketch), {k: v for k, v in dec.items() if v is not None})

    def _score(self, cands: list[Candidate]) -> None:
        if not cands:
            return
        pred = self.model.predict(np.stack([c.features for c in cands]))
        for c, p in zip(cands, pred):
            c.score = float(p)

    # -- a round -----------------------------------------------------------------------------
    def propose(self, n: int) -> list[Candidate]:
        best = sorted((x for x in self.measured.values() if x[1].ok), key=lambda x: x[1].cost)
        pop = [c for c, _ in best[: self.population // 4]]
        if not self.measured:  # the first round: the rules' own choices first (`sketch.rule_candidates`)
            for sk in self.sketches:
                for dec in S.rule_candidates(sk, self.outs, self.target):
                    c = self._make(sk, dec)
                    if c is not None and c.key not in {p.key for p in pop}:
                        pop.append(c)
        rules = len(pop)
        pop += self.random_candidates(self.population - len(pop))
        if self.model.booster is not None:
            self._score(pop)
            for _ in range(self.generations):
                children = []
                weights = np.exp(np.array([c.score for c in pop]) - max(c.score for c in pop))
                for _ in range(self.population):
                    a = self.rng.choices(pop, weights=weights)[0]
                    if self.rng.random() < 0.3:
                        same = [c for c in pop if c.sketch == a.sketch and c is not a]
                        child = self.crossover(a, self.rng.choice(same)) if same else self.mutate(a)
                    else:
                        child = self.mutate(a)
                    if child is not None:
                        children.append(child)
                self._score(children)
                uniq = {c.key: c for c in pop + children}
                pop = sorted(uniq.values(), key=lambda c: -c.score)[: self.population]
        else:
            head, tail = pop[:rules], pop[rules:]
            self.rng.shuffle(tail)
            pop = head + tail
        picked: list[Candidate] = []
        seen = set(self.measured)
        for c in pop:
            if len(picked) >= n:
                break
            if c.key in seen:
                continue
            if self.model.booster is not None and self.rng.random() < self.eps:
                extra = self.random_candidates(1)
                c = extra[0] if extra and extra[0].key not in seen else c
            seen.add(c.key)
            picked.append(c)
        return picked

    def round(self, n: int) -> list[MeasureResult]:
        """Measure n candidates (the default schedule first, in the first round); retrain the model."""
        cands = self.propose(n)
        configs = [self.task.config(c.sketch, c.decisions) for c in cands]
        if self.default_cost is None:
            configs.insert(0, self.task.space.fallback())
        results = self.measurer.measure(self.task, configs)
        if self.log is not None:
            from ember.tune.log import make_record

            self.log.append([make_record(self.task, r) for r in results])  # type: ignore[attr-defined]
        if self.default_cost is None:
            self.default_cost = results[0].cost
            self.history.append(results[0].cost)
            results_c = results[1:]
        else:
            results_c = results
        for c, r in zip(cands, results_c):
            self.measured[c.key] = (c, r)
            self.history.append(r.cost)
            self.errors += 0 if r.ok else 1
        self._train()
        return results

    def _train(self) -> None:
        rows = [(c.features, r.cost) for c, r in self.measured.values()]
        ok = [cost for _, cost in rows if np.isfinite(cost)]
        if len(rows) < MIN_TRAIN or not ok:
            return
        best = min(ok)
        x = np.stack([f for f, _ in rows])
        y = np.array([best / cost if np.isfinite(cost) else 0.0 for _, cost in rows], dtype=np.float32)
        self.model.fit(x, y)

    # -- results -----------------------------------------------------------------------------
    @property
    def best_cost(self) -> float:
        best = self.best
        return min(self.default_cost or float("inf"), best[1].cost if best is not None else float("inf"))

    @property
    def best(self) -> tuple[Candidate, MeasureResult] | None:
        """The fastest candidate: the confirmed one once `confirm` has measured it again (the others' single
        measurements, taken at other moments of the machine's load, are not compared with its median)."""
        if self.confirmed is not None:
            return self.confirmed
        ok = [x for x in self.measured.values() if x[1].ok]
        return min(ok, key=lambda x: x[1].cost) if ok else None

    @property
    def trials(self) -> int:
        return len(self.history)


def n_model_features() -> int:
    return n_features() + 1
