"""`ember.lower` and `ember.build`: the public entry points, and the argument checks of a built module, which
must reject bad arrays before any native code runs."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import te
from ember.runtime.module import ArgumentError, Function


def matmul(m: int = 5, n: int = 6, k: int = 7):
    A = te.placeholder((m, k), "float32", name="A")
    B = te.placeholder((k, n), "float32", name="B")
    r = te.reduce_axis((0, k), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    return A, B, C


@pytest.fixture(scope="module")
def mm():
    A, B, C = matmul()
    return ember.build(te.create_schedule(C), [A, B, C])


def arrays(rng):
    return (rng.standard_normal((5, 7)).astype(np.float32), rng.standard_normal((7, 6)).astype(np.float32),
            np.zeros((5, 6), np.float32))  # fmt: skip


def test_the_quick_example(check_build, rng):
    A, B = te.placeholder((64, 64), "float32", name="A"), te.placeholder((64, 64), "float32", name="B")
    k = te.reduce_axis((0, 64), name="k")
    C = te.compute((64, 64), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    s = te.create_schedule(C)
    s[C].tile(C.op.axis[0], C.op.axis[1], 32, 32)
    text = str(ember.lower(s, [A, B, C]))
    assert text.splitlines()[0] == "def default_function(A: float32[64, 64], B: float32[64, 64], C: float32[64, 64]):"
    f = check_build(s, [A, B, C], lambda a, b: a @ b, rng)
    assert "int32_t default_function(" in f.source
    assert repr(f).startswith("Module(default_function from ")


def test_build_of_a_lowered_function(rng):
    A, B, C = matmul()
    func = ember.lower(te.create_schedule(C), [A, B, C], name="mm")
    f = ember.build(func)
    a, b, c = arrays(rng)
    f["mm"](a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-5)


def test_two_outputs_in_one_function(check_build, rng):
    A = te.placeholder((9, 4), name="A")
    B = te.compute((9, 4), lambda i, j: A[i, j] + 1.0, name="B")
    C = te.compute((4, 9), lambda i, j: A[j, i] * 2.0, name="C")
    s = te.create_schedule([B, C])
    check_build(s, [A, B, C], lambda a: (a + 1, a.T * 2), rng)


def test_empty_tensors(check_build, rng):
    A = te.placeholder((0, 5), name="A")
    B = te.compute((0, 5), lambda i, j: A[i, j] + 1.0, name="B")
    check_build(te.create_schedule(B), [A, B], lambda a: a + 1, rng)


def test_lower_trace_prints_every_pass(capsys):
    A, B, C = matmul()
    ember.lower(te.create_schedule(C), [A, B, C], trace=True)
    out = capsys.readouterr().out
    for name in ("schedule", "simplify", "partition_loops", "flatten", "vectorize", "unroll"):
        assert f"# after {name}\n" in out


def test_benchmark_reports_a_median(mm, rng):
    stats = mm.benchmark(*arrays(rng), repeat=3, min_time=0.001)
    assert stats["median"] > 0 and len(stats["runs"]) == 3


def test_build_needs_arguments_and_a_known_target():
    A, B, C = matmul()
    s = te.create_schedule(C)
    with pytest.raises(TypeError, match="the argument tensors are required"):
        ember.build(s)
    with pytest.raises(TypeError, match="arguments must be tensors"):
        ember.build(s, [A, B, "C"])
    with pytest.raises(Exception, match="not bound to a GPU thread axis"):  # GPU targets need bound loops
        ember.build(s, [A, B, C], target="cuda")
    with pytest.raises(ValueError, match="unknown target"):
        ember.build(s, [A, B, C], target="fortran")


# -- argument checks ------------------------------------------------------------------------------


# (id, the call's arguments made from good ones, expected message): every call is wrong in one way
BAD_CALLS = [
    ("too few arguments", lambda a, b, c: (a, b), r"default_function expects 3 arguments \(A, B, C\), got 2"),
    ("too many arguments", lambda a, b, c: (a, b, c, c), "expects 3 arguments"),
    ("not an array", lambda a, b, c: (a.tolist(), b, c), "argument 'A' must be a numpy array, got list"),
    ("wrong shape", lambda a, b, c: (a, b.T.copy(), c), r"argument 'B' has shape \(6, 7\), expected \(7, 6\)"),
    ("wrong dtype", lambda a, b, c: (a.astype(np.float64), b, c), "argument 'A' has dtype float64, expected float32"),
    ("wrong output dtype", lambda a, b, c: (a, b, c.astype(np.int32)),
     "argument 'C' has dtype int32, expected float32"),
    ("strided view", lambda a, b, c: (a, b, np.zeros((10, 12), np.float32)[::2, ::2]),
     "argument 'C' is not C-contiguous"),
    ("transposed view", lambda a, b, c: (np.ascontiguousarray(a.T).T, b, c), "argument 'A' is not C-contiguous"),
    ("output is a view of an input", lambda a, b, c: (a, b, b[:5]), "arguments 'B' and 'C' overlap in memory"),
]  # fmt: skip


@pytest.mark.parametrize("name, make, message", BAD_CALLS, ids=[b[0] for b in BAD_CALLS])
def test_bad_arguments_are_rejected_before_native_code_runs(mm, rng, monkeypatch, name, make, message):
    args = make(*arrays(rng))

    def native(*_):
        raise AssertionError(f"{name}: native code ran")

    monkeypatch.setattr(Function, "call_unchecked", native)
    with pytest.raises(ArgumentError, match=message):
        mm(*args)


def test_read_only_output_is_rejected(mm, rng):
    a, b, c = arrays(rng)
    c.flags.writeable = False
    with pytest.raises(ArgumentError, match="argument 'C' is written by the function but the array is read-only"):
        mm(a, b, c)


def test_read_only_inputs_are_fine(mm, rng):
    a, b, c = arrays(rng)
    a.flags.writeable = b.flags.writeable = False
    mm(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-5)


def test_output_overlapping_an_input_is_rejected(rng):
    A = te.placeholder((8,), name="A")
    B = te.compute((8,), lambda i: A[i] * 2.0, name="B")
    f = ember.build(te.create_schedule(B), [A, B])
    buf = rng.standard_normal(12).astype(np.float32)
    before = buf.copy()
    with pytest.raises(ArgumentError, match="arguments 'A' and 'B' overlap in memory"):
        f(buf[:8], buf[4:])
    with pytest.raises(ArgumentError, match="overlap in memory"):
        f(buf[:8], buf[:8])
    np.testing.assert_array_equal(buf, before)


def test_two_inputs_may_share_memory(rng):
    A = te.placeholder((6,), name="A")
    B = te.placeholder((6,), name="B")
    C = te.compute((6,), lambda i: A[i] * B[i], name="C")
    f = ember.build(te.create_schedule(C), [A, B, C])
    a = rng.standard_normal(6).astype(np.float32)
    c = np.zeros(6, np.float32)
    f(a, a, c)
    np.testing.assert_allclose(c, a * a, rtol=1e-6)


def test_an_input_the_computation_does_not_read_is_an_unused_parameter(rng):
    """Regression: an unused placeholder in the argument list raised "tensor 'U' is not part of this schedule"."""
    A = te.placeholder((4,), name="A")
    U = te.placeholder((3, 3), "int8", name="U")
    B = te.compute((4,), lambda i: A[i] * 2.0, name="B")
    f = ember.build(te.create_schedule(B), [A, U, B])
    assert str(f.ir).splitlines()[0] == "def default_function(A: float32[4], U: int8[3, 3], B: float32[4]):"
    a, b = rng.standard_normal(4).astype(np.float32), np.zeros(4, np.float32)
    f(a, np.zeros((3, 3), np.int8), b)
    np.testing.assert_array_equal(b, a * 2)
    with pytest.raises(ArgumentError, match="argument 'U' has dtype float32, expected int8"):
        f(a, np.zeros((3, 3), np.float32), b)
