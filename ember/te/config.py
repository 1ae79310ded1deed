"""Config spaces: the knobs a schedule template reads, and one point of such a space.

A template (a compute + schedule in `ember.templates.nn`) asks a config object for each of its
choices, giving the choices and the value it would pick on its own (the fallback, derived from
shapes and target):

    mr = cfg.define_split("tile_m", M, 2, policy="candidate", candidates=[...], default=(-1, 6))[-1]
    order = cfg.define_knob("order", ["ij", "ji"], default="ij")

The same template code serves three config objects:

- `ConfigSpace`: records every knob (space extraction) and answers with the defaults, so a
  template run with an empty space is the untuned (fallback) kernel;
- `ConfigEntity`: one point (an index and a value per knob): answers with its values, checked
  against the choices the template declares for this workload;
- None, which templates turn into a fresh `ConfigSpace` (the fallback).

Knob values are plain hashable data: a split is a tuple of factors with -1 for the outer part,
a reorder a permutation tuple, an annotation a tuple of "none"/"unroll"/"vec" per axis, and a free
knob any JSON scalar. A config reaches an operator's compute explicitly, through the reserved
attribute `attrs[CONFIG_ATTR]` of the fused group's anchor node (see `ember.kernels.kernel_te`).

`load_best(path, target)` reads a tuning log (JSON lines written by `ember.tune`) and gives the
best config per workload (`read_records` skips, with a warning naming the lines, any line that is not
a record: invalid UTF-8 or JSON, or fields of the wrong types); `load_tuned` gives each with the
schedule it produced when it was measured (a record's "schedule": `Schedule.record()`, the stages
and the steps), which `ember.compile(..., tuning_log=path)` replays on a kernel of the same compute.
Records from before logs stored schedules (version 1) carry none: their config goes through the
template again.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONFIG_ATTR = "__config__"  # reserved attrs key: the tuning config given to an anchor op's compute

ANNOTATIONS = ("none", "unroll", "vec")


class ConfigError(ValueError):
    """A config that does not fit the template's space (unknown value, wrong workload)."""


@dataclass(frozen=True)
class Knob:
    """One named choice: its kind ("split", "reorder", "annotate", "knob") and ordered choices."""

    name: str
    kind: str
    choices: tuple
    default: Any

    def __post_init__(self):
        if not self.choices:
            raise ConfigError(f"knob {self.name!r} has no choices")
        if self.default not in self.choices:
            raise ConfigError(f"knob {self.name!r}: default {self.default!r} is not one of its choices")

    def __len__(self) -> int:
        return len(self.choices)

    def index(self, value: Any) -> int:
        try:
            return self.choices.index(value)
        except ValueError:
            raise ConfigError(f"knob {self.name!r}: {value!r} is not one of {list(self.choices)[:8]}...") from None


def _split_choices(extent: int, num_outputs: int, policy: str, candidates, max_factor: int | None) -> tuple:
    """Tuples (-1, f1, ..., f_{n-1}) of inner factors for a split of `extent` into num_outputs loops."""
    if policy == "candidate":
        if not candidates:
            raise ConfigError("define_split(policy='candidate') needs candidates")
        return tuple(tuple(int(x) for x in c) for c in candidates)
    cap = min(extent, max_factor or extent)
    if policy == "factors":
        per = [d for d in range(1, cap + 1) if extent % d == 0]
    elif policy == "power2":
        per = [1 << i for i in range(cap.bit_length()) if 1 << i <= cap]
    elif policy == "verbose":
        per = sorted({d for d in range(1, cap + 1) if extent % d == 0} | {1 << i for i in range(cap.bit_length())})
        per = [d for d in per if d <= cap]
    else:
        raise ConfigError(f"unknown split policy {policy!r} (factors, power2, verbose, candidate)")
    out = []
    for fs in itertools.product(per, repeat=num_outputs - 1):
        p = math.prod(fs)
        if p <= extent and (policy != "factors" or extent % p == 0):
            out.append((-1, *fs))
    return tuple(out)


