"""`ember rpc server` in a subprocess and `ember run --rpc` against it, end to end."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("grpc", reason="the device server needs grpcio (pip install ember[rpc])")

from rpc_helpers import TOKEN, export_mlp, needs_cc, start_server, stop_server  # noqa: E402

from ember.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return export_mlp(tmp_path_factory.mktemp("mlp"))


def ember_command(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-m", "ember.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)  # fmt: skip


def first_line(proc: subprocess.Popen, timeout: float) -> str:
    """The first line the process prints, waiting at most `timeout` seconds."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(proc.stdout.readline()), daemon=True).start()
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        proc.kill()
        raise AssertionError(f"no line in {timeout} s; stderr: {proc.communicate(timeout=10)[1]}") from None


def test_server_refuses_to_start_without_a_token():
    proc = ember_command("rpc", "server", "--port", "0")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "needs a token" in err and "--insecure" in err


@needs_cc
def test_ember_run_rpc_end_to_end(mlp, tmp_path, capsys):
    _, m, export = mlp
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    server = ember_command("rpc", "server", "--port", "0", "--key", "host", "--token-file", str(token_file))
    try:
        line = first_line(server, timeout=120)
        found = re.search(r"listening on (127\.0\.0\.1:\d+)", line)
        assert found, line
        address = found.group(1)
        x = m.random_inputs(seed=5)[0]
        np.save(tmp_path / "x.npy", x)
        args = ["run", "--rpc", address, "--key", "host", "--token-file", str(token_file), str(export),
                "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path / "out"), "--benchmark"]  # fmt: skip
        assert main(args) == 0
        out = capsys.readouterr().out
        assert "latency: median" in out
        (name,) = m.output_names
        assert np.array_equal(np.load(tmp_path / "out" / f"{name}.npy"), m(x))

        wrong = tmp_path / "wrong"
        wrong.write_text("not the token")
        args[args.index(str(token_file))] = str(wrong)
        assert main(args) == 1
        assert "UNAUTHENTICATED" in capsys.readouterr().err
        args[args.index(str(wrong))] = str(token_file)
        assert main(args) == 0  # the server serves the next client
    finally:
        server.terminate()
        try:
            server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.communicate(timeout=10)
    assert server.returncode == 0


@needs_cc
def test_pool_status_tune_and_bench_through_rpc(tmp_path, capsys):
    import json

    import onnx

    from ember import zoo

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    proc, address = start_server(token_file)
    try:
        args = ["rpc", "pool", "status", "--devices", f"{address},127.0.0.1:1", "--token-file", str(token_file)]
        assert main(args) == 0
        out = capsys.readouterr().out
        assert re.search(rf"{re.escape(address)}\s+host\s+\S+\s+ok", out), out
        assert re.search(r"127\.0\.0\.1:1\s+\?\s+-\s+no answer", out) and "queued requests by key: host: 0" in out

        model = tmp_path / "conv.onnx"
        onnx.save(zoo.conv_bn_relu_stack(layers=1, channels=8, size=8), model)
        log = tmp_path / "tune.jsonl"
        args = ["tune", str(model), "--rpc", address, "--key", "host", "--devices", "1", "--token-file",
                str(token_file), "--trials", "3", "--max-tasks", "1", "--tuner", "random", "--repeat", "2",
                "--log", str(log)]  # fmt: skip
        assert main(args) == 0
        assert "measuring on 1 device server(s) of key 'host'" in capsys.readouterr().out
        records = [json.loads(line) for line in log.read_text().splitlines()]
        assert len(records) == 3 and all(r["error"] is None and r["cost"] > 0 for r in records)
        assert main([*args[:4], "--key", "board", *args[6:]]) == 1  # a key no server has
        assert "serves device 'host', not 'board'" in capsys.readouterr().err

        args = ["bench", str(model), "--rpc", address, "--key", "host", "--token-file", str(token_file),
                "--repeat", "3"]  # fmt: skip
        assert main(args) == 0
        out = capsys.readouterr().out
        assert "on the device" in out and "round trip" in out and "max |remote - local| 0" in out
    finally:
        stop_server(proc)
