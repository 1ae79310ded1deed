"""Each schedule primitive on small computes, built to C and compared with numpy.

A case builds a compute, applies primitives and returns (schedule, arguments, numpy reference); sizes are
chosen so that splits do not divide and tails are exercised.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

import ember
from ember import te


def matmul(m: int = 13, n: int = 11, k: int = 9):
    A = te.placeholder((m, k), name="A")
    B = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    return A, B, C


def mm_ref(a, b):
    return a @ b


def elementwise(m: int = 13, n: int = 11):
    A = te.placeholder((m, n), name="A")
    B = te.compute((m, n), lambda i, j: A[i, j] * 2.0 + 1.0, name="B")
    return A, B


def ew_ref(a):
    return a * 2 + 1


def chain(m: int = 13, n: int = 11):
    """A -> B = A + 1 -> C = 2B -> D = C - 3."""
    A = te.placeholder((m, n), name="A")
    B = te.compute((m, n), lambda i, j: A[i, j] + 1.0, name="B")
    C = te.compute((m, n), lambda i, j: B[i, j] * 2.0, name="C")
    D = te.compute((m, n), lambda i, j: C[i, j] - 3.0, name="D")
    return A, B, C, D


def chain_ref(a):
    return (a + 1) * 2 - 3


@dataclass
class Case:
    id: str
    build: Callable[[], tuple]  # () -> (schedule, args, reference)
    ir_has: tuple[str, ...] = ()  # substrings of the lowered IR
    ir_lacks: tuple[str, ...] = ()


CASES: list[Case] = []


def case(*ir_has: str, lacks: tuple[str, ...] = ()):
    def register(fn):
        CASES.append(Case(fn.__name__, fn, ir_has, lacks))
        return fn

    return register


# -- split, tile ------------------------------------------------------------------------------


@case("for i.outer in range(2):", "for i.inner in range(5):", "for i.inner in range(3):")
def split_by_factor_not_dividing():
    A, B = elementwise()
    s = te.create_schedule(B)
    s[B].split(B.op.axis[0], factor=5)
    return s, [A, B], ew_ref


@case("for j.outer in range(3):", "for j.inner in range(3):", "for j.inner in range(2):")
def split_by_nparts_not_dividing():
    A, B = elementwise()
    s = te.create_schedule(B)
    s[B].split(B.op.axis[1], nparts=4)
    return s, [A, B], ew_ref


@case()
def split_by_factor_and_nparts_larger_than_the_extent():
    A, B = elementwise()
    s = te.create_schedule(B)
    s[B].split(B.op.axis[0], factor=40)
    s[B].split(B.op.axis[1], nparts=30)
    return s, [A, B], ew_ref


@case()
def split_by_one():
    A, B = elementwise()
    s = te.create_schedule(B)
    s[B].split(B.op.axis[0], factor=1)
    s[B].split(B.op.axis[1], nparts=1)
    return s, [A, B], ew_ref


@case()
def split_nested_and_reordered():
    A, B, C = matmul()
    s = te.create_schedule(C)
    xo, xi = s[C].split(C.op.axis[0], factor=5)
    xio, xii = s[C].split(xi, factor=2)
    xoo, xoi = s[C].split(xo, nparts=2)
    s[C].reorder(xii, C.op.reduce_axis[0], xoo, xio, C.op.axis[1], xoi)
    return s, [A, B, C], mm_ref


@case()
def split_of_a_reduction_axis():
    A, B, C = matmul()
    s = te.create_schedule(C)
    ko, ki = s[C].split(C.op.reduce_axis[0], factor=4)
    s[C].reorder(ko, C.op.axis[0], ki, C.op.axis[1])
    return s, [A, B, C], mm_ref


@case("for i.outer in range(3):", "for i.inner in range(4):", "for j.inner in range(8):", "for j.inner in range(3):")
def tile_not_dividing():
    A, B, C = matmul(13, 11, 9)
    s = te.create_schedule(C)
    s[C].tile(C.op.axis[0], C.op.axis[1], 4, 8)
    return s, [A, B, C], mm_ref


@case(lacks=("if ",))
def tile_dividing_has_no_guards():
    A, B, C = matmul(16, 16, 5)
    s = te.create_schedule(C)
    s[C].tile(C.op.axis[0], C.op.axis[1], 4, 8)
    return s, [A, B, C], mm_ref


# -- fuse, reorder --------------------------------------------------------------------------------


@case("for i.j.fused in range(143):")
def fuse_two_loops():
    A, B = elementwise()
    s = te.create_schedule(B)
    s[B].fuse(*B.op.axis)
    return s, [A, B], ew_ref


@case()
def fuse_three_loops():
    A = te.placeholder((3, 5, 7), name="A")
    B = te.compute((3, 5, 7), lambda i, j, k: A[i, j, k] - 1.0, name="B")
    s = te.create_schedule(B)
    s[B].fuse(*B.op.axis)
    return s, [A, B], lambda a: a - 1


@case()
def fuse_then_split_not_dividing():
    A, B = elementwise()
    s = te.create_schedule(B)
    fused = s[B].fuse(*B.op.axis)
    s[B].split(fused, factor=10)
    return s, [A, B], ew_ref


@case("ramp(")
def fuse_then_split_then_vectorize():
    A, B, C = matmul()
    s = te.create_schedule(C)
    fused = s[C].fuse(*C.op.axis)
    _, inner = s[C].split(fused, factor=8)
    s[C].vectorize(inner)
    return s, [A, B, C], mm_ref


@case("B[ramp(0, 1, 32)]")
def fused_loop_vectorized_power_of_two():
    A, B = elementwise(4, 8)
    s = te.create_schedule(B)
    s[B].vectorize(s[B].fuse(*B.op.axis))
    return s, [A, B], ew_ref


@case("B[ramp(0, 1, 64)]", "lanes where", lacks=("vectorize_fallback",))
def fused_loop_vectorized_not_power_of_two_is_masked():
    A, B = elementwise(7, 8)
    s = te.create_schedule(B)
    s[B].vectorize(s[B].fuse(*B.op.axis))
    return s, [A, B], ew_ref


@case()
def fuse_of_reduction_axes_then_split_and_unroll():
    A = te.placeholder((5, 7, 9), name="A")
    k, l = te.reduce_axis((0, 7), name="k"), te.reduce_axis((0, 9), name="l")
    B = te.compute((5,), lambda i: te.sum(A[i, k, l], axis=[k, l]), name="B")
    s = te.create_schedule(B)
    _, inner = s[B].split(s[B].fuse(k, l), factor=5)
    s[B].unroll(inner)
    return s, [A, B], lambda a: a.sum(axis=(1, 2))


@pytest.mark.parametrize("order", ["ijk", "ikj", "jik", "jki", "kij", "kji"])
def test_reorder_every_permutation_of_matmul(check_build, rng, order):
    A, B, C = matmul()
    s = te.create_schedule(C)
    axes = {"i": C.op.axis[0], "j": C.op.axis[1], "k": C.op.reduce_axis[0]}
    s[C].reorder(*(axes[a] for a in order))
    assert [iv.name for iv in s[C].leaf_iter_vars] == list(order)
    check_build(s, [A, B, C], mm_ref, rng)


# -- vectorize, unroll, parallel, pragma ---------------------------------------------------------


@pytest.mark.parametrize("lanes", [2, 4, 8, 16])
def test_vectorize_power_of_two_lanes_gives_vector_code(check_build, rng, lanes):
    A, B = elementwise(5, lanes)
    s = te.create_schedule(B)
    s[B].vectorize(B.op.axis[1])
    f = check_build(s, [A, B], ew_ref, rng)
    assert f"B[ramp(i * {lanes}, 1, {lanes})]" in str(f.ir)
    assert f"float32x{lanes}" in f.source


@pytest.mark.parametrize("lanes", [3, 5, 6, 7])
@pytest.mark.parametrize("target", ["c", "llvm"])
def test_vectorize_other_lane_counts_mask_the_next_power_of_two(check_build, rng, lanes, target):
    """A row of 3..7 elements: one vector of 4 or 8 lanes, its loads and stores masked to the row (the last row's
    lanes past the buffer are never touched)."""
    A, B = elementwise(5, lanes)
    s = te.create_schedule(B)
    s[B].vectorize(B.op.axis[1])
    f = check_build(s, [A, B], ew_ref, rng, target=target)
    p = 1 << lanes.bit_length()
    assert f"B[ramp(i * {lanes}, 1, {p})]" in str(f.ir) and "masked(A[" in str(f.ir), f.ir
    assert "vectorize_fallback" not in str(f.ir)


@case("C[ramp(i * 19 + j.outer * 8, 1, 8)]", "C[ramp(i * 19 + 16, 1, 4)]", "lanes where")
def vectorize_a_split_with_a_tail():
    A, B, C = matmul(13, 19, 9)
    s = te.create_schedule(C)
    jo, ji = s[C].split(C.op.axis[1], factor=8)
    s[C].reorder(C.op.axis[0], jo, C.op.reduce_axis[0], ji)
    s[C].vectorize(ji)
    return s, [A, B, C], mm_ref


@case("ramp(")
def vectorize_a_loop_that_holds_the_reduction_loop():
    A, B, C = matmul(9, 8, 7)
    s = te.create_schedule(C)
    s[C].reorder(C.op.axis[0], C.op.axis[1], C.op.reduce_axis[0])
    s[C].vectorize(C.op.axis[1])
    return s, [A, B, C], mm_ref


@case("masked(A[ramp(-1, 1, 16)]", lacks=("vectorize_fallback",))
def vectorize_a_guarded_read_masks_it():
    A = te.placeholder((16,), name="A")
    B = te.compute((16,), lambda i: te.if_then_else(i % 2 == 1, A[i - 1], 0.0), name="B")  # never reads A[-1]
    s = te.create_schedule(B)
    s[B].vectorize(B.op.axis[0])
    return s, [A, B], lambda a: np.where(np.arange(16) % 2 == 1, np.roll(a, 1), 0).astype(a.dtype)


@case("ramp(", lacks=("vectorize_fallback",))
def vectorize_a_select_reading_what_its_condition_reads():
    A = te.placeholder((16,), name="A")
    B = te.compute((16,), lambda i: te.if_then_else(A[i] > 0.0, A[i], 0.0), name="B")  # relu as a select
    s = te.create_schedule(B)
    s[B].vectorize(B.op.axis[0])
    return s, [A, B], lambda a: np.maximum(a, 0)


@case(lacks=("for j in", "unrolled"))
def unroll_a_data_loop():
    A, B, C = matmul()
    s = te.create_schedule(C)
    s[C].unroll(C.op.axis[1])
    return s, [A, B, C], mm_ref


@case()
def unroll_a_non_dividing_inner_loop():
    A, B = elementwise()
    s = te.create_schedule(B)
    _, inner = s[B].split(B.op.axis[1], factor=4)
    s[B].unroll(inner)
    return s, [A, B], ew_ref


@case("for i in parallel(13):")
def parallel_outer_loop():
    A, B, C = matmul()
    s = te.create_schedule(C)
    s[C].parallel(C.op.axis[0])
    return s, [A, B, C], mm_ref


@case("for i.j.fused in parallel(143):")
def parallel_fused_loop():
    A, B, C = matmul()
    s = te.create_schedule(C)
    s[C].parallel(s[C].fuse(*C.op.axis))
    return s, [A, B, C], mm_ref


@case()
def parallel_loop_inside_the_reduction_loop():
    A, B, C = matmul()
    s = te.create_schedule(C)
    s[C].reorder(C.op.reduce_axis[0], C.op.axis[0], C.op.axis[1])
    s[C].parallel(C.op.axis[0])
    return s, [A, B, C], mm_ref


@case("for i.inner in parallel(2):")
def parallel_loop_with_many_regions():
    """Regression: GCC 12's -O3 predictive commoning raced on this one (see Target.cflags)."""
    A, B, C = matmul(8, 7, 7)
    s = te.create_schedule(C)
    i, j = C.op.axis
    io, ii = s[C].split(i, 2)
    s[C].reorder(C.op.reduce_axis[0], j, ii, io)
    s[C].unroll(j)
    s[C].parallel(ii)
    return s, [A, B, C], mm_ref


