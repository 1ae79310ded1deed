"""The ONNX backend interface, and a fixed slice of onnx's node test suite through it.

The whole suite is a tool, not a unit test: `python tools/onnx_node_tests.py`."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ember.backend import ENGINES, EmberBackend

# A spread of operators, versions and import paths (folding, specialization, function
# expansion, control flow, quantization, narrow float types).
NODE_TESTS = [
    "test_abs", "test_add_bcast", "test_averagepool_2d_ceil", "test_batchnorm_epsilon", "test_cast_FLOAT_to_FLOAT16",
    "test_castlike_FLOAT_to_BFLOAT16_expanded", "test_clip_splitbounds", "test_concat_3d_axis_negative_1",
    "test_conv_with_strides_and_asymmetric_padding", "test_convtranspose_kernel_shape", "test_cumsum_2d_axis_0",
    "test_depthtospace_crd_mode_example", "test_dequantizelinear_axis", "test_einsum_batch_matmul",
    "test_expand_dim_changed", "test_gather_negative_indices", "test_gemm_all_attributes", "test_gelu_tanh_2",
    "test_globalaveragepool", "test_gru_defaults", "test_hardswish_expanded", "test_if",
    "test_layer_normalization_4d_axis0",
    "test_loop11", "test_lstm_with_peepholes", "test_matmul_4d", "test_maxpool_2d_same_upper",
    "test_maxpool_with_argmax_2d_precomputed_pads", "test_nonzero_example", "test_onehot_with_negative_axis",
    "test_constant_pad_axes", "test_range_float_type_positive_delta_expanded",
    "test_reduce_mean_do_not_keepdims_example",
    "test_reshape_negative_extended_dims", "test_resize_upsample_sizes_cubic", "test_scan9_sum",
    "test_slice_neg_steps", "test_softmax_axis_0", "test_split_variable_parts_2d_opset18",
    "test_squeeze_negative_axes",
    "test_tile", "test_top_k_negative_axis", "test_transpose_all_permutations_4", "test_unsqueeze_unsorted_axes",
    "test_where_long_example", "test_attention_4d_gqa", "test_rms_normalization_3d_axis_negative_1_epsilon",
]  # fmt: skip


@pytest.fixture(scope="module")
def node_tests():
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return {t.name: t for t in load_model_tests(kind="node")}


@pytest.mark.parametrize("name", NODE_TESTS)
def test_node_suite_slice(node_tests, name: str):
    from onnx.backend.test.runner import Runner

    case = node_tests[name]
    rep = EmberBackend.prepare(case.model, "CPU")
    for inputs, expected in case.data_sets:
        arrays = [numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x for x in inputs]
        expected = [numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x for x in expected]
        Runner.assert_similar_outputs(expected, rep.run(arrays), rtol=case.rtol, atol=case.atol)


def reshape_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])
    shape = helper.make_tensor_value_info("shape", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    return helper.make_model(helper.make_graph([node], "g", [x, shape], [y]))


def test_backend_devices_and_engines():
    assert EmberBackend.supports_device("CPU") and not EmberBackend.supports_device("CUDA")
    assert "reference" in ENGINES
    with pytest.raises(ValueError, match="unknown engine 'fast'"):
        EmberBackend.prepare(reshape_model(), engine="fast")
    with pytest.raises(ValueError, match="runs on CPU"):
        EmberBackend.prepare(reshape_model(), "CUDA")


def slice_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])
    starts, ends = (helper.make_tensor_value_info(n, TensorProto.INT64, [1]) for n in ("starts", "ends"))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, "n"])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    node = helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["y"])
    return helper.make_model(helper.make_graph([node], "g", [x, starts, ends], [y], [axes]))


def stft_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 1])
    step = helper.make_tensor_value_info("step", TensorProto.INT64, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b", "c", 2])
    length = helper.make_tensor("length", TensorProto.INT64, [], [4])
    node = helper.make_node("STFT", ["x", "step", "", "length"], ["y"])
    graph = helper.make_graph([node], "g", [x, step], [y], [length])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_backend_specializes_shape_operands_and_caches_by_value():
    """An STFT frame step fed as an input is bound as a constant: one import per value."""
    from onnx.reference import ReferenceEvaluator

    model = stft_model()
    rep = EmberBackend.prepare(model)
    x = np.random.default_rng(0).standard_normal((1, 16, 1)).astype(np.float32)
    for step in (4, 2):
        feeds = {"x": x, "step": np.array(step, np.int64)}
        (y,) = rep.run(feeds)
        np.testing.assert_allclose(y, ReferenceEvaluator(model).run(None, feeds)[0], rtol=1e-4, atol=1e-4)
    assert rep.bound == {"step"} and len(rep.cache) == 2


def test_backend_reads_slice_operands_at_run_time():
    """Slice starts and ends fed as inputs are read by the kernel: one import serves every value."""
    rep = EmberBackend.prepare(slice_model(), specialize=False)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    (y,) = rep.run([x, np.array([1]), np.array([4])])
    assert y.shape == (2, 3) and not rep.bound
    (y,) = rep.run({"x": x, "starts": np.array([0]), "ends": np.array([-1])})
    assert y.shape == (2, 5) and len(rep.cache) == 1
    np.testing.assert_array_equal(y, x[:, :-1])


def test_backend_reads_a_reshape_target_at_run_time():
    """A Reshape target fed as an input is no specialization: one import serves every value."""
    rep = EmberBackend.prepare(reshape_model(), specialize=False)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    (y,) = rep.run([x, np.array([3, 4])])
    assert y.shape == (3, 4) and not rep.bound
    (y,) = rep.run({"x": x, "shape": np.array([4, -1])})
    assert y.shape == (4, 3) and len(rep.cache) == 1
    np.testing.assert_array_equal(y.reshape(-1), x.reshape(-1))
