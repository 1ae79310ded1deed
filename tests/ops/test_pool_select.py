"""MaxPool and elementwise Max/Min after the branch-free select of `ember.codegen.c` (`minmax`): NaN on either
side still wins (numpy's maximum), ceil_mode windows past the edge, against numpy on fresh random inputs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import ember


def one_node(op: str, inputs: dict[str, tuple], out: tuple, **attrs):
    graph = helper.make_graph(
        [helper.make_node(op, list(inputs), ["y"], **attrs)], op.lower(),
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def with_nans(rng: np.random.Generator, shape: tuple, count: int) -> np.ndarray:
    x = rng.standard_normal(shape).astype(np.float32)
    x.reshape(-1)[rng.choice(x.size, count, replace=False)] = np.nan
    return x


@pytest.mark.parametrize("target", ["c -threads=1", "llvm"])
def test_maxpool_ceil_mode_with_nans(target):
    rng = np.random.default_rng(11)
    x = with_nans(rng, (1, 3, 8, 8), 5)
    m = ember.compile(one_node("MaxPool", {"x": x.shape}, (1, 3, 4, 4), kernel_shape=[3, 3], strides=[2, 2],
                               ceil_mode=1), target=target, fallback=False)  # fmt: skip
    padded = np.pad(x, ((0, 0), (0, 0), (0, 1), (0, 1)), constant_values=-np.inf)  # the ceil-mode overhang
    ref = np.stack([np.stack([padded[:, :, 2 * i: 2 * i + 3, 2 * j: 2 * j + 3].max(axis=(2, 3)) for j in range(4)], -1)
                    for i in range(4)], -2)  # fmt: skip
    np.testing.assert_array_equal(m(x), ref)


@pytest.mark.parametrize("op,ref", [("Max", np.maximum), ("Min", np.minimum)])
def test_elementwise_max_min_nan_on_either_side(op, ref):
    rng = np.random.default_rng(12)
    a, b = with_nans(rng, (37,), 6), with_nans(rng, (37,), 6)
    m = ember.compile(one_node(op, {"a": (37,), "b": (37,)}, (37,)), target="c -threads=1", fallback=False)
    np.testing.assert_array_equal(m(a, b), ref(a, b))
