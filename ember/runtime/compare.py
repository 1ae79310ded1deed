"""Fair side-by-side timing of Ember and other runtimes in one process (`ember bench`, bench/models.py).

Runtimes with worker threads disturb each other: threads left spinning after one system's run steal the
cores of the next, and threads woken from sleep make the first run after a switch slow. So the systems
take turns in blocks of a few runs; before each block there is a short pause (the previous system's
threads go idle) and one run that is not counted (this system's threads wake up, its data is back in
cache). ONNX Runtime gets sessions whose idle threads do not spin. Medians are reported.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

BLOCK = 5  # counted runs of one system in a row
PAUSE = 0.05  # seconds before each block


def timed(fn: Callable[[], object], repeat: int, clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Seconds of each of `repeat` calls of `fn`, in order."""
    runs = []
    for _ in range(repeat):
        t0 = clock()
        fn()
        runs.append(clock() - t0)
    return runs


def interleaved_medians(systems: dict[str, Callable[[], object]], repeat: int, warmup: int = 3,
                        clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Median seconds of one call per system, over about `repeat` counted calls each, taken in turns. `clock`:
    wall time by default; `time.process_time` counts this process's CPU time (all its threads), the steadier
    measure of one-thread runs on a loaded machine."""
    for fn in systems.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {k: [] for k in systems}
    blocks = max(1, -(-repeat // BLOCK))
    per_block = -(-repeat // blocks)
    for _ in range(blocks):  # a block each in turn: drifts of a shared machine hit every system alike
        for k, fn in systems.items():
            time.sleep(PAUSE)
            fn()  # wakes this system's threads and warms its caches: not counted
            times[k] += timed(fn, per_block, clock)
    return {k: statistics.median(v) for k, v in times.items()}


def onnxruntime_session(model: Any, threads: int):
    """An onnxruntime CPU session on `threads` intra-op threads whose idle threads do not spin."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    data = model.SerializeToString() if hasattr(model, "SerializeToString") else model
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


__all__ = ["BLOCK", "interleaved_medians", "onnxruntime_session"]
