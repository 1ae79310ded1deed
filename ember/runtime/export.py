"""Export a compiled model as standalone C: the model library (source, header, weights) and `ember_run`, a small
program that runs it on .npy files. No Python is needed to build or run either.

    ember.compile(model).export("out/")      # the library, ember_run.c, a Makefile, and out/ember_run built
    ember export model.onnx --target c -o out/           # the same from the command line
    out/ember_run --input x=x.npy --output-dir y/ --repeat 10   # y/<output>.npy, one JSON timing line on stdout
    ember.compile(model).export_c("out/")    # only the library: out/ember_model.c, ember_model.h, weights.bin
    cc -O3 -march=native -fopenmp app.c out/ember_model.c -lm

The header declares an opaque model handle:

    ember_model* ember_model_create(const char* weights_path);   /* NULL on failure */
    int ember_model_set_shapes(ember_model* m, const int64_t* const* dims);   /* 0, or 2: ember_model_error(m) */
    int ember_model_run(ember_model* m, const void* const* inputs, void* const* outputs);
    void ember_model_destroy(ember_model* m);

A model with symbolic sizes is exported with them as run-time values: `ember_model_set_shapes(m, dims)` reads the
sizes from the input shapes (checking every dim and each size's bounds), plans the workspace at them (first fit by
liveness, as `Plan.at`) and gives the outputs' dims (`ember_model_output_dims`, `_output_nbytes`); the segment
functions take the sizes after the value table. A static model has the same functions (they check the shapes).
Sizes read from input values (a Reshape target fed as an input) are not exported yet.

Inputs and outputs are contiguous arrays in graph order with the shapes and dtypes listed in the
header, as comments and as the tables `ember_model_inputs[]`/`ember_model_outputs[]` (name, numpy dtype
descr such as "<f4", rank, dims, bytes; a row of zeros ends each), and in `model.json` (name, target, and each
input's and output's name, dtype, numpy descr and shape) for programs that send the export elsewhere. Every
node must run natively (a model with reference-fallback steps cannot be exported). `ember_run` (ember_run.c
beside this module) uses only libc, libm and optionally OpenMP; `runtime.standalone.run_exported` runs it from
Python.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ..codegen.toolchain import CompileError, compiler_for
from ..target import Target
from ..tir.dtype import numpy_dtype
from ..tir.expr import BinOp, Cast, Const, Select, Var
from .plan import ALIGN, Plan, live_ranges


def _ident(name: str) -> str:
    s = re.sub(r"[^0-9A-Za-z_]", "_", name).upper()
    return s if not s[:1].isdigit() else "V" + s


def _c_string(text: str) -> str:
    """A C string literal of `text` (UTF-8; quotes, backslashes and non-printable bytes escaped in octal)."""
    out = []
    for b in text.encode():
        out.append(chr(b) if 32 <= b < 127 and b not in (34, 92, 63) else f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def npy_descr(dtype: str) -> str:
    """numpy's descr of a scalar type name, little-endian: "<f4", "|u1", "|b1"."""
    dt = numpy_dtype(dtype)
    return dt.newbyteorder("<").str if dt.itemsize > 1 else dt.str


def _tensor_table(plan: Plan, prefix: str) -> list[str]:
    """`<prefix>_inputs[]` and `<prefix>_outputs[]`: name, dtype descr, rank, dims, bytes of each, then zeros."""
    lines = []
    for kind, ids in (("inputs", plan.inputs), ("outputs", plan.outputs)):
        rows = []
        for i, vid in enumerate(ids):
            v = plan.values[vid]
            dims = "NULL"
            if v.shape:
                dims = f"{prefix}_{kind}_{i}_dims"
                shown = ", ".join(str(d) if isinstance(d, int) else "-1" for d in v.shape)  # -1: a symbolic dim
                lines.append(f"static const int64_t {dims}[] = {{{shown}}};")
            nbytes = str(v.nbytes) if v.is_static else "0"  # 0: known at run time
            fields = [_c_string(v.name), _c_string(npy_descr(v.dtype)), str(len(v.shape)), dims, nbytes]
            rows.append(f"  {{{', '.join(fields)}}},")
        lines += [f"const {prefix}_tensor {prefix}_{kind}[] = {{", *rows, "  {NULL, NULL, 0, NULL, 0},", "};", ""]
    return lines


