"""The run plan of a compiled model: numbered values, the steps that compute them, workspace offsets.

A plan is plain data (saved as `plan.json`): every backend runs the same plan.

- values: graph inputs, weights, intermediates ("temp": a workspace slice), outputs, and aliases (views such
  as Reshape, which share their source's storage; or a slice of it at `view_offset` bytes: a part of a Concat
  that its producer writes in place, a channel slice of a Split);
- steps: a *segment* is consecutive native kernels called by one generated function; a *fallback* step runs
  one node through its numpy reference;
- offsets: `plan_offsets` places the temporaries in one workspace, reusing memory by liveness, each aligned
  to a given number of bytes (64 for the CPU backends, a device's sub-buffer alignment for the GPU ones).

This module imports nothing else from `ember.runtime`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..target import Target
from ..tir.arith import eval_int
from ..tir.dtype import numpy_dtype
from ..tir.expr import Expr, Var
from ..tir.functor import walk
from ..tir.sizevar import SizeJSONError, dim_from_json, dim_to_json, size_var_to_json, size_vars_from_json

ALIGN = 64  # bytes: the CPU backends' workspace alignment


@dataclass
class ValueInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str  # "input" | "weight" | "temp" | "output" | "alias"
    offset: int = -1  # workspace offset of temps
    alias_of: int = -1  # for aliases: the value whose storage this one shares
    view_offset: int = 0  # for aliases: where this one starts in its source's storage, in bytes

    @property
    def nbytes(self) -> int:
        if not self.is_static:
            raise TypeError(f"value {self.name} has symbolic dims: its size is known at run time (Plan.at)")
        return int(np.prod(self.shape, dtype=np.int64)) * numpy_dtype(self.dtype).itemsize

    @property
    def is_static(self) -> bool:
        return all(not isinstance(d, Expr) for d in self.shape)


@dataclass
class KernelInfo:
    name: str  # C function
    args: list[int]  # value ids, inputs then outputs
    nodes: list[str]  # graph nodes computed by this kernel
    ops: list[str]
    flops: int = 0
    arg_bytes: list[int] = field(default_factory=list)  # bytes the code reads or writes per argument
    sizes: list[int] = field(default_factory=list)  # a kernel with symbolic sizes: indices into Plan.size_vars
    flops_expr: Any = None  # symbolic sizes: its FLOPs as an expression of them (`flops`: at the compile's hints)
    int_flops: int = 0  # of `flops` at the compile's hints, the integer multiply-accumulates (8-bit dot products)

    def flops_at(self, env: dict) -> int:
        """Its FLOPs at a call's sizes (`env`: size variable -> value)."""
        if self.flops_expr is None:
            return self.flops
        n = eval_int(self.flops_expr, env)
        return self.flops if n is None else int(n)

    def at_sizes(self, env: dict) -> KernelInfo:
        """This kernel with its FLOPs at a call's sizes (the integer share as at the hints)."""
        n = self.flops_at(env)
        share = self.int_flops / self.flops if self.flops else 0.0
        return replace(self, flops=n, flops_expr=None, int_flops=round(n * share))


@dataclass
class Step:
    kind: str  # "segment" (native kernels) or "fallback" (reference evaluation of one node)
    kernels: list[KernelInfo] = field(default_factory=list)
    function: str = ""  # segment: the generated C function
    op: str = ""  # fallback
    attrs: dict = field(default_factory=dict)
    inputs: list[int | None] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    node: str = ""


