"""`ember.compile`: import a model, lower every operator through `ember.te`, build it for a target.

graph -> passes -> kernels (ember.kernels: one per node with a TE compute; views like Reshape become aliases)
      -> run plan with workspace offsets by liveness (runtime.plan)
      -> a backend (runtime: C library, LLVM JIT, OpenCL/CUDA device code) -> a model (runtime.model.Model)

The driver owns what the runtime must not import: the op registry's numpy references (`reference_fallback`),
passed to every backend and to `load` for the nodes without a native kernel.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .build import default_target
from .codegen.toolchain import check_toolchain
from .graph.ir import Graph
from .kernels import GraphLowering, Limits, LoweringUnsupported, WorkLimitError, check_tensor_sizes
from .ops import get_op
from .ops.common import SizeBoundError
from .ops.te_lib import NotLowerable
from .passes import run_passes
from .passes.layout import active_algorithm_choices, algorithm_choices
from .runtime import compile_cache
from .runtime.executor import build_c_model
from .runtime.load import load as runtime_load
from .runtime.model import Model
from .runtime.plan import Plan, assign_offsets
from .target import Target
from .te.config import algorithms, load_tuned

__all__ = ["BACKENDS", "Limits", "LoweredModel", "LoweringUnsupported", "NotLowerable", "WorkLimitError",
           "build_model", "compile", "import_model", "load", "lower_model", "reference_fallback"]  # fmt: skip


SYMBOLIC_KINDS = ("c", "llvm")  # target kinds whose kernels take sizes as arguments (a symbolic model's default)


def reference_fallback(op: str, attrs: dict, arrays: list[np.ndarray | None]) -> list[np.ndarray]:
    """Run one node with its numpy reference (for operators without a native kernel)."""
    return list(get_op(op).reference(attrs, *arrays))


def compile(  # noqa: A001
    model: Any,
    target: str | Target | None = None,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    fallback: bool = True,
    opt_level: int = 3,
    disabled_passes: Sequence[str] = (),
    tuning_log: str | os.PathLike | None = None,
    max_elements: int | None = None,
    max_iterations: int | None = None,
    dynamic: bool | None = None,
    dynamic_bounds: dict[str, tuple[int, int | None]] | None = None,
    example_inputs: Any = None,
    dynamic_shapes: Any = None,
) -> Model:
    """Compile a model (ONNX path or ModelProto, a .tflite file, a Keras model or SavedModel directory, a torch
    `nn.Module` with `example_inputs` or an `ExportedProgram`, or an ember Graph: `import_model`) for `target`
    (default: "c", or "llvm"
    where no C compiler is installed, as `ember.build`).

    `opt_level` 0..3 and `disabled_passes` choose the graph passes (`ember.passes.PASSES`); with
    `fallback=False` every node must get a native kernel (else one error lists those that do not).
    `tuning_log` (JSON lines written by `ember tune`) gives each tuned workload its best config;
    the others keep their templates' fallback configs.

    A target of another machine (`"c -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"`) is built with its cross
    compiler (checked first: a missing one raises a `TargetError` naming its package); the model saves, but
    running it here raises `ForeignTargetError` (it runs on that machine, or under an emulator).

    Work bounds, checked before any code is generated (`ember.kernels.Limits`): a tensor of more than
    `max_elements` elements (default 2^34, or the environment variable EMBER_MAX_ELEMENTS) or a kernel whose
    loops run more than `max_iterations` iterations (default 2^40, or EMBER_MAX_ITERATIONS) makes compile
    raise `WorkLimitError`, naming the node and the tensor.

    Symbolic sizes: a model's symbolic dims (ONNX dim_params; an ExportedProgram's, or a torch module's
    `dynamic_shapes`: `torch.export.Dim`s as `torch.export.export` takes them, each size variable named as its Dim)
    stay symbolic by default on the CPU targets (`SYMBOLIC_KINDS`), bounded by `dynamic_bounds` ({"S": (1, 512)}:
    inclusive, None for unbounded; default [1, inf)): the kernels take the sizes as arguments and the model runs at
    every size in the bounds, planning its memory once per new size (no recompile); `summary()["symbolic_dims"]`
    lists the size variables and their bounds. `input_shapes` still fixes an input's dims. `dynamic=False`
    specializes instead (a symbolic leading dim becomes 1, another symbolic dim asks for `input_shapes`), as do the
    GPU targets by default, with a warning naming the dims; `dynamic=True` or `dynamic_bounds` there is an error."""
    t0 = time.perf_counter()
    if target is not None and not isinstance(target, str | Target):  # ember.compile(module, example_inputs)
        target, example_inputs = None, target
    limits = Limits.resolve(max_elements, max_iterations)
    target = Target.parse(target if target is not None else default_target())
    if target.kind not in BACKENDS:
        have = ", ".join(sorted(BACKENDS))
        raise NotImplementedError(f"ember.compile: no model backend for target {target.kind!r} yet (have: {have})")
    if not target.runs_here:
        check_toolchain(target)
    if dynamic is False and (dynamic_bounds or dynamic_shapes):
        raise ValueError("ember.compile: dynamic_bounds or dynamic_shapes is given with dynamic=False (the dims would "
                         "be specialized)")  # fmt: skip
    symbolic = bool(dynamic or dynamic_bounds or dynamic_shapes) or (dynamic is None and target.kind in SYMBOLIC_KINDS)
    if symbolic and target.kind not in SYMBOLIC_KINDS:
        raise NotImplementedError(f"ember.compile: symbolic sizes (dynamic=True) are compiled for targets "
                                  f"{', '.join(SYMBOLIC_KINDS)} only so far, not {target.kind!r}; pass input_shapes= "
                                  "or dynamic=False to specialize")  # fmt: skip
    if dynamic is None and not symbolic:
        _warn_specialized(model, input_shapes, target)
    options = {"input_shapes": input_shapes, "fallback": fallback, "opt_level": opt_level,
               "disabled_passes": sorted(disabled_passes), "limits": [limits.max_elements, limits.max_iterations],
               "symbolic": symbolic, "dynamic_bounds": sorted((dynamic_bounds or {}).items())}  # fmt: skip
    # (within `algorithm_choices`, the passes must run: they take the context's choices, or record what they met)
    key = None if dynamic_shapes or active_algorithm_choices() else compile_key(model, target, options, tuning_log)
    if key is not None and (cached := compile_cache.lookup(key, load)) is not None:
        cached.update_summary(compile_seconds=time.perf_counter() - t0, compile_cache="hit", lower_seconds=0.0,
                              build_seconds=0.0)  # fmt: skip
        return cached
    lowered = _lower_bounded(model, target, input_shapes, fallback, opt_level, disabled_passes, tuning_log, t0,
                             limits, dynamic_bounds if symbolic else None, symbolic, example_inputs, dynamic_shapes)
    if lowered.plan.is_symbolic and target.kind not in SYMBOLIC_KINDS:  # sizes read from values (a Reshape target)
        names = ", ".join(v.name for v in lowered.plan.size_vars)
        raise NotImplementedError(f"ember.compile: sizes known at run time ({names}) are compiled for targets "
                                  f"{', '.join(SYMBOLIC_KINDS)} only so far, not {target.kind!r}; bind their inputs "
                                  "as constants")  # fmt: skip
    built = build_model(lowered)
    if key is not None:
        built.update_summary(compile_cache="stored" if compile_cache.store(key, built) else "not stored")
    return built


def _lower_bounded(model: Any, target: Target, input_shapes: dict | None, fallback: bool, opt_level: int,
                   disabled_passes: Sequence[str], tuning_log: Any, t0: float, limits: Limits,
                   dynamic_bounds: dict | None, symbolic: bool, example_inputs: Any,
                   dynamic_shapes: Any) -> LoweredModel:  # fmt: skip
    """`lower_model`; where a symbolic model needs a size no larger than a bound it implies (S against min(S, c): a
    Slice of a c-long table, BERT's positions) and no bound was given for that size, lowered again with it (a
    warning names it; a larger size is then an ArgumentError at run time, where the kernels would read past the
    table), each size at most once."""
    bounds = dict(dynamic_bounds or {})
    while True:
        try:
            lowered = lower_model(model, target, input_shapes, fallback, opt_level, disabled_passes, tuning_log,
                                  t0, limits, bounds if symbolic else None, symbolic, example_inputs,
                                  dynamic_shapes)  # fmt: skip
        except ValueError as e:
            hint = _size_bound(e)
            if not symbolic or hint is None or hint.size in bounds:
                raise
            bounds[hint.size] = (1, hint.bound)
            warnings.warn(f"ember.compile: the model needs {hint.size} <= {hint.bound} ({e}); compiled with "
                          f"{hint.size} in [1, {hint.bound}]", stacklevel=4)  # fmt: skip
            continue
        if bounds != dict(dynamic_bounds or {}):
            lowered.summary["inferred_bounds"] = {k: list(v) for k, v in bounds.items()
                                                  if k not in (dynamic_bounds or {})}  # fmt: skip
        return lowered


def _size_bound(e: BaseException) -> SizeBoundError | None:
    """The SizeBoundError behind an error (a frontend's ModelError wraps the shape rule's), or None."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, SizeBoundError):
            return e
        e, seen = e.__cause__ or e.__context__, seen + 1
    return None


