"""The run plan (`ember.runtime.plan`) and the runtime's place in the layers.

One offset planner serves every backend: the CPU plan at 64 bytes, a GPU's re-plan at its sub-buffer alignment.
The plan is data that imports nothing else of the runtime."""

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


def test_the_plan_imports_nothing_else_of_the_runtime():
    """runtime.plan is the data every backend (and the coming remote and standalone runtimes) shares: it stands
    on its own (tests/test_layering.py checks the layers themselves)."""
    tree = ast.parse((EMBER / "runtime" / "plan.py").read_text())
    relative = [f".{n.module}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1]
    absolute = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level]
    absolute += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not relative and not [m for m in absolute if m and m.startswith("ember.runtime")], relative + absolute
