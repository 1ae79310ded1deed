"""Keras models with random weights (MobileNetV2 at 32x32, a transformer block) and a SavedModel directory,
compiled with `ember.compile(model)` through tf2onnx and compared with Keras's own output on random inputs
(max abs error <= 1e-4 of the output's largest magnitude). Skipped without tensorflow and tf2onnx (ember[tf])."""

from __future__ import annotations

import importlib
import importlib.util
import os

import numpy as np
import pytest

import ember

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
pytestmark = pytest.mark.tensorflow  # run apart from the OpenCL tests (tests/conftest.py)
for _module in ("tensorflow", "tf2onnx"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"TensorFlow/Keras models need {_module} (pip install ember[tf])", allow_module_level=True)
from lazy_modules import Lazy, random_batchnorm  # noqa: E402

tf = Lazy("tensorflow")
keras = Lazy("keras")
L = Lazy("keras.layers")


def transformer_block() -> keras.Model:
    x0 = keras.Input((16, 32), batch_size=2)
    h = L.MultiHeadAttention(num_heads=4, key_dim=8)(x0, x0)
    x = L.LayerNormalization(epsilon=1e-6)(x0 + h)
    h = L.Dense(32)(L.Dense(64, activation="gelu")(x))
    return keras.Model(x0, L.LayerNormalization(epsilon=1e-6)(x + h))


def mobilenet_v2() -> keras.Model:
    """Random batch-norm statistics too: with keras's (0 and 1) every activation dies by the last layers and the
    output is a uniform 0.1, which any port gets right."""
    return random_batchnorm(keras.applications.MobileNetV2((32, 32, 3), alpha=0.35, weights=None, classes=10))


def check(model, x: np.ndarray, compiled) -> None:
    ref = np.asarray(model(x, training=False))
    assert ref.std() > 1e-3, "a degenerate test model: its outputs are all alike"
    y = compiled(x)
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def convnext_block() -> keras.Model:
    """A grouped conv (Keras 3 runs it in a function marked for XLA, which grappler does not inline unless told)
    and exact gelu (TF's Erfc, which tf2onnx leaves unconverted)."""
    x0 = keras.Input((8, 8, 16))
    x = L.LayerNormalization(epsilon=1e-6)(L.Conv2D(16, 3, padding="same", groups=4)(x0))
    return keras.Model(x0, x0 + L.Dense(16)(L.Activation("gelu")(L.Dense(48)(x))))


SHAPES = {"transformer_block": (2, 16, 32), "mobilenet_v2": (1, 32, 32, 3), "convnext_block": (1, 8, 8, 16)}


@pytest.mark.parametrize("make", [transformer_block, mobilenet_v2, convnext_block],
                         ids=["transformer", "mobilenet_v2", "convnext_block"])  # fmt: skip
def test_keras_models(make):
    model = make()
    shape = SHAPES[make.__name__]
    x = np.random.default_rng(0).uniform(-1, 1, shape).astype("float32")
    check(model, x, ember.compile(model, fallback=False))


def test_captured_constants_are_weights_not_inputs():
    """A Normalization layer's mean and variance are tensors the traced function captures (EfficientNetV2's
    first layer): they become constants of the model, not inputs the caller must feed."""
    x0 = keras.Input((6,), batch_size=2)
    norm = L.Normalization(mean=np.linspace(-1, 1, 6), variance=np.linspace(0.5, 2, 6))
    model = keras.Model(x0, L.Dense(3)(norm(x0)))
    from ember.frontend.tensorflow import to_onnx

    assert [i.name for i in to_onnx(model).graph.input] == [x0.name]
    x = np.random.default_rng(2).uniform(-1, 1, (2, 6)).astype("float32")
    check(model, x, ember.compile(model, fallback=False))


def test_saved_model_directory(tmp_path):
    x0 = keras.Input((8,))
    model = keras.Model(x0, L.Dense(4, activation="sigmoid")(L.Dense(16, activation="relu")(x0)))
    model.export(str(tmp_path / "sm"))
    x = np.random.default_rng(1).uniform(-1, 1, (1, 8)).astype("float32")
    m = ember.compile(str(tmp_path / "sm"))
    y = m(x)
    ref = np.asarray(model(x))
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_unconvertible_tf_op_is_named():
    from ember.frontend.onnx_importer import UnsupportedOperatorError

    x0 = keras.Input((8,), batch_size=1)
    y = L.Lambda(lambda t: tf.raw_ops.Betainc(a=t, b=t, x=t))(x0)
    with pytest.raises(UnsupportedOperatorError, match="Betainc"):
        ember.compile(keras.Model(x0, y))


def test_debug_through_onnxruntime():
    from ember.debug import debug

    report = debug(transformer_block(), reference="onnxruntime")
    assert sum(r.error is not None for r in report.rows) >= 20
    assert report.first_bad is None, report.table()
