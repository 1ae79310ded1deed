"""ONNX-ML preprocessing and linear models (`ember.frontend.onnx_ml`) against onnxruntime's own kernels: single
nodes built by hand on random inputs, and scikit-learn pipelines as skl2onnx converts them (trained on the
datasets that ship with scikit-learn)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.frontend.onnx import ModelError

ort = pytest.importorskip("onnxruntime")
F, I64 = TensorProto.FLOAT, TensorProto.INT64


def one_node(op: str, attrs: dict, x_shape: tuple, outs: list[tuple[str, int, tuple]]) -> onnx.ModelProto:
    node = helper.make_node(op, ["x"], [o[0] for o in outs], domain="ai.onnx.ml", **attrs)
    graph = helper.make_graph([node], op, [helper.make_tensor_value_info("x", F, x_shape)],
                              [helper.make_tensor_value_info(n, t, s) for n, t, s in outs])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])


def against_onnxruntime(model: onnx.ModelProto, feeds: dict, compare, **compile_args) -> None:
    """`compare(ours, ref)` for each output of Ember's compile of `model` (with `compile_args`) and of onnxruntime's
    session, on `feeds`."""
    refs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for ours, ref in zip(ember.compile(model, **compile_args).run(feeds).values(), refs, strict=True):
        compare(ours, ref)


def without_zipmap(model, x: np.ndarray) -> onnx.ModelProto:
    """skl2onnx's conversion of a fitted model or pipeline for opset 17 and ai.onnx.ml 3, its probabilities (if
    any) as a tensor, not ZipMap's maps."""
    import skl2onnx

    last = model.steps[-1][1] if hasattr(model, "steps") else model
    options = {id(last): {"zipmap": False}} if hasattr(last, "predict_proba") else None
    return skl2onnx.to_onnx(model, x[:1], options=options, target_opset={"": 17, "ai.onnx.ml": 3})


def check(model: onnx.ModelProto, x: np.ndarray) -> None:
    refs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    outs = ember.compile(model, fallback=False).run({"x": x})
    for (name, ours), ref in zip(outs.items(), refs, strict=True):
        assert ours.shape == ref.shape and ours.dtype == ref.dtype, (name, ours.shape, ref.shape)
        if ref.dtype == np.int64:
            np.testing.assert_array_equal(ours, ref)
        else:
            np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


def test_preprocessing():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 3)).astype(np.float32)
    check(one_node("Scaler", {"offset": [0.5, -1.0, 2.0], "scale": [2.0, 0.5, 1.5]}, (6, 3), [("y", F, (6, 3))]), x)
    for norm in ("MAX", "L1", "L2"):
        check(one_node("Normalizer", {"norm": norm}, (6, 3), [("y", F, (6, 3))]), x)
    holes = x.copy()
    holes[1, 2] = holes[4, 0] = np.nan
    imputer = {"imputed_value_floats": [1.0, 2.0, 3.0], "replaced_value_float": float("nan")}
    check(one_node("Imputer", imputer, (6, 3), [("y", F, (6, 3))]), holes)


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
@pytest.mark.parametrize("classes", [3, 2])
def test_linear_models(post, classes):
    """Multi-class and binary (one weight row: onnxruntime's scores (1 - t, t)) classifiers with each post
    transform, and a regressor of two targets."""
    rng = np.random.default_rng(classes)
    rows = 1 if classes == 2 else classes
    attrs = {"coefficients": list(rng.standard_normal(3 * rows)), "intercepts": list(rng.standard_normal(rows)),
             "classlabels_ints": [3, 5, 7][:classes], "post_transform": post}  # fmt: skip
    x = rng.standard_normal((8, 3)).astype(np.float32)
    check(one_node("LinearClassifier", attrs, (8, 3), [("label", I64, (8,)), ("scores", F, (8, classes))]), x)
    reg = {"coefficients": list(rng.standard_normal(6)), "intercepts": [0.5, -0.5], "targets": 2}
    check(one_node("LinearRegressor", reg, (8, 3), [("y", F, (8, 2))]), x)


