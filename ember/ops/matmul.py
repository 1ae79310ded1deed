"""Matrix products: MatMul, MatMulInteger, Gemm, MatMulPackedB, Einsum, and Det (entries,
references, TE computes on the GEMM template of `ember.templates.nn`).

References accumulate in float64 for float inputs (int64 for integers)."""

from __future__ import annotations

import itertools
import math

import numpy as np

from ember import te
from ember.graph.types import TensorType
from ember.ops.common import ShapeError, acc_array, broadcast_shapes
from ember.ops.opdef import Attr, Pattern, op
from ember.ops.rows import RowStats
from ember.ops.te_lib import NotLowerable, broadcast_indices, lowering
from ember.te.config import CONFIG_ATTR
from ember.te.tensor import Tensor
from ember.templates import nn as T
from ember.tir.dtype import dtype as as_dtype

OUT = Pattern.OUT_ELEMWISE_FUSABLE

# -- matrix products ---------------------------------------------------------------------------------
def matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """numpy.matmul output shape (1-d operands promoted and the added axis removed)."""
    if not a or not b:
        raise ShapeError("MatMul operands must have rank >= 1")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ShapeError(f"MatMul inner dims differ: {list(a)} @ {list(b)}")
    out = broadcast_shapes(a2[:-2], b2[:-2]) + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def _matmul_infer(a: dict, x: TensorType, y: TensorType) -> TensorType:
    if x.dtype != y.dtype:
        raise ShapeError(f"MatMul operands must have one dtype, got {x.dtype} and {y.dtype}")
    return TensorType(matmul_shape(x.shape, y.shape), x.dtype)


