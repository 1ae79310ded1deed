"""Targets: a string like "c -mcpu=native -threads=2" parsed once into a `Target`."""

from __future__ import annotations

import functools
import os
import platform
import shlex
from dataclasses import dataclass, field

KINDS = ("c", "llvm", "cuda", "opencl")
FLAGS = ("fastmath",)  # options without a value: "llvm -fastmath" means fastmath=1


@dataclass(frozen=True)
class Target:
    kind: str
    mcpu: str = "native"
    threads: int | None = None  # None: OpenMP's default (all cores)
    opt: str = "-O3"
    extra_flags: tuple[str, ...] = ()
    options: tuple[tuple[str, str], ...] = field(default=())

    @staticmethod
    def parse(spec: str | Target) -> Target:
        if isinstance(spec, Target):
            return spec
        parts = shlex.split(spec)
        if not parts or parts[0] not in KINDS:
            raise ValueError(f"unknown target {spec!r}; the kind must be one of {', '.join(KINDS)}")
        kind, kw = parts[0], {}
        extra: list[str] = []
        options: list[tuple[str, str]] = []
        for p in parts[1:]:
            key, _, value = p.lstrip("-").partition("=")
            if key == "mcpu":
                kw["mcpu"] = value
            elif key == "threads":
                if not value.isdigit() or int(value) < 1:
                    raise ValueError(f"target {spec!r}: -threads needs a positive integer")
                kw["threads"] = int(value)
            elif key in ("O0", "O1", "O2", "O3", "Os", "Ofast"):
                kw["opt"] = "-" + key
            elif key == "cflag":
                extra.append(value)
            elif value:
                options.append((key, value))
            elif key in FLAGS:
                options.append((key, "1"))
            else:
                raise ValueError(f"target {spec!r}: unknown option {p!r}")
        return Target(kind, extra_flags=tuple(extra), options=tuple(options), **kw)

    def __str__(self) -> str:
        out = [self.kind]
        if self.mcpu != "native":
            out.append(f"-mcpu={self.mcpu}")
        if self.threads is not None:
            out.append(f"-threads={self.threads}")
        if self.opt != "-O3":
            out.append(self.opt)
        out += [f"-cflag={f}" for f in self.extra_flags]
        out += [f"-{k}={v}" for k, v in self.options]
        return " ".join(out)

    def cflags(self) -> list[str]:
        """Flags for the system C compiler.

        `-fno-predictive-commoning`: GCC 12's predictive commoning (on at -O3) moves stores across
        iterations of an OpenMP thread's chunk and writes back stale values to elements that belong to
        other threads, e.g. `#pragma omp parallel for` over `ii < 2` of `C[io * 14 + ii * 7] = 0` loses
        stores in one call out of a few hundred (regression test in tests/codegen/test_codegen_c.py).
        `-fno-math-errno`: kernels never read errno, and without it GCC keeps sqrt/floor/... as calls."""
        return [
            self.opt, f"-march={self.mcpu}", "-fno-predictive-commoning", "-fno-math-errno", "-fopenmp", "-fPIC",
            "-shared", "-std=gnu11", *self.extra_flags,
        ]  # fmt: skip

    @property
    def vector_bits(self) -> int:
        """Width of the widest float SIMD registers the target has (for choosing vector lanes)."""
        if self.kind in ("cuda", "opencl"):
            return 128
        flags = host_cpu_flags() if self.mcpu == "native" else set()
        if self.mcpu != "native":
            return (
                512
                if any(s in self.mcpu for s in ("avx512", "skylake-avx512", "znver4", "znver5", "sapphire"))
                else 256
            )
        if "avx512f" in flags:
            return 512
        if "avx2" in flags or "avx" in flags:
            return 256
        return 128

    def vector_lanes(self, dtype_bits: int = 32) -> int:
        return max(1, self.vector_bits // dtype_bits)

    @property
    def num_cores(self) -> int:
        return self.threads or os.cpu_count() or 1


@functools.cache
def host_cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset([platform.machine()])
