"""A tuning log with lines that are not records (invalid UTF-8, wrong field types) is read by both readers (resume
and `ember.compile(tuning_log=...)`): the bad lines are skipped with one warning naming the file and the lines."""

import json
import warnings

import pytest

from ember.te.config import LogWarning, load_best, load_tuned, read_records
from ember.tune import TuningLog


def rec(index: int, cost: float | None, **extra) -> dict:
    return {"workload": "w1", "target": "c", "config": {"index": index, "knobs": {"a": index}}, "cost": cost,
            "error": None, **extra}  # fmt: skip


def write_log(path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(line + b"\n" for line in lines))


def bad_log(path) -> None:
    """Lines 2 (invalid UTF-8), 4 (config 7), 5 (cost "abc"), 6 (workload 3), 7 (knobs a list) are not records;
    line 3 is a version-1 record (no schedule); the best good record is line 3's."""
    write_log(path, [
        json.dumps(rec(1, 2.0, version=2, schedule=None)).encode(),
        json.dumps(rec(9, 0.001)).encode()[:-20] + b"\xff\xfe\x80" + b'"}',
        json.dumps(rec(2, 1.0, version=1)).encode(),
        json.dumps({**rec(3, 0.5), "config": 7}).encode(),
        json.dumps(rec(4, "abc")).encode(),
        json.dumps({**rec(5, 0.1), "workload": 3}).encode(),
        json.dumps({**rec(6, 0.1), "config": {"index": 6, "knobs": [1, 2]}}).encode(),
    ])  # fmt: skip


def one_warning(record: list[warnings.WarningMessage], path) -> str:
    ours = [str(w.message) for w in record if issubclass(w.category, LogWarning)]
    assert len(ours) == 1, ours
    msg = ours[0]
    assert str(path) in msg
    return msg


def test_read_records_skips_bad_lines_with_one_warning(tmp_path):
    path = tmp_path / "log.jsonl"
    bad_log(path)
    with pytest.warns(LogWarning) as record:
        recs = list(read_records(path))
    assert [r["config"]["index"] for r in recs] == [1, 2]
    msg = one_warning(record, path)
    assert "5 unreadable line(s)" in msg
    for part in ("2 (invalid UTF-8)", "4 (config is not an object", "5 (cost is not a number", "6 (workload",
                 "7 (config is not an object"):  # fmt: skip
        assert part in msg, msg


def test_load_tuned_skips_bad_lines(tmp_path):
    path = tmp_path / "log.jsonl"
    bad_log(path)
    with pytest.warns(LogWarning) as record:
        tuned = load_tuned(path, "c")
    assert tuned["w1"].config.values == {"a": 2} and tuned["w1"].schedule is None  # version 1: no schedule
    msg = one_warning(record, path)
    assert "2 (invalid UTF-8)" in msg and "5 (cost" in msg


def test_resume_reader_skips_bad_lines(tmp_path):
    path = tmp_path / "log.jsonl"
    bad_log(path)
    with pytest.warns(LogWarning) as record:
        measured = TuningLog(path).measured("w1", "c")
    assert sorted(json.loads(k)["a"] for k in measured) == [1, 2]
    one_warning(record, path)


def test_torn_last_line_is_skipped_silently(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_bytes(json.dumps(rec(1, 2.0)).encode() + b"\n" + b'{"workload": "w1", "conf\xc3')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_best(path, "c")["w1"].values == {"a": 1}


def test_ember_compile_reads_a_log_with_bad_lines(tmp_path):
    """ember.compile(tuning_log=...) with invalid UTF-8 and wrong types in the log: compiles, warns, names the lines."""
    import numpy as np

    import ember

    path = tmp_path / "log.jsonl"
    write_log(path, [b"\xff\xff not utf-8", json.dumps({"workload": "w", "config": 7, "cost": "abc"}).encode()])
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])  # fmt: skip
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.warns(LogWarning) as record:
        m = ember.compile(model, "c", tuning_log=str(path))
    msg = one_warning(record, path)
    assert "1 (invalid UTF-8)" in msg and "2 (config is not an object" in msg
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(m(x), np.maximum(x, 0))
