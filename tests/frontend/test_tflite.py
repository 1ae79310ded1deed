"""TFLite models made here with the TFLite converter from small Keras models with random weights (a CNN, a
MobileNetV2 and a MobileNetV3-Small at 32x32, a MobileBERT-style transformer block), float32 and int8 (full-integer
quantization from a representative dataset), compiled by `ember.compile("model.tflite")` and compared with the
TFLite interpreter's reference kernels on random inputs.

Float: max abs error <= 1e-4 of the output's largest magnitude. Int8: every output within one quantization step
of TFLite's (Ember requantizes in float with round-half-even, TFLite in fixed point: ties can round apart).
Skipped without tensorflow (the converter and the interpreter) and tflite (the flatbuffer reader)."""

from __future__ import annotations

import importlib
import importlib.util
import os

import numpy as np
import pytest

import ember

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
pytestmark = pytest.mark.tensorflow  # run apart from the OpenCL tests (tests/conftest.py)
if importlib.util.find_spec("tflite") is None:
    pytest.skip("reading .tflite files needs the tflite package (pip install ember[tflite])", allow_module_level=True)
if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("the TFLite converter and interpreter come with tensorflow (ember[tf])", allow_module_level=True)
from lazy_modules import Lazy, random_batchnorm  # noqa: E402

tf = Lazy("tensorflow")
keras = Lazy("keras")


def small_cnn() -> keras.Model:
    L = keras.layers
    x0 = keras.Input((16, 16, 3), batch_size=1)
    x = L.Conv2D(8, 3, strides=2, padding="same", activation="relu")(x0)
    a = L.DepthwiseConv2D(3, padding="same", depth_multiplier=2)(x)
    b = L.Conv2D(16, 1, activation="hard_swish")(x)
    x = L.Add()([a, b])
    x = L.BatchNormalization()(x)
    x = L.Concatenate()([x, L.MaxPooling2D(1)(x)])
    x = L.ZeroPadding2D(((1, 0), (0, 1)))(x)
    x = L.Conv2D(8, 3, padding="valid", activation="relu6")(x)
    x = L.UpSampling2D(2, interpolation="bilinear")(x)
    x = L.AveragePooling2D(2)(x)
    x = L.Multiply()([x, L.Activation("sigmoid")(L.GlobalAveragePooling2D(keepdims=True)(x))])
    x = L.Flatten()(x)
    x = L.Dense(16, activation="tanh")(x)
    return random_batchnorm(keras.Model(x0, L.Softmax()(L.Dense(10)(x))))


def mobilenet_v2() -> keras.Model:
    return random_batchnorm(keras.applications.MobileNetV2((32, 32, 3), alpha=0.35, weights=None, classes=10))


def mobilenet_v3() -> keras.Model:
    return random_batchnorm(keras.applications.MobileNetV3Small((32, 32, 3), alpha=0.75, weights=None, classes=10,
                                                          include_preprocessing=False))  # fmt: skip


def transformer_block() -> keras.Model:
    """MobileBERT's pieces: an embedding (GATHER), attention (FULLY_CONNECTED, BATCH_MATMUL, SOFTMAX), layer norm
    (MEAN, SQUARED_DIFFERENCE, RSQRT), gelu, residual adds."""
    L = keras.layers
    ids = keras.Input((16,), batch_size=1, dtype="int32")
    x = L.Embedding(100, 32)(ids)
    h = L.MultiHeadAttention(num_heads=4, key_dim=8)(x, x)
    x = L.LayerNormalization()(x + h)
    h = L.Dense(32)(L.Dense(64, activation="gelu")(x))
    return keras.Model(ids, L.LayerNormalization()(x + h))


def convnext_block() -> keras.Model:
    """ConvNeXt's block with the batch left dynamic (as keras.applications build it): a grouped conv, layer norm,
    dense layers on a 4-d tensor (TF's Tensordot: the converter packs products of SHAPE slices for its reshapes and
    records placeholder shapes for their outputs), exact gelu."""
    L = keras.layers
    x0 = keras.Input((8, 8, 16))
    x = L.Conv2D(16, 3, padding="same", groups=4)(x0)
    x = L.LayerNormalization(epsilon=1e-6)(x)
    x = L.Dense(16)(L.Activation("gelu")(L.Dense(48)(x)))
    return keras.Model(x0, x0 + x)


MODELS = {"small_cnn": small_cnn, "mobilenet_v2": mobilenet_v2, "mobilenet_v3": mobilenet_v3,
          "transformer": transformer_block, "convnext_block": convnext_block}  # fmt: skip


