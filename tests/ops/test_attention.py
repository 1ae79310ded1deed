"""Attention (MatMul -> [scale] -> Softmax -> MatMul fused by `ember.passes.attention`, computed in row blocks by
`ember.templates.attention`) against onnxruntime on small shapes: score rows narrower than a vector, not a
multiple of it, longer than one block of rows; a scale by Mul and by Div; an added mask with the float32 minimum in
it; 1 and 2 threads; the heads' transposes fused in. A chain the pass must leave alone (probabilities read twice)
and shapes the op rejects."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.frontend.onnx import from_onnx
from ember.graph.types import TensorType
from ember.ops import ShapeError, get_op
from ember.passes import run_passes

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the reference for the fused attention")


def attention_model(batch: tuple[int, ...], m: int, n: int, d: int, dv: int, scale: str | None = None,
                    mask: bool | tuple[int, ...] = False, probs_out: bool = False):  # fmt: skip
    """softmax(q @ k [* or / c] [+ mask]) @ v as an ONNX model, with q [*batch, m, d], k [*batch, d, n] inputs; the
    mask [n] (mask=True) or of the shape given."""
    f = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info("q", f, [*batch, m, d]), helper.make_tensor_value_info("k", f, [*batch, d, n]),
           helper.make_tensor_value_info("v", f, [*batch, n, dv])]  # fmt: skip
    nodes, inits, s = [helper.make_node("MatMul", ["q", "k"], ["s"])], [], "s"
    if scale is not None:
        inits.append(numpy_helper.from_array(np.array(8.0 if scale == "Div" else 0.125, np.float32), "c"))
        nodes.append(helper.make_node(scale, [s, "c"], ["scaled"]))
        s = "scaled"
    if mask:
        ins.append(helper.make_tensor_value_info("mask", f, [n] if mask is True else list(mask)))
        nodes.append(helper.make_node("Add", [s, "mask"], ["masked"]))
        s = "masked"
    nodes += [helper.make_node("Softmax", [s], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["o"])]
    outs = [helper.make_tensor_value_info("o", f, [*batch, m, dv])]
    if probs_out:
        outs.append(helper.make_tensor_value_info("p", f, [*batch, m, n]))
    graph = helper.make_graph(nodes, "attention", ins, outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def feeds_for(model, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for i in model.graph.input:
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        out[i.name] = rng.standard_normal(shape).astype(np.float32)
    if "mask" in out:  # padding masked as transformers do it: the float32 minimum added to the scores
        out["mask"][rng.random(out["mask"].shape) < 0.3] = np.finfo(np.float32).min
    return out


def ops_after_passes(model) -> list[str]:
    graph, _ = run_passes(from_onnx(model), disabled=["fuse_ops"], target="c")
    return [n.op for n in graph.nodes]


@pytest.mark.parametrize("batch, m, n, d, dv, scale, mask, threads", [
    ((1, 2), 37, 45, 16, 16, None, False, 1),   # rows of scores not a multiple of the vector width, a block + a tail
    ((3,), 50, 13, 32, 8, "Mul", True, 1),      # scores narrower than one vector, output narrower than one, masked
    ((1, 2), 61, 100, 64, 64, "Div", True, 2),  # blocks split across threads, K = 64 (a head's width), masked
    ((), 24, 32, 16, 48, "Mul", False, 1),      # no batch dims, exactly one block and whole panels
    ((2, 3), 49, 49, 32, 32, "Mul", (2, 3, 49, 49), 1),  # Swin's windows: a bias per score, rows not a vector's
    ((2, 3), 49, 49, 32, 32, "Mul", (1, 3, 49, 1), 2),   # a bias broadcast over windows and columns
    ((1,), 53, 700, 16, 16, "Mul", True, 2),    # long rows: blocks of rows, the last one shifted back
])  # fmt: skip
def test_fused_attention_matches_onnxruntime(batch, m, n, d, dv, scale, mask, threads):
    model = attention_model(batch, m, n, d, dv, scale, mask=mask)
    assert "BlockAttention" in ops_after_passes(model) and "Softmax" not in ops_after_passes(model)
    compiled = ember.compile(model, target=f"c -threads={threads}")
    # static rows: every register tile is whole (partial ones shifted back), its accumulators in registers; a
    # guarded partial tile indexed them by its shift and kept them in a memory array
    assert not re.search(r"float attention_\w*local\[", compiled.source)
    for seed in (0, 1):
        feeds = feeds_for(model, seed)
        ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        got = compiled.run(feeds)["o"]
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_reference_matches_onnxruntime():
    """The op's numpy reference (float64) is the same function as the unfused chain."""
    from ember.ops.attention import attention

    model = attention_model((2,), 9, 11, 5, 7, "Div")
    feeds = feeds_for(model, 3)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = attention({"scale": 1 / 8.0}, feeds["q"], feeds["k"], feeds["v"])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_chain_read_elsewhere_left_alone():
    """Probabilities read elsewhere (an output too): no BlockAttention, same results."""
    model = attention_model((2,), 20, 24, 16, 16, "Mul", mask=True, probs_out=True)
    assert "BlockAttention" not in ops_after_passes(model)
    feeds = feeds_for(model, 4)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ember.compile(model, target="c -threads=1").run(feeds)
    np.testing.assert_allclose(got["o"], ref[0], rtol=1e-4, atol=1e-5)


