"""Property tests on GPU targets: random legal GPU schedules of a matmul, a padded 2-D convolution and a softmax
agree with numpy, run through OpenCL (PoCL on the CPU in CI).

The workloads and references are those of the CPU property tests (`tests/te/test_te_random_schedules.py`). A GPU
schedule is drawn per stage, consumers first: an elementwise intermediate is inlined or computed at root; a root
stage's data-parallel loops are bound in one of three shapes (all fused then split over blockIdx.x x threadIdx.x,
a serial per-thread loop inside that, or the leading loops over blockIdx.y/threadIdx.y and the last over
blockIdx.x/threadIdx.x), with thread counts that rarely divide the extents (the guards must hold); reduction loops
are split and maybe unrolled inside the thread; the matmul may accumulate in a local (register) buffer computed
at the thread loop. Examples are derandomized (the same schedules on every run); EMBER_GPU_PROPERTY_EXAMPLES sets
how many.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import opencl_missing
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import ember
from ember import te

OPENCL_MISSING = opencl_missing()
pytestmark = [
    pytest.mark.property,
    pytest.mark.skipif(OPENCL_MISSING is not None, reason=f"no OpenCL platform: {OPENCL_MISSING}"),
]

EXAMPLES = int(os.environ.get("EMBER_GPU_PROPERTY_EXAMPLES", "8"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip


def _workloads():
    path = Path(__file__).resolve().parents[1] / "te" / "test_te_random_schedules.py"
    spec = importlib.util.spec_from_file_location("_gpu_rerun_workloads", path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = mod  # type: ignore[union-attr]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


W = _workloads()


class GPUScheduler:
    """Draws a random legal GPU schedule for every stage of `s`, consumers first."""

    def __init__(self, data: st.DataObject, s: te.Schedule):
        self.data, self.s = data, s

    def draw(self, strategy: st.SearchStrategy, label: str):
        return self.data.draw(strategy, label=label)

    def schedule_all(self) -> None:
        for stage in reversed([x for x in self.s.stages if not x.is_placeholder]):
            if stage.attach == "at":
                continue  # a local accumulator: scheduled with its consumer
            if not stage.is_output and not isinstance(stage.op.body, te.Reduce) and self.draw(
                st.booleans(), f"inline {stage.name}"
            ):
                stage.compute_inline()
                continue
            self.bind(stage)
        note(f"schedule:\n{self.s}")

    def threads(self, label: str, extent: int) -> dict:
        by = self.draw(st.sampled_from(["factor", "nparts"]), f"{label}: split by")
        return {by: self.draw(st.integers(1, max(1, min(extent + 2, 64))), f"{label}: {by}")}

    def bind(self, stage: te.Stage) -> te.IterVar:
        """Bind the stage's data-parallel loops; returns the innermost thread loop."""
        name = stage.name
        axes = list(stage.op.axis)
        extents = [iv.dom[1] for iv in axes]
        shape = self.draw(st.sampled_from(["1d", "1d+serial", "2d"] if len(axes) >= 2 else ["1d", "1d+serial"]),
                          f"{name}: binding")  # fmt: skip
        reduce = list(stage.op.reduce_axis)
        if shape == "2d":
            lead = axes[0]
            for ax in axes[1:-1]:
                lead = stage.fuse(lead, ax)
            n_lead = int(np.prod(extents[:-1]))
            by, ty = stage.split(lead, **self.threads(f"{name} y", n_lead))
            bx, tx = stage.split(axes[-1], **self.threads(f"{name} x", extents[-1]))
            stage.reorder(by, bx, ty, tx, *reduce)
            for iv, tag in ((by, "blockIdx.y"), (bx, "blockIdx.x"), (ty, "threadIdx.y"), (tx, "threadIdx.x")):
                stage.bind(iv, tag)
            inner = tx
        else:
            fused = axes[0]
            for ax in axes[1:]:
                fused = stage.fuse(fused, ax)
            n = int(np.prod(extents))
            serial = None
            if shape == "1d+serial":
                per = self.draw(st.integers(1, 5), f"{name}: per thread")
                fused, serial = stage.split(fused, factor=per)
                n = -(-n // per)
            bx, tx = stage.split(fused, **self.threads(name, n))
            stage.bind(bx, "blockIdx.x")
            stage.bind(tx, "threadIdx.x")
            inner = tx
            if serial is not None and self.draw(st.booleans(), f"{name}: unroll per-thread loop"):
                stage.unroll(serial)
        for r in reduce:
            if self.draw(st.booleans(), f"{name}: split {r.name}"):
                factor = self.draw(st.integers(1, r.dom[1] + 1), f"{name}: {r.name} factor")
                _, ri = stage.split(r, factor=factor)
                if self.draw(st.booleans(), f"{name}: unroll {r.name}") and factor <= 8:
                    stage.unroll(ri)
        return inner


def run_opencl(s, args, ref, seed: int, atol: float = 1e-5) -> None:
    f = ember.build(s, args, target="opencl")
    rng = np.random.default_rng(seed)
    ins = [rng.uniform(-2, 2, [int(x) for x in a.shape]).astype(a.dtype.name) for a in args[:-1]]
    out = np.full([int(x) for x in args[-1].shape], np.nan, np.float32)
    f(*ins, out)
    np.testing.assert_allclose(out, ref(*ins), rtol=1e-4, atol=atol)


SIZES = st.integers(5, 20)


@PROPERTY
@given(st.data())
def test_random_gpu_schedule_of_matmul(data):
    sizes = [data.draw(SIZES, label=d) for d in "MNK"]
    A, B, C = W.matmul(*sizes)
    s = te.create_schedule(C)
    local = data.draw(st.booleans(), label="local accumulator")
    CL = s.cache_write(C, "local") if local else None
    g = GPUScheduler(data, s)
    if CL is not None:
        inner = g.bind(s[C])
        s[CL].compute_at(s[C], inner)
        (k,) = s[CL].op.reduce_axis
        if data.draw(st.booleans(), label="split k"):
            s[CL].split(k, factor=data.draw(st.integers(1, sizes[2] + 1), label="k factor"))
        note(f"schedule:\n{s}")
    else:
        g.schedule_all()
    run_opencl(s, [A, B, C], lambda a, b: a @ b, data.draw(st.integers(0, 2**31), label="seed"), atol=1e-4)


@PROPERTY
@given(st.data())
def test_random_gpu_schedule_of_conv2d_with_padding(data):
    ci, co = data.draw(st.integers(1, 3), label="ci"), data.draw(st.integers(1, 4), label="co")
    h, w = data.draw(st.integers(5, 11), label="h"), data.draw(st.integers(5, 11), label="w")
    kh, kw = data.draw(st.integers(1, 3), label="kh"), data.draw(st.integers(1, 3), label="kw")
    pad, stride = data.draw(st.integers(0, 2), label="pad"), data.draw(st.integers(1, 2), label="stride")
    X, Wt, Y = W.conv2d(ci, co, h, w, kh, kw, pad, stride)
    s = te.create_schedule(Y)
    GPUScheduler(data, s).schedule_all()
    # sums of at most 27 products of values in [-2, 2]: float32 rounding stays well below 1e-4
    run_opencl(s, [X, Wt, Y], lambda x, wt: W.conv2d_ref(x, wt, pad, stride), data.draw(st.integers(0, 2**31),
               label="seed"), atol=1e-4)  # fmt: skip


@PROPERTY
@given(st.data())
def test_random_gpu_schedule_of_softmax(data):
    m, n = data.draw(SIZES, label="rows"), data.draw(SIZES, label="cols")
    X, O = W.softmax(m, n)
    s = te.create_schedule(O)
    GPUScheduler(data, s).schedule_all()
    run_opencl(s, [X, O], W.softmax_ref, data.draw(st.integers(0, 2**31), label="seed"))
