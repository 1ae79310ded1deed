"""TFLite and TensorFlow/Keras models through Ember against their frameworks: accuracy, compile time, latency.

    python bench/frontends.py [--threads N] [--models small_cnn,mobilenet_v2,...]

The models are the tests' (tests/frontend/test_tflite.py, test_tensorflow.py: random weights, small inputs). Per
model: the max relative error against the TFLite interpreter's reference kernels or Keras (int8: the max difference
in quantization steps), Ember's compile seconds, and the median latency of Ember, the TFLite interpreter (its
default kernels, XNNPACK for float) or Keras, measured in the same run. Needs ember[tf,tflite].
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "frontend"))

import tensorflow as tf  # noqa: E402
import test_tensorflow as tft  # noqa: E402
import test_tflite as tfl  # noqa: E402

import ember  # noqa: E402


def median_ms(fn, repeat: int = 20) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * float(np.median(times))


def tflite_row(name: str, int8: bool, target: str, workdir: Path) -> tuple:
    model = tfl.MODELS[name]()
    path = tfl.to_tflite(model, workdir / f"{name}{'_int8' if int8 else ''}.tflite", int8)
    x = tfl.quantize_input(path, tfl._inputs(model, np.random.default_rng(2))[0])
    ref = tfl.interpret(path, x)
    t = time.perf_counter()
    m = ember.compile(path, target=target)
    compile_s = time.perf_counter() - t
    y = m(x)
    if int8:
        err = f"{int(np.abs(y.astype(int) - ref.astype(int)).max())} steps"
    else:
        err = f"{np.abs(y - ref).max() / np.abs(ref).max():.1e}"
    it = tf.lite.Interpreter(model_path=path, num_threads=m.plan.threads or 1)
    it.allocate_tensors()
    index = it.get_input_details()[0]["index"]

    def run_tflite():
        it.set_tensor(index, x)
        it.invoke()

    return (f"{name} tflite {'int8' if int8 else 'float32'}", err, compile_s, median_ms(lambda: m(x)),
            median_ms(run_tflite), "tflite")  # fmt: skip


def keras_row(name: str, target: str) -> tuple:
    model = {"mobilenet_v2": tft.mobilenet_v2, "transformer": tft.transformer_block}[name]()
    shape = (2, 16, 32) if name == "transformer" else (1, 32, 32, 3)
    x = np.random.default_rng(0).uniform(-1, 1, shape).astype("float32")
    ref = np.asarray(model(x, training=False))
    t = time.perf_counter()
    m = ember.compile(model, target=target)
    compile_s = time.perf_counter() - t
    err = f"{np.abs(m(x) - ref).max() / np.abs(ref).max():.1e}"
    fn = tf.function(lambda t: model(t, training=False))
    xt = tf.constant(x)
    return (f"{name} keras", err, compile_s, median_ms(lambda: m(x)), median_ms(lambda: fn(xt).numpy()), "keras")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--models", default="small_cnn,mobilenet_v2,mobilenet_v3,transformer")
    args = p.parse_args()
    target = f"c -threads={args.threads}"
    names = args.models.split(",")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for name in names:
            for int8 in (False, True):
                if int8 and name not in ("small_cnn", "mobilenet_v2"):
                    continue
                rows.append(tflite_row(name, int8, target, Path(d)))
        rows += [keras_row(n, target) for n in names if n in ("mobilenet_v2", "transformer")]
    print(f"{'model':<28} {'max err':>10} {'compile s':>10} {'ember ms':>9} {'ref ms':>8} {'ratio':>6}  ref")
    for name, err, cs, ours, theirs, ref in rows:
        print(f"{name:<28} {err:>10} {cs:>10.1f} {ours:>9.3f} {theirs:>8.3f} {theirs / ours:>6.2f}  {ref}")


if __name__ == "__main__":
    main()
