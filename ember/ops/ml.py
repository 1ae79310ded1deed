"""Classical-ML operators: TfIdfVectorizer (ai.onnx), the ai.onnx.ml ops Binarizer and ArrayFeatureExtractor,
and TreeWalk (decision tree ensembles as tables, which the frontend makes of ai.onnx.ml's tree ensembles)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ember import te
from ember.graph.dims import dim_product
from ember.graph.types import TensorType
from ember.ops.common import ShapeError
from ember.ops.elemwise import astype, const_like
from ember.ops.opdef import Attr, Pattern, op
from ember.ops.te_lib import NotLowerable, elemwise, lowering
from ember.te.tensor import prod_hint
from ember.tir import expr as tx

# -- TfIdfVectorizer ----------------------------------------------------------------------------------
TFIDF_ATTRS = [
    Attr("max_gram_length", "int"), Attr("max_skip_count", "int"), Attr("min_gram_length", "int"),
    Attr("mode", "str"), Attr("ngram_counts", "ints"), Attr("ngram_indexes", "ints"),
    Attr("pool_int64s", "ints", ()), Attr("pool_strings", "strs", ()), Attr("weights", "floats", ()),
]  # fmt: skip


def _tfidf_infer(a: dict, x: TensorType) -> TensorType:
    width = max(a["ngram_indexes"]) + 1
    return TensorType((width,) if x.rank == 1 else (x.shape[0], width), "float32")


def _ngram_table(a: dict) -> dict[tuple[int, ...], int]:
    """n-gram (tuple of ids) -> output column."""
    pool, starts = a["pool_int64s"], list(a["ngram_counts"]) + [len(a["pool_int64s"])]
    table, k = {}, 0
    for n, (lo, hi) in enumerate(zip(starts, starts[1:]), start=1):
        for i in range(lo, hi, n):
            table[tuple(pool[i : i + n])] = a["ngram_indexes"][k]
            k += 1
    return table


@op("TfIdfVectorizer", Pattern.OPAQUE, infer=_tfidf_infer, attrs=TFIDF_ATTRS)
def tfidf_vectorizer(a: dict, x: np.ndarray) -> np.ndarray:
    """Count pool n-grams (items skip+1 apart, skip <= max_skip_count); TF, IDF or TFIDF."""
    table = _ngram_table(a)
    width = max(a["ngram_indexes"]) + 1
    rows = x.reshape(1, -1) if x.ndim == 1 else x
    out = np.zeros((rows.shape[0], width), np.float32)
    for r, row in enumerate(rows.tolist()):
        for n in range(max(a["min_gram_length"], 1), a["max_gram_length"] + 1):
            for skip in range(a["max_skip_count"] + 1 if n > 1 else 1):
                step = skip + 1
                for i in range(len(row) - (n - 1) * step):
                    col = table.get(tuple(row[i : i + (n - 1) * step + 1 : step]))
                    if col is not None:
                        out[r, col] += 1
    weights = np.array(a["weights"], np.float32) if a["weights"] else np.ones(width, np.float32)
    if a["mode"] == "IDF":
        out = (out > 0) * weights
    elif a["mode"] == "TFIDF":
        out = out * weights
    return out.reshape(_tfidf_infer(a, TensorType.of(x)).shape).astype(np.float32)


TFIDF_TERM_LIMIT = 1024  # pool n-gram items a TfIdfVectorizer kernel spells out as comparisons


@lowering("TfIdfVectorizer")
def _(a: dict, x: te.Tensor) -> te.Tensor:
    """out[r, c] counts, over skips s and start positions i, the pool n-grams of column c found at
    x[r, i], x[r, i + s + 1], ...: every pool n-gram is a chain of comparisons with constants."""
    if a["pool_strings"] or not x.dtype.is_int or x.ndim not in (1, 2):
        raise NotLowerable("TfIdfVectorizer over strings (or not 1-d/2-d integers)")
    table = _ngram_table(a)
    if sum(len(g) for g in table) > TFIDF_TERM_LIMIT:
        raise NotLowerable(f"TfIdfVectorizer with a pool of {len(table)} n-grams")
    width, length = max(a["ngram_indexes"]) + 1, x.shape[-1]
    lo, hi = max(a["min_gram_length"], 1), a["max_gram_length"]
    s = te.reduce_axis((0, a["max_skip_count"] + 1), name="s")
    i = te.reduce_axis((0, max(length, 1)), name="i")

    def item(r, pos: tx.Expr) -> tx.Expr:
        pos = te.minimum(pos, length - 1)  # in bounds; the count only takes positions below length
        return x[(r, pos) if x.ndim == 2 else (pos,)]

    def count(r, c) -> tx.Expr:
        terms = []
        for gram, col in table.items():
            n = len(gram)
            if not lo <= n <= hi or length == 0:
                continue
            step = s.var + 1
            conds = [c == col, i.var + (n - 1) * step < length] + ([s.var == 0] if n == 1 else [])
            items = [item(r, i.var + t * step) for t in range(n)]
            conds += [it == const_like(v, it) for it, v in zip(items, gram)]
            terms.append(te.if_then_else(te.all(*conds), te.const(1.0), te.const(0.0)))
        total = terms[0] if terms else te.const(0.0)
        for t in terms[1:]:
            total = total + t
        return te.sum(total, axis=[s, i])

    shape = (width,) if x.ndim == 1 else (x.shape[0], width)
    counts = te.compute(shape, lambda *o: count(o[0] if x.ndim == 2 else 0, o[-1]), name="tfidf_count")
    if a["mode"] == "TF":
        return counts
    weights = a["weights"] or (1.0,) * width

    def weighted(*o):
        c, w = o[-1], te.const(0.0)
        for col, wc in enumerate(weights):
            w = te.if_then_else(c == col, te.const(float(np.float32(wc))), w)
        v = counts[o]
        return te.if_then_else(v > 0.0, w, te.const(0.0)) if a["mode"] == "IDF" else v * w

    return te.compute(shape, weighted, name="tfidf")


# -- ai.onnx.ml -----------------------------------------------------------------------------------------
@op("Binarizer", Pattern.ELEMWISE, infer=lambda a, x: x, attrs=[Attr("threshold", "float", 0.0)])
def binarizer(a: dict, x: np.ndarray) -> np.ndarray:
    return (x > a["threshold"]).astype(x.dtype)


@lowering("Binarizer")
def _(a: dict, x: te.Tensor) -> te.Tensor:
    if x.dtype.is_bool:
        raise NotLowerable("Binarizer on bool")
    return elemwise(lambda v: astype(v > a["threshold"], v.dtype), x, name="binarizer")


def _afe_infer(a: dict, x: TensorType, idx: TensorType) -> TensorType:
    lead = x.shape[:-1] if x.rank > 1 else (1,)
    return x.with_shape(lead + (dim_product(idx.shape),))


@op("ArrayFeatureExtractor", Pattern.INJECTIVE, infer=_afe_infer, inputs=(2, 2))
def array_feature_extractor(a: dict, x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Columns `idx` of the last axis."""
    out = np.take(x, idx.reshape(-1).astype(np.int64), axis=-1)
    return out.reshape(_afe_infer(a, TensorType.of(x), TensorType.of(idx)).shape)


