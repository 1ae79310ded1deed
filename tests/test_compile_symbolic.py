"""ember.compile with symbolic sizes: compiled once, run at many sizes, matching onnxruntime, planned once per size."""

from __future__ import annotations

import re
import sys

import numpy as np
import onnx
import pytest
from conftest import opencl_missing
from onnx import TensorProto, helper

import ember
from ember import zoo
from ember.runtime.module import ArgumentError
from ember.runtime.plan import Plan

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the reference")


def symbolic(model: onnx.ModelProto, dims: dict[str, dict[int, str]]) -> onnx.ModelProto:
    """The model with the given input/output dims made symbolic (name -> {axis: dim_param}), its stale
    intermediate shapes dropped (onnxruntime would trust them)."""
    for vi in list(model.graph.input) + list(model.graph.output):
        for axis, name in dims.get(vi.name, {}).items():
            vi.type.tensor_type.shape.dim[axis].dim_param = name
    del model.graph.value_info[:]
    return model


def check_sizes(model: onnx.ModelProto, compiled, feeds_at, sizes, atol=1e-4) -> None:
    sess = ort.InferenceSession(model.SerializeToString())
    for size in sizes:
        feeds = feeds_at(size)
        want = sess.run(None, feeds)
        got = compiled.run(feeds)
        for name, w in zip(compiled.output_names, want):
            assert got[name].shape == w.shape, (size, name)
            np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=atol, err_msg=f"size {size}")


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_transformer_layer_with_a_symbolic_batch(monkeypatch, target):
    m = zoo.transformer_encoder_layer(seq=8, batch=2)
    out = m.graph.output[0].name
    m = symbolic(m, {"x": {0: "B"}, out: {0: "B"}})
    cm = ember.compile(m, target=target, dynamic_bounds={"B": (1, 16)})
    s = cm.summary()
    assert s["symbolic_dims"] == {"B": [1, 16]} and s["input_shapes"] == {"x": "[B, 8, 32]"}
    assert s["fallback_ops"] == []
    rng = np.random.default_rng(0)
    planned = []
    at = Plan.at
    monkeypatch.setattr(Plan, "at", lambda self, sizes, *a: planned.append(sizes) or at(self, sizes, *a))
    check_sizes(m, cm, lambda b: {"x": rng.standard_normal((b, 8, 32)).astype(np.float32)}, (1, 3, 16, 3))
    assert planned == [(1,), (3,), (16,)]  # one plan per new size, kept
    with pytest.raises(ArgumentError, match=r"size B = 17 is outside its bounds \[1, 16\]"):
        cm(np.zeros((17, 8, 32), np.float32))
    with pytest.raises(ArgumentError, match=r"wants rank 3"):
        cm(np.zeros((8, 32), np.float32))


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_symbolic_dims_stay_symbolic_by_default_on_cpu_targets(target):
    m = symbolic(zoo.mlp(batch=4), {"x": {0: "N"}})
    dyn = ember.compile(m, target=target)  # the default on the CPU targets: symbolic, unbounded above
    assert dyn.summary()["symbolic_dims"] == {"N": [1, None]}
    rng = np.random.default_rng(1)
    check_sizes(m, dyn, lambda n: {"x": rng.standard_normal((n, 48)).astype(np.float32)}, (1, 5, 64))
    static = ember.compile(m, target=target, dynamic=False)  # specialized: a symbolic leading dim is 1
    assert static.plan.values[static.plan.inputs[0]].shape == (1, 48) and not static.plan.is_symbolic
    fixed = ember.compile(m, target=target, input_shapes={"x": (3, 48)})
    assert fixed.plan.values[fixed.plan.inputs[0]].shape == (3, 48) and not fixed.plan.is_symbolic
    with pytest.raises(ValueError, match="dynamic_bounds or dynamic_shapes is given with dynamic=False"):
        ember.compile(m, target=target, dynamic=False, dynamic_bounds={"N": (1, 4)})


