"""Post-training quantization: calibrate with Ember, measure each layer's sensitivity, write the QDQ model.

1. `prepare`: opset >= 13, batch norms folded into convolutions (the float reference from here on).
2. Calibration: the float model compiled by Ember with every activation a layer needs exposed as an output, run on
   the calibration data (twice for the histogram methods); ranges by min-max, percentile or entropy.
3. Sensitivity: one model holding the float graph and, beside it, each layer quantized alone on the float
   graph's tensors, compiled by Ember and run on the first `report_samples` inputs: the SQNR of each layer's
   output is the error that layer adds by itself. Layers below `min_sqnr` (and those named in `exclude`) stay float.
4. The QDQ model of the remaining layers, run by Ember against the float model: the accuracy change, per output.

The report travels inside the model (metadata `ember.quantization`, JSON): `read_report(model)`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx

from ..compiler import compile as ember_compile
from ..frontend.onnx import from_onnx, load_model
from .calibrate import RangeCollector
from .qdq import (
    ACTIVATION_DTYPES,
    Layer,
    QParams,
    QuantizeError,
    activation_params,
    find_layers,
    prepare,
    with_isolated_layers,
    write_bf16,
    write_qdq,
)

PRECISIONS = ("int8", "bf16")
QUANTIZED_FORMS = {
    "QuantizeLinear",
    "DequantizeLinear",
    "QLinearConv",
    "QLinearMatMul",
    "ConvInteger",
    "MatMulInteger",
    "DynamicQuantizeLinear",
}
REPORT_KEY = "ember.quantization"


@dataclass
class LayerReport:
    """One layer: its output's SQNR (dB) and relative error when quantized alone, and whether it was quantized."""

    name: str
    op: str
    output: str
    sqnr_db: float | None
    rel_error: float | None
    quantized: bool
    reason: str = ""  # why it stays float


@dataclass
class QuantizationReport:
    precision: str
    method: str
    activation_dtype: str
    calibration_samples: int
    report_samples: int
    layers: list[LayerReport] = field(default_factory=list)
    outputs: dict[str, dict[str, float]] = field(default_factory=dict)  # per output: sqnr_db, rel_error, cosine, ...

    def to_json(self) -> str:
        return json.dumps(asdict(self), allow_nan=True)

    @classmethod
    def from_json(cls, text: str) -> QuantizationReport:
        d = json.loads(text)
        d["layers"] = [LayerReport(**x) for x in d["layers"]]
        return cls(**d)

    def __str__(self) -> str:
        quantized = sum(x.quantized for x in self.layers)
        how = (
            f"{self.method} calibration on {self.calibration_samples} samples, activations {self.activation_dtype}"
            if self.precision == "int8"
            else "weights and activations rounded to bfloat16"
        )
        lines = [f"{self.precision} ({how}): {quantized} of {len(self.layers)} layers quantized",
                 f"{'layer':<28} {'op':<7} {'SQNR dB':>8} {'rel err':>8}  kept"]  # fmt: skip
        for x in self.layers:
            sqnr = "-" if x.sqnr_db is None else f"{x.sqnr_db:8.1f}"
            rel = "-" if x.rel_error is None else f"{x.rel_error:8.4f}"
            kept = "int8" if x.quantized and self.precision == "int8" else "bf16" if x.quantized else "float"
            why = f" ({x.reason})" if x.reason else ""
            lines.append(f"{x.name[:28]:<28} {x.op:<7} {sqnr:>8} {rel:>8}  {kept}{why}")
        for name, m in self.outputs.items():
            stats = ", ".join(f"{k} {v:.4g}" for k, v in m.items())
            lines.append(f"output {name} vs float ({self.report_samples} samples): {stats}")
        return "\n".join(lines)


@dataclass
class QuantizeResult:
    model: onnx.ModelProto
    report: QuantizationReport


