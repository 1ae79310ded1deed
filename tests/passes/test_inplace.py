"""Concatenation without copies (`ember.passes.inplace`): producers write their part of a Concat straight into
the output's storage, channel splits are views; the plan's aliases and liveness are checked, and each model's
outputs against onnxruntime on fresh random inputs (NCHW and the blocked layout, channel counts multiple of the
block and not, a concat feeding two readers, a part read by another op too, parts that must be copied,
DenseNet-style growing concats, a ShuffleNet unit)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.codegen.toolchain import find_cc
from ember.frontend.onnx import from_onnx
from ember.passes import run_passes
from ember.runtime.plan import check_plan, live_ranges
from ember.runtime.standalone import run_exported

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the reference")


class Net:
    """A small ONNX model built node by node; convs get random weights (kept small: values stay O(1))."""

    def __init__(self, c: int, hw: int = 10, batch: int = 1, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.shape = [], [], (batch, c, hw, hw)
        self.channels = {"x": c}

    def conv(self, x: str, k: int, name: str, kernel: int = 1, relu: bool = True) -> str:
        c = self.channels[x]
        w = (self.rng.standard_normal((k, c, kernel, kernel)) / np.sqrt(c * kernel * kernel)).astype(np.float32)
        self.inits.append(numpy_helper.from_array(w, f"{name}_w"))
        out = f"{name}_c" if relu else name
        self.nodes.append(helper.make_node("Conv", [x, f"{name}_w"], [out], pads=[kernel // 2] * 4))
        if relu:
            self.nodes.append(helper.make_node("Relu", [out], [name]))
        self.channels[name] = k
        return name

    def concat(self, xs: list[str], name: str) -> str:
        self.nodes.append(helper.make_node("Concat", xs, [name], axis=1))
        self.channels[name] = sum(self.channels[x] for x in xs)
        return name

    def add(self, op: str, ins: list[str], outs: list[str], **attrs) -> None:
        self.nodes.append(helper.make_node(op, ins, outs, **attrs))

    def model(self, outputs: list[str]):
        """The model, its outputs' shapes as onnxruntime gives them."""
        shapes = [list("nchw")] * len(outputs)
        for _ in range(2):
            x = helper.make_tensor_value_info("x", TensorProto.FLOAT, self.shape)
            ys = [helper.make_tensor_value_info(o, TensorProto.FLOAT, s) for o, s in zip(outputs, shapes)]
            g = helper.make_graph(self.nodes, "net", [x], ys, self.inits)
            model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
            sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            shapes = [r.shape for r in sess.run(None, {"x": np.zeros(self.shape, np.float32)})]
        return model


def check(model, blocked: bool, monkeypatch) -> ember.Model:
    """Compile (the small convs taking the blocked layout when `blocked`), check the plan, compare with onnxruntime."""
    if blocked:
        monkeypatch.setattr("ember.passes.layout.MIN_MACS", 0)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    feeds = {"x": np.random.default_rng().standard_normal(shape).astype(np.float32)}
    refs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    m = ember.compile(model, fallback=False)
    check_plan(m.plan, m._weights if hasattr(m, "_weights") else {})
    for _ in range(2):  # the second run reuses the workspace
        got = m.run(feeds)
        for out, ref in zip(model.graph.output, refs):
            np.testing.assert_allclose(got[out.name], ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))
    return m


def in_place(m: ember.Model) -> list[str]:
    """The names of the values that are slices of another value's storage."""
    return [v.name for v in m.plan.values if v.kind == "alias" and v.view_offset > 0]


def kernel_ops(m: ember.Model) -> Counter:
    return Counter(op for s in m.plan.steps for k in s.kernels for op in k.ops)


@pytest.mark.parametrize("blocked, widths", [(False, (24, 8, 16)), (True, (32, 16, 16)), (True, (24, 8, 16)),
                                             (True, (20, 12, 8)), (True, (6, 10, 16))])  # fmt: skip
