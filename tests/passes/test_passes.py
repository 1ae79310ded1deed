"""Graph passes: the IR before/after each rewrite, and the function kept (reference evaluator vs onnxruntime).

Numerics use the numpy reference evaluator on the rewritten graph (so a pass is checked without compiling)
and compare with onnxruntime on the original model: rtol 1e-4, atol 1e-5 (outputs near zero)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto

import ember
from ember import zoo
from ember.frontend.onnx import from_onnx
from ember.graph.ir import Node, Value
from ember.graph.types import TensorType
from ember.ops.evaluate import evaluate
from ember.ops.verify import verify
from ember.passes import PASSES, pass_names, run_passes
from ember.passes.batchnorm import fold_batchnorm
from ember.passes.cleanup import dead_code_elimination, eliminate_common_subexpr, fold_constant
from ember.passes.fuse import fuse_ops
from ember.passes.simplify import simplify

ort = pytest.importorskip("onnxruntime")
RTOL, ATOL = 1e-4, 1e-5


def ort_run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def check_same_function(model: onnx.ModelProto, graph, seeds=(0, 1)) -> None:
    for seed in seeds:
        feeds = zoo.random_feeds(model, seed)
        ours = list(evaluate(graph, feeds).values())
        for a, b in zip(ours, ort_run(model, feeds)):
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def ops(graph) -> list[str]:
    return [n.op for n in graph.nodes]


def build(fn, inputs: dict, dtypes: dict | None = None) -> onnx.ModelProto:
    b = zoo.Builder(11)
    out = fn(b)
    return b.model(inputs, out, dtypes=dtypes)


# -- each pass, before and after ------------------------------------------------------------------


def test_simplify_removes_identities_and_noops():
    def net(b):
        y = b.op("Identity", ["x"])
        y = b.op("Mul", [y, b.const(np.ones((4,), np.float32))])
        y = b.op("Add", [b.const(np.float32(0)), y])
        y = b.op("Dropout", [y])
        y = b.op("Cast", [y], to=TensorProto.FLOAT)
        y = b.op("Transpose", [b.op("Transpose", [y], perm=[1, 0])], perm=[1, 0])
        y = b.op(
            "Reshape", [b.op("Reshape", [y, b.const(np.array([8], np.int64))]), b.const(np.array([2, 4], np.int64))]
        )
        return b.op("Relu", [y])

    model = build(net, {"x": (2, 4)})
    g = from_onnx(model)
    assert {"Identity", "Mul", "Add", "Dropout", "Cast", "Transpose", "Reshape"} <= set(ops(g))
    g = simplify(g)
    assert ops(g) == ["Relu"]
    check_same_function(model, g)


@pytest.mark.parametrize("form", ["torch", "hf", "inner_half"])
def test_simplify_recognizes_gelu(form):
    def net(b):
        x = b.op("Relu", ["x"])
        erf = b.op("Erf", [b.op("Div", [x, b.const(np.float32(np.sqrt(2)))])])
        one = b.op("Add", [erf, b.const(np.float32(1))])
        half = b.const(np.float32(0.5))
        if form == "torch":
            return b.op("Mul", [b.op("Mul", [x, one]), half])
        if form == "hf":
            return b.op("Mul", [b.op("Mul", [x, half]), one])
        return b.op("Mul", [x, b.op("Mul", [one, half])])

    model = build(net, {"x": (3, 5)})
    g = simplify(from_onnx(model))
    assert ops(g) == ["Relu", "Gelu"]
    check_same_function(model, g)


@pytest.mark.parametrize("cube", ["pow", "mul"])
def test_simplify_recognizes_tanh_gelu(cube):
    """GPT-2's 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) -> Gelu(approximate="tanh"): one op, so
    it fuses into the matmul before it (x feeds four nodes of the spelled-out form: no chain to fuse)."""

    def net(b):
        x = b.op("Relu", ["x"])
        x3 = b.op("Pow", [x, b.const(np.float32(3))]) if cube == "pow" else b.op("Mul", [x, b.op("Mul", [x, x])])
        inner = b.op("Add", [x, b.op("Mul", [b.const(np.float32(0.044715)), x3])])
        t = b.op("Tanh", [b.op("Mul", [inner, b.const(np.float32(np.sqrt(2 / np.pi)))])])
        return b.op("Mul", [b.op("Mul", [x, b.const(np.float32(0.5))]), b.op("Add", [t, b.const(np.float32(1))])])

    model = build(net, {"x": (3, 5)})
    g = simplify(from_onnx(model))
    assert ops(g) == ["Relu", "Gelu"] and g.nodes[1].attrs["approximate"] == "tanh"
    check_same_function(model, g)


def test_simplify_recognizes_layer_norm():
    def net(b):
        mean = b.op("ReduceMean", ["x"], axes=[-1], keepdims=1)
        d = b.op("Sub", ["x", mean])
        var = b.op("ReduceMean", [b.op("Pow", [d, b.const(np.float32(2))])], axes=[-1])
        n = b.op("Div", [d, b.op("Sqrt", [b.op("Add", [var, b.const(np.float32(1e-5))])])])
        return b.op("Add", [b.op("Mul", [n, b.weight((6,), positive=True)]), b.weight((6,))])

    model = build(net, {"x": (2, 3, 6)})
    g = simplify(from_onnx(model))
    assert ops(g) == ["LayerNormalization"]
    assert g.nodes[0].attrs["epsilon"] == pytest.approx(1e-5)
    check_same_function(model, g)


def test_fold_batchnorm_into_conv_and_gemm():
    def net(b):
        y = b.conv_bn_relu("x", 3, 8)  # Conv (no bias) + BN + Relu
        y = b.op("Flatten", [b.op("GlobalAveragePool", [y])])
        y = b.op("Gemm", [y, b.weight((5, 8)), b.weight((5,))], transB=1)
        bn = [b.weight((5,), positive=True), b.weight((5,)), b.weight((5,)), b.weight((5,), positive=True)]
        return b.op("BatchNormalization", [y, *bn])

    model = build(net, {"x": (2, 3, 6, 6)})
    g = fold_batchnorm(from_onnx(model))
    assert "BatchNormalization" not in ops(g)
    conv = next(n for n in g.nodes if n.op == "Conv")
    assert len(conv.inputs) == 3 and conv.inputs[2].is_constant  # the folded bias
    check_same_function(model, g)


def test_fold_constant_scale_and_shift_into_conv_and_lone_batchnorm():
    def net(b):
        y = b.conv("x", 3, 4, bias=True)
        y = b.op("Mul", [y, b.weight((4, 1, 1), positive=True)])
        y = b.op("Add", [y, b.weight((1, 4, 1, 1))])
        bn = [b.weight((4,), positive=True), b.weight((4,)), b.weight((4,)), b.weight((4,), positive=True)]
        return b.op("BatchNormalization", [b.op("Relu", [y]), *bn])  # after Relu: nothing to fold into

    model = build(net, {"x": (1, 3, 5, 5)})
    g = fold_batchnorm(from_onnx(model))
    assert ops(g) == ["Conv", "Relu", "Mul", "Add"]
    check_same_function(model, g)


def test_cse_and_dce():
    def net(b):
        w = b.weight((4, 4))
        a1 = b.op("MatMul", ["x", w])
        a2 = b.op("MatMul", ["x", w])
        b.op("Exp", ["x"])  # unused
        c1 = b.const(np.full((4,), 2.0, np.float32))
        c2 = b.const(np.full((4,), 2.0, np.float32))
        return b.op("Add", [b.op("Mul", [a1, c1]), b.op("Mul", [a2, c2])])

    model = build(net, {"x": (3, 4)})
    g = from_onnx(model)
    g = eliminate_common_subexpr(dead_code_elimination(g))
    assert ops(g) == ["MatMul", "Mul", "Add"]
    add = g.nodes[-1]
    assert add.inputs[0] is add.inputs[1]
    check_same_function(model, g)


def test_dead_code_elimination_drops_unused_optional_outputs():
    """A LayerNormalization's unused mean and inverse deviation and a MaxPool's unused indices are dropped (each
    then lowers to its one-output kernel); a Split's unused last output is kept (the count of a Split's outputs
    is its split); the function is onnxruntime's."""
    from onnx import helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 4, 4])
    g = onnx.numpy_helper.from_array(np.random.default_rng(0).standard_normal(4).astype(np.float32), "g")
    nodes = [
        helper.make_node("MaxPool", ["x"], ["p", "idx"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Split", ["p"], ["s0", "s1", "s2"], axis=1, num_outputs=3),
        helper.make_node("Concat", ["s0", "s1"], ["c"], axis=1),
        helper.make_node("LayerNormalization", ["c", "g"], ["y", "mean", "inv"], axis=-1),
    ]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [g]), opset_imports=[helper.make_opsetid("", 18)])
    graph = dead_code_elimination(from_onnx(model))
    outs = {n.op: len(n.outputs) for n in graph.nodes}
    assert outs == {"MaxPool": 1, "Split": 3, "Concat": 1, "LayerNormalization": 1}
    check_same_function(model, graph)
    feeds = zoo.random_feeds(model, 2)
    np.testing.assert_allclose(ember.compile(model).run(feeds)["y"], ort_run(model, feeds)[0], rtol=RTOL, atol=ATOL)


