"""Ctrl-C reaches a long native call within a second (it used to take effect only when the call returned), and
the model still answers right afterwards."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import time
import numpy as np
import ember
from ember import zoo

b = zoo.Builder(0)
y = b.op("ReduceSum", [b.op("Expand", ["x", b.const(np.array([1 << 21, 1 << 16], np.int64))])], keepdims=0)
m = ember.compile(b.model({"x": (1, 1)}, y), "c -threads=1", max_elements=1 << 38)  # 1.4e11 additions: seconds
small = np.full((1, 1), 0.5, np.float32)
print("go", flush=True)
t0 = time.perf_counter()
try:
    m(small)
    print("finished", flush=True)
except KeyboardInterrupt:
    print(f"interrupted {time.perf_counter() - t0:.3f}", flush=True)
"""


def test_ctrl_c_interrupts_a_long_native_call(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "go", proc.stderr.read()
        time.sleep(0.5)
        sent = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        line = proc.stdout.readline().strip()
        waited = time.perf_counter() - sent
    finally:
        proc.kill()
        proc.wait()
    assert line.startswith("interrupted"), line
    assert waited < 1.5, f"Ctrl-C took {waited:.2f} s to interrupt the call"


def test_a_symbolic_segment_is_interruptible_by_the_flops_of_the_call(monkeypatch):
    """Whether a segment runs on the interruptible caller thread (a thread hand-off per call) is decided by its FLOPs
    at the call's sizes, not at the compile's size hint: a short call stays on the calling thread."""
    import numpy as np
    from onnx import TensorProto, helper

    import ember
    from ember.runtime import executor

    rng = np.random.default_rng(0)
    wm = rng.standard_normal((64, 64)).astype(np.float32)
    w = helper.make_tensor("w", TensorProto.FLOAT, [64, 64], wm.ravel())
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm", [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    monkeypatch.setattr(executor, "INTERRUPTIBLE_FLOPS", 2 * 64 * 64 * 100)  # between N = 1 and N = 400
    cm = ember.compile(model, target="c", dynamic_bounds={"N": (1, 512)})
    for n, long in ((1, False), (400, True)):
        a = rng.standard_normal((n, 64)).astype(np.float32)
        np.testing.assert_allclose(cm(a), a @ wm, rtol=1e-4, atol=1e-4)
        assert list(cm._local.values.prepared.long.values()) == [long]
