"""The on-disk cache's size limit: least recently used entries are evicted, recent ones and builds in flight kept."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from ember import te
from ember.build import build
from ember.cli import main
from ember.codegen import toolchain
from ember.codegen.toolchain import cache_entries, cache_limit, parse_size, prune_cache


def make_entry(path, size, age):
    path.mkdir(parents=True)
    (path / "kernel.so").write_bytes(b"x" * size)
    t = time.time() - age
    os.utime(path, (t, t))
    return path


@pytest.mark.parametrize("text, want", [("8G", 8 << 30), ("500M", 500 << 20), ("1.5GiB", 3 << 29), ("123456", 123456),
                                        ("64kb", 64 << 10), ("0", None), ("none", None)])  # fmt: skip
def test_parse_size(text, want):
    assert parse_size(text) == want


@pytest.mark.parametrize("bad", ["", "x", "-3G", "8Q", "G"])
def test_bad_size_names_the_variable(bad, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_SIZE", bad or " ")
    if not bad:
        assert cache_limit() == toolchain.DEFAULT_CACHE_SIZE  # blank: the default
        return
    with pytest.raises(ValueError, match="EMBER_CACHE_SIZE"):
        cache_limit()


def test_prune_evicts_least_recently_used_first(tmp_path):
    old = make_entry(tmp_path / "ab" / ("a" * 64), 4000, age=3000)
    mid = make_entry(tmp_path / "models" / ("b" * 64), 4000, age=2000)
    new = make_entry(tmp_path / "cd" / ("c" * 64), 4000, age=1000)
    obj = tmp_path / "llvm" / "ef" / ("e" * 64 + ".o")
    obj.parent.mkdir(parents=True)
    obj.write_bytes(b"y" * 4000)
    t = time.time() - 4000
    os.utime(obj, (t, t))  # the oldest of all
    (tmp_path / "roofline").mkdir()
    (tmp_path / "roofline" / "m.json").write_text("{}")  # not an entry: never evicted
    assert {e.path for e in cache_entries(tmp_path)} == {old, mid, new, obj}
    removed = prune_cache(limit=10000, root=tmp_path)  # 16000 bytes: evict down to 8000 (80%)
    assert removed == [obj, old]
    assert mid.exists() and new.exists() and not old.exists() and not obj.exists()
    assert (tmp_path / "roofline" / "m.json").exists()
    assert prune_cache(limit=10000, root=tmp_path) == []  # under the limit now


def test_recent_entries_and_young_staging_dirs_are_kept(tmp_path):
    recent = make_entry(tmp_path / "ab" / ("a" * 64), 5000, age=10)
    stale = make_entry(tmp_path / "ab" / ".aaaaaaaa-killed", 10, age=2 * 86400)
    young = make_entry(tmp_path / "ab" / ".bbbbbbbb-building", 10, age=5)
    assert prune_cache(limit=100, root=tmp_path, keep_recent=600) == []  # over the limit, but used 10 s ago
    assert recent.exists() and young.exists() and not stale.exists()
    assert prune_cache(limit=100, root=tmp_path) == [recent]


def test_a_built_kernel_survives_a_tiny_limit_and_still_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EMBER_CACHE_SIZE", "1")  # one byte: everything old is evicted at the next prune
    monkeypatch.setattr(toolchain, "PRUNE_EVERY", 0.0)
    stale = make_entry(tmp_path / "00" / ("0" * 64), 1000, age=3600)
    a = te.placeholder((37,), name="a")
    b = te.compute((37,), lambda i: a[i] * 2.0 + 1.0, name="b")
    f = build(te.create_schedule(b), [a, b], target="c")
    x = np.random.default_rng(0).standard_normal(37).astype(np.float32)
    y = np.zeros_like(x)
    f(x, y)
    np.testing.assert_allclose(y, x * 2 + 1, rtol=1e-6)
    assert not stale.exists()  # the old entry went
    assert cache_entries(tmp_path)  # the new one stays (used just now)


def test_cache_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    make_entry(tmp_path / "ab" / ("a" * 64), 3 << 20, age=100)
    make_entry(tmp_path / "models" / ("b" * 64), 1 << 20, age=50)
    assert main(["cache"]) == 0
    assert "2 entries (1 compiled models), 4.0 MiB" in capsys.readouterr().out
    assert main(["cache", "prune", "--max-size", "2M"]) == 0
    assert "removed 1 entries" in capsys.readouterr().out
    assert main(["cache", "prune", "--max-size", "lots"]) == 1
    assert "--max-size" in capsys.readouterr().err
    assert main(["cache", "clear"]) == 0
    assert "0 entries" in capsys.readouterr().out
