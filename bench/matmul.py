"""The classic GEMM schedule progression on this machine, against numpy (OpenBLAS) and FMA peak.

    python bench/matmul.py [--size 1024] [--threads 1,2] [--target c,llvm] [--json]

Per schedule and thread count: median ms, GFLOP/s, fraction of numpy's sgemm at the same thread
count and fraction of the machine's float32 peak (measured by an FMA microbenchmark in this run).
With several targets (`--target c,llvm`), each target's table is printed and the JSON holds them under
"targets" (the first target's results also stay at the top level), with each target's best as a
fraction of the first's.
OpenBLAS is measured at its best: when OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are set (they pin an
older kernel on some machines), the bench re-runs itself without them; --keep-openblas-env opts out.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import ember
from ember.codegen.toolchain import CompileError, compile_c
from ember.demo import SCHEDULES, GemmTiles
from ember.target import Target

PINNED = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def fma_peak_source(lanes: int, threads: int, chains: int = 12) -> str:
    decl = "\n".join(f"    v{i} = v{i} * m + a;" for i in range(chains))
    init = "\n".join(f"    vec v{i} = (vec){{}} + (float)(1 + {i}) * 1e-3f;" for i in range(chains))
    total = " + ".join(f"v{i}[0]" for i in range(chains))
    return f"""
#include <stdint.h>
typedef float vec __attribute__((vector_size({4 * lanes})));
float fma_loop(int64_t iters) {{
  float out = 0.0f;
  #pragma omp parallel reduction(+:out) num_threads({threads})
  {{
    vec m = (vec){{}} + 0.999999f, a = (vec){{}} + 1e-7f;
{init}
    for (int64_t it = 0; it < iters; ++it) {{
{decl}
    }}
    out += {total};
  }}
  return out;
}}
"""


def measure_peak(threads: int, lanes: int, chains: int = 12) -> float:
    """float32 GFLOP/s of independent vector FMA chains on `threads` threads (NaN without a C compiler)."""
    src = fma_peak_source(lanes, threads, chains)
    try:
        lib = ctypes.CDLL(str(compile_c(src, Target.parse("c").cflags(), name="fma_peak")))
    except CompileError:
        return float("nan")
    lib.fma_loop.argtypes = [ctypes.c_int64]
    lib.fma_loop.restype = ctypes.c_float
    iters = 2_000_000
    lib.fma_loop(iters // 10)
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        lib.fma_loop(iters)
        runs.append(time.perf_counter() - t0)
    return 2 * lanes * chains * iters * threads / statistics.median(runs) / 1e9


def numpy_gflops(a: np.ndarray, b: np.ndarray, threads: int) -> tuple[float, str]:
    from threadpoolctl import threadpool_info, threadpool_limits

    with threadpool_limits(limits=threads, user_api="blas"):
        for _ in range(3):
            a @ b
        runs = []
        for _ in range(15):
            t0 = time.perf_counter()
            a @ b
            runs.append(time.perf_counter() - t0)
    info = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    kernel = f"{info[0].get('internal_api')} {info[0].get('architecture')}" if info else "unknown"
    n = a.shape[0] * a.shape[1] * b.shape[1] * 2
    return n / statistics.median(runs) / 1e9, kernel


def run(size: int, threads_list: list[int], names: list[str], kind: str = "c") -> dict:
    M = N = K = size
    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K), dtype=np.float32)
    b = rng.standard_normal((K, N), dtype=np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    flops = 2 * M * N * K
    out: dict = {"size": size, "target": kind, "threads": {}}
    for threads in threads_list:
        target = Target.parse(f"{kind} -threads={threads}")
        tiles = GemmTiles.for_target(target)
        peak = measure_peak(threads, tiles.lanes)
        np_gflops, kernel = numpy_gflops(a, b, threads)
        row: dict = {"numpy_gflops": np_gflops, "numpy_kernel": kernel, "peak_gflops": peak, "schedules": {}}
        details = {}
        for name in names:
            s, args = SCHEDULES[name](M, N, K, tiles)
            t0 = time.perf_counter()
            f = ember.build(s, args, target=target)
            build_s = time.perf_counter() - t0
            c = np.zeros((M, N), dtype=np.float32)
            f(a, b, c)
            err = float(np.abs(c - ref).max() / np.abs(ref).max())
            slow = name in ("naive", "blocking")
            r = f.benchmark(a, b, c, repeat=3 if slow else 7, min_time=0.05 if slow else 0.2)
            g = flops / r["median"] / 1e9
            row["schedules"][name] = g
            details[name] = {"ms": r["median"] * 1e3, "gflops": g, "max_rel_err": err, "build_s": build_s}
        row["details"] = details
        row["best_gflops"] = max(row["schedules"].values())
        out["threads"][str(threads)] = row
    return out


def print_table(res: dict) -> None:
    size = res["size"]
    for threads, row in res["threads"].items():
        print(f"\n{size}x{size}x{size} float32 matmul, target {res.get('target', 'c')}, {threads} thread(s)")
        print(f"  numpy (OpenBLAS {row['numpy_kernel']}): {row['numpy_gflops']:.1f} GFLOP/s")
        print(f"  FMA peak: {row['peak_gflops']:.1f} GFLOP/s")
        head = ("schedule", "median ms", "GFLOP/s", "x numpy", "x peak", "rel err", "build s")
        print("  {:<18} {:>10} {:>9} {:>8} {:>7} {:>9} {:>8}".format(*head))
        for name, d in row["details"].items():
            print(
                f"  {name:<18} {d['ms']:>10.2f} {d['gflops']:>9.1f} {d['gflops'] / row['numpy_gflops']:>8.2f} "
                f"{d['gflops'] / row['peak_gflops']:>7.2f} {d['max_rel_err']:>9.1e} {d['build_s']:>8.2f}"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    p.add_argument("--schedules", default=",".join(SCHEDULES), help="comma-separated subset of " + ",".join(SCHEDULES))
    p.add_argument("--target", default="c", help="comma-separated target kinds (c, llvm); ratios are to the first")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object on the last line")
    p.add_argument("--keep-openblas-env", action="store_true", help="keep OPENBLAS_CORETYPE/L2_SIZE as set")
    args = p.parse_args()
    if not args.keep_openblas_env and any(v in os.environ for v in PINNED):
        env = {k: v for k, v in os.environ.items() if k not in PINNED}
        sys.exit(subprocess.call([sys.executable, *sys.argv], env=env))
    threads = [int(t) for t in args.threads.split(",")]
    kinds = args.target.split(",")
    results = {kind: run(args.size, threads, args.schedules.split(","), kind) for kind in kinds}
    for res in results.values():
        print_table(res)

    def slim(res: dict) -> dict:
        return {t: {k: v for k, v in r.items() if k != "details"} for t, r in res["threads"].items()}

    first = results[kinds[0]]
    if len(kinds) > 1:
        print(f"\nbest GFLOP/s as a fraction of {kinds[0]}'s best:")
        for kind in kinds[1:]:
            for t in first["threads"]:
                ratio = results[kind]["threads"][t]["best_gflops"] / first["threads"][t]["best_gflops"]
                print(f"  {kind}, {t} thread(s): {ratio:.2f}")
                results[kind]["threads"][t]["best_vs_first"] = ratio
    if args.json:
        out = {"size": first["size"], "target": kinds[0], "threads": slim(first)}
        if len(kinds) > 1:
            out["targets"] = {kind: slim(res) for kind, res in results.items()}
        print(json.dumps(out))


if __name__ == "__main__":
    main()