@op("MatMul", OUT, infer=_matmul_infer, inputs=(2, 2))
def matmul(a: dict, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.matmul(acc_array(x), acc_array(y)).astype(x.dtype)


def matmul_te(x: Tensor, y: Tensor | None, dtype=None, pre_x=None, pre_y=None, post=None, name: str = "matmul",
              cfg=None, packed_b: Tensor | None = None, n: int = 0) -> Tensor:  # fmt: skip
    """numpy.matmul of x and y through the GEMM template: 1-d operands promoted, batch dims broadcast.

    pre_x/pre_y map an operand element (and its row index i / column index j) to the accumulation
    dtype (casts, zero points); post(v, i, j) is the epilogue on each accumulated element. With
    `packed_b` (panels [n / nr, K, nr] of a 2-d B with n columns, see `MatMulPackedB`) y is None."""
    xs = x.shape
    ys = y.shape if packed_b is None else (packed_b.shape[1], n)
    a1, b1 = len(xs) == 1, len(ys) == 1
    x2 = (1,) + xs if a1 else xs
    y2 = ys + (1,) if b1 else ys
    (M, K), N = x2[-2:], y2[-1]
    abatch, bbatch = x2[:-2], y2[:-2]
    batch = broadcast_shapes(abatch, bbatch)
    nb = len(batch)
    dtype = as_dtype(dtype) if dtype is not None else x.dtype
    half = dtype if dtype.is_half else None
    if half is not None:  # float16/bfloat16 products accumulate in float32 (as numpy's and onnxruntime's do)
        dtype = as_dtype("float32")
        pre_x = pre_x or (lambda v, i: te.cast(v, "float32"))
        pre_y = pre_y or (lambda v, j: te.cast(v, "float32"))
    pre_x = pre_x or (lambda v, i: v)
    pre_y = pre_y or (lambda v, j: v)

    def xa(ab, i, k):  # x's element, ab indexing x's own batch dims
        return pre_x(x[k] if a1 else x[tuple(ab) + (i, k)], i)

    def yb(bb, k, j):
        return pre_y(y[k] if b1 else y[tuple(bb) + (k, j)], j)

    def a_batch(bi):
        return broadcast_indices(bi, abatch, nb)

    def b_batch(bi):
        return broadcast_indices(bi, bbatch, nb)

    # few columns and many rows: compute the transpose (B^T A^T), so that vectors run along the rows
    lanes = T.lanes_of(dtype, T.host_target())
    swap = packed_b is None and not (a1 or b1) and te.size_hint(N) < lanes <= te.size_hint(M) // 2
    if packed_b is not None:
        acc = T.gemm_acc(batch, M, N, K, lambda bi, i, k: xa(a_batch(bi), i, k), None, (), lambda bi: (), dtype,
                         name=f"{name}_acc", cfg=cfg, packed_b=packed_b)  # fmt: skip
    elif swap:
        acc = T.gemm_acc(batch, N, M, K, lambda bi, j, k: yb(b_batch(bi), k, j), lambda ab, k, i: xa(ab, i, k),
                         abatch, a_batch, dtype, name=f"{name}_acc", cfg=cfg)  # fmt: skip
    else:
        acc = T.gemm_acc(batch, M, N, K, lambda bi, i, k: xa(a_batch(bi), i, k), yb, bbatch, b_batch, dtype,
                         name=f"{name}_acc", cfg=cfg)  # fmt: skip

    def out(*idx):
        i = te.const(0) if a1 else idx[nb]
        j = te.const(0) if b1 else idx[-1]
        v = acc[tuple(idx[:nb]) + ((j, i) if swap else (i, j))]
        v = post(v, i, j) if post else v
        return te.cast(v, half) if half is not None else v

    i_axis = None if a1 else nb
    j_axis = None if b1 else nb + (0 if a1 else 1)
    if swap:
        i_axis, j_axis = j_axis, i_axis
    attrs = {} if a1 and b1 else {"template": "gemm", "acc": acc, "i_axis": i_axis, "j_axis": j_axis}
    return te.compute(matmul_shape(xs, ys), out, name=name, attrs=attrs)


@lowering("MatMul", schedule=T.schedule_nn)
def _matmul_compute(a: dict, x: Tensor, y: Tensor) -> Tensor:
    return matmul_te(x, y, cfg=a.get(CONFIG_ATTR))


def _matmul_int_infer(a: dict, x: TensorType, y: TensorType, *zps) -> TensorType:
    return TensorType(matmul_shape(x.shape, y.shape), "int32")


@op("MatMulInteger", OUT, infer=_matmul_int_infer, inputs=(2, 4))
def matmul_integer(a: dict, x, y, x_zp=None, y_zp=None) -> np.ndarray:
    """Integer matmul with zero points (per tensor, per row of A or per column of B)."""
    xz = 0 if x_zp is None else x_zp.astype(np.int64)
    xz = xz.reshape(-1, 1) if np.ndim(xz) and np.size(xz) > 1 else xz
    yz = 0 if y_zp is None else y_zp.astype(np.int64)
    xi, yi = x.astype(np.int64) - xz, y.astype(np.int64) - yz
    return np.matmul(xi, yi).astype(np.int32)


def _zp_at(zp: Tensor | None, i):
    """A zero point as int32: per tensor, or the entry for index i (per row / per column)."""
    if zp is None:
        return None
    per = math.prod(zp.shape) > 1
    return te.cast(zp[(i if per else 0,) * zp.ndim] if zp.ndim else zp[()], "int32")


@lowering("MatMulInteger", schedule=T.schedule_nn)
def _matmul_integer_compute(a: dict, x: Tensor, y: Tensor, x_zp=None, y_zp=None) -> Tensor:
    def pre(zp):
        return lambda v, i: te.cast(v, "int32") - _zp_at(zp, i) if zp is not None else te.cast(v, "int32")

    return matmul_te(x, y, dtype="int32", pre_x=pre(x_zp), pre_y=pre(y_zp), name="matmul_integer")


def _gemm_infer(a: dict, x: TensorType, y: TensorType, c: TensorType | None = None) -> TensorType:
    if x.rank != 2 or y.rank != 2:
        raise ShapeError(f"Gemm needs 2-d operands, got {x} and {y}")
    m, k = x.shape[::-1] if a["transA"] else x.shape
    k2, n = y.shape[::-1] if a["transB"] else y.shape
    if k != k2:
        raise ShapeError(f"Gemm inner dims differ: {x} (transA={a['transA']}) and {y} (transB={a['transB']})")
    if c is not None and broadcast_shapes(c.shape, (m, n)) != (m, n):
        raise ShapeError(f"Gemm C {c} does not broadcast to [{m}, {n}]")
    return TensorType((m, n), x.dtype)


@op(
    "Gemm",
    OUT,
    infer=_gemm_infer,
    inputs=(2, 3),
    attrs=[Attr("alpha", "float", 1.0), Attr("beta", "float", 1.0), Attr("transA", "int", 0), Attr("transB", "int", 0)],
)
def gemm(a: dict, x, y, c=None) -> np.ndarray:
    """alpha * op(A) @ op(B) + beta * C."""
    xa = acc_array(x).T if a["transA"] else acc_array(x)
    yb = acc_array(y).T if a["transB"] else acc_array(y)
    out = a["alpha"] * (xa @ yb)
    if c is not None:
        out = out + a["beta"] * acc_array(c)
    return out.astype(x.dtype)


@lowering("Gemm", schedule=T.schedule_nn)
def _gemm_compute(a: dict, x: Tensor, y: Tensor, c: Tensor | None = None) -> Tensor:
    alpha, beta = a["alpha"], a["beta"]
    xt = te.compute(x.shape[::-1], lambda i, k: x[k, i], name="a_t") if a["transA"] else x
    yt = te.compute(y.shape[::-1], lambda k, j: y[j, k], name="b_t") if a["transB"] else y
    exact = x.dtype.is_float

    def post(v, i, j):
        if alpha != 1.0:
            v = v * alpha if exact else te.cast(te.cast(v, "float64") * alpha, v.dtype)
        if c is not None and beta != 0.0:
            cv = c[broadcast_indices((i, j), c.shape, 2)]
            v = v + (cv * beta if exact else te.cast(te.cast(cv, "float64") * beta, v.dtype)) if beta != 1.0 else v + cv
        return v

    m, k = xt.shape
    if a["transB"] and te.size_hint(m) < 8 and k >= 2 * T.lanes_of(x.dtype, T.host_target()):
        return _dot_rows_te(xt, y, post, "gemm")  # a fully connected layer: rows of W are contiguous
    return matmul_te(xt, yt, post=post, name="gemm", cfg=a.get(CONFIG_ATTR))


def _packed_b_infer(a: dict, x: TensorType, w: TensorType, c: TensorType | None = None) -> TensorType:
    if x.rank < 2 or w.rank != 3 or x.dtype != w.dtype:
        raise ShapeError(f"MatMulPackedB needs x [..., M, K] and panels [N/nr, K, nr] of one dtype, got {x} and {w}")
    panels, k, nr = w.shape
    if x.shape[-1] != k or not (panels - 1) * nr < a["n"] <= panels * nr:
        raise ShapeError(f"MatMulPackedB: x {x} and panels {w} do not make a [{x.shape[-1]}, {a['n']}] B")
    out = (*x.shape[:-1], a["n"])
    if c is not None and broadcast_shapes(c.shape, out) != out:
        raise ShapeError(f"MatMulPackedB: C {c} does not broadcast to {list(out)}")
    return TensorType(out, x.dtype)


def unpack_b(w: np.ndarray, n: int) -> np.ndarray:
    """The 2-d B [K, n] of panels w [n / nr, K, nr]."""
    panels, k, nr = w.shape
    return w.transpose(1, 0, 2).reshape(k, panels * nr)[:, :n]


def pack_b(b: np.ndarray, nr: int) -> np.ndarray:
    """Panels [ceil(N / nr), K, nr] of a 2-d B [K, N], zeros past N (the layout the GEMM template reads)."""
    k, n = b.shape
    panels = -(-n // nr)
    padded = np.zeros((k, panels * nr), dtype=b.dtype)
    padded[:, :n] = b
    return np.ascontiguousarray(padded.reshape(k, panels, nr).transpose(1, 0, 2))


@op("MatMulPackedB", OUT, infer=_packed_b_infer, inputs=(2, 3),
    attrs=[Attr("n", "int"), Attr("alpha", "float", 1.0), Attr("beta", "float", 1.0)])  # fmt: skip
def matmul_packed_b(a: dict, x: np.ndarray, w: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
    """alpha * x @ B + beta * C, with the constant B [K, n] given packed in column panels (`pack_b`), as
    `ember.passes.pack` leaves MatMul and Gemm by weights: the packing is done once, at compile time."""
    out = a["alpha"] * np.matmul(acc_array(x), acc_array(unpack_b(w, a["n"])))
    if c is not None:
        out = out + a["beta"] * acc_array(c)
    return out.astype(x.dtype)


@lowering("MatMulPackedB", schedule=T.schedule_nn)
def _matmul_packed_b_compute(a: dict, x: Tensor, w: Tensor, c: Tensor | None = None) -> Tensor:
    alpha, beta = a["alpha"], a["beta"]
    rank = len(x.shape)

    def post(v, i, j):
        if alpha != 1.0:
            v = v * alpha
        if c is not None and beta != 0.0:
            cv = c[broadcast_indices((i, j), c.shape, 2)] if len(c.shape) <= 1 or rank == 2 else None
            if cv is None:
                raise NotLowerable("MatMulPackedB: C must be at most 2-d with a 2-d x")
            v = v + (cv * beta if beta != 1.0 else cv)
        return v

    return matmul_te(x, None, post=post, name="dense", cfg=a.get(CONFIG_ATTR), packed_b=w, n=a["n"])


def _dot_rows_te(x: Tensor, w: Tensor, post, name: str) -> Tensor:
    """x @ w^T for few rows of x: each output a dot product of two contiguous rows (vectorized partial
    sums of the row template), so w streams once along its rows instead of across them."""
    (m, k), n = x.shape, w.shape[0]
    st = RowStats((m, n, k), (2,))
    dot = st.reduce(lambda i: x[i[0], i[2]] * w[i[1], i[2]], te.sum, x.dtype, f"{name}_dot")
    return te.compute((m, n), lambda i, j: post(dot((i, j, 0)), i, j), name=name, attrs={"template": "rows", "rows": 2})


def _einsum_infer(a: dict, *ts: TensorType) -> TensorType:
    dummies = [np.broadcast_to(np.zeros((), np.float32), t.shape) for t in ts]
    return TensorType(np.einsum(a["equation"], *dummies).shape, ts[0].dtype)


@op("Einsum", OUT, infer=_einsum_infer, inputs=(1, None), attrs=[Attr("equation", "str")])
def einsum(a: dict, *xs: np.ndarray) -> np.ndarray:
    return np.einsum(a["equation"], *[acc_array(x) for x in xs]).astype(xs[0].dtype)


def _einsum_terms(equation: str, shapes: list[tuple[int, ...]]) -> tuple[list[list], list]:
    """Labels of each operand and of the output; the dims an ellipsis covers become labels
    ("...", k), k counting from the right, so broadcasting aligns them."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise NotLowerable(f"Einsum {equation!r}: {len(terms)} terms for {len(shapes)} operands")
    ell = 0
    labels = []
    for term, shape in zip(terms, shapes):
        head, dots, tail = term.partition("...")
        n = len(shape) - len(head) - len(tail) if dots else 0
        ell = max(ell, n)
        labels.append(list(head) + [("...", n - 1 - k) for k in range(n)] + list(tail))
    if arrow:
        head, dots, tail = rhs.partition("...")
        out = list(head) + ([("...", ell - 1 - k) for k in range(ell)] if dots else []) + list(tail)
    else:
        letters = [c for t in labels for c in t if isinstance(c, str)]
        out = [("...", ell - 1 - k) for k in range(ell)] + sorted(c for c in set(letters) if letters.count(c) == 1)
    return labels, out


@lowering("Einsum", schedule=T.schedule_nn)
def _einsum_compute(a: dict, *xs: Tensor) -> Tensor:
    """out[out labels] = sum over the other labels of the product of the operands (size-1 dims
    broadcast); a batched matrix product of two operands goes through the GEMM template."""
    labels, out = _einsum_terms(a["equation"], [x.shape for x in xs])
    size: dict = {}
    for lab, x in zip(labels, xs):
        for c, n in zip(lab, x.shape):
            size[c] = max(size.get(c, 1), n)
    mm = _einsum_matmul(labels, out, xs, size)
    if mm is not None:
        return mm
    red = [c for c in size if c not in out]
    raxes = {c: te.reduce_axis((0, size[c]), name=f"r{i}") for i, c in enumerate(red)}

    def body(*idx):
        env = dict(zip(out, idx)) | raxes
        v = None
        for lab, x in zip(labels, xs):
            e = x[tuple(te.const(0) if n == 1 and size[c] > 1 else env[c] for c, n in zip(lab, x.shape))]
            v = e if v is None else v * e
        return te.sum(v, axis=list(raxes.values())) if raxes else v

    return te.compute(tuple(size[c] for c in out), body, name="einsum")


def _einsum_matmul(labels, out, xs, size) -> Tensor | None:
    """`...ij,...jk->...ik`-like equations (one row, one column and one summed label at most, no
    repeated or broadcast labels, output in batch-row-column order) as matmul_te."""
    if len(xs) != 2 or any(len(set(lab)) != len(lab) for lab in labels):
        return None
    a, b = labels
    if any(n != size[c] for lab, x in zip(labels, xs) for c, n in zip(lab, x.shape)):
        return None
    batch = [c for c in out if c in a and c in b]
    rows = [c for c in a if c not in b and c in out]
    cols = [c for c in b if c not in a and c in out]
    red = [c for c in a if c in b and c not in out]
    if len(rows) > 1 or len(cols) > 1 or len(red) != 1 or out != batch + rows + cols:
        return None
    if set(a) != set(batch + rows + red) or set(b) != set(batch + cols + red):
        return None

    def view(x, lab, order, name):
        shape = tuple(size[c] for c in order)
        return te.compute(shape, lambda *i: x[tuple(i[order.index(c)] for c in lab)], name=name)

    xa = view(xs[0], a, batch + rows + red, "einsum_a")
    xb = view(xs[1], b, batch + red + cols, "einsum_b")
    if not rows:
        xa = te.compute(xa.shape[:-1] + (1,) + xa.shape[-1:], lambda *i: xa[i[:-2] + i[-1:]], name="einsum_a1")
    if not cols:
        xb = te.compute(xb.shape + (1,), lambda *i: xb[i[:-1]], name="einsum_b1")
    y = matmul_te(xa, xb, name="einsum_mm")
    shape = tuple(size[c] for c in out)
    if y.shape == shape:
        return y
    return None


def _det_infer(a: dict, x: TensorType) -> TensorType:
    if x.rank < 2 or x.shape[-1] != x.shape[-2]:
        raise ShapeError(f"Det needs square matrices, got {x}")
    return x.with_shape(x.shape[:-2])


@op("Det", Pattern.OPAQUE, infer=_det_infer)
def det(a: dict, x: np.ndarray) -> np.ndarray:
    return np.linalg.det(acc_array(x)).astype(x.dtype)


DET_MAX = 4  # the Leibniz sum has n! terms


@lowering("Det", schedule=T.schedule_nn)
def _det_compute(a: dict, x: Tensor) -> Tensor:
    """Leibniz's formula (a signed sum over permutations), in float64, for matrices up to 4 x 4;
    LU with pivoting is sequential and data-dependent: larger matrices run by reference."""
    n = x.shape[-1]
    if n > DET_MAX or not x.dtype.is_float:
        raise NotLowerable(f"Det of {n} x {n} {x.dtype} matrices (native up to {DET_MAX} x {DET_MAX})")
    terms = []
    for perm in itertools.permutations(range(n)):
        inversions = sum(perm[i] > perm[j] for i in range(n) for j in range(i + 1, n))
        terms.append((-1.0 if inversions % 2 else 1.0, perm))

    def body(*b):
        total = te.const(0.0, "float64")
        for sign, perm in terms:
            term = te.const(sign, "float64")
            for r, col in enumerate(perm):
                term = term * te.cast(x[b + (r, col)], "float64")
            total = total + term
        return te.cast(total, x.dtype)

    return te.compute(x.shape[:-2], body, name="det")
