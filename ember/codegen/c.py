"""C code from the loop IR: readable names, a thread pool for parallel loops, GCC vector types for vectors.

The generated file is self-contained: typedefs and small `static inline` helpers (vector load/store,
broadcast, select, floor division) are emitted only when used. Each function takes one pointer per
buffer parameter (`restrict`: the runtime checks that arguments do not overlap) and returns 0, or -1
when an allocation failed. A parallel loop's body is outlined into a static function over a range of its
iterations, which the library's thread pool (`codegen.c_pool`) runs in chunks taken from a shared counter.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..target import Target
from ..te.intrin import ADDRESS, INTRINSICS, PREFETCH, isa_features
from ..tir.arith import Analyzer
from ..tir.dtype import DType, int64
from ..tir.expr import BinOp, Broadcast, Call, Cast, Const, Expr, Load, Not, Ramp, Select, Var, const_value, same
from ..tir.functor import walk
from ..tir.narrow import CONVERSIONS
from ..tir.stmt import (
    Allocate,
    Buffer,
    Evaluate,
    For,
    ForKind,
    IfThenElse,
    LetStmt,
    PrimFunc,
    Seq,
    Stmt,
    Store,
    size_params,
)  # fmt: skip
from ..tir.vectorize import HALF_ROUND, lane_mask, mask_bits
from .c_pool import POOL_DECL, POOL_SOURCE
from .lanes import aligned_lanes, buffer_elems
from .narrow import c_function
from .vmath import EXP2_TABLE, c_vector_exp, exp2_table_values, vector_exp, wants_arithmetic_exp

STACK_LIMIT = 32 * 1024  # bytes: larger allocations go to the heap
SCRATCH_SLOTS = 8  # freed heap buffers of a library kept for its next calls (`SCRATCH`)
# Heap buffers of a kernel (a Winograd convolution's transformed tiles, a few MB) are taken from and given back
# to a few slots of the library instead of malloc/free: glibc hands buffers that large back to the system on
# free (mmap, or trimming the heap's top), and every call then page-faults them in again (measured: half the
# time of a 64-channel 56x56 Winograd layer). A block carries its size in a 64-byte header and serves any request
# up to it; one too small for the request that finds it is freed (the larger new block takes its place), one that
# finds no free slot is freed. Slots change hands only by atomic exchange and compare-exchange (any thread may
# call); the library keeps at most SCRATCH_SLOTS blocks, each of a kernel's largest heap buffer at most.
SCRATCH = f"""static void* ember_scratch_slot[{SCRATCH_SLOTS}];
static void* ember_scratch_alloc(size_t n) {{
  for (int i = 0; i < {SCRATCH_SLOTS}; ++i) {{
    if (__atomic_load_n(&ember_scratch_slot[i], __ATOMIC_RELAXED) == NULL) continue;
    char* p = (char*)__atomic_exchange_n(&ember_scratch_slot[i], NULL, __ATOMIC_ACQ_REL);
    if (p == NULL) continue;
    if (*(size_t*)p >= n) return p + 64;
    free(p);
  }}
  char* p = (char*)aligned_alloc(64, n + 64);
  if (p == NULL) return NULL;
  *(size_t*)p = n;
  return p + 64;
}}
static void ember_scratch_free(void* q) {{
  char* p = (char*)q - 64;
  for (int i = 0; i < {SCRATCH_SLOTS}; ++i) {{
    void* none = NULL;
    if (__atomic_compare_exchange_n(&ember_scratch_slot[i], &none, p, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) return;
  }}
  free(p);
}}
__attribute__((destructor)) static void ember_scratch_release(void) {{
  for (int i = 0; i < {SCRATCH_SLOTS}; ++i) free(ember_scratch_slot[i]);
}}"""
CHUNK_WORK = 2048  # stores (scalar or vector) a chunk of a parallel loop does at least, where the loop has them
CHUNKS_PER_THREAD = 4  # chunks per thread a parallel loop is split into at least, where it has the iterations
PARALLEL_MIN_WORK = 2 * CHUNK_WORK  # stores a parallel loop must do in all to be split: a smaller one runs serially

C_KEYWORDS = set(
    "auto break case char const continue default do double else enum extern float for goto if inline int long "
    "register restrict return short signed sizeof static struct switch typedef union unsigned void volatile while "
    "bool main".split()
)

def _is_cmp(e: Expr) -> bool:
    return isinstance(e, BinOp) and e.op in ("eq", "ne", "lt", "le", "gt", "ge")


_OPS = {
    "add": ("+", 12), "sub": ("-", 12), "mul": ("*", 13), "div": ("/", 13),
    "eq": ("==", 9), "ne": ("!=", 9), "lt": ("<", 10), "le": ("<=", 10), "gt": (">", 10), "ge": (">=", 10),
}  # fmt: skip

# intrinsic -> (float32 name, float64 name)
MATH = {
    "exp": ("expf", "exp"), "log": ("logf", "log"), "sqrt": ("sqrtf", "sqrt"), "tanh": ("tanhf", "tanh"),
    "erf": ("erff", "erf"), "floor": ("floorf", "floor"), "ceil": ("ceilf", "ceil"),
    "round": ("nearbyintf", "nearbyint"), "pow": ("powf", "pow"), "sin": ("sinf", "sin"), "cos": ("cosf", "cos"),
    "abs": ("fabsf", "fabs"), "rsqrt": ("ember_rsqrt_f32", "ember_rsqrt_f64"),
    "sigmoid": ("ember_sigmoid_f32", "ember_sigmoid_f64"), "tan": ("tanf", "tan"), "asin": ("asinf", "asin"),
    "acos": ("acosf", "acos"), "atan": ("atanf", "atan"), "sinh": ("sinhf", "sinh"), "cosh": ("coshf", "cosh"),
    "asinh": ("asinhf", "asinh"), "acosh": ("acoshf", "acosh"), "atanh": ("atanhf", "atanh"),
    "log1p": ("log1pf", "log1p"), "fmod": ("fmodf", "fmod"),
}  # fmt: skip

# intrinsic -> the libmvec (glibc vector math) function; names follow the x86 vector function ABI
_LIBMVEC = {
    "exp": "exp", "log": "log", "erf": "erf", "tanh": "tanh", "sin": "sin", "cos": "cos", "pow": "pow",
    "tan": "tan", "asin": "asin", "acos": "acos", "atan": "atan", "sinh": "sinh", "cosh": "cosh",
    "asinh": "asinh", "acosh": "acosh", "atanh": "atanh", "log1p": "log1p",
}  # fmt: skip

_LIBM_NAMES = {n for pair in MATH.values() for n in pair} | {"fmaxf", "fminf", "fmax", "fmin", "fabs"}

_SCALAR_HELPERS = {
    "ember_rsqrt_f32": "static inline float ember_rsqrt_f32(float x) { return 1.0f / sqrtf(x); }",
    "ember_rsqrt_f64": "static inline double ember_rsqrt_f64(double x) { return 1.0 / sqrt(x); }",
    "ember_sigmoid_f32": "static inline float ember_sigmoid_f32(float x) { return 1.0f / (1.0f + expf(-x)); }",
    "ember_sigmoid_f64": "static inline double ember_sigmoid_f64(double x) { return 1.0 / (1.0 + exp(-x)); }",
}


INT_INTRINSICS = ("truncdiv", "truncmod", "pow", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not",
                  "shift_left", "shift_right")  # fmt: skip


def _int_helper_body(fn: str, t: str, signed: bool, bits: int) -> str:
    """Body of `static inline T ember_fn_T(T a[, T b])` for an integer intrinsic, with numpy's answers where C
    has none: x / 0 and x % 0 give 0, INT_MIN / -1 wraps, a shift by a negative amount or by the bit width or
    more gives 0 (-1 for a negative value shifted right), and a negative power truncates (1 / a**-b)."""
    if fn == "truncdiv":
        return f"return b == 0 ? 0 : {f'b == -1 ? ({t})(0 - (uint64_t)a) : ' if signed else ''}a / b;"
    if fn == "truncmod":
        return f"return (b == 0{' || b == -1' if signed else ''}) ? 0 : a % b;"
    if fn == "pow":
        neg = "if (b < 0) return a == 1 ? 1 : a == -1 ? ((b & 1) ? -1 : 1) : 0;\n  " if signed else ""
        loop = "while (e) { if (e & 1) r *= x; x *= x; e >>= 1; }"
        return f"{neg}uint64_t r = 1, x = (uint64_t)a, e = (uint64_t)b;\n  {loop}\n  return ({t})r;"
    if fn == "shift_left":
        return f"return (uint64_t)b >= {bits} ? 0 : ({t})((uint64_t)a << b);"
    if fn == "shift_right":  # past the width, a signed shift fills with the sign bit
        return f"return (uint64_t)b >= {bits} ? {'(a < 0 ? -1 : 0)' if signed else '0'} : ({t})(a >> b);"
    if fn == "bitwise_not":
        return f"return ({t})~a;"
    sym = {"bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^"}[fn]
    return f"return ({t})(a {sym} b);"


def c_symbol(name: str) -> str:
    """The C name of a function named `name` in the IR."""
    return _ident(name)


class CodegenError(Exception):
    pass


def _ident(name: str) -> str:
    s = re.sub(r"[^0-9a-zA-Z_]", "_", name) or "v"
    if s[0].isdigit():
        s = "v" + s
    return s + "_" if s in C_KEYWORDS or s in _LIBM_NAMES else s


class CCodegen:
    def __init__(self, target: Target):
        self.target = target
        self.names: dict[int, str] = {}
        self.taken: set[str] = {"ember_status", "ember_arg", "ember_closure", "ember_begin", "ember_end"}
        self.helpers: dict[str, str] = {}
        self.vec_types: dict[str, str] = {}
        self.ana = Analyzer()
        self.lines: list[str] = []
        self.indent = 1
        self.in_parallel = False
        self.written: set[Buffer] = set()
        self.registers: dict[Buffer, str] = {}  # local buffers promoted to one variable per slot
        self.regions: list[str] = []  # outlined parallel loops, emitted before the function
        self.func_name = ""

    # -- names and types ---------------------------------------------------------------------
    def name(self, obj: Var | Buffer) -> str:
        key = id(obj)
        if key not in self.names:
            base = _ident(obj.name)
            out, n = base, 1
            while out in self.taken:
                out, n = f"{base}_{n}", n + 1
            self.taken.add(out)
            self.names[key] = out
        return self.names[key]

    def ctype(self, dt: DType) -> str:
        if dt.is_half:  # float16/bfloat16 values are computed in float; only buffers hold 16 bits
            if dt.lanes > 1:
                raise CodegenError(f"vectors of {dt.name} are not supported")
            return "float"
        if dt.lanes == 1:
            return dt.c_type
        name = f"{dt.name}x{dt.lanes}"
        if name not in self.vec_types:
            self.vec_types[name] = f"typedef {dt.c_type} {name} __attribute__((vector_size({dt.itemsize * dt.lanes})));"
        return name

    def mask_type(self, bits: int, lanes: int) -> str:
        return self.ctype(DType(f"int{bits}", lanes))

    def helper(self, name: str, code: str) -> str:
        self.helpers.setdefault(name, code)
        return name

    # -- expressions -------------------------------------------------------------------------
    def expr(self, e: Expr, prec: int = 0) -> str:
        s, p = self._expr(e)
        return f"({s})" if p < prec else s

    def _expr(self, e: Expr) -> tuple[str, int]:  # (text, precedence of its top operator)
        if isinstance(e, Var):
            return self.name(e), 16
        if isinstance(e, Const):
            return self.const(e)
        if isinstance(e, Load):
            return self.load(e), 15
        if isinstance(e, BinOp):
            return self.binop(e)
        if isinstance(e, Not):
            if e.dtype.lanes > 1:
                return f"~{self.expr(e.a, 14)}", 14
            return f"!{self.expr(e.a, 14)}", 14
        if isinstance(e, Select):
            return self.select(e)
        if isinstance(e, Cast):
            return self.cast(e), 14
        if isinstance(e, Call):
            return self.call(e), 15
        if isinstance(e, Ramp):
            return self.ramp(e), 15
        if isinstance(e, Broadcast):
            return self.bcast(e.value, e.lanes), 15
        raise CodegenError(f"C codegen: unsupported expression {type(e).__name__}: {e}")

    def const(self, c: Const) -> tuple[str, int]:
        dt, v = c.dtype, c.value
        if dt.is_bool:
            return ("true" if v else "false"), 16
        if dt.is_narrow:  # the code of the value
            return f"((uint8_t){int(np.asarray(v).astype(dt.numpy).view(np.uint8))})", 16
        if dt.is_float:
            f = float(np.asarray(v, dtype=dt.numpy)) if dt.is_half else float(v)
            suffix = "f" if dt.bits <= 32 else ""
            if math.isnan(f):
                return ("NAN" if suffix else "(double)NAN"), 16
            if math.isinf(f):
                s = "INFINITY" if suffix else "(double)INFINITY"
                return (s if f > 0 else f"-{s}"), (16 if f > 0 else 14)
            text = repr(f)
            if "e" not in text and "." not in text:
                text += ".0"
            return text + suffix, (16 if f >= 0 else 14)
        v = int(v)
        if dt.bits == 64:
            lim = "INT64_MIN" if dt.kind == "int" else "0"
            if dt.kind == "int" and v == -(2**63):
                return lim, 16
            return f"(({dt.c_type}){v}LL)", 16
        if dt.name == "int32" and v == -(2**31):
            return "INT32_MIN", 16
        if dt.name != "int32":
            return f"(({dt.c_type}){v})", 16
        return str(v), (16 if v >= 0 else 14)

    def binop(self, e: BinOp) -> tuple[str, int]:
        op, a, b, dt = e.op, e.a, e.b, e.dtype
        vec = dt.lanes > 1
        if vec:
            a2 = a if a.dtype.lanes > 1 else Broadcast(a, dt.lanes)
            b2 = b if b.dtype.lanes > 1 else Broadcast(b, dt.lanes)
            a, b = a2, b2
        if op in _OPS:
            sym, p = _OPS[op]
            if op == "div" and dt.is_int:
                raise CodegenError(f"integer true division in {e}")
            text = f"{self.expr(a, p)} {sym} {self.expr(b, p + 1)}"
            if dt.is_half and op in ("add", "sub", "mul", "div"):  # numpy rounds each half operation
                return f"{self.half_helper(dt, 'round')}({text})", 15
            if not vec and dt.is_int and dt.bits < 32 and op in ("add", "sub", "mul"):
                return f"({dt.c_type})({text})", 14  # C computes in int: wrap back to the narrow type
            return text, p
        if op in ("and", "or"):
            if vec:  # (comparisons under & and | in parentheses: what they mean, and -Wparentheses quiet)
                sym, p = ("&", 8) if op == "and" else ("|", 6)
                return f"{self.expr(a, max(p, 11) if _is_cmp(a) else p)} {sym} {self.expr(b, max(p, 11))}", p
            sym, p = ("&&", 5) if op == "and" else ("||", 4)
            return f"{self.expr(a, p)} {sym} {self.expr(b, p + 1)}", p
        if op in ("min", "max"):
            return self.minmax(op, a, b, dt), 15
        if op in ("floordiv", "floormod"):
            return self.divmod(op, a, b, dt)
        raise CodegenError(f"C codegen: unsupported operator {op}")

    def minmax(self, op: str, a: Expr, b: Expr, dt: DType) -> str:
        cmp = "<" if op == "min" else ">"
        t = self.ctype(dt)
        name = f"ember_{op}_{t}"
        # numpy's maximum/minimum: a NaN on either side wins. `|`, not `||`: both comparisons are evaluated and the
        # choice is a select; a short-circuit branch mispredicts on every other element of random data (MaxPool
        # at 0.8 GFLOP/s)
        nan = " | (a != a)" if dt.is_float else ""
        x86 = self.x86_minmax(op, dt) if dt.is_float and dt.lanes > 1 else None
        if dt.is_int and dt.bits in (8, 16, 32) and dt.lanes > 1:
            x86 = self.x86_int_minmax(op, dt)
        if x86 is not None:
            return f"{x86}({self.expr(a)}, {self.expr(b)})"
        if dt.lanes == 1:
            code = f"static inline {t} {name}({t} a, {t} b) {{ return ((a {cmp} b){nan}) ? a : b; }}"
        elif not dt.is_float:  # per lane: the compilers make one vector min/max of it (a select takes 2-3)
            code = (f"static inline {t} {name}({t} a, {t} b) {{ {t} r; for (int i = 0; i < {dt.lanes}; i++) "
                    f"r[i] = a[i] {cmp} b[i] ? a[i] : b[i]; return r; }}")
        else:
            sel = self.vselect_helper(dt)
            vnan = " | (a != a)" if dt.is_float else ""
            code = f"static inline {t} {name}({t} a, {t} b) {{ return {sel}((a {cmp} b){vnan}, a, b); }}"
        return f"{self.helper(name, code)}({self.expr(a)}, {self.expr(b)})"

    def x86_minmax(self, op: str, dt: DType) -> str | None:
        """A float vector min/max of exactly one AVX-512 or AVX register in intrinsics, NaN on either side winning:
        vmaxps gives its second operand when either is NaN, and a NaN first operand is blended back in (three
        instructions; GCC compiles the generic select of `minmax` to an xor-blend with spills, MaxPool 2x
        slower). None where the target has no such register for the type (the generic helper then serves)."""
        x86 = self.x86_float_register(dt)
        if x86 is None:
            return None
        (w, sfx, reg), t = x86, self.ctype(dt)
        name = f"ember_x86_{op}_{t}"
        r = f"_mm{w}_{op}_{sfx}(({reg})a, ({reg})b)"
        if w == "512":
            body = f"_mm512_mask_mov_{sfx}({r}, _mm512_cmp_{sfx}_mask(({reg})a, ({reg})a, _CMP_UNORD_Q), ({reg})a)"
        else:
            body = f"_mm256_blendv_{sfx}({r}, ({reg})a, _mm256_cmp_{sfx}(({reg})a, ({reg})a, _CMP_UNORD_Q))"
        return self.helper(name, f"static inline {t} {name}({t} a, {t} b) {{ return ({t}){body}; }}")

    def x86_int_minmax(self, op: str, dt: DType) -> str | None:
        """An integer vector min/max (8-, 16- or 32-bit lanes) of exactly one AVX-512, AVX2 or SSE register (VEX),
        or of 64 bits in the low half of one, in one instruction: GCC compiles `minmax`'s lane loop on 16 int32
        lanes as two 256-bit halves, a shuffle and an insert (its preferred vector width on AVX-512 CPUs; the clamp
        of every int8 epilogue), and on 8 bytes in general-purpose registers, byte by byte (an int8 max pool over
        13-wide rows). None where the target has no such register."""
        flags, bits = self.target.simd_features(), dt.bits * dt.lanes
        need = {512: "avx512bw" if dt.bits < 32 else "avx512f", 256: "avx2", 128: "avx", 64: "avx"}.get(bits)
        if dt.bits not in (8, 16, 32) or need not in flags:
            return None
        pre, reg = {512: ("_mm512", "__m512i"), 256: ("_mm256", "__m256i")}.get(bits, ("_mm", "__m128i"))
        t = self.ctype(dt)
        self.helper("immintrin", "#include <immintrin.h>")
        name = f"ember_x86_{op}_{t}"
        fn = f"{pre}_{op}_ep{'i' if dt.kind == 'int' else 'u'}{dt.bits}"
        if bits == 64:  # in the low half of an SSE register
            body = (f"__m128i x = _mm_setzero_si128(), y = _mm_setzero_si128(); __builtin_memcpy(&x, &a, 8); "
                    f"__builtin_memcpy(&y, &b, 8); x = {fn}(x, y); {t} r; __builtin_memcpy(&r, &x, 8); return r;")
        else:
            body = f"return ({t}){fn}(({reg})a, ({reg})b);"
        return self.helper(name, f"static inline {t} {name}({t} a, {t} b) {{ {body} }}")

    def divmod(self, op: str, a: Expr, b: Expr, dt: DType) -> tuple[str, int]:
        if dt.is_float:
            fl = "floorf" if dt.bits == 32 else "floor"
            if dt.lanes > 1:
                return self.lanewise(f"floor{'div' if op == 'floordiv' else 'mod'}", [a, b], dt), 15
            q = f"{fl}({self.expr(a, 13)} / {self.expr(b, 14)})"
            if op == "floordiv":
                return q, 15
            return f"{self.expr(a, 12)} - {q} * {self.expr(b, 14)}", 12
        if dt.lanes == 1:
            la, _ = self.ana.bounds(a)
            lb, _ = self.ana.bounds(b)
            if la is not None and la >= 0 and lb is not None and lb > 0:
                return f"{self.expr(a, 13)} {'/' if op == 'floordiv' else '%'} {self.expr(b, 14)}", 13
        return self.lanewise(op, [a, b], dt), 15

    def lanewise(self, fn: str, args: list[Expr], dt: DType) -> str:
        """Call a scalar helper/function per lane (or once for scalars)."""
        scalar = dt.scalar
        st = scalar.c_type
        sname = self.scalar_fn(fn, scalar)
        if dt.lanes == 1:
            return f"{sname}({', '.join(self.expr(x) for x in args)})"
        t = self.ctype(dt)
        vec = self.inline_exp(fn, dt) or self.simd_math(fn, dt)
        if vec is not None:
            vargs = [x if x.dtype.lanes > 1 else Broadcast(x, dt.lanes) for x in args]
            return f"{vec}({', '.join(self.expr(x) for x in vargs)})"
        if self.arithmetic_math(fn, dt):
            x = args[0] if args[0].dtype.lanes > 1 else Broadcast(args[0], dt.lanes)
            return f"({self.expr(vector_exp(x))})"
        arg_types = [self.ctype(x.dtype.with_lanes(dt.lanes)) for x in args]
        params = ", ".join(f"{at} x{i}" for i, at in enumerate(arg_types))
        name = f"ember_{fn}_{t}"
        lanes = _lanes_init(dt.lanes, lambda l: f"({st}){sname}({', '.join(f'x{i}[{l}]' for i in range(len(args)))})")
        code = f"static inline {t} {name}({params}) {{\n  return ({t}){lanes};\n}}"
        vargs = [x if x.dtype.lanes > 1 else Broadcast(x, dt.lanes) for x in args]
        return f"{self.helper(name, code)}({', '.join(self.expr(x) for x in vargs)})"

    def inline_exp(self, fn: str, dt: DType) -> str | None:
        """The inline vector exp helper (`ember.codegen.vmath.c_vector_exp`) for a float32 vector exp on a C
        target: faster than libmvec's call and exact to about 1 ulp; None for anything else."""
        if self.target.kind != "c" or not wants_arithmetic_exp(fn, dt):
            return None
        t = self.ctype(dt)
        name = f"ember_exp_{t}"
        return self.helper(name, c_vector_exp(name, t, self.mask_type(32, dt.lanes), dt.lanes))

    def arithmetic_math(self, fn: str, dt: DType) -> bool:
        """Whether `fn` on vectors of dt is computed in arithmetic (`ember.codegen.vmath`): a float32 exp on a
        C target without libmvec, where expf would run once per lane. Defines the table it reads."""
        if self.target.kind != "c" or self.target.has_libmvec or not wants_arithmetic_exp(fn, dt):
            return False
        values = ", ".join("INFINITY" if np.isinf(v) else float(v).hex() + "f" for v in exp2_table_values())
        name = self.name(EXP2_TABLE)
        self.helper(name, f"static const float {name}[{EXP2_TABLE.size}] = {{{values}}};")
        return True

    def simd_math(self, fn: str, dt: DType) -> str | None:
        """A helper computing `fn` on a whole float vector with glibc's libmvec (about 4 ulp), splitting
        vectors wider than the ISA's registers; None when libmvec does not apply."""
        if fn == "sigmoid":
            exp = self.inline_exp("exp", dt) or self.simd_math("exp", dt)
            if exp is None:
                return None
            t, one = self.ctype(dt), "1.0f" if dt.bits == 32 else "1.0"
            name = f"ember_simd_sigmoid_{t}"
            return self.helper(name, f"static inline {t} {name}({t} x) {{ return {one} / ({one} + {exp}(-x)); }}")
        if fn not in _LIBMVEC or dt.scalar.name not in ("float32", "float64") or not self.target.has_libmvec:
            return None
        flags = self.target.simd_features()
        width = {512: "e", 256: "d", 128: "b"}
        bits = dt.bits * dt.lanes
        isa = [(b, c) for b, c in width.items() if b <= bits and (b != 512 or "avx512f" in flags)
               and (b != 256 or "avx2" in flags)]  # fmt: skip
        if not isa or bits % isa[0][0]:
            return None
        reg_bits, letter = isa[0]
        n = reg_bits // dt.bits
        libm = _LIBMVEC[fn] + ("f" if dt.bits == 32 else "")
        arity = 2 if fn == "pow" else 1
        sym = f"_ZGV{letter}N{n}{'v' * arity}_{libm}"
        reg_t, t = self.ctype(dt.with_lanes(n)), self.ctype(dt)
        self.helper(sym, f"extern {reg_t} {sym}({', '.join([reg_t] * arity)});")
        name = f"ember_simd_{fn}_{t}"
        params = ", ".join(f"{t} x{i}" for i in range(arity))
        if n == dt.lanes and fn == "exp" and dt.bits == 32:
            body = self.exp_underflow(sym, t, self.mask_type(32, n))
        elif n == dt.lanes:
            body = f"  return {sym}({', '.join(f'x{i}' for i in range(arity))});"
        else:  # wider than a register: call per register-sized part
            parts = [f"  {t} r;", f"  {reg_t} {', '.join(f'a{i}' for i in range(arity))};",
                     f"  for (int h = 0; h < {dt.lanes // n}; ++h) {{"]  # fmt: skip
            parts += [f"    memcpy(&a{i}, ({dt.c_type}*)&x{i} + h * {n}, sizeof a{i});" for i in range(arity)]
            parts += [f"    a0 = {sym}({', '.join(f'a{i}' for i in range(arity))});",
                      f"    memcpy(({dt.c_type}*)&r + h * {n}, &a0, sizeof a0);", "  }", "  return r;"]  # fmt: skip
            body = "\n".join(parts)
        return self.helper(name, f"static inline {t} {name}({params}) {{\n{body}\n}}")

    @staticmethod
    def exp_underflow(sym: str, t: str, it: str) -> str:
        """The body of a float32 vector exp: glibc's vector expf computes the whole vector again lane by lane in
        scalar code when any lane is below ln(FLT_MIN) (a softmax over masked scores, -10000: 14 times slower);
        such lanes are computed as 0 (their exp is a subnormal or 0: flushed, an error below 1.2e-38)."""
        return (f"  const {t} lo = ({t}){{}} - 87.33654f;  /* ln(FLT_MIN) */\n"
                f"  const {it} under = x0 < lo;\n"
                f"  const {t} r = {sym}(({t})((({it})x0 & ~under) | (({it})lo & under)));\n"
                f"  return ({t})(({it})r & ~under);")

    def scalar_fn(self, fn: str, dt: DType) -> str:
        if fn in CONVERSIONS:  # a narrow format to or from float32/int32 (ember.codegen.narrow)
            return self.helper(*c_function(CONVERSIONS[fn]))
        if fn in MATH and dt.is_float:
            name = MATH[fn][0 if dt.bits <= 32 else 1]
            if name in _SCALAR_HELPERS:
                self.helper(name, _SCALAR_HELPERS[name])
            return name
        t = self.ctype(dt.scalar)
        if fn == "abs":
            name = f"ember_abs_{dt.name}"
            return self.helper(name, f"static inline {t} {name}({t} a) {{ return a < 0 ? ({t})-a : a; }}")
        if fn in ("floordiv", "floormod") and dt.is_int:
            name = f"ember_{fn}_{dt.name}"
            if fn == "floordiv":
                body = f"{t} q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;"
            else:
                body = f"{t} r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;"
            return self.helper(name, f"static inline {t} {name}({t} a, {t} b) {{ {body} }}")
        if fn in ("floordiv", "floormod") and dt.is_float:
            fl = "floorf" if dt.bits == 32 else "floor"
            name = f"ember_{fn}_{dt.name}"
            body = f"return {fl}(a / b);" if fn == "floordiv" else f"return a - {fl}(a / b) * b;"
            return self.helper(name, f"static inline {t} {name}({t} a, {t} b) {{ {body} }}")
        if fn in INT_INTRINSICS and dt.is_int:
            name = f"ember_{fn}_{dt.name}"
            params = f"{t} a" if fn == "bitwise_not" else f"{t} a, {t} b"
            body = _int_helper_body(fn, t, dt.kind == "int", dt.bits)
            return self.helper(name, f"static inline {t} {name}({params}) {{\n  {body}\n}}")
        if fn in ("floor", "ceil", "round") and dt.is_int:
            name = f"ember_identity_{dt.name}"
            return self.helper(name, f"static inline {t} {name}({t} a) {{ return a; }}")
        raise CodegenError(f"C codegen: no {fn} for {dt}")

    def call(self, e: Call) -> str:
        if e.name == ADDRESS:  # an intrinsic's operand: &buf[offset]
            (ld,) = e.args
            return f"&{self.name(ld.buffer)}[{self.expr(ld.indices[0])}]"
        if e.name == PREFETCH:
            return self.prefetch(e.args[0])
        if e.name in INTRINSICS:  # a tensorized micro-kernel, specialized on its constant shape
            m, n = (const_value(a) for a in e.args[6:8])
            zero = len(e.args) > 9 and bool(const_value(e.args[9]))  # C = A . B (`intrin._fold_zero_init`)
            intr = INTRINSICS[e.name]
            whole = -(-int(n) // intr.whole_columns) * intr.whole_columns if intr.whole_columns else int(n)
            if whole != n and isinstance(e.args[1], Const) and int(e.args[1].value) >= whole:
                n = whole  # whole tiles: C's rows hold them (`Intrinsic.whole_columns`)
            fname, code = intr.c_impl(int(m), int(n), isa_features(self.target), zero)
            args = [self.expr(a) for a in e.args[:6]] + [self.expr(e.args[8])]
            return f"{self.helper(fname, code)}({', '.join(args)})"
        if e.name in HALF_ROUND.values():  # float32 rounded to a 16-bit float (`vectorize._half_round_trips`)
            return self.half_round(e)
        if e.name == "round" and e.dtype.lanes > 1:
            op = "roundscale_ps" if e.dtype.lanes == 16 else "round_ps"
            rounded = self.x86_vector_fn(op, e.args[0], e.dtype, "_MM_FROUND_CUR_DIRECTION | _MM_FROUND_NO_EXC")
            if rounded is not None:
                return rounded
        text = self.lanewise(e.name, list(e.args), e.dtype)
        return f"{self.half_helper(e.dtype, 'round')}({text})" if e.dtype.is_half else text

    def prefetch(self, ld: Load) -> str:
        """A software prefetch of ld's cache line for reading, into L2 (locality 2: x86 prefetcht1, AArch64
        prfm pldl2keep); GPU code generators drop it."""
        return f"__builtin_prefetch(&{self.name(ld.buffer)}[{self.expr(ld.indices[0])}], 0, 2)"

    def half_round(self, e: Call) -> str:
        """float32 lanes rounded to bfloat16 (to nearest even, NaN kept quiet: `ember_f32_to_bf16`'s rule) in
        integer operations on the whole vector; float16 lane by lane (its rounding has subnormals and overflow)."""
        half = DType(next(h for h, name in HALF_ROUND.items() if name == e.name))
        x = self.expr(e.args[0])
        if e.dtype.lanes == 1:
            return f"{self.half_helper(half, 'round')}({x})"
        t, n = self.ctype(e.dtype), e.dtype.lanes
        if half.name == "float16":
            one = self.half_helper(half, "round")
            name = f"ember_round_f16_{t}"
            code = (f"static inline {t} {name}({t} f) {{\n  {t} y;\n"
                    f"  for (int l = 0; l < {n}; ++l) y[l] = {one}(f[l]);\n  return y;\n}}")  # fmt: skip
            return f"{self.helper(name, code)}({x})"
        u = self.ctype(DType("uint32", n))
        name = f"ember_round_bf16_{t}"
        code = (f"static inline {t} {name}({t} f) {{\n"
                f"  {u} x; __builtin_memcpy(&x, &f, sizeof x);\n"
                f"  {u} r = (x + 0x7fffu + ((x >> 16) & 1u)) & 0xffff0000u;\n"
                f"  {u} q = (x | 0x400000u) & 0xffff0000u;  /* a NaN stays a (quiet) NaN */\n"
                f"  {u} nan = ({u})((x & 0x7fffffffu) > 0x7f800000u);\n"
                f"  r = (r & ~nan) | (q & nan);\n"
                f"  {t} y; __builtin_memcpy(&y, &r, sizeof y); return y;\n}}")  # fmt: skip
        return f"{self.helper(name, code)}({x})"

    def half_helper(self, dt: DType, what: str) -> str:
        """ember_{f16,bf16}_{to_f32, from_f32, round}: 16-bit float storage converted in software (RNE)."""
        tag = "f16" if dt.name == "float16" else "bf16"
        for name, code in _HALF_HELPERS[tag].items():
            self.helper(name, code)
        return {"to_f32": f"ember_{tag}_to_f32", "from_f32": f"ember_f32_to_{tag}", "round": f"ember_round_{tag}"}[what]

    def cast(self, e: Cast) -> str:
        if e.dtype.is_narrow or e.value.dtype.is_narrow:
            raise CodegenError(f"C codegen: cast {e.value.dtype} -> {e.dtype}: narrow formats convert through "
                               "ember.tir.narrow.convert (te.cast), not a plain cast")  # fmt: skip
        if e.dtype.lanes == 1:
            if e.dtype.is_bool:
                return f"({self.expr(e.value)} != 0)"
            if e.dtype.is_half:
                return f"{self.half_helper(e.dtype, 'round')}((float){self.expr(e.value, 14)})"
            return f"({e.dtype.c_type}){self.expr(e.value, 14)}"
        src = e.value.dtype
        if src.is_int and src.bits == 8 and e.dtype.bits == 32 and not e.dtype.is_bool:
            return self.widen_bytes(e)
        if src.is_int and src.bits == 32 and e.dtype.is_int and e.dtype.bits == 8:
            narrow = self.narrow_to_bytes(e)
            if narrow is not None:
                return narrow
        if isinstance(e.value, Call) and e.value.name == "round" and e.dtype.name == "int32":
            rounded = self.x86_vector_fn("cvtps_epi32", e.value.args[0], e.dtype, "")
            if rounded is not None:
                return rounded
        return f"__builtin_convertvector({self.expr(e.value)}, {self.ctype(e.dtype)})"

    def x86_vector_fn(self, op: str, x: Expr, out: DType, imm: str) -> str | None:
        """_mm{512,256,}_{op}(x[, imm]) on one float32 register of AVX-512, AVX or SSE (VEX), as `out`; None where
        x is another type or the target has no such register. Rounding to int32 in one vcvtps2dq (the rounding mode
        of nearbyintf: the current one, to nearest even) and round in one vrndscaleps, where GCC compiles the
        lanes' nearbyintf into two 256-bit vroundps, a shuffle and an insert, then a truncating conversion."""
        dt, flags = x.dtype, self.target.simd_features()
        need = {16: "avx512f", 8: "avx", 4: "avx"}.get(dt.lanes)
        if dt.scalar.name != "float32" or need not in flags:
            return None
        self.helper("immintrin", "#include <immintrin.h>")
        pre, reg = {16: ("_mm512", "__m512"), 8: ("_mm256", "__m256"), 4: ("_mm", "__m128")}[dt.lanes]
        t, r = self.ctype(dt), self.ctype(out)
        name = f"ember_x86_{op}_{t}"
        body = f"return ({r}){pre}_{op}(({reg})a{', ' + imm if imm else ''});"
        return f"{self.helper(name, f'static inline {r} {name}({t} a) {{ {body} }}')}({self.expr(x)})"

    def narrow_to_bytes(self, e: Cast) -> str | None:
        """A vector of 32-bit integers to 8 bits (truncated, as C converts), in one vpmovdb on AVX-512 (16 lanes;
        8 and 4 with avx512vl). GCC 12 compiles __builtin_convertvector's narrowing lane by lane (~50 extracts
        and inserts for 16 lanes: a requantizing int8 epilogue took 3x the convolution's time). None elsewhere."""
        lanes, flags = e.dtype.lanes, self.target.simd_features()
        width = {16: "512", 8: "256", 4: ""}.get(lanes)
        if width is None or "avx512f" not in flags or (lanes < 16 and "avx512vl" not in flags):
            return None
        self.helper("immintrin", "#include <immintrin.h>")
        t32, t8 = self.ctype(e.value.dtype), self.ctype(e.dtype)
        reg = f"__m{width or '128'}i"
        name = f"ember_narrow_{t32}_{t8}"
        body = f"__m128i r = _mm{width}_cvtepi32_epi8(({reg})a); {t8} v; __builtin_memcpy(&v, &r, sizeof v); return v;"
        return f"{self.helper(name, f'static inline {t8} {name}({t32} a) {{ {body} }}')}({self.expr(e.value)})"

    def widen_bytes(self, e: Cast) -> str:
        """A vector of 8-bit integers to 32 bits (int or float: by way of int32). GCC 12 compiles the one-step
        __builtin_convertvector lane by lane (shifts and inserts, ~60 instructions for 16 lanes: a residual join's
        epilogue ran at half speed); one vpmovzxbd/vpmovsxbd on AVX-512, else two steps through 16 bits, which it
        vectorizes (8 lanes: one vpmovzxbd/vpmovsxbd on AVX2)."""
        src, lanes = e.value.dtype, e.dtype.lanes
        i32 = DType("int32", lanes)
        t8, t16, t32 = self.ctype(src), self.ctype(DType(f"{src.kind}16", lanes)), self.ctype(i32)
        name = f"ember_widen_{t8}"
        if lanes == 16 and "avx512f" in self.target.simd_features():
            self.helper("immintrin", "#include <immintrin.h>")
            cvt = "_mm512_cvtepi8_epi32" if src.kind == "int" else "_mm512_cvtepu8_epi32"
            body = f"return ({t32}){cvt}((__m128i)a);"
        elif lanes == 8 and "avx2" in self.target.simd_features():  # (a row of 56: 8 lanes; the two steps
            self.helper("immintrin", "#include <immintrin.h>")  # took 8 shuffles, an SE block's rescale)
            cvt = "_mm256_cvtepi8_epi32" if src.kind == "int" else "_mm256_cvtepu8_epi32"
            body = f"long long b; __builtin_memcpy(&b, &a, 8); return ({t32}){cvt}(_mm_cvtsi64_si128(b));"
        else:
            body = f"return __builtin_convertvector(__builtin_convertvector(a, {t16}), {t32});"
        text = f"{self.helper(name, f'static inline {t32} {name}({t8} a) {{ {body} }}')}({self.expr(e.value)})"
        return text if e.dtype == i32 else f"__builtin_convertvector({text}, {self.ctype(e.dtype)})"

    def select(self, e: Select) -> tuple[str, int]:
        if e.cond.dtype.lanes == 1:
            return f"{self.expr(e.cond, 4)} ? {self.expr(e.t, 3)} : {self.expr(e.f, 3)}", 3
        minmax = self.x86_select_minmax(e)
        if minmax is not None:
            return minmax, 15
        sel = self.vselect_helper(e.dtype)
        return f"{sel}({self.mask(e.cond, e.dtype.bits)}, {self.expr(e.t)}, {self.expr(e.f)})", 15

    def x86_select_minmax(self, e: Select) -> str | None:
        """`a < b ? b : a` (a comparison choosing one of its own operands, as the softmax's row max) on a float
        vector of exactly one AVX-512 or AVX register: one vmaxps/vminps, which has these semantics exactly when
        its operands are in the right order (the second one is returned where the comparison is false: equal,
        or unordered by a NaN). GCC makes a compare and a blend of the select (2 instructions on the row max's
        dependency chain; the softmax over 197 scores 8% slower). None for anything else."""
        c, dt = e.cond, e.dtype
        if not (isinstance(c, BinOp) and c.op in ("lt", "gt") and dt.is_float and dt.bits in (32, 64)):
            return None
        x, y = c.a, c.b
        if same(e.t, y) and same(e.f, x):  # x < y ? y : x = max(y, x); x > y ? y : x = min(y, x)
            first, second, op = y, x, "max" if c.op == "lt" else "min"
        elif same(e.t, x) and same(e.f, y):  # x < y ? x : y = min(x, y); x > y ? x : y = max(x, y)
            first, second, op = x, y, "min" if c.op == "lt" else "max"
        else:
            return None
        x86 = self.x86_float_register(dt)
        if x86 is None:
            return None
        w, sfx, reg = x86
        return f"({self.ctype(dt)})_mm{w}_{op}_{sfx}(({reg})({self.expr(first)}), ({reg})({self.expr(second)}))"

    def x86_float_register(self, dt: DType) -> tuple[str, str, str] | None:
        """(width, suffix, register type) of intrinsics on a float vector type of exactly one AVX-512 or AVX
        register of this target (including <immintrin.h>), or None."""
        flags, bits = self.target.simd_features(), dt.bits * dt.lanes
        if dt.bits not in (32, 64) or not ((bits == 512 and "avx512f" in flags) or (bits == 256 and "avx" in flags)):
            return None
        w = "512" if bits == 512 else "256"
        self.helper("immintrin", "#include <immintrin.h>")
        return w, "ps" if dt.bits == 32 else "pd", f"__m{w}" + ("" if dt.bits == 32 else "d")

    def vselect_helper(self, dt: DType) -> str:
        t = self.ctype(dt)
        m = self.mask_type(dt.bits, dt.lanes)
        name = f"ember_select_{t}"
        code = f"static inline {t} {name}({m} m, {t} a, {t} b) {{ return ({t})((({m})a & m) | (({m})b & ~m)); }}"
        return self.helper(name, code)

    def bcast(self, value: Expr, lanes: int) -> str:
        dt = value.dtype.with_lanes(lanes)
        if value.dtype.is_bool:
            raise CodegenError(f"broadcast of a boolean {value}")
        t, s = self.ctype(dt), dt.c_type
        name = f"ember_bcast_{t}"
        code = f"static inline {t} {name}({s} x) {{ return ({t}){_lanes_init(lanes, lambda l: 'x')}; }}"
        return f"{self.helper(name, code)}({self.expr(value)})"

    def ramp(self, e: Ramp) -> str:
        t, s = self.ctype(e.dtype), e.dtype.c_type
        name = f"ember_ramp_{t}"
        init = _lanes_init(e.lanes, lambda l: f"base + {l} * stride")
        code = f"static inline {t} {name}({s} base, {s} stride) {{\n  return ({t}){init};\n}}"
        return f"{self.helper(name, code)}({self.expr(e.base)}, {self.expr(e.stride)})"

    def load(self, e: Load) -> str:
        buf = self.name(e.buffer)
        if len(e.indices) != 1:
            raise CodegenError(f"load of {e.buffer.name} is not flattened")
        idx = e.indices[0]
        if e.buffer in self.registers:
            return f"{buf}_{const_offset(idx)}"
        if e.predicate is not None and idx.dtype.lanes > 1:
            mask = self.mask(e.predicate, self.access_bits(e.predicate, e.dtype))
            if isinstance(idx, Ramp) and isinstance(idx.stride, Const) and idx.stride.value == 1:
                return f"{self.masked_helper('load', e.dtype, e.predicate)}(&{buf}[{self.expr(idx.base)}], {mask})"
            return f"{self.masked_helper('gather', e.dtype, e.predicate, idx.dtype)}({buf}, {self.expr(idx)}, {mask})"
        if idx.dtype.lanes == 1 and e.buffer.dtype.is_half:
            return f"{self.half_helper(e.buffer.dtype, 'to_f32')}({buf}[{self.expr(idx)}])"
        if idx.dtype.lanes == 1:
            return f"{buf}[{self.expr(idx)}]"
        dt = e.dtype
        t, s = self.ctype(dt), dt.c_type
        if isinstance(idx, Ramp) and isinstance(idx.stride, Const) and idx.stride.value == 1:
            name = f"ember_vload_{t}"
            code = f"static inline {t} {name}(const {s}* p) {{ {t} v; __builtin_memcpy(&v, p, sizeof v); return v; }}"
            return f"{self.helper(name, code)}(&{buf}[{self.expr(idx.base)}])"
        stride = idx.stride.value if isinstance(idx, Ramp) and isinstance(idx.stride, Const) else None
        if stride == 2 and dt.lanes >= 4 and not dt.is_bool:
            return f"{self.stride2_load(dt)}(&{buf}[{self.expr(idx.base)}])"
        table = self.byte_table(e, idx)
        if table is not None:
            return table
        block = None if dt.is_bool else aligned_lanes(idx, buffer_elems(e.buffer))
        if block is not None:
            return f"{self.block_shuffle(dt, block[1])}(&{buf}[{self.expr(block[0])}])"
        hw = self.x86_gather(dt, idx.dtype)
        if hw is not None:
            return f"{hw}({buf}, {self.expr(idx)})"
        it = self.ctype(idx.dtype)
        name = f"ember_gather_{t}_{it}"
        init = _lanes_init(dt.lanes, lambda l: f"p[idx[{l}]]")
        code = f"static inline {t} {name}(const {s}* p, {it} idx) {{\n  return ({t}){init};\n}}"
        return f"{self.helper(name, code)}({buf}, {self.expr(idx)})"

    def x86_gather(self, dt: DType, idx_dt: DType) -> str | None:
        """A gather of 32-bit elements at 32-bit indices as the x86 instruction (vpgatherdd, vgatherdps): one of 16
        lanes with AVX-512F, 8-lane pieces with AVX2; None elsewhere (the generic helper builds the vector element
        by element, which GCC compiles to a load and an insert per lane)."""
        flags, n = self.target.simd_features(), dt.lanes
        if dt.bits != 32 or idx_dt.bits != 32 or not idx_dt.is_int or dt.is_bool or not (dt.is_float or dt.is_int):
            return None
        if n == 16 and "avx512f" in flags:
            piece = 16
        elif n % 8 == 0 and n <= 32 and "avx2" in flags:
            piece = 8
        else:
            return None
        self.helper("immintrin", "#include <immintrin.h>")
        t, it, s = self.ctype(dt), self.ctype(idx_dt), dt.c_type
        pt, pit = self.ctype(dt.with_lanes(piece)), self.ctype(idx_dt.with_lanes(piece))
        kind, reg = ("ps" if dt.is_float else "epi32"), f"__m{512 if piece == 16 else 256}i"
        call = (f"_mm512_i32gather_{kind}(({reg})i, p, 4)" if piece == 16
                else f"_mm256_i32gather_{kind}(({'const float' if dt.is_float else 'const int'}*)p, ({reg})i, 4)")
        name = f"ember_x86_gather_{t}_{it}"
        if n == piece:
            body = f"  {pit} i = idx;\n  return ({t}){call};"
        else:  # pieces of 8 lanes, joined
            parts = []
            for k in range(n // piece):
                lanes = ", ".join(str(k * piece + l) for l in range(piece))
                parts.append(f"  {pit} i{k} = __builtin_shufflevector(idx, idx, {lanes});\n"
                             f"  {pt} g{k}; {{ {pit} i = i{k}; g{k} = ({pt}){call}; }}")
            body = "\n".join(parts) + f"\n  {t} v;\n" + "".join(
                f"  __builtin_memcpy((char*)&v + {k * piece * 4}, &g{k}, sizeof g{k});\n" for k in range(n // piece))
            body += "  return v;"
        code = f"static inline {t} {name}(const {s}* p, {it} idx) {{\n{body}\n}}"
        return self.helper(name, code)

    def byte_table(self, e: Load, idx: Expr) -> str | None:
        """A gather of 8 to 64 bytes from a table of at least 256 at indices that are bytes themselves (an int8
        lookup table: GELU, sigmoid of quantized values) as two vpermi2b over the table's four 64-byte registers and
        a blend on the index's top bit (AVX-512 VBMI), where the generic gather loads lane by lane; None elsewhere."""
        dt, flags = e.dtype, self.target.simd_features()
        if not (dt.is_int and dt.bits == 8 and dt.lanes in (8, 16, 32, 64) and isinstance(idx, Cast)):
            return None
        src = idx.value.dtype
        if src.name != "uint8" or not e.buffer.is_static or math.prod(e.buffer.shape) < 256:
            return None
        if not {"avx512f", "avx512bw", "avx512vbmi"} <= flags:
            return None
        self.helper("immintrin", "#include <immintrin.h>")
        t, s, it = self.ctype(dt), dt.c_type, self.ctype(src)
        name = f"ember_table256_{t}"
        code = (f"static inline {t} {name}(const {s}* p, {it} i) {{\n"
                "  const __m512i t0 = _mm512_loadu_si512(p), t1 = _mm512_loadu_si512(p + 64);\n"
                "  const __m512i t2 = _mm512_loadu_si512(p + 128), t3 = _mm512_loadu_si512(p + 192);\n"
                "  __m512i x = _mm512_setzero_si512(); __builtin_memcpy(&x, &i, sizeof i);\n"
                "  const __m512i lo = _mm512_permutex2var_epi8(t0, x, t1), hi = _mm512_permutex2var_epi8(t2, x, t3);\n"
                "  const __m512i r = _mm512_mask_blend_epi8(_mm512_movepi8_mask(x), lo, hi);\n"
                f"  {t} v; __builtin_memcpy(&v, &r, sizeof v); return v;\n}}")  # fmt: skip
        return f"{self.helper(name, code)}({self.name(e.buffer)}, {self.expr(idx.value)})"

    def mask(self, pred: Expr, bits: int | None = None) -> str:
        """A vector mask as C: a literal where its lanes are constant (a tile's tail: the compiler folds it into the
        masked move), else the comparison; as `bits`-wide lanes where given (converted: a comparison of int32
        indices selecting bytes)."""
        lanes = lane_mask(pred)
        own = mask_bits(pred)
        if lanes is None:
            if bits is None or own is None or bits == own:
                return self.expr(pred)
            return f"__builtin_convertvector({self.expr(pred)}, {self.mask_type(bits, pred.dtype.lanes)})"
        m = self.mask_type(bits or own or 32, len(lanes))
        return f"({m}){_lanes_init(len(lanes), lambda i: '-1' if lanes[i] else '0')}"

    @staticmethod
    def access_bits(pred: Expr, dt: DType) -> int:
        """The lane width of the mask of a masked access of dt: the predicate's own, or dt's where the predicate's
        lanes would span more than one 512-bit register (64 bytes under int32 index comparisons)."""
        bits = mask_bits(pred) or dt.bits
        return dt.bits if bits > dt.bits and bits * dt.lanes > 512 else bits

    def masked_helper(self, kind: str, dt: DType, pred: Expr, idx_dt: DType | None = None) -> str:
        """The helper of a masked vector access (`kind`: load, store, gather, scatter) of type dt under mask `pred`
        (a vector comparison: an integer vector of -1/0 lanes): only the lanes where it is set are read (the others
        are zero) or written. Contiguous accesses to one AVX-512 register (or a 256- or 128-bit one with avx512vl) of
        32- or 64-bit elements, or of 8- or 16-bit ones with avx512bw (an int8 epilogue's last, partial vector of
        bytes), are one masked move; otherwise a loop over the lanes."""
        t, s, n = self.ctype(dt), dt.c_type, dt.lanes
        bits = self.access_bits(pred, dt)
        m = self.mask_type(bits, n)
        flags, width = self.target.simd_features(), dt.bits * n
        mwidth = bits * n  # the mask's register: as wide as the data's, or wider (bytes stored under int32 lanes)
        need = {"avx512f"} | ({"avx512vl"} if min(width, mwidth) < 512 else set()) | (
            {"avx512bw"} if min(dt.bits, bits) < 32 else set())
        plain = not dt.is_bool and (dt.is_int or dt.bits >= 32) and dt.bits in (8, 16, 32, 64)  # (not half, fp8)
        x86 = (kind in ("load", "store") and plain and bits in (8, 16, 32, 64) and width in (128, 256, 512)
               and mwidth in (128, 256, 512) and need <= flags)
        it = self.ctype(idx_dt) if idx_dt is not None else ""
        name = f"ember_v{kind}_masked_{t}" + (f"_{it}" if it else "") + ("" if bits == dt.bits else f"_{m}")
        at = "p[idx[l]]" if it else "p[l]"
        if x86:
            self.helper("immintrin", "#include <immintrin.h>")
            w, el = ("" if width == 128 else str(width)), f"epi{dt.bits}"
            reg, mreg = f"__m{width}i", f"__m{mwidth}i"
            k = f"_mm{'' if mwidth == 128 else mwidth}_test_epi{bits}_mask(({mreg})m, ({mreg})m)"
            if kind == "load":
                body = f"return ({t})_mm{w}_maskz_loadu_{el}({k}, p);"
                code = f"static inline {t} {name}(const {s}* p, {m} m) {{ {body} }}"
            else:
                body = f"_mm{w}_mask_storeu_{el}(p, {k}, ({reg})v);"
                code = f"static inline void {name}({s}* p, {t} v, {m} m) {{ {body} }}"
        elif kind in ("load", "gather"):
            extra = f", {it} idx" if it else ""
            code = (f"static inline {t} {name}(const {s}* p{extra}, {m} m) {{\n  {t} v = {{0}};\n"
                    f"  for (int l = 0; l < {n}; ++l) if (m[l]) v[l] = {at};\n  return v;\n}}")  # fmt: skip
        else:
            extra = f", {it} idx" if it else ""
            code = (f"static inline void {name}({s}* p{extra}, {t} v, {m} m) {{\n"
                    f"  for (int l = 0; l < {n}; ++l) if (m[l]) {at} = v[l];\n}}")  # fmt: skip
        return self.helper(name, code)

    def block_shuffle(self, dt: DType, lanes: list[int]) -> str:
        """A helper loading the aligned block of dt.lanes elements at p and taking its lanes in the order `lanes`
        (`ember.codegen.lanes.aligned_lanes`: a grouped convolution's channels repeated per group), one vector load
        and one constant shuffle in place of a gather."""
        t, s, n = self.ctype(dt), dt.c_type, dt.lanes
        name = f"ember_vload_{t}_" + "_".join(map(str, lanes))
        it = self.mask_type(dt.bits, n)
        order = ", ".join(map(str, lanes))
        code = (f"static inline {t} {name}(const {s}* p) {{\n"
                f"  {t} a;\n  __builtin_memcpy(&a, p, sizeof a);\n{_shuffle_return('a', None, order, it)}}}")
        return self.helper(name, code)

    def stride2_load(self, dt: DType) -> str:
        """A helper loading the even elements p[0], p[2], ..., p[2(L-1)] as a vector of L lanes: two contiguous loads
        (the second ending at the last element read: nothing past it is touched) and one two-input shuffle, in place
        of a gather (a window of stride 2 read along a row: pooling and convolutions in NCHW)."""
        t, s, n = self.ctype(dt), dt.c_type, dt.lanes
        name = f"ember_vload_stride2_{t}"
        flags = self.target.simd_features()
        if dt.is_int and dt.bits == 8 and n in (8, 16, 32) and {"avx512bw", "avx512vl"} <= flags:
            # bytes: the 2n - 1 bytes from p as n 16-bit words (a masked load: nothing past the last element is
            # touched), narrowed to their low bytes (vpmovwb); GCC compiled the shuffle of bytes lane by lane
            self.helper("immintrin", "#include <immintrin.h>")
            w = {8: "", 16: "256", 32: "512"}[n]
            reg, load = f"__m{w or 128}i", f"_mm{w}_maskz_loadu_epi8"
            narrow = {8: "_mm_cvtepi16_epi8", 16: "_mm256_cvtepi16_epi8", 32: "_mm512_cvtepi16_epi8"}[n]
            k = f"0x{(1 << (2 * n - 1)) - 1:x}ULL"
            code = (f"static inline {t} {name}(const {s}* p) {{\n  const {reg} w = {load}({k}, p);\n"
                    f"  const __m{max(n * 8, 128)}i b = {narrow}(w);\n"
                    f"  {t} v; __builtin_memcpy(&v, &b, sizeof v); return v;\n}}")  # fmt: skip
            return self.helper(name, code)
        it = self.mask_type(dt.bits, n)
        lanes = [2 * j if 2 * j < n else 2 * j + 1 for j in range(n)]
        order = ", ".join(map(str, lanes))
        code = (f"static inline {t} {name}(const {s}* p) {{\n"
                f"  {t} a, b;\n  __builtin_memcpy(&a, p, sizeof a);\n  __builtin_memcpy(&b, p + {n - 1}, sizeof b);\n"
                f"{_shuffle_return('a', 'b', order, it)}}}")  # fmt: skip
        return self.helper(name, code)

    # -- statements --------------------------------------------------------------------------
    def emit(self, line: str) -> None:
        self.lines.append("  " * self.indent + line)

    def block(self, s: Stmt) -> None:
        self.indent += 1
        self.stmt(s)
        self.indent -= 1

    def stmt(self, s: Stmt) -> None:
        if isinstance(s, Seq):
            for x in s.stmts:
                self.stmt(x)
        elif isinstance(s, For):
            self.loop(s)
        elif isinstance(s, Store):
            self.store(s)
        elif isinstance(s, IfThenElse):
            self.emit(f"if ({self.expr(s.cond)}) {{")
            self.block(s.then_case)
            if s.else_case is not None:
                self.emit("} else {")
                self.block(s.else_case)
            self.emit("}")
        elif isinstance(s, LetStmt):
            self.emit(f"const {self.ctype(s.value.dtype)} {self.name(s.var)} = {self.expr(s.value)};")
            lo, hi = self.ana.bounds(s.value) if s.value.dtype.is_int and s.value.dtype.lanes == 1 else (None, None)
            with self.ana.scope(s.var, lo, hi):
                self.stmt(s.body)
        elif isinstance(s, Allocate):
            self.allocate(s)
        elif isinstance(s, Evaluate):
            if not isinstance(s.value, Const):
                self.emit(f"(void)({self.expr(s.value)});")
        else:
            raise CodegenError(f"C codegen: unsupported statement {type(s).__name__}")

    def loop(self, s: For) -> None:
        if s.kind is ForKind.THREAD_BINDING:
            raise CodegenError(
                f"loop '{s.var.name}' is bound to {s.thread_tag}, which needs a GPU target (cuda, opencl), "
                f"not {self.target.kind}"
            )
        v = self.name(s.var)
        t = s.var.dtype.c_type
        lo = self.expr(s.min)
        end = self.expr(self.ana.simplify(s.min + s.extent))
        parallel_here = s.kind is ForKind.PARALLEL and not self.in_parallel
        small = parallel_here and self.target.kind == "c" and self.too_small(s)
        parallel_here = parallel_here and not small
        for key, value in s.annotations:
            if key == "vectorize_fallback":
                self.emit(f"// not vectorized: {value}")
            elif key == "unroll":
                self.emit(f"#pragma GCC unroll {int(value)}")
            elif key == "ivdep":
                self.emit("#pragma GCC ivdep")
            elif key == "simd":
                self.emit("#pragma omp simd")
            else:
                self.emit(f"// pragma {key}={value}")
        if parallel_here and self.target.kind == "c":
            inputs = self.region_inputs(s)
            if inputs is not None:
                self.parallel_region(s, *inputs)
                return
        if parallel_here:  # a GPU renderer drops the pragma; C: a region reading registers of the enclosing code
            threads = f" num_threads({self.target.threads})" if self.target.threads else ""
            self.emit(f"#pragma omp parallel for schedule(dynamic, {self.chunk(s)}){threads}")
        elif small:
            self.emit("// parallel loop with little work: runs serially (a region would cost more than it saves)")
        elif s.kind is ForKind.PARALLEL:
            self.emit("// parallel loop nested in a parallel loop: runs serially")
        elif s.kind is ForKind.UNROLLED:
            n = s.extent.value if isinstance(s.extent, Const) else self.ana.const_upper_bound(s.extent)
            if n is not None and 0 <= n < 65535:  # a symbolic extent unrolls by its bound (min(N, 12): 12)
                self.emit(f"#pragma GCC unroll {n}")
        self.emit(f"for ({t} {v} = {lo}; {v} < {end}; ++{v}) {{")
        lb, hb = self.ana.bind_loop(s.var, s.min, s.extent)
        was = self.in_parallel
        self.in_parallel = was or parallel_here
        with self.ana.scope(s.var, lb, hb):
            self.block(s.body)
        self.in_parallel = was
        self.emit("}")

    # -- parallel loops: regions run by the thread pool (codegen/c_pool.py) -------------------------------
    def chunk(self, s: For) -> int:
        """Iterations per chunk of a parallel loop: enough work to pay for taking a chunk (CHUNK_WORK stores), but
        at least CHUNKS_PER_THREAD chunks per thread where the loop has that many iterations, so that a thread
        slowed down (a core shared with another process) leaves little work for the others to wait for."""
        n = s.extent.value if isinstance(s.extent, Const) else self.ana.const_upper_bound(s.extent)
        per_iteration = max(1, _stores(s.body, self.ana))
        chunk = -(-CHUNK_WORK // per_iteration)
        if n is not None:
            chunk = min(chunk, n // (CHUNKS_PER_THREAD * max(self.target.threads or 0, 2)))
        return max(1, chunk)

    def too_small(self, s: For) -> bool:
        """Whether a parallel loop does too little work in all (fewer than PARALLEL_MIN_WORK stores, at its constant
        extent or bound) to pay for a region: waking a worker, and on a core shared with another process its time
        slice, costs more than the few microseconds splitting it saves."""
        n = s.extent.value if isinstance(s.extent, Const) else self.ana.const_upper_bound(s.extent)
        return n is not None and n * max(1, _stores(s.body, self.ana)) < PARALLEL_MIN_WORK

    def region_inputs(self, s: For) -> tuple[list[Var], list[Buffer]] | None:
        """The variables and buffers of the enclosing function that a parallel loop's body uses (its closure), or
        None where it reads register variables of the enclosing code (then it stays an OpenMP loop)."""
        nodes = list(walk(s.body))
        bound = {id(n.var) for n in nodes if isinstance(n, For | LetStmt)} | {id(s.var)}
        allocated = {id(n.buffer) for n in nodes if isinstance(n, Allocate)}
        sizes = [x for n in nodes if isinstance(n, Allocate) and isinstance(n.buffer.size, Expr)
                 for x in walk(n.buffer.size)]  # fmt: skip
        variables: dict[int, Var] = {}
        buffers: dict[int, Buffer] = {}
        for n in nodes + sizes:
            if isinstance(n, Var) and id(n) not in bound:
                variables.setdefault(id(n), n)
            elif isinstance(n, Load | Store) and id(n.buffer) not in allocated:
                buffers.setdefault(id(n.buffer), n.buffer)
        if any(b in self.registers for b in buffers.values()):
            return None
        return list(variables.values()), list(buffers.values())

    def parallel_region(self, s: For, variables: list[Var], buffers: list[Buffer]) -> None:
        """The loop's body becomes `static void F_parK(void* closure, int64_t begin, int64_t end)` over its
        iterations [begin, end), emitted before the function; the loop becomes a call of `ember_parallel_for`."""
        region = f"{self.func_name}_par{len(self.regions) + 1}"
        self.taken.add(region)
        stored = {id(n.buffer) for n in walk(s.body) if isinstance(n, Store)}
        ptr = {id(b): f"{'' if id(b) in stored else 'const '}{b.dtype.c_type}*" for b in buffers}
        fields = [f"{self.ctype(v.dtype)} {self.name(v)};" for v in variables]
        fields += [f"{ptr[id(b)]} {self.name(b)};" for b in buffers] + ["int32_t* ember_status;"]
        unpack = [f"const {self.ctype(v.dtype)} {self.name(v)} = ember_closure->{self.name(v)};" for v in variables]
        unpack += [f"{ptr[id(b)]} restrict {self.name(b)} = ember_closure->{self.name(b)};" for b in buffers]
        outer_lines, outer_indent = self.lines, self.indent
        self.lines, self.indent = [], 1
        v, t = self.name(s.var), s.var.dtype.c_type
        self.emit(f"for ({t} {v} = ({t})ember_begin; {v} < ({t})ember_end; ++{v}) {{")
        lb, hb = self.ana.bind_loop(s.var, s.min, s.extent)
        self.in_parallel = True
        with self.ana.scope(s.var, lb, hb):
            self.block(s.body)
        self.in_parallel = False
        self.emit("}")
        body, self.lines, self.indent = self.lines, outer_lines, outer_indent
        self.regions.append("\n".join([
            f"struct {region} {{", *("  " + f for f in fields), "};",
            f"static void {region}(void* ember_arg, int64_t ember_begin, int64_t ember_end) {{",
            f"  const struct {region}* ember_closure = (const struct {region}*)ember_arg;",
            *("  " + u for u in unpack), "  int32_t ember_status = 0;", *body,
            "  if (ember_status != 0) *ember_closure->ember_status = ember_status;", "}", "",
        ]))  # fmt: skip
        values = [f".{self.name(v)} = {self.name(v)}" for v in variables]
        values += [f".{self.name(b)} = {self.name(b)}" for b in buffers]
        self.emit("{")
        self.emit(f"  struct {region} {region}_closure = {{{', '.join([*values, '.ember_status = &ember_status'])}}};")
        end = self.expr(self.ana.simplify(s.min + s.extent))
        self.helper("ember_parallel_for", POOL_DECL)  # defined once per library, with the threads API
        self.emit(f"  ember_parallel_for({region}, &{region}_closure, {self.expr(s.min)}, {end}, {self.chunk(s)}, "
                  f"{self.target.threads or 0});")  # fmt: skip
        self.emit("}")

    def store(self, s: Store) -> None:
        self.written.add(s.buffer)
        buf = self.name(s.buffer)
        if len(s.indices) != 1:
            raise CodegenError(f"store to {s.buffer.name} is not flattened")
        idx = s.indices[0]
        value = self.expr(s.value)
        if s.buffer in self.registers and s.predicate is not None:
            reg = f"{buf}_{const_offset(idx)}"
            mask = self.mask(s.predicate, s.value.dtype.bits)
            self.emit(f"{reg} = {self.vselect_helper(s.value.dtype)}({mask}, {value}, {reg});")
            return
        if s.buffer in self.registers:
            self.emit(f"{buf}_{const_offset(idx)} = {value};")
            return
        if s.predicate is not None and idx.dtype.lanes > 1:
            dt, mask = s.value.dtype, self.mask(s.predicate, self.access_bits(s.predicate, s.value.dtype))
            if isinstance(idx, Ramp) and isinstance(idx.stride, Const) and idx.stride.value == 1:
                helper = self.masked_helper("store", dt, s.predicate)
                self.emit(f"{helper}(&{buf}[{self.expr(idx.base)}], {value}, {mask});")
            else:
                helper = self.masked_helper("scatter", dt, s.predicate, idx.dtype)
                self.emit(f"{helper}({buf}, {self.expr(idx)}, {value}, {mask});")
            return
        if idx.dtype.lanes == 1 and s.buffer.dtype.is_half:
            self.emit(f"{buf}[{self.expr(idx)}] = {self.half_helper(s.buffer.dtype, 'from_f32')}({value});")
            return
        if idx.dtype.lanes == 1:
            self.emit(f"{buf}[{self.expr(idx)}] = {value};")
            return
        dt = s.value.dtype
        t, sc = self.ctype(dt), dt.c_type
        if isinstance(idx, Ramp) and isinstance(idx.stride, Const) and idx.stride.value == 1:
            name = f"ember_vstore_{t}"
            code = f"static inline void {name}({sc}* p, {t} v) {{ __builtin_memcpy(p, &v, sizeof v); }}"
            self.emit(f"{self.helper(name, code)}(&{buf}[{self.expr(idx.base)}], {value});")
            return
        it = self.ctype(idx.dtype)
        name = f"ember_scatter_{t}_{it}"
        code = (
            f"static inline void {name}({sc}* p, {it} idx, {t} v) {{\n"
            f"  for (int l = 0; l < {dt.lanes}; ++l) p[idx[l]] = v[l];\n}}"
        )
        self.emit(f"{self.helper(name, code)}({buf}, {self.expr(idx)}, {value});")

    def allocate(self, s: Allocate) -> None:
        b = s.buffer
        name, t = self.name(b), b.dtype.c_type
        self.emit(f"// {b.name}: {b.dtype}[{', '.join(map(str, b.shape))}], {b.scope}")
        slots = register_slots(s) if b.scope == "local" else None
        if slots is not None:  # every access at a constant offset: one variable per slot, kept in registers
            self.emit("{")
            self.indent += 1
            for base, lanes in sorted(slots.items()):
                var = f"{name}_{base}"
                self.taken.add(var)
                self.emit(f"{self.ctype(b.dtype.with_lanes(lanes))} {var};")
            self.registers[b] = name
            self.stmt(s.body)
            del self.registers[b]
            self.indent -= 1
            self.emit("}")
            return
        if b.is_static and b.nbytes <= STACK_LIMIT:
            self.emit("{")
            self.indent += 1
            self.emit(f"{t} {name}[{max(b.size, 1)}] __attribute__((aligned(64)));")
            self.stmt(s.body)
            self.indent -= 1
            self.emit("}")
            return
        if b.is_static:
            nbytes = str(-(-b.nbytes // 64) * 64)
        else:  # symbolic size: bytes computed from the size arguments
            size = self.expr(Cast(int64, b.size) if isinstance(b.size, Expr) else Const(b.size, int64))
            nbytes = f"(({size}) * {b.dtype.itemsize} + 63) / 64 * 64 + 64"
        self.emit("{")  # a scope of its own: a loop partitioned into straight code may allocate the buffer twice
        self.indent += 1
        self.helper("ember_scratch", SCRATCH)
        self.emit(f"{t}* restrict {name} = ({t}*)ember_scratch_alloc({nbytes});")
        self.emit(f"if ({name} == NULL) {{")
        self.emit("  ember_status = -1;")
        self.emit("} else {")
        self.block(s.body)
        self.emit(f"  ember_scratch_free({name});")
        self.emit("}")
        self.indent -= 1
        self.emit("}")

    # -- function ----------------------------------------------------------------------------
    def function(self, f: PrimFunc) -> str:
        self.func_name = _ident(f.name)
        self.taken.add(self.func_name)
        for p in f.params:
            self.name(p)
        sizes = size_params(f.params)  # symbolic sizes: int64 arguments after the buffers
        for v in sizes:
            self.name(v)
        self.ana.bind_sizes(sizes)  # sizes known >= 0: their quotients are plain C divisions
        self.stmt(f.body)
        body = self.lines
        params = []
        for p in f.params:
            const_ = "" if p in self.written else "const "
            params.append(f"{const_}{p.dtype.c_type}* restrict {self.name(p)}")
        params += [f"{v.dtype.c_type} {self.name(v)}" for v in sizes]
        sig = f"int32_t {_ident(f.name)}({', '.join(params) or 'void'})"
        self.signature = sig
        doc = [
            f"// {f.name}(" + ", ".join(f"{p.name}: {p.dtype}[{', '.join(map(str, p.shape))}]" for p in f.params) + ")"
        ]
        head = [*self.regions, *doc, sig + " {", "  int32_t ember_status = 0;"]
        return "\n".join([*head, *body, "  return ember_status;", "}"])


_HALF_HELPERS = {
    "f16": {
        "ember_f16_to_f32": """static inline float ember_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
  if (e == 0) {  /* zero or subnormal: m * 2^-24 */
    float f = (float)m * 5.9604644775390625e-8f;
    return sign ? -f : f;
  }
  bits = e == 31 ? (sign | 0x7f800000u | (m << 13)) : (sign | ((e + 112u) << 23) | (m << 13));
  float f;
  memcpy(&f, &bits, 4);
  return f;
}""",
        "ember_f32_to_f16": """static inline uint16_t ember_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  /* rounds to infinity */
  if (ax < 0x38800000u) {  /* below the smallest normal: a multiple of 2^-24, rounded half to even */
    float v;
    memcpy(&v, &ax, 4);
    return (uint16_t)(sign | (uint32_t)nearbyintf(v * 16777216.0f));
  }
  return (uint16_t)(sign | ((ax + 0xfffu + ((ax >> 13) & 1u) - 0x38000000u) >> 13));
}""",
        "ember_round_f16": "static inline float ember_round_f16(float f) {\n"
        "  return ember_f16_to_f32(ember_f32_to_f16(f));\n}",
    },
    "bf16": {
        "ember_bf16_to_f32": """static inline float ember_bf16_to_f32(uint16_t h) {
  uint32_t b = (uint32_t)h << 16;
  float f;
  memcpy(&f, &b, 4);
  return f;
}""",
        "ember_f32_to_bf16": """static inline uint16_t ember_f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);  /* quiet NaN */
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}""",
        "ember_round_bf16": "static inline float ember_round_bf16(float f) {\n"
        "  return ember_bf16_to_f32(ember_f32_to_bf16(f));\n}",
    },
}


def _lanes_init(lanes: int, lane: Callable[[int], str]) -> str:
    """A vector initializer {lane(0), lane(1), ...}: GCC turns it into one broadcast/insert sequence,
    where a loop over lanes can become one masked instruction per lane."""
    return "{" + ", ".join(lane(i) for i in range(lanes)) + "}"


def _shuffle_return(a: str, b: str | None, order: str, it: str) -> str:
    """The `return` of a helper's constant shuffle of vector a (and b: lanes past a's count index into b), for clang
    (`__builtin_shufflevector`) and GCC (`__builtin_shuffle` with a mask vector of type `it`)."""
    second = b or a
    gcc = f"{a}, {b}" if b else a
    return (f"#if defined(__clang__)\n  return __builtin_shufflevector({a}, {second}, {order});\n#else\n"
            f"  return __builtin_shuffle({gcc}, ({it}){{{order}}});\n#endif\n")


def const_offset(idx: Expr) -> int | None:
    """The element offset of a constant index (or a contiguous ramp from a constant base); None otherwise."""
    if isinstance(idx, Const):
        return int(idx.value)
    if (
        isinstance(idx, Ramp)
        and isinstance(idx.base, Const)
        and isinstance(idx.stride, Const)
        and idx.stride.value == 1
    ):
        return int(idx.base.value)
    return None


def register_slots(s: Allocate, max_slots: int = 64) -> dict[int, int] | None:
    """{offset: lanes} when every access to the buffer is at a constant offset with one width per offset
    and slots do not overlap; None otherwise."""
    slots: dict[int, int] = {}
    for n in walk(s.body):
        if isinstance(n, Call) and n.name == ADDRESS and n.args[0].buffer is s.buffer:
            return None  # an intrinsic reads and writes it through a pointer
        if isinstance(n, Load | Store) and n.buffer is s.buffer:
            idx = n.indices[0] if len(n.indices) == 1 else None
            off = None if idx is None else const_offset(idx)
            if off is None:
                return None
            lanes = idx.dtype.lanes  # type: ignore[union-attr]
            if slots.setdefault(off, lanes) != lanes:
                return None
    if not slots or len(slots) > max_slots:
        return None
    end = -1
    for off in sorted(slots):
        if off <= end:
            return None
        end = off + slots[off] - 1
    return slots


PRELUDE = """\
// Generated by Ember. Compile with a C11 compiler (GNU extensions for vector types) and pthreads.
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
"""

THREADS_API = POOL_SOURCE


def _stores(s: Stmt, ana: Analyzer) -> int:
    """About how many stores one run of `s` does (loops at their constant extent or bound, else 16 iterations;
    a conditional at its larger branch): the work of a parallel loop's iteration. A vector store or load at lanes
    that are not contiguous (a gather, a scatter: one access per lane) counts its lanes: an attention kernel's
    packing of K, a transpose by 32-lane gathers, counted as one store per vector, ran serially."""
    if isinstance(s, Store):
        return 1 + sum(_lane_by_lane(n) for n in walk(s) if isinstance(n, Load | Store))
    if isinstance(s, Seq):
        return sum(_stores(x, ana) for x in s.stmts)
    if isinstance(s, For):
        n = s.extent.value if isinstance(s.extent, Const) else ana.const_upper_bound(s.extent)
        return (n if n is not None and n > 0 else 16) * _stores(s.body, ana)
    if isinstance(s, IfThenElse):
        return max(_stores(s.then_case, ana), _stores(s.else_case, ana) if s.else_case is not None else 0)
    if isinstance(s, LetStmt | Allocate):
        return _stores(s.body, ana)
    if isinstance(s, Evaluate) and isinstance(s.value, Call) and s.value.name in INTRINSICS:
        return _intrinsic_work(s.value)
    return 1 if isinstance(s, Evaluate) else 0


def _lane_by_lane(access: Load | Store) -> int:
    """The lanes of a vector access that runs one lane at a time (indices not a unit-stride ramp), else 0."""
    if len(access.indices) != 1 or access.indices[0].dtype.lanes == 1:
        return 0
    idx = access.indices[0]
    unit = isinstance(idx, Ramp) and isinstance(idx.stride, Const) and idx.stride.value in (1, 2)
    return 0 if unit else idx.dtype.lanes


def _intrinsic_work(call: Call) -> int:
    """A tensorized micro-kernel call's work in vector instructions: m x n / 16 x k steps (its dot products; a call
    over a 7 x 7 image's whole K is tens of thousands, not the one store it was counted as, which kept
    ResNet-50's 2048 -> 512 and 1024 -> 256 int8 convolutions serial at 2 threads)."""
    m, n, k = (const_value(a) for a in call.args[6:9])
    if not all(isinstance(v, int) for v in (m, n, k)):
        return 1
    return max(1, m * -(-n // 16) * k)


def codegen_c(funcs: PrimFunc | list[PrimFunc], target: Target | str = "c", threads_api: bool = True) -> str:
    """The C source of a module holding the given functions."""
    return codegen_c_unit(funcs, target, threads_api)[0]


def codegen_c_unit(
    funcs: PrimFunc | list[PrimFunc], target: Target | str = "c", threads_api: bool = True
) -> tuple[str, list[str]]:
    """(C source of a translation unit holding the functions, their prototypes for other units)."""
    parts = codegen_c_parts(funcs, target)
    return assemble_c([parts], threads_api), parts.protos


@dataclass(frozen=True)
class CParts:
    """The pieces of a translation unit: vector typedefs and `static inline` helpers by name, function bodies and
    their prototypes. Units that share helpers are joined by `assemble_c`, which writes each name once."""

    types: dict[str, str]
    helpers: dict[str, str]
    bodies: list[str]
    protos: list[str]


def codegen_c_parts(funcs: PrimFunc | list[PrimFunc], target: Target | str = "c") -> CParts:
    """The typedefs, helpers, bodies and prototypes of the given functions."""
    target = Target.parse(target)
    funcs = [funcs] if isinstance(funcs, PrimFunc) else list(funcs)
    types: dict[str, str] = {}
    helpers: dict[str, str] = {}
    bodies, protos = [], []
    for f in funcs:
        g = CCodegen(target)
        bodies.append(g.function(f))
        protos.append(g.signature + ";")
        types.update(g.vec_types)
        helpers.update(g.helpers)
    return CParts(types, helpers, bodies, protos)


def assemble_c(parts: Sequence[CParts], threads_api: bool = True) -> str:
    """One translation unit: the prelude, every typedef and helper once, the threads API, then every body."""
    types = {k: v for p in parts for k, v in p.types.items()}
    helpers = {k: v for p in parts for k, v in p.helpers.items()}
    out = [PRELUDE]
    if types:
        out.append("\n".join(types.values()) + "\n")
    if helpers:
        out.append("\n".join(helpers.values()) + "\n")
    if threads_api:
        out.append(THREADS_API)
    out += [b + "\n" for b in (b for p in parts for b in p.bodies)]
    return "\n".join(out)
