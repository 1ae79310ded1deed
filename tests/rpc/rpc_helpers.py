"""Helpers of the device server tests: the token, a small MLP exported for this machine (`export_mlp`), fake
modules (a program that segfaults, one that hangs) built with the host C compiler around
that export's weights and model.json. (Not a conftest.py: other test directories import the top one as `conftest`.)"""

from __future__ import annotations

import shutil
import subprocess
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
