"""What every compiled model does, whatever runs its kernels: the base class of the C, LLVM and GPU models.

`Model` checks inputs (names, count, dtype, shape: an `ArgumentError` before any native code runs), answers
`m(x)` and `m.run({...})`, and has `summary()`, `benchmark()`, `profile()`, `profile_table()`,
`random_inputs()` and `save(dir)` (plan.json, summary.json, weights.npz). A backend subclass says how a run
goes, in three steps over the checked input arrays:

    _start(arrays)            make the inputs visible to the kernels (once per call)
    _execute(arrays, times)   run every step of the plan; with `times`, each kernel call's and fallback
                              step's seconds by profile row
    _results(arrays)          the graph outputs as numpy arrays

and adds its own files to a saved model (`_save_files`) and facts to its summary (`_summary_extra`).

Threads: calls, benchmarks and profiles hold `_calls()`, by default one lock per model (the backend's state is
shared: a GPU model's device buffers); a backend that gives each calling thread its own state (the CPU models)
returns a context that holds nothing, so its calls run in parallel.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import shutil
import statistics
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..codegen.toolchain import sha256_of
from ..tir.dtype import numpy_dtype
from .module import ArgumentError
from .plan import Plan, PlanError, Step, check_plan
from .roofline import Limits, limits_for

Fallback = Callable[[str, dict, list[np.ndarray]], list[np.ndarray]]
Feeds = Sequence[np.ndarray] | Mapping[str, Any]  # inputs in graph order, or by name


TensorSpec = tuple[str, np.dtype, tuple[int, ...]]  # an input's name, dtype and shape
SIZES_KEPT = 16  # a symbolic model keeps what it made for this many sizes, the least recently used dropped first


def input_specs(plan: Plan) -> list[TensorSpec]:
    return [(plan.values[i].name, numpy_dtype(plan.values[i].dtype), tuple(plan.values[i].shape)) for i in plan.inputs]


def random_arrays(specs: Sequence[TensorSpec], seed: int = 0) -> list[np.ndarray]:
    """Random arrays for inputs: normal floats, fair bools, small non-negative integers."""
    rng = np.random.default_rng(seed)
    out = []
    for _, dt, shape in specs:
        if dt.kind == "f":
            out.append(rng.standard_normal(shape).astype(dt))
        elif dt.kind == "b":
            out.append(rng.random(shape) < 0.5)
        else:
            out.append(rng.integers(0, 4, shape).astype(dt))
    return out


def output_decoders(plan: Plan) -> list[tuple[int, Callable[[np.ndarray], Any]]]:
    """(output index, decoder) for each output that the plan's `info["decoders"]` (`Graph.decoders`) names: an
    index tensor decoded as the labels it picks (string class labels: a numpy array of Python objects, as
    onnxruntime returns them), a [N, C] score tensor as a list of N dicts label -> score, keys in order (ONNX-ML's
    ZipMap). A malformed entry raises PlanError."""
    out = []
    for key, d in plan.info.get("decoders", {}).items():
        try:
            i, kind, labels = int(key), d["kind"], list(d["labels"])
            if not 0 <= i < len(plan.outputs) or kind not in ("labels", "zipmap") or not (
                    all(isinstance(v, str) for v in labels) or all(isinstance(v, int) for v in labels)):  # fmt: skip
                raise ValueError
        except (ValueError, TypeError, KeyError):
            raise PlanError(f"plan of model {plan.name!r}: output decoder {key!r}: {d!r} is not one of "
                            "{'kind': 'labels' | 'zipmap', 'labels': [str, ...] | [int, ...]} for an output") from None
        if kind == "labels":
            table = np.empty(len(labels), object)
            table[:] = labels
            out.append((i, table.__getitem__))
            continue
        order = sorted(range(len(labels)), key=labels.__getitem__)  # (keys in order, as onnxruntime's maps)
        keys = [labels[j] for j in order]

        def zipmap(a: np.ndarray, keys=keys, order=order, i=i) -> list[dict]:
            rows = a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1)
            if rows.shape[-1] != len(keys):
                raise PlanError(f"plan of model {plan.name!r}: output {i} has {rows.shape[-1]} scores per row, its "
                                f"ZipMap {len(keys)} labels")  # fmt: skip
            return [dict(zip(keys, r)) for r in rows[:, order].tolist()]  # (tolist: Python floats, made in C)

        out.append((i, zipmap))
    return out


def check_feeds(model: str, specs: Sequence[TensorSpec], feeds: Feeds) -> list[np.ndarray]:
    """The inputs as contiguous arrays in `specs` order (given so, or by name); wrong names, count, dtype or shape
    raise ArgumentError naming the input. Local and remote models (ember.rpc) check their inputs here."""
    names = [n for n, _, _ in specs]
    if isinstance(feeds, Mapping):
        missing = [n for n in names if n not in feeds]
        extra = [n for n in feeds if n not in names]
        if missing or extra:
            raise ArgumentError(f"model {model}: inputs are {names}"
                                + (f"; missing {missing}" if missing else "")
                                + (f"; unknown {extra}" if extra else ""))  # fmt: skip
        feeds = [feeds[n] for n in names]
    if len(feeds) != len(specs):
        raise ArgumentError(f"model {model} takes {len(specs)} inputs ({', '.join(names)}), got {len(feeds)}")
    arrays = []
    for (name, dtype, shape), x in zip(specs, feeds):
        x = np.asarray(x)
        if x.dtype != dtype:
            want = f"{dtype}{list(shape)}" if shape is not None else f"{dtype}"  # (None: symbolic dims)
            raise ArgumentError(f"model {model}: input '{name}' has dtype {x.dtype}, wants {want}")
        if shape is not None and x.shape != shape:  # None: symbolic dims, checked by Plan.bind
            raise ArgumentError(f"model {model}: input '{name}' has shape {x.shape}, wants {dtype}{list(shape)}")
        arrays.append(x if x.flags.c_contiguous else np.ascontiguousarray(x).reshape(x.shape))  # (a scalar: 1-d)
    return arrays


def _dims_text(shape: tuple) -> str:
    return "[" + ", ".join(str(d).replace(" ", "") for d in shape) + "]"


def profile_table(rows: list[dict], top: int = 20) -> str:
    """The `top` rows of a profile (kernel, time, share, GFLOP/s, GB/s, what bounds it and the roofline fraction,
    ops) as a text table."""
    lines = [f"{'kernel':<32} {'ms':>9} {'share':>6} {'GFLOP/s':>8} {'GB/s':>7} {'bound':>7} {'roof':>5}  ops"]
    for r in rows[:top]:
        g = f"{r['gflops']:.1f}" if r["gflops"] else "-"
        gbs = f"{r['gbs']:.1f}" if r.get("gbs") else "-"
        roof = f"{r['roofline']:.0%}" if r.get("roofline") is not None else "-"
        lines.append(f"{r['kernel']:<32} {r['seconds'] * 1e3:>9.3f} {r['share']:>6.1%} {g:>8} {gbs:>7} "
                     f"{r.get('bound') or '-':>7} {roof:>5}  {'+'.join(r['ops'])}")  # fmt: skip
    return "\n".join(lines)


def add_roofline(rows: list[dict], limits: Limits | None) -> dict | None:
    """Give each profile row that knows its bytes what bounds it ("compute" or "memory") and its roofline fraction
    (the least time the machine allows over its measured time); the whole model's fraction (the rows' least times
    over all rows' time, fallbacks included) with the limits used, or None without limits."""
    if limits is None:
        return None
    least = 0.0
    for r in rows:
        if r.get("bytes") is None or r["seconds"] <= 0:
            continue
        seconds, bound = limits.bound(r["flops"], r["bytes"], r.get("int_flops", 0))
        r["bound"], r["roofline"] = bound, seconds / r["seconds"]
        least += seconds
    total = sum(r["seconds"] for r in rows)
    return {"fraction": least / total if total > 0 else None, "peak_gflops": limits.peak_gflops,
            "peak_int8_gops": limits.peak_int8_gops or None,
            "dram_gbs": limits.dram_gbs, "threads": limits.threads,
            "memory_bound_kernels": sum(1 for r in rows if r.get("bound") == "memory"),
            "compute_bound_kernels": sum(1 for r in rows if r.get("bound") == "compute")}  # fmt: skip