def test_gpu_targets_specialize_symbolic_dims_with_a_warning():
    m = symbolic(zoo.mlp(batch=4), {"x": {0: "N"}})
    with pytest.raises(NotImplementedError, match="symbolic sizes .* not 'opencl'"):
        ember.compile(m, target="opencl", dynamic=True)
    if opencl_missing() is not None:
        pytest.skip(f"no OpenCL platform: {opencl_missing()}")
    with pytest.warns(UserWarning, match=r"symbolic dims \(N\) are specialized on target 'opencl'"):
        gpu = ember.compile(m, target="opencl")
    assert gpu.plan.values[gpu.plan.inputs[0]].shape == (1, 48)


def test_bert_with_symbolic_batch_and_sequence_compiles_once(monkeypatch):
    m = zoo.bert_encoder(layers=1, seq=64, d=32, heads=4, ff=64, dynamic=True)
    cm = ember.compile(m, target="c", dynamic_bounds={"seq": (1, 64), "batch": (1, 4)})
    assert cm.summary()["input_shapes"] == {"input_ids": "[batch, seq]", "attention_mask": "[batch, seq]"}
    import ember.codegen.toolchain as toolchain
    import ember.runtime.executor as executor

    def no_compile(*a, **k):
        raise AssertionError("a compile after the first")

    for module, name in ((toolchain, "compile_units"), (toolchain, "compile_c"), (executor, "compile_units")):
        monkeypatch.setattr(module, name, no_compile)
    rng = np.random.default_rng(2)

    def feeds(bs):
        b, s = bs
        mask = np.ones((b, s), np.int64)
        mask[:, s // 2 + 1 :] = 0  # padding at the end of each row
        return {"input_ids": rng.integers(0, 1000, (b, s)), "attention_mask": mask}

    check_sizes(m, cm, feeds, [(1, 1), (1, 7), (2, 16), (1, 64), (3, 33)])
    with pytest.raises(ArgumentError, match=r"wants \[batch, seq\] = \(2, 5\)"):
        cm.run({"input_ids": np.zeros((2, 5), np.int64), "attention_mask": np.zeros((2, 6), np.int64)})


def test_resnet18_with_a_symbolic_batch():
    m = zoo.resnet18(image=32, width=8)
    m = symbolic(m, {"x": {0: "N"}, m.graph.output[0].name: {0: "N"}})
    cm = ember.compile(m, target="c", dynamic_bounds={"N": (1, 8)})
    assert cm.summary()["fallback_ops"] == []
    rng = np.random.default_rng(3)
    check_sizes(m, cm, lambda n: {"x": rng.standard_normal((n, 3, 32, 32)).astype(np.float32)}, (1, 3, 8))


def test_a_symbolic_batch_keeps_winograd_convolutions():
    """A stride-1 3x3 convolution over a symbolic batch runs as Winograd (its gain is per image), its tiles over
    N x tiles-per-image; values match onnxruntime at several batches."""
    rng = np.random.default_rng(8)
    w = helper.make_tensor("w", TensorProto.FLOAT, [32, 32, 3, 3], (rng.standard_normal((32, 32, 3, 3)) / 17).ravel())
    conv = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 32, 16, 16]) for n in "xy")
    graph = helper.make_graph([conv], "wino", [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    cm = ember.compile(model, target="c", dynamic_bounds={"N": (1, 4)})
    assert "ConvWinogradNCHWc" in {op for k in cm.profile({"x": np.zeros((1, 32, 16, 16), np.float32)})
                                   for op in k["ops"]}  # fmt: skip
    check_sizes(model, cm, lambda n: {"x": rng.standard_normal((n, 32, 16, 16)).astype(np.float32)}, (1, 3, 4))


def test_profile_counts_flops_and_bytes_at_the_call_sizes(tmp_path):
    """A symbolic kernel's FLOPs are an expression of the sizes, evaluated at each call's (not the compile's size
    hint), the same through save and load, and equal to those of the model specialized to that size."""
    rng = np.random.default_rng(9)
    w = helper.make_tensor("w", TensorProto.FLOAT, [16, 8, 3, 3], (rng.standard_normal((16, 8, 3, 3)) / 9).ravel())
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 12, 12])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16, 12, 12])
    model = helper.make_model(helper.make_graph(nodes, "conv", [x], [y], [w]),
                              opset_imports=[helper.make_opsetid("", 17)])  # fmt: skip
    cm = ember.compile(model, target="c", dynamic_bounds={"N": (1, 8)})
    cm.save(tmp_path / "m")
    loaded = ember.load(tmp_path / "m")

    def totals(m, n):
        rows = m.profile({"x": np.zeros((n, 8, 12, 12), np.float32)}, repeat=1)
        return sum(r["flops"] for r in rows), sum(r["bytes"] or 0 for r in rows)

    for n in (1, 5):
        flops, nbytes = totals(cm, n)
        specialized = totals(ember.compile(model, target="c", input_shapes={"x": (n, 8, 12, 12)}), n)
        assert flops == specialized[0] >= n * 2 * 16 * 8 * 9 * 144
        assert nbytes > 0
        assert totals(loaded, n)[0] == flops