@lowering("ArrayFeatureExtractor")
def _(a: dict, x: te.Tensor, idx: te.Tensor) -> te.Tensor:
    """out[.., j] = x[.., idx.flat[j]]; negative indices count from the end, as np.take's (out-of-range ones,
    which the reference rejects, are clamped)."""
    n, count = x.shape[-1], dim_product(idx.shape)
    lead = x.shape[:-1] if x.ndim > 1 else (1,)

    def body(*i):
        j, flat = i[-1], []
        for d in reversed(range(idx.ndim)):
            flat.append(j % idx.shape[d] if d else j)
            j = j // idx.shape[d]
        v = te.cast(idx[tuple(reversed(flat))], "int64")
        v = te.if_then_else(v < 0, v + n, v)
        v = te.minimum(te.maximum(v, te.const(0, "int64")), te.const(max(n - 1, 0), "int64"))
        return x[(*i[:-1], v) if x.ndim > 1 else (v,)]

    return te.compute(lead + (count,), body, name="array_feature_extractor")


# -- support vector machines ---------------------------------------------------------------------------------
@op("PairwiseCoupling", Pattern.OPAQUE, infer=lambda a, r: r.with_shape((r.shape[0], a["classes"])),
    attrs=[Attr("classes", "int")])  # fmt: skip
def pairwise_coupling(a: dict, r: np.ndarray) -> np.ndarray:
    """Class probabilities [N, k] from pairwise ones [N, k(k-1)/2] (r_ij, i < j, in that order): libsvm's
    `multiclass_probability` (Wu, Lin and Weng's second method, as onnxruntime's SVMClassifier runs it), rows in
    step, each stopping where it has converged. No native kernel: its iterations stop on the data."""
    k, n = a["classes"], r.shape[0]
    if r.shape[1] != k * (k - 1) // 2:
        raise ShapeError(f"PairwiseCoupling of {k} classes takes {k * (k - 1) // 2} pairs, got {r.shape[1]}")
    R = np.zeros((n, k, k))
    i, j = np.triu_indices(k, 1)
    R[:, i, j], R[:, j, i] = r, 1 - r
    Q = -R.transpose(0, 2, 1) * R  # Q[t, s] = -r_st r_ts
    Q[:, np.arange(k), np.arange(k)] = (R**2).sum(axis=1) - R[:, np.arange(k), np.arange(k)] ** 2
    P = np.full((n, k), 1.0 / k)
    active = np.ones(n, bool)
    for _ in range(max(100, k)):
        Qp = np.einsum("nts,ns->nt", Q, P)
        pQp = (P * Qp).sum(axis=1)
        active &= np.abs(Qp - pQp[:, None]).max(axis=1) >= 0.005 / k
        if not active.any():
            break
        for t in range(k):
            diff = np.where(active, (pQp - Qp[:, t]) / Q[:, t, t], 0.0)
            P[:, t] += diff
            pQp = (pQp + diff * (diff * Q[:, t, t] + 2 * Qp[:, t])) / (1 + diff) ** 2
            P /= (1 + diff)[:, None]
            Qp = (Qp + diff[:, None] * Q[:, t, :]) / (1 + diff)[:, None]
    return P.astype(r.dtype)