def _dims_text(shape: Sequence) -> str:
    return "[" + ", ".join(str(d).replace(" ", "") for d in shape) + "]"


class SizedExport:
    """The run-time half of a symbolic plan in C: the sizes read from the input shapes, every dim and the workspace
    (first fit by liveness, as `Plan.at`) computed from them. Only sizes that are an input's bare dim are exported;
    a size read from input values (a Reshape target fed as an input) is not yet (NotImplementedError)."""

    def __init__(self, plan: Plan, prefix: str):
        self.plan, self.prefix = plan, prefix
        self.index = {v: k for k, v in enumerate(plan.size_vars)}
        self.source: dict[Var, tuple[int, int]] = {}  # size -> (input number, axis) of its first bare occurrence
        for i, vid in enumerate(plan.inputs):
            for axis, d in enumerate(plan.values[vid].shape):
                if isinstance(d, Var) and d not in self.source:
                    self.source[d] = (i, axis)
        missing = [v.name for v in plan.size_vars if v not in self.source or hasattr(v, "rule")]
        if missing:
            raise NotImplementedError(f"export: size(s) {', '.join(missing)} of model {plan.name} are read from input "
                                      "values or are no input's dim; only sizes given by input shapes are exported "
                                      "so far")  # fmt: skip

    def fields(self) -> list[str]:
        outs = len(self.plan.outputs)
        rank = max([len(self.plan.values[v].shape) for v in self.plan.outputs] + [1])
        return [f"  int64_t sizes[{len(self.plan.size_vars)}];", "  size_t capacity;  /* of the workspace */",
                "  int bound;  /* set_shapes succeeded */", f"  int64_t out_dims[{max(outs, 1)}][{rank}];",
                f"  size_t out_nbytes[{max(outs, 1)}];"]  # fmt: skip

    def dim(self, d: object) -> str:
        """A dim as a C expression of the sizes `m->sizes[k]`."""
        if isinstance(d, int):
            return f"INT64_C({d})"
        if isinstance(d, Var):
            return f"m->sizes[{self.index[d]}]"
        if isinstance(d, Const):
            return f"INT64_C({int(d.value)})"
        if isinstance(d, Cast):
            return self.dim(d.value)
        if isinstance(d, Select):
            return f"({self.dim(d.cond)} ? {self.dim(d.t)} : {self.dim(d.f)})"
        if isinstance(d, BinOp):
            a, b = self.dim(d.a), self.dim(d.b)
            if d.op in _C_OPS:
                return f"({a} {_C_OPS[d.op]} {b})"
            if d.op in ("floordiv", "floormod", "min", "max"):
                return f"{self.prefix}_{d.op}({a}, {b})"
        raise NotImplementedError(f"export: dim {d} of model {self.plan.name} has no C form")

    def elements(self, shape: Sequence) -> str:
        return " * ".join(f"(size_t){self.dim(d)}" for d in shape) or "(size_t)1"

    def set_shapes(self) -> list[str]:
        plan, p = self.plan, self.prefix
        lines = [
            f"static inline int64_t {p}_floordiv(int64_t a, int64_t b) {{",
            "  int64_t q = a / b;",
            "  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;",
            "}",
            f"static inline int64_t {p}_floormod(int64_t a, int64_t b) {{",
            "  int64_t r = a % b;",
            "  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;",
            "}",
            f"static inline int64_t {p}_min(int64_t a, int64_t b) {{ return a < b ? a : b; }}",
            f"static inline int64_t {p}_max(int64_t a, int64_t b) {{ return a > b ? a : b; }}",
            "",
            *_first_fit(plan, p),
            f"int {p}_set_shapes({p}* m, const int64_t* const* dims) {{",
            "  m->bound = 0;",
        ]
        for v in plan.size_vars:
            i, axis = self.source[v]
            name = plan.values[plan.inputs[i]].name
            k = self.index[v]
            lo, hi = getattr(v, "lo", 0), getattr(v, "hi", None)
            lines.append(f"  m->sizes[{k}] = dims[{i}][{axis}];  // {v.name}: input '{name}' dim {axis}")
            cond = f"m->sizes[{k}] < {lo}" + (f" || m->sizes[{k}] > {hi}" if hi is not None else "")
            lines.append(f'  if ({cond}) return {p}_fail(m, 2, "input \'%s\' gives size {v.name} = %lld, outside its '
                         f'bounds [{lo}, {"inf" if hi is None else hi}]", {_c_string(name)}, '
                         f"(long long)m->sizes[{k}]);")  # fmt: skip
        for i, vid in enumerate(plan.inputs):
            v = plan.values[vid]
            for axis, d in enumerate(v.shape):
                want = self.dim(d)
                lines.append(f"  if (dims[{i}][{axis}] != {want})")
                lines.append(f'    return {p}_fail(m, 2, "input \'%s\' has %lld at dim {axis}, wants '
                             f'{str(d).replace(" ", "")} = %lld", {_c_string(v.name)}, (long long)dims[{i}][{axis}], '
                             f"(long long)({want}));")  # fmt: skip
        temps = _temps_in_order(plan)
        if temps:
            lines.append(f"  size_t need[{len(temps)}], offset[{len(temps)}];")
            for k, vid in enumerate(temps):
                v = plan.values[vid]
                size = numpy_dtype(v.dtype).itemsize
                lines.append(f"  need[{k}] = ({self.elements(v.shape)} * {size} + {ALIGN - 1}) / {ALIGN} * {ALIGN};  "
                             f"// {v.name}")  # fmt: skip
                lines.append(f"  if (need[{k}] == 0) need[{k}] = {ALIGN};")
            lines += [
                f"  size_t total = {p}_first_fit(need, offset);",
                "  if (total > m->capacity) {",
                "    free(m->workspace);",
                f"    m->workspace = (unsigned char*)aligned_alloc({ALIGN}, total);",
                "    m->capacity = m->workspace != NULL ? total : 0;",
                f'    if (m->workspace == NULL) return {p}_fail(m, 1, "out of memory (a workspace of %zu bytes)", '
                "total);",
                "  }",
            ]
            lines += [f"  m->table[{vid}] = m->workspace + offset[{k}];  // {plan.values[vid].name}"
                      for k, vid in enumerate(temps)]  # fmt: skip
        for i, vid in enumerate(plan.outputs):
            v = plan.values[vid]
            lines += [f"  m->out_dims[{i}][{axis}] = {self.dim(d)};" for axis, d in enumerate(v.shape)]
            lines.append(f"  m->out_nbytes[{i}] = {self.elements(v.shape)} * {numpy_dtype(v.dtype).itemsize};")
        lines += ["  m->bound = 1;", "  return 0;", "}", ""]
        lines += [
            f"const int64_t* {p}_output_dims(const {p}* m, int i) {{",
            f"  return m->bound ? m->out_dims[i] : {p}_outputs[i].dims;",
            "}",
            f"size_t {p}_output_nbytes(const {p}* m, int i) {{ return m->bound ? m->out_nbytes[i] : 0; }}",
            "",
        ]
        return lines