def compile_key(model: Any, target: Target, options: dict, tuning_log: str | os.PathLike | None) -> str | None:
    """The whole-model cache key of a compile (`runtime.compile_cache`), or None where the result is not cached: the
    cache is off (EMBER_COMPILE_CACHE=0), the target is not this machine's CPU, the model is not bytes (a torch module,
    a Keras model, a SavedModel directory, an ember Graph) or refers to external data, or the tuning log is
    unreadable (the compile then reports it)."""
    if not compile_cache.cache_enabled() or target.kind not in ("c", "llvm") or not target.runs_here:
        return None
    parts = model_bytes(model)
    if parts is None:
        return None
    if tuning_log is not None:
        try:
            options = options | {"tuning_log": hashlib.sha256(Path(tuning_log).read_bytes()).hexdigest()}
        except OSError:
            return None
    return compile_cache.model_key(parts, target, options)


def model_bytes(model: Any) -> list[bytes] | None:
    """The bytes that define a model given as a file path, bytes or an ONNX ModelProto (with a file's name, which
    names the compiled model), or None for anything else and for ONNX models with external data."""
    if isinstance(model, bytes | bytearray):
        data, name = bytes(model), b""
    elif isinstance(model, str | os.PathLike) and os.path.isfile(model):
        data, name = Path(model).read_bytes(), os.path.basename(model).encode()
    elif type(model).__name__ == "ModelProto" and hasattr(model, "SerializeToString"):
        data, name = model.SerializeToString(), b""
    else:
        return None
    if b"location" in data and uses_external_data(data):
        return None
    return [name, data]