@dataclass
class Plan:
    name: str
    values: list[ValueInfo]
    inputs: list[int]
    outputs: list[int]
    steps: list[Step]
    workspace: int
    target: str
    info: dict = field(default_factory=dict)

    # -- symbolic sizes: one plan per size, made at run time ------------------------------------------------
    @property
    def size_vars(self) -> list[Var]:
        """The size variables of a symbolic plan (bare dims of its inputs first), in the order kernels and
        segment runners receive them; empty for a static plan."""
        cached = self.__dict__.get("_size_vars")
        if cached is not None and cached[0] == len(self.values):
            return cached[1]
        out: dict[Var, None] = {}
        for i in self.inputs + list(range(len(self.values))):
            for d in self.values[i].shape:
                if isinstance(d, Expr):
                    out.update((n, None) for n in walk(d) if isinstance(n, Var))
        self.__dict__["_size_vars"] = (len(self.values), list(out))
        return list(out)

    @property
    def is_symbolic(self) -> bool:
        return bool(self.size_vars)

    def bind(self, shapes: list[tuple[int, ...]], arrays: list[np.ndarray] | None = None) -> tuple[int, ...]:
        """The size variables' values (in `size_vars` order) given the input arrays' shapes, and for sizes read
        from input values (a shape operand fed as an input, `ember.graph.dims.ValueSizeVar`) the arrays; ValueError
        naming the input when a dim contradicts another or a size is outside its bounds."""
        env: dict[Var, int] = {}
        for i, shape in zip(self.inputs, shapes):
            v = self.values[i]
            if len(shape) != len(v.shape):
                raise ValueError(f"input '{v.name}' has shape {tuple(shape)}, wants rank {len(v.shape)} "
                                 f"{_dims(v.shape)}")  # fmt: skip
            for d, n in zip(v.shape, shape):
                if isinstance(d, Var) and d not in env:
                    lo, hi = getattr(d, "lo", 0), getattr(d, "hi", None)
                    if n < lo or (hi is not None and n > hi):
                        raise ValueError(f"input '{v.name}' has shape {tuple(shape)}: size {d.name} = {n} is outside "
                                         f"its bounds [{lo}, {'inf' if hi is None else hi}]")  # fmt: skip
                    env[d] = int(n)
        for i, shape in zip(self.inputs, shapes):
            v = self.values[i]
            want = tuple(eval_int(d, env) if isinstance(d, Expr) else d for d in v.shape)
            if want != tuple(shape):
                sizes = ", ".join(f"{k.name}={n}" for k, n in env.items())
                raise ValueError(f"input '{v.name}' has shape {tuple(shape)}, wants {_dims(v.shape)} = {want} with "
                                 f"{sizes}")  # fmt: skip
        if arrays is not None:
            self._bind_values(env, arrays)
        missing = [d.name for d in self.size_vars if d not in env]
        if missing:
            raise ValueError(f"size(s) {', '.join(missing)} are no input's dim: no input gives their value")
        return tuple(env[d] for d in self.size_vars)

    def _bind_values(self, env: dict[Var, int], arrays: list[np.ndarray]) -> None:
        """Binds the sizes read from input values (after those given by shapes, which a Reshape's 0 and -1 need)."""
        by_name = {self.values[i].name: a for i, a in zip(self.inputs, arrays)}
        computed: dict[int, np.ndarray] = {}  # an operand computed from inputs (a callable) is evaluated once

        def read(o: object) -> np.ndarray | None:
            """An operand's values: a graph input's by name, a constant's (a tuple), or computed from the inputs."""
            if o is None:
                return None
            if isinstance(o, str):
                if o not in by_name:
                    raise ValueError(f"size {d.name} is read from input '{o}', which the model does not take")
                return np.asarray(by_name[o]).reshape(-1)
            if callable(o):
                if id(o) not in computed:
                    computed[id(o)] = np.asarray(o(by_name, env)).reshape(-1)
                return computed[id(o)]
            return np.asarray(o).reshape(-1)

        def ready(d: Var) -> bool:  # the sizes its rule's dims (and a computed operand's shapes) mention are bound
            needs = [x for x in d.dims if isinstance(x, Expr)]
            needs += [n for o in (d.source, *getattr(d, "operands", ())) for n in getattr(o, "needs", ())]
            return all(n in env for x in needs for n in walk(x) if isinstance(n, Var))

        pending = [d for d in self.size_vars if getattr(d, "source", "") and d not in env]
        while pending:  # in order, each after the sizes it reads (a Slice of a Pad by values: the Pad's first)
            d = next((d for d in pending if ready(d)), pending[0])
            pending.remove(d)
            source = d.source
            flat = read(source)
            operands = [read(o) for o in getattr(d, "operands", ())]
            n = _value_size(d, flat, env, operands)
            lo, hi = getattr(d, "lo", 0), getattr(d, "hi", None)
            if n < lo or (hi is not None and n > hi):
                raise ValueError(f"{_what(source)} = {flat.tolist()} gives size {d.name} = {n}, outside its bounds "
                                 f"[{lo}, {'inf' if hi is None else hi}]")  # fmt: skip
            env[d] = n

    def at(self, sizes: tuple[int, ...], align: int = ALIGN) -> Plan:
        """This plan at one set of sizes: every shape and kernel FLOP count evaluated and the workspace planned for
        them (the run-time half of a symbolic plan; the executors make it once per new size and keep it)."""
        env = dict(zip(self.size_vars, sizes))
        out = copy.copy(self)
        out.__dict__.pop("_size_vars", None)
        out.values = [ValueInfo(v.name, tuple(int(eval_int(d, env)) if isinstance(d, Expr) else d for d in v.shape),
                                v.dtype, v.kind, v.offset, v.alias_of, v.view_offset)
                      for v in self.values]  # fmt: skip
        out.steps = [replace(s, kernels=[k.at_sizes(env) for k in s.kernels]) if s.kind == "segment" else s
                     for s in self.steps]  # fmt: skip
        out.info = {**self.info, "sizes": {d.name: n for d, n in env.items()}}
        assign_offsets(out, align)
        return out

    @property
    def threads(self) -> int | None:
        """The target's -threads (None: OpenMP's default, all cores, also for a target this version cannot parse)."""
        try:
            return Target.parse(self.target).threads if self.target else None
        except ValueError:
            return None

    def to_json(self) -> dict:
        def step(s: Step) -> dict:
            d = {"kind": s.kind}
            if s.kind == "segment":
                d |= {"function": s.function, "kernels": [_kernel_json(k) for k in s.kernels]}
            else:
                d |= {"op": s.op, "attrs": _json_attrs(s.attrs), "inputs": s.inputs, "outputs": s.outputs,
                      "node": s.node}  # fmt: skip
            return d

        return {
            "name": self.name, "values": [vars(v) | {"shape": [dim_to_json(x) for x in v.shape]} for v in self.values],
            "inputs": self.inputs, "outputs": self.outputs, "steps": [step(s) for s in self.steps],
            "workspace": self.workspace, "target": self.target, "info": self.info,
            **({"size_vars": [size_var_to_json(v) for v in self.size_vars]} if self.is_symbolic else {}),
        }  # fmt: skip

    @staticmethod
    def from_json(d: dict) -> Plan:
        """The plan `to_json` wrote; a symbolic plan's dims refer to its `size_vars` by name (SizeJSONError: a dim
        or size that is not one)."""
        sizes = size_vars_from_json(d.get("size_vars", []))

        def size(name: str) -> Var:
            if name not in sizes:
                raise SizeJSONError(f"size {name!r} is used but not declared among the plan's size variables")
            return sizes[name]

        values = [ValueInfo(**(v | {"shape": tuple(dim_from_json(x, size) for x in v["shape"])})) for v in d["values"]]
        steps = []
        for s in d["steps"]:
            if s["kind"] == "segment":
                kernels = [KernelInfo(**(k | {"flops_expr": dim_from_json(k["flops_expr"], size)}
                                         if "flops_expr" in k else k)) for k in s["kernels"]]  # fmt: skip
                steps.append(Step("segment", kernels, s["function"]))
            else:
                steps.append(Step("fallback", op=s["op"], attrs=_unjson_attrs(s["attrs"]), inputs=s["inputs"],
                                  outputs=s["outputs"], node=s["node"]))  # fmt: skip
        return Plan(d["name"], values, d["inputs"], d["outputs"], steps, d["workspace"], d["target"], d["info"])