_C_OPS = {"add": "+", "sub": "-", "mul": "*", "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
          "and": "&&", "or": "||"}  # fmt: skip


def _temps_in_order(plan: Plan) -> list[int]:
    """The temporaries in the order `plan_offsets` places them (first use, then id)."""
    first, _ = live_ranges(plan)
    return sorted((i for i, v in enumerate(plan.values) if v.kind == "temp"), key=lambda i: (first.get(i, 0), i))


def _first_fit(plan: Plan, p: str) -> list[str]:
    """`<p>_first_fit(need, offset)`: `plan_offsets` in C over the temporaries' bytes at the sizes of a call (their
    live ranges are the same at every size); returns the workspace's size."""
    temps = _temps_in_order(plan)
    if not temps:
        return []
    first, last = live_ranges(plan)
    n = len(temps)
    return [
        f"static const int32_t {p}_first[{n}] = {{{', '.join(str(first.get(i, 0)) for i in temps)}}};",
        f"static const int32_t {p}_last[{n}] = {{{', '.join(str(last.get(i, first.get(i, 0))) for i in temps)}}};",
        f"static size_t {p}_first_fit(const size_t* need, size_t* offset) {{",
        f"  size_t live_off[{n}], live_size[{n}], total = 0;",
        f"  int32_t live_last[{n}];",
        "  int live = 0;",
        f"  for (int k = 0; k < {n}; k++) {{",
        "    int kept = 0;",
        "    for (int j = 0; j < live; j++) {  /* the blocks still live at this one's first use, by offset */",
        f"      if (live_last[j] < {p}_first[k]) continue;",
        "      int at = kept++;",
        "      size_t o = live_off[j], z = live_size[j];",
        "      int32_t l = live_last[j];",
        "      for (; at > 0 && live_off[at - 1] > o; at--) {",
        "        live_off[at] = live_off[at - 1], live_size[at] = live_size[at - 1];",
        "        live_last[at] = live_last[at - 1];",
        "      }",
        "      live_off[at] = o, live_size[at] = z, live_last[at] = l;",
        "    }",
        "    live = kept;",
        "    size_t off = 0;",
        "    for (int j = 0; j < live; j++) {",
        "      if (live_off[j] >= off + need[k]) break;",
        "      if (live_off[j] + live_size[j] > off) off = live_off[j] + live_size[j];",
        "    }",
        "    offset[k] = off;",
        f"    live_off[live] = off, live_size[live] = need[k], live_last[live] = {p}_last[k];",
        "    live++;",
        "    if (off + need[k] > total) total = off + need[k];",
        "  }",
        "  return total;",
        "}",
        "",
    ]


