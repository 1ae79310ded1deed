"""The machine's limits for a roofline: its compute peak and its memory bandwidth, measured once and cached.

A kernel that does F floating-point operations and moves B bytes cannot take less than

    bound = max(F / peak, B / bandwidth(B))

where F's integer multiply-accumulates (quantized products: 8-bit dot-product instructions, four products a lane)
count against the int8 peak instead, where the target has such an instruction (VNNI, AVX-VNNI, Arm's dot product).

seconds; `Limits.bound` gives that time and which term is the larger ("compute" or "memory"), and a profile
reports each kernel's `bound / measured` as its roofline fraction (1.0: at the machine's limit).

Both limits are measured by a small C microbenchmark built by our toolchain with the target's flags and
threads (`MICROBENCH`): the peak is independent chains of vector fused multiply-adds on every thread; the
bandwidth is the faster of a streaming copy and a streaming read, at a few working-set sizes (`levels`), so a
kernel whose arguments fit in a cache is held to that cache's bandwidth, not DRAM's (a cache-aware roofline;
between two sizes measured, interpolated in log size). The result is a
small JSON file in the compile cache directory, keyed by this machine (CPU model, core count), the target and
the compiler, written atomically; later processes read it back. Targets that do not run in this process (GPU,
cross-built) have no limits here: `limits_for` returns None.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import platform
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from ..codegen.toolchain import CompileError, cache_dir, cc_version, compile_c, compiler_for
from ..target import CPU_KINDS, Target, TargetError

FORMAT = 2
ACCUMULATORS = 12  # independent FMA chains per thread: enough to hide FMA latency on 2 ports
DEFAULT_LEVELS = (1 << 17, 1 << 20, 1 << 23, 1 << 27)  # working sets (bytes) where the OS names no caches
TRIALS = 5

MICROBENCH = r"""
#include <omp.h>

typedef float vf __attribute__((vector_size(VBYTES)));
enum { LANES = VBYTES / 4 };
volatile float ember_roofline_sink;

/* Seconds for `iters` rounds of ACC independent vector FMAs on each of `threads` threads. */
double ember_peak(long iters, int threads, float x, float y) {
  double t0 = omp_get_wtime();
  float sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  {
    vf a[ACC];
    for (int i = 0; i < ACC; i++) a[i] = (vf){0} + (float)(i + omp_get_thread_num());
    for (long it = 0; it < iters; it++)
      for (int i = 0; i < ACC; i++) a[i] = a[i] * x + y;
    vf s = {0};
    for (int i = 0; i < ACC; i++) s += a[i];
    for (int l = 0; l < LANES; l++) sink += s[l];
  }
  double t = omp_get_wtime() - t0;
  ember_roofline_sink = sink;
  return t;
}

/* Seconds for `iters` rounds of ACC independent 8-bit dot products (4 products per 32-bit lane) on one thread;
   -1 where the target has no dot-product instruction. */
#if defined(__AVX512VNNI__) && VBYTES == 64
#include <immintrin.h>
typedef __m512i vi;
#define DOT(a, x, y) _mm512_dpbusd_epi32(a, x, y)
#define ZERO() _mm512_setzero_si512()
#define SET(v) _mm512_set1_epi32(v)
#define OPAQUE(v) __asm__ volatile("" : "+v"(v))
#elif defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
#include <immintrin.h>
typedef __m256i vi;
#if defined(__AVXVNNI__)
#define DOT(a, x, y) _mm256_dpbusd_avx_epi32(a, x, y)
#else
#define DOT(a, x, y) _mm256_dpbusd_epi32(a, x, y)
#endif
#define ZERO() _mm256_setzero_si256()
#define SET(v) _mm256_set1_epi32(v)
#define OPAQUE(v) __asm__ volatile("" : "+x"(v))
#elif defined(__ARM_FEATURE_DOTPROD)
#include <arm_neon.h>
typedef int32x4_t vi;
#define DOT(a, x, y) vdotq_s32(a, vreinterpretq_s8_s32(x), vreinterpretq_s8_s32(y))
#define ZERO() vdupq_n_s32(0)
#define SET(v) vdupq_n_s32(v)
#define OPAQUE(v) __asm__ volatile("" : "+w"(v))
#endif
#ifdef DOT
enum { DOT_BYTES = sizeof(vi) };
volatile int ember_roofline_isink;
double ember_peak_int8(long iters, int x) {
  double t0 = omp_get_wtime();
  vi a[ACC], vx = SET(x), vy = SET(x + 1);
  for (int i = 0; i < ACC; i++) a[i] = ZERO();
  for (long it = 0; it < iters; it++) {
    for (int i = 0; i < ACC; i++) a[i] = DOT(a[i], vx, vy);
    OPAQUE(vx);  /* (not hoisted: x stays unknown to the compiler each round) */
  }
  int s = 0;
  for (int i = 0; i < ACC; i++) { int t[DOT_BYTES / 4]; __builtin_memcpy(t, &a[i], sizeof t); s += t[0]; }
  ember_roofline_isink = s;
  return omp_get_wtime() - t0;
}
#else
enum { DOT_BYTES = 0 };
double ember_peak_int8(long iters, int x) { (void)iters; (void)x; return -1.0; }
#endif
int ember_dot_bytes(void) { return DOT_BYTES; }

