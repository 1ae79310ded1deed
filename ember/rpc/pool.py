"""The embedded device pool: device servers registered by address, lent out by key, in the client's own process.

    pool = DevicePool(token=token)                      # health checks every `health_period` seconds
    pool.add("10.0.0.5:9090"); pool.add("10.0.0.6:9090")  # each must answer Info; its key comes from there
    with pool.lease("arm-a72", priority=1) as board:    # a RemoteDevice, yours until the block ends
        board.load(export)...
    fut = pool.submit("arm-a72", lambda board: ...)     # run on the next free device; reassigned if it is lost
    pool.status()                                       # devices (key, health, busy, load) and queue lengths

Requests wait in one queue per key: higher `priority` first, first come first served within a priority. A device
serves one request at a time. Every `health_period` seconds each device is asked for its Info (within
`health_timeout`); one that fails `misses` checks in a row, or fails one right after a call on it failed, is dropped
from the pool and its connection closed. Work given with `submit` that was running on a dropped device is put back
at the head of its queue and runs on another device of the key (at most `retries` times); an error of the work
itself (the device still answers) is the work's result. `ember rpc pool status` prints `status()` for a list of
addresses; `ember.rpc.raypool` is the same pool on a Ray cluster.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .client import RemoteDevice, RemoteError, connect


class PoolError(RuntimeError):
    """A request the pool cannot serve: no device of the key (left), a time-out, a closed pool."""


class DeviceLost(RemoteError):
    """The device a request ran on stopped answering; it was dropped from the pool."""


@dataclass(eq=False)
class PoolDevice:
    """One registered device server: its connection, health and whether it is lent out."""

    address: str
    remote: RemoteDevice
    info: dict
    busy: bool = False
    healthy: bool = True
    dropped: bool = False
    misses: int = 0
    served: int = 0
    last_seen: float = field(default_factory=time.monotonic)

    @property
    def key(self) -> str:
        return self.info["key"]

    def row(self) -> dict:
        load = {k: self.info.get(k) for k in ("running", "waiting", "sessions", "runs_done")}
        return {"address": self.address, "key": self.key, "arch": self.info.get("arch"), "busy": self.busy,
                "healthy": self.healthy and not self.dropped, "served": self.served, **load}  # fmt: skip


class DevicePool:
    """Devices by key, lent to one request at a time in priority then arrival order; see the module's doc."""

    def __init__(self, token: str | None = None, root_cert: str | Path | bytes | None = None,
                 health_period: float = 2.0, health_timeout: float = 5.0, misses: int = 2, retries: int = 3,
                 call_timeout: float = 120.0, max_workers: int = 32):  # fmt: skip
        if health_period <= 0 or health_timeout <= 0 or misses < 1 or retries < 0:
            raise ValueError("health_period and health_timeout must be positive, misses >= 1, retries >= 0")
        self.token, self.root_cert = token, root_cert
        self.health_timeout, self.misses, self.retries = health_timeout, misses, retries
        self.call_timeout = call_timeout
        self.devices: list[PoolDevice] = []
        self.dropped: list[PoolDevice] = []
        self._queues: dict[str, list[tuple[int, int]]] = {}  # key -> heap of (-priority, ticket)
        self._tickets = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._workers = futures.ThreadPoolExecutor(max_workers, thread_name_prefix="ember-pool")
        self._stop = threading.Event()
        self._health = threading.Thread(target=self._check_loop, args=(health_period,), daemon=True,
                                        name="ember-pool-health")  # fmt: skip
        self._health.start()

    # -- devices ----------------------------------------------------------------------------------
    def add(self, address: str, key: str | None = None, token: str | None = None,
            root_cert: str | Path | bytes | None = None) -> PoolDevice:  # fmt: skip
        """Register the device server at `address` (it must answer Info; with `key`, serve that key)."""
        with self._cond:
            if any(d.address == address for d in self.devices):
                raise ValueError(f"device {address} is already in the pool")
        remote = connect(address, key=key, token=token or self.token, timeout=self.call_timeout,
                         root_cert=root_cert or self.root_cert)  # fmt: skip
        dev = PoolDevice(address, remote, remote.info())
        with self._cond:
            self.devices.append(dev)
            self._cond.notify_all()
        return dev

    def drop(self, dev: PoolDevice, why: str = "") -> None:
        """Take a device out of the pool and close its connection (a call in flight on it fails)."""
        with self._cond:
            if dev.dropped:
                return
            dev.dropped, dev.healthy = True, False
            dev.info["dropped_because"] = why
            self.devices.remove(dev)
            self.dropped.append(dev)
            self._cond.notify_all()
        dev.remote.close()

    def keys(self) -> list[str]:
        with self._cond:
            return sorted({d.key for d in self.devices})

    def _alive(self, dev: PoolDevice) -> bool:
        """Whether the device answers Info now (its load is refreshed); a device that does not is dropped."""
        if dev.dropped:
            return False
        try:
            dev.info.update(dev.remote.info(timeout=self.health_timeout))
        except RemoteError as e:
            self.drop(dev, f"no answer after a failed call: {e}")
            return False
        dev.last_seen, dev.misses, dev.healthy = time.monotonic(), 0, True
        return True

    def _check_loop(self, period: float) -> None:
        while not self._stop.wait(period):
            self.check()

    def check(self) -> None:
        """One round of health checks: each device's Info; `misses` failures in a row drop it."""
        with self._cond:
            devices = list(self.devices)
        for dev in devices:
            try:
                dev.info.update(dev.remote.info(timeout=self.health_timeout))
            except (RemoteError, ValueError) as e:  # ValueError: the channel was closed meanwhile
                dev.misses += 1
                dev.healthy = False
                if dev.misses >= self.misses:
                    self.drop(dev, f"missed {dev.misses} health checks: {e}")
                continue
            dev.last_seen, dev.misses, dev.healthy = time.monotonic(), 0, True

    # -- lending ----------------------------------------------------------------------------------
    def _ticket(self, key: str, priority: int, ticket: int | None = None) -> tuple[int, int]:
        entry = (-priority, next(self._tickets) if ticket is None else ticket)
        with self._cond:
            heapq.heappush(self._queues.setdefault(key, []), entry)
        return entry

    def _wait(self, key: str, entry: tuple[int, int], timeout: float | None) -> PoolDevice:
        """The first free device of `key` once `entry` heads the key's queue."""
        deadline = None if timeout is None else time.monotonic() + timeout
        queue = self._queues[key]
        with self._cond:
            try:
                while True:
                    if self._closed:
                        raise PoolError("the device pool is closed")
                    if not any(d.key == key for d in self.devices):
                        have = ", ".join(sorted({d.key for d in self.devices})) or "none"
                        raise PoolError(f"the pool has no device of key {key!r} (left); keys: {have}")
                    free = [d for d in self.devices if d.key == key and not d.busy and d.healthy]
                    if free and queue[0] == entry:
                        heapq.heappop(queue)
                        dev = min(free, key=lambda d: d.served)
                        dev.busy = True
                        dev.served += 1
                        self._cond.notify_all()
                        return dev
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise PoolError(f"no device of key {key!r} was free within {timeout:g} s")
                    self._cond.wait(left if left is not None else 1.0)
            except BaseException:
                if entry in queue:
                    queue.remove(entry)
                    heapq.heapify(queue)
                    self._cond.notify_all()
                raise

    def acquire(self, key: str, priority: int = 0, timeout: float | None = None) -> PoolDevice:
        """Wait for a free device of `key` (higher priority first, then first come); give it back with `release`."""
        return self._wait(key, self._ticket(key, priority), timeout)

    def release(self, dev: PoolDevice) -> None:
        with self._cond:
            dev.busy = False
            self._cond.notify_all()

    @contextmanager
    def lease(self, key: str, priority: int = 0, timeout: float | None = None) -> Iterator[RemoteDevice]:
        """A free device of `key` (its RemoteDevice) for the block: `with pool.lease("arm") as board: ...`."""
        dev = self.acquire(key, priority, timeout)
        try:
            yield dev.remote
        finally:
            self.release(dev)

    def submit(self, key: str, fn: Callable[[RemoteDevice], Any], priority: int = 0) -> futures.Future:
        """Run `fn(device)` on the next free device of `key`, in a worker thread; the future has its result. A
        RemoteError from a device that then fails its health check puts the work back at the head of the queue for
        another device (DeviceLost once `retries` devices were lost under it); other errors are the result."""
        entry = self._ticket(key, priority)
        return self._workers.submit(self._serve, key, fn, entry)

    def _serve(self, key: str, fn: Callable[[RemoteDevice], Any], entry: tuple[int, int]) -> Any:
        lost: list[str] = []
        while True:
            dev = self._wait(key, entry, None)
            try:
                return fn(dev.remote)
            except (RemoteError, ValueError) as e:  # ValueError: its channel was closed under it (dropped)
                if self._alive(dev):
                    raise
                lost.append(f"{dev.address}: {e}")
                if len(lost) > self.retries:
                    raise DeviceLost(f"the work lost {len(lost)} devices of key {key!r}: {'; '.join(lost)}") from e
                entry = self._ticket(key, -entry[0], entry[1])  # back at its old place: the head of its class
            finally:
                self.release(dev)

    def map(self, key: str, fn: Callable[[RemoteDevice, Any], Any], items: Sequence[Any],
            priority: int = 0) -> list[Any]:  # fmt: skip
        """`fn(device, item)` for each item on the devices of `key` in parallel; the results in order."""
        futs = [self.submit(key, lambda d, x=x: fn(d, x), priority) for x in items]
        return [f.result() for f in futs]

    # -- status and life --------------------------------------------------------------------------
    def status(self) -> dict:
        """{"devices": rows (address, key, arch, busy, healthy, served, running, waiting, sessions, runs_done),
        "dropped": rows of dropped devices, "queues": {key: requests waiting}}."""
        with self._cond:
            keys = {d.key for d in self.devices} | {k for k, q in self._queues.items() if q}
            queues = {k: len(self._queues.get(k, ())) for k in sorted(keys)}
            return {"devices": [d.row() for d in self.devices], "dropped": [d.row() for d in self.dropped],
                    "queues": queues}  # fmt: skip

    def close(self) -> None:
        with self._cond:
            self._closed = True
            devices, self.devices = list(self.devices), []
            self._cond.notify_all()
        self._stop.set()
        self._workers.shutdown(wait=True, cancel_futures=True)
        for d in devices:
            d.remote.close()

    def __enter__(self) -> DevicePool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def format_status(status: dict) -> str:
    """`status()` as the table `ember rpc pool status` prints."""
    head = f"{'address':<24} {'key':<12} {'arch':<8} {'health':<9} {'busy':<5} {'running':>7} {'waiting':>7} " \
           f"{'modules':>7} {'runs':>6}"  # fmt: skip
    lines = [head, "-" * len(head)]
    for d in status["devices"] + status.get("dropped", []):
        health = "ok" if d["healthy"] else ("no answer" if d.get("error") else "dropped")
        lines.append(f"{d['address']:<24} {d['key']:<12} {d.get('arch') or '-':<8} {health:<9} "
                     f"{'yes' if d['busy'] else 'no':<5} {_n(d.get('running')):>7} {_n(d.get('waiting')):>7} "
                     f"{_n(d.get('sessions')):>7} {_n(d.get('runs_done')):>6}")  # fmt: skip
    queues = ", ".join(f"{k}: {n}" for k, n in sorted(status["queues"].items())) or "none"
    lines.append(f"queued requests by key: {queues}")
    return "\n".join(lines)


def _n(x: Any) -> str:
    return "-" if x is None else str(x)