def same_outputs(ours, ref, tol: float = 1e-5) -> None:
    """An output against onnxruntime's: ZipMap's lists of dicts by keys and values, string labels exactly."""
    if isinstance(ref, list):
        assert isinstance(ours, list) and len(ours) == len(ref)
        for a, b in zip(ours, ref):
            assert list(a) == list(b)
            np.testing.assert_allclose(list(a.values()), list(b.values()), rtol=tol, atol=tol)
    elif ref.dtype == object or ref.dtype.kind in "iU":
        assert ours.shape == ref.shape and ours.tolist() == ref.tolist()
    else:
        np.testing.assert_allclose(ours, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("labels", [{"classlabels_strings": ["cat", "dog", "eel"]}, {"classlabels_ints": [4, 2, 9]}])
def test_zipmap_and_string_labels(labels, tmp_path):
    """A classifier's label output with string class labels, and its scores through ZipMap (a list of one dict per
    row), as onnxruntime returns them: the model returns them decoded from an index and a score tensor; saved and
    loaded, it still does."""
    rng = np.random.default_rng(0)
    strings = "classlabels_strings" in labels
    zip_attrs = {"classlabels_strings" if strings else "classlabels_int64s": next(iter(labels.values()))}
    cls = helper.make_node("LinearClassifier", ["x"], ["label", "scores"], domain="ai.onnx.ml", **labels,
                           coefficients=list(rng.standard_normal(12)), intercepts=[0.1, -0.2, 0.3],
                           post_transform="SOFTMAX")  # fmt: skip
    ident = helper.make_node("Identity", ["label"], ["out_label"])
    zm = helper.make_node("ZipMap", ["scores"], ["probs"], domain="ai.onnx.ml", **zip_attrs)
    key = TensorProto.STRING if strings else I64
    graph = helper.make_graph(
        [cls, ident, zm], "zm", [helper.make_tensor_value_info("x", F, (None, 4))],
        [helper.make_tensor_value_info("out_label", key, (None,)),
         helper.make_value_info("probs", helper.make_sequence_type_proto(helper.make_map_type_proto(
             key, helper.make_tensor_type_proto(F, None))))])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    x = rng.standard_normal((7, 4)).astype(np.float32)
    refs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    m = ember.compile(model)
    for ours, ref in zip(m.run({"x": x}).values(), refs, strict=True):
        same_outputs(ours, ref)
    m.save(tmp_path / "m")
    for ours, ref in zip(ember.load(tmp_path / "m").run({"x": x}).values(), refs, strict=True):
        same_outputs(ours, ref)


def test_cli_saves_labels_and_maps(tmp_path, capsys):
    """`ember run --output-dir`: string labels as a numpy text array (no pickle), ZipMap's maps as JSON."""
    import json

    from ember.cli import main

    node = helper.make_node("LinearClassifier", ["x"], ["label", "scores"], domain="ai.onnx.ml", intercepts=[0.0, 0.0],
                            coefficients=[1.0, -1.0, -1.0, 1.0], classlabels_strings=["no", "yes"])
    zm = helper.make_node("ZipMap", ["scores"], ["maps"], domain="ai.onnx.ml", classlabels_strings=["no", "yes"])
    graph = helper.make_graph([node, zm], "cls", [helper.make_tensor_value_info("x", F, (2, 2))],
                              [helper.make_tensor_value_info("label", TensorProto.STRING, (2,)),
                               helper.make_tensor_value_info("maps", F, None)])  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    onnx.save(helper.make_model(graph, opset_imports=opsets), tmp_path / "cls.onnx")
    np.save(tmp_path / "x.npy", np.array([[2.0, 0.0], [0.0, 2.0]], np.float32))
    assert main(["compile", str(tmp_path / "cls.onnx"), "-o", str(tmp_path / "m")]) == 0
    assert main(["run", str(tmp_path / "m"), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir",
                 str(tmp_path / "out")]) == 0  # fmt: skip
    assert np.load(tmp_path / "out" / "label.npy").tolist() == ["no", "yes"]
    maps = json.loads((tmp_path / "out" / "maps.json").read_text())
    assert [max(m, key=m.get) for m in maps] == ["no", "yes"] and list(maps[0]) == ["no", "yes"]


def test_zipmap_read_by_a_node_is_refused_by_name():
    zm = helper.make_node("ZipMap", ["x"], ["m"], domain="ai.onnx.ml", classlabels_int64s=[0, 1])
    use = helper.make_node("Relu", ["m"], ["y"], name="reader")
    graph = helper.make_graph([zm, use], "zm", [helper.make_tensor_value_info("x", F, (3, 2))],
                              [helper.make_tensor_value_info("y", F, (3, 2))])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    with pytest.raises(ModelError, match="'reader' \\(Relu\\) reads a ZipMap"):
        ember.compile(model)


def test_scikit_learn_default_conversions():
    """Classifiers as skl2onnx converts them by default (ZipMap of the probabilities; string targets as string
    labels), on the batch size it leaves symbolic: logistic regression, a multi-layer perceptron and naive Bayes
    (their labels through an ArrayFeatureExtractor of a symbolic count), k nearest neighbours (a Scan over the
    training points, with a body typed in the batch size)."""
    skl2onnx = pytest.importorskip("skl2onnx")
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    from sklearn.naive_bayes import GaussianNB
    from sklearn.neighbors import KNeighborsClassifier, KNeighborsRegressor
    from sklearn.neural_network import MLPClassifier

    x, y = load_iris(return_X_y=True)
    x = x.astype(np.float32)
    names = np.array(["setosa", "versicolor", "virginica"])[y]
    for model, target in ((LogisticRegression(max_iter=500), names), (MLPClassifier((8,), max_iter=300), y),
                          (GaussianNB(), names), (KNeighborsClassifier(3), y), (KNeighborsRegressor(3), x[:, 0])):
        model.fit(x[::2], target[::2])
        against_onnxruntime(skl2onnx.to_onnx(model, x[:1]), {"X": x[1::5]}, same_outputs)


def test_scikit_learn_pipelines():
    pytest.importorskip("skl2onnx")
    from sklearn.datasets import load_breast_cancer, load_digits
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import MinMaxScaler, Normalizer, StandardScaler

    for x, y in (load_digits(return_X_y=True), load_breast_cancer(return_X_y=True)):
        x = x.astype(np.float32)
        for pipe in (make_pipeline(StandardScaler(), LogisticRegression(max_iter=300)),
                     make_pipeline(SimpleImputer(), MinMaxScaler(), Normalizer(), LogisticRegression(max_iter=300)),
                     make_pipeline(StandardScaler(), Ridge())):  # fmt: skip
            pipe.fit(x, y)
            against_onnxruntime(without_zipmap(pipe, x), {"X": x[:40]},
                                lambda ours, ref: np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5),
                                input_shapes={"X": (40, x.shape[1])}, fallback=False)  # fmt: skip


