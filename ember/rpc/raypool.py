"""The device pool on a Ray cluster (`pip install ember[ray]`): device servers as Ray actors, builds as Ray tasks.

    ray.init(address="auto")                      # or ray.init(num_cpus=8, resources={"ember_device:arm": 2})
    pool = RayDevicePool(token=token)
    pool.add("10.0.0.5:9090"); pool.add("10.0.0.6:9090")     # actors named "KEY@ADDRESS" in namespace "ember"
    with RayMeasurer(pool, "arm", devices=2) as m:
        ember.tune.tune_task(task, "xgb", 64, measurer=m, log="tune.jsonl")
    pool_status()                                 # from any process connected to the cluster

Each device server is one actor (`DeviceActor`) that asks for one unit of the custom resource `ember_device:KEY`:
Ray places it on a node that declares the resource (`ray start --resources='{"ember_device:arm": 2}'` on the machine
the boards are wired to) and never puts more actors there than it has devices. The actor holds the connection and
runs one measurement at a time; calls wait in the actor's queue (it reports its length in `status`). Candidates are
built as Ray tasks (`build_files`, one CPU each) wherever the cluster has CPUs, and their files travel to the actor
through Ray's object store. Placement, queueing of the builds and the death of a node (its actors' calls fail with
RayActorError) are Ray's; what this module adds is the same rule as the embedded pool: a measurement whose device
stopped answering, or whose actor died, is given to another device of the key, and the batch comes back whole.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from ..te.config import ConfigEntity
from ..tune.measure import MeasureResult
from .client import RemoteError, connect
from .measure import build_artifact, result_of_error, run_artifact

RESOURCE = "ember_device:{key}"
NAMESPACE = "ember"


def ray_module() -> Any:
    """The `ray` module, or an ImportError saying how to install it."""
    try:
        import ray
    except ImportError as e:
        raise ImportError("the Ray device pool needs ray: pip install ember[ray]") from e
    return ray


class DeviceActor:
    """A device server seen from the Ray cluster (wrapped by `ray.remote` in `RayDevicePool.add`): `info`,
    `status`, and `measure` (one at a time; other calls of `status` are answered meanwhile)."""

    def __init__(self, address: str, key: str, token: str | None, root_cert: bytes | None, timeout: float):
        self.address, self.key = address, key
        self.remote = connect(address, key=key, token=token, root_cert=root_cert, timeout=timeout)
        self.lock = threading.Lock()
        self.waiting = self.running = self.served = 0
        self.lost = ""

    def status(self, timeout: float = 5.0) -> dict:
        row = {"address": self.address, "key": self.key, "busy": bool(self.running), "queued": self.waiting,
               "served": self.served, "healthy": False}  # fmt: skip
        if self.lost:
            return row | {"lost": self.lost}
        try:
            info = self.remote.info(timeout=timeout)
        except RemoteError as e:
            return row | {"lost": str(e)}
        return row | {k: info[k] for k in ("arch", "triple", "running", "waiting", "sessions", "runs_done")} | {
            "healthy": True}

    def measure(self, files: dict[str, bytes], inputs: list[np.ndarray], ref: list | None, repeat: int, warmup: int,
                rtol: float) -> dict:  # fmt: skip
        """Run a built candidate (its files) on the device: run_artifact's result, {"error", "detail"} for a
        failed candidate, or {"lost": why} when the device no longer answers (the caller tries another)."""
        self.waiting += 1
        with self.lock:
            self.waiting -= 1
            self.running += 1
            try:
                if self.lost:
                    return {"lost": self.lost}
                with tempfile.TemporaryDirectory(prefix="ember-cand-") as tmp:
                    for name, data in files.items():
                        (Path(tmp) / name).write_bytes(data)
                    try:
                        out = run_artifact(self.remote, tmp, inputs, ref, repeat, warmup, rtol)
                    except RemoteError as e:
                        try:
                            self.remote.info(timeout=5.0)
                        except RemoteError as dead:
                            self.lost = f"{self.address}: {dead}"
                            return {"lost": self.lost}
                        kind, detail = result_of_error(e)
                        return {"error": kind, "detail": detail, "device": self.address}
                self.served += 1
                return out
            finally:
                self.running -= 1


def build_files(task: Any, knobs: dict) -> dict:
    """A Ray task: build one candidate (`build_artifact`) and return its files' bytes, so that any node can build."""
    with tempfile.TemporaryDirectory(prefix="ember-build-") as root:
        b = build_artifact(task, knobs, root)
        if "error" in b:
            return b
        d = Path(b.pop("dir"))
        b["files"] = {n: (d / n).read_bytes() for n in ("ember_run", "weights.bin", "model.json")}
    return b


