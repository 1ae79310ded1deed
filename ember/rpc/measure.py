"""Tuning measured on remote devices: each candidate is a one-kernel standalone export run by a device server.

    with DevicePool(token=token) as pool:
        pool.add("10.0.0.5:9090"); pool.add("10.0.0.6:9090")
        target = device_target("c", pool.devices[0].info)      # cross-compiles for a board of another triple
        with RemoteMeasurer(pool, "arm-a72", devices=2) as m:
            ember.tune.tune_task(task, "xgb", 64, measurer=m, log="tune.jsonl")

A candidate is built here, in the tuner's process pool (`Measurer`'s, with its handling of build workers that
die), as a standalone export whose model is the one kernel (`export_kernel`: its inputs are the kernel's input
arguments, its outputs the arguments it writes) and whose `ember_run` is built for the task's target. It is
uploaded to a free device of the key, run once with `repeat` timed runs (`Run`: outputs and the device's own
timing), compared with the task's numpy reference (or the fallback config's outputs, measured on a device first),
and closed. Up to `devices` candidates are measured at once, on different devices. A device that stops answering
costs the candidate a retry on another device (the pool's `submit`); the batch's results come back whole and in
order, so the tuning log gets each trial exactly once. The module crashing is an error of kind "crash", running
past the server's limit "timeout", a wrong answer "wrong".
"""

from __future__ import annotations

import functools
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from ..runtime.export import export_standalone
from ..runtime.plan import KernelInfo, Plan, Step, ValueInfo
from ..target import Target, host_triple
from ..te.config import ConfigEntity
from ..tune.measure import Measurer, MeasureResult
from ..tune.runner import mismatch
from .client import RemoteDevice, RemoteError
from .pool import DeviceLost

SEGMENT = "ember_kernel_segment"


def export_kernel(func: Any, target: Target | str, directory: str | Path, n_outputs: int = 1,
                  openmp: bool = True) -> Path:  # fmt: skip
    """A standalone export (`ember_run`, model.json, an empty weights.bin) of one lowered kernel: its first
    arguments are the model's inputs and its last `n_outputs` its outputs, named as the kernel names them."""
    from ..codegen.c import c_symbol, codegen_c

    target = Target.parse(target)
    params = list(func.params)
    if not 0 < n_outputs <= len(params):
        raise ValueError(f"kernel {func.name} has {len(params)} arguments, cannot have {n_outputs} outputs")
    n_in = len(params) - n_outputs
    values = [ValueInfo(b.name, tuple(int(d) for d in b.shape), b.dtype.name, "input" if i < n_in else "output")
              for i, b in enumerate(params)]  # fmt: skip
    names = [v.name for v in values]
    if len(set(names)) != len(names):
        raise ValueError(f"kernel {func.name} has arguments of the same name: {names}")
    symbol = c_symbol(func.name)
    call = ", ".join(f"table[{i}]" for i in range(len(params)))
    wrapper = f"int32_t {SEGMENT}(void** table) {{\n  return {symbol}({call});\n}}\n"
    kernel = KernelInfo(symbol, list(range(len(params))), [func.name], [func.name])
    plan = Plan(func.name, values, list(range(n_in)), list(range(n_in, len(params))),
                [Step("segment", [kernel], SEGMENT)], 0, str(target))  # fmt: skip
    return export_standalone(plan, {}, codegen_c(func, target) + "\n" + wrapper, directory, target, openmp=openmp)


def build_artifact(task: Any, knobs: dict, root: str) -> dict:
    """Build one candidate as a one-kernel export in a new directory under `root`: {"dir", "build_s",
    "schedule"}, or {"error": "compile", "detail"} (runs in the measurer's build workers)."""
    from ..build import lower

    t0 = time.perf_counter()
    try:
        cfg = task.space.entity(knobs)
        sch, args = task.instantiate(cfg)
        func = lower(sch, args, "candidate")
        directory = export_kernel(func, task.target, tempfile.mkdtemp(prefix="cand-", dir=root), task.n_outputs)
    except Exception as e:  # any failure to build is the candidate's error, not the tuner's
        return {"error": "compile", "detail": f"{type(e).__name__}: {e}"[:2000],
                "trace": traceback.format_exc(limit=4)[-2000:]}  # fmt: skip
    return {"dir": str(directory), "build_s": time.perf_counter() - t0, "schedule": sch.record()}


