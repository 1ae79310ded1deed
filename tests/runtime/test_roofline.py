"""The roofline: the machine's limits measured once and cached, and every profiled kernel held to them.

Fractions are a kernel's least possible time over its measured time: on a machine shared with other work they
are low, never much above 1 (the limits are the best of several trials, and a kernel cannot beat them)."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper

import ember
from ember.runtime import roofline

TARGET = "c -threads=1"  # one thread: a quick measurement, and steady on a busy machine


def model_of(node: onnx.NodeProto, inputs: dict[str, tuple], out: tuple, inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(
        [node], "m", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, out)], list(inits),
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_limits_measured_once_cached_and_reread(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    first = roofline.limits_for(TARGET)
    assert first is not None and first.peak_gflops > 0.1 and first.threads == 1
    sizes = [s for s, _ in first.bandwidth_gbs]
    assert sizes == sorted(sizes) and all(g > 0.1 for _, g in first.bandwidth_gbs)
    path = roofline.cache_path(ember.target.Target.parse(TARGET))
    assert path.is_file() and json.loads(path.read_text())["peak_gflops"] == first.peak_gflops

    def refuse(target):
        raise AssertionError("measured again: the cached limits were not read")

    monkeypatch.setattr(roofline, "measure_limits", refuse)
    assert roofline.limits_for(TARGET) == first
    assert roofline.limits_for("cuda") is None  # not a target of this process
    path.write_text("{torn")
    assert roofline.limits_for(TARGET, measure=False) is None  # a torn file is not trusted
    assert not list(path.parent.glob(".*"))  # no temporary file left behind


def test_bound_classes_copy_as_memory_and_big_gemm_as_compute():
    limits = roofline.limits_for(TARGET)
    assert limits is not None
    n = 1 << 22  # a copy: no FLOPs, 2 x 16 MiB
    assert limits.bound(0, 2 * 4 * n)[1] == "memory"
    m = 1024  # a 1024^3 GEMM: 2 GFLOP over 12 MiB
    assert limits.bound(2 * m**3, 3 * 4 * m * m)[1] == "compute"
    assert limits.bandwidth_for(1) >= limits.bandwidth_for(1 << 40) == limits.dram_gbs


def test_profile_reports_roofline_per_kernel_and_for_the_model():
    rng = np.random.default_rng(7)
    m, k, n = 256, 256, 256
    w = rng.standard_normal((k, n)).astype(np.float32)
    gemm = model_of(helper.make_node("MatMul", ["x", "w"], ["y"]), {"x": (m, k)}, (m, n),
                    [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel())])  # fmt: skip
    add = model_of(helper.make_node("Add", ["a", "b"], ["y"]), {"a": (1 << 20,), "b": (1 << 20,)}, (1 << 20,))
    classes = {}
    for name, model in (("gemm", gemm), ("add", add)):
        cm = ember.compile(model, target=TARGET, fallback=False)
        feeds = [rng.standard_normal(s).astype(np.float32) for s in ((m, k),)] if name == "gemm" else [
            rng.standard_normal(1 << 20).astype(np.float32) for _ in range(2)]  # fmt: skip
        ref = feeds[0] @ w if name == "gemm" else feeds[0] + feeds[1]
        np.testing.assert_allclose(cm(*feeds), ref, rtol=1e-4, atol=1e-3)
        rows = cm.profile(feeds, repeat=3)
        assert rows and all(r["bytes"] > 0 for r in rows)
        for r in rows:
            assert 0 < r["roofline"] <= 1.5, r
            assert r["gbs"] > 0 and r["bound"] in ("compute", "memory")
        classes[name] = rows[0]["bound"]
        assert rows[0]["bytes"] >= sum(a.nbytes for a in feeds)
        s = cm.summary()["roofline"]
        assert 0 < s["fraction"] <= 1.5 and s["peak_gflops"] > 0 and s["dram_gbs"] > 0
        assert "roof" in cm.profile_table(feeds)
    assert classes == {"gemm": "compute", "add": "memory"}


def test_bandwidth_between_working_sets_is_interpolated_in_log_size():
    limits = roofline.Limits(100.0, ((1 << 10, 80.0), (1 << 20, 40.0), (1 << 30, 10.0)), 1)
    assert limits.bandwidth_for(10) == 80.0 and limits.bandwidth_for(1 << 40) == limits.dram_gbs == 10.0
    assert limits.bandwidth_for(1 << 15) == 60.0 and limits.bandwidth_for(1 << 25) == 25.0
    assert limits.bound(0, 1 << 20) == ((1 << 20) / 40e9, "memory")
    assert limits.bound(10**9, 1 << 20) == (10**9 / 100e9, "compute")


def test_flops_count_the_product_not_its_padding_or_packing():
    """A batched score product Q K^T (197 columns: the GEMM pads them to whole panels and packs K) scaled by a
    constant: 2 M N K per batch plus one multiply per element; the packing, the crop and the padded columns of
    the accumulation count nothing (they had inflated the bound of the attention scores by 15%)."""
    from ember.tune import Task

    b, m, n, k = 2, 37, 197, 64
    task = Task.from_op("MatMul", [(b, m, k), (b, k, n)], {}, target=TARGET)
    assert task.flops == 2 * b * m * n * k
    sch, args = task.instantiate(None)
    names = {st.op.name for st in sch.stages}
    assert any("pack" in name for name in names), names  # the case in point: a packed, padded product
    out = args[-1]
    y = ember.te.compute(out.shape, lambda *i: out[i] * 0.125, name="scaled")
    assert ember.kernels.flops([y]) == 2 * b * m * n * k + b * m * n


def test_integer_products_are_held_to_the_int8_peak():
    """8-bit multiply-accumulates count against the dot-product peak (four products per 32-bit lane): an int8
    convolution's fraction stays at most ~1 where the float peak made it 3x; without such an instruction
    (peak 0) they count against the float peak as before."""
    limits = roofline.Limits(100.0, ((1 << 30, 10.0),), 1, peak_int8_gops=400.0)
    assert limits.bound(10**9, 0, int_flops=8 * 10**8) == (2 * 10**8 / 100e9 + 8 * 10**8 / 400e9, "compute")
    no_dot = roofline.Limits(100.0, ((1 << 30, 10.0),), 1)
    assert no_dot.bound(10**9, 0, int_flops=8 * 10**8) == (10**9 / 100e9, "compute")
    from tests.passes.test_integer_attention import qdq

    rng = np.random.default_rng(3)
    nodes, inits = [], []
    xd = qdq(nodes, inits, "x", 0.05, 128, np.uint8)
    w = rng.integers(-127, 128, (64, 64, 3, 3)).astype(np.int8)
    inits += [onnx.numpy_helper.from_array(w, "w_q"), onnx.numpy_helper.from_array(np.float32(0.01), "w_s"),
              onnx.numpy_helper.from_array(np.int8(0), "w_z"), onnx.numpy_helper.from_array(np.float32(0.2), "y_s"),
              onnx.numpy_helper.from_array(np.uint8(128), "y_z")]  # fmt: skip
    nodes += [helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w"]),
              helper.make_node("Conv", [xd, "w"], ["c"], pads=[1, 1, 1, 1]),
              helper.make_node("QuantizeLinear", ["c", "y_s", "y_z"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 64, 28, 28))],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, (1, 64, 28, 28))], inits)
    cm = ember.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), target=TARGET)
    rows = cm.profile(repeat=3)
    conv = next(r for r in rows if "QConvPacked" in r["ops"])
    assert conv["int_flops"] >= 2 * 64 * 64 * 9 * 28 * 28 and conv["int_flops"] <= conv["flops"]
    if cm.summary()["roofline"]["peak_int8_gops"]:  # (a machine with VNNI or AVX-VNNI)
        assert 0 < conv["roofline"] <= 1.5, conv
