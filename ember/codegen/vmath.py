"""Vector math in plain arithmetic, for the renderers of targets without a vector math library.

A kernel's compute says `exp`; the renderer decides how a vector of them is computed: on C targets a float32
vector exp is an inline helper in vector arithmetic (`c_vector_exp`: range reduction, a polynomial, 2^n built
from its exponent bits, on AVX-512 with 2^(j/16) from a 16-entry table in a register; no call, about 1 ulp),
the native exp on GPUs, and on LLVM the same portable arithmetic built in LLVM IR (`LLVMCodegen.vector_exp`),
so that it vectorizes where the C library's expf runs once per lane. The arithmetic float32 exp of
`ember.templates.nn.exp`, whose 2^n factors come from a constant table (`EXP2_TABLE`, a gather), remains for
renderers without either.

`vector_exp(x)` gives that arithmetic as a tir expression over the vector `x`; the renderer emits it like
any other expression and defines `EXP2_TABLE` once per module as constant data (`exp2_table_values`).
"""

from __future__ import annotations

import numpy as np

from ..templates.nn import EXP_LOW
from ..templates.nn import exp as arithmetic_exp
from ..tir.dtype import float32
from ..tir.expr import BinOp, Broadcast, Call, Cast, Const, Expr, Load, Select, Var
from ..tir.stmt import Buffer

EXP2_TABLE = Buffer("ember_exp2_table", (280,), "float32")  # 2^(k - 151): see templates.nn.exp_table


def exp2_table_values() -> np.ndarray:
    """The contents of EXP2_TABLE (exact powers of two; the smallest round to 0, the largest is inf)."""
    with np.errstate(over="ignore"):
        return np.ldexp(np.float32(1.0), np.arange(280) - 151).astype(np.float32)


class _Table:
    """Indexing as `arithmetic_exp` does with a te table, giving loads of EXP2_TABLE."""

    def __getitem__(self, index: Expr) -> Expr:
        return Load(EXP2_TABLE, (index,))


def wants_arithmetic_exp(name: str, dt) -> bool:
    """Whether a call is a vector float32 exp (the one the arithmetic replaces)."""
    return name == "exp" and dt.lanes > 1 and dt.scalar == float32


def vector_exp(x: Expr) -> Expr:
    """exp of the float32 vector x in arithmetic and selects, reading 2^n from EXP2_TABLE."""
    lanes = x.dtype.lanes
    scalar = Var("x", float32)
    return _lift(arithmetic_exp(scalar, _Table()), scalar, x, lanes, {})


def _lift(e: Expr, var: Var, value: Expr, lanes: int, memo: dict[int, Expr]) -> Expr:
    """The scalar expression e of var, computed on every lane of value (shared subexpressions stay shared)."""
    if e is var:
        return value
    if id(e) in memo:
        return memo[id(e)]

    def lift(c: Expr) -> Expr:
        return _lift(c, var, value, lanes, memo)

    if isinstance(e, Const):
        out: Expr = Broadcast(e, lanes)
    elif isinstance(e, BinOp):
        out = BinOp(e.op, lift(e.a), lift(e.b), e.dtype.with_lanes(lanes))
    elif isinstance(e, Select):
        out = Select(lift(e.cond), lift(e.t), lift(e.f))
    elif isinstance(e, Cast):
        out = Cast(e.dtype.with_lanes(lanes), lift(e.value))
    elif isinstance(e, Load):
        out = Load(e.buffer, tuple(lift(i) for i in e.indices), e.predicate)
    elif isinstance(e, Call):
        out = Call(e.name, tuple(lift(a) for a in e.args), e.dtype.with_lanes(lanes))
    else:
        raise TypeError(f"vector_exp: cannot lift {type(e).__name__}")
    memo[id(e)] = out
    return out


# Cephes' expf: x = n ln2 + r, |r| <= ln2/2 (Cody-Waite: ln2 = C1 + C2, C1 exact in 9 bits), then
# e^r = 1 + r + r^2 P(r) with P of degree 5 (about 1 ulp on that interval)
EXP_C1, EXP_C2 = 0.693359375, -2.12194440e-4
EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)


