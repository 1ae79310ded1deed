"""Models compiled for other machines, run on emulated boards: ResNet-18, MobileNetV2 and a BERT-like encoder
(built in code, random weights) for aarch64, riscv64 and armhf, exported with `ember_run` and run under qemu-user,
against this machine's build of the same model in the same run.

    python bench/edge.py [--models resnet18,mobilenet_v2,bert] [--triples aarch64-linux-gnu,...] [--small]

Per model and board: cross-compile seconds, the median of `ember_run` under qemu (emulated: the time says how fast
the emulator is, not the board), the max difference from the host's outputs relative to their scale, and whether
it is within 1e-5. Needs the cross compilers and qemu-user (Debian: gcc-aarch64-linux-gnu gcc-riscv64-linux-gnu
gcc-arm-linux-gnueabihf qemu-user).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import ember
from ember import zoo
from ember.runtime.standalone import emulator, run_exported

FULL = {
    "resnet18": lambda: zoo.resnet18(),
    "mobilenet_v2": lambda: zoo.mobilenet_v2(),
    "bert": lambda: zoo.bert_encoder(layers=4, seq=128),
}
SMALL = {
    "resnet18": lambda: zoo.resnet18(image=32, classes=10, width=8),
    "mobilenet_v2": lambda: zoo.mobilenet_v2(image=32, classes=10, width=0.25),
    "bert": lambda: zoo.bert_encoder(layers=1, seq=16, d=64, heads=2, ff=128),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet18,mobilenet_v2,bert")
    p.add_argument("--triples", default="aarch64-linux-gnu,riscv64-linux-gnu,arm-linux-gnueabihf")
    p.add_argument("--small", action="store_true", help="the small variants the tests use")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    builders = SMALL if args.small else FULL
    print(f"{'model':<14} {'board':<22} {'compile s':>9} {'qemu ms':>10} {'host ms':>9} {'max rel diff':>12}  ok")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            model = builders[name]()
            feeds = zoo.random_feeds(model, seed=1)
            host = ember.compile(model, "c")
            expected = host.run(feeds)
            host_ms = host.benchmark(feeds, repeat=10)["median"] * 1e3
            for triple in args.triples.split(","):
                t0 = time.perf_counter()
                m = ember.compile(model, f"c -mtriple={triple}")
                out = m.export(Path(tmp) / f"{name}-{triple}")
                compile_s = time.perf_counter() - t0
                outputs, timings = run_exported(out, feeds, launcher=emulator(m.plan.target), repeat=args.repeat)
                diff = max(float(np.max(np.abs(outputs[k] - v))) / (float(np.max(np.abs(v))) or 1.0)
                           for k, v in expected.items())  # fmt: skip
                ok = "yes" if diff <= 1e-5 else "NO"
                print(f"{name:<14} {triple:<22} {compile_s:>9.1f} {timings['median'] * 1e3:>10.1f} {host_ms:>9.2f} "
                      f"{diff:>12.2e}  {ok}", flush=True)


if __name__ == "__main__":
    main()