def _kernel_json(k: KernelInfo) -> dict:
    d = {f: v for f, v in vars(k).items() if f != "flops_expr"}
    return d | ({"flops_expr": dim_to_json(k.flops_expr)} if k.flops_expr is not None else {})


def _json_attrs(attrs: dict) -> dict:
    out = {}
    for k, v in attrs.items():
        if hasattr(v, "nodes") and hasattr(v, "outputs"):  # a subgraph (control flow on the reference fallback)
            raise NotImplementedError(
                f"cannot save a model whose control-flow node (attribute {k!r}) runs on the reference fallback"
            )
        if isinstance(v, np.ndarray):
            out[k] = {"__ndarray__": v.tolist(), "dtype": v.dtype.name}
        elif isinstance(v, tuple):
            out[k] = {"__tuple__": [_json_attrs({"x": x})["x"] for x in v]}
        else:
            out[k] = v
    return out


def _unjson_attrs(attrs: dict) -> dict:
    out = {}
    for k, v in attrs.items():
        if isinstance(v, dict) and "__ndarray__" in v:
            out[k] = np.asarray(v["__ndarray__"], dtype=v["dtype"])
        elif isinstance(v, dict) and "__tuple__" in v:
            out[k] = tuple(_unjson_attrs({"x": x})["x"] for x in v["__tuple__"])
        else:
            out[k] = v
    return out


