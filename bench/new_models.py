"""Models outside the zoo, through every way a new user would bring them, each checked against its own framework.

    PYTHONPATH=<torchvision> python bench/new_models.py [--only deberta_v2,keras_convnext_tiny] [--list]

Random weights, small configs, no downloads. Per model, each path it supports:
  legacy  torch.onnx.export(dynamo=False) -> ember.compile(path)        vs torch eager
  dynamo  torch.onnx.export(dynamo=True)  -> ember.compile(path)        vs torch eager
  torch   ember.compile(module, example_inputs)                         vs torch eager
  dynamic torch.onnx legacy with dynamic batch and sequence, compiled once (dynamic=True), run at three sizes
                                                                        vs onnxruntime
  keras   ember.compile(keras_model)                                    vs Keras
  tflite  TFLiteConverter -> ember.compile(".tflite")                   vs the TFLite interpreter
  ortopt  the model as onnxruntime saves it optimized (its contrib ops) vs onnxruntime on that file
  qdq, qop  onnxruntime's quantize_static (QDQ, QOperator)              vs onnxruntime on that file
A row prints ok and the max error relative to the reference's largest magnitude, or the error (the traceback goes
to --logdir). A failure of the exporter itself (torch's, onnxruntime's quantizer) is shown as "export: ..." and is
not Ember's; "degenerate" marks a reference whose values are all alike (it would check nothing). Random batch-norm
statistics make some of these nets sensitive: keras EfficientNetV2-B0's logits move by 5e-4 of their scale when its
input moves by 1e-6, and TFLite differs from Keras by 3e-4 there.
This is how the frontends were tried as a new user would (torch 2.13, transformers 5, keras 3, onnxruntime 1.23).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ember  # noqa: E402


# -- the models: name -> (builder, paths) ---------------------------------------------------------------------
def _transformers():
    """transformers, imported after torchvision's model definitions (bench/zoo.py: its compiled ops do not load)."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is not None:
        from zoo import torchvision_models

        torchvision_models()
    import transformers

    return transformers


def _text(config: str, model: str, vocab: int = 1000, seq: int = 16, **kw):
    import torch

    transformers = _transformers()

    cfg = getattr(transformers, config)(vocab_size=vocab, **kw)
    cfg._attn_implementation, cfg.use_cache = "eager", False
    return getattr(transformers, model)(cfg), (torch.randint(0, vocab, (1, seq)),)


def _image(config: str, model: str, size: int = 64, **kw):
    import torch

    transformers = _transformers()

    cfg = getattr(transformers, config)(**kw)
    cfg._attn_implementation = "eager"
    return getattr(transformers, model)(cfg), (torch.randn(1, 3, size, size),)


def _vision(name: str, size: int = 64, **kw):
    import torch
    from zoo import torchvision_models

    models = torchvision_models()
    import torchvision.models.segmentation  # noqa: F401  (submodules the zoo's loader leaves unimported)
    import torchvision.models.video  # noqa: F401

    builder = getattr(models.segmentation, name, None) or getattr(models.video, name, None) or getattr(models, name)
    shape = (1, 3, 8, size, size) if ".video." in builder.__module__ else (1, 3, size, size)
    return builder(weights=None, **kw), (torch.randn(*shape),)