class ConfigBase:
    """The `define_*` vocabulary shared by spaces and entities; subclasses say what a knob answers."""

    template: str = ""

    def _define(self, knob: Knob) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def define_split(self, name: str, extent: int, num_outputs: int = 2, policy: str = "factors",
                     candidates: Sequence[Sequence[int]] | None = None, max_factor: int | None = None,
                     filter: Callable[[tuple], bool] | None = None,
                     default: Sequence[int] | None = None) -> tuple:  # fmt: skip
        """Split a loop of `extent` into num_outputs loops: the inner factors (the outer is -1)."""
        choices = _split_choices(int(extent), num_outputs, policy, candidates, max_factor)
        if filter is not None:
            choices = tuple(c for c in choices if filter(c))
        dflt = tuple(default) if default is not None else choices[0]
        return self._define(Knob(name, "split", choices, dflt))

    def define_reorder(self, name: str, num_axes: int, policy: str = "all",
                       candidates: Sequence[Sequence[int]] | None = None,
                       default: Sequence[int] | None = None) -> tuple:  # fmt: skip
        """An order of num_axes loops: a permutation (all of them, or the candidates)."""
        if policy == "all":
            choices = tuple(itertools.permutations(range(num_axes)))
        elif policy == "candidate" and candidates:
            choices = tuple(tuple(int(i) for i in c) for c in candidates)
        else:
            raise ConfigError(f"define_reorder {name!r}: policy 'all', or 'candidate' with candidates")
        dflt = tuple(default) if default is not None else choices[0]
        return self._define(Knob(name, "reorder", choices, dflt))

    def define_annotate(self, name: str, num_axes: int, policy: str = "try_unroll",
                        candidates: Sequence[Sequence[str]] | None = None,
                        default: Sequence[str] | None = None) -> tuple:  # fmt: skip
        """An annotation ("none", "unroll", "vec") per loop: policy try_unroll, try_unroll_vec or candidate."""
        if policy == "try_unroll":
            choices = tuple(itertools.product(("none", "unroll"), repeat=num_axes))
        elif policy == "try_unroll_vec":
            inner = tuple(itertools.product(("none", "unroll"), repeat=num_axes - 1))
            choices = tuple((*c, last) for c in inner for last in ANNOTATIONS)
        elif policy == "candidate" and candidates:
            choices = tuple(tuple(str(a) for a in c) for c in candidates)
        else:
            raise ConfigError(f"define_annotate {name!r}: unknown policy {policy!r}")
        bad = {a for c in choices for a in c} - set(ANNOTATIONS)
        if bad:
            raise ConfigError(f"define_annotate {name!r}: unknown annotation(s) {sorted(bad)}")
        dflt = tuple(default) if default is not None else choices[0]
        return self._define(Knob(name, "annotate", choices, dflt))

    def define_knob(self, name: str, choices: Sequence[Any], default: Any = None) -> Any:
        """A free choice among JSON scalars (strings, numbers, booleans)."""
        choices = tuple(choices)
        return self._define(Knob(name, "knob", choices, choices[0] if default is None else default))


