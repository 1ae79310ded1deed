"""Compile time against graph size: elementwise chains of 1k, 3k and 10k nodes and ResNet-50, cold, warm and cached.

    python bench/compile_time.py [--sizes 1000 3000 10000] [--no-resnet] [--image 224] [--target c] [--json]

Cold: an empty EMBER_CACHE_DIR (a fresh temporary directory), so every kernel goes through the C compiler;
warm: the same compile again with the whole-model cache off (EMBER_COMPILE_CACHE=0): import, passes and lowering
run again, the kernels are found in the kernel cache; cached: the same compile with the whole-model cache on, which
finds the model the cold compile stored and only loads it (`runtime.compile_cache`). `growth` is a chain's cold
time over the previous size's, beside the ratio of their sizes: linear-time compiles keep the two close (quadratic
ones square the size ratio). `s / 1k nodes` is the cold time per thousand ONNX nodes.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import ember
from ember import zoo


def timed_compile(model, target: str, whole_model_cache: bool = True) -> tuple[float, dict]:
    os.environ["EMBER_COMPILE_CACHE"] = "1" if whole_model_cache else "0"
    t0 = time.perf_counter()
    m = ember.compile(model, target=target)
    return time.perf_counter() - t0, m.summary()


def measure(name: str, model, nodes: int, target: str) -> dict:
    saved = {k: os.environ.get(k) for k in ("EMBER_CACHE_DIR", "EMBER_COMPILE_CACHE")}
    with tempfile.TemporaryDirectory(prefix="ember-cache-") as cache:
        os.environ["EMBER_CACHE_DIR"] = cache
        try:
            cold, s = timed_compile(model, target)
            warm, _ = timed_compile(model, target, whole_model_cache=False)
            cached, c = timed_compile(model, target)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return {"model": name, "nodes": nodes, "kernels": s.get("kernels", 0), "cold_s": cold, "warm_s": warm,
            "cached_s": cached, "cache": c.get("compile_cache", "-")}  # fmt: skip


def run(sizes: list[int], resnet: bool, image: int, target: str) -> list[dict]:
    rows: list[dict] = []
    prev = None
    for n in sizes:
        row = measure(f"chain {n}", zoo.elementwise_chain(n), n, target)
        if prev is not None:
            row["growth"] = row["cold_s"] / prev["cold_s"]
            row["size_ratio"] = n / prev["nodes"]
        rows.append(row)
        prev = row
        print_row(row)
    if resnet:
        model = zoo.resnet50(image=image)
        rows.append(measure(f"resnet50 ({image}x{image})", model, len(model.graph.node), target))
        print_row(rows[-1])
    return rows


HEADER = (f"{'model':<22} {'nodes':>6} {'kernels':>7} {'cold s':>8} {'warm s':>8} {'cached s':>8} {'cache':>6} "
          f"{'s / 1k nodes':>12} {'growth':>14}")  # fmt: skip


def print_row(r: dict) -> None:
    growth = f"x{r['growth']:.2f} (size x{r['size_ratio']:.1f})" if "growth" in r else "-"
    per_k = r["cold_s"] / r["nodes"] * 1000
    print(f"{r['model']:<22} {r['nodes']:>6} {r['kernels']:>7} {r['cold_s']:>8.2f} {r['warm_s']:>8.2f} "
          f"{r['cached_s']:>8.3f} {r['cache']:>6} {per_k:>12.2f} {growth:>14}", flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 3000, 10000])
    ap.add_argument("--no-resnet", action="store_true", help="chains only")
    ap.add_argument("--image", type=int, default=224, help="ResNet-50's input size")
    ap.add_argument("--target", default="c")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    print(f"compile seconds, target {args.target!r}, ember at {os.path.dirname(ember.__file__)}")
    print(HEADER)
    rows = run(args.sizes, not args.no_resnet, args.image, args.target)
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