def run_artifact(remote: RemoteDevice, directory: str | Path, inputs: list[np.ndarray], ref: list | None,
                 repeat: int, warmup: int, rtol: float) -> dict:  # fmt: skip
    """Upload a candidate's export to `remote`, run it once with `repeat` timed runs, compare its outputs with
    `ref`: {"costs", "outputs", "device"} or {"error": "wrong", "detail"}. A failed call raises RemoteError (so
    the pool can tell a lost device from a failed candidate: see `result_of_error`)."""
    with remote.load(directory) as rm:
        outs, timings = rm.run_timed(list(inputs), repeat, warmup)
    outputs = list(outs.values())
    if ref is not None:
        for i, (y, r) in enumerate(zip(outputs, ref)):
            bad = mismatch(y, r, rtol)
            if bad:
                return {"error": "wrong", "detail": f"output {i}: {bad}", "device": remote.address}
    return {"costs": [float(timings["median"])], "outputs": outputs, "device": remote.address}


def result_of_error(e: BaseException) -> tuple[str, str]:
    """(error kind, detail) of a failed remote measurement: a module that crashed ("crash"), ran past the server's
    limit ("timeout"), or was refused ("runtime"); a device lost under it (DeviceLost), or one that answers Info
    but could not take the call (unreachable for a moment, out of room for modules), is "runtime" with a detail
    starting "device lost" or "device busy", which `MeasureResult.transient` reads: measured again on resume."""
    code = getattr(e, "code", None)
    if isinstance(e, DeviceLost):
        return "runtime", f"device lost: {e}"[:2000]
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.RESOURCE_EXHAUSTED):
        return "runtime", f"device busy: {e}"[:2000]
    kind = {grpc.StatusCode.ABORTED: "crash", grpc.StatusCode.DEADLINE_EXCEEDED: "timeout"}.get(code, "runtime")
    return kind, f"{type(e).__name__}: {e}"[:2000]


def device_target(target: str | Target, info: dict) -> str:
    """The target to build for a device whose Info is `info`: `target` itself where the device has this machine's
    triple (or `target` names one), else `target` cross-compiled for the device's triple."""
    target = Target.parse(target)
    triple = info.get("triple") or ""
    if not triple or "-mtriple" in str(target) or triple == host_triple():
        return str(target)
    return str(Target.parse(f"{target} -mtriple={triple}"))


class RemoteMeasurer(Measurer):
    """Measures candidates on the devices of `key` in a `DevicePool`, `devices` at a time (see the module's doc).
    `measured_on` maps each measured config's index to the device address that measured it (the last time)."""

    def __init__(self, pool: Any, key: str, devices: int = 1, repeat: int = 10, warmup: int = 2,
                 n_parallel: int | None = None, build_timeout: float = 120.0, check: bool = True, rtol: float = 1e-3,
                 cache: dict | None = None, seed: int = 0, priority: int = 0):  # fmt: skip
        if devices < 1 or repeat < 1 or warmup < 0:
            raise ValueError("RemoteMeasurer wants devices >= 1, repeat >= 1 and warmup >= 0")
        super().__init__(n_parallel=n_parallel, build_timeout=build_timeout, check=check, rtol=rtol, cache=cache,
                         seed=seed)  # fmt: skip
        self.pool, self.key, self.devices, self.priority = pool, key, devices, priority
        self.runs, self.warmups = repeat, warmup
        self.build = functools.partial(build_artifact, root=self._tmp.name)
        self.measured_on: dict[int, str] = {}
        self._slots = threading.BoundedSemaphore(devices)
        self._refs: dict[str, tuple[list[np.ndarray], list | None]] = {}

    def measure(self, task: Any, configs: list[ConfigEntity]) -> list[MeasureResult]:
        results, todo = self.cached(task, configs)
        built = self._build(task, [configs[i] for i in todo])
        inputs, ref = self._reference(task)
        futs = {}
        for i, b in zip(todo, built):
            if "error" in b:
                results[i] = MeasureResult(configs[i], error=b["error"], detail=b["detail"])
            else:
                futs[i] = self._submit(functools.partial(run_artifact, directory=b["dir"], inputs=inputs, ref=ref,
                                                         repeat=self.runs, warmup=self.warmups, rtol=self.rtol))
        for i, fut in futs.items():
            b, cfg = built[todo.index(i)], configs[i]
            try:
                out = fut.result()
            except RemoteError as e:
                shutil.rmtree(b["dir"], ignore_errors=True)
                kind, detail = result_of_error(e)
                results[i] = MeasureResult(cfg, error=kind, detail=detail, build_s=b["build_s"], schedule=b["schedule"])
                continue
            shutil.rmtree(b["dir"], ignore_errors=True)  # measured: its export is not needed any more
            self.measured_on[cfg.index] = out["device"]
            if "error" in out:
                results[i] = MeasureResult(cfg, error=out["error"], detail=out["detail"], build_s=b["build_s"],
                                           schedule=b["schedule"])  # fmt: skip
            else:
                results[i] = MeasureResult(cfg, costs=tuple(out["costs"]), build_s=b["build_s"], schedule=b["schedule"])
        for i in todo:
            if self.cache is not None and not results[i].transient:
                self.cache[self._key(task, configs[i])] = results[i]
        return [results[i] for i in range(len(configs))]

    def _submit(self, fn: Callable[[RemoteDevice], dict]) -> Any:
        """The pool runs `fn` on a device; at most `devices` at a time (a slot is held while it queues and runs)."""

        self._slots.acquire()
        fut = self.pool.submit(self.key, fn, self.priority)
        fut.add_done_callback(lambda _: self._slots.release())
        return fut

    def _reference(self, task: Any) -> tuple[list[np.ndarray], list | None]:
        """The task's random inputs and right outputs (numpy references, else the fallback config's outputs
        measured on a device), once per task."""
        key = f"{task.workload}|{task.target}"
        if key not in self._refs:
            inputs = task.random_inputs(self.seed)
            ref = task.reference(inputs) if self.check else None
            if self.check and ref is None:
                b = self.build(task, dict(task.space.fallback().values))
                if "error" in b:
                    raise RuntimeError(f"the fallback config of {task.name} does not build: {b['detail']}")
                out = self._submit(functools.partial(run_artifact, directory=b["dir"], inputs=inputs, ref=None,
                                                     repeat=1, warmup=0, rtol=self.rtol)).result()  # fmt: skip
                ref = out["outputs"]
            self._refs[key] = (inputs, ref)
        return self._refs[key]


