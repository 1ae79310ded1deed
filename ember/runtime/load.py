"""`load`: a saved model back, by the files its backend saved (no compiler needed).

    backend "gpu"   -> GPU model (runtime.gpu_model: OpenCL builds the source, CUDA loads the PTX)
    backend "llvm"  -> llvm model (runtime.llvm_model: the saved machine code or the IR, JIT)
    backend "c"     -> C model (runtime.executor: model.so)
    backend "cross" -> a model built for another machine (runtime.cross: kept, saved and exported, not run here)

Every saved model has plan.json, weights.npz, summary.json and manifest.json (the backend, every file's SHA-256,
every weight's dtype and shape). `runtime.model.read_saved` checks them all, and the plan's consistency, before
any of the model's native code is loaded: a truncated, edited or swapped file is refused with an error naming it.
Loading a model runs its native code (a shared library's constructors, say): load only models you trust, as you
would any shared library. Nodes that run on the reference fallback need `fallback` (the driver passes the op
registry's numpy references).
"""

from __future__ import annotations

from pathlib import Path

from ..target import Target, lacking_features
from .model import MANIFEST, ArtifactError, Fallback, Model, read_saved


def load(path: str | Path, fallback: Fallback | None = None) -> Model:
    """Load a model saved by `Model.save`."""
    d = Path(path)
    if not (d / "plan.json").exists():
        raise FileNotFoundError(f"{d} is not a saved Ember model (no plan.json)")
    plan, weights, summary, backend = read_saved(d)
    if backend in ("c", "llvm"):  # code for another CPU of this architecture would stop the process
        lacks = lacking_features(f for f in summary.get("simd", []) if isinstance(f, str))
        if lacks and Target.parse(plan.target).runs_here:
            raise ArtifactError(f"{d}: the model was compiled for a CPU with {', '.join(lacks)}, which this CPU "
                                "lacks: compile it again here (or for a -mcpu this CPU has)")  # fmt: skip
    if backend == "cross":
        from .cross import CrossCompiledModel

        return CrossCompiledModel.from_files(d, plan, weights, summary, fallback)
    if backend == "gpu":
        from .gpu_model import GPUCompiledModel

        return GPUCompiledModel.from_files(d, plan, weights, summary, fallback)
    if backend == "llvm":
        from .llvm_model import LLVMCompiledModel

        return LLVMCompiledModel.from_files(d, plan, weights, summary, fallback)
    if backend == "c":
        from .executor import CompiledModel

        return CompiledModel.from_files(d, plan, weights, summary, fallback)
    raise ArtifactError(f"{d / MANIFEST}: unknown backend {backend!r}")
