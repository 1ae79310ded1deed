"""double_buffer: a stage computed inside a loop gets two slots; the next iteration's part is prefetched into the
other slot while this iteration computes. Checked against numpy on C and OpenCL (shared-memory operand tiles),
with reduction extents that the tiles do not divide."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import te


def matmul(m: int = 24, n: int = 20, k: int = 37):
    A = te.placeholder((m, k), "float32", name="A")
    B = te.placeholder((k, n), "float32", name="B")
    r = te.reduce_axis((0, k), name="k")
    return A, B, te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")


def check(s, A, B, C, target):
    rng = np.random.default_rng(5)
    a = rng.standard_normal(A.shape).astype("float32")
    b = rng.standard_normal(B.shape).astype("float32")
    c = np.zeros(C.shape, "float32")
    ember.build(s, [A, B, C], target=target)(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


def test_double_buffer_cpu_local_copy():
    A, B, C = matmul()
    s = te.create_schedule(C)
    AL = s.cache_read(A, "local", [C])
    ko, ki = s[C].split(C.op.reduce_axis[0], 8)
    s[C].reorder(ko, C.op.axis[0], C.op.axis[1], ki)
    s[AL].compute_at(s[C], ko)
    s[AL].double_buffer()
    text = str(ember.lower(s, [A, B, C]))
    assert "A.local = alloc float32[2, 24, 8]" in text and "(k.outer + 1) % 2" in text, text
    assert [st.kind for st in s.steps][-1] == "double_buffer"
    check(s, A, B, C, "c")
    again = te.Schedule.from_record(C, s.record())  # replays like any step
    assert str(ember.lower(again, [A, B, C])) == text


def test_double_buffer_opencl_shared_tiles():
    from tests.conftest import opencl_missing

    why = opencl_missing()
    if why:
        pytest.skip(f"OpenCL: {why}")
    A, B, C = matmul()
    s = te.create_schedule(C)
    CL = s.cache_write(C, "local")
    io, ii = s[C].split(C.op.axis[0], 8)
    jo, ji = s[C].split(C.op.axis[1], 8)
    s[C].reorder(io, jo, ii, ji)
    s[C].bind(s[C].fuse(io, jo), "blockIdx.x")
    t = s[C].fuse(ii, ji)
    s[C].bind(t, "threadIdx.x")
    s[CL].compute_at(s[C], t)
    ko, _ = s[CL].split(s[CL].op.reduce_axis[0], 4)
    for X in (s.cache_read(A, "shared", [CL]), s.cache_read(B, "shared", [CL])):
        s[X].compute_at(s[CL], ko)
        _, tx = s[X].split(s[X].fuse(*s[X].op.axis), 64)
        s[X].bind(tx, "threadIdx.x")
        s[X].double_buffer()
    check(s, A, B, C, "opencl")


def test_double_buffer_of_an_output_is_refused():
    A, B, C = matmul()
    s = te.create_schedule(C)
    with pytest.raises(te.ScheduleError, match="output cannot be double-buffered"):
        s[C].double_buffer()
