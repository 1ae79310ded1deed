"""The accuracy check on real data: a small CNN trained (numpy, in a fixture) on scikit-learn's digits, quantized
to int8 with 100 calibration images, loses at most 1 point of held-out accuracy, run by onnxruntime and by Ember."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from numpy.lib.stride_tricks import sliding_window_view
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.quantization import quantize_model

BATCH = 20


def im2col(x: np.ndarray) -> np.ndarray:
    """3x3 patches of a zero-padded NCHW batch: (N*H*W, C*9), in the order of a (O, C, 3, 3) weight."""
    n, c, h, w = x.shape
    windows = sliding_window_view(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3))
    return windows.transpose(0, 2, 3, 1, 4, 5).reshape(n * h * w, c * 9)


def col2im(cols: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    n, c, h, w = shape
    patches = cols.reshape(n, h, w, c, 3, 3)
    out = np.zeros((n, c, h + 2, w + 2), cols.dtype)
    for i in range(3):
        for j in range(3):
            out[:, :, i : i + h, j : j + w] += patches[..., i, j].transpose(0, 3, 1, 2)
    return out[:, :, 1:-1, 1:-1]


class DigitsCNN:
    """conv 3x3 (1 -> 8) + relu, maxpool 2x2, conv 3x3 (8 -> 16) + relu, flatten, dense 256 -> 10."""

    def __init__(self, rng: np.random.Generator):
        def init(*shape):
            return (rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))).astype(np.float32)

        self.p = {"w1": init(8, 1, 3, 3), "b1": np.zeros(8, np.float32), "w2": init(16, 8, 3, 3),
                  "b2": np.zeros(16, np.float32), "w3": init(10, 256), "b3": np.zeros(10, np.float32)}  # fmt: skip

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, dict]:
        p, n = self.p, len(x)
        c1 = im2col(x)
        a1 = np.maximum(c1 @ p["w1"].reshape(8, -1).T + p["b1"], 0).reshape(n, 8, 8, 8).transpose(0, 3, 1, 2)
        blocks = a1.reshape(n, 8, 4, 2, 4, 2)
        pooled = blocks.max(axis=(3, 5))
        c2 = im2col(pooled)
        z2 = c2 @ p["w2"].reshape(16, -1).T + p["b2"]
        a2 = np.maximum(z2, 0).reshape(n, 4, 4, 16).transpose(0, 3, 1, 2)
        flat = a2.reshape(n, 256)
        logits = flat @ p["w3"].T + p["b3"]
        return logits, {"c1": c1, "a1": a1, "blocks": blocks, "pooled": pooled, "c2": c2, "z2": z2, "flat": flat}

    def gradients(self, x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
        p, n = self.p, len(x)
        logits, t = self.forward(x)
        prob = np.exp(logits - logits.max(axis=1, keepdims=True))
        prob /= prob.sum(axis=1, keepdims=True)
        d = prob
        d[np.arange(n), y] -= 1
        d /= n
        g = {"w3": d.T @ t["flat"], "b3": d.sum(axis=0)}
        da2 = (d @ p["w3"]).reshape(n, 16, 4, 4).transpose(0, 2, 3, 1).reshape(-1, 16) * (t["z2"] > 0)
        g["w2"], g["b2"] = (da2.T @ t["c2"]).reshape(p["w2"].shape), da2.sum(axis=0)
        dpool = col2im(da2 @ p["w2"].reshape(16, -1), t["pooled"].shape)
        mask = t["blocks"] == t["pooled"][:, :, :, None, :, None]
        da1 = (mask * dpool[:, :, :, None, :, None]).reshape(n, 8, 8, 8)
        dz1 = da1.transpose(0, 2, 3, 1).reshape(-1, 8) * (t["a1"].transpose(0, 2, 3, 1).reshape(-1, 8) > 0)
        g["w1"], g["b1"] = (dz1.T @ t["c1"]).reshape(p["w1"].shape), dz1.sum(axis=0)
        return g

    def train(self, x: np.ndarray, y: np.ndarray, rng: np.random.Generator, epochs: int = 25, lr: float = 3e-3):
        """Adam on mini-batches of 32."""
        m = {k: np.zeros_like(v) for k, v in self.p.items()}
        v = {k: np.zeros_like(a) for k, a in self.p.items()}
        step = 0
        for _ in range(epochs):
            order = rng.permutation(len(x))
            for i in range(0, len(x), 32):
                idx = order[i : i + 32]
                step += 1
                for k, g in self.gradients(x[idx], y[idx]).items():
                    m[k] = 0.9 * m[k] + 0.1 * g
                    v[k] = 0.999 * v[k] + 0.001 * g * g
                    mh, vh = m[k] / (1 - 0.9**step), v[k] / (1 - 0.999**step)
                    self.p[k] -= (lr * mh / (np.sqrt(vh) + 1e-8)).astype(np.float32)

    def onnx(self) -> onnx.ModelProto:
        p = self.p
        nodes = [
            helper.make_node("Conv", ["image", "w1", "b1"], ["conv1"], name="conv1", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["conv1"], ["relu1"], name="relu1"),
            helper.make_node("MaxPool", ["relu1"], ["pool1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
            helper.make_node("Conv", ["pool1", "w2", "b2"], ["conv2"], name="conv2", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["conv2"], ["relu2"], name="relu2"),
            helper.make_node("Flatten", ["relu2"], ["flat"], name="flatten"),
            helper.make_node("Gemm", ["flat", "w3", "b3"], ["logits"], name="dense", transB=1),
        ]
        graph = helper.make_graph(nodes, "digits_cnn",
                                  [helper.make_tensor_value_info("image", TensorProto.FLOAT, [BATCH, 1, 8, 8])],
                                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [BATCH, 10])],
                                  [numpy_helper.from_array(a, k) for k, a in p.items()])  # fmt: skip
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        onnx.checker.check_model(model, full_check=True)
        return model


@pytest.fixture(scope="module")
def digits():
    """(float model, calibration samples, held-out images, held-out labels)."""
    datasets = pytest.importorskip("sklearn.datasets", reason="scikit-learn ships the digits data set")
    data = datasets.load_digits()
    x = (data.images / 16.0).astype(np.float32)[:, None]
    y = data.target
    rng = np.random.default_rng(0)
    order = rng.permutation(len(x))
    train, test = order[:1200], order[1200:1780]  # 580 held-out images
    net = DigitsCNN(rng)
    net.train(x[train], y[train], rng)
    calibration = x[train[:100]]  # 100 training images
    samples = [{"image": calibration[i : i + BATCH]} for i in range(0, 100, BATCH)]
    return net.onnx(), samples, x[test], y[test]


def accuracy(run, images: np.ndarray, labels: np.ndarray) -> float:
    preds = np.concatenate([run(images[i : i + BATCH]).argmax(axis=1) for i in range(0, len(images), BATCH)])
    return float(np.mean(preds == labels))


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy"])
def test_int8_loses_at_most_one_point_on_digits(digits, method, capsys):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime runs the float and int8 models")
    model, samples, images, labels = digits
    result = quantize_model(model, samples, method=method, report_samples=2)
    q = result.model
    assert all(x.quantized for x in result.report.layers) and len(result.report.layers) == 3

    def ort_runner(m):
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        return lambda batch: sess.run(None, {"image": batch})[0]

    compiled = ember.compile(q)
    float_acc = accuracy(ort_runner(model), images, labels)
    int8_ort = accuracy(ort_runner(q), images, labels)
    int8_ember = accuracy(lambda batch: compiled(batch), images, labels)
    with capsys.disabled():
        print(f"\ndigits CNN, {len(labels)} held-out images, {method}: float {float_acc:.2%}, "
              f"int8 onnxruntime {int8_ort:.2%}, int8 Ember {int8_ember:.2%}")  # fmt: skip
    assert float_acc > 0.93  # the network learned the task
    assert float_acc - int8_ort <= 0.01
    assert float_acc - int8_ember <= 0.01
