"""Winograd F(4x4, 3x3) vs the direct NCHWc template vs onnxruntime, per 3x3 layer of ResNet-18 and VGG-16.

Each layer is one Conv (3x3, stride 1, pad 1) + bias + Relu model at batch 1. Ember is compiled twice: with
the layout pass's choice forced to the direct template (`WINOGRAD_MIN_GAIN = inf`) and to Winograd (0);
"chosen" says which one `winograd_gain` picks by default. GFLOP/s count the direct convolution's
2*C*K*9*OH*OW; medians of interleaved rounds. `python bench/winograd.py [--threads 1] [--repeat 20]`.

`--sweep` times a grid instead (maps of 56, 28, 14 and 7, C = K from 64 to 512, 1 thread, process CPU time,
`--batch`): the direct template, each Winograd tile size forced, the layout pass's default choice and
onnxruntime (io-binding), all called without argument checks, in turns (`interleaved_medians`).
`--shapes C,K,HW ...` times those layers instead of the grid (`--zoo-layers`: the 3x3 stride-1 layers of
SqueezeNet and GoogLeNet, whose small squeeze widths the square grid does not cover).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.passes import layout
from ember.runtime.compare import interleaved_medians, timed
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


def conv_model(c: int, k: int, hw: int, batch: int = 1):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((k, c, 3, 3)) / math.sqrt(9 * c)).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
             helper.make_node("Relu", ["c"], ["y"])]  # fmt: skip
    g = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, c, hw, hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, k, hw, hw])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def compile_with(model, threads: int, min_gain: float):
    os.environ["EMBER_COMPILE_CACHE"] = "0"  # the forced choice is a module setting, not part of the cache's key
    saved = layout.WINOGRAD_MIN_GAIN
    layout.WINOGRAD_MIN_GAIN = min_gain
    try:
        return ember.compile(model, target=f"c -threads={threads}", fallback=False)
    finally:
        layout.WINOGRAD_MIN_GAIN = saved


SWEEP_SIZES = (56, 28, 14, 7)
ZOO_LAYERS = (  # (C, K, HW): SqueezeNet 1.1's expand 3x3 layers, 1.0's at 54 and 27, GoogLeNet's 3x3 branches
    (16, 64, 55), (32, 128, 27), (48, 192, 13), (64, 256, 13), (16, 64, 54), (32, 128, 54), (48, 192, 27),
    (64, 256, 27), (96, 128, 28), (128, 192, 28), (16, 32, 28), (32, 96, 28), (112, 224, 14), (160, 320, 7),
    (24, 64, 14), (48, 128, 7), (64, 192, 56))
SWEEP_CHANNELS = (64, 128, 256, 512)


def _unchecked(m, x: np.ndarray):
    """A call of compiled model m on x without the per-call input checks (a one-conv model's checks cost about
    as much as a 7x7 layer's kernel)."""
    arrays = [x]
    with m._calls():
        m._start(arrays)
    return lambda: m._execute(arrays)


def _ort_call(model, x: np.ndarray, threads: int):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    ref = sess.run(None, {"x": x})[0]
    y = np.zeros_like(ref)
    binding = sess.io_binding()
    binding.bind_cpu_input("x", x)
    binding.bind_output("y", "cpu", 0, np.float32, y.shape, y.ctypes.data)
    return ref, lambda out=y: sess.run_with_iobinding(binding)  # out: y lives as long as the call


def _compile_tile(model, threads: int, tile: int | None):
    """Ember with Winograd forced at output tile `tile` (None: the direct template)."""
    if tile is None:
        return compile_with(model, threads, math.inf)
    saved = getattr(layout, "WINOGRAD_TILE", None)
    layout.WINOGRAD_TILE = tile
    try:
        return compile_with(model, threads, 0.0)
    finally:
        layout.WINOGRAD_TILE = saved


def sweep(args) -> None:
    tiles = [int(t) for t in args.tiles.split(",") if t] if hasattr(layout, "WINOGRAD_TILE") else [4]
    names = ["direct"] + [f"F{t}" for t in tiles] + ["chosen", "ort"]
    print(f"3x3 conv + bias + relu, batch {args.batch}, {args.threads} thread(s), process CPU time, medians (ms); "
          "GFLOP/s of the direct convolution for the chosen one")
    print(f"{'C':>4} {'K':>4} {'HW':>3} " + " ".join(f"{n:>7}" for n in names) + f" {'GF/s':>6} {'best/dir':>8} "
          f"{'chosen/ort':>10} {'rel err':>8}")
    clock = time.process_time
    shapes = [tuple(int(v) for v in sh.split(",")) for sh in args.shapes] if args.shapes else []
    if args.zoo_layers:
        shapes += list(ZOO_LAYERS)
    for c, k, hw in shapes or [(c, c, hw) for hw in args.sizes for c in args.channels]:
        model = conv_model(c, k, hw, batch=args.batch)
        x = np.random.default_rng(1).standard_normal((args.batch, c, hw, hw)).astype(np.float32)
        ref, ort_fn = _ort_call(model, x, args.threads)
        systems, err = {}, 0.0
        for n, t in zip(names[:-2], [None, *tiles]):
            m = _compile_tile(model, args.threads, t)
            err = max(err, float(np.abs(m(x) - ref).max() / np.abs(ref).max()))
            systems[n] = _unchecked(m, x)
        chosen = compile_with(model, args.threads, layout.WINOGRAD_MIN_GAIN)
        err = max(err, float(np.abs(chosen(x) - ref).max() / np.abs(ref).max()))
        systems["chosen"], systems["ort"] = _unchecked(chosen, x), ort_fn
        med = interleaved_medians(systems, args.repeat, clock=clock)
        gf = 2 * args.batch * c * k * 9 * hw * hw / 1e9
        best = min(med[n] for n in names[1:-2])
        print(f"{c:>4} {k:>4} {hw:>3} " + " ".join(f"{med[n] * 1e3:7.3f}" for n in names)
              + f" {gf / med['chosen']:6.1f} {med['direct'] / best:8.2f} {med['ort'] / med['chosen']:10.2f}"
              f" {err:8.1e}", flush=True)  # fmt: skip
    print("best/dir: the direct template's time over the fastest Winograd's; chosen/ort > 1: Ember's choice is faster")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sweep", action="store_true", help="the grid of map sizes x channels (1 thread, CPU time)")
    ap.add_argument("--sizes", type=int, nargs="*", default=list(SWEEP_SIZES))
    ap.add_argument("--channels", type=int, nargs="*", default=list(SWEEP_CHANNELS))
    ap.add_argument("--shapes", nargs="*", default=[], help="C,K,HW layers to sweep instead of the grid")
    ap.add_argument("--zoo-layers", action="store_true", help="sweep the 3x3 layers of SqueezeNet and GoogLeNet")
    ap.add_argument("--tiles", default="2,4", help="Winograd output tiles forced in the sweep")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--layers", nargs="*", default=list(LAYERS))
    args = ap.parse_args()
    if args.sweep or args.shapes or args.zoo_layers:
        sweep(args)
        return
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