def random_trees(rng: np.random.Generator, trees: int, features: int, modes: list[str], targets: int = 2):
    """ai.onnx.ml 3 TreeEnsembleRegressor attributes: `trees` random trees of depth up to 4, thresholds from a small
    grid (inputs drawn from it hit them exactly), each branch's mode from `modes`, NaN sent either way."""
    attrs = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_modes", "nodes_values",
                             "nodes_truenodeids", "nodes_falsenodeids", "nodes_missing_value_tracks_true",
                             "target_treeids", "target_nodeids", "target_ids", "target_weights")}  # fmt: skip
    count = [0]

    def grow(t: int, depth: int) -> int:
        me = count[0]
        count[0] += 1
        leaf = depth == 0 or rng.random() < 0.2
        attrs["nodes_treeids"].append(t)
        attrs["nodes_nodeids"].append(me)
        attrs["nodes_featureids"].append(int(rng.integers(features)))
        attrs["nodes_modes"].append("LEAF" if leaf else str(rng.choice(modes)))
        attrs["nodes_values"].append(float(rng.integers(-2, 3)) / 2)
        attrs["nodes_missing_value_tracks_true"].append(int(rng.integers(2)))
        slot = len(attrs["nodes_truenodeids"])
        attrs["nodes_truenodeids"].append(0)
        attrs["nodes_falsenodeids"].append(0)
        if leaf:
            for k in rng.choice(targets, int(rng.integers(1, targets + 1)), replace=False):
                attrs["target_treeids"].append(t)
                attrs["target_nodeids"].append(me)
                attrs["target_ids"].append(int(k))
                attrs["target_weights"].append(float(rng.standard_normal()))
        else:
            attrs["nodes_truenodeids"][slot] = grow(t, depth - 1)
            attrs["nodes_falsenodeids"][slot] = grow(t, depth - 1)
        return me

    for t in range(trees):
        count[0] = 0
        grow(t, 4)
    return attrs


