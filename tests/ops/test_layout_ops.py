"""The blocked-layout operators of `ember.ops.layout`: layout strings, references against onnxruntime's NCHW
operators, native kernels against the references, shape-rule errors.

Each group of independent nodes is one graph compiled once (`fallback=False`). Shapes cover the templates of
`ember.templates.nchwc`: dense tiles of 1, 2 and 4 channel blocks, rows split into balanced tiles and several
short rows per tile, blocks of 16, 8 and 1 (an RGB input), strides, dilations, asymmetric pads (bounds checks in
the border tiles), depthwise with stride 2, pooling with ceil mode, global pooling. Float32 sums run in another
order than the float64 references: tolerance rtol 1e-4 with atol scaled to the output's largest value."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import ember
from ember.graph.ir import Graph, Node, Value
from ember.graph.types import TensorType
from ember.ops import get_op
from ember.ops.common import ShapeError
from ember.ops.layout import Layout, relayout
from ember.templates.nchwc import k_chunk, nchwc_plan

ort = pytest.importorskip("onnxruntime")
RTOL = 1e-4


def close(a: np.ndarray, b: np.ndarray) -> None:
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=1e-5 * max(float(np.abs(b).max()), 1.0))


def conv_case(rng, n, c, k, hw, ks, s, pads, cb, kb, dw=False, dil=1, bias=True):
    """(attrs, [x blocked, w packed, b], NCHW x, OIHW w)."""
    x = rng.standard_normal((n, c, *hw)).astype(np.float32)
    w = (rng.standard_normal((k, 1 if dw else c, ks, ks)) / ks).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32) if bias else None
    a = {"strides": (s, s), "pads": pads, "dilations": (dil, dil), "group": c if dw else 1}
    xb = relayout(x, "NCHW", f"NCHW{cb}c")
    wb = relayout(w, "OIHW", f"OIHW{1 if dw else cb}i{kb}o")
    return a, [xb, wb] + ([b] if bias else []), x, w


CONVS = [  # n, c, k, (h, w), kernel, stride, pads, cb, kb, depthwise, dilation, bias
    (1, 32, 64, (9, 30), 3, 1, (1, 1, 1, 1), 16, 16, False, 1, True),  # 2 blocks per tile, 2 tiles per row
    (2, 16, 48, (7, 7), 3, 1, (1, 1, 1, 1), 16, 16, False, 1, False),  # short rows: several rows per tile
    (1, 3, 32, (17, 19), 7, 2, (3, 2, 3, 2), 1, 16, False, 1, True),  # RGB input (block 1), asymmetric pads
    (1, 24, 16, (11, 13), 1, 2, (0, 0, 0, 0), 8, 16, False, 1, True),  # 1x1 strided, block 8 in
    (1, 64, 24, (10, 10), 1, 1, (0, 0, 0, 0), 16, 8, False, 1, True),  # block 8 out
    (1, 16, 16, (12, 12), 3, 1, (2, 2, 2, 2), 16, 16, False, 2, True),  # dilation
    (1, 32, 32, (15, 15), 3, 1, (1, 1, 1, 1), 16, 16, True, 1, True),  # depthwise
    (1, 48, 48, (14, 13), 3, 2, (1, 1, 1, 1), 16, 16, True, 1, True),  # depthwise, stride 2
    (1, 24, 24, (9, 9), 5, 1, (2, 2, 2, 2), 8, 8, True, 1, False),  # depthwise 5x5, block 8
    # pointwise, a tile's weights beyond L1: the reduction in chunks (`k_chunk`), the last one partial (37 blocks)
    (1, 296, 32, (7, 7), 1, 1, (0, 0, 0, 0), 8, 8, False, 1, True),
    (1, 512, 64, (5, 5), 1, 1, (0, 0, 0, 0), 16, 16, False, 1, False),
    (1, 320, 32, (9, 9), 1, 2, (0, 0, 0, 0), 8, 8, False, 1, True),  # strided
]


def graph_of(cases: list[tuple[str, dict, list[np.ndarray], int]]) -> tuple[Graph, list[np.ndarray]]:
    """One graph of independent nodes (op, attrs, arrays, how many leading arrays are inputs; the rest
    are constants), outputs in order."""
    ins, outs, nodes, feeds = [], [], [], []
    for i, (op, attrs, arrays, n_in) in enumerate(cases):
        vals = []
        for j, a in enumerate(arrays):
            if j < n_in:
                v = Value(f"x{i}_{j}", TensorType(a.shape, a.dtype.name))
                ins.append(v)
                feeds.append(a)
            else:
                v = Value.constant(f"c{i}_{j}", a)
            vals.append(v)
        opdef = get_op(op)
        attrs = opdef.check_attrs(attrs)
        (t,) = opdef.infer(attrs, *[v.type for v in vals])
        out = Value(f"y{i}", t)
        nodes.append(Node(op, vals, [out], attrs, f"n{i}"))
        outs.append(out)
    return Graph("layout_ops", ins, outs, nodes), feeds


def ort_node(op: str, attrs: dict, arrays: list[np.ndarray]) -> np.ndarray:
    names = [f"i{k}" for k in range(len(arrays))]
    node = helper.make_node(op, names, ["y"], **attrs)
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape) for n, a in zip(names, arrays)]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, dict(zip(names, arrays)))[0]  # fmt: skip


# -- layouts ----------------------------------------------------------------------------------------------
def test_layout_strings_and_relayout_round_trips():
    assert str(Layout.parse("NCHW16c")) == "NCHW16c"
    assert Layout.parse("OIHW8i16o").block("I") == 8
    x = np.arange(2 * 32 * 3 * 5, dtype=np.float32).reshape(2, 32, 3, 5)
    xb = relayout(x, "NCHW", "NCHW16c")
    assert xb.shape == (2, 2, 3, 5, 16) and xb[1, 1, 2, 4, 3] == x[1, 16 + 3, 2, 4]
    np.testing.assert_array_equal(relayout(xb, "NCHW16c", "NCHW"), x)
    np.testing.assert_array_equal(relayout(relayout(xb, "NCHW16c", "NCHW8c"), "NCHW8c", "NCHW"), x)
    np.testing.assert_array_equal(relayout(x, "NCHW", "NHWC"), x.transpose(0, 2, 3, 1))
    w = np.arange(32 * 16 * 3 * 3, dtype=np.float32).reshape(32, 16, 3, 3)
    wb = relayout(w, "OIHW", "OIHW8i16o")
    assert wb.shape == (2, 2, 3, 3, 8, 16) and wb[1, 1, 2, 0, 5, 7] == w[16 + 7, 8 + 5, 2, 0]
    for bad in ("NCHW16", "NCHWc", "NCHW16C", "NCHW0c", "NCCHW", "NHW16c"):
        with pytest.raises(ValueError):
            Layout.parse(bad)


def test_layout_transform_kernels():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 48, 5, 7)).astype(np.float32)
    xb = relayout(x, "NCHW", "NCHW16c")
    cases = [("LayoutTransform", {"src_layout": "NCHW", "dst_layout": "NCHW16c"}, [x], 1),
             ("LayoutTransform", {"src_layout": "NCHW16c", "dst_layout": "NCHW"}, [xb], 1),
             ("LayoutTransform", {"src_layout": "NCHW16c", "dst_layout": "NCHW8c"}, [xb], 1),
             ("LayoutTransform", {"src_layout": "NCHW", "dst_layout": "NHWC"}, [x], 1)]  # fmt: skip
    g, feeds = graph_of(cases)
    got = ember.compile(g, fallback=False)(*feeds)
    for (op, attrs, arrays, _), y in zip(cases, got):
        np.testing.assert_array_equal(y, get_op(op).reference(attrs, *arrays)[0])


def test_layout_transform_shape_errors():
    infer = get_op("LayoutTransform").infer
    with pytest.raises(ShapeError, match="blocks of 16"):
        infer({"src_layout": "NCHW", "dst_layout": "NCHW16c"}, TensorType((1, 24, 4, 4), "float32"))
    with pytest.raises(ShapeError, match="different axes"):
        infer({"src_layout": "NCHW", "dst_layout": "NHWD"}, TensorType((1, 24, 4, 4), "float32"))


# -- convolution -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CONVS, ids=[f"{c[1]}to{c[2]}k{c[4]}s{c[5]}{'dw' if c[9] else ''}" for c in CONVS])
def test_conv_nchwc_reference_matches_onnxruntime(case):
    rng = np.random.default_rng(1)
    n, c, k, hw, ks, s, pads, cb, kb, dw, dil, bias = case
    a, arrays, x, w = conv_case(rng, n, c, k, hw, ks, s, pads, cb, kb, dw, dil, bias)
    y = get_op("ConvNCHWc").reference(a, *arrays)[0]
    expected = ort_node("Conv", {"strides": [s, s], "pads": list(pads), "dilations": [dil, dil], "group": a["group"]},
                        [x, w] + arrays[2:])  # fmt: skip
    close(relayout(y, f"NCHW{kb}c", "NCHW"), expected)


def test_conv_nchwc_kernels():
    rng = np.random.default_rng(2)
    cases = []
    for n, c, k, hw, ks, s, pads, cb, kb, dw, dil, bias in CONVS:
        a, arrays, _, _ = conv_case(rng, n, c, k, hw, ks, s, pads, cb, kb, dw, dil, bias)
        cases.append(("ConvNCHWc", a, arrays, 1))
    g, feeds = graph_of(cases)
    got = ember.compile(g, fallback=False)(*feeds)
    for (op, attrs, arrays, _), y in zip(cases, got):
        close(y, get_op(op).reference(attrs, *arrays)[0])


def test_pointwise_cases_take_their_reduction_in_chunks():
    """The last three CONVS exercise `k_chunk` on this host's plans (else the kernels test would not reach it)."""
    for _, c, k, hw, ks, s, _, cb, kb, *_ in CONVS[-3:]:
        out = tuple((d - 1) // s + 1 for d in hw)
        plan = nchwc_plan(k // kb, kb, out, "float32", panel=c * kb * 4)
        assert k_chunk(plan, c // cb, ks * ks, cb, kb, "float32").kchunk, (c, k, hw)


def test_conv_nchwc_shape_errors():
    infer = get_op("ConvNCHWc").infer
    a = get_op("ConvNCHWc").check_attrs({"strides": (1, 1), "pads": (0,) * 4, "dilations": (1, 1)})
    x = TensorType((1, 2, 8, 8, 16), "float32")
    with pytest.raises(ShapeError, match="input blocks"):
        infer(a, x, TensorType((2, 4, 3, 3, 8, 16), "float32"))
    with pytest.raises(ShapeError, match="depthwise"):
        infer({**a, "group": 2}, x, TensorType((2, 1, 3, 3, 1, 16), "float32"))
    with pytest.raises(ShapeError, match="whole channel blocks per group"):  # 2 groups of 2 blocks: weight [., 2, ...]
        infer({**a, "group": 2}, TensorType((1, 4, 8, 8, 16), "float32"), TensorType((4, 4, 1, 1, 16, 16), "float32"))
    (grouped,) = infer({**a, "group": 2}, TensorType((1, 4, 8, 8, 16), "float32"), TensorType((6, 2, 3, 3, 16, 16),
                                                                                         "float32"))  # fmt: skip
    assert grouped.shape == (1, 6, 6, 6, 16)
    with pytest.raises(ShapeError, match="5-d"):
        infer(a, TensorType((1, 32, 8, 8), "float32"), TensorType((2, 2, 3, 3, 16, 16), "float32"))


# -- pooling ------------------------------------------------------------------------------------------------------
POOLS = [  # mode, kernel, strides, pads, ceil_mode, count_include_pad, (c, h, w), block
    ("max", (3, 3), (2, 2), (1, 1, 1, 1), 0, 0, (32, 15, 15), 16),
    ("max", (2, 2), (2, 2), (0, 0, 0, 0), 1, 0, (16, 9, 7), 16),
    ("avg", (3, 3), (1, 1), (1, 1, 1, 1), 0, 0, (24, 8, 9), 8),
    ("avg", (3, 3), (2, 2), (1, 0, 1, 0), 1, 1, (16, 10, 11), 16),
]


def test_pool_nchwc_reference_and_kernels():
    rng = np.random.default_rng(3)
    cases = []
    for mode, ks, st, pads, ceil, incl, (c, h, w), b in POOLS:
        x = rng.standard_normal((2, c, h, w)).astype(np.float32)
        onnx_attrs = {"kernel_shape": list(ks), "strides": list(st), "pads": list(pads), "ceil_mode": ceil}
        if mode == "avg":
            onnx_attrs["count_include_pad"] = incl
        a = {"mode": mode, "kernel_shape": ks, "strides": st, "pads": pads, "dilations": (1, 1), "ceil_mode": ceil,
             "count_include_pad": incl}  # fmt: skip
        xb = relayout(x, "NCHW", f"NCHW{b}c")
        ref = get_op("PoolNCHWc").reference(get_op("PoolNCHWc").check_attrs(a), xb)[0]
        nchw_op = "MaxPool" if mode == "max" else "AveragePool"
        close(relayout(ref, f"NCHW{b}c", "NCHW"), ort_node(nchw_op, onnx_attrs, [x]))
        cases.append(("PoolNCHWc", a, [xb], 1))
    for mode in ("max", "avg"):
        x = rng.standard_normal((2, 32, 7, 6)).astype(np.float32)
        xb = relayout(x, "NCHW", "NCHW16c")
        ref = get_op("GlobalPoolNCHWc").reference({"mode": mode}, xb)[0]
        close(relayout(ref, "NCHW16c", "NCHW"), ort_node("GlobalMaxPool" if mode == "max" else "GlobalAveragePool",
                                                          {}, [x]))  # fmt: skip
        cases.append(("GlobalPoolNCHWc", {"mode": mode}, [xb], 1))
    g, feeds = graph_of(cases)
    got = ember.compile(g, fallback=False)(*feeds)
    for (op, attrs, arrays, _), y in zip(cases, got):
        opdef = get_op(op)
        close(y, opdef.reference(opdef.check_attrs(attrs), *arrays)[0])
