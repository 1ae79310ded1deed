"""Size variables: loop IR variables standing for a size known at run time, and their JSON form.

`SizeVar` is a `Var` with inclusive bounds; `ValueSizeVar` is one whose value the run time reads from an int
input's values (a shape operand fed as an input) by a named rule. The graph layer makes them
(`ember.graph.dims.size_var`, `value_size_var`) and puts them in tensor types; kernels take them as arguments;
a run plan evaluates its shapes at the sizes of each call. They live here, in the lowest layer, so that a saved
plan can be read back without the graph: `dim_to_json` / `dim_from_json` write a dim (an int or an integer
expression of size variables) and `size_var_to_json` / `size_vars_from_json` the variables themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .dtype import dtype, int64
from .expr import BinOp, Cast, Const, Expr, Select, Var, binop


class DimError(ValueError):
    """A size variable's bounds or a dim's value is wrong (names the variable)."""


@dataclass(frozen=True, eq=False, repr=False)
class SizeVar(Var):
    """A named size known at run time: `lo <= value <= hi` (hi None: unbounded)."""

    lo: int = 0
    hi: int | None = None

    __hash__ = Var.__hash__

    def __repr__(self) -> str:
        return self.name

    @property
    def bounds(self) -> tuple[int, int | None]:
        return self.lo, self.hi

    def check(self, value: int, where: str = "") -> None:
        if value < self.lo or (self.hi is not None and value > self.hi):
            hi = "inf" if self.hi is None else self.hi
            raise DimError(f"{where}size {self.name} = {value} is outside its bounds [{self.lo}, {hi}]")


@dataclass(frozen=True, eq=False, repr=False)
class ValueSizeVar(SizeVar):
    """A size read at run time from the values of an int graph input (a shape operand fed as an input):
    `VALUE_RULES[rule]` of input `source`'s values, at `index`, against the dims `dims`. A rule of several
    operands reads `operands` instead (`source` is one of them): each the name of a graph input, a constant's
    values (a tuple) or None (an operand left out)."""

    source: object = ""  # the input's name, or a callable: the operand computed from the inputs' values by name
    index: int = 0
    rule: str = "element"
    dims: tuple = ()
    operands: tuple = ()

    __hash__ = Var.__hash__


class SizeJSONError(ValueError):
    """A dim that has no JSON form, or a JSON form that is not one (a saved plan edited by hand)."""


def dim_to_json(d: int | Expr) -> object:
    """A dim as JSON: an int as it is; a size variable as {"size": name}; an expression as {"op": ..., "args": [...]}
    (BinOp), {"cast": dtype, "value": ...} or {"select": [cond, t, f]}."""
    if isinstance(d, bool) or not isinstance(d, int | Expr):
        raise SizeJSONError(f"dim {d!r} is neither an int nor an integer expression")
    if isinstance(d, int):
        return d
    if isinstance(d, Var):
        return {"size": d.name}
    if isinstance(d, Const):
        return {"const": d.value, "dtype": str(d.dtype)}
    if isinstance(d, BinOp):
        return {"op": d.op, "args": [dim_to_json(d.a), dim_to_json(d.b)]}
    if isinstance(d, Cast):
        return {"cast": str(d.dtype), "value": dim_to_json(d.value)}
    if isinstance(d, Select):
        return {"select": [dim_to_json(d.cond), dim_to_json(d.t), dim_to_json(d.f)]}
    raise SizeJSONError(f"dim {d} holds a {type(d).__name__}, which a saved plan cannot hold")


def dim_from_json(j: object, size: Callable[[str], Var]) -> int | Expr:
    """The dim `dim_to_json` wrote; `size(name)` gives the size variable of a name."""
    if isinstance(j, int) and not isinstance(j, bool):
        return j
    if not isinstance(j, dict):
        raise SizeJSONError(f"dim {j!r} is not a dim's JSON form")
    if "size" in j:
        return size(j["size"])
    if "const" in j:
        return Const(j["const"], dtype(j["dtype"]))
    if "op" in j:
        a, b = (dim_from_json(x, size) for x in j["args"])
        return binop(j["op"], a, b)
    if "cast" in j:
        return Cast(dtype(j["cast"]), dim_from_json(j["value"], size))
    if "select" in j:
        c, t, f = (dim_from_json(x, size) for x in j["select"])
        return Select(c, t, f)
    raise SizeJSONError(f"dim {j!r} is not a dim's JSON form")


def size_var_to_json(v: Var) -> dict:
    """A size variable as JSON: name and bounds, and for one read from values its rule, index, source, dims and
    operands (graph inputs by name, constants' values as lists). An operand computed on the host from the inputs
    (a callable) has no JSON form: NotImplementedError naming the size."""
    out: dict = {"name": v.name, "lo": getattr(v, "lo", 0), "hi": getattr(v, "hi", None)}
    if not isinstance(v, ValueSizeVar):
        return out

    def operand(o: object) -> object:
        if o is None:
            return None
        if isinstance(o, str):
            return {"input": o}
        if isinstance(o, tuple | list):
            return {"values": [float(x) if isinstance(x, float) else int(x) for x in _flat(o)]}
        raise NotImplementedError(f"size {v.name} is read from {o}, an operand computed from the inputs on the "
                                  "host: a model with such a size cannot be saved or exported yet")  # fmt: skip

    return out | {"rule": v.rule, "index": v.index, "source": operand(v.source),
                  "dims": [dim_to_json(d) for d in v.dims], "operands": [operand(o) for o in v.operands]}  # fmt: skip


def _flat(values: Sequence) -> list:
    out = []
    for x in values:
        out += _flat(x) if isinstance(x, tuple | list) else [x]
    return out


def size_vars_from_json(items: Sequence[dict]) -> dict[str, SizeVar]:
    """The size variables `size_var_to_json` wrote, by name (one object per name; a size read from values may
    mention others in its dims, made first)."""
    by_name = {d["name"]: d for d in items}
    made: dict[str, SizeVar] = {}

    def make(name: str) -> SizeVar:
        if name in made:
            return made[name]
        if name not in by_name:
            raise SizeJSONError(f"size {name!r} is used but not declared among the plan's size variables")
        d = by_name[name]
        if "rule" not in d:
            made[name] = SizeVar(name, int64, int(d["lo"]), d["hi"])
            return made[name]

        def operand(o: object) -> object:
            if o is None:
                return None
            if "input" in o:
                return str(o["input"])
            return tuple(o["values"])

        made[name] = ValueSizeVar(name, int64, int(d["lo"]), d["hi"], operand(d["source"]), int(d["index"]),
                                  str(d["rule"]), tuple(dim_from_json(x, make) for x in d["dims"]),
                                  tuple(operand(o) for o in d["operands"]))  # fmt: skip
        return made[name]

    for name in by_name:
        make(name)
    return made