def test_concat_of_convs_written_in_place(monkeypatch, blocked, widths):
    """Three conv branches concatenated, then a conv: the branches write into the concat (no Concat kernel), in
    NCHW and blocked (block 16, 8 or 4 dividing every branch); 6 + 10 channels have no common block >= 4 (NCHW)."""
    n = Net(16)
    a = n.conv("x", 16, "a")
    parts = [n.conv(a, k, f"b{i}", kernel=1 + 2 * (i % 2)) for i, k in enumerate(widths)]
    n.conv(n.concat(parts, "cat"), 16, "y", kernel=3, relu=False)
    model = n.model(["y"])
    m = check(model, blocked, monkeypatch)
    assert not kernel_ops(m)["Concat"] and not kernel_ops(m)["ConcatInPlace"]
    assert len(in_place(m)) == len(widths) - 1
    if blocked and widths != (6, 10, 16):  # no round trip through NCHW: only the graph output goes back
        g, _ = run_passes(from_onnx(model), opt_level=3, disabled=["fuse_ops"], verify=True)
        assert [x.attrs["dst_layout"] for x in g.nodes if x.op == "LayoutTransform"].count("NCHW") == 1


def test_plan_liveness_of_parts(monkeypatch):
    """A part's storage is the concat's: it lives from the first part's write to the concat's last reader, and no
    other temporary overlaps it meanwhile."""
    n = Net(16)
    a = n.conv("x", 16, "a")
    cat = n.concat([n.conv(a, 16, "b0"), n.conv(a, 16, "b1")], "cat")
    n.conv(n.conv(cat, 16, "d"), 16, "y", relu=False)
    m = check(n.model(["y"]), False, monkeypatch)
    plan = m.plan
    first, last = live_ranges(plan)
    root = next(i for i, v in enumerate(plan.values) if v.name == "cat")
    parts = [i for i, v in enumerate(plan.values) if v.kind == "alias" and v.alias_of == root]
    assert len(parts) == 2 and first[root] == 1  # the first branch's conv (after a's) writes it
    for i, v in enumerate(plan.values):
        if v.kind == "temp" and i != root and first.get(i, 0) <= last[root] and last.get(i, 0) >= first[root]:
            lo, hi = plan.values[root].offset, plan.values[root].offset + plan.values[root].nbytes
            assert v.offset + v.nbytes <= lo or v.offset >= hi, v.name


@pytest.mark.parametrize("blocked", [False, True])
def test_concat_read_twice_and_part_read_elsewhere(monkeypatch, blocked):
    """The concat feeds two convs; one part is also read by another conv (it is read from the concat's storage)."""
    n = Net(16)
    a = n.conv("x", 16, "a")
    b0, b1 = n.conv(a, 16, "b0"), n.conv(a, 16, "b1", kernel=3)
    cat = n.concat([b0, b1], "cat")
    n.add("Add", [n.conv(cat, 16, "y0"), n.conv(cat, 16, "y1")], ["y01"])
    n.add("Add", ["y01", n.conv(b1, 16, "side")], ["y"])
    m = check(n.model(["y"]), blocked, monkeypatch)
    assert len(in_place(m)) == 1 and not kernel_ops(m)["Concat"]


def test_parts_that_must_be_copied(monkeypatch):
    """A part used in two concats at different offsets, the graph input, a graph output and a repeated part: those
    concats copy; the one concat whose parts are all free still goes in place."""
    n = Net(16)
    a, b = n.conv("x", 16, "a"), n.conv("x", 16, "b")
    n.concat([a, b], "c1")  # a and b sit in c2 already (placed from the last concat back): c1 copies
    n.concat([b, a], "c2")  # b and a in place
    n.concat(["x", n.conv("x", 16, "d")], "c3")  # the graph input
    n.concat([n.conv("x", 16, "e"), n.conv("x", 16, "out")], "c4")  # a graph output
    n.concat([n.conv("x", 16, "f"), "f"], "c5")  # the same value twice
    n.add("Sum", [n.conv(c, 16, f"y{c}", relu=False) for c in ("c1", "c2", "c3", "c4", "c5")], ["y"])
    m = check(n.model(["y", "out"]), False, monkeypatch)
    assert kernel_ops(m)["Concat"] == 4 and sorted(in_place(m)) == ["a"]