def uses_external_data(data: bytes) -> bool:
    """Whether ONNX model bytes keep tensors in external files (not ONNX, e.g. TFLite: False)."""
    import onnx

    try:
        proto = onnx.load_from_string(data)
    except Exception:  # noqa: BLE001 - not an ONNX model
        return False

    def graph_tensors(g) -> list:
        tensors = list(g.initializer) + [s.values for s in g.sparse_initializer]
        for node in g.node:
            for a in node.attribute:
                tensors += ([a.t] if a.HasField("t") else []) + list(a.tensors)
                for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    tensors += graph_tensors(sub)
        return tensors

    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in graph_tensors(proto.graph))


def _warn_specialized(model: Any, input_shapes: dict | None, target: Target) -> None:
    """Warn that an ONNX model's symbolic input dims (those `input_shapes` leaves open) are specialized."""
    if isinstance(model, Graph) or not (isinstance(model, str | os.PathLike | bytes) or hasattr(model, "graph")):
        return
    from .frontend.onnx import load_model

    try:
        proto, _ = load_model(model)
    except Exception:  # not an ONNX model: its own frontend reports what it is
        return
    dims = sorted({d.dim_param or "?" for vi in proto.graph.input if vi.name not in (input_shapes or {})
                   for d in vi.type.tensor_type.shape.dim if not d.HasField("dim_value")})  # fmt: skip
    if dims:
        warnings.warn(f"ember.compile: the model's symbolic dims ({', '.join(dims)}) are specialized on target "
                      f"{target.kind!r} (symbolic sizes: targets {', '.join(SYMBOLIC_KINDS)} only); a leading one "
                      "becomes 1, pass input_shapes= to choose", stacklevel=3)  # fmt: skip


@dataclass
class LoweredModel:
    """A model after import, graph passes and lowering, before code generation: the kernels in loop IR
    (`gl.kernels`), the run plan (`plan`: values, steps, workspace offsets) and the summary so far."""

    graph: Graph
    target: Target
    gl: GraphLowering
    plan: Plan
    summary: dict
    t0: float  # when compile started (perf_counter)
    t_lower: float  # when lowering ended


