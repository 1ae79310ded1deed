"""Targets: a string like "c -mcpu=native -threads=2" parsed once, and validated, into a `Target`.

    KIND [-mtriple=TRIPLE] [-mcpu=CPU] [-mattr=+f,-g,...] [-threads=N] [-O0|-O1|-O2|-O3|-Os|-Ofast]
         [-cflag=FLAG]... [-fastmath (llvm)] [-arch=sm_XY (cuda)]

KIND is c, llvm, cuda or opencl. The machine options (`-mtriple`, `-mcpu`, `-mattr`) are for the CPU kinds
c and llvm: TRIPLE is one of `ARCHS` (aliases such as aarch64-unknown-linux-gnu are normalized), CPU one of
its architecture's known CPUs (`-mcpu=native`, the default, only for this machine's own triple; a foreign
triple defaults to its generic CPU), and each -mattr feature one its architecture has. Anything else raises
one `TargetError` naming the option and the fix, before any compiler sees it (LLVM aborts the process on a
CPU of another architecture). Whether the cross compiler is installed is checked where it is looked up
(`codegen.toolchain.compiler_for`), so that a target string still parses on any machine.

A target for another machine (`runs_here` is False) builds a shared library there that this process cannot
load: it runs under an emulator (`Arch.emulator`) or on a device of that architecture.
"""

from __future__ import annotations

import difflib
import functools
import os
import platform
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field

KINDS = ("c", "llvm", "cuda", "opencl")
CPU_KINDS = ("c", "llvm")
FLAGS = ("fastmath",)  # options without a value: "llvm -fastmath" means fastmath=1
OPTIONS = {"c": (), "llvm": ("fastmath",), "cuda": ("arch", "fastmath"), "opencl": ()}  # -key=value per kind
OPT_LEVELS = ("O0", "O1", "O2", "O3", "Os", "Ofast")


class TargetError(ValueError):
    """A target string that names something this compiler cannot build for, or a missing toolchain."""


@dataclass(frozen=True)
class Arch:
    """What Ember knows of one CPU architecture: its triple, CPUs, features, toolchain and vector width."""

    name: str  # aarch64, riscv64, armhf, x86_64
    triple: str  # the GNU triple: the cross compiler is `<triple>-gcc`
    llvm_triple: str  # the triple LLVM's target machine gets
    elf_machine: int  # e_machine of its ELF files
    package: str  # the Debian package of its cross compiler
    generic_cpu: str  # the -mcpu of a foreign target without one
    cpus: dict[str, int]  # known CPU -> float SIMD width in bits (0: scalar code)
    features: tuple[str, ...]  # -mattr names (LLVM's spelling)
    qemu: str  # user-mode emulator

    @property
    def emulator(self) -> str:
        """The command that runs a program built for this architecture on another machine (Debian's paths)."""
        return f"{self.qemu} -L /usr/{self.triple}"


_X86_CPUS = {
    "x86-64": 128, "x86-64-v2": 128, "x86-64-v3": 256, "x86-64-v4": 512, "nehalem": 128, "westmere": 128,
    "sandybridge": 256, "ivybridge": 256, "haswell": 256, "broadwell": 256, "skylake": 256, "alderlake": 256,
    "skylake-avx512": 512, "cascadelake": 512, "cooperlake": 512, "icelake-client": 512, "icelake-server": 512,
    "tigerlake": 512, "sapphirerapids": 512, "znver1": 256, "znver2": 256, "znver3": 256, "znver4": 512,
    "znver5": 512,
}  # fmt: skip
_AARCH64_CPUS = (
    "generic cortex-a53 cortex-a55 cortex-a57 cortex-a72 cortex-a73 cortex-a76 cortex-a78 cortex-x1 "
    "neoverse-n1 neoverse-n2 neoverse-v1 apple-m1 a64fx"
).split()
# armhf CPU -> its -mfpu (with -mfloat-abi=hard)
_ARMHF_FPU = {"generic": "neon", "cortex-a7": "neon-vfpv4", "cortex-a8": "neon", "cortex-a9": "neon",
              "cortex-a15": "neon-vfpv4", "cortex-a17": "neon-vfpv4", "cortex-a53": "neon-fp-armv8",
              "cortex-a72": "neon-fp-armv8"}  # fmt: skip

def feature_key(name: str) -> str:
    """A CPU feature's name with LLVM's and /proc/cpuinfo's spellings made one (amx-int8, amx_int8: amxint8)."""
    return name.replace("_", "").replace("-", "")


