"""Channel shuffles in the blocked layout (`ChannelShuffleNCHWc`, made by `ember.passes.layout`): ShuffleNet units
(split, a conv branch, concat, shuffle) and ShuffleNet v1-style group shuffles, compiled with the small convs taking
the blocked layout, against onnxruntime on fresh random inputs: groups 2 and 4, halves whose channels are not a
multiple of the concatenation's block, batch 1 and 2; no LayoutTransform left between the blocked convs, the concat
read by the shuffle (no copy) and the split halves views at batch 1; the op against numpy."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from onnx import numpy_helper
from test_inplace import Net, check, kernel_ops

import ember
from ember import te
from ember.frontend.onnx import from_onnx
from ember.graph.types import TensorType
from ember.ops import get_op
from ember.ops.common import ShapeError
from ember.ops.layout import relayout
from ember.passes import run_passes
from ember.target import Target


def shuffle(n: Net, x: str, c: int, group: int, name: str) -> str:
    """Reshape [N, g, C/g, H, W] -> Transpose(0, 2, 1, 3, 4) -> Reshape [N, C, H, W], as torchvision writes it."""
    batch, hw = n.shape[0], n.shape[2]
    for k, shape in enumerate([(batch, group, c // group, hw, hw), (batch, c, hw, hw)]):
        n.inits.append(numpy_helper.from_array(np.array(shape, np.int64), f"{name}_s{k}"))
    n.add("Reshape", [x, f"{name}_s0"], [f"{name}_r1"])
    n.add("Transpose", [f"{name}_r1"], [f"{name}_t"], perm=[0, 2, 1, 3, 4])
    n.add("Reshape", [f"{name}_t", f"{name}_s1"], [name])
    n.channels[name] = c
    return name


def unit(n: Net, x: str, c: int, name: str) -> str:
    """ShuffleNet v2 unit (stride 1): split in halves, 1x1 / 3x3 / 1x1 convs on the second, concat, shuffle (2)."""
    half = c // 2
    n.add("Split", [x], [f"{name}_x1", f"{name}_x2"], axis=1, num_outputs=2)
    n.channels[f"{name}_x2"] = n.channels[f"{name}_x1"] = half
    b = n.conv(n.conv(n.conv(f"{name}_x2", half, f"{name}_a"), half, f"{name}_b", kernel=3), half, f"{name}_c")
    return shuffle(n, n.concat([f"{name}_x1", b], f"{name}_cat"), c, 2, name)


def shufflenet(c: int, batch: int, units: int = 2, hw: int = 6) -> Net:
    """A first unit of two branches on the input (ShuffleNet v2's downsampling unit, at stride 1), concat, shuffle;
    then `units` units."""
    n = Net(c, hw=hw, batch=batch, seed=c + batch)
    branches = [n.conv(n.conv("x", c // 2, "l0", kernel=3), c // 2, "l1"), n.conv("x", c // 2, "r0")]
    y = shuffle(n, n.concat(branches, "stem_cat"), c, 2, "stem")
    for i in range(units):
        y = unit(n, y, c, f"u{i}")
    n.conv(y, 8, "y", relu=False)
    return n


def passes_ops(model, monkeypatch, blocked: bool = True) -> list[str]:
    """The ops after the passes (all convs blocked, or only those big enough to start a blocked region)."""
    if blocked:
        monkeypatch.setattr("ember.passes.layout.MIN_MACS", 0)
    g, _ = run_passes(from_onnx(model), opt_level=3, disabled=["fuse_ops"], verify=True)
    return [node.op for node in g.nodes]


@pytest.mark.parametrize("c, batch", [(48, 1), (48, 2), (40, 1), (40, 2)])
def test_shufflenet_units_match_onnxruntime(monkeypatch, c, batch):
    """48 channels: halves of 24 (block 8 with 16 lanes, 4 with 8); 40: halves of 20, a multiple of 4 only, so the
    shuffle writes blocks of 4 where the convs would take larger ones; batch 2: the halves are not views."""
    m = check(shufflenet(c, batch).model(["y"]), True, monkeypatch)
    ops = kernel_ops(m)
    assert ops["ChannelShuffleNCHWc"] == 3 and not ops["ChannelShuffle"] and not ops["Transpose"]
    assert not ops["Concat"]  # each shuffle reads its concat's inputs (the last one is not folded into y's weights:
    # its concat would copy, its first half being a view of the shuffle before)
    assert ops["LayoutTransform"] == 2  # the input in, the output out: none between the units


def test_no_layout_transform_between_the_blocked_convs(monkeypatch):
    """Between the first and the last blocked conv of two units, every value stays blocked: the only
    LayoutTransforms (besides the weights' at compile time) take the model's input in and its output out."""
    ops = passes_ops(shufflenet(48, 1).model(["y"]), monkeypatch)
    convs = [k for k, op in enumerate(ops) if op == "ConvNCHWc"]
    assert len(convs) == 10 and ops.count("ChannelShuffleNCHWc") == 3
    assert "LayoutTransform" not in ops[convs[0]:convs[-1]]
    assert {"ChannelShuffle", "Transpose", "Concat"}.isdisjoint(ops)


def test_split_halves_are_views_at_batch_one(monkeypatch):
    """The shuffle writes the blocks the split cuts between: each half of its output is a view (no Split kernel)."""
    m = check(shufflenet(48, 1, units=3).model(["y"]), True, monkeypatch)
    assert not kernel_ops(m)["Split"]
    assert sum(v.kind == "alias" and "_x" in v.name for v in m.plan.values) >= 4


@pytest.mark.parametrize("group, c, batch", [(4, 32, 1), (4, 64, 2), (2, 24, 2)])
def test_group_shuffle_between_convs(monkeypatch, group, c, batch):
    """ShuffleNet v1: a grouped 1x1 conv, the shuffle of its groups, a depthwise conv and a residual add (which
    keeps the shuffle from being folded into weights); one shuffle kernel, blocked."""
    n = Net(c, hw=5, batch=batch, seed=group + c)
    n.conv("x", c, "stem")
    w = (n.rng.standard_normal((c, c // group, 1, 1)) / np.sqrt(c / group)).astype(np.float32)
    n.inits.append(numpy_helper.from_array(w, "g_w"))
    n.add("Conv", ["stem", "g_w"], ["g"], group=group)
    n.channels["g"] = c
    s = shuffle(n, "g", c, group, "s")
    wd = n.rng.standard_normal((c, 1, 3, 3)).astype(np.float32) / 3
    n.inits.append(numpy_helper.from_array(wd, "d_w"))
    n.add("Conv", [s, "d_w"], ["d"], group=c, pads=[1, 1, 1, 1])
    n.add("Add", ["d", s], ["r"])
    n.channels["r"] = c
    n.conv("r", 8, "y", relu=False)
    m = check(n.model(["y"]), True, monkeypatch)
    ops = kernel_ops(m)
    assert ops["ChannelShuffleNCHWc"] == 1 and not ops["Transpose"] and ops["LayoutTransform"] == 2


@pytest.mark.parametrize("group, blocks, channels, out_block", [
    (2, (4, 4), (12, 12), 4), (2, (4, 4), (12, 12), 8), (2, (8, 1), (16, 8), 4), (4, (4,) * 4, (8,) * 4, 16),
    (3, (1, 4), (5, 4), 3), (3, (1, 4), (5, 4), 1)])  # fmt: skip
def test_op_against_numpy(group, blocks, channels, out_block):
    """The kernel on its own: inputs in their own blocks (1 = NCHW as [N, C, H, W, 1]), of equal or unequal
    channels, against numpy's reshape and transpose of the concatenation."""
    rng = np.random.default_rng(group * 10 + out_block)
    flat = [rng.standard_normal((2, ch, 3, 5)).astype(np.float32) for ch in channels]
    xs = [relayout(x, "NCHW", f"NCHW{b}c") for x, b in zip(flat, blocks)]
    cat = np.concatenate(flat, axis=1)
    n, c, h, w = cat.shape
    shuffled = cat.reshape(n, group, c // group, h, w).transpose(0, 2, 1, 3, 4).reshape(n, c, h, w)
    want = relayout(shuffled, "NCHW", f"NCHW{out_block}c")
    ph = [te.placeholder(x.shape, "float32", name=f"x{k}") for k, x in enumerate(xs)]
    opdef, attrs = get_op("ChannelShuffleNCHWc"), {"group": group, "block": out_block}
    y = opdef.compute(attrs, *ph)
    f = ember.build(opdef.schedule(attrs, [y], Target.parse("c")), [*ph, y], target="c")
    got = np.full(want.shape, np.nan, np.float32)
    f(*xs, got)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(opdef.reference(attrs, *xs)[0], want)


def test_bad_inputs_name_the_problem():
    infer = get_op("ChannelShuffleNCHWc").infer
    with pytest.raises(ShapeError, match="NCHW"):
        infer({"group": 2, "block": 4}, TensorType((1, 8, 3, 3), "float32"))
    with pytest.raises(ShapeError, match="multiple of the group and of the block"):
        infer({"group": 2, "block": 8}, TensorType((1, 3, 3, 3, 4), "float32"))
    with pytest.raises(ShapeError, match="differ outside the channels"):
        infer({"group": 2, "block": 4}, TensorType((1, 1, 3, 3, 4), "float32"), TensorType((1, 1, 2, 3, 4), "float32"))


@pytest.mark.parametrize("blocked", [False, True])
def test_shuffle_of_unblocked_inputs(monkeypatch, blocked):
    """A shuffle none of whose inputs is blocked (6 channels have no block) stays NCHW unless a conv that takes the
    blocked layout reads it: then it reads its inputs as [N, C, H, W, 1] views and writes the conv's blocks, one
    copy in place of the NCHW shuffle and a LayoutTransform (ShuffleNet v2 1.0x: 58-channel branches, then 116
    channels). A graph output keeps it from being folded into the conv's weights."""
    n = Net(12, hw=4)
    shuffle(n, n.concat([n.conv("x", 6, "a"), n.conv("x", 6, "b")], "cat"), 12, 2, "s")
    n.conv("s", 12, "y", relu=False)
    ops = Counter(passes_ops(n.model(["y", "s"]), monkeypatch, blocked))
    assert ops["ChannelShuffle"] + ops["ChannelShuffleNCHWc"] == 1 and ops["ChannelShuffleNCHWc"] == blocked
    assert ops["LayoutTransform"] == (2 if blocked else 0)  # back to NCHW: y and s, the graph's outputs
    if blocked:
        check(n.model(["y", "s"]), True, monkeypatch)


def downsampling_unit(c: int, batch: int) -> Net:
    """ShuffleNet v2's downsampling unit (at stride 1 here) whose shuffle only convolutions read: the next unit's
    branches, a depthwise conv then a 1x1 conv (a Relu between), and a 1x1 conv."""
    n = Net(c, hw=6, batch=batch, seed=7 * c + batch)
    branches = [n.conv(n.conv("x", c // 2, "l0", kernel=3), c // 2, "l1"), n.conv("x", c // 2, "r0")]
    y = shuffle(n, n.concat(branches, "cat"), c, 2, "s")
    wd = n.rng.standard_normal((c, 1, 3, 3)).astype(np.float32) / 3
    n.inits.append(numpy_helper.from_array(wd, "d_w"))
    n.inits.append(numpy_helper.from_array(n.rng.standard_normal(c).astype(np.float32), "d_b"))
    n.add("Conv", [y, "d_w", "d_b"], ["d"], group=c, pads=[1, 1, 1, 1])
    n.add("Relu", ["d"], ["dr"])
    n.channels["dr"] = c
    n.add("Concat", [n.conv("dr", c // 2, "a", relu=False), n.conv(y, c // 2, "b", relu=False)], ["y"], axis=1)
    return n


@pytest.mark.parametrize("c, batch, blocked", [(32, 1, True), (32, 2, True), (24, 1, False)])
def test_shuffle_read_by_convs_folds_into_their_weights(monkeypatch, c, batch, blocked):
    """At batch 1, the permutation goes into the weights of the convs that read the shuffle (through the depthwise
    conv and the Relu: their weights and bias permuted, so their outputs carry it to the 1x1 conv): no shuffle
    kernel at all, and the concat is written in place by its two branches."""
    m = check(downsampling_unit(c, batch).model(["y"]), blocked, monkeypatch)
    ops = kernel_ops(m)
    assert not ops["ChannelShuffle"] and not ops["Transpose"]
    assert ops["ChannelShuffleNCHWc"] == ops["Concat"] == (batch > 1)  # at batch 2 a concat would copy: the shuffle
    # stays (one copy either way); the output's concat copies


@pytest.mark.parametrize("batch", [1, 2])
def test_branch_channels_padded_to_whole_vectors(monkeypatch, batch):
    """ShuffleNet v2 1.0x's stage 2: 58-channel branches have no block; their convs compute 64 channels (zero weights
    and bias for the padding: 58 -> 64 adds 10%), the depthwise conv and Relu run on the padded value and the shuffle
    reads the 58 channels of each; its output, whose cuts at 58 fit no block, is written NCHW ([N, C, H, W, 1])
    and the next convs read their halves as such, at their offsets at batch 1."""
    n = shufflenet(116, batch, units=2, hw=5)
    m = check(n.model(["y"]), True, monkeypatch)
    ops = kernel_ops(m)
    assert ops["ChannelShuffleNCHWc"] == 3 and not ops["ChannelShuffle"] and ops["LayoutTransform"] == 2
    g_ops = passes_ops(n.model(["y"]), monkeypatch)
    assert "Slice" not in g_ops or batch == 2  # no unpadding slice at batch 1: every reader takes the padded value


def test_padded_value_read_by_an_unpadded_conv(monkeypatch):
    """A reader that cannot take the padding (a conv of 6 output channels: no block, and 16 would add too much) gets
    the value back in NCHW, its padding sliced off."""
    n = Net(16, hw=5, seed=3)
    n.conv(n.conv(n.conv("x", 16, "a"), 58, "b"), 6, "y", relu=False)
    m = check(n.model(["y"]), True, monkeypatch)
    assert kernel_ops(m)["ConvNCHWc"] == 2


def test_padding_goes_through_clip_and_stops_at_a_residual_add(monkeypatch):
    """A Clip (ReLU6-like, its bounds scalars) carries the padding of b to the conv d reading it; d's output, read by
    an Add whose output is the graph's (padded, it would need a slice; an Add of values padded alike is padded, see
    tests/passes/test_layout.py's RegNet blocks), is not padded: d and e keep 58 channels, unblocked (so d gets the
    Clip back in NCHW, its padding sliced off)."""
    n = Net(16, hw=5, seed=5)
    b = n.conv(n.conv("x", 16, "a"), 58, "b", relu=False)
    for name, v in (("lo", 0.0), ("hi", 0.5)):
        n.inits.append(numpy_helper.from_array(np.array(v, np.float32), name))
    n.add("Clip", [b, "lo", "hi"], ["clip"])
    n.channels["clip"] = 58
    d = n.conv("clip", 58, "d")
    n.add("Add", [d, n.conv(d, 58, "e")], ["y"])
    m = check(n.model(["y"]), True, monkeypatch)
    ops = kernel_ops(m)
    assert ops["ConvNCHWc"] == 2 and ops["Conv"] == 2  # a and b (padded) blocked; d gets the Clip back in NCHW, sliced
