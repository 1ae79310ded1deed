"""Pooling kept in the blocked layout (PoolNCHWc) vs onnxruntime's NCHW pooling, on SqueezeNet/ResNet/VGG shapes.

Ember compiles 1x1 conv -> relu -> pool (the conv makes the blocked layout the pool then stays in) and the
pool's kernel time is read from `profile()`; onnxruntime times the pool alone on the same NCHW input (the
relu'd conv output, hot in the caches: "ort ms"), and its pool node inside the same conv -> relu -> pool model
from its profiler ("ort in-model", the input just written by the conv, as Ember's; "ort-m/ember" compares
those two). GFLOP/s count one operation per window element; GB/s the input and output bytes.
`python bench/pool_nchwc.py [--threads 1] [--repeat 30]`."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import ember

CASES = {  # name: (op, channels, map size, attrs)
    "squeezenet pool1": ("MaxPool", 96, 109, {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "squeezenet pool3": ("MaxPool", 256, 54, {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "squeezenet pool5": ("MaxPool", 512, 27, {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "resnet maxpool": ("MaxPool", 64, 112, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "vgg maxpool": ("MaxPool", 128, 112, {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "avg 3x3 pad ceil": ("AveragePool", 256, 28, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                                                  "ceil_mode": 1}),  # fmt: skip
    "dilated max": ("MaxPool", 128, 56, {"kernel_shape": [3, 3], "strides": [1, 1], "dilations": [2, 2],
                                         "pads": [2, 2, 2, 2]}),  # fmt: skip
}


def model(op: str, c: int, hw: int, attrs: dict, out_shape, with_conv: bool):
    nodes = [helper.make_node(op, ["r" if with_conv else "x"], ["y"], **attrs)]
    inits = []
    if with_conv:
        w = (np.random.default_rng(0).standard_normal((c, c, 1, 1)) / np.sqrt(c)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, "w"))
        nodes[:0] = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
                     helper.make_node("Relu", ["c"], ["r"])]  # fmt: skip
    g = helper.make_graph(nodes, "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])


def ort_in_model(model, x: np.ndarray, threads: int, repeat: int) -> float:
    """Median seconds of the pooling node of `model` in onnxruntime's profile over `repeat` runs."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.enable_profiling = True
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    for _ in range(repeat + 2):
        sess.run(None, {"x": x})
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.remove(path)
    durs = [e["dur"] for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
            and "Pool" in e.get("args", {}).get("op_name", "")]  # fmt: skip
    return statistics.median(durs[2:] or durs) * 1e-6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=30)
    args = ap.parse_args()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    print(f"pooling, batch 1, {args.threads} thread(s), medians: Ember's PoolNCHWc kernel vs onnxruntime's pool")
    print(f"{'case':18} {'C,HW':>9} {'ember ms':>9} {'ort ms':>8} {'ort/ember':>9} {'ort in-model':>12} "
          f"{'ort-m/ember':>11} {'GFLOP/s':>8} {'GB/s':>6} {'rel err':>8}")  # fmt: skip
    for name, (op, c, hw, attrs) in CASES.items():
        x = np.maximum(np.random.default_rng(1).standard_normal((1, c, hw, hw)), 0).astype(np.float32)
        alone = model(op, c, hw, attrs, ("n", "c", "h", "w"), with_conv=False)
        sess = ort.InferenceSession(alone.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        shape = sess.run(None, {"x": x})[0].shape
        sess = ort.InferenceSession(model(op, c, hw, attrs, shape, False).SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])  # fmt: skip
        full = model(op, c, hw, attrs, shape, with_conv=True)
        m = ember.compile(full, target=f"c -threads={args.threads}", fallback=False)
        full_ref = ort.InferenceSession(full.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        ref = full_ref.run(None, {"x": x})[0]
        err = float(np.abs(m(x) - ref).max() / np.abs(ref).max())
        rows = [r for r in m.profile({"x": x}, repeat=args.repeat) if any("Pool" in o for o in r["ops"])]
        if len(rows) != 1:
            raise RuntimeError(f"{name}: expected one pooling kernel, got {[r['ops'] for r in rows]}")
        e = rows[0]["seconds"]
        runs = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            sess.run(None, {"x": x})
            runs.append(time.perf_counter() - t0)
        o = statistics.median(runs)
        om = ort_in_model(full, x, args.threads, args.repeat)
        k = int(np.prod(attrs["kernel_shape"]))
        flops = k * int(np.prod(shape))
        nbytes = 4 * (x.size + int(np.prod(shape)))
        print(f"{name:18} {f'{c},{hw}':>9} {e * 1e3:9.3f} {o * 1e3:8.3f} {o / e:9.2f} {om * 1e3:12.3f} {om / e:11.2f} "
              f"{flops / e / 1e9:8.1f} {nbytes / e / 1e9:6.1f} {err:8.1e}")  # fmt: skip
    print("ort/ember > 1: Ember's kernel is faster (onnxruntime's time includes its session call overhead)")


if __name__ == "__main__":
    main()