def _value_size(d: Var, flat: np.ndarray, env: dict[Var, int], operands: list[np.ndarray | None] = ()) -> int:
    """A `ValueSizeVar`'s value from its input's values (flattened) by its rule, its `dims` evaluated in `env`;
    a rule of several operands gets the list of their values (None for one left out; the source is one of them)."""
    if d.rule == "element" and d.index >= flat.size:
        raise ValueError(f"{_what(d.source)} has {flat.size} element(s); size {d.name} reads element {d.index}")
    dims = [int(eval_int(x, env)) if isinstance(x, Expr) else int(x) for x in d.dims]

    def read(a: np.ndarray | None) -> object:  # counts and Range read the values as they are, the rest as ints
        return a if a is None or d.rule in RAW_RULES else a.astype(np.int64).tolist()

    try:
        values = [read(a) for a in operands] if d.rule in OPERAND_RULES else read(flat)
        return int(VALUE_RULES[d.rule](values, d.index, dims))
    except (ValueError, IndexError, ZeroDivisionError, OverflowError) as e:
        shown = ", ".join(str(a.tolist()) for a in operands if a is not None) if operands else str(flat.tolist())
        raise ValueError(f"{_what(d.source)} = {shown}: {e}") from None


def _what(source: object) -> str:
    """A size's source in messages: a graph input by name, or an operand computed from inputs (it says which)."""
    return f"input '{source}'" if isinstance(source, str) else str(source)


def _reshape_target(v: list[int], dims: list[int], allowzero: bool) -> list[int]:
    out = [dims[j] if t == 0 and not allowzero and j < len(dims) else t for j, t in enumerate(v)]
    if out.count(-1) > 1 or any(t < -1 for t in out):
        raise ValueError("a Reshape target has one -1 at most and no other negative entry")
    total = int(np.prod(dims, dtype=np.int64))
    if -1 in out:
        known = int(np.prod([t for t in out if t != -1], dtype=np.int64))
        if known == 0 or total % known:
            raise ValueError(f"cannot reshape {dims} to it")
        out[out.index(-1)] = total // known
    if int(np.prod(out, dtype=np.int64)) != total:
        raise ValueError(f"cannot reshape {dims} to {out}")
    return out