def test_bad_shapes_name_the_operands():
    infer = get_op("BlockAttention").infer

    def t(*shape):
        return TensorType(shape, "float32")

    with pytest.raises(ShapeError, match="do not chain"):
        infer({"scale": 1.0}, t(2, 5, 4), t(2, 3, 7), t(2, 7, 6))
    with pytest.raises(ShapeError, match="batch dims"):
        infer({"scale": 1.0}, t(2, 5, 4), t(3, 4, 7), t(2, 7, 6))
    with pytest.raises(ShapeError, match="bias"):
        infer({"scale": 1.0}, t(2, 5, 4), t(2, 4, 7), t(2, 7, 6), t(5, 6))


def heads_model(s: int, heads: int, d: int):
    """q, k, v [s, heads * d] split into heads by Reshape + Transpose (as transformers export them), k transposed
    for the product, the heads' outputs transposed back: the transposes before BlockAttention fuse into its kernel."""
    f, w = TensorProto.FLOAT, heads * d
    ins = [helper.make_tensor_value_info(n, f, [1, s, w]) for n in ("q", "k", "v")]
    shape = numpy_helper.from_array(np.array([1, s, heads, d], np.int64), "heads")
    back = numpy_helper.from_array(np.array([1, s, w], np.int64), "merged")
    nodes = []
    for n, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [helper.make_node("Reshape", [n, "heads"], [f"{n}4"]),
                  helper.make_node("Transpose", [f"{n}4"], [f"{n}h"], perm=perm)]  # fmt: skip
    nodes += [helper.make_node("MatMul", ["qh", "kh"], ["s"]), helper.make_node("Softmax", ["s"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "vh"], ["oh"]),
              helper.make_node("Transpose", ["oh"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", "merged"], ["o"])]  # fmt: skip
    graph = helper.make_graph(nodes, "heads", ins, [helper.make_tensor_value_info("o", f, [1, s, w])], [shape, back])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("target", ["c -threads=1", "llvm -threads=2"])
def test_head_transposes_fuse_into_attention(target):
    model = heads_model(29, 3, 16)
    graph, _ = run_passes(from_onnx(model), target="c")
    fused = [n for n in graph.nodes if n.op == "Fused" and "BlockAttention" in [m.op for m in n.attrs["body"].nodes]]
    assert len(fused) == 1 and [m.op for m in fused[0].attrs["body"].nodes].count("Transpose") == 3
    compiled = ember.compile(model, target=target)
    if target.startswith("c"):  # read in place: no copy of q, k or v into a transposed buffer inside the kernel
        assert not re.search(r"// transpose\w*: float32\[", compiled.source)
    feeds = feeds_for(model, 5)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(compiled.run(feeds)["o"], ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("target", ["c -threads=1", "c -threads=2", "llvm -threads=1"])
def test_symbolic_length_attention(target):
    """One kernel for every sequence length S (queries and keys alike, a padding mask [1, 1, 1, S]): the score
    panel's width is a symbolic multiple of the vector, -inf past S; lengths of one row, a partial block, whole
    blocks and the bound, each against onnxruntime."""
    model = attention_model((1, 2), "S", "S", 16, 16, "Div", mask=(1, 1, 1, "S"))
    graph, _ = run_passes(from_onnx(model, symbolic=True, dynamic_bounds={"S": (1, 80)}), disabled=["fuse_ops"],
                          target="c")  # fmt: skip
    assert "BlockAttention" in [n.op for n in graph.nodes]
    compiled = ember.compile(model, target=target, dynamic_bounds={"S": (1, 80)})
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(6)
    for s in (1, 5, 24, 37, 80):
        feeds = {"q": rng.standard_normal((1, 2, s, 16)), "k": rng.standard_normal((1, 2, 16, s)),
                 "v": rng.standard_normal((1, 2, s, 16)), "mask": np.zeros((1, 1, 1, s))}  # fmt: skip
        feeds["mask"][..., rng.random(s) < 0.3] = np.finfo(np.float32).min
        feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
        np.testing.assert_allclose(compiled.run(feeds)["o"], sess.run(None, feeds)[0], rtol=1e-4, atol=1e-5)


def test_stacked_qkv_gathers_read_in_place():
    """q, k, v taken out of one stacked tensor [3, windows, heads, 49, 32] by Gather (torchvision's Swin): the
    gathers are read in place inside the attention kernel, not copied serially into buffers first; the packing of
    k (a transpose by vector gathers, few stores but a load per lane) runs on the threads; onnxruntime's result."""
    f = TensorProto.FLOAT
    shape = [3, 4, 3, 49, 32]
    nodes = [helper.make_node("Gather", ["qkv", f"i{j}"], [n], axis=0) for j, n in enumerate("qkv")]
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Softmax", ["s"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["o"])]  # fmt: skip
    inits = [numpy_helper.from_array(np.array(j, np.int64), f"i{j}") for j in range(3)]
    graph = helper.make_graph(nodes, "qkv", [helper.make_tensor_value_info("qkv", f, shape)],
                              [helper.make_tensor_value_info("o", f, shape[1:])], inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    compiled = ember.compile(model, target="c -threads=2")
    assert "BlockAttention" in ops_after_passes(model)
    assert not re.search(r"// gather\w*: float32\[", compiled.source)
    lines = compiled.source.splitlines()
    pack = next(i for i, line in enumerate(lines) if "store" in line and "(&attention_s_packed_b[" in line)
    assert not any("runs serially" in line for line in lines[pack - 3 : pack])
    feeds = {"qkv": np.random.default_rng(3).standard_normal(shape).astype(np.float32)}
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(compiled.run(feeds)["o"], ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("with_bias", [True, False])
def test_shifted_window_mask_through_views(with_bias):
    """Swin's shifted windows: the scores [windows, heads, 49, 49] (+ a relative position bias) viewed as
    [1, windows, heads, 49, 49] to add a mask per window, viewed back, then the softmax: one BlockAttention whose
    mask is the constants combined; onnxruntime's result."""
    f, w, h, n, d = TensorProto.FLOAT, 4, 3, 49, 32
    rng = np.random.default_rng(4)
    ins = [helper.make_tensor_value_info("q", f, [w, h, n, d]), helper.make_tensor_value_info("k", f, [w, h, d, n]),
           helper.make_tensor_value_info("v", f, [w, h, n, d])]  # fmt: skip
    mask = np.where(rng.random((1, w, 1, n, n)) < 0.3, -100.0, 0.0).astype(np.float32)
    inits = [numpy_helper.from_array(rng.standard_normal((1, h, n, n)).astype(np.float32), "bias"),
             numpy_helper.from_array(mask, "mask"), numpy_helper.from_array(np.array([1, w, h, n, n], np.int64), "v5"),
             numpy_helper.from_array(np.array([w, h, n, n], np.int64), "v4")]  # fmt: skip
    nodes = [helper.make_node("MatMul", ["q", "k"], ["s"])]
    if with_bias:
        nodes.append(helper.make_node("Add", ["s", "bias"], ["sb"]))
    nodes += [helper.make_node("Reshape", ["sb" if with_bias else "s", "v5"], ["s5"]),
              helper.make_node("Add", ["s5", "mask"], ["m5"]), helper.make_node("Reshape", ["m5", "v4"], ["m4"]),
              helper.make_node("Softmax", ["m4"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["o"])]  # fmt: skip
    graph = helper.make_graph(nodes, "shifted", ins, [helper.make_tensor_value_info("o", f, [w, h, n, d])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ops = ops_after_passes(model)
    assert "BlockAttention" in ops and "Softmax" not in ops and "Reshape" not in ops
    compiled = ember.compile(model, target="c -threads=2")
    feeds = feeds_for(model, 7)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(compiled.run(feeds)["o"], ref, rtol=1e-4, atol=1e-5)


def rotary_model(s: int, heads: int, d: int):
    """LLaMA's attention: q and k [1, heads, s, d] rotated by position (x cos + rotate_half(x) sin, rotate_half by
    Slice, Neg and Concat), the scores scaled, softmax, times v."""
    f, h = TensorProto.FLOAT, d // 2
    pos = np.arange(s)[:, None] / 10000 ** (np.arange(h) / h)[None, :]
    angles = np.concatenate([pos, pos], axis=1).astype(np.float32)
    inits = [numpy_helper.from_array(np.cos(angles), "cos"), numpy_helper.from_array(np.sin(angles), "sin"),
             numpy_helper.from_array(np.array(d**-0.5, np.float32), "scale")]  # fmt: skip
    for name, v in (("lo", [0]), ("mid", [h]), ("hi", [d]), ("last", [-1])):
        inits.append(numpy_helper.from_array(np.array(v, np.int64), name))
    nodes = []
    for x in ("q", "k"):
        nodes += [helper.make_node("Slice", [x, "lo", "mid", "last"], [f"{x}1"]),
                  helper.make_node("Slice", [x, "mid", "hi", "last"], [f"{x}2"]),
                  helper.make_node("Neg", [f"{x}2"], [f"{x}2n"]),
                  helper.make_node("Concat", [f"{x}2n", f"{x}1"], [f"{x}rot"], axis=-1),
                  helper.make_node("Mul", [x, "cos"], [f"{x}c"]),
                  helper.make_node("Mul", [f"{x}rot", "sin"], [f"{x}s"]),
                  helper.make_node("Add", [f"{x}c", f"{x}s"], [f"{x}r"])]  # fmt: skip
    nodes += [helper.make_node("Transpose", ["kr"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["qr", "kt"], ["s0"]), helper.make_node("Mul", ["s0", "scale"], ["s1"]),
              helper.make_node("Softmax", ["s1"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["o"])]
    ins = [helper.make_tensor_value_info(n, f, [1, heads, s, d]) for n in ("q", "k", "v")]
    graph = helper.make_graph(nodes, "rotary", ins, [helper.make_tensor_value_info("o", f, [1, heads, s, d])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("threads", [1, 2])
def test_rotary_query_computed_once_in_vectors(threads):
    """The rotary embedding fuses into the attention kernel: k's is read in place by the packing, q's is computed
    once into a buffer, in vectors (read in place, every register tile redid it for each column panel of the
    scores), and the slices and concatenations are no copies of their own; onnxruntime's result."""
    model = rotary_model(40, 3, 32)
    compiled = ember.compile(model, target=f"c -threads={threads}")
    assert "BlockAttention" in ops_after_passes(model)
    src = compiled.source
    assert not re.search(r"// (slice|concat|expand)\w*: float32\[", src)
    query = re.search(r"// (add\w*): float32\[1, 3, 40, 32\], global", src)  # the rotated q, materialized
    assert query and re.search(rf"ember_vstore_float32x\d+\(&{query.group(1)}\[", src)
    feeds = feeds_for(model, 8)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(compiled.run(feeds)["o"], ref, rtol=1e-4, atol=1e-5)
