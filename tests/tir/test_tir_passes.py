"""Loop IR: the printer and the loop passes (simplify, partition, flatten, vectorize, unroll), as IR before/after."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import ember
from ember import te, tir
from ember.tir import Allocate, Broadcast, Buffer, For, ForKind, IfThenElse, LetStmt, Load, PrimFunc, Ramp, Store, Var
from ember.tir import const as c
from ember.tir.functor import walk
from ember.tir.transform import flatten, optimize, partition_loops, simplify, unroll_loops
from ember.tir.vectorize import vectorize_loops

A = Buffer("A", (10,), "float32")
B = Buffer("B", (10,), "float32")


def loop(var: Var, extent: int, body, kind=ForKind.SERIAL, lo: int = 0, **kw) -> For:
    return For(var, c(lo), c(extent), kind, body, **kw)


def text(f: PrimFunc) -> str:
    return str(f)


def expect(s: str) -> str:
    return textwrap.dedent(s).strip("\n")


def vectorize(f: PrimFunc) -> PrimFunc:
    """The vectorize pass, then simplify (as in the pipeline)."""
    return simplify(f.with_body(vectorize_loops(f.body)))


# ---------------------------------------------------------------------------------------------
# printer


def test_printer_shows_loop_kinds_names_and_allocations():
    i, j, t = Var("i.outer"), Var("j"), Var("t")
    T = Buffer("T.local", (4,), "int32", "local")
    body = LetStmt(
        t,
        i * 2,
        Allocate(
            T,
            tir.seq(
                loop(j, 4, Store(T, j + t, (j,)), ForKind.UNROLLED),
                loop(j, 4, Store(A, tir.Cast(tir.dtype("float32"), T[j]), (j,)), ForKind.VECTORIZED),
                loop(j, 3, IfThenElse(j < 2, Store(B, A[j], (j,)), Store(B, c(0.0), (j,))), lo=1),
            ),
        ),
    )
    f = PrimFunc("f", (A, B), tir.seq(loop(i, 5, body, ForKind.PARALLEL), loop(j, 2, tir.Evaluate(c(0)))))
    assert text(f) == expect("""
        def f(A: float32[10], B: float32[10]):
          for i.outer in parallel(5):
            t = i.outer * 2
            T.local = alloc int32[4], local
            for j in unrolled(4):
              T.local[j] = j + t
            for j in vectorized(4):
              A[j] = float32(T.local[j])
            for j in range(1, 4):
              if j < 2:
                B[j] = A[j]
              else:
                B[j] = 0.0f
          for j in range(2):
            0
    """)


def test_printer_shows_thread_bindings_pragmas_and_needed_parentheses():
    i = Var("i")
    body = Store(A, (A[i] + 1.0) * (A[i] - 2.0) / A[(i + 1) // 2], (i,))
    f = PrimFunc("g", (A,), loop(i, 8, body, ForKind.THREAD_BINDING, thread_tag="threadIdx.x",
                               annotations=(("unroll", 4),)))  # fmt: skip
    assert text(f) == expect("""
        def g(A: float32[10]):
          for i in thread_binding(8, "threadIdx.x"):  # unroll=4
            A[i] = (A[i] + 1.0f) * (A[i] - 2.0f) / A[(i + 1) // 2]
    """)


def test_printer_renames_a_loop_variable_that_shadows_an_enclosing_one():
    """Regression: a producer computed inside its consumer's loop `i` has its own loop `i`; both printed as `i`,
    so `A[... + i * 7 + i]` did not say which was which."""
    X = te.placeholder((9, 7), name="X")
    T = te.compute((9, 7), lambda i, j: X[i, j] * 2.0, name="T")
    Y = te.compute((7, 9), lambda i, j: T[j, i] + 1.0, name="Y")
    s = te.create_schedule(Y)
    s[T].compute_at(s[Y], Y.op.axis[1])
    assert str(ember.lower(s, [X, Y])) == expect("""
        def default_function(X: float32[9, 7], Y: float32[7, 9]):
          for i in range(7):
            for j in range(9):
              T = alloc float32[1, 1], global
              T[0] = X[j * 7 + i] * 2.0f
              Y[i * 9 + j] = T[0] + 1.0f
    """)
    s = te.create_schedule(Y)
    s[T].compute_at(s[Y], Y.op.axis[0])
    assert str(ember.lower(s, [X, Y])) == expect("""
        def default_function(X: float32[9, 7], Y: float32[7, 9]):
          for i in range(7):
            T = alloc float32[9, 1], global
            for i_1 in range(9):
              T[i_1] = X[i_1 * 7 + i] * 2.0f
            for j in range(9):
              Y[i * 9 + j] = T[j] + 1.0f
    """)


def test_lowered_ir_keeps_the_names_of_tensors_and_axes():
    X = te.placeholder((12, 10), name="Input")
    Y = te.compute((12, 10), lambda row, col: X[row, col] * 2.0, name="Doubled")
    s = te.create_schedule(Y)
    ro, ri = s[Y].split(Y.op.axis[0], factor=4)
    s[Y].parallel(ro)
    s[Y].vectorize(Y.op.axis[1])
    ir = str(ember.lower(s, [X, Y], name="double_it"))
    assert ir.startswith("def double_it(Input: float32[12, 10], Doubled: float32[12, 10]):")
    assert "for row.outer in parallel(3):" in ir
    assert "for row.inner in range(4):" in ir


# ---------------------------------------------------------------------------------------------
# simplify and partition


def test_simplify_drops_provably_true_guards_and_empty_loops():
    i = Var("i")
    f = PrimFunc("f", (A, B), tir.seq(
        loop(i, 10, IfThenElse(i < 10, Store(B, A[i], (i,)))),
        loop(i, 0, Store(B, A[i], (i,))),
        loop(i, 1, Store(B, A[i + 3], (i,))),
    ))  # fmt: skip
    assert text(simplify(f)) == expect("""
        def f(A: float32[10], B: float32[10]):
          for i in range(10):
            B[i] = A[i]
          B[0] = A[3]
    """)


def test_partition_splits_a_guarded_loop_into_unguarded_main_part_and_tail():
    io, ii = Var("i.outer"), Var("i.inner")
    i = io * 4 + ii
    f = PrimFunc("f", (A, B), loop(io, 3, loop(ii, 4, IfThenElse(i < 10, Store(B, A[i] * 2.0, (i,))))))
    assert text(optimize(f, [("partition", partition_loops), ("simplify", simplify)])) == expect("""
        def f(A: float32[10], B: float32[10]):
          for i.outer in range(2):
            for i.inner in range(4):
              B[i.outer * 4 + i.inner] = A[i.outer * 4 + i.inner] * 2.0f
          for i.inner in range(2):
            B[i.inner + 8] = A[i.inner + 8] * 2.0f
    """)


def test_non_dividing_split_has_no_branch_in_the_main_loop():
    X = te.placeholder((37,), name="X")
    Y = te.compute((37,), lambda i: X[i] + 1.0, name="Y")
    s = te.create_schedule(Y)
    s[Y].split(Y.op.axis[0], factor=8)
    before = str(optimize(ember.te.lower.lower_schedule(s, [X, Y]), [("simplify", simplify)]))
    assert "if i.outer * 8 + i.inner < 37:" in before
    assert str(ember.lower(s, [X, Y])) == expect("""
        def default_function(X: float32[37], Y: float32[37]):
          for i.outer in range(4):
            for i.inner in range(8):
              Y[i.outer * 8 + i.inner] = X[i.outer * 8 + i.inner] + 1.0f
          for i.inner in range(5):
            Y[i.inner + 32] = X[i.inner + 32] + 1.0f
    """)


def test_partition_through_floordiv_of_a_fused_loop():
    X = te.placeholder((5, 7), name="X")
    Y = te.compute((5, 7), lambda i, j: X[i, j] * 3.0, name="Y")
    s = te.create_schedule(Y)
    fused = s[Y].fuse(*Y.op.axis)
    s[Y].split(fused, factor=16)
    ir = ember.lower(s, [X, Y])
    ifs = [n for n in walk(ir.body) if isinstance(n, IfThenElse)]
    assert not ifs, f"guards left in\n{ir}"


def test_seq_of_nothing_is_a_no_op():
    assert tir.seq() is tir.stmt.NOP
    assert tir.seq(tir.Evaluate(c(0)), tir.seq()) is tir.stmt.NOP


def test_no_empty_loops_are_left_after_partitioning_a_tiled_reduction():
    """Regression: partition pieces whose guard is false everywhere used to stay as loops with an empty body."""
    X = te.placeholder((13, 9), name="X")
    W = te.placeholder((9, 11), name="W")
    k = te.reduce_axis((0, 9), name="k")
    Y = te.compute((13, 11), lambda i, j: te.sum(X[i, k] * W[k, j], axis=k), name="Y")
    s = te.create_schedule(Y)
    s[Y].tile(Y.op.axis[0], Y.op.axis[1], 4, 8)
    ir = ember.lower(s, [X, W, Y])
    lines = str(ir).splitlines()
    for n, line in enumerate(lines[:-1]):
        if line.lstrip().startswith("for "):
            indent = len(line) - len(line.lstrip())
            assert len(lines[n + 1]) - len(lines[n + 1].lstrip()) > indent, f"empty loop at line {n}:\n{ir}"
    assert lines[-1].lstrip().startswith("Y[")


# ---------------------------------------------------------------------------------------------
# flatten


def test_flatten_turns_nd_indices_into_one_offset():
    C = Buffer("C", (3, 5), "float32")
    i, j = Var("i"), Var("j")
    f = PrimFunc("h", (C,), loop(i, 3, loop(j, 5, Store(C, C[i, j] + 1.0, (i, j)))))
    assert text(simplify(flatten(f))) == expect("""
        def h(C: float32[3, 5]):
          for i in range(3):
            for j in range(5):
              C[i * 5 + j] = C[i * 5 + j] + 1.0f
    """)


# ---------------------------------------------------------------------------------------------
# vectorize


def test_vectorized_loop_becomes_ramp_loads_and_stores():
    i = Var("i")
    f = PrimFunc("g", (A, B), loop(i, 8, Store(B, A[i] * 2.0 + A[i + 1], (i,)), ForKind.VECTORIZED))
    assert text(vectorize(f)) == expect("""
        def g(A: float32[10], B: float32[10]):
          B[ramp(0, 1, 8)] = A[ramp(0, 1, 8)] * broadcast(2.0f, 8) + A[ramp(1, 1, 8)]
    """)


def test_vectorize_keeps_lane_invariant_parts_scalar_and_strides_in_the_ramp():
    C = Buffer("C", (64,), "float32")
    i, k = Var("i"), Var("k")
    f = PrimFunc("g", (A, C), loop(k, 3, loop(i, 4, Store(C, A[k] + C[i * 3 + k], (i * 3 + k,)), ForKind.VECTORIZED)))
    assert text(vectorize(f)) == expect("""
        def g(A: float32[10], C: float32[64]):
          for k in range(3):
            C[ramp(k, 3, 4)] = broadcast(A[k], 4) + C[ramp(k, 3, 4)]
    """)


def test_vectorize_a_scheduled_compute_gives_vector_loads_in_the_ir():
    X = te.placeholder((16, 16), name="X")
    Y = te.compute((16, 16), lambda i, j: te.exp(X[i, j]) * X[j, i], name="Y")
    s = te.create_schedule(Y)
    s[Y].vectorize(Y.op.axis[1])
    ir = ember.lower(s, [X, Y])
    loads = [n for n in walk(ir.body) if isinstance(n, Load)]
    assert {str(n.indices[0]) for n in loads} == {"ramp(i * 16, 1, 16)", "ramp(i, 16, 16)"}
    assert all(n.dtype.lanes == 16 for n in loads)
    assert not [n for n in walk(ir.body) if isinstance(n, For)][1:], f"the j loop should be gone:\n{ir}"


FALLBACKS = [
    ("lane-dependent branch with an else", lambda i: IfThenElse(i < 3, Store(B, A[i], (i,)), Store(B, c(0.0), (i,))),
     4, "branch on the vector lane"),
    ("all lanes store one element", lambda i: Store(B, A[i], (c(0),)), 4, "all lanes store to the same element"),
    ("allocation inside", lambda i: Allocate(Buffer("T", (1,), "float32", "local"), Store(B, A[i], (i,))), 4,
     "allocation of T inside the vectorized loop"),
    ("6 lanes around a loop", lambda i: loop(Var("k"), 2, Store(B, A[i], (i,))), 6,
     "6 lanes (not a power of two) and no masked form"),
    ("scalar load under a per-lane condition", lambda i: IfThenElse(i > 1, Store(B, A[Var("n")], (i,))), 4,
     "guards a scalar read of A"),
    ("a 64-bit lane condition in a masked tail of 32-bit stores", lambda i: IfThenElse(
        tir.Cast(tir.DType("int64"), i) > c(1, "int64"), Store(B, A[i], (i,))), 6, "mixed-width vector conditions"),
]  # fmt: skip


@pytest.mark.parametrize("name, body, lanes, reason", FALLBACKS, ids=[f[0] for f in FALLBACKS])
def test_vectorize_falls_back_to_a_scalar_loop_with_the_reason(name, body, lanes, reason):
    i = Var("i")
    out = vectorize(PrimFunc("g", (A, B), loop(i, lanes, body(i), ForKind.VECTORIZED)))
    assert isinstance(out.body, For) and out.body.kind is ForKind.SERIAL
    notes = dict(out.body.annotations)
    assert reason in notes["vectorize_fallback"]
    assert not [n for n in walk(out.body) if isinstance(n, Ramp | Broadcast)]


def test_vectorize_masks_a_tail_of_lanes():
    """A lane count that is not a power of two: the next one, its stores and loads masked to the lanes that exist;
    a branch on the lane around stores: masked stores (the loads within their buffer at constant offsets unmasked);
    a select reading on one side only: that side's loads masked by its condition."""
    i = Var("i")
    A6 = Buffer("A6", (6,), "float32")
    six = vectorize(PrimFunc("g", (A6, B), loop(i, 6, Store(B, A6[i] * c(2.0), (i,)), ForKind.VECTORIZED)))
    mask = "ramp(0, 1, 8) < broadcast(6, 8)"
    assert text(six) == expect(f"""
        def g(A6: float32[6], B: float32[10]):
          B[ramp(0, 1, 8)] = masked(A6[ramp(0, 1, 8)], {mask}) * broadcast(2.0f, 8)  # lanes where {mask}
    """)
    n = Var("n")
    tail = vectorize(PrimFunc("g", (A, B), loop(i, 4, IfThenElse((i < n) & (n > 2), Store(B, A[i] + A[c(9)], (i,))),
                                                 ForKind.VECTORIZED)))  # fmt: skip
    assert text(tail) == expect("""
        def g(A: float32[10], B: float32[10]):
          if n >= 3:
            B[ramp(0, 1, 4)] = A[ramp(0, 1, 4)] + broadcast(A[9], 4)  # lanes where ramp(0, 1, 4) < broadcast(n, 4)
    """)
    pad = vectorize(PrimFunc("g", (A, B), loop(i, 4, Store(B, tir.Select(i > n, A[i - 1], c(0.0)), (i,)),
                                                ForKind.VECTORIZED)))  # fmt: skip
    cond = "ramp(0, 1, 4) > broadcast(n, 4)"
    assert f"select({cond}, masked(A[ramp(-1, 1, 4)], {cond})" in text(pad)


def test_masked_stores_of_constant_masks_simplify():
    """Once unrolled, a masked store of no lane is dropped and one of every lane is a plain store."""
    i, j = Var("i"), Var("j")
    C = Buffer("C", (64,), "float32")
    body = loop(j, 4, loop(i, 16, IfThenElse(j * 16 + i < 21, Store(C, c(1.0), (j * 16 + i,))), ForKind.VECTORIZED),
                ForKind.UNROLLED)  # fmt: skip
    out = optimize(PrimFunc("g", (C,), body))
    assert text(out) == expect("""
        def g(C: float32[64]):
          C[ramp(0, 1, 16)] = broadcast(1.0f, 16)
          C[ramp(16, 1, 16)] = broadcast(1.0f, 16)  # lanes where ramp(16, 1, 16) < broadcast(21, 16)
    """)


def test_vectorize_selects_without_loads_under_a_lane_condition():
    C = Buffer("C", (8,), "int32")
    i = Var("i")
    f = PrimFunc("g", (C,), loop(i, 8, Store(C, tir.Select(i % 3 == 0, i * 2, c(7)), (i,)), ForKind.VECTORIZED))
    assert text(vectorize(f)) == expect("""
        def g(C: int32[8]):
          C[ramp(0, 1, 8)] = select(ramp(0, 1, 8) % broadcast(3, 8) == broadcast(0, 8), ramp(0, 2, 8), broadcast(7, 8))
    """)


def test_vectorize_branches_on_the_uniform_part_of_a_padding_condition():
    """A padded copy whose row check does not depend on the lane (`r >= 1`, a row index of a fused loop) and whose
    column check does: the select branches on the row check and masks by the column check only (a boolean
    broadcast has no mask form: the loop stayed scalar); bytes under int32 index checks narrow the mask."""
    i, r = Var("i"), Var("r")
    X, P = Buffer("X", (64,), "uint8"), Buffer("P", (80,), "uint8")
    body = Store(P, tir.Select((r % 5 >= 1) & (i >= 1), X[r * 4 + i - 1], c(0, "uint8")), (r * 16 + i,))
    out = vectorize(PrimFunc("g", (X, P), loop(i, 16, body, ForKind.VECTORIZED)))
    t = text(out)
    lane = "ramp(0, 1, 16) >= broadcast(1, 16)"
    assert t.endswith(f"= select(r % 5 >= 1, select({lane}, masked(X[ramp(r * 4 - 1, 1, 16)], {lane}), "
                      "broadcast(0, 16)), broadcast(0, 16))"), t


def test_padded_bytes_vectorize_and_match_numpy(rng):
    """The same padding end to end: a uint8 image padded by one on each side, its copy scheduled with fused rows and
    vectorized lanes; equal to numpy's pad."""
    X = te.placeholder((3, 20, 37), "uint8", name="X")
    P = te.compute((3, 22, 39), lambda b, h, w: te.if_then_else(te.all(h >= 1, h < 21, w >= 1, w < 38),
                                                                X[b, h - 1, w - 1], te.const(0, "uint8")), name="P")
    s = te.create_schedule(P)
    _, wi = s[P].split(P.op.axis[2], 16)
    s[P].vectorize(wi)
    s[P].fuse(P.op.axis[0], P.op.axis[1])
    f = ember.build(s, [X, P], target="c")
    assert "not vectorized" not in f.source
    x = rng.integers(0, 256, (3, 20, 37)).astype(np.uint8)
    y = np.empty((3, 22, 39), np.uint8)
    f(x, y)
    np.testing.assert_array_equal(y, np.pad(x, ((0, 0), (1, 1), (1, 1))))


# ---------------------------------------------------------------------------------------------
# unroll


def test_unroll_replicates_the_body_with_constant_indices():
    i, j = Var("i"), Var("j")
    C = Buffer("C", (3, 2), "float32")
    f = PrimFunc("u", (C,), loop(i, 3, loop(j, 2, Store(C, c(1.0), (i, j))), ForKind.UNROLLED, lo=0))
    assert text(unroll_loops(f)) == expect("""
        def u(C: float32[3, 2]):
          for j in range(2):
            C[0, j] = 1.0f
          for j in range(2):
            C[1, j] = 1.0f
          for j in range(2):
            C[2, j] = 1.0f
    """)


def test_unroll_keeps_big_loops_as_loops():
    i = Var("i")
    big = PrimFunc("u", (A,), loop(i, 100, Store(A, c(1.0), (i % 10,)), ForKind.UNROLLED))
    assert text(unroll_loops(big)) == text(big)


def test_unroll_of_a_scheduled_reduction_in_the_ir():
    X = te.placeholder((4, 3), name="X")
    k = te.reduce_axis((0, 3), name="k")
    Y = te.compute((4,), lambda i: te.sum(X[i, k], axis=k), name="Y")
    s = te.create_schedule(Y)
    s[Y].unroll(k)
    assert str(ember.lower(s, [X, Y])) == expect("""
        def default_function(X: float32[4, 3], Y: float32[4]):
          for i in range(4):
            Y[i] = 0.0f
            Y[i] = Y[i] + X[i * 3]
            Y[i] = Y[i] + X[i * 3 + 1]
            Y[i] = Y[i] + X[i * 3 + 2]
    """)


def test_walk_unique_visits_a_shared_node_once():
    """An expression read twice at every level (an inlined stage read by an inlined stage...) is a DAG of 41 nodes
    and a tree of 2^41 - 1: walk(unique=True) visits the 41, so searches over inlined bodies stay linear."""
    e = Var("x")
    for _ in range(40):
        e = e + e
    nodes = list(walk(e, unique=True))
    assert len(nodes) == 41 and nodes[0] is e
    assert sum(1 for _ in zip(range(1000), walk(e))) == 1000  # the plain walk still visits every use
