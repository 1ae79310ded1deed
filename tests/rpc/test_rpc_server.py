"""The device server's guarantees: the token is checked on every call, messages are bounded, uploads are checked,
a module that crashes or hangs fails its run and nothing else, and sessions are removed on close and when idle."""

from __future__ import annotations

import time

import numpy as np
import pytest

grpc = pytest.importorskip("grpc", reason="the device server needs grpcio (pip install ember[rpc])")

from rpc_helpers import HANG, SEGFAULT, TOKEN, export_mlp, fake_module, needs_cc  # noqa: E402

from ember.rpc import RemoteError, connect  # noqa: E402
from ember.rpc import ember_rpc_pb2 as pb  # noqa: E402
from ember.rpc.server import serve  # noqa: E402


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return export_mlp(tmp_path_factory.mktemp("mlp"))


@pytest.fixture
def server():
    s = serve("127.0.0.1", 0, key="host", token=TOKEN, run_timeout=30, idle_timeout=60)
    yield s
    s.stop()


def addr(s) -> str:
    return f"127.0.0.1:{s.port}"


def test_serve_refuses_to_start_without_a_token():
    with pytest.raises(ValueError, match="needs a token"):
        serve("127.0.0.1", 0, key="host", token=None)
    s = serve("127.0.0.1", 0, key="host", token=None, insecure=True)
    try:
        assert connect(addr(s), timeout=10).info()["key"] == "host"
    finally:
        s.stop()


@pytest.mark.parametrize("token", ["wrong", None, TOKEN + "x"])
def test_wrong_or_missing_token_is_refused_and_the_server_serves_the_next_client(server, token):
    with pytest.raises(RemoteError) as e:
        connect(addr(server), key="host", token=token, timeout=10)
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    with connect(addr(server), key="host", token=TOKEN, timeout=10) as remote:
        info = remote.info()
    assert info["key"] == "host" and info["launcher"] == [] and info["arch"]


def test_wrong_key_is_refused(server):
    with pytest.raises(RemoteError, match="serves device 'host', not 'board'"):
        connect(addr(server), key="board", token=TOKEN, timeout=10)


@needs_cc
def test_mlp_runs_remotely_and_matches_the_local_model_bit_for_bit(server, mlp):
    model, m, out = mlp
    x = m.random_inputs(seed=3)[0]
    with connect(addr(server), key="host", token=TOKEN, timeout=60) as remote, remote.load(out) as rm:
        assert rm.input_names == m.input_names and rm.output_names == m.output_names
        local = m.run({"x": x})
        got = rm.run({"x": x})
        assert list(got) == list(local)
        for k in local:
            assert got[k].dtype == local[k].dtype and np.array_equal(got[k], local[k])
        assert np.array_equal(rm(x), m(x))
        bench = rm.benchmark(repeat=5, warmup=1)
        assert bench["repeat"] == 5 and 0 < bench["min"] <= bench["median"]
        with pytest.raises(ValueError, match="wants float32"):  # checked here, before anything is sent
            rm.run({"x": x.astype(np.float64)})
        with pytest.raises(ValueError, match="missing"):
            rm.run({})


@needs_cc
def test_session_directory_is_removed_on_close_and_when_idle(mlp):
    s = serve("127.0.0.1", 0, key="host", token=TOKEN, idle_timeout=0.5)
    try:
        remote = connect(addr(s), token=TOKEN, timeout=30)
        rm = remote.load(mlp[2])
        session = s.root / rm.module_id
        assert (session / "ember_run").is_file() and (session / "weights.bin").is_file()
        rm.close()
        assert not session.exists()
        with pytest.raises(RemoteError) as e:
            remote.call("Run", pb.RunRequest(module_id=rm.module_id))
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        idle = remote.load(mlp[2])
        session = s.root / idle.module_id
        deadline = time.monotonic() + 10
        while session.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not session.exists()  # expired by the reaper
        with pytest.raises(RemoteError, match="no module"):
            idle.run({"x": mlp[1].random_inputs()[0]})
        remote.close()
    finally:
        s.stop()
    assert not s.root.exists()