@contextmanager
def pool_measurer(addresses: Sequence[str], key: str, devices: int | None = None, token: str | None = None,
                  root_cert: str | Path | None = None, ray_address: str | None = None,
                  **measurer_args: Any) -> Iterator[tuple[Any, dict]]:  # fmt: skip
    """(a measurer on the device servers at `addresses` serving `key`, the Info of one of them), for `ember tune
    --rpc`: an embedded DevicePool, or with `ray_address` a RayDevicePool ("local": a Ray cluster started here with
    one `ember_device:KEY` per address; else the address of a running cluster). `devices` (default: all) bounds
    the measurements at once. Servers that do not answer are left out, with a warning; none answering is an error."""
    from .pool import DevicePool

    if not addresses:
        raise ValueError("--rpc wants at least one device server address (HOST:PORT[,HOST:PORT...])")
    devices = devices or len(addresses)
    if ray_address is None:
        with DevicePool(token=token, root_cert=root_cert) as pool:
            infos = _register(pool, addresses, key)
            with RemoteMeasurer(pool, key, devices=devices, **measurer_args) as m:
                yield m, infos[0]
        return
    from .raypool import RayDevicePool, RayMeasurer, ray_module

    ray = ray_module()
    started = not ray.is_initialized()
    if started:
        if ray_address == "local":
            ray.init(resources={f"ember_device:{key}": len(addresses)}, include_dashboard=False)
        else:
            ray.init(address=ray_address)
    try:
        with RayDevicePool(token=token, root_cert=root_cert) as pool:
            _register(pool, addresses, key)
            info = ray.get(pool.actors[key][0].status.remote())
            args = {k: v for k, v in measurer_args.items() if k in ("repeat", "warmup", "check", "rtol", "seed")}
            with RayMeasurer(pool, key, devices=devices, **args) as m:
                yield m, info
    finally:
        if started:
            ray.shutdown()


def _register(pool: Any, addresses: Sequence[str], key: str) -> list[dict]:
    infos = []
    for address in addresses:
        try:
            dev = pool.add(address, key=key)
        except (RemoteError, RuntimeError) as e:
            print(f"warning: device server {address} left out: {e}", file=sys.stderr)
            continue
        infos.append(dev.info if hasattr(dev, "info") else {})
    if not infos:
        raise RemoteError(f"none of the device servers {', '.join(addresses)} serves key {key!r}")
    return infos