def c_vector_exp(name: str, t: str, it: str, lanes: int = 0) -> str:
    """A C function `t name(t x)`: exp of a float32 vector (GNU vector types `t`, its int32 twin `it`) in vector
    arithmetic, inline in the kernel (glibc's vector expf is a call and redoes a whole vector lane by lane when
    one lane is below ln(FLT_MIN), as in masked softmax scores).

    x is clamped to [EXP_LOW, 88.8] (NaN passes through: both compares are false); n = rint(x log2 e) by the
    1.5 * 2^23 trick, whose float bits hold n in their low bits; 2^n is applied as 2^(n >> 1) * 2^(n - (n >> 1)),
    two normal powers built from exponent bits, so that exp(88.72..) stays finite. exp(-inf) = 0,
    exp(x > ln FLT_MAX) = inf, exp(NaN) = NaN (P of NaN).

    Results below FLT_MIN are 0 (x < EXP_LOW, just above ln FLT_MIN: the flush XNNPACK's exps make too): a
    subnormal result costs the CPU a microcode assist (AMD Zen here: a vector of exps took ~45 cycles, not ~8,
    when some lanes were subnormal), and every masked score of a softmax (-inf, -1e4, or a padded column) is such
    a lane; its 0 is exact where the subnormal was the rounding of something that small.

    With AVX-512 (16 lanes, compiled with __AVX512F__) the reduction is finer: x = (16 k + j) ln2/16 + r with
    |r| <= ln2/32, e^x = 2^k * 2^(j/16) * e^r; 2^(j/16) is one of 16 constants held in a register, picked
    per lane by vpermps (j is the low 4 bits of n = 16 k + j), e^r - 1 = r q(r) with q of degree 2, and the
    product T + T (r q) is one rounding (`avx512_exp`): 11 vector instructions instead of 17, 9.6 cycles a
    vector of 16 instead of 11.8 here (Zen 4), at most 0.97 ulp from exp over [-87, 88] (the degree-7
    path: 1.00). The upper clamp is vminps (its NaN operand second: it passes), n is rounded by vrndscaleps,
    and 2^k applied by vscalefps (exact scaling, infinite results rounded once), zeroing the lanes below
    EXP_LOW in the same instruction (so no lower clamp: those lanes' garbage is discarded)."""
    c1, c2 = EXP_C1, EXP_C2
    poly = f"{EXP_POLY[0]:.10e}f"
    for c in EXP_POLY[1:]:
        poly = f"({poly}) * r + {c:.10e}f"
    portable = _c_vector_exp_portable(name, t, it, c1, c2, poly)
    if lanes != 16:
        return portable
    avx512 = avx512_exp(name, t)
    return f"#if defined(__AVX512F__)\n#include <immintrin.h>\n{avx512}\n#else\n{portable}\n#endif"


# e^x = 2^k 2^(j/16) e^r: ln2/16 = EXP16_C1 + EXP16_C2 (C1 exact in 12 bits: n C1 is exact for |n| < 2^12), and
# e^r - 1 = r (Q0 + Q1 r + Q2 r^2) on |r| <= ln2/32 (a least-squares fit at 4000 Chebyshev nodes, weighted by
# 1/e^r: relative error 1.1e-9 before rounding)
EXP16_C1, EXP16_C2 = 0.0433197021484375, 1.9966364561696537e-06
EXP16_Q = (1.000000002866329, 0.5000195488232507, 0.16666177930053508)


def avx512_exp(name: str, t: str) -> str:
    """The AVX-512 body of `c_vector_exp` (see there): a 16-entry table of 2^(j/16) in a register."""
    table = ", ".join(f"{float(np.float32(2.0 ** (j / 16))).hex()}f" for j in range(16))
    q0, q1, q2 = (f"{c!r}f" for c in EXP16_Q)
    return "\n".join([
        f"static inline {t} {name}({t} x) {{",
        f"  const __m512 pow2_16ths = (__m512)(__v16sf){{{table}}};  /* 2^(j/16), j = 0..15 */",
        "  const __m512 v = _mm512_min_ps(_mm512_set1_ps(88.8f), (__m512)x);",
        f"  const __mmask16 normal = _mm512_cmp_ps_mask((__m512)x, _mm512_set1_ps({EXP_LOW}f), _CMP_NLT_UQ);",
        "  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(v, _mm512_set1_ps(23.083120654223414f)),  /* 16/ln2 */",
        "                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);",
        f"  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps({EXP16_C1!r}f), v);",
        f"  r = _mm512_fnmadd_ps(n, _mm512_set1_ps({EXP16_C2!r}f), r);",
        f"  const __m512 q = _mm512_mul_ps(_mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps({q2}), r,"
        f" _mm512_set1_ps({q1})), r, _mm512_set1_ps({q0})), r);",
        "  const __m512i nj = _mm512_cvtps_epi32(n);",
        "  const __m512 pj = _mm512_permutexvar_ps(nj, pow2_16ths);  /* by the low 4 bits: j */",
        "  const __m512 k = _mm512_cvtepi32_ps(_mm512_srai_epi32(nj, 4));",
        f"  return ({t})_mm512_maskz_scalef_ps(normal, _mm512_fmadd_ps(pj, q, pj), k);",
        "}",
    ])  # fmt: skip


def _c_vector_exp_portable(name: str, t: str, it: str, c1: float, c2: float, poly: str) -> str:
    return "\n".join([
        f"static inline {t} {name}({t} x) {{",
        f"  const {t} lo = ({t}){{}} + {EXP_LOW}f, hi = ({t}){{}} + 88.8f;",
        f"  const {it} below = x < lo, above = x > hi;",
        f"  x = ({t})((({it})x & ~below) | (({it})lo & below));",
        f"  x = ({t})((({it})x & ~above) | (({it})hi & above));",
        f"  const {t} shifter = ({t}){{}} + 12582912.0f;  /* 1.5 * 2^23: adding it rounds to an integer */",
        f"  const {t} t = x * 1.44269504088896341f + shifter;",
        f"  const {t} n = t - shifter;",
        f"  const {t} r = (x - n * {c1!r}f) - n * {c2!r}f;",
        f"  const {t} p = (({poly}) * (r * r) + r) + 1.0f;",
        f"  const {it} k = ({it})t - 0x4B400000;  /* n, from the low bits of t */",
        f"  const {it} k1 = k >> 1, k2 = k - k1;",
        f"  const {t} y = p * ({t})((k1 + 127) << 23) * ({t})((k2 + 127) << 23);",
        f"  return ({t})(({it})y & ~below);  /* 0 below FLT_MIN */",
        "}",
    ])
