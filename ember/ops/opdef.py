"""`OpDef`: everything Ember knows about one operator, in one place.

An operator entry holds its attributes (with defaults and checks), its shape rule
(`infer`), its numpy reference, its fusion pattern, and the slots the lowering layer
fills (`compute`, `schedule`). Entries are made with the `@op` decorator on the numpy
reference, or with a table of rows; both end in `register`, and `OPS` maps names to
entries. Ember's operators follow ONNX semantics, with attributes normalized by the
frontend (explicit pads, axes as attributes, ...).

Conventions:
  infer(attrs, *types) -> tuple[TensorType, ...]   (None for an absent optional input)
  reference(attrs, *arrays) -> tuple[np.ndarray, ...]
  compute(attrs, *tensors): attrs may hold the reserved key "__config__" (`ember.te.config.CONFIG_ATTR`),
    a tuning config for the op's template; computes without tunable templates ignore it
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ember.graph.dims import simplify_dim
from ember.graph.types import DTYPES, TensorType


class Pattern(enum.Enum):
    """How an operator fuses (the TVM pattern kinds)."""

    ELEMWISE = "elemwise"  # out[i] = f(in[i]), same shape
    BROADCAST = "broadcast"  # elementwise with numpy broadcasting
    INJECTIVE = "injective"  # each output element reads one input element (reshape, slice, ...)
    REDUCTION = "reduction"
    OUT_ELEMWISE_FUSABLE = "out_elemwise_fusable"  # conv, matmul: elementwise ops fuse after it
    OPAQUE = "opaque"  # everything else; never fused


class ShapeDependsOnData(Exception):
    """Raised by `infer` when the output shape depends on input values, not only on types.

    The frontend turns it into an error that names the graph inputs to bind as constants."""


class AttrError(ValueError):
    """An attribute is missing, unknown, or has a bad value."""


REQUIRED = object()  # default of a mandatory attribute

# Attribute kinds: how a value is coerced before `check` runs.
_COERCE: dict[str, Callable[[Any], Any]] = {
    "int": int,
    "float": float,
    "str": str,
    "ints": lambda v: tuple(int(x) for x in v),
    "dims": lambda v: tuple(simplify_dim(x) for x in v),  # ints or symbolic sizes (ember.graph.dims)
    "dim": simplify_dim,  # an int or a symbolic size
    "floats": lambda v: tuple(float(x) for x in v),
    "strs": lambda v: tuple(str(x) for x in v),
    "dtype": lambda v: _check_dtype(str(v)),
    "tensor": np.asarray,
    "graph": lambda v: v,
    "any": lambda v: v,
}


def _check_dtype(name: str) -> str:
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}")
    return name


@dataclass(frozen=True)
class Attr:
    """One attribute: name, kind (a key of _COERCE), default (REQUIRED if none), check."""

    name: str
    kind: str = "int"
    default: Any = REQUIRED
    check: Callable[[Any], bool] | None = None
    expect: str = ""  # what `check` wants, for the error message ("one of 'constant', 'edge'")

    def __post_init__(self):
        if self.kind not in _COERCE:
            raise ValueError(f"attribute {self.name}: unknown kind {self.kind!r}")


def one_of(*choices: Any) -> dict[str, Any]:
    """`Attr(..., **one_of("a", "b"))`: check membership, with the message."""
    return {"check": lambda v: v in choices, "expect": "one of " + ", ".join(map(repr, choices))}


InferFn = Callable[..., tuple[TensorType, ...]]
RefFn = Callable[..., tuple[np.ndarray, ...]]


@dataclass(frozen=True)
class OpDef:
    name: str
    pattern: Pattern
    attrs: tuple[Attr, ...]
    infer: InferFn
    reference: RefFn
    compute: Callable | None = None  # TE compute, filled by the lowering layer
    schedule: Callable | None = None  # default schedule, filled by the lowering layer
    inputs: tuple[int, int | None] = (1, 1)  # (min, max) number of inputs; max None = variadic
    foldable: bool = True  # may the frontend evaluate it when all inputs are constant
    reads_data: bool = True  # False: outputs depend on input types only (Shape, Size, EyeLike)
    doc: str = ""
    attr_index: dict[str, Attr] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "attr_index", {a.name: a for a in self.attrs})
        # rules may return one value or a tuple; entries always return tuples
        infer, reference = self.infer, self.reference
        object.__setattr__(self, "infer", lambda a, *ts: _as_tuple(infer(a, *ts)))
        object.__setattr__(self, "reference", lambda a, *xs: _as_tuple(reference(a, *xs)))

    def check_attrs(self, attrs: dict[str, Any], where: str = "") -> dict[str, Any]:
        """Attributes with defaults filled in, coerced and checked, in declaration order."""
        where = where or self.name
        unknown = sorted(set(attrs) - set(self.attr_index))
        if unknown:
            known = ", ".join(self.attr_index) or "none"
            raise AttrError(f"{where}: unknown attribute(s) {', '.join(unknown)} for {self.name} (known: {known})")
        out = {}
        for a in self.attrs:
            if a.name not in attrs:
                if a.default is REQUIRED:
                    raise AttrError(f"{where}: {self.name} needs attribute {a.name!r} ({a.kind})")
                out[a.name] = a.default
                continue
            if attrs[a.name] is None and a.default is None:
                out[a.name] = None
                continue
            try:
                value = _COERCE[a.kind](attrs[a.name])
            except (TypeError, ValueError) as e:
                raise AttrError(f"{where}: attribute {a.name}={attrs[a.name]!r} is not a valid {a.kind}: {e}") from e
            if a.check is not None and not a.check(value):
                raise AttrError(
                    f"{where}: attribute {a.name}={value!r} is invalid; expected {a.expect or 'a valid value'}"
                )
            out[a.name] = value
        return out

    def check_arity(self, n: int, where: str = "") -> None:
        lo, hi = self.inputs
        if n < lo or (hi is not None and n > hi):
            want = f"{lo}" if lo == hi else f"{lo} to {hi if hi is not None else 'any number of'}"
            raise AttrError(f"{where or self.name}: {self.name} takes {want} inputs, got {n}")


OPS: dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    if opdef.name in OPS:
        raise ValueError(f"operator {opdef.name} is defined twice")
    OPS[opdef.name] = opdef
    return opdef


def attach(name: str, compute: Callable | None = None, schedule: Callable | None = None) -> OpDef:
    """Fill an entry's lowering slots (TE compute, default schedule); returns the new entry."""
    opdef = get_op(name)
    changes = {k: v for k, v in (("compute", compute), ("schedule", schedule)) if v is not None}
    OPS[name] = dataclasses.replace(opdef, **changes)
    return OPS[name]


def get_op(name: str) -> OpDef:
    """The entry for an operator name; a KeyError suggests close names."""
    try:
        return OPS[name]
    except KeyError:
        close = difflib.get_close_matches(name, OPS, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"Ember has no operator {name!r}{hint}") from None


def _as_tuple(result: Any) -> tuple:
    return tuple(result) if isinstance(result, tuple | list) else (result,)


def op(
    name: str,
    pattern: Pattern,
    infer: Callable,
    attrs: Sequence[Attr] = (),
    inputs: tuple[int, int | None] = (1, 1),
    foldable: bool = True,
    reads_data: bool = True,
    compute: Callable | None = None,
    schedule: Callable | None = None,
) -> Callable[[Callable], Callable]:
    """Decorator on a numpy reference `fn(attrs, *arrays)`: registers the operator.

    `infer` and the reference may return one value or a tuple; entries always return tuples."""

    def wrap(fn: Callable) -> Callable:
        doc = (fn.__doc__ or "").strip()
        register(OpDef(name, pattern, tuple(attrs), infer, fn, compute, schedule, inputs=inputs, foldable=foldable,
                       reads_data=reads_data, doc=doc))  # fmt: skip
        return fn

    return wrap