def _axes(v: list[int], rank: int) -> list[int]:
    axes = [a + rank if a < 0 else a for a in v]
    if any(not 0 <= a < rank for a in axes) or len(set(axes)) != len(axes):
        raise ValueError(f"axes must be distinct, in [{-rank}, {rank - 1}]")
    return axes


def _axis_view(axis: int, dims: list[int]) -> tuple[int, int, int]:
    (a,) = _axes([axis], len(dims))
    return int(np.prod(dims[:a], dtype=np.int64)), dims[a], int(np.prod(dims[a + 1 :], dtype=np.int64))


def _squeeze(v: list[int], dims: list[int]) -> list[int]:
    axes = _axes(v, len(dims))
    if any(dims[a] != 1 for a in axes):
        raise ValueError(f"Squeeze removes only dims of 1, not those of {dims} at axes {axes}")
    return [n for k, n in enumerate(dims) if k not in axes]


def _unsqueeze(v: list[int], dims: list[int]) -> list[int]:
    axes, rest = _axes(v, len(dims) + len(v)), iter(dims)
    return [1 if k in axes else next(rest) for k in range(len(dims) + len(v))]


def _split(v: list[int], n: int) -> list[int]:
    if sum(v) != n or min(v) < 0:
        raise ValueError(f"split sizes must be >= 0 and add up to the axis length {n}")
    return v


def _slice_lengths(v: list, dims: list[int]) -> list[int]:
    """The length of every axis of a tensor of shape dims sliced by v = [starts, ends, axes, steps] (ONNX)."""
    starts, ends, axes, steps = v
    axes = _axes(axes, len(dims)) if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(axes)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ValueError("Slice starts, ends, axes and steps must have the same length")
    out = list(dims)
    for a, start, end, step in zip(axes, starts, ends, steps):
        if step == 0:
            raise ValueError("a Slice step cannot be 0")
        out[a] = len(range(*slice(start, end, step).indices(dims[a])))
    return out


def _pads(v: list, dims: list[int]) -> list[int]:
    """The padded dims of a tensor of shape dims by v = [pads, axes] (ONNX; negative pads crop)."""
    pads, axes = v
    axes = _axes(axes, len(dims)) if axes is not None else list(range(len(dims)))
    if len(pads) != 2 * len(axes):
        raise ValueError(f"Pad takes {2 * len(axes)} pads for {len(axes)} axes, got {len(pads)}")
    out = list(dims)
    for k, a in enumerate(axes):
        out[a] += pads[k] + pads[k + len(axes)]
    if min(out, default=0) < 0:
        raise ValueError(f"pads {pads} remove more than the dims {dims} hold")
    return out


def _dft_axis(axis: int, dims: list[int]) -> int:
    """A DFT's signal axis among `dims` (the input's dims but the trailing complex one; a negative axis counts it)."""
    a = axis + len(dims) + 1 if axis < 0 else axis
    if not 0 <= a < len(dims):
        raise ValueError(f"the DFT axis must be in [{-len(dims) - 1}, -2] or [0, {len(dims) - 1}], got {axis}")
    return a


def _dft_out(v: list[int], dims: list[int], length) -> list[int]:
    a = _dft_axis(v[0], dims)
    return [length(n) if k == a else n for k, n in enumerate(dims)]


def _range_length(v: list) -> int:
    start, limit, delta = (a.reshape(-1)[0].item() for a in v)
    if delta == 0:
        raise ValueError("Range's delta cannot be 0")
    return max(int(np.ceil((limit - start) / delta)), 0)


def _compress_count(v: np.ndarray, length: int) -> int:
    if v.size > length:
        raise ValueError(f"a Compress condition of {v.size} elements is longer than the axis ({length})")
    return int(np.count_nonzero(v))


RESIZE_POLICIES = ("stretch", "not_larger", "not_smaller")  # Resize's keep_aspect_ratio_policy, by its code


