"""Row kernels (Softmax, LogSoftmax) and permutes before/after: this checkout vs another (`--baseline`, e.g. the
main checkout) vs onnxruntime, one operator per kernel, 1 thread, process CPU time.

    python bench/rows.py [--baseline /work/main] [--only softmax_128,softmax_197] [--rounds 7] [--json]

Each measurement is a process of its own (`--worker`): Ember's kernels are the compiler's default schedule for
the one-node model (`ember.tune.Task.from_op(...).instantiate(None)`, built with `ember.build`), called through
ctypes without argument checks; onnxruntime runs the same one-node model (io-binding, intra_op_num_threads=1).
A worker times blocks of calls by `time.process_time` (the CPU time of this process alone: a machine shared with
other work inflates wall time, not this) and reports each block's time per call. The systems' workers take turns
for `--rounds` rounds; the table gives each system's median and least time per call over all blocks and the
ratios base/new (> 1: this checkout is faster) on both. Outputs are checked against numpy first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# name -> (op, input shape, attrs)
CASES = {
    "softmax_128": ("Softmax", (128, 128), {"axis": -1}),
    "softmax_197": ("Softmax", (12, 197, 197), {"axis": -1}),
    "logsoftmax_1000": ("LogSoftmax", (128, 1000), {"axis": -1}),
    "nchw_to_nhwc": ("Transpose", (1, 96, 56, 56), {"perm": [0, 2, 3, 1]}),
    "nhwc_to_nchw": ("Transpose", (1, 56, 56, 96), {"perm": [0, 3, 1, 2]}),
    "head_split": ("Transpose", (1, 197, 12, 64), {"perm": [0, 2, 1, 3]}),
    "head_merge": ("Transpose", (1, 12, 197, 64), {"perm": [0, 2, 1, 3]}),
}


def reference(op: str, x: np.ndarray, attrs: dict) -> np.ndarray:
    if op == "Transpose":
        return np.transpose(x, attrs["perm"])
    s = x.astype(np.float64) - x.max(-1, keepdims=True)
    e = np.exp(s)
    return (s - np.log(e.sum(-1, keepdims=True))) if op == "LogSoftmax" else e / e.sum(-1, keepdims=True)


def worker(system: str, case: str, blocks: int, seconds: float) -> list[float]:
    """Seconds per call of each of `blocks` timed blocks (about `seconds` of CPU time each)."""
    op, shape, attrs = CASES[case]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    want = reference(op, x, attrs)
    if system == "onnxruntime":
        import onnxruntime as ort
        from onnx import TensorProto, helper

        node = helper.make_node(op, ["x"], ["y"], **attrs)
        graph = helper.make_graph([node], "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, want.shape)])  # fmt: skip
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = 1, 1
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        y = np.zeros(want.shape, np.float32)
        binding = sess.io_binding()
        binding.bind_cpu_input("x", x)
        binding.bind_output("y", "cpu", 0, np.float32, y.shape, y.ctypes.data)

        def call() -> None:
            sess.run_with_iobinding(binding)
    else:
        import ember
        from ember.tune import Task

        task = Task.from_op(op, [shape], attrs, target="c -threads=1")
        sch, args = task.instantiate(None)
        f = ember.build(sch, args, target="c -threads=1")
        y = np.zeros(want.shape, np.float32)
        call = f.functions[f.entry].bind((x, y))
    call()
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    n = 1
    while True:  # calls per block: about `seconds` of CPU time
        t0 = time.process_time()
        for _ in range(n):
            call()
        dt = time.process_time() - t0
        if dt >= seconds / 4:
            break
        n *= 4
    n = max(1, int(n * seconds / max(dt, 1e-9)))
    out = []
    for _ in range(blocks):
        t0 = time.process_time()
        for _ in range(n):
            call()
        out.append((time.process_time() - t0) / n)
    return out


def measure(system: str, case: str, baseline: str, blocks: int, seconds: float) -> list[float]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    root = baseline if system == "ember@base" else str(ROOT)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", system, "--only", case, "--blocks", str(blocks),
           "--seconds", str(seconds)]  # fmt: skip
    res = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"{system} {case} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--baseline", default="", help="another Ember checkout, measured as ember@base")
    p.add_argument("--only", default=",".join(CASES))
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--blocks", type=int, default=5, help="timed blocks per worker")
    p.add_argument("--seconds", type=float, default=0.05, help="CPU seconds per block")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    cases = [c.strip() for c in args.only.split(",") if c.strip()]
    if args.worker:
        print(json.dumps(worker(args.worker, cases[0], args.blocks, args.seconds)))
        return 0
    systems = (["ember@base"] if args.baseline else []) + ["ember", "onnxruntime"]
    rows = []
    print(f"{'case':<16} {'system':<12} {'median ms':>10} {'least ms':>9}   1 thread, process CPU time, "
          f"{args.rounds} rounds x {args.blocks} blocks")
    for case in cases:
        times: dict[str, list[float]] = {s: [] for s in systems}
        for _ in range(args.rounds):
            for s in systems:
                times[s] += measure(s, case, args.baseline, args.blocks, args.seconds)
        row = {"case": case, **{s: {"median_ms": statistics.median(t) * 1e3, "least_ms": min(t) * 1e3}
                                for s, t in times.items()}}  # fmt: skip
        for s in systems:
            print(f"{case:<16} {s:<12} {row[s]['median_ms']:10.4f} {row[s]['least_ms']:9.4f}")
        new = row["ember"]
        for other in [s for s in systems if s != "ember"]:
            r_med, r_min = row[other]["median_ms"] / new["median_ms"], row[other]["least_ms"] / new["least_ms"]
            row[f"{other}/ember"] = {"median": r_med, "least": r_min}
            print(f"{'':<16} {other + '/ember':<22} median {r_med:5.2f}x  least {r_min:5.2f}x")
        rows.append(row)
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
