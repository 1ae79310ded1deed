"""`ember.lower` and `ember.build`: from a schedule to printable loop IR and to a callable library."""

from __future__ import annotations

from collections.abc import Sequence

from .codegen.c import c_symbol, codegen_c
from .codegen.toolchain import compile_c, compiler_for, find_cc
from .runtime.cross import CrossModule
from .runtime.module import ArgSpec, Module
from .target import Target
from .te.lower import lower_schedule
from .te.schedule import Schedule
from .te.tensor import Tensor
from .tir.functor import walk
from .tir.stmt import PrimFunc, Store, size_params
from .tir.transform import optimize


def lower(
    sch: Schedule, args: Sequence[Tensor], name: str = "default_function", trace: bool = False, gpu: bool = False
) -> PrimFunc:
    """The optimized loop IR of a schedule (print it to read the loop nest).

    `trace=True` prints the IR after each loop pass; `gpu=True` runs the GPU targets' passes (vectorized
    loops stay scalar loops: the threads are the lanes)."""
    func = lower_schedule(sch, args, name)
    if trace:
        print(f"# after schedule\n{func}\n")
    if gpu:
        from .codegen.gpu import GPU_PIPELINE

        return optimize(func, GPU_PIPELINE, trace=trace)
    return optimize(func, trace=trace)


def build(
    sch: Schedule | PrimFunc,
    args: Sequence[Tensor] | None = None,
    target: str | Target | None = None,
    name: str = "default_function",
) -> Module:
    """Compile a schedule (or lowered function) for `target` and load it.

    The result is called with one numpy array per argument, outputs written in place:
    `f(a, b, c)`. Shapes, dtypes and layout are checked before any native code runs. The default
    target is "c", or "llvm" where no C compiler is installed. A target of another machine (`-mtriple=`) is
    cross-compiled into a `CrossModule`: its library and source, which refuse to run in this process."""
    target = Target.parse(target if target is not None else default_target())
    if isinstance(sch, PrimFunc):
        func = sch
    else:
        if args is None:
            raise TypeError("build(schedule, args): the argument tensors are required")
        func = lower(sch, args, name, gpu=target.kind in ("cuda", "opencl"))
    written = {n.buffer for n in walk(func.body) if isinstance(n, Store)}
    specs = [ArgSpec(b.name, b.shape, b.dtype.name, b in written) for b in func.params]
    sizes = size_params(func.params)
    if sizes and target.kind not in ("c", "llvm"):
        raise NotImplementedError(f"build: kernels with symbolic sizes ({', '.join(v.name for v in sizes)}) are built "
                                  f"for the c and llvm targets only so far, not {target.kind!r}")  # fmt: skip
    if target.kind == "llvm":
        return _build_llvm(func, target, specs)
    if target.kind == "opencl":
        return _build_opencl(func, target)
    if target.kind == "cuda":
        return _build_cuda(func, target)
    if target.kind != "c":
        raise NotImplementedError(f"target {target.kind!r} is not available yet")
    source = codegen_c(func, target)
    lib = compile_c(source, target.cflags(), cc=compiler_for(target))
    if not target.executes_here:
        return CrossModule(lib, target, {c_symbol(func.name): specs}, source, func)
    return Module(lib, {c_symbol(func.name): specs}, source, func)


def default_target() -> str:
    """"c" where a C compiler is installed, else "llvm" (llvmlite needs none)."""
    return "c" if find_cc() is not None else "llvm"


def _build_llvm(func: PrimFunc, target: Target, specs: list[ArgSpec]) -> Module | CrossModule:
    import os

    from .codegen.llvm import JITEngine, codegen_llvm, refuse_missing_features, shared_library
    from .runtime.jit import JITModule

    source = codegen_llvm(func, target)
    if not target.runs_here:
        return CrossModule(shared_library(source, target, name="kernel"), target, {c_symbol(func.name): specs},
                           source, func)  # fmt: skip
    refuse_missing_features(target)
    jit = JITEngine(source, target)
    jit.set_num_threads(target.threads or os.cpu_count() or 1)
    return JITModule(jit, {c_symbol(func.name): specs}, source, func)


def _build_opencl(func: PrimFunc, target: Target):
    from .codegen.gpu import split_host_device
    from .codegen.opencl import codegen_opencl
    from .runtime.opencl import OpenCLModule

    prog = split_host_device(func)
    return OpenCLModule(prog, codegen_opencl(prog, target), func)


def _build_cuda(func: PrimFunc, target: Target):
    from .codegen.cuda import codegen_cuda, compile_cuda
    from .codegen.gpu import split_host_device
    from .runtime.cuda import CUDAModule

    prog = split_host_device(func)
    source = codegen_cuda(prog, target)
    return CUDAModule(prog, source, compile_cuda(source, target), func)
