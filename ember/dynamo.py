"""`torch.compile(model, backend="ember")`: Ember as a TorchDynamo backend.

Dynamo hands the backend one FX graph per captured region (a graph break makes several) with example inputs:
the user's tensors and, as further inputs, the module's parameters and buffers. `ember_backend` returns a
callable that runs the region as an Ember model:

- weights (the inputs that dynamo took from an nn.Module: parameters and buffers) are frozen into the model as
  constants when the region is compiled, as inductor's `freezing` does, so that batch-norm folding and weight
  packing apply; a module whose weights change after compiling must be compiled again (`torch._dynamo.reset()`);
- the other inputs are passed without copies: a contiguous CPU tensor is handed to the model as a numpy view of
  its memory, and each output comes back as a tensor over the model's result array (`torch.from_numpy`);
- Ember compiles static shapes, so the callable keeps one Ember model per input signature (shapes, dtypes and the
  values of integer inputs). Dynamo recompiles on a new shape, and may then hand over a graph with symbolic
  sizes: each concrete signature it is called with compiles (once) to its own model.

Registered under the name "ember" through the `torch_dynamo_backends` entry point (pyproject.toml), so
`torch.compile(m, backend="ember")` works wherever ember is installed; `options={"target": "c -threads=2"}` and
the other keywords of `ember.compile` pass through `torch.compile(..., options=...)`. Inference only: outputs
carry no autograd history.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils import _pytree as pytree

from .compiler import compile as ember_compile
from .frontend.torch import from_exported_program
from .runtime.model import Model

__all__ = ["CompiledRegion", "ember_backend", "numpy_view"]


def ember_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **options: Any) -> Callable:
    """The TorchDynamo backend: a callable running `gm` through Ember models (see the module doc)."""
    options = dict(options.get("options") or {}, **{k: v for k, v in options.items() if k != "options"})
    return CompiledRegion(gm, list(example_inputs), options)


def _is_weight(node: torch.fx.Node, value: Any) -> bool:
    """Whether dynamo took this graph input from an nn.Module (a parameter or a buffer)."""
    if isinstance(value, torch.nn.Parameter):
        return True
    grapharg = node.meta.get("grapharg")
    source = getattr(grapharg, "source", None)
    if source is None:
        return False
    guard = source.guard_source
    return bool(getattr(guard, "is_unspecialized_nn_module", lambda: False)()
                or getattr(guard, "is_specialized_nn_module", lambda: False)())  # fmt: skip


class CompiledRegion:
    """One FX graph from dynamo, and an Ember model per concrete input signature."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: list[Any], options: dict[str, Any]):
        self.gm, self.options = gm, options
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.weights = {i: x for i, (n, x) in enumerate(zip(placeholders, example_inputs))
                        if isinstance(x, torch.Tensor) and _is_weight(n, x)}  # fmt: skip
        self.models: dict[tuple, tuple[Model, Any]] = {}
        self.lock = threading.Lock()
        if all(not isinstance(x, torch.SymInt) for x in example_inputs) and not any(
                isinstance(x, torch.Tensor) and x.device.type != "cpu" for x in example_inputs):  # fmt: skip
            self.model_for(example_inputs)  # compile now: errors surface at torch.compile's first call

    @staticmethod
    def signature(args: Sequence[Any]) -> tuple:
        return tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)

    def model_for(self, args: Sequence[Any]) -> tuple[Model, Any]:
        key = self.signature([a for i, a in enumerate(args) if i not in self.weights])
        with self.lock:
            if key not in self.models:
                self.models[key] = self.build(args)
            return self.models[key]

    def build(self, args: Sequence[Any]) -> tuple[Model, Any]:
        args = [int(a) if isinstance(a, torch.SymInt) else a for a in args]
        with torch.no_grad():
            ep = torch.export.export(self.gm, tuple(args), strict=False)
        graph = from_exported_program(ep, name="dynamo_region", frozen_inputs=self.weights)
        return ember_compile(graph, **self.options), ep.call_spec.out_spec

    def __call__(self, *args: Any) -> Any:
        model, out_spec = self.model_for(args)
        feeds = [numpy_view(a) for i, a in enumerate(args) if i not in self.weights and isinstance(a, torch.Tensor)]
        outs = model(*feeds)
        outs = outs if isinstance(outs, tuple) else (outs,)
        return pytree.tree_unflatten([torch.from_numpy(o) for o in outs], out_spec)


def numpy_view(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor's memory (no copy); other devices are an error naming the fix."""
    if t.device.type != "cpu":
        raise ValueError(f"ember backend: input on {t.device}; Ember's torch.compile backend runs CPU tensors")
    return t.detach().numpy()
