"""Compile time against graph size: elementwise chains of 1k, 3k and 10k nodes and ResNet-50, cold and warm.

    python bench/compile_time.py [--sizes 1000 3000 10000] [--no-resnet] [--image 224] [--target c] [--json]

Cold: an empty EMBER_CACHE_DIR (a fresh temporary directory), so every kernel goes through the C compiler;
warm: the same compile again, its kernels found in that cache. `growth` is a chain's cold time over the
previous size's, beside the ratio of their sizes: linear-time compiles keep the two close (quadratic ones
square the size ratio). `s / 1k nodes` is the cold time per thousand ONNX nodes.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import ember
from ember import zoo


def timed_compile(model, target: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    m = ember.compile(model, target=target)
    return time.perf_counter() - t0, m.summary().get("kernels", 0)


def measure(name: str, model, nodes: int, target: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="ember-cache-") as cache:
        old = os.environ.get("EMBER_CACHE_DIR")
        os.environ["EMBER_CACHE_DIR"] = cache
        try:
            cold, kernels = timed_compile(model, target)
            warm, _ = timed_compile(model, target)
        finally:
            if old is None:
                os.environ.pop("EMBER_CACHE_DIR", None)
            else:
                os.environ["EMBER_CACHE_DIR"] = old
    return {"model": name, "nodes": nodes, "kernels": kernels, "cold_s": cold, "warm_s": warm}


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


HEADER = f"{'model':<22} {'nodes':>6} {'kernels':>7} {'cold s':>8} {'warm s':>8} {'s / 1k nodes':>12} {'growth':>14}"


def print_row(r: dict) -> None:
    growth = f"x{r['growth']:.2f} (size x{r['size_ratio']:.1f})" if "growth" in r else "-"
    per_k = r["cold_s"] / r["nodes"] * 1000
    print(f"{r['model']:<22} {r['nodes']:>6} {r['kernels']:>7} {r['cold_s']:>8.2f} {r['warm_s']:>8.2f} {per_k:>12.2f} "
          f"{growth:>14}", flush=True)  # fmt: skip


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
