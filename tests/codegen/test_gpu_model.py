"""Whole models on the GPU targets: `ember.compile(model, target="opencl" | "cuda")`.

OpenCL runs for real on whatever platform is installed (PoCL on the CPU in CI): the models' outputs are compared
with onnxruntime. CUDA kernels are generated and compiled by nvcc for every model (running them needs a GPU,
which CI does not have: those tests skip with the reason).

Tolerance: rtol 1e-4 like the CPU model tests; atol 1e-5 times the output's largest magnitude covers outputs near
zero (ReLU, softmax), whose relative error means nothing. The GPU kernels sum in a different order than
onnxruntime (a row's partial sums per thread, then across threads), which stays well inside it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import nvcc_missing, opencl_missing
from onnx import TensorProto, helper, numpy_helper

import ember
from ember import te, zoo
from ember.codegen.gpu import split_host_device
from ember.compiler import lower_model
from ember.runtime.module import ArgumentError
from ember.target import Target
from ember.templates.gpu import schedule_gpu
from ember.tir.functor import walk
from ember.tir.stmt import Store

ort = pytest.importorskip("onnxruntime")
RTOL = 1e-4


OPENCL_MISSING = opencl_missing()
needs_opencl = pytest.mark.skipif(OPENCL_MISSING is not None, reason=f"no OpenCL platform: {OPENCL_MISSING}")


NVCC_MISSING = nvcc_missing()
needs_nvcc = pytest.mark.skipif(NVCC_MISSING is not None, reason=NVCC_MISSING or "")

MODELS = {
    "conv_bn_relu": lambda: zoo.conv_bn_relu_stack(layers=2, channels=8, size=8),
    "mlp": lambda: zoo.mlp(batch=4, features=48, hidden=(64, 32), classes=10),
    "transformer": lambda: zoo.transformer_encoder_layer(batch=1, seq=8, d=32, heads=2, ff=64),
    "mobilenet_block": lambda: zoo.mobilenet_v2_inverted_residual(channels=8, expand=2, size=8),
}


def run_ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def assert_close(got: np.ndarray, want: np.ndarray, name: str = "") -> None:
    atol = 1e-5 * max(1.0, float(np.abs(want).max()) if want.size else 0.0)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=atol, err_msg=name)


# -- every kernel is bound to threads (no device code; fast) ------------------------------------------------
@pytest.mark.parametrize("name", list(MODELS))
def test_every_kernel_runs_on_bound_threads(name):
    """Each device kernel of each model kernel is launched over blockIdx x threadIdx (none runs a whole loop nest
    on one thread), and the templates' marks are there: GEMMs tile through shared memory, rows use barriers."""
    lowered = lower_model(MODELS[name](), Target.parse("opencl"))
    assert lowered.gl.fallback_reasons == {}
    shared = []
    for k in lowered.gl.kernels.values():
        prog = split_host_device(k.func)  # refuses a statement with no loop bound to a thread axis
        for dk in prog.kernels:
            big = any(n.buffer.size > 1 for n in walk(dk.body) if isinstance(n, Store) and n.buffer.scope == "global")
            assert dk.threads * dk.grid[0] > 1 or not big, f"{dk.name} runs on one thread"
            if "gpu.barrier" in str(dk.body):
                shared.append(k.name)
    if name in ("mlp", "transformer"):
        assert any(n.startswith(("matmul", "gemm")) for n in shared), shared
    if name == "transformer":
        assert any(n.startswith("layernormalization") for n in shared), shared