@case("# unroll=4", "# my_note=yes")
def pragma_on_loops():
    A, B, C = matmul()
    s = te.create_schedule(C)
    s[C].pragma(C.op.reduce_axis[0], "unroll", 4)
    s[C].pragma(C.op.axis[1], "my_note", "yes")
    return s, [A, B, C], mm_ref


def test_pragmas_reach_the_c_code(check_build, rng):
    A, B, C = matmul()
    s = te.create_schedule(C)
    s[C].pragma(C.op.reduce_axis[0], "unroll", 4)
    s[C].pragma(C.op.axis[0], "my_note", "yes")
    f = check_build(s, [A, B, C], mm_ref, rng)
    assert "#pragma GCC unroll 4" in f.source
    assert "// pragma my_note=yes" in f.source


def test_storage_align_pads_the_rows_of_a_computed_at_buffer(check_build, rng):
    """A stage computed at a loop with `storage_align(16)`: its buffer's rows are allocated 16 apart where the
    tile needs 14 columns; the values are unchanged, and the step replays from JSON."""
    A = te.placeholder((6, 14), "float32", name="A")
    B = te.compute((6, 14), lambda i, j: A[i, j] * 2.0, name="B")
    C = te.compute((6, 14), lambda i, j: B[i, j] + 1.0, name="C")
    s = te.create_schedule(C)
    io, _ = s[C].split(C.op.axis[0], 3)
    s[B].compute_at(s[C], io)
    s[B].storage_align(16)
    f = check_build(s, [A, C], lambda a: a * 2.0 + 1.0, rng)
    assert "B[48]" in f.source  # 3 rows of 16, not 3 x 14
    again = te.Schedule.load(C, s.to_json())
    assert again[B].row_align == 16
    with pytest.raises(te.ScheduleError, match="storage_align"):
        s[C].storage_align(16)