class ConfigSpace(ConfigBase):
    """Every knob a template declared, in declaration order; points are numbered in mixed radix
    (the first knob varies fastest). Used as a config, it answers with the knobs' defaults."""

    def __init__(self, template: str = ""):
        self.template = template
        self.knobs: dict[str, Knob] = {}

    def _define(self, knob: Knob) -> Any:
        old = self.knobs.get(knob.name)
        if old is not None and old.choices != knob.choices:
            raise ConfigError(f"knob {knob.name!r} defined twice with different choices")
        self.knobs[knob.name] = knob
        return knob.default

    def __getitem__(self, name: str) -> Any:
        return self.knobs[name].default

    def __len__(self) -> int:
        return math.prod(len(k) for k in self.knobs.values())

    def __iter__(self) -> Iterator[ConfigEntity]:
        return (self.get(i) for i in range(len(self)))

    def __repr__(self) -> str:
        knobs = ", ".join(f"{k.name}:{len(k)}" for k in self.knobs.values())
        return f"ConfigSpace({self.template or '?'}, {len(self)} points: {knobs})"

    # -- points -----------------------------------------------------------------------------
    def digits(self, index: int) -> list[int]:
        if not 0 <= index < len(self):
            raise ConfigError(f"config index {index} is out of range for a space of {len(self)} points")
        out = []
        for k in self.knobs.values():
            index, d = divmod(index, len(k))
            out.append(d)
        return out

    def index_of(self, digits: Sequence[int]) -> int:
        index, radix = 0, 1
        for d, k in zip(digits, self.knobs.values()):
            index += d * radix
            radix *= len(k)
        return index

    def get(self, index: int) -> ConfigEntity:
        values = {k.name: k.choices[d] for k, d in zip(self.knobs.values(), self.digits(index))}
        return ConfigEntity(index, values, self.template)

    def entity(self, values: dict[str, Any]) -> ConfigEntity:
        """The point with these knob values (JSON lists accepted for tuples); missing knobs take defaults."""
        unknown = set(values) - set(self.knobs)
        if unknown:
            raise ConfigError(f"config names knobs {sorted(unknown)} that the {self.template} template does not have")
        digits = [k.index(_tupled(values.get(k.name, k.default))) for k in self.knobs.values()]
        return self.get(self.index_of(digits))

    def fallback(self) -> ConfigEntity:
        """The template's own choice for this workload and target (every knob at its default)."""
        return self.entity({})

    def sample(self, rng: random.Random, n: int, exclude: set[int] | None = None) -> list[ConfigEntity]:
        """Up to n distinct random points not in exclude."""
        exclude = exclude or set()
        total = len(self)
        left = total - len(exclude)
        if left <= 0:
            return []
        n = min(n, left)
        if left <= 4 * n:  # dense: draw from the remaining indices
            rest = [i for i in range(total) if i not in exclude]
            return [self.get(i) for i in rng.sample(rest, n)]
        seen: set[int] = set()
        while len(seen) < n:
            i = rng.randrange(total)
            if i not in exclude:
                seen.add(i)
        return [self.get(i) for i in seen]

    def neighbours(self, cfg: ConfigEntity, adjacent: bool = True) -> list[ConfigEntity]:
        """Points that differ from cfg in one knob: by one step of its ordered choices (adjacent),
        or by any other choice."""
        digits = self.digits(cfg.index)
        out = []
        for pos, k in enumerate(self.knobs.values()):
            steps = (-1, 1) if adjacent else range(-digits[pos], len(k) - digits[pos])
            for s in steps:
                d = digits[pos] + s
                if s != 0 and 0 <= d < len(k):
                    out.append(self.get(self.index_of(digits[:pos] + [d] + digits[pos + 1 :])))
        return out

    def random_neighbour(self, cfg: ConfigEntity, rng: random.Random) -> ConfigEntity:
        """cfg with one knob (that has a choice) set to another random value."""
        digits = self.digits(cfg.index)
        knobs = [(p, k) for p, k in enumerate(self.knobs.values()) if len(k) > 1]
        if not knobs:
            return cfg
        pos, k = rng.choice(knobs)
        d = rng.randrange(len(k) - 1)
        digits[pos] = d if d < digits[pos] else d + 1
        return self.get(self.index_of(digits))

    def to_json(self) -> dict:
        return {"template": self.template, "knobs": [
            {"name": k.name, "kind": k.kind, "choices": _jsonable(k.choices), "default": _jsonable(k.default)}
            for k in self.knobs.values()]}  # fmt: skip

    @staticmethod
    def from_json(d: dict) -> ConfigSpace:
        space = ConfigSpace(d.get("template", ""))
        for k in d["knobs"]:
            space._define(Knob(k["name"], k["kind"], _tupled(k["choices"]), _tupled(k["default"])))
        return space


