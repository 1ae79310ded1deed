"""Graph optimizations on and off: the same models compiled at opt_level 0 and 3.

    python bench/fusion.py [--threads N] [--json]

Per model: ONNX node count, kernel count and median latency at each level, the speedup of
level 3 over level 0, and the max relative difference of level 3's outputs from onnxruntime's.
Also ResNet-18's kernel count at level 3 against a third of its ONNX node count.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import onnxruntime as ort

import ember
from ember import zoo

MODELS = {
    "conv_bn_relu_x5 (64ch, 56x56)": lambda: zoo.conv_bn_relu_stack(layers=5, channels=64, size=56),
    "resnet_basic_block (64ch, 56x56)": lambda: zoo.resnet_basic_block(channels=64, size=56),
    "transformer_encoder_layer (seq 128, d 256)": lambda: zoo.transformer_encoder_layer(seq=128, d=256, heads=4,
                                                                                         ff=1024, batch=1),
}  # fmt: skip


def rel_diff(ours: list[np.ndarray], theirs: list[np.ndarray]) -> float:
    return max(float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)) for a, b in zip(ours, theirs))


def run(threads: int | None, repeat: int) -> dict:
    target = "c" if threads is None else f"c -threads={threads}"
    rows = {}
    for name, build in MODELS.items():
        model = build()
        feeds = zoo.random_feeds(model)
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        ref = sess.run(None, feeds)
        row = {"onnx_nodes": len(model.graph.node)}
        for level in (0, 3):
            m = ember.compile(model, target=target, opt_level=level)
            s = m.summary()
            outs = list(m.run(feeds).values())
            r = m.benchmark(list(feeds.values()), repeat=repeat)
            row[f"o{level}"] = {"kernels": s["kernels"], "fallback": len(s["fallback_ops"]), "ms": r["median"] * 1e3,
                                "rel_diff": rel_diff(outs, ref), "compile_s": s["compile_seconds"]}  # fmt: skip
        row["speedup"] = row["o0"]["ms"] / row["o3"]["ms"]
        rows[name] = row
    r18 = zoo.resnet18()
    m = ember.compile(r18, target=target, opt_level=3)
    resnet = {"onnx_nodes": len(r18.graph.node), "kernels_o3": m.summary()["kernels"]}
    resnet["bar_met"] = resnet["kernels_o3"] <= resnet["onnx_nodes"] / 3
    return {"models": rows, "resnet18": resnet, "target": target}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=None, help="threads for Ember (default: all cores)")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    res = run(args.threads, args.repeat)
    print(f"target '{res['target']}'")
    head = ("model", "nodes", "k@O0", "k@O3", "ms@O0", "ms@O3", "O0/O3", "max rel diff")
    print("{:<44} {:>6} {:>5} {:>5} {:>9} {:>9} {:>6} {:>12}".format(*head))
    for name, r in res["models"].items():
        o0, o3 = r["o0"], r["o3"]
        cells = (name, r["onnx_nodes"], o0["kernels"], o3["kernels"], o0["ms"], o3["ms"], r["speedup"], o3["rel_diff"])
        print("{:<44} {:>6} {:>5} {:>5} {:>9.3f} {:>9.3f} {:>6.2f} {:>12.1e}".format(*cells))
        if o0["fallback"] or o3["fallback"]:
            print(f"  (nodes run by the numpy reference: {o0['fallback']} at O0, {o3['fallback']} at O3)")
    rn = res["resnet18"]
    print(f"ResNet-18: {rn['onnx_nodes']} ONNX nodes, {rn['kernels_o3']} kernels at opt_level 3 "
          f"(bar: <= {rn['onnx_nodes'] / 3:.0f}) -> {'met' if rn['bar_met'] else 'NOT met'}")  # fmt: skip
    if args.json:
        print(json.dumps(res))


if __name__ == "__main__":
    main()
