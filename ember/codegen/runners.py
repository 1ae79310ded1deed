"""The runner functions of a model's segments: each calls the segment's kernels in order, with buffer addresses
from a table of pointers indexed by value id, and returns the first nonzero status.

    int32_t ember_segment_N(void* const* v)                  the plain runner
    int32_t ember_segment_N_profiled(void* const* v, double* t)  the same, writing each kernel's seconds to t[j]

`runner_source` writes them in C (the C backend compiles them with the kernels), `runner_ir` in LLVM IR (the
llvm backend's module). `steps` are a run plan's steps (`runtime.plan.Step`: kind, function, and the kernels'
name, args and nodes); fallback steps have no runner.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any


def runner_source(steps: Iterable[Any], sized: bool = False) -> str:
    """C functions that call each segment's kernels in order (plain and timed variants). `sized`: a plan with
    symbolic sizes, whose runners take the sizes' values (`const int64_t* s`) after the table and pass each kernel
    its own (`KernelInfo.sizes`: indices into s)."""
    out = [
        "#include <time.h>",
        "static double ember_now(void) {",
        "  struct timespec ts;",
        "  clock_gettime(CLOCK_MONOTONIC, &ts);",
        "  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;",
        "}",
    ]
    for s in steps:
        if s.kind != "segment":
            continue
        for timed in (False, True):
            params = "void* const* v" + (", const int64_t* s" if sized else "") + (", double* t" if timed else "")
            sig = f"int32_t {s.function}{'_profiled' if timed else ''}({params})"
            out += ["", sig + " {", "  int32_t status;"]
            for j, k in enumerate(s.kernels):
                args = [f"v[{a}]" for a in k.args] + [f"s[{i}]" for i in getattr(k, "sizes", [])]
                call = f"{k.name}({', '.join(args)})"
                out.append(f"  // {', '.join(k.nodes)}")
                if timed:
                    out.append("  double t0 = ember_now();" if j == 0 else "  t0 = ember_now();")
                out.append(f"  if ((status = {call}) != 0) return status;")
                if timed:
                    out.append(f"  t[{j}] = ember_now() - t0;")
            out += ["  return 0;", "}"]
    return "\n".join(out) + "\n"


# clock_gettime's id of the monotonic clock
_CLOCK_MONOTONIC = {"linux": 1, "darwin": 6}

_CLOCK_IR = """
%ember.timespec = type {{ i64, i64 }}
declare i32 @clock_gettime(i32, ptr)

define internal double @ember_now() {{
  %ts = alloca %ember.timespec
  %rc = call i32 @clock_gettime(i32 {clock}, ptr %ts)
  %sp = getelementptr %ember.timespec, ptr %ts, i32 0, i32 0
  %s = load i64, ptr %sp
  %np = getelementptr %ember.timespec, ptr %ts, i32 0, i32 1
  %ns = load i64, ptr %np
  %sf = sitofp i64 %s to double
  %nf = sitofp i64 %ns to double
  %nsec = fmul double %nf, 1.0e-9
  %t = fadd double %sf, %nsec
  ret double %t
}}
"""


def runner_ir(steps: Iterable[Any], sized: bool = False) -> str:
    """LLVM IR of each segment's runner (plain and timed): the kernels called in order, the first nonzero
    status returned. The timed variant writes each kernel's seconds to `t[j]`. `sized`: the runners take the
    sizes' values (`ptr %s`, i64 each) after the table and pass each kernel its own, as `runner_source`'s."""
    clock = _CLOCK_MONOTONIC.get(sys.platform, 1)
    out = [_CLOCK_IR.format(clock=clock)]
    for s in steps:
        if s.kind != "segment":
            continue
        for timed in (False, True):
            name = s.function + ("_profiled" if timed else "")
            params = "ptr noalias %v" + (", ptr noalias %s" if sized else "") + (", ptr noalias %t" if timed else "")
            out.append(f'define i32 @"{name}"({params}) {{')
            out.append("entry:")
            for j, k in enumerate(s.kernels):
                out.append(f"  ; {', '.join(k.nodes)}")
                args = []
                for n, a in enumerate(k.args):
                    out.append(f"  %p{j}.{n} = getelementptr ptr, ptr %v, i64 {a}")
                    out.append(f"  %a{j}.{n} = load ptr, ptr %p{j}.{n}")
                    args.append(f"ptr %a{j}.{n}")
                for n, i in enumerate(getattr(k, "sizes", [])):
                    out.append(f"  %sp{j}.{n} = getelementptr i64, ptr %s, i64 {i}")
                    out.append(f"  %sv{j}.{n} = load i64, ptr %sp{j}.{n}")
                    args.append(f"i64 %sv{j}.{n}")
                if timed:
                    out.append(f"  %t{j}.0 = call double @ember_now()")
                out.append(f'  %s{j} = call i32 @"{k.name}"({", ".join(args)})')
                if timed:
                    out.append(f"  %t{j}.1 = call double @ember_now()")
                    out.append(f"  %dt{j} = fsub double %t{j}.1, %t{j}.0")
                    out.append(f"  %tp{j} = getelementptr double, ptr %t, i64 {j}")
                    out.append(f"  store double %dt{j}, ptr %tp{j}")
                out.append(f"  %bad{j} = icmp ne i32 %s{j}, 0")
                out.append(f"  br i1 %bad{j}, label %fail{j}, label %ok{j}")
                out.append(f"fail{j}:")
                out.append(f"  ret i32 %s{j}")
                out.append(f"ok{j}:")
            out += ["  ret i32 0", "}", ""]
    return "\n".join(out)
