"""ONNX-ML operators (domain ai.onnx.ml) that scikit-learn converters (skl2onnx, onnxmltools) write, expanded into
standard ONNX operators and Ember's own: Scaler, Normalizer, Imputer, LinearRegressor, LinearClassifier,
SVMRegressor, SVMClassifier (its probabilities: `PairwiseCoupling`), the tree ensembles of every version
(TreeEnsembleRegressor/Classifier, TreeEnsemble) as one `TreeWalk` (`Forest`), and ZipMap. String class labels and
ZipMap's maps are returned decoded by the model (`Body.decoders`, `Graph.decoders`). Binarizer and
ArrayFeatureExtractor are Ember operators of their own (`ember.ops.ml`). Each expansion builds its nodes with the
contrib expansions' `Body`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ember.frontend import onnx_contrib
from ember.frontend.onnx_contrib import Body, Expansion
from ember.frontend.onnx_importer import NodeContext

DOMAIN = "ai.onnx.ml"
EXPANSIONS: dict[str, Expansion] = {}


def expansion(name: str):
    return onnx_contrib.expansion(name, table=EXPANSIONS)


def expand_ml(ctx: NodeContext) -> None:
    """Import an ai.onnx.ml node as the standard nodes it stands for."""
    onnx_contrib.expand(ctx, EXPANSIONS, {DOMAIN: 5})  # (5: TreeEnsemble)


def _float(b: Body, i: int) -> str:
    """Input i as float32 (these operators take int32, int64 and double features too)."""
    return b.input(i) if b.ctx.type(i).dtype == "float32" else b.node("Cast", [b.input(i)], to=1)


def _rows(b: Body) -> str:
    """Input 0 as float32 rows [N, C] (a vector [C]: one row)."""
    x = _float(b, 0)
    return b.node("Unsqueeze", [x, b.const([0], np.int64)]) if b.rank(0) == 1 else x


@expansion("Scaler")
def _scaler(b: Body) -> None:
    """(X - offset) * scale, per feature (or one value for all)."""
    offset = np.asarray(b.attrs.get("offset", [0.0]), np.float32)
    scale = np.asarray(b.attrs.get("scale", [1.0]), np.float32)
    b.node("Mul", [b.node("Sub", [_float(b, 0), b.const(offset)]), b.const(scale)], b.output(0))


@expansion("Normalizer")
def _normalizer(b: Body) -> None:
    """Each row divided by its MAX, its L1 norm (sum of |x|) or its L2 norm."""
    x, norm = _float(b, 0), _text(b.attrs.get("norm", "MAX"))
    reduce = {"MAX": "ReduceMax", "L1": "ReduceL1", "L2": "ReduceL2"}.get(norm)
    if reduce is None:
        raise b.ctx.error(f"norm {norm!r} (MAX, L1 or L2 are defined)")
    b.node("Div", [x, b.node(reduce, [x, b.const([-1], np.int64)], keepdims=1)], b.output(0))


@expansion("Imputer")
def _imputer(b: Body) -> None:
    """Elements equal to `replaced_value_float` (NaN by default: the NaNs) replaced by the imputed value of their
    feature (float inputs; integer ones with `replaced_value_int64`)."""
    x = b.input(0)
    integer = b.ctx.type(0).dtype != "float32"
    if integer:
        values = np.asarray(b.attrs.get("imputed_value_int64s", [0]), np.int64)
        hit = b.node("Equal", [x, b.const(int(b.attrs.get("replaced_value_int64", 0)), np.int64)])
        b.node("Where", [hit, b.const(values, np.int64), x], b.output(0))
        return
    values = np.asarray(b.attrs.get("imputed_value_floats", [0.0]), np.float32)
    replaced = float(b.attrs.get("replaced_value_float", 0.0))
    hit = b.node("IsNaN", [x]) if np.isnan(replaced) else b.node("Equal", [x, b.const(replaced)])
    b.node("Where", [hit, b.const(values), x], b.output(0))


def _post(b: Body, scores: str, how: str, out: str | None = None) -> str:
    """A linear model's post_transform of its scores [N, E]."""
    if how == "NONE":
        return b.node("Identity", [scores], out)
    if how == "LOGISTIC":
        return b.node("Sigmoid", [scores], out)
    if how == "SOFTMAX":
        return b.node("Softmax", [scores], out, axis=-1)
    if how == "SOFTMAX_ZERO":  # softmax where a score of exactly 0 stays 0
        e = b.node("Exp", [b.node("Sub", [scores, b.node("ReduceMax", [scores, b.const([-1], np.int64)])])])
        e = b.node("Where", [b.node("Equal", [scores, b.const(0.0)]), b.const(0.0), e])
        return b.node("Div", [e, b.node("ReduceSum", [e, b.const([-1], np.int64)])], out)
    if how == "PROBIT":  # sqrt(2) erfinv(2p - 1): no erfinv in ONNX
        raise b.ctx.error("post_transform PROBIT is not supported")
    raise b.ctx.error(f"post_transform {how!r}")


