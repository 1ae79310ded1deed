"""Classical-ML operators: TfIdfVectorizer (ai.onnx) and the ai.onnx.ml ops Binarizer,
ArrayFeatureExtractor, TreeEnsemble."""

from __future__ import annotations

import numpy as np

from ember import te
from ember.graph.types import TensorType
from ember.ops.elemwise import astype, const_like
from ember.ops.opdef import Attr, Pattern, op
from ember.ops.te_lib import NotLowerable, elemwise, lowering
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
    return x.with_shape(lead + (idx.size,))


@op("ArrayFeatureExtractor", Pattern.INJECTIVE, infer=_afe_infer, inputs=(2, 2))
def array_feature_extractor(a: dict, x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Columns `idx` of the last axis."""
    out = np.take(x, idx.reshape(-1).astype(np.int64), axis=-1)
    return out.reshape(_afe_infer(a, TensorType.of(x), TensorType.of(idx)).shape)


@lowering("ArrayFeatureExtractor")
def _(a: dict, x: te.Tensor, idx: te.Tensor) -> te.Tensor:
    """out[.., j] = x[.., idx.flat[j]]; negative indices count from the end, as np.take's (out-of-range ones,
    which the reference rejects, are clamped)."""
    n, count = x.shape[-1], int(np.prod(idx.shape, dtype=np.int64))
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


TREE_ATTRS = [
    Attr("aggregate_function", "int", 1), Attr("leaf_targetids", "ints"), Attr("leaf_weights", "tensor"),
    Attr("membership_values", "tensor", None), Attr("n_targets", "int"), Attr("nodes_falseleafs", "ints"),
    Attr("nodes_falsenodeids", "ints"), Attr("nodes_featureids", "ints"), Attr("nodes_hitrates", "tensor", None),
    Attr("nodes_missing_value_tracks_true", "ints", ()), Attr("nodes_modes", "tensor"), Attr("nodes_splits", "tensor"),
    Attr("nodes_trueleafs", "ints"), Attr("nodes_truenodeids", "ints"), Attr("post_transform", "int", 0),
    Attr("tree_roots", "ints"),
]  # fmt: skip

_TREE_TESTS = {
    0: lambda v, s: v <= s, 1: lambda v, s: v < s, 2: lambda v, s: v >= s,
    3: lambda v, s: v > s, 4: lambda v, s: v == s, 5: lambda v, s: v != s,
}  # fmt: skip


def _members(a: dict) -> dict[int, set[float]]:
    """BRANCH_MEMBER node -> its set (membership_values lists the sets, NaN-separated)."""
    values = [] if a["membership_values"] is None else a["membership_values"].astype(np.float64).tolist()
    groups, current = [], []
    for v in values:
        if np.isnan(v):
            groups.append(set(current))
            current = []
        else:
            current.append(v)
    groups.append(set(current))
    member_nodes = [i for i, m in enumerate(a["nodes_modes"].tolist()) if m == 6]
    return dict(zip(member_nodes, groups))


def _tree_leaf(a: dict, row: np.ndarray, node: int, members: dict) -> int:
    modes, splits = a["nodes_modes"].tolist(), a["nodes_splits"].astype(np.float64).tolist()
    missing = a["nodes_missing_value_tracks_true"]
    while True:
        v = float(row[a["nodes_featureids"][node]])
        if np.isnan(v) and missing and missing[node]:
            go = True
        elif modes[node] == 6:
            go = v in members[node]
        else:
            go = bool(_TREE_TESTS[modes[node]](v, splits[node]))
        leaf, nxt = (a["nodes_trueleafs"][node], a["nodes_truenodeids"][node]) if go else (
            a["nodes_falseleafs"][node], a["nodes_falsenodeids"][node])  # fmt: skip
        if leaf:
            return nxt
        node = nxt


def _post_transform(scores: np.ndarray, kind: int) -> np.ndarray:
    if kind == 1:
        e = np.exp(scores - scores.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    if kind == 2:
        return 1 / (1 + np.exp(-scores))
    if kind == 3:
        e = np.where(scores == 0, 0, np.exp(scores - scores.max(axis=1, keepdims=True)))
        return e / np.maximum(e.sum(axis=1, keepdims=True), 1e-30)
    if kind == 4:
        from ember.ops.elemwise import erf

        # probit: sqrt(2) * erfinv(2p - 1), by Newton steps on erf
        p = 2 * scores - 1
        y = np.zeros_like(p)
        for _ in range(50):
            y = y - (erf(y) - p) / (2 / np.sqrt(np.pi) * np.exp(-y * y))
        return np.sqrt(2) * y
    return scores


@op("TreeEnsemble", Pattern.OPAQUE, infer=lambda a, x: x.with_shape((x.shape[0], a["n_targets"])), attrs=TREE_ATTRS)
def tree_ensemble(a: dict, x: np.ndarray) -> np.ndarray:
    """Sum (or average, min, max) the leaf weights each tree reaches, per target."""
    members = _members(a)
    agg = a["aggregate_function"]
    weights = a["leaf_weights"].astype(np.float64)
    init = {2: np.inf, 3: -np.inf}.get(agg, 0.0)
    out = np.full((x.shape[0], a["n_targets"]), init)
    for r, row in enumerate(x):
        for root in a["tree_roots"]:
            leaf = _tree_leaf(a, row, root, members)
            t = a["leaf_targetids"][leaf]
            w = weights[leaf]
            out[r, t] = min(out[r, t], w) if agg == 2 else max(out[r, t], w) if agg == 3 else out[r, t] + w
    out = np.where(np.isinf(out), 0.0, out)
    if agg == 0:
        out = out / len(a["tree_roots"])
    return _post_transform(out, a["post_transform"]).astype(x.dtype)
