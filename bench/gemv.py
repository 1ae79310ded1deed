"""Skinny products (fully connected layers at batch 1..8, a huge constant weight) against onnxruntime and numpy.

    python bench/gemv.py [--threads 1] [--repeat 20] [--only fc6_t,fc7] [--json]

Each case is a one-node ONNX model whose weight is an initializer (as in a trained model: Ember packs it at
compile time). Ember (target "c -threads=N") and onnxruntime (intra_op_num_threads=N) run in this process,
timed in interleaved rounds (`ember.runtime.compare.interleaved_medians`); numpy's `x @ W` is the reference for
the outputs and a third timing. The table gives each engine's GFLOP/s, the GB/s of its weight stream (the
weight, the input and the output once) and that as a fraction of the machine's memory bandwidth, measured by
`ember.runtime.roofline` for the same target.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import onnx
from onnx import TensorProto, helper

import ember
from ember.runtime.compare import interleaved_medians, onnxruntime_session
from ember.runtime.roofline import limits_for

# name -> (op, rows M, K, N, transB)
CASES: dict[str, tuple[str, int, int, int, int]] = {
    "fc6_t": ("Gemm", 1, 9216, 4096, 1),  # AlexNet's first classifier layer (torchvision exports transB=1)
    "fc7_t": ("Gemm", 1, 4096, 4096, 1),
    "fc7": ("MatMul", 1, 4096, 4096, 0),
    "fc7_m4_t": ("Gemm", 4, 4096, 4096, 1),
    "fc7_m8": ("MatMul", 8, 4096, 4096, 0),
    "head_t": ("Gemm", 1, 4096, 1000, 1),
}


def model_of(op: str, m: int, k: int, n: int, trans: int,
             rng: np.random.Generator) -> tuple[onnx.ModelProto, np.ndarray]:  # fmt: skip
    """A one-node model of x[m, k] times a random constant weight, and the weight as x multiplies it ([k, n])."""
    w = (rng.standard_normal((n, k) if trans else (k, n)) / np.sqrt(k)).astype(np.float32)
    init = helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel())
    attrs = {"transB": 1} if op == "Gemm" and trans else {}
    graph = helper.make_graph(
        [helper.make_node(op, ["x", "w"], ["y"], **attrs)], op.lower(),
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (m, k))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (m, n))], [init],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), (w.T if trans else w)


def measure(name: str, case: tuple[onnx.ModelProto, np.ndarray], x: np.ndarray, target: str,
            args: argparse.Namespace) -> dict[str, float]:  # fmt: skip
    """Median seconds per engine on one case, after checking Ember's output against numpy's in float64."""
    model, w = case
    compiled = ember.compile(model, target=target, fallback=False)
    sess = onnxruntime_session(model, args.threads)
    ref = x.astype(np.float64) @ w.astype(np.float64)
    err = float(np.max(np.abs(compiled(x) - ref)) / np.max(np.abs(ref)))
    assert err < 1e-4, f"{name}: ember differs from numpy by {err:.2e} (relative to the largest output)"
    systems = {"ember": lambda: compiled(x), "onnxruntime": lambda: sess.run(None, {"x": x}), "numpy": lambda: x @ w}
    return interleaved_medians(systems, args.repeat)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--only", default="")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    target = f"c -threads={args.threads}"
    limits = limits_for(target)
    dram = limits.dram_gbs if limits else float("nan")
    print(f"target '{target}': memory bandwidth {dram:.1f} GB/s (ember.runtime.roofline)")
    print(f"{'case':<10} {'M x K x N':>16} {'engine':<12} {'ms':>8} {'GFLOP/s':>8} {'GB/s':>7} {'of bw':>6} "
          f"{'vs ort':>7}")  # fmt: skip
    rng = np.random.default_rng(0)
    results = {}
    for name, (op, m, k, n, trans) in CASES.items():
        if args.only and name not in args.only.split(","):
            continue
        med = measure(name, model_of(op, m, k, n, trans, rng), rng.standard_normal((m, k)).astype(np.float32),
                      target, args)  # fmt: skip
        flops, nbytes = 2 * m * k * n, 4 * (k * n + m * k + m * n)
        results[name] = {}
        for engine, sec in med.items():
            gbs = nbytes / sec / 1e9
            row = {"ms": sec * 1e3, "gflops": flops / sec / 1e9, "gbs": gbs, "of_bw": gbs / dram,
                   "speedup_vs_ort": med["onnxruntime"] / sec}  # fmt: skip
            results[name][engine] = row
            print(f"{name:<10} {f'{m}x{k}x{n}':>16} {engine:<12} {row['ms']:>8.3f} {row['gflops']:>8.2f} "
                  f"{gbs:>7.1f} {row['of_bw']:>6.0%} {row['speedup_vs_ort']:>6.2f}x")  # fmt: skip
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