def _array_before_a_guard_page(shape: tuple[int, ...]) -> tuple[np.ndarray, object]:
    """A float32 array whose last byte ends a page, the next page unreadable: a kernel reading past it faults."""
    import ctypes
    import mmap

    n = int(np.prod(shape)) * 4
    pages = -(-n // mmap.PAGESIZE)
    mm = mmap.mmap(-1, (pages + 1) * mmap.PAGESIZE)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(addr + pages * mmap.PAGESIZE, mmap.PAGESIZE, 0) == 0
    arr = np.frombuffer(mm, dtype=np.float32, count=n // 4, offset=pages * mmap.PAGESIZE - n).reshape(shape)
    return arr, mm


@pytest.mark.skipif(sys.platform != "linux", reason="mprotect through libc")
def test_symbolic_gemm_reads_no_row_past_its_inputs():
    """Row tiles of a symbolic product do not read past the last row of S: the inputs end at an unreadable page,
    at sizes that do not divide the tiles."""
    k = 32
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "mm",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["S", k]),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, [k, "S"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["S", "S"])])  # fmt: skip
    m = ember.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), dynamic=True)
    rng = np.random.default_rng(0)
    for s in (1, 7, 13, 25):
        a, keep_a = _array_before_a_guard_page((s, k))
        b, keep_b = _array_before_a_guard_page((k, s))
        a[:], b[:] = rng.standard_normal((s, k)), rng.standard_normal((k, s))
        np.testing.assert_allclose(m.run({"a": a, "b": b})["y"], a @ b, rtol=1e-5, atol=1e-5)
        del a, b, keep_a, keep_b


def test_reshapes_and_transposes_of_a_symbolic_length():
    """Reshapes unravel each run of dims with equal products on their own ([N, 96] -> [1, N, 3, 32] and
    [N, 6, 16]), and the tiled transpose after them has a main part and a tail; values match onnxruntime."""
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["r1"]),
             helper.make_node("Transpose", ["r1"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("Reshape", ["x", "s2"], ["r2"]),
             helper.make_node("Transpose", ["r2"], ["u"], perm=[1, 0, 2])]  # fmt: skip
    graph = helper.make_graph(nodes, "reshapes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 96])],
                              [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 3, 32, "N"]),
                               helper.make_tensor_value_info("u", TensorProto.FLOAT, [6, "N", 16])],
                              [helper.make_tensor("s1", TensorProto.INT64, [4], [1, -1, 3, 32]),
                               helper.make_tensor("s2", TensorProto.INT64, [3], [-1, 6, 16])])  # fmt: skip
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    cm = ember.compile(m, target="c", dynamic_bounds={"N": (1, 64)})
    assert "floormod_int64(" not in cm.source and "floordiv_int64(" not in cm.source  # sizes >= 0: C division
    rng = np.random.default_rng(5)
    check_sizes(m, cm, lambda n: {"x": rng.standard_normal((n, 96)).astype(np.float32)}, (1, 5, 17, 64), atol=0)


