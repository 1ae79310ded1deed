"""The llvm target's thread pool (codegen.llvm_pool): parallel loops on persistent workers.

Two kinds of test: kernels built from te schedules with parallel loops, compared with numpy; and a small LLVM
IR module (`VISIT_IR`) that calls `ember_parallel_for` directly, so a test controls the extent exactly (0 and 1
included) and sees, per index, how often it ran and on which thread. Then what a pool must survive: thousands
of regions, thread counts changed at run time, nested regions, several modules, several host threads, fork,
failing thread creation and process exit."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import ember
from ember import te

pytest.importorskip("llvmlite", reason="the llvm target needs llvmlite (pip install 'ember[llvm]')")

from ember.codegen import llvm_pool  # noqa: E402
from ember.codegen.llvm import JITEngine  # noqa: E402
from ember.target import Target  # noqa: E402

# visit(counts, tids, n): counts[i] += 1 and tids[i] = pthread_self() for i in [0, n), as one parallel region;
# visit2(counts, tids, n, m): the same over n x m, a region of n rows whose rows are regions of m (nested)
VISIT_IR = r"""
%clo = type { ptr, ptr, i64 }

declare void @ember_parallel_for(ptr, ptr, i64)
declare i64 @pthread_self()

define internal void @region(ptr %c, i64 %b, i64 %e) {
entry:
  %cp = getelementptr %clo, ptr %c, i32 0, i32 0
  %counts = load ptr, ptr %cp
  %tp = getelementptr %clo, ptr %c, i32 0, i32 1
  %tids = load ptr, ptr %tp
  %self = call i64 @pthread_self()
  br label %head
head:
  %i = phi i64 [ %b, %entry ], [ %i1, %body ]
  %more = icmp slt i64 %i, %e
  br i1 %more, label %body, label %done
body:
  %p = getelementptr i32, ptr %counts, i64 %i
  %old = atomicrmw add ptr %p, i32 1 monotonic
  %q = getelementptr i64, ptr %tids, i64 %i
  store i64 %self, ptr %q
  %i1 = add i64 %i, 1
  br label %head
done:
  ret void
}

define i32 @visit(ptr %counts, ptr %tids, i64 %n) {
  %c = alloca %clo
  %cp = getelementptr %clo, ptr %c, i32 0, i32 0
  store ptr %counts, ptr %cp
  %tp = getelementptr %clo, ptr %c, i32 0, i32 1
  store ptr %tids, ptr %tp
  call void @ember_parallel_for(ptr @region, ptr %c, i64 %n)
  ret i32 0
}

define internal void @rows(ptr %c, i64 %b, i64 %e) {
entry:
  %cp = getelementptr %clo, ptr %c, i32 0, i32 0
  %counts = load ptr, ptr %cp
  %tp = getelementptr %clo, ptr %c, i32 0, i32 1
  %tids = load ptr, ptr %tp
  %mp = getelementptr %clo, ptr %c, i32 0, i32 2
  %m = load i64, ptr %mp
  %inner = alloca %clo
  br label %head
head:
  %i = phi i64 [ %b, %entry ], [ %i1, %body ]
  %more = icmp slt i64 %i, %e
  br i1 %more, label %body, label %done
body:
  %off = mul i64 %i, %m
  %rc = getelementptr i32, ptr %counts, i64 %off
  %rt = getelementptr i64, ptr %tids, i64 %off
  %icp = getelementptr %clo, ptr %inner, i32 0, i32 0
  store ptr %rc, ptr %icp
  %itp = getelementptr %clo, ptr %inner, i32 0, i32 1
  store ptr %rt, ptr %itp
  call void @ember_parallel_for(ptr @region, ptr %inner, i64 %m)
  %i1 = add i64 %i, 1
  br label %head
done:
  ret void
}

