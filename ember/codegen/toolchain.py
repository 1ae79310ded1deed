"""Compile C source to a shared library with the target's C compiler, cached by content hash.

A cache entry is a directory named by the SHA-256 of (source, compiler, flags), holding
`kernel.c` (the source, kept for reading and debugging) and `kernel.so`. Entries are built in a
temporary directory and renamed into place, so a killed compile never leaves a broken entry.

The compiler of a target is `compiler_for(target)` and its flags `target.cflags()`: this machine's
compiler ($CC, else cc/gcc/clang) for a target of this machine, the distribution's cross compiler
`<triple>-gcc` for another (`-mtriple=`). Anything that builds C for a target (a model, a kernel, an
exported model's runtime) calls these two:

    cc = compiler_for(target)                   # raises TargetError naming the package to install
    subprocess.run([cc, *target.cflags(), "model.c", "-o", "model.so", "-lm"])
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..target import Target, TargetError, host_has_libmvec


class CompileError(RuntimeError):
    """The C compiler rejected generated code; the message holds its output and where the source is."""


def cache_dir() -> Path:
    root = os.environ.get("EMBER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ember"
    )
    return Path(root)


DEFAULT_CACHE_SIZE = 8 << 30  # bytes; `EMBER_CACHE_SIZE` overrides (ccache's default is 5 GB)
PRUNE_EVERY = 600.0  # seconds between automatic prunes of one cache directory (a walk of every entry)
KEEP_RECENT = 900.0  # seconds: an automatic prune never evicts an entry used this recently (a compile may need it)
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str, what: str = "size") -> int | None:
    """Bytes from "8G", "500M", "1.5GiB", "123456"; None (no limit) from "0", "none", "off" or "unlimited". A bad
    value raises ValueError naming `what`."""
    norm = text.strip().upper().removesuffix("IB").removesuffix("B")
    if norm in ("0", "NONE", "OFF", "UNLIMITED"):
        return None
    unit = norm[-1] if norm and norm[-1] in _UNITS else ""
    try:
        size = float(norm[: len(norm) - len(unit)])
    except ValueError:
        size = -1.0
    if not size > 0:
        raise ValueError(f"{what}={text!r}: want a size such as 8G, 500M or 123456 (bytes), or 0 for no limit")
    return int(size * _UNITS[unit])


def cache_limit() -> int | None:
    """The cache's size limit in bytes from `EMBER_CACHE_SIZE` (`parse_size`; default 8 GiB, "0": no limit)."""
    text = os.environ.get("EMBER_CACHE_SIZE", "").strip()
    return parse_size(text, "EMBER_CACHE_SIZE") if text else DEFAULT_CACHE_SIZE


def touch(entry: Path) -> None:
    """Mark a cache entry used now (its directory's mtime orders eviction: least recently used first)."""
    with contextlib.suppress(OSError):
        os.utime(entry)


@dataclass(frozen=True)
class CacheEntry:
    path: Path
    bytes: int
    used: float  # last use, seconds since the epoch


def _is_bucket(p: Path) -> bool:
    return len(p.name) == 2 and all(c in "0123456789abcdef" for c in p.name) and p.is_dir()


def cache_entries(root: Path | None = None) -> list[CacheEntry]:
    """Every evictable entry of the cache, with its size and last use: kernel and link entries (`xx/<key>/`), whole
    models (`models/<key>/`), LLVM objects (`llvm/xx/<key>.o`). Staging directories of builds in flight (names
    starting with a dot) are not entries, nor is the roofline measurement (small, and slow to redo)."""
    root = cache_dir() if root is None else root
    if not root.is_dir():
        return []
    parents = [b for b in root.iterdir() if _is_bucket(b)]
    parents += [root / "models"] + [b for b in (root / "llvm").glob("??") if _is_bucket(b)]
    found = []
    for parent in parents:
        for entry in parent.iterdir() if parent.is_dir() else ():
            if entry.name.startswith("."):
                continue
            try:
                files = [entry] if entry.is_file() else [f for f in entry.rglob("*") if f.is_file()]
                found.append(CacheEntry(entry, sum(f.stat().st_size for f in files), entry.stat().st_mtime))
            except OSError:
                continue  # removed while we looked
    return found


