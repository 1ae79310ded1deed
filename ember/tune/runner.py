"""The runner process of `ember.tune.measure`: `python -m ember.tune.runner`.

Reads requests (length-prefixed pickles) on stdin, answers on stdout: load a candidate's library,
call it once on the task's inputs, compare with the reference, then time it. Whatever the
candidate does to this process (a segfault, an endless loop) is seen by the parent as a crash or
a time-out of this one candidate.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Callable

import numpy as np


def _load_arrays(path: str, cache: dict) -> list[np.ndarray]:
    if path not in cache:
        with np.load(path) as z:
            cache[path] = [z[f"a{i}"] for i in range(len(z.files))]
    return cache[path]


def mismatch(y: np.ndarray, r: np.ndarray, rtol: float) -> str:
    """Why y is not r within rtol (relative to r's largest magnitude, at least 1); "" when it is."""
    r = np.asarray(r).astype(y.dtype, copy=False)
    if y.shape != r.shape:
        return f"shape {y.shape}, expected {r.shape}"
    if y.dtype.kind not in "fc":
        n = int(np.count_nonzero(y != r))
        return f"{n} of {y.size} elements differ" if n else ""
    fin = np.isfinite(r)
    if not np.array_equal(np.isfinite(y), fin) or not np.array_equal(y[~fin], r[~fin], equal_nan=True):
        return "non-finite values differ"
    if not fin.any():
        return ""
    scale = max(1.0, float(np.abs(r[fin]).max()))
    err = float(np.abs(y[fin].astype(np.float64) - r[fin]).max())
    return f"max abs error {err:.3g} > {rtol * scale:.3g}" if err > rtol * scale else ""


class _GPUFunction:
    """A GPU candidate built in this process with its target's runtime (OpenCL, CUDA), called like a
    `Function`: the device's own timing (kernels finished) is what `benchmark` returns."""

    def __init__(self, module):
        self.module = module

    def __call__(self, *arrays: np.ndarray) -> None:
        self.module(*arrays)

    def call_unchecked(self, arrays: list) -> None:
        self.module(*arrays)

    def bind(self, arrays: list) -> Callable[[], None]:
        return lambda: self.module(*arrays)

    def benchmark(self, *arrays: np.ndarray, repeat: int, min_time: float, warmup: int = 1) -> dict:
        return self.module.benchmark(*arrays, repeat=repeat, min_time=min_time)


def _gpu_function(msg: dict, cache: dict) -> _GPUFunction:
    """Build a GPU candidate (its task and knobs) for its target here, where the device is."""
    from ember.build import build

    task = msg["task"]
    sch, args = task.instantiate(task.space.entity(msg["knobs"]))
    return _GPUFunction(build(sch, args, target=msg["gpu"]))


def run_one(msg: dict, cache: dict) -> dict:
    from ember.runtime.module import ArgSpec, Function

    specs = [ArgSpec(n, tuple(s), d, w) for n, s, d, w in msg["specs"]]
    inputs = _load_arrays(msg["inputs"], cache)
    outputs = [np.zeros(s.shape, dtype=np.dtype(s.dtype)) for s in specs[len(inputs) :]]
    arrays = [*inputs, *outputs]
    if msg.get("gpu"):
        fn = _gpu_function(msg, cache)
    else:
        fn = Function(ctypes.CDLL(msg["lib"]), msg["symbol"], specs)
    fn(*arrays)
    if msg.get("save"):
        np.savez(msg["save"], **{f"a{i}": y for i, y in enumerate(outputs)})
    if msg.get("ref"):
        for i, (y, r) in enumerate(zip(outputs, _load_arrays(msg["ref"], cache))):
            bad = mismatch(y, r, msg["rtol"])
            if bad:
                return {"error": "wrong", "detail": f"output {i}: {bad}"}
    if msg["repeat"] <= 0:
        return {"costs": [0.0]}
    warmup = msg["warmup"] if cache.get("warm") else max(msg["warmup"], 0.3)  # a fresh process: clocks, pages
    cache["warm"] = True
    call = fn.bind(arrays)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warmup:
        call()
    if msg.get("flush") and not msg.get("gpu"):
        return {"costs": cold_runs(call, arrays, msg["repeat"], msg["flush"], cache)}
    r = fn.benchmark(*arrays, repeat=msg["repeat"], min_time=msg["min_time"], warmup=1)
    return {"costs": r["runs"]}


def cache_flush_bytes() -> int:
    """Bytes to write to push a kernel's arguments out of every cache level: twice the last-level cache (sysfs),
    64 MiB where it does not say."""
    sizes = []
    for idx in range(8):
        try:
            with open(f"/sys/devices/system/cpu/cpu0/cache/index{idx}/size") as f:
                text = f.read().strip().upper()
        except OSError:
            break
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        try:
            sizes.append(int(text.rstrip("KMG")) * mult)
        except ValueError:
            continue
    return 2 * max(sizes) if sizes and max(sizes) >= 1 << 20 else 64 << 20


def cold_runs(call: Callable[[], None], arrays: list, repeat: int, flush: int, cache: dict) -> list[float]:
    """Seconds of `repeat` single calls of `call` (the kernel bound to `arrays`), each after `flush` bytes of
    another buffer were written and the first argument read again: the kernel's weights and other operands come
    from memory and its input (the activation, which the kernel before it wrote) from cache, as in a whole model
    (a schedule measured on warm caches can rank above one that is slower in the model: a BERT GEMM 3% ahead warm
    and 7% behind cold). TVM's measurers flush alike (`enable_cpu_cache_flush`: every argument but the first)."""
    scratch = cache.get("scratch")
    if scratch is None or scratch.nbytes != flush:
        scratch = cache["scratch"] = np.zeros(flush // 4, np.float32)
    first = arrays[0] if arrays and isinstance(arrays[0], np.ndarray) else None
    runs = []
    for _ in range(max(repeat, 5)):
        scratch += 1.0
        if first is not None:
            first.sum()  # back into the cache
        t0 = time.perf_counter()
        call()
        runs.append(time.perf_counter() - t0)
    return runs


def main() -> None:
    from ember.tune.measure import PARENT_ENV, die_with_parent, recv_msg, send_msg

    if os.environ.get(PARENT_ENV):
        die_with_parent(int(os.environ[PARENT_ENV]))

    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints must not corrupt the protocol
    inp = sys.stdin.buffer
    cache: dict = {}
    while True:
        try:
            msg = recv_msg(inp)
        except EOFError:
            return
        if msg is None:
            return
        try:
            res = run_one(msg, cache)
        except Exception as e:
            res = {"error": "runtime", "detail": f"{type(e).__name__}: {e}"[:2000]}
        send_msg(out, res)


if __name__ == "__main__":
    main()
