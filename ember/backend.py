"""Ember as an ONNX backend (`onnx.backend.base.Backend`), so onnx's node test suite runs on it.

    rep = EmberBackend.prepare(model, "CPU")
    outputs = rep.run([x, y])          # positional, in the order of the model's inputs

Ember compiles static shapes, so a representation imports the model when it first runs,
with the shapes of the arrays it is given. Operands that must be static but that the
model feeds from graph inputs (a Reshape target, TopK's k, the input of NonZero, ...)
are specialized: the frontend names those inputs (`DynamicShapeError.inputs`), the
representation binds them to the values given and imports again; the specialization is
cached by those values.

The engine that runs the imported graph is chosen in one place, `ENGINES`: "compiled"
(native kernels from ember.compile, numpy reference for ops without one; the default),
"native" (native kernels only: an op without one fails) and "reference" (the numpy evaluator).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, namedtupledict

from ember.frontend.onnx import DynamicShapeError, from_onnx, load_model
from ember.graph.ir import Graph

# engine name -> function building a runner from a graph; a runner maps input dict -> output dict
Runner = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


def _reference_engine(graph: Graph) -> Runner:
    from ember.ops.evaluate import evaluate

    return lambda inputs: evaluate(graph, inputs)


def _compiled_engine(graph: Graph, fallback: bool = True) -> Runner:
    """Native kernels through ember.compile; with fallback, ops that have none run by reference."""
    from ember.compiler import compile as ember_compile

    model = ember_compile(graph, target="c", fallback=fallback)
    return model.run


ENGINES: dict[str, Callable[[Graph], Runner]] = {
    "compiled": _compiled_engine,  # native kernels, reference fallback for ops without one
    "native": lambda g: _compiled_engine(g, fallback=False),  # every op must have a native kernel
    "reference": _reference_engine,  # the numpy evaluator
}
DEFAULT_ENGINE = "compiled"
MAX_SPECIALIZATIONS = 8  # import attempts per run before giving up on binding inputs


class EmberRep(BackendRep):
    """A prepared model: imports (and specializes) lazily, then runs with the chosen engine."""

    def __init__(self, model: onnx.ModelProto, engine: str = DEFAULT_ENGINE, specialize: bool = True):
        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
        self.model = model
        self.engine = engine
        init_names = {t.name for t in model.graph.initializer}
        self.input_names = [vi.name for vi in model.graph.input if vi.name not in init_names]
        self.output_names = [vo.name for vo in model.graph.output]
        self.bound: set[str] = set()  # inputs the model needs as constants (learned on first run)
        self.cache: dict[Any, tuple[Graph, Runner]] = {}
        self.specialize = specialize  # False: a DynamicShapeError propagates instead
        self.specialized = False

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        feeds = self._feeds(inputs)
        graph, runner = self._prepare_for(feeds)
        live = {v.name: feeds[v.name] for v in graph.inputs}
        outs = runner(live)
        return namedtupledict("Outputs", self.output_names)(*[outs[n] for n in self.output_names])

    def _feeds(self, inputs: Any) -> dict[str, np.ndarray]:
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        if not isinstance(inputs, Mapping):
            if len(inputs) > len(self.input_names):
                raise ValueError(f"model takes {len(self.input_names)} inputs, got {len(inputs)}")
            inputs = dict(zip(self.input_names, inputs))
        for name, x in inputs.items():
            if isinstance(x, list | tuple | dict) or x is None:
                raise TypeError(f"input {name!r} is a {type(x).__name__}, not a tensor; Ember takes tensors only")
        return {k: np.asarray(v) for k, v in inputs.items()}

    def _prepare_for(self, feeds: dict[str, np.ndarray]) -> tuple[Graph, Runner]:
        for _ in range(MAX_SPECIALIZATIONS):
            key = self._key(feeds)
            if key in self.cache:
                return self.cache[key]
            shapes = {n: x.shape for n, x in feeds.items() if n not in self.bound}
            values = {n: feeds[n] for n in self.bound if n in feeds}
            try:
                graph = from_onnx(self.model, shapes, input_values=values)
            except DynamicShapeError as e:
                new = set(e.inputs) - self.bound
                if not self.specialize or not new or not new <= set(feeds):
                    raise
                self.bound |= new
                self.specialized = True
                continue
            self.cache[key] = (graph, ENGINES[self.engine](graph))
            return self.cache[key]
        raise RuntimeError("could not specialize the model on its inputs")

    def _key(self, feeds: dict[str, np.ndarray]) -> tuple:
        shapes = tuple((n, x.shape, x.dtype.str) for n, x in sorted(feeds.items()))
        values = tuple((n, feeds[n].tobytes()) for n in sorted(self.bound) if n in feeds)
        return shapes, values


class EmberBackend(Backend):
    """ONNX backend interface over Ember; CPU only."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", engine: str = DEFAULT_ENGINE, specialize: bool = True,
                **kwargs: Any) -> EmberRep:  # fmt: skip
        """A representation of the model; `specialize=False` refuses to bind inputs as constants."""
        if not cls.supports_device(device):
            raise ValueError(f"Ember's ONNX backend runs on CPU, not {device!r}")
        proto, _ = load_model(model)
        return EmberRep(proto, engine, specialize)

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return str(device).upper().split(":")[0] == "CPU"


prepare = EmberBackend.prepare
run_model = EmberBackend.run_model
supports_device = EmberBackend.supports_device

__all__ = ["DEFAULT_ENGINE", "ENGINES", "EmberBackend", "EmberRep", "prepare", "run_model", "supports_device"]