def _linear(b: Body, targets: int) -> str:
    """X [N, C] (or [C]) times the coefficients [targets, C] transposed, plus the intercepts: [N, targets]."""
    coef = np.asarray(b.attrs["coefficients"], np.float32)
    width = coef.size // targets
    y = b.node("MatMul", [_rows(b), b.const(coef.reshape(targets, width).T)])
    intercepts = b.attrs.get("intercepts")
    return b.node("Add", [y, b.const(np.asarray(intercepts, np.float32))]) if intercepts else y


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _class_labels(b: Body, ints: str) -> np.ndarray | list[str]:
    """The class labels: the integer ones (attribute `ints`), else the strings of `classlabels_strings`."""
    labels = b.attrs.get(ints)
    if labels is not None:
        return np.asarray(labels, np.int64)
    strings = b.attrs.get("classlabels_strings")
    if strings is None:
        raise b.ctx.error(f"neither {ints} nor classlabels_strings is given")
    return [_text(v) for v in strings]


def _label(b: Body, labels: np.ndarray | list[str], pick: str) -> None:
    """Output 0: the labels at the picked class indices. String labels: the indices, which the model returns as
    the strings (`Graph.decoders`)."""
    if isinstance(labels, np.ndarray):
        b.node("Gather", [b.const(labels, np.int64), pick], b.output(0))
    elif b.output(0):
        b.node("Identity", [pick], b.output(0))
        b.decoders[b.output(0)] = {"kind": "labels", "labels": labels}


def _binary_label(b: Body, labels: np.ndarray | list[str], score: str, threshold: float) -> None:
    """Output 0 of a binary model that scores one class [N, 1]: the second label where the score passes
    `threshold`, else the first."""
    win = b.node("Cast", [b.node("Greater", [score, b.const(threshold)])], to=7)
    _label(b, labels, b.node("Squeeze", [win, b.const([-1], np.int64)]))


@expansion("LinearRegressor")
def _linear_regressor(b: Body) -> None:
    _post(b, _linear(b, int(b.attrs.get("targets", 1))), _text(b.attrs.get("post_transform", "NONE")), b.output(0))


@expansion("LinearClassifier")
def _linear_classifier(b: Body) -> None:
    """Scores X W^T + b and their post_transform; the label is the class of the largest score. One weight row for
    two classes (a binary model), as onnxruntime computes it: scores (1 - t, t) with t = s, or sigmoid(s) after
    LOGISTIC (the softmaxes leave one score as it is), the second class where s > 0."""
    labels = _class_labels(b, "classlabels_ints")
    how = _text(b.attrs.get("post_transform", "NONE"))
    rows = np.asarray(b.attrs["coefficients"]).size // int(b.ctx.type(0).shape[-1])
    raw = _linear(b, rows)
    if rows == 1 and len(labels) == 2:
        p = b.node("Sigmoid", [raw]) if how == "LOGISTIC" else raw  # (as onnxruntime: no softmax of one score)
        b.node("Concat", [b.node("Sub", [b.const(1.0), p]), p], b.output(1), axis=-1)
        _binary_label(b, labels, raw, 0.0)
    else:
        _post(b, raw, how, b.output(1))
        _label(b, labels, b.node("ArgMax", [raw], axis=-1, keepdims=0))