/* Seconds for `passes` copies of n floats from src to dst, split over `threads` threads. */
double ember_copy(float *restrict dst, const float *restrict src, long n, int passes, int threads) {
  double t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads)
  for (int p = 0; p < passes; p++) {
#pragma omp for simd schedule(static)
    for (long i = 0; i < n; i++) dst[i] = src[i];
  }
  return omp_get_wtime() - t0;
}

/* Seconds for `passes` reads (a sum in 8 vector accumulators: loads, not the adds, are the limit) of n floats,
   split over `threads` threads. */
double ember_read(const float *restrict src, long n, int passes, int threads) {
  typedef float vfu __attribute__((vector_size(VBYTES), aligned(4)));
  double t0 = omp_get_wtime();
  float sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  {
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
    long nv = n / LANES, lo = nv * t / nt, hi = nv * (t + 1) / nt;
    const vfu *v = (const vfu *)src;
    for (int p = 0; p < passes; p++) {
      vf s[8] = {{0}};
      long i = lo;
      for (; i + 8 <= hi; i += 8)
        for (int j = 0; j < 8; j++) s[j] += v[i + j];
      for (; i < hi; i++) s[0] += v[i];
      for (int j = 1; j < 8; j++) s[0] += s[j];
      for (int l = 0; l < LANES; l++) sink += s[0][l];
#pragma omp barrier
    }
  }
  ember_roofline_sink = sink;
  return omp_get_wtime() - t0;
}
"""


@dataclass(frozen=True)
class Limits:
    """A machine's limits for one target: FLOP/s peak and bytes/s bandwidth by working-set size."""

    peak_gflops: float
    bandwidth_gbs: tuple[tuple[int, float], ...]  # (working-set bytes, GB/s), smallest set first
    threads: int
    key: str = ""
    peak_int8_gops: float = 0.0  # 8-bit multiply-accumulates (2 ops each) per second; 0: no dot-product instruction

    @property
    def dram_gbs(self) -> float:
        return self.bandwidth_gbs[-1][1]

    def bandwidth_for(self, nbytes: int) -> float:
        """GB/s for a kernel moving `nbytes`: interpolated (in log size) between the working sets measured, the
        smallest's below it, memory's above the largest."""
        table = self.bandwidth_gbs
        if nbytes <= table[0][0]:
            return table[0][1]
        for (s0, g0), (s1, g1) in zip(table, table[1:]):
            if nbytes <= s1:
                f = math.log(nbytes / s0) / math.log(s1 / s0)
                return g0 + f * (g1 - g0)
        return self.dram_gbs

    def bound(self, flops: int, nbytes: int, int_flops: int = 0) -> tuple[float, str]:
        """The least seconds a kernel of `flops` (of them `int_flops` 8-bit multiply-accumulates) moving `nbytes`
        can take here, and what bounds it."""
        int_flops = int_flops if self.peak_int8_gops else 0
        compute = (flops - int_flops) / (self.peak_gflops * 1e9)
        if int_flops:
            compute += int_flops / (self.peak_int8_gops * 1e9)
        memory = nbytes / (self.bandwidth_for(nbytes) * 1e9)
        return (compute, "compute") if compute > memory else (memory, "memory")

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(d: dict) -> Limits:
        return Limits(float(d["peak_gflops"]), tuple((int(s), float(g)) for s, g in d["bandwidth_gbs"]),
                      int(d["threads"]), str(d.get("key", "")), float(d.get("peak_int8_gops", 0.0)))  # fmt: skip


def cpu_name() -> str:
    """This machine's CPU model as the OS names it (/proc/cpuinfo), else the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Model", "uarch")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_sizes() -> list[int]:
    """The data and unified cache sizes of CPU 0 (bytes, ascending) as Linux lists them; [] elsewhere."""
    sizes = set()
    for d in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if (d / "type").read_text().strip() == "Instruction":
                continue
            text = (d / "size").read_text().strip().upper()
        except OSError:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        if text.rstrip("KMG").isdigit():
            sizes.add(int(text.rstrip("KMG")) * unit)
    return sorted(sizes)


def levels() -> tuple[int, ...]:
    """Working sets (bytes) the bandwidth is measured at: half of each cache (what a kernel's arguments can hold of
    it), an eighth of the largest (its share on a busy machine), and four times the largest cache (memory);
    `DEFAULT_LEVELS` where the OS names no caches."""
    caches = cache_sizes()
    if not caches:
        return DEFAULT_LEVELS
    sets = {c // 2 for c in caches} | {caches[-1] // 8}  # (a shared last-level cache: also an eighth of it)
    return (*sorted(sets), max(4 * caches[-1], 1 << 27))


def _source(target: Target) -> str:
    vbytes = max(16, target.vector_bits // 8)
    return f"#define VBYTES {vbytes}\n#define ACC {ACCUMULATORS}\n" + MICROBENCH


def cache_key(target: Target) -> str:
    """The cache key of a target's limits: machine, CPU, core count, target string, compiler and microbenchmark."""
    cc = compiler_for(target)
    parts = [str(FORMAT), platform.machine(), cpu_name(), str(os.cpu_count()), str(levels()), str(target),
             cc_version(cc), _source(target)]  # fmt: skip
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def cache_path(target: Target) -> Path:
    return cache_dir() / "roofline" / f"{cache_key(target)}.json"


