"""Casts to and from the narrow ONNX formats (float8, float4, int4): Ember's kernels against onnxruntime and ml_dtypes.

    python bench/narrow.py [--n 1048576] [--threads 1] [--repeat 20]

Each case is a one-node Cast model on n elements. Ember (target "c -threads=N"), onnxruntime
(intra_op_num_threads=N; where it has a kernel for the type and takes the input, which rules out the ml_dtypes
arrays of float8/int4 inputs) and numpy's astype through ml_dtypes run in this process, timed in interleaved rounds
(`ember.runtime.compare.interleaved_medians`). Every engine's output is checked against onnx's reference evaluator
first (bit for bit; "differs" marks one that does not agree, e.g. ml_dtypes, which does not saturate); the table
gives each median in microseconds and its ratio to Ember's.
"""

from __future__ import annotations

import argparse

import ml_dtypes
import numpy as np
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import ember
from ember.runtime.compare import interleaved_medians, onnxruntime_session

TYPES = {"float32": TensorProto.FLOAT, "float8_e4m3fn": TensorProto.FLOAT8E4M3FN, "float8_e5m2": TensorProto.FLOAT8E5M2,
         "float4_e2m1fn": TensorProto.FLOAT4E2M1, "int4": TensorProto.INT4}  # fmt: skip
CASES = [("float32", "float8_e4m3fn"), ("float8_e4m3fn", "float32"), ("float32", "float8_e5m2"),
         ("float8_e5m2", "float32"), ("float32", "float4_e2m1fn"), ("float32", "int4"),
         ("int4", "float32")]  # fmt: skip


def np_dtype(name: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, name, None) or name)


def cast_model(src: str, dst: str, n: int):
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=TYPES[dst])], "cast",
        [helper.make_tensor_value_info("x", TYPES[src], [n])], [helper.make_tensor_value_info("y", TYPES[dst], [n])],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-equal (NaN equal to NaN for float32). onnxruntime returns float8 outputs as uint8 codes."""
    if a.dtype != b.dtype and not (a.dtype == np.uint8 and b.dtype.itemsize == 1):
        return False
    if a.dtype == np.float32:
        return bool(((a == b) | (np.isnan(a) & np.isnan(b))).all())
    return bool((a.view(np.uint8) == b.view(np.uint8)).all())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1 << 20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    wide = (rng.standard_normal(args.n) * 8).astype(np.float32)
    print(f"Cast of {args.n} elements, {args.threads} thread(s); median microseconds (ratio to Ember)")
    print(f"{'case':32} {'ember':>9} {'onnxruntime':>18} {'ml_dtypes':>18}")
    for src, dst in CASES:
        x = wide if src == "float32" else wide.astype(np_dtype(src))
        model = cast_model(src, dst, args.n)
        (want,) = ReferenceEvaluator(model).run(None, {"x": x})
        compiled = ember.compile(model, target=f"c -threads={args.threads}", fallback=False)
        systems = {"ember": lambda c=compiled, x=x: c(x)}
        try:
            sess = onnxruntime_session(model, args.threads)
            systems["onnxruntime"] = lambda s=sess, x=x: s.run(None, {"x": x})[0]
        except Exception:  # noqa: BLE001 - onnxruntime has no kernel for this type pair
            pass
        target_type = np_dtype(dst)
        systems["ml_dtypes"] = lambda x=x, t=target_type: x.astype(t)  # no saturation: differs past the max
        checked = {}
        for k, fn in list(systems.items()):
            try:
                checked[k] = same(np.asarray(fn()), want)
            except Exception:  # noqa: BLE001 - onnxruntime takes no ml_dtypes arrays (float8/int4 inputs)
                del systems[k]
        times = interleaved_medians(systems, args.repeat)
        cells = []
        for k in ("onnxruntime", "ml_dtypes"):
            if k not in times:
                cells.append(f"{'-':>18}")
                continue
            mark = "" if checked[k] else " (differs)"
            cells.append(f"{times[k] * 1e6:9.0f} ({times[k] / times['ember']:4.1f}x){mark}")
        ok = "" if checked["ember"] else " EMBER DIFFERS"
        print(f"{src + ' -> ' + dst:32} {times['ember'] * 1e6:9.0f} {cells[0]} {cells[1]}{ok}")


if __name__ == "__main__":
    main()