def test_fold_constant_evaluates_constant_subgraphs():
    g = from_onnx(zoo.mlp())
    w = next(v for v in g.constants() if v.shape == (64, 48))
    t = Value("wt", TensorType((48, 64), "float32"))
    g.nodes.insert(0, Node("Transpose", [w], [t], {"perm": (1, 0)}, "wt"))  # as exporters leave weight transposes
    g = fold_constant(g)
    assert t.is_constant and np.array_equal(t.data, w.data.T)
    assert "Transpose" not in ops(g)


def test_fuse_conv_bias_relu_residual_into_one_kernel():
    model = zoo.resnet_basic_block()
    g, _ = run_passes(from_onnx(model), opt_level=3)
    assert ops(g) == ["Fused", "Fused"]
    second = g.nodes[1].attrs["body"]
    assert [n.op for n in second.nodes] == ["Conv", "Add", "Relu"]  # conv (+ folded bias) + residual + relu
    assert g.nodes[1].attrs["body"].name == "fused_conv_add_relu"
    check_same_function(model, g)


def test_fuse_does_not_make_cycles():
    def net(b):
        a = b.op("Exp", ["x"])
        c = b.op("Neg", [a])  # depends on a ...
        d = b.op("Sqrt", [b.op("Abs", [c])])
        return b.op("Add", [a, d])  # ... so `a`'s group cannot take Add while d is outside it

    model = build(net, {"x": (8,)})
    g = fuse_ops(from_onnx(model))
    verify(g)
    check_same_function(model, g)