def test_a_size_the_model_bounds_is_bounded_by_default():
    """BERT slices its 16-row position table by seq and adds it to the embeddings ([B, seq] + [1, min(seq, 16)]):
    without dynamic_bounds the default compile bounds seq by 16 (a warning names it) instead of failing."""
    m = zoo.bert_encoder(layers=1, seq=16, d=32, heads=2, ff=64, vocab=50, dynamic=True)
    with pytest.warns(UserWarning, match=r"needs seq <= 16 .*compiled with seq in \[1, 16\]"):
        cm = ember.compile(m, target="c")
    s = cm.summary()
    assert s["symbolic_dims"] == {"batch": [1, None], "seq": [1, 16]} and s["inferred_bounds"] == {"seq": [1, 16]}
    rng = np.random.default_rng(4)

    def feeds(bs):
        return {"input_ids": rng.integers(0, 50, bs), "attention_mask": np.ones(bs, np.int64)}

    check_sizes(m, cm, feeds, [(1, 16), (3, 5)])
    with pytest.raises(ArgumentError, match=r"size seq = 17 is outside its bounds \[1, 16\]"):
        cm.run(feeds((1, 17)))
    with pytest.raises(ember.frontend.onnx.ModelError, match=r"dynamic_bounds=\{'seq': \(1, 16\)\}"):
        ember.compile(m, target="c", dynamic_bounds={"seq": (1, 32)})  # a bound given: not changed, the fix named


def _dense_model(k: int, n: int) -> onnx.ModelProto:
    """y = x @ w + b + x[:, :n]: a dense layer with a residual (a fused GEMM epilogue), x of S rows."""
    rng = np.random.default_rng(5)
    w = helper.make_tensor("w", TensorProto.FLOAT, [k, n], rng.standard_normal((k, n)).astype(np.float32).ravel())
    b = helper.make_tensor("b", TensorProto.FLOAT, [n], rng.standard_normal(n).astype(np.float32))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["q"]),
             helper.make_node("Add", ["q", "x"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["S", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["S", n])], [w, b])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_symbolic_product_below_one_tile_runs_a_variant_per_size():
    """Sizes below one row tile run a constant-size variant each (`S == r`: its tile loops unroll, its accumulators
    are registers, as in a kernel specialized to r rows), and the tail after full tiles one per remainder (`S % 12
    == r`: a tile of r rows after S // 12 full ones). Every variant, the general tails and the main part match
    onnxruntime."""
    model = _dense_model(32, 32)
    m = ember.compile(model, target="c -threads=1", dynamic_bounds={"S": (1, 96)})  # (parallel loops: no partition)
    tile = m.source.count("if (S == ((int64_t)") + 1
    assert tile >= 3 and len(re.findall(r"if \(S % \(\(int64_t\)\d+LL\) == ", m.source)) == tile - 1
    rng = np.random.default_rng(6)
    sizes = list(range(1, tile + 3)) + [2 * tile - 1, 3 * tile + tile // 2, 96]  # every small variant, remainders
    check_sizes(model, m, lambda s: {"x": rng.standard_normal((s, 32)).astype(np.float32)}, sizes)


def test_batched_scores_with_a_batch_bounded_to_one_keep_registers_and_vector_panels():
    """Attention scores [B, H, S, d] x [B, H, d, S] with B bounded to (1, 1): the batch is the constant 1 in the
    kernel (its accumulator tile indexed by constants: registers), and the column tail's clamped panel offset stays
    a multiple of the panel (vector loads of B's panel, no gathers); values match onnxruntime at every tail."""
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["B", 2, "S", 16])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["B", 2, 16, "S"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 2, "S", "S"])
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "scores", [a, b], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m = ember.compile(model, target="c -threads=1", dynamic_bounds={"B": (1, 1), "S": (1, 80)})
    assert "_gather_" not in m.source and "int64_t B" not in m.source
    rng = np.random.default_rng(7)

    def feeds(s):
        return {"a": rng.standard_normal((1, 2, s, 16)).astype(np.float32),
                "b": rng.standard_normal((1, 2, 16, s)).astype(np.float32)}  # fmt: skip

    check_sizes(model, m, feeds, (1, 5, 12, 13, 31, 32, 45, 80))