def test_bind_is_recorded_in_the_ir_and_the_c_target_refuses_it():
    A, B = elementwise()
    s = te.create_schedule(B)
    s[B].bind(B.op.axis[0], "blockIdx.x")
    s[B].bind(B.op.axis[1], "threadIdx.x")
    ir = str(ember.lower(s, [A, B]))
    assert 'for i in thread_binding(13, "blockIdx.x"):' in ir
    assert 'for j in thread_binding(11, "threadIdx.x"):' in ir
    with pytest.raises(Exception, match="bound to blockIdx.x, which needs a GPU target"):
        ember.build(s, [A, B])


# -- compute_at, compute_inline, compute_root -------------------------------------------------------


@case("C = alloc float32[1, 11]", "B = alloc float32[1, 1]")
def compute_at_chain():
    A, B, C, D = chain()
    s = te.create_schedule(D)
    s[C].compute_at(s[D], D.op.axis[0])
    s[B].compute_at(s[C], C.op.axis[1])
    return s, [A, D], chain_ref


@case("B = alloc float32[1, 11]", "C = alloc float32[1, 11]")
def compute_at_several_stages_at_one_loop():
    A, B, C, D = chain()
    s = te.create_schedule(D)
    s[C].compute_at(s[D], D.op.axis[0])
    s[B].compute_at(s[D], D.op.axis[0])
    return s, [A, D], chain_ref


