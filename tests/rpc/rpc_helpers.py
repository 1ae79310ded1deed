"""Helpers of the device server tests: the token, a small MLP exported for this machine (`export_mlp`), fake
modules (a program that segfaults, one that hangs) built with the host C compiler around
that export's weights and model.json. (Not a conftest.py: other test directories import the top one as `conftest`.)"""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path

import pytest

import ember
from ember import zoo
from ember.codegen.toolchain import find_cc

TOKEN = "s3cret-token-for-tests"

needs_cc = pytest.mark.skipif(find_cc() is None, reason="needs a C compiler")


def export_mlp(directory: Path) -> tuple:
    """(the ONNX model, the model compiled for this machine, its standalone export in `directory`); a test without
    a C compiler is skipped."""
    if find_cc() is None:
        pytest.skip("needs a C compiler")
    model = zoo.mlp(batch=2, features=16, hidden=(32,), classes=5)
    m = ember.compile(model, "c")
    return model, m, m.export(directory)


def fake_module(mlp_dir: Path, directory: Path, c_source: str | None = None, ember_run: bytes | None = None) -> Path:
    """A copy of the MLP export whose ember_run is `c_source` built with the host compiler (or the bytes given)."""
    directory.mkdir(parents=True)
    for name in ("model.json", "weights.bin"):
        shutil.copyfile(mlp_dir / name, directory / name)
    if c_source is not None:
        (directory / "main.c").write_text(c_source)
        subprocess.run([find_cc(), "-O1", "-o", str(directory / "ember_run"), str(directory / "main.c")], check=True,
                       timeout=60)  # fmt: skip
    else:
        (directory / "ember_run").write_bytes(ember_run)
    return directory


SEGFAULT = "#include <signal.h>\nint main(void) { raise(SIGSEGV); return 0; }\n"
HANG = "#include <unistd.h>\nint main(void) { for (;;) sleep(1000); return 0; }\n"


def conv_task():
    """A small conv tuning task (a 16-channel 3x3 convolution on 8x8: hundreds of configs, milliseconds each)."""
    from ember.tune.task import Task

    return Task.from_op("Conv", [(1, 16, 8, 8), (16, 16, 3, 3)],
                        {"pads": [1, 1, 1, 1], "strides": [1, 1], "dilations": [1, 1], "group": 1})  # fmt: skip


def start_server(token_file: Path, key: str = "host", *extra: str) -> tuple[subprocess.Popen, str]:
    """`ember rpc server --port 0` in a subprocess: (the process, the address it printed)."""
    import os
    import queue
    import re
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "ember.cli", "rpc", "server", "--port", "0", "--key", key,
                             "--token-file", str(token_file), *extra], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(proc.stdout.readline()), daemon=True).start()
    try:
        line = lines.get(timeout=120)
    except queue.Empty:
        proc.kill()
        raise AssertionError(f"the server printed nothing in 120 s: {proc.communicate(timeout=10)[1]}") from None
    found = re.search(r"listening on (\S+:\d+)", line)
    if not found:
        proc.kill()
        raise AssertionError(f"unexpected first line {line!r}: {proc.communicate(timeout=10)[1]}")
    return proc, found.group(1)


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=10)


def kill_after_runs(proc: subprocess.Popen, address: str, runs: int) -> threading.Thread:
    """A thread that SIGKILLs the server `proc` once it has finished `runs` runs (its Info's runs_done), so that it
    dies in the middle of the work sent to it; `.killed_at` is the count it saw then."""
    import signal
    import time

    from ember.rpc import RemoteError, connect

    def watch() -> None:
        with connect(address, token=TOKEN, timeout=10) as remote:
            while proc.poll() is None:
                try:
                    done = remote.info(timeout=5)["runs_done"]
                except RemoteError:
                    return
                if done >= runs:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait(10)
                    thread.killed_at = done
                    return
                time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.killed_at = None
    thread.start()
    return thread