# -- support vector machines ----------------------------------------------------------------------------------
def _svm_kernel(b: Body, x: str, vectors: np.ndarray) -> str:
    """K(x, v) for each row of x and support vector v: [N, n_supports]. kernel_params (gamma, coef0, degree):
    LINEAR x.v, POLY (gamma x.v + coef0)^degree, RBF exp(-gamma |x - v|^2), SIGMOID tanh(gamma x.v + coef0)."""
    kind = _text(b.attrs.get("kernel_type", "LINEAR"))
    gamma, coef0, degree = (list(b.attrs.get("kernel_params", [])) + [0.0, 0.0, 3.0])[:3]
    dot = b.node("MatMul", [x, b.const(vectors.T)])
    if kind == "LINEAR":
        return dot
    if kind == "RBF":  # |x|^2 - 2 x.v + |v|^2
        sq = b.node("ReduceSumSquare", [x, b.const([-1], np.int64)], keepdims=1)
        d2 = b.node("Add", [b.node("Sub", [sq, b.node("Mul", [dot, b.const(2.0)])]),
                            b.const((vectors.astype(np.float64) ** 2).sum(axis=1).astype(np.float32))])  # fmt: skip
        return b.node("Exp", [b.node("Mul", [b.node("Max", [d2, b.const(0.0)]), b.const(-float(gamma))])])
    affine = b.node("Add", [b.node("Mul", [dot, b.const(float(gamma))]), b.const(float(coef0))])
    if kind == "POLY":
        return b.node("Pow", [affine, b.const(float(degree))])
    if kind == "SIGMOID":
        return b.node("Tanh", [affine])
    raise b.ctx.error(f"kernel_type {kind!r}")


@expansion("SVMRegressor")
def _svm_regressor(b: Body) -> None:
    """sum over support vectors of coefficient x K(x, v), plus rho (one_class: +1 where that is positive, else
    -1); without support vectors, a linear model of the coefficients."""
    coef = np.asarray(b.attrs["coefficients"], np.float32)
    rho = np.asarray(b.attrs.get("rho", [0.0]), np.float32)
    n_sv = int(b.attrs.get("n_supports", 0))
    x = _float(b, 0)
    if n_sv:
        vectors = np.asarray(b.attrs["support_vectors"], np.float32).reshape(n_sv, -1)
        y = b.node("MatMul", [_svm_kernel(b, x, vectors), b.const(coef.reshape(n_sv, 1))])
    else:
        y = b.node("MatMul", [x, b.const(coef.reshape(-1, 1))])
    y = b.node("Add", [y, b.const(rho.reshape(1, -1)[:, :1])])
    if b.attrs.get("one_class", 0):
        y = b.node("Where", [b.node("Greater", [y, b.const(0.0)]), b.const(1.0), b.const(-1.0)])
    _post(b, y, _text(b.attrs.get("post_transform", "NONE")), b.output(0))


