"""PackWeights (`ember.passes.pack`): constant B of MatMul/Gemm packed into GEMM panels at compile time.

Each case checks which nodes the pass rewrote and that the function is kept: the rewritten graph through the
numpy reference evaluator and the compiled model (native kernels only) against onnxruntime on random inputs,
rtol 1e-4, atol 1e-5 of the output's scale."""

from __future__ import annotations

import numpy as np
import onnx.numpy_helper
import pytest

import ember
from ember import zoo
from ember.frontend.onnx import from_onnx
from ember.ops.evaluate import evaluate
from ember.ops.matmul import pack_b, unpack_b
from ember.passes import run_passes
from ember.templates import nn as T
from ember.tune import Task

ort = pytest.importorskip("onnxruntime")
LANES = T.lanes_of("float32", T.host_target())


def packed_ops(model):
    g, _ = run_passes(from_onnx(model), opt_level=3, disabled=["fuse_ops"], verify=True)
    return g, [n for n in g.nodes if n.op == "MatMulPackedB"]


def check(model, g) -> None:
    feeds = zoo.random_feeds(model, 1)
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for ours in (list(evaluate(g, feeds).values()), list(ember.compile(model, fallback=False).run(feeds).values())):
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * max(float(np.abs(b).max()), 1.0))


def test_pack_roundtrip_pads_the_last_panel():
    b = np.random.default_rng(0).standard_normal((5, 2 * LANES + 3)).astype(np.float32)
    w = pack_b(b, 2 * LANES)
    assert w.shape == (2, 5, 2 * LANES)
    assert np.all(w[1, :, 3:] == 0)
    np.testing.assert_array_equal(unpack_b(w, b.shape[1]), b)


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_with_bias_alpha_beta(trans_b):
    b = zoo.Builder(0)
    k, n = 20, 2 * LANES + 5
    w = b.weight((n, k) if trans_b else (k, n))
    y = b.op("Gemm", ["x", w, b.weight((n,))], alpha=0.5, beta=2.0, transB=trans_b)
    model = b.model({"x": (16, k)}, b.op("Relu", [y]), "gemm")
    g, packed = packed_ops(model)
    assert len(packed) == 1 and packed[0].attrs["n"] == n
    assert packed[0].inputs[1].shape == (-(-n // T.packed_width(n, "float32")), k, T.packed_width(n, "float32"))
    check(model, g)


def test_batched_matmul_and_shared_weight_packed_once():
    b = zoo.Builder(1)
    w = b.weight((24, 3 * LANES))
    y1 = b.op("MatMul", ["x", w])
    y2 = b.op("MatMul", [b.op("Relu", ["x"]), w])
    model = b.model({"x": (2, 9, 24)}, b.op("Add", [y1, y2]), "shared")
    g, packed = packed_ops(model)
    assert len(packed) == 2 and packed[0].inputs[1] is packed[1].inputs[1]
    check(model, g)


def test_few_rows_or_a_runtime_b_stay_unpacked():
    b = zoo.Builder(2)
    small = b.op("MatMul", ["x", b.weight((16, 4 * LANES))])  # 4 rows: the unpacked row plans
    model = b.model({"x": (4, 16)}, small, "few_rows")
    assert not packed_ops(model)[1]
    b = zoo.Builder(3)
    model = b.model({"x": (16, 12), "y": (12, 2 * LANES)}, b.op("MatMul", ["x", "y"]), "runtime_b")
    g, packed = packed_ops(model)
    assert not packed
    check(model, g)


def test_mlp_model_is_packed_and_tunable():
    model = zoo.mlp(batch=16, features=24, hidden=(2 * LANES, LANES), classes=10)
    g, packed = packed_ops(model)
    assert len(packed) == 3  # the 10-class layer too: one panel of a vector, padded
    check(model, g)
    task = Task.from_node(packed[0], "c")
    assert task.space.template == "gemm" and "tile_n" not in task.space.knobs and "pack_b" not in task.space.knobs


def test_batch_dims_fold_into_rows_with_the_epilogue():
    """x [2, 7, 7, K] @ W (7 rows per batch index, as ConvNeXt's last stage): one 2-d product over 98 rows,
    the bias, activation and residual add after it move to the 2-d view and still fuse into one kernel."""
    b = zoo.Builder(5)
    k, n = 24, 2 * LANES
    y = b.op("MatMul", ["x", b.weight((k, n))])
    y = b.op("Add", [b.op("Relu", [b.op("Add", [y, b.weight((n,))])]), "res"])
    model = b.model({"x": (2, 7, 7, k), "res": (2, 7, 7, n)}, y, "folded")
    g, packed = packed_ops(model)
    assert len(packed) == 1 and packed[0].inputs[0].shape == (98, k) and packed[0].outputs[0].shape == (98, n)
    check(model, g)
    m = ember.compile(model, fallback=False)
    assert m.summary()["kernels"] == 1


@pytest.mark.parametrize("rows,trans_b", [(1, 1), (3, 0), (7, 1)])
def test_skinny_products_stream_wide_panels(rows, trans_b):
    """A fully connected layer on a few rows with a large weight: packed in the skinny plan's panels (up to four
    vectors wide), N not a multiple of them, bias and alpha/beta kept; against onnxruntime and numpy."""
    b = zoo.Builder(4 + rows)
    k, n = 600, 4 * LANES * 4 + 5  # (a weight of SKINNY_MIN_WEIGHT elements or more at 8 lanes too)
    w = b.weight((n, k) if trans_b else (k, n))
    bias = b.weight((n,))
    y = b.op("Gemm", ["x", w, bias], alpha=0.5, beta=2.0, transB=trans_b)
    model = b.model({"x": (rows, k)}, b.op("Relu", [y]), "skinny")
    g, packed = packed_ops(model)
    nr = T.packed_width(n, "float32", rows=rows)
    regs = T.vector_regs(T.host_target())
    assert nr == min(4, (regs - 4) // rows) * LANES and T.skinny_plan(rows, nr, T.host_target()).mr == rows
    assert len(packed) == 1 and packed[0].inputs[1].shape == (-(-n // nr), k, nr)
    check(model, g)
    init = {t.name: t for t in model.graph.initializer}
    wt = onnx.numpy_helper.to_array(init[w])
    x = zoo.random_feeds(model, 2)["x"]
    ref = np.maximum(0.5 * (x @ (wt.T if trans_b else wt)) + 2.0 * onnx.numpy_helper.to_array(init[bias]), 0)
    out = ember.compile(model, fallback=False)(x)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_skinny_batched_matmul_folds_rows():
    b = zoo.Builder(9)
    model = b.model({"x": (1, 2, 1024)}, b.op("MatMul", ["x", b.weight((1024, 3 * LANES * 4))]), "skinny_batched")
    g, packed = packed_ops(model)
    assert len(packed) == 1
    check(model, g)