def test_device_workspace_offsets_are_aligned_and_disjoint_within_each_kernel_call():
    """OpenCL sub-buffers need offsets aligned to the device's base address alignment (often 128 bytes or more):
    the GPU runtime re-plans the workspace at that alignment, still reusing memory by liveness."""
    from ember.runtime.plan import plan_offsets

    plan = lower_model(MODELS["transformer"](), Target.parse("opencl")).plan
    offsets, total = plan_offsets(plan, 1024)
    temps = {i for i, v in enumerate(plan.values) if v.kind == "temp"}
    assert set(offsets) == temps and all(o % 1024 == 0 for o in offsets.values())
    assert total < sum(-(-max(plan.values[i].nbytes, 1) // 1024) * 1024 for i in temps)  # memory is reused
    for step in plan.steps:
        for k in step.kernels:
            spans = sorted((offsets[i], offsets[i] + plan.values[i].nbytes) for i in set(k.args) & temps)
            assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), k.name


def _layer_norm(rows: int = 8, length: int = 64):
    from ember.ops import get_op

    x, scale, bias = te.placeholder((rows, length), name="x"), te.placeholder((length,), name="s"), None
    (y, *_) = get_op("LayerNormalization").compute({"axis": -1, "epsilon": 1e-5, "stash_type": 1}, x, scale, bias)
    return [x, scale, y]


def test_gpu_schedules_are_replayable_data():
    """A GPU template's schedule (here a row per block, partial sums in shared memory) is steps like any other:
    it replays from JSON on a fresh compute to the same loop IR."""
    args = _layer_norm()
    s = schedule_gpu(args[-1:], Target.parse("opencl"))
    assert "set_scope" in s.to_json() and "threadIdx.x" in s.to_json()
    fresh = _layer_norm()
    replayed = te.Schedule.load(fresh[-1:], s.to_json())
    assert str(ember.lower(replayed, fresh, gpu=True)) == str(ember.lower(s, args, gpu=True))
    with pytest.raises(te.ScheduleError, match="unknown scope 'texture'"):
        s[args[-1]].set_scope("texture")


# -- OpenCL: run and compare -----------------------------------------------------------------------------
@pytest.fixture(scope="module", params=list(MODELS))
def opencl_model(request):
    if OPENCL_MISSING is not None:
        pytest.skip(f"no OpenCL platform: {OPENCL_MISSING}")
    model = MODELS[request.param]()
    return model, ember.compile(model, target="opencl", fallback=False)


def test_opencl_matches_onnxruntime(opencl_model):
    model, m = opencl_model
    for seed in range(2):
        feeds = zoo.random_feeds(model, seed)
        for (name, got), want in zip(m.run(feeds).items(), run_ort(model, feeds)):
            assert_close(got, want, name)


def test_opencl_summary_profile_and_benchmark(opencl_model):
    model, m = opencl_model
    s = m.summary()
    assert s["target"] == "opencl" and s["fallback_ops"] == [] and s["serial_kernels"] == []
    assert s["nodes"] >= s["kernels"] > 0 and s["device_launches_per_run"] >= s["kernels"]
    assert s["compile_seconds"] > 0 and s["device"]
    feeds = list(zoo.random_feeds(model, 3).values())
    y = m(*feeds)
    assert_close(y[0] if isinstance(y, tuple) else y, run_ort(model, dict(zip(m.input_names, feeds)))[0])
    rows = m.profile(feeds, repeat=2)
    assert len(rows) == s["kernels"] and all(r["seconds"] > 0 and r["launches"] >= 1 for r in rows)
    assert "kernel" in m.profile_table(feeds)
    assert m.benchmark(feeds, repeat=2, warmup=1)["median"] > 0


@needs_opencl
def test_opencl_inputs_are_checked(tmp_path):
    m = ember.compile(MODELS["conv_bn_relu"](), target="opencl")
    with pytest.raises(ArgumentError, match="shape"):
        m(np.zeros((1, 8, 8, 9), np.float32))
    with pytest.raises(ArgumentError, match="missing"):
        m.run({})
    with pytest.raises(NotImplementedError, match="opencl"):
        m.export_c(tmp_path / "c")


def test_opencl_save_and_load_round_trip(opencl_model, tmp_path):
    """A saved GPU model is data (plan, weights, kernel source, launches): `ember.load` runs it again."""
    model, m = opencl_model
    path = m.save(tmp_path / "m")
    assert {p.name for p in path.iterdir()} >= {"plan.json", "weights.npz", "model.cl", "gpu.json"}
    loaded = ember.load(path)
    assert loaded.summary()["kernels"] == m.summary()["kernels"] and loaded.summary()["target"] == "opencl"
    feeds = zoo.random_feeds(model, 5)
    for (name, got), want in zip(loaded.run(feeds).items(), m.run(feeds).values()):
        np.testing.assert_array_equal(got, want, err_msg=name)


@needs_opencl
def test_opencl_fallback_step_between_kernels():
    """A node without a native kernel (a CumSum too long for the quadratic compute) runs by reference on the host,
    between device kernels: its input comes back from the device, its output goes to it."""
    n = 8193
    nodes = [helper.make_node("Mul", ["x", "two"], ["a"]), helper.make_node("CumSum", ["a", "axis"], ["b"]),
             helper.make_node("Tanh", ["b"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "fallback", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
                              [numpy_helper.from_array(np.array(0.01, np.float32), "two"),
                               numpy_helper.from_array(np.array(1, np.int64), "axis")])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m = ember.compile(model, target="opencl")
    assert m.summary()["fallback_ops"] == ["CumSum"]
    x = np.random.default_rng(0).standard_normal((1, n)).astype(np.float32)
    assert_close(m(x), np.tanh(np.cumsum(x.astype(np.float64) * 0.01, axis=1)).astype(np.float32))


@needs_opencl
def test_opencl_half_precision_kernels():
    """float16 buffers: the kernels convert through bit casts (memcpy is a builtin in OpenCL C)."""
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Cast", ["r"], ["y"], to=TensorProto.FLOAT)]  # fmt: skip
    graph = helper.make_graph(nodes, "half", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 6])])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m = ember.compile(model, target="opencl", fallback=False)
    x = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    np.testing.assert_array_equal(m(x), np.maximum(x.astype(np.float16), 0).astype(np.float32))


# -- CUDA: every kernel through nvcc; running needs a GPU -------------------------------------------------------
@needs_nvcc
@pytest.mark.parametrize("name", list(MODELS))
def test_cuda_model_compiles_with_nvcc_and_runs_where_a_gpu_is(name, tmp_path):
    model = MODELS[name]()
    m = ember.compile(model, target="cuda -arch=sm_80", fallback=False)
    ptx = Path(m.summary()["ptx"]).read_text()
    for prog in m.programs.values():
        for k in prog.kernels:
            assert f".entry {k.name}(" in ptx
    assert 'extern "C" __global__' in m.source
    saved = ember.load(m.save(tmp_path / "m"))  # the PTX travels with it: loading needs no nvcc
    assert saved.summary()["ptx"].endswith("model.ptx") and len(saved.launches) == len(m.launches)
    from ember.runtime.cuda import CUDAUnavailable, available

    feeds = zoo.random_feeds(model, 0)
    reason = available()
    if reason is not None:
        with pytest.raises(CUDAUnavailable):  # a clear error, before any device memory is touched
            m.run(feeds)
        pytest.skip(f"no CUDA GPU to run on: {reason}")
    for (out, got), want in zip(m.run(feeds).items(), run_ort(model, feeds)):
        assert_close(got, want, out)