def limits_for(target: Target | str, measure: bool = True) -> Limits | None:
    """The limits of `target` on this machine: read from the cache, else measured (unless `measure` is False) and
    cached. None for a target whose code does not run in this process, or when no C compiler is there."""
    try:
        t = Target.parse(target)
    except TargetError:
        return None
    if t.kind not in CPU_KINDS or not t.runs_here:
        return None
    try:
        path = cache_path(t)
    except (TargetError, CompileError):
        return None
    try:
        return Limits.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent, or torn by hand: measure again
    if not measure:
        return None
    try:
        limits = measure_limits(t)
    except CompileError:
        return None
    limits = replace(limits, key=path.stem)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem[:8]}-", suffix=".json", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(limits.to_json(), f, indent=1)
    os.replace(tmp, path)  # atomic: a reader sees the old file, none, or the whole new one
    return limits


def _best(fn, *args, trials: int = TRIALS) -> float:
    """The least seconds of `trials` calls of a microbenchmark function (each returns its own time)."""
    return min(fn(*args) for _ in range(trials))


def _calibrated(fn, *args) -> tuple[int, float]:
    """(iterations, least seconds of many short trials) of a peak microbenchmark fn(iters, *args), its iterations
    doubled until one call takes 2 ms."""
    iters = 1 << 10
    while fn(iters, *args) < 0.002 and iters < 1 << 30:
        iters *= 2
    return iters, _best(fn, iters, *args, trials=3 * TRIALS)


def measure_limits(target: Target) -> Limits:
    """Measure the compute peak and the bandwidth at each of `levels()` with the microbenchmark (about a second)."""
    lib = ctypes.CDLL(str(compile_c(_source(target), target.cflags(), name="roofline", cc=compiler_for(target))))
    lib.ember_peak.restype = lib.ember_copy.restype = lib.ember_read.restype = ctypes.c_double
    lib.ember_peak_int8.restype = ctypes.c_double
    lib.ember_peak.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_float, ctypes.c_float]
    lib.ember_peak_int8.argtypes = [ctypes.c_long, ctypes.c_int]
    ptr, n_, i_ = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
    lib.ember_copy.argtypes = [ptr, ptr, n_, i_, i_]
    lib.ember_read.argtypes = [ptr, n_, i_, i_]
    threads = target.num_cores

    # the peak of one core times the threads: cores compute independently, and timing them all at once on a
    # shared machine measures the neighbours (short trials, the best of many, for the same reason)
    lanes = max(4, target.vector_bits // 32)
    iters, seconds = _calibrated(lib.ember_peak, 1, 0.999999, 1e-7)
    peak = 2.0 * lanes * ACCUMULATORS * iters * threads / seconds / 1e9
    peak_int8 = 0.0
    dot_bytes = lib.ember_dot_bytes()
    if dot_bytes:  # a multiply-accumulate per byte of the vector
        iters, seconds = _calibrated(lib.ember_peak_int8, 3)
        peak_int8 = 2.0 * dot_bytes * ACCUMULATORS * iters * threads / seconds / 1e9

    sets = levels()
    src = np.ones(sets[-1] // 4, np.float32)
    dst = np.empty(sets[-1] // 8, np.float32)
    bandwidth = []
    for size in sets:
        passes = max(1, (1 << 24) // size)  # at least 16 MiB moved a trial
        n_copy, n_read = size // 8, size // 4  # a copy's working set is its source and its destination
        best = 0.0
        for t in sorted({1, threads}):  # one thread's bandwidth is a floor for more (on a busy machine, the best)
            copy = _best(lib.ember_copy, dst.ctypes.data, src.ctypes.data, n_copy, passes, t)
            read = _best(lib.ember_read, src.ctypes.data, n_read, passes, t)
            best = max(best, size * passes / copy, size * passes / read)
        bandwidth.append((size, best / 1e9))
    # a larger working set never streams faster than a smaller one (noise aside): keep the table monotone
    for i in range(len(bandwidth) - 2, -1, -1):
        bandwidth[i] = (bandwidth[i][0], max(bandwidth[i][1], bandwidth[i + 1][1]))
    return Limits(peak, tuple(bandwidth), threads, peak_int8_gops=peak_int8)


def kernel_bytes(arg_bytes: list[int]) -> int:
    """The bytes a kernel must move: each argument read or written once."""
    return int(sum(arg_bytes))