@case("C = alloc float32[1, 1]")
def compute_at_then_split_the_attach_loop():
    A, B, C, D = chain()
    s = te.create_schedule(D)
    s[C].compute_at(s[D], D.op.axis[1])
    s[D].split(D.op.axis[1], factor=4)
    s[B].compute_inline()
    return s, [A, D], chain_ref


@case("for i.j.fused in range(143):", "B = alloc float32[1, 1]")
def compute_at_then_fuse_the_attach_loop():
    A, B, C, D = chain()
    s = te.create_schedule(D)
    s[C].compute_at(s[D], D.op.axis[0])
    s[B].compute_at(s[D], D.op.axis[1])
    s[D].fuse(*D.op.axis)
    return s, [A, D], chain_ref


@case("C = alloc float32[4, 11]")
def compute_at_an_outer_split_loop_with_a_tail():
    A, B, C, D = chain()
    s = te.create_schedule(D)
    io, _ = s[D].split(D.op.axis[0], factor=4)
    s[C].compute_at(s[D], io)
    return s, [A, D], chain_ref


@case("B = alloc float32[6]")
def compute_at_infers_a_stencil_region():
    A = te.placeholder((17,), name="A")
    B = te.compute((19,), lambda i: te.if_then_else(te.all(i >= 1, i < 18), A[i - 1], 0.0), name="B")
    C = te.compute((17,), lambda i: B[i] + B[i + 1] + B[i + 2], name="C")
    s = te.create_schedule(C)
    io, _ = s[C].split(C.op.axis[0], factor=4)
    s[B].compute_at(s[C], io)

    def ref(a):
        p = np.pad(a, 1)
        return p[:-2] + p[1:-1] + p[2:]

    return s, [A, C], ref