# -- decision trees --------------------------------------------------------------------------------------
def _tree_walk_infer(a: dict, x: TensorType, roots, feature, split, nxt, values: TensorType) -> TensorType:
    if x.rank != 2 or values.rank != 2 or nxt.rank != 2 or nxt.shape[1] != 2:
        raise ShapeError(f"TreeWalk takes x [N, F], tables of nodes and next [M, 2], values [L, K]; got x {x}, "
                         f"next {nxt}, values {values}")  # fmt: skip
    return TensorType((x.shape[0], values.shape[1]), values.dtype)


@op("TreeWalk", Pattern.OPAQUE, infer=_tree_walk_infer, inputs=(6, 6),
    attrs=[Attr("depth", "int"), Attr("leaves", "int"), Attr("aggregate", "str", "sum")])  # fmt: skip
def tree_walk(a: dict, x: np.ndarray, roots, feature, split, nxt, values: np.ndarray) -> np.ndarray:
    """Decision trees as one table of nodes (the frontend's `onnx_ml.Forest`): from each tree's root, `depth`
    steps of node = next[node, 0] if x[row, feature[node]] <= split[node] else next[node, 1] (NaN: the second); a
    leaf is a node >= `leaves` that steps to itself. The output sums (or takes the min, the max of) the leaves'
    rows of `values` over the trees: [N, K]."""
    node = np.broadcast_to(roots.astype(np.int64), (x.shape[0], roots.size))
    rows = np.arange(x.shape[0])[:, None]
    for _ in range(a["depth"]):
        node = np.where(x[rows, feature[node]] <= split[node], nxt[node, 0], nxt[node, 1])
    reduce = {"sum": np.sum, "min": np.min, "max": np.max}[a["aggregate"]]
    out = np.zeros((x.shape[0], values.shape[1]), np.float64)
    for start in range(0, x.shape[0], 256):  # (a block of rows at a time: [rows, trees, K] gathered)
        out[start : start + 256] = reduce(values[node[start : start + 256] - a["leaves"]].astype(np.float64), axis=1)
    return out.astype(values.dtype)


TREES_AT_ONCE = 8  # trees whose walks interleave (independent chains of gathers)


def _schedule_tree_walk(attrs: dict, outs: Sequence[te.Tensor], target) -> te.Schedule:
    """Rows in blocks of a vector's lanes (parallel over blocks where there are enough rows); in a block,
    TREES_AT_ONCE trees walk every level together (independent chains of gathers), so that their nodes stay in
    cache."""
    out = outs[0]
    s = te.create_schedule(list(outs))
    rows = max(1, target.vector_lanes(32))
    ro, ri = s[out].split(out.op.axis[0], rows)
    tree, tree_in = s[out].split(out.op.reduce_axis[0], TREES_AT_ONCE)
    s[out].reorder(ro, tree, ri, out.op.axis[1], tree_in)
    for st in s.stages:
        if st.is_placeholder or st.op.tag != "tree_level":
            continue  # (small constant tables are stages of their own)
        st.compute_at(s[out], tree)
        st.reorder(st.op.axis[1], st.op.axis[0])
        st.vectorize(st.op.axis[0])
    if target.num_cores > 1 and prod_hint(out.op.shape[:1]) >= 4 * rows:
        s[out].parallel(ro)
    return s


@lowering("TreeWalk", schedule=_schedule_tree_walk)
def _(a: dict, x: te.Tensor, roots, feature, split, nxt, values: te.Tensor) -> te.Tensor:
    n, trees = x.shape[0], roots.shape[0]
    node = te.compute((n, trees), lambda r, t: roots[t], name="tree_roots", tag="tree_level")
    for level in range(1, a["depth"] + 1):

        def step(r, t, prev=node):
            i = prev[r, t]
            return nxt[i, te.if_then_else(x[r, feature[i]] <= split[i], te.const(0, "int32"), te.const(1, "int32"))]

        node = te.compute((n, trees), step, name=f"tree_level{level}", tag="tree_level")
    t = te.reduce_axis((0, trees), name="tree")
    reduce = {"sum": te.sum, "min": te.min, "max": te.max}[a["aggregate"]]
    return te.compute((n, values.shape[1]), lambda r, k: reduce(values[node[r, t] - a["leaves"], k], axis=t),
                      name="tree_scores", tag="tree_walk")  # fmt: skip
