"""Measured convolution algorithms: `algorithm_choices` makes ConvertLayout run a 3x3 convolution as the named
implementation (each computing onnxruntime's result), `measure_algorithms` times them and logs its choice, a
re-run resumes from the log, and `ember.compile(..., tuning_log=...)` runs the logged choice."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.passes.layout import CONV_ALGORITHMS, AlgorithmChoices, algorithm_choices
from ember.target import Target
from ember.te.config import algorithms, load_tuned
from ember.tune.algorithms import algorithms_table, conv_workloads, measure_algorithms

ort = pytest.importorskip("onnxruntime", reason="the oracle for each algorithm's result")
KERNEL_OP = {"direct": "ConvNCHWc", "winograd2": "ConvWinogradNCHWc", "winograd4": "ConvWinogradNCHWc"}


def conv_model(c: int = 16, size: int = 24) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) * 0.1).astype("float32"), "w")
    b = numpy_helper.from_array(rng.standard_normal(c).astype("float32"), "b")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, size, size])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, size, size])
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["t"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
             helper.make_node("Relu", ["t"], ["y"])]  # fmt: skip
    return helper.make_model(helper.make_graph(nodes, "conv3x3", [x], [y], [w, b]),
                             opset_imports=[helper.make_opsetid("", 17)])  # fmt: skip


def conv_ops(model) -> set[str]:
    return {op for r in model.profile(repeat=1) for op in r["ops"] if op.startswith("Conv")}


@pytest.mark.parametrize("algorithm", CONV_ALGORITHMS)
def test_each_algorithm_computes_the_convolution(tmp_path, algorithm):
    path = str(tmp_path / "conv.onnx")
    onnx.save(conv_model(), path)
    seen = AlgorithmChoices()
    with algorithm_choices(seen):
        ember.compile(conv_model(), target="c")
    (key,) = seen.seen  # the one 3x3 convolution, with the estimate's choice
    assert seen.seen[key] in CONV_ALGORITHMS
    with algorithm_choices({key: algorithm}):
        m = ember.compile(conv_model(), target="c")
    assert conv_ops(m) == {KERNEL_OP[algorithm]}
    x = np.random.default_rng(1).standard_normal((1, 16, 24, 24)).astype("float32")
    (ref,) = ort.InferenceSession(path).run(None, {"x": x})
    np.testing.assert_allclose(m(x), ref, rtol=1e-4, atol=1e-4)  # Winograd's transforms round differently


def test_unknown_algorithm_is_refused():
    bad = {"conv3x3:float32:16x24x24:k16:pads1,1,1,1": "fft"}
    with pytest.raises(ValueError, match="unknown convolution algorithm.*'fft'.*direct, winograd2, winograd4"):
        algorithm_choices(bad).__enter__()


def test_measured_choice_is_logged_resumed_and_compiled(tmp_path):
    log = str(tmp_path / "algo.jsonl")
    model = conv_model()
    (key,) = conv_workloads(model, Target.parse("c"))
    seen: list = []
    (res,) = measure_algorithms(model, "c", log=log, rounds=1, repeat=1, progress=seen.append)
    assert seen == [res] and res.key == key and set(res.times) == set(CONV_ALGORITHMS)
    assert all(t > 0 for t in res.times.values()) and res.chosen in CONV_ALGORITHMS and not res.resumed
    assert key in algorithms_table([res])
    (rec,) = [json.loads(line) for line in Path(log).read_text().splitlines()]
    assert rec["workload"] == "algo:" + key and rec["confirmed"] is True
    assert algorithms(load_tuned(log, "c")) == {key: res.chosen}
    (again,) = measure_algorithms(model, "c", log=log)  # a re-run takes the log's choice, measures nothing
    assert again.resumed and again.chosen == res.chosen and again.times == res.times
    # a log that chose another algorithm than the estimate: the compile runs that one
    other = next(a for a in ("winograd2", "direct") if KERNEL_OP[a] != KERNEL_OP[res.default])
    rec = dict(rec, config={"index": 0, "knobs": {"algorithm": other}}, cost=rec["cost"] / 10)
    with open(log, "a") as f:
        f.write(json.dumps(rec) + "\n")
    m = ember.compile(model, target="c", tuning_log=log)
    assert conv_ops(m) == {KERNEL_OP[other]}


@pytest.mark.parametrize("flag", [[], ["--no-algorithms"]])
def test_tune_cli_measures_algorithms_first(tmp_path, capsys, flag):
    from ember.cli import main

    path, log = str(tmp_path / "conv.onnx"), str(tmp_path / "tune.jsonl")
    onnx.save(conv_model(), path)
    assert main(["tune", path, "--trials", "1", "--batch-size", "1", "--target", "c", "--log", log, *flag]) == 0
    out = capsys.readouterr().out
    recs = [json.loads(line) for line in Path(log).read_text().splitlines()]
    algo = [r for r in recs if r["template"] == "algorithm"]
    if flag:
        assert "convolution algorithms" not in out and not algo
    else:
        assert "convolution algorithms, measured" in out and "conv3x3:float32:16x24x24:k16" in out, out
        assert len(algo) == 1 and algo[0]["config"]["knobs"]["algorithm"] in CONV_ALGORITHMS
    assert "tunable workload(s)" in out  # then the kernels (as the chosen algorithm makes them) were extracted
