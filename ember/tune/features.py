"""Features of a candidate's lowered loop IR, for the cost model.

A candidate (task + config) is lowered by `ember.te.lower.lower_schedule` (loops with their kinds,
before unrolling and vectorization expand them) and summarized as a fixed-length vector:

- the hot statement (the store that runs most often, e.g. the multiply-accumulate): its loop nest
  from the innermost level out (log extent, and kind: serial / parallel / vectorized / unrolled),
  its trip count, the products of unrolled, vectorized and parallel extents, loads and arithmetic
  operations per execution;
- per buffer it touches (the stored buffer, then the loaded ones in order): bytes touched inside
  each of the innermost loop levels (the footprint of the accesses whose indices those loops
  drive), the stride of the innermost loop in that buffer, and its reuse (trips per element);
- the whole kernel: trips of the other stores (packing, padding, copy-out), bytes of local
  (register tile) and global (packed operand) allocations.

All counts are log2(1 + x), so that the model sees ratios. `config_features` adds the config's own
knob values (log2 of split factors, choice positions, annotations as numbers): the cost model sees
both what the knobs are and what they did to the loop nest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ember.te.lower import lower_schedule
from ember.tir.expr import BinOp, Call, Const, Expr, Load, Var
from ember.tir.functor import walk
from ember.tir.stmt import Allocate, For, ForKind, PrimFunc, Stmt, Store

LEVELS = 10  # loop levels of the hot statement, innermost first
BUFFERS = 4  # buffers of the hot statement
FOOT_LEVELS = 6  # innermost levels with a footprint per buffer
KINDS = (ForKind.SERIAL, ForKind.PARALLEL, ForKind.VECTORIZED, ForKind.UNROLLED)


def _l(x: float) -> float:
    return math.log2(1.0 + max(float(x), 0.0))


@dataclass
class _Loop:
    var: Var
    extent: int
    kind: ForKind


def _extent(e: Expr) -> int:
    return int(e.value) if isinstance(e, Const) else 1


def _stores(stmt: Stmt, loops: list[_Loop], out: list, allocs: dict) -> None:
    """(store, its loops outer->inner) for every Store; sizes of allocations by scope."""
    if isinstance(stmt, For):
        _stores(stmt.body, loops + [_Loop(stmt.var, _extent(stmt.extent), stmt.kind)], out, allocs)
        return
    if isinstance(stmt, Store):
        out.append((stmt, loops))
        return
    if isinstance(stmt, Allocate):
        allocs[stmt.buffer.scope] = allocs.get(stmt.buffer.scope, 0) + stmt.buffer.nbytes
    for f in stmt._values():
        if isinstance(f, Stmt):
            _stores(f, loops, out, allocs)
        elif isinstance(f, tuple):
            for x in f:
                if isinstance(x, Stmt):
                    _stores(x, loops, out, allocs)


def _vars(e: Expr) -> set[Var]:
    return {n for n in walk(e) if isinstance(n, Var)}


def _buffer_features(buf, indices: tuple[Expr, ...], loops: list[_Loop], trips: int) -> list[float]:
    used = [_vars(i) for i in indices]
    drive = set().union(*used) if used else set()
    inner_first = loops[::-1]
    feats = []
    foot = 1
    for lvl in range(FOOT_LEVELS):
        if lvl < len(inner_first) and inner_first[lvl].var in drive:
            foot *= inner_first[lvl].extent
        feats.append(_l(min(foot, buf.size) * buf.dtype.itemsize))
    stride = 0
    if inner_first:
        v = inner_first[0].var
        strides = buf.strides
        stride = sum(strides[d] for d, vs in enumerate(used) if v in vs)
    total_foot = 1
    for lp in loops:
        if lp.var in drive:
            total_foot *= lp.extent
    feats += [_l(stride), _l(trips / max(1, min(total_foot, buf.size)))]
    return feats


def featurize(func: PrimFunc) -> np.ndarray:
    """The feature vector of a lowered function (see the module doc)."""
    stores: list = []
    allocs: dict[str, int] = {}
    _stores(func.body, [], stores, allocs)
    if not stores:
        return np.zeros(n_features(), dtype=np.float32)

    def trips_of(loops):
        return math.prod(lp.extent for lp in loops)

    hot, hot_loops = max(stores, key=lambda s: (s[0].value.dtype.is_float, trips_of(s[1])))
    trips = trips_of(hot_loops)
    loads = [n for n in walk(hot.value) if isinstance(n, Load)]
    arith = sum(1 for n in walk(hot.value) if isinstance(n, BinOp | Call) and n.dtype.is_float)
    prod = {k: math.prod(lp.extent for lp in hot_loops if lp.kind is k) for k in KINDS}
    feats = [_l(trips), _l(sum(trips_of(lp) for s, lp in stores if s is not hot)), float(len(hot_loops)),
             float(len(loads)), float(arith), _l(trips * arith), _l(prod[ForKind.UNROLLED]),
             _l(prod[ForKind.VECTORIZED]), _l(prod[ForKind.PARALLEL]), _l(allocs.get("local", 0)),
             _l(allocs.get("global", 0)), float(len(stores))]  # fmt: skip
    inner_first = hot_loops[::-1]
    for lvl in range(LEVELS):
        if lvl < len(inner_first):
            lp = inner_first[lvl]
            feats += [_l(lp.extent)] + [1.0 if lp.kind is k else 0.0 for k in KINDS]
        else:
            feats += [0.0] * (1 + len(KINDS))
    bufs = [(hot.buffer, hot.indices)] + [(ld.buffer, ld.indices) for ld in loads if ld.buffer is not hot.buffer]
    seen = []
    for buf, idx in bufs:
        if any(buf is b for b, _ in seen):
            continue
        seen.append((buf, idx))
    per = FOOT_LEVELS + 2
    for slot in range(BUFFERS):
        feats += _buffer_features(*seen[slot], hot_loops, trips) if slot < len(seen) else [0.0] * per
    return np.asarray(feats, dtype=np.float32)


def n_features() -> int:
    return 12 + LEVELS * (1 + len(KINDS)) + BUFFERS * (FOOT_LEVELS + 2)


def candidate_features(task, cfg) -> np.ndarray:
    """Features of one candidate (task, config): its schedule lowered and `featurize`d, then its knobs."""
    sch, args = task.instantiate(cfg)
    return np.concatenate([featurize(lower_schedule(sch, args, "candidate")), config_features(task.space, cfg)])


_ANN = {"none": 0.0, "unroll": 1.0, "vec": 2.0}


def config_features(space, cfg) -> np.ndarray:
    """The knob values of a config as numbers, in the space's knob order."""
    out = []
    for knob in space.knobs.values():
        v = cfg.values[knob.name]
        if knob.kind == "split":
            out += [_l(f) for f in v[1:]]
        elif knob.kind == "annotate":
            out += [_ANN[a] for a in v]
        else:
            out.append(float(knob.choices.index(v)))
            if knob.kind == "knob" and isinstance(v, int | float) and not isinstance(v, bool):
                out.append(_l(v))
    return np.asarray(out, dtype=np.float32)
