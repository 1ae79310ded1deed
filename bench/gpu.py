"""Ember's CUDA kernels against cuBLAS and PyTorch eager on the same GPU.

    python bench/gpu.py [--size 4096] [--models resnet18,mobilenet_v2,bert4,conv_stack,mlp] [--repeat 20] [--json]

1. matmul: a size^3 float32 product (an ONNX MatMul of two inputs through `ember.compile(..., target="cuda")`:
   the GPU GEMM template), kernel time against `torch.matmul` (cuBLAS) on resident tensors: GFLOP/s and the
   fraction of cuBLAS;
2. models (`ember.zoo_torch`, exported with torch.onnx): per inference, the kernels with the inputs resident on the
   device (`benchmark(copies=False)`) and a whole call with copies in and out, against PyTorch eager
   (`torch.no_grad`, inputs on the GPU): the fraction of PyTorch eager (torch ms / ember ms, 1.0 = as fast).

TF32 is off on both sides (float32 products stay float32). Outputs are checked against PyTorch. The target is
"cuda -arch=sm_XY" for the GPU's compute capability. Needs a CUDA GPU, cuda-python and torch built with CUDA:
without them the bench says which is missing and exits with status 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

MODELS = ("resnet18", "mobilenet_v2", "bert4", "conv_stack", "mlp")


def requirements() -> str | None:
    """None when the bench can run here, else what is missing."""
    from ember.codegen.cuda import find_nvcc
    from ember.runtime.cuda import available

    if find_nvcc() is None:
        return "nvcc is not installed (ember compiles CUDA kernels with it)"
    reason = available()
    if reason is not None:
        return f"no CUDA GPU for ember: {reason}"
    try:
        import torch
    except ImportError:
        return "torch is not installed (the references are cuBLAS and PyTorch eager through torch)"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} has no CUDA device (a CPU-only build?)"
    return None


def torch_seconds(fn, repeat: int, warmup: int = 3) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def bench_matmul(n: int, target: str, repeat: int) -> dict:
    import onnx
    import torch
    from onnx import TensorProto, helper

    import ember

    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "matmul",
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [n, n]) for x in "ab"],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, [n, n])])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    t0 = time.perf_counter()
    m = ember.compile(model, target=target, fallback=False)
    compile_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    ours = m.benchmark([a, b], repeat=repeat, copies=False)["median"]
    ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    theirs = torch_seconds(lambda: torch.matmul(ta, tb), repeat)
    ref = torch.matmul(ta, tb).cpu().numpy()
    err = float(np.abs(m(a, b) - ref).max() / np.abs(ref).max())
    flops = 2.0 * n**3
    return {"name": f"matmul {n}^3", "ember_ms": ours * 1e3, "cublas_ms": theirs * 1e3,
            "ember_gflops": flops / ours / 1e9, "cublas_gflops": flops / theirs / 1e9,
            "fraction_of_cublas": theirs / ours, "max_rel_error": err, "compile_s": compile_s}  # fmt: skip


def bench_model(name: str, target: str, repeat: int) -> dict:
    import torch

    import ember
    from ember import zoo_torch

    module, args, names = zoo_torch.example(name)
    model = zoo_torch.to_onnx(module, args, names)
    t0 = time.perf_counter()
    m = ember.compile(model, target=target)
    compile_s = time.perf_counter() - t0
    feeds = [a.numpy() for a in args]
    kernels = m.benchmark(feeds, repeat=repeat, copies=False)["median"]
    call = m.benchmark(feeds, repeat=repeat)["median"]
    gpu = module.cuda()
    gargs = tuple(a.cuda() for a in args)
    with torch.no_grad():
        eager = torch_seconds(lambda: gpu(*gargs), repeat)
        ref = gpu(*gargs).float().cpu().numpy()
    y = m(*feeds)
    y = y[0] if isinstance(y, tuple) else y
    err = float(np.abs(y - ref).max() / max(float(np.abs(ref).max()), 1e-30))
    s = m.summary()
    return {"name": name, "ember_ms": kernels * 1e3, "ember_call_ms": call * 1e3, "torch_ms": eager * 1e3,
            "fraction_of_torch": eager / kernels, "kernels": s["kernels"], "launches": s["device_launches_per_run"],
            "fallback_ops": s["fallback_ops"], "max_rel_error": err, "compile_s": compile_s}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=4096, help="matmul size (default 4096)")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)} ('' for none)")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--target", default="", help="ember target (default: cuda -arch=sm_XY of device 0)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = p.parse_args(argv)
    missing = requirements()
    if missing is not None:
        print(f"bench/gpu.py needs a CUDA GPU: {missing}", file=sys.stderr)
        return 1
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    major, minor = torch.cuda.get_device_capability(0)
    target = args.target or f"cuda -arch=sm_{major}{minor}"
    device = torch.cuda.get_device_name(0)
    results = {"device": device, "target": target, "matmul": None, "models": []}
    if args.size:
        r = results["matmul"] = bench_matmul(args.size, target, args.repeat)
        if not args.json:
            print(f"{device}, ember target '{target}'\n")
            print(f"{'':<16} {'ember ms':>9} {'cuBLAS ms':>9} {'ember GF/s':>10} {'cuBLAS GF/s':>11} {'of cuBLAS':>9}")
            print(f"{r['name']:<16} {r['ember_ms']:>9.3f} {r['cublas_ms']:>9.3f} {r['ember_gflops']:>10.0f} "
                  f"{r['cublas_gflops']:>11.0f} {r['fraction_of_cublas']:>9.1%}   "
                  f"(max rel. error {r['max_rel_error']:.1e})")  # fmt: skip
    names = [n for n in args.models.split(",") if n]
    if names and not args.json:
        print(f"\n{'model':<16} {'kernels ms':>10} {'call ms':>9} {'torch ms':>9} {'of torch':>9} {'launches':>8}")
    for name in names:
        r = bench_model(name, target, args.repeat)
        results["models"].append(r)
        if not args.json:
            fb = f"  fallback: {', '.join(r['fallback_ops'])}" if r["fallback_ops"] else ""
            print(f"{name:<16} {r['ember_ms']:>10.3f} {r['ember_call_ms']:>9.3f} {r['torch_ms']:>9.3f} "
                  f"{r['fraction_of_torch']:>9.1%} {r['launches']:>8}   "
                  f"(max rel. error {r['max_rel_error']:.1e}){fb}")  # fmt: skip
    if args.json:
        print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