ARCHS: dict[str, Arch] = {
    a.triple: a
    for a in (
        Arch("x86_64", "x86_64-linux-gnu", "x86_64-unknown-linux-gnu", 62, "gcc-x86-64-linux-gnu", "x86-64",
             _X86_CPUS, ("sse4.2", "avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512vl",
                         "avx512vnni", "avx512bf16", "avx512vbmi", "amx-tile", "amx-int8", "amx-bf16"), "qemu-x86_64"),
        Arch("aarch64", "aarch64-linux-gnu", "aarch64-unknown-linux-gnu", 183, "gcc-aarch64-linux-gnu", "generic",
             dict.fromkeys(_AARCH64_CPUS, 128), ("neon", "crypto", "fp16", "dotprod", "i8mm", "bf16", "sve"),
             "qemu-aarch64"),
        Arch("riscv64", "riscv64-linux-gnu", "riscv64-unknown-linux-gnu", 243, "gcc-riscv64-linux-gnu",
             "generic-rv64", dict.fromkeys(("generic-rv64", "sifive-u54", "sifive-u74"), 0), ("zba", "zbb", "zbs"),
             "qemu-riscv64"),
        Arch("armhf", "arm-linux-gnueabihf", "armv7a-unknown-linux-gnueabihf", 40, "gcc-arm-linux-gnueabihf",
             "generic", dict.fromkeys(_ARMHF_FPU, 128), ("neon",), "qemu-arm"),
    )
}  # fmt: skip
_ARCH_ALIASES = {"arm64": "aarch64", "amd64": "x86_64", "x86-64": "x86_64", "riscv64gc": "riscv64", "arm": "arm",
                 "armv7": "arm", "armv7l": "arm", "armv7a": "arm", "armv7hl": "arm", "armhf": "arm"}  # fmt: skip
_HINTS = {("riscv64", "v"): "RVV (the vector extension) is not supported yet: riscv64 targets generate scalar code"}


def normalize_triple(triple: str) -> str:
    """The triple of `ARCHS` that `triple` names: aarch64-unknown-linux-gnu -> aarch64-linux-gnu, ..."""
    parts = triple.strip().lower().split("-")
    cpu = _ARCH_ALIASES.get(parts[0], parts[0])
    rest = [p for p in parts[1:] if p not in ("unknown", "pc", "none", "linux")]
    for arch in ARCHS.values():
        a_cpu, *a_rest = arch.triple.replace("-linux", "").split("-")
        if cpu == a_cpu and rest == a_rest and "linux" in parts:
            return arch.triple
    known = ", ".join(ARCHS)
    raise TargetError(f"-mtriple={triple}: not a machine Ember builds for; use one of {known} "
                      "(aliases like aarch64-unknown-linux-gnu are accepted)")  # fmt: skip


@functools.cache
def host_triple() -> str | None:
    """This machine's triple in `ARCHS` (None on a machine Ember has no table for)."""
    machine = platform.machine().lower()
    if platform.system() != "Linux":
        return None
    try:
        return normalize_triple(f"{machine}-linux-{'gnueabihf' if machine.startswith('arm') else 'gnu'}")
    except TargetError:
        return None


@functools.cache
def host_has_libmvec() -> bool:
    """Whether glibc's vector math library (SIMD expf, logf, erff, tanhf, ...) can be linked on this machine."""
    import ctypes.util

    return platform.machine() in ("x86_64", "AMD64") and ctypes.util.find_library("mvec") is not None


def _close(word: str, choices) -> str:
    near = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


