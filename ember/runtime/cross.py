"""Models and kernels built for another machine (`Target.executes_here` is False): their code is a shared library
for that machine's architecture, which this process cannot load, or for a CPU of this architecture with
instructions this one lacks (AVX-512 code on an AVX2 machine), which would stop the process at the first of them.
They save like any model (the library, its source, plan.json, weights.npz) and run where their architecture and
CPU do: on a device of it, or here under an emulator (`Arch.emulator`, e.g. `qemu-aarch64 -L
/usr/aarch64-linux-gnu`) through the standalone runtime. Calling, `run`, `benchmark` and `profile` raise
`ForeignTargetError` saying so."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..target import Target
from .export import ExportsC
from .model import Fallback, Feeds, Model
from .plan import Plan


class ForeignTargetError(RuntimeError):
    """Code built for another machine was asked to run in this process."""


def foreign_error(what: str, target: Target | str) -> ForeignTargetError:
    """The error for running `what` (a model or kernel) built for `target` here: where it can run instead."""
    target = Target.parse(target)
    arch = target.arch
    if target.runs_here:  # this architecture, another CPU
        lacks = ", ".join(sorted(target.missing_features))
        return ForeignTargetError(
            f"{what} was compiled for target '{target}', whose instructions ({lacks}) this CPU lacks, and cannot run "
            "in this process; save it (.save(dir)) and run it on a CPU that has them, or compile for -mcpu=native"
        )  # fmt: skip
    assert arch is not None
    return ForeignTargetError(
        f"{what} was compiled for {arch.triple} (target '{target}') and cannot run in this process; save it "
        f"(.save(dir)) and run it on a machine of that architecture ({arch.name}), or here under an emulator "
        f"({arch.emulator}) through the standalone runtime"
    )


class CrossCompiledModel(ExportsC, Model):
    """A model compiled for another machine: its shared library (`lib_path`) and source, saved and exported (a C
    model's standalone export builds `ember_run` with the cross compiler), never run here."""

    backend = "cross"

    def __init__(self, lib: Path | str, plan: Plan, weights: Mapping[int, np.ndarray], source: str = "",
                 fallback: Fallback | None = None, summary: dict | None = None):  # fmt: skip
        super().__init__(plan, weights, fallback, summary)
        self.lib_path = Path(lib)
        self.source = source

    @property
    def target(self) -> Target:
        return Target.parse(self.plan.target)

    def _check(self, feeds: Feeds) -> list[np.ndarray]:  # every way of running starts here
        raise foreign_error(f"model {self.plan.name}", self.plan.target)

    def _save_files(self, out: Path) -> None:
        """The library and its source (model.c, or model.ll for the llvm target)."""
        shutil.copyfile(self.lib_path, out / "model.so")
        (out / ("model.ll" if self.target.kind == "llvm" else "model.c")).write_text(self.source)

    def _summary_extra(self) -> dict:
        arch = self.target.arch
        return {"triple": arch.triple if arch else "", "runs_here": False,
                **({"missing_features": sorted(self.target.missing_features)} if self.target.runs_here else {})}

    @classmethod
    def from_files(cls, directory: Path, plan: Plan, weights: Mapping[int, np.ndarray], summary: dict,
                   fallback: Fallback | None = None) -> CrossCompiledModel:  # fmt: skip
        src = next((directory / n for n in ("model.c", "model.ll") if (directory / n).exists()), None)
        return cls(directory / "model.so", plan, weights, src.read_text() if src else "", fallback, summary)


class CrossModule:
    """A kernel library built for another machine (`ember.build` with a foreign target): its path and source."""

    def __init__(self, lib_path: Path | str, target: Target, functions: dict[str, Any], source: str, ir: Any = None):
        self.lib_path = Path(lib_path)
        self.target = target
        self.functions = functions  # name -> argument specs
        self.source = source
        self.ir = ir
        self.entry = next(iter(functions))

    def _refuse(self, *args: Any, **kw: Any) -> Any:
        raise foreign_error(f"kernel {self.entry}", self.target)

    __call__ = benchmark = __getitem__ = set_num_threads = _refuse

    def __repr__(self) -> str:
        return f"CrossModule({', '.join(self.functions)} for {self.target}, {self.lib_path})"
