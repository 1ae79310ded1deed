"""The non-GEMM kernel classes of the zoo's transformer and NHWC models, as small ONNX graphs: Ember against
onnxruntime in one process, 1 thread, process CPU time, calls interleaved (`interleaved_medians`).

    python bench/zoo_classes.py [--only back_20x192,ln_128x768] [--repeat 200] [--threads 1]

Cases (shapes of bench/zoo.py's models):
  back_HxC   convnext's block end: [H*W, C] -> [1, H, W, C] -> NCHW, times a per-channel scale, plus the residual
  front_HxC  convnext's block start: depthwise 7x7 (NCHW) -> NHWC -> LayerNorm over C
  ln_RxC     LayerNormalization over rows of C (BERT 128x768, ViT 197x768, Whisper 750x384, convnext 5x5x768)
  gelu_RxC   GELU in the exported erf form (Div, Erf, Add, Mul, Mul), Whisper's FFN width
The ratio is onnxruntime / Ember (> 1: Ember faster); `err` is the max abs difference from onnxruntime.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def _model(nodes: list, inputs: dict[str, list[int]], outputs: dict[str, list[int]], inits: dict[str, np.ndarray]):
    graph = helper.make_graph(nodes, "case", [helper.make_tensor_value_info(k, TensorProto.FLOAT, s) for k, s in
                                              inputs.items()],
                              [helper.make_tensor_value_info(k, TensorProto.FLOAT, s) for k, s in outputs.items()],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def back(h: int, c: int, rng: np.random.Generator):
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 3, 1, 2]),
             helper.make_node("Mul", ["t", "gamma"], ["m"]), helper.make_node("Add", ["m", "res"], ["y"])]  # fmt: skip
    inits = {"shape": np.array([1, h, h, c], np.int64), "gamma": rng.standard_normal((c, 1, 1)).astype(np.float32)}
    m = _model(nodes, {"x": [h * h, c], "res": [1, c, h, h]}, {"y": [1, c, h, h]}, inits)
    return m, {"x": rng.standard_normal((h * h, c)), "res": rng.standard_normal((1, c, h, h))}


def front(h: int, c: int, rng: np.random.Generator):
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["d"], group=c, kernel_shape=[7, 7], pads=[3, 3, 3, 3]),
             helper.make_node("Transpose", ["d"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("LayerNormalization", ["t", "g", "be"], ["y"], axis=-1, epsilon=1e-6)]  # fmt: skip
    inits = {"w": rng.standard_normal((c, 1, 7, 7)).astype(np.float32) * 0.1, "b": rng.standard_normal(c),
             "g": rng.standard_normal(c), "be": rng.standard_normal(c)}  # fmt: skip
    m = _model(nodes, {"x": [1, c, h, h]}, {"y": [1, h, h, c]}, {k: np.float32(v) for k, v in inits.items()})
    return m, {"x": rng.standard_normal((1, c, h, h))}


def layer_norm(r: int, c: int, rng: np.random.Generator):
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "be"], ["y"], axis=-1, epsilon=1e-5)]
    inits = {"g": np.float32(rng.standard_normal(c)), "be": np.float32(rng.standard_normal(c))}
    return _model(nodes, {"x": [1, r, c]}, {"y": [1, r, c]}, inits), {"x": rng.standard_normal((1, r, c))}


def gelu(r: int, c: int, rng: np.random.Generator):
    nodes = [helper.make_node("Div", ["x", "sq"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["p"]), helper.make_node("Mul", ["x", "p"], ["q"]),
             helper.make_node("Mul", ["q", "half"], ["y"])]  # fmt: skip
    inits = {"sq": np.float32(math.sqrt(2)), "one": np.float32(1.0), "half": np.float32(0.5)}
    return _model(nodes, {"x": [r, c]}, {"y": [r, c]}, inits), {"x": rng.standard_normal((r, c))}


CASES = {f"back_{h}x{c}": (back, h, c) for h, c in [(40, 96), (20, 192), (10, 384), (5, 768)]}
CASES |= {f"front_{h}x{c}": (front, h, c) for h, c in [(40, 96), (20, 192), (10, 384), (5, 768)]}
CASES |= {f"ln_{r}x{c}": (layer_norm, r, c) for r, c in [(25, 768), (128, 768), (197, 768), (750, 384), (1600, 96)]}
CASES |= {"gelu_750x1536": (gelu, 750, 1536)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(CASES))
    p.add_argument("--repeat", type=int, default=200, help="timed calls per system")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import ember
    from ember.runtime.compare import interleaved_medians, onnxruntime_session

    print(f"{'case':<16} {'ember us':>9} {'ort us':>9} {'ratio':>6} {'err':>8}   ({args.threads} thread(s), process "
          "CPU time, interleaved medians)")  # fmt: skip
    for name in args.only.split(","):
        build, a, b = CASES[name]
        model, feeds = build(a, b, np.random.default_rng(0))
        feeds = {k: np.asarray(v, np.float32) for k, v in feeds.items()}
        m = ember.compile(model, target=f"c -threads={args.threads}", fallback=False)
        sess = onnxruntime_session(model, args.threads)
        err = float(np.abs(m.run(feeds)["y"] - sess.run(None, feeds)[0]).max())
        systems = {"ember": lambda m=m, f=feeds: m.run(f), "ort": lambda s=sess, f=feeds: s.run(None, f)}
        t = interleaved_medians(systems, args.repeat, clock=time.process_time)
        print(f"{name:<16} {t['ember'] * 1e6:9.1f} {t['ort'] * 1e6:9.1f} {t['ort'] / t['ember']:6.2f} {err:8.1e}",
              flush=True)


if __name__ == "__main__":
    main()