class RayDevicePool:
    """Device servers registered as Ray actors, one `ember_device:KEY` resource each (Ray must be initialized)."""

    def __init__(self, token: str | None = None, root_cert: str | Path | bytes | None = None, timeout: float = 120.0):
        self.ray = ray_module()
        if not self.ray.is_initialized():
            raise RuntimeError("initialize Ray first: ray.init(address=...) to join a cluster, or ray.init("
                               "resources={'ember_device:KEY': N}) for one on this machine")  # fmt: skip
        self.token, self.timeout = token, timeout
        self.root_cert = Path(root_cert).read_bytes() if isinstance(root_cert, (str, Path)) else root_cert
        self.actors: dict[str, list[Any]] = {}  # key -> actor handles
        self.dropped: list[dict] = []

    def add(self, address: str, key: str | None = None, token: str | None = None) -> Any:
        """Register the device server at `address` as an actor holding one `ember_device:KEY` (KEY from its Info)."""
        token = token or self.token
        with connect(address, key=key, token=token, root_cert=self.root_cert, timeout=30) as probe:
            key = probe.info()["key"]
        resource = RESOURCE.format(key=key)
        if self.ray.cluster_resources().get(resource, 0) < 1:
            raise RuntimeError(f"no node of the Ray cluster declares the resource {resource!r}: start the node the "
                               f"device is wired to with ray start --resources='{{\"{resource}\": N}}'")  # fmt: skip
        cls = self.ray.remote(DeviceActor)
        actor = cls.options(name=f"{key}@{address}", namespace=NAMESPACE, resources={resource: 1}, num_cpus=0,
                            max_concurrency=4).remote(address, key, token, self.root_cert, self.timeout)  # fmt: skip
        self.ray.get(actor.status.remote())  # placed and connected (or its error, here)
        self.actors.setdefault(key, []).append(actor)
        return actor

    def drop(self, key: str, actor: Any, why: str) -> None:
        if actor in self.actors.get(key, []):
            self.actors[key].remove(actor)
            self.dropped.append({"key": key, "why": why})
            self.ray.kill(actor, no_restart=True)

    def status(self) -> dict:
        return pool_status(self.ray)

    def close(self) -> None:
        for actors in list(self.actors.values()):
            for a in actors:
                self.ray.kill(a, no_restart=True)
        self.actors = {}

    def __enter__(self) -> RayDevicePool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def pool_status(ray: Any = None, timeout: float = 10.0) -> dict:
    """The devices registered on the Ray cluster this process is connected to (the actors of namespace "ember"),
    in the shape of `DevicePool.status()`; "queues" counts the measurements waiting in each key's actors, and
    "free" the key's `ember_device` resources not held."""
    ray = ray or ray_module()
    rows = []
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry.get("namespace") != NAMESPACE:
            continue
        name = entry["name"]
        key, _, address = name.partition("@")
        try:
            row = ray.get(ray.get_actor(name, namespace=NAMESPACE).status.remote(), timeout=timeout)
        except Exception as e:  # an actor on a dead node, or one that does not answer in time
            row = {"address": address, "key": key, "busy": False, "queued": None, "healthy": False, "lost": str(e)}
        rows.append(row)
    total, free = ray.cluster_resources(), ray.available_resources()
    keys = sorted({r["key"] for r in rows} | {k.split(":", 1)[1] for k in total if k.startswith("ember_device:")})
    queues = {k: sum(r.get("queued") or 0 for r in rows if r["key"] == k) for k in keys}
    free_devices = {k: free.get(RESOURCE.format(key=k), 0.0) for k in keys}
    return {"devices": [r for r in rows if r["healthy"]], "dropped": [r for r in rows if not r["healthy"]],
            "queues": queues, "free": free_devices}  # fmt: skip


