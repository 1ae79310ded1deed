"""What the TensorFlow and TFLite tests share: modules imported on first use (TensorFlow must not load in a process
that only collects them: it breaks PoCL's OpenCL compiler there, so nothing imports it before a test runs), and
random batch-norm statistics for their Keras models."""

from __future__ import annotations

import importlib


class Lazy:
    """A module imported on first use of one of its attributes."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, attr: str):
        if attr.startswith(("_", "pytest")):  # what pytest asks of module attributes while collecting
            raise AttributeError(attr)
        return getattr(importlib.import_module(self.name), attr)


def random_batchnorm(model, seed: int = 0):
    """`model` with random batch-norm statistics: Keras initializes them to 0 and 1, with which activations die by
    the last layers (a uniform output any port gets right) and layout mistakes hide."""
    import numpy as np

    layers = importlib.import_module("keras.layers")
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, layers.BatchNormalization):
            *affine, m, v = layer.get_weights()  # gamma and beta unless built without scale or center
            fresh = [rng.uniform(0.5, 1.5, a.shape) if k == 0 and layer.scale else rng.normal(0, 0.1, a.shape)
                     for k, a in enumerate(affine)]  # fmt: skip
            layer.set_weights([*fresh, rng.normal(0, 0.1, m.shape), rng.uniform(0.5, 1.5, v.shape)])
    return model