@dataclass
class ConfigEntity(ConfigBase):
    """One point of a space: its index (-1 when unknown) and a value per knob. As a config, it
    answers each `define_*` with its value, after checking the value is one of the choices."""

    index: int
    values: dict[str, Any]
    template: str = ""
    strict: bool = field(default=True, repr=False)

    def _define(self, knob: Knob) -> Any:
        if knob.name not in self.values:
            if self.strict and self.values:
                raise ConfigError(f"config has no value for knob {knob.name!r} of the {self.template} template")
            return knob.default
        value = _tupled(self.values[knob.name])
        knob.index(value)
        return value

    def __getitem__(self, name: str) -> Any:
        return _tupled(self.values[name])

    def key(self) -> str:
        """A canonical string of the knob values (identifies the point across runs)."""
        return json.dumps(_jsonable(self.values), sort_keys=True, separators=(",", ":"))

    def to_json(self) -> dict:
        return {"index": self.index, "knobs": _jsonable(self.values)}

    @staticmethod
    def from_json(d: dict, template: str = "") -> ConfigEntity:
        return ConfigEntity(int(d.get("index", -1)), {k: _tupled(v) for k, v in d["knobs"].items()}, template)

    def __str__(self) -> str:
        body = ", ".join(f"{k}={_short(v)}" for k, v in self.values.items())
        return f"[{self.index}] {body}"


def _short(v: Any) -> str:
    return "x".join(map(str, v)) if isinstance(v, tuple) else str(v)


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    return x


def _tupled(x: Any) -> Any:
    return tuple(_tupled(v) for v in x) if isinstance(x, list | tuple) else x


def as_config(cfg: ConfigBase | None) -> ConfigBase:
    """A template's config: the one given, or a fresh space (every knob at its fallback value)."""
    return ConfigSpace() if cfg is None else cfg


# ------------------------------------------------------------------------------------------------
# reading the best records of a tuning log (the writer lives in ember.tune.log)
# ------------------------------------------------------------------------------------------------
def read_records(path: str | Path) -> Iterator[dict]:
    """The records of a JSON-lines tuning log. A line that is not a record (invalid UTF-8 or JSON, or fields of
    the wrong types: see `record_problem`) is skipped, with one warning per file naming the file and the lines;
    a torn last line without its newline (a writer killed mid-write, or still writing) is skipped silently.
    Records of version 1 (no "schedule") are records."""
    p = Path(path)
    if not p.exists():
        return
    bad: list[tuple[int, str]] = []
    with p.open("rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8").strip()
                if not line:
                    continue
                rec = json.loads(line)
            except (ValueError, RecursionError) as e:  # UnicodeDecodeError, JSONDecodeError, nesting too deep
                if raw.endswith(b"\n"):
                    bad.append((n, "invalid UTF-8" if isinstance(e, UnicodeDecodeError) else "invalid JSON"))
                continue
            why = record_problem(rec)
            if why:
                bad.append((n, why))
                continue
            yield rec
    if bad:
        lines = ", ".join(f"{n} ({why})" for n, why in bad[:10])
        lines += f" and {len(bad) - 10} more" if len(bad) > 10 else ""
        warnings.warn(f"tuning log {p}: skipped {len(bad)} unreadable line(s): {lines}", LogWarning, stacklevel=2)


class LogWarning(UserWarning):
    """Lines of a tuning log that were skipped (not records)."""


_NUMBER = (int, float)


def _is_number(x: Any) -> bool:
    return isinstance(x, _NUMBER) and not isinstance(x, bool) and math.isfinite(x)


def _is_knob_value(x: Any) -> bool:
    if isinstance(x, list):
        return all(_is_knob_value(v) for v in x)
    return x is None or isinstance(x, str | int | float | bool)


