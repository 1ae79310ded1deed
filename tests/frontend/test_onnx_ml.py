"""ONNX-ML preprocessing and linear models (`ember.frontend.onnx_ml`) against onnxruntime's own kernels: single
nodes built by hand on random inputs, and scikit-learn pipelines as skl2onnx converts them (trained on the
datasets that ship with scikit-learn)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ember

ort = pytest.importorskip("onnxruntime")
F, I64 = TensorProto.FLOAT, TensorProto.INT64


def one_node(op: str, attrs: dict, x_shape: tuple, outs: list[tuple[str, int, tuple]]) -> onnx.ModelProto:
    node = helper.make_node(op, ["x"], [o[0] for o in outs], domain="ai.onnx.ml", **attrs)
    graph = helper.make_graph([node], op, [helper.make_tensor_value_info("x", F, x_shape)],
                              [helper.make_tensor_value_info(n, t, s) for n, t, s in outs])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])


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


def test_string_labels_are_refused_by_name():
    m = one_node("LinearClassifier", {"coefficients": [1.0, 2.0, 3.0, 4.0], "classlabels_strings": ["a", "b"]},
                 (2, 2), [("label", TensorProto.STRING, (2,)), ("scores", F, (2, 2))])  # fmt: skip
    with pytest.raises(Exception, match="string class labels"):
        ember.compile(m)


def test_scikit_learn_pipelines():
    skl2onnx = pytest.importorskip("skl2onnx")
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
            last = pipe.steps[-1][1]
            options = {id(last): {"zipmap": False}} if hasattr(last, "predict_proba") else None
            m = skl2onnx.to_onnx(pipe, x[:1], options=options, target_opset={"": 17, "ai.onnx.ml": 3})
            feeds = {"X": x[:40]}
            refs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
            outs = ember.compile(m, input_shapes={"X": (40, x.shape[1])}, fallback=False).run(feeds)
            for ours, ref in zip(outs.values(), refs, strict=True):
                np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


def test_scikit_learn_trees():
    """Decision trees, random forests and gradient boosting (regressors and classifiers, binary too) as skl2onnx
    writes them: TreeEnsembleRegressor/Classifier of ai.onnx.ml 3, rewritten as version 5's TreeEnsemble, one tree
    copy per target (run by the reference evaluator: TreeEnsemble has no native kernel); regressors within float32
    rounding of values in the hundreds."""
    skl2onnx = pytest.importorskip("skl2onnx")
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
        options = {id(model): {"zipmap": False}} if hasattr(model, "predict_proba") else None
        m = skl2onnx.to_onnx(model, x[:1], options=options, target_opset={"": 17, "ai.onnx.ml": 3})
        feeds = {"X": x[:40]}
        refs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        outs = ember.compile(m, input_shapes={"X": (40, x.shape[1])}).run(feeds)
        for ours, ref in zip(outs.values(), refs, strict=True):
            np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-5 * max(1.0, float(np.abs(ref).max())))


def test_scikit_learn_support_vector_regression():
    """SVMRegressor with each kernel (linear, polynomial, RBF, sigmoid: the RBF distance as |x|^2 - 2 x.v + |v|^2),
    and a one-class SVM (its sign), relative to the output's scale."""
    skl2onnx = pytest.importorskip("skl2onnx")
    from sklearn.datasets import load_diabetes
    from sklearn.svm import SVR, OneClassSVM

    x, y = load_diabetes(return_X_y=True)
    x = x.astype(np.float32)
    for model in (SVR(kernel="linear"), SVR(kernel="poly", degree=2), SVR(kernel="rbf"), SVR(kernel="sigmoid"),
                  OneClassSVM()):  # fmt: skip
        model.fit(x[:200], *([] if isinstance(model, OneClassSVM) else [y[:200]]))
        m = skl2onnx.to_onnx(model, x[:1], target_opset={"": 17, "ai.onnx.ml": 3})
        feeds = {"X": x[200:240]}
        refs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        outs = ember.compile(m, input_shapes={"X": (40, x.shape[1])}, fallback=False).run(feeds)
        for ours, ref in zip(outs.values(), refs, strict=True):
            np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6 * max(1.0, float(np.abs(ref).max())))
