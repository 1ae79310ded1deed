#!/usr/bin/env python
"""One model compiled once with a symbolic size vs one compiled for each size: a BERT encoder's sequence length,
or ResNet-18's batch.

    python bench/dynamic.py                                  # BERT, 2 layers, d=128, lengths 1..384
    python bench/dynamic.py --layers 4 --d 768 --heads 12 --ff 3072 --threads 2
    python bench/dynamic.py --model resnet18                 # batches 1, 3, 8 at 224 x 224
    python bench/dynamic.py --model resnet18 --image 64 --width 16 --sizes 1,3,8
    python bench/dynamic.py --cpu-time                       # process CPU time, on a loaded machine

For each size: the median latency of the dynamic model, of a model specialized to that size (the same ONNX
model with input_shapes= fixing it), their ratio, onnxruntime's, and the largest difference from
onnxruntime's output. The dynamic model is compiled once: no compile happens at the sizes it runs at.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ember  # noqa: E402
from ember import zoo  # noqa: E402


def median_ms(fn, repeat: int, clock=time.perf_counter) -> float:
    fn()
    runs = []
    for _ in range(repeat):
        t0 = clock()
        fn()
        runs.append(clock() - t0)
    return 1e3 * statistics.median(runs)


def interleaved_ms(fns, repeat: int, clock=time.perf_counter) -> list[float]:
    """Median ms of each of fns, timed in alternation (a load that comes and goes hits them alike)."""
    for fn in fns:
        fn()
    runs: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, r in zip(fns, runs):
            t0 = clock()
            fn()
            r.append(clock() - t0)
    return [1e3 * statistics.median(r) for r in runs]


def bert_case(args) -> tuple:
    """The model, its symbolic dims' bounds, feeds at a size, and the title line."""
    model = zoo.bert_encoder(layers=args.layers, seq=max(args.sizes), d=args.d, heads=args.heads, ff=args.ff,
                             dynamic=True)  # fmt: skip
    rng = np.random.default_rng(0)

    def feeds(n):
        return {"input_ids": rng.integers(0, 1000, (1, n)), "attention_mask": np.ones((1, n), np.int64)}

    title = f"BERT {args.layers} layers, d={args.d}, heads={args.heads}, ff={args.ff}"
    return model, {"batch": (1, 1), "seq": (1, max(args.sizes))}, feeds, title, "length"


def resnet_case(args) -> tuple:
    model = zoo.resnet18(image=args.image, width=args.width)
    for vi in (model.graph.input[0], model.graph.output[0]):  # a symbolic batch
        vi.type.tensor_type.shape.dim[0].dim_param = "N"
    del model.graph.value_info[:]
    rng = np.random.default_rng(0)

    def feeds(n):
        return {model.graph.input[0].name: rng.standard_normal((n, 3, args.image, args.image)).astype(np.float32)}

    title = f"ResNet-18, {args.image} x {args.image}, width {args.width}"
    return model, {"N": (1, max(args.sizes))}, feeds, title, "batch"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("bert", "resnet18"), default="bert")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ff", type=int, default=512)
    p.add_argument("--image", type=int, default=224, help="resnet18: image size")
    p.add_argument("--width", type=int, default=64, help="resnet18: channels of the first stage")
    p.add_argument("--sizes", "--lengths", default=None, help="sizes to run (BERT: 1,7,16,64,128,200,384; "
                   "ResNet-18: 1,3,8)")  # fmt: skip
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--cpu-time", action="store_true", help="time by process CPU time (on a loaded machine), the "
                   "dynamic and specialized models interleaved")  # fmt: skip
    args = p.parse_args()
    args.sizes = [int(x) for x in (args.sizes or ("1,3,8" if args.model == "resnet18" else "1,7,16,64,128,200,384"))
                  .split(",")]  # fmt: skip
    model, bounds, feeds_at, title, what = (resnet_case if args.model == "resnet18" else bert_case)(args)
    target = f"c -threads={args.threads}"
    t0 = time.perf_counter()
    dyn = ember.compile(model, target=target, dynamic_bounds=bounds)
    print(f"{title}, {target}; dynamic model compiled once in {time.perf_counter() - t0:.1f} s")
    try:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        sess = ort.InferenceSession(model.SerializeToString(), opts)
    except ImportError:
        sess = None
    print(f"{what:>6} {'dynamic ms':>11} {'specialized ms':>15} {'ratio':>6} {'ort ms':>8} {'max err':>9} "
          f"{'compile s':>9}")  # fmt: skip
    ratios = []
    for n in args.sizes:
        feeds = feeds_at(n)
        t0 = time.perf_counter()
        spec = ember.compile(model, target=target, input_shapes={k: v.shape for k, v in feeds.items()})
        t_spec = time.perf_counter() - t0
        clock = time.process_time if args.cpu_time else time.perf_counter
        d_ms, s_ms = interleaved_ms([lambda: dyn.run(feeds), lambda: spec.run(feeds)], args.repeat, clock)  # noqa: B023
        got = next(iter(dyn.run(feeds).values()))
        o_ms, err = float("nan"), float("nan")
        if sess is not None:
            o_ms = median_ms(lambda: sess.run(None, feeds), args.repeat, clock)  # noqa: B023
            err = float(np.abs(got - sess.run(None, feeds)[0]).max())
        ratios.append(d_ms / s_ms)
        print(f"{n:>6} {d_ms:>11.3f} {s_ms:>15.3f} {d_ms / s_ms:>6.2f} {o_ms:>8.3f} {err:>9.1e} {t_spec:>9.1f}")
    print(f"dynamic / specialized: median {statistics.median(ratios):.2f}, worst {max(ratios):.2f}")


if __name__ == "__main__":
    main()