def record_problem(rec: Any) -> str:
    """Why a decoded log line is not a measurement record ("" when it is): the fields a reader uses must have
    their types (workload a string, config an object with an object of knobs, cost a number or null, ...)."""
    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__}, not an object"
    if not isinstance(rec.get("workload"), str):
        return "workload is not a string"
    cfg = rec.get("config")
    if not isinstance(cfg, dict) or not isinstance(cfg.get("knobs"), dict):
        return "config is not an object with knobs"
    if not all(isinstance(k, str) and _is_knob_value(v) for k, v in cfg["knobs"].items()):
        return "config has a knob value that is not a JSON scalar or list"
    if "index" in cfg and (not isinstance(cfg["index"], int) or isinstance(cfg["index"], bool)):
        return "config index is not an integer"
    for key in ("target", "template", "task"):
        if key in rec and not isinstance(rec[key], str):
            return f"{key} is not a string"
    if rec.get("cost") is not None and not _is_number(rec["cost"]):
        return "cost is not a number or null"
    costs = rec.get("costs")
    if costs is not None and not (isinstance(costs, list) and all(_is_number(c) for c in costs)):
        return "costs is not a list of numbers"
    for key in ("build_s", "timestamp", "gflops"):
        if rec.get(key) is not None and not _is_number(rec[key]):
            return f"{key} is not a number"
    err = rec.get("error")
    if err is not None and not (isinstance(err, dict) and isinstance(err.get("kind", ""), str)
                                and isinstance(err.get("detail", ""), str)):  # fmt: skip
        return "error is not null or an object with a kind"
    if rec.get("schedule") is not None and not isinstance(rec["schedule"], dict):
        return "schedule is not an object or null"
    return ""


def target_kind(target: str) -> str:
    return str(target).split()[0] if str(target).strip() else ""


@dataclass(frozen=True)
class Tuned:
    """The best record of a workload: its config, and the schedule the config produced when it was measured
    (`Schedule.record()`: stages and steps); None where the record has none (logs from before version 2)."""

    config: ConfigEntity
    schedule: dict | None = None


def load_tuned(path: str | Path, target: str) -> dict[str, Tuned]:
    """Best (lowest cost) record per workload among the log's successful records for `target`:
    records of exactly this target win over records of the same target kind ("c", "llvm"), and records marked
    "confirmed" (a best and the default measured again in turns: `ember.autoschedule.scheduler.confirm`) over
    single measurements."""
    best: dict[str, tuple[tuple[int, int, float], dict]] = {}
    for rec in read_records(path):
        cost = rec.get("cost")
        if rec.get("error") or cost is None:
            continue
        rt = str(rec.get("target", ""))
        if rt == str(target):
            rank = 0
        elif target_kind(rt) == target_kind(str(target)):
            rank = 1
        else:
            continue
        score = (rank, 0 if rec.get("confirmed") is True else 1, float(cost))
        w = rec["workload"]
        if w not in best or score < best[w][0]:
            best[w] = (score, rec)
    out = {}
    for w, (_, rec) in best.items():
        sch = rec.get("schedule")
        sch = sch if isinstance(sch, dict) and isinstance(sch.get("steps"), list) else None
        out[w] = Tuned(ConfigEntity.from_json(rec["config"], rec.get("template", "")), sch)
    return out


ALGORITHM = "algorithm"  # the template of a measured implementation choice's records
ALGORITHM_PREFIX = "algo:"  # ... and the prefix of their workloads (then the convolution's key)


def algorithms(tuned: dict[str, Tuned]) -> dict[str, str]:
    """The implementation chosen per convolution in `load_tuned`'s records (the fastest measured): key -> algorithm,
    for `ember.passes.layout.algorithm_choices`."""
    return {w[len(ALGORITHM_PREFIX):]: str(t.config.values.get(ALGORITHM)) for w, t in tuned.items()
            if w.startswith(ALGORITHM_PREFIX) and t.config.template == ALGORITHM}  # fmt: skip


def load_best(path: str | Path, target: str) -> dict[str, ConfigEntity]:
    """The config of `load_tuned`'s best record per workload."""
    return {w: t.config for w, t in load_tuned(path, target).items()}