def _shape_functions(plan: Plan, prefix: str, sized: SizedExport | None) -> list[str]:
    """`<prefix>_set_shapes`, `_output_dims`, `_output_nbytes` and `_error`: a symbolic model's sizes bound from its
    inputs' shapes (`SizedExport`); a static model's shapes checked."""
    p = prefix
    lines = [
        f"static inline int {p}_fail({p}* m, int status, const char* fmt, ...) {{",
        "  va_list ap;",
        "  va_start(ap, fmt);",
        "  vsnprintf(m->error, sizeof m->error, fmt, ap);",
        "  va_end(ap);",
        "  return status;",
        "}",
        f"const char* {p}_error(const {p}* m) {{ return m->error; }}",
        "",
    ]
    if sized is not None:
        return lines + sized.set_shapes()
    lines += [f"int {p}_set_shapes({p}* m, const int64_t* const* dims) {{"]
    for i, vid in enumerate(plan.inputs):
        v = plan.values[vid]
        for axis, d in enumerate(v.shape):
            lines += [f"  if (dims[{i}][{axis}] != {d})",
                      f'    return {p}_fail(m, 2, "input \'%s\' has %lld at dim {axis}, the model takes {d}", '
                      f"{_c_string(v.name)}, (long long)dims[{i}][{axis}]);"]  # fmt: skip
    lines += [
        "  (void)m, (void)dims;",
        "  return 0;",
        "}",
        f"const int64_t* {p}_output_dims(const {p}* m, int i) {{ (void)m; return {p}_outputs[i].dims; }}",
        f"size_t {p}_output_nbytes(const {p}* m, int i) {{ (void)m; return {p}_outputs[i].nbytes; }}",
        "",
    ]
    return lines


