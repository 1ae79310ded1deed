"""Ember against ONNX Runtime and PyTorch eager on whole models, side by side in one run.

    python bench/models.py [--models resnet18,mobilenet_v2,bert4,conv_stack,mlp] [--threads 1,2]
                           [--tuning-log LOG] [--repeat 30] [--cold-compile] [--json]

The models are PyTorch modules (`ember.zoo_torch`: torchvision-style ResNet-18 and MobileNetV2, a
BERT-base-like encoder with 4 layers at sequence 128, 5 x (Conv, BN, ReLU) at 64 channels, an MLP
at batch 64) with random weights, exported to ONNX with torch.onnx. Without torch, the same
architectures come from `ember.zoo` (ONNX built directly) and the torch column is left out.

Per model and thread count: median latency of each system (after warm-up, the systems take turns
in blocks of a few runs, with a pause before each block and its first run not counted, so that
one system's idle worker threads do not steal CPU from the next; ONNX Runtime's threads do not
spin), the ratio to Ember, Ember's compile time, and the max relative difference from onnxruntime.
The last lines give the geometric means of the ratios.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
from collections.abc import Callable

import numpy as np
import onnx

import ember
from ember import zoo
from ember.passes import layout
from ember.runtime.compare import interleaved_medians, onnxruntime_session

try:
    import torch

    from ember import zoo_torch
except ImportError:  # the bench still runs: Ember vs onnxruntime on the zoo's ONNX models
    torch = None


ZOO: dict[str, Callable[[], onnx.ModelProto]] = {
    "resnet18": zoo.resnet18,
    "mobilenet_v2": zoo.mobilenet_v2,
    "bert4": lambda: zoo.bert_encoder(layers=4, seq=128),
    "conv_stack": lambda: zoo.conv_bn_relu_stack(layers=5, channels=64, size=56),
    "mlp": lambda: zoo.mlp(batch=64, features=784, hidden=(1024, 1024)),
}


def build(name: str) -> tuple[onnx.ModelProto, Callable | None, dict[str, np.ndarray]]:
    """(ONNX model, torch callable or None, feeds)."""
    if torch is None:
        model = ZOO[name]()
        return model, None, zoo.random_feeds(model)
    module, args, names = zoo_torch.example(name)  # the PyTorch modules, written in ember.zoo_torch
    model = zoo_torch.to_onnx(module, args, names)
    feeds = {n: a.numpy() for n, a in zip(names, args)}

    def run_torch(*xs):
        with torch.inference_mode():
            return module(*[torch.from_numpy(x) for x in xs])

    return model, run_torch, feeds


def bench_model(name: str, threads: int, repeat: int, tuning_log: str | None) -> dict:
    model, run_torch, feeds = build(name)
    xs = list(feeds.values())
    target = f"c -threads={threads}"
    kwargs = {"tuning_log": tuning_log} if tuning_log else {}
    m = ember.compile(model, target=target, **kwargs)
    sess = onnxruntime_session(model, threads)
    ref = sess.run(None, feeds)
    ours = list(m.run(feeds).values())
    diff = max(float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)) for a, b in zip(ours, ref))
    systems: dict[str, Callable[[], object]] = {"ember": lambda: m(*xs), "onnxruntime": lambda: sess.run(None, feeds)}
    if run_torch is not None:
        torch.set_num_threads(threads)
        systems["torch"] = lambda: run_torch(*xs)
    med = {k: v * 1e3 for k, v in interleaved_medians(systems, repeat).items()}
    s = m.summary()
    return {"ms": med, "ratio": {k: med[k] / med["ember"] for k in med}, "compile_s": s["compile_seconds"],
            "kernels": s["kernels"], "fallback": len(s["fallback_ops"]), "rel_diff": diff}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(ZOO))
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--tuning-log", default=None)
    p.add_argument("--cold-compile", action="store_true",
                   help="also time each model's compile with an empty kernel cache (the compile column is warm)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-winograd", action="store_true",
                   help="3x3 convolutions by the direct template only (ember.passes.layout.WINOGRAD_MIN_GAIN = inf)")
    args = p.parse_args()
    if args.no_winograd:
        layout.WINOGRAD_MIN_GAIN = math.inf
    results: dict = {}
    if args.cold_compile:
        results["cold_compile_s"] = cold = {}
        print("compile with an empty kernel cache (1 thread, untuned):")
        for name in args.models.split(","):
            model = build(name)[0]
            with tempfile.TemporaryDirectory() as d:
                saved = os.environ.get("EMBER_CACHE_DIR")
                os.environ["EMBER_CACHE_DIR"] = d
                try:
                    s = ember.compile(model, target="c -threads=1").summary()
                finally:
                    if saved is None:
                        del os.environ["EMBER_CACHE_DIR"]
                    else:
                        os.environ["EMBER_CACHE_DIR"] = saved
            cold[name] = s["compile_seconds"]
            print(f"  {name:<14} {s['compile_seconds']:6.2f} s  (lower {s['lower_seconds']:.2f} s, "
                  f"C compiler {s['build_seconds']:.2f} s, {s['kernels']} kernels)")  # fmt: skip
    for threads in [int(t) for t in args.threads.split(",")]:
        print(f"\n{threads} thread(s){'  (tuned: ' + args.tuning_log + ')' if args.tuning_log else ''}")
        head = (
            "model",
            "ember ms",
            "ort ms",
            "torch ms",
            "ort/ember",
            "torch/ember",
            "compile s",
            "kernels",
            "rel diff",
        )
        print("{:<14} {:>9} {:>9} {:>9} {:>10} {:>12} {:>10} {:>8} {:>9}".format(*head))
        rows = {}
        for name in args.models.split(","):
            r = bench_model(name, threads, args.repeat, args.tuning_log)
            rows[name] = r
            t = r["ms"].get("torch")
            tr = r["ratio"].get("torch")
            print(f"{name:<14} {r['ms']['ember']:>9.3f} {r['ms']['onnxruntime']:>9.3f} "
                  f"{t if t is not None else float('nan'):>9.3f} {r['ratio']['onnxruntime']:>10.2f} "
                  f"{tr if tr is not None else float('nan'):>12.2f} {r['compile_s']:>10.2f} {r['kernels']:>8} "
                  f"{r['rel_diff']:>9.1e}" + (f"  ({r['fallback']} on ref.)" if r["fallback"] else ""))  # fmt: skip
        for other in ("onnxruntime", "torch"):
            ratios = [r["ratio"][other] for r in rows.values() if other in r["ratio"]]
            if ratios:
                gm = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
                print(f"geometric mean {other}/ember: {gm:.2f}  (> 1: Ember faster; Ember = {1 / gm:.2f} x {other})")
        results[str(threads)] = rows
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
