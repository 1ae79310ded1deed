"""Shape operands fed as graph inputs (a Reshape target, reduction axes, TopK's k, ...): compiled once, their
values read at run time (`ember.graph.dims.ValueSizeVar`), every call matching onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import ember
from ember.frontend.onnx import DynamicShapeError, ModelError
from ember.runtime.module import ArgumentError

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the reference")

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def one_node(op: str, x_shape: list[int] | None, operand: list[int], out_ranks: list[int], opset: int = 18,
             n_out: int = 1, **attrs) -> object:  # fmt: skip
    """A model of one node: op(x, operand) with the operand an int64 graph input of shape `operand`."""
    ins = [helper.make_tensor_value_info("x", F, x_shape)] if x_shape is not None else []
    ins.append(helper.make_tensor_value_info("s", I64, operand))
    names = [f"y{i}" for i in range(n_out)]
    dtypes = [F, I64] if op == "TopK" else [F] * n_out
    outs = [helper.make_tensor_value_info(n, t, [None] * r) for n, t, r in zip(names, dtypes, out_ranks)]
    node = helper.make_node(op, [i.name for i in ins], names, **attrs)
    graph = helper.make_graph([node], op.lower(), ins, outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


# (model, x's shape, the operand's values at each call)
CASES = {
    "reshape": (one_node("Reshape", [2, 3, 4], [3], [3]), [2, 3, 4], [[4, 3, 2], [0, -1, 2], [-1, 1, 1], [6, 2, 2]]),
    "expand": (one_node("Expand", [3, 1], [3], [3]), [3, 1], [[2, 3, 4], [1, 3, 1], [1, 1, 5]]),
    "tile": (one_node("Tile", [2, 3], [2], [2]), [2, 3], [[1, 1], [3, 2], [2, 1]]),
    "constant_of_shape": (one_node("ConstantOfShape", None, [2], [2], value=helper.make_tensor("v", F, [1], [1.5])),
                          None, [[2, 3], [1, 7]]),  # fmt: skip
    "reduce_sum_keepdims": (one_node("ReduceSum", [3, 4, 5], [2], [3]), [3, 4, 5], [[0, 2], [1, -1], [2, 1]]),
    "reduce_mean": (one_node("ReduceMean", [3, 4, 5], [1], [2], keepdims=0), [3, 4, 5], [[0], [-1], [1]]),
    "reduce_max_empty": (one_node("ReduceMax", [2, 0, 3], [1], [3]), [2, 0, 3], [[1], [0], [2]]),
    "cumsum": (one_node("CumSum", [2, 3, 4], [], [3], opset=14), [2, 3, 4], [0, 1, -1]),
    "unsqueeze": (one_node("Unsqueeze", [3, 4], [2], [4], opset=13), [3, 4], [[0, 3], [1, 2], [-1, 0]]),
    "squeeze": (one_node("Squeeze", [1, 4, 1], [1], [2], opset=13), [1, 4, 1], [[0], [2], [-1]]),
    "topk": (one_node("TopK", [3, 6], [1], [2, 2], opset=11, n_out=2), [3, 6], [[1], [4], [6]]),
    "trilu": (one_node("Trilu", [4, 5], [], [2], opset=14), [4, 5], [0, 2, -1]),
    "split": (one_node("Split", [6, 2], [2], [2, 2], opset=13, n_out=2), [6, 2], [[2, 4], [0, 6], [5, 1]]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_operand_values_read_at_run_time(name, target="c"):
    model, x_shape, values = CASES[name]
    compiled = ember.compile(model, target=target, fallback=False)
    sess = ort.InferenceSession(model.SerializeToString())
    rng = np.random.default_rng(len(name))
    for value in values:
        feeds = {"s": np.array(value, np.int64)}
        if x_shape is not None:
            feeds["x"] = rng.standard_normal(x_shape).astype(np.float32)
        want = sess.run(None, feeds)
        got = compiled.run(feeds)
        for out, w in zip(compiled.output_names, want):
            assert got[out].shape == w.shape, (name, value, out)
            np.testing.assert_allclose(got[out], w, rtol=1e-5, atol=1e-6, err_msg=f"{name} at {value}")
    assert compiled.summary()["fallback_ops"] == []


def test_one_hot_depth_fed_as_a_float_input():
    ins = [helper.make_tensor_value_info("i", I64, [2, 3]), helper.make_tensor_value_info("d", F, [1]),
           helper.make_tensor_value_info("v", F, [2])]  # fmt: skip
    node = helper.make_node("OneHot", ["i", "d", "v"], ["y"], axis=1)
    graph = helper.make_graph([node], "one_hot", ins, [helper.make_tensor_value_info("y", F, [2, None, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    compiled = ember.compile(model, target="c", fallback=False)
    sess = ort.InferenceSession(model.SerializeToString())
    rng = np.random.default_rng(0)
    for depth in (4.0, 10.0, 3.0):
        feeds = {"i": rng.integers(-3, 3, (2, 3)), "d": np.array([depth], np.float32),
                 "v": np.array([-1.0, 2.0], np.float32)}  # fmt: skip
        (want,) = sess.run(None, feeds)
        np.testing.assert_array_equal(compiled.run(feeds)["y"], want)


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.BOOL, TensorProto.INT32])
def test_non_zero_counted_from_the_input_at_run_time(dtype):
    ins = [helper.make_tensor_value_info("x", dtype, [3, 4])]
    graph = helper.make_graph([helper.make_node("NonZero", ["x"], ["y"])], "non_zero", ins,
                              [helper.make_tensor_value_info("y", I64, [2, None])])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    compiled = ember.compile(model, target="c", fallback=False)
    sess = ort.InferenceSession(model.SerializeToString())
    np_dtype = {TensorProto.FLOAT: np.float32, TensorProto.BOOL: np.bool_, TensorProto.INT32: np.int32}[dtype]
    rng = np.random.default_rng(dtype)
    for p in (0.0, 0.3, 1.0):
        x = ((rng.random((3, 4)) < p) * rng.integers(1, 5, (3, 4))).astype(np_dtype)
        (want,) = sess.run(None, {"x": x})
        np.testing.assert_array_equal(compiled.run({"x": x})["y"], want)


@pytest.mark.parametrize("name, value, message", [
    ("reshape", [5, 5, 1], "cannot reshape"),
    ("reshape", [-1, -1, 2], "one -1 at most"),
    ("squeeze", [1], "removes only dims of 1"),
    ("topk", [7], "outside its bounds"),
    ("split", [2, 3], "add up to the axis length 6"),
    ("reduce_sum_keepdims", [0, 0], "axes must be distinct"),
])  # fmt: skip
def test_bad_operand_values_name_the_input(name, value, message):
    model, x_shape, _ = CASES[name]
    compiled = ember.compile(model, target="c", fallback=False)
    feeds = {"x": np.zeros(x_shape, np.float32), "s": np.array(value, np.int64)}
    with pytest.raises(ArgumentError, match=message) as e:
        compiled.run(feeds)
    assert "'s'" in str(e.value)


@pytest.mark.parametrize("name", ["reshape", "topk", "split"])
def test_operand_values_read_at_run_time_on_llvm(name):
    test_operand_values_read_at_run_time(name, target="llvm")


def test_sizes_read_from_values_need_a_cpu_target():
    model, _, _ = CASES["reshape"]
    with pytest.raises(NotImplementedError, match="targets c, llvm only so far, not 'opencl'"):
        ember.compile(model, target="opencl")


# -- operands of several inputs, and operands other nodes compute from inputs --------------------------------
def model_of(nodes: list, inputs: list[tuple[str, int, list]], outputs: list[tuple[str, int, list]],
             opset: int = 19) -> object:  # fmt: skip
    ins = [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs]
    outs = [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs]
    graph = helper.make_graph(nodes, "g", ins, outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def check_against_ort(model, feeds_list: list[dict], rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """One compile, every feed run against onnxruntime; no node runs by reference."""
    compiled = ember.compile(model, target="c", fallback=False)
    sess = ort.InferenceSession(model.SerializeToString())
    for feeds in feeds_list:
        want = sess.run(None, feeds)
        got = compiled.run(feeds)
        for out, w in zip(compiled.output_names, want):
            assert got[out].shape == w.shape, (feeds, out)
            np.testing.assert_allclose(got[out], w, rtol=rtol, atol=atol, err_msg=str(feeds))
    assert compiled.summary()["fallback_ops"] == []


def test_slice_starts_ends_axes_steps_fed_as_inputs():
    model = model_of([helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["y"])],
                     [("x", F, [5, 6, 4])] + [(n, I64, [2]) for n in ("st", "en", "ax", "sp")],
                     [("y", F, [None] * 3)])  # fmt: skip
    x = np.random.default_rng(0).standard_normal((5, 6, 4)).astype(np.float32)
    cases = [([0, 1], [3, 5], [0, 1], [1, 2]), ([-1, 5], [-9, 0], [1, 0], [-1, -2]),
             ([1, 0], [2**62, -1], [-1, 0], [2, 1]), ([3, 0], [3, 4], [0, 2], [1, 3])]  # fmt: skip
    check_against_ort(model, [{"x": x, **{n: np.array(v, np.int64) for n, v in zip(("st", "en", "ax", "sp"), c)}}
                              for c in cases])  # fmt: skip


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "wrap"])
def test_pad_amounts_and_axes_fed_as_inputs(mode):
    shapes = [("x", F, [3, 5, 4]), ("p", I64, [4]), ("v", F, []), ("a", I64, [2])]
    model = model_of([helper.make_node("Pad", ["x", "p", "v", "a"], ["y"], mode=mode)], shapes, [("y", F, [None] * 3)])
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((3, 5, 4)).astype(np.float32), "p": np.array(p, np.int64),
              "v": np.array(1.5, np.float32), "a": np.array(a, np.int64)}
             for p, a in [([1, 2, 3, 0], [1, -1]), ([-1, 1, 1, -2], [0, 2]), ([0, 4, 0, 3], [2, 1])]]  # fmt: skip
    check_against_ort(model, feeds)


@pytest.mark.parametrize("dtype", [F, TensorProto.INT32])
def test_range_fed_as_inputs(dtype):
    model = model_of([helper.make_node("Range", ["s", "l", "d"], ["y"])], [(n, dtype, []) for n in "sld"],
                     [("y", dtype, [None])])  # fmt: skip
    np_dtype = np.float32 if dtype == F else np.int32
    check_against_ort(model, [{"s": np.array(s, np_dtype), "l": np.array(lim, np_dtype), "d": np.array(d, np_dtype)}
                              for s, lim, d in [(1, 10, 3), (10, -2, -4), (5, 5, 1), (0, 7, 2)]])  # fmt: skip


@pytest.mark.parametrize("axis", [None, 1, -1])
def test_compress_by_a_condition_fed_as_an_input(axis):
    n = {None: 24, 1: 4, -1: 3}[axis]
    node = helper.make_node("Compress", ["x", "c"], ["y"], **({} if axis is None else {"axis": axis}))
    model = model_of([node], [("x", F, [2, 4, 3]), ("c", TensorProto.BOOL, [n])],
                     [("y", F, [None] * (1 if axis is None else 3))])  # fmt: skip
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 4, 3)).astype(np.float32)
    check_against_ort(model, [{"x": x, "c": rng.random(n) < p} for p in (0.0, 0.5, 1.0)])


def test_operands_computed_from_inputs_are_read_on_the_host():
    """A window's length computed from its size input, a centre crop's pads and starts from its shape input: the
    few nodes between them are re-evaluated from the input values at every call."""
    window = model_of([helper.make_node("HannWindow", ["n"], ["y"])], [("n", TensorProto.INT32, [])],
                      [("y", F, [None])], opset=17)  # fmt: skip
    check_against_ort(window, [{"n": np.array(k, np.int32)} for k in (1, 8, 13)])
    crop = model_of([helper.make_node("CenterCropPad", ["x", "s"], ["y"], axes=[0, 2])],
                    [("x", F, [6, 3, 5]), ("s", I64, [2])], [("y", F, [None] * 3)], opset=18)  # fmt: skip
    x = np.random.default_rng(3).standard_normal((6, 3, 5)).astype(np.float32)
    check_against_ort(crop, [{"x": x, "s": np.array(s, np.int64)} for s in ([4, 7], [6, 5], [9, 2])])


def test_bad_slice_and_range_operands_name_the_inputs():
    ins = [(n, F, []) for n in "sld"]
    model = model_of([helper.make_node("Range", ["s", "l", "d"], ["y"])], ins, [("y", F, [None])])
    compiled = ember.compile(model, target="c", fallback=False)
    with pytest.raises(ArgumentError, match="delta cannot be 0"):
        compiled.run({"s": np.array(0, np.float32), "l": np.array(3, np.float32), "d": np.array(0, np.float32)})
    ins = [("x", F, [4])] + [(n, I64, [1]) for n in ("st", "en", "ax", "sp")]
    model = model_of([helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["y"])], ins, [("y", F, [None])])
    compiled = ember.compile(model, target="c", fallback=False)
    with pytest.raises(ArgumentError, match="step cannot be 0") as e:
        compiled.run({"x": np.zeros(4, np.float32), "st": np.array([0]), "en": np.array([1]), "ax": np.array([0]),
                      "sp": np.array([0])})  # fmt: skip
    assert "input 'st'" in str(e.value)
    bad = model_of([helper.make_node("Slice", ["x", "st", "en"], ["y"])], [("x", F, [4]), ("st", I64, [1]),
                   ("en", I64, [2])], [("y", F, [None])])  # fmt: skip
    with pytest.raises(ModelError, match="1-D int tensors of one length"):
        ember.compile(bad, target="c")


@pytest.mark.parametrize("mode, coordinates", [("nearest", "asymmetric"), ("linear", "half_pixel"),
                                               ("cubic", "align_corners")])  # fmt: skip
def test_resize_scales_fed_as_an_input(mode, coordinates):
    node = helper.make_node("Resize", ["x", "", "s"], ["y"], mode=mode, coordinate_transformation_mode=coordinates,
                            axes=[2, 3])  # fmt: skip
    model = model_of([node], [("x", F, [1, 2, 4, 5]), ("s", F, [2])], [("y", F, [None] * 4)])
    x = np.random.default_rng(4).standard_normal((1, 2, 4, 5)).astype(np.float32)
    feeds = [{"x": x, "s": np.array(s, np.float32)} for s in ([2.0, 0.6], [1.0, 1.0], [0.5, 3.0])]
    check_against_ort(model, feeds, rtol=1e-4, atol=1e-5)  # (onnxruntime interpolates in float32, Ember in float64)


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
def test_resize_sizes_fed_as_an_input(policy):
    node = helper.make_node("Resize", ["x", "", "", "n"], ["y"], mode="linear", keep_aspect_ratio_policy=policy,
                            axes=[2, 3])  # fmt: skip
    model = model_of([node], [("x", F, [1, 1, 4, 6]), ("n", I64, [2])], [("y", F, [None] * 4)])
    x = np.random.default_rng(5).standard_normal((1, 1, 4, 6)).astype(np.float32)
    feeds = [{"x": x, "n": np.array(n, np.int64)} for n in ([8, 3], [2, 2], [4, 6])]
    check_against_ort(model, feeds, rtol=1e-4, atol=1e-5)


def test_resize_crop_roi_and_sizes_fed_as_inputs():
    node = helper.make_node("Resize", ["x", "roi", "", "n"], ["y"], coordinate_transformation_mode="tf_crop_and_resize",
                            mode="linear", axes=[2, 3], extrapolation_value=-1.0)  # fmt: skip
    model = model_of([node], [("x", F, [1, 1, 5, 5]), ("roi", F, [4]), ("n", I64, [2])], [("y", F, [None] * 4)])
    x = np.random.default_rng(6).standard_normal((1, 1, 5, 5)).astype(np.float32)
    check_against_ort(model, [{"x": x, "roi": np.array(r, np.float32), "n": np.array(n, np.int64)}
                              for r, n in [([0.2, 0.1, 0.8, 0.9], [3, 4]), ([0.0, -0.2, 1.0, 1.2], [6, 2])]],
                      rtol=1e-4, atol=1e-5)  # fmt: skip


@pytest.mark.parametrize("sort", [1, 0])
def test_unique_counted_from_the_input_at_run_time(sort):
    node = helper.make_node("Unique", ["x"], ["y", "i", "inv", "c"], sorted=sort)
    outs = [("y", F, [None])] + [(n, I64, [None]) for n in ("i", "inv", "c")]
    model = model_of([node], [("x", F, [2, 5])], outs)
    rng = np.random.default_rng(7)
    check_against_ort(model, [{"x": rng.integers(0, k, (2, 5)).astype(np.float32)} for k in (1, 4, 50)])


def test_dims_read_from_values_that_a_shape_rule_cannot_relate_ask_for_the_values():
    """Two sizes read at run time that the model means to be equal cannot be proven so: a DynamicShapeError naming
    the inputs (the ONNX backend then binds them as constants), not a plain model error."""
    nodes = [helper.make_node("ConstantOfShape", ["s"], ["a"], value=helper.make_tensor("v", F, [1], [1.0])),
             helper.make_node("Range", ["zero", "n", "one"], ["r"]), helper.make_node("Add", ["a", "r"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("s", I64, [1]),
                                           helper.make_tensor_value_info("n", I64, [])],
                              [helper.make_tensor_value_info("y", F, [None])],
                              [helper.make_tensor("zero", I64, [], [0]), helper.make_tensor("one", I64, [], [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(DynamicShapeError, match="read from values at run time") as e:
        ember.compile(model, target="c")
    assert e.value.inputs == ["n", "s"]


@pytest.mark.parametrize("axis, sorted_", [(1, 1), (-1, 0), (0, 1)])
def test_unique_along_an_axis_counts_distinct_slices_at_run_time(axis, sorted_):
    """Unique with an axis, of an input: the run time counts the distinct slices (rule 'unique_slices'), the kernel
    orders them as numpy does (lexicographically) or by first occurrence; all four outputs match onnxruntime."""
    kinds = (("y", F, 3), ("i", I64, 1), ("inv", I64, 1), ("c", I64, 1))
    outs = [helper.make_tensor_value_info(n, t, [None] * r) for n, t, r in kinds]
    node = helper.make_node("Unique", ["x"], ["y", "i", "inv", "c"], axis=axis, sorted=sorted_)
    graph = helper.make_graph([node], "unique_axis", [helper.make_tensor_value_info("x", F, [3, 5, 4])], outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    compiled = ember.compile(model, target="c", fallback=False)
    sess = ort.InferenceSession(model.SerializeToString())
    rng = np.random.default_rng(axis + 2 + 5 * sorted_)
    for distinct in (1, 2, 3):  # slices drawn from a few patterns: repeats along the axis
        base = rng.integers(-2, 3, (3, 5, 4)).astype(np.float32)
        n = base.shape[axis]
        pick = rng.integers(0, distinct, n)
        x = np.take(np.take(base, np.arange(distinct), axis=axis), pick, axis=axis)
        want = sess.run(None, {"x": x})
        got = compiled.run({"x": x})
        for name, w in zip(["y", "i", "inv", "c"], want):
            np.testing.assert_array_equal(got[name], w, err_msg=f"{name} with {distinct} distinct slices")


@pytest.mark.parametrize("inverse, onesided", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_dft_axis_fed_as_an_input(inverse, onesided):
    """DFT (opset 20) with its axis an input: the signal viewed as (before, along, after) the axis (rule 'dft_view',
    a negative axis counting the trailing complex one), a onesided transform's output dims read at run time too;
    every axis of one compiled model vs numpy's FFT."""
    c = 2 if inverse else 1
    ins = [helper.make_tensor_value_info("x", F, [2, 6, 4, c]), helper.make_tensor_value_info("axis", I64, [])]
    node = helper.make_node("DFT", ["x", "", "axis"], ["y"], inverse=inverse, onesided=onesided)
    graph = helper.make_graph([node], "dft", ins, [helper.make_tensor_value_info("y", F, [None] * 4)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    compiled = ember.compile(model, target="c", fallback=False)
    rng = np.random.default_rng(inverse + 2 * onesided)
    x = rng.standard_normal((2, 6, 4, c)).astype(np.float32)
    z = x[..., 0] + 1j * x[..., 1] if c == 2 else x[..., 0]
    for axis in (0, 1, 2, -2, -3):
        a = axis + 4 if axis < 0 else axis
        if inverse and onesided:
            want = np.fft.irfft(z, axis=a)[..., None]
        else:
            w = (np.fft.ifft if inverse else np.fft.rfft if onesided else np.fft.fft)(z, axis=a)
            want = np.stack([w.real, w.imag], axis=-1)
        got = compiled.run({"x": x, "axis": np.array(axis, np.int64)})["y"]
        assert got.shape == want.shape, (axis, got.shape, want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"axis {axis}")
    with pytest.raises(ArgumentError, match="DFT axis"):
        compiled.run({"x": x, "axis": np.array(3, np.int64)})