def lower_model(model: Any, target: Target, input_shapes: dict | None = None, fallback: bool = True,
                opt_level: int = 3, disabled_passes: Sequence[str] = (), tuning_log: str | os.PathLike | None = None,
                t0: float | None = None, limits: Limits | None = None, dynamic_bounds: dict | None = None,
                symbolic: bool = False, example_inputs: Any = None,
                dynamic_shapes: Any = None) -> LoweredModel:  # fmt: skip
    """The target-independent half of `compile`: import, passes, kernels lowered to loop IR, memory plan.
    `limits` (default: `Limits.resolve()`, the environment's or the default bounds) are checked on the
    imported graph's tensors, the graph's after the passes, and each kernel's loops."""
    t0 = time.perf_counter() if t0 is None else t0
    limits = Limits.resolve() if limits is None else limits
    graph = import_model(model, input_shapes, example_inputs, symbolic=symbolic, dynamic_bounds=dynamic_bounds,
                         dynamic_shapes=dynamic_shapes)  # fmt: skip
    check_tensor_sizes(graph, limits)
    nodes = len(graph.nodes)
    t_import = time.perf_counter()
    graph = graph.copy()
    tuned = load_tuned(tuning_log, str(target)) if tuning_log else {}
    chosen = algorithms(tuned)  # measured implementations (`ember tune --auto`), else the caller's context's
    with algorithm_choices(chosen) if chosen else nullcontext():
        graph, pass_report = run_passes(graph, opt_level=opt_level, disabled=disabled_passes, target=target)
    check_tensor_sizes(graph, limits)
    t_passes = time.perf_counter()
    gl = GraphLowering(graph, target, allow_fallback=fallback, tuned=tuned, limits=limits)
    gl.run()
    plan = gl.plan()
    if not plan.is_symbolic:  # a symbolic plan is planned at each size it runs at (Plan.at)
        assign_offsets(plan)
    t_lower = time.perf_counter()
    summary = {
        "name": plan.name,
        "nodes": nodes,
        "nodes_after_passes": len(graph.nodes),
        "opt_level": opt_level,
        "import_seconds": t_import - t0,
        "passes_seconds": t_passes - t_import,
        "passes": pass_report,
        "lower_seconds": t_lower - t_passes,
        "fallback_reasons": gl.fallback_reasons,
        "tuned_workloads": len(tuned),
        "replayed_workloads": len(gl.replayed),
        "simd": sorted(target.simd_features()),  # (what the code may use: `ember.load` checks the CPU has them)
    }
    return LoweredModel(graph, target, gl, plan, summary, t0, t_lower)


def import_model(model: Any, input_shapes: dict | None = None, example_inputs: Any = None, symbolic: bool = False,
                 dynamic_bounds: dict[str, tuple[int, int | None]] | None = None, dynamic_shapes: Any = None) -> Graph:
    """The frontend for what `model` is: an ember Graph as it is; a torch `nn.Module` (run on `example_inputs`) or
    `ExportedProgram` through `ember.frontend.torch`; a .tflite file (or its bytes); a Keras model or a SavedModel
    directory (through tf2onnx); else ONNX (a path, bytes or a ModelProto; `symbolic` keeps its symbolic dims,
    within `dynamic_bounds`)."""
    if isinstance(model, Graph):
        return model
    torch = sys.modules.get("torch")  # a torch object exists only where torch was imported
    if torch is not None and isinstance(model, torch.nn.Module | torch.export.ExportedProgram):
        from .frontend.torch import from_exported_program, from_torch

        if isinstance(model, torch.nn.Module):
            return from_torch(model, example_inputs, dynamic_shapes, input_shapes, symbolic, dynamic_bounds)
        return from_exported_program(model, input_shapes, symbolic=symbolic, dynamic_bounds=dynamic_bounds)
    from .frontend.tensorflow import from_tensorflow, is_tensorflow
    from .frontend.tflite import from_tflite, is_tflite

    if is_tflite(model):
        return from_tflite(model, input_shapes)
    if is_tensorflow(model):
        return from_tensorflow(model, input_shapes)
    from .frontend.onnx import from_onnx

    return from_onnx(model, input_shapes=input_shapes, symbolic=symbolic, dynamic_bounds=dynamic_bounds)


def build_model(m: LoweredModel) -> Model:
    """The code of a lowered model on its target's backend (`BACKENDS`), and the compile times in its summary."""
    model = BACKENDS[m.target.kind](m.gl.kernel_funcs(), m.plan, m.gl.weights, m.target, reference_fallback,
                                    m.summary)  # fmt: skip
    t_build = time.perf_counter()
    model.update_summary(compile_seconds=t_build - m.t0, build_seconds=t_build - m.t_lower)
    return model


def _build_llvm(*args: Any) -> Model:
    """LLVM backend: the kernels and segment runners in one LLVM module, JIT-compiled (runtime.llvm_model)."""
    from .runtime.llvm_model import build_llvm_model

    return build_llvm_model(*args)


def _build_gpu(*args: Any) -> Model:
    """OpenCL and CUDA backends: device kernels of every kernel, one source, a GPU runtime (runtime.gpu_model)."""
    from .runtime.gpu_model import build_gpu_model

    return build_gpu_model(*args)


# target kind -> its backend: (kernels, plan, weights, target, fallback, summary) -> model
Builder = Callable[..., Model]
BACKENDS: dict[str, Builder] = {"c": build_c_model, "llvm": _build_llvm, "opencl": _build_gpu, "cuda": _build_gpu}


def load(path: str | os.PathLike) -> Model:
    """Load a compiled model saved with `save` (no compiler needed; runtime.load), with the reference fallback."""
    return runtime_load(path, fallback=reference_fallback)