def latency(run: Callable[[], Any], repeat: int) -> dict:
    """Median, mean and min seconds of `repeat` calls of `run`, and every call's time."""
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        run()
        runs.append(time.perf_counter() - t0)
    return {"median": statistics.median(runs), "mean": statistics.fmean(runs), "min": min(runs), "runs": runs}


HUGE_PAGE = 2 << 20  # bytes: a transparent huge page (x86-64, and aarch64 with 4 KiB pages)


def gathered_weights(weights: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
    """The weights as C-contiguous arrays (0-d stays 0-d). Where they add up to a huge page or more, they are copied
    into one private anonymous mapping that starts at a huge-page boundary and asks for transparent huge pages
    (Linux, MADV_HUGEPAGE), each at a 64-byte boundary. A model that streams its weights at every call (a batch of
    one through a transformer) then reads them through few TLB entries whatever the process allocated before:
    left to numpy, only arrays of 4 MiB or more ask for huge pages and get them when memory allows, so two
    compiles of one model differed by 30% (a 4-layer BERT, d=768, at length 1). Weights of object dtypes, and
    platforms without madvise, keep numpy's memory."""
    arrays = {i: np.require(w, requirements="C") for i, w in weights.items()}
    packed = {i: w for i, w in arrays.items() if not w.dtype.hasobject}
    sizes = {i: -(-w.nbytes // 64) * 64 for i, w in packed.items()}
    advise = getattr(mmap, "MADV_HUGEPAGE", None)
    if sum(sizes.values()) < HUGE_PAGE or advise is None or not hasattr(mmap, "MAP_ANONYMOUS"):
        return arrays
    memory = mmap.mmap(-1, sum(sizes.values()) + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    memory.madvise(advise)
    raw = np.frombuffer(memory, np.uint8)  # (the arrays keep the mapping alive)
    offset = (-raw.ctypes.data) % HUGE_PAGE
    for i, w in packed.items():
        arrays[i] = raw[offset : offset + w.nbytes].view(w.dtype).reshape(w.shape)
        arrays[i][...] = w
        offset += sizes[i]
    return arrays


MANIFEST = "manifest.json"  # a saved model's table of contents: every file's SHA-256, every weight's type
MANIFEST_FORMAT = 1


class ArtifactError(ValueError):
    """A saved model that is incomplete, corrupted or edited since it was saved: the message names the file."""


def read_manifest(directory: Path) -> dict:
    """A saved model's manifest, after checking every file it lists against its SHA-256 (nothing is loaded, and no
    native code runs, before this passes)."""
    path = directory / MANIFEST
    if not path.is_file():
        raise ArtifactError(f"{directory}: no {MANIFEST}: not a complete saved Ember model (an interrupted save, or "
                            f"one by an Ember before manifests): save the model again")  # fmt: skip
    try:
        manifest = json.loads(path.read_bytes())
        files, weights = manifest["files"], manifest["weights"]
    except (ValueError, KeyError, TypeError) as e:
        raise ArtifactError(f"{path}: not a manifest Ember can read ({type(e).__name__}: {e})") from None
    if manifest.get("format") != MANIFEST_FORMAT or not isinstance(files, dict) or not isinstance(weights, dict):
        raise ArtifactError(f"{path}: not a manifest of format {MANIFEST_FORMAT}")
    for name in ("plan.json", "weights.npz"):
        if name not in files:
            raise ArtifactError(f"{path}: lists no {name}")
    for name, digest in files.items():
        if not isinstance(name, str) or Path(name).is_absolute() or ".." in Path(name).parts or name == MANIFEST:
            raise ArtifactError(f"{path}: lists a file outside the model's directory: {name!r}")
        f = directory / name
        if not f.is_file():
            raise ArtifactError(f"{f}: missing (the manifest lists it)")
        if sha256_of(f) != digest:
            raise ArtifactError(f"{f}: changed since the model was saved (its SHA-256 is not the manifest's)")
    return manifest


def read_saved(directory: Path) -> tuple[Plan, dict[int, np.ndarray], dict, str]:
    """The files every saved model has (its plan, its weights by value id, its summary) and its backend, verified:
    the manifest's hashes, the weights' shapes and dtypes, the plan's consistency (`check_plan`)."""
    manifest = read_manifest(directory)
    try:
        plan = Plan.from_json(json.loads((directory / "plan.json").read_text()))
    except (ValueError, KeyError, TypeError) as e:
        raise ArtifactError(f"{directory / 'plan.json'}: not a plan Ember can read ({type(e).__name__}: {e})") from None
    try:
        with np.load(directory / "weights.npz", allow_pickle=False) as z:
            weights = {int(k[1:]): z[k] for k in z.files}
    except (ValueError, OSError) as e:
        raise ArtifactError(f"{directory / 'weights.npz'}: not readable ({e})") from None
    typed = {f"v{i}": [w.dtype.name, list(w.shape)] for i, w in weights.items()}
    if typed != manifest["weights"]:
        raise ArtifactError(f"{directory / 'weights.npz'}: weights of other shapes or dtypes than the manifest's")
    try:
        check_plan(plan, weights)
    except PlanError as e:
        raise ArtifactError(f"{directory / 'plan.json'}: {e}") from None
    summary = json.loads((directory / "summary.json").read_text()) if "summary.json" in manifest["files"] else {}
    return plan, weights, summary, str(manifest.get("backend"))


def replace_directory(staged: Path, out: Path) -> None:
    """Put a fully written directory in place of `out`: an existing saved model there is replaced whole (no file of
    an earlier save stays behind), anything else there is left alone with an error."""
    if out.exists():
        if not out.is_dir() or (any(out.iterdir()) and not (out / "plan.json").exists()):
            raise FileExistsError(f"{out} exists and is not a saved Ember model: not overwriting it")
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
        out.rename(old / out.name)
        staged.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        staged.rename(out)


class Model:
    """A compiled model: call it with numpy arrays (positional, in graph input order) or `run` a dict."""

    backend = ""  # the kind of code a saved model holds ("c", "llvm", "gpu"): `runtime.load` dispatches on it

    def __init__(self, plan: Plan, weights: Mapping[int, np.ndarray], fallback: Fallback | None = None,
                 summary: dict | None = None):  # fmt: skip
        self.plan = plan
        self._weights = gathered_weights(weights)
        self._fallback = fallback
        self._summary = dict(summary or {})
        self._lock = threading.RLock()
        self._roofline: dict | None = None  # the last profile's whole-model roofline (summary()["roofline"])
        # what a call checks its inputs against (symbolic dims: shapes None, `_bind` checks them)
        self._symbolic = plan.is_symbolic
        self._specs = [(n, dt, None if self._symbolic else shape) for n, dt, shape in input_specs(plan)]
        self._decoders = output_decoders(plan)  # outputs returned decoded (string labels, ZipMap's maps)
        # symbolic sizes: what each size needs (`_at`), by input shapes when they give every size (a repeat shape
        # is one lookup), else by the sizes `Plan.bind` reads; the SIZES_KEPT last used are kept
        self._by_shapes = not any(getattr(v, "source", "") for v in plan.size_vars)
        self._kept: OrderedDict[tuple, Any] = OrderedDict()

    # -- how a backend runs (see the module's doc) ----------------------------------------------------------
    def _start(self, arrays: list[np.ndarray]) -> None:
        pass

    def _execute(self, arrays: list[np.ndarray] | None, times: dict[int, float] | None = None) -> None:
        raise NotImplementedError

    def _results(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError

    def _save_files(self, out: Path) -> None:
        pass

    def _calls(self) -> contextlib.AbstractContextManager:
        """Held by every call: one call at a time unless a backend keeps its state per thread."""
        return self._lock

    def _summary_extra(self) -> dict:
        return {}

    def _current_plan(self) -> Plan:
        """The plan of the calling thread's current call (a backend with symbolic sizes: the plan at them)."""
        return self.plan

    def _at(self, sizes: tuple[int, ...]) -> Any:
        """What calls at one set of sizes need, made at the first call at them (`_bind`): here the plan at them; a
        backend that runs symbolic plans adds what it derives from it."""
        return self.plan.at(sizes)

    def _profile_extra(self, step: int, call: int | None) -> dict:
        """Extra columns of the profile row of a step's kernel call (None: a fallback step)."""
        return {}

    # -- metadata -------------------------------------------------------------------------------------------
    @property
    def input_names(self) -> list[str]:
        return [self.plan.values[i].name for i in self.plan.inputs]

    @property
    def output_names(self) -> list[str]:
        return [self.plan.values[i].name for i in self.plan.outputs]

    def summary(self) -> dict:
        kernels = [k for s in self.plan.steps if s.kind == "segment" for k in s.kernels]
        return {
            **self._summary,
            "kernels": len(kernels),
            "distinct_kernels": len({k.name for k in kernels}),
            **self._summary_extra(),
            "fallback_ops": [s.op for s in self.plan.steps if s.kind == "fallback"],
            "native_calls_per_run": sum(1 for s in self.plan.steps if s.kind == "segment"),
            "workspace_bytes": self.plan.workspace,
            **({"symbolic_dims": {v.name: [getattr(v, "lo", 0), getattr(v, "hi", None)] for v in self.plan.size_vars},
                "input_shapes": {self.plan.values[i].name: _dims_text(self.plan.values[i].shape)
                                 for i in self.plan.inputs}} if self.plan.is_symbolic else {}),  # fmt: skip
            "target": self.plan.target,
            **({"roofline": self._roofline} if self._roofline else {}),
        }

    def update_summary(self, **facts: Any) -> None:
        """Add facts to what `summary()` and a saved model report (the driver's compile times)."""
        self._summary.update(facts)

    # -- running --------------------------------------------------------------------------------------------
    def _check(self, feeds: Feeds) -> list[np.ndarray]:
        """The inputs as contiguous arrays in graph order; wrong names, count, dtype or shape raise."""
        arrays = check_feeds(self.plan.name, self._specs, feeds)
        if self._symbolic:
            self._bind(arrays)
        return arrays

    def _bind(self, arrays: list[np.ndarray]) -> Any:
        """A symbolic model's call: `_at` of its sizes, made at a new size and kept for the SIZES_KEPT last used. A
        repeat of input shapes that give every size is one lookup (no size evaluated, nothing checked again: the
        same shapes passed before); ArgumentError naming the input whose shape the plan refuses."""
        key = tuple([a.shape for a in arrays]) if self._by_shapes else self._sizes(arrays)
        try:
            at = self._kept[key]
            self._kept.move_to_end(key)
            return at
        except KeyError:  # a new size (or one another thread has just dropped)
            pass
        sizes = self._sizes(arrays) if self._by_shapes else key
        with self._lock:
            at = self._kept.get(key)
            if at is None:
                at = self._kept[key] = self._at(sizes)
                while len(self._kept) > SIZES_KEPT:
                    self._kept.popitem(last=False)
        return at

    def _sizes(self, arrays: list[np.ndarray]) -> tuple[int, ...]:
        try:
            return self.plan.bind([a.shape for a in arrays], arrays)
        except ValueError as e:
            raise ArgumentError(f"model {self.plan.name}: {e}") from None

    def _outputs_of(self, feeds: Feeds) -> list[Any]:
        arrays = self._check(feeds)
        with self._calls():
            self._start(arrays)
            self._execute(arrays)
            outs = self._results(arrays)
        for i, decode in self._decoders:
            outs[i] = decode(outs[i])
        return outs

    def __call__(self, *inputs: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        outs = self._outputs_of(inputs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Inputs by graph input name in, outputs by graph output name out."""
        return dict(zip(self.output_names, self._outputs_of(feeds)))

    def _reference(self, s: Step, read: Callable[[int], np.ndarray | None]) -> list[np.ndarray]:
        """A fallback step's outputs: its node's numpy reference on its inputs (`read` gives a value's array)."""
        if self._fallback is None:
            raise RuntimeError(f"node {s.node} ({s.op}) needs the reference fallback, which is not available")
        return list(self._fallback(s.op, s.attrs, [None if i is None else read(i) for i in s.inputs]))

    def random_inputs(self, seed: int = 0, sizes: Mapping[str, int] | None = None) -> list[np.ndarray]:
        """Random inputs; a symbolic model's at `sizes` ({"S": 7}; default: each size at its lower bound, >= 1)."""
        plan = self.plan
        if plan.is_symbolic:
            given = dict(sizes or {})
            plan = plan.at(tuple(given.get(v.name, max(1, getattr(v, "lo", 1))) for v in plan.size_vars))
        return random_arrays(input_specs(plan), seed)

    def benchmark(self, inputs: Feeds | None = None, repeat: int = 20, warmup: int = 3) -> dict:
        """Latency of whole inferences: median, mean, min (seconds) over `repeat` runs."""
        arrays = self._check(inputs if inputs is not None else self.random_inputs())
        with self._calls():
            self._start(arrays)
            for _ in range(warmup):
                self._execute(arrays)
            return latency(lambda: self._execute(arrays), repeat)

    def _limits(self) -> Limits | None:
        """The machine's limits for the roofline (None: not known for this backend or target)."""
        return limits_for(self.plan.target)

    def profile(self, inputs: Feeds | None = None, repeat: int = 10) -> list[dict]:
        """Per-kernel (and per-fallback) median time over `repeat` runs, slowest first; each kernel's FLOPs, bytes
        moved (its arguments' sizes), GFLOP/s and GB/s, and against the machine's limits (`runtime.roofline`, measured
        once per machine and target) what bounds it and its roofline fraction. The whole model's fraction is then in
        `summary()["roofline"]`."""
        arrays = self._check(inputs if inputs is not None else self.random_inputs())
        samples = []
        with self._calls():
            self._start(arrays)
            self._execute(arrays)
            for _ in range(repeat):
                times: dict[int, float] = {}
                self._execute(arrays, times)
                samples.append(times)
        sized = self._current_plan()  # (symbolic sizes: the plan at this call's, its FLOPs and shapes evaluated)
        rows = []
        for j, s in enumerate(sized.steps):
            for c, k in enumerate(s.kernels) if s.kind == "segment" else [(None, None)]:
                med = statistics.median(t[len(rows)] for t in samples)
                if k is None:
                    row = {"kernel": f"fallback:{s.op}", "ops": [s.op], "nodes": [s.node], "seconds": med, "flops": 0}
                else:
                    row = {"kernel": k.name, "ops": k.ops, "nodes": k.nodes, "seconds": med, "flops": k.flops,
                           "int_flops": k.int_flops, "bytes": self._kernel_bytes(k.args, k.arg_bytes, sized)}
                rows.append(row | self._profile_extra(j, c))
        total = sum(r["seconds"] for r in rows) or 1.0
        for r in rows:
            r["share"] = r["seconds"] / total
            r["gflops"] = r["flops"] / r["seconds"] / 1e9 if r["seconds"] > 0 and r["flops"] else 0.0
            r["gbs"] = r["bytes"] / r["seconds"] / 1e9 if r["seconds"] > 0 and r.get("bytes") else 0.0
        self._roofline = add_roofline(rows, self._limits())
        return sorted(rows, key=lambda r: -r["seconds"])

    def _kernel_bytes(self, args: list[int], arg_bytes: list[int], plan: Plan | None = None) -> int | None:
        """The bytes a kernel moves: each argument once, at the sizes of `plan` (None: not known)."""
        if arg_bytes:
            return int(sum(arg_bytes))
        values = [(plan or self.plan).values[a] for a in args]
        return sum(v.nbytes for v in values) if all(v.is_static for v in values) else None

    def profile_table(self, inputs: Feeds | None = None, top: int = 20) -> str:
        return profile_table(self.profile(inputs), top)

    # -- persistence ----------------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """A directory holding the plan, the summary, the weights, the backend's own files (its code) and a manifest
        (every file's SHA-256, every weight's dtype and shape), which `ember.load` checks before it runs the model
        again without the compiler. The files are written to a fresh directory first and moved into place whole, so
        a killed save leaves no half-written model."""
        plan_json = self.plan.to_json()  # (a size computed on the host from inputs: NotImplementedError)
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(prefix=f".{out.name}.saving.", dir=out.parent))
        try:
            self._save_files(staged)
            (staged / "plan.json").write_text(json.dumps(plan_json, indent=1) + "\n")
            (staged / "summary.json").write_text(json.dumps(self._summary, indent=1, default=str) + "\n")
            np.savez(staged / "weights.npz", **{f"v{i}": w for i, w in self._weights.items()})
            files = {p.relative_to(staged).as_posix(): sha256_of(p) for p in sorted(staged.rglob("*")) if p.is_file()}
            weights = {f"v{i}": [w.dtype.name, list(w.shape)] for i, w in self._weights.items()}
            manifest = {"format": MANIFEST_FORMAT, "backend": self.backend, "files": files, "weights": weights}
            (staged / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
            replace_directory(staged, out)
        finally:
            shutil.rmtree(staged, ignore_errors=True)
        return out

    def __repr__(self) -> str:
        s = self.summary()
        return f"{type(self).__name__}({self.plan.name}: {s['kernels']} kernels, target '{self.plan.target}')"
