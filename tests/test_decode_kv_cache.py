"""Decoding with a KV cache: a GPT-2 exported with its past key/values as inputs and present key/values as outputs,
compiled once with symbolic batch, past and sequence lengths, generating greedily token by token against
onnxruntime running the same ONNX model the same way; and the pieces such graphs are made of, each on its own:
Range over symbolic bounds, Concat of a cache that may be empty, Shape read at run time, causal masks."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.graph.dims import eval_dim, range_length, size_var

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the reference")

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _ints(name: str, *values: int):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _scalar(name: str, value: int):
    return numpy_helper.from_array(np.array(value, np.int64), name)


def _check(model: onnx.ModelProto, compiled, feeds: dict, atol: float = 1e-5) -> None:
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    got = compiled.run(feeds)
    for name, w in zip(compiled.output_names, want):
        assert got[name].shape == w.shape, name
        np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=atol, err_msg=name)


# -- the pieces --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("start, limit, delta", [(0, "S", 1), ("P", "P+S", 1), (1, "S", 2), ("S", 0, -3),
                                                 ("P", 2, 1)])  # fmt: skip
def test_range_length_of_symbolic_bounds(start, limit, delta):
    S, P = size_var("S", 1, 40), size_var("P", 0, 40)
    dim = {"S": S, "P": P, "P+S": P + S}
    n = range_length(dim.get(start, start), dim.get(limit, limit), delta)
    for s, p in ((1, 0), (7, 3), (40, 40)):
        env = {S: s, P: p}
        at = {"S": s, "P": p, "P+S": p + s}
        assert eval_dim(n, env) == len(range(at.get(start, start), at.get(limit, limit), delta)), (s, p)


def _causal_mask_model(trilu: bool) -> onnx.ModelProto:
    """Attention scores of queries q [1, S, 4] against a cache k [1, P, 4] and themselves ([1, S, P+S]), masked
    causally as exporters write it: either Range(P, P+S) >= Range(0, P+S) and Where, or Trilu(k=P) of ones shaped
    by the sizes (older exporters)."""
    nodes = [
        helper.make_node("Concat", ["k", "q"], ["keys"], axis=1),
        helper.make_node("Transpose", ["keys"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["x"]),
        helper.make_node("Shape", ["k"], ["p1"], start=1, end=2),
        helper.make_node("Shape", ["q"], ["s1"], start=1, end=2),
        helper.make_node("Squeeze", ["p1"], ["p"]),
        helper.make_node("Squeeze", ["s1"], ["s"]),
        helper.make_node("Add", ["p", "s"], ["total"]),
    ]
    if trilu:
        nodes += [
            helper.make_node("Unsqueeze", ["total", "zero"], ["t1"]),
            helper.make_node("Concat", ["s1", "t1"], ["mask_shape"], axis=0),
            helper.make_node("ConstantOfShape", ["mask_shape"], ["ones"],
                             value=numpy_helper.from_array(np.ones(1, np.float32))),  # fmt: skip
            helper.make_node("Trilu", ["ones", "p"], ["lower"], upper=0),
            helper.make_node("Cast", ["lower"], ["keep"], to=TensorProto.BOOL),
        ]
    else:
        nodes += [
            helper.make_node("Range", ["p", "total", "one"], ["rows"]),
            helper.make_node("Range", ["zero_s", "total", "one"], ["cols"]),
            helper.make_node("Unsqueeze", ["rows", "one_axis"], ["rows2"]),
            helper.make_node("LessOrEqual", ["cols", "rows2"], ["keep"]),
        ]
    nodes += [helper.make_node("Where", ["keep", "x", "neg"], ["masked"]),
              helper.make_node("Softmax", ["masked"], ["y"], axis=-1)]  # fmt: skip
    inits = [_ints("zero", 0), _scalar("zero_s", 0), _scalar("one", 1), _ints("one_axis", 1),
             numpy_helper.from_array(np.float32(-1e9), "neg")]  # fmt: skip
    return _model(nodes, [helper.make_tensor_value_info("q", F, [1, "S", 4]),
                          helper.make_tensor_value_info("k", F, [1, "P", 4])],
                  [helper.make_tensor_value_info("y", F, [1, "S", "T"])], inits)  # fmt: skip


@pytest.mark.parametrize("trilu", [False, True], ids=["range_where", "trilu"])
def test_causal_mask_over_symbolic_cache_and_sequence_lengths(trilu):
    m = _causal_mask_model(trilu)
    cm = ember.compile(m, target="c", dynamic_bounds={"S": (1, 16), "P": (0, 16)})
    assert cm.summary()["fallback_ops"] == []
    rng = np.random.default_rng(0)
    for p, s in ((0, 5), (5, 1), (9, 3)):
        feeds = {"q": rng.standard_normal((1, s, 4)).astype(np.float32),
                 "k": rng.standard_normal((1, p, 4)).astype(np.float32)}  # fmt: skip
        _check(m, cm, feeds)


def test_concat_onto_a_cache_that_may_be_empty_and_its_shape_at_run_time():
    """present = Concat(past, new) along the symbolic cache axis, past of length 0 at the first step; the Shape of
    the result is computed by a kernel from the sizes."""
    nodes = [helper.make_node("Concat", ["past", "new"], ["present"], axis=1),
             helper.make_node("Shape", ["present"], ["shape"])]  # fmt: skip
    m = _model(nodes, [helper.make_tensor_value_info("past", F, [2, "P", 3]),
                       helper.make_tensor_value_info("new", F, [2, "S", 3])],
               [helper.make_tensor_value_info("present", F, [2, "P+S", 3]),
                helper.make_tensor_value_info("shape", I64, [3])])  # fmt: skip
    cm = ember.compile(m, target="c", dynamic_bounds={"P": (0, 64), "S": (1, 8)})
    rng = np.random.default_rng(1)
    for p, s in ((0, 8), (8, 1), (9, 1), (37, 2)):
        past = rng.standard_normal((2, p, 3)).astype(np.float32)
        new = rng.standard_normal((2, s, 3)).astype(np.float32)
        got = cm.run({"past": past, "new": new})
        np.testing.assert_array_equal(got["present"], np.concatenate([past, new], axis=1))
        np.testing.assert_array_equal(got["shape"], [2, p + s, 3])


# -- GPT-2 -------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt2() -> onnx.ModelProto:
    pytest.importorskip("torch", reason="the model is exported from PyTorch")
    pytest.importorskip("transformers", reason="the model is Hugging Face's GPT2LMHeadModel")
    pytest.importorskip("onnxscript", reason="torch's dynamo exporter writes the ONNX with onnxscript")
    from ember import zoo_torch

    return zoo_torch.gpt2_with_kv_cache(layers=2, d=64, heads=4, vocab=100, positions=64)


def test_gpt2_exported_with_its_cache_has_symbolic_past_and_sequence(gpt2):
    dims = {vi.name: [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]
            for vi in list(gpt2.graph.input) + list(gpt2.graph.output)}  # fmt: skip
    assert dims["input_ids"] == ["batch", "seq"] and dims["past_key_1"] == ["batch", 4, "past", 16]
    assert dims["logits"] == ["batch", "seq", 100] and dims["present_value_0"] == ["batch", 4, "past + seq", 16]


def test_gpt2_greedy_decoding_with_a_kv_cache_matches_onnxruntime_in_one_compile(gpt2, monkeypatch):
    from ember import zoo_torch
    from ember.runtime.plan import Plan

    cm = ember.compile(gpt2, target="c", dynamic_bounds={"batch": (1, 4), "seq": (1, 64), "past": (0, 64)})
    s = cm.summary()
    assert s["fallback_ops"] == [] and s["input_shapes"]["past_key_0"] == "[batch, 4, past, 16]"
    import ember.codegen.toolchain as toolchain
    import ember.runtime.executor as executor

    def no_compile(*a, **k):
        raise AssertionError("a compile after the first")

    for module, name in ((toolchain, "compile_units"), (toolchain, "compile_c"), (executor, "compile_units")):
        monkeypatch.setattr(module, name, no_compile)
    monkeypatch.setattr(ember, "compile", no_compile)
    planned, at = [], Plan.at
    monkeypatch.setattr(Plan, "at", lambda self, sizes, *a: planned.append(sizes) or at(self, sizes, *a))

    sess = ort.InferenceSession(gpt2.SerializeToString())
    names = [o.name for o in sess.get_outputs()]
    prompt = np.random.default_rng(2).integers(0, 100, 16)
    steps = 32  # decoding steps after the prompt: past = 16 .. 47, seq = 1
    want_tokens, want_logits = zoo_torch.greedy_decode(lambda f: dict(zip(names, sess.run(None, f))), gpt2, prompt,
                                                       steps)  # fmt: skip
    tokens, logits = zoo_torch.greedy_decode(cm.run, gpt2, prompt, steps)
    assert len(set(want_tokens)) > 4, "a degenerate reference: the random model repeats itself"
    assert tokens == want_tokens
    for step, (got, want) in enumerate(zip(logits, want_logits)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"step {step}")
    assert len(planned) == steps + 1  # a plan per new size (batch, seq, past), no recompile
    # the cache Ember returns has the grown length
    out = cm.run({"input_ids": np.array([[1]]), **{vi.name: np.zeros((1, 4, 47, 16), np.float32)
                                                   for vi in gpt2.graph.input[1:]}})  # fmt: skip
    assert out["present_key_1"].shape == (1, 4, 48, 16) and out["logits"].shape == (1, 1, 100)
