"""The llvm model backend: a whole compiled model as one LLVM module, JIT-compiled by llvmlite (no C compiler).

    kernels (loop IR)      -> LLVM functions `i32 name(ptr, ...)` (codegen.llvm)
    segments (run plan)    -> `i32 ember_segment_N(ptr v)` and `i32 ember_segment_N_profiled(ptr v, ptr t)`:
                              the kernels called in order with buffer pointers from the value table `v`
                              (the C backend's runner functions, written in LLVM IR)
    the module             -> `JITEngine` (machine code cached on disk by a hash of the IR)

`CompiledModel` calls the segment functions at the engine's addresses as it calls a shared library's.
A saved model keeps the LLVM IR (`model.ll`) and the machine code (`model.o` with its cache key): `ModelJIT.load`
puts the code back into the JIT cache where the key still matches (same IR, target, CPU and llvmlite), so
loading needs neither a C compiler nor a new optimization run; elsewhere the IR is compiled again.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..runtime.executor import CompiledModel, Step
from ..target import Target
from .llvm import JITEngine, atomic_write, codegen_llvm, object_cache_path, object_key, target_machine

if TYPE_CHECKING:
    from ..compiler import LoweredModel

# clock_gettime's id of the monotonic clock
_CLOCK_MONOTONIC = {"linux": 1, "darwin": 6}

_CLOCK_IR = """
%ember.timespec = type {{ i64, i64 }}
declare i32 @clock_gettime(i32, ptr)

define internal double @ember_now() {{
  %ts = alloca %ember.timespec
  %rc = call i32 @clock_gettime(i32 {clock}, ptr %ts)
  %sp = getelementptr %ember.timespec, ptr %ts, i32 0, i32 0
  %s = load i64, ptr %sp
  %np = getelementptr %ember.timespec, ptr %ts, i32 0, i32 1
  %ns = load i64, ptr %np
  %sf = sitofp i64 %s to double
  %nf = sitofp i64 %ns to double
  %nsec = fmul double %nf, 1.0e-9
  %t = fadd double %sf, %nsec
  ret double %t
}}
"""


def runner_ir(steps: list[Step]) -> str:
    """LLVM IR of each segment's runner (plain and timed): the kernels called in order, the first nonzero
    status returned. The timed variant writes each kernel's seconds to `t[j]`."""
    clock = _CLOCK_MONOTONIC.get(sys.platform, 1)
    out = [_CLOCK_IR.format(clock=clock)]
    for s in steps:
        if s.kind != "segment":
            continue
        for timed in (False, True):
            name = s.function + ("_profiled" if timed else "")
            out.append(f'define i32 @"{name}"(ptr noalias %v{", ptr noalias %t" if timed else ""}) {{')
            out.append("entry:")
            for j, k in enumerate(s.kernels):
                out.append(f"  ; {', '.join(k.nodes)}")
                args = []
                for n, a in enumerate(k.args):
                    out.append(f"  %p{j}.{n} = getelementptr ptr, ptr %v, i64 {a}")
                    out.append(f"  %a{j}.{n} = load ptr, ptr %p{j}.{n}")
                    args.append(f"ptr %a{j}.{n}")
                if timed:
                    out.append(f"  %t{j}.0 = call double @ember_now()")
                out.append(f'  %s{j} = call i32 @"{k.name}"({", ".join(args)})')
                if timed:
                    out.append(f"  %t{j}.1 = call double @ember_now()")
                    out.append(f"  %dt{j} = fsub double %t{j}.1, %t{j}.0")
                    out.append(f"  %tp{j} = getelementptr double, ptr %t, i64 {j}")
                    out.append(f"  store double %dt{j}, ptr %tp{j}")
                out.append(f"  %bad{j} = icmp ne i32 %s{j}, 0")
                out.append(f"  br i1 %bad{j}, label %fail{j}, label %ok{j}")
                out.append(f"fail{j}:")
                out.append(f"  ret i32 %s{j}")
                out.append(f"ok{j}:")
            out += ["  ret i32 0", "}", ""]
    return "\n".join(out)


class ModelJIT(JITEngine):
    """A model's module compiled in memory, as `CompiledModel` calls it (`runtime.executor.NativeCode`); its
    parallel loops use the target's threads (default: all cores)."""

    def __init__(self, ir_text: str, target: Target):
        super().__init__(ir_text, target)
        self.set_num_threads(target.num_cores)

    def save(self, directory: Path) -> None:
        """Write the LLVM IR, and the machine code with the cache key it is valid for."""
        (directory / "model.ll").write_text(self.ir_text)
        if self.object_path.exists():
            (directory / "model.o").write_bytes(self.object_path.read_bytes())
            (directory / "model.key").write_text(self.object_path.stem + "\n")

    @classmethod
    def load(cls, directory: Path, target: str | Target) -> ModelJIT:
        """The engine of a saved model: its machine code where still valid (the key matches), else its IR
        compiled again."""
        target = Target.parse(target)
        ir_text = (directory / "model.ll").read_text()
        obj, key_file = directory / "model.o", directory / "model.key"
        if obj.exists() and key_file.exists():
            key = object_key(ir_text, target, target_machine(target))
            cached = object_cache_path(key)
            if key_file.read_text().strip() == key and not cached.exists():
                atomic_write(cached, obj.read_bytes())
        return cls(ir_text, target)


def build_llvm_model(m: LoweredModel) -> CompiledModel:
    """The model backend of target kind "llvm": every kernel and the segment runners in one LLVM module."""
    from ..compiler import reference_fallback

    funcs = [k.func for k in m.gl.kernels.values()]
    source = codegen_llvm(funcs, m.target) + "\n" + runner_ir(m.gl.steps)  # (ImportError without llvmlite)
    jit = ModelJIT(source, m.target)
    import llvmlite

    t_build = time.perf_counter()
    summary = {**m.summary, "compile_seconds": t_build - m.t0, "build_seconds": t_build - m.t_lower,
               "llvmlite": llvmlite.__version__, "jit_cache_hit": jit.from_cache}  # fmt: skip
    return CompiledModel(jit, m.plan, m.gl.weights, source, reference_fallback, summary)