def prune_cache(limit: int | None = None, root: Path | None = None, stale_after: float = 86400.0,
                keep_recent: float = 0.0) -> list[Path]:  # fmt: skip
    """Evict least recently used entries until the cache holds at most `limit` bytes (default `cache_limit()`; it
    stops at 80% so that the next few compiles do not prune again), never one used in the last `keep_recent`
    seconds (a compile in progress may still need what it built), and remove staging directories older than
    `stale_after` seconds (left by killed builds). Each entry is renamed aside before removal, so a reader sees a
    whole entry or none. Returns the removed entries."""
    root = cache_dir() if root is None else root
    limit = cache_limit() if limit is None else limit
    removed = []
    now = time.time()
    for stage in [*root.glob("*/.*"), *root.glob("llvm/??/.*")] if root.is_dir() else ():
        with contextlib.suppress(OSError):
            if now - stage.stat().st_mtime > stale_after:
                shutil.rmtree(stage, ignore_errors=True) if stage.is_dir() else stage.unlink()
    if limit is None:
        return removed
    entries = sorted(cache_entries(root), key=lambda e: e.used)
    total = sum(e.bytes for e in entries)
    if total <= limit:
        return removed
    for e in entries:
        if total <= 0.8 * limit or e.used > now - keep_recent:
            break
        if e.path.is_dir():
            _discard(e.path)
        else:
            e.path.unlink(missing_ok=True)
        total -= e.bytes
        removed.append(e.path)
    return removed


def maybe_prune_cache() -> None:
    """`prune_cache()` at most once per PRUNE_EVERY seconds per cache directory (a stamp file's mtime says when),
    called after a build adds to the cache. Errors are ignored: a cache that cannot be pruned still works."""
    root = cache_dir()
    stamp = root / ".pruned"
    try:
        if stamp.exists() and time.time() - stamp.stat().st_mtime < PRUNE_EVERY:
            return
        root.mkdir(parents=True, exist_ok=True)
        stamp.touch()
        prune_cache(root=root, keep_recent=KEEP_RECENT)
    except (OSError, ValueError):
        pass


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


def has_libmvec() -> bool:
    """Whether this machine can link glibc's vector math library (a target's code uses it where
    `Target.has_libmvec`: only code for this machine's own triple)."""
    return host_has_libmvec()


def compiler_for(target: Target | str) -> str:
    """The C compiler command that builds code for `target` (with `target.cflags()`).

    This machine's target (no -mtriple, or its own triple): `find_cc()` ($CC, else cc, gcc, clang), or
    `CompileError` where none is installed. Another machine's: the cross compiler `<triple>-gcc` (the llvm
    target links its objects with it), or a `TargetError` that names the Debian package to install. For a c
    target naming a CPU or features, also checks (once) that the compiler accepts its machine flags."""
    target = Target.parse(target)
    arch = target.arch
    if target.runs_here:
        cc = find_cc()
        if cc is None:
            raise CompileError("no C compiler found (set CC, or install gcc/clang); the llvm target needs none")
    else:
        assert arch is not None
        cc = f"{arch.triple}-gcc"
        if shutil.which(cc) is None:
            raise TargetError(f"target '{target}' needs the cross compiler {cc}, which is not installed: "
                              f"apt-get install {arch.package} (Debian/Ubuntu)")  # fmt: skip
    if target.kind == "c" and (target.mcpu != "native" or target.mattr):
        _check_machine_flags(cc, tuple(target.machine_flags()), str(target))
    return cc


def check_toolchain(target: Target | str) -> None:
    """Raise now (`TargetError`, `CompileError`) where this machine cannot build for `target`: a c target
    needs its C compiler, an llvm target for another machine needs the cross compiler to link."""
    target = Target.parse(target)
    if target.kind == "c" or (target.kind == "llvm" and not target.runs_here):
        compiler_for(target)


@functools.cache
def _check_machine_flags(cc: str, flags: tuple[str, ...], target: str) -> None:
    cmd = [cc, *flags, "-x", "c", "-c", "-o", os.devnull, "-"]
    proc = subprocess.run(cmd, input="int ember_probe;\n", capture_output=True, text=True)
    if proc.returncode != 0:
        first = (proc.stderr.strip().splitlines() or ["?"])[0]
        raise TargetError(f"target '{target}': {cc_version(cc)} does not accept {' '.join(flags)} ({first}); "
                          "pick another -mcpu/-mattr, or a newer compiler (set CC)")  # fmt: skip


def elf_machine(path: str | os.PathLike) -> int:
    """The e_machine field of an ELF file (62 x86_64, 183 aarch64, 243 riscv, 40 arm: `Arch.elf_machine`)."""
    with open(path, "rb") as f:
        head = f.read(20)
    if head[:4] != b"\x7fELF":
        raise ValueError(f"{path} is not an ELF file")
    return int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")