@case("A.local = alloc float32[1, 1]")
def compute_at_a_reduction_loop():
    A, B, C = matmul()
    s = te.create_schedule(C)
    AL = s.cache_read(A, "local", [C])
    s[AL].compute_at(s[C], C.op.reduce_axis[0])
    return s, [A, B, C], mm_ref


@case("S = alloc float32[1]")
def compute_at_a_reduction_producer():
    """Softmax-like: the row sum is computed inside the row loop of its consumer."""
    A = te.placeholder((9, 13), name="A")
    k = te.reduce_axis((0, 13), name="k")
    S = te.compute((9,), lambda i: te.sum(A[i, k], axis=k), name="S")
    D = te.compute((9, 13), lambda i, j: A[i, j] / S[i], name="D")
    s = te.create_schedule(D)
    s[S].compute_at(s[D], D.op.axis[0])
    return s, [A, D], lambda a: a / a.sum(axis=1, keepdims=True)


@case(lacks=("alloc",))
def compute_inline_a_chain():
    A, B, C, D = chain()
    s = te.create_schedule(D)
    s[B].compute_inline()
    s[C].compute_inline()
    return s, [A, D], chain_ref


@case(lacks=("alloc",))
def compute_inline_a_padding_stage_into_a_reduction():
    A = te.placeholder((10,), name="A")
    P = te.compute((14,), lambda i: te.if_then_else(te.all(i >= 2, i < 12), A[i - 2], 0.0), name="P")
    k = te.reduce_axis((0, 5), name="k")
    B = te.compute((10,), lambda i: te.sum(P[i + k], axis=k), name="B")
    s = te.create_schedule(B)
    s[P].compute_inline()
    return s, [A, B], lambda a: np.convolve(a, np.ones(5, np.float32), mode="same")


@case("B = alloc float32[13, 11], global")
def compute_root_after_compute_at():
    A, B, C, D = chain()
    s = te.create_schedule(D)
    s[B].compute_at(s[D], D.op.axis[0])
    s[B].compute_root()
    return s, [A, D], chain_ref


# -- cache_read, cache_write ----------------------------------------------------------------------


@case("A.local = alloc float32[1, 9], local")
def cache_read_attached_at_a_row():
    A, B, C = matmul()
    s = te.create_schedule(C)
    AL = s.cache_read(A, "local", [C])
    s[AL].compute_at(s[C], C.op.axis[0])
    return s, [A, B, C], mm_ref


@case("A.global = alloc float32[13, 11], global")
def cache_read_for_two_readers():
    A = te.placeholder((13, 11), name="A")
    B = te.compute((13, 11), lambda i, j: A[i, j] * 2.0, name="B")
    C = te.compute((13, 11), lambda i, j: A[i, j] + B[i, j], name="C")
    s = te.create_schedule(C)
    s.cache_read(A, "global", [B, C])
    return s, [A, C], lambda a: a + 2 * a


@case("B.local = alloc float32[4, 4], local")
def cache_write_of_an_elementwise_stage():
    A, B = elementwise()
    s = te.create_schedule(B)
    BL = s.cache_write(B, "local")
    _, yo, _, _ = s[B].tile(B.op.axis[0], B.op.axis[1], 4, 4)
    s[BL].compute_at(s[B], yo)
    return s, [A, B], ew_ref


@case("C.local = alloc float32[13, 11]")
def cache_write_of_a_reduction_at_root():
    A, B, C = matmul()
    s = te.create_schedule(C)
    s.cache_write(C, "local")
    return s, [A, B, C], mm_ref


@case("C.local = alloc float32[4, 4], local", "C.local[ramp(")
def cache_write_of_a_reduction_with_tiles_and_tails():
    A, B, C = matmul()
    s = te.create_schedule(C)
    CL = s.cache_write(C, "local")
    _, yo, _, _ = s[C].tile(C.op.axis[0], C.op.axis[1], 4, 4)
    s[CL].compute_at(s[C], yo)
    s[CL].vectorize(CL.op.axis[1])
    return s, [A, B, C], mm_ref


@case("C.local = alloc float32[4, 8], local")
def cache_write_register_blocking():
    A, B, C = matmul(16, 16, 16)
    s = te.create_schedule(C)
    CL = s.cache_write(C, "local")
    io, jo, _, _ = s[C].tile(C.op.axis[0], C.op.axis[1], 4, 8)
    s[C].parallel(io)
    s[CL].compute_at(s[C], jo)
    i, j = CL.op.axis
    s[CL].reorder(CL.op.reduce_axis[0], i, j)
    s[CL].vectorize(j)
    s[CL].unroll(i)
    return s, [A, B, C], mm_ref