def test_batch_two_copies_nchw(monkeypatch):
    """At batch 2 the parts of a channel concat are not contiguous: a Concat kernel, still correct."""
    n = Net(16, batch=2)
    a = n.conv("x", 16, "a")
    n.conv(n.concat([n.conv(a, 8, "b0"), n.conv(a, 24, "b1")], "cat"), 16, "y", relu=False)
    m = check(n.model(["y"]), True, monkeypatch)
    assert kernel_ops(m)["Concat"] == 1 and not in_place(m)


def test_dense_block_concats_are_prefixes(monkeypatch):
    """DenseNet: each layer reads the concat of all features so far, the last concat holds them all; every
    feature is written once into the last concat's storage and the earlier concats are views of its prefix."""
    n = Net(16)
    feats = [n.conv("x", 16, "f0")]
    for i in range(1, 4):
        src = feats[0] if i == 1 else n.concat(feats, f"cat{i}")
        feats.append(n.conv(n.conv(src, 16, f"bn{i}"), 8, f"f{i}", kernel=3))
    n.conv(n.concat(feats, "block"), 16, "y", relu=False)
    for blocked in (False, True):
        m = check(n.model(["y"]), blocked, monkeypatch)
        assert not kernel_ops(m)["Concat"] and len(in_place(m)) == 3


def shuffle_unit(n: Net, x: str, c: int, name: str) -> str:
    """ShuffleNet v2 unit: split the channels in halves, a branch on the second, concat, channel shuffle (2)."""
    half = c // 2
    n.add("Split", [x], [f"{name}_x1", f"{name}_x2"], axis=1, num_outputs=2)
    n.channels[f"{name}_x2"] = n.channels[f"{name}_x1"] = half
    b = n.conv(n.conv(f"{name}_x2", half, f"{name}_p1"), half, f"{name}_p2", kernel=3)
    cat = n.concat([f"{name}_x1", b], f"{name}_cat")
    hw = n.shape[2]
    for k, (shape, out) in enumerate([((1, 2, half, hw, hw), "r1"), ((1, c, hw, hw), "r2")]):
        shape_init = numpy_helper.from_array(np.array(shape, np.int64), f"{name}_s{k}")
        n.inits.append(shape_init)
        src = cat if k == 0 else f"{name}_t"
        n.add("Reshape", [src, shape_init.name], [f"{name}_{out}"])
        if k == 0:
            n.add("Transpose", [f"{name}_r1"], [f"{name}_t"], perm=[0, 2, 1, 3, 4])
    n.channels[f"{name}_r2"] = c
    return f"{name}_r2"


@pytest.mark.parametrize("blocked", [False, True])
def test_shuffle_units(monkeypatch, blocked):
    """Two ShuffleNet units: the split halves are views of their input (no Split kernel), each shuffle is one
    ChannelShuffle kernel (no Transpose), in the blocked layout where its inputs are (58-channel halves, ShuffleNet
    v2 1.0x: their convs padded to whole vectors); the second one is not folded into y's weights: its concat
    would copy (its first half is a view of the first shuffle's output)."""
    for c in (32, 116):
        n = Net(c)
        x = n.conv("x", c, "stem")
        n.conv(shuffle_unit(n, shuffle_unit(n, x, c, "u1"), c, "u2"), 16, "y", relu=False)
        m = check(n.model(["y"]), blocked, monkeypatch)
        ops = kernel_ops(m)
        assert not ops["Split"] and not ops["Transpose"] and ops["ChannelShuffle"] + ops["ChannelShuffleNCHWc"] == 2
        # blocked where the convs are: the small 32-channel ones only when forced; the 58-channel ones padded to 64
        assert ops["ChannelShuffleNCHWc"] == (0 if not blocked and c == 32 else 2)
        assert blocked or not ops["Concat"]  # the shuffles read the concats' inputs
        assert sum(v.kind == "alias" and "_x" in v.name for v in m.plan.values) >= 4


