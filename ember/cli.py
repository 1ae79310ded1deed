"""The `ember` command line."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def cmd_demo(args: argparse.Namespace) -> int:
    """Compile an example model built in code, check it against onnxruntime, print its latency."""
    if args.matmul:
        return _demo_matmul(args)
    import ember
    from ember import zoo

    builders = {"resnet18": zoo.resnet18, "mobilenet_v2": zoo.mobilenet_v2, "bert": zoo.bert_encoder, **zoo.BLOCKS}
    if args.model not in builders:
        return _fail("demo", ValueError(f"unknown model {args.model!r}; choose from {', '.join(builders)}"))
    model = builders[args.model]()
    feeds = zoo.random_feeds(model)
    print(f"ember demo: {args.model} ({len(model.graph.node)} ONNX nodes), target '{args.target}'")
    m = ember.compile(model, target=args.target)
    s = m.summary()
    native = "all native" if not s["fallback_ops"] else f"{len(s['fallback_ops'])} by the numpy reference"
    print(f"  compile: {s['compile_seconds']:.2f} s, {s['kernels']} kernels ({native})")
    ours = list(m.run(feeds).values())
    try:
        import onnxruntime as ort

        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        theirs, ref_name = sess.run(None, feeds), "onnxruntime"
    except ImportError:
        from ember.frontend.onnx import from_onnx
        from ember.ops.evaluate import evaluate

        theirs, ref_name = (
            list(evaluate(from_onnx(model), feeds).values()),
            "numpy reference (onnxruntime not installed)",
        )
    err = max(float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)) for a, b in zip(ours, theirs))
    ok = err < 1e-3
    print(f"  check vs {ref_name}: max relative error {err:.1e} -> {'OK' if ok else 'MISMATCH'}")
    r = m.benchmark(list(feeds.values()))
    print(f"  latency: {r['median'] * 1e3:.2f} ms median over {len(r['runs'])} runs")
    return 0 if ok else 1


def _demo_matmul(args: argparse.Namespace) -> int:
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
    print(f"ember demo --matmul: {n}x{n}x{n} float32 matmul, target '{target}'")
    print(f"  schedule: packed B, {tiles.mr}x{tiles.nr} register tile, {tiles.lanes}-lane vectors, parallel")
    where = f"C source: {f.lib_path.with_suffix('.c')}" if f.lib_path is not None else "LLVM IR, JIT-compiled"
    print(f"  compile: {compile_s:.2f} s   ({where})")
    print(f"  check vs numpy: max relative error {err:.1e} -> {'OK' if ok else 'MISMATCH'}")
    print(f"  speed: {r['median'] * 1e3:.2f} ms median, {2 * n**3 / r['median'] / 1e9:.1f} GFLOP/s")
    return 0 if ok else 1


def _fail(cmd: str, e: BaseException) -> int:
    print(f"ember {cmd}: {e}", file=sys.stderr)
    return 1


def _shapes(items: list[str]) -> dict[str, tuple[int, ...]] | None:
    from ember.frontend.show import parse_shape

    return dict(parse_shape(x) for x in items) or None


def cmd_compile(args: argparse.Namespace) -> int:
    """Compile an ONNX model and save it (library and C source, or LLVM IR; plan, weights) to a directory."""
    import ember
    from ember.frontend.onnx import ModelError

    try:
        m = ember.compile(args.model, target=args.target, input_shapes=_shapes(args.input_shape),
                          opt_level=args.opt_level, disabled_passes=args.disable_pass,
                          dynamic=False if args.static else None)  # fmt: skip
        out = m.save(args.output)
    except (ModelError, FileNotFoundError, ValueError, NotImplementedError, ImportError) as e:
        return _fail("compile", e)
    s = m.summary()
    print(f"compiled {args.model} -> {out}")
    print(f"  nodes {s['nodes']}, kernels {s['kernels']} ({s['distinct_kernels']} distinct), "
          f"native calls per run {s['native_calls_per_run']}, compile {s['compile_seconds']:.2f} s")  # fmt: skip
    if s["fallback_ops"]:
        ops = ", ".join(sorted(set(s["fallback_ops"])))
        print(f"  {len(s['fallback_ops'])} node(s) run by the numpy reference: {ops}")
    for vid in m.plan.inputs:
        v = m.plan.values[vid]
        print(f"  input  {v.name}: {v.dtype}{list(v.shape)}")
    decoders = m.plan.info.get("decoders", {})
    for i, vid in enumerate(m.plan.outputs):
        v = m.plan.values[vid]
        how = {"labels": " (returned as the class labels it indexes)", "zipmap": " (returned as one map a row, ZipMap)"}
        print(f"  output {v.name}: {v.dtype}{list(v.shape)}{how.get(decoders.get(str(i), {}).get('kind'), '')}")
    return 0


def _read_token(path: str | None) -> str | None:
    """The token in a file (surrounding whitespace stripped); None without a file."""
    if path is None:
        return None

    token = Path(path).read_text().strip()
    if not token:
        raise ValueError(f"token file {path} is empty")
    return token


def cmd_run(args: argparse.Namespace) -> int:
    """Run a compiled model directory on .npy inputs (random inputs for those not given); with --rpc, a standalone
    export (`ember export`) on a device server."""
    import ember

    if args.rpc:
        return _run_remote(args)
    try:
        m = ember.load(args.model)
    except (FileNotFoundError, OSError) as e:
        return _fail("run", e)
    return _run_model(args, m)


def _run_remote(args: argparse.Namespace) -> int:
    """`ember run --rpc`: upload the export, run it there, remove it from the server."""
    try:
        from ember.rpc import RemoteError, connect
    except ImportError as e:
        return _fail("run", e)
    try:
        remote = connect(args.rpc, key=args.key, token=_read_token(args.token_file), root_cert=args.root_cert)
    except (RemoteError, OSError, ValueError) as e:
        return _fail("run", e)
    with remote:
        try:
            m = remote.load(args.model)
        except (RemoteError, OSError, ValueError) as e:
            return _fail("run", e)
        try:
            return _run_model(args, m)
        finally:
            try:
                m.close()
            except RemoteError as e:
                print(f"ember run: closing the remote model: {e}", file=sys.stderr)


def _run_model(args: argparse.Namespace, m) -> int:
    """Run a model (local, or a RemoteModel) on the inputs of `args`: print, save and time its outputs."""
    from ember.runtime.module import ArgumentError

    feeds = dict(zip(m.input_names, m.random_inputs(args.seed)))
    for item in args.input:
        name, sep, path = item.partition("=")
        if not sep:
            return _fail("run", ValueError(f"--input wants NAME=FILE.npy, got {item!r}"))
        if name not in feeds:
            return _fail("run", ValueError(f"model has no input {name!r}; inputs: {', '.join(m.input_names)}"))
        try:
            feeds[name] = np.load(path)
        except (OSError, ValueError) as e:
            return _fail("run", e)
    from ember.runtime.cross import ForeignTargetError

    errors: tuple[type[BaseException], ...] = (ArgumentError, ForeignTargetError)
    if args.rpc:
        from ember.rpc import RemoteError

        errors += (RemoteError,)
    try:
        outs = m.run(feeds)
    except errors as e:
        return _fail("run", e)
    for name, y in outs.items():
        path = Path(args.output_dir or ".") / name.replace("/", "_")
        if isinstance(y, list):  # a ZipMap's maps: saved as JSON (keys as text)
            print(f"{name}: {len(y)} map(s) label -> score")
            if args.output_dir:
                path.parent.mkdir(parents=True, exist_ok=True)
                (path.parent / f"{path.name}.json").write_text(json.dumps(y))
            continue
        if y.dtype == object:  # string labels: saved as a numpy text array (no pickle)
            y = np.asarray(y.tolist(), str)
        stats = f"min {y.min():.4g} max {y.max():.4g} mean {y.mean():.4g}" if y.size and y.dtype.kind == "f" else ""
        print(f"{name}: {y.dtype}{list(y.shape)} {stats}")
        if args.output_dir:
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(path.parent / f"{path.name}.npy", y)
    if args.benchmark:
        try:
            r = m.benchmark([feeds[n] for n in m.input_names])
        except errors as e:
            return _fail("run", e)
        print(f"latency: median {r['median'] * 1e3:.3f} ms, min {r['min'] * 1e3:.3f} ms")
    return 0


def cmd_rpc_server(args: argparse.Namespace) -> int:
    """Serve this machine (or an emulated board, --launcher) to `ember.rpc.connect` clients until interrupted."""
    import signal

    try:
        from ember.rpc.server import serve

        token = _read_token(args.token_file)
        server = serve(args.host, args.port, key=args.key, token=token, launcher=args.launcher,
                       insecure=args.insecure, run_timeout=args.run_timeout, idle_timeout=args.idle_timeout,
                       max_message_bytes=int(args.max_message_mb * (1 << 20)), tls_cert=args.tls_cert,
                       tls_key=args.tls_key)  # fmt: skip
    except (ImportError, ValueError, OSError) as e:
        return _fail("rpc server", e)

    import threading

    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stopping.set())
    launcher = f", launcher {args.launcher}" if args.launcher else ""
    print(f"ember rpc server: device {args.key!r} listening on {server.address}{launcher}"
          + (" (TLS)" if args.tls_cert else "") + ("" if token else " (insecure: no token)"), flush=True)  # fmt: skip
    while not stopping.wait(0.5):
        pass
    server.stop()
    print("ember rpc server: stopped", flush=True)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Export a model as standalone C (library, header, weights) and build `ember_run`, its runner, in a directory."""

    import ember
    from ember.codegen.toolchain import CompileError
    from ember.frontend.onnx import ModelError

    try:
        if (Path(args.model) / "plan.json").exists():
            m = ember.load(args.model)
        else:
            m = ember.compile(args.model, target=args.target, input_shapes=_shapes(args.input_shape),
                              opt_level=args.opt_level, dynamic=False if args.static else None)  # fmt: skip
        out = m.export(args.output, build=not args.no_build, openmp=not args.no_openmp)
    except (ModelError, FileNotFoundError, ValueError, NotImplementedError, ImportError, CompileError) as e:
        return _fail("export", e)
    print(f"exported {args.model} -> {out}: {', '.join(sorted(p.name for p in out.iterdir()))}")
    inputs = " ".join(f"--input {m.plan.values[v].name}=FILE.npy" for v in m.plan.inputs)
    if args.no_build:
        print(f"  build: make -C {out}")
    print(f"  run:   {out / 'ember_run'} {inputs} --output-dir OUT [--repeat N]")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Time a model with Ember next to other runtimes (turns in blocks, medians, ratios: ember.runtime.compare)."""
    import json

    import ember
    from ember import zoo
    from ember.frontend.onnx import ModelError, load_model
    from ember.runtime.compare import interleaved_medians, onnxruntime_session

    try:
        proto, _ = load_model(args.model)
    except ModelError as e:
        return _fail("bench", e)
    feeds = zoo.random_feeds(proto, args.seed)
    if args.rpc:
        return _bench_remote(args, proto, feeds)
    others = [c for c in args.compare.split(",") if c]
    unknown = set(others) - {"onnxruntime", "torch"}
    if unknown:
        return _fail("bench", ValueError(f"--compare takes onnxruntime and/or torch, not {', '.join(unknown)}"))
    if "torch" in others:
        print("ember bench: torch needs the model as a torch module; for ONNX files it is left out "
              "(bench/models.py compares with PyTorch on its own modules)", file=sys.stderr)  # fmt: skip
        others.remove("torch")
    results = {}
    xs = list(feeds.values())
    for threads in [int(t) for t in args.threads.split(",")]:
        target = f"{args.target} -threads={threads}"
        kw = {"tuning_log": args.tuning_log} if args.tuning_log else {}
        try:
            m = ember.compile(proto, target=target, input_shapes=_shapes(args.input_shape), **kw)
        except (ModelError, ValueError, NotImplementedError, ImportError) as e:
            return _fail("bench", e)
        systems = {"ember": lambda m=m: m(*xs)}
        if "onnxruntime" in others:
            sess = onnxruntime_session(proto, threads)
            systems["onnxruntime"] = lambda sess=sess: sess.run(None, feeds)
        med = {k: v * 1e3 for k, v in interleaved_medians(systems, args.repeat).items()}
        s = m.summary()
        row = {"ms": med, "ratio": {k: v / med["ember"] for k, v in med.items()}, "compile_s": s["compile_seconds"],
               "kernels": s["kernels"], "fallback_ops": len(s["fallback_ops"])}  # fmt: skip
        results[threads] = row
        print(f"{args.model}  threads={threads}  compile {s['compile_seconds']:.2f} s, {s['kernels']} kernels")
        for k, v in med.items():
            print(f"  {k:<12} {v:9.3f} ms   {row['ratio'][k]:5.2f}x ember's latency")
        if args.profile:
            print(m.profile_table(xs, top=args.top))
            roof = m.summary().get("roofline")
            if roof and roof["fraction"] is not None:
                int8 = f", int8 {roof['peak_int8_gops']:.0f} GOP/s" if roof.get("peak_int8_gops") else ""
                print(f"  roofline: {roof['fraction']:.0%} of the machine's limits over the whole model (peak "
                      f"{roof['peak_gflops']:.0f} GFLOP/s{int8}, memory {roof['dram_gbs']:.1f} GB/s, "
                      f"{roof['threads']} threads)")
    if args.json:
        print(json.dumps(results))
    return 0


def _bench_remote(args: argparse.Namespace, proto, feeds: dict) -> int:
    """`ember bench --rpc`: build for the device's target (cross-compiled for a foreign triple), export, upload, and
    time it there (device-timed, and the round trip seen here); next to this machine's build where it runs here."""
    import tempfile
    import time

    import ember
    from ember.target import Target

    try:
        from ember.rpc import RemoteError, connect
        from ember.rpc.measure import device_target

        remote = connect(args.rpc, key=args.key, token=_read_token(args.token_file), root_cert=args.root_cert)
    except (ImportError, RemoteError, OSError, ValueError) as e:
        return _fail("bench", e)
    with remote, tempfile.TemporaryDirectory(prefix="ember-bench-") as tmp:
        info = remote.info()
        target = device_target(args.target, info)
        try:
            m = ember.compile(proto, target=target, input_shapes=_shapes(args.input_shape), dynamic=False)
            export = m.export(tmp)
            t0 = time.perf_counter()
            rm = remote.load(export)
            upload = time.perf_counter() - t0
        except (ValueError, NotImplementedError, ImportError, OSError, RemoteError) as e:
            return _fail("bench", e)
        with rm:
            xs = [feeds[n] for n in rm.input_names]
            try:
                got = rm.run(feeds)
                trips = []
                for _ in range(max(args.repeat // 3, 3)):
                    t0 = time.perf_counter()
                    rm.run(feeds)
                    trips.append(time.perf_counter() - t0)
                device = rm.benchmark(xs, repeat=args.repeat)
            except (RemoteError, ValueError) as e:
                return _fail("bench", e)
        print(f"{args.model} on {args.rpc} (key {info['key']}, {info['arch']}), target '{target}'")
        print(f"  upload                {upload * 1e3:9.3f} ms")
        print(f"  round trip (median)   {float(np.median(trips)) * 1e3:9.3f} ms   one run, inputs and outputs sent")
        print(f"  on the device         {device['median'] * 1e3:9.3f} ms   median of {device['repeat']}, timed there")
        if Target.parse(target).runs_here:
            local = m.benchmark(xs, repeat=args.repeat)
            want = m.run(feeds)
            err = max(float(np.abs(got[k].astype(np.float64) - want[k]).max()) if want[k].size else 0.0 for k in want)
            print(f"  here, in process      {local['median'] * 1e3:9.3f} ms   remote/local "
                  f"{device['median'] / local['median']:.2f}x on the device, "
                  f"{float(np.median(trips)) / local['median']:.2f}x round trip; "
                  f"max |remote - local| {err:.3g}")  # fmt: skip
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    """Tune a model's heavy kernels (template knobs, measured here) into a log for --tuning-log."""
    if args.auto:
        if args.rpc:
            return _fail("tune", ValueError("--auto measures on this machine only, not yet through --rpc: "
                                            "tune templates on remote devices, or auto-schedule here"))
        from ember.autoschedule.cli import run_auto

        return run_auto(args)
    from ember.tune.cli import run_tune

    if not args.rpc:
        return run_tune(args)
    if not args.key:
        return _fail("tune", ValueError("--rpc needs --key: the device key to measure on"))
    try:
        from ember.rpc import RemoteError
        from ember.rpc.measure import device_target, pool_measurer

        token = _read_token(args.token_file)
        addresses = [a for a in args.rpc.split(",") if a]
        with pool_measurer(addresses, args.key, args.devices, token=token, root_cert=args.root_cert,
                           ray_address=args.ray, repeat=args.repeat) as (m, info):  # fmt: skip
            args.target = device_target(args.target, info)
            print(f"ember tune: measuring on {len(addresses)} device server(s) of key {args.key!r} "
                  f"({info.get('arch') or '?'}), {args.devices or len(addresses)} at once"
                  + (f", Ray {args.ray}" if args.ray else ""))  # fmt: skip
            return run_tune(args, measurer=m)
    except (ImportError, RemoteError, OSError, ValueError, RuntimeError) as e:
        return _fail("tune", e)


def cmd_rpc_pool_status(args: argparse.Namespace) -> int:
    """List the devices of a pool: keys, health, load and queue lengths (device servers by address, or on Ray)."""
    try:
        if args.ray:
            from ember.rpc.raypool import pool_status, ray_module

            ray = ray_module()
            ray.init(address=args.ray, include_dashboard=False, log_to_driver=False)
            try:
                status = pool_status(ray)
            finally:
                ray.shutdown()
        else:
            if not args.devices:
                raise ValueError("give the device servers (--devices HOST:PORT[,...]) or a Ray cluster (--ray ADDRESS)")
            from ember.rpc.pool import DevicePool

            with DevicePool(token=_read_token(args.token_file), root_cert=args.root_cert, health_timeout=5) as pool:
                missing = []
                for address in args.devices.split(","):
                    try:
                        pool.add(address)
                    except Exception as e:  # an address that does not answer is a row of the table, not a failure
                        missing.append({"address": address, "key": "?", "busy": False, "healthy": False,
                                        "error": str(e)})  # fmt: skip
                status = pool.status()
                status["dropped"] += missing
    except (ImportError, ValueError, OSError, ConnectionError) as e:
        return _fail("rpc pool status", e)
    from ember.rpc.pool import format_status

    print(format_status(status))
    for row in status["dropped"]:
        if row.get("error") or row.get("lost"):
            print(f"  {row['address']}: {row.get('error') or row.get('lost')}")
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    """The on-disk cache of built kernels and compiled models: its size (info), evict to its limit (prune), empty it
    (clear)."""
    from ember.codegen.toolchain import cache_dir, cache_entries, cache_limit, parse_size, prune_cache

    try:
        limit = cache_limit() if args.max_size is None else parse_size(args.max_size, "--max-size")
        root = cache_dir()
        if args.cache_command == "prune":
            removed = [] if limit is None else prune_cache(limit, keep_recent=0.0)
            print(f"removed {len(removed)} entries")
        elif args.cache_command == "clear":
            removed = prune_cache(0, keep_recent=0.0)
            print(f"removed {len(removed)} entries")
    except (OSError, ValueError) as e:
        return _fail(f"cache {args.cache_command}", e)
    entries = cache_entries(root)
    models = sum(e.path.parent.name == "models" for e in entries)
    used = sum(e.bytes for e in entries)
    print(f"{root}: {len(entries)} entries ({models} compiled models), {used / 2**20:.1f} MiB; limit "
          + ("none" if limit is None else f"{limit / 2**20:.0f} MiB") + " (EMBER_CACHE_SIZE)")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """Import a model (ONNX, TFLite, a SavedModel directory) and print Ember's graph (optionally after a pass)."""
    from ember.compiler import import_model
    from ember.frontend.onnx import ModelError
    from ember.frontend.show import summary
    from ember.passes import PASSES, pass_names, run_passes

    if args.passes:
        for p in PASSES:
            print(f"{p.name:<26} opt_level>={p.opt_level}  {p.doc}")
        return 0
    if not args.model:
        return _fail("show", ValueError("a model path is required (or --passes)"))
    try:
        graph = import_model(args.model, _shapes(args.input_shape))
    except ModelError as e:
        return _fail("show", e)
    if args.after:
        if args.after not in pass_names():
            return _fail("show", ValueError(f"unknown pass {args.after!r}; passes: {', '.join(pass_names())}"))
        stop = next((i for i, p in enumerate(PASSES) if p.name == args.after and args.opt_level >= p.opt_level), None)
        if stop is None:
            return _fail("show", ValueError(f"pass {args.after} does not run at opt_level {args.opt_level}"))
        graph, _ = run_passes(graph, opt_level=args.opt_level, passes=PASSES[: stop + 1])
    with np.printoptions(threshold=8):
        print(summary(graph) if args.summary else graph)
    return 0


def cmd_quantize(args: argparse.Namespace) -> int:
    """Quantize a float ONNX model (post-training, static) into a QDQ int8 (or bf16) ONNX model, calibrated on
    inputs from an .npz (or random ones), and print the per-layer sensitivity and the accuracy change."""
    import onnx

    from ember.frontend.onnx import ModelError
    from ember.quantization import QuantizeError, quantize_model
    from ember.quantization.ptq import random_samples, samples_from_arrays

    try:
        if args.calibration:
            with np.load(args.calibration) as npz:
                samples = samples_from_arrays(args.model, dict(npz))
            if args.samples:
                samples = samples[: args.samples]
        else:
            count = args.samples or 32
            print(f"ember quantize: warning: no --calibration given: calibrating on {count} random inputs; the "
                  "ranges, and the accuracy, will not reflect real data", file=sys.stderr)  # fmt: skip
            samples = random_samples(args.model, count, args.seed, _shapes(args.input_shape))
        result = quantize_model(args.model, samples, precision=args.precision, method=args.method,
                                percentile=args.percentile, activation_dtype=args.activation_dtype,
                                exclude=args.exclude, min_sqnr=args.min_sqnr, report_samples=args.report_samples,
                                target=args.target)  # fmt: skip
    except (ModelError, QuantizeError, FileNotFoundError, ValueError, OSError) as e:
        return _fail("quantize", e)
    onnx.save(result.model, args.output)
    print(result.report)
    print(f"wrote {args.output}")
    return 0


def cmd_debug(args: argparse.Namespace) -> int:
    """Run a model compiled by Ember beside a reference and print, per graph node, the error of its output, the
    first node past the tolerance flagged, with the kernel it was fused into. Exit status: 0 all within the
    tolerance, 1 a node past it, 2 an error."""
    from ember.debug import REFERENCES, debug

    feeds = {}
    for item in args.input:
        name, sep, path = item.partition("=")
        if not sep:
            return _usage("debug", ValueError(f"--input wants NAME=FILE.npy, got {item!r}"))
        feeds[name] = np.load(path)
    if args.reference is not None and args.reference not in REFERENCES:
        return _usage("debug", ValueError(f"unknown reference {args.reference!r}; use one of {', '.join(REFERENCES)}"))
    try:
        report = debug(args.model, feeds, args.reference, args.target, args.tolerance,
                       input_shapes=_shapes(args.input_shape), opt_level=args.opt_level, seed=args.seed)  # fmt: skip
    except (ValueError, OSError, ImportError) as e:
        return _usage("debug", e)
    print(report.table(only_compared=args.compared_only))
    return 1 if report.first_bad is not None else 0


def _usage(cmd: str, e: BaseException) -> int:
    """`_fail` with exit status 2, for commands whose status 1 means a result (ember debug: a node past tolerance)."""
    _fail(cmd, e)
    return 2


TARGET_HELP = ('c or llvm, with options ("llvm -threads=2", "c -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"); '
               "default: c, or llvm where no C compiler is installed")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ember", description="Ember: a deep learning compiler.")
    p.add_argument("--version", action="store_true", help="print the version and exit")
    sub = p.add_subparsers(dest="command")
    d = sub.add_parser("demo", help=cmd_demo.__doc__)
    d.add_argument("--model", default="resnet18", help="resnet18 (default), mobilenet_v2, bert, or a block name")
    d.add_argument("--target", default=None, help=TARGET_HELP)
    d.add_argument("--matmul", action="store_true", help="instead: the scheduled matmul example vs numpy")
    d.add_argument("--size", type=int, default=512, help="matmul size (with --matmul)")
    d.set_defaults(fn=cmd_demo)
    c = sub.add_parser("compile", help=cmd_compile.__doc__)
    c.add_argument("model", help="path to an .onnx file")
    c.add_argument("-o", "--output", required=True, help="directory to write the compiled model to")
    c.add_argument("--target", default=None, help=TARGET_HELP)
    c.add_argument("--input-shape", action="append", default=[], metavar="NAME=D,D,...")
    c.add_argument("--static", action="store_true", help="specialize the model's symbolic dims (a leading one is 1; "
                   "others need --input-shape) instead of keeping them symbolic")  # fmt: skip
    c.add_argument("--opt-level", type=int, default=3, help="graph optimization level 0..3 (default 3)")
    c.add_argument("--disable-pass", action="append", default=[], metavar="NAME")
    c.set_defaults(fn=cmd_compile)
    r = sub.add_parser("run", help=cmd_run.__doc__)
    r.add_argument("model", help="a directory written by `ember compile`")
    r.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    r.add_argument("--output-dir", help="save each output as NAME.npy there")
    r.add_argument("--benchmark", action="store_true", help="also time inferences")
    r.add_argument("--seed", type=int, default=0, help="seed of random inputs")
    r.add_argument("--rpc", metavar="HOST:PORT", help="run a standalone export (`ember export`) on this device server")
    r.add_argument("--key", help="with --rpc: the device key the server must answer to")
    r.add_argument("--token-file", help="with --rpc: a file holding the server's token")
    r.add_argument("--root-cert", help="with --rpc: connect with TLS, trusting this PEM certificate (the server's or "
                   "its authority's)")
    r.set_defaults(fn=cmd_run)
    rp = sub.add_parser("rpc", help="remote devices: `ember rpc server` runs standalone exports for clients")
    rps = rp.add_subparsers(dest="rpc_command", required=True)
    sv = rps.add_parser("server", help=cmd_rpc_server.__doc__)
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    sv.add_argument("--port", type=int, default=9090, help="port (default 9090; 0: a free one, printed)")
    sv.add_argument("--key", default="local", help="the device key clients ask for (default local)")
    sv.add_argument("--token-file", help="a file holding the token every call must carry")
    sv.add_argument("--insecure", action="store_true", help="serve without a token (anyone who can connect runs code)")
    sv.add_argument("--launcher", help='run modules through this command: "qemu-aarch64 -L /usr/aarch64-linux-gnu"')
    sv.add_argument("--run-timeout", type=float, default=600.0, help="seconds before a run is killed (default 600)")
    sv.add_argument("--idle-timeout", type=float, default=600.0, help="seconds before an idle module is removed")
    sv.add_argument("--max-message-mb", type=float, default=256.0, help="largest message received (MiB, default 256)")
    sv.add_argument("--tls-cert", help="listen with TLS: this PEM certificate (chain); needs --tls-key")
    sv.add_argument("--tls-key", help="the PEM private key of --tls-cert")
    sv.set_defaults(fn=cmd_rpc_server)
    po = rps.add_parser("pool", help="the device pool: `ember rpc pool status`")
    pos = po.add_subparsers(dest="pool_command", required=True)
    st = pos.add_parser("status", help=cmd_rpc_pool_status.__doc__)
    st.add_argument("--devices", metavar="HOST:PORT[,...]", help="the device servers of an embedded pool")
    st.add_argument("--ray", metavar="ADDRESS", help="or the Ray cluster whose pool to list (auto, HOST:PORT)")
    st.add_argument("--token-file", help="a file holding the servers' token")
    st.add_argument("--root-cert", help="connect with TLS, trusting this PEM certificate")
    st.set_defaults(fn=cmd_rpc_pool_status)
    e = sub.add_parser("export", help=cmd_export.__doc__)
    e.add_argument("model", help="path to an .onnx file, or a directory written by `ember compile`")
    e.add_argument("-o", "--output", required=True, help="directory to write the export to")
    e.add_argument("--target", default="c", help='a C target, with options ("c -mcpu=native -threads=2"); default c')
    e.add_argument("--input-shape", action="append", default=[], metavar="NAME=D,D,...")
    e.add_argument("--static", action="store_true", help="specialize the model's symbolic dims instead of exporting "
                   "them as sizes read from the input shapes")  # fmt: skip
    e.add_argument("--opt-level", type=int, default=3, help="graph optimization level 0..3 (default 3)")
    e.add_argument("--no-build", action="store_true", help="write the files and the Makefile, do not build ember_run")
    e.add_argument("--no-openmp", action="store_true", help="build ember_run without OpenMP (one thread)")
    e.set_defaults(fn=cmd_export)
    b = sub.add_parser("bench", help=cmd_bench.__doc__)
    b.add_argument("model", help="path to an .onnx file")
    b.add_argument("--compare", default="onnxruntime", help="comma-separated: onnxruntime,torch")
    b.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    b.add_argument("--target", default=None, help=TARGET_HELP)
    b.add_argument("--tuning-log", default=None)
    b.add_argument("--input-shape", action="append", default=[], metavar="NAME=D,D,...")
    b.add_argument("--repeat", type=int, default=30)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--profile", action="store_true", help="print the slowest kernels")
    b.add_argument("--top", type=int, default=10)
    b.add_argument("--json", action="store_true")
    b.add_argument("--rpc", metavar="HOST:PORT", help="time it on this device server (built for its target)")
    b.add_argument("--key", help="with --rpc: the device key the server must answer to")
    b.add_argument("--token-file", help="with --rpc: a file holding the server's token")
    b.add_argument("--root-cert", help="with --rpc: connect with TLS, trusting this PEM certificate")
    b.set_defaults(fn=cmd_bench)
    tu = sub.add_parser("tune", help=cmd_tune.__doc__)
    from ember.tune.cli import add_arguments as _tune_arguments

    _tune_arguments(tu)
    tu.set_defaults(fn=cmd_tune)
    q = sub.add_parser("quantize", help=cmd_quantize.__doc__)
    q.add_argument("model", help="path to a float .onnx file")
    q.add_argument("-o", "--output", required=True, help="the quantized .onnx file to write")
    q.add_argument("--calibration", metavar="FILE.npz", help="one array per input: (N, *shape) for N samples, or "
                   "(N * batch, *shape[1:]); without it, random inputs (with a warning)")  # fmt: skip
    q.add_argument("--samples", type=int, default=0, help="use at most this many samples (random: default 32)")
    q.add_argument("--precision", choices=["int8", "bf16"], default="int8")
    q.add_argument("--method", choices=["minmax", "percentile", "entropy"], default="minmax", help="calibration")
    q.add_argument("--percentile", type=float, default=99.99, help="with --method percentile (default 99.99)")
    q.add_argument("--activation-dtype", choices=["uint8", "int8"], default="uint8")
    q.add_argument("--exclude", action="append", default=[], metavar="NODE", help="keep this node in float")
    q.add_argument("--min-sqnr", type=float, default=None, metavar="DB",
                   help="keep in float the layers whose output SQNR, quantized alone, is below this")  # fmt: skip
    q.add_argument("--report-samples", type=int, default=8,
                   help="samples for the sensitivity and accuracy report (default 8; 0 skips both)")  # fmt: skip
    q.add_argument("--input-shape", action="append", default=[], metavar="NAME=D,D,...",
                   help="shapes of random inputs (for symbolic dimensions)")  # fmt: skip
    q.add_argument("--seed", type=int, default=0, help="seed of random calibration inputs")
    q.add_argument("--target", default=None, help=TARGET_HELP)
    q.set_defaults(fn=cmd_quantize)
    ca = sub.add_parser("cache", help=cmd_cache.__doc__)
    ca.add_argument("cache_command", nargs="?", default="info", choices=("info", "prune", "clear"))
    ca.add_argument("--max-size", help="prune to this size (8G, 500M, bytes) instead of EMBER_CACHE_SIZE's")
    ca.set_defaults(fn=cmd_cache)
    sh = sub.add_parser("show", help=cmd_show.__doc__)
    sh.add_argument("model", nargs="?", help="path to an .onnx or .tflite file, or a SavedModel directory")
    sh.add_argument("--input-shape", action="append", default=[], metavar="NAME=D,D,...")
    sh.add_argument("--summary", action="store_true", help="op counts and sizes instead of the graph")
    sh.add_argument("--after", metavar="PASS", help="print the graph after this pass (see --passes)")
    sh.add_argument("--opt-level", type=int, default=3)
    sh.add_argument("--passes", action="store_true", help="list the graph passes")
    sh.set_defaults(fn=cmd_show)
    db = sub.add_parser("debug", help=cmd_debug.__doc__)
    db.add_argument("model", help="an .onnx or .tflite file, or a SavedModel directory")
    db.add_argument("--reference", default=None, help="onnxruntime, tflite, torch or numpy (default: the model's "
                    "own framework: onnxruntime for ONNX and SavedModels, tflite for .tflite)")
    db.add_argument("--tolerance", type=float, default=1e-4, help="max relative error of a float output (1e-4)")
    db.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy", help="else random inputs")
    db.add_argument("--input-shape", action="append", default=[], metavar="NAME=D,D,...")
    db.add_argument("--target", default=None, help=TARGET_HELP)
    db.add_argument("--opt-level", type=int, default=3)
    db.add_argument("--seed", type=int, default=0)
    db.add_argument("--compared-only", action="store_true", help="leave out the nodes the reference has no value for")
    db.set_defaults(fn=cmd_debug)
    args = p.parse_args(argv)
    if args.version:
        import ember

        print(ember.__version__)
        return 0
    if not getattr(args, "fn", None):
        p.print_help()
        return 2
    if getattr(args, "target", "") is None:
        from ember.build import default_target

        args.target = default_target()
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
