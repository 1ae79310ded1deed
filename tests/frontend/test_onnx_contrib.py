"""Microsoft contrib operators (com.microsoft) that onnxruntime writes into the models it saves, each in a one-node
model compared with onnxruntime's own kernel on random inputs; then whole models as onnxruntime saves them (its
graph optimizer's fusions, its quantizer's operator format).

Float: max abs error <= 1e-5 of the output's largest magnitude (float32 through other kernels). Quantized outputs:
within one quantization step (Ember requantizes with round-half-even in float; onnxruntime's fixed-point paths
may round ties apart)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.frontend.onnx_importer import UnsupportedOperatorError

ort = pytest.importorskip("onnxruntime")
MS = "com.microsoft"
F, U8, I8, I32 = TensorProto.FLOAT, TensorProto.UINT8, TensorProto.INT8, TensorProto.INT32
NP = {F: np.float32, U8: np.uint8, I8: np.int8, I32: np.int32, TensorProto.INT64: np.int64}


def one_node(op: str, inputs: list[tuple[str, int, tuple] | None], outputs: list[tuple[str, int, tuple]],
             consts: dict[str, np.ndarray], domain: str = MS, **attrs) -> onnx.ModelProto:  # fmt: skip
    """A model of one node: `inputs` (name, elem type, shape; None: an absent optional input), of which the names
    in `consts` are initializers."""
    names = ["" if i is None else i[0] for i in inputs]
    node = helper.make_node(op, names, [o[0] for o in outputs], domain=domain, **attrs)
    graph = helper.make_graph(
        [node], op,
        [helper.make_tensor_value_info(n, t, s) for n, t, s in (i for i in inputs if i) if n not in consts],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(v, n) for n, v in consts.items()],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])


def feeds_of(model: onnx.ModelProto, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for vi in model.graph.input:
        t = vi.type.tensor_type
        shape = tuple(d.dim_value for d in t.shape.dim)
        dtype = NP[t.elem_type]
        out[vi.name] = (rng.integers(0, 256 if dtype == np.uint8 else 100, shape).astype(dtype)
                        if dtype != np.float32 else rng.standard_normal(shape).astype(dtype))  # fmt: skip
    return out


def check(model: onnx.ModelProto, rng: np.random.Generator, quantized: bool = False) -> None:
    feeds = feeds_of(model, rng)
    refs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    outs = ember.compile(model, fallback=False).run(feeds)
    for (name, ours), ref in zip(outs.items(), refs, strict=True):
        assert ours.shape == ref.shape and ours.dtype == ref.dtype, (name, ours.shape, ours.dtype, ref.shape, ref.dtype)
        if quantized:
            diff = np.abs(ours.astype(np.int32) - ref.astype(np.int32))
            assert diff.max() <= 1, f"{name}: {diff.max()} quantization steps apart"
        else:
            err = np.abs(ours.astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1e-6)
            assert err <= 1e-5, f"{name}: max error {err:.2e} of the output's scale"


def W(rng, *shape, scale=0.5) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# -- float fusions -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("act,params", [("", ()), ("Relu", ()), ("Clip", (-0.5, 0.7)), ("LeakyRelu", (0.2,)),
                                        ("HardSigmoid", (0.3, 0.4)), ("Sigmoid", ()), ("Tanh", ())])  # fmt: skip
def test_fused_conv(act, params):
    rng = np.random.default_rng(1)
    consts = {"w": W(rng, 6, 4, 3, 3), "b": W(rng, 6)}
    attrs = {"activation": act} if act else {}
    if params:
        attrs["activation_params"] = list(params)
    m = one_node("FusedConv", [("x", F, (1, 4, 7, 7)), ("w", F, (6, 4, 3, 3)), ("b", F, (6,)), ("z", F, (1, 6, 4, 4))],
                 [("y", F, (1, 6, 4, 4))], consts, strides=[2, 2], pads=[1, 1, 1, 1], **attrs)  # fmt: skip
    check(m, rng)


@pytest.mark.parametrize("ta,tb,alpha", [(0, 0, 1.0), (1, 0, 0.5), (0, 1, 2.0), (1, 1, 1.0)])
def test_fused_matmul(ta, tb, alpha):
    rng = np.random.default_rng(2)
    a, b = (2, 3, 8, 5) if ta else (2, 3, 5, 8), (3, 6, 8) if tb else (3, 8, 6)
    m = one_node("FusedMatMul", [("a", F, a), ("b", F, b)], [("y", F, (2, 3, 5, 6))], {}, transA=ta, transB=tb,
                 alpha=alpha)  # fmt: skip
    check(m, rng)


@pytest.mark.parametrize("op,n_in", [("Gelu", 1), ("FastGelu", 2), ("BiasGelu", 2), ("QuickGelu", 1)])
def test_activations(op, n_in):
    rng = np.random.default_rng(3)
    shapes = [(2, 5, 16), (16,)][:n_in]
    m = one_node(op, [(f"x{i}", F, s) for i, s in enumerate(shapes)], [("y", F, (2, 5, 16))], {},
                 **({"alpha": 1.0} if op == "QuickGelu" else {}))  # fmt: skip
    check(m, rng)


def test_bias_add():
    """onnxruntime has BiasAdd on CUDA only: numpy is the reference."""
    rng = np.random.default_rng(3)
    m = one_node("BiasAdd", [("x", F, (2, 5, 16)), ("bias", F, (16,)), ("skip", F, (2, 5, 16))],
                 [("y", F, (2, 5, 16))], {})  # fmt: skip
    feeds = feeds_of(m, rng)
    y = ember.compile(m, fallback=False).run(feeds)["y"]
    np.testing.assert_allclose(y, feeds["x"] + feeds["bias"] + feeds["skip"], rtol=1e-6, atol=1e-6)


def test_skip_layer_norms():
    rng = np.random.default_rng(4)
    consts = {"gamma": W(rng, 16) + 1, "beta": W(rng, 16), "bias": W(rng, 16)}
    x = [("x", F, (2, 5, 16)), ("skip", F, (2, 5, 16)), ("gamma", F, (16,)), ("beta", F, (16,)), ("bias", F, (16,))]
    check(one_node("SkipLayerNormalization", x, [("y", F, (2, 5, 16)), ("mean", F, (2, 5, 1)), ("inv", F, (2, 5, 1)),
                                                  ("sum", F, (2, 5, 16))], consts, epsilon=1e-5), rng)  # fmt: skip
    check(one_node("SkipLayerNormalization", x[:3], [("y", F, (2, 5, 16))], consts, epsilon=1e-5), rng)
    rms = [x[0], x[1], x[2], x[4]]
    check(one_node("SkipSimplifiedLayerNormalization", rms, [("y", F, (2, 5, 16))], consts, epsilon=1e-6), rng)
    check(one_node("SimplifiedLayerNormalization", [x[0], x[2]], [("y", F, (2, 5, 16))], consts, domain="",
                   axis=-1, epsilon=1e-6), rng)  # fmt: skip


def test_embed_layer_norm():
    rng = np.random.default_rng(5)
    consts = {"word": W(rng, 50, 16), "pos": W(rng, 8, 16), "seg": W(rng, 2, 16), "gamma": W(rng, 16) + 1,
              "beta": W(rng, 16)}  # fmt: skip
    inputs = [("ids", TensorProto.INT32, (2, 8)), ("segs", TensorProto.INT32, (2, 8)), ("word", F, (50, 16)),
              ("pos", F, (8, 16)), ("seg", F, (2, 16)), ("gamma", F, (16,)), ("beta", F, (16,)),
              ("mask", TensorProto.INT32, (2, 8))]  # fmt: skip
    m = one_node("EmbedLayerNormalization", inputs, [("y", F, (2, 8, 16)), ("mask_index", I32, (2,))], consts,
                 epsilon=1e-12)  # fmt: skip
    feeds = {"ids": rng.integers(0, 50, (2, 8)).astype(np.int32), "segs": rng.integers(0, 2, (2, 8)).astype(np.int32),
             "mask": (rng.random((2, 8)) < 0.7).astype(np.int32)}  # fmt: skip
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    ours = ember.compile(m, fallback=False).run(feeds)
    np.testing.assert_allclose(ours["y"], ref[0], rtol=1e-5, atol=1e-5 * np.abs(ref[0]).max())
    np.testing.assert_array_equal(ours["mask_index"], ref[1])


# -- the quantizer's operator format -----------------------------------------------------------------------------
def qparams(scale: float, zero: int, dtype=np.uint8) -> tuple[np.ndarray, np.ndarray]:
    return np.array(scale, np.float32), np.array(zero, dtype)


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_qlinear_binary(op):
    rng = np.random.default_rng(6)
    (sa, za), (sb, zb), (sc, zc) = qparams(0.02, 120), qparams(0.03, 130), qparams(0.05 if op == "QLinearAdd" else
                                                                                  0.2, 128)  # fmt: skip
    consts = {"sa": sa, "za": za, "sb": sb, "zb": zb, "sc": sc, "zc": zc}
    ins = [("a", U8, (2, 4, 5)), ("sa", F, ()), ("za", U8, ()), ("b", U8, (4, 5)), ("sb", F, ()), ("zb", U8, ()),
           ("sc", F, ()), ("zc", U8, ())]  # fmt: skip
    check(one_node(op, ins, [("y", U8, (2, 4, 5))], consts), rng, quantized=True)


@pytest.mark.parametrize("op,attrs", [("QLinearSigmoid", {}), ("QLinearLeakyRelu", {"alpha": 0.1}),
                                      ("QLinearSoftmax", {"axis": -1, "opset": 13})])  # fmt: skip
def test_qlinear_unary(op, attrs):
    rng = np.random.default_rng(7)
    (sx, zx), (sy, zy) = qparams(0.05, 128), qparams(1 / 256 if op != "QLinearLeakyRelu" else 0.04, 0 if op !=
                                                     "QLinearLeakyRelu" else 100)  # fmt: skip
    consts = {"sx": sx, "zx": zx, "sy": sy, "zy": zy}
    ins = [("x", U8, (3, 10)), ("sx", F, ()), ("zx", U8, ()), ("sy", F, ()), ("zy", U8, ())]
    check(one_node(op, ins, [("y", U8, (3, 10))], consts, **attrs), rng, quantized=True)


@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_pools(channels_last):
    rng = np.random.default_rng(8)
    (sx, zx), (sy, zy) = qparams(0.05, 128), qparams(0.04, 120)
    consts = {"sx": sx, "zx": zx, "sy": sy, "zy": zy}
    shape = (1, 6, 6, 4) if channels_last else (1, 4, 6, 6)
    ins = [("x", U8, shape), ("sx", F, ()), ("zx", U8, ()), ("sy", F, ()), ("zy", U8, ())]
    gap = (1, 1, 1, 4) if channels_last else (1, 4, 1, 1)
    check(one_node("QLinearGlobalAveragePool", ins, [("y", U8, gap)], consts, channels_last=channels_last), rng,
          quantized=True)  # fmt: skip
    pooled = (1, 3, 3, 4) if channels_last else (1, 4, 3, 3)
    check(one_node("QLinearAveragePool", ins, [("y", U8, pooled)], consts, channels_last=channels_last,
                   kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=0), rng,
          quantized=True)  # fmt: skip


def test_qlinear_concat():
    rng = np.random.default_rng(9)
    consts = {}
    ins = [("sy", F, ()), ("zy", U8, ())]
    for i, (s, z) in enumerate([(0.05, 128), (0.02, 100), (0.08, 140)]):
        consts[f"s{i}"], consts[f"z{i}"] = qparams(s, z)
        ins += [(f"x{i}", U8, (1, 2 + i, 3)), (f"s{i}", F, ()), (f"z{i}", U8, ())]
    consts["sy"], consts["zy"] = qparams(0.06, 128)
    check(one_node("QLinearConcat", ins, [("y", U8, (1, 9, 3))], consts, axis=1), rng, quantized=True)


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("float_out", [False, True])
def test_qgemm(per_channel, float_out):
    rng = np.random.default_rng(10)
    sa, za = qparams(0.05, 128)
    sb = (rng.random(6) * 0.02 + 0.01).astype(np.float32) if per_channel else np.array(0.02, np.float32)
    zb = np.zeros(sb.shape, np.int8)
    consts = {"sa": sa, "za": za, "b": rng.integers(-100, 100, (6, 8)).astype(np.int8), "sb": sb, "zb": zb,
              "c": rng.integers(-500, 500, 6).astype(np.int32)}  # fmt: skip
    ins = [("a", U8, (3, 8)), ("sa", F, ()), ("za", U8, ()), ("b", I8, (6, 8)), ("sb", F, sb.shape),
           ("zb", I8, sb.shape), ("c", I32, (6,))]  # fmt: skip
    if not float_out:
        consts["sy"], consts["zy"] = qparams(0.5, 128)
        ins += [("sy", F, ()), ("zy", U8, ())]
    out = [("y", F if float_out else U8, (3, 6))]
    check(one_node("QGemm", ins, out, consts, transB=1, alpha=1.0), rng, quantized=not float_out)


def test_integer_matmuls_to_float():
    rng = np.random.default_rng(11)
    consts = {"b": rng.integers(-100, 100, (8, 5)).astype(np.int8), "sb": np.array(0.01, np.float32),
              "bias": W(rng, 5)}  # fmt: skip
    m = one_node("DynamicQuantizeMatMul", [("a", F, (4, 8)), ("b", I8, (8, 5)), ("sb", F, ()), None, ("bias", F, (5,))],
                 [("y", F, (4, 5))], consts)  # fmt: skip
    feeds = {"a": W(rng, 4, 8)}
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    ours = ember.compile(m, fallback=False).run(feeds)["y"]
    step = 0.01 * float(np.ptp(feeds["a"])) / 255  # A's dynamic quantization step times B's scale
    assert np.abs(ours - ref).max() <= 8 * 100 * step, "beyond rounding A differently in each element"
    consts["sa"], consts["za"] = qparams(0.05, 128)
    m = one_node("MatMulIntegerToFloat", [("a", U8, (4, 8)), ("b", I8, (8, 5)), ("sa", F, ()), ("sb", F, ()),
                                          ("za", U8, ()), None, ("bias", F, (5,))], [("y", F, (4, 5))], consts)
    # against numpy in float64, not onnxruntime: its 1.32 kernel is off by up to 39 integer products on these
    # operands (a u8 x s8 pair sum that saturates 16 bits, as vpmaddubsw does)
    feeds = feeds_of(m, rng)
    a = feeds["a"].astype(np.float64) - float(consts["za"])
    ref = a @ consts["b"] * float(consts["sa"]) * float(consts["sb"]) + consts["bias"]
    ours = ember.compile(m, fallback=False).run(feeds)["y"]
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("k,n,bits,block,zeros,bias", [
    (64, 16, 4, 32, None, False), (100, 24, 4, 32, "packed", True), (96, 8, 8, 32, "packed", False),
    (64, 10, 4, 16, "float", False), (72, 12, 2, 16, "packed", False), (48, 5, 4, 16, "packed", True),
])  # fmt: skip
def test_matmul_nbits(k, n, bits, block, zeros, bias):
    """Weight-only quantization (onnxruntime's MatMulNBits): 2/4/8-bit codes in blocks of K, K not a multiple of the
    block (100, 72, 48: the last block padded), zero points packed like the codes, as floats, or absent (2^(bits-1)),
    an odd N (the packed zero points of a column end mid-byte), a bias."""
    rng = np.random.default_rng(k + n + bits)
    blocks = -(-k // block)
    consts = {"B": rng.integers(0, 256, (n, blocks, block * bits // 8)).astype(np.uint8),
              "scales": (rng.random(n * blocks) * 0.1 + 0.01).astype(np.float32)}  # fmt: skip
    ins = [("a", F, (3, k)), ("B", U8, consts["B"].shape), ("scales", F, (n * blocks,))]
    if zeros == "packed":
        consts["zp"] = rng.integers(0, 256, n * -(-blocks * bits // 8)).astype(np.uint8)
    elif zeros == "float":
        consts["zp"] = (rng.random(n * blocks) * (1 << bits)).astype(np.float32)
    ins.append(("zp", U8 if zeros == "packed" else F, consts["zp"].shape) if zeros else None)
    if bias:
        consts["bias"] = W(rng, n)
        ins += [None, ("bias", F, (n,))]
    check(one_node("MatMulNBits", ins, [("y", F, (3, n))], consts, K=k, N=n, bits=bits, block_size=block), rng)


def test_matmul_nbits_weights_read_at_run_time_are_refused_by_name():
    m = one_node("MatMulNBits", [("a", F, (3, 32)), ("B", U8, (4, 1, 16)), ("scales", F, (4,))], [("y", F, (3, 4))],
                 {"scales": np.ones(4, np.float32)}, K=32, N=4, bits=4, block_size=32)  # fmt: skip
    with pytest.raises(Exception, match="MatMulNBits.*must be constants"):
        ember.compile(m)
    consts = {"B": np.zeros((4, 1, 16), np.uint8), "scales": np.ones(4, np.float32)}
    m = one_node("MatMulNBits", [("a", F, (3, 32)), ("B", U8, (4, 1, 16)), ("scales", F, (4,)), None,
                                 ("g_idx", I32, (32,))], [("y", F, (3, 4))], consts, K=32, N=4, bits=4, block_size=32)
    with pytest.raises(Exception, match="MatMulNBits.*g_idx"):
        ember.compile(m)


def test_matmul_nbits_from_onnxruntimes_quantizer(tmp_path):
    """An MLP through onnxruntime's own 4-bit weight quantizer (`MatMulNBitsQuantizer`, block 32): the same
    outputs as onnxruntime on the file it writes."""
    nbits = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")
    rng = np.random.default_rng(12)
    nodes, inits = [], []
    x = "x"
    for i, (fi, fo) in enumerate([(64, 96), (96, 40)]):
        inits.append(numpy_helper.from_array(W(rng, fi, fo), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"]))
        x = f"h{i}"
        if i == 0:
            nodes.append(helper.make_node("Relu", [x], ["r0"]))
            x = "r0"
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", F, (4, 64))],
                              [helper.make_tensor_value_info(x, F, (4, 40))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    quant = nbits.MatMulNBitsQuantizer(model, block_size=32, is_symmetric=False)
    quant.process()
    q = quant.model.model
    assert any(node.op_type == "MatMulNBits" for node in q.graph.node)
    check(q, rng)


@pytest.mark.parametrize("rank,interleaved,offset,rotary_dim", [
    (3, False, False, 0), (3, True, False, 0), (4, False, True, 0), (4, True, False, 0), (3, False, True, 4),
    (3, True, False, 4), (4, False, False, 4),
])  # fmt: skip
def test_rotary_embedding(rank, interleaved, offset, rotary_dim):
    """RotaryEmbedding on (B, S, heads x head) or (B, heads, S, head), halves or interleaved pairs, positions per
    token or one offset, all of each head's dims or its first 4 (the rest passed through)."""
    rng = np.random.default_rng(rank * 8 + interleaved * 4 + offset * 2 + bool(rotary_dim))
    b_, s_, n, h = 2, 5, 3, 8
    half = (rotary_dim or h) // 2
    consts = {"cos": W(rng, 32, half, scale=1.0), "sin": W(rng, 32, half, scale=1.0)}
    shape = (b_, s_, n * h) if rank == 3 else (b_, n, s_, h)
    pos = np.array([4], np.int64) if offset else rng.integers(0, 32, (b_, s_)).astype(np.int64)
    attrs = {"interleaved": int(interleaved)} | ({"rotary_embedding_dim": rotary_dim, "num_heads": n} if rotary_dim
                                                 else {})  # fmt: skip
    m = one_node("RotaryEmbedding", [("x", F, shape), ("pos", TensorProto.INT64, pos.shape), ("cos", F, (32, half)),
                                     ("sin", F, (32, half))], [("y", F, shape)], consts, **attrs)  # fmt: skip
    feeds = {"x": W(rng, *shape, scale=1.0), "pos": pos}
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(ember.compile(m, fallback=False).run(feeds)["y"], ref, rtol=1e-5, atol=1e-5)


def test_unknown_contrib_op_named():
    m = one_node("NotAnOp", [("x", F, (2,))], [("y", F, (2,))], {})
    with pytest.raises(UnsupportedOperatorError, match="NotAnOp.*Microsoft contrib"):
        ember.compile(m)


# -- whole models as onnxruntime saves them ------------------------------------------------------------------
def small_cnn(rng: np.random.Generator) -> onnx.ModelProto:
    """Conv+BN+Relu, a residual add, Conv+Clip, global pooling and a Gemm head."""
    nodes, inits = [], []

    def conv(x, cin, cout, name, act):
        inits.extend([numpy_helper.from_array(W(rng, cout, cin, 3, 3, scale=0.3), name + "_w"),
                      numpy_helper.from_array(W(rng, cout, scale=0.1), name + "_b")])  # fmt: skip
        nodes.append(helper.make_node("Conv", [x, name + "_w", name + "_b"], [name], pads=[1, 1, 1, 1]))
        if act == "relu":
            nodes.append(helper.make_node("Relu", [name], [name + "_a"]))
            return name + "_a"
        inits.extend([numpy_helper.from_array(np.float32(0), name + "_lo"),
                      numpy_helper.from_array(np.float32(6), name + "_hi")])  # fmt: skip
        nodes.append(helper.make_node("Clip", [name, name + "_lo", name + "_hi"], [name + "_a"]))
        return name + "_a"

    h = conv("x", 3, 8, "c1", "relu")
    h2 = conv(h, 8, 8, "c2", "clip")
    nodes.append(helper.make_node("Add", [h, h2], ["res"]))
    nodes.append(helper.make_node("GlobalAveragePool", ["res"], ["gap"]))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"]))
    inits.extend([numpy_helper.from_array(W(rng, 10, 8), "fc_w"), numpy_helper.from_array(W(rng, 10), "fc_b")])
    nodes.append(helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["y"], transB=1))
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", F, (1, 3, 12, 12))],
                              [helper.make_tensor_value_info("y", F, (1, 10))], inits)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_models_onnxruntime_optimized_and_quantized(tmp_path):
    quantization = pytest.importorskip("onnxruntime.quantization")
    rng = np.random.default_rng(12)
    src = tmp_path / "cnn.onnx"
    onnx.save(small_cnn(rng), src)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    optimized = onnx.load(so.optimized_model_filepath)
    assert any(n.domain == MS for n in optimized.graph.node), "onnxruntime fused nothing"
    check(optimized, rng)

    class Reader(quantization.CalibrationDataReader):
        def __init__(self):
            self.data = iter([{"x": rng.standard_normal((1, 3, 12, 12)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.data, None)

    qpath = tmp_path / "qoperator.onnx"
    quantization.quantize_static(str(src), str(qpath), Reader(), quant_format=quantization.QuantFormat.QOperator)
    quantized = onnx.load(qpath)
    assert {"QLinearAdd", "QLinearGlobalAveragePool"} <= {n.op_type for n in quantized.graph.node if n.domain == MS}
    feeds = feeds_of(quantized, rng)
    ref = ort.InferenceSession(str(qpath), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    ours = ember.compile(str(qpath), fallback=False).run(feeds)["y"]
    scale = np.abs(ref).max()
    assert np.abs(ours - ref).max() <= 0.05 * scale, "beyond a few output quantization steps"


# -- attention ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mask", ["none", "2d", "lengths", "3d", "causal"])
def test_attention(mask):
    rng = np.random.default_rng(13)
    batch, seq, hidden, heads = 2, 6, 16, 4
    consts = {"w": W(rng, hidden, 3 * hidden), "b": W(rng, 3 * hidden)}
    ins = [("x", F, (batch, seq, hidden)), ("w", F, (hidden, 3 * hidden)), ("b", F, (3 * hidden,))]
    feeds = {"x": W(rng, batch, seq, hidden, scale=1.0)}
    if mask == "2d":
        ins.append(("m", I32, (batch, seq)))
        feeds["m"] = np.array([[1] * seq, [1] * 4 + [0] * 2], np.int32)
    elif mask == "lengths":
        ins.append(("m", I32, (batch,)))
        feeds["m"] = np.array([seq, 3], np.int32)
    elif mask == "3d":
        ins.append(("m", I32, (batch, seq, seq)))
        feeds["m"] = (rng.random((batch, seq, seq)) < 0.8).astype(np.int32)
        feeds["m"][..., 0] = 1
    m = one_node("Attention", ins, [("y", F, (batch, seq, hidden))], consts, num_heads=heads,
                 unidirectional=int(mask == "causal"))  # fmt: skip
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    ours = ember.compile(m, fallback=False).run(feeds)["y"]
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_multi_head_attention():
    rng = np.random.default_rng(14)
    batch, seq, kv_len, d, heads = 2, 5, 7, 16, 4
    consts = {"bias": W(rng, 3 * d)}
    ins = [("q", F, (batch, seq, d)), ("k", F, (batch, kv_len, d)), ("v", F, (batch, kv_len, d)),
           ("bias", F, (3 * d,)), ("m", I32, (batch, kv_len))]  # fmt: skip
    m = one_node("MultiHeadAttention", ins, [("y", F, (batch, seq, d))], consts, num_heads=heads)
    feeds = {"q": W(rng, batch, seq, d, scale=1.0), "k": W(rng, batch, kv_len, d, scale=1.0),
             "v": W(rng, batch, kv_len, d), "m": np.array([[1] * kv_len, [1] * 4 + [0] * 3], np.int32)}  # fmt: skip
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    ours = ember.compile(m, fallback=False).run(feeds)["y"]
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