@expansion("SVMClassifier")
def _svm_classifier(b: Body) -> None:
    """libsvm's one-vs-one classifier (scikit-learn's SVC): a decision value per pair of classes (i < j) from the
    support vectors of both, K @ W + rho in one product; each pair's vote to i where its value is positive, else to
    j; the label is the class of most votes (the first of equals). Scores: the pairs' values (two classes: -s, s),
    or with Platt's prob_a, prob_b the class probabilities that pairwise coupling makes of the pairs' (libsvm's
    multiclass_probability, `PairwiseCoupling`); then the post_transform. As onnxruntime computes them (ONNX's
    reference evaluator gives two classes whose coefficients are all >= 0 the second label always; onnxruntime
    counts their vote like any other)."""
    labels = _class_labels(b, "classlabels_ints")
    classes, per_class = len(labels), [int(v) for v in b.attrs.get("vectors_per_class", [])]
    coef = np.asarray(b.attrs["coefficients"], np.float64)
    if not per_class or sum(per_class) == 0:
        raise b.ctx.error("SVMClassifier without support vectors (its linear mode) is not supported")
    if len(per_class) != classes or classes < 2 or coef.size != (classes - 1) * sum(per_class):
        raise b.ctx.error(f"{classes} class labels, vectors_per_class {per_class} and {coef.size} coefficients "
                          "do not fit one another")  # fmt: skip
    n_sv = sum(per_class)
    start = np.cumsum([0, *per_class])
    coef = coef.reshape(classes - 1, n_sv)
    pairs = [(i, j) for i in range(classes) for j in range(i + 1, classes)]
    w = np.zeros((n_sv, len(pairs)), np.float32)
    first, second = np.zeros((len(pairs), classes), np.float32), np.zeros((len(pairs), classes), np.float32)
    for p, (i, j) in enumerate(pairs):
        w[start[i] : start[i + 1], p] = coef[j - 1, start[i] : start[i + 1]]
        w[start[j] : start[j + 1], p] = coef[i, start[j] : start[j + 1]]
        first[p, i] = second[p, j] = 1.0
    rho = np.asarray(b.attrs["rho"], np.float32).reshape(-1)
    if rho.size != len(pairs):
        raise b.ctx.error(f"{rho.size} rho values for {len(pairs)} pairs of classes")
    vectors = np.asarray(b.attrs["support_vectors"], np.float32).reshape(n_sv, -1)
    s = b.node("Add", [b.node("MatMul", [_svm_kernel(b, _rows(b), vectors), b.const(w)]), b.const(rho)])
    win = b.node("Cast", [b.node("Greater", [s, b.const(0.0)])], to=1)
    votes = b.node("Add", [b.node("MatMul", [win, b.const(first)]),
                           b.node("MatMul", [b.node("Sub", [b.const(1.0), win]), b.const(second)])])  # fmt: skip
    how = _text(b.attrs.get("post_transform", "NONE"))
    prob_a, prob_b = (np.asarray(b.attrs.get(k, []), np.float32).reshape(-1) for k in ("prob_a", "prob_b"))
    if prob_a.size:
        if prob_a.size != len(pairs) or prob_b.size != len(pairs):
            raise b.ctx.error(f"prob_a, prob_b of {prob_a.size}, {prob_b.size} values for {len(pairs)} pairs")
        r = b.node("Sigmoid", [b.node("Neg", [b.node("Add", [b.node("Mul", [s, b.const(prob_a)]), b.const(prob_b)])])])
        r = b.node("Clip", [r, b.const(1e-7), b.const(1 - 1e-7)])
        _post(b, b.node("PairwiseCoupling", [r], classes=classes), how, b.output(1))
    elif len(pairs) == 1:
        _post(b, b.node("Concat", [b.node("Neg", [s]), s], axis=-1), how, b.output(1))
    else:
        _post(b, s, how, b.output(1))
    _label(b, labels, b.node("ArgMax", [votes], axis=-1, keepdims=0))


# -- tree ensembles: every version's trees as one table of comparisons `x' <= split` for the TreeWalk kernel
Ref = tuple[str, int]  # ("node", i) or ("leaf", j)
LESS = ("<=", "<", ">=", ">")  # the ordered modes BRANCH_LEQ, LT, GTE, GT (0-3); then EQ 4, NEQ 5, MEMBER 6
NOT = {"<=": ">", "<": ">=", ">=": "<", ">": "<="}
MODES = {"BRANCH_LEQ": 0, "BRANCH_LT": 1, "BRANCH_GTE": 2, "BRANCH_GT": 3, "BRANCH_EQ": 4, "BRANCH_NEQ": 5,
         "BRANCH_MEMBER": 6}  # fmt: skip


def _f32_at_most(t: float, strict: bool) -> float:
    """The largest float32 v with v <= t (v < t if strict): float32 x <= t exactly when x <= v (NaN: never)."""
    v = np.float32(t)
    if float(v) > t or (strict and float(v) == t):
        v = np.nextafter(v, np.float32(-np.inf))
    return float("nan") if strict and float(v) == -np.inf else float(v)


