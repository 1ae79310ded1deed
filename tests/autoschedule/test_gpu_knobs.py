"""The GPU templates' knobs and the GPU rfactor sketch: any config computes the numpy reference on OpenCL (PoCL
here), the default config is today's schedule, knobs change the schedule, and CUDA compiles where nvcc is.

Small shapes (each example builds one kernel); Hypothesis draws the config's index in its space.
"""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import ember
from ember.autoschedule import sketch as S
from ember.autoschedule.task import AutoTask
from ember.target import Target
from ember.templates.gpu import schedule_gpu
from ember.tune import Task

pytestmark = pytest.mark.property

EXAMPLES = int(os.environ.get("EMBER_PROPERTY_EXAMPLES", "4"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None,
                    derandomize=os.environ.get("EMBER_PROPERTY_RANDOM", "") in ("", "0"),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
CONV = {"pads": [1, 1, 1, 1], "strides": [1, 1], "dilations": [1, 1], "group": 1}
KERNELS = {  # op, inputs, attrs, the template its GPU space belongs to
    "matmul": ("MatMul", [(19, 24), (24, 21)], {}, "gpu_gemm"),
    "batch_matmul": ("MatMul", [(2, 9, 40), (2, 40, 7)], {}, "gpu_gemm"),
    "conv": ("Conv", [(1, 8, 6, 6), (16, 8, 3, 3)], CONV, "gpu_conv"),
    "depthwise": ("Conv", [(1, 8, 9, 9), (8, 1, 3, 3)], {**CONV, "group": 8}, "gpu_conv"),
    "softmax": ("Softmax", [(3, 70)], {"axis": -1}, "gpu_rows"),
}


def opencl_or_skip() -> None:
    from tests.conftest import opencl_missing

    why = opencl_missing()
    if why:
        pytest.skip(f"OpenCL: {why}")


def run_against_reference(task: Task, sch, args, seed: int) -> None:
    xs = task.random_inputs(seed)
    ref = task.reference(xs)
    outs = args[len(args) - task.n_outputs :]
    ys = [np.zeros(o.shape, o.dtype.name) for o in outs]
    ember.build(sch, args, target="opencl")(*xs, *ys)
    for y, r in zip(ys, ref):
        np.testing.assert_allclose(y, r, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@PROPERTY
@given(data=st.data())
def test_any_gpu_config_computes_the_reference_on_opencl(kernel, data):
    opencl_or_skip()
    op, ins, attrs, template = KERNELS[kernel]
    task = Task.from_op(op, ins, attrs, target="opencl")
    space = task.space
    assert space.template == template and len(space) > 1, space
    cfg = space.get(data.draw(st.integers(0, len(space) - 1), label="index"))
    note(str(cfg))
    sch, args = task.instantiate(cfg)
    run_against_reference(task, sch, args, seed=data.draw(st.integers(0, 2**16), label="seed"))


def test_default_config_is_the_untuned_schedule_and_knobs_change_it():
    task = Task.from_op(*KERNELS["matmul"][:3], target="opencl")
    space = task.space
    outs = task.instantiate(None)[1][-1:]
    untuned = schedule_gpu(outs, Target.parse("opencl"))
    default = task.instantiate(space.fallback())[0]
    assert [s.to_json() for s in default.steps] == [s.to_json() for s in untuned.steps]

    def lowered(**values) -> str:
        return str(ember.lower(*task.instantiate(space.entity({**space.fallback().values, **values})), gpu=True))

    text = lowered(gpu_tk=8, gpu_unroll_k=True)
    assert "k.outer" in text and "k.inner" not in text, text  # the reduction's steps unrolled
    lowered = {lowered(gpu_tile_m=tm) for tm in [(-1, 4, 1), (-1, 16, 1)]}
    assert len(lowered) == 2  # the block tile is the knob's


def test_template_tuner_searches_the_gpu_knobs_on_opencl(tmp_path):
    """`ember tune --target opencl`: the records hold the GPU knobs, and no candidate fails."""
    opencl_or_skip()
    from ember.tune import Measurer, tune_task

    task = Task.from_op(*KERNELS["matmul"][:3], target="opencl")
    with Measurer(n_parallel=1, repeat=1, min_time=0.0, warmup=0.0) as m:
        res = tune_task(task, "random", 4, m, batch_size=2, seed=1)
    assert res.n_errors == 0
    assert all(k.startswith("gpu_") for k in task.space.fallback().values)


@PROPERTY
@given(seed=st.integers(0, 2**16))
def test_gpu_rfactor_sketch_computes_the_reference_on_opencl(seed):
    """A long row reduction split into partial sums by as many threads (gpu.rfactor), any annotation."""
    opencl_or_skip()
    task = AutoTask.from_op("ReduceMean", [(3, 2000)], {"axes": [1], "keepdims": 0}, target="opencl")
    assert "gpu.rfactor" in [s.name for s in task.sketches()]
    outs, args = task.computes()
    sch, dec = S.sample(task.sketch("gpu.rfactor"), outs, args, Target.parse("opencl"), random.Random(seed))
    note(str(dec))
    run_against_reference(task, sch, args, seed)


@pytest.mark.parametrize("kernel", ["matmul", "conv", "softmax"])
def test_gpu_configs_compile_with_nvcc(kernel):
    from tests.conftest import nvcc_missing

    why = nvcc_missing()
    if why:
        pytest.skip(f"CUDA: {why}")
    from ember.codegen.cuda import codegen_cuda, compile_cuda
    from ember.codegen.gpu import split_host_device

    task = Task.from_op(*KERNELS[kernel][:3], target="cuda")
    space = task.space
    for index in random.Random(0).sample(range(len(space)), min(3, len(space))):
        sch, args = task.instantiate(space.get(index))
        src = codegen_cuda(split_host_device(ember.lower(sch, args, gpu=True)), "cuda -arch=sm_90")
        assert ".entry" in compile_cuda(src, "cuda -arch=sm_90").read_text()