def compile_c(source: str, flags: list[str], name: str = "kernel", cc: str | None = None) -> Path:
    """Path of a shared library built from `source` by `cc` (default: this machine's, `find_cc`), reused from
    the cache when present."""
    cc = cc or find_cc()
    if cc is None:
        raise CompileError("no C compiler found (set CC, or install gcc/clang); the llvm target needs none")
    key = hashlib.sha256("\0".join([source, cc_version(cc), *flags]).encode()).hexdigest()
    entry = cache_dir() / key[:2] / key
    lib = entry / f"{name}.so"
    if lib.exists():
        touch(entry)
        return lib
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key[:8]}-", dir=entry.parent))
    try:
        src = tmp / f"{name}.c"
        src.write_text(source)
        libs = ["-lmvec", "-lm"] if "_ZGV" in source else ["-lm"]  # (only code for a libmvec target has _ZGV)
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
    maybe_prune_cache()
    return lib


def cached_build(key_parts: list[str], out_name: str, build) -> Path:
    """Cache entry for a key: `build(tmpdir)` writes `out_name` into a fresh temp dir, then it is renamed in, with
    the SHA-256 of `out_name` beside it (`<out_name>.sha256`). An entry is checked on every hit: one that is torn,
    edited or from before entries carried hashes is removed and built again."""
    key = hashlib.sha256("\0".join(key_parts).encode()).hexdigest()
    entry = cache_dir() / key[:2] / key
    out = entry / out_name
    if out.exists():
        if _entry_intact(out):
            touch(entry)
            return out
        _discard(entry)
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key[:8]}-", dir=entry.parent))
    try:
        build(tmp)
        (tmp / f"{out_name}.sha256").write_text(sha256_of(tmp / out_name) + "\n")
        try:
            os.rename(tmp, entry)
        except OSError:
            if not out.exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    maybe_prune_cache()
    return out


def sha256_of(path: Path) -> str:
    """The SHA-256 of a file (hex), read in blocks: cache entries and saved models are checked with it."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _entry_intact(out: Path) -> bool:
    digest = out.with_name(out.name + ".sha256")
    try:
        return digest.read_text().strip() == sha256_of(out)
    except OSError:
        return False


def _discard(entry: Path) -> None:
    """Remove a cache entry (renamed aside first, so no reader sees it half removed)."""
    aside = entry.with_name(f".{entry.name}-bad-{os.getpid()}")
    try:
        os.rename(entry, aside)
    except OSError:
        return  # another process replaced or removed it
    shutil.rmtree(aside, ignore_errors=True)


def _run_cc(cmd: list[str], source: str, name: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        keep = Path(tempfile.mkdtemp(prefix="ember-failed-")) / f"{name}.c"
        keep.write_text(source)
        raise CompileError(f"{' '.join(cmd[:3])} ... failed on {keep}:\n{proc.stderr.strip()[:4000]}")


def compile_units(units: list[str], flags: list[str], name: str = "model", jobs: int | None = None,
                  cc: str | None = None) -> Path:  # fmt: skip
    """A shared library from several C translation units, compiled in parallel by `cc` (default: `find_cc`).

    Each unit's object file is cached by its own hash (a kernel shared by two models, or unchanged
    between compiles, is compiled once); the library is cached by the hashes of its objects. The
    units' sources are kept, concatenated, as `<name>.c` beside the library."""
    from concurrent.futures import ThreadPoolExecutor

    cc = cc or find_cc()
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
        libs = ["-lmvec", "-lm"] if "_ZGV" in source else ["-lm"]
        _run_cc([cc, *flags, *map(str, objs), "-o", str(tmp / f"{name}.so"), *libs], source, name)

    return cached_build([str(o) for o in objs] + [version, *flags, "link"], f"{name}.so", link)


def link_object(obj: bytes, target: Target, key: str, name: str = "model") -> Path:
    """A shared library for `target` from one object file (the llvm target's code for another machine), linked
    by `compiler_for(target)`; cached under `key` (the object's own cache key)."""
    cc = compiler_for(target)

    def link(tmp: Path) -> None:
        (tmp / f"{name}.o").write_bytes(obj)
        cmd = [cc, "-shared", "-fPIC", str(tmp / f"{name}.o"), "-o", str(tmp / f"{name}.so"), "-lm", "-lpthread"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CompileError(f"{' '.join(cmd)} failed:\n{proc.stderr.strip()[:4000]}")

    return cached_build([key, cc_version(cc), "link-object"], f"{name}.so", link)
