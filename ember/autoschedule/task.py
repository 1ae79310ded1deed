"""Auto-scheduling tasks: any kernel of a model (templated or not), its candidates as (sketch, decisions).

An `AutoTask` is a `ember.tune.Task` whose configs are `{"sketch": name, "@<decision>": value, ...}` (template
"auto"); the empty config is the kernel's default schedule (the template or default schedule the compiler
uses today), so the measurer, the log and the cost model treat both alike. Its workload is the anchor's
workload key where the kernel has an anchor (so that `load_tuned` picks the best of template and auto
records for it: templates where they win), else `group_key(node)` ("auto:" + the members, their shapes and
attributes), which `ember.kernels` looks up too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ember.graph.ir import Node
from ember.kernels import VIEW_OPS, LoweringUnsupported, anchor_member, group_key, kernel_te, workload_key
from ember.ops import get_op
from ember.target import Target
from ember.te.config import ConfigEntity
from ember.tune.task import Task, op_node, passed_graph, portable_node

from . import sketch as S

AUTO = "auto"
DECISION = "@"  # prefix of the knobs that hold a candidate's decisions


@dataclass
class AutoSpace:
    """The config space of an AutoTask: any (sketch, decisions) pair; `fallback()` is the default schedule."""

    sketches: tuple[str, ...] = ()
    template: str = AUTO
    knobs: tuple = ()

    def entity(self, values: dict) -> ConfigEntity:
        return ConfigEntity(-1, dict(values), AUTO, strict=False)

    def fallback(self) -> ConfigEntity:
        return self.entity({})

    def __len__(self) -> int:
        return 0


class AutoTask(Task):
    """A kernel tuned by sketches (see the module doc)."""

    def instantiate(self, cfg: Any) -> tuple[Any, list]:
        target = Target.parse(self.target)
        k = kernel_te(self.node, target)
        values = getattr(cfg, "values", None) or {}
        if not values.get("sketch"):
            return k.schedule, k.args
        sk = self.sketch(values["sketch"])
        sch, _ = S.apply(sk, k.outputs, target, decisions_of(values))
        return sch, k.args

    def sketch(self, name: str) -> S.Sketch:
        for sk in self.sketches():
            if sk.name == name:
                return sk
        names = [s.name for s in self.sketches()]
        raise S.SketchError(f"task {self.name}: no sketch named {name!r}; its sketches: {names}")

    def sketches(self) -> list[S.Sketch]:
        cached = self.__dict__.get("_sketches")
        if cached is None:
            k = kernel_te(self.node, Target.parse(self.target))
            cached = self.__dict__["_sketches"] = S.sketches(k.outputs, Target.parse(self.target))
        return list(cached)

    def computes(self) -> tuple[list, list]:
        """(outputs, arguments) of the kernel's compute, fresh."""
        k = kernel_te(self.node, Target.parse(self.target))
        return k.outputs, k.args

    @property
    def space(self) -> AutoSpace:  # type: ignore[override]
        if self._space is None:
            self._space = AutoSpace(tuple(s.name for s in self.sketches()))  # type: ignore[assignment]
            self.template = AUTO
        return self._space  # type: ignore[return-value]

    def config(self, sketch: str, decisions: dict) -> ConfigEntity:
        """The config of a candidate: its sketch, and each decision as a knob "@name" (flat JSON scalars, as the
        log's records want)."""
        return self.space.entity({"sketch": sketch, **{DECISION + k: v for k, v in decisions.items()}})

    @staticmethod
    def from_node(node: Node, target: str | Target, weight: int = 1) -> AutoTask:  # type: ignore[override]
        anchor = anchor_member(node)
        key = workload_key(anchor) if anchor is not None else group_key(node)
        members = node.attrs["body"].nodes if node.op == "Fused" else [node]
        ins = ", ".join(f"{v.dtype}{list(v.shape)}" for v in node.inputs if v is not None)
        label = "+".join(m.op for m in members)
        return AutoTask(f"{label}({ins})", key, str(Target.parse(target)), node=portable_node(node), weight=weight,
                        template=AUTO, n_outputs=len(node.outputs))  # fmt: skip

    @staticmethod
    def from_op(op: str, inputs, attrs: dict | None = None, target: str | Target = "c",  # type: ignore[override]
                outputs: int | None = None) -> AutoTask:  # fmt: skip
        return AutoTask.from_node(op_node(op, inputs, attrs, outputs), target)


def extract_auto_tasks(model: Any, target: str | Target = "c", input_shapes: dict | None = None,
                       opt_level: int = 3, algorithms: dict | None = None) -> list[AutoTask]:  # fmt: skip
    """One AutoTask per distinct kernel of a model (every kernel, templated or not), with its weight (kernels
    that share it); largest arithmetic first. `algorithms`: measured convolution implementations."""
    target = Target.parse(target)
    graph = passed_graph(model, target, input_shapes, opt_level, algorithms=algorithms)
    tasks: dict[str, AutoTask] = {}
    for node in graph.nodes:
        if node.op in VIEW_OPS or (node.op != "Fused" and get_op(node.op).compute is None):
            continue
        task = AutoTask.from_node(node, target)
        if task.workload in tasks:
            tasks[task.workload].weight += 1
            continue
        try:
            if not task.sketches():
                continue
        except (LoweringUnsupported, NotImplementedError, TypeError, ValueError):
            continue
        tasks[task.workload] = task
    return sorted(tasks.values(), key=lambda t: -t.flops * t.weight)


def decisions_of(values: dict) -> dict:
    """The decisions held in an auto config's knobs."""
    return {k[len(DECISION) :]: v for k, v in values.items() if k.startswith(DECISION)}
