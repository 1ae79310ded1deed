"""Pooling kernels and their schedules: PoolNCHWc (the blocked layout, vectorized over the channel block) with its
knobs, pools inside models with channel counts that are not a multiple of the vector (blocks of 8 or 4, or NCHW),
and the NCHW pools, against onnxruntime and the numpy references on fresh random inputs. Pooling selects or
averages exactly: the tolerances are float32 rounding (and the convolution's, inside models)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.frontend.onnx import from_onnx
from ember.ops import get_op
from ember.ops.layout import relayout
from ember.passes import run_passes
from ember.target import Target
from ember.templates.nchwc import global_parts
from ember.tune.task import Task

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the reference")

TARGET = "c -threads=1"
VARIANTS = [  # op, attrs: ceil_mode, pads, dilation, strides, count_include_pad
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ("MaxPool", {"kernel_shape": [3, 3], "dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    ("MaxPool", {"kernel_shape": [2, 3], "strides": [1, 2], "dilations": [2, 1], "pads": [0, 1, 1, 0], "ceil_mode": 1}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 0, 1], "count_include_pad": 1}),
    ("AveragePool", {"kernel_shape": [2, 2], "strides": [1, 1], "pads": [1, 1, 1, 1], "count_include_pad": 1,
                     "ceil_mode": 1}),  # fmt: skip
    ("AveragePool", {"kernel_shape": [5, 5], "strides": [3, 3], "dilations": [1, 1], "ceil_mode": 1}),
]


def random_input(shape: tuple, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def pool_model(op: str, attrs: dict, shape: tuple, out_shape=("n", "c", "h", "w")):
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], "pool",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))])  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])


def onnx_pool(op: str, attrs: dict, x: np.ndarray) -> np.ndarray:
    """The pool of x (NCHW) by onnxruntime."""
    model = pool_model(op, attrs, x.shape)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def nchwc_attrs(op: str, attrs: dict) -> dict:
    mode = "max" if op == "MaxPool" else "avg"
    return {"mode": mode, "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], **attrs}


def run_nchwc(op: str, attrs: dict, x: np.ndarray, block: int, knobs: dict | None = None) -> np.ndarray:
    """PoolNCHWc on x (NCHW) blocked by `block`, built for TARGET with `knobs` (None: the default schedule); NCHW."""
    xb = relayout(x, "NCHW", f"NCHW{block}c")
    task = Task.from_op("PoolNCHWc", [xb.shape], nchwc_attrs(op, attrs), target=TARGET)
    cfg = None if knobs is None else task.space.entity(knobs)
    sch, args = task.instantiate(cfg)
    f = ember.build(sch, args, target=TARGET)
    y = np.zeros(tuple(int(d) for d in args[-1].shape), np.float32)
    f(xb, y)
    return relayout(y, f"NCHW{block}c", "NCHW")


@pytest.mark.parametrize("op, attrs", VARIANTS, ids=[f"{v[0]}-{i}" for i, v in enumerate(VARIANTS)])
def test_pool_nchwc_default_schedule_matches_onnxruntime(op, attrs):
    x = random_input((2, 32, 11, 14), seed=len(str(attrs)))
    np.testing.assert_allclose(run_nchwc(op, attrs, x, block=16), onnx_pool(op, attrs, x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("block", [4, 8])
def test_pool_nchwc_narrow_blocks_match_onnxruntime(block):
    """Blocks narrower than a vector (channel counts 24, 12): the block is one partial vector."""
    op, attrs = VARIANTS[1]
    x = random_input((1, 3 * block, 9, 10), seed=block)
    np.testing.assert_allclose(run_nchwc(op, attrs, x, block=block), onnx_pool(op, attrs, x), rtol=1e-6, atol=1e-6)


def test_pool_nchwc_interior_has_no_bounds_checks():
    """The padded border is a partition of its own: the interior tiles read the input without conditions. (With
    8 lanes, AVX2, a tile is 4 columns of two vectors, and the loop over column tiles keeps its left border's
    check: `i3_outer >= 1 ? load : -inf`, a select per vector; rows are partitioned.)"""
    task = Task.from_op("PoolNCHWc", [(1, 2, 30, 30, 16)], nchwc_attrs(*VARIANTS[1]), target=TARGET)
    sch, args = task.instantiate(None)
    src = ember.build(sch, args, target=TARGET).source
    body = src[src.index("int32_t default_function(") :]
    lanes = Target.parse(TARGET).vector_lanes(32)
    selects = [line for line in body.splitlines() if "?" in line]
    assert "-INFINITY" in body  # border cells are the pad value
    assert all("i3_outer >= 1 ?" in line for line in selects) and (lanes < 16 or not selects)
    assert f"ember_vload_float32x{lanes}" in body and "gather" not in body


PROPERTY = settings(max_examples=int(os.environ.get("EMBER_PROPERTY_EXAMPLES", "6")), deadline=None,
                    derandomize=os.environ.get("EMBER_PROPERTY_RANDOM", "") in ("", "0"),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip


@pytest.mark.property
@PROPERTY
@given(data=st.data())
def test_pool_nchwc_any_knobs_match_reference(data):
    """Any point of the PoolNCHWc config space (positions and rows per tile, the window unrolled or not) on a random
    pool computes the numpy reference."""
    op = data.draw(st.sampled_from(["MaxPool", "AveragePool"]), label="op")
    k = [data.draw(st.integers(1, 3), label="kh"), data.draw(st.integers(1, 3), label="kw")]
    attrs = {"kernel_shape": k, "strides": [data.draw(st.integers(1, 2), label=f"s{i}") for i in range(2)],
             "dilations": [data.draw(st.integers(1, 2), label=f"d{i}") for i in range(2)],
             "pads": [data.draw(st.integers(0, k[i % 2] - 1), label=f"p{i}") for i in range(4)],
             "ceil_mode": data.draw(st.integers(0, 1), label="ceil")}  # fmt: skip
    if op == "AveragePool":
        attrs["count_include_pad"] = data.draw(st.integers(0, 1), label="count_include_pad")
    x = random_input((1, 32, data.draw(st.integers(5, 12), label="h"), data.draw(st.integers(5, 12), label="w")),
                     seed=data.draw(st.integers(0, 2**16), label="seed"))  # fmt: skip
    xb = relayout(x, "NCHW", "NCHW16c")
    space = Task.from_op("PoolNCHWc", [xb.shape], nchwc_attrs(op, attrs), target=TARGET).space
    knobs = space.get(data.draw(st.integers(0, len(space) - 1), label="point")).values
    note(f"{op} {attrs} {x.shape} {knobs}")
    ref = get_op(op).reference({**get_op(op).check_attrs(attrs)}, x)
    ref = ref[0] if isinstance(ref, tuple | list) else ref
    np.testing.assert_allclose(run_nchwc(op, attrs, x, 16, knobs), ref, rtol=1e-6, atol=1e-6)


def conv_pool_model(op: str, attrs: dict, channels: int, seed: int, out_shape=("n", "c", "h", "w")):
    """1x1 conv to `channels`, relu, the pool (the conv makes the blocked layout the pool then stays in); out_shape:
    the output's declared dims (symbolic until onnxruntime gave them)."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((channels, 8, 1, 1)) / 3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node(op, ["r"], ["y"], **attrs)]  # fmt: skip
    g = helper.make_graph(nodes, "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 13])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))],
                          [numpy_helper.from_array(w, "w")])  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])


