"""Native kernels of the data-movement operators (tensor.py, resize.py, signal.py, vision.py) against
onnxruntime, or against the op's numpy reference where onnxruntime lacks the op.

Table driven: a case is one ONNX node with random graph inputs (`R`, `Idx`) and constant operands
(`C`, folded by the frontend into attributes). The cases of one table row group are nodes of one
model, compiled once with `ember.compile(model, fallback=False)` (every node must get a kernel) and
compared output by output. Float tolerance is 1e-4 relative, 1e-5 absolute."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import ember
from ember.frontend.onnx import ONNX_DTYPES, from_onnx
from ember.ops.evaluate import evaluate

ort = pytest.importorskip("onnxruntime")
RTOL, ATOL = 1e-4, 1e-5
ELEM = {d: k for k, d in ONNX_DTYPES.items()}


@dataclass(frozen=True)
class R:
    """A random graph input."""

    shape: tuple[int, ...]
    dtype: str = "float32"

    def make(self, rng: np.random.Generator) -> np.ndarray:
        if self.dtype == "bool":
            return rng.random(self.shape) < 0.5
        if self.dtype.startswith(("int", "uint")):
            lo = 0 if self.dtype.startswith("uint") else -50
            return rng.integers(lo, 50, self.shape, endpoint=True).astype(self.dtype)
        return rng.uniform(-2, 2, self.shape).astype(self.dtype)


@dataclass(frozen=True)
class Idx:
    """Random indices into an axis of length `dim` (negative ones too, as ONNX allows), as a graph input.
    `dims` gives one length per entry of the last axis (GatherND/ScatterND tuples); `unique` draws
    distinct values along `axis` (scatters without a reduction are undefined on duplicates)."""

    shape: tuple[int, ...]
    dim: int = 0
    dtype: str = "int64"
    dims: tuple[int, ...] = ()
    unique_axis: int | None = None

    def make(self, rng: np.random.Generator) -> np.ndarray:
        if self.dims:
            cols = [rng.integers(-d, d, self.shape[:-1]) for d in self.dims]
            out = np.stack(cols, axis=-1) if cols else np.zeros(self.shape)
        elif self.unique_axis is not None:
            ax = self.unique_axis
            moved = np.moveaxis(np.zeros(self.shape, np.int64), ax, -1)
            flat = moved.reshape(-1, self.shape[ax])
            for row in flat:
                row[:] = rng.permutation(self.dim)[: self.shape[ax]]
            out = np.moveaxis(flat.reshape(moved.shape), -1, ax)
            out = np.where(rng.random(out.shape) < 0.3, out - self.dim, out)  # some negative spellings
        else:
            out = rng.integers(-self.dim, self.dim, self.shape)
        return out.astype(self.dtype)


@dataclass(frozen=True)
class C:
    """A constant operand (an initializer)."""

    value: object
    dtype: str = "int64"

    def make(self, rng: np.random.Generator) -> np.ndarray:
        return np.asarray(self.value, dtype=self.dtype)


@dataclass
class Case:
    op: str
    inputs: list
    attrs: dict = field(default_factory=dict)
    outputs: int = 1
    id: str = ""


def f(*shape: int) -> R:
    return R(shape)


NONE = object()  # an absent optional input


# Each group is one model (one compile); `ref` groups compare with Ember's numpy reference (ops that
# onnxruntime lacks). Opsets: the newest onnxruntime runs for these ops.
# fmt: off
GROUPS: dict[str, tuple[int, bool, list[Case]]] = {
    "shape-ops": (18, False, [
        Case("Transpose", [f(2, 3, 4)], {"perm": [2, 0, 1]}),
        Case("Transpose", [f(37, 45)], {"perm": [1, 0]}, id="tiled-2d"),
        Case("Transpose", [R((3, 33, 40, 2), "float64")], {"perm": [0, 2, 1, 3]}, id="inner-kept"),
        Case("Transpose", [R((4, 40, 50), "int8")], {"perm": [2, 1, 0]}, id="tiled-int8"),
        Case("Transpose", [f(0, 3)], {"perm": [1, 0]}, id="empty"),
        Case("Reshape", [f(2, 3, 4), C([3, -1, 0])], id="reshape"),
        Case("Flatten", [f(2, 3, 4, 5)], {"axis": 2}),
        Case("Squeeze", [f(1, 3, 1, 4), C([0, -2])]),
        Case("Unsqueeze", [R((), "int32"), C([0, 1])], id="scalar"),
        Case("Identity", [R((3, 4), "bool")]),
        Case("Expand", [f(3, 1), C([2, 3, 5])]),
        Case("Expand", [R((), "int64"), C([4, 2])], id="scalar"),
        Case("Tile", [f(2, 3), C([3, 2])]),
        Case("Tile", [R((2, 1, 3), "int16"), C([1, 4, 1])], id="int16"),
    ]),
    "join-split-slice": (18, False, [
        Case("Concat", [f(2, 3, 4), f(2, 5, 4), f(2, 1, 4)], {"axis": 1}),
        Case("Concat", [f(3, 2), f(3, 0), f(3, 7)], {"axis": -1}, id="last-axis-empty-part"),
        Case("Concat", [R((40, 64), "float32"), R((24, 64), "float32")], {"axis": 0}, id="vector-copy"),
        Case("Concat", [R((2, 3), "int64"), R((1, 3), "int64")], {"axis": 0}, id="int64"),
        Case("Split", [f(2, 9, 3), C([2, 3, 4])], {"axis": 1}, outputs=3),
        Case("Split", [R((7, 2), "uint8")], {"axis": 0, "num_outputs": 3}, outputs=3, id="uneven"),
        Case("Split", [f(6, 2), C([0, 6])], outputs=2, id="zero-piece"),
        Case("Slice", [f(5, 6, 7), C([1, -3]), C([4, 100]), C([0, 2])], id="clamp"),
        Case("Slice", [f(5, 6), C([-1, 4]), C([-100, 0]), C([0, 1]), C([-2, -3])], id="negative-steps"),
        Case("Slice", [f(4, 5), C([3]), C([1]), C([0])], id="empty"),
        Case("Slice", [R((10, 3), "bool"), C([1]), C([9]), C([0]), C([3])], id="bool-stride"),
    ]),
    "gather": (18, False, [
        Case("Gather", [f(5, 4, 3), Idx((2, 3), 4)], {"axis": 1}),
        Case("Gather", [R((6,), "int32"), Idx((), 6)], id="scalar-index"),
        Case("Gather", [f(3, 4), Idx((0, 2), 3)], id="empty-indices"),
        Case("Gather", [f(7, 2), Idx((5,), 7, "int32")], id="int32-indices"),
        Case("GatherElements", [f(4, 5), Idx((4, 3), 5)], {"axis": 1}),
        Case("GatherElements", [R((3, 4, 2), "int64"), Idx((2, 4, 2), 3)], {"axis": 0}, id="axis0"),
        Case("GatherND", [f(4, 5, 6), Idx((3, 2), dims=(4, 5))], id="tuples"),
        Case("GatherND", [f(2, 3, 4), Idx((2, 5, 1), dims=(3,))], {"batch_dims": 1}, id="batch"),
        Case("GatherND", [R((3, 4), "int8"), Idx((2, 2), dims=(3, 4))], id="scalars"),
    ]),
    "scatter": (18, False, [
        Case("ScatterElements", [f(5, 6), Idx((3, 6), 5, unique_axis=0), f(3, 6)], {"axis": 0}),
        Case("ScatterElements", [f(4, 7), Idx((2, 3), 7, unique_axis=1), f(2, 3)], {"axis": 1}, id="partial"),
        Case("ScatterElements", [f(4, 5), Idx((4, 6), 5), f(4, 6)], {"axis": 1, "reduction": "add"}, id="add"),
        Case("ScatterElements", [f(4, 5), Idx((4, 3), 5), f(4, 3)], {"axis": 1, "reduction": "mul"}, id="mul"),
        Case("ScatterElements", [R((6, 2), "int32"), Idx((5, 2), 6), R((5, 2), "int32")],
             {"axis": 0, "reduction": "max"}, id="max-int"),
        Case("ScatterElements", [f(6, 3), Idx((4, 3), 6), f(4, 3)], {"axis": 0, "reduction": "min"}, id="min"),
        Case("ScatterND", [f(4, 5, 6), Idx((3, 1), 4, unique_axis=0), f(3, 5, 6)], id="rows"),
        Case("ScatterND", [f(4, 5), Idx((2, 3, 2), dims=(4, 5)), f(2, 3)], {"reduction": "add"}, id="add"),
        Case("ScatterND", [f(4, 5), Idx((6, 2), dims=(4, 5)), f(6)], {"reduction": "mul"}, id="mul"),
        Case("ScatterND", [R((5, 3), "int64"), Idx((4, 1), dims=(5,)), R((4, 3), "int64")],
             {"reduction": "max"}, id="max"),
        Case("ScatterND", [f(3, 4), C([[1, -1]]), f(1)], id="one-tuple"),
        Case("ScatterND", [f(2, 3), C(np.zeros((0, 2))), f(0)], id="no-updates"),
    ]),
    "pad": (19, False, [
        Case("Pad", [f(3, 4), C([1, 2, 0, 3])], id="constant"),
        Case("Pad", [f(2, 3, 20, 24), C([0, 0, 1, 2, 0, 0, 3, 1]), C(1.5, "float32")], id="nchw-value"),
        Case("Pad", [R((3, 4), "int32"), C([-1, 1, 2, -2]), C(7, "int32")], id="crop-int"),
        Case("Pad", [f(3, 4), C([2, 3, 2, 3])], {"mode": "reflect"}, id="reflect"),
        Case("Pad", [f(3, 4), C([2, 1, 2, 3])], {"mode": "edge"}, id="edge"),
        Case("Pad", [f(3, 4), C([2, 5, 4, 1])], {"mode": "wrap"}, id="wrap"),
        Case("Pad", [f(2, 3, 4), C([1, 2]), NONE, C([-1])], {"mode": "reflect"}, id="axes"),
        Case("Pad", [R((2, 3), "bool"), C([1, 1, 1, 1])], id="bool"),
    ]),
    "creation": (18, False, [
        Case("ConstantOfShape", [C([2, 3])], {"value": numpy_helper.from_array(np.array([4], np.int32))}),
        Case("ConstantOfShape", [C([1100, 1000])], id="too-big-to-fold"),
        Case("EyeLike", [f(3, 5)], {"k": 1}),
        Case("EyeLike", [R((4, 3), "int32")], {"k": -2, "dtype": onnx.TensorProto.DOUBLE}, id="dtype"),
        Case("OneHot", [Idx((2, 3), 5), C(5), C([2.0, 7.0], "float32")], {"axis": 1}),
        Case("OneHot", [R((4,), "float32"), C(3), C([0, 1], "int64")], id="float-indices"),
        Case("Trilu", [f(2, 4, 5)], {"upper": 1}),
        Case("Trilu", [f(5, 3), C(-1)], {"upper": 0}, id="lower-k"),
        Case("Trilu", [R((4, 4), "int64"), C(2)], id="upper-k"),
    ]),
    "rearrange": (18, False, [
        Case("DepthToSpace", [f(2, 8, 3, 4)], {"blocksize": 2, "mode": "DCR"}),
        Case("DepthToSpace", [f(1, 18, 2, 3)], {"blocksize": 3, "mode": "CRD"}, id="crd"),
        Case("SpaceToDepth", [f(2, 3, 4, 6)], {"blocksize": 2}),
        Case("ReverseSequence", [f(5, 3, 2), C([5, 1, 3])], {"batch_axis": 1, "time_axis": 0}),
        Case("ReverseSequence", [R((3, 6), "int32"), C([0, 6, 2])], {"batch_axis": 0, "time_axis": 1}, id="batch0"),
        Case("CenterCropPad", [f(5, 6, 3), C([3, 9])], {"axes": [0, 1]}),
        Case("CenterCropPad", [R((4, 5), "int64"), C([7, 2])], id="all-axes"),
    ]),
    "resize": (19, False, [
        Case("Resize", [f(1, 2, 4, 5), C([], "float32"), C([1, 1, 2, 1.5], "float32")], {"mode": "nearest"},
             id="nearest"),
        Case("Resize", [f(1, 1, 5, 7), C([], "float32"), C([], "float32"), C([1, 1, 3, 4])],
             {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "ceil"},
             id="nearest-asymmetric-ceil"),
        Case("Resize", [f(1, 1, 4, 4), C([], "float32"), C([1, 1, 2, 0.75], "float32")],
             {"mode": "nearest", "coordinate_transformation_mode": "align_corners",
              "nearest_mode": "round_prefer_ceil"}, id="nearest-align-corners"),
        Case("Resize", [f(1, 1, 4, 6), C([], "float32"), C([1, 1, 1.5, 0.5], "float32")],
             {"mode": "nearest", "coordinate_transformation_mode": "tf_half_pixel_for_nn", "nearest_mode": "floor"},
             id="nearest-tf-half-pixel"),
        Case("Resize", [f(1, 1, 5, 4), C([], "float32"), C([1, 1, 0.6, 2], "float32")],
             {"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"}, id="linear-symmetric"),
        Case("Resize", [f(2, 3, 4, 5), C([], "float32"), C([1, 1, 2, 2], "float32")], {"mode": "linear"}, id="linear"),
        Case("Resize", [f(1, 2, 6, 5), C([], "float32"), C([], "float32"), C([1, 2, 4, 7])],
             {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, id="linear-sizes"),
        Case("Resize", [f(1, 1, 5, 6), C([], "float32"), C([1, 1, 1.5, 0.5], "float32")],
             {"mode": "cubic", "coordinate_transformation_mode": "asymmetric"}, id="cubic"),
        Case("Resize", [f(1, 1, 4, 4), C([], "float32"), C([1, 1, 2.0, 2.0], "float32")],
             {"mode": "cubic", "exclude_outside": 1, "cubic_coeff_a": -0.5}, id="cubic-exclude"),
        Case("Resize", [f(1, 1, 8, 8), C([], "float32"), C([1, 1, 0.5, 0.75], "float32")],
             {"mode": "linear", "antialias": 1}, id="linear-antialias"),
        Case("Resize", [f(1, 1, 6, 6), C([0, 0, 0.2, -0.1, 1, 1, 0.8, 0.9], "float32"), C([], "float32"),
                        C([1, 1, 4, 5])],
             {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": 9.0},
             id="crop"),
        Case("Resize", [R((1, 1, 3, 4), "int32"), C([], "float32"), C([1, 1, 2, 2], "float32")], {"mode": "nearest"},
             id="int32"),
    ]),
    "vision-signal": (20, False, [
        Case("GridSample", [f(1, 2, 4, 5), R((1, 3, 6, 2))], {"mode": "linear"}),
        Case("GridSample", [f(2, 1, 3, 4), R((2, 2, 3, 2))], {"mode": "cubic"}, id="cubic"),
        Case("GridSample", [f(1, 1, 4, 4), R((1, 5, 2, 2))],
             {"mode": "nearest", "padding_mode": "reflection", "align_corners": 1}, id="nearest-reflection"),
        Case("GridSample", [f(1, 1, 3, 4, 2), R((1, 2, 2, 3, 3))], {"mode": "linear"}, id="volumetric"),
        Case("RoiAlign", [f(2, 3, 8, 9), C([[0, 0, 4, 5], [1.5, 2, 7, 8], [-2, -1, 3, 2]], "float32"), C([0, 1, 1])],
             {"output_height": 3, "output_width": 2, "sampling_ratio": 2, "spatial_scale": 0.9}),
        Case("RoiAlign", [f(1, 2, 6, 6), C([[0.5, 0.5, 5, 4], [1, 1, 2, 2]], "float32"), C([0, 0])],
             {"output_height": 2, "output_width": 2, "sampling_ratio": 1, "mode": "max",
              "coordinate_transformation_mode": "output_half_pixel"}, id="max"),
        Case("Col2Im", [f(2, 8, 6), C([3, 4]), C([2, 2])], {"strides": [1, 2], "pads": [0, 1, 0, 1]}),
        Case("DFT", [f(2, 8, 1)], {"onesided": 1}, id="rfft"),
        Case("DFT", [f(3, 6, 2), NONE, C(1)], {"inverse": 1}, id="inverse-axis1"),
        Case("DFT", [f(2, 5, 2), C(8), C(-2)], id="padded"),
        Case("STFT", [f(2, 20, 1), C(4), C(np.hanning(8), "float32"), C(8)]),
        Case("MaxUnpool", [f(1, 2, 2, 3), C([[[[0, 3, 5], [13, 15, 17]], [[18, 21, 23], [31, 33, 35]]]])],
             {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ]),
    # onnxruntime has no kernels for these (or not at this opset), or differs from the ONNX reference
    # (integer linear resizing rounds half to even there; align_corners with a fractional output length
    # uses the unrounded length): Ember's numpy reference is the oracle
    "reference-only": (24, True, [
        Case("Resize", [R((1, 1, 3, 4), "uint8"), C([], "float32"), C([1, 1, 2, 2], "float32")], {"mode": "linear"},
             id="uint8"),
        Case("Resize", [f(1, 1, 4, 4), C([], "float32"), C([1, 1, 1.7, 0.6], "float32")],
             {"mode": "nearest", "coordinate_transformation_mode": "align_corners"}, id="align-corners-fractional"),
        Case("Resize", [f(1, 1, 6, 6), C([0, 0, 0.2, 0.3, 1, 1, 0.8, 0.9], "float32"), C([1, 1, 1.5, 1.5], "float32")],
             {"mode": "cubic", "coordinate_transformation_mode": "tf_crop_and_resize"}, id="crop-scales"),
        # more taps than FUSED_TAPS: the axes resized one after another (onnxruntime has cubic for 2 axes only)
        Case("Resize", [f(1, 2, 4, 5, 3), C([], "float32"), C([1, 1, 1.5, 2, 0.7], "float32")], {"mode": "cubic"},
             id="cubic-3d-separable"),
        Case("Resize", [f(1, 1, 12, 10), C([], "float32"), C([1, 1, 0.25, 0.5], "float32")],
             {"mode": "cubic", "antialias": 1}, id="cubic-antialias-separable"),
        Case("Resize", [f(1, 3, 5, 6), C([0, 0.2, 0.2, -0.1, 1, 0.9, 0.8, 0.9], "float32"), C([], "float32"),
                        C([1, 4, 4, 5])],
             {"mode": "cubic", "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": 9.0},
             id="crop-separable"),
        Case("Resize", [R((1, 2, 3, 4), "uint8"), C([], "float32"), C([1, 2, 2, 1.5], "float32")], {"mode": "cubic"},
             id="uint8-separable"),
        Case("TensorScatter", [f(2, 6, 3), f(2, 2, 3), C([1, 4])], {"axis": 1}),
        Case("TensorScatter", [f(2, 5, 3), f(2, 3, 3), C([3, 4])], {"axis": -2, "mode": "circular"}, id="circular"),
        Case("DFT", [f(2, 5, 2), C(8), C(1)], {"inverse": 1, "onesided": 1}, id="irfft"),
        Case("DeformConv", [f(1, 4, 5, 5), f(6, 2, 2, 2), R((1, 16, 4, 4)), f(6), R((1, 8, 4, 4))],
             {"group": 2, "offset_group": 2, "pads": [0, 0, 0, 0]}),
        Case("DeformConv", [f(1, 1, 4, 4), f(2, 1, 3, 3), R((1, 18, 2, 2))], {"strides": [2, 2], "pads": [1, 1, 1, 1]},
             id="strided-padded"),
        Case("Shape", [f(2, 3, 4)], {"start": 1}),
        Case("Size", [f(2, 3)]),
    ]),
}
# fmt: on


def build(cases: list[Case], opset: int, rng: np.random.Generator) -> tuple[onnx.ModelProto, dict, list[str]]:
    """One model holding every case as an independent node; returns it, its feeds, its output names."""
    nodes, inputs, inits, feeds, outs = [], [], [], {}, []
    for n, case in enumerate(cases):
        names = []
        for i, spec in enumerate(case.inputs):
            if spec is NONE:
                names.append("")
                continue
            name = f"n{n}_in{i}"
            data = spec.make(rng)
            names.append(name)
            if isinstance(spec, C):
                inits.append(numpy_helper.from_array(data, name))
            else:
                inputs.append(helper.make_tensor_value_info(name, ELEM[data.dtype.name], list(data.shape)))
                feeds[name] = data
        node_outs = [f"n{n}_{case.op}{('-' + case.id) if case.id else ''}_out{k}" for k in range(case.outputs)]
        nodes.append(helper.make_node(case.op, names, node_outs, name=f"n{n}", **case.attrs))
        outs += node_outs
    infos = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outs]
    graph = helper.make_graph(nodes, "cases", inputs, infos, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return with_output_types(model, feeds), feeds, outs


def with_output_types(model: onnx.ModelProto, feeds: dict) -> onnx.ModelProto:
    """Output types from onnx's shape inference, or where it cannot tell, from onnx's reference run."""
    model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    missing = [o for o in model.graph.output if not o.type.tensor_type.HasField("shape")]
    if missing:
        from onnx.reference import ReferenceEvaluator

        values = ReferenceEvaluator(model).run([o.name for o in missing], feeds)
        for o, v in zip(missing, values):
            o.CopyFrom(helper.make_tensor_value_info(o.name, ELEM[v.dtype.name], list(v.shape)))
    return model


def expected_outputs(model: onnx.ModelProto, feeds: dict, outs: list[str], ref: bool) -> dict[str, np.ndarray]:
    if ref:
        return dict(zip(outs, evaluate(from_onnx(model), feeds).values()))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip(outs, sess.run(outs, feeds)))


def compare(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    problems = []
    for name, e in expected.items():
        g = got[name]
        try:
            assert g.dtype == e.dtype and g.shape == e.shape, f"{g.dtype}{list(g.shape)} vs {e.dtype}{list(e.shape)}"
            if np.issubdtype(e.dtype, np.floating):
                np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL)
            else:
                np.testing.assert_array_equal(g, e)
        except AssertionError as err:
            problems.append(f"{name}: {str(err).strip()[:600]}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("group", list(GROUPS))
def test_native_kernels_match(group: str):
    opset, ref, cases = GROUPS[group]
    model, feeds, outs = build(cases, opset, np.random.default_rng(11))
    compiled = ember.compile(model, fallback=False)
    assert not compiled.summary()["fallback_ops"]
    compare(compiled.run(feeds), expected_outputs(model, feeds, outs, ref))


# Data-movement ops inside fused groups, as prologues of a broadcast (an Expand that adds a leading
# axis of 2): the computes compose and the group gets the default schedule, not the op's own.
FUSED = [
    ("Transpose", [f(3, 40, 50)], {"perm": [2, 1, 0]}),
    ("Pad", [f(2, 3, 9, 9), C([0, 0, 1, 1, 0, 0, 1, 1])], {}),
    ("Concat", [f(4, 16), f(3, 16)], {"axis": 0}),
    ("Gather", [f(6, 8), Idx((3, 2), 6)], {"axis": 0}),
    ("Resize", [f(1, 2, 3, 4), C([], "float32"), C([1, 1, 2, 2], "float32")], {"mode": "linear"}),
    ("Reshape", [f(2, 3, 4), C([4, 6])], {}),
    ("Flatten", [f(2, 3, 4)], {"axis": 1}),
    ("Squeeze", [f(3, 1, 4), C([1])], {}),
    ("Unsqueeze", [f(3, 4), C([0, 2])], {}),
    ("Slice", [f(6, 5), C([1]), C([5]), C([0]), C([2])], {}),
]


def test_fused_prologues_match():
    rng = np.random.default_rng(5)
    nodes, inputs, inits, feeds, outs = [], [], [numpy_helper.from_array(np.array([2, 1, 1, 1, 1]), "two")], {}, []
    for n, (op, specs, attrs) in enumerate(FUSED):
        names = []
        for i, spec in enumerate(specs):
            name, data = f"n{n}_in{i}", spec.make(rng)
            names.append(name)
            if isinstance(spec, C):
                inits.append(numpy_helper.from_array(data, name))
            else:
                inputs.append(helper.make_tensor_value_info(name, ELEM[data.dtype.name], list(data.shape)))
                feeds[name] = data
        nodes += [
            helper.make_node(op, names, [f"n{n}_mid"], **attrs),
            helper.make_node("Expand", [f"n{n}_mid", "two"], [f"n{n}_out"]),
        ]
        outs.append(f"n{n}_out")
    infos = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outs]
    model = helper.make_model(
        helper.make_graph(nodes, "fused", inputs, infos, inits), opset_imports=[helper.make_opsetid("", 19)]
    )
    model = with_output_types(model, feeds)
    compiled = ember.compile(model, fallback=False)
    assert compiled.summary()["kernels"] == len(FUSED)  # one kernel per (op, Expand) pair
    compare(compiled.run(feeds), expected_outputs(model, feeds, outs, ref=False))


@pytest.mark.parametrize(
    ("op", "attrs", "why"),
    [
        ("RoiAlign", {"sampling_ratio": 0}, "adaptive sampling_ratio"),
    ],
)
def test_unlowerable_instances_run_by_reference(op: str, attrs: dict, why: str):
    """Instances without a native kernel fall back to the reference (and say why)."""
    rng = np.random.default_rng(3)
    specs, opset = [f(1, 1, 6, 6), C([[0, 0, 3, 4]], "float32"), C([0])], 16
    model, feeds, outs = build([Case(op, specs, attrs)], opset, rng)
    with pytest.raises(ember.compiler.NotLowerable, match=why):
        ember.compile(model, fallback=False)
    compiled = ember.compile(model)
    compare(compiled.run(feeds), expected_outputs(model, feeds, outs, ref=True))


def test_two_transposes_fused_with_a_reshape():
    """Transpose (5-d) -> Reshape -> Transpose (3-d) fuse into one kernel whose output is the second transpose's:
    the first one's schedule must not index the output's axes with its own perm (an attention head split)."""
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 2, 4, 1]),
             helper.make_node("Reshape", ["t", "shape"], ["r"]),
             helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 1])]  # fmt: skip
    shape = numpy_helper.from_array(np.array([8, 8, 16], np.int64), "shape")
    x_info = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 16, 1, 4, 8])
    y_info = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [8, 16, 8])
    graph = helper.make_graph(nodes, "heads", [x_info], [y_info], [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(0).standard_normal((2, 16, 1, 4, 8)).astype("float32")
    y = ember.compile(model)(x)
    np.testing.assert_array_equal(y, x.transpose(0, 3, 2, 4, 1).reshape(8, 8, 16).transpose(0, 2, 1))


@pytest.mark.parametrize("src, dst", [
    (("S", 128), (1, "S", 128)),          # a unit dim added: (0, i), no division by S
    ((1, "S", 128), ("S", 128)),          # removed
    ((1, "S", 2, 64), (1, "S", 128)),     # heads merged after a unit dim
    (("S", 1, 2, 8), (1, "S", 16)),       # a unit dim between two groups
])  # fmt: skip
def test_symbolic_reshape_with_unit_dims(src, dst):
    """Reshapes that add or drop dims of 1 beside a size variable index those dims by 0: the kernel divides by
    no size (a division by S in every epilogue load of a GEMM is what they replaced), at each size equal to numpy."""
    from ember import te
    from ember.graph.dims import size_var
    from ember.ops.tensor import reshape_compute
    from ember.tir.functor import walk as walk_tir

    S = size_var("S", 1, 40)
    x = te.placeholder(tuple(S if d == "S" else d for d in src), name="x")
    y = reshape_compute(x, tuple(S if d == "S" else d for d in dst))
    divides = [n for n in walk_tir(y.op.body) if getattr(n, "op", None) in ("floordiv", "floormod")
               and any(v is S for v in walk_tir(n.b))]  # fmt: skip
    assert not divides, f"{src} -> {dst} divides by S: {y.op.body}"
    mod = ember.build(te.create_schedule(y), [x, y], "c")
    rng = np.random.default_rng(7)
    for s in (1, 3, 40):
        a = rng.standard_normal(tuple(s if d == "S" else d for d in src)).astype(np.float32)
        out = np.zeros(tuple(s if d == "S" else d for d in dst), np.float32)
        mod(a, out)
        np.testing.assert_array_equal(out, a.reshape(out.shape))