def export_c(plan: Plan, weights: Mapping[int, np.ndarray], source: str, directory: str | Path,
             prefix: str = "ember_model") -> Path:  # fmt: skip
    """Write `<prefix>.c` (the C backend's model source `source` and the create/run/destroy functions over
    `plan`), `<prefix>.h` and `weights.bin` (each weight 64-byte aligned) into `directory`."""
    fallbacks = [s.op for s in plan.steps if s.kind != "segment"]
    if fallbacks:
        raise ValueError(
            f"cannot export: {len(fallbacks)} node(s) run on the numpy reference ({', '.join(sorted(set(fallbacks)))})"
        )
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)

    # weights: one blob, each array 64-byte aligned
    offsets: dict[int, int] = {}
    blob = bytearray()
    for vid, w in sorted(weights.items()):
        blob += b"\0" * ((-len(blob)) % ALIGN)
        offsets[vid] = len(blob)
        blob += np.ascontiguousarray(w).tobytes()
    (out / "weights.bin").write_bytes(bytes(blob))

    n = len(plan.values)
    sized = SizedExport(plan, prefix) if plan.is_symbolic else None
    lines = [
        f'#include "{prefix}.h"',
        "#include <stdarg.h>",
        "#include <stdio.h>",
        "",
        f"struct {prefix} {{",
        "  unsigned char* weights;",
        "  unsigned char* workspace;",
        f"  void* table[{max(n, 1)}];",
        *(sized.fields() if sized else []),
        "  char error[512];",
        "};",
        "",
        f"{prefix}* {prefix}_create(const char* weights_path) {{",
        f"  {prefix}* m = ({prefix}*)calloc(1, sizeof({prefix}));",
        "  if (m == NULL) return NULL;",
        f"  m->weights = (unsigned char*)aligned_alloc({ALIGN}, {max(-(-len(blob) // ALIGN) * ALIGN, ALIGN)});",
        f"  m->workspace = (unsigned char*)aligned_alloc({ALIGN}, {max(-(-plan.workspace // ALIGN) * ALIGN, ALIGN)});",
        '  FILE* f = fopen(weights_path, "rb");',
        "  if (m->weights == NULL || m->workspace == NULL || f == NULL ||",
        f"      fread(m->weights, 1, {len(blob)}, f) != {len(blob)}) {{",
        "    if (f) fclose(f);",
        f"    {prefix}_destroy(m);",
        "    return NULL;",
        "  }",
        "  fclose(f);",
    ]
    for vid, off in offsets.items():
        lines.append(f"  m->table[{vid}] = m->weights + {off};  // {plan.values[vid].name}")
    for vid, v in enumerate(plan.values):
        if v.kind == "temp" and sized is None:
            lines.append(f"  m->table[{vid}] = m->workspace + {v.offset};  // {v.name}")
    lines += ["  return m;", "}", ""]
    lines += _shape_functions(plan, prefix, sized)
    lines += [
        f"void {prefix}_destroy({prefix}* m) {{",
        "  if (m == NULL) return;",
        "  free(m->weights);",
        "  free(m->workspace);",
        "  free(m);",
        "}",
        "",
        f"int {prefix}_run({prefix}* m, const void* const* inputs, void* const* outputs) {{",
        "  int status;",
        *([f'  if (!m->bound) return {prefix}_fail(m, -2, "{prefix}_set_shapes was not called");'] if sized else []),
    ]
    for i, vid in enumerate(plan.inputs):
        lines.append(f"  m->table[{vid}] = (void*)inputs[{i}];  // {plan.values[vid].name}")
    copies = []
    for i, vid in enumerate(plan.outputs):
        v = plan.values[vid]
        if v.kind == "output":
            lines.append(f"  m->table[{vid}] = outputs[{i}];  // {v.name}")
        else:
            nbytes = v.nbytes if v.is_static else f"m->out_nbytes[{i}]"
            copies.append(f"  memcpy(outputs[{i}], m->table[{vid}], {nbytes});  // {v.name}")
    for vid, v in enumerate(plan.values):
        if v.kind == "alias":
            at = f"(unsigned char*)m->table[{v.alias_of}] + {v.view_offset}" if v.view_offset else \
                f"m->table[{v.alias_of}]"  # fmt: skip
            lines.append(f"  m->table[{vid}] = {at};  // {v.name} (view)")
    sizes_arg = ", m->sizes" if sized else ""
    for s in plan.steps:
        lines.append(f"  if ((status = {s.function}(m->table{sizes_arg})) != 0) return status;")
    lines += copies + ["  return 0;", "}", ""]
    lines += _tensor_table(plan, prefix)
    source = source + "\n" + "\n".join(lines)
    (out / f"{prefix}.c").write_text(source)

    guard = _ident(prefix) + "_H"
    name = _ident(prefix)
    header = [f"#ifndef {guard}", f"#define {guard}", "/* Generated by Ember: the standalone model library. */",
              "#include <stddef.h>", "#include <stdint.h>", "", f"typedef struct {prefix} {prefix};", "",
              f"#define {name}_NAME {_c_string(plan.name)}",
              f"#define {name}_THREADS {plan.threads or 0}  /* the target's -threads; 0: all cores */"]  # fmt: skip
    header.append(f"#define {name}_NUM_SIZES {len(plan.size_vars)}  /* symbolic sizes, set by the input shapes */")
    for v in plan.size_vars:
        hi = "inf" if getattr(v, "hi", None) is None else v.hi
        header.append(f"/* size {v.name} in [{getattr(v, 'lo', 0)}, {hi}] */")
    for kind, ids in (("INPUT", plan.inputs), ("OUTPUT", plan.outputs)):
        header.append(f"#define {_ident(prefix)}_NUM_{kind}S {len(ids)}")
        for i, vid in enumerate(ids):
            v = plan.values[vid]
            size = f"{v.nbytes} bytes" if v.is_static else "bytes at the sizes of the call"
            header.append(f"/* {kind.lower()} {i}: {v.name}: {v.dtype}{_dims_text(v.shape)} ({size}) */")
    header += [
        "",
        '/* An input or output: its name, numpy dtype descr ("<f4", "|u1", ...), rank, dims and size (a symbolic dim',
        "   is -1 and the size 0: see ember_model_set_shapes). */",
        "typedef struct {",
        "  const char* name;",
        "  const char* dtype;",
        "  int32_t rank;",
        "  const int64_t* dims;",
        "  size_t nbytes;",
        f"}} {prefix}_tensor;",
        f"/* In graph order, {_ident(prefix)}_NUM_INPUTS (_OUTPUTS) entries, then one of zeros. */",
        f"extern const {prefix}_tensor {prefix}_inputs[];",
        f"extern const {prefix}_tensor {prefix}_outputs[];",
        "",
        f"{prefix}* {prefix}_create(const char* weights_path);",
        "/* The shapes of the next runs' inputs (dims[i]: input i's dims, of its rank): every dim is checked, the",
        "   symbolic sizes are read from them and the workspace is planned for them (needed before the first run of a",
        f"   model with {name}_NUM_SIZES > 0). 0, or 2 with the reason in {prefix}_error(m). */",
        f"int {prefix}_set_shapes({prefix}* m, const int64_t* const* dims);",
        f"/* Output i's dims and bytes at the sizes of the last {prefix}_set_shapes (else the table's). */",
        f"const int64_t* {prefix}_output_dims(const {prefix}* m, int i);",
        f"size_t {prefix}_output_nbytes(const {prefix}* m, int i);",
        f"const char* {prefix}_error(const {prefix}* m);",
        f"int {prefix}_run({prefix}* m, const void* const* inputs, void* const* outputs);",
        f"void {prefix}_destroy({prefix}* m);",
        "",
        f"#endif  /* {guard} */",
    ]
    (out / f"{prefix}.h").write_text("\n".join(header) + "\n")
    (out / "model.json").write_text(json.dumps(model_description(plan), indent=1) + "\n")
    return out


