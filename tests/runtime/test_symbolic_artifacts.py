"""Models with symbolic sizes saved, loaded and cached: the plan keeps its shapes as expressions of its size
variables (their bounds, and for sizes read from input values their rules), a fresh process loads it and runs it
at every size, matching onnxruntime; the compile cache keeps symbolic models too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ember
from ember import compiler, zoo
from ember.codegen.toolchain import find_cc
from ember.runtime.model import ArtifactError
from ember.runtime.plan import Plan
from ember.runtime.standalone import StandaloneError, run_exported
from ember.tir.sizevar import SizeJSONError

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the reference")

ROOT = Path(__file__).resolve().parents[2]


def batch_seq_model() -> onnx.ModelProto:
    """x [B, S, 16] -> Reshape [B*S, 16] -> MatMul -> Relu -> Reshape by x's shape -> Softmax over S: dims that are
    expressions of two size variables (B*S) and a Shape-driven Reshape."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", TensorProto.FLOAT, [16, 16], rng.standard_normal((16, 16)).astype(np.float32).ravel())
    flat = helper.make_tensor("flat", TensorProto.INT64, [2], [-1, 16])
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["r"]), helper.make_node("MatMul", ["r", "w"], ["m"]),
             helper.make_node("Relu", ["m"], ["h"]), helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Reshape", ["h", "shape"], ["back"]),
             helper.make_node("Softmax", ["back"], ["y"], axis=1)]  # fmt: skip
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", "S", 16]) for n in "xy")
    graph = helper.make_graph(nodes, "batch_seq", [x], [y], [w, flat])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def reshape_by_input_model() -> onnx.ModelProto:
    """Reshape of x [2, 3, 4] by an int64 input: its output dims are sizes read from the input's values."""
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4]),
           helper.make_tensor_value_info("s", TensorProto.INT64, [3])]  # fmt: skip
    node = helper.make_node("Reshape", ["x", "s"], ["y"])
    graph = helper.make_graph([node], "reshape", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                                      [None] * 3)])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def feeds_at(name: str, size: tuple[int, ...], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if name == "batch_seq":
        return {"x": rng.standard_normal((*size, 16)).astype(np.float32)}
    return {"x": rng.standard_normal((2, 3, 4)).astype(np.float32), "s": np.array(size, np.int64)}


MODELS = {"batch_seq": (batch_seq_model, [(1, 3), (4, 7)]),
          "reshape": (reshape_by_input_model, [(4, 3, 2), (-1, 1, 2)])}  # fmt: skip

LOAD_AND_RUN = """
import sys, numpy as np, ember
m = ember.load(sys.argv[1])
feeds = np.load(sys.argv[2])
outs = [m.run({k: feeds[f"{i}_{k}"] for k in m.input_names}) for i in range(int(sys.argv[4]))]
np.savez(sys.argv[3], **{f"{i}_{k}": v for i, o in enumerate(outs) for k, v in o.items()})
print(m.summary().get("symbolic_dims"))
"""


@pytest.mark.parametrize("target", ["c", "llvm"])
@pytest.mark.parametrize("name", list(MODELS))
def test_a_saved_symbolic_model_runs_at_every_size_in_a_fresh_process(name, target, tmp_path):
    build, sizes = MODELS[name]
    model = build()
    cm = ember.compile(model, target=target, fallback=False)
    assert cm.plan.is_symbolic
    cm.save(tmp_path / "m")
    plan = json.loads((tmp_path / "m" / "plan.json").read_text())
    assert [v["name"] for v in plan["size_vars"]] == [v.name for v in cm.plan.size_vars]
    feeds = [feeds_at(name, s, seed) for seed, s in enumerate(sizes)]
    np.savez(tmp_path / "in.npz", **{f"{i}_{k}": v for i, f in enumerate(feeds) for k, v in f.items()})
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", LOAD_AND_RUN, str(tmp_path / "m"), str(tmp_path / "in.npz"),
                           str(tmp_path / "out.npz"), str(len(sizes))], capture_output=True, text=True, env=env,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    sess = ort.InferenceSession(model.SerializeToString())
    with np.load(tmp_path / "out.npz") as got:
        for i, f in enumerate(feeds):
            for out, want in zip(cm.output_names, sess.run(None, f)):
                assert got[f"{i}_{out}"].shape == want.shape, (name, sizes[i])
                np.testing.assert_allclose(got[f"{i}_{out}"], want, rtol=1e-5, atol=1e-6, err_msg=f"{name} {sizes[i]}")


