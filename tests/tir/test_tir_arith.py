"""The arithmetic simplifier and bound analysis of `ember.tir.arith`: rules as a table, plus a property test
that simplification never changes the value of a random integer expression."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember import tir
from ember.tir import Analyzer, Var, const, simplify
from ember.tir.arith import eval_int
from ember.tir.expr import Cast, Select, binop

x, y, z = Var("x"), Var("y"), Var("z")
one = Var("one")  # a size bounded to (1, 1)
f = Var("f", tir.dtype("float32"))
RANGES = {x: (0, 15), y: (0, 7), z: (-4, 4), one: (1, 1)}


def mn(a, b):
    return binop("min", a, b)


def mx(a, b):
    return binop("max", a, b)


# (expression, ranges known?, expected text after simplification)
RULES = [
    # constant folding
    (const(3) + 4, False, "7"),
    (const(2.5, "float32") * 2, False, "5.0f"),
    (const(7.0) / 2.0, False, "3.5f"),
    (const(-7) // 2, False, "-4"),
    (const(-7) % 2, False, "1"),
    (const(7) // -2, False, "-4"),
    (mn(const(3), 9), False, "3"),
    (Cast(tir.dtype("int8"), const(300)), False, "44"),
    # identities and canonical affine forms (sum of coefficient * term + constant)
    (x + 0, False, "x"),
    (x * 1, False, "x"),
    (x - x, False, "0"),
    (x + 1 + x + 2, False, "x * 2 + 3"),
    ((x + y) * 3 - y * 3, False, "x * 3"),
    (2 * x + 3 * y - x, False, "y * 3 + x"),
    (y * x, False, "x * y"),
    (f + 0.0, False, "f"),
    (f * 1.0, False, "f"),
    # (x // c) * c + x % c -> x
    ((x // 4) * 4 + x % 4, False, "x"),
    ((x // 4) * 4 + x % 4 + 1, True, "x + 1"),
    (3 * (x // 8) * 8 + 3 * (x % 8), False, "x * 3"),
    # an index unravelled into [.., 7, 7] and flattened again (a matmul's batch dims folded into rows)
    ((x // 49) * 784 + (x // 7 % 7) * 112 + (x % 7) * 16 + y, False, "x * 16 + y"),
    ((x // 6) * 6 + (x // 2 % 3) * 2, False, "x // 2 * 2"),
    # a row and a column of one plane flattened again (a vector of a per-channel scale crossing rows)
    ((x // 56 % 56) * 56 + x % 56, False, "x % 3136"),
    ((x // 56 % 56) * 112 + (x % 56) * 2 + y, False, "x % 3136 * 2 + y"),
    ((x // 3136) * 3136 + (x // 56 % 56) * 56 + x % 56, False, "x"),
    # floordiv / floormod
    (x // 1, False, "x"),
    (x % 1, False, "0"),
    ((x // 2) // 4, False, "x // 8"),
    ((x % 8) % 4, False, "x % 4"),
    ((x * 8 + y) // 8, False, "x + y // 8"),
    ((x * 6 + 4) % 3, False, "1"),
    # ... with known bounds
    (x // 16, True, "0"),
    (x % 16, True, "x"),
    (x // 8, True, "x // 8"),
    ((x * 8 + y) // 8, True, "x"),
    ((x * 8 + y) % 8, True, "y"),
    ((y * 4 + x % 4) // 4, True, "y"),
    (((x + 1) * 2 - 2) // 2, True, "x"),
    # comparisons decided by bounds, the others normalized
    (x < 16, True, "True"),
    (x >= 0, True, "True"),
    (x < 0, True, "False"),
    (x == 20, True, "False"),
    (x + y < 23, True, "True"),
    (x < 15, True, "x < 15"),
    (x + y <= 21, True, "x + y < 22"),
    (x - y < x, True, "y >= 1"),
    (x * 2 < 7, False, "x < 4"),
    (x * 4 + 2 == 7, False, "False"),
    (~(x < 3), False, "x >= 3"),
    ((x < 3) & (y < 100), True, "x < 3"),
    ((x < 3) | (y < 100), True, "True"),
    # min / max decided by bounds
    (mn(x, 20), True, "x"),
    (mx(x, 0), True, "x"),
    (mn(x, y), True, "min(x, y)"),
    (mx(x + 1, x), False, "x + 1"),
    (mn(mn(x, y), y), False, "min(x, y)"),  # a clamp applied twice
    (mx(z, mx(y, z)), False, "max(y, z)"),
    (mn(x // 12, (x + 11) // 12), True, "x // 12"),  # quotients by one constant: monotone in the numerator
    (mx(x // 4, (x + 2) // 4), True, "(x + 2) // 4"),
    # a common factor leaves the clamp: a tile clamped back from the end stays a multiple of the tile
    (mn(x * 32, (z + 31) // 32 * 32 - 32), False, "min(x, (z + 31) // 32 - 1) * 32"),
    ((mn(x * 32, (z + 31) // 32 * 32 - 32) + y) % 32, True, "y"),
    (mx(x * 6 + 4, y * 2), False, "max(x * 3 + 2, y) * 2"),
    (mn(x * 4 + 1, y * 4), False, "min(x * 4 + 1, y * 4)"),
    # a common start out of both sides: the extent of a union of two tiles from one start is the larger tile
    (mx(x * 24 + mn(12, z - x * 24) + 11, x * 24 + mn(24, z - x * 24) - 1) - x * 24 + 1, False,
     "max(min(12, z - x * 24) + 11, min(24, z - x * 24) - 1) + 1"),
    (mn(x + y + 3, x + z), False, "min(y + 3, z) + x"),
    # a variable bounded to one value is that value (a size with bounds (1, 1), a one-trip loop's variable)
    (one * x + one, True, "x + 1"),
    # selects and casts
    (Select(x < 16, y, z), True, "y"),
    (Select(x < 3, y, y), False, "y"),
    (Cast(tir.dtype("int64"), Cast(tir.dtype("int32"), Cast(tir.dtype("int8"), y))), True, "int64(y)"),
    (Cast(tir.dtype("int64"), Cast(tir.dtype("int8"), x * 100)), True, "int64(int8(x * 100))"),
]


@pytest.mark.parametrize("expr, bounded, expected", RULES, ids=[str(r[0]) for r in RULES])
def test_simplifier_rule(expr, bounded, expected):
    assert str(simplify(expr, RANGES if bounded else None)) == expected


def test_float_arithmetic_is_not_reassociated():
    g = Var("g", tir.dtype("float32"))
    e = (f + g) - g  # not f: rounding
    assert str(simplify(e)) == "f + g - g"


def test_not_of_a_float_comparison_is_kept():
    # not (f < 1) is not (f >= 1) when f is NaN
    assert str(simplify(~(f < 1.0))) == "not f < 1.0f"


BOUNDS = [
    (x * 3 + y - 2, (-2, 50)),
    (x // 4, (0, 3)),
    (x % 4, (0, 3)),
    (z % 4, (0, 3)),
    (z // 2, (-2, 2)),
    ((x * 8 + y) % 5, (0, 4)),
    (x * z, (-60, 60)),
    (mn(x, y) - mx(z, 1), (-4, 6)),
    (Select(x < 3, y, z), (-4, 7)),
]


@pytest.mark.parametrize("expr, expected", BOUNDS, ids=[str(b[0]) for b in BOUNDS])
def test_bounds(expr, expected):
    assert Analyzer(RANGES).bounds(expr) == expected


def test_can_prove_uses_scoped_ranges():
    ana = Analyzer()
    assert not ana.can_prove(x < 16)
    with ana.scope(x, 0, 15):
        assert ana.can_prove(x < 16)
        assert ana.can_prove_false(x > 15)
    assert not ana.can_prove(x < 16)


# ---------------------------------------------------------------------------------------------
# property: simplify(e) has the value of e at every point of the ranges

VARS = [x, y, z]


def _exprs() -> st.SearchStrategy:
    leaf = st.one_of(st.sampled_from(VARS), st.integers(-9, 9).map(const))

    def grow(sub):
        divisor = st.integers(-6, 6).filter(bool).map(const)
        return st.one_of(
            st.tuples(st.sampled_from(["add", "sub", "mul", "min", "max"]), sub, sub).map(lambda t: binop(*t)),
            st.tuples(st.sampled_from(["floordiv", "floormod"]), sub, divisor).map(lambda t: binop(*t)),
            st.tuples(sub, sub, sub, sub).map(lambda t: Select(binop("lt", t[0], t[1]), t[2], t[3])),
        )

    return st.recursive(leaf, grow, max_leaves=8)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(_exprs(), st.lists(st.tuples(st.integers(-20, 20), st.integers(0, 20)), min_size=3, max_size=3), st.data())
def test_simplify_preserves_values(expr, ranges, data):
    bounds = {v: (lo, lo + n) for v, (lo, n) in zip(VARS, ranges)}
    simple = simplify(expr, bounds)
    for _ in range(8):
        env = {v: data.draw(st.integers(*bounds[v]), label=v.name) for v in VARS}
        assert eval_int(simple, env) == eval_int(expr, env), f"{expr} -> {simple} at {env}"


def _exprs_dividing_by_anything() -> st.SearchStrategy:
    """Like _exprs, but a divisor is any expression: it can be 0 at some points (eval_int gives None there)."""
    leaf = st.one_of(st.sampled_from(VARS), st.integers(-4, 4).map(const))

    def grow(sub):
        return st.one_of(
            st.tuples(st.sampled_from(["add", "sub", "mul", "min", "max", "floordiv", "floormod"]), sub, sub)
            .map(lambda t: binop(*t)),
            st.tuples(sub, sub, sub, sub).map(lambda t: Select(binop("lt", t[0], t[1]), t[2], t[3])),
        )

    return st.recursive(leaf, grow, max_leaves=8)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_exprs_dividing_by_anything(), st.lists(st.tuples(st.integers(-5, 5), st.integers(0, 4)), min_size=3,
                                               max_size=3))  # fmt: skip
def test_grid_evaluation_agrees_with_eval_int_at_every_point(expr, ranges):
    """eval_grid (numpy over the whole grid) gives eval_int's value at every point, and marks exactly the points
    where eval_int gives None; max_over_loops is the grid's maximum where it is defined everywhere."""
    import itertools

    import numpy as np

    from ember.tir.arith import Analyzer, eval_grid

    bounds = {v: (lo, lo + n) for v, (lo, n) in zip(VARS, ranges)}
    grid = np.ix_(*[np.arange(lo, hi + 1) for lo, hi in bounds.values()])
    values, undefined = eval_grid(expr, dict(zip(VARS, grid)))
    points = list(itertools.product(*[range(lo, hi + 1) for lo, hi in bounds.values()]))
    want = [eval_int(expr, dict(zip(VARS, p))) for p in points]
    for p, w in zip(points, want):
        at = tuple(i - lo for i, (lo, _) in zip(p, bounds.values()))
        got_undefined = bool(np.broadcast_to(undefined, [len(a.ravel()) for a in grid])[at])
        assert got_undefined == (w is None), f"{expr} at {p}"
        if w is not None:
            assert int(np.broadcast_to(values, [len(a.ravel()) for a in grid])[at]) == int(w), f"{expr} at {p}"
    if all(w is not None for w in want):
        assert Analyzer(bounds).max_over_loops(expr) == max(int(w) for w in want)
