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


@functools.cache
def has_libmvec() -> bool:
    """Whether glibc's vector math library (SIMD expf, logf, erff, tanhf, ...) can be linked."""
    import ctypes.util
    import platform

    return platform.machine() in ("x86_64", "AMD64") and ctypes.util.find_library("mvec") is not None


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
        libs = ["-lmvec", "-lm"] if "_ZGV" in source and has_libmvec() else ["-lm"]
        cmd = [cc, *flags, str(src), "-o", str(tmp / f"{name}.so"), *libs]
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


def cached_build(key_parts: list[str], out_name: str, build) -> Path:
    """Cache entry for a key: `build(tmpdir)` writes `out_name` into a fresh temp dir, then it is renamed in."""
    key = hashlib.sha256("\0".join(key_parts).encode()).hexdigest()
    entry = cache_dir() / key[:2] / key
    out = entry / out_name
    if out.exists():
        return out
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key[:8]}-", dir=entry.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, entry)
        except OSError:
            if not out.exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _run_cc(cmd: list[str], source: str, name: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        keep = Path(tempfile.mkdtemp(prefix="ember-failed-")) / f"{name}.c"
        keep.write_text(source)
        raise CompileError(f"{' '.join(cmd[:3])} ... failed on {keep}:\n{proc.stderr.strip()[:4000]}")


def compile_units(units: list[str], flags: list[str], name: str = "model", jobs: int | None = None) -> Path:
    """A shared library from several C translation units, compiled in parallel.

    Each unit's object file is cached by its own hash (a kernel shared by two models, or unchanged
    between compiles, is compiled once); the library is cached by the hashes of its objects. The
    units' sources are kept, concatenated, as `<name>.c` beside the library."""
    from concurrent.futures import ThreadPoolExecutor

    cc = find_cc()
    if cc is None:
        raise CompileError("no C compiler found (set CC, or install gcc/clang); the llvm target needs none")
    version = cc_version(cc)
    obj_flags = [f for f in flags if f != "-shared"]

    def obj(i_src: tuple[int, str]) -> Path:
        i, src = i_src

        def build(tmp: Path) -> None:
            (tmp / "unit.c").write_text(src)
            _run_cc([cc, *obj_flags, "-c", str(tmp / "unit.c"), "-o", str(tmp / "unit.o")], src, f"{name}_{i}")

        return cached_build([src, version, *obj_flags, "object"], "unit.o", build)

    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        objs = list(pool.map(obj, enumerate(units)))
    source = "\n".join(units)

    def link(tmp: Path) -> None:
        (tmp / f"{name}.c").write_text(source)
        libs = ["-lmvec", "-lm"] if "_ZGV" in source and has_libmvec() else ["-lm"]
        _run_cc([cc, *flags, *map(str, objs), "-o", str(tmp / f"{name}.so"), *libs], source, name)

    return cached_build([str(o) for o in objs] + [version, *flags, "link"], f"{name}.so", link)