def _inputs(model: keras.Model, rng: np.random.Generator) -> list[np.ndarray]:
    out = []
    for t in model.inputs:
        shape = tuple(d or 1 for d in t.shape)
        out.append(rng.integers(0, 100, shape).astype("int32") if "int" in str(t.dtype) else
                   rng.uniform(-1, 1, shape).astype("float32"))  # fmt: skip
    return out


def to_tflite(model: keras.Model, path, int8: bool) -> str:
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    if int8:
        rng = np.random.default_rng(1)
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = lambda: ([x] for x in (_inputs(model, rng)[0] for _ in range(16)))
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        conv.inference_input_type = conv.inference_output_type = tf.int8
    path.write_bytes(conv.convert())
    return str(path)


def interpret(path: str, x: np.ndarray) -> np.ndarray:
    """TFLite's reference kernels (no XNNPACK delegate: its float kernels reassociate sums)."""
    it = tf.lite.Interpreter(model_path=path,
                             experimental_op_resolver_type=tf.lite.experimental.OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


def quantize_input(path: str, x: np.ndarray) -> np.ndarray:
    it = tf.lite.Interpreter(model_path=path)
    d = it.get_input_details()[0]
    if d["dtype"] != np.int8:
        return x
    scale, zp = d["quantization"]
    return np.clip(np.round(x / scale) + zp, -128, 127).astype(np.int8)


@pytest.mark.parametrize("int8", [False, True], ids=["float32", "int8"])
@pytest.mark.parametrize("name", list(MODELS))
def test_tflite_models(name, int8, tmp_path):
    if int8 and name in ("transformer", "mobilenet_v3", "convnext_block"):
        pytest.skip("int8 runs: the small CNN and MobileNetV2 (each compile of a quantized network takes a minute)")
    model = MODELS[name]()
    path = to_tflite(model, tmp_path / f"{name}.tflite", int8)
    x = quantize_input(path, _inputs(model, np.random.default_rng(2))[0])
    ref = interpret(path, x)
    m = ember.compile(path, fallback=False)
    y = m(x)
    assert y.dtype == ref.dtype and y.shape == ref.shape
    assert ref.astype(np.float64).std() > (0.5 if int8 else 1e-3), "a degenerate test model: its outputs are alike"
    if int8:
        diff = np.abs(y.astype(np.int32) - ref.astype(np.int32))
        assert diff.max() <= 1, f"{diff.max()} quantization steps apart ({(diff > 1).sum()} of {diff.size} outputs)"
    else:
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_nhwc_converted_once(tmp_path):
    """A chain of convolutions and elementwise ops stays NCHW: one transpose in, one out."""
    path = to_tflite(small_cnn(), tmp_path / "cnn.tflite", int8=False)
    from ember.frontend.tflite import from_tflite

    g = from_tflite(path)
    transposes = [n for n in g.nodes if n.op == "Transpose"]
    assert len(transposes) == 2, [n.attrs["perm"] for n in transposes]  # the input, then before Flatten
    assert g.inputs[0].shape == (1, 16, 16, 3) and g.outputs[0].shape == (1, 10)


def test_unsupported_ops_listed_at_once(tmp_path):
    from ember.frontend.onnx_importer import UnsupportedOperatorError

    x0 = keras.Input((8,), batch_size=1)
    y = keras.layers.Lambda(lambda t: tf.math.cumsum(tf.math.sin(t), axis=-1))(x0)
    path = to_tflite(keras.Model(x0, y), tmp_path / "odd.tflite", int8=False)
    with pytest.raises(UnsupportedOperatorError) as e:
        ember.compile(path)
    assert "CUMSUM" in str(e.value) and "SIN" in str(e.value)


def test_bad_file(tmp_path):
    from ember.frontend.onnx_importer import ModelError

    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"not a flatbuffer at all")
    with pytest.raises(ModelError, match="not a TFLite model"):
        ember.compile(str(bad))


def test_debug_against_the_interpreter(tmp_path):
    """`ember debug` with TFLite's interpreter as the reference: every TFLite tensor compared (NCHW ones
    transposed). Float: none past 1e-4. Int8: each op rounds within one step of TFLite's, but one-step differences
    grow through the layers (4 steps at this CNN's logits, 1 after its softmax), so only the first layer's output
    is held to one step here."""
    from ember.debug import debug

    report = debug(to_tflite(small_cnn(), tmp_path / "cnn.tflite", int8=False))
    assert report.reference == "tflite" and report.first_bad is None, report.table()
    assert sum(r.error is not None for r in report.rows) >= 15
    report = debug(to_tflite(small_cnn(), tmp_path / "cnn8.tflite", int8=True))
    compared = [r for r in report.rows if r.error is not None]
    assert len(compared) >= 15 and all(r.integer for r in compared)
    assert compared[0].error <= 1 and compared[-1].error <= 1, report.table()
