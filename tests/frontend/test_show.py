"""`ember show`: the printed graph, the summary, and exit status on bad input."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ember.frontend.show import show_main


def save_model(path, dims=("N", 3, 8, 8)) -> str:
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], name="conv")
    graph = helper.make_graph([node], "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(dims))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 8, 8])], [w])  # fmt: skip
    onnx.save(helper.make_model(graph), str(path))
    return str(path)


def test_show_prints_the_graph(tmp_path, capsys):
    assert show_main([save_model(tmp_path / "m.onnx")]) == 0
    out = capsys.readouterr().out
    assert "graph net(%x: float32[1, 3, 8, 8])" in out and "%y = Conv(%x, %w)" in out


def test_show_summary_with_input_shape(tmp_path, capsys):
    assert show_main([save_model(tmp_path / "m.onnx"), "--input-shape", "x=2,3,8,8", "--summary"]) == 0
    out = capsys.readouterr().out
    assert "1 nodes, 1 constants (108 elements" in out and "x: float32[2, 3, 8, 8]" in out and "1  Conv" in out


def test_show_fails_cleanly(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage")
    assert show_main([str(bad)]) == 1
    assert "ember show: " in capsys.readouterr().err
    assert show_main([str(tmp_path / "missing.onnx")]) == 1
    assert "no such file" in capsys.readouterr().err
