"""Whole compiled models cached by content hash, so that compiling the same model again only loads it.

An entry is a saved model (`Model.save`: written to a fresh directory and moved into place whole, with a manifest
holding every file's SHA-256) under `<cache dir>/models/<key>`, the key the SHA-256 of everything the compiled code
depends on (`model_key`): the model's bytes, the target with this machine's CPU and C compiler, every option of
`ember.compile`, the tuning log's contents, the EMBER_* and C compiler environment variables, and Ember's own source.
`ember.load` checks the manifest before it loads any native code, so an entry that is truncated, edited or half
deleted is reported, removed and rebuilt, never run.

`EMBER_COMPILE_CACHE=0` turns it off (the kernel cache of `codegen.toolchain` stays on). Entries share the cache
directory's size limit (`EMBER_CACHE_SIZE`, `codegen.toolchain.prune_cache`): least recently used ones go first.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..codegen.toolchain import cache_dir, cc_version, find_cc, maybe_prune_cache, touch
from ..target import Target
from .model import Model

__all__ = ["ENV_KEYS", "cache_enabled", "entry_path", "lookup", "model_key", "source_fingerprint", "store"]

# environment variables besides EMBER_* that change what a compile produces
ENV_KEYS = ("CC", "CFLAGS", "CPPFLAGS", "LDFLAGS")
# EMBER_* variables that do not: where the cache lives, its size limit, and this switch
ENV_IGNORED = ("EMBER_CACHE_DIR", "EMBER_CACHE_SIZE", "EMBER_COMPILE_CACHE")


def cache_enabled() -> bool:
    return os.environ.get("EMBER_COMPILE_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")


@functools.cache
def source_fingerprint() -> str:
    """SHA-256 of Ember's own files (Python, C, TOML): a cached model is only reused by the code that compiled it."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.suffix in (".py", ".c", ".h", ".toml") and p.is_file() and "__pycache__" not in p.parts:
            h.update(p.relative_to(root).as_posix().encode() + b"\0")
            h.update(p.read_bytes())
    return h.hexdigest()


def environment(env: Any = None) -> dict[str, str]:
    env = os.environ if env is None else env
    return {k: v for k, v in sorted(env.items())
            if (k.startswith("EMBER_") and k not in ENV_IGNORED) or k in ENV_KEYS}  # fmt: skip


@functools.cache
def _version(package: str) -> str | None:
    """An installed package's version, whether or not it is imported yet (the key read `__version__` of the imported
    module: onnx, imported by the first compile, made the second compile of a process miss the entry the first
    stored)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def model_key(model_parts: Iterable[bytes], target: Target, options: dict[str, Any]) -> str:
    """The key of a compile: `model_parts` (the model's bytes, and those of files it refers to), the target as this
    machine builds it, `options` (JSON-serializable: every argument of the compile that changes its result, the
    tuning log's contents as a digest), the environment and Ember's source."""
    h = hashlib.sha256()
    for part in model_parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    cc = find_cc() if target.kind == "c" else None
    facts = {
        "target": repr(target),
        "simd": sorted(target.simd_features()),
        "l1d": repr(target.l1d),  # the host's L1 shapes GEMM tiles (`ember.templates.nn.alias_free_rows`)
        "machine": platform.machine(),
        "cc": cc_version(cc) if cc else None,
        "python": sys.version_info[:2],
        "versions": {m: _version(m) for m in ("numpy", "onnx")},
        "options": options,
        "env": environment(),
        "ember": source_fingerprint(),
    }
    h.update(json.dumps(facts, sort_keys=True, default=repr).encode())
    return h.hexdigest()


def entry_path(key: str) -> Path:
    return cache_dir() / "models" / key


def lookup(key: str, load: Callable[[Path], Model]) -> Model | None:
    """The cached model of `key` loaded by `load` (which verifies it), or None. An entry that does not verify is
    removed with a warning naming what was wrong, and None returned: the caller compiles and stores it again."""
    path = entry_path(key)
    if not (path / "manifest.json").exists() and not path.exists():
        return None
    try:
        model = load(path)
        touch(path)
        return model
    except Exception as e:  # noqa: BLE001 - any defect of an entry means: do not trust it, rebuild it
        warnings.warn(f"ember compile cache: entry {path} is damaged ({type(e).__name__}: {e}); rebuilding it",
                      RuntimeWarning, stacklevel=3)  # fmt: skip
        shutil.rmtree(path, ignore_errors=True)
        return None


def store(key: str, model: Model) -> Path | None:
    """Save `model` as the entry of `key` (atomically: a concurrent or killed compile leaves either no entry or a
    whole one). A model that cannot be saved (a size computed on the host from input values, control flow on the
    reference fallback) or a cache that cannot be written is skipped."""
    path = entry_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(prefix=f".{key[:16]}.", dir=path.parent))
        try:
            model.save(staged / "m")
            try:
                os.rename(staged / "m", path)  # atomic; fails if another process stored it first, which is as good
            except OSError:
                if not (path / "manifest.json").exists():
                    raise
        finally:
            shutil.rmtree(staged, ignore_errors=True)
    except (NotImplementedError, OSError) as e:
        warnings.warn(f"ember compile cache: not storing {path} ({e})", RuntimeWarning, stacklevel=3)
        return None
    maybe_prune_cache()
    return path
