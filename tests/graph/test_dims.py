"""Symbolic dims: canonical forms, equality, bounds, evaluation, the reshape -1 and broadcasting."""

import pytest

from ember.graph.dims import (
    DimError,
    SizeVars,
    broadcast_dim,
    decide,
    dim_bounds,
    dims_equal,
    divide_dims,
    eval_shape,
    shape_str,
    simplify_dim,
    size_var,
    size_vars,
)
from ember.graph.types import TensorType
from ember.ops.common import ShapeError, broadcast_shapes, window_out_dim


def test_expressions_are_canonical_and_print():
    S = size_var("S", 1, 512)
    t = TensorType((1, S + 1, 2 * S, S // 2, S + S), "float32")
    assert str(t) == "float32[1, S+1, S*2, S//2, S*2]"
    assert not t.is_static and TensorType((2, 3), "float32").is_static
    assert t.shape[2] == t.shape[4]  # S + S and 2 * S are one canonical dim
    assert TensorType((S,), "float32") == TensorType((S + 0,), "float32")
    assert simplify_dim(S - S + 3) == 3
    with pytest.raises(TypeError, match="symbolic dims"):
        _ = t.size


def test_equality_bounds_and_evaluation():
    S, B = size_var("S", 1, 512), size_var("B")
    assert dims_equal(S + S, 2 * S) and not dims_equal(S, S + 1) and not dims_equal(S, B)
    assert dim_bounds(2 * S + 1) == (3, 1025)
    assert dim_bounds(B)[1] is None
    assert eval_shape((B, S + 1, S // 2, 768), {S: 7, B: 2}) == (2, 8, 3, 768)
    assert size_vars([(B, S + 1), (S,)]) == [B, S]
    with pytest.raises(DimError, match="outside its bounds"):
        S.check(513)
    with pytest.raises(DimError, match="no value for S"):
        eval_shape((S,), {B: 1})


def test_size_vars_are_one_per_name():
    sizes = SizeVars({"S": (1, 64), "T": (1, 2)})
    assert sizes("S") is sizes("S") and sizes("S").bounds == (1, 64) and sizes("B").bounds == (1, None)
    assert sizes.unused_bounds() == ["T"]
    with pytest.raises(DimError):
        size_var("S", 5, 2)
    with pytest.raises(DimError):
        size_var("not a name")


def test_reshape_minus_one_and_broadcast():
    S, B = size_var("S", 1, 512), size_var("B", 1, 64)
    assert divide_dims([B, S, 768], [B, 12, 64]) is S
    assert dims_equal(divide_dims([B * S * 768], [S, 64]), B * 12)
    assert divide_dims([B, S, 768], [S, 7]) is None  # 768 / 7 is not whole
    assert divide_dims([S, 768], [B]) is None  # B does not divide S * 768 for every value
    assert broadcast_dim(1, S) is S and broadcast_dim(S, S) is S and broadcast_dim(S, B) is None
    assert broadcast_shapes((B, 1, S), (S,)) == (B, 1, S)
    with pytest.raises(ShapeError, match=r"\[B, S\], \[S, B\] do not broadcast"):
        broadcast_shapes((B, S), (S, B))


def test_window_out_dim_is_symbolic():
    H = size_var("H", 8, 1024)
    out = window_out_dim(H, 3, 2, (1, 1))
    assert shape_str((out,)) == "[(H+1)//2]"  # (H + 2 - 3) // 2 + 1, simplified
    for h in (8, 15, 16, 1024):
        assert eval_shape((out,), {H: h}) == (window_out_dim(h, 3, 2, (1, 1)),)
    with pytest.raises(ShapeError, match="larger lower bound"):
        window_out_dim(size_var("W", 1, 9), 7, 1, (0, 0))


def test_comparisons_decided_only_where_every_size_agrees():
    s, t = size_var("s", 1, 512), size_var("t", 1)
    assert decide("==", s, -1) is False  # the exporters' `shape == -1` test
    assert decide("==", s, 5) is None and decide("<", t, 100) is None
    assert decide(">=", s, 1) is True and decide("<", s, 513) is True and decide(">", s, 512) is False
    assert decide("==", s * 2, s + s) is True and decide("<=", t, t + 1) is True and decide(">", t, t) is False
    assert decide("<", 2, 3) is True and decide("==", 4, 3) is False
