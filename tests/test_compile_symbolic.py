"""ember.compile with symbolic sizes: compiled once, run at many sizes, matching onnxruntime, planned once per size."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import ember
from ember import zoo
from ember.runtime.module import ArgumentError
from ember.runtime.plan import Plan

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the reference")


def symbolic(model: onnx.ModelProto, dims: dict[str, dict[int, str]]) -> onnx.ModelProto:
    """The model with the given input/output dims made symbolic (name -> {axis: dim_param}), its stale
    intermediate shapes dropped (onnxruntime would trust them)."""
    for vi in list(model.graph.input) + list(model.graph.output):
        for axis, name in dims.get(vi.name, {}).items():
            vi.type.tensor_type.shape.dim[axis].dim_param = name
    del model.graph.value_info[:]
    return model


def check_sizes(model: onnx.ModelProto, compiled, feeds_at, sizes, atol=1e-4) -> None:
    sess = ort.InferenceSession(model.SerializeToString())
    for size in sizes:
        feeds = feeds_at(size)
        want = sess.run(None, feeds)
        got = compiled.run(feeds)
        for name, w in zip(compiled.output_names, want):
            assert got[name].shape == w.shape, (size, name)
            np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=atol, err_msg=f"size {size}")


def test_transformer_layer_with_a_symbolic_batch(monkeypatch):
    m = zoo.transformer_encoder_layer(seq=8, batch=2)
    out = m.graph.output[0].name
    m = symbolic(m, {"x": {0: "B"}, out: {0: "B"}})
    cm = ember.compile(m, target="c", dynamic_bounds={"B": (1, 16)})
    s = cm.summary()
    assert s["symbolic_dims"] == {"B": [1, 16]} and s["input_shapes"] == {"x": "[B, 8, 32]"}
    assert s["fallback_ops"] == []
    rng = np.random.default_rng(0)
    planned = []
    at = Plan.at
    monkeypatch.setattr(Plan, "at", lambda self, sizes, *a: planned.append(sizes) or at(self, sizes, *a))
    check_sizes(m, cm, lambda b: {"x": rng.standard_normal((b, 8, 32)).astype(np.float32)}, (1, 3, 16, 3))
    assert planned == [(1,), (3,), (16,)]  # one plan per new size, kept
    with pytest.raises(ArgumentError, match=r"size B = 17 is outside its bounds \[1, 16\]"):
        cm(np.zeros((17, 8, 32), np.float32))
    with pytest.raises(ArgumentError, match=r"wants rank 3"):
        cm(np.zeros((8, 32), np.float32))
    with pytest.raises(NotImplementedError, match="symbolic sizes"):
        cm.save("unused")


def test_symbolic_compile_is_opt_in_and_checked():
    m = symbolic(zoo.mlp(batch=4), {"x": {0: "N"}})
    static = ember.compile(m, target="c")  # the documented default: a symbolic leading dim is 1
    assert static.plan.values[static.plan.inputs[0]].shape == (1, 48)
    with pytest.raises(NotImplementedError, match="c target only"):
        ember.compile(m, target="llvm", dynamic=True)
    dyn = ember.compile(m, target="c", dynamic=True)
    rng = np.random.default_rng(1)
    check_sizes(m, dyn, lambda n: {"x": rng.standard_normal((n, 48)).astype(np.float32)}, (1, 5, 64))
