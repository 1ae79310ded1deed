"""The `ember` command line."""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def cmd_demo(args: argparse.Namespace) -> int:
    """Compile the scheduled matmul example, check it against numpy, print its speed."""
    import ember
    from ember.demo import SCHEDULES, GemmTiles

    n = args.size
    target = ember.Target.parse(args.target)
    tiles = GemmTiles.for_target(target)
    t0 = time.perf_counter()
    s, tensors = SCHEDULES["parallel"](n, n, n, tiles)
    f = ember.build(s, tensors, target=target)
    compile_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty((n, n), dtype=np.float32)
    f(a, b, c)
    ref = a @ b
    err = float(np.abs(c - ref).max() / np.abs(ref).max())
    ok = err < 1e-4
    r = f.benchmark(a, b, c)
    ms = r["median"] * 1e3
    print(f"ember demo: {n}x{n}x{n} float32 matmul, target '{target}'")
    print(f"  schedule: packed B, {tiles.mr}x{tiles.nr} register tile, {tiles.lanes}-lane vectors, parallel")
    print(f"  compile: {compile_s:.2f} s   (C source: {f.lib_path.with_suffix('.c')})")
    print(f"  check vs numpy: max relative error {err:.1e} -> {'OK' if ok else 'MISMATCH'}")
    print(f"  speed: {ms:.2f} ms median, {2 * n**3 / r['median'] / 1e9:.1f} GFLOP/s")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ember", description="Ember: a deep learning compiler.")
    p.add_argument("--version", action="store_true", help="print the version and exit")
    sub = p.add_subparsers(dest="command")
    d = sub.add_parser("demo", help=cmd_demo.__doc__)
    d.add_argument("--size", type=int, default=512)
    d.add_argument("--target", default="c")
    d.set_defaults(fn=cmd_demo)
    args = p.parse_args(argv)
    if args.version:
        import ember

        print(ember.__version__)
        return 0
    if not getattr(args, "fn", None):
        p.print_help()
        return 2
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
