"""Config spaces: knobs, enumeration, serialization, sampling, neighbours; template spaces and fallbacks."""

import json
import random

import pytest

from ember.te.config import ConfigEntity, ConfigError, ConfigSpace, load_best
from ember.templates import nn as T
from ember.tune.task import Task


def small_space() -> ConfigSpace:
    s = ConfigSpace("toy")
    s.define_split("tile_x", 12, 2, policy="factors")  # (-1, f) for f | 12: 6 choices
    s.define_split("tile_y", 8, 3, policy="power2")  # (-1, a, b) with a * b <= 8
    s.define_reorder("order", 3)
    s.define_annotate("ann", 2, policy="try_unroll_vec")
    s.define_knob("unroll", [False, True], default=True)
    return s


def test_knob_choices():
    s = small_space()
    assert s.knobs["tile_x"].choices == ((-1, 1), (-1, 2), (-1, 3), (-1, 4), (-1, 6), (-1, 12))
    assert all(a * b <= 8 and a & (a - 1) == 0 for _, a, b in s.knobs["tile_y"].choices)
    assert len(s.knobs["order"]) == 6
    assert s.knobs["ann"].choices[:3] == (("none", "none"), ("none", "unroll"), ("none", "vec"))
    assert s["unroll"] is True  # a space answers with the defaults
    assert len(s) == 6 * len(s.knobs["tile_y"]) * 6 * 6 * 2


def test_enumerate_and_serialize():
    s = small_space()
    seen = set()
    for i, cfg in enumerate(s):
        assert cfg.index == i
        d = json.loads(json.dumps(cfg.to_json()))
        back = ConfigEntity.from_json(d)
        assert back.values == cfg.values
        assert s.entity(back.values).index == i  # the values alone identify the point
        seen.add(cfg.key())
    assert len(seen) == len(s)
    s2 = ConfigSpace.from_json(json.loads(json.dumps(s.to_json())))
    assert len(s2) == len(s) and s2.get(123).values == s.get(123).values


def test_sample_neighbours_fallback():
    s = small_space()
    rng = random.Random(0)
    pts = s.sample(rng, 50, exclude={0, 1, 2})
    assert len({p.index for p in pts}) == 50 and not {p.index for p in pts} & {0, 1, 2}
    cfg = s.get(777)
    for nb in s.neighbours(cfg) + s.neighbours(cfg, adjacent=False):
        assert sum(nb.values[k] != cfg.values[k] for k in cfg.values) == 1
    for _ in range(20):
        nb = s.random_neighbour(cfg, rng)
        assert sum(nb.values[k] != cfg.values[k] for k in cfg.values) == 1
    fb = s.fallback()
    assert fb.values["unroll"] is True and fb.values["tile_x"] == (-1, 1)
    all_left = s.sample(rng, 10**6, exclude=set(range(len(s) - 3)))
    assert sorted(p.index for p in all_left) == [len(s) - 3, len(s) - 2, len(s) - 1]


def test_entity_checks_values():
    s = small_space()
    cfg = s.get(5)
    assert cfg.define_split("tile_x", 12, 2, policy="factors") == cfg["tile_x"]
    with pytest.raises(ConfigError):
        s.entity({"tile_x": (-1, 5)})
    with pytest.raises(ConfigError):
        s.entity({"nope": 1})
    bad = ConfigEntity(-1, {"tile_x": (-1, 5)})
    with pytest.raises(ConfigError):
        bad.define_split("tile_x", 12, 2, policy="factors")


def test_gemm_template_space_and_fallback():
    t = Task.from_op("MatMul", [(64, 48), (48, 40)])
    space = t.space
    assert space.template == "gemm"
    assert set(space.knobs) == {"tile_m", "tile_n", "tile_k", "order", "pack_b", "unroll_tile"}
    dtype = T.as_dtype("float32")
    plan = T.gemm_plan(64, 40, 48, dtype)
    fb = space.fallback()
    assert fb["tile_m"][-1] == plan.mr and fb["tile_n"][-1] == plan.nr and fb["tile_k"][-1] == plan.kr
    assert T.gemm_plan(64, 40, 48, dtype, cfg=fb) == plan  # the fallback config is the untuned plan


def test_conv_template_space_and_fallback():
    t = Task.from_op("Conv", [(1, 32, 14, 14), (T.lanes_of("float32", T.host_target()) * 2, 32, 3, 3)],
                     {"pads": (1, 1, 1, 1), "strides": (1, 1), "dilations": (1, 1)})  # fmt: skip
    space = t.space
    assert space.template == "conv_oc"
    assert {"tile_oc", "tile_ow", "tile_oh", "reduce_order", "unroll_kw"} <= set(space.knobs)
    plan = T.conv_plan(t.node.outputs[0].shape[1], t.node.outputs[0].shape[1], 14, 1, T.as_dtype("float32"))
    fb = space.fallback()
    assert fb["tile_oc"][-1] == plan.block and fb["tile_ow"][-1] == plan.width


def test_load_best(tmp_path):
    log = tmp_path / "log.jsonl"
    recs = [
        {"workload": "w1", "target": "c", "config": {"index": 1, "knobs": {"a": 1}}, "cost": 2.0, "error": None},
        {"workload": "w1", "target": "c", "config": {"index": 2, "knobs": {"a": 2}}, "cost": 1.0, "error": None},
        {"workload": "w1", "target": "c", "config": {"index": 3, "knobs": {"a": 3}}, "cost": None,
         "error": {"kind": "crash"}},
        {"workload": "w1", "target": "c -threads=2", "config": {"index": 4, "knobs": {"a": 4}}, "cost": 0.5,
         "error": None},
        {"workload": "w2", "target": "llvm", "config": {"index": 5, "knobs": {"a": 5}}, "cost": 0.1, "error": None},
    ]  # fmt: skip
    log.write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"workload": "w1", "tor')
    best = load_best(log, "c")
    assert best["w1"].values == {"a": 2} and "w2" not in best  # exact target wins; other kinds never apply
    assert load_best(log, "c -threads=2")["w1"].values == {"a": 4}
    assert load_best(log, "c -threads=4")["w1"].values == {"a": 4}  # same kind: the fastest record
