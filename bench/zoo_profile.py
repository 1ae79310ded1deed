"""Where the time goes: Ember's per-kernel profile beside onnxruntime's profiler, grouped by operator class.

    python bench/zoo_profile.py MODEL_DIR [MODEL_DIR ...] [--threads 1] [--repeat 10] [--top 12] [--json OUT]

MODEL_DIR is a model directory of bench/zoo.py's cache (model.onnx and inputs.npz: `python bench/zoo.py --models
NAME` exports it). Both systems run in this process at `--threads`; their whole-model times are process CPU time,
medians of calls taken in turns (`interleaved_medians`), the steadier clock on a loaded machine. Then each is
profiled: Ember with `m.profile()` (per-kernel median, roofline fraction), onnxruntime with
`SessionOptions.enable_profiling` (per-node durations of the same number of runs, median per node). Kernels and
nodes are grouped by class: the first heavy operator of a fused kernel (Conv, MatMul, Gemm, ...) names its class,
so that a Conv+Add+Relu kernel of Ember's and onnxruntime's fused Conv land in one row. The table prints each
class's milliseconds in both and the difference, largest first: where Ember loses its time. With openvino
installed, OpenVINO is timed and profiled too (`PERF_COUNT`, per-layer times of `get_profiling_info()`, its
layer types mapped to the same classes: FullyConnected is MatMul, MVN is LayerNormalization, RMS the simplified
one; a `Subgraph` is OpenVINO's fused elementwise/attention code, its own class). The profilers time kernels by
the wall clock (OpenVINO's per-layer sums ran 3-4x over its whole-model time on the loaded machine), so each
system's class times are printed as shares of its profile times its measured whole-model CPU time: the columns
then add up to the medians above, and compare where each system spends its time.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

# the operator that names a fused kernel's class, in order of precedence
HEAVY = ("ConvNCHWc", "Conv", "ConvInteger", "Winograd", "MatMul", "Gemm", "FusedMatMul", "FusedConv",
         "BatchMatMul", "Attention", "Softmax", "LayerNormalization", "SimplifiedLayerNormalization",
         "SkipLayerNormalization", "ReduceMean", "GlobalAveragePool", "PoolNCHWc", "MaxPool", "AveragePool",
         "Gather", "Concat", "Transpose", "LayoutTransform")  # fmt: skip


def op_class(ops: list[str]) -> str:
    for h in HEAVY:
        for o in ops:
            if o == h or o.startswith(h):
                return "Conv" if h in ("ConvNCHWc", "FusedConv", "Winograd") else h
    return ops[0] if ops else "?"


def ember_profile(m, feeds: dict, repeat: int) -> tuple[dict[str, float], list[dict]]:
    rows = m.profile(feeds, repeat=repeat)
    by = defaultdict(float)
    for r in rows:
        by[op_class(r["ops"])] += r["seconds"]
    return dict(by), rows


def ort_profile(path: Path, feeds: dict, threads: int, repeat: int) -> dict[str, float]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(prefix="ort-prof-"), "p")
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    for _ in range(repeat + 1):
        sess.run(None, feeds)
    events = json.loads(Path(sess.end_profiling()).read_text())
    per_node: dict[str, list[float]] = defaultdict(list)
    kind: dict[str, str] = {}
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        per_node[e["name"]].append(e["dur"] * 1e-6)
        kind[e["name"]] = e.get("args", {}).get("op_name", "?")
    by = defaultdict(float)
    for name, durs in per_node.items():
        by[op_class([kind[name]])] += statistics.median(durs[1:] or durs)  # the first run warms up
    return dict(by)


OV_CLASSES = {"FullyConnected": "MatMul", "MVN": "LayerNormalization", "RMS": "SimplifiedLayerNormalization"}


def openvino_profile(path: Path, feeds: dict, threads: int, repeat: int) -> dict[str, float]:
    """OpenVINO's per-layer times (PERF_COUNT) by class: the median over `repeat` runs of each executed layer."""
    import openvino as ov

    config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1,
              "INFERENCE_PRECISION_HINT": "f32", "PERF_COUNT": True}  # fmt: skip
    request = ov.Core().compile_model(str(path), "CPU", config).create_infer_request()
    request.infer(feeds)  # warm-up
    per_layer: dict[str, list[float]] = defaultdict(list)
    kind: dict[str, str] = {}
    for _ in range(repeat):
        request.infer(feeds)
        for info in request.get_profiling_info():
            if info.status.name == "EXECUTED":
                per_layer[info.node_name].append(info.real_time.total_seconds())
                kind[info.node_name] = OV_CLASSES.get(info.node_type, info.node_type)
    by = defaultdict(float)
    for name, times in per_layer.items():
        by[kind[name]] += statistics.median(times)
    return dict(by)


