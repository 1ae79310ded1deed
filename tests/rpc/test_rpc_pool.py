"""The embedded device pool: lending by key in priority then arrival order, health checks that drop a server that
stops answering, work reassigned from a lost device; tuning measured through the pool on two servers of one key,
one killed half-way; one-kernel exports checked against numpy."""

from __future__ import annotations

import collections
import json
import threading
import time

import numpy as np
import pytest

grpc = pytest.importorskip("grpc", reason="the device server needs grpcio (pip install ember[rpc])")

from rpc_helpers import TOKEN, conv_task, kill_after_runs, needs_cc, start_server, stop_server  # noqa: E402

from ember.rpc.client import RemoteError  # noqa: E402
from ember.rpc.measure import RemoteMeasurer, build_artifact, device_target, run_artifact  # noqa: E402
from ember.rpc.pool import DeviceLost, DevicePool, PoolError, format_status  # noqa: E402
from ember.rpc.server import serve  # noqa: E402
from ember.tune.driver import tune_task  # noqa: E402
from ember.tune.log import TuningLog  # noqa: E402


@pytest.fixture
def servers():
    started = []

    def start(key="host", **kw):
        s = serve("127.0.0.1", 0, key=key, token=TOKEN, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop(grace=0)


def test_requests_are_served_by_key_in_priority_then_arrival_order(servers):
    a, board = servers(), servers(key="board")
    with DevicePool(token=TOKEN, health_period=60) as pool:
        pool.add(a.address)
        pool.add(board.address, key="board")
        assert pool.keys() == ["board", "host"]
        first = pool.acquire("host")
        served, threads = [], []

        def request(name: str, priority: int) -> None:
            dev = pool.acquire("host", priority, timeout=30)
            served.append(name)
            pool.release(dev)

        for name, priority in [("low1", 0), ("high", 5), ("low2", 0), ("mid", 2)]:
            threads.append(threading.Thread(target=request, args=(name, priority)))
            threads[-1].start()
            deadline = time.monotonic() + 30
            while pool.status()["queues"]["host"] < len(threads) and time.monotonic() < deadline:
                time.sleep(0.01)  # queued: the next one arrives after it
        with pool.lease("board", timeout=5) as remote:  # another key is not held up by the queue of "host"
            assert remote.info()["key"] == "board"
        assert pool.status()["queues"]["host"] == 4
        pool.release(first)
        for t in threads:
            t.join(30)
        assert served == ["high", "mid", "low1", "low2"]
        with pytest.raises(PoolError, match="no device of key 'gpu'"):
            pool.acquire("gpu")
        with pool.lease("host"), pytest.raises(PoolError, match="free within"):
            pool.acquire("host", timeout=0.3)


def test_a_server_that_stops_answering_is_dropped_and_its_work_reassigned(servers):
    a, b = servers(), servers()
    with DevicePool(token=TOKEN, health_period=60, health_timeout=2) as pool:
        dev_a = pool.add(a.address)
        pool.add(b.address)
        held = pool.acquire("host")  # the least used device first: a
        assert held is dev_a
        seen = []

        def work(remote):
            seen.append(remote.address)
            if remote.address == a.address:
                a.stop(grace=0)  # the device is lost in the middle of the work
            return remote.info()["key"]

        pool.release(held)
        b_dev = pool.acquire("host")  # keep b busy so the work starts on a
        fut = pool.submit("host", work)
        time.sleep(0.5)
        pool.release(b_dev)
        assert fut.result(timeout=60) == "host"
        assert seen == [a.address, b.address]
        status = pool.status()
        assert [d["address"] for d in status["devices"]] == [b.address]
        assert [d["address"] for d in status["dropped"]] == [a.address]
        table = format_status(status)
        assert "dropped" in table and b.address in table and "queued requests by key: host: 0" in table
        # an error of the work itself, on a device that still answers, is its result (no retry)
        with pytest.raises(ValueError, match="the work's own"):
            pool.submit("host", lambda r: (_ for _ in ()).throw(ValueError("the work's own error"))).result(30)
        fut = pool.submit("host", lambda r: (_ for _ in ()).throw(RemoteError("refused", grpc.StatusCode.ABORTED)))
        with pytest.raises(RemoteError, match="refused"):
            fut.result(30)
        b.stop(grace=0)
        with pytest.raises((DeviceLost, PoolError)):
            pool.submit("host", lambda r: r.call("Info", None)).result(60)


def test_health_checks_drop_a_dead_server(servers):
    a, b = servers(), servers()
    with DevicePool(token=TOKEN, health_period=0.2, health_timeout=1, misses=2) as pool:
        pool.add(a.address)
        pool.add(b.address)
        a.stop(grace=0)
        deadline = time.monotonic() + 20
        while len(pool.status()["devices"]) > 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        status = pool.status()
        assert [d["address"] for d in status["devices"]] == [b.address] and status["devices"][0]["healthy"]
        assert "missed 2 health checks" in pool.dropped[0].info["dropped_because"]


@needs_cc
def test_a_one_kernel_export_computes_the_task_on_the_device(servers, tmp_path):
    s = servers()
    task = conv_task()
    cfg = task.space.get(7)
    built = build_artifact(task, dict(cfg.values), str(tmp_path))
    assert "error" not in built, built
    meta = json.loads((tmp_path / built["dir"] / "model.json").read_text())
    assert [t["shape"] for t in meta["inputs"]] == [[1, 16, 8, 8], [16, 16, 3, 3]]
    assert [t["shape"] for t in meta["outputs"]] == [[1, 16, 8, 8]]
    rng = np.random.default_rng(11)
    x, w = rng.standard_normal((1, 16, 8, 8), np.float32), rng.standard_normal((16, 16, 3, 3), np.float32)
    pad = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    expected = np.zeros((1, 16, 8, 8))
    for i in range(3):
        for j in range(3):
            expected += np.einsum("nchw,oc->nohw", pad[:, :, i : i + 8, j : j + 8], w[:, :, i, j])
    from ember.rpc import connect

    with connect(s.address, token=TOKEN, timeout=30) as remote:
        out = run_artifact(remote, built["dir"], [x, w], [expected], repeat=3, warmup=1, rtol=1e-5)
        assert "error" not in out and out["costs"][0] > 0
        np.testing.assert_allclose(out["outputs"][0], expected, rtol=1e-4, atol=1e-4)
        wrong = run_artifact(remote, built["dir"], [x, w], [expected + 1], repeat=1, warmup=0, rtol=1e-5)
        assert wrong["error"] == "wrong"
    assert device_target("c", {"triple": "aarch64-linux-gnu"}) == str(device_target("c -mtriple=aarch64-linux-gnu", {}))
    assert device_target("c -threads=2", {"triple": ""}) == "c -threads=2"


@needs_cc
def test_tuning_through_the_pool_survives_a_server_killed_half_way(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    (a, addr_a), (b, addr_b) = start_server(token_file), start_server(token_file)
    task = conv_task()
    log = TuningLog(tmp_path / "tune.jsonl")
    try:
        with DevicePool(token=TOKEN, health_period=60) as pool:  # the pool finds the loss through the failed call
            pool.add(addr_a)
            pool.add(addr_b)
            killer = kill_after_runs(a, addr_a, 3)  # half-way through the first batch (a has about 4 of 8)
            with RemoteMeasurer(pool, "host", devices=2, repeat=3, warmup=1, n_parallel=2) as m:
                res = tune_task(task, "random", 16, m, log, batch_size=8)
            killer.join(30)
            assert killer.killed_at is not None and len(res.trials) == 16 and res.n_errors == 0, res.errors
            assert [d["address"] for d in pool.status()["dropped"]] == [addr_a]
        records = log.records()
        counts = collections.Counter(r["config"]["index"] for r in records)
        assert len(records) == 16 and set(counts.values()) == {1}  # every trial once
        assert all(r["error"] is None and r["cost"] > 0 for r in records)
        after = [r["config"]["index"] for r in records[8:]]
        assert {m.measured_on[i] for i in after} == {addr_b}  # the second half ran on the server left
        assert addr_a in {m.measured_on[r["config"]["index"]] for r in records[:8]}
    finally:
        stop_server(a)
        stop_server(b)


def test_a_lost_or_busy_device_is_a_transient_error_and_a_failing_module_is_not():
    from ember.rpc.measure import result_of_error
    from ember.tune.measure import MeasureResult

    cfg = conv_task().space.get(0)
    code = grpc.StatusCode
    cases = [(DeviceLost("lost 4 devices"), "runtime", True), (RemoteError("gone", code.UNAVAILABLE), "runtime", True),
             (RemoteError("full", code.RESOURCE_EXHAUSTED), "runtime", True),
             (RemoteError("killed by signal 11", code.ABORTED), "crash", False),
             (RemoteError("ran past the run timeout", code.DEADLINE_EXCEEDED), "timeout", True),
             (RemoteError("ember_run refused the inputs", code.INVALID_ARGUMENT), "runtime", False)]  # fmt: skip
    for error, kind, transient in cases:
        got, detail = result_of_error(error)
        assert got == kind and str(error) in detail
        assert MeasureResult(cfg, error=got, detail=detail).transient is transient, error