class Forest:
    """Decision trees as the tables of one TreeWalk: each branch a node `x' <= split`, x' a feature or its
    negation (features + F in [x, -x]), NaN going to the second branch; the six comparisons of ONNX-ML, with NaN
    sent either way (missing_value_tracks_true), and set membership are one or more such nodes. Leaves follow the
    branches and step to themselves; each holds a weight per target."""

    def __init__(self, features: int, targets: int, aggregate: str):
        """`aggregate`: "sum", "average" (the sum over the number of trees), "min" or "max"."""
        self.features, self.targets, self.aggregate = features, targets, aggregate
        self.nodes: list[tuple[int, float, Ref, Ref]] = []  # (feature in [x, -x], split, yes, no)
        self.leaves: list[dict[int, float]] = []
        self.roots: list[Ref] = []

    def leaf(self, weights: dict[int, float]) -> Ref:
        self.leaves.append(weights)
        return ("leaf", len(self.leaves) - 1)

    def _less(self, f: int, cmp: str, t: float, yes: Ref, no: Ref) -> Ref:
        """x[f] cmp t ? yes : no (NaN: no)."""
        negate = cmp in (">=", ">")
        self.nodes.append((f + (self.features if negate else 0), _f32_at_most(-t if negate else t, cmp in ("<", ">")),
                           yes, no))  # fmt: skip
        return ("node", len(self.nodes) - 1)

    def branch(self, f: int, mode: int, t: float, nan_yes: bool, yes: Ref, no: Ref, members=()) -> Ref:
        """A branch of ONNX-ML: x[f] (mode) t ? yes : no, NaN to `yes` where nan_yes (as onnxruntime: the
        comparison, or NaN where nan_yes; so NaN != t always)."""
        if not 0 <= f < self.features:
            raise ValueError(f"feature {f} of a tree node is outside the input's {self.features}")
        if mode < 4:
            cmp = LESS[mode]
            return self._less(f, NOT[cmp], t, no, yes) if nan_yes else self._less(f, cmp, t, yes, no)
        if mode == 4:  # x == t: not above and not below
            if nan_yes:
                return self._less(f, ">", t, no, self._less(f, "<", t, no, yes))
            return self._less(f, "<=", t, self._less(f, ">=", t, yes, no), no)
        if mode == 5:  # (NaN != t: NaN always takes `yes`)
            return self._less(f, "<=", t, self._less(f, ">=", t, no, yes), yes)
        if mode == 6:  # x in the set: one equality test after another
            for v in reversed(members):
                no = self.branch(f, 4, v, False, yes, no)
            return self._less(f, "<=", np.inf, no, yes) if nan_yes else no
        raise ValueError(f"node mode {mode}")

    def add_trees(self, b: Body, roots, children: Callable, make: Callable) -> None:
        """Add a tree per root key, each built bottom-up without recursion: `children(key)` gives a node's child
        keys (none for a leaf), `make(key, child refs)` its Ref. A model's inconsistent tables raise its error."""
        try:
            for root in roots:
                self._tree(root, children, make)
        except (KeyError, IndexError, ValueError) as e:
            raise b.ctx.error(f"malformed trees: {e}") from None

    def _tree(self, root, children: Callable, make: Callable) -> None:
        refs: dict = {}
        opened: set = set()
        stack = [(root, False)]
        while stack:
            key, ready = stack.pop()
            if key in refs:
                continue
            kids = children(key)
            if kids and not ready:
                if key in opened:
                    raise ValueError(f"tree node {key} is its own descendant")
                opened.add(key)
                stack.append((key, True))
                stack.extend((k, False) for k in kids if k not in refs)
                continue
            refs[key] = make(key, [refs[k] for k in kids])
        self.roots.append(refs[root])

    def scores(self, b: Body, x: str) -> str:
        """The TreeWalk node over x [N, F] (float32); its output [N, targets]: the trees' leaf weights summed (or
        averaged, or their min, max: targets no tree scores are 0)."""
        first_leaf = len(self.nodes)
        index = lambda r: r[1] + (first_leaf if r[0] == "leaf" else 0)  # noqa: E731
        m = first_leaf + len(self.leaves)
        feature, split, nxt = np.zeros(m, np.int32), np.zeros(m, np.float32), np.zeros((m, 2), np.int32)
        depth = np.zeros(m, np.int64)
        for i, (f, v, yes, no) in enumerate(self.nodes):  # (children come first)
            feature[i], split[i], nxt[i] = f, v, (index(yes), index(no))
            depth[i] = 1 + max(depth[index(yes)], depth[index(no)])
        nxt[first_leaf:] = np.arange(first_leaf, m)[:, None]
        walk = {"average": "sum"}.get(self.aggregate, self.aggregate)
        fill = {"sum": 0.0, "min": np.inf, "max": -np.inf}[walk]
        values = np.full((max(len(self.leaves), 1), self.targets), fill, np.float32)
        for j, weights in enumerate(self.leaves):
            for k, w in weights.items():
                if not 0 <= k < self.targets:
                    raise ValueError(f"a leaf scores target {k} of {self.targets}")
                values[j, k] = w
        if (feature >= self.features).any():
            x = b.node("Concat", [x, b.node("Neg", [x])], axis=-1)
        roots = np.asarray([index(r) for r in self.roots], np.int32)
        y = b.node("TreeWalk", [x, b.const(roots, np.int32), b.const(feature, np.int32), b.const(split),
                                b.const(nxt, np.int32), b.const(values)],
                   depth=int(depth[roots].max(initial=0)), leaves=first_leaf, aggregate=walk)  # fmt: skip
        if self.aggregate == "average":
            return b.node("Div", [y, b.const(float(len(self.roots)))])
        return y if walk == "sum" else b.node("Where", [b.node("IsInf", [y]), b.const(0.0), y])


