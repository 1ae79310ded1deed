"""A ResNet-18 cross-compiled for aarch64 runs on an emulated board: a device server whose launcher is qemu-user."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

pytest.importorskip("grpc", reason="the device server needs grpcio (pip install ember[rpc])")

from rpc_helpers import TOKEN  # noqa: E402

import ember  # noqa: E402
from ember import zoo  # noqa: E402
from ember.rpc import connect  # noqa: E402
from ember.rpc.server import serve  # noqa: E402

LAUNCHER = ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"]


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None, reason="no cross compiler (gcc-aarch64-linux-gnu)")
@pytest.mark.skipif(shutil.which("qemu-aarch64") is None, reason="no qemu-aarch64 (apt-get install qemu-user)")
def test_resnet18_for_aarch64_runs_on_an_emulated_board_and_matches_the_host_build(tmp_path):
    model = zoo.resnet18(image=32, classes=10, width=8)
    feeds = zoo.random_feeds(model, seed=1)
    expected = ember.compile(model, "c").run(feeds)
    arm = ember.compile(model, "c -mtriple=aarch64-linux-gnu")
    export = arm.export(tmp_path / "arm")
    server = serve("127.0.0.1", 0, key="arm", token=TOKEN, launcher=LAUNCHER, run_timeout=300)
    with server, connect(f"127.0.0.1:{server.port}", key="arm", token=TOKEN, timeout=300) as board:
        info = board.info()
        assert info["arch"] == "aarch64" and info["launcher"] == LAUNCHER
        with board.load(export) as rm:
            got = rm.run(feeds)
            assert list(got) == list(expected)
            for name, y in expected.items():
                scale = float(np.abs(y).max()) or 1.0
                assert got[name].shape == y.shape
                assert np.abs(got[name] - y).max() <= 1e-5 * scale, name
            assert rm.benchmark(repeat=2, warmup=0)["repeat"] == 2


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None, reason="no cross compiler (gcc-aarch64-linux-gnu)")
@pytest.mark.skipif(shutil.which("qemu-aarch64") is None, reason="no qemu-aarch64 (apt-get install qemu-user)")
def test_tuning_on_an_emulated_board_cross_compiles_for_its_triple(tmp_path):
    from rpc_helpers import conv_task

    from ember.rpc.measure import RemoteMeasurer, device_target
    from ember.rpc.pool import DevicePool
    from ember.tune.driver import tune_task
    from ember.tune.log import TuningLog
    from ember.tune.task import Task

    server = serve("127.0.0.1", 0, key="arm", token=TOKEN, launcher=LAUNCHER, run_timeout=300)
    with server, DevicePool(token=TOKEN, health_period=60) as pool:
        info = pool.add(server.address).info
        assert info["triple"] == "aarch64-linux-gnu"
        target = device_target("c", info)
        assert target == "c -mtriple=aarch64-linux-gnu"
        host = conv_task()
        task = Task.from_node(host.node, target)
        log = TuningLog(tmp_path / "arm.jsonl")
        with RemoteMeasurer(pool, "arm", repeat=2, warmup=0, n_parallel=2) as m:
            res = tune_task(task, "random", 3, m, log, batch_size=3)
        assert len(res.trials) == 3 and res.n_errors == 0, res.errors  # each checked against numpy's conv
        records = log.records()
        assert [r["target"] for r in records] == [target] * 3 and all(r["cost"] > 0 for r in records)
