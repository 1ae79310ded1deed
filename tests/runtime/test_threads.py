"""Compiled models are safe to call from many threads: 4 threads x many calls on fresh inputs give exactly what
sequential calls give, on every backend (CPU models run the calls in parallel, each thread with its own value
table and workspace; a GPU model serializes them on its one set of device buffers)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import opencl_missing

import ember
from ember import zoo

CALLS = 240


def small_model():
    """MatMul -> Relu -> MatMul (+ a fallback-free elementwise tail): intermediates live in the workspace."""
    b = zoo.Builder(7)
    h = b.op("Relu", [b.op("MatMul", ["x", b.weight((24, 32))])])
    y = b.op("Add", [b.op("MatMul", [h, b.weight((32, 16))]), b.weight((16,))])
    return b.model({"x": (8, 24)}, b.op("Sigmoid", [y]))


def check_threads(m) -> None:
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((8, 24)).astype(np.float32) for _ in range(CALLS)]
    expected = [m(x) for x in xs]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda x: m(x), xs))
        named = list(pool.map(lambda x: m.run({"x": x}), xs[:40]))
    bad = [i for i, (g, e) in enumerate(zip(got, expected)) if not np.array_equal(g, e)]
    assert not bad, f"{len(bad)} of {CALLS} concurrent calls differ from the sequential ones (first: {bad[:5]})"
    for i, d in enumerate(named):
        np.testing.assert_array_equal(next(iter(d.values())), expected[i])


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_cpu_models_are_thread_safe(target):
    if target == "llvm":
        pytest.importorskip("llvmlite")
    check_threads(ember.compile(small_model(), target))


def test_opencl_model_is_thread_safe():
    why = opencl_missing()
    if why:
        pytest.skip(why)
    check_threads(ember.compile(small_model(), "opencl"))


def test_a_benchmark_beside_calls_changes_no_answer():
    m = ember.compile(small_model(), "c")
    x = np.random.default_rng(4).standard_normal((8, 24)).astype(np.float32)
    want = m(x)
    with ThreadPoolExecutor(2) as pool:
        bench = pool.submit(m.benchmark, None, 50, 1)
        outs = list(pool.map(lambda _: m(x), range(100)))
        bench.result()
    assert all(np.array_equal(o, want) for o in outs)


def test_every_calling_thread_gets_the_targets_thread_count():
    """A call from another Python thread, and the main thread's long calls (made on the model's NativeCaller
    thread, so that Ctrl-C reaches the main thread), use the target's -threads, not the default (all cores): the
    thread pool's count is the library's, and each parallel loop of a -threads=N target asks for N. (OpenMP kept
    its count per thread: a 2-thread ResNet-18 ran at its 1-thread speed.)"""
    import ctypes
    import threading

    from ember.runtime.executor import NativeCaller

    m = ember.compile(small_model(), "c -threads=1")
    count = m._lib.ember_get_num_threads
    count.restype = ctypes.c_int32
    seen = []

    def other_thread():
        m(np.zeros((8, 24), np.float32))
        seen.append(count())

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert NativeCaller(m._set_threads)(count) == 1
    assert seen == [1]
    assert ", 1);" in m.source and "ember_parallel_for(" in m.source
