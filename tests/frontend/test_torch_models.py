"""Models written in PyTorch (torchvision-style ResNet-18 and MobileNetV2, a BERT-like encoder) and from
Hugging Face transformers (BERT, ViT) with random weights, exported with torch.onnx, compiled natively,
compared with onnxruntime (rtol 1e-4 of the output's scale: long conv/attention chains in float32).

Skipped where torch (or transformers) is not installed; CI does not install them (torch is a large download)."""

from __future__ import annotations

import numpy as np
import pytest

import ember

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
zoo_torch = pytest.importorskip("ember.zoo_torch")


def check(model, feeds: dict) -> None:
    m = ember.compile(model, fallback=False)
    ours = list(m.run(feeds).values())
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for a, b in zip(ours, ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * np.abs(b).max())


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "bert4"])
def test_torch_models(name):
    module, args, names = zoo_torch.example(name, image=64)
    check(zoo_torch.to_onnx(module, args, names), {n: a.numpy() for n, a in zip(names, args)})


class _LastHidden(torch.nn.Module):
    def __init__(self, model, names):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *xs):
        return self.model(**dict(zip(self.names, xs)), use_cache=False).last_hidden_state


@pytest.mark.parametrize("arch", ["bert", "vit"])
def test_hugging_face_models(arch):
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if arch == "bert":
        cfg = tf.BertConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, intermediate_size=256)
        names = ["input_ids", "attention_mask"]
        args = (torch.randint(0, 1000, (2, 32)), torch.ones(2, 32, dtype=torch.int64))
        model = _LastHidden(tf.BertModel(cfg).eval(), names)
    else:
        cfg = tf.ViTConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, intermediate_size=256,
                           image_size=64, patch_size=16)  # fmt: skip
        names, args = ["pixel_values"], (torch.randn(1, 3, 64, 64),)
        model = _LastHidden(tf.ViTModel(cfg).eval(), names)
    check(zoo_torch.to_onnx(model, args, names), {n: a.numpy() for n, a in zip(names, args)})
