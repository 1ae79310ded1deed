"""Property tests: shape rules agree with numpy on random shapes and parameters."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.graph import TensorType
from ember.ops import ShapeError, get_op
from ember.ops.common import broadcast_shapes

dims = st.lists(st.integers(1, 4), min_size=0, max_size=4).map(tuple)


@settings(max_examples=200, deadline=None)
@given(dims, dims)
def test_broadcast_shapes_match_numpy(a, b):
    a = tuple(1 if (i % 2) else d for i, d in enumerate(a))  # make broadcasting likely
    try:
        expected = np.broadcast_shapes(a, b)
    except ValueError:
        with pytest.raises(ShapeError):
            broadcast_shapes(a, b)
        return
    assert broadcast_shapes(a, b) == expected


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 9), st.integers(-12, 12), st.integers(-12, 12), st.sampled_from([-3, -2, -1, 1, 2, 3]))
def test_slice_rule_and_reference_match_python_slicing(n, start, end, step):
    if step < 0 and start < -n:
        return  # ONNX clamps such a start to 0 (element 0 is included); Python treats it as empty
    x = np.arange(n)
    a = get_op("Slice").check_attrs({"starts": [start], "ends": [end], "axes": [0], "steps": [step]})
    (t,) = get_op("Slice").infer(a, TensorType.of(x))
    (y,) = get_op("Slice").reference(a, x)
    expected = x[start:end:step]
    assert t.shape == expected.shape and y.tolist() == expected.tolist()


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 12), st.integers(1, 4), st.integers(1, 3), st.integers(1, 3), st.integers(0, 2),
       st.booleans())  # fmt: skip
def test_pool_rule_matches_reference(size, kernel, stride, dilation, pad, ceil):
    if dilation * (kernel - 1) + 1 > size + 2 * pad or pad >= kernel:
        return
    a = get_op("MaxPool").check_attrs({"kernel_shape": [kernel], "strides": [stride], "pads": [pad, pad],
                                       "dilations": [dilation], "ceil_mode": int(ceil)})  # fmt: skip
    x = np.random.default_rng(size).standard_normal((1, 1, size)).astype(np.float32)
    types = get_op("MaxPool").infer(a, TensorType.of(x))
    outs = get_op("MaxPool").reference(a, x)
    assert [t.shape for t in types] == [o.shape for o in outs]