@pytest.mark.parametrize("modes,aggregate", [
    (["BRANCH_LEQ"], "SUM"), (["BRANCH_LT", "BRANCH_GTE", "BRANCH_GT"], "AVERAGE"),
    (["BRANCH_EQ", "BRANCH_NEQ", "BRANCH_LEQ"], "SUM"), (["BRANCH_LEQ", "BRANCH_GT"], "MIN"),
    (["BRANCH_NEQ", "BRANCH_LT"], "MAX"),
])  # fmt: skip
def test_tree_comparisons(modes, aggregate):
    """Every comparison of ai.onnx.ml's trees, NaN going either way, on inputs equal to the thresholds, just off
    them, and NaN (one table of `x <= split` nodes in Ember, some over -x), and each aggregate, against
    onnxruntime: within float32 rounding of sums of a few weights."""
    rng = np.random.default_rng(len(modes) + len(aggregate))
    attrs = random_trees(rng, 6, 3, modes) | {"n_targets": 2, "aggregate_function": aggregate,
                                              "base_values": [0.25, -0.5]}  # fmt: skip
    x = rng.integers(-2, 3, (64, 3)).astype(np.float32) / 2
    x[::5, 1] = np.nan
    x[1::7, 0] += np.float32(1e-7)
    x[2::7, 2] -= np.float32(1e-7)
    check(one_node("TreeEnsembleRegressor", attrs, (64, 3), [("y", F, (64, 2))]), x)


def test_tree_ensemble_version_5():
    """ai.onnx.ml 5's TreeEnsemble (leaves of their own; set membership), against onnxruntime."""
    v5 = {"nodes_featureids": [0, 1, 0], "nodes_splits": numpy_helper.from_array(np.array([0.5, 0, 1.5], np.float32)),
          "nodes_modes": numpy_helper.from_array(np.array([0, 6, 3], np.uint8)), "nodes_truenodeids": [1, 0, 2],
          "nodes_trueleafs": [0, 1, 1], "nodes_falsenodeids": [2, 1, 3], "nodes_falseleafs": [0, 1, 1],
          "nodes_missing_value_tracks_true": [0, 1, 0], "leaf_targetids": [0, 1, 0, 1],
          "leaf_weights": numpy_helper.from_array(np.array([1.0, 2.0, 3.0, 4.0], np.float32)),
          "membership_values": numpy_helper.from_array(np.array([1, 2, np.nan, 0], np.float32)), "n_targets": 2,
          "tree_roots": [0], "post_transform": 0, "aggregate_function": 1}  # fmt: skip
    node = helper.make_node("TreeEnsemble", ["x"], ["y"], domain="ai.onnx.ml", **v5)
    graph = helper.make_graph([node], "v5", [helper.make_tensor_value_info("x", F, (6, 2))],
                              [helper.make_tensor_value_info("y", F, (6, 2))])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("ai.onnx.ml", 5)])
    x = np.array([[0, 1], [0, 2], [0, 3], [1, 0], [2, 0], [0, np.nan]], np.float32)
    check(model, x)


def test_scikit_learn_trees():
    """Decision trees, random forests and gradient boosting (regressors and classifiers, binary too) as skl2onnx
    writes them (TreeEnsembleRegressor/Classifier of ai.onnx.ml 3), compiled to native code (the TreeWalk kernel):
    regressors within float32 rounding of values in the hundreds."""
    pytest.importorskip("skl2onnx")
    from sklearn.datasets import load_breast_cancer, load_diabetes, load_digits
    from sklearn.ensemble import (
        GradientBoostingClassifier,
        GradientBoostingRegressor,
        RandomForestClassifier,
        RandomForestRegressor,
    )
    from sklearn.tree import DecisionTreeClassifier

    cases = [(RandomForestRegressor(n_estimators=4, max_depth=5, random_state=0), load_diabetes),
             (GradientBoostingRegressor(n_estimators=8, random_state=0), load_diabetes),
             (DecisionTreeClassifier(max_depth=5, random_state=0), load_digits),
             (RandomForestClassifier(n_estimators=4, max_depth=4, random_state=0), load_digits),
             (GradientBoostingClassifier(n_estimators=4, random_state=0), load_digits),
             (RandomForestClassifier(n_estimators=4, max_depth=4, random_state=0), load_breast_cancer),
             (GradientBoostingClassifier(n_estimators=4, random_state=0), load_breast_cancer)]  # fmt: skip
    for model, data in cases:
        x, y = data(return_X_y=True)
        x = x.astype(np.float32)
        model.fit(x, y)
        against_onnxruntime(without_zipmap(model, x), {"X": x[:40]}, lambda ours, ref: np.testing.assert_allclose(
            ours, ref, rtol=1e-6, atol=1e-5 * max(1.0, float(np.abs(ref).max()))),
                            input_shapes={"X": (40, x.shape[1])}, fallback=False)  # fmt: skip


