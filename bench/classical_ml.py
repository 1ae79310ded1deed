"""scikit-learn models as skl2onnx converts them by default (ZipMap outputs, string labels, symbolic batch), in
Ember and in onnxruntime, in one run.

    python bench/classical_ml.py [--models rf_reg,svc,...] [--batch 1,1000] [--threads 1] [--repeat 30] [--json]

Each model is trained on a data set that ships with scikit-learn (digits, breast cancer, diabetes, iris) and
converted with `skl2onnx.to_onnx(model, X[:1])`. Per batch size: the median latency of a call of Ember and of
onnxruntime on the same rows, taken in turns (`ember.runtime.compare.interleaved_medians`), both with --threads
threads, and their ratio (onnxruntime's time / Ember's: above 1, Ember is faster); the outputs are compared
(labels exactly, scores and ZipMap's maps by their largest difference relative to the largest value).
Ember's column includes decoding the outputs (ZipMap's dicts, string labels), as onnxruntime's does. Models that
Ember runs partly in its reference evaluator (numpy) say so in the last column. With --json the last line is
`{"models": {NAME: {BATCH: {"ember_ms", "ort_ms", "error"}}}}`.
"""

from __future__ import annotations

import argparse
import json
import warnings
from collections.abc import Callable

import numpy as np

import ember
from ember.runtime.compare import interleaved_medians, onnxruntime_session


def _data(name: str) -> tuple[np.ndarray, np.ndarray]:
    from sklearn import datasets

    x, y = getattr(datasets, f"load_{name}")(return_X_y=True)
    return x.astype(np.float32), y


def models() -> dict[str, Callable[[], tuple]]:
    """name -> () -> (unfitted estimator, data set name, targets transform)."""
    from sklearn import ensemble, linear_model, neighbors, neural_network, pipeline, preprocessing, svm, tree

    iris_names = lambda y: np.array(["setosa", "versicolor", "virginica"])[y]  # noqa: E731
    return {
        "logreg": lambda: (linear_model.LogisticRegression(max_iter=500), "digits", None),
        "logreg_strings": lambda: (linear_model.LogisticRegression(max_iter=500), "iris", iris_names),
        "scaler_ridge": lambda: (pipeline.make_pipeline(preprocessing.StandardScaler(), linear_model.Ridge()),
                                 "diabetes", None),  # fmt: skip
        "mlp": lambda: (neural_network.MLPClassifier((64,), max_iter=100, random_state=0), "digits", None),
        "svc": lambda: (svm.SVC(), "digits", None),
        "svr": lambda: (svm.SVR(), "diabetes", None),
        "tree": lambda: (tree.DecisionTreeClassifier(random_state=0), "digits", None),
        "rf_clf": lambda: (ensemble.RandomForestClassifier(100, random_state=0), "digits", None),
        "rf_reg": lambda: (ensemble.RandomForestRegressor(100, random_state=0), "diabetes", None),
        "gb_clf": lambda: (ensemble.GradientBoostingClassifier(n_estimators=100, random_state=0), "breast_cancer",
                           None),  # fmt: skip
        "extra_trees": lambda: (ensemble.ExtraTreesClassifier(100, random_state=0), "iris", iris_names),
        "knn": lambda: (neighbors.KNeighborsClassifier(), "digits", None),
    }


def _error(ours, ref) -> float:
    """The largest difference relative to the reference's largest value (labels: the fraction that differ)."""
    if isinstance(ref, list):  # ZipMap: a dict per row
        a = np.array([[d[k] for k in sorted(d)] for d in ours])
        b = np.array([[d[k] for k in sorted(d)] for d in ref])
        return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
    ref, ours = np.asarray(ref), np.asarray(ours)
    if ref.dtype.kind in "iuOU":
        return float(np.mean(ours != ref))
    return float(np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-30))


def run(name: str, batches: list[int], threads: int, repeat: int) -> dict:
    from skl2onnx import to_onnx

    est, data, target = models()[name]()
    x, y = _data(data)
    est.fit(x, target(y) if target else y)
    onx = to_onnx(est, x[:1])
    m = ember.compile(onx, target=f"c -threads={threads}")
    sess = onnxruntime_session(onx, threads)
    fallback = sorted(set(m.summary()["fallback_ops"]))
    out = {}
    for n in batches:
        rows = np.resize(x, (n, x.shape[1]))
        feeds = {"X": rows}
        err = max(_error(a, b) for a, b in zip(m.run(feeds).values(), sess.run(None, feeds), strict=True))
        med = interleaved_medians({"ember": lambda f=feeds: m.run(f), "ort": lambda f=feeds: sess.run(None, f)}, repeat)
        out[n] = {"ember_ms": med["ember"] * 1e3, "ort_ms": med["ort"] * 1e3, "error": err}
        print(f"{name:<15} {n:>6} {out[n]['ember_ms']:10.3f} {out[n]['ort_ms']:10.3f} "
              f"{out[n]['ort_ms'] / out[n]['ember_ms']:7.2f}x {err:9.1e}  {', '.join(fallback)}", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(models()))
    p.add_argument("--batch", default="1,1000", help="rows per call, comma-separated")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    warnings.filterwarnings("ignore")  # (scikit-learn's convergence and deprecation notes)
    print(f"{'model':<15} {'batch':>6} {'ember ms':>10} {'ort ms':>10} {'ort/ember':>8} {'max err':>9}  reference ops")
    results = {"models": {}}
    for name in args.models.split(","):
        results["models"][name] = run(name, [int(b) for b in args.batch.split(",")], args.threads, args.repeat)
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