def scaled(by_class: dict[str, float], whole: float) -> dict[str, float]:
    """Class times as shares of the profile's sum times the measured whole-model time."""
    total = sum(by_class.values()) or 1.0
    return {c: t / total * whole for c, t in by_class.items()}


def openvino_request(path: Path, threads: int, feeds: dict):
    """OpenVINO's CPU plugin on `threads` threads, as bench/zoo.py configures it: a callable running the model."""
    import openvino as ov

    config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1,
              "INFERENCE_PRECISION_HINT": "f32"}  # fmt: skip
    request = ov.Core().compile_model(str(path), "CPU", config).create_infer_request()
    return lambda: request.infer(feeds)


def compare(path: Path, threads: int, repeat: int, top: int) -> dict:
    import ember
    from ember.runtime.compare import interleaved_medians, onnxruntime_session
    from ember.runtime.model import profile_table

    with np.load(path / "inputs.npz") as z:
        feeds = {k: z[k] for k in z.files}
    t0 = time.perf_counter()
    m = ember.compile(str(path / "model.onnx"), target=f"c -threads={threads}")
    compile_s = time.perf_counter() - t0
    sess = onnxruntime_session(str(path / "model.onnx"), threads)
    systems = {"ember": lambda: m.run(feeds), "ort": lambda: sess.run(None, feeds)}
    if importlib.util.find_spec("openvino") is not None:
        systems["ov"] = openvino_request(path / "model.onnx", threads, feeds)
    whole = interleaved_medians(systems, repeat, warmup=1, clock=time.process_time)
    ours, rows = ember_profile(m, feeds, repeat)
    theirs = ort_profile(path / "model.onnx", feeds, threads, repeat)
    ov_by = openvino_profile(path / "model.onnx", feeds, threads, repeat) if "ov" in whole else {}
    ours, theirs = scaled(ours, whole["ember"]), scaled(theirs, whole["ort"])
    ov_by = scaled(ov_by, whole["ov"]) if ov_by else {}
    name = path.name
    ov = f", openvino {whole['ov'] * 1e3:.2f} ms" if "ov" in whole else ""
    best = min(v for k, v in whole.items() if k != "ember")
    print(f"\n== {name}: ember {whole['ember'] * 1e3:.2f} ms, onnxruntime {whole['ort'] * 1e3:.2f} ms{ov} "
          f"(process CPU time, {threads} thread(s), loaded), ratio best/ember {best / whole['ember']:.2f}; "
          f"compile {compile_s:.1f} s; model roofline {(m.summary().get('roofline') or {}).get('fraction') or 0:.0%}")
    classes = sorted(set(ours) | set(theirs) | set(ov_by), key=lambda c: -(ours.get(c, 0) - theirs.get(c, 0)))
    print(f"{'class (ms: shares of the CPU time)':<36} {'ember':>8} {'ort':>8} {'diff':>8} {'openvino':>9}")
    for c in classes:
        a, b = ours.get(c, 0.0) * 1e3, theirs.get(c, 0.0) * 1e3
        o = f"{ov_by[c] * 1e3:>9.2f}" if c in ov_by else f"{'-':>9}"
        print(f"{c:<36} {a:>8.2f} {b:>8.2f} {a - b:>+8.2f} {o}")
    print(profile_table(rows, top))
    return {"model": name, "seconds": whole, "ember": ours, "ort": theirs, "openvino": ov_by,
            "kernels": [{k: r.get(k) for k in ("kernel", "ops", "seconds", "gflops", "roofline")} for r in rows]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+", help="model directories of bench/zoo.py's cache")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--top", type=int, default=12, help="Ember's slowest kernels printed per model")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    results = []
    for d in args.models:
        results.append(compare(Path(d), args.threads, args.repeat, args.top))
        sys.stdout.flush()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
