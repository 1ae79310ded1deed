"""What a remote run costs over a local one: a device server on loopback, a small and a large model.

    python bench/rpc.py [--repeat 10]

Per model: the size and upload time of its standalone export, the median round trip of one inference in this
process (`m(x)`), through `ember_run` here (`run_exported`: a process start, .npy files), and through the device
server (`ember.rpc.connect(...).load(...)`: gRPC on loopback, then the same `ember_run` on the server), the
device-timed median of the remote model (`benchmark`: ember_run's own timer), and the overhead of the remote round
trip over the local `ember_run` one. Medians of `--repeat` turns each.

    python bench/rpc.py --aarch64

ResNet-18 (224x224) cross-compiled for aarch64 and run on an emulated board (a device server whose launcher is
qemu-aarch64) through `connect(...).load(...)`, against this machine's build: the largest difference, relative to
the output's largest magnitude (the issue's bound is 1e-5), and the run times.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import tempfile
import time
from pathlib import Path

import ember
from ember import zoo
from ember.rpc import connect
from ember.rpc.server import serve
from ember.runtime.standalone import run_exported

MODELS = {
    "mlp (batch 4)": lambda: zoo.mlp(),
    "resnet18 (224x224)": lambda: zoo.resnet18(),
}


def median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def aarch64_resnet18() -> None:
    """ResNet-18 built for aarch64 on an emulated board through the device server, vs this machine's build."""
    import numpy as np

    from ember.runtime.standalone import emulator

    target = "c -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"
    model = zoo.resnet18()
    feeds = zoo.random_feeds(model, seed=1)
    t0 = time.perf_counter()
    expected = ember.compile(model, "c").run(feeds)
    host_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    arm = ember.compile(model, target)
    token = secrets.token_hex(16)
    board_server = serve("127.0.0.1", 0, key="arm", token=token, launcher=emulator(target), run_timeout=1800)
    with tempfile.TemporaryDirectory() as tmp, board_server as server:
        export = arm.export(Path(tmp) / "arm")
        build_s = time.perf_counter() - t0
        with connect(server.address, key="arm", token=token, timeout=1800) as board, board.load(export) as rm:
            t0 = time.perf_counter()
            got = rm.run(feeds)
            run_s = time.perf_counter() - t0
    print(f"resnet18 224x224, target '{target}', emulated board {' '.join(emulator(target))}")
    print(f"{'output':<12} {'shape':<12} {'max |arm - host| / max |host|':>30}")
    for name, y in expected.items():
        rel = float(np.abs(got[name] - y).max()) / (float(np.abs(y).max()) or 1.0)
        print(f"{name:<12} {str(list(y.shape)):<12} {rel:>30.3g}   {'ok' if rel <= 1e-5 else 'OVER 1e-5'}")
    print(f"host compile+run {host_s:.1f} s, aarch64 compile+export {build_s:.1f} s, "
          f"remote run under qemu {run_s:.1f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--aarch64", action="store_true", help="ResNet-18 for aarch64 on an emulated board instead")
    args = p.parse_args()
    if args.aarch64:
        aarch64_resnet18()
        return
    token = secrets.token_hex(16)
    server = serve("127.0.0.1", 0, key="bench", token=token)
    print(f"{'model':<20} {'export MB':>9} {'upload ms':>9} {'in-proc ms':>10} {'ember_run ms':>12} "
          f"{'remote ms':>9} {'device ms':>9} {'overhead ms':>11}")  # fmt: skip
    try:
        with tempfile.TemporaryDirectory() as tmp, connect(server.address, key="bench", token=token) as device:
            for name, build in MODELS.items():
                model = build()
                m = ember.compile(model, "c")
                out = m.export(Path(tmp) / name.split()[0])
                size = sum(f.stat().st_size for f in out.iterdir() if f.is_file()) / 1e6
                feeds = zoo.random_feeds(model, seed=0)
                t0 = time.perf_counter()
                remote = device.load(out)
                upload = (time.perf_counter() - t0) * 1e3
                in_proc = median_ms(lambda: m.run(feeds), args.repeat)  # noqa: B023
                local = median_ms(lambda: run_exported(out, feeds), args.repeat)  # noqa: B023
                far = median_ms(lambda: remote.run(feeds), args.repeat)  # noqa: B023
                device_ms = remote.benchmark(feeds, repeat=args.repeat)["median"] * 1e3
                remote.close()
                print(f"{name:<20} {size:>9.2f} {upload:>9.1f} {in_proc:>10.2f} {local:>12.2f} {far:>9.2f} "
                      f"{device_ms:>9.2f} {far - local:>11.2f}", flush=True)  # fmt: skip
    finally:
        server.stop()


if __name__ == "__main__":
    main()
