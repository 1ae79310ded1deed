"""Measuring candidates safely: build in a process pool, run in a separate process with a time limit.

`Measurer.measure(task, configs)` does, per batch:

1. build: each candidate (task + config) is instantiated, lowered, compiled to C and to a shared
   library in a pool of worker processes (compiles run in parallel; identical code is a cache hit);
   an exception (an illegal schedule, a compiler error) or a build past `build_timeout` is an
   error of kind "compile" or "build_timeout". A worker that dies (a template that segfaults or
   exits) breaks the pool and every future in it: the pool is replaced and the candidates whose
   futures were lost are built again one at a time, so that exactly the one whose worker dies alone
   is an error of kind "crash" ("build worker died (exit status 3)") and the others go on;
2. run: one at a time (timings never overlap a compile), in a runner process: the library is
   loaded, called once on the task's random inputs and its outputs compared with the reference
   (the numpy references of the task's ops, else the fallback config's outputs); then warm-up
   calls for `warmup` seconds and `repeat` timed runs of at least `min_time` seconds each (the
   cost is their median). A runner that dies (a segfault) gives an error of kind "crash" with
   its signal, one that does not answer within `run_timeout` is killed ("timeout"), a wrong
   answer is "wrong", a failed call "runtime"; a fresh runner then serves the next candidate.

Build workers fork from this process (templates given as functions stay reachable); the runner is
a fresh interpreter (`python -m ember.tune.runner`), so native code never runs in a fork of a
process with live OpenMP threads, and the caller's main module is not re-imported.

Neither outlives the tuner, even one killed with `kill -9` (which runs no clean-up): each calls
`die_with_parent` as it starts (the workers in the pool's initializer, the runner in its `main`).
On Linux the kernel sends it SIGKILL when its parent dies (`prctl(PR_SET_PDEATHSIG)`), and on every
platform a watchdog thread exits it once `os.getppid()` is no longer the tuner (it was reparented).
Build workers stay in the tuner's process group; the runner has its own session (a time-out kills
its whole group). The death signal follows the thread that started the child: a Measurer is meant
to be used from one long-lived thread (the main thread in `ember tune`).
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import select
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ember.te.config import ConfigEntity
from ember.tune.runner import cache_flush_bytes

ERROR_KINDS = ("compile", "build_timeout", "runtime", "crash", "timeout", "wrong")


@dataclass
class MeasureResult:
    """The outcome of one candidate: run times in seconds, or an error kind and its reason."""

    config: ConfigEntity
    costs: tuple[float, ...] = ()
    error: str | None = None
    detail: str = ""
    build_s: float = 0.0
    timestamp: float = field(default_factory=time.time)
    schedule: dict | None = None  # the candidate's schedule (`Schedule.record()`), where it was built

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.costs)

    @property
    def transient(self) -> bool:
        """A failure that says nothing sure about the candidate, so a resumed run measures it again: its build
        worker died (it, or a neighbour in its batch before the culprit was told apart), it timed out, or the remote
        device measuring it was lost or could not take it (a detail starting "device lost" or "device busy")."""
        return (self.error in ("timeout", "build_timeout") or "build worker died" in self.detail
                or self.detail.startswith(("device lost", "device busy")))  # fmt: skip

    @property
    def cost(self) -> float:
        return statistics.median(self.costs) if self.ok else float("inf")

    def gflops(self, flops: int) -> float:
        return flops / self.cost / 1e9 if self.ok and self.cost > 0 else 0.0


# ------------------------------------------------------------------------------------------------
# tied to the tuner's life: build workers and the runner die with the process that started them
# ------------------------------------------------------------------------------------------------
PARENT_ENV = "EMBER_TUNE_PARENT"  # the tuner's pid, given to the runner process


def die_with_parent(parent: int) -> None:
    """Make this process (a build worker or the runner) exit when `parent` does, even after a `kill -9`:
    on Linux the kernel sends SIGKILL at the parent's death (`prctl(PR_SET_PDEATHSIG)`); everywhere a
    daemon thread polls `os.getppid()` and exits the process once it is no longer `parent` (reparented)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before the death signal was armed
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="ember-parent-watchdog", daemon=True).start()


