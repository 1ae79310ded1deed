"""Tensor intrinsics: a loop nest replaced by one call to a target's dot-product micro-kernel.

An `Intrinsic` is declared as a small TE compute (what it computes, for numpy and for reading) plus its
implementation per target, as C. `Stage.tensorize(axis, "dot_u8s8")` marks a loop; after lowering,
`tensorize_loops` matches the loop nest under it against the intrinsic (one update statement
`C[...] += int32(A[...]) * int32(B[...])`, its loops classified by the buffers they index) and replaces it
by a call `dot_u8s8(&C[..], ldc, &A[..], lda, &B[..], ldb, m, n, k4)`: the strides come from the nest's
index arithmetic, so any schedule around the marked loop (splits, reorders, parallel loops) keeps working.

`dot_u8s8` (u8 x s8 -> s32, the operands of x86's `vpdpbusd`):

    C[i, j] += sum over k4 < K4, kk < 4 of int32(A[i, 4 * k4 + kk]) * int32(B[k4, j, kk])

A is row-major (4 consecutive k of a row are broadcast), B is packed by groups of 4 k per column (the
layout `vpdpbusd` reads: 16 columns x 4 bytes per 512-bit vector). Implementations: AVX-512 VNNI
(`_mm512_dpbusd_epi32`), AVX2 (u8/s8 widened to s16 and `_mm256_madd_epi16`: `vpmaddubsw` would saturate
the sum of two u8*s8 products at 32767, so the pairs are formed in 16 bits from exact products), and
NEON `sdot` on aarch64 CPUs with the dot-product extension (int8 x int8: the uint8 operand is shifted to int8
and 128 times B's column sums added back), and portable C for any other target (and for column counts the
vectors do not divide).

`dot_s8u8` is the same product with the signs swapped (A int8, broadcast; B uint8, packed): weights times
activations (`ember.templates.int8.int8_acc_wx`). On VNNI it takes any column count (the last vector masked);
AVX2 as above; portable C elsewhere (NEON included). `dot_s8u8_rows` is `dot_s8u8` for callers whose C rows are
storage-aligned to 16 columns and whose B columns past n are readable (a W x X tile of padded image rows): it
computes whole tiles of 16 columns, so that AMX takes a tile of two 14-pixel rows (30 columns) as 32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..target import Target, feature_key
from ..tir import expr as E
from ..tir.arith import Analyzer
from ..tir.dtype import int32, int64
from ..tir.functor import substitute, transform, walk
from ..tir.stmt import Evaluate, For, PrimFunc, Seq, Stmt, Store
from .tensor import Tensor, compute, placeholder, reduce_axis
from .tensor import sum as te_sum

TENSORIZE = "tensorize"  # the pragma key a tensorize step puts on its loop
ADDRESS = "address_of"  # Call(ADDRESS, (Load,)): the address of a buffer element (an intrinsic's operand)
PREFETCH = "prefetch"  # Evaluate(Call(PREFETCH, (Load,))): bring that element's cache line into L2 (`Stage.prefetch`)


class TensorizeError(ValueError):
    """A loop nest that does not match the intrinsic it is tensorized with; names the loop and the reason."""


@dataclass(frozen=True)
class Intrinsic:
    """A micro-kernel: its semantics as a TE compute (`decl(m, n, k4)` -> (A, B, C)) and its C per target."""

    name: str
    doc: str
    decl: Callable[[int, int, int], tuple[Tensor, Tensor, Tensor]]
    c_impl: Callable[..., tuple[str, str]]  # (m, n, isa, zero=False) -> (function name, code); zero: C = A . B
    # columns computed in multiples of this where C's row stride holds them (0: exactly n): the caller's C rows
    # are storage-aligned and B's columns past n readable (a padded image's grid), so the call may write and read
    # whole tiles (AMX's 16 columns) past the n its tile needs
    whole_columns: int = 0


def _dot_decl(a_dtype: str, b_dtype: str) -> Callable[[int, int, int], tuple[Tensor, Tensor, Tensor]]:
    """The TE declaration of an m x n tile of 4-byte dot products, `a_dtype` rows against `b_dtype` columns."""

    def decl(m: int, n: int, k4: int) -> tuple[Tensor, Tensor, Tensor]:
        a = placeholder((m, 4 * k4), a_dtype, name="A")
        b = placeholder((k4, n, 4), b_dtype, name="B")
        ko = reduce_axis((0, k4), name="k4")
        ki = reduce_axis((0, 4), name="kk")
        c = compute((m, n), lambda i, j: te_sum(_i32(a[i, 4 * ko + ki]) * _i32(b[ko, j, ki]), axis=[ko, ki]),
                    name="C")  # fmt: skip
        return a, b, c

    return decl


def _i32(v):
    from .tensor import cast

    return cast(v, "int32")


DOTPROD_CPUS = {"cortex-a55", "cortex-a76", "cortex-a78", "cortex-x1", "neoverse-n1", "neoverse-n2", "neoverse-v1",
                "apple-m1"}  # aarch64 CPUs with the dot-product extension (sdot/udot)


def isa_features(target: Target) -> frozenset[str]:
    """The instruction-set features the intrinsics' implementations choose by: x86 SIMD features, or "dotprod"
    for an aarch64 target whose CPU (or -mattr=+dotprod) has sdot."""
    arch = target.arch
    if arch is not None and arch.name == "aarch64":
        dot = "+dotprod" in target.mattr or (target.mcpu in DOTPROD_CPUS and "-dotprod" not in target.mattr)
        return frozenset({"dotprod"} if dot else ())
    return target.simd_features()


def _signature(a_signed: bool) -> str:
    a, b = ("int8_t", "uint8_t") if a_signed else ("uint8_t", "int8_t")
    return f"(int32_t* c, long ldc, const {a}* a, long lda, const {b}* b, long ldb, long k4)"


def dot_u8s8_isa(features: frozenset[str], n: int, a_signed: bool = False) -> str:
    """The implementation used for n columns on a target with these features (`isa_features`): avx512_vnni,
    avx2, neon_dotprod (u8 x s8 only), or c. `a_signed`: the s8 x u8 form (`dot_s8u8`)."""
    have = {feature_key(f) for f in features}  # (cpuinfo's and -mattr's spellings)
    if (n % 16 == 0 or a_signed) and "avx512vnni" in have:
        return "avx512_vnni"  # dot_s8u8: any n, the last vector masked
    if n % 8 == 0 and "avx2" in features:
        return "avx2"
    if n % 4 == 0 and "dotprod" in features and not a_signed:
        return "neon_dotprod"
    return "c"


VNNI_REGISTERS = 32  # zmm registers: a tile's accumulators, its operand vectors and broadcasts


def _dot_u8s8_c(m: int, n: int, features: frozenset[str], zero: bool = False) -> tuple[str, str]:
    return _dot_c(m, n, features, False, zero)


def _dot_s8u8_c(m: int, n: int, features: frozenset[str], zero: bool = False) -> tuple[str, str]:
    return _dot_c(m, n, features, True, zero)


AMX_TILES = 8  # tile registers: the C tiles, a tile of A per 16 rows and a tile of B per 16 columns
AMX_ROWS = 8  # rows per call of the vpdpbusd kernel an AMX tile falls back to


def amx_tiles(features: frozenset[str], m: int, n: int, kind: str = "int8") -> bool:
    """Whether an m x n tile of dot products runs on AMX (Intel's tile registers: `tdpbusd` multiplies a 16 x 64
    byte tile of A by a 16 x 64 byte tile of B, 16K products an instruction): the CPU has amx_int8, and m and n
    are whole 16 x 16 tiles that, with their tiles of A and B, fit the 8 tile registers (32 x 32, 16 x 48 ...).
    `kind` "bf16": the same tiles of bfloat16 pairs on amx_bf16 (`tdpbf16ps`), float32 accumulators."""
    have = {feature_key(f) for f in features}  # (cpuinfo's and -mattr's spellings)
    need = {"amxbf16", "amxtile", "avx512bf16"} if kind == "bf16" else {"amxint8", "amxtile", "avx512vnni"}
    if not need <= have or m % 16 or n % 16:
        return False
    return (m // 16) * (n // 16) + m // 16 + n // 16 <= AMX_TILES


_AMX_HELPERS = """#ifndef EMBER_AMX
#define EMBER_AMX
#include <sys/syscall.h>
#include <unistd.h>
/* Linux gives a process AMX's tile data only on request (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
   asked once, -1 unknown, 0 refused (the vpdpbusd kernels then), 1 granted */