define i32 @visit2(ptr %counts, ptr %tids, i64 %n, i64 %m) {
  %c = alloca %clo
  %cp = getelementptr %clo, ptr %c, i32 0, i32 0
  store ptr %counts, ptr %cp
  %tp = getelementptr %clo, ptr %c, i32 0, i32 1
  store ptr %tids, ptr %tp
  %mp = getelementptr %clo, ptr %c, i32 0, i32 2
  store i64 %m, ptr %mp
  call void @ember_parallel_for(ptr @rows, ptr %c, i64 %n)
  ret i32 0
}
"""


class Visit:
    """VISIT_IR compiled: `visit(n)` and `visit2(n, m)` return (counts, thread ids) per index."""

    def __init__(self):
        self.jit = JITEngine(VISIT_IR, Target.parse("llvm"))
        self._visit = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(
            self.jit.address("visit")
        )
        self._visit2 = ctypes.CFUNCTYPE(
            ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64
        )(self.jit.address("visit2"))

    def visit(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        counts, tids = np.zeros(max(n, 1), np.int32), np.zeros(max(n, 1), np.uint64)
        self._visit(counts.ctypes.data, tids.ctypes.data, n)
        return counts[:n], tids[:n]

    def visit2(self, n: int, m: int) -> tuple[np.ndarray, np.ndarray]:
        counts, tids = np.zeros((n, m), np.int32), np.zeros((n, m), np.uint64)
        self._visit2(counts.ctypes.data, tids.ctypes.data, n, m)
        return counts, tids


@pytest.fixture(scope="module")
def visit() -> Visit:
    return Visit()


def chunk_threads(tids: np.ndarray, n: int, nt: int) -> list[int]:
    """The thread of each static chunk of [0, n) on nt threads (chunks are whole: one thread each)."""
    chunk = -(-n // nt)
    out = []
    for k in range(nt):
        part = tids[k * chunk : min((k + 1) * chunk, n)]
        if len(part):
            assert len(set(part.tolist())) == 1, f"chunk {k} ran on several threads"
            out.append(int(part[0]))
    return out


@pytest.mark.parametrize("threads", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 7, 64, 1000])
def test_every_index_runs_once_on_one_thread_per_chunk(visit, threads, n):
    visit.jit.set_num_threads(threads)
    for _ in range(3):
        counts, tids = visit.visit(n)
        np.testing.assert_array_equal(counts, np.ones(n, np.int32))
        nt = min(threads, n, 64)
        if nt > 1:
            used = chunk_threads(tids, n, nt)
            assert len(set(used)) == len(used)  # each chunk on its own thread
            assert used[0] == threading.get_ident()  # chunk 0 on the calling thread (pthread_self)
    assert llvm_pool.workers() >= (min(threads, n, 64) - 1 if n > 1 else 0)


def test_workers_persist_across_regions(visit):
    visit.jit.set_num_threads(3)
    seen = set()
    for _ in range(50):
        _, tids = visit.visit(30)
        used = chunk_threads(tids, 30, 3)
        assert used[0] == threading.get_ident()
        seen.update(used[1:])
    assert len(seen) == 2  # the same two workers served all 50 regions


def test_many_regions_in_a_row(visit):
    visit.jit.set_num_threads(2)
    total = np.zeros(5, np.int32)
    for _ in range(2000):
        counts, _ = visit.visit(5)
        total += counts
    np.testing.assert_array_equal(total, np.full(5, 2000))


def test_nested_regions_run_serially_inside_the_outer_one(visit):
    visit.jit.set_num_threads(4)
    for n, m in [(4, 9), (2, 100), (7, 3)]:
        counts, tids = visit.visit2(n, m)
        np.testing.assert_array_equal(counts, np.ones((n, m), np.int32))
        for row in tids:  # an inner region: the whole row on the thread that ran it
            assert len(set(row.tolist())) == 1
    counts, tids = visit.visit2(1, 50)  # an outer loop of one iteration runs alone: the inner one in parallel
    np.testing.assert_array_equal(counts, np.ones((1, 50), np.int32))
    assert len(set(tids[0].tolist())) == 4


def parallel_rows(m: int, n: int, scale: float = 3.0):
    A = te.placeholder((m, n), name="A")
    B = te.compute((m, n), lambda i, j: A[i, j] * scale + te.const(0.5), name="B")
    s = te.create_schedule(B)
    s[B].parallel(B.op.axis[0])
    return ember.build(s, [A, B], target="llvm -threads=2")


def check_rows(f, rng, m: int, n: int, scale: float = 3.0) -> None:
    a = rng.standard_normal((m, n)).astype("float32")
    b = np.full_like(a, np.nan)
    f(a, b)
    np.testing.assert_allclose(b, a * scale + 0.5, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("threads", [2, 3, 4, 7])
@pytest.mark.parametrize("m", [2, 3, 6, 33])
def test_kernels_match_numpy(threads, m, rng):
    f = parallel_rows(m, 11)
    f.set_num_threads(threads)
    for _ in range(3):
        check_rows(f, rng, m, 11)


def test_2000_small_kernel_calls(rng):
    f = parallel_rows(8, 16)
    a = rng.standard_normal((8, 16)).astype("float32")
    b = np.empty_like(a)
    for _ in range(2000):
        b[:] = np.nan
        f(a, b)
        np.testing.assert_allclose(b, a * 3 + 0.5, rtol=1e-5, atol=1e-6)


def test_thread_count_changed_at_run_time(rng):
    f = parallel_rows(40, 9)
    for n in (1, 2, 1, 2, 4, 1, 2):
        f.set_num_threads(n)
        for _ in range(20):
            check_rows(f, rng, 40, 9)
        assert llvm_pool.workers() >= n - 1


def test_two_modules_used_alternately(rng):
    f, g = parallel_rows(12, 5, 3.0), parallel_rows(20, 7, -2.0)
    g.set_num_threads(3)
    for _ in range(200):
        check_rows(f, rng, 12, 5, 3.0)
        check_rows(g, rng, 20, 7, -2.0)


@pytest.mark.parametrize("shared", [True, False], ids=["one module", "a module each"])
def test_calls_from_two_python_threads_at_once(shared, rng):
    mods = [parallel_rows(32, 64)] * 2 if shared else [parallel_rows(32, 64), parallel_rows(32, 64)]
    a = [rng.standard_normal((32, 64)).astype("float32") for _ in range(2)]
    errors = []
    start = threading.Barrier(2)

    def run(k: int) -> None:
        try:
            b = np.empty_like(a[k])
            start.wait()
            for _ in range(500):
                b[:] = np.nan
                mods[k](a[k], b)  # ctypes releases the GIL: both threads are in native code at once
                np.testing.assert_allclose(b, a[k] * 3 + 0.5, rtol=1e-5, atol=1e-6)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a host thread hung in a parallel region"
    assert not errors, errors


def test_host_threads_share_the_pool_or_run_serially(visit):
    visit.jit.set_num_threads(3)
    results = []

    def run() -> None:
        for _ in range(300):
            results.append(visit.visit(50)[0])

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(results) == 900 and all((c == 1).all() for c in results)


def run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


PRELUDE = """
    import numpy as np
    import ember
    from ember import te
    from ember.codegen import llvm_pool

    A = te.placeholder((64, 33), name="A")
    B = te.compute((64, 33), lambda i, j: A[i, j] + 1.0, name="B")
    s = te.create_schedule(B)
    s[B].parallel(B.op.axis[0])
    f = ember.build(s, [A, B], target="llvm -threads=4")
    a = np.arange(64 * 33, dtype="float32").reshape(64, 33)
    b = np.empty_like(a)
