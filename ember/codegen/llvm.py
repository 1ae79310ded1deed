"""LLVM IR from the loop IR (llvmlite), JIT-compiled for the host CPU, or compiled for another machine.

Needs no C compiler: `ember.build(s, args, target="llvm")` works where gcc is missing. A target of another
machine (`"llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"`) is compiled to an object for its triple, CPU and
features (`shared_library`) and linked into a shared library by its cross compiler (`toolchain.link_object`).

- Each PrimFunc becomes `i32 name(ptr noalias A, ptr noalias B, ...)` returning 0, or -1 when a heap
  allocation failed (as the C target's functions do).
- Vectorized loops arrive as vector expressions (Ramp, Broadcast, vector Load/Store) and become LLVM
  vector types `<N x float>`; contiguous accesses are single vector loads/stores, others per-lane.
- Floating point follows C with GCC's defaults (`contract`: a*b+c may become one FMA). The target
  option `-fastmath` (`"llvm -fastmath"`) sets LLVM's `fast` flags instead.
- A parallel loop is outlined into `void region(ptr closure, i64 begin, i64 end)` whose closure holds
  the buffers and variables it uses; `ember_parallel_for` (LLVM IR in `RUNTIME_IR`, linked into every
  module) splits [0, n) into one static chunk per thread and hands the region to the process's persistent
  thread pool (`codegen.llvm_pool`, LLVM IR over pthreads): chunk 0 runs on the calling thread, chunk k on
  pool worker k, created on the first region that needs it and then kept, spinning briefly after each region
  and sleeping on a condition variable when idle. A region costs a wake-up, not a thread creation. A
  parallel loop inside a parallel loop runs serially (in codegen; at run time, a region that finds the pool
  busy, from a nested call or another host thread, runs serially on its own thread). The thread count is the
  module global `ember_num_threads` (`Module.set_num_threads`); the pool grows when it is raised.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..target import Target, TargetError
from ..te.intrin import PREFETCH
from ..templates.nn import EXP_LOW
from ..tir.arith import Analyzer
from ..tir.dtype import DType, float32, int32, int64
from ..tir.expr import BinOp, Broadcast, Call, Cast, Const, Expr, Load, Not, Ramp, Select, Var
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
)
from . import llvm_pool
from .c import STACK_LIMIT, CodegenError, c_symbol, const_offset, register_slots
from .lanes import aligned_lanes, buffer_elems
from .toolchain import cache_dir, link_object, touch
from .vmath import EXP16_C1, EXP16_C2, EXP16_Q, EXP_C1, EXP_C2, EXP_POLY, wants_arithmetic_exp

try:  # llvmlite is the optional extra `ember[llvm]`
    import llvmlite.binding as llvm
    import llvmlite.ir as ir
except ImportError:  # pragma: no cover - exercised where llvmlite is missing
    llvm = ir = None  # type: ignore[assignment]

MAX_THREADS = 64

# intrinsic -> LLVM intrinsic (vector-capable), else libm names (float32, float64) called per lane
_LLVM_MATH = {"exp": "llvm.exp", "log": "llvm.log", "sqrt": "llvm.sqrt", "floor": "llvm.floor", "ceil": "llvm.ceil",
              "abs": "llvm.fabs", "round": "llvm.nearbyint", "sin": "llvm.sin", "cos": "llvm.cos",
              "pow": "llvm.pow"}  # fmt: skip
_LIBM = {"tanh": ("tanhf", "tanh"), "erf": ("erff", "erf"), "tan": ("tanf", "tan"), "asin": ("asinf", "asin"),
         "acos": ("acosf", "acos"), "atan": ("atanf", "atan"), "sinh": ("sinhf", "sinh"), "cosh": ("coshf", "cosh"),
         "asinh": ("asinhf", "asinh"), "acosh": ("acoshf", "acosh"), "atanh": ("atanhf", "atanh"),
         "log1p": ("log1pf", "log1p"), "fmod": ("fmodf", "fmod")}  # fmt: skip

_CMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}

RUNTIME_IR = r"""
@ember_num_threads = global i32 1

declare void @ember_pool_run(ptr, ptr, i64, i64)