# ------------------------------------------------------------------------------------------------
# the build half (runs in pool workers)
# ------------------------------------------------------------------------------------------------
def build_candidate(task: Any, knobs: dict) -> dict:
    """Compile one candidate to a shared library: {"lib", "symbol", "specs", "build_s"} or an error."""
    from ember.build import lower
    from ember.codegen.c import c_symbol, codegen_c
    from ember.codegen.toolchain import compile_c, compiler_for
    from ember.target import Target
    from ember.tir.functor import walk
    from ember.tir.stmt import Store

    t0 = time.perf_counter()
    try:
        target = Target.parse(task.target)
        cfg = task.space.entity(knobs)
        sch, args = task.instantiate(cfg)
        gpu = target.kind in ("opencl", "cuda")
        func = lower(sch, args, "candidate", gpu=gpu)
        written = {n.buffer for n in walk(func.body) if isinstance(n, Store)}
        specs = [(b.name, list(b.shape), b.dtype.name, b in written) for b in func.params]
        if gpu:  # the target's own code generator; the device program is built where it runs (the runner)
            gpu_source(func, target)
            return {"gpu": str(target), "task": task, "knobs": knobs, "symbol": c_symbol(func.name), "specs": specs,
                    "build_s": time.perf_counter() - t0, "schedule": sch.record()}  # fmt: skip
        lib = compile_c(codegen_c(func, target), target.cflags(), cc=compiler_for(target))
    except Exception as e:  # any failure to build is the candidate's error, not the tuner's
        detail = f"{type(e).__name__}: {e}"[:2000]
        return {"error": "compile", "detail": detail, "trace": traceback.format_exc(limit=4)[-2000:]}
    return {"lib": str(lib), "symbol": c_symbol(func.name), "specs": specs, "build_s": time.perf_counter() - t0,
            "schedule": sch.record()}


def gpu_source(func: Any, target: Any) -> str:
    """The device source of a lowered function for a GPU target (OpenCL C or CUDA): code generation errors
    surface in the build worker, as a compile error of the candidate."""
    from ember.codegen.gpu import split_host_device

    prog = split_host_device(func)
    if target.kind == "opencl":
        from ember.codegen.opencl import codegen_opencl

        return codegen_opencl(prog, target)
    from ember.codegen.cuda import codegen_cuda

    return codegen_cuda(prog, target)