"""


def test_process_exits_right_after_a_region():
    # workers are still spinning, or asleep on a condition variable: exit neither waits for nor crashes them
    r = run_python(PRELUDE + "    f(a, b)\n    assert (b == a + 1).all() and llvm_pool.workers() >= 3\n")
    assert r.returncode == 0, r.stderr


FORK = """
    import os, signal
    f(a, b)
    pid = os.fork()
    if pid == 0:
        signal.alarm(60)  # a child stuck waiting for its parent's workers dies instead of hanging the test
        assert llvm_pool.workers() == 0
        for _ in range(100):
            b[:] = 0
            f(a, b)
            assert (b == a + 1).all()
        os._exit(0 if llvm_pool.workers() >= 3 else 2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
    f(a, b)
    assert (b == a + 1).all()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_a_pool_of_its_own():
    r = run_python(PRELUDE + FORK)
    assert r.returncode == 0, r.stderr


NO_THREADS = """
    import resource
    f.set_num_threads(1)
    f(a, b)  # everything loaded and allocated; the pool itself too
    f.set_num_threads(4)
    with open("/proc/self/statm") as fh:
        size = int(fh.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (size + (1 << 20), resource.RLIM_INFINITY))  # no room for a stack
    for _ in range(10):
        b[:] = 0
        f(a, b)
        assert (b == a + 1).all()
    print(llvm_pool.workers())
"""


@pytest.mark.skipif(sys.platform != "linux", reason="address-space limit as a way to fail pthread_create")
def test_chunks_run_inline_when_threads_cannot_be_created():
    r = run_python(PRELUDE + NO_THREADS)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0"]  # no worker could be made; the caller ran every chunk