SMALL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128}
DECODER = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
TORCH_PATHS = ("legacy", "dynamo", "torch")
TORCH: dict[str, Callable] = {
    "deberta_v2": lambda: _text("DebertaV2Config", "DebertaV2Model", **SMALL),
    "mpnet": lambda: _text("MPNetConfig", "MPNetModel", **SMALL),
    "bloom": lambda: _text("BloomConfig", "BloomModel", hidden_size=64, n_layer=2, n_head=4),
    "opt": lambda: _text("OPTConfig", "OPTModel", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         ffn_dim=128, word_embed_proj_dim=64),
    "falcon": lambda: _text("FalconConfig", "FalconModel", hidden_size=64, num_hidden_layers=2, num_attention_heads=4),
    "mistral": lambda: _text("MistralConfig", "MistralModel", num_key_value_heads=2, sliding_window=8, **DECODER),
    "qwen2": lambda: _text("Qwen2Config", "Qwen2Model", num_key_value_heads=2, **DECODER),
    "phi": lambda: _text("PhiConfig", "PhiModel", **DECODER),
    "gemma": lambda: _text("GemmaConfig", "GemmaModel", num_key_value_heads=1, head_dim=16, **DECODER),
    "fnet": lambda: _text("FNetConfig", "FNetModel", hidden_size=64, num_hidden_layers=2, intermediate_size=128),
    "xlnet": lambda: _text("XLNetConfig", "XLNetModel", d_model=64, n_layer=2, n_head=4, d_inner=128),
    "funnel": lambda: _text("FunnelConfig", "FunnelModel", d_model=64, n_head=4, d_head=16, d_inner=128,
                            block_sizes=[1, 1]),
    "beit": lambda: _image("BeitConfig", "BeitModel", image_size=64, patch_size=16, use_relative_position_bias=True,
                           **SMALL),
    "dinov2": lambda: _image("Dinov2Config", "Dinov2Model", image_size=64, patch_size=16, **SMALL),
    "mobilevit": lambda: _image("MobileViTConfig", "MobileViTModel", image_size=64),
    "convnextv2": lambda: _image("ConvNextV2Config", "ConvNextV2Model", depths=[1, 1, 1, 1]),
    "yolos": lambda: _image("YolosConfig", "YolosModel", image_size=[64, 64], patch_size=16, num_detection_tokens=10,
                            **SMALL),
    "segformer": lambda: _image("SegformerConfig", "SegformerForSemanticSegmentation"),
    "lraspp": lambda: _vision("lraspp_mobilenet_v3_large", 96, weights_backbone=None),
    "r3d_18": lambda: _vision("r3d_18", 56),
    "maxvit_t": lambda: _vision("maxvit_t", 224),
    "swin_v2_t": lambda: _vision("swin_v2_t", 64),
}  # fmt: skip
DYNAMIC = {  # name -> builder: dynamic batch and sequence through the legacy exporter
    "bert": lambda: _text("BertConfig", "BertModel", **SMALL),
    "gpt2": lambda: _text("GPT2Config", "GPT2Model", n_embd=64, n_layer=2, n_head=4),
    "t5_encoder": lambda: _text("T5Config", "T5EncoderModel", d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16),
}
KERAS = {  # keras.applications builder name -> input size
    "MobileNetV3Small": 96, "EfficientNetV2B0": 64, "ResNet50V2": 64, "DenseNet121": 64, "InceptionV3": 96,
    "ConvNeXtTiny": 64,
}  # fmt: skip
ORT = {  # name -> torchvision builder, for onnxruntime's optimized and quantized files
    "resnet18": "resnet18", "mobilenet_v2": "mobilenet_v2", "efficientnet_b0": "efficientnet_b0",
}  # fmt: skip


def rows() -> dict[str, tuple[Callable, tuple[str, ...]]]:
    out: dict[str, tuple[Callable, tuple[str, ...]]] = {n: (b, TORCH_PATHS) for n, b in TORCH.items()}
    out.update({f"dynamic_{n}": (b, ("dynamic",)) for n, b in DYNAMIC.items()})
    out.update({f"keras_{n.lower()}": (n, ("keras", "tflite")) for n in KERAS})
    out.update({f"ort_{n}": (lambda b=b: _vision(b, 64), ("ortopt", "qdq", "qop")) for n, b in ORT.items()})
    return out


# -- the paths -------------------------------------------------------------------------------------------------
def rel(ours, ref) -> float:
    """Max error relative to the reference's largest magnitude; a reference whose values are all alike (dead
    activations: any port gets it right) cannot check anything and raises."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    scale = max(np.abs(ref).max(), 1e-30)
    if ref.std() < 1e-4 * scale:
        raise DegenerateError(f"the reference's values are all alike (std {ref.std():.1e} of scale {scale:.1e})")
    return float(np.abs(ours - ref).max() / scale)


class DegenerateError(Exception):
    """The test model's output checks nothing."""


class ExportError(Exception):
    """The framework's exporter failed (not Ember)."""


