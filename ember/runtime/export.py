"""Export a compiled model as standalone C: the model library (source, header, weights) and `ember_run`, a small
program that runs it on .npy files. No Python is needed to build or run either.

    ember.compile(model).export("out/")      # the library, ember_run.c, a Makefile, and out/ember_run built
    ember export model.onnx --target c -o out/           # the same from the command line
    out/ember_run --input x=x.npy --output-dir y/ --repeat 10   # y/<output>.npy, one JSON timing line on stdout
    ember.compile(model).export_c("out/")    # only the library: out/ember_model.c, ember_model.h, weights.bin
    cc -O3 -march=native -fopenmp app.c out/ember_model.c -lm

The header declares an opaque model handle:

    ember_model* ember_model_create(const char* weights_path);   /* NULL on failure */
    int ember_model_run(ember_model* m, const void* const* inputs, void* const* outputs);
    void ember_model_destroy(ember_model* m);

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
from .plan import ALIGN, Plan


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
                lines.append(f"static const int64_t {dims}[] = {{{', '.join(map(str, v.shape))}}};")
            fields = [_c_string(v.name), _c_string(npy_descr(v.dtype)), str(len(v.shape)), dims, str(v.nbytes)]
            rows.append(f"  {{{', '.join(fields)}}},")
        lines += [f"const {prefix}_tensor {prefix}_{kind}[] = {{", *rows, "  {NULL, NULL, 0, NULL, 0},", "};", ""]
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
    lines = [
        f'#include "{prefix}.h"',
        "#include <stdio.h>",
        "",
        f"struct {prefix} {{",
        "  unsigned char* weights;",
        "  unsigned char* workspace;",
        f"  void* table[{max(n, 1)}];",
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
        if v.kind == "temp":
            lines.append(f"  m->table[{vid}] = m->workspace + {v.offset};  // {v.name}")
    lines += ["  return m;", "}", ""]
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
    ]
    for i, vid in enumerate(plan.inputs):
        lines.append(f"  m->table[{vid}] = (void*)inputs[{i}];  // {plan.values[vid].name}")
    copies = []
    for i, vid in enumerate(plan.outputs):
        v = plan.values[vid]
        if v.kind == "output":
            lines.append(f"  m->table[{vid}] = outputs[{i}];  // {v.name}")
        else:
            copies.append(f"  memcpy(outputs[{i}], m->table[{vid}], {v.nbytes});  // {v.name}")
    for vid, v in enumerate(plan.values):
        if v.kind == "alias":
            lines.append(f"  m->table[{vid}] = m->table[{v.alias_of}];  // {v.name} (view)")
    for s in plan.steps:
        lines.append(f"  if ((status = {s.function}(m->table)) != 0) return status;")
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
    for kind, ids in (("INPUT", plan.inputs), ("OUTPUT", plan.outputs)):
        header.append(f"#define {_ident(prefix)}_NUM_{kind}S {len(ids)}")
        for i, vid in enumerate(ids):
            v = plan.values[vid]
            header.append(f"/* {kind.lower()} {i}: {v.name}: {v.dtype}{list(v.shape)} ({v.nbytes} bytes) */")
    header += [
        "",
        '/* An input or output: its name, numpy dtype descr ("<f4", "|u1", ...), rank, dims and size. */',
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
                 "shape": list(plan.values[v].shape)} for v in ids]  # fmt: skip

    return {"name": plan.name, "target": str(plan.target), "inputs": tensors(plan.inputs),
            "outputs": tensors(plan.outputs)}  # fmt: skip


RUNNER_SOURCE = Path(__file__).with_name("ember_run.c")


def executable_flags(target: Target, openmp: bool = True) -> list[str]:
    """The target's C flags for an executable: no -shared/-fPIC; without -fopenmp the `#pragma omp` lines are
    ignored on purpose, so the unknown-pragma warning is off."""
    flags = [f for f in target.cflags() if f not in ("-shared", "-fPIC")]
    return flags + ["-Wall"] if openmp else [f for f in flags if f != "-fopenmp"] + ["-Wall", "-Wno-unknown-pragmas"]


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
        if self.plan.is_symbolic:
            raise NotImplementedError(f"{what}: a model with symbolic sizes cannot be exported yet; compile it with "
                                      "input_shapes= or dynamic=False to export it")  # fmt: skip
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