def test_fuse_takes_readers_that_meet_again():
    """SiLU (x * sigmoid(x)) and a longer diamond after a conv join its kernel: the conv's output has two
    elementwise readers that meet again in one node. Where one of them is also read elsewhere, they do not."""

    def net(b):
        y = b.conv("x", 8, 8, bias=True)
        y = b.op("Mul", [y, b.op("Sigmoid", [y])])  # SiLU
        y = b.conv(y, 8, 8)
        t = b.op("Tanh", [y])
        y = b.op("Add", [b.op("Mul", [y, b.op("Exp", [b.op("Neg", [t])])]), b.op("Abs", [t])])
        z = b.conv(y, 8, 8)
        s = b.op("Sigmoid", [z])
        return b.op("Add", [b.op("Mul", [z, s]), b.op("ReduceMean", [s], axes=[1], keepdims=1)])

    model = build(net, {"x": (1, 8, 6, 6)})
    g = fuse_ops(from_onnx(model))
    bodies = [[m.op for m in n.attrs["body"].nodes] for n in g.nodes if n.op == "Fused"]
    assert ["Conv", "Sigmoid", "Mul"] in bodies and ["Conv", "Tanh", "Neg", "Exp", "Mul", "Abs", "Add"] in bodies
    assert "Sigmoid" in ops(g)  # the third conv's sigmoid is read by a reduction too
    verify(g)
    check_same_function(model, g)
    feeds = zoo.random_feeds(model, 2)  # and compiled: the conv's result is read twice in one kernel
    ours = ember.compile(model, fallback=False)(*feeds.values())
    np.testing.assert_allclose(ours, ort_run(model, feeds)[0], rtol=RTOL, atol=ATOL)