# ------------------------------------------------------------------------------------------------
# the run half (a runner process: `python -m ember.tune.runner`)
# ------------------------------------------------------------------------------------------------
class _Runner:
    """A runner process and the pipes to it (length-prefixed pickles); restarted after a crash or a
    time-out. A plain subprocess, not multiprocessing: the caller's main module is never re-run."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env[PARENT_ENV] = str(os.getpid())
        self.proc = subprocess.Popen([sys.executable, "-m", "ember.tune.runner"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, start_new_session=True)  # fmt: skip

    def run(self, msg: dict, timeout: float) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        proc = self.proc
        try:
            send_msg(proc.stdin, msg)
            ready, _, _ = select.select([proc.stdout], [], [], timeout)
            if not ready:
                self.kill()
                return {"error": "timeout", "detail": f"no result within {timeout:g} s (killed)"}
            out = recv_msg(proc.stdout)
        except (OSError, EOFError, pickle.UnpicklingError):
            out = None
        if out is not None:
            return out
        try:
            code = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = None
        self.proc = None
        if code is not None and code < 0:
            return {"error": "crash", "detail": f"runner killed by {_status(code)}"}
        return {"error": "crash", "detail": f"runner exited with status {code}"}

    def kill(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
            self.proc.wait()
        self.proc = None

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                send_msg(self.proc.stdin, None)
                self.proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass
            if self.proc.poll() is None:
                self.kill()
        self.proc = None


def _status(code: int) -> str:
    """A process's exit code in words: "exit status 3", "SIGSEGV"."""
    if code >= 0:
        return f"exit status {code}"
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def send_msg(f, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(struct.pack("<Q", len(data)) + data)
    f.flush()


def recv_msg(f) -> Any:
    head = f.read(8)
    if len(head) < 8:
        raise EOFError("runner closed its pipe")
    (n,) = struct.unpack("<Q", head)
    data = f.read(n)
    if len(data) < n:
        raise EOFError("runner closed its pipe mid-message")
    return pickle.loads(data)


class Measurer:
    """Builds candidates in a process pool and runs them one by one in a runner process.

    `cache` (a dict, optional) remembers results by (workload, target, config): a candidate seen
    before is not built or run again (benches share it between tuners). `flush_cache`: each timed call of a CPU
    kernel runs after twice the last-level cache's bytes were written elsewhere and its first argument read
    (`runner.cold_runs`), as the kernel runs in a whole model: its weights come from memory, its input from cache."""

    def __init__(self, n_parallel: int | None = None, build_timeout: float = 120.0, run_timeout: float = 20.0,
                 repeat: int = 5, min_time: float = 0.02, warmup: float = 0.05, check: bool = True,
                 rtol: float = 1e-3, cache: dict | None = None, seed: int = 0, flush_cache: bool = False):  # fmt: skip
        self.n_parallel = n_parallel or os.cpu_count() or 1
        self.flush = cache_flush_bytes() if flush_cache else 0  # each timed call of a CPU kernel on cold caches
        self.build_timeout = build_timeout
        self.run_timeout = run_timeout
        self.repeat, self.min_time, self.warmup = repeat, min_time, warmup
        self.check, self.rtol, self.seed = check, rtol, seed
        self.cache = cache
        self._pool: cf.ProcessPoolExecutor | None = None
        self._runner = _Runner()
        self._tmp = tempfile.TemporaryDirectory(prefix="ember-tune-")
        self._data: dict[str, tuple[str, str | None]] = {}
        self._death = ""  # how the last build worker that died ended: " (exit status 3)", " (SIGSEGV)"
        self._workers: list = []  # the build pool's processes when candidates were last submitted
        self.build = build_candidate  # (task, knobs) -> built candidate or error: what the pool's workers run

    # -- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._runner.close()
        self._stop_pool()
        self._tmp.cleanup()

    def _pool_(self) -> cf.ProcessPoolExecutor:
        if self._pool is None:
            self._pool = cf.ProcessPoolExecutor(self.n_parallel, mp_context=mp.get_context("fork"),
                                                initializer=die_with_parent, initargs=(os.getpid(),))  # fmt: skip
        return self._pool

    def _stop_pool(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        # (the pool's own table, which its manager thread may already have emptied after a death, and the workers
        # seen when candidates were last submitted: the dead one's exit status names the death)
        procs = list({id(p): p for p in [*self._workers, *(getattr(pool, "_processes", None) or {}).values()]}.values())
        self._workers = []
        exited = [p for p in procs if mp.connection.wait([p.sentinel], timeout=0)]  # ended, maybe not yet reaped
        for p in exited:
            p.join(timeout=2)
        died = [p.exitcode for p in exited if p.exitcode not in (None, 0, -signal.SIGTERM)]  # the pool sends SIGTERM
        self._death = f" ({_status(died[0])})" if died else ""
        pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(timeout=5)

    # -- measuring ------------------------------------------------------------------------------
    def cached(self, task: Any, configs: list[ConfigEntity]) -> tuple[dict[int, MeasureResult], list[int]]:
        """The results this measurer's cache already holds, by index in `configs`, and the indices still to measure."""
        results: dict[int, MeasureResult] = {}
        todo = []
        for i, cfg in enumerate(configs):
            hit = self.cache.get(self._key(task, cfg)) if self.cache is not None else None
            if hit is not None:
                results[i] = hit
            else:
                todo.append(i)
        return results, todo

    def measure(self, task: Any, configs: list[ConfigEntity]) -> list[MeasureResult]:
        results, todo = self.cached(task, configs)
        built = self._build(task, [configs[i] for i in todo])
        for i, b in zip(todo, built):
            results[i] = self._run(task, configs[i], b)
            if self.cache is not None and results[i].error not in ("timeout", "build_timeout"):
                self.cache[self._key(task, configs[i])] = results[i]
        return [results[i] for i in range(len(configs))]

    @staticmethod
    def _key(task: Any, cfg: ConfigEntity) -> tuple:
        return (task.workload, task.target, cfg.key())

    def _build(self, task: Any, configs: list[ConfigEntity]) -> list[dict]:
        """Build results in the order of configs. Candidates lost with a build worker that died (their
        futures broken) are built again one at a time in a fresh pool: the one whose worker dies alone is
        the culprit, an error of kind "crash" ("build worker died"); the others build as usual."""
        out = self._build_group(task, configs)
        lost = [i for i, b in enumerate(out) if b is None]
        for i in lost:
            b = self._build_group(task, [configs[i]])[0] if len(configs) > 1 else None
            out[i] = b if b is not None else {"error": "crash", "detail": f"build worker died{self._death}"}
        return out

    def _build_group(self, task: Any, configs: list[ConfigEntity]) -> list[dict | None]:
        """Build results (None for a candidate lost with a dead worker); the pool is replaced after a death
        or a build time-out."""
        if not configs:
            return []
        pool = self._pool_()
        try:
            futs = [pool.submit(self.build, task, dict(c.values)) for c in configs]
        except cf.process.BrokenProcessPool:
            self._stop_pool()
            pool = self._pool_()
            futs = [pool.submit(self.build, task, dict(c.values)) for c in configs]
        self._workers = list((getattr(pool, "_processes", None) or {}).values())
        done, _ = cf.wait(futs, timeout=self.build_timeout)
        out: list[dict | None] = []
        restart = False
        for f in futs:
            if f not in done:
                out.append({"error": "build_timeout", "detail": f"build not done within {self.build_timeout:g} s"})
                restart = True
                continue
            try:
                out.append(f.result())
            except cf.process.BrokenProcessPool:
                out.append(None)
                restart = True
            except Exception as e:
                out.append({"error": "compile", "detail": f"{type(e).__name__}: {e}"})
        if restart:
            self._stop_pool()
        return out

    def _task_data(self, task: Any) -> tuple[str, str | None]:
        """Files of the task's random inputs and reference outputs (computed once per task)."""
        key = f"{task.workload}|{task.target}"
        if key in self._data:
            return self._data[key]
        d = Path(self._tmp.name) / f"task{len(self._data)}"
        d.mkdir()
        inputs = task.random_inputs(self.seed)
        np.savez(d / "inputs.npz", **{f"a{i}": x for i, x in enumerate(inputs)})
        ref = None
        if self.check:
            outs = task.reference(inputs)
            if outs is None:  # no numpy reference: the fallback config's outputs are the reference
                b = build_candidate(task, dict(task.space.fallback().values))
                if "error" in b:
                    raise RuntimeError(f"the fallback config of {task.name} does not build: {b['detail']}")
                res = self._runner.run(self._msg(b, str(d / "inputs.npz"), None, save=str(d / "ref.npz")),
                                       self.run_timeout)  # fmt: skip
                if "error" in res:
                    raise RuntimeError(f"the fallback config of {task.name} fails: {res['detail']}")
            else:
                np.savez(d / "ref.npz", **{f"a{i}": y for i, y in enumerate(outs)})
            ref = str(d / "ref.npz")
        self._data[key] = (str(d / "inputs.npz"), ref)
        return self._data[key]

    def _msg(self, built: dict, inputs: str, ref: str | None, save: str | None = None) -> dict:
        gpu = {"gpu": built["gpu"], "task": built["task"], "knobs": built["knobs"]} if built.get("gpu") else {}
        return {**gpu, "lib": built.get("lib"), "symbol": built["symbol"], "specs": built["specs"], "inputs": inputs,
                "ref": ref, "save": save, "rtol": self.rtol, "repeat": self.repeat if save is None else 0,
                "min_time": self.min_time, "warmup": self.warmup, "flush": self.flush}  # fmt: skip

    def _run(self, task: Any, cfg: ConfigEntity, built: dict) -> MeasureResult:
        if "error" in built:
            return MeasureResult(cfg, error=built["error"], detail=built["detail"])
        inputs, ref = self._task_data(task)
        res = self._runner.run(self._msg(built, inputs, ref), self.run_timeout)
        sch = built.get("schedule")
        if "error" in res:
            return MeasureResult(cfg, error=res["error"], detail=res["detail"], build_s=built["build_s"], schedule=sch)
        return MeasureResult(cfg, costs=tuple(res["costs"]), build_s=built["build_s"], schedule=sch)
