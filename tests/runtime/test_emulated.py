"""Models built for other machines run on emulated boards: ResNet-18, MobileNetV2 and a BERT-like encoder (small
variants of the zoo's builders) compiled for aarch64, riscv64 and armhf, exported with `ember_run`, run under
qemu-user, and compared with this machine's build of the same model (bench/edge.py does the full sizes).

Tolerance 1e-5 relative to the output's scale: the same C, but other vector widths change the order of the sums,
and the exp of softmax and GELU is libmvec's here and libm's or the arithmetic one there (float32 rounding)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import ember
from ember import zoo
from ember.runtime.standalone import emulator, run_exported
from ember.target import ARCHS

MODELS = {
    "resnet18": lambda: zoo.resnet18(image=32, classes=10, width=8),
    "mobilenet_v2": lambda: zoo.mobilenet_v2(image=32, classes=10, width=0.25),
    "bert": lambda: zoo.bert_encoder(layers=1, seq=16, d=64, heads=2, ff=128),
}
TRIPLES = ["aarch64-linux-gnu", "riscv64-linux-gnu", "arm-linux-gnueabihf"]


def missing(triple: str) -> str | None:
    arch = next(a for a in ARCHS.values() if a.triple == triple)
    if shutil.which(f"{triple}-gcc") is None:
        return f"no cross compiler (apt-get install {arch.package})"
    if shutil.which(arch.qemu) is None:
        return f"no {arch.qemu} (apt-get install qemu-user)"
    return None


@pytest.fixture(scope="module")
def host():
    """Each model, its inputs and this machine's outputs."""
    out = {}
    for name, build in MODELS.items():
        model = build()
        feeds = zoo.random_feeds(model, seed=1)
        out[name] = (model, feeds, ember.compile(model, "c").run(feeds))
    return out


@pytest.mark.parametrize("triple", TRIPLES)
@pytest.mark.parametrize("name", list(MODELS))
def test_model_runs_on_an_emulated_board(host, tmp_path, triple, name):
    why = missing(triple)
    if why:
        pytest.skip(why)
    model, feeds, expected = host[name]
    m = ember.compile(model, f"c -mtriple={triple}")
    outputs, timings = run_exported(m.export(tmp_path / "board"), feeds, launcher=emulator(m.plan.target))
    assert timings["repeat"] == 1 and timings["median"] > 0
    assert set(outputs) == set(expected)
    for k, want in expected.items():
        got = outputs[k]
        assert got.shape == want.shape and got.dtype == want.dtype
        scale = float(np.max(np.abs(want))) or 1.0
        assert float(np.max(np.abs(got - want))) <= 1e-5 * scale, (k, float(np.max(np.abs(got - want))) / scale)


def test_the_emulator_of_each_target():
    assert emulator("c") is None
    if shutil.which("qemu-aarch64"):
        assert emulator("c -mtriple=aarch64-linux-gnu") == ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"]
