"""Latency with a busy neighbour: Ember, ONNX Runtime and OpenVINO at 2 threads, quiet and beside a busy core.

    python bench/contention.py [--models resnet18,bert4,efficientnet_b0] [--systems ember,onnxruntime,openvino]
                               [--threads 2] [--repeat 40] [--busy-cpu 1] [--baseline /path/to/ember] [--json]

Each measurement is a process of its own (a fresh runtime, no other system's threads around): it loads the model
(Ember: the directory `ember.compile(...).save` wrote, compiled once by this script; the others: the ONNX file),
runs it a few times to warm up, then times single runs; the systems' processes take turns (`--rounds`), and the
table gives the median and 90th percentile of each system's `--repeat` runs over all rounds.
"busy" runs the same measurement while another process spins in a loop pinned to one core
(`os.sched_setaffinity`): the model's threads share the machine with it, as on a loaded server. The table
gives both conditions and their ratio (busy median / quiet median) per system. `--baseline DIR` adds the system
"ember@base": Ember from another checkout (DIR on PYTHONPATH, which compiles and runs it), for a before/after in
one run.

The models are those of bench/models.py (torch modules from `ember.zoo_torch`, exported with torch.onnx;
without torch, the zoo's ONNX builders) plus EfficientNet-B0. OpenVINO is skipped with a note where the
`openvino` package is not installed (`pip install openvino`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SYSTEMS = ("ember", "onnxruntime", "openvino")
BASE = "ember@base"  # Ember from --baseline
COMPILE = "import sys, onnx, ember\nember.compile(onnx.load(sys.argv[1]), target=sys.argv[2]).save(sys.argv[3])\n"
SPIN = """\
import os, sys
os.sched_setaffinity(0, {int(sys.argv[1])})
parent = os.getppid()
while os.getppid() == parent:  # spins till killed, or till the bench is gone
    for _ in range(100000):
        pass
"""


def build(name: str):
    """(ONNX model, feeds) of a bench model."""
    try:
        from ember import zoo_torch
    except ImportError:
        zoo_torch = None
    if zoo_torch is not None:
        if name == "efficientnet_b0":
            import torch

            module = zoo_torch.EfficientNetB0().eval()
            args, names = (torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0)),), ["x"]
        else:
            module, args, names = zoo_torch.example(name)
        return zoo_torch.to_onnx(module, args, names), {n: a.numpy() for n, a in zip(names, args)}
    from ember import zoo

    builders = {"resnet18": zoo.resnet18, "bert4": lambda: zoo.bert_encoder(layers=4, seq=128)}
    if name not in builders:
        raise SystemExit(f"{name} needs torch (ember.zoo_torch); without it: {', '.join(builders)}")
    model = builders[name]()
    return model, zoo.random_feeds(model)


def runner(system: str, workdir: Path, threads: int):
    """A no-argument callable running the model once in `system` on the saved feeds."""
    feeds = dict(np.load(workdir / "feeds.npz"))
    if system in ("ember", BASE):
        import ember

        m = ember.load(workdir / system)  # compiled for `threads` (target "c -threads=N")
        return lambda: m.run(feeds)
    if system == "onnxruntime":
        from ember.runtime.compare import onnxruntime_session

        sess = onnxruntime_session(str(workdir / "model.onnx"), threads)
        return lambda: sess.run(None, feeds)
    import openvino as ov

    # float32 as Ember and onnxruntime compute (OpenVINO's default on a CPU with avx512_bf16 is bf16)
    config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1,
              "INFERENCE_PRECISION_HINT": "f32"}  # fmt: skip
    compiled = ov.Core().compile_model(str(workdir / "model.onnx"), "CPU", config)
    request = compiled.create_infer_request()
    return lambda: request.infer(feeds)


def measure(system: str, workdir: Path, threads: int, repeat: int) -> list[float]:
    """In the child process: the milliseconds of `repeat` single runs, after a warm-up."""
    fn = runner(system, workdir, threads)
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def stats(times: list[float]) -> dict:
    times = sorted(times)
    return {"median": statistics.median(times), "p90": times[min(len(times) - 1, int(0.9 * len(times)))]}


def with_path(path: str | None) -> dict:
    """The environment with `path` first on PYTHONPATH (None: unchanged)."""
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([path, *filter(None, [env.get("PYTHONPATH")])])
    return env


def one_process(system: str, workdir: Path, threads: int, repeat: int, busy_cpu: int | None,
                base: str | None = None) -> list[float]:  # fmt: skip
    """Run `measure` in a fresh process, beside a spinning process pinned to `busy_cpu` when given."""
    spinner = None
    if busy_cpu is not None:
        spinner = subprocess.Popen([sys.executable, "-c", SPIN, str(busy_cpu)])
        time.sleep(0.3)
    try:
        cmd = [sys.executable, __file__, "--child", system, "--workdir", str(workdir), "--threads", str(threads),
               "--repeat", str(repeat)]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, check=False, env=with_path(base))
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    if out.returncode != 0:
        raise RuntimeError(f"{system} on {workdir.name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def model_names() -> tuple[str, ...]:
    """The models `build` makes: ember.zoo_torch's examples and EfficientNet-B0 with torch, two without."""
    try:
        from ember import zoo_torch
    except ImportError:
        return ("resnet18", "bert4")
    return (*zoo_torch.EXAMPLES, "efficientnet_b0")


