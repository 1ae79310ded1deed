"""Compile C source to a shared library with the system compiler, cached by content hash.

A cache entry is a directory named by the SHA-256 of (source, compiler, flags), holding
`kernel.c` (the source, kept for reading and debugging) and `kernel.so`. Entries are built in a
temporary directory and renamed into place, so a killed compile never leaves a broken entry.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path


class CompileError(RuntimeError):
    """The C compiler rejected generated code; the message holds its output and where the source is."""


def cache_dir() -> Path:
    root = os.environ.get("EMBER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ember"
    )
    return Path(root)


@functools.cache
def find_cc() -> str | None:
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return cc
    return None


@functools.cache
def cc_version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return cc


def compile_c(source: str, flags: list[str], name: str = "kernel") -> Path:
    """Path of a shared library built from `source` (reused from the cache when present)."""
    cc = find_cc()
    if cc is None:
        raise CompileError("no C compiler found (set CC, or install gcc/clang); the llvm target needs none")
    key = hashlib.sha256("\0".join([source, cc_version(cc), *flags]).encode()).hexdigest()
    entry = cache_dir() / key[:2] / key
    lib = entry / f"{name}.so"
    if lib.exists():
        return lib
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key[:8]}-", dir=entry.parent))
    try:
        src = tmp / f"{name}.c"
        src.write_text(source)
        cmd = [cc, *flags, str(src), "-o", str(tmp / f"{name}.so"), "-lm"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            keep = Path(tempfile.mkdtemp(prefix="ember-failed-")) / f"{name}.c"
            keep.write_text(source)
            raise CompileError(f"{' '.join(cmd[:-4])} failed on {keep}:\n{proc.stderr.strip()[:4000]}")
        try:
            os.rename(tmp, entry)
        except OSError:
            if not lib.exists():  # lost a race to a concurrent build of the same entry: theirs is as good
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return lib