def first_output(module):
    import torch

    class First(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = module

        def forward(self, *args):
            out = self.inner(*args)
            if isinstance(out, dict):  # torchvision's segmentation models: {"out": ...}
                out = list(out.values())
            return out if isinstance(out, torch.Tensor) else out[0]

    return First().eval()


def torch_path(path: str, build: Callable, tmp: Path) -> str:
    import onnxruntime as ort
    import torch

    torch.manual_seed(0)
    module, args = build()
    module = first_output(module.eval())
    with torch.no_grad():
        for w in module.parameters():  # zero-initialized layers (layer scales, heads) would make the output 0
            if w.numel() > 1 and not w.any():
                w.normal_(0.0, 0.02)
        ref = module(*args).numpy()
    feeds = [a.numpy() for a in args]
    if path == "torch":
        return f"ok {rel(ember.compile(module, example_inputs=args)(*feeds), ref):.1e}"
    f = str(tmp / f"{path}.onnx")
    try:
        if path == "dynamic":
            axes = {"x": {0: "b", 1: "s"}}
            torch.onnx.export(module, args, f, dynamo=False, input_names=["x"], dynamic_axes=axes, opset_version=17)
        else:
            torch.onnx.export(module, args, f, dynamo=path == "dynamo", opset_version=18 if path == "dynamo" else 17)
    except Exception as e:
        raise ExportError(str(e).splitlines()[0][:120]) from e
    if path != "dynamic":
        return f"ok {rel(ember.compile(f, fallback=False)(*feeds), ref):.1e}"
    m, session, worst = ember.compile(f, dynamic=True, fallback=False), ort.InferenceSession(f), 0.0
    for shape in ((1, 7), (3, 33), (2, 16)):
        x = np.random.default_rng(0).integers(0, 1000, shape).astype(np.int64)
        worst = max(worst, rel(m(x), session.run(None, {"x": x})[0]))
    return f"ok {worst:.1e} (3 sizes)"


def keras_path(path: str, name: str, tmp: Path) -> str:
    import keras
    import tensorflow as tf

    size = KERAS[name]
    model = getattr(keras.applications, name)(input_shape=(size, size, 3), weights=None, classes=10,
                                               classifier_activation=None)  # logits: a softmax hides differences
    rng = np.random.default_rng(0)
    for layer in model.layers:  # batch-norm statistics other than 0 and 1 (with those, activations die out)
        if isinstance(layer, keras.layers.BatchNormalization):
            *affine, mean, var = layer.get_weights()
            layer.set_weights([*(rng.uniform(0.5, 1.5, w.shape) for w in affine), rng.normal(0, 0.1, mean.shape),
                               rng.uniform(0.5, 1.5, var.shape)])  # fmt: skip
    x = np.random.default_rng(0).uniform(-1, 1, (1, size, size, 3)).astype(np.float32)
    if path == "keras":
        return f"ok {rel(ember.compile(model, fallback=False)(x), np.asarray(model(x, training=False))):.1e}"
    f = tmp / "model.tflite"
    f.write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
    it = tf.lite.Interpreter(model_path=str(f))
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return f"ok {rel(ember.compile(str(f), fallback=False)(x), it.get_tensor(it.get_output_details()[0]['index'])):.1e}"


def ort_path(path: str, build: Callable, tmp: Path) -> str:
    import onnxruntime as ort
    import torch
    from onnxruntime import quantization as q
    from onnxruntime.quantization.shape_inference import quant_pre_process

    torch.manual_seed(0)
    module, args = build()
    src = str(tmp / "model.onnx")
    torch.onnx.export(first_output(module.eval()), args, src, dynamo=False, input_names=["x"], opset_version=17)
    f = str(tmp / f"{path}.onnx")
    if path == "ortopt":
        so = ort.SessionOptions()
        so.graph_optimization_level, so.optimized_model_filepath = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, f
        ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
    else:
        rng = np.random.default_rng(1)

        class Reader(q.CalibrationDataReader):
            def __init__(self):
                self.data = iter([{"x": rng.standard_normal(args[0].shape).astype(np.float32)} for _ in range(4)])

            def get_next(self):
                return next(self.data, None)

        fmt = q.QuantFormat.QDQ if path == "qdq" else q.QuantFormat.QOperator
        try:  # as onnxruntime's guide says: pre-process, uint8 activations on x86
            quant_pre_process(src, src, skip_symbolic_shape=True)
            q.quantize_static(src, f, Reader(), quant_format=fmt, activation_type=q.QuantType.QUInt8,
                              weight_type=q.QuantType.QInt8)  # fmt: skip
        except Exception as e:
            raise ExportError(f"quantize_static: {str(e).splitlines()[0][:100]}") from e
    x = args[0].numpy()
    ref = ort.InferenceSession(f, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    return f"ok {rel(ember.compile(f, fallback=False)(x), ref):.1e}"


def run(name: str, build, paths: tuple[str, ...], logdir: Path) -> dict[str, str]:
    out = {}
    for path in paths:
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                if path in ("keras", "tflite"):
                    result = keras_path(path, build, Path(tmp))
                elif path in ("ortopt", "qdq", "qop"):
                    result = ort_path(path, build, Path(tmp))
                else:
                    result = torch_path(path, build, Path(tmp))
                out[path] = f"{result} {time.perf_counter() - t0:.0f}s"
            except ExportError as e:
                out[path] = f"export: {e}"
            except DegenerateError as e:
                out[path] = f"degenerate: {e}"
            except Exception as e:
                out[path] = f"FAIL {type(e).__name__}: {str(e).splitlines()[0][:100]}"
                logdir.mkdir(parents=True, exist_ok=True)
                (logdir / f"{name}.{path}.txt").write_text(traceback.format_exc())
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", help="comma-separated model names (--list shows them)")
    p.add_argument("--list", action="store_true")
    p.add_argument("--logdir", default=os.path.join(tempfile.gettempdir(), "ember-new-models"))
    a = p.parse_args()
    table = rows()
    if a.list:
        print("\n".join(f"{n:24} {' '.join(paths)}" for n, (_, paths) in table.items()))
        return
    names = a.only.split(",") if a.only else list(table)
    failed = 0
    for name in names:
        build, paths = table[name]
        results = run(name, build, paths, Path(a.logdir))
        failed += sum(r.startswith("FAIL") for r in results.values())
        print(f"{name:24} " + "  |  ".join(f"{k}: {v}" for k, v in results.items()), flush=True)
    print(f"{failed} failure(s); tracebacks in {a.logdir}" if failed else "no failures")


if __name__ == "__main__":
    main()