@dataclass(frozen=True)
class Target:
    kind: str
    mcpu: str = "native"
    threads: int | None = None  # None: OpenMP's default (all cores)
    opt: str = "-O3"
    extra_flags: tuple[str, ...] = ()
    options: tuple[tuple[str, str], ...] = field(default=())
    triple: str = ""  # "" (or this machine's triple): build for this machine; else a key of ARCHS
    mattr: tuple[str, ...] = ()  # "+avx2", "-avx512f", ...

    def __post_init__(self) -> None:
        self.validate()

    @staticmethod
    def parse(spec: str | Target) -> Target:
        if isinstance(spec, Target):
            return spec
        parts = shlex.split(spec)
        if not parts or parts[0] not in KINDS:
            raise TargetError(f"unknown target {spec!r}; the kind must be one of {', '.join(KINDS)}")
        kind, kw = parts[0], {}
        extra: list[str] = []
        options: list[tuple[str, str]] = []
        for p in parts[1:]:
            key, eq, value = p.lstrip("-").partition("=")
            if key in ("mtriple", "mcpu", "mattr", "threads", "cflag") and not value:
                raise TargetError(f"target {spec!r}: -{key} needs a value (-{key}=...)")
            if key == "mtriple":
                kw["triple"] = normalize_triple(value)
            elif key == "mcpu":
                kw["mcpu"] = value
            elif key == "mattr":
                kw["mattr"] = tuple(f.strip() for f in value.split(",") if f.strip())
            elif key == "threads":
                if not value.isdigit() or int(value) < 1:
                    raise TargetError(f"target {spec!r}: -threads needs a positive integer")
                kw["threads"] = int(value)
            elif key in OPT_LEVELS and not eq:
                kw["opt"] = "-" + key
            elif key == "cflag":
                extra.append(value)
            elif key in OPTIONS[kind] and (value or key in FLAGS):
                options.append((key, value or "1"))
            else:
                raise TargetError(_unknown_option(spec, kind, p, key))
        if "triple" in kw and "mcpu" not in kw and kw["triple"] != host_triple():
            kw["mcpu"] = ARCHS[kw["triple"]].generic_cpu
        try:
            return Target(kind, extra_flags=tuple(extra), options=tuple(options), **kw)
        except TargetError as e:
            raise TargetError(f"target {spec!r}: {e}") from None

    def validate(self) -> None:
        """Raise `TargetError` where the machine options do not fit together (called on construction)."""
        if self.kind not in KINDS:
            raise TargetError(f"unknown target kind {self.kind!r}; the kind must be one of {', '.join(KINDS)}")
        if self.kind not in CPU_KINDS:
            if self.triple or self.mattr or self.mcpu != "native":
                raise TargetError(f"-mtriple, -mcpu and -mattr are options of the CPU targets c and llvm, "
                                  f"not {self.kind}")  # fmt: skip
            return
        if self.triple and self.triple not in ARCHS:
            raise TargetError(f"-mtriple={self.triple}: use one of {', '.join(ARCHS)} (or normalize_triple)")
        arch = self.arch
        if arch is None:  # a host Ember has no table for: options go to its compilers unchecked
            return
        if self.mcpu == "native":
            if not self.runs_here:
                raise TargetError(f"-mcpu=native means this machine's CPU, which is not a CPU of {arch.name}: "
                                  f"name one for -mtriple={arch.triple} ({', '.join(arch.cpus)})")  # fmt: skip
        elif self.mcpu not in arch.cpus:
            other = [a.name for a in ARCHS.values() if self.mcpu in a.cpus]
            why = f"is a CPU of {other[0]}, not {arch.name}" if other else f"is not a known {arch.name} CPU"
            fix = f"; to build for it add -mtriple={_triple_of(other[0])}" if other else ""
            raise TargetError(f"-mcpu={self.mcpu} {why}{_close(self.mcpu, arch.cpus)}{fix}; "
                              f"{arch.name} CPUs: {', '.join(arch.cpus)}"
                              + (", native" if self.runs_here else ""))  # fmt: skip
        for f in self.mattr:
            name = f[1:]
            if f[:1] not in "+-" or not name:
                raise TargetError(f"-mattr={','.join(self.mattr)}: write each feature as +name or -name, not {f!r}")
            if name not in arch.features:
                hint = _HINTS.get((arch.name, name)) or f"{arch.name} features: {', '.join(arch.features)}"
                raise TargetError(f"-mattr: {arch.name} has no feature {name!r}{_close(name, arch.features)}; "
                                  f"{hint}")  # fmt: skip

    def __str__(self) -> str:
        out = [self.kind]
        if self.triple:
            out.append(f"-mtriple={self.triple}")
        if self.mcpu != self.default_mcpu:
            out.append(f"-mcpu={self.mcpu}")
        if self.mattr:
            out.append(f"-mattr={','.join(self.mattr)}")
        if self.threads is not None:
            out.append(f"-threads={self.threads}")
        if self.opt != "-O3":
            out.append(self.opt)
        out += [f"-cflag={f}" for f in self.extra_flags]
        out += [f"-{k}={v}" for k, v in self.options]
        return " ".join(out)

    # -- the machine --------------------------------------------------------------------------------------
    @property
    def arch(self) -> Arch | None:
        """The architecture built for (None: this machine, where Ember has no table for it)."""
        return ARCHS.get(self.triple or host_triple() or "")

    @property
    def runs_here(self) -> bool:
        """Whether code built for this target can run in this process (GPU targets: on this machine's GPU)."""
        return not self.triple or self.triple == host_triple()

    @property
    def missing_features(self) -> frozenset[str]:
        """The SIMD features that code for this target may use and this machine's CPU lacks (an x86 target of this
        architecture naming another CPU or +features: -mcpu=skylake-avx512 on a CPU without AVX-512); empty
        elsewhere."""
        if not self.runs_here or self.kind not in CPU_KINDS or (self.mcpu == "native" and not self.mattr):
            return frozenset()
        arch = self.arch
        if arch is None or arch.name != "x86_64":
            return frozenset()
        return frozenset(lacking_features(self.simd_features()))

    @property
    def executes_here(self) -> bool:
        """Whether this process can execute code built for the target: of this architecture, using no
        instruction this CPU lacks (`missing_features`)."""
        return self.runs_here and not self.missing_features

    @property
    def default_mcpu(self) -> str:
        return "native" if self.runs_here else ARCHS[self.triple].generic_cpu

    def machine_flags(self) -> list[str]:
        """The C compiler's flags that choose the instruction set (`-march`/`-mcpu`/`-mabi`/`-mfpu`...)."""
        arch = self.arch
        on, off = [f[1:] for f in self.mattr if f[0] == "+"], [f[1:] for f in self.mattr if f[0] == "-"]
        name = arch.name if arch else "x86_64"
        if name == "x86_64":
            return [f"-march={self.mcpu}", *[f"-m{f}" for f in on], *[f"-mno-{f}" for f in off]]
        if name == "aarch64":
            gcc = {"neon": "simd"}
            ext = "".join(f"+{gcc.get(f, f)}" for f in on) + "".join(f"+no{gcc.get(f, f)}" for f in off)
            return [f"-march=armv8-a{ext}" if self.mcpu == "generic" else f"-mcpu={self.mcpu}{ext}"]
        if name == "riscv64":
            tune = [] if self.mcpu == "generic-rv64" else [f"-mtune={self.mcpu}"]
            return ["-march=rv64gc" + "".join(f"_{f}" for f in on), "-mabi=lp64d", *tune]
        fpu = "vfpv3-d16" if "neon" in off else _ARMHF_FPU.get(self.mcpu, "neon")  # armhf
        cpu = "-march=armv7-a" if self.mcpu in ("generic", "native") else f"-mcpu={self.mcpu}"
        return [cpu, f"-mfpu={fpu}", "-mfloat-abi=hard"]

    def cflags(self) -> list[str]:
        """Flags for the C compiler of this target (`codegen.toolchain.compiler_for`).

        `-fno-predictive-commoning`: GCC 12's predictive commoning (on at -O3) moves stores across
        iterations of an OpenMP thread's chunk and writes back stale values to elements that belong to
        other threads, e.g. `#pragma omp parallel for` over `ii < 2` of `C[io * 14 + ii * 7] = 0` loses
        stores in one call out of a few hundred (regression test in tests/codegen/test_codegen_c.py).
        `-fno-math-errno`: kernels never read errno, and without it GCC keeps sqrt/floor/... as calls."""
        return [
            self.opt, *self.machine_flags(), "-fno-predictive-commoning", "-fno-math-errno", "-fopenmp", "-fPIC",
            "-shared", "-std=gnu11", *self.extra_flags,
        ]  # fmt: skip

    def llvm_machine(self) -> tuple[str, str, str]:
        """(triple, cpu, features) of LLVM's target machine for a foreign target ("" triple: the process's)."""
        arch = self.arch
        assert arch is not None and not self.runs_here, "llvm_machine is for targets of another machine"
        features = list(self.mattr)
        if arch.name == "riscv64":
            features = ["+m", "+a", "+f", "+d", "+c", *features]
        elif arch.name == "armhf" and "-neon" not in features:
            features = ["+neon", *features]
        return arch.llvm_triple, self.mcpu, ",".join(features)

    def simd_features(self) -> frozenset[str]:
        """The x86 SIMD features (avx, avx2, fma, avx512f, ...) the code may use: for -mcpu=native the host's,
        else the CPU's from the table; then -mattr's. Empty for other architectures."""
        arch = self.arch
        if self.mcpu == "native" and self.runs_here:
            have = set(host_cpu_flags())
        elif arch is None or arch.name != "x86_64":
            return frozenset()
        else:
            bits = arch.cpus.get(self.mcpu, 128)
            have = ({"avx", "avx2", "fma"} if bits >= 256 else set()) | ({"avx512f"} if bits >= 512 else set())
        for f in self.mattr:  # (-mattr's LLVM names against /proc/cpuinfo's: avx512vnni is avx512_vnni)
            have = have | {f[1:]} if f[0] == "+" else {h for h in have if feature_key(h) != feature_key(f[1:])}
        return frozenset(have)

    @property
    def vector_bits(self) -> int:
        """Width of the widest float SIMD registers the target has (for choosing vector lanes); 0: none.
        x86 (and a host Ember has no table for): from `simd_features`; aarch64 and armhf NEON: 128;
        riscv64: 0 (scalar code: no RVV yet)."""
        if self.kind in ("cuda", "opencl"):
            return 128
        arch = self.arch
        if arch is None or arch.name == "x86_64" or self.mcpu == "native" and self.runs_here:
            isa = self.simd_features()
            return 512 if "avx512f" in isa else 256 if "avx2" in isa or "avx" in isa else 128
        return 0 if "-neon" in self.mattr else arch.cpus[self.mcpu]

    def vector_lanes(self, dtype_bits: int = 32) -> int:
        return max(1, self.vector_bits // dtype_bits)

    @property
    def has_libmvec(self) -> bool:
        """Whether code for this target may call glibc's vector math library: only code for this machine's own
        triple, on x86_64 with libmvec installed (its `_ZGV` names follow the x86 vector function ABI)."""
        return self.runs_here and host_has_libmvec()

    @property
    def num_cores(self) -> int:
        return self.threads or os.cpu_count() or 1

    @property
    def l1d(self) -> Cache:
        """The level-1 data cache of the CPU the code runs on: this machine's (read from sysfs) for code built to run
        here for this CPU (`-mcpu=native`), else `DEFAULT_L1D`."""
        here = self.kind in CPU_KINDS and self.runs_here and self.mcpu == "native"
        return (host_l1d() if here else None) or DEFAULT_L1D


def _triple_of(arch_name: str) -> str:
    return next(t for t, a in ARCHS.items() if a.name == arch_name)


def _unknown_option(spec: str, kind: str, p: str, key: str) -> str:
    known = ["-mtriple", "-mcpu", "-mattr", "-threads", "-O0..-Ofast", "-cflag"] if kind in CPU_KINDS else []
    known += [f"-{o}" for o in OPTIONS[kind]]
    if kind not in CPU_KINDS:
        known += ["-threads", "-O0..-Ofast", "-cflag"]
    where = [k for k, opts in OPTIONS.items() if key in opts]
    hint = f"; -{key} is an option of {' and '.join(where)}" if where else _close("-" + key, known)
    if key == "fastmath" and kind == "c":
        hint += " (for c use -cflag=-ffast-math)"
    return f"target {spec!r}: unknown option {p!r} for {kind}{hint}; {kind} takes {', '.join(known)}"


def lacking_features(features: Iterable[str]) -> list[str]:
    """The CPU features of `features` (LLVM's or /proc/cpuinfo's spellings) that this machine's CPU lacks."""
    have = {feature_key(f) for f in host_cpu_flags()}
    return [f for f in features if feature_key(f) not in have]


@dataclass(frozen=True)
class Cache:
    """A CPU cache's geometry: lines 4 KiB apart on a 32 KiB 8-way L1 (`size // ways`) share one set."""

    size: int  # bytes
    ways: int
    line: int = 64


DEFAULT_L1D = Cache(32 << 10, 8)  # most x86 (Zen, Skylake) and Arm (Cortex-A55/A76) cores: 32 KiB in 8 ways


@functools.cache
def host_l1d(root: str = "/sys/devices/system/cpu/cpu0/cache") -> Cache | None:
    """This machine's level-1 data cache from Linux's sysfs (`index*/level`, `type`, `size`, `ways_of_associativity`,
    `coherency_line_size`); None where it does not say (another OS, a container hiding it)."""
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return None
    for entry in entries:
        path = os.path.join(root, entry)

        def read(name: str, path: str = path) -> str:
            with open(os.path.join(path, name)) as f:
                return f.read().strip()

        try:
            if read("level") != "1" or read("type") not in ("Data", "Unified"):
                continue
            size = read("size").upper()
            scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
            ways, line = int(read("ways_of_associativity")), int(read("coherency_line_size"))
            nbytes = int(size.rstrip("KM")) * scale
        except (OSError, ValueError):
            continue
        if nbytes > 0 and ways > 0 and line > 0:
            return Cache(nbytes, ways, line)
    return None


@functools.cache
def host_cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset([platform.machine()])