; fn(closure, begin, end) over [0, n): on min(ember_num_threads, n, 64) threads of the process's pool
define void @ember_parallel_for(ptr %fn, ptr %closure, i64 %n) {
entry:
  %nt32 = load i32, ptr @ember_num_threads
  %nt0 = sext i32 %nt32 to i64
  %c1 = icmp slt i64 %nt0, %n
  %nt1 = select i1 %c1, i64 %nt0, i64 %n
  %c2 = icmp slt i64 %nt1, 64
  %nt = select i1 %c2, i64 %nt1, i64 64
  %serial = icmp sle i64 %nt, 1
  br i1 %serial, label %alone, label %pool
alone:
  call void %fn(ptr %closure, i64 0, i64 %n)
  ret void
pool:
  call void @ember_pool_run(ptr %fn, ptr %closure, i64 %n, i64 %nt)
  ret void
}
"""


def available() -> bool:
    return llvm is not None


def _require() -> None:
    if llvm is None:
        raise ImportError("the llvm target needs llvmlite: pip install 'ember[llvm]' (or pip install llvmlite)")


@functools.cache
def _init() -> None:
    _require()
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


# -- types -------------------------------------------------------------------------------------


def ltype(dt: DType):
    """The LLVM register type of a dtype (bool is i1)."""
    if dt.is_bool:
        t = ir.IntType(1)
    elif dt.is_float:
        if dt.is_half:
            raise NotImplementedError(f"{dt.name} is not supported by the llvm target yet (use target 'c')")
        t = ir.FloatType() if dt.bits == 32 else ir.DoubleType()
    else:
        t = ir.IntType(dt.bits)
    return t if dt.lanes == 1 else ir.VectorType(t, dt.lanes)


def mtype(dt: DType):
    """The LLVM memory type of one element (bool is a byte)."""
    return ir.IntType(8) if dt.is_bool else ltype(dt.scalar)


@dataclass
class _FnState:
    """What the generator needs while it emits one LLVM function."""

    fn: Any
    builder: Any
    entry: Any  # builder at the top of the entry block: allocas go there (hoisted out of loops)
    vars: dict[Var, Any] = field(default_factory=dict)
    bufs: dict[Buffer, Any] = field(default_factory=dict)
    slots: dict[Buffer, dict[int, Any]] = field(default_factory=dict)  # local buffers kept in registers
    status: Any = None
    in_parallel: bool = False


class LLVMCodegen:
    def __init__(self, module, target: Target):
        self.module = module
        self.target = target
        fast = dict(target.options).get("fastmath", "0") not in ("0", "false", "")
        self.fp_flags = ("fast",) if fast else ("contract",)
        self.ana = Analyzer()
        self.st: _FnState = None  # type: ignore[assignment]
        self.regions = 0
        self.i32, self.i64, self.ptr = ir.IntType(32), ir.IntType(64), ir.PointerType()

    @property
    def b(self):
        return self.st.builder

    # -- helpers -----------------------------------------------------------------------------
    def declare(self, name: str, ret, args: list) -> Any:
        fn = self.module.globals.get(name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ret, args), name)
        return fn

    def intrinsic(self, base: str, t) -> Any:
        return self.declare(f"{base}.{_suffix(t)}", t, [t] * (2 if base == "llvm.pow" else 1))

    def fp(self, instr):
        instr.flags.extend(self.fp_flags)
        return instr

    def splat(self, v, lanes: int):
        if isinstance(v.type, ir.VectorType):
            return v
        vt = ir.VectorType(v.type, lanes)
        one = self.b.insert_element(ir.Constant(vt, ir.Undefined), v, ir.Constant(self.i32, 0))
        mask = ir.Constant(ir.VectorType(self.i32, lanes), [0] * lanes)
        return self.b.shuffle_vector(one, ir.Constant(vt, ir.Undefined), mask)

    def lanewise(self, values: list, lanes: int, fn: Callable[..., Any]):
        """Apply a scalar function per lane (lanes == 1: once)."""
        if lanes == 1:
            return fn(*values)
        values = [self.splat(v, lanes) for v in values]
        out = None
        for lane in range(lanes):
            idx = ir.Constant(self.i32, lane)
            r = fn(*[self.b.extract_element(v, idx) for v in values])
            if out is None:
                out = ir.Constant(ir.VectorType(r.type, lanes), ir.Undefined)
            out = self.b.insert_element(out, r, idx)
        return out

    def alloca(self, t, name: str, count: int | None = None, align: int | None = None):
        size = None if count is None else ir.Constant(self.i64, count)
        a = self.st.entry.alloca(t, size=size, name=name)
        if align:
            a.align = align
        return a

    # -- expressions -------------------------------------------------------------------------
    def expr(self, e: Expr):
        if isinstance(e, Var):
            if e not in self.st.vars:
                raise CodegenError(f"LLVM codegen: variable '{e.name}' used outside its loop or let")
            return self.st.vars[e]
        if isinstance(e, Const):
            return self.const(e.value, e.dtype)
        if isinstance(e, Load):
            return self.load(e)
        if isinstance(e, BinOp):
            return self.binop(e)
        if isinstance(e, Not):
            a = self.expr(e.a)
            if e.a.dtype.is_bool:
                return self.b.not_(a)
            return self.b.zext(self.b.icmp_signed("==", a, ir.Constant(a.type, 0)), a.type)
        if isinstance(e, Select):
            lanes = e.dtype.lanes
            c = self.expr(e.cond)
            t, f = self.expr(e.t), self.expr(e.f)
            if lanes > 1:
                t, f = self.splat(t, lanes), self.splat(f, lanes)
            return self.b.select(c, t, f)
        if isinstance(e, Cast):
            return self.cast(self.expr(e.value), e.value.dtype, e.dtype)
        if isinstance(e, Call):
            return self.call(e)
        if isinstance(e, Ramp):
            base, stride = self.expr(e.base), self.expr(e.stride)
            t = base.type
            steps = ir.Constant(ir.VectorType(t, e.lanes), list(range(e.lanes)))
            return self.b.add(self.splat(base, e.lanes), self.b.mul(self.splat(stride, e.lanes), steps))
        if isinstance(e, Broadcast):
            return self.splat(self.expr(e.value), e.lanes)
        raise CodegenError(f"LLVM codegen: unsupported expression {type(e).__name__}: {e}")

    def const(self, value, dt: DType):
        t = ltype(dt.scalar)
        if dt.is_bool:
            c = ir.Constant(t, int(bool(value)))
        elif dt.is_narrow:  # the code of the value
            c = ir.Constant(t, int(np.asarray(value).astype(dt.numpy).view(np.uint8)))
        elif dt.is_float:
            c = ir.Constant(t, float(value))
        else:
            v = int(value) & ((1 << dt.bits) - 1)  # two's complement bits
            c = ir.Constant(t, v)
        return c if dt.lanes == 1 else ir.Constant(ir.VectorType(t, dt.lanes), [c.constant] * dt.lanes)

    def binop(self, e: BinOp):
        op, dt = e.op, e.dtype
        lanes = dt.lanes
        a, b = self.expr(e.a), self.expr(e.b)
        if lanes > 1:
            a, b = self.splat(a, lanes), self.splat(b, lanes)
        odt = e.a.dtype  # operand dtype (comparisons)
        B = self.b
        if not odt.is_float and not odt.is_bool and a.type != b.type:  # an int32 index beside an int64 size
            wide = a.type if _int_width(a.type) >= _int_width(b.type) else b.type
            a, b = self.fit_int(a, wide), self.fit_int(b, wide)
        if op not in _CMP and not dt.is_float and not dt.is_bool:
            a, b = self.fit_int(a, ltype(dt)), self.fit_int(b, ltype(dt))
        if op in _CMP:
            if odt.is_float:
                if op == "ne":
                    return B.fcmp_unordered("!=", a, b)
                return B.fcmp_ordered(_CMP[op], a, b)
            if odt.kind == "int":
                return B.icmp_signed(_CMP[op], a, b)
            return B.icmp_unsigned(_CMP[op], a, b)
        if op in ("and", "or"):
            return B.and_(a, b) if op == "and" else B.or_(a, b)
        if op in ("min", "max"):
            sym = "<" if op == "min" else ">"
            if dt.is_float:  # numpy's maximum/minimum: a NaN on either side wins
                c = B.or_(B.fcmp_ordered(sym, a, b), B.fcmp_unordered("!=", a, a))
            elif dt.kind == "int":
                c = B.icmp_signed(sym, a, b)
            else:
                c = B.icmp_unsigned(sym, a, b)
            return B.select(c, a, b)
        if dt.is_float:
            if op in ("add", "sub", "mul", "div"):
                fn = {"add": B.fadd, "sub": B.fsub, "mul": B.fmul, "div": B.fdiv}[op]
                return self.fp(fn(a, b))
            if op in ("floordiv", "floormod"):
                q = self.b.call(self.intrinsic("llvm.floor", a.type), [self.fp(B.fdiv(a, b))])
                return q if op == "floordiv" else self.fp(B.fsub(a, self.fp(B.fmul(q, b))))
        elif op in ("add", "sub", "mul"):
            # int32/int64 overflow is undefined in C (nsw, as gcc assumes); narrower types wrap
            flags = ["nsw"] if dt.kind == "int" and dt.bits >= 32 else []
            return {"add": B.add, "sub": B.sub, "mul": B.mul}[op](a, b, flags=flags)
        elif op in ("floordiv", "floormod"):
            return self.int_divmod(op, e.a, e.b, a, b, dt)
        elif op == "div":
            raise CodegenError(f"integer true division in {e}")
        raise CodegenError(f"LLVM codegen: unsupported operator {op} on {dt}")

    def int_divmod(self, op: str, ea: Expr, eb: Expr, a, b, dt: DType):
        B = self.b
        signed = dt.kind == "int"
        if dt.lanes == 1:
            la, _ = self.ana.bounds(ea)
            lb, _ = self.ana.bounds(eb)
            if la is not None and la >= 0 and lb is not None and lb > 0:
                return B.sdiv(a, b) if op == "floordiv" else B.srem(a, b)
        if not signed:
            return B.udiv(a, b) if op == "floordiv" else B.urem(a, b)
        q, r = self.signed_divrem(a, b, eb)
        zero = ir.Constant(a.type, 0) if dt.lanes == 1 else self.splat(ir.Constant(a.type.element, 0), dt.lanes)
        adjust = B.and_(B.icmp_signed("!=", r, zero), B.xor(B.icmp_signed("<", r, zero), B.icmp_signed("<", b, zero)))
        if op == "floordiv":
            return B.sub(q, B.zext(adjust, q.type))
        return B.select(adjust, B.add(r, b), r)

    def signed_divrem(self, a, b, eb: Expr):
        """(a / b, a % b) truncated, without the traps of x86: b == 0 gives (0, 0) and b == -1 gives
        (-a wrapping, 0), as numpy's integer division does."""
        B = self.b
        if isinstance(eb, Const) and eb.value not in (0, -1):
            return B.sdiv(a, b), B.srem(a, b)
        t = b.type
        lanes = t.count if isinstance(t, ir.VectorType) else 1
        scalar = t.element if lanes > 1 else t
        zero, one, neg = (self.splat(ir.Constant(scalar, v), lanes) if lanes > 1 else ir.Constant(scalar, v)
                          for v in (0, 1, -1))  # fmt: skip
        is0, is_neg = B.icmp_signed("==", b, zero), B.icmp_signed("==", b, neg)
        safe = B.select(B.or_(is0, is_neg), one, b)
        q = B.select(is0, zero, B.select(is_neg, B.sub(zero, a), B.sdiv(a, safe)))
        r = B.select(B.or_(is0, is_neg), zero, B.srem(a, safe))
        return q, r

    def fit_int(self, v, t):
        """An integer value (or vector) as integer type `t`: sign-extended or truncated where the loop IR mixes an
        int32 index with an int64 size in one operation (C converts them implicitly)."""
        if v.type == t or not isinstance(t.element if isinstance(t, ir.VectorType) else t, ir.IntType):
            return v
        if _int_width(v.type) < _int_width(t):
            return self.b.sext(v, t)
        return self.b.trunc(v, t) if _int_width(v.type) > _int_width(t) else v

    def cast(self, v, src: DType, dst: DType):
        B = self.b
        if not src.is_float and not src.is_bool and not src.is_narrow:
            v = self.fit_int(v, ltype(src))
        if src.is_narrow or dst.is_narrow:
            raise CodegenError(f"LLVM codegen: cast {src} -> {dst}: narrow formats convert through "
                               "ember.tir.narrow.convert (te.cast), not a plain cast")  # fmt: skip
        t = ltype(dst)
        if src.scalar == dst.scalar:
            return v
        if dst.is_bool:
            if src.is_float:
                return B.fcmp_unordered("!=", v, ir.Constant(v.type, None))
            return B.icmp_unsigned("!=", v, ir.Constant(v.type, None))
        if src.is_bool:
            return B.uitofp(v, t) if dst.is_float else B.zext(v, t)
        if src.is_float and dst.is_float:
            return B.fpext(v, t) if dst.bits > src.bits else B.fptrunc(v, t)
        if src.is_float:
            return B.fptosi(v, t) if dst.kind == "int" else B.fptoui(v, t)
        if dst.is_float:
            return B.sitofp(v, t) if src.kind == "int" else B.uitofp(v, t)
        if dst.bits > src.bits:
            return B.sext(v, t) if src.kind == "int" else B.zext(v, t)
        if dst.bits < src.bits:
            return B.trunc(v, t)
        return v  # same width, other signedness: the same bits

    def vector_exp(self, x, lanes: int):
        """exp of a float32 vector in vector arithmetic, as the C target's portable helper
        (`ember.codegen.vmath.c_vector_exp`): x clamped to [EXP_LOW, 88.8] (NaN passes), n = rint(x log2 e) by
        the 1.5 * 2^23 trick, r = x - n ln2 in two parts, e^r = 1 + r + r^2 P(r), and 2^n applied as two normal
        powers built in the exponent bits (no table gather: 12.8 -> 4.7 ns a vector of 16 here); results below
        FLT_MIN are 0. Only `contract` on its float operations, whatever the module's flags: its NaN and infinity
        handling must hold."""
        B, f32, i32 = self.b, float32.with_lanes(lanes), int32.with_lanes(lanes)

        def c(v):
            return self.const(v, f32)

        def fl(instr):
            instr.flags.append("contract")
            return instr

        if lanes == 16 and "avx512f" in self.target.simd_features():
            return self.avx512_exp(x, c, fl)
        below, above = B.fcmp_ordered("<", x, c(EXP_LOW)), B.fcmp_ordered(">", x, c(88.8))
        x = B.select(above, c(88.8), B.select(below, c(EXP_LOW), x))
        shifter = c(12582912.0)  # 1.5 * 2^23: adding it rounds to an integer
        t = fl(B.fadd(fl(B.fmul(x, c(1.44269504088896341))), shifter))
        n = fl(B.fsub(t, shifter))
        r = fl(B.fsub(fl(B.fsub(x, fl(B.fmul(n, c(EXP_C1))))), fl(B.fmul(n, c(EXP_C2)))))
        p = c(EXP_POLY[0])
        for k in EXP_POLY[1:]:
            p = fl(B.fadd(fl(B.fmul(p, r)), c(k)))
        p = fl(B.fadd(fl(B.fadd(fl(B.fmul(p, fl(B.fmul(r, r)))), r)), c(1.0)))
        k = B.sub(B.bitcast(t, ltype(i32)), self.const(0x4B400000, i32))  # n, from the low bits of t
        k1 = B.ashr(k, self.const(1, i32))
        k2 = B.sub(k, k1)

        def pow2(e):
            return B.bitcast(B.shl(B.add(e, self.const(127, i32)), self.const(23, i32)), ltype(f32))

        y = fl(B.fmul(fl(B.fmul(p, pow2(k1))), pow2(k2)))
        return B.select(below, c(0.0), y)

    def avx512_exp(self, x, c, fl):
        """The AVX-512 exp of `ember.codegen.vmath.avx512_exp` (2^(j/16) from 16 constants in a register by
        vpermps, e^r - 1 = r q(r), 2^k by vscalefps zeroing the lanes below EXP_LOW) in LLVM IR, through the
        x86 intrinsics LLVM has for those two instructions."""
        B = self.b
        vf, vi = ir.VectorType(ir.FloatType(), 16), ir.VectorType(self.i32, 16)
        table = ir.Constant(vf, [float(np.float32(2.0 ** (j / 16))) for j in range(16)])
        v = B.select(B.fcmp_ordered(">", x, c(88.8)), c(88.8), x)  # NaN passes
        normal = B.fcmp_unordered(">=", x, c(EXP_LOW))
        n = B.call(self.intrinsic("llvm.rint", vf), [fl(B.fmul(v, c(16 / np.log(2))))])
        r = fl(B.fsub(fl(B.fsub(v, fl(B.fmul(n, c(EXP16_C1))))), fl(B.fmul(n, c(EXP16_C2)))))
        q0, q1, q2 = EXP16_Q
        q = fl(B.fmul(fl(B.fadd(fl(B.fmul(fl(B.fadd(fl(B.fmul(c(q2), r)), c(q1))), r)), c(q0))), r))
        nj = B.fptosi(n, vi)
        perm = self.declare("llvm.x86.avx512.permvar.sf.512", vf, [vf, vi])
        pj = B.call(perm, [table, nj])
        k = B.sitofp(B.ashr(nj, ir.Constant(vi, [4] * 16)), vf)
        scalef = self.declare("llvm.x86.avx512.mask.scalef.ps.512", vf, [vf, vf, vf, ir.IntType(16), self.i32])
        mask = B.bitcast(normal, ir.IntType(16))
        return B.call(scalef, [fl(B.fadd(fl(B.fmul(pj, q)), pj)), k, ir.Constant(vf, [0.0] * 16), mask,
                               ir.Constant(self.i32, 4)])  # 4: the current rounding mode

    def call(self, e: Call):
        dt, name = e.dtype, e.name
        if name in CONVERSIONS:  # a narrow format to or from float32/int32 (ember.codegen.narrow_llvm)
            from .narrow_llvm import llvm_function

            fn = llvm_function(self.module, CONVERSIONS[name])
            return self.lanewise([self.expr(e.args[0])], dt.lanes, lambda x: self.b.call(fn, [x]))
        if name == PREFETCH:  # llvm.prefetch(ptr, read, locality 2 (L2), data cache)
            (ld,) = e.args
            fn = self.declare("llvm.prefetch.p0", ir.VoidType(), [self.ptr, self.i32, self.i32, self.i32])
            ptr = self.address(ld.buffer, self.expr(ld.indices[0]))
            return self.b.call(fn, [ptr, ir.Constant(self.i32, 0), ir.Constant(self.i32, 2), ir.Constant(self.i32, 1)])
        if wants_arithmetic_exp(name, dt):  # llvm.exp on a vector runs expf once per lane
            return self.vector_exp(self.splat(self.expr(e.args[0]), dt.lanes), dt.lanes)
        args = [self.expr(a) for a in e.args]
        if dt.lanes > 1:
            args = [self.splat(a, dt.lanes) for a in args]
        B = self.b
        if dt.is_float:
            t = ltype(dt)
            if name in _LLVM_MATH:
                return B.call(self.intrinsic(_LLVM_MATH[name], t), args)
            if name == "rsqrt":
                root = B.call(self.intrinsic("llvm.sqrt", t), args)
                return self.fp(B.fdiv(self.const(1.0, dt), root))
            if name == "sigmoid":
                neg = self.fp(B.fneg(args[0]))
                ex = self.vector_exp(neg, dt.lanes) if wants_arithmetic_exp("exp", dt) else \
                    B.call(self.intrinsic("llvm.exp", t), [neg])
                return self.fp(B.fdiv(self.const(1.0, dt), self.fp(B.fadd(self.const(1.0, dt), ex))))
            if name in _LIBM:
                st = ltype(dt.scalar)
                fn = self.declare(_LIBM[name][0 if dt.bits == 32 else 1], st, [st] * len(args))
                return self.lanewise(args, dt.lanes, lambda *xs: B.call(fn, list(xs)))
        elif dt.is_int:
            return self.int_call(name, args, dt, e)
        raise CodegenError(f"LLVM codegen: no {name} for {dt}")

    def int_call(self, name: str, args: list, dt: DType, e: Call):
        B = self.b
        signed = dt.kind == "int"
        t = args[0].type
        scalar = t.element if isinstance(t, ir.VectorType) else t

        def c(v: int):
            k = ir.Constant(scalar, v & ((1 << dt.bits) - 1))
            return self.splat(k, dt.lanes) if dt.lanes > 1 else k

        if name in ("floor", "ceil", "round"):
            return args[0]
        if name == "abs":
            a = args[0]
            return B.select(B.icmp_signed("<", a, c(0)), B.sub(c(0), a), a) if signed else a
        if name == "bitwise_not":
            return B.xor(args[0], c(-1))
        if name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
            return {"bitwise_and": B.and_, "bitwise_or": B.or_, "bitwise_xor": B.xor}[name](*args)
        if name in ("shift_left", "shift_right"):
            a, s = args
            big = B.icmp_unsigned(">=", s, c(dt.bits))  # also a negative amount, as an unsigned number
            s_ok = B.select(big, c(0), s)
            if name == "shift_left":
                return B.select(big, c(0), B.shl(a, s_ok))
            if signed:
                fill = B.select(B.icmp_signed("<", a, c(0)), c(-1), c(0))
                return B.select(big, fill, B.ashr(a, s_ok))
            return B.select(big, c(0), B.lshr(a, s_ok))
        if name in ("truncdiv", "truncmod"):
            a, b = args
            if signed:
                q, r = self.signed_divrem(a, b, e.args[1])
            else:
                zero_b = B.icmp_unsigned("==", b, c(0))
                safe = B.select(zero_b, c(1), b)
                q, r = (B.select(zero_b, c(0), x) for x in (B.udiv(a, safe), B.urem(a, safe)))
            return q if name == "truncdiv" else r
        if name == "pow":
            fn = self.int_pow_helper(scalar, signed)
            return self.lanewise(args, dt.lanes, lambda x, y: B.call(fn, [x, y]))
        raise CodegenError(f"LLVM codegen: no {name} for {dt}")

    def int_pow_helper(self, t, signed: bool):
        """`T ember_ipow_T(T a, T b)`: repeated squaring; a negative power truncates (1 / a**-b) like numpy."""
        name = f"ember_ipow_{'i' if signed else 'u'}{t.width}"
        if name in self.module.globals:
            return self.module.globals[name]
        fn = ir.Function(self.module, ir.FunctionType(t, [t, t]), name)
        fn.linkage = "internal"
        a, b = fn.args
        B = ir.IRBuilder(fn.append_basic_block("entry"))
        zero, one = ir.Constant(t, 0), ir.Constant(t, 1)
        loop, body, done = fn.append_basic_block("loop"), fn.append_basic_block("body"), fn.append_basic_block("done")
        if signed:
            neg_bb, pos_bb = fn.append_basic_block("neg"), fn.append_basic_block("pos")
            B.cbranch(B.icmp_signed("<", b, zero), neg_bb, pos_bb)
            B.position_at_end(neg_bb)
            minus1 = ir.Constant(t, (1 << t.width) - 1)
            odd = B.icmp_unsigned("!=", B.and_(b, one), zero)
            r_m1 = B.select(odd, minus1, one)
            B.ret(B.select(B.icmp_signed("==", a, one), one, B.select(B.icmp_signed("==", a, minus1), r_m1, zero)))
            B.position_at_end(pos_bb)
        entry_end = B.block
        B.branch(loop)
        B.position_at_end(loop)
        r, x, k = B.phi(t), B.phi(t), B.phi(t)
        r.add_incoming(one, entry_end)
        x.add_incoming(a, entry_end)
        k.add_incoming(b, entry_end)
        B.cbranch(B.icmp_unsigned("!=", k, zero), body, done)
        B.position_at_end(body)
        odd = B.icmp_unsigned("!=", B.and_(k, one), zero)
        r2 = B.select(odd, B.mul(r, x), r)
        x2, k2 = B.mul(x, x), B.lshr(k, one)
        B.branch(loop)
        r.add_incoming(r2, body)
        x.add_incoming(x2, body)
        k.add_incoming(k2, body)
        B.position_at_end(done)
        B.ret(r)
        return fn

    # -- memory ------------------------------------------------------------------------------
    def address(self, buf: Buffer, idx):
        if buf not in self.st.bufs:
            raise CodegenError(f"LLVM codegen: buffer '{buf.name}' used outside its allocation")
        return self.b.gep(self.st.bufs[buf], [idx], source_etype=mtype(buf.dtype))

    def load(self, e: Load):
        if len(e.indices) != 1:
            raise CodegenError(f"load of {e.buffer.name} is not flattened")
        buf, idx = e.buffer, e.indices[0]
        B = self.b
        if buf in self.st.slots:
            slot, t = self.st.slots[buf][_const_offset(idx)]
            return B.load(slot, typ=t)
        align = buf.dtype.itemsize
        if idx.dtype.lanes == 1:
            v = B.load(self.address(buf, self.expr(idx)), typ=mtype(buf.dtype), align=align)
            return B.trunc(v, ir.IntType(1)) if buf.dtype.is_bool else v
        if e.predicate is not None:
            return self.masked_load(e)
        if isinstance(idx, Ramp) and isinstance(idx.stride, Const) and idx.stride.value == 1:
            p = self.address(buf, self.expr(idx.base))
            return B.load(p, typ=ltype(e.dtype), align=align)
        block = None if buf.dtype.is_bool else aligned_lanes(idx, buffer_elems(buf))
        if block is not None:  # one aligned block, its lanes rearranged (`ember.codegen.lanes`)
            v = B.load(self.address(buf, self.expr(block[0])), typ=ltype(e.dtype), align=align)
            order = ir.Constant(ir.VectorType(self.i32, len(block[1])), [ir.Constant(self.i32, k) for k in block[1]])
            return B.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), order)
        vi = self.expr(idx)
        et = mtype(buf.dtype)
        return self.lanewise([vi], idx.dtype.lanes, lambda i: B.load(self.address(buf, i), typ=et, align=align))

    def store(self, s: Store) -> None:
        if len(s.indices) != 1:
            raise CodegenError(f"store to {s.buffer.name} is not flattened")
        buf, idx = s.buffer, s.indices[0]
        B = self.b
        value = self.expr(s.value)
        if buf in self.st.slots:
            slot, t = self.st.slots[buf][_const_offset(idx)]
            if s.predicate is not None:  # the lanes it does not write keep their value
                value = B.select(self.expr(s.predicate), self.splat(value, idx.dtype.lanes), B.load(slot, typ=t))
            _store(B, value, slot)
            return
        align = buf.dtype.itemsize
        if idx.dtype.lanes == 1:
            if buf.dtype.is_bool:
                value = B.zext(value, ir.IntType(8))
            B.store(value, self.address(buf, self.expr(idx)), align=align)
            return
        lanes = idx.dtype.lanes
        value = self.splat(value, lanes)
        if s.predicate is not None:
            self.masked_store(s, value)
            return
        if isinstance(idx, Ramp) and isinstance(idx.stride, Const) and idx.stride.value == 1:
            _store(B, value, self.address(buf, self.expr(idx.base)), align)
            return
        vi = self.expr(idx)
        for lane in range(lanes):
            k = ir.Constant(self.i32, lane)
            B.store(B.extract_element(value, k), self.address(buf, B.extract_element(vi, k)), align=align)

    def masked_load(self, e: Load):
        """A vector load of the lanes where e.predicate holds (zero elsewhere): llvm.masked.load for a contiguous
        ramp, llvm.masked.gather otherwise."""
        B, buf, idx = self.b, e.buffer, e.indices[0]
        vt, mask = ltype(e.dtype), self.expr(e.predicate)
        align = ir.Constant(self.i32, buf.dtype.itemsize)
        zero = ir.Constant(vt, None)
        if isinstance(idx, Ramp) and isinstance(idx.stride, Const) and idx.stride.value == 1:
            fn = self.declare(f"llvm.masked.load.{_suffix(vt)}.p0", vt, [self.ptr, self.i32, mask.type, vt])
            return B.call(fn, [self.address(buf, self.expr(idx.base)), align, mask, zero])
        ptrs = self.pointers(buf, idx)
        fn = self.declare(f"llvm.masked.gather.{_suffix(vt)}.v{idx.dtype.lanes}p0", vt, [ptrs.type, self.i32,
                          mask.type, vt])  # fmt: skip
        return B.call(fn, [ptrs, align, mask, zero])

    def pointers(self, buf: Buffer, idx: Expr):
        """The addresses of a vector index's lanes, as a vector of pointers."""
        B, vi, n = self.b, self.expr(idx), idx.dtype.lanes
        out = ir.Constant(ir.VectorType(self.ptr, n), ir.Undefined)
        for lane in range(n):
            k = ir.Constant(self.i32, lane)
            out = B.insert_element(out, self.address(buf, B.extract_element(vi, k)), k)
        return out

    def masked_store(self, s: Store, value) -> None:
        """A vector store of the lanes where s.predicate holds: llvm.masked.store (llvm.masked.scatter for
        other than a contiguous ramp)."""
        B, buf, idx = self.b, s.buffer, s.indices[0]
        mask = self.expr(s.predicate)
        align = ir.Constant(self.i32, buf.dtype.itemsize)
        vt = value.type
        if isinstance(idx, Ramp) and isinstance(idx.stride, Const) and idx.stride.value == 1:
            fn = self.declare(f"llvm.masked.store.{_suffix(vt)}.p0", ir.VoidType(), [vt, self.ptr, self.i32, mask.type])
            B.call(fn, [value, self.address(buf, self.expr(idx.base)), align, mask])
            return
        ptrs = self.pointers(buf, idx)
        fn = self.declare(f"llvm.masked.scatter.{_suffix(vt)}.v{idx.dtype.lanes}p0", ir.VoidType(),
                          [vt, ptrs.type, self.i32, mask.type])  # fmt: skip
        B.call(fn, [value, ptrs, align, mask])

    # -- statements --------------------------------------------------------------------------
    def stmt(self, s: Stmt) -> None:
        if isinstance(s, Seq):
            for x in s.stmts:
                self.stmt(x)
        elif isinstance(s, For):
            self.loop(s)
        elif isinstance(s, Store):
            self.store(s)
        elif isinstance(s, IfThenElse):
            self.if_then_else(s)
        elif isinstance(s, LetStmt):
            value = self.expr(s.value)
            self.st.vars[s.var] = value
            lo, hi = self.ana.bounds(s.value) if s.value.dtype.is_int and s.value.dtype.lanes == 1 else (None, None)
            with self.ana.scope(s.var, lo, hi):
                self.stmt(s.body)
        elif isinstance(s, Allocate):
            self.allocate(s)
        elif isinstance(s, Evaluate):
            if not isinstance(s.value, Const):
                self.expr(s.value)
        else:
            raise CodegenError(f"LLVM codegen: unsupported statement {type(s).__name__}")

    def if_then_else(self, s: IfThenElse) -> None:
        cond = self.expr(s.cond)
        B = self.b
        if s.else_case is None:
            with B.if_then(cond):
                self.stmt(s.then_case)
            return
        with B.if_else(cond) as (then, other):
            with then:
                self.stmt(s.then_case)
            with other:
                self.stmt(s.else_case)

    def loop(self, s: For) -> None:
        if s.kind is ForKind.THREAD_BINDING:
            raise CodegenError(
                f"loop '{s.var.name}' is bound to {s.thread_tag}, which needs a GPU target (cuda, opencl), "
                f"not {self.target.kind}"
            )
        if s.kind is ForKind.PARALLEL and not self.st.in_parallel:
            self.parallel_loop(s)
            return
        lo = self.expr(s.min)
        end = self.expr(self.ana.simplify(s.min + s.extent))
        self.counted_loop(s.var, lo, end, s.body, ana_bounds=self.ana.bind_loop(s.var, s.min, s.extent))

    def counted_loop(self, var: Var, lo, end, body: Stmt, ana_bounds) -> None:
        B = self.b
        pre = B.block
        head = B.append_basic_block(f"{var.name}.head")
        inner = B.append_basic_block(f"{var.name}.body")
        exit_ = B.append_basic_block(f"{var.name}.exit")
        B.branch(head)
        B.position_at_end(head)
        i = B.phi(lo.type, name=var.name)
        i.add_incoming(lo, pre)
        B.cbranch(B.icmp_signed("<", i, end), inner, exit_)
        B.position_at_end(inner)
        self.st.vars[var] = i
        with self.ana.scope(var, *ana_bounds):
            self.stmt(body)
        nxt = B.add(i, ir.Constant(i.type, 1), flags=["nsw"])
        i.add_incoming(nxt, B.block)
        B.branch(head)
        B.position_at_end(exit_)

    def parallel_loop(self, s: For) -> None:
        """Outline the loop body into a region function run by `ember_parallel_for`."""
        bound = {n.var for n in walk(s.body) if isinstance(n, For | LetStmt)} | {s.var}
        # a buffer of symbolic size allocated in the body: the variables of its size too
        sizes = [x for n in walk(s.body) if isinstance(n, Allocate) and isinstance(n.buffer.size, Expr)
                 for x in walk(n.buffer.size)]  # fmt: skip
        used_vars = [v for v in _unique([*walk(s), *sizes]) if isinstance(v, Var) and v not in bound]
        used_bufs = [b for b in _unique(n.buffer for n in walk(s.body) if isinstance(n, Load | Store))]
        outer_bufs = [b for b in used_bufs if b in self.st.bufs]
        slot_bufs = [b for b in used_bufs if b in self.st.slots]  # register buffers: their slots' addresses
        slot_keys = [(b, off) for b in slot_bufs for off in sorted(self.st.slots[b])]
        values = [self.st.vars[v] for v in used_vars if v in self.st.vars]
        used_vars = [v for v in used_vars if v in self.st.vars]
        # the closure: one field per outer variable value and buffer pointer, then the status pointer
        fields = [v.type for v in values] + [self.ptr] * (len(outer_bufs) + 1 + len(slot_keys))
        ctype = ir.LiteralStructType(fields)
        clo = self.alloca(ctype, "closure")
        slot_ptrs = [self.st.slots[b][off][0] for b, off in slot_keys]
        for k, v in enumerate([*values, *(self.st.bufs[b] for b in outer_bufs), self.st.status, *slot_ptrs]):
            _store(self.b, v, self.b.gep(clo, [ir.Constant(self.i32, 0), ir.Constant(self.i32, k)], source_etype=ctype))
        # inner(noalias buffers..., values..., i64 begin, i64 end): noalias is kept when inlined into the region
        self.regions += 1
        base = f"{self.st.fn.name}_par{self.regions}"
        inner_ty = ir.FunctionType(ir.VoidType(), [self.ptr] * len(outer_bufs) + [v.type for v in values]
                                   + [self.i64, self.i64, self.ptr] + [self.ptr] * len(slot_keys))  # fmt: skip
        inner = ir.Function(self.module, inner_ty, base + "_body")
        inner.linkage = "internal"
        for k in range(len(outer_bufs)):
            inner.args[k].add_attribute("noalias")
        region = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [self.ptr, self.i64, self.i64]), base)
        region.linkage = "internal"
        rb = ir.IRBuilder(region.append_basic_block("entry"))
        cl = region.args[0]
        loaded = [rb.load(rb.gep(cl, [ir.Constant(self.i32, 0), ir.Constant(self.i32, k)], source_etype=ctype),
                          typ=fields[k]) for k in range(len(fields))]  # fmt: skip
        nv = len(values)
        nb = len(outer_bufs)
        args = loaded[nv : nv + nb] + loaded[:nv] + [region.args[1], region.args[2], loaded[nv + nb]]
        rb.call(inner, args + loaded[nv + nb + 1 :])
        rb.ret_void()
        # the body
        outer = self.st
        st = self._new_state(inner)
        st.in_parallel = True
        nb = len(outer_bufs)
        begin, end, st.status = inner.args[nb + nv : nb + nv + 3]
        st.bufs = dict(zip(outer_bufs, inner.args[:nb]))
        st.vars = dict(zip(used_vars, inner.args[nb : nb + nv]))
        for (b, off), p in zip(slot_keys, inner.args[nb + nv + 3 :]):
            st.slots.setdefault(b, {})[off] = (p, outer.slots[b][off][1])
        self.st = st
        vt = ltype(s.var.dtype)
        if vt.width != 64:
            begin, end = st.builder.trunc(begin, vt), st.builder.trunc(end, vt)
        i_var = Var(s.var.name + "_p", s.var.dtype)
        lb, hb = self.ana.bind_loop(s.var, s.min, s.extent)
        ext_hi = None if lb is None or hb is None else hb - lb
        # i runs over [begin, end) of [0, extent); the loop variable is min + i
        body = LetStmt(s.var, s.min + i_var, s.body)
        self.counted_loop(i_var, begin, end, body, (0, ext_hi))
        st.builder.ret_void()
        self.st = outer
        # the call
        n = self.expr(s.extent)
        n64 = self.b.sext(n, self.i64) if n.type.width < 64 else n
        pf = self.declare("ember_parallel_for", ir.VoidType(), [self.ptr, self.ptr, self.i64])
        self.b.call(pf, [region, clo, n64])

    def allocate(self, s: Allocate) -> None:
        b = s.buffer
        st = self.st
        slots = register_slots(s) if b.scope == "local" else None
        if slots is not None:
            types = {off: ltype(b.dtype.with_lanes(lanes)) for off, lanes in slots.items()}
            st.slots[b] = {off: (self.alloca(t, f"{b.name}_{off}"), t) for off, t in types.items()}
            self.stmt(s.body)
            del st.slots[b]
            return
        t = mtype(b.dtype)
        if b.is_static and b.nbytes <= STACK_LIMIT:
            arr = self.alloca(t, b.name, count=max(b.size, 1), align=64)
            st.bufs[b] = arr
            self.stmt(s.body)
            del st.bufs[b]
            return
        B = self.b
        if b.is_static:
            nbytes = ir.Constant(self.i64, -(-b.nbytes // 64) * 64)
        else:  # symbolic size: bytes computed from the size arguments, rounded up to 64 (as the C target does)
            size = self.expr(Cast(int64, b.size) if isinstance(b.size, Expr) else Const(b.size, int64))
            raw = B.add(B.mul(size, ir.Constant(self.i64, b.dtype.itemsize)), ir.Constant(self.i64, 63 + 64))
            nbytes = B.mul(B.sdiv(raw, ir.Constant(self.i64, 64)), ir.Constant(self.i64, 64))
        alloc = self.declare("aligned_alloc", self.ptr, [self.i64, self.i64])
        free = self.declare("free", ir.VoidType(), [self.ptr])
        p = B.call(alloc, [ir.Constant(self.i64, 64), nbytes], name=b.name)
        with B.if_else(B.icmp_unsigned("==", p, ir.Constant(self.ptr, None))) as (failed, ok):
            with failed:
                B.store(ir.Constant(self.i32, -1), st.status)
            with ok:
                st.bufs[b] = p
                self.stmt(s.body)
                del st.bufs[b]
                B.call(free, [p])

    # -- functions ---------------------------------------------------------------------------
    def _new_state(self, fn) -> _FnState:
        entry = fn.append_basic_block("entry")
        start = fn.append_basic_block("start")
        eb = ir.IRBuilder(entry)
        eb.branch(start)
        eb.position_at_start(entry)  # allocas before the branch
        return _FnState(fn, ir.IRBuilder(start), eb)

    def function(self, f: PrimFunc):
        """`i32 name(ptr buffers..., i64 sizes...)`: the size variables of the buffers' shapes (`size_params`) are
        i64 arguments after the buffers, as the C target's `int64_t` ones."""
        sizes = size_params(f.params)
        fty = ir.FunctionType(self.i32, [self.ptr] * len(f.params) + [self.i64] * len(sizes))
        fn = ir.Function(self.module, fty, c_symbol(f.name))
        for arg, p in zip(fn.args, f.params):
            arg.name = c_symbol(p.name)
            arg.add_attribute("noalias")
        self.ana.bind_sizes(sizes)  # sizes known >= their lower bounds
        self.st = st = self._new_state(fn)
        st.bufs = dict(zip(f.params, fn.args))
        for arg, v in zip(fn.args[len(f.params) :], sizes):
            arg.name = c_symbol(v.name)
            st.vars[v] = arg if v.dtype.bits == 64 else st.entry.trunc(arg, ltype(v.dtype))
        st.status = self.alloca(self.i32, "status")
        st.entry.store(ir.Constant(self.i32, 0), st.status)
        self.stmt(f.body)
        st.builder.ret(st.builder.load(st.status, typ=self.i32))
        return fn


def _store(builder, value, ptr, align: int | None = None) -> None:
    """A store without llvmlite's pointee check: it types GEP results (float*, {ptr}*) where LLVM's pointers
    are opaque, so a vector stored at an element's address, or a field stored into a struct, is refused."""
    st = ir.instructions.StoreInstr(builder.block, value, ptr)
    st.align = align
    builder._insert(st)


def _const_offset(idx: Expr) -> int:
    v = const_offset(idx)
    assert v is not None
    return v


def _unique(items) -> list:
    seen, out = set(), []
    for x in items:
        if id(x) not in seen:
            seen.add(id(x))
            out.append(x)
    return out


def _int_width(t) -> int:
    """The bits of an integer type or of a vector's integer lanes (0 for anything else)."""
    t = t.element if isinstance(t, ir.VectorType) else t
    return t.width if isinstance(t, ir.IntType) else 0


def _suffix(t) -> str:
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{_suffix(t.element)}"
    if isinstance(t, ir.FloatType):
        return "f32"
    if isinstance(t, ir.DoubleType):
        return "f64"
    return f"i{t.width}"


# -- compile and load --------------------------------------------------------------------------


def codegen_llvm(funcs: PrimFunc | list[PrimFunc], target: Target | str = "llvm") -> str:
    """The LLVM IR (text) of a module holding the given functions, before optimization."""
    _require()
    target = Target.parse(target)
    funcs = [funcs] if isinstance(funcs, PrimFunc) else list(funcs)
    module = ir.Module(name="ember")
    for f in funcs:
        LLVMCodegen(module, target).function(f)
    return str(module)


def refuse_missing_features(target: Target) -> None:
    """A TargetError for an llvm target of this architecture whose CPU has instructions this one lacks: its JIT
    code would stop the process (the c target builds such a model to save and run elsewhere)."""
    if target.missing_features:
        raise TargetError(f"target '{target}' uses {', '.join(sorted(target.missing_features))}, which this CPU "
                          "lacks: the llvm target JIT-compiles into this process; build for that CPU with the c "
                          "target (its model saves and runs there), or use -mcpu=native")  # fmt: skip


def target_machine(target: Target):
    """LLVM's target machine: this process's triple and CPU (JIT), or a foreign target's triple, CPU and
    features (position-independent code for a shared library). The target was validated when parsed: LLVM
    aborts the process on a CPU of another architecture."""
    _init()
    opt = {"-O0": 0, "-O1": 1, "-O2": 2}.get(target.opt, 3)
    if not target.runs_here:
        _init_all()
        triple, cpu, features = target.llvm_machine()
        t = llvm.Target.from_triple(triple)
        return t.create_target_machine(cpu=cpu, features=features, opt=opt, reloc="pic", codemodel="default")
    t = llvm.Target.from_triple(llvm.get_process_triple())
    if target.mcpu == "native":
        cpu, features = llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
    else:
        cpu, features = target.mcpu, ",".join(target.mattr)
    return t.create_target_machine(cpu=cpu, features=features, opt=opt, codemodel="jitdefault", jit=True)


@functools.cache
def _init_all() -> None:
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()


# The library of a foreign target: the pool (codegen.llvm_pool) linked in and started by a constructor, and the
# thread count set as the C target's libraries set it
LIBRARY_IR = r"""
@ember_num_threads = external global i32
declare void @ember_pool_init()
@llvm.global_ctors = appending global [1 x { i32, ptr, ptr }]
  [{ i32, ptr, ptr } { i32 65535, ptr @ember_pool_init, ptr null }]

define void @ember_set_num_threads(i32 %n) {
  %pos = icmp sgt i32 %n, 0
  %v = select i1 %pos, i32 %n, i32 1
  store i32 %v, ptr @ember_num_threads
  ret void
}
"""


def shared_library(ir_text: str, target: Target, name: str = "model") -> Path:
    """A shared library for a target of another machine from LLVM IR (`codegen_llvm`, plus any runners): an
    object for its triple, CPU and features, linked by its cross compiler. Cached by content hash."""
    _init()
    import llvmlite

    from .llvm_pool import pool_ir

    tm = target_machine(target)
    parts = [ir_text, RUNTIME_IR, LIBRARY_IR, pool_ir(tm.triple), str(target), tm.triple, llvmlite.__version__]
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()
    path = cache_dir() / "llvm" / key[:2] / f"{key}.o"
    if not path.exists():
        with _lock:
            mod = llvm.parse_assembly(ir_text)
            for extra in (RUNTIME_IR, pool_ir(tm.triple), LIBRARY_IR):
                mod.link_in(llvm.parse_assembly(extra))
            mod.triple = tm.triple
            mod.data_layout = str(tm.target_data)
            if tm.triple.startswith("riscv64"):  # the hard-float ABI of riscv64-linux-gnu's libraries
                abi = llvm.parse_assembly('!llvm.module.flags = !{!0}\n!0 = !{i32 1, !"target-abi", !"lp64d"}')
                mod.link_in(abi)
            mod.verify()
            level = {"-O0": 0, "-O1": 1, "-O2": 2}.get(target.opt, 3)
            pto = llvm.create_pipeline_tuning_options(speed_level=level)
            pto.loop_vectorization = pto.slp_vectorization = level >= 2
            pb = llvm.create_pass_builder(tm, pto)
            pb.getModulePassManager().run(mod, pb)
            obj = tm.emit_object(mod)
        atomic_write(path, obj)
    return link_object(path.read_bytes(), target, key, name)


_lock = threading.Lock()


class JITEngine:
    """LLVM IR compiled in memory: function addresses and globals of one execution engine.

    Machine code is cached on disk by a content hash of (IR, target, CPU, llvmlite version), beside the C
    toolchain's cache: a cache hit skips both the optimization passes and code generation. An entry carries the
    SHA-256 of its object and is checked on every read (`read_cached_object`): a torn, corrupted or planted entry
    is discarded and the IR compiled again, never handed to LLVM. `object_code` (a saved model's machine code,
    verified by its manifest) is used for this engine alone and never enters the shared cache."""

    def __init__(self, ir_text: str, target: Target, object_code: bytes | None = None):
        _init()
        if not target.runs_here:
            raise CodegenError(f"target '{target}' is another machine's: its code cannot be JIT-compiled into this "
                               "process (codegen.llvm.shared_library builds its library)")  # fmt: skip
        self.ir_text, self.target = ir_text, target
        self.tm = tm = target_machine(target)
        key = object_key(ir_text, target, tm)
        self.key, self.object_path = key, object_cache_path(key)
        cached = object_code if object_code is not None else read_cached_object(self.object_path)
        self.from_cache = cached is not None
        self.object_code = cached

        def compiled(_m, buf: bytes) -> None:  # (called only when LLVM generated the code)
            self.object_code = bytes(buf)
            write_cached_object(self.object_path, self.object_code)

        with _lock:  # llvmlite's module and engine objects are not thread-safe
            llvm_pool.load()  # ember_pool_run, before the engine links this module
            mod = self._parse()
            if cached is None:
                self._optimize(mod)
            self.engine = llvm.create_mcjit_compiler(mod, tm)
            self.engine.set_object_cache(compiled, lambda _m: cached)
            self.engine.finalize_object()
            self.engine.run_static_constructors()
        self.llmod = mod

    def _parse(self):
        mod = llvm.parse_assembly(self.ir_text)
        mod.link_in(llvm.parse_assembly(RUNTIME_IR))
        mod.triple = self.tm.triple
        mod.data_layout = str(self.tm.target_data)
        mod.verify()
        return mod

    def _optimize(self, mod) -> None:
        level = {"-O0": 0, "-O1": 1, "-O2": 2}.get(self.target.opt, 3)
        pto = llvm.create_pipeline_tuning_options(speed_level=level)
        pto.loop_vectorization = level >= 2
        pto.slp_vectorization = level >= 2
        pb = llvm.create_pass_builder(self.tm, pto)
        pb.getModulePassManager().run(mod, pb)

    @property
    def optimized_ir(self) -> str:
        with _lock:
            mod = self._parse()
            self._optimize(mod)
            return str(mod)

    def address(self, name: str) -> int:
        addr = self.engine.get_function_address(name)
        if not addr:
            raise CodegenError(f"LLVM module has no function {name!r}")
        return addr

    def set_num_threads(self, n: int) -> None:
        ctypes.c_int32.from_address(self.engine.get_global_value_address("ember_num_threads")).value = max(1, n)

    def assembly(self) -> str:
        with _lock:
            mod = self._parse()
            self._optimize(mod)
            return self.tm.emit_assembly(mod)


def object_cache_path(key: str) -> Path:
    """Where the JIT cache keeps the machine code of a module whose key (`object_key`) is `key`."""
    return cache_dir() / "llvm" / key[:2] / f"{key}.o"


OBJECT_MAGIC = b"EMBEROBJ1\n"  # a cache entry: magic, the object's SHA-256 (32 bytes), the object


def read_cached_object(path: Path) -> bytes | None:
    """The machine code of a JIT cache entry, if it is whole and unchanged; a bad entry is removed (None)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    head = len(OBJECT_MAGIC) + 32
    obj = data[head:]
    if data[: len(OBJECT_MAGIC)] == OBJECT_MAGIC and hashlib.sha256(obj).digest() == data[len(OBJECT_MAGIC) : head]:
        touch(path)
        return obj
    with contextlib.suppress(OSError):
        path.unlink()
    return None


def write_cached_object(path: Path, obj: bytes) -> None:
    atomic_write(path, OBJECT_MAGIC + hashlib.sha256(obj).digest() + obj)


def object_key(ir_text: str, target: Target, tm) -> str:
    import llvmlite

    cpu = llvm.get_host_cpu_name() + llvm.get_host_cpu_features().flatten() if target.mcpu == "native" else ""
    parts = [ir_text, RUNTIME_IR, str(target), tm.triple, cpu, llvmlite.__version__]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
