"""`load`: a saved model back, by the files its backend saved (no compiler needed).

    plan's target another machine -> cross-compiled model (runtime.cross: kept and saved, not run here)
    gpu.json                      -> GPU model (runtime.gpu_model: OpenCL builds the source, CUDA loads the PTX)
    model.ll (and no model.so)    -> llvm model (runtime.llvm_model: the saved machine code or the IR, JIT)
    otherwise                     -> C model (runtime.executor: model.so)

Every saved model has plan.json, weights.npz and summary.json (`runtime.model.read_saved`). Nodes that run on
the reference fallback need `fallback` (the driver passes the op registry's numpy references).
"""

from __future__ import annotations

from pathlib import Path

from ..target import Target, TargetError
from .model import Fallback, Model, read_saved


def load(path: str | Path, fallback: Fallback | None = None) -> Model:
    """Load a model saved by `Model.save`."""
    d = Path(path)
    if not (d / "plan.json").exists():
        raise FileNotFoundError(f"{d} is not a saved Ember model (no plan.json)")
    plan, weights, summary = read_saved(d)
    if _foreign(plan.target):
        from .cross import CrossCompiledModel

        return CrossCompiledModel.from_files(d, plan, weights, summary, fallback)
    if (d / "gpu.json").exists():
        from .gpu_model import GPUCompiledModel

        return GPUCompiledModel.from_files(d, plan, weights, summary, fallback)
    if (d / "model.ll").exists() and not (d / "model.so").exists():
        from .llvm_model import LLVMCompiledModel

        return LLVMCompiledModel.from_files(d, plan, weights, summary, fallback)
    from .executor import CompiledModel

    return CompiledModel.from_files(d, plan, weights, summary, fallback)


def _foreign(target: str) -> bool:
    try:
        return not Target.parse(target).runs_here
    except TargetError:  # a target this version no longer accepts: load it as its files say
        return False
