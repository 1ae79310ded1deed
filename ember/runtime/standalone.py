"""Run a standalone export (`CompiledModel.export`, `ember export`): its `ember_run` program on numpy arrays.

    outputs, timings = run_exported("out/mlp", {"x": x}, repeat=10)
    outputs, timings = run_exported("out/mlp_arm", {"x": x}, launcher=["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"])

The inputs go to .npy files, `DIR/ember_run` runs (through `launcher` when given: an emulator, or a command that
runs it on another machine), and its outputs come back from the .npy files it wrote. `timings` is its JSON line:
repeat, warmup, threads, min, median, mean (seconds) and the output files.

`emulator(target)` is the launcher of an emulated board for a target built for another architecture (qemu-user
with the cross toolchain's libraries: `qemu-aarch64 -L /usr/aarch64-linux-gnu`), or None where the code runs here:

    m = ember.compile(model, "c -mtriple=aarch64-linux-gnu -mcpu=cortex-a72")
    outputs, timings = run_exported(m.export("out/arm"), {"x": x}, launcher=emulator(m.plan.target))
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ..target import Target


class StandaloneError(RuntimeError):
    """`ember_run` failed: the message holds its exit status and what it said on stderr."""


def emulator(target: Target | str) -> list[str] | None:
    """The command prefix that runs a program built for `target` here (None: it runs natively): its
    architecture's qemu-user, with the cross toolchain's sysroot; a clear error where qemu is not installed."""
    target = Target.parse(target)
    if target.runs_here or target.arch is None:
        return None
    arch = target.arch
    if shutil.which(arch.qemu) is None:
        raise StandaloneError(f"running code for {arch.triple} here needs the emulator {arch.qemu}: install it "
                              f"(Debian/Ubuntu: apt-get install qemu-user)")  # fmt: skip
    return arch.emulator.split()


def run_exported(
    directory: str | Path,
    inputs: Mapping[str, np.ndarray],
    launcher: Sequence[str] | None = None,
    repeat: int = 1,
    warmup: int = 0,
    timeout: float | None = 600,
) -> tuple[dict[str, np.ndarray], dict]:
    """(outputs by name, the timing record) of `DIR/ember_run` on `inputs` (arrays by input name, written as
    given: a wrong shape or dtype is ember_run's error). Raises StandaloneError when it exits nonzero."""
    directory = Path(directory).resolve()
    with tempfile.TemporaryDirectory(prefix="ember-run-") as tmp:
        cmd = [*(launcher or []), str(directory / "ember_run")]
        for i, (name, x) in enumerate(inputs.items()):
            path = Path(tmp) / f"input_{i}_{re.sub(r'[^0-9A-Za-z_.-]', '_', name)}.npy"
            np.save(path, np.ascontiguousarray(x))
            cmd += ["--input", f"{name}={path}"]
        out = Path(tmp) / "outputs"
        out.mkdir()
        cmd += ["--output-dir", str(out), "--repeat", str(repeat), "--warmup", str(warmup)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise StandaloneError(f"{' '.join(cmd[:len(launcher or []) + 1])} exited {proc.returncode}: "
                                  f"{proc.stderr.strip()[:4000]}")  # fmt: skip
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if not lines:
            raise StandaloneError(f"ember_run printed no timing line: {proc.stdout[:1000]!r}")
        timings = json.loads(lines[-1])
        outputs = {name: np.load(path) for name, path in timings["outputs"].items()}
    return outputs, timings