static int ember_amx_state = -1;
static inline int ember_amx_ready(void) {
  int s = __atomic_load_n(&ember_amx_state, __ATOMIC_RELAXED);
  if (s < 0) {
    s = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    __atomic_store_n(&ember_amx_state, s, __ATOMIC_RELAXED);
  }
  return s;
}
/* all 8 tile registers as 16 rows x 64 bytes (palette 1), loaded where the thread's configuration is another
   (another library's, or none yet): reading it back costs less than loading it at every call */
typedef struct { uint8_t palette, start; uint8_t reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } ember_amx_cfg;
static inline void ember_amx_config(void) {
  ember_amx_cfg want, have;
  memset(&want, 0, sizeof want);
  want.palette = 1;
  for (int t = 0; t < 8; ++t) { want.colsb[t] = 64; want.rows[t] = 16; }
  _tile_storeconfig(&have);
  if (memcmp(&want, &have, sizeof want) != 0) _tile_loadconfig(&want);
}
#endif
"""


def _amx_kernel_c(name: str, signature: str, m: int, n: int, zero: bool, k: str, group: int, esize: int, dp: str,
                  fallback: tuple[str, str], what: str) -> tuple[str, str]:  # fmt: skip
    """The C of an AMX tile kernel C[m x n] (+)= A . B (`amx_tiles`): C in 16 x 16 tiles of 32-bit accumulators, K in
    steps of 16 groups of `group` elements of `esize` bytes (64 bytes of a row of A; B's panel rows are the tile's
    rows as packed), the product instruction `dp`. Where the process may not use AMX, or `k` (the groups of K) is
    not a multiple of 16, the `fallback` kernel (name, code) on blocks of AMX_ROWS rows."""
    mt, nt = m // 16, n // 16
    fb_name, fb_code = fallback
    c_tile = [[r * nt + j for j in range(nt)] for r in range(mt)]
    a_tile = [mt * nt + r for r in range(mt)]
    b_tile = [mt * nt + mt + j for j in range(nt)]
    stride = "" if esize == 1 else f" * {esize}"
    lines = [f"  /* C[{m}x{n}] {'=' if zero else '+='} A . B on AMX: {mt} x {nt} tiles of 16 x 16 {what}, {mt} of A "
             f"and {nt} of B per 64 bytes of K */",
             f"  if ({k} % 16 == 0 && ember_amx_ready()) {{",
             "    ember_amx_config();"]  # fmt: skip
    for r in range(mt):
        for j in range(nt):
            lines.append(f"    _tile_zero({c_tile[r][j]});" if zero else
                         f"    _tile_loadd({c_tile[r][j]}, c + {16 * r} * ldc + {16 * j}, ldc * 4);")  # fmt: skip
    lines.append(f"    for (long p = 0; p < {k}; p += 16) {{")
    lines += [f"      _tile_loadd({a_tile[r]}, a + {16 * r} * lda + {group} * p, lda{stride});" for r in range(mt)]
    lines += [f"      _tile_loadd({b_tile[j]}, b + p * ldb + {16 * group * j}, ldb{stride});" for j in range(nt)]
    lines += [f"      {dp}({c_tile[r][j]}, {a_tile[r]}, {b_tile[j]});" for r in range(mt) for j in range(nt)]
    lines.append("    }")
    lines += [f"    _tile_stored({c_tile[r][j]}, c + {16 * r} * ldc + {16 * j}, ldc * 4);"
              for r in range(mt) for j in range(nt)]  # fmt: skip
    fb = f"{fb_name}(c + r * ldc, ldc, a + r * lda, lda, b, ldb, {k});"
    lines += ["    return;", "  }", f"  for (int r = 0; r < {m}; r += {AMX_ROWS}) {fb}"]
    head = f"static inline void {name}{signature} {{\n"
    return name, "#include <immintrin.h>\n#include <string.h>\n" + _AMX_HELPERS + fb_code + "\n" + head + \
        "\n".join(lines) + "\n}"


def _dot_amx_c(m: int, n: int, features: frozenset[str], a_signed: bool, zero: bool) -> tuple[str, str]:
    """C[m x n] (+)= A . B on AMX tiles (`amx_tiles`): `tdpbusd` (`tdpbsud` for A signed), int32 accumulators, K in
    groups of 4 bytes; where AMX is refused or K is no multiple of 64 bytes, the vpdpbusd kernel (`_amx_kernel_c`)."""
    tag = "s8u8" if a_signed else "u8s8"
    name = f"ember_dot_{tag}_{m}x{n}_amx{'_set' if zero else ''}"
    dp = "_tile_dpbsud" if a_signed else "_tile_dpbusd"
    return _amx_kernel_c(name, _signature(a_signed), m, n, zero, "k4", 4, 1, dp,
                         _dot_c(AMX_ROWS, n, features, a_signed, zero), "int32")  # fmt: skip


def _dot_s8u8_256_c(m: int, n: int, features: frozenset[str], zero: bool = False) -> tuple[str, str]:
    return _dot_c(m, n, features, True, zero, 256 if "avx512vl" in features else 512)


def _dot_c(m: int, n: int, features: frozenset[str], a_signed: bool, zero: bool = False,
           bits: int = 512) -> tuple[str, str]:  # fmt: skip
    """The C of C[m x n] += A . B: A uint8 and B int8 (`dot_u8s8`), or A int8 and B uint8 (`a_signed`, `dot_s8u8`:
    the same instruction with the broadcast row operand as its signed source). `zero`: C = A . B (the tile is not
    read: its accumulators start at zero in registers). `bits`: the VNNI vectors' width, 256 (`dot_s8u8_256`: 8
    columns a vector, AVX512VL) where 8 divides n better than 16 (a 7 x 7 image's 49 pixels: 7 vectors of 8,
    87% of the lanes, against 4 of 16, 77%; on a CPU that runs a 512-bit vpdpbusd as two 256-bit halves, such as
    Zen 4, the same products per cycle). A 512-bit tile that AMX takes (`amx_tiles`) runs there (`_dot_amx_c`)."""
    if bits == 512 and amx_tiles(features, m, n):
        return _dot_amx_c(m, n, features, a_signed, zero)
    isa = dot_u8s8_isa(features, n, a_signed)
    wide = "_y" if isa == "avx512_vnni" and bits == 256 else ""
    name = f"ember_dot_{'s8u8' if a_signed else 'u8s8'}_{m}x{n}_{isa}{wide}{'_set' if zero else ''}"
    head = f"static inline void {name}{_signature(a_signed)} {{\n"
    if isa == "avx512_vnni":
        lanes = bits // 32
        nv, tail = -(-n // lanes), n % lanes
        cs = [[f"c{r}_{v}" for v in range(nv)] for r in range(m)]
        vec, pre = ("__m512i", "_mm512") if bits == 512 else ("__m256i", "_mm256")

        def load(v: int, addr: str) -> str:  # the last vector of a tail of n % lanes columns: masked (no read past n)
            if tail and v == nv - 1:
                return f"{pre}_maskz_loadu_epi32(tail, {addr})"
            return f"_mm512_loadu_si512({addr})" if bits == 512 else f"_mm256_loadu_si256((const __m256i*)({addr}))"

        def store(r: int, v: int) -> str:
            addr = f"c + {r} * ldc + {lanes * v}"
            if tail and v == nv - 1:
                return f"  {pre}_mask_storeu_epi32({addr}, tail, {cs[r][v]});"
            if bits == 512:
                return f"  _mm512_storeu_si512({addr}, {cs[r][v]});"
            return f"  _mm256_storeu_si256((__m256i*)({addr}), {cs[r][v]});"

        op = "=" if zero else "+="
        lines = [f"  /* C[{m}x{n}] {op} A[{m}x4k] . B[k][{n}][4] with vpdpbusd: {m * nv} accumulators of {lanes} "
                 "columns */"]  # fmt: skip
        if tail:
            lines.append(f"  const __mmask{max(lanes, 8)} tail = 0x{(1 << tail) - 1:x};  /* the last {tail} columns */")
        zero_v = "_mm512_setzero_si512()" if bits == 512 else "_mm256_setzero_si256()"
        init = [zero_v if zero else load(v, f"c + {r} * ldc + {lanes * v}") for r in range(m) for v in range(nv)]
        lines += [f"  {vec} {cs[r][v]} = {init[r * nv + v]};" for r in range(m) for v in range(nv)]
        lines.append("  for (long p = 0; p < k4; ++p) {")
        ops = [[f"b{v}, a{r}" if a_signed else f"a{r}, b{v}" for v in range(nv)] for r in range(m)]  # unsigned first
        step = 4 * lanes  # bytes of B per vector
        bcast = [f"    const {vec} a{r} = {pre}_set1_epi32(ember_load4(a + {r} * lda + 4 * p));" for r in range(m)]
        if (m + 1) * nv + 1 <= VNNI_REGISTERS:  # the row of B in registers, one broadcast of A at a time
            lines += [f"    const {vec} b{v} = {load(v, f'b + p * ldb + {step * v}')};" for v in range(nv)]
            for r in range(m):
                lines.append(bcast[r])
                lines += [f"    EMBER_DPBUSD({cs[r][v]}, {ops[r][v]});" for v in range(nv)]
        else:  # a wide tile (a 14 x 14 image's 13 vectors): the m broadcasts in registers, one vector of B at a time
            lines += bcast
            for v in range(nv):
                lines.append(f"    const {vec} b{v} = {load(v, f'b + p * ldb + {step * v}')};")
                lines += [f"    EMBER_DPBUSD({cs[r][v]}, {ops[r][v]});" for r in range(m)]
        lines.append("  }")
        lines += [store(r, v) for r in range(m) for v in range(nv)]
        body = "\n".join(lines) + "\n"
    elif isa == "avx2":
        nv = n // 8
        ax, bx = ("i", "u") if a_signed else ("u", "i")
        body = (
            f"  /* C[{m}x{n}] += A[{m}x4k] . B[k][{n}][4]: u8/s8 widened to s16, exact pair sums with vpmaddwd;\n"
            "     lo/hi hold columns 0-3/4-7 of each group of 8 as pairs, added and reordered once at the end */\n"
            f"  __m256i lo[{m}][{nv}], hi[{m}][{nv}];\n"
            f"  for (int r = 0; r < {m}; ++r)\n"
            f"    for (int v = 0; v < {nv}; ++v) lo[r][v] = hi[r][v] = _mm256_setzero_si256();\n"
            "  for (long p = 0; p < k4; ++p) {\n"
            f"    __m256i bl[{nv}], bh[{nv}];\n"
            f"    for (int v = 0; v < {nv}; ++v) {{\n"
            "      const __m256i bb = _mm256_loadu_si256((const __m256i*)(b + p * ldb + 32 * v));\n"
            f"      bl[v] = _mm256_cvtep{bx}8_epi16(_mm256_castsi256_si128(bb));\n"
            f"      bh[v] = _mm256_cvtep{bx}8_epi16(_mm256_extracti128_si256(bb, 1));\n"
            "    }\n"
            f"    for (int r = 0; r < {m}; ++r) {{\n"
            "      int32_t a4;\n"
            "      memcpy(&a4, a + r * lda + 4 * p, 4);\n"
            f"      const __m256i av = _mm256_cvtep{ax}8_epi16(_mm_set1_epi32(a4));\n"
            f"      for (int v = 0; v < {nv}; ++v) {{\n"
            "        lo[r][v] = _mm256_add_epi32(lo[r][v], _mm256_madd_epi16(av, bl[v]));\n"
            "        hi[r][v] = _mm256_add_epi32(hi[r][v], _mm256_madd_epi16(av, bh[v]));\n"
            "      }\n"
            "    }\n"
            "  }\n"
            f"  for (int r = 0; r < {m}; ++r)\n"
            f"    for (int v = 0; v < {nv}; ++v) {{\n"
            "      const __m256i s = _mm256_permute4x64_epi64(_mm256_hadd_epi32(lo[r][v], hi[r][v]), 0xD8);\n"
            "      __m256i* cp = (__m256i*)(c + r * ldc + 8 * v);\n"
            + ("      _mm256_storeu_si256(cp, s);\n" if zero else
               "      _mm256_storeu_si256(cp, _mm256_add_epi32(_mm256_loadu_si256(cp), s));\n")
            + "    }\n"
        )
    elif isa == "neon_dotprod":
        nv = n // 4
        lines = [f"  /* C[{m}x{n}] += A[{m}x4k] . B[k][{n}][4] with sdot (int8 x int8): a ^ 0x80 = a - 128 as int8,",
                 "     so C += sdot(a ^ 0x80, B) + 128 * (B's column sums, one more sdot against ones) */"]
        lines += [f"  int32x4_t c{r}_{v} = {'vdupq_n_s32(0)' if zero else f'vld1q_s32(c + {r} * ldc + {4 * v})'};"
                  for r in range(m) for v in range(nv)]  # fmt: skip
        lines += [f"  int32x4_t s{v} = vdupq_n_s32(0);" for v in range(nv)]
        lines += ["  const int8x16_t ones = vdupq_n_s8(1);", "  const uint8x16_t flip = vdupq_n_u8(0x80);"]
        lines.append("  for (long p = 0; p < k4; ++p) {")
        for v in range(nv):
            lines.append(f"    const int8x16_t b{v} = vld1q_s8(b + p * ldb + {16 * v});")
            lines.append(f"    s{v} = vdotq_s32(s{v}, ones, b{v});")
        for r in range(m):
            lines.append(f"    const int8x16_t a{r} = vreinterpretq_s8_u8(veorq_u8(vreinterpretq_u8_u32("
                         f"vdupq_n_u32((uint32_t)ember_load4(a + {r} * lda + 4 * p))), flip));")  # fmt: skip
            lines += [f"    c{r}_{v} = vdotq_s32(c{r}_{v}, a{r}, b{v});" for v in range(nv)]
        lines.append("  }")
        lines += [f"  vst1q_s32(c + {r} * ldc + {4 * v}, vaddq_s32(c{r}_{v}, vshlq_n_s32(s{v}, 7)));" for r in range(m)
                  for v in range(nv)]  # fmt: skip
        body = "\n".join(lines) + "\n"
    else:
        body = (
            f"  for (int r = 0; r < {m}; ++r)\n"
            f"    for (int j = 0; j < {n}; ++j) {{\n"
            f"      int32_t s = {'0' if zero else 'c[r * ldc + j]'};\n"
            "      for (long p = 0; p < k4; ++p)\n"
            "        for (int q = 0; q < 4; ++q)\n"
            "          s += (int32_t)a[r * lda + 4 * p + q] * (int32_t)b[p * ldb + 4 * j + q];\n"
            "      c[r * ldc + j] = s;\n"
            "    }\n"
        )
    include = {"c": "", "neon_dotprod": "#include <arm_neon.h>\n"}.get(isa, "#include <immintrin.h>\n")
    if isa == "neon_dotprod":
        include += ("#ifndef EMBER_LOAD4\n#define EMBER_LOAD4\n"
                    "static inline int32_t ember_load4(const uint8_t* p) { int32_t v; memcpy(&v, p, 4); return v; }\n"
                    "#endif\n")
    if isa == "avx512_vnni":  # in place: GCC copies the accumulator around _mm512_dpbusd_epi32 (a move per call)
        include += ("#ifndef EMBER_DPBUSD\n#define EMBER_DPBUSD(acc, a, b) "
                    "__asm__(\"vpdpbusd %2, %1, %0\" : \"+v\"(acc) : \"v\"(a), \"v\"(b))\n#endif\n"
                    "#ifndef EMBER_LOAD4\n#define EMBER_LOAD4\n"
                    "static inline int32_t ember_load4(const uint8_t* p) { int32_t v; memcpy(&v, p, 4); return v; }\n"
                    "#endif\n")
    guard = f"#ifndef {name.upper()}\n#define {name.upper()}\n"  # (the AMX kernels' fallback may define it first)
    return name, include + guard + head + body + "}\n#endif"


def _bf16_decl(m: int, n: int, k2: int) -> tuple[Tensor, Tensor, Tensor]:
    """C[m, n] (float32) += A[m, 2 * k2] . B[k2, n, 2], bfloat16 operands: pairs of k, as vdpbf16ps reads them."""
    a = placeholder((m, 2 * k2), "bfloat16", name="A")
    b = placeholder((k2, n, 2), "bfloat16", name="B")
    ko = reduce_axis((0, k2), name="k2")
    ki = reduce_axis((0, 2), name="kk")
    c = compute((m, n), lambda i, j: te_sum(_f32(a[i, 2 * ko + ki]) * _f32(b[ko, j, ki]), axis=[ko, ki]), name="C")
    return a, b, c


def _f32(v):
    from .tensor import cast

    return cast(v, "float32")


def dot_bf16_isa(features: frozenset[str], n: int) -> str:
    """The implementation of `dot_bf16` for n columns: avx512_bf16 (vdpbf16ps, 16 columns a vector), or c."""
    return "avx512_bf16" if n % 16 == 0 and "avx512bf16" in {feature_key(f) for f in features} else "c"


def _dot_bf16_amx_c(m: int, n: int, features: frozenset[str], zero: bool) -> tuple[str, str]:
    """C[m x n] (+)= A . B in float32 from bfloat16 pairs on AMX tiles (`amx_tiles(..., "bf16")`: `tdpbf16ps`
    multiplies 16 rows x 32 bfloat16 of A by 16 pairs x 16 columns of B, B's packed panel rows as they are).
    Where the process may not use AMX, or K is not a multiple of 32, the vdpbf16ps kernel on blocks of AMX_ROWS
    rows. Products are exact and sums float32 either way; the order of the sums differs (not bit-equal)."""
    name = f"ember_dot_bf16_{m}x{n}_amx{'_set' if zero else ''}"
    signature = "(float* c, long ldc, const uint16_t* a, long lda, const uint16_t* b, long ldb, long k2)"
    return _amx_kernel_c(name, signature, m, n, zero, "k2", 2, 2, "_tile_dpbf16ps",
                         _dot_bf16_c(AMX_ROWS, n, features, zero, amx=False), "float32")  # fmt: skip


def _dot_bf16_c(m: int, n: int, features: frozenset[str], zero: bool = False, amx: bool = True) -> tuple[str, str]:
    """C[m x n] += A[m x 2k] . B[k][n][2] in float32 from bfloat16 pairs: on AMX tiles where they fit
    (`_dot_bf16_amx_c`), else `_mm512_dpbf16_ps` (each lane adds a0 * b0 + a1 * b1 of one column's pair;
    products exact, sums rounded to float32, denormals flushed), or the same sums in portable C (bf16 -> float32
    is a 16-bit shift). `zero`: C = A . B (the tile is not read)."""
    if amx and amx_tiles(features, m, n, "bf16"):
        return _dot_bf16_amx_c(m, n, features, zero)
    isa = dot_bf16_isa(features, n)
    name = f"ember_dot_bf16_{m}x{n}_{isa}{'_set' if zero else ''}"
    head = f"static inline void {name}(float* c, long ldc, const uint16_t* a, long lda, const uint16_t* b, long ldb, " \
           "long k2) {\n"  # fmt: skip
    if isa == "avx512_bf16":
        nv = n // 16
        cs = [[f"c{r}_{v}" for v in range(nv)] for r in range(m)]
        lines = [f"  /* C[{m}x{n}] += A[{m}x2k] . B[k][{n}][2] with vdpbf16ps: {m * nv} accumulators of 16 columns */"]
        lines += [f"  __m512 {cs[r][v]} = " + ("_mm512_setzero_ps();" if zero else
                                                f"_mm512_loadu_ps(c + {r} * ldc + {16 * v});")
                  for r in range(m) for v in range(nv)]  # fmt: skip
        lines.append("  for (long p = 0; p < k2; ++p) {")
        lines += [f"    const __m512bh b{v} = (__m512bh)_mm512_loadu_si512(b + p * ldb + {32 * v});" for v in range(nv)]
        for r in range(m):
            pair = f"ember_load_pair(a + {r} * lda + 2 * p)"  # one row's pair of k, broadcast
            lines.append(f"    const __m512bh a{r} = (__m512bh)_mm512_set1_epi32({pair});")
            lines += [f"    {cs[r][v]} = _mm512_dpbf16_ps({cs[r][v]}, a{r}, b{v});" for v in range(nv)]
        lines.append("  }")
        lines += [f"  _mm512_storeu_ps(c + {r} * ldc + {16 * v}, {cs[r][v]});" for r in range(m) for v in range(nv)]
        body = "\n".join(lines) + "\n"
        include = ("#include <immintrin.h>\n#ifndef EMBER_LOAD_PAIR\n#define EMBER_LOAD_PAIR\n"
                   "static inline int32_t ember_load_pair(const uint16_t* p) {\n"
                   "  int32_t v; memcpy(&v, p, 4); return v;\n}\n"
                   "#endif\n")  # fmt: skip
    else:
        body = (
            "  /* bfloat16 -> float32: the 16 bits are the float's high half */\n"
            f"  for (int r = 0; r < {m}; ++r)\n"
            f"    for (int j = 0; j < {n}; ++j) {{\n"
            f"      float s = {'0.0f' if zero else 'c[r * ldc + j]'};\n"
            "      for (long p = 0; p < k2; ++p) {\n"
            "        uint32_t a0 = (uint32_t)a[r * lda + 2 * p] << 16, a1 = (uint32_t)a[r * lda + 2 * p + 1] << 16;\n"
            "        uint32_t b0 = (uint32_t)b[p * ldb + 2 * j] << 16, b1 = (uint32_t)b[p * ldb + 2 * j + 1] << 16;\n"
            "        float x0, x1, y0, y1;\n"
            "        memcpy(&x0, &a0, 4); memcpy(&x1, &a1, 4); memcpy(&y0, &b0, 4); memcpy(&y1, &b1, 4);\n"
            "        s += x0 * y0 + x1 * y1;\n"
            "      }\n"
            "      c[r * ldc + j] = s;\n"
            "    }\n"
        )
        include = ""
    guard = f"#ifndef {name.upper()}\n#define {name.upper()}\n"  # (the AMX kernels' fallback may define it first)
    return name, include + guard + head + body + "}\n#endif"


INTRINSICS: dict[str, Intrinsic] = {
    "dot_u8s8": Intrinsic("dot_u8s8", "C[m, n] += A[m, 4k] (uint8) . B[k, n, 4] (int8), int32 accumulation",
                          _dot_decl("uint8", "int8"), _dot_u8s8_c),
    "dot_s8u8": Intrinsic("dot_s8u8", "C[m, n] += A[m, 4k] (int8) . B[k, n, 4] (uint8), int32 accumulation",
                          _dot_decl("int8", "uint8"), _dot_s8u8_c),
    "dot_s8u8_256": Intrinsic("dot_s8u8_256", "dot_s8u8 in vectors of 8 columns (256 bits; 512 without AVX512VL)",
                              _dot_decl("int8", "uint8"), _dot_s8u8_256_c),
    "dot_s8u8_rows": Intrinsic("dot_s8u8_rows", "dot_s8u8 on whole tiles of 16 columns where C's rows hold them "
                               "(a W x X tile of padded image rows, storage-aligned)", _dot_decl("int8", "uint8"),
                               _dot_s8u8_c, whole_columns=16),
    "dot_bf16": Intrinsic("dot_bf16", "C[m, n] += A[m, 2k] (bfloat16) . B[k, n, 2] (bfloat16), float32 accumulation",
                          _bf16_decl, _dot_bf16_c),
}  # fmt: skip


def get_intrinsic(name: str) -> Intrinsic:
    if name not in INTRINSICS:
        raise TensorizeError(f"unknown intrinsic {name!r}; known: {', '.join(INTRINSICS)}")
    return INTRINSICS[name]


def address_of(load: E.Load) -> E.Expr:
    return E.Call(ADDRESS, (load,), int64)


# -- matching a loop nest ------------------------------------------------------------------------------
def _nest(loop: For) -> tuple[list[For], Store]:
    loops, s = [loop], loop.body
    while isinstance(s, For):
        loops.append(s)
        s = s.body
    if not isinstance(s, Store):
        raise TensorizeError(f"loop '{loop.var.name}': the nest under a tensorized loop must be loops around "
                             f"one update, found {type(s).__name__} (a split that does not divide adds a guard)")
    return loops, s


# name -> (accumulator dtype, the cast around each operand's load, (A dtype, B dtype), values per group)
OPERANDS = {"dot_u8s8": ("int32", "int32", ("uint8", "int8"), 4), "dot_s8u8": ("int32", "int32", ("int8", "uint8"), 4),
            "dot_s8u8_256": ("int32", "int32", ("int8", "uint8"), 4),
            "dot_s8u8_rows": ("int32", "int32", ("int8", "uint8"), 4),
            "dot_bf16": ("float32", "float32", ("bfloat16", "bfloat16"), 2)}  # fmt: skip


def _operands(store: Store, loop: For, name: str) -> tuple[E.Load, E.Load]:
    acc, cast, want, _ = OPERANDS[name]
    v = store.value
    if not (isinstance(v, E.BinOp) and v.op == "add" and isinstance(v.a, E.Load) and v.a.buffer is store.buffer):
        raise TensorizeError(f"loop '{loop.var.name}': the update is not C[...] = C[...] + ..., got {v}")
    prod = v.b
    if not (isinstance(prod, E.BinOp) and prod.op == "mul"):
        raise TensorizeError(f"loop '{loop.var.name}': the update does not add a product, got {prod}")
    ops = []
    for x in (prod.a, prod.b):
        if isinstance(x, E.Cast) and x.dtype.name == cast and isinstance(x.value, E.Load):
            ops.append(x.value)
        else:
            raise TensorizeError(f"loop '{loop.var.name}': operand {x} is not {cast}(load)")
    ops.sort(key=lambda ld: ld.buffer.dtype.name != want[0])
    a, b = ops
    if (a.buffer.dtype.name, b.buffer.dtype.name) != want or store.buffer.dtype.name != acc:
        raise TensorizeError(f"loop '{loop.var.name}': {name} wants {want[0]} x {want[1]} -> {acc}, got "
                             f"{a.buffer.dtype} x {b.buffer.dtype} -> {store.buffer.dtype}")  # fmt: skip
    return a, b


def _flat(ld: E.Load | Store, ana: Analyzer) -> E.Expr:
    """The element offset of an access (row-major)."""
    dt = ld.indices[0].dtype if ld.indices else int32
    off: E.Expr = E.const(0, dt)
    for i, st in zip(ld.indices, ld.buffer.strides):
        off = off + i * st
    return ana.simplify(off)


def _at_zero(ld: E.Load | Store, loops: list[For]) -> E.Load:
    """The access with the region's loop variables at zero: the operand's first element."""
    zero = {f.var: E.const(0, f.var.dtype) for f in loops}
    return E.Load(ld.buffer, tuple(substitute(i, zero) for i in ld.indices))


def _coefs(off: E.Expr, loops: list[For], ana: Analyzer, what: str, loop: For) -> list[int]:
    """Coefficients of the region's loop variables in `off` (checked linear)."""
    zero = {f.var: E.const(0, f.var.dtype) for f in loops}
    base = ana.simplify(substitute(off, zero))
    out = []
    for f in loops:
        one = dict(zero)
        one[f.var] = E.const(1, f.var.dtype)
        d = ana.simplify(substitute(off, one) - base)
        if not isinstance(d, E.Const):
            raise TensorizeError(f"loop '{loop.var.name}': {what} index is not linear in loop '{f.var.name}'")
        out.append(int(d.value))
    # linear check: the expression equals base + sum(coef * var) over the whole region (no div/mod left)
    lin = base
    for f, c in zip(loops, out):
        lin = lin + f.var * c
    if not isinstance(ana.simplify(off - lin), E.Const) or ana.simplify(off - lin).value != 0:
        raise TensorizeError(f"loop '{loop.var.name}': {what} index {off} is not linear in the tensorized loops")
    return out


def _reduction(ks: list[tuple[int, For]], ac: list[int], bc: list[int], loop: For,
               group: int = 4) -> tuple[int, int]:  # fmt: skip
    """(k4, ldb) of the reduction loops: one `kk` of extent `group` (4; 2 for bf16 pairs; stride 1 in A and B), the
    others one run of groups (A strides 4, 4 * e0, ...; B strides ldb, ldb * e0, ...: loops that collapse into
    one)."""
    inner = [(i, f) for i, f in ks if f.extent.value == group and ac[i] == 1 and bc[i] == 1]
    if not inner:
        raise TensorizeError(f"loop '{loop.var.name}': no reduction loop of extent {group} with stride 1 in A and B")
    rest = sorted((x for x in ks if x[0] != inner[0][0]), key=lambda x: ac[x[0]])
    k4, a_next, ldb = 1, group, bc[rest[0][0]] if rest else 0
    for i, f in rest:
        if ac[i] != a_next or bc[i] != ldb * k4:
            raise TensorizeError(f"loop '{loop.var.name}': reduction loop '{f.var.name}' does not continue the "
                                 f"groups of 4 (A stride {ac[i]}, wants {a_next}; B stride {bc[i]}, wants {ldb * k4})")
        k4 *= int(f.extent.value)
        a_next = group * k4
    return k4, ldb


def _match_dot(loop: For, ana: Analyzer, name: str = "dot_u8s8") -> Stmt:
    loops, store = _nest(loop)
    for f in loops:
        if not (isinstance(f.extent, E.Const) and isinstance(f.min, E.Const) and f.min.value == 0):
            raise TensorizeError(f"loop '{f.var.name}' under tensorized '{loop.var.name}' has no constant extent")
        ana.bind(f.var, 0, int(f.extent.value) - 1)
    a, b = _operands(store, loop, name)
    cc = _coefs(_flat(store, ana), loops, ana, "C", loop)
    ac = _coefs(_flat(a, ana), loops, ana, "A", loop)
    bc = _coefs(_flat(b, ana), loops, ana, "B", loop)
    role: dict[str, list[tuple[int, For]]] = {"m": [], "n": [], "k": []}
    for i, f in enumerate(loops):
        if f.extent.value == 1:
            continue
        used = (cc[i] != 0, ac[i] != 0, bc[i] != 0)
        kind = {(True, True, False): "m", (True, False, True): "n", (False, True, True): "k"}.get(used)
        if kind is None:
            raise TensorizeError(f"loop '{f.var.name}' under tensorized '{loop.var.name}' indexes C/A/B as "
                                 f"{used}: each loop must be a row (C, A), a column (C, B) or a reduction (A, B) "
                                 "loop")
        role[kind].append((i, f))
    if len(role["m"]) > 1 or len(role["n"]) > 1:
        raise TensorizeError(f"loop '{loop.var.name}': {name} wants at most one row loop and one column loop "
                             f"under it, found {[f.var.name for f in loops]}")  # fmt: skip
    group = OPERANDS[name][3]
    k4, ldb = _reduction(role["k"], ac, bc, loop, group)
    m, ldc, lda = 1, 0, 0
    if role["m"]:
        im, fm = role["m"][0]
        m, ldc, lda = int(fm.extent.value), cc[im], ac[im]
    n = 1
    if role["n"]:
        jn, fn = role["n"][0]
        n = int(fn.extent.value)
        if cc[jn] != 1 or bc[jn] != group:
            raise TensorizeError(f"loop '{fn.var.name}': columns must be contiguous in C and {group} apart in B "
                                 f"(strides {cc[jn]}, {bc[jn]})")  # fmt: skip
    args = (
        address_of(_at_zero(store, loops)), E.const(ldc, int64),
        address_of(_at_zero(a, loops)), E.const(lda, int64),
        address_of(_at_zero(b, loops)), E.const(ldb, int64),
        E.const(m, int64), E.const(n, int64), E.const(k4, int64),
    )  # fmt: skip
    return Evaluate(E.Call(name, args, int32))  # (the call's value is unused)


MATCHERS: dict[str, Callable[[For, Analyzer], Stmt]] = {
    "dot_u8s8": _match_dot,
    "dot_s8u8": lambda loop, ana: _match_dot(loop, ana, "dot_s8u8"),
    "dot_s8u8_256": lambda loop, ana: _match_dot(loop, ana, "dot_s8u8_256"),
    "dot_s8u8_rows": lambda loop, ana: _match_dot(loop, ana, "dot_s8u8_rows"),
    "dot_bf16": lambda loop, ana: _match_dot(loop, ana, "dot_bf16"),
}


def tensorize_loops(func: PrimFunc) -> PrimFunc:
    """Replace each loop marked by a tensorize step by its intrinsic's call (accesses as flat offsets); a call
    right after the loops that zero exactly its tile computes C = A . B instead (`_fold_zero_init`)."""
    if not any(isinstance(n, For) and any(k == TENSORIZE for k, _ in n.annotations)
               for n in walk(func.body, unique=True)):
        return func

    def post(n):
        if isinstance(n, For):
            for key, name in n.annotations:
                if key == TENSORIZE:
                    return MATCHERS[name](n, Analyzer())
        if isinstance(n, Seq):
            return _fold_zero_init(n)
        return None

    return func.with_body(transform(func.body, post))  # type: ignore[arg-type]


def _fold_zero_init(block: Seq) -> Stmt | None:
    """[loops storing 0 to C[base + i] for every i < m * n, dot(&C[base], ldc = n, ..., m, n, k4)] -> the call
    alone with a 10th argument 1: its accumulators start at zero (a reduction that one call covers whole: the tile
    of a 1 x 1 convolution is neither zeroed in memory nor loaded)."""
    out, changed = list(block.stmts), False
    i = 0
    while i + 1 < len(out):
        call = _single_call(out[i + 1])
        if isinstance(call, E.Call) and call.name in INTRINSICS and len(call.args) == 9 and _zeroes_tile(out[i], call):
            out[i : i + 2] = [Evaluate(E.Call(call.name, (*call.args, E.const(1, int64)), call.dtype))]
            changed = True
        i += 1
    return (Seq(tuple(out)) if len(out) > 1 else out[0]) if changed else None  # type: ignore[return-value]


def _single_call(s: Stmt) -> E.Expr | None:
    """The call of `s`: Evaluate(call), possibly under loops of one iteration (a 1 x 1 kernel's taps)."""
    while isinstance(s, For) and isinstance(s.extent, E.Const) and s.extent.value == 1:
        s = substitute(s.body, {s.var: s.min})
    return s.value if isinstance(s, Evaluate) else None


def _zeroes_tile(init: Stmt, call: E.Call) -> bool:
    """Whether `init` is a nest of constant loops storing 0 to exactly the call's tile, a contiguous m x n block
    (ldc = n) at the call's C address."""
    loops, s = [], init
    while isinstance(s, For):
        if not (isinstance(s.extent, E.Const) and isinstance(s.min, E.Const) and s.min.value == 0):
            return False
        loops.append(s)
        s = s.body
    c, ldc, m, n = call.args[0], call.args[1], call.args[6], call.args[7]
    if not (isinstance(s, Store) and isinstance(s.value, E.Const) and s.value.value == 0 and loops):
        return False
    if not (isinstance(c, E.Call) and c.name == ADDRESS and c.args[0].buffer is s.buffer):
        return False
    if not all(isinstance(v, E.Const) for v in (ldc, m, n)) or ldc.value != n.value:
        return False
    ana = Analyzer()
    try:
        coefs = _coefs(_flat(s, ana), loops, ana, "C", loops[0])
    except TensorizeError:
        return False
    size, dense = 1, True
    for f, k in sorted(zip(loops, coefs), key=lambda fk: fk[1]):
        dense = dense and k == size
        size *= int(f.extent.value)
    base = ana.simplify(substitute(_flat(s, ana), {f.var: E.const(0, f.var.dtype) for f in loops}))
    start = ana.simplify(_flat(c.args[0], ana))
    return dense and size == m.value * n.value and isinstance(ana.simplify(base - start), E.Const) and \
        ana.simplify(base - start).value == 0


__all__ = ["ADDRESS", "PREFETCH", "INTRINSICS", "TENSORIZE", "Intrinsic", "TensorizeError", "address_of", "amx_tiles",
           "dot_bf16_isa", "dot_u8s8_isa", "get_intrinsic", "isa_features", "tensorize_loops"]  # fmt: skip