def _floats(b: Body, name: str) -> np.ndarray | None:
    v = b.attrs.get(f"{name}_as_tensor")
    v = b.attrs.get(name) if v is None else v
    return None if v is None else np.asarray(v, np.float64).reshape(-1)


def _tree_input(b: Body) -> tuple[str, int]:
    """Input 0 as float32 rows [N, F], and F."""
    shape = b.ctx.type(0).shape
    if len(shape) not in (1, 2) or not isinstance(shape[-1], int):
        raise b.ctx.error(f"input of shape {list(shape)}: trees take [N, F] with F known")
    return _rows(b), shape[-1]


def _tree_scores(b: Body, prefix: str, targets: int) -> str:
    """The ai.onnx.ml 1-4 trees' scores [N, targets] (`prefix`: "target" or "class" for the leaves' lists),
    aggregated, plus the base values."""
    x, features = _tree_input(b)
    agg = _text(b.attrs.get("aggregate_function", "SUM"))
    if agg not in ("SUM", "AVERAGE", "MIN", "MAX"):
        raise b.ctx.error(f"aggregate_function {agg!r}")
    forest = Forest(features, targets, agg.lower())
    tree_ids, node_ids = list(b.attrs["nodes_treeids"]), list(b.attrs["nodes_nodeids"])
    modes = [_text(m) for m in b.attrs["nodes_modes"]]
    feats, splits = list(b.attrs["nodes_featureids"]), _floats(b, "nodes_values")
    true_ids, false_ids = list(b.attrs["nodes_truenodeids"]), list(b.attrs["nodes_falsenodeids"])
    missing = list(b.attrs.get("nodes_missing_value_tracks_true", [])) or [0] * len(modes)
    index = {(t, n): i for i, (t, n) in enumerate(zip(tree_ids, node_ids))}
    roots: dict[int, int] = {}  # tree -> its root: node 0, else its first node id
    for t, n in index:
        roots[t] = min(roots.get(t, n), n)
    weights: dict[tuple[int, int], dict[int, float]] = {}  # (tree, leaf node) -> target -> weight
    leaf_w = _floats(b, f"{prefix}_weights")
    for t, n, k, w in zip(b.attrs[f"{prefix}_treeids"], b.attrs[f"{prefix}_nodeids"], b.attrs[f"{prefix}_ids"], leaf_w):
        d = weights.setdefault((int(t), int(n)), {})
        d[int(k)] = d.get(int(k), 0.0) + float(w)

    def children(key):
        i = index[key]
        if modes[i] == "LEAF":
            return ()
        if modes[i] not in MODES or modes[i] == "BRANCH_MEMBER":
            raise b.ctx.error(f"node mode {modes[i]!r}")
        return (key[0], true_ids[i]), (key[0], false_ids[i])

    def make(key, kids):
        i = index[key]
        if not kids:
            return forest.leaf(weights.get(key, {}))
        return forest.branch(int(feats[i]), MODES[modes[i]], float(splits[i]), bool(missing[i]), *kids)

    forest.add_trees(b, roots.items(), children, make)
    scores = forest.scores(b, x)
    base = _floats(b, "base_values")
    return b.node("Add", [scores, b.const(base.astype(np.float32))]) if base is not None and base.size else scores