def test_pass_leaves_gpu_graphs_and_symbolic_concats():
    """The GPU targets keep their Concat kernels; the pass prints as ConcatInPlace where it applies."""
    n = Net(16)
    n.conv(n.concat([n.conv("x", 8, "b0"), n.conv("x", 8, "b1")], "cat"), 16, "y", relu=False)
    cpu, _ = run_passes(from_onnx(n.model(["y"])), opt_level=3, disabled=["fuse_ops"], verify=True)
    gpu, _ = run_passes(from_onnx(n.model(["y"])), opt_level=3, disabled=["fuse_ops"], verify=True, target="opencl")
    assert Counter(x.op for x in cpu.nodes)["ConcatInPlace"] == 1
    assert Counter(x.op for x in gpu.nodes)["Concat"] == 1


def dense_and_shuffle(c: int = 32) -> Net:
    """A growing concat (views of a prefix) then a shuffle unit (channel views): every kind of offset view."""
    n = Net(c)
    f0 = n.conv("x", c, "f0")
    f1 = n.conv(f0, c // 2, "f1")
    f2 = n.conv(n.concat([f0, f1], "cat1"), c // 2, "f2")
    n.conv(shuffle_unit(n, n.conv(n.concat([f0, f1, f2], "cat2"), c, "mix"), c, "u"), 8, "y", relu=False)
    return n


def test_views_survive_save_load_and_the_llvm_backend(tmp_path, monkeypatch):
    """The aliases' offsets are part of the saved plan; the LLVM backend reads the same table of addresses."""
    model = dense_and_shuffle().model(["y"])
    m = check(model, False, monkeypatch)
    assert in_place(m)
    m.save(tmp_path / "m")
    feeds = {"x": np.random.default_rng(3).standard_normal((1, 32, 10, 10)).astype(np.float32)}
    np.testing.assert_array_equal(ember.load(tmp_path / "m").run(feeds)["y"], m.run(feeds)["y"])
    pytest.importorskip("llvmlite", reason="the LLVM backend needs llvmlite")
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(ember.compile(model, target="llvm").run(feeds)["y"], ref, rtol=1e-4,
                               atol=1e-4 * float(np.abs(ref).max()))  # fmt: skip


@pytest.mark.skipif(find_cc() is None, reason="needs a C compiler")
def test_exported_program_points_views_at_their_offsets(tmp_path, monkeypatch):
    """ember_run (the standalone C export) sets each view's address at its byte offset: the same outputs."""
    model = dense_and_shuffle().model(["y"])
    m = check(model, True, monkeypatch)
    out = m.export(tmp_path / "exp", extra_cflags=["-Werror"])
    assert "(unsigned char*)m->table[" in (out / "ember_model.c").read_text()
    feeds = {"x": np.random.default_rng(4).standard_normal((1, 32, 10, 10)).astype(np.float32)}
    outputs, _ = run_exported(out, feeds)
    np.testing.assert_array_equal(outputs["y"], m.run(feeds)["y"])


def test_blocked_conv_reads_a_split_half_at_its_offset(monkeypatch):
    """A conv taking the blocked layout reads a split half whose channels have no block as [N, C, H, W, 1]: a view
    (Reshape) of a view (the half, at its offset in the split input); the offset carries through both."""
    n = Net(12, hw=8)
    n.conv("x", 12, "s")
    n.add("Split", ["s"], ["a", "b"], axis=1, num_outputs=2)
    n.channels["a"] = n.channels["b"] = 6
    n.conv("b", 16, "y", relu=False)
    m = check(n.model(["y", "a"]), True, monkeypatch)
    assert {v.name: v.view_offset for v in m.plan.values if v.kind == "alias"}["b_NCHW1c"] == 6 * 8 * 8 * 4