def model_description(plan: Plan) -> dict:
    """`model.json` of an export: the model's name and target, and its inputs and outputs in graph order (name,
    ember dtype, numpy descr, shape): what a program needs to call `ember_run` without reading the C header."""

    def tensors(ids: Sequence[int]) -> list[dict]:
        return [{"name": plan.values[v].name, "dtype": plan.values[v].dtype, "descr": npy_descr(plan.values[v].dtype),
                 "shape": [d if isinstance(d, int) else str(d).replace(" ", "") for d in plan.values[v].shape]}
                for v in ids]  # fmt: skip

    sizes = {v.name: [getattr(v, "lo", 0), getattr(v, "hi", None)] for v in plan.size_vars}
    return {"name": plan.name, "target": str(plan.target), "inputs": tensors(plan.inputs),
            "outputs": tensors(plan.outputs), **({"sizes": sizes} if sizes else {})}  # fmt: skip


RUNNER_SOURCE = Path(__file__).with_name("ember_run.c")


def executable_flags(target: Target, openmp: bool = True) -> list[str]:
    """The target's C flags for an executable: no -shared/-fPIC; without -fopenmp the `#pragma omp` lines are
    ignored on purpose, so the unknown-pragma warning is off."""
    flags = [f for f in target.cflags() if f not in ("-shared", "-fPIC")]
    # -Wno-psabi: vectors wider than the target's registers (8 x int64 under AVX2) pass between the model's static
    # helpers only, so GCC's warning that their ABI differs from a build with wider registers does not apply
    warn = ["-Wall", "-Wno-psabi"]
    return flags + warn if openmp else [f for f in flags if f != "-fopenmp"] + warn + ["-Wno-unknown-pragmas"]


