"""The whole-model compile cache (ember.runtime.compile_cache): a second compile of the same model loads it without
lowering; every option that changes the result changes the key; a damaged entry is rebuilt, never run."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest

import ember
from ember import compiler, zoo
from ember.runtime import compile_cache

ort = pytest.importorskip("onnxruntime", reason="the outputs are checked against onnxruntime")


@dataclass
class Cache:
    dir: Path
    lowerings: list  # the targets of the compiles that lowered the model


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Cache:
    """The cache on, in a fresh directory, counting the compiles that lowered the model."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EMBER_COMPILE_CACHE", "1")
    calls = []
    real = compiler.lower_model

    def counting(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(compiler, "lower_model", counting)
    return Cache(tmp_path, calls)


def entries(cache: Cache) -> list[Path]:
    return sorted(p for p in (cache.dir / "models").iterdir() if not p.name.startswith("."))


def small_model(seed: int = 0) -> onnx.ModelProto:
    return zoo.mlp(batch=2, features=12, hidden=(16,), classes=5) if seed == 0 else zoo.mlp(2, 12, (16,), 6)


def check_against_ort(m, model: onnx.ModelProto, seed: int) -> None:
    feeds = zoo.random_feeds(model, seed=seed)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for ours, want in zip(m.run(feeds).values(), ref):
        np.testing.assert_allclose(ours, want, rtol=1e-4, atol=1e-5)


def test_second_compile_hits_the_cache(cache, tmp_path_factory):
    model = small_model()
    first = ember.compile(model, target="c -threads=1")
    assert first.summary()["compile_cache"] == "stored" and len(cache.lowerings) == 1
    again = ember.compile(model, target="c -threads=1")
    assert len(cache.lowerings) == 1, "the second compile lowered the model again"
    s = again.summary()
    assert s["compile_cache"] == "hit" and s["compile_seconds"] < 1.0 and s["kernels"] == first.summary()["kernels"]
    check_against_ort(again, model, seed=3)
    # the same bytes from a file (its name is part of the key: it names the model)
    path = tmp_path_factory.mktemp("m") / "mlp.onnx"
    onnx.save(model, path)
    ember.compile(str(path), target="c -threads=1")
    ember.compile(path, target="c -threads=1")
    assert len(cache.lowerings) == 2 and len(entries(cache)) == 2


def test_every_option_that_changes_the_result_is_in_the_key(cache, tmp_path, monkeypatch):
    model = small_model()
    log = tmp_path / "tune.jsonl"
    log.write_text("")
    base = {"target": "c -threads=1"}
    variants = [
        {"target": "c -threads=2"},
        {"target": "llvm -threads=1"},
        {"target": "c -threads=1", "opt_level": 1},
        {"target": "c -threads=1", "disabled_passes": ["fuse_ops"]},
        {"target": "c -threads=1", "input_shapes": {"x": (2, 12)}},
        {"target": "c -threads=1", "max_elements": 2**30},
        {"target": "c -threads=1", "fallback": False},
        {"target": "c -threads=1", "tuning_log": str(log)},
    ]
    ember.compile(model, **base)
    for i, kwargs in enumerate(variants):
        m = ember.compile(model, **kwargs)
        assert len(cache.lowerings) == i + 2, f"{kwargs} hit the entry of another compile"
        check_against_ort(m, model, seed=i)
    n = len(cache.lowerings)
    record = {"workload": "w", "error": {"kind": "build", "message": "a failed build"}, "target": "c",
              "config": {"knobs": {}}}  # fmt: skip
    log.write_text(json.dumps(record) + "\n")
    ember.compile(model, target="c -threads=1", tuning_log=str(log))  # another log: its contents count
    monkeypatch.setenv("EMBER_MAX_ITERATIONS", str(2**39))  # an environment knob
    ember.compile(model, **base)
    monkeypatch.delenv("EMBER_MAX_ITERATIONS")
    ember.compile(small_model(seed=1), **base)  # another model
    assert len(cache.lowerings) == n + 3
    log.write_text("")
    for kwargs in [base, *variants]:  # and each of them is cached now
        ember.compile(model, **kwargs)
    assert len(cache.lowerings) == n + 3


def damage_file(entry: Path, name: str) -> None:
    data = (entry / name).read_bytes()
    (entry / name).write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("damage", ["truncate weights", "truncate library", "edit plan", "delete manifest",
                                    "garbage manifest", "empty directory"])  # fmt: skip
def test_a_damaged_entry_is_rebuilt_not_trusted(cache, damage):
    model = small_model()
    ember.compile(model, target="c -threads=1")
    (entry,) = entries(cache)
    if damage == "truncate weights":
        damage_file(entry, "weights.npz")
    elif damage == "truncate library":
        damage_file(entry, next(p.name for p in entry.iterdir() if p.suffix == ".so"))
    elif damage == "edit plan":
        (entry / "plan.json").write_text((entry / "plan.json").read_text().replace('"', "'", 1))
    elif damage == "delete manifest":
        (entry / "manifest.json").unlink()
    elif damage == "garbage manifest":
        (entry / "manifest.json").write_text("{not json")
    else:
        for p in entry.iterdir():
            p.unlink()
    with pytest.warns(RuntimeWarning, match="damaged"):
        m = ember.compile(model, target="c -threads=1")
    assert len(cache.lowerings) == 2 and m.summary()["compile_cache"] == "stored"
    check_against_ort(m, model, seed=1)
    again = ember.compile(model, target="c -threads=1")  # the rebuilt entry is whole again
    assert len(cache.lowerings) == 2 and again.summary()["compile_cache"] == "hit"
    assert [p.name for p in (cache.dir / "models").iterdir()] == [entry.name], "a staging directory was left behind"


def test_off_switch_and_what_is_not_cached(cache, tmp_path, monkeypatch):
    model = small_model()
    path = tmp_path / "ext" / "model.onnx"
    path.parent.mkdir()
    external = onnx.ModelProto()
    external.CopyFrom(model)  # onnx.save marks the tensors of what it saves as external
    onnx.save(external, path, save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
              size_threshold=0)  # fmt: skip
    assert compiler.model_bytes(str(path)) is None  # the weights live in another file: not keyed by these bytes
    ember.compile(str(path), target="c -threads=1")
    ember.compile(str(path), target="c -threads=1")
    assert len(cache.lowerings) == 2
    monkeypatch.setenv("EMBER_COMPILE_CACHE", "0")
    ember.compile(model, target="c -threads=1")
    ember.compile(model, target="c -threads=1")
    assert len(cache.lowerings) == 4 and not (cache.dir / "models").exists()


def test_key_parts():
    t = ember.target.Target.parse("c -threads=1")
    k = compile_cache.model_key([b"m"], t, {"a": 1})
    assert k == compile_cache.model_key([b"m"], t, {"a": 1})
    assert k != compile_cache.model_key([b"m", b""], t, {"a": 1})  # parts are length-prefixed
    assert k != compile_cache.model_key([b"m"], t, {"a": 2})
    assert len(compile_cache.source_fingerprint()) == 64


def test_key_does_not_depend_on_what_is_imported(monkeypatch):
    """The key names the installed onnx and numpy, imported or not: the first compile of a process imports onnx,
    and a key read from the imported module made the second compile of the same model miss the entry the first
    stored (the third hit)."""
    import sys

    t = ember.target.Target.parse("c -threads=1")
    k = compile_cache.model_key([b"m"], t, {})
    monkeypatch.delitem(sys.modules, "onnx")
    assert compile_cache.model_key([b"m"], t, {}) == k