def test_elementwise_after_a_view_of_a_product_fuses_into_it():
    """GPT-2's 2-d Gemm -> Reshape to [1, T, N] -> GELU -> Reshape back, and Gemm -> Reshape -> residual Add: the
    elementwise ops move before the views (into the product's rows), so each joins its product's kernel."""

    def net(b):
        h = b.op("Reshape", ["x", b.const(np.array([8, 16], np.int64))])
        y = b.op("Gemm", [h, b.weight((16, 32)), b.weight((32,))])
        y = b.op("Tanh", [b.op("Reshape", [y, b.const(np.array([1, 8, 32], np.int64))])])
        y = b.op("Reshape", [y, b.const(np.array([8, 32], np.int64))])
        y = b.op("Gemm", [y, b.weight((32, 16)), b.weight((16,))])
        return b.op("Add", [b.op("Reshape", [y, b.const(np.array([1, 8, 16], np.int64))]), "x"])

    model = build(net, {"x": (1, 8, 16)})
    g, _ = run_passes(from_onnx(model), opt_level=3)
    bodies = [[m.op for m in n.attrs["body"].nodes] for n in g.nodes if n.op == "Fused"]
    assert ["MatMulPackedB", "Tanh"] in bodies and any(b[0] == "MatMulPackedB" and b[-1] == "Add" for b in bodies)
    assert "Tanh" not in ops(g) and "Add" not in ops(g)
    check_same_function(model, g)


def test_elementwise_after_a_view_to_a_scalar_stays():
    """A view of a one-element product to a scalar (a decoder's length arithmetic) has no rows to keep."""

    def net(b):
        y = b.op("Reshape", [b.op("MatMul", ["x", b.weight((4, 1))]), b.const(np.array([], np.int64))])
        return b.op("Add", [y, b.const(np.float32(1))])

    model = build(net, {"x": (1, 4)})
    g = simplify(from_onnx(model))
    assert ops(g) == ["MatMul", "Reshape", "Add"]
    check_same_function(model, g)


def test_reduction_takes_elementwise_prologue():
    def net(b):
        sq = b.op("Mul", ["x", "x"])
        return b.op(
            "ReduceSum", [b.op("Exp", [sq]), b.const(np.array([1], np.int64))], keepdims=0
        )  # axes input: opset 13

    model = build(net, {"x": (4, 7)})
    g = fuse_ops(from_onnx(model))
    assert ops(g) == ["Fused"]
    assert [n.op for n in g.nodes[0].attrs["body"].nodes] == ["Mul", "Exp", "ReduceSum"]
    check_same_function(model, g)


# -- the pipeline ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(zoo.BLOCKS))
@pytest.mark.parametrize("opt_level", [0, 1, 2, 3])
def test_pipeline_keeps_function(name, opt_level):
    model = zoo.BLOCKS[name]()
    g, report = run_passes(from_onnx(model), opt_level=opt_level, verify=True)
    assert all(r["pass"] in pass_names() for r in report)
    assert opt_level > 0 or [r["pass"] for r in report] == ["unroll_scan"]  # level 0: only control-flow lowering
    check_same_function(model, g, seeds=(0,))


def test_pipeline_options_and_errors(capsys):
    model = zoo.resnet_basic_block()
    g, report = run_passes(from_onnx(model), disabled=["fuse_ops"])
    assert "Fused" not in ops(g) and "fuse_ops" not in [r["pass"] for r in report]
    run_passes(from_onnx(model), dump_after="fold_batchnorm")
    assert "# after fold_batchnorm" in capsys.readouterr().out
    with pytest.raises(ValueError, match="unknown pass"):
        run_passes(from_onnx(model), disabled=["no_such_pass"])
    with pytest.raises(ValueError, match="opt_level"):
        run_passes(from_onnx(model), opt_level=7)
    assert len(PASSES) >= 6


def test_resnet18_kernels_at_most_a_third_of_onnx_nodes():
    model = zoo.resnet18(image=64, classes=10)
    g, _ = run_passes(from_onnx(model), opt_level=3)
    kernels = [n for n in g.nodes if n.op not in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")]
    assert len(kernels) <= len(model.graph.node) / 3, (len(kernels), len(model.graph.node))


def test_unroll_scan_inlines_each_step():
    from onnx import helper

    def vi(name: str, shape: list[int]):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]), helper.make_node("Mul", ["s_out", "x_t"], ["y_t"])],
        "body", [vi("s_in", [3]), vi("x_t", [3])], [vi("s_out", [3]), vi("y_t", [3])],
    )  # fmt: skip
    scan = helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1,
                            scan_input_directions=[1], scan_output_axes=[1])  # fmt: skip
    graph = helper.make_graph([scan], "g", [vi("s0", [3]), vi("xs", [4, 3])], [vi("s", [3]), vi("ys", [3, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    g = run_passes(from_onnx(model), opt_level=0)[0]
    assert "Scan" not in ops(g) and ops(g).count("Add") == 4
    check_same_function(model, g)
