"""Neural-network operators on representative shapes: Ember's native kernels against onnxruntime.

    python bench/ops_nn.py [--threads 1] [--repeat 50] [--only conv3x3,matmul] [--json]

Each case is a single-node ONNX model with random inputs (weights as graph inputs, as a kernel sees
them: packing the weights is part of Ember's time). Both engines run in this process at the same
thread count (Ember: target "c -threads=N"; onnxruntime: intra_op_num_threads=N) and are timed the
same way: medians over `repeat` runs of whole inferences with inputs already bound (Ember:
`CompiledModel.benchmark`; onnxruntime: `run_with_iobinding`), after warm-up runs, alternating the
engines in rounds so that machine noise hits both. Outputs are checked against onnxruntime first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

import ember
from ember.runtime.compare import timed

# name -> (op, input shapes, attrs, flops or None, opset)
CASES: dict[str, tuple] = {
    "conv3x3": ("Conv", [(1, 64, 56, 56), (64, 64, 3, 3)], {"pads": [1, 1, 1, 1]}, 2 * 64 * 64 * 9 * 56 * 56),
    "conv3x3_s2": (
        "Conv",
        [(1, 128, 28, 28), (256, 128, 3, 3)],
        {"pads": [1, 1, 1, 1], "strides": [2, 2]},
        2 * 256 * 128 * 9 * 14 * 14,
    ),  # fmt: skip
    "conv1x1": ("Conv", [(1, 64, 56, 56), (256, 64, 1, 1)], {}, 2 * 256 * 64 * 56 * 56),
    "depthwise3x3": (
        "Conv",
        [(1, 32, 112, 112), (32, 1, 3, 3)],
        {"pads": [1, 1, 1, 1], "group": 32},
        2 * 32 * 9 * 112 * 112,
    ),  # fmt: skip
    "matmul": ("MatMul", [(128, 768), (768, 768)], {}, 2 * 128 * 768 * 768),
    "matmul_m1": ("MatMul", [(1, 768), (768, 768)], {}, 2 * 768 * 768),
    "gemm_fc": ("Gemm", [(1, 512), (1000, 512), (1000,)], {"transB": 1}, 2 * 512 * 1000),
    "maxpool3x3_s2": (
        "MaxPool",
        [(1, 64, 112, 112)],
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        None,
    ),  # fmt: skip
    "maxpool3x3_s2_ceil": (
        "MaxPool",
        [(1, 96, 109, 109)],
        {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
        None,
    ),  # fmt: skip  (SqueezeNet's first pooling)
    "softmax": ("Softmax", [(12, 128, 128)], {}, None),
    "layernorm": ("LayerNormalization", [(128, 768), (768,), (768,)], {}, None),
    "softmax_197": ("Softmax", [(12, 197, 197)], {}, None),  # ViT/DeiT attention probabilities
    "logsoftmax": ("LogSoftmax", [(128, 1000)], {}, None),
    # permutes of the zoo's worst injective kernels: ConvNeXt's NCHW <-> NHWC around its LayerNorm, DeiT's and
    # Swin's head split/merge (B, L, H, D) <-> (B, H, L, D), Swin's window partition
    "nchw_to_nhwc": ("Transpose", [(1, 96, 56, 56)], {"perm": [0, 2, 3, 1]}, None),
    "nhwc_to_nchw": ("Transpose", [(1, 56, 56, 96)], {"perm": [0, 3, 1, 2]}, None),
    "head_split": ("Transpose", [(1, 197, 12, 64)], {"perm": [0, 2, 1, 3]}, None),
    "head_merge": ("Transpose", [(1, 12, 197, 64)], {"perm": [0, 2, 1, 3]}, None),
    "window_part": ("Transpose", [(1, 8, 7, 8, 7, 96)], {"perm": [0, 1, 3, 2, 4, 5]}, None),
}


def model_of(op: str, shapes: list[tuple[int, ...]], attrs: dict, opset: int = 18) -> onnx.ModelProto:
    names = [f"x{i}" for i in range(len(shapes))]
    graph = helper.make_graph(
        [helper.make_node(op, names, ["y"], **attrs)], op.lower(),
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in zip(names, shapes)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(model)


def run_case(name: str, threads: int, repeat: int, rounds: int = 5) -> dict:
    op, shapes, attrs, flops = CASES[name]
    model = model_of(op, shapes, attrs)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    t0 = time.perf_counter()
    compiled = ember.compile(model, target=f"c -threads={threads}", fallback=False)
    compile_s = time.perf_counter() - t0
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    feeds = {f"x{i}": x for i, x in enumerate(xs)}
    expected = sess.run(None, feeds)[0]
    got = compiled(*xs)
    err = float(np.abs(got - expected).max() / max(float(np.abs(expected).max()), 1e-30))
    binding = sess.io_binding()
    for k, v in feeds.items():
        binding.bind_cpu_input(k, v)
    binding.bind_output("y", "cpu")
    ember_runs, ort_runs = [], []
    per_round = max(1, repeat // rounds)
    compiled.benchmark(xs, repeat=1, warmup=3)
    for _ in range(3):
        sess.run_with_iobinding(binding)
    for _ in range(rounds):
        ember_runs += compiled.benchmark(xs, repeat=per_round, warmup=1)["runs"]
        ort_runs += timed(lambda: sess.run_with_iobinding(binding), per_round)
    e, o = statistics.median(ember_runs), statistics.median(ort_runs)
    row = {"case": name, "op": op, "shapes": shapes, "ember_ms": e * 1e3, "ort_ms": o * 1e3, "ort_over_ember": o / e,
           "max_rel_err": err, "compile_s": compile_s}  # fmt: skip
    if flops:
        row["ember_gflops"] = flops / e / 1e9
        row["ort_gflops"] = flops / o / 1e9
    return row


def print_table(rows: list[dict], threads: int) -> None:
    print(f"\nEmber native kernels vs onnxruntime {ort.__version__}, {threads} thread(s), medians")
    head = ("case", "shapes", "ember ms", "ort ms", "ort/ember", "GFLOP/s", "rel err")
    print("{:<14} {:<34} {:>9} {:>9} {:>9} {:>13} {:>8}".format(*head))
    for r in rows:
        shapes = " ".join("x".join(map(str, s)) for s in r["shapes"])
        gf = f"{r['ember_gflops']:.0f} / {r['ort_gflops']:.0f}" if "ember_gflops" in r else ""
        print(f"{r['case']:<14} {shapes[:34]:<34} {r['ember_ms']:>9.3f} {r['ort_ms']:>9.3f} "
              f"{r['ort_over_ember']:>9.2f} {gf:>13} {r['max_rel_err']:>8.1e}")  # fmt: skip
    print("ort/ember > 1: Ember is faster; GFLOP/s as ember / onnxruntime")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=50, help="timed runs per engine and case")
    p.add_argument("--only", default=",".join(CASES), help="comma-separated subset of " + ",".join(CASES))
    p.add_argument("--json", action="store_true", help="print the rows as JSON on the last line")
    args = p.parse_args()
    rows = [run_case(name, args.threads, args.repeat) for name in args.only.split(",")]
    print_table(rows, args.threads)
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