# -- reducers and conditions ---------------------------------------------------------------------


def row_reduce(fn, dt: str = "float32", n: int = 13):
    A = te.placeholder((9, n), dt, name="A")
    k = te.reduce_axis((0, n), name="k")
    B = te.compute((9,), lambda i: fn(A, i, k), name="B")
    return A, B


@pytest.mark.parametrize("dt", ["float32", "float64", "int8", "int32", "int64"])
@pytest.mark.parametrize("reducer, ref", [(te.max, np.max), (te.min, np.min), (te.sum, np.sum)])
def test_builtin_reducers(check_build, rng, dt, reducer, ref):
    A, B = row_reduce(lambda A, i, k: reducer(A[i, k], axis=k), dt)
    s = te.create_schedule(B)
    ko, ki = s[B].split(B.op.reduce_axis[0], factor=4)
    s[B].reorder(ko, B.op.axis[0], ki)
    check_build(s, [A, B], lambda a: ref(a, axis=1).astype(dt), rng)


def test_custom_product_reducer(check_build, rng):
    prod = te.comm_reducer(lambda x, y: x * y, lambda t: 1, name="prod")
    A, B = row_reduce(lambda A, i, k: prod(A[i, k], axis=k))
    s = te.create_schedule(B)
    assert "prod(A[i, k], axis=[k])" in repr(B.op)
    a = rng.uniform(0.5, 1.5, (9, 13)).astype("float32")
    check_build(s, [A, B], lambda a: a.prod(axis=1), rng, inputs={"A": a})


def test_custom_reducer_of_absolute_maximum(check_build, rng):
    absmax = te.comm_reducer(lambda x, y: te.max(te.abs(x), te.abs(y)), lambda t: 0.0, name="absmax")
    A, B = row_reduce(lambda A, i, k: absmax(A[i, k], axis=k))
    s = te.create_schedule(B)
    s[B].split(B.op.reduce_axis[0], nparts=3)
    check_build(s, [A, B], lambda a: np.abs(a).max(axis=1), rng)


def test_reduction_with_where_on_axes(check_build, rng):
    A, B = row_reduce(lambda A, i, k: te.sum(A[i, k], axis=k, where=k <= i))
    s = te.create_schedule(B)
    check_build(s, [A, B], lambda a: np.tril(a).sum(axis=1), rng)


def test_reduction_with_where_on_data(check_build, rng):
    A, B = row_reduce(lambda A, i, k: te.max(A[i, k], axis=k, where=A[i, k] < 0.5))
    s = te.create_schedule(B)
    check_build(s, [A, B], lambda a: np.where(a < 0.5, a, -np.inf).max(axis=1), rng)


def test_reduction_over_an_offset_range(check_build, rng):
    A = te.placeholder((9, 13), name="A")
    k = te.reduce_axis((3, 11), name="k")
    B = te.compute((9,), lambda i: te.sum(A[i, k], axis=k), name="B")
    s = te.create_schedule(B)
    s[B].split(k, factor=3)
    check_build(s, [A, B], lambda a: a[:, 3:11].sum(axis=1), rng)


def test_reduction_to_a_scalar(check_build, rng):
    A = te.placeholder((37,), name="A")
    k = te.reduce_axis((0, 37), name="k")
    B = te.compute((), lambda: te.sum(A[k], axis=k), name="B")
    s = te.create_schedule(B)
    s[B].split(k, factor=8)
    check_build(s, [A, B], lambda a: np.float32(a.sum()), rng)


def test_empty_reduction_gives_the_identity(check_build, rng):
    A, B = row_reduce(lambda A, i, k: te.sum(A[i, k], axis=k), n=0)
    check_build(te.create_schedule(B), [A, B], lambda a: np.zeros(9, np.float32), rng)


# -- run the table ----------------------------------------------------------------------------------


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_primitive(check_build, rng, c: Case):
    s, args, ref = c.build()
    f = check_build(s, args, ref, rng)
    ir = str(f.ir)
    for part in c.ir_has:
        assert part in ir, f"expected {part!r} in\n{ir}"
    for part in c.ir_lacks:
        assert part not in ir, f"unexpected {part!r} in\n{ir}"