@pytest.mark.parametrize("target", ["c -mcpu=skylake-avx512 -threads=1", "c -mcpu=haswell -threads=1"])
def test_symbolic_rows_that_may_be_skinny_pack_the_skinny_panel(target):
    """Rows of S in [1, 64] are a GEMV at S = 1 and a GEMM at 64: the weight is packed once in the panel width of
    the skinny plan (4 vectors with AVX-512's 32 registers: full tiles of 7 x 64, variants of 1..6 rows; AVX2's
    16 registers keep 2 vectors), and every size, through each variant and remainder, matches onnxruntime."""
    from ember.target import Target
    from ember.templates import nn as T

    model = _dense_model(128, 128)
    m = ember.compile(model, target=target, dynamic_bounds={"S": (1, 64)})
    t = Target.parse(target)
    lanes = T.lanes_of("float32", t)
    width = T.packed_width(128, "float32", t, rows=64, rows_low=1)
    assert width == (4 * lanes if T.vector_regs(t) >= 32 else 2 * lanes)
    assert T.packed_width(128, "float32", t, rows=64, rows_low=8) == 2 * lanes  # never skinny: the GEMM's own
    panels = [v.shape for v in m.plan.values if v.kind == "weight" and len(v.shape) == 3]
    assert panels == [(128 // width, 128, width)]
    rng = np.random.default_rng(8)
    if not t.executes_here:  # (AVX-512 code on a CPU without it: the model refuses to run, naming what is missing)
        from ember.runtime.cross import ForeignTargetError

        with pytest.raises(ForeignTargetError, match="avx512f"):
            m.run({"x": np.zeros((4, 128), np.float32)})
        return
    sizes = [1, 2, 5, 6, 7, 8, 9, 13, 16, 20, 64]
    check_sizes(model, m, lambda s: {"x": rng.standard_normal((s, 128)).astype(np.float32)}, sizes)


def test_expand_to_a_shape_tested_against_minus_one():
    """torch.onnx's legacy exporter writes x.expand(b, s) as Expand(x, Where(shape == -1, 1, shape)): the test
    folds (a size is never -1), so the target is the input's symbolic shape and the model compiles once."""
    nodes = [helper.make_node("Shape", ["ids"], ["shape"]),
             helper.make_node("Constant", [], ["minus1"], value=helper.make_tensor("m", TensorProto.INT64, [], [-1])),
             helper.make_node("Equal", ["shape", "minus1"], ["is_any"]),
             helper.make_node("ConstantOfShape", ["two"], ["ones"],
                              value=helper.make_tensor("o", TensorProto.INT64, [1], [1])),
             helper.make_node("Where", ["is_any", "ones", "shape"], ["target"]),
             helper.make_node("Expand", ["row", "target"], ["expanded"]),
             helper.make_node("Cast", ["ids"], ["idf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["expanded", "idf"], ["y"]),
             helper.make_node("Gather", ["y", "last"], ["y_last"], axis=1)]  # fmt: skip
    two = helper.make_tensor("two", TensorProto.INT64, [1], [2])
    row = helper.make_tensor("row", TensorProto.FLOAT, [1, 1], [0.5])
    last = helper.make_tensor("last", TensorProto.INT64, [], [-1])
    graph = helper.make_graph(nodes, "expand", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s"]),
                               helper.make_tensor_value_info("y_last", TensorProto.FLOAT, ["b"])], [two, row, last])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m = ember.compile(model, dynamic=True)
    rng = np.random.default_rng(0)
    check_sizes(model, m, lambda n: {"ids": rng.integers(0, 9, (n % 3 + 1, n))}, [3, 7, 20])