def read_report(model: onnx.ModelProto | str | os.PathLike) -> QuantizationReport | None:
    """The report `quantize` stored in a model's metadata (None if it has none)."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(model)
    for p in model.metadata_props:
        if p.key == REPORT_KEY:
            return QuantizationReport.from_json(p.value)
    return None


def quantize_model(
    model: onnx.ModelProto | str | os.PathLike,
    calibration_data: Iterable[Mapping[str, np.ndarray]],
    *,
    precision: str = "int8",
    method: str = "minmax",
    percentile: float = 99.99,
    activation_dtype: str = "uint8",
    exclude: Sequence[str] = (),
    min_sqnr: float | None = None,
    report_samples: int = 8,
    target: str | None = None,
) -> QuantizeResult:
    """`ember.quantize`, returning the report beside the model (see `quantize`)."""
    if precision not in PRECISIONS:
        raise QuantizeError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if activation_dtype not in ACTIVATION_DTYPES:
        raise QuantizeError(f"activation_dtype must be uint8 or int8, got {activation_dtype!r}")
    if min_sqnr is not None and report_samples < 1:
        raise QuantizeError("min_sqnr needs the sensitivity analysis: give report_samples >= 1")
    proto, _ = load_model(model)
    already = sorted({n.op_type for n in proto.graph.node} & QUANTIZED_FORMS)
    if already:
        raise QuantizeError(f"the model is already quantized (it has {', '.join(already)}): give the float model")
    float_model = prepare(proto)
    layers = find_layers(float_model)
    names = {n.name for n in float_model.graph.node}
    by_name = {x.name: x for x in layers}
    for name in exclude:
        if name not in by_name:
            what = "is not a quantizable layer" if name in names else "is not a node of the model"
            raise QuantizeError(f"exclude: {name!r} {what}; quantizable layers: {', '.join(by_name) or 'none'}")
    samples = list(calibration_data)
    if not samples:
        raise QuantizeError("calibration_data is empty: give at least one input dict")
    collector = RangeCollector(method, percentile)  # checks the method and the percentile
    if precision == "bf16":  # no ranges needed: one pass for the float outputs and shapes
        collector, method, activation_dtype = RangeCollector("minmax"), "none", "bfloat16"
    report = QuantizationReport(precision, method, activation_dtype, len(samples), min(report_samples, len(samples)))
    if not layers:
        return QuantizeResult(with_report(float_model, report), report)

    check_samples(float_model, samples)
    compile_options = {"target": target, "input_shapes": {n: np.shape(a) for n, a in samples[0].items()}}
    tensors = list(dict.fromkeys(t for x in layers for t in x.activations()))
    floats, shapes = calibrate(float_model, tensors, samples, collector, report.report_samples, compile_options)
    params = {}
    for t, (lo, hi) in collector.ranges().items() if precision == "int8" else ():
        symmetric = any(x.signed_input == t for x in layers)
        params[t] = activation_params(lo, hi, "int8" if symmetric else activation_dtype, symmetric)
    write = write_qdq if precision == "int8" else write_bf16

    chosen = [x for x in layers if x.name not in exclude] if report.report_samples else []
    sqnr = sensitivity(float_model, chosen, write, params, shapes, samples[: report.report_samples], compile_options)
    for x in layers:
        s, rel = sqnr.get(x.name, (None, None))
        reason = "excluded" if x.name in exclude else ""
        if not reason and min_sqnr is not None and s is not None and s < min_sqnr:
            reason = f"SQNR below {min_sqnr:g} dB"
        report.layers.append(LayerReport(x.name, x.node.op_type, x.output, s, rel, not reason, reason))
    quantized = {r.name for r in report.layers if r.quantized}
    kept = [x for x in layers if x.name in quantized]
    out = write(float_model, kept, params)
    if report.report_samples and kept:
        report.outputs = compare_outputs(out, floats, samples[: report.report_samples], compile_options)
    return QuantizeResult(with_report(out, report), report)


def quantize(
    model: onnx.ModelProto | str | os.PathLike,
    calibration_data: Iterable[Mapping[str, np.ndarray]],
    *,
    precision: str = "int8",
    method: str = "minmax",
    percentile: float = 99.99,
    activation_dtype: str = "uint8",
    exclude: Sequence[str] = (),
    min_sqnr: float | None = None,
    report_samples: int = 8,
    target: str | None = None,
) -> onnx.ModelProto:
    """Post-training static quantization of a float ONNX model (path or ModelProto) into a QDQ model.

    `calibration_data`: input dicts (name -> array), as `Model.run` takes. With `precision="int8"`, Conv, MatMul
    and Gemm get per-channel symmetric int8 weights and per-tensor `activation_dtype` activations (uint8 by
    default: VNNI's vpdpbusd multiplies unsigned by signed bytes), calibrated by `method`: "minmax",
    "percentile" (the central `percentile` %) or "entropy" (TensorRT's KL divergence). Relu, Clip, a bias Add and
    a residual Add after a layer are its epilogue (no rounding inside). With `precision="bf16"`, the same layers
    read weights and activations rounded to bfloat16 (Cast pairs) and accumulate in float32.

    Each layer is first quantized alone against the float model on the first `report_samples` inputs (its
    output's SQNR); layers below `min_sqnr` dB, or named in `exclude` (node names), stay float
    (`report_samples=0` skips this analysis and the final comparison: three Ember compiles become one). The report
    (`read_report(model)`, or `quantize_model(...).report`) holds those numbers and the outputs' error against
    the float model; Ember (`target`) runs every model involved."""
    return quantize_model(model, calibration_data, precision=precision, method=method, percentile=percentile,
                          activation_dtype=activation_dtype, exclude=exclude, min_sqnr=min_sqnr,
                          report_samples=report_samples, target=target).model  # fmt: skip


def with_report(model: onnx.ModelProto, report: QuantizationReport) -> onnx.ModelProto:
    for i, p in enumerate(model.metadata_props):
        if p.key == REPORT_KEY:
            del model.metadata_props[i]
            break
    onnx.helper.set_model_props(model, {**{p.key: p.value for p in model.metadata_props}, REPORT_KEY:
                                        report.to_json()})  # fmt: skip
    return model


Outputs = list[dict[str, np.ndarray]]


def calibrate(model: onnx.ModelProto, tensors: list[str], samples: list[Mapping[str, Any]], collector: RangeCollector,
              keep: int, options: dict) -> tuple[Outputs, dict[str, tuple[int, ...]]]:  # fmt: skip
    """Observe `tensors` on every sample with Ember (the float model, those tensors exposed as outputs). Returns
    the float model's outputs on the first `keep` samples and each observed tensor's shape."""
    graph = from_onnx(model, input_shapes=options["input_shapes"])
    values = {v.name: v for v in graph.values()}
    missing = [t for t in tensors if t not in values]
    if missing:
        raise QuantizeError(f"tensors {missing[:5]} of the model are not values of its imported graph")
    outputs = [v.name for v in graph.outputs]
    observed = [t for t in tensors if not values[t].is_constant]
    graph.outputs = list(dict.fromkeys([*graph.outputs, *(values[t] for t in observed)]))
    compiled = ember_compile(graph, target=options["target"])
    floats: list[dict[str, np.ndarray]] = []
    shapes: dict[str, tuple[int, ...]] = {}
    for p in range(collector.passes):
        if p == 1:
            collector.start_histograms()
        for i, feeds in enumerate(samples):
            outs = compiled.run(feeds)
            if p == 0 and i < keep:
                floats.append({n: outs[n] for n in outputs})
            for t in observed:
                collector.observe(t, outs[t])
                shapes[t] = outs[t].shape
    return floats, shapes


def sqnr_db(ref: np.ndarray, x: np.ndarray) -> tuple[float, float]:
    """(signal-to-quantization-noise ratio in dB, relative error ||x - ref|| / ||ref||)."""
    signal = float(np.sum(ref.astype(np.float64) ** 2))
    noise = float(np.sum((x.astype(np.float64) - ref) ** 2))
    rel = math.sqrt(noise / signal) if signal > 0 else (0.0 if noise == 0 else math.inf)
    db = math.inf if noise == 0 else 10 * math.log10(signal / noise) if signal > 0 else -math.inf
    return db, rel


def sensitivity(model: onnx.ModelProto, layers: list[Layer], write, params: dict[str, QParams],
                shapes: dict[str, tuple[int, ...]], samples: list[Mapping[str, Any]],
                options: dict) -> dict[str, tuple[float, float]]:  # fmt: skip
    """layer name -> (SQNR dB, relative error) of its output quantized alone (see `with_isolated_layers`)."""
    if not layers:
        return {}
    combined, names = with_isolated_layers(model, layers, write, params, shapes)
    compiled = ember_compile(combined, **options)
    refs: dict[str, list[np.ndarray]] = {x.name: [] for x in layers}
    quant: dict[str, list[np.ndarray]] = {x.name: [] for x in layers}
    for feeds in samples:
        outs = compiled.run(feeds)
        for x in layers:
            refs[x.name].append(outs[x.output])
            quant[x.name].append(outs[names[x.name]])
    return {x.name: sqnr_db(np.concatenate([a.ravel() for a in refs[x.name]]),
                            np.concatenate([a.ravel() for a in quant[x.name]])) for x in layers}  # fmt: skip


def compare_outputs(model: onnx.ModelProto, floats: list[dict[str, np.ndarray]], samples: list[Mapping[str, Any]],
                    options: dict) -> dict[str, dict[str, float]]:  # fmt: skip
    """Per output of the quantized model run by Ember, against the float outputs: SQNR (dB), relative error,
    cosine similarity, and for outputs of shape (batch, classes) the fraction of rows whose argmax agrees."""
    if not samples:
        return {}
    compiled = ember_compile(model, **options)
    runs = [compiled.run(feeds) for feeds in samples]
    out = {}
    for name in floats[0]:
        ref = np.stack([f[name] for f in floats]).astype(np.float64)
        got = np.stack([r[name] for r in runs]).astype(np.float64)
        db, rel = sqnr_db(ref, got)
        norm = np.linalg.norm(ref) * np.linalg.norm(got)
        m = {"sqnr_db": db, "rel_error": rel, "cosine": float(np.sum(ref * got) / norm) if norm else 1.0}
        if ref.ndim == 3 and ref.shape[-1] > 1:  # samples x batch x classes
            m["top1_agree"] = float(np.mean(ref.argmax(-1) == got.argmax(-1)))
        out[name] = m
    return out


# -- calibration data -------------------------------------------------------------------------------------------
def model_inputs(model: onnx.ModelProto | str | os.PathLike) -> list[tuple[str, np.dtype, tuple]]:
    """(name, dtype, shape) of the model's graph inputs (initializers aside); a symbolic dimension is its name."""
    proto, _ = load_model(model)
    inits = {t.name for t in proto.graph.initializer}
    out = []
    for vi in proto.graph.input:
        if vi.name in inits:
            continue
        t = vi.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in t.shape.dim)
        out.append((vi.name, onnx.helper.tensor_dtype_to_np_dtype(t.elem_type), shape))
    return out


def check_samples(model: onnx.ModelProto, samples: list[Mapping[str, Any]]) -> None:
    """Every sample a dict naming exactly the model's inputs, with the same shapes throughout."""
    names = [n for n, _, _ in model_inputs(model)]
    first = samples[0]
    for i, s in enumerate(samples):
        if not isinstance(s, Mapping) or sorted(s) != sorted(names):
            got = sorted(s) if isinstance(s, Mapping) else type(s).__name__
            raise QuantizeError(f"calibration sample {i}: wants a dict of the inputs {names}, got {got}")
        for n in names:
            if np.shape(s[n]) != np.shape(first[n]):
                raise QuantizeError(f"calibration sample {i}: input {n!r} has shape {np.shape(s[n])}, sample 0 "
                                    f"has {np.shape(first[n])}: every sample must have the same shapes")  # fmt: skip


def samples_from_arrays(model: onnx.ModelProto | str | os.PathLike,
                        arrays: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:  # fmt: skip
    """Calibration samples from one array per input (an .npz): shaped (N, *input_shape), N samples; or
    (N * batch, *input_shape[1:]), split into N batches of the input's batch size (its first dimension, which may
    be symbolic: then each row is one sample of batch 1)."""
    inputs = model_inputs(model)
    names = [n for n, _, _ in inputs]
    if sorted(arrays) != sorted(names):
        raise QuantizeError(f"calibration arrays are named {sorted(arrays)}; the model's inputs are {names}")
    counts, per_input = {}, {}
    for name, dtype, shape in inputs:
        a = np.asarray(arrays[name])
        static = all(isinstance(d, int) for d in shape)
        if static and a.shape[1:] == shape:
            split = [x for x in a]
        elif a.ndim == len(shape) and a.shape[1:] == tuple(shape[1:]) and all(isinstance(d, int) for d in shape[1:]):
            batch = shape[0] if isinstance(shape[0], int) else 1
            if a.shape[0] % batch:
                raise QuantizeError(f"calibration array {name!r}: {a.shape[0]} rows are not a multiple of the "
                                    f"input's batch size {batch}")  # fmt: skip
            split = [a[i : i + batch] for i in range(0, a.shape[0], batch)]
        else:
            raise QuantizeError(f"calibration array {name!r} has shape {a.shape}; the input is {list(shape)}: "
                                f"give (N, *{list(shape)}) or (N * batch, *{list(shape[1:])})")  # fmt: skip
        per_input[name] = [x.astype(dtype, copy=False) for x in split]
        counts[name] = len(split)
    if len(set(counts.values())) > 1:
        raise QuantizeError(f"calibration arrays hold different numbers of samples: {counts}")
    return [{n: per_input[n][i] for n in names} for i in range(next(iter(counts.values())))]


def random_samples(model: onnx.ModelProto | str | os.PathLike, count: int, seed: int = 0,
                   input_shapes: Mapping[str, tuple] | None = None) -> list[dict[str, np.ndarray]]:  # fmt: skip
    """`count` random input dicts (normal floats, small integers): for trying the tool, not for real ranges."""
    from ..runtime.model import random_arrays

    specs = []
    for name, dtype, shape in model_inputs(model):
        shape = tuple((input_shapes or {}).get(name, shape))
        if not all(isinstance(d, int) for d in shape):
            raise QuantizeError(f"input {name!r} has symbolic shape {list(shape)}: give its shape, or calibration "
                                f"data")  # fmt: skip
        specs.append((name, dtype, shape))
    return [dict(zip([n for n, _, _ in specs], random_arrays(specs, seed + i))) for i in range(count)]