def available(system: str) -> bool:
    import importlib.util

    return system == "ember" or importlib.util.find_spec(system) is not None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet18,bert4,efficientnet_b0")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=40, help="timed runs per system and condition, over all rounds")
    p.add_argument("--rounds", type=int, default=2, help="each system's processes take turns this many times")
    p.add_argument("--busy-cpu", type=int, default=1, help="the core the busy process is pinned to")
    p.add_argument("--json", action="store_true")
    p.add_argument("--baseline", default=None, help="an Ember checkout to measure too, as ember@base")
    p.add_argument("--child", choices=(*SYSTEMS, BASE), help=argparse.SUPPRESS)
    p.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.workdir, args.threads, args.repeat)))
        return
    systems = [s for s in args.systems.split(",") if s]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        raise SystemExit(f"--systems takes {', '.join(SYSTEMS)}, not {', '.join(unknown)}")
    models = [m for m in args.models.split(",") if m]
    known = model_names()
    bad = [m for m in models if m not in known]
    if bad:
        raise SystemExit(f"unknown model(s) {', '.join(bad)}; known: {', '.join(known)}")
    for s in [s for s in systems if not available(s)]:
        print(f"note: {s} is not installed: left out (pip install {s})")
        systems.remove(s)
    if args.baseline:
        systems.insert(0, BASE)
    import onnx

    import ember

    results: dict = {}
    print(f"{args.threads} threads; busy: a spinning process pinned to core {args.busy_cpu}; "
          f"ms over {args.repeat} runs in {args.rounds} rounds")  # fmt: skip
    print(f"{'model':<16} {'system':<12} {'quiet med':>9} {'quiet p90':>9} {'busy med':>9} {'busy p90':>9} "
          f"{'busy/quiet':>10}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            workdir = Path(tmp) / name
            workdir.mkdir()
            model, feeds = build(name)
            onnx.save(model, workdir / "model.onnx")
            np.savez(workdir / "feeds.npz", **feeds)
            target = f"c -threads={args.threads}"
            if "ember" in systems:
                ember.compile(model, target=target).save(workdir / "ember")
            if BASE in systems:
                cmd = [sys.executable, "-c", COMPILE, str(workdir / "model.onnx"), target, str(workdir / BASE)]
                # run in the baseline's directory: `python -c` puts the working directory first on sys.path, where
                # this checkout's `ember` would shadow the baseline's
                subprocess.run(cmd, check=True, env=with_path(args.baseline), cwd=args.baseline)
            times: dict = {(k, busy): [] for k in systems for busy in (False, True)}
            per_round = max(1, -(-args.repeat // args.rounds))
            for _ in range(args.rounds):  # turns: a drift of the machine's load hits every system alike
                for system in systems:
                    base = args.baseline if system == BASE else None
                    for busy in (False, True):
                        cpu = args.busy_cpu if busy else None
                        times[system, busy] += one_process(system, workdir, args.threads, per_round, cpu, base)
            results[name] = {}
            for system in systems:
                quiet, busy = stats(times[system, False]), stats(times[system, True])
                ratio = busy["median"] / quiet["median"]
                results[name][system] = {"quiet": quiet, "busy": busy, "ratio": ratio}
                print(f"{name:<16} {system:<12} {quiet['median']:>9.2f} {quiet['p90']:>9.2f} {busy['median']:>9.2f} "
                      f"{busy['p90']:>9.2f} {ratio:>10.2f}", flush=True)  # fmt: skip
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