def export_standalone(plan: Plan, weights: Mapping[int, np.ndarray], source: str, directory: str | Path,
                      target: Target | str | None = None, build: bool = True, openmp: bool = True,
                      extra_cflags: Sequence[str] = ()) -> Path:  # fmt: skip
    """Write the model library (`export_c`: ember_model.c, ember_model.h, weights.bin), `ember_run.c` (the
    standalone runner) and a `Makefile` into `directory`, and build `ember_run` there with the target's C compiler
    and flags (plus `extra_cflags`; `openmp=False` builds without OpenMP: the parallel loops' thread pool needs
    only pthreads) unless `build` is False."""
    target = Target.parse(target if target is not None else plan.target)
    out = export_c(plan, weights, source, directory)
    shutil.copyfile(RUNNER_SOURCE, out / "ember_run.c")
    if build:
        cc = compiler_for(target)  # (raises naming the Debian package of a missing cross compiler)
    else:  # the sources to build elsewhere: the compiler the Makefile names
        cc = "cc" if target.runs_here or target.arch is None else f"{target.arch.triple}-gcc"
    flags = [*executable_flags(target, openmp), *extra_cflags]
    libs = ["-lmvec", "-lm"] if "_ZGV" in source and target.has_libmvec else ["-lm"]
    libs.append("-pthread")  # the model's thread pool
    makefile = [
        "# Generated by Ember: `make` builds ember_run, the standalone runner, with the exported model.",
        "# ./ember_run --input NAME=FILE.npy [...] --output-dir OUT [--repeat N] [--weights PATH]",
        f"CC = {cc}",
        f"CFLAGS = {' '.join(flags)}",
        f"LDLIBS = {' '.join(libs)}",
        "",
        "ember_run: ember_run.c ember_model.c ember_model.h",
        "\t$(CC) $(CFLAGS) -o $@ ember_run.c ember_model.c $(LDLIBS)",
        "",
        "clean:",
        "\trm -f ember_run",
        "",
        ".PHONY: clean",
    ]
    (out / "Makefile").write_text("\n".join(makefile) + "\n")
    if build:
        cmd = [cc, *flags, "-o", "ember_run", "ember_run.c", "ember_model.c", *libs]
        proc = subprocess.run(cmd, cwd=out, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CompileError(f"building ember_run in {out} failed: {' '.join(cmd)}\n{proc.stderr.strip()[:4000]}")
    return out


class ExportsC:
    """`export_c` and `export` for a model whose code is C source (`self.source`): the C models, here or built for
    another machine. A model of another target kind (llvm) refuses with the fix."""

    plan: Plan
    source: str
    _weights: dict[int, np.ndarray]

    def _c_source(self, what: str) -> str:
        if Target.parse(self.plan.target).kind != "c":
            raise ValueError(f"{what} writes the model's C source, and this model was compiled for target "
                             f"'{self.plan.target}': compile it with target='c' to export it")  # fmt: skip
        return self.source

    def export_c(self, directory: str | Path, prefix: str = "ember_model") -> Path:
        """Write a standalone C library (source, header, weights) a C program can link: see `export_c`."""
        return export_c(self.plan, self._weights, self._c_source("export_c"), directory, prefix)

    def export(self, directory: str | Path, build: bool = True, openmp: bool = True,
               extra_cflags: Sequence[str] = ()) -> Path:  # fmt: skip
        """Write the standalone export (the C library, ember_run.c, a Makefile) and build `ember_run` with the
        target's compiler and flags: see `export_standalone` and `runtime.standalone.run_exported`."""
        source = self._c_source("export")
        return export_standalone(self.plan, self._weights, source, directory, build=build, openmp=openmp,
                                 extra_cflags=extra_cflags)  # fmt: skip
