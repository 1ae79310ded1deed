"""Target strings: the grammar, validation at parse time (one clear error, never a process abort), round trips,
and what a target decides about the machine (vector width, compiler flags, libmvec, the toolchain)."""

import subprocess
import sys
import textwrap

import pytest

from ember.codegen import toolchain
from ember.target import ARCHS, Target, TargetError, host_triple, normalize_triple

X86_HOST = host_triple() == "x86_64-linux-gnu"

GOOD = [
    # spec, its canonical string
    ("c", "c"),
    ("llvm -threads=2 -O1", "llvm -threads=2 -O1"),
    ("llvm -fastmath", "llvm -fastmath=1"),
    ("cuda -arch=sm_90", "cuda -arch=sm_90"),
    ("c -mtriple=aarch64-linux-gnu -mcpu=cortex-a72", "c -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"),
    ("c -mtriple=aarch64-unknown-linux-gnu", "c -mtriple=aarch64-linux-gnu"),
    ("llvm -mtriple=arm64-linux-gnu -mcpu=neoverse-n1 -mattr=+dotprod",
     "llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1 -mattr=+dotprod"),
    ("c -mtriple=riscv64-unknown-linux-gnu -mcpu=sifive-u74", "c -mtriple=riscv64-linux-gnu -mcpu=sifive-u74"),
    ("llvm -mtriple=armv7-unknown-linux-gnueabihf -mcpu=cortex-a7",
     "llvm -mtriple=arm-linux-gnueabihf -mcpu=cortex-a7"),
    ("c -mtriple=arm-linux-gnueabihf -threads=4 -O2", "c -mtriple=arm-linux-gnueabihf -threads=4 -O2"),
]  # fmt: skip
if X86_HOST:
    GOOD += [
        ("c -mcpu=znver3 -O2 -cflag=-ffast-math", "c -mcpu=znver3 -O2 -cflag=-ffast-math"),
        ("llvm -mcpu=x86-64-v3 -mattr=+avx2,-avx512f", "llvm -mcpu=x86-64-v3 -mattr=+avx2,-avx512f"),
        ("c -mtriple=x86_64-pc-linux-gnu -mcpu=native", "c -mtriple=x86_64-linux-gnu"),
    ]

BAD = [
    # spec, a fragment of the message
    ("fortran", "the kind must be one of"),
    ("c -mfoo=bar", "unknown option '-mfoo=bar'"),
    ("c -fastmath", "for c use -cflag=-ffast-math"),
    ("opencl -mcpu=cortex-a72", "options of the CPU targets c and llvm"),
    ("c -mtriple=sparc-sun-solaris", "not a machine Ember builds for"),
    ("llvm -mtriple=aarch64-linux-gnu -mcpu=znver4", "-mcpu=znver4 is a CPU of x86_64, not aarch64"),
    ("c -mtriple=aarch64-linux-gnu -mcpu=native", "-mcpu=native means this machine's CPU"),
    ("c -mtriple=aarch64-linux-gnu -mcpu=neoverse-n3", "did you mean "),
    ("c -mtriple=riscv64-linux-gnu -mattr=+v", "RVV (the vector extension) is not supported yet"),
    ("c -mtriple=aarch64-linux-gnu -mattr=+avx2", "aarch64 has no feature 'avx2'"),
    ("c -mtriple=aarch64-linux-gnu -mattr=neon", "write each feature as +name or -name"),
    ("c -mcpu=", "-mcpu needs a value"),
    ("c -threads=0", "-threads needs a positive integer"),
]
if X86_HOST:
    BAD += [
        ("llvm -mcpu=cortex-a72", "add -mtriple=aarch64-linux-gnu"),
        ("llvm -mattr=+neon", "x86_64 has no feature 'neon'"),
        ("c -mcpu=skylak", "did you mean 'skylake'?"),
    ]


@pytest.mark.parametrize("spec,canonical", GOOD)
def test_good_targets_parse_and_round_trip(spec, canonical):
    t = Target.parse(spec)
    assert str(t) == canonical
    assert Target.parse(str(t)) == t


@pytest.mark.parametrize("spec,fragment", BAD)
def test_bad_targets_raise_one_clear_error(spec, fragment):
    with pytest.raises(TargetError) as e:
        Target.parse(spec)
    assert isinstance(e.value, ValueError)
    assert fragment in str(e.value)


def test_triples_normalize():
    assert normalize_triple("aarch64-unknown-linux-gnu") == "aarch64-linux-gnu"
    assert normalize_triple("x86_64-pc-linux-gnu") == "x86_64-linux-gnu"
    assert normalize_triple("armv7l-unknown-linux-gnueabihf") == "arm-linux-gnueabihf"
    with pytest.raises(TargetError, match="arm-linux-gnueabihf"):
        normalize_triple("arm-linux-gnueabi")  # soft-float: not a machine we build for


