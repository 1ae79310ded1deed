"""The run plan (`ember.runtime.plan`) and the runtime's place in the layers.

One offset planner serves every backend: the CPU plan at 64 bytes, a GPU's re-plan at its sub-buffer alignment.
The runtime runs a plan without the compiler: it imports neither `ember.compiler`, `ember.kernels` nor the graph
and op registry, and codegen (below it) imports nothing of the runtime."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ember
from ember import zoo
from ember.compiler import lower_model
from ember.runtime.plan import ALIGN, Plan, assign_offsets, plan_offsets
from ember.target import Target

EMBER = Path(ember.__file__).parent


@pytest.fixture(scope="module")
def plan() -> Plan:
    return lower_model(zoo.transformer_encoder_layer(seq=8, d=16, heads=2, ff=32, batch=1), Target.parse("c")).plan


def test_compiled_plan_is_the_planner_at_64_bytes(plan):
    offsets, total = plan_offsets(plan, ALIGN)
    assert plan.workspace == total and all(plan.values[i].offset == off for i, off in offsets.items())
    assert all(off % ALIGN == 0 for off in offsets.values())
    for step in plan.steps:
        for k in step.kernels:
            temps = [i for i in set(k.args) if plan.values[i].kind == "temp"]
            spans = sorted((offsets[i], offsets[i] + plan.values[i].nbytes) for i in temps)
            assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), k.name


def test_plan_round_trips_through_json(plan):
    again = Plan.from_json(plan.to_json())
    assert again == plan
    assign_offsets(again, 256)
    assert again.workspace >= plan.workspace and all(v.offset % 256 == 0 for v in again.values if v.kind == "temp")


def imported_modules(path: Path) -> set[str]:
    """The ember modules a file imports (relative imports resolved), anywhere in the file."""
    package = ".".join(path.relative_to(EMBER.parent).with_suffix("").parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            out.add(".".join(base + ([node.module] if node.module else [])))
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m.startswith("ember")}


@pytest.mark.parametrize(("layer", "forbidden"), [
    ("runtime", ("ember.compiler", "ember.kernels", "ember.ops", "ember.graph", "ember.passes", "ember.frontend")),
    ("codegen", ("ember.runtime", "ember.compiler", "ember.kernels")),
])  # fmt: skip
def test_layers_import_downward(layer, forbidden):
    files = sorted((EMBER / layer).glob("*.py"))
    bad = [f"{p.name}: {m}" for p in files for m in sorted(imported_modules(p)) if m.startswith(forbidden)]
    assert not bad
    assert not [m for m in imported_modules(EMBER / "runtime" / "plan.py") if m.startswith("ember.runtime")]
