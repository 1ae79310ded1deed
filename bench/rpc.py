"""What a remote run costs over a local one: a device server on loopback, a small and a large model.

    python bench/rpc.py [--repeat 10]

Per model: the size and upload time of its standalone export, the median round trip of one inference in this
process (`m(x)`), through `ember_run` here (`run_exported`: a process start, .npy files), and through the device
server (`ember.rpc.connect(...).load(...)`: gRPC on loopback, then the same `ember_run` on the server), the
device-timed median of the remote model (`benchmark`: ember_run's own timer), and the overhead of the remote round
trip over the local `ember_run` one. Medians of `--repeat` turns each.
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=10)
    args = p.parse_args()
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