class RayMeasurer:
    """The tuner's measurer on a `RayDevicePool`: builds as Ray tasks, measurements on the key's actors, at most
    `devices` at once; a measurement whose device or actor was lost is given to another (see the module's doc)."""

    def __init__(self, pool: RayDevicePool, key: str, devices: int = 1, repeat: int = 10, warmup: int = 2,
                 check: bool = True, rtol: float = 1e-3, seed: int = 0, retries: int = 3):  # fmt: skip
        if devices < 1 or repeat < 1 or warmup < 0:
            raise ValueError("RayMeasurer wants devices >= 1, repeat >= 1 and warmup >= 0")
        self.pool, self.ray, self.key = pool, pool.ray, key
        self.devices, self.repeat, self.warmup = devices, repeat, warmup
        self.check, self.rtol, self.seed, self.retries = check, rtol, seed, retries
        self.measured_on: dict[int, str] = {}
        self._build = self.ray.remote(num_cpus=1)(build_files)
        self._refs: dict[str, tuple[Any, Any]] = {}

    def __enter__(self) -> RayMeasurer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._refs = {}

    def _reference(self, task: Any) -> tuple[Any, Any]:
        key = f"{task.workload}|{task.target}"
        if key not in self._refs:
            inputs = task.random_inputs(self.seed)
            ref = task.reference(inputs) if self.check else None
            if self.check and ref is None:
                b = self.ray.get(self._build.remote(task, dict(task.space.fallback().values)))
                if "error" in b:
                    raise RuntimeError(f"the fallback config of {task.name} does not build: {b['detail']}")
                out = self._run_all([b["files"]], self.ray.put(inputs), self.ray.put(None))[0]
                if "error" in out:
                    raise RuntimeError(f"the fallback config of {task.name} fails on the device: {out['detail']}")
                ref = out["outputs"]
            self._refs[key] = (self.ray.put(inputs), self.ray.put(ref))
        return self._refs[key]

    def measure(self, task: Any, configs: list[ConfigEntity]) -> list[MeasureResult]:
        inputs, ref = self._reference(task)
        built = self.ray.get([self._build.remote(task, dict(c.values)) for c in configs])
        todo = [i for i, b in enumerate(built) if "error" not in b]
        outs = dict(zip(todo, self._run_all([built[i]["files"] for i in todo], inputs, ref)))
        results = []
        for i, (cfg, b) in enumerate(zip(configs, built)):
            if "error" in b:
                results.append(MeasureResult(cfg, error=b["error"], detail=b["detail"]))
                continue
            out, meta = outs[i], {"build_s": b["build_s"], "schedule": b["schedule"]}
            if "device" in out:
                self.measured_on[cfg.index] = out["device"]
            if "error" in out:
                results.append(MeasureResult(cfg, error=out["error"], detail=out["detail"], **meta))
            else:
                results.append(MeasureResult(cfg, costs=tuple(out["costs"]), **meta))
        return results

    def _run_all(self, files: list[dict], inputs: Any, ref: Any) -> list[dict]:
        """Measure each candidate's files on the key's actors, `devices` at a time; a lost device or actor costs
        a retry on another one. Results in order."""
        pending = deque((i, 0) for i in range(len(files)))
        results: dict[int, dict] = {}
        flight: dict[Any, tuple[int, int, Any]] = {}  # object ref -> (candidate, tries, actor)
        start = time.monotonic()
        while pending or flight:
            actors = self.pool.actors.get(self.key, [])
            if not actors and not flight:
                raise RuntimeError(f"no device of key {self.key!r} is left in the Ray pool")
            load = {id(a): 0 for a in actors}
            for _, _, a in flight.values():
                load[id(a)] = load.get(id(a), 0) + 1
            while pending and len(flight) < self.devices and actors:
                i, tries = pending.popleft()
                actor = min(actors, key=lambda a: load[id(a)])
                load[id(actor)] += 1
                ref_ = actor.measure.remote(files[i], inputs, ref, self.repeat, self.warmup, self.rtol)
                flight[ref_] = (i, tries, actor)
            done, _ = self.ray.wait(list(flight), num_returns=1)
            for d in done:
                i, tries, actor = flight.pop(d)
                try:
                    out = self.ray.get(d)
                except self.ray.exceptions.RayActorError as e:  # its node (or process) died
                    out = {"lost": f"actor died: {e}"}
                if "lost" in out:
                    self.pool.drop(self.key, actor, out["lost"])
                    if tries >= self.retries:
                        results[i] = {"error": "runtime", "detail": f"device lost {tries + 1} times: {out['lost']}"}
                    else:
                        pending.appendleft((i, tries + 1))
                    continue
                results[i] = out
        self.seconds = time.monotonic() - start
        return [results[i] for i in range(len(files))]
