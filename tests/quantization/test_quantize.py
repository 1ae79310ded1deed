"""ember.quantize: QDQ models that pass the ONNX checker, run by Ember as onnxruntime runs them, with the layout of
scales and zero points the integer kernels expect; exclusion, the report, bf16, the command line."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import int8_reference
from onnx import numpy_helper

import ember
from ember import zoo
from ember.cli import main
from ember.quantization import QuantizeError, quantize_model, read_report
from ember.quantization.ptq import random_samples, samples_from_arrays

ort = pytest.importorskip("onnxruntime", reason="onnxruntime runs the quantized models as the reference")

MODELS = {
    "resnet_block": lambda: zoo.resnet_basic_block(channels=8, size=6),
    "mobilenet_block": lambda: zoo.mobilenet_v2_inverted_residual(channels=8, expand=2, size=6),
    "mlp": lambda: zoo.mlp(batch=2),
}


def initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def largest_activation_step(model: onnx.ModelProto) -> float:
    """The largest scale of any activation QuantizeLinear: one quantization step of the coarsest tensor."""
    inits = initializers(model)
    return max(float(inits[n.input[1]]) for n in model.graph.node if n.op_type == "QuantizeLinear")


@pytest.mark.parametrize("name, activations", [(n, "uint8") for n in sorted(MODELS)] + [("resnet_block", "int8")])
def test_qdq_model_checks_and_runs_in_ember_as_in_onnxruntime(name, activations):
    model = MODELS[name]()
    result = quantize_model(model, random_samples(model, 6, seed=1), activation_dtype=activations, report_samples=2)
    q = result.model
    onnx.checker.check_model(q, full_check=True)
    assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in q.graph.node}
    sess = int8_reference(q)
    compiled = ember.compile(q)
    zero_points = [initializers(q)[n.input[2]] for n in q.graph.node if n.op_type == "QuantizeLinear"]
    assert {z.dtype for z in zero_points} == {np.dtype(activations)}
    step = largest_activation_step(q)
    for feeds in random_samples(model, 2, seed=50):  # fresh inputs, not the calibration ones
        theirs = sess.run(None, feeds)
        ours = list(compiled.run(feeds).values())
        for a, b in zip(ours, theirs):
            # onnxruntime fuses DQ -> Conv -> Q into QLinearConv (integer arithmetic, its own rounding order):
            # within one quantization step of the coarsest activation
            np.testing.assert_allclose(a, b, rtol=0, atol=step)


def test_layout_of_weights_biases_and_activations(rng):
    model = zoo.resnet_basic_block(channels=8, size=6)
    q = quantize_model(model, random_samples(model, 4, seed=2), report_samples=1).model
    inits = initializers(q)
    nodes = {n.name: n for n in q.graph.node}
    for conv in (n for n in q.graph.node if n.op_type == "Conv"):
        x_dq, w_dq, b_dq = (next(m for m in q.graph.node if i in m.output) for i in conv.input)
        # activations: uint8 per tensor (the VNNI instruction multiplies unsigned by signed bytes)
        assert x_dq.op_type == "DequantizeLinear" and inits[x_dq.input[2]].dtype == np.uint8
        # weights: int8, symmetric per output channel, each channel's largest magnitude at 127
        w, w_scale = inits[w_dq.input[0]], inits[w_dq.input[1]]
        assert w.dtype == np.int8 and w_scale.shape == (w.shape[0],) and not inits[w_dq.input[2]].any()
        assert (np.abs(w).reshape(w.shape[0], -1).max(axis=1) == 127).all()
        # bias: int32 with scale input_scale * weight_scale, zero point 0
        b_scale = inits[b_dq.input[1]]
        assert inits[b_dq.input[0]].dtype == np.int32
        np.testing.assert_allclose(b_scale, inits[x_dq.input[1]] * w_scale, rtol=1e-6)
    # the epilogue is not rounded: Conv -> Relu and Conv -> Add -> Relu with no Q in between
    ops = [n.op_type for n in q.graph.node if n.op_type not in ("QuantizeLinear", "DequantizeLinear")]
    assert ops == ["Conv", "Relu", "Conv", "Add", "Relu"]
    relu = next(n for n in q.graph.node if n.op_type == "Relu")
    assert [n.op_type for n in q.graph.node if relu.output[0] in n.input] == ["QuantizeLinear"]
    # the residual operand of the Add is the block's quantized input
    add = next(n for n in q.graph.node if n.op_type == "Add")
    assert any(nodes[n.name].op_type == "DequantizeLinear" for n in q.graph.node if set(n.output) & set(add.input))


def test_maxpool_keeps_the_scale_of_its_input(rng):
    b = zoo.Builder(seed=3)
    y = b.op("Relu", [b.conv("x", 3, 8)])
    y = b.op("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2])
    y = b.conv(y, 8, 4)
    model = b.model({"x": (1, 3, 8, 8)}, y, "pool")
    q = quantize_model(model, random_samples(model, 4, seed=4), report_samples=1).model
    inits = initializers(q)
    scales = [(float(inits[n.input[1]]), int(inits[n.input[2]])) for n in q.graph.node if n.op_type == "QuantizeLinear"]
    pool_in, pool_out = scales[1], scales[2]  # x, the relu (before the pool), the pool's output
    assert pool_in == pool_out


def test_exclusion_by_name_and_by_sensitivity():
    model = zoo.mlp(batch=2)
    data = random_samples(model, 4, seed=5)
    r = quantize_model(model, data, exclude=["gemm13"], report_samples=2)
    kept = {x.name: x for x in r.report.layers}
    assert not kept["gemm13"].quantized and kept["gemm13"].reason == "excluded"
    gemm = next(n for n in r.model.graph.node if n.name == "gemm13")
    assert gemm.input[1] in initializers(r.model)  # its float weight, read directly
    # every layer's SQNR is finite and far below 200 dB: all stay float, and the model equals the float one
    r = quantize_model(model, data, min_sqnr=200.0, report_samples=2)
    assert not any(x.quantized for x in r.report.layers)
    assert all("SQNR below 200" in x.reason for x in r.report.layers)
    assert not any(n.op_type == "QuantizeLinear" for n in r.model.graph.node)
    with pytest.raises(QuantizeError, match="'softmax14' is not a quantizable layer"):
        quantize_model(model, data, exclude=["softmax14"])
    with pytest.raises(QuantizeError, match="'nope' is not a node"):
        quantize_model(model, data, exclude=["nope"])


def test_report_travels_in_the_model_and_measures_error():
    model = zoo.mlp(batch=2)
    r = quantize_model(model, random_samples(model, 4, seed=6), method="percentile", report_samples=3)
    back = read_report(r.model)
    assert back == r.report and back.method == "percentile" and back.report_samples == 3
    assert all(20 < x.sqnr_db < 80 and 0 < x.rel_error < 0.1 for x in back.layers)
    (out,) = back.outputs.values()
    assert out["cosine"] > 0.99 and 0 <= out["top1_agree"] <= 1
    assert "gemm4" in str(back) and "SQNR dB" in str(back)


def test_bf16_rounds_layer_operands_and_matches_onnxruntime():
    import ml_dtypes

    model = zoo.mlp(batch=2)
    r = quantize_model(model, random_samples(model, 3, seed=7), precision="bf16", report_samples=2)
    onnx.checker.check_model(r.model, full_check=True)
    weights = [a for a in initializers(r.model).values() if a.dtype == ml_dtypes.bfloat16]
    assert len(weights) == 3  # one per Gemm/MatMul
    feeds = random_samples(model, 1, seed=70)[0]
    ours = list(ember.compile(r.model).run(feeds).values())[0]
    theirs = ort.InferenceSession(r.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    assert all(x.sqnr_db > 40 for x in r.report.layers)  # bf16 keeps 8 significant bits: ~50 dB


def test_bad_calibration_data_names_the_problem():
    model = zoo.mlp(batch=2)
    with pytest.raises(QuantizeError, match="calibration_data is empty"):
        quantize_model(model, [])
    with pytest.raises(QuantizeError, match=r"sample 1: wants a dict of the inputs \['x'\]"):
        quantize_model(model, [{"x": np.zeros((2, 48), np.float32)}, {"y": np.zeros((2, 48), np.float32)}])
    one = [{"x": np.zeros((2, 48), np.float32)}]
    with pytest.raises(QuantizeError, match="precision must be one of"):
        quantize_model(model, one, precision="fp8")
    with pytest.raises(QuantizeError, match="min_sqnr needs the sensitivity analysis"):
        quantize_model(model, one, min_sqnr=30.0, report_samples=0)
    quick = quantize_model(model, one, report_samples=0)  # no analysis: nothing measured, everything quantized
    assert all(x.quantized and x.sqnr_db is None for x in quick.report.layers) and not quick.report.outputs
    with pytest.raises(QuantizeError, match="already quantized"):
        quantize_model(quick.model, one)


def test_calibration_arrays_split_into_samples(rng):
    model = zoo.mlp(batch=2)
    stacked = rng.standard_normal((5, 2, 48)).astype(np.float32)
    samples = samples_from_arrays(model, {"x": stacked})
    assert len(samples) == 5 and np.array_equal(samples[3]["x"], stacked[3])
    rows = samples_from_arrays(model, {"x": stacked.reshape(10, 48)})
    assert len(rows) == 5 and np.array_equal(rows[3]["x"], stacked[3])
    with pytest.raises(QuantizeError, match="not a multiple of the input's batch size 2"):
        samples_from_arrays(model, {"x": stacked.reshape(10, 48)[:9]})
    with pytest.raises(QuantizeError, match="has shape"):
        samples_from_arrays(model, {"x": stacked.reshape(5, 96)})


def test_command_line(tmp_path, capsys, rng):
    model = zoo.mlp(batch=2)
    onnx.save(model, tmp_path / "mlp.onnx")
    np.savez(tmp_path / "cal.npz", x=rng.standard_normal((8, 48)).astype(np.float32))
    out = tmp_path / "mlp_int8.onnx"
    args = ["quantize", str(tmp_path / "mlp.onnx"), "-o", str(out), "--report-samples", "2"]
    assert main([*args, "--calibration", str(tmp_path / "cal.npz"), "--method", "entropy"]) == 0
    printed = capsys.readouterr()
    assert "int8 (entropy calibration on 4 samples" in printed.out and "warning" not in printed.err
    onnx.checker.check_model(onnx.load(out), full_check=True)
    assert main([*args, "--samples", "3", "--exclude", "gemm4"]) == 0
    printed = capsys.readouterr()
    assert "random inputs" in printed.err and "float (excluded)" in printed.out
    assert main([*args, "--exclude", "nope"]) == 1
    assert "'nope' is not a node" in capsys.readouterr().err


def test_sensitivity_numbers_match_numpy_on_onnxruntime_runs():
    """With one layer, quantizing it alone is the whole quantized model: the layer's SQNR, the output's SQNR and
    numpy's SQNR of onnxruntime's float and quantized runs agree."""
    b = zoo.Builder(seed=8)
    y = b.linear("x", 24, 12, gemm=True)
    model = b.model({"x": (3, 24)}, y, "one_gemm")
    samples = random_samples(model, 4, seed=9)
    r = quantize_model(model, samples, report_samples=4)
    (layer,) = r.report.layers
    (out,) = r.report.outputs.values()
    run_float = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    run_int8 = int8_reference(r.model)
    ref = np.stack([run_float.run(None, s)[0] for s in samples]).astype(np.float64)
    got = np.stack([run_int8.run(None, s)[0] for s in samples]).astype(np.float64)
    sqnr = 10 * np.log10(np.sum(ref**2) / np.sum((got - ref) ** 2))
    assert layer.sqnr_db == pytest.approx(sqnr, abs=0.01) and out["sqnr_db"] == pytest.approx(sqnr, abs=0.01)
    assert layer.rel_error == pytest.approx(np.linalg.norm(got - ref) / np.linalg.norm(ref), rel=1e-3)