def _resize_sizes(v: list, dims: list[int]) -> list[int]:
    """The output dims of Resize for v = [scales, sizes, roi, axes, (policy code,)], one of scales and sizes None
    (ONNX: floor(dim * roi extent * scale), or the sizes, or for a policy keeping the aspect ratio
    floor(dim * r + 0.5) with r the least or greatest ratio of size to dim)."""
    scales, sizes, roi, axes, (policy,) = v
    rank, axes = len(dims), _axes([int(a) for a in axes], len(dims))
    given = scales if scales is not None else sizes
    if given is None or len(given) != len(axes):
        raise ValueError(f"Resize takes one scale or size per resized axis ({len(axes)})")
    out = list(dims)
    if scales is not None:
        full_roi = [0.0] * rank + [1.0] * rank
        for k, a in enumerate(axes):
            if roi is not None and len(roi) == 2 * len(axes):
                full_roi[a], full_roi[a + rank] = float(roi[k]), float(roi[k + len(axes)])
            if not scales[k] > 0:
                raise ValueError(f"Resize scales must be positive, got {scales[k]} for axis {a}")
            out[a] = int(np.floor(dims[a] * (full_roi[a + rank] - full_roi[a]) * float(scales[k]) + 1e-9))
        return out
    sizes = [int(x) for x in sizes]
    if min(sizes) < 0:
        raise ValueError(f"Resize sizes must be >= 0, got {sizes}")
    if RESIZE_POLICIES[int(policy)] == "stretch":
        for a, n in zip(axes, sizes):
            out[a] = n
        return out
    ratios = [n / dims[a] for a, n in zip(axes, sizes)]
    r = min(ratios) if RESIZE_POLICIES[int(policy)] == "not_larger" else max(ratios)
    for a in axes:
        out[a] = int(np.floor(dims[a] * r + 0.5))
    return out


# rules that read the values as they are
RAW_RULES = {"nonzero", "range", "compress", "resize", "unique", "unique_slices"}
OPERAND_RULES = {"slice", "pad", "range", "resize"}  # rules of several operands

