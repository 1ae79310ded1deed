"""ember.runtime.compare: systems take turns in blocks, each block after a pause and an uncounted run."""

from __future__ import annotations

import time

from ember.runtime import compare


def test_interleaved_medians_counts_and_orders(monkeypatch):
    monkeypatch.setattr(compare, "PAUSE", 0.0)
    calls: list[str] = []

    def system(name: str, seconds: float):
        def run():
            calls.append(name)
            time.sleep(seconds)

        return run

    med = compare.interleaved_medians({"fast": system("fast", 0.001), "slow": system("slow", 0.004)}, repeat=10,
                                      warmup=2)  # fmt: skip
    assert 0.0009 < med["fast"] < med["slow"]
    blocks = 10 // compare.BLOCK
    assert calls.count("fast") == calls.count("slow") == 2 + blocks * (compare.BLOCK + 1)
    turns = [c for i, c in enumerate(calls[4:]) if i == 0 or calls[4 + i - 1] != c]  # after warm-up: alternating blocks
    assert turns == ["fast", "slow"] * blocks
