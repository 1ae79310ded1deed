"""Int8 against float32 and against onnxruntime's int8, on whole models, in one run.

    python bench/int8.py [--models resnet18,resnet50,mobilenet_v2,bert4] [--threads 1,2] [--quick] [--json] [--no-bf16]

Each model (`ember.zoo`, random weights) is quantized by `quantize_for_bench` (`ember.quantize` when Ember has
it, else onnxruntime's `quantize_static`: QDQ, per-channel int8 weights, uint8 activations, calibrated on
random inputs). Per thread count: the median latency of Ember on the quantized model (int8), Ember on the
float model (fp32) and onnxruntime on the same quantized model (ort_int8), taken in turns
(`ember.runtime.compare.interleaved_medians`), with the ratios. Accuracy against float on fresh random
inputs (200, 20 with --quick): top-1 agreement (the argmax over the last axis: the class of an image model,
the largest feature per token of BERT) and the mean cosine similarity of the outputs. The machine may be
shared: compare the ratios within one run (--cpu-time: process CPU time instead of wall time, for 1 thread).
Beside them, the same model in bfloat16 (`ember.quantize(..., precision="bf16")`: bf16 weights and activations,
float32 accumulation; vdpbf16ps kernels where the CPU has avx512_bf16), its latency, its speedup over fp32 and its
agreement with float (--no-bf16 leaves it out). With --json the last line is
`{"models": {NAME: {"threads": {T: {"int8_ms", "fp32_ms", "ort_int8_ms", "top1_agree", "cosine", "bf16_ms",
"bf16_top1_agree", "bf16_cosine"}}}}}`.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable

import numpy as np
import onnx

import ember
from ember import zoo
from ember.runtime.compare import interleaved_medians, onnxruntime_session

MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    "resnet18": zoo.resnet18,
    "resnet50": zoo.resnet50,
    "mobilenet_v2": zoo.mobilenet_v2,
    "bert4": lambda: zoo.bert_encoder(layers=4, seq=128),
}


def quantize_for_bench(model: onnx.ModelProto, calibration: list[dict[str, np.ndarray]]) -> onnx.ModelProto:
    """A QDQ model of `model`: `ember.quantize` when it exists, else onnxruntime's static quantization."""
    if hasattr(ember, "quantize"):
        return ember.quantize(model, calibration)
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(calibration)

        def get_next(self):
            return next(self.it, None)

    with tempfile.TemporaryDirectory() as d:
        src, pre, out = (os.path.join(d, f) for f in ("float.onnx", "pre.onnx", "int8.onnx"))
        onnx.save(model, src)
        quant_pre_process(src, pre, skip_symbolic_shape=True)  # folds batch norms into the convolutions
        quantize_static(pre, out, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)  # fmt: skip
        return onnx.load(out)


def _first(out) -> np.ndarray:
    return np.asarray(out[0] if isinstance(out, tuple | list) else out)


def agreement(m_int8, m_fp32, model: onnx.ModelProto, n: int) -> tuple[float, float]:
    """(top-1 agreement, mean cosine similarity) of the int8 and float outputs on n fresh random inputs."""
    agree, total, cos = 0, 0, []
    for i in range(n):
        feeds = zoo.random_feeds(model, seed=1000 + i)
        a = _first(m_int8(*feeds.values())).astype(np.float64)
        b = _first(m_fp32(*feeds.values())).astype(np.float64)
        agree += int(np.sum(a.argmax(-1) == b.argmax(-1)))
        total += a.argmax(-1).size
        cos.append(float(a.ravel() @ b.ravel() / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30)))
    return agree / total, float(np.mean(cos))


def run(name: str, threads: list[int], quick: bool, repeat: int, clock=time.perf_counter, bf16: bool = True) -> dict:
    model = MODELS[name]()
    calibration = [zoo.random_feeds(model, seed=i) for i in range(4 if quick else 16)]
    qmodel = quantize_for_bench(model, calibration)
    bmodel = ember.quantize(model, calibration[:2], precision="bf16", report_samples=0) if bf16 else None
    feeds = zoo.random_feeds(model, seed=7)
    args = list(feeds.values())
    out: dict = {"threads": {}}
    top1 = cos = None
    b_top1 = b_cos = float("nan")
    for t in threads:
        m8 = ember.compile(qmodel, target=f"c -threads={t}")
        m32 = ember.compile(model, target=f"c -threads={t}")
        sess = onnxruntime_session(qmodel, t)
        runs = {"int8": lambda m=m8: m(*args), "fp32": lambda m=m32: m(*args),
                "ort_int8": lambda s=sess: s.run(None, feeds)}  # fmt: skip
        if bmodel is not None:
            mb = ember.compile(bmodel, target=f"c -threads={t}")
            runs["bf16"] = lambda m=mb: m(*args)
        med = interleaved_medians(runs, repeat, clock=clock)
        if top1 is None:  # the same kernels at every thread count: measured once
            top1, cos = agreement(m8, m32, model, 20 if quick else 200)
            if bmodel is not None:
                b_top1, b_cos = agreement(mb, m32, model, 20 if quick else 200)
        row = {"int8_ms": med["int8"] * 1e3, "fp32_ms": med["fp32"] * 1e3, "ort_int8_ms": med["ort_int8"] * 1e3,
               "top1_agree": top1, "cosine": cos, "bf16_ms": med.get("bf16", float("nan")) * 1e3,
               "bf16_top1_agree": b_top1, "bf16_cosine": b_cos}  # fmt: skip
        out["threads"][t] = row
        print(f"{name:<13} {t:>2}  {row['int8_ms']:9.2f} {row['fp32_ms']:9.2f} {row['ort_int8_ms']:9.2f}"
              f"  {row['fp32_ms'] / row['int8_ms']:8.2f}x {row['ort_int8_ms'] / row['int8_ms']:8.2f}x"
              f"  {top1:7.1%} {cos:8.4f}  {row['bf16_ms']:9.2f} {row['fp32_ms'] / row['bf16_ms']:8.2f}x"
              f"  {b_top1:7.1%} {b_cos:8.4f}", flush=True)  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="fewer calibration and agreement inputs, fewer runs")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-bf16", action="store_true", help="leave out the bfloat16 model")
    p.add_argument("--cpu-time", action="store_true", help="time by process CPU time (all threads summed): steadier "
                   "than wall time on a loaded machine, a latency only at 1 thread")  # fmt: skip
    a = p.parse_args()
    names = [n.strip() for n in a.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        p.error(f"unknown model(s) {unknown}; known: {', '.join(MODELS)}")
    threads = [int(t) for t in a.threads.split(",")]
    print(f"{'model':<13} {'T':>2}  {'int8 ms':>9} {'fp32 ms':>9} {'ort int8':>9}  {'fp32/int8':>9} {'ort/int8':>9}"
          f"  {'top-1':>7} {'cosine':>8}  {'bf16 ms':>9} {'fp32/bf16':>9}  {'top-1':>7} {'cosine':>8}")  # fmt: skip
    clock = time.process_time if a.cpu_time else time.perf_counter
    results = {n: run(n, threads, a.quick, 6 if a.quick else a.repeat, clock, not a.no_bf16) for n in names}
    if a.json:
        print(json.dumps({"models": results}))


if __name__ == "__main__":
    main()