# `ember.graph.dims.VALUE_RULES`: rule -> f(values, index, dims)
VALUE_RULES = {
    "element": lambda v, i, dims: v[i],
    "reshape": lambda v, i, dims: _reshape_target(v, dims, False)[i],
    "reshape_allowzero": lambda v, i, dims: _reshape_target(v, dims, True)[i],
    "reduce_out": lambda v, i, dims: 1 if i in _axes(v, len(dims)) else dims[i],
    "reduce_kept": lambda v, i, dims: [n for k, n in enumerate(dims) if k not in _axes(v, len(dims))][i],
    "axis_view": lambda v, i, dims: _axis_view(v[0], dims)[i],
    "nonzero": lambda v, i, dims: int(np.count_nonzero(v)),
    "split": lambda v, i, dims: _split(v, dims[0])[i],
    "squeeze": lambda v, i, dims: _squeeze(v, dims)[i],
    "unsqueeze": lambda v, i, dims: _unsqueeze(v, dims)[i],
    "slice": lambda v, i, dims: _slice_lengths(v, dims)[i],
    "pad": lambda v, i, dims: _pads(v, dims)[i],
    "range": lambda v, i, dims: _range_length(v),
    "compress": lambda v, i, dims: _compress_count(v, dims[0]),
    "resize": lambda v, i, dims: _resize_sizes(v, dims)[i],
    "unique": lambda v, i, dims: int(np.unique(v).size),
    "unique_slices": lambda v, i, dims: int(np.unique(np.asarray(v).reshape(dims), axis=1).shape[1]),
    "dft_view": lambda v, i, dims: _axis_view(_dft_axis(v[0], dims), dims)[i],
    "dft_rfft": lambda v, i, dims: _dft_out(v, dims, lambda n: n // 2 + 1)[i],
    "dft_irfft": lambda v, i, dims: _dft_out(v, dims, lambda n: 2 * (n - 1))[i],
}


def _dims(shape: tuple) -> str:
    return "[" + ", ".join(str(d).replace(" ", "") for d in shape) + "]"


class PlanError(ValueError):
    """A plan that does not hang together (a saved model edited or corrupted): the message lists what is wrong."""


def check_plan(plan: Plan, weights: dict[int, np.ndarray]) -> None:
    """Refuse a plan whose parts contradict each other before any native code sees it: value ids out of range,
    unknown kinds or dtypes, temporaries outside the workspace, views of another size than their source, a kernel
    argument of another size than the kernel was compiled for, weights missing or of another shape or dtype. A
    symbolic plan is checked at its sizes' lower bounds (at least 1 where allowed), its kernels' size indices
    against its size variables; a view of a symbolic shape is the size of its source at the sizes of a call
    (Plan.bind relates sizes read from values), not necessarily at those bounds."""
    symbolic = {i for i, v in enumerate(plan.values) if not v.is_static}
    if plan.is_symbolic:
        n = len(plan.size_vars)
        bad = [k.name for s in plan.steps for k in s.kernels if not all(isinstance(i, int) and 0 <= i < n
                                                                           for i in k.sizes)]  # fmt: skip
        if bad:
            raise PlanError(f"plan of model {plan.name!r} is inconsistent:\n  kernel(s) {', '.join(bad)}: size "
                            f"indices outside the {n} size variables")  # fmt: skip
        low = tuple(max(getattr(v, "lo", 0), min(1, getattr(v, "hi", None) or 1)) for v in plan.size_vars)
        try:
            plan = plan.at(low)
        except (TypeError, ValueError, ZeroDivisionError) as e:
            raise PlanError(f"plan of model {plan.name!r}: its shapes cannot be evaluated at sizes {low}: "
                            f"{e}") from None  # fmt: skip
    problems: list[str] = []
    n = len(plan.values)

    def valid(i: object) -> bool:
        return isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n

    nbytes: dict[int, int] = {}
    for i, v in enumerate(plan.values):
        try:
            if v.kind not in ("input", "weight", "temp", "output", "alias"):
                raise ValueError(f"unknown kind {v.kind!r}")
            if not all(isinstance(d, int) and d >= 0 for d in v.shape):
                raise ValueError(f"shape {v.shape}")
            nbytes[i] = v.nbytes
        except (ValueError, TypeError) as e:
            problems.append(f"value {i} ({v.name!r}): {e}")
    for i, v in enumerate(plan.values):
        if i not in nbytes:
            continue
        if v.kind == "temp" and not (v.offset >= 0 and v.offset + nbytes[i] <= plan.workspace):
            problems.append(f"value {i} ({v.name!r}): bytes {v.offset}..{v.offset + nbytes[i]} outside the workspace "
                            f"of {plan.workspace}")  # fmt: skip
        if v.kind == "alias" and not (valid(v.alias_of) and plan.values[v.alias_of].kind != "alias"
                                      and isinstance(v.view_offset, int) and v.view_offset >= 0
                                      and (bool({i, v.alias_of} & symbolic)
                                           or v.view_offset + nbytes[i] <= nbytes.get(v.alias_of, -1))):  # fmt: skip
            problems.append(f"value {i} ({v.name!r}): a view of value {v.alias_of} at byte {v.view_offset} that "
                            "does not fit in it, or no source")  # fmt: skip
        if v.kind == "weight":
            w = weights.get(i)
            if w is None:
                problems.append(f"value {i} ({v.name!r}): weight missing")
            elif w.dtype != numpy_dtype(v.dtype) or tuple(w.shape) != tuple(v.shape):
                problems.append(f"value {i} ({v.name!r}): weight is {w.dtype}{list(w.shape)}, the plan says "
                                f"{v.dtype}{list(v.shape)}")  # fmt: skip
    problems += [f"weight {i}: no weight value of that id" for i in weights
                 if not (valid(i) and plan.values[i].kind == "weight")]  # fmt: skip
    problems += [f"graph input/output id {i} out of range" for i in plan.inputs + plan.outputs if not valid(i)]
    for s in plan.steps:
        for k in s.kernels:
            if not all(valid(a) for a in k.args):
                problems.append(f"kernel {k.name}: argument ids out of range")
            elif k.arg_bytes and [nbytes.get(a) for a in k.args] != list(k.arg_bytes):
                problems.append(f"kernel {k.name}: arguments of {[nbytes.get(a) for a in k.args]} bytes, compiled "
                                f"for {list(k.arg_bytes)}")  # fmt: skip
        if s.kind == "fallback" and not all(i is None or valid(i) for i in s.inputs + s.outputs):
            problems.append(f"fallback step {s.node}: value ids out of range")
    if plan.workspace < 0:
        problems.append(f"workspace of {plan.workspace} bytes")
    if problems:
        raise PlanError(f"plan of model {plan.name!r} is inconsistent:\n  " + "\n  ".join(problems[:20]))


# -- memory --------------------------------------------------------------------------------------------
def alias_view(src: np.ndarray | None, v: ValueInfo) -> np.ndarray | None:
    """An alias's numpy view of its source's array: the same bytes (from `view_offset` on) as v's shape and dtype."""
    if src is None:
        return None
    dt = numpy_dtype(v.dtype)
    if v.view_offset == 0 and src.nbytes == v.nbytes:
        return src.view(dt).reshape(v.shape)
    raw = src.reshape(-1).view(np.uint8)
    return raw[v.view_offset : v.view_offset + v.nbytes].view(dt).reshape(v.shape)


def live_ranges(plan: Plan) -> tuple[dict[int, int], dict[int, int]]:
    """First and last use of each storage (aliases count as their source), in events: one per kernel call or
    fallback step, in run order; the graph outputs live past the last event."""
    values = plan.values

    def root(i: int) -> int:
        return values[i].alias_of if values[i].kind == "alias" else i

    events: list[list[int]] = []  # the buffers each kernel call / fallback step touches, in order
    for s in plan.steps:
        if s.kind == "segment":
            events += [k.args for k in s.kernels]
        else:
            events.append([i for i in s.inputs if i is not None] + s.outputs)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for t, args in enumerate(events):
        for i in args:
            first.setdefault(root(i), t)
            last[root(i)] = t
    for i in plan.outputs:
        last[root(i)] = len(events)
    return first, last


def plan_offsets(plan: Plan, align: int = ALIGN) -> tuple[dict[int, int], int]:
    """Workspace offsets of the plan's temporaries, each aligned to `align` bytes, reusing memory by liveness
    (first fit, in order of first use); returns the offsets by value id and the workspace size."""
    values = plan.values
    first, last = live_ranges(plan)
    live: list[tuple[int, int, int]] = []  # (offset, size, last event)
    offsets: dict[int, int] = {}
    total = 0
    for i in sorted((i for i, v in enumerate(values) if v.kind == "temp"), key=lambda i: (first.get(i, 0), i)):
        t = first.get(i, 0)
        live = [b for b in live if b[2] >= t]
        need = -(-max(values[i].nbytes, 1) // align) * align
        offset = 0
        for off, size, _ in sorted(live):
            if off - offset >= need:
                break
            offset = max(offset, off + size)
        offsets[i] = offset
        live.append((offset, need, last.get(i, t)))
        total = max(total, offset + need)
    return offsets, total


def assign_offsets(plan: Plan, align: int = ALIGN) -> None:
    """Write `plan_offsets` into the plan: each temporary's `offset` and the `workspace` size."""
    offsets, plan.workspace = plan_offsets(plan, align)
    for i, off in offsets.items():
        plan.values[i].offset = off
