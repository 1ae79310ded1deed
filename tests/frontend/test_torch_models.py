"""Models written in PyTorch (torchvision-style ResNet-18 and MobileNetV2, a BERT-like encoder) and from
Hugging Face transformers (BERT, ViT) with random weights, exported with torch.onnx, compiled natively,
compared with onnxruntime (rtol 1e-4 of the output's scale: long conv/attention chains in float32).

Skipped where torch (or transformers) is not installed (CI installs them: the `torch` extra)."""

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


class _Hidden(torch.nn.Module):
    """A model's last_hidden_state, called with its inputs by name."""

    def __init__(self, model, names):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *xs):
        return self.model(**dict(zip(self.names, xs))).last_hidden_state


def _hf_case(tf, arch: str):
    """(module, input names, example args) of a small Hugging Face model with random weights."""
    ids = (torch.randint(0, 100, (1, 16)),)
    image = (torch.randn(1, 3, 64, 64),)
    if arch == "distilbert":
        cfg = tf.DistilBertConfig(vocab_size=100, dim=64, n_layers=2, n_heads=4, hidden_dim=128)
        return tf.DistilBertModel(cfg), ["input_ids"], ids
    if arch == "t5_encoder":
        cfg = tf.T5Config(vocab_size=100, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)
        return tf.T5EncoderModel(cfg), ["input_ids"], ids
    if arch == "convnext":
        cfg = tf.ConvNextConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1])
        return tf.ConvNextModel(cfg), ["pixel_values"], image
    if arch == "swin":
        cfg = tf.SwinConfig(image_size=64, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4)
        return tf.SwinModel(cfg), ["pixel_values"], image
    if arch == "segformer":
        cfg = tf.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                                 num_attention_heads=[1, 2], mlp_ratios=[2, 2], patch_sizes=[7, 3], strides=[4, 2])
        return tf.SegformerModel(cfg), ["pixel_values"], image
    raise KeyError(arch)


@pytest.mark.parametrize("arch", ["distilbert", "t5_encoder", "convnext", "swin", "segformer"])
def test_more_hugging_face_architectures(arch):
    """Architectures none of Ember's own tests were written for: relative position buckets (T5), depthwise
    7x7 convs with channels-last LayerNorm (ConvNeXt), shifted windows (Swin), overlapping patch merging and
    reduced attention (SegFormer); all natively, no reference fallback."""
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model, names, args = _hf_case(tf, arch)
    check(zoo_torch.to_onnx(_Hidden(model.eval(), names), args, names), {n: a.numpy() for n, a in zip(names, args)})


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_decoders_exported_by_the_dynamo_exporter(arch):
    """Decoder-only models through torch's newer exporter (torch.export + onnxscript): causal masks built
    from ranges, rotary embeddings, grouped-query attention, RMS norm, SiLU gates. GPT-2 cannot go through the
    TorchScript exporter (aten::diff), this one writes it differently."""
    tf = pytest.importorskip("transformers")
    pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    if arch == "gpt2":
        model = tf.GPT2Model(tf.GPT2Config(vocab_size=100, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                           bos_token_id=0, eos_token_id=0))  # fmt: skip
    else:
        cfg = tf.LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
        model = tf.LlamaModel(cfg)
    ids = torch.randint(0, 100, (2, 16))
    wrapped = _LastHidden(model.eval(), ["input_ids"])
    proto = torch.onnx.export(wrapped, (ids,), dynamo=True, input_names=["ids"]).model_proto
    check(proto, {proto.graph.input[0].name: ids.numpy()})