@expansion("TreeEnsemble")
def _tree_ensemble(b: Body) -> None:
    """ai.onnx.ml 5's TreeEnsemble: leaves in lists of their own, each scoring one target; set membership."""
    x, features = _tree_input(b)
    agg = int(b.attrs.get("aggregate_function", 1))
    if agg not in (0, 1, 2, 3):
        raise b.ctx.error(f"aggregate_function {agg}")
    forest = Forest(features, int(b.attrs["n_targets"]), ("average", "sum", "min", "max")[agg])
    modes = np.asarray(b.attrs["nodes_modes"]).reshape(-1).astype(int).tolist()
    splits = np.asarray(b.attrs["nodes_splits"], np.float64).reshape(-1).tolist()
    feats, missing = b.attrs["nodes_featureids"], b.attrs.get("nodes_missing_value_tracks_true") or [0] * len(modes)
    true_ids, false_ids = b.attrs["nodes_truenodeids"], b.attrs["nodes_falsenodeids"]
    true_leaf, false_leaf = b.attrs["nodes_trueleafs"], b.attrs["nodes_falseleafs"]
    targets, leaf_w = b.attrs["leaf_targetids"], np.asarray(b.attrs["leaf_weights"], np.float64).reshape(-1).tolist()
    sets, current = [], []  # BRANCH_MEMBER nodes' sets, in node order (membership_values: NaN-separated)
    member_values = b.attrs.get("membership_values")
    for v in [] if member_values is None else np.asarray(member_values, np.float64).reshape(-1).tolist():
        if np.isnan(v):
            sets.append(current)
            current = []
        else:
            current.append(v)
    sets.append(current)
    member_set = {i: sets[min(j, len(sets) - 1)] for j, i in enumerate(i for i, m in enumerate(modes) if m == 6)}

    def children(key):
        kind, i = key
        if kind == "leaf":
            return ()
        return ("leaf" if true_leaf[i] else "node", true_ids[i]), ("leaf" if false_leaf[i] else "node", false_ids[i])

    def make(key, kids):
        kind, i = key
        if kind == "leaf":
            return forest.leaf({int(targets[i]): leaf_w[i]})
        return forest.branch(int(feats[i]), modes[i], splits[i], bool(missing[i]), *kids, members=member_set.get(i, ()))

    forest.add_trees(b, [("node", int(root)) for root in b.attrs["tree_roots"]], children, make)
    scores = forest.scores(b, x)
    how = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")
    post = int(b.attrs.get("post_transform", 0))
    _post(b, scores, how[post] if 0 <= post < len(how) else str(post), b.output(0))


@expansion("TreeEnsembleRegressor")
def _tree_regressor(b: Body) -> None:
    scores = _tree_scores(b, "target", int(b.attrs.get("n_targets", 1)))
    _post(b, scores, _text(b.attrs.get("post_transform", "NONE")), b.output(0))


@expansion("TreeEnsembleClassifier")
def _tree_classifier(b: Body) -> None:
    """Class scores from the trees; the label is the class of the largest."""
    labels = _class_labels(b, "classlabels_int64s")
    how = _text(b.attrs.get("post_transform", "NONE"))
    if len(labels) == 2 and len(set(b.attrs["class_ids"])) == 1:  # binary, one class scored: as onnxruntime
        k = int(b.attrs["class_ids"][0])  # (its score is the second class's)
        t = b.node("Slice", [_tree_scores(b, "class", 2), *(b.const([v], np.int64) for v in (k, k + 1, 1))])
        positive = bool((_floats(b, "class_weights") >= 0).all())  # probabilities: (1 - t, t), else (-t, t)
        low = b.node("Sub", [b.const(1.0), t]) if positive else b.node("Neg", [t])
        _post(b, b.node("Concat", [low, t], axis=-1), how, b.output(1))
        _binary_label(b, labels, t, 0.5 if positive else 0.0)
        return
    raw = _tree_scores(b, "class", len(labels))
    _post(b, raw, how, b.output(1))
    _label(b, labels, b.node("ArgMax", [raw], axis=-1, keepdims=0))


@expansion("ZipMap")
def _zip_map(b: Body) -> None:
    """Each row of scores [N, C] as a dict label -> score (`Graph.decoders`): the model returns the list of dicts,
    as onnxruntime does; inside the graph the scores stay a tensor, which only an Identity or the outputs read."""
    labels = _class_labels(b, "classlabels_int64s")
    labels = labels.tolist() if isinstance(labels, np.ndarray) else labels
    width = b.ctx.type(0).shape[-1] if b.rank(0) else None
    if width != len(labels):
        raise b.ctx.error(f"{len(labels)} class labels for input {b.input(0)!r} of shape {b.ctx.type(0).shape}")
    b.node("Identity", [b.input(0)], b.output(0))
    b.decoders[b.output(0)] = {"kind": "zipmap", "labels": labels}


__all__ = ["DOMAIN", "EXPANSIONS", "expand_ml"]