@pytest.mark.parametrize("spec,bits", [
    ("c -mtriple=aarch64-linux-gnu", 128), ("llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-v1", 128),
    ("c -mtriple=arm-linux-gnueabihf -mcpu=cortex-a9", 128), ("c -mtriple=riscv64-linux-gnu", 0),
    ("c -mtriple=aarch64-linux-gnu -mattr=-neon", 0),
])  # fmt: skip
def test_vector_width_comes_from_the_target(spec, bits):
    t = Target.parse(spec)
    assert t.vector_bits == bits and t.vector_lanes(32) == max(1, bits // 32)
    assert not t.has_libmvec and not t.runs_here


@pytest.mark.skipif(not X86_HOST, reason="x86_64 CPU table")
@pytest.mark.parametrize("cpu,bits", [("x86-64", 128), ("x86-64-v3", 256), ("haswell", 256), ("znver3", 256),
                                      ("znver4", 512), ("skylake-avx512", 512), ("x86-64-v3 -mattr=+avx512f", 512),
                                      ("znver4 -mattr=-avx512f", 256)])  # fmt: skip
def test_named_x86_cpus_have_their_isa(cpu, bits):
    assert Target.parse(f"c -mcpu={cpu}").vector_bits == bits


@pytest.mark.parametrize("spec,flags", [
    ("c -mtriple=aarch64-linux-gnu -mcpu=cortex-a72", ["-mcpu=cortex-a72"]),
    ("c -mtriple=aarch64-linux-gnu -mattr=+dotprod", ["-march=armv8-a+dotprod"]),
    ("c -mtriple=riscv64-linux-gnu", ["-march=rv64gc", "-mabi=lp64d"]),
    ("c -mtriple=riscv64-linux-gnu -mcpu=sifive-u74 -mattr=+zba",
     ["-march=rv64gc_zba", "-mabi=lp64d", "-mtune=sifive-u74"]),
    ("c -mtriple=arm-linux-gnueabihf -mcpu=cortex-a7", ["-mcpu=cortex-a7", "-mfpu=neon-vfpv4", "-mfloat-abi=hard"]),
    ("c -mtriple=arm-linux-gnueabihf", ["-march=armv7-a", "-mfpu=neon", "-mfloat-abi=hard"]),
    ("c -mtriple=x86_64-linux-gnu -mcpu=haswell -mattr=-fma", ["-march=haswell", "-mno-fma"]),
])  # fmt: skip
def test_machine_flags_per_architecture(spec, flags):
    t = Target.parse(spec)
    assert t.machine_flags() == flags
    assert t.cflags()[1 : 1 + len(flags)] == flags


def test_host_flags_unchanged():
    assert Target.parse("c").cflags() == ["-O3", "-march=native", "-fno-predictive-commoning", "-fno-math-errno",
                                          "-fopenmp", "-fPIC", "-shared", "-std=gnu11"]  # fmt: skip


def test_missing_cross_compiler_names_the_package(monkeypatch):
    t = Target.parse("c -mtriple=aarch64-linux-gnu -mcpu=cortex-a72")  # parses anywhere
    monkeypatch.setattr(toolchain.shutil, "which", lambda cmd: None)
    with pytest.raises(TargetError, match="apt-get install gcc-aarch64-linux-gnu"):
        toolchain.compiler_for(t)
    with pytest.raises(TargetError, match="aarch64-linux-gnu-gcc"):
        toolchain.check_toolchain("llvm -mtriple=aarch64-linux-gnu")  # llvm links with it
    toolchain.check_toolchain("llvm")  # the host's llvm target needs no compiler


def test_compiler_for_a_cross_target_is_the_distributions_gcc():
    arch = ARCHS["riscv64-linux-gnu"]
    if toolchain.shutil.which(f"{arch.triple}-gcc") is None:
        pytest.skip(f"needs {arch.triple}-gcc (apt-get install {arch.package})")
    assert toolchain.compiler_for("c -mtriple=riscv64-linux-gnu") == "riscv64-linux-gnu-gcc"


@pytest.mark.skipif(not X86_HOST or toolchain.find_cc() is None, reason="needs an x86_64 host with gcc")
def test_a_cpu_the_compiler_does_not_know_is_a_target_error(monkeypatch):
    """The table may be ahead of the installed gcc (gcc 12 lacks znver5): a TargetError, not gcc's -march error."""
    t = Target.parse("c -mcpu=znver5")
    try:
        toolchain.compiler_for(t)
    except TargetError as e:
        assert "-march=znver5" in str(e) and "pick another -mcpu" in str(e)


BAD_FOR_COMPILE = [
    "llvm -mcpu=cortex-a72", "llvm -mtriple=aarch64-linux-gnu -mcpu=znver4", "c -mcpu=cortex-a72",
    "c -mtriple=sparc-sun-solaris", "c -mfoo=bar", "llvm -mattr=+neon",
    "llvm -mtriple=riscv64-linux-gnu -mcpu=cortex-a53",
    "llvm -mtriple=arm-linux-gnueabihf -mcpu=apple-m1", "llvm -mcpu=generic-rv64", "c -mcpu=znver5",
    "llvm -mtriple=aarch64-linux-gnu -mcpu=native",
]  # fmt: skip


def test_no_target_string_aborts_the_process():
    """LLVM aborts the process on a CPU of another architecture: every such target must fail before it."""
    script = textwrap.dedent(f"""
        import ember, ember.zoo
        model = ember.zoo.mlp(batch=1, features=8, hidden=(8,), classes=4)
        for spec in {BAD_FOR_COMPILE!r}:
            try:
                ember.compile(model, target=spec)
                print("built", spec)
            except (ValueError, RuntimeError) as e:
                print("error", spec, "|", type(e).__name__, e)
        print("survived")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[-1] == "survived"
    for spec in BAD_FOR_COMPILE:
        line = next(x for x in lines if x.split(" ", 1)[1].startswith(spec + " |") or x == f"built {spec}")
        if spec == "c -mcpu=znver5" and line.startswith("built"):
            continue  # a gcc that knows znver5
        assert line.startswith("error") and "TargetError" in line, line