def test_scikit_learn_support_vector_regression():
    """SVMRegressor with each kernel (linear, polynomial, RBF, sigmoid: the RBF distance as |x|^2 - 2 x.v + |v|^2),
    and a one-class SVM (its sign), relative to the output's scale."""
    pytest.importorskip("skl2onnx")
    from sklearn.datasets import load_diabetes
    from sklearn.svm import SVR, OneClassSVM

    x, y = load_diabetes(return_X_y=True)
    x = x.astype(np.float32)
    for model in (SVR(kernel="linear"), SVR(kernel="poly", degree=2), SVR(kernel="rbf"), SVR(kernel="sigmoid"),
                  OneClassSVM()):  # fmt: skip
        model.fit(x[:200], *([] if isinstance(model, OneClassSVM) else [y[:200]]))
        against_onnxruntime(without_zipmap(model, x), {"X": x[200:240]}, lambda ours, ref: np.testing.assert_allclose(
            ours, ref, rtol=1e-5, atol=1e-6 * max(1.0, float(np.abs(ref).max()))),
                            input_shapes={"X": (40, x.shape[1])}, fallback=False)  # fmt: skip


def test_scikit_learn_support_vector_classification():
    """SVC (SVMClassifier: one-vs-one votes over the pairs' decision values) with each kernel, two and three
    classes, string labels, and Platt probabilities (pairwise coupling, which Ember runs in its reference
    evaluator): labels exact, scores and probabilities within float32 rounding of onnxruntime's."""
    skl2onnx = pytest.importorskip("skl2onnx")
    from sklearn.datasets import load_breast_cancer, load_iris
    from sklearn.svm import SVC

    iris, cancer = load_iris(return_X_y=True), load_breast_cancer(return_X_y=True)
    names = np.array(["setosa", "versicolor", "virginica"])
    cases = [(SVC(kernel="rbf"), *iris), (SVC(kernel="linear"), iris[0], names[iris[1]]),
             (SVC(kernel="poly", degree=2), *cancer), (SVC(kernel="sigmoid", gamma=0.001), *cancer),
             (SVC(probability=True, random_state=0), *iris), (SVC(probability=True, random_state=0), *cancer)]
    for model, x, y in cases:
        x = (x / np.abs(x).max(axis=0)).astype(np.float32)
        model.fit(x[::2], y[::2])
        against_onnxruntime(skl2onnx.to_onnx(model, x[:1]), {"X": x[1::2][:60]},
                            lambda ours, ref: same_outputs(ours, ref, tol=1e-4))


@pytest.mark.parametrize("labels", [{"classlabels_ints": [3, 7]}, {"classlabels_strings": ["a", "b"]}])
@pytest.mark.parametrize("signs", ["positive", "mixed"])
def test_binary_svm_labels_follow_the_vote(labels, signs):
    """Two classes: the label is the first class where the decision value is positive, whatever the signs of the
    coefficients (ONNX's reference evaluator always gives all-positive ones the second class; onnxruntime, and
    Ember, do not)."""
    rng = np.random.default_rng(len(signs))
    coef = rng.random(3) * (1 if signs == "positive" else np.array([1.0, -1.0, 1.0]))
    vectors, x = rng.standard_normal((3, 2)), rng.standard_normal((16, 2)).astype(np.float32)
    kernel = np.exp(-0.5 * ((x[:, None, :] - vectors[None]) ** 2).sum(axis=-1))
    rho = -float(np.median(kernel @ coef)) + 1e-3  # (half the rows on each side)
    attrs = {"coefficients": list(coef), "kernel_type": "RBF", "kernel_params": [0.5, 0.0, 3.0], "rho": [rho],
             "support_vectors": list(vectors.ravel()), "vectors_per_class": [1, 2], **labels}  # fmt: skip
    kind = I64 if "classlabels_ints" in labels else TensorProto.STRING
    model = one_node("SVMClassifier", attrs, (16, 2), [("label", kind, (16,)), ("scores", F, (16, 2))])
    against_onnxruntime(model, {"x": x}, same_outputs)
    labels_out = ember.compile(model).run({"x": x})["label"]
    assert len(set(labels_out.tolist())) == 2  # (both classes occur: the vote decides)

