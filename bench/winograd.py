"""Winograd F(4x4, 3x3) vs the direct NCHWc template vs onnxruntime, per 3x3 layer of ResNet-18 and VGG-16.

Each layer is one Conv (3x3, stride 1, pad 1) + bias + Relu model at batch 1. Ember is compiled twice: with
the layout pass's choice forced to the direct template (`WINOGRAD_MIN_GAIN = inf`) and to Winograd (0);
"chosen" says which one `winograd_gain` picks by default. GFLOP/s count the direct convolution's
2*C*K*9*OH*OW; medians of interleaved rounds. `python bench/winograd.py [--threads 1] [--repeat 20]`."""

from __future__ import annotations

import argparse
import math
import statistics

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.passes import layout
from ember.runtime.compare import timed
from ember.templates.winograd import winograd_gain

LAYERS = {  # name: (channels in, out, map size)
    "resnet18 conv2_x": (64, 64, 56),
    "resnet18 conv3_x": (128, 128, 28),
    "resnet18 conv4_x": (256, 256, 14),
    "resnet18 conv5_x": (512, 512, 7),
    "vgg16 conv1_2": (64, 64, 224),
    "vgg16 conv2_2": (128, 128, 112),
    "vgg16 conv3_2": (256, 256, 56),
    "vgg16 conv4_2": (512, 512, 28),
    "vgg16 conv5_2": (512, 512, 14),
}


def conv_model(c: int, k: int, hw: int):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((k, c, 3, 3)) / math.sqrt(9 * c)).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
             helper.make_node("Relu", ["c"], ["y"])]  # fmt: skip
    g = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, k, hw, hw])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def compile_with(model, threads: int, min_gain: float):
    saved = layout.WINOGRAD_MIN_GAIN
    layout.WINOGRAD_MIN_GAIN = min_gain
    try:
        return ember.compile(model, target=f"c -threads={threads}", fallback=False)
    finally:
        layout.WINOGRAD_MIN_GAIN = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--layers", nargs="*", default=list(LAYERS))
    args = ap.parse_args()
    print(f"3x3 conv + bias + relu, batch 1, {args.threads} thread(s), medians; GFLOP/s of the direct convolution")
    heads = [("layer", 18), ("C,K,HW", 13), ("direct ms", 9), ("wino ms", 8), ("ort ms", 8), ("dir GF/s", 8),
             ("wino GF/s", 9), ("ort GF/s", 8), ("wino/dir", 8), ("wino/ort", 8), ("gain est", 8), ("rel err", 8)]
    print(" ".join(f"{h:<{n}}" if i == 0 else f"{h:>{n}}" for i, (h, n) in enumerate(heads)))
    for name in args.layers:
        c, k, hw = LAYERS[name]
        model = conv_model(c, k, hw)
        x = np.random.default_rng(1).standard_normal((1, c, hw, hw)).astype(np.float32)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        ref = sess.run(None, {"x": x})[0]
        direct, wino = compile_with(model, args.threads, math.inf), compile_with(model, args.threads, 0.0)
        err = float(np.abs(wino(x) - ref).max() / np.abs(ref).max())
        runs = {"d": [], "w": [], "o": []}
        per = max(1, args.repeat // 4)
        for _ in range(4):
            runs["d"] += direct.benchmark([x], repeat=per, warmup=1)["runs"]
            runs["w"] += wino.benchmark([x], repeat=per, warmup=1)["runs"]
            runs["o"] += timed(lambda s=sess, f={"x": x}: s.run(None, f), per)
        d, w, o = (statistics.median(runs[key]) for key in "dwo")
        gf = 2 * c * k * 9 * hw * hw / 1e9
        print(f"{name:18} {f'{c},{k},{hw}':>13} {d * 1e3:9.2f} {w * 1e3:8.2f} {o * 1e3:8.2f} {gf / d:8.1f} "
              f"{gf / w:9.1f} {gf / o:8.1f} {d / w:8.2f} {o / w:8.2f} {winograd_gain(1, c, k, (hw, hw)):8.2f} "
              f"{err:8.1e}")  # fmt: skip
    print("wino/dir, wino/ort > 1: Winograd is faster; gain est: the layout pass's estimate (Winograd from "
          f"{layout.WINOGRAD_MIN_GAIN})")


if __name__ == "__main__":
    main()