def test_a_saved_plan_with_an_undeclared_size_is_refused(tmp_path):
    cm = ember.compile(batch_seq_model(), target="c", dynamic_bounds={"B": (1, 8)})
    cm.save(tmp_path / "m")
    loaded = ember.load(tmp_path / "m")
    assert loaded.summary()["symbolic_dims"] == {"B": [1, 8], "S": [1, None]}
    plan = tmp_path / "m" / "plan.json"
    data = json.loads(plan.read_text())
    data["size_vars"] = [v for v in data["size_vars"] if v["name"] != "S"]
    with pytest.raises(SizeJSONError, match="size 'S' is used but not declared"):
        Plan.from_json(data)
    plan.write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="plan.json"):  # (the manifest's hash, before the plan is even read)
        ember.load(tmp_path / "m")


@pytest.fixture
def counted_compiles(tmp_path, monkeypatch) -> list:
    """The compile cache on, in a fresh directory; the list of the compiles that lowered a model."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EMBER_COMPILE_CACHE", "1")
    calls: list = []
    real = compiler.lower_model
    monkeypatch.setattr(compiler, "lower_model", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    return calls


def test_the_compile_cache_keeps_symbolic_models(counted_compiles):
    model = batch_seq_model()
    first = ember.compile(model, target="c -threads=1")
    assert first.summary()["compile_cache"] == "stored"
    again = ember.compile(model, target="c -threads=1")
    assert again.summary()["compile_cache"] == "hit" and again.plan.is_symbolic and len(counted_compiles) == 1
    bounded = ember.compile(model, target="c -threads=1", dynamic_bounds={"S": (1, 64)})  # other bounds: a key
    static = ember.compile(model, target="c -threads=1", dynamic=False, input_shapes={"x": (2, 5, 16)})
    assert len(counted_compiles) == 3 and not static.plan.is_symbolic
    assert bounded.summary()["symbolic_dims"]["S"] == [1, 64]
    sess = ort.InferenceSession(model.SerializeToString())
    for size in ((1, 1), (3, 9)):
        f = feeds_at("batch_seq", size, 5)
        np.testing.assert_allclose(again.run(f)["y"], sess.run(None, f)[0], rtol=1e-5, atol=1e-6)


def test_symbolic_mlp_bounds_survive_a_save(tmp_path):
    m = zoo.mlp(batch=4)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    cm = ember.compile(m, target="llvm", dynamic_bounds={"N": (2, 6)})
    loaded = ember.load(cm.save(tmp_path / "m"))
    with pytest.raises(ember.runtime.module.ArgumentError, match=r"size N = 7 is outside its bounds \[2, 6\]"):
        loaded(np.zeros((7, 48), np.float32))
    x = np.random.default_rng(0).standard_normal((5, 48)).astype(np.float32)
    np.testing.assert_allclose(loaded(x), cm(x), rtol=1e-6)


needs_cc = pytest.mark.skipif(find_cc() is None, reason="the standalone export builds with a C compiler")


@needs_cc
def test_a_symbolic_export_runs_at_every_size_with_ember_run(tmp_path):
    """ember_run reads the sizes from the input shapes (ember_model_set_shapes), plans the workspace for them and
    writes outputs of those sizes: equal to the in-process model's bit for bit, and to onnxruntime's."""
    model = batch_seq_model()
    cm = ember.compile(model, target="c", dynamic_bounds={"B": (1, 8)})
    out = cm.export(tmp_path / "e", extra_cflags=["-Werror"])
    description = json.loads((out / "model.json").read_text())
    assert description["inputs"][0]["shape"] == ["B", "S", 16] and description["sizes"] == {"B": [1, 8], "S": [1, None]}
    assert "int ember_model_set_shapes(" in (out / "ember_model.h").read_text()
    sess = ort.InferenceSession(model.SerializeToString())
    for size in ((1, 3), (4, 7), (2, 1), (8, 5)):
        feeds = feeds_at("batch_seq", size, sum(size))
        outputs, _ = run_exported(out, feeds)
        assert outputs["y"].shape == (*size, 16)
        np.testing.assert_array_equal(outputs["y"], cm.run(feeds)["y"])
        np.testing.assert_allclose(outputs["y"], sess.run(None, feeds)[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(StandaloneError, match=r"size B = 9, outside its bounds \[1, 8\]"):
        run_exported(out, {"x": np.zeros((9, 2, 16), np.float32)})
    with pytest.raises(StandaloneError, match=r"holds shape \(2, 3\), the model takes \(\?, \?, 16\)"):
        run_exported(out, {"x": np.zeros((2, 3), np.float32)})


def test_sizes_read_from_values_do_not_export_yet(tmp_path):
    cm = ember.compile(reshape_by_input_model(), target="c")
    with pytest.raises(NotImplementedError, match="read from input values"):
        cm.export(tmp_path / "e", build=False)
