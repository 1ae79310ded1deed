#!/usr/bin/env python
"""The per-call cost of the runtime around the kernels: tiny models, where the native code takes a few microseconds,
compiled once with a symbolic batch and once specialized to the batch, called back to back.

    python bench/call_overhead.py                    # Add, 2-layer MLP, 1-layer BERT; 2000 calls a round
    python bench/call_overhead.py --cpu-time         # process CPU time, on a loaded machine

For each model: microseconds a call (the median of --rounds rounds of --calls calls, the models interleaved round by
round) of the specialized model, of the symbolic one at one size, and of the symbolic one alternating between two
sizes it has seen (each call at another size than the last); the symbolic/specialized ratio; and the native code's
part (`benchmark()`: the segment calls alone on resident inputs, wall time), specialized / symbolic. A symbolic
model at a size it has seen should cost what a specialized one does.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ember  # noqa: E402
from ember import zoo  # noqa: E402


def add_model():
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 16]) for n in ("x", "y")]
    out = helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 16])
    graph = helper.make_graph([helper.make_node("Add", ["x", "y"], ["z"])], "add", ins, [out])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), {"N": (1, 64)}


def mlp_model():
    m = zoo.mlp(batch=4)
    for vi in (m.graph.input[0], m.graph.output[0]):
        vi.type.tensor_type.shape.dim[0].dim_param = "N"
    del m.graph.value_info[:]
    return m, {"N": (1, 64)}


def bert_model():
    return zoo.bert_encoder(layers=1, seq=16, d=32, heads=2, ff=64, dynamic=True), {"batch": (1, 1), "seq": (1, 16)}


MODELS = {"add": add_model, "mlp": mlp_model, "bert-tiny": bert_model}


def feeds_at(model, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random feeds with every symbolic dim at n (a BERT's batch at 1)."""
    feeds = {}
    for vi in model.graph.input:
        dims = vi.type.tensor_type.shape.dim
        shape = [d.dim_value if d.dim_value else (1 if d.dim_param == "batch" else n) for d in dims]
        if vi.type.tensor_type.elem_type == TensorProto.INT64:
            feeds[vi.name] = rng.integers(0, 8, shape) if vi.name != "attention_mask" else np.ones(shape, np.int64)
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def per_call_us(static, dynamic, xa: list, xb: list, args, clock) -> list[float]:
    """Median microseconds a call: the specialized model, the symbolic one at xa's sizes, and alternating xa, xb."""
    runs = [
        lambda: [static(*xa) for _ in range(args.calls)],
        lambda: [dynamic(*xa) for _ in range(args.calls)],
        lambda: [dynamic(*(xa if i % 2 else xb)) for i in range(args.calls)],
    ]
    times: list[list[float]] = [[] for _ in runs]
    for run in runs:
        run()
    for _ in range(args.rounds):
        for run, t in zip(runs, times):
            t0 = clock()
            run()
            t.append((clock() - t0) / args.calls * 1e6)
    return [statistics.median(t) for t in times]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help=f"among {', '.join(MODELS)}")
    p.add_argument("--size", type=int, default=4, help="the batch (BERT: the length) of the calls")
    p.add_argument("--other", type=int, default=7, help="the second size of the alternating calls")
    p.add_argument("--calls", type=int, default=2000, help="calls a round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cpu-time", action="store_true", help="time by process CPU time (on a loaded machine)")
    args = p.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter
    rng = np.random.default_rng(0)
    target = "c -threads=1"
    print(f"{target}, {args.calls} calls a round, median of {args.rounds} rounds, "
          f"{'CPU time' if args.cpu_time else 'wall time'}")  # fmt: skip
    print(f"{'model':<10} {'specialized us':>14} {'symbolic us':>11} {'alternating us':>14} {'ratio':>6} "
          f"{'native us':>14}")  # fmt: skip
    for name in args.models.split(","):
        model, bounds = MODELS[name]()
        a, b = feeds_at(model, args.size, rng), feeds_at(model, args.other, rng)
        static = ember.compile(model, target=target, input_shapes={k: v.shape for k, v in a.items()})
        dynamic = ember.compile(model, target=target, dynamic_bounds=bounds)
        s, d, alt = per_call_us(static, dynamic, list(a.values()), list(b.values()), args, clock)
        native = [m.benchmark(a, repeat=args.calls)["median"] * 1e6 for m in (static, dynamic)]
        print(f"{name:<10} {s:>14.1f} {d:>11.1f} {alt:>14.1f} {d / s:>6.2f} {native[0]:>6.1f} / {native[1]:<5.1f}")


if __name__ == "__main__":
    main()
