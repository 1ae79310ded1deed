"""ONNX-ML operators (domain ai.onnx.ml) that scikit-learn converters (skl2onnx, onnxmltools) write, expanded into
standard ONNX operators: Scaler, Normalizer, Imputer, LinearRegressor, LinearClassifier (numeric class labels),
SVMRegressor; and the tree ensembles of ai.onnx.ml 1-4 (TreeEnsembleRegressor/Classifier) as version 5's
TreeEnsemble. Binarizer, ArrayFeatureExtractor and TreeEnsemble are Ember operators of their own (`ember.ops.ml`).
Each expansion builds its nodes with the contrib expansions' `Body`.
"""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

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
    x = _float(b, 0)
    if len(b.ctx.type(0).shape) == 1:
        x = b.node("Unsqueeze", [x, b.const([0], np.int64)])
    y = b.node("MatMul", [x, b.const(coef.reshape(targets, width).T)])
    intercepts = b.attrs.get("intercepts")
    return b.node("Add", [y, b.const(np.asarray(intercepts, np.float32))]) if intercepts else y


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _int_labels(b: Body, attr: str) -> np.ndarray:
    labels = b.attrs.get(attr)
    if labels is None:
        raise b.ctx.error("string class labels (Ember has no string tensors): convert with integer labels")
    return np.asarray(labels, np.int64)


def _label(b: Body, labels: np.ndarray, pick: str) -> None:
    """Output 0: the labels at the picked class indices."""
    b.node("Gather", [b.const(labels, np.int64), pick], b.output(0))


def _binary_label(b: Body, labels: np.ndarray, score: str, threshold: float) -> None:
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
    labels = _int_labels(b, "classlabels_ints")
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


# -- tree ensembles (ai.onnx.ml 1-4): rewritten as the TreeEnsemble of ai.onnx.ml 5, one copy of a tree per target it
# scores (a version 5 leaf scores one target), then the base values and the post transform
MODES = {"BRANCH_LEQ": 0, "BRANCH_LT": 1, "BRANCH_GTE": 2, "BRANCH_GT": 3, "BRANCH_EQ": 4, "BRANCH_NEQ": 5}


def _floats(b: Body, name: str) -> np.ndarray | None:
    v = b.attrs.get(f"{name}_as_tensor")
    v = b.attrs.get(name) if v is None else v
    return None if v is None else np.asarray(v, np.float64).reshape(-1)


def _tree_scores(b: Body, prefix: str, targets: int) -> str:
    """The summed leaf weights [N, targets] of the trees (`prefix`: "target" or "class" for the leaves' lists)."""
    tree_ids, node_ids = list(b.attrs["nodes_treeids"]), list(b.attrs["nodes_nodeids"])
    modes = [_text(m) for m in b.attrs["nodes_modes"]]
    feats, splits = list(b.attrs["nodes_featureids"]), _floats(b, "nodes_values")
    true_ids, false_ids = list(b.attrs["nodes_truenodeids"]), list(b.attrs["nodes_falsenodeids"])
    missing = list(b.attrs.get("nodes_missing_value_tracks_true", [0] * len(modes)))
    index = {(t, n): i for i, (t, n) in enumerate(zip(tree_ids, node_ids))}
    roots = {}  # tree -> its root: node 0, else its first node id
    for t, n in index:
        roots[t] = min(roots.get(t, n), n)
    weights: dict[tuple[int, int], dict[int, float]] = {}  # (tree, leaf node) -> target -> weight
    scored: dict[int, set[int]] = {}  # tree -> the targets its leaves score
    leaf_w = _floats(b, f"{prefix}_weights")
    for t, n, k, w in zip(b.attrs[f"{prefix}_treeids"], b.attrs[f"{prefix}_nodeids"], b.attrs[f"{prefix}_ids"], leaf_w):
        d = weights.setdefault((int(t), int(n)), {})
        d[int(k)] = d.get(int(k), 0.0) + float(w)
        scored.setdefault(int(t), set()).add(int(k))
    out = {k: [] for k in ("feat", "split", "mode", "miss", "tid", "tleaf", "fid", "fleaf", "roots", "lt", "lw")}

    def add_leaf(tree: int, node: int, target: int) -> int:
        out["lt"].append(target)
        out["lw"].append(weights.get((tree, node), {}).get(target, 0.0))
        return len(out["lt"]) - 1

    def copy(tree: int, node: int, target: int) -> tuple[int, int]:  # (index, is leaf)
        i = index[(tree, node)]
        if modes[i] == "LEAF":
            return add_leaf(tree, node, target), 1
        if modes[i] not in MODES:
            raise b.ctx.error(f"node mode {modes[i]!r}")
        me = len(out["feat"])
        for k, v in (("feat", feats[i]), ("split", splits[i]), ("mode", MODES[modes[i]]), ("miss", missing[i])):
            out[k].append(v)
        for k in ("tid", "tleaf", "fid", "fleaf"):
            out[k].append(0)
        out["tid"][me], out["tleaf"][me] = copy(tree, true_ids[i], target)
        out["fid"][me], out["fleaf"][me] = copy(tree, false_ids[i], target)
        return me, 0

    for tree in roots:
        for target in sorted(scored.get(tree, ())):
            root, leaf = copy(tree, roots[tree], target)
            if leaf:  # a tree of one leaf: a node whose both branches reach it
                for k, v in (("feat", 0), ("split", 0.0), ("mode", 0), ("miss", 0), ("tid", root), ("tleaf", 1),
                             ("fid", root), ("fleaf", 1)):  # fmt: skip
                    out[k].append(v)
                root = len(out["feat"]) - 1
            out["roots"].append(root)
    f32 = lambda v: numpy_helper.from_array(np.asarray(v, np.float32))  # noqa: E731
    node = helper.make_node(
        "TreeEnsemble", [_float(b, 0)], [f"{b.prefix}/trees"], domain=DOMAIN, aggregate_function=1,
        leaf_targetids=out["lt"], leaf_weights=f32(out["lw"]), n_targets=targets, nodes_falseleafs=out["fleaf"],
        nodes_falsenodeids=out["fid"], nodes_featureids=out["feat"], nodes_missing_value_tracks_true=out["miss"],
        nodes_modes=numpy_helper.from_array(np.asarray(out["mode"], np.uint8)), nodes_splits=f32(out["split"]),
        nodes_trueleafs=out["tleaf"], nodes_truenodeids=out["tid"], post_transform=0, tree_roots=out["roots"],
    )  # fmt: skip
    b.nodes.append(node)
    scores = node.output[0]
    agg = _text(b.attrs.get("aggregate_function", "SUM"))
    if agg == "AVERAGE":
        scores = b.node("Div", [scores, b.const(float(len(roots)))])
    elif agg != "SUM":
        raise b.ctx.error(f"aggregate_function {agg} (SUM and AVERAGE are supported)")
    base = _floats(b, "base_values")
    return b.node("Add", [scores, b.const(base.astype(np.float32))]) if base is not None and base.size else scores


@expansion("TreeEnsembleRegressor")
def _tree_regressor(b: Body) -> None:
    scores = _tree_scores(b, "target", int(b.attrs.get("n_targets", 1)))
    _post(b, scores, _text(b.attrs.get("post_transform", "NONE")), b.output(0))


@expansion("TreeEnsembleClassifier")
def _tree_classifier(b: Body) -> None:
    """Class scores from the trees; the label is the class of the largest (integer labels)."""
    labels = _int_labels(b, "classlabels_int64s")
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


__all__ = ["DOMAIN", "EXPANSIONS", "expand_ml"]