@needs_cc
def test_oversized_message_is_refused(mlp, tmp_path):
    s = serve("127.0.0.1", 0, key="host", token=TOKEN, max_message_bytes=1 << 20)
    try:
        big = fake_module(mlp[2], tmp_path / "big", ember_run=(mlp[2] / "ember_run").read_bytes())
        (big / "weights.bin").write_bytes(bytes(2 << 20))
        with connect(addr(s), token=TOKEN, timeout=30) as remote:
            assert remote.info()["max_message_bytes"] == 1 << 20
            with pytest.raises(RemoteError) as e:
                remote.load(big)
            assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            with remote.load(mlp[2]) as rm:  # the server goes on
                assert rm.run({"x": mlp[1].random_inputs()[0]})
    finally:
        s.stop()


@needs_cc
def test_malformed_uploads_are_refused_with_a_clear_error(server, mlp, tmp_path):
    garbage = fake_module(mlp[2], tmp_path / "garbage", ember_run=b"garbage bytes, not a program")
    with connect(addr(server), token=TOKEN, timeout=30) as remote:
        with pytest.raises(RemoteError, match="not an executable") as e:
            remote.load(garbage)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        for files in ([pb.File(name="../ember_run", data=b"\x7fELF"), pb.File(name="weights.bin")],
                      [pb.File(name="weights.bin", data=b"")],
                      [pb.File(name="ember_run", data=b"\x7fELF")] * 2 + [pb.File(name="weights.bin")]):  # fmt: skip
            with pytest.raises(RemoteError, match="exactly the files") as e:
                remote.call("Upload", pb.UploadRequest(files=files))
            assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(FileNotFoundError, match="model.json"):
            remote.load(tmp_path)
        assert list(server.root.iterdir()) == []  # nothing was kept


@needs_cc
def test_a_crashing_module_fails_its_run_and_the_server_serves_the_next(server, mlp, tmp_path):
    crash = fake_module(mlp[2], tmp_path / "crash", SEGFAULT)
    x = mlp[1].random_inputs()[0]
    with connect(addr(server), token=TOKEN, timeout=30) as remote:
        with remote.load(crash) as rm:
            with pytest.raises(RemoteError, match="crashed: killed by signal 11 \\(SIGSEGV\\)") as e:
                rm.run({"x": x})
            assert e.value.code == grpc.StatusCode.ABORTED
        with remote.load(mlp[2]) as good:
            assert np.array_equal(good(x), mlp[1](x))


@needs_cc
def test_a_hanging_module_is_killed_at_the_run_timeout(mlp, tmp_path):
    s = serve("127.0.0.1", 0, key="host", token=TOKEN, run_timeout=1.0)
    try:
        hang = fake_module(mlp[2], tmp_path / "hang", HANG)
        x = mlp[1].random_inputs()[0]
        with connect(addr(s), token=TOKEN, timeout=30) as remote:
            with remote.load(hang) as rm:
                t0 = time.monotonic()
                with pytest.raises(RemoteError, match="run timeout \\(1 s\\) and was killed") as e:
                    rm.run({"x": x})
                assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
                assert time.monotonic() - t0 < 20
            with remote.load(mlp[2]) as good:
                assert np.array_equal(good(x), mlp[1](x))
    finally:
        s.stop()


@needs_cc
def test_a_symbolic_export_runs_remotely_at_the_sizes_of_its_inputs(server, tmp_path):
    """model.json names the symbolic dims; the client leaves their check to ember_run on the device."""
    import ember
    from ember import zoo

    model = zoo.mlp(batch=2, features=16, hidden=(32,), classes=5)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    m = ember.compile(model, "c", dynamic_bounds={"N": (1, 8)})
    out = m.export(tmp_path / "e")
    rng = np.random.default_rng(0)
    with connect(addr(server), key="host", token=TOKEN, timeout=60) as remote, remote.load(out) as rm:
        for n in (1, 5):
            x = rng.standard_normal((n, 16)).astype(np.float32)
            got = rm.run({"x": x})
            for k, want in m.run({"x": x}).items():
                assert np.array_equal(got[k], want)
        with pytest.raises(RemoteError, match="outside its bounds"):
            rm.run({"x": np.zeros((9, 16), np.float32)})