@pytest.mark.parametrize("channels", [24, 12, 6])
@pytest.mark.parametrize("variant", [0, 6])
def test_pools_in_models_with_odd_channel_counts(monkeypatch, channels, variant):
    """Channel counts that are not a multiple of the vector: blocked by 8 or 4, or left NCHW (6 channels)."""
    monkeypatch.setattr("ember.passes.layout.MIN_MACS", 0)  # the small conv starts a blocked region
    op, attrs = VARIANTS[variant]
    model = conv_pool_model(op, attrs, channels, seed=channels)
    feeds = {"x": random_input((1, 8, 12, 13), seed=channels + variant)}
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    model = conv_pool_model(op, attrs, channels, seed=channels, out_shape=ref.shape)
    g, _ = run_passes(from_onnx(model), opt_level=3, disabled=["fuse_ops"], target=TARGET)
    assert sum(n.op == "PoolNCHWc" for n in g.nodes) == (channels % 4 == 0)
    got = ember.compile(model, target=TARGET, fallback=False).run(feeds)["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))


@pytest.mark.parametrize("op, attrs", VARIANTS[:2] + VARIANTS[5:7], ids=["max-ceil", "max-pad", "avg-ceil", "avg-inc"])
@pytest.mark.parametrize("width", [15, 40])
def test_nchw_pools_match_onnxruntime(op, attrs, width):
    """Pools left in NCHW (no convolution before them): rows in vectors along the width, strided or not."""
    x = random_input((1, 3, 9, width), seed=width)
    ref = onnx_pool(op, attrs, x)
    np.testing.assert_allclose(ember.compile(pool_model(op, attrs, x.shape, ref.shape), target=TARGET,
                                             fallback=False)(x), ref, rtol=1e-6, atol=1e-6)  # fmt: skip


def test_nchw_strided_pool_reads_rows_without_gathers():
    """A stride-2 window along the row is read as two contiguous vectors and a shuffle (`stride2_load`), and the
    padded copy is made per channel tile, inside the tile loop."""
    task = Task.from_op("AveragePool", [(1, 4, 20, 40)], {**VARIANTS[5][1], "dilations": [1, 1]}, target=TARGET)
    sch, args = task.instantiate(None)
    f = ember.build(sch, args, target=TARGET)
    body = f.source[f.source.index("int32_t default_function(") :]
    assert "ember_vload_stride2_float32x" in body and "gather" not in body
    assert body.index("for (") < body.index("// avgpool_pad:")  # the padded copy is made inside the tile loop
    x = random_input((1, 4, 20, 40), seed=3)
    y = np.zeros(tuple(int(d) for d in args[-1].shape), np.float32)
    f(x, y)
    np.testing.assert_allclose(y, onnx_pool("AveragePool", VARIANTS[5][1], x), rtol=1e-6, atol=1e-6)


GLOBALS = [((7, 7), 16, None), ((13, 13), 8, None), ((5, 6), 16, 2), ((11, 3), 4, 1)]  # (H, W), block, parts knob


@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("hw, block, parts", GLOBALS)
def test_global_pool_nchwc_matches_onnxruntime(mode, hw, block, parts):
    """Global pooling as a row reduction into independent partial vectors (`global_parts`, or the `parts` knob)."""
    x = random_input((2, 2 * block, *hw), seed=hw[0] * block)
    xb = relayout(x, "NCHW", f"NCHW{block}c")
    task = Task.from_op("GlobalPoolNCHWc", [xb.shape], {"mode": mode}, target=TARGET)
    sch, args = task.instantiate(None if parts is None else task.space.entity({"parts": parts}))
    y = np.zeros(tuple(int(d) for d in args[-1].shape), np.float32)
    ember.build(sch, args, target=TARGET)(xb, y)
    ref = onnx_pool("GlobalMaxPool" if mode == "max" else "GlobalAveragePool", {}, x)
    np.testing.assert_allclose(relayout(y, f"NCHW{block}c", "NCHW"), ref, rtol=1e-5, atol=1e-6)


def test_global_parts():
    assert [global_parts(n) for n in (49, 196, 3136, 169, 30, 13, 1)] == [7, 7, 8, 13, 6, 13, 1]


@pytest.mark.property
@PROPERTY
@given(data=st.data())
def test_depthwise_nchwc_any_knobs_match_reference(data):
    """The depthwise convolution shares the window template (tiles of DEPTHWISE_TILE by default): any point of its
    config space computes the numpy reference."""
    stride = data.draw(st.integers(1, 2), label="stride")
    h, w = data.draw(st.integers(4, 11), label="h"), data.draw(st.integers(4, 11), label="w")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    x, wt = rng.standard_normal((1, 2, h, w, 16)).astype(np.float32), rng.standard_normal((2, 1, 3, 3, 1, 16))
    attrs = {"pads": [1, 1, 1, 1], "strides": [stride, stride], "dilations": [1, 1], "group": 32}
    task = Task.from_op("ConvNCHWc", [x.shape, wt.shape], attrs, target=TARGET)
    knobs = task.space.get(data.draw(st.integers(0, len(task.space) - 1), label="point")).values
    note(f"{h}x{w} stride {stride} {knobs}")
    sch, args = task.instantiate(task.space.entity(knobs))
    y = np.zeros(tuple(int(d) for d in args[-1].shape), np.float32)
    ember.build(sch, args, target=TARGET)(x, wt.astype(np.float32), y)
    ref = get_op("ConvNCHWc").reference(get_op("ConvNCHWc").check_attrs(attrs), x, wt.astype(np.float32))
    ref = ref[0] if isinstance(ref, tuple | list) else ref
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
