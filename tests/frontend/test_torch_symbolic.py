"""PyTorch modules with dims declared dynamic (`torch.export.Dim`) compiled once with symbolic sizes: each Dim is
an Ember size variable of its name, and the model runs at every size against torch eager (computed before the
export: exporting a Hugging Face model with dynamic shapes changes its later eager results)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import ember
from ember.runtime.module import ArgumentError

torch = pytest.importorskip("torch", reason="the models are PyTorch modules")
zoo_torch = pytest.importorskip("ember.zoo_torch")


def test_a_dim_declared_dynamic_stays_symbolic():
    torch.manual_seed(0)
    m = zoo_torch.MLP().eval()
    xs = [torch.randn(b, 784) for b in (1, 3, 16)]
    with torch.no_grad():
        want = [m(x).numpy() for x in xs]
    batch = torch.export.Dim("batch", max=64)
    cm = ember.compile(m, example_inputs=(xs[1],), dynamic_shapes=({0: batch},), dynamic_bounds={"batch": (1, 16)},
                       target="c")  # fmt: skip
    s = cm.summary()
    assert s["input_shapes"] == {"x": "[batch, 784]"} and s["symbolic_dims"] == {"batch": [1, 16]}
    for x, w in zip(xs, want):
        np.testing.assert_allclose(cm(x.numpy()), w, rtol=1e-4, atol=1e-5)
    with pytest.raises(ArgumentError, match=r"size batch = 17 is outside its bounds \[1, 16\]"):
        cm(np.zeros((17, 784), np.float32))


def test_an_exported_program_keeps_its_dims_symbolic_named_by_input_and_axis():
    torch.manual_seed(1)
    m = zoo_torch.MLP().eval()
    x = torch.randn(5, 784)
    with torch.no_grad():
        want = m(x).numpy()
    ep = torch.export.export(m, (torch.randn(3, 784),), dynamic_shapes=({0: torch.export.Dim("b", max=8)},))
    cm = ember.compile(ep, target="c")  # symbolic by default
    assert cm.summary()["input_shapes"] == {"x": "[x_0, 784]"} and cm.summary()["symbolic_dims"]["x_0"][1] == 8
    np.testing.assert_allclose(cm(x.numpy()), want, rtol=1e-4, atol=1e-5)
    with warnings.catch_warnings(record=True):  # with dynamic=False the Dim is bound to the example's size
        static = ember.compile(ep, target="c", dynamic=False)
    assert static.plan.values[static.plan.inputs[0]].shape == (3, 784)


def test_gpt2_with_its_kv_cache_from_torch_with_symbolic_batch_past_and_sequence():
    """Sizes used as data (the cache positions arange(past, past + seq)) are computed from the sizes (SizeValue,
    Range); the cache may be empty."""
    transformers = pytest.importorskip("transformers", reason="the model is Hugging Face's GPT-2")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=100, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                  initializer_range=0.2, bos_token_id=0, eos_token_id=0)  # fmt: skip
    m = zoo_torch.DecoderWithCache(transformers.GPT2LMHeadModel(cfg).eval(), 2)
    cases = []
    for b, p, s in ((1, 0, 16), (1, 16, 1), (2, 7, 3)):
        ids, cache = torch.randint(0, 100, (b, s)), tuple(torch.randn(b, 4, p, 16) for _ in range(4))
        with torch.no_grad():
            cases.append((ids, cache, m(ids, *cache)))
    batch, seq = torch.export.Dim("batch", max=8), torch.export.Dim("seq", max=64)
    past = torch.export.Dim("past", max=64)
    example = (torch.randint(0, 100, (2, 5)), *[torch.randn(2, 4, 3, 16) for _ in range(4)])
    cm = ember.compile(m, example_inputs=example, dynamic_shapes=({0: batch, 1: seq}, ({0: batch, 2: past},) * 4),
                       target="c")  # fmt: skip
    assert cm.summary()["input_shapes"]["past_0"] == "[batch, 4, past, 16]" and cm.summary()["fallback_ops"] == []
    for ids, cache, want in cases:
        got = cm(ids.numpy(), *[c.numpy() for c in cache])
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-4, atol=1e-4)
