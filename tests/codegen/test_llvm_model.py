"""Whole models on the llvm target: `ember.compile(model, target="llvm")`, no C compiler involved.

Small zoo models are compared with onnxruntime on random inputs (float32 within rtol 1e-4; atol 1e-5 for
outputs near zero, as in tests/test_compile_models.py), then what is particular to the JIT-compiled model:
reference-fallback steps between native segments, per-kernel profiling, save/load (LLVM IR plus machine
code), the thread count, and the command line."""

from __future__ import annotations

import ctypes
import sys

import numpy as np
import onnx
import pytest

import ember
from ember import zoo
from ember.cli import main

pytest.importorskip("llvmlite", reason="the llvm target needs llvmlite (pip install 'ember[llvm]')")
ort = pytest.importorskip("onnxruntime")
RTOL, ATOL = 1e-4, 1e-5

MODELS = {
    "conv_bn_relu": lambda: zoo.conv_bn_relu_stack(layers=2, channels=8, size=8),
    "mlp": lambda: zoo.mlp(batch=2, features=16, hidden=(32, 16), classes=5),
    "inverted_residual": lambda: zoo.mobilenet_v2_inverted_residual(channels=8, expand=2, size=6),
    "transformer": lambda: zoo.transformer_encoder_layer(seq=8, d=16, heads=2, ff=32, batch=1),
    "bert": lambda: zoo.bert_encoder(layers=1, seq=8, d=16, heads=2, ff=32, vocab=100),
}


def run_ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def assert_matches_ort(m: ember.runtime.executor.CompiledModel, model: onnx.ModelProto, seed: int = 0) -> None:
    feeds = zoo.random_feeds(model, seed)
    for (name, a), b in zip(m.run(feeds).items(), run_ort(model, feeds)):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=name)


def num_threads(m) -> int:
    jit = m._lib
    return ctypes.c_int32.from_address(jit.engine.get_global_value_address("ember_num_threads")).value


@pytest.fixture
def no_c_compiler(monkeypatch):
    """No C compiler on this machine: the default target is llvm, and calling one fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("the llvm target must not call a C compiler")

    monkeypatch.setattr(sys.modules["ember.build"], "find_cc", lambda: None)
    monkeypatch.setattr(sys.modules["ember.runtime.executor"], "compile_units", refuse)


@pytest.fixture(scope="module", params=list(MODELS))
def compiled(request):
    model = MODELS[request.param]()
    return model, ember.compile(model, target="llvm", fallback=False)


def test_models_match_onnxruntime(compiled):
    model, m = compiled
    for seed in range(2):
        assert_matches_ort(m, model, seed)
    s = m.summary()
    assert s["target"] == "llvm" and s["fallback_ops"] == [] and s["native_calls_per_run"] == 1
    assert s["compile_seconds"] > 0 and s["kernels"] > 0
    assert 'define i32 @"ember_segment_0"' in m.source and m.lib_path is None


def test_profile_times_every_kernel(compiled):
    model, m = compiled
    xs = list(zoo.random_feeds(model, 1).values())
    rows = m.profile(xs, repeat=2)
    assert len(rows) == m.summary()["kernels"] and all(r["seconds"] >= 0 for r in rows)
    assert sum(r["seconds"] for r in rows) > 0
    assert m.benchmark(xs, repeat=2)["median"] > 0


def test_default_target_without_a_c_compiler_is_llvm(no_c_compiler):
    model = MODELS["mlp"]()
    m = ember.compile(model)
    assert m.summary()["target"] == "llvm"
    assert_matches_ort(m, model)


def topk_between_native_ops() -> onnx.ModelProto:
    """Mul -> TopK -> Neg, Exp: TopK over 9000 elements has no native kernel (its quadratic compute is refused)."""
    b = zoo.Builder(1)
    y = b.op("Mul", ["x", b.const(np.float32(2))])
    values, _ = b.op("TopK", [y, b.const(np.array([5], np.int64))], n_out=2, axis=-1)
    return b.model({"x": (1, 9000)}, b.op("Exp", [b.op("Neg", [values])]), "topk_between")


def test_reference_fallback_between_native_segments():
    model = topk_between_native_ops()
    m = ember.compile(model, target="llvm")
    assert [s.kind for s in m.plan.steps] == ["segment", "fallback", "segment"]
    assert m.summary()["fallback_ops"] == ["TopK"] and m.summary()["native_calls_per_run"] == 2
    assert_matches_ort(m, model)
    rows = m.profile(repeat=2)
    assert {r["kernel"] for r in rows} >= {"fallback:TopK"} and len(rows) == 3


def test_save_and_load_round_trip(tmp_path, monkeypatch, no_c_compiler):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    model = MODELS["conv_bn_relu"]()
    m = ember.compile(model, target="llvm -threads=1")
    path = m.save(tmp_path / "model")
    assert {p.name for p in path.iterdir()} >= {"model.ll", "model.o", "model.key", "plan.json", "weights.npz"}
    assert not (path / "model.so").exists()
    feeds = zoo.random_feeds(model, 5)
    (expected,) = m.run(feeds).values()

    # a fresh cache: the saved machine code is used (no optimization or code generation at load)
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "fresh"))
    loaded = ember.load(path)
    assert loaded._lib.from_cache and loaded.summary()["target"] == "llvm -threads=1"
    assert loaded.summary()["compile_seconds"] == m.summary()["compile_seconds"]
    np.testing.assert_array_equal(next(iter(loaded.run(feeds).values())), expected)

    # machine code for another key (another CPU or llvmlite: here the key this process computes is another) is
    # ignored: the IR is compiled again (editing model.key itself is tampering, which the manifest refuses)
    import ember.codegen.llvm_model as llvm_model

    monkeypatch.setattr(llvm_model, "object_key", lambda *a: "0" * 64)
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "other"))
    again = ember.load(path)
    assert not again._lib.from_cache
    np.testing.assert_array_equal(next(iter(again.run(feeds).values())), expected)


def test_threads_from_the_target():
    model = MODELS["conv_bn_relu"]()
    two = ember.compile(model, target="llvm -threads=2")
    one = ember.compile(model, target="llvm -threads=1")
    assert num_threads(two) == 2 and num_threads(one) == 1
    assert_matches_ort(two, model)
    feeds = zoo.random_feeds(model, 3)
    np.testing.assert_array_equal(*[next(iter(m.run(feeds).values())) for m in (one, two)])


def test_export_c_refuses_an_llvm_model(tmp_path):
    m = ember.compile(MODELS["mlp"](), target="llvm")
    with pytest.raises(ValueError, match="target='c'"):
        m.export_c(tmp_path)


def test_cli_compile_run_and_bench(tmp_path, capsys):
    model = MODELS["mlp"]()
    onnx.save(model, tmp_path / "mlp.onnx")
    assert main(["compile", str(tmp_path / "mlp.onnx"), "-o", str(tmp_path / "out"), "--target", "llvm"]) == 0
    assert (tmp_path / "out" / "model.ll").exists()
    assert main(["run", str(tmp_path / "out")]) == 0
    args = ["bench", str(tmp_path / "mlp.onnx"), "--target", "llvm", "--threads", "1", "--repeat", "2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "compiled" in out and "threads=1" in out and "onnxruntime" in out


def test_cli_demos(capsys):
    assert main(["demo", "--model", "mlp", "--target", "llvm"]) == 0
    assert main(["demo", "--matmul", "--size", "64", "--target", "llvm"]) == 0
    out = capsys.readouterr().out
    assert out.count("OK") == 2 and "target 'llvm'" in out
