"""The dot_bf16 intrinsic (`ember.te.intrin`): a bfloat16 GEMM whose reduction is one micro-kernel call per tile,
float32 accumulation.

Reference: numpy's float64 product of the same bfloat16 values (A and B drawn at random, rounded to bfloat16).
Each product of two bfloat16 values is exact in float32 (8 + 8 significant bits); what remains is the float32
rounding of the sums, in another order than numpy's: over K terms at most about K * 2^-24 of the sum of |a * b|,
so the tolerance is 4 * K * 2^-24 * sum(|A| @ |B|) per element (vdpbf16ps also flushes denormals, which these
values never reach). Each implementation is checked by target: vdpbf16ps where the target has avx512_bf16 (run
where this CPU has it too), the portable C where it does not."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import ember
from ember import te
from ember.codegen.c import codegen_c
from ember.target import Target, host_cpu_flags
from ember.te.intrin import dot_bf16_isa

BF16 = ml_dtypes.bfloat16
HAS_BF16 = "avx512_bf16" in host_cpu_flags()


def gemm(m: int, n: int, k: int, nb: int):
    a = te.placeholder((m, k), "bfloat16", name="A")
    b = te.placeholder((n // nb, k // 2, nb, 2), "bfloat16", name="B")
    k2 = te.reduce_axis((0, k // 2), name="k2")
    kk = te.reduce_axis((0, 2), name="kk")
    c = te.compute((m, n), lambda i, j: te.sum(te.cast(a[i, k2 * 2 + kk], "float32")
                                               * te.cast(b[j // nb, k2, j % nb, kk], "float32"), axis=[k2, kk]),
                   name="C")  # fmt: skip
    return a, b, c


def tensorized(C, mr: int, nb: int):
    s = te.create_schedule(C)
    i, j = C.op.axis
    k2, kk = C.op.reduce_axis
    io, ii = s[C].split(i, mr)
    jo, ji = s[C].split(j, nb)
    s[C].reorder(jo, io, k2, ii, ji, kk)
    s[C].tensorize(k2, "dot_bf16")
    return s


def check(f, m, n, k, nb, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(m, k)).astype(BF16)
    b = rng.normal(size=(k, n)).astype(BF16)
    packed = np.ascontiguousarray(b.reshape(k // 2, 2, n // nb, nb).transpose(2, 0, 3, 1))
    c = np.zeros((m, n), np.float32)
    f(a, packed, c)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    tol = 4 * k * 2.0**-24 * (np.abs(a64) @ np.abs(b64))
    assert np.all(np.abs(c - a64 @ b64) <= tol)


@pytest.mark.parametrize("target, isa", [("c -mcpu=skylake-avx512 -mattr=+avx512bf16", "avx512_bf16"),
                                         ("c -mcpu=skylake-avx512", "c"), ("c -mcpu=x86-64", "c")])  # fmt: skip
@pytest.mark.parametrize("mr, nb", [(4, 32), (8, 32), (3, 16), (2, 8)])
def test_dot_bf16_implementations(target, isa, mr, nb):
    m, n, k = 2 * mr, 2 * nb, 24
    A, B, C = gemm(m, n, k, nb)
    s = tensorized(C, mr, nb)
    want = dot_bf16_isa(Target.parse(target).simd_features(), nb)
    assert want == (isa if nb % 16 == 0 else "c")
    if want == "avx512_bf16":
        src = codegen_c(ember.lower(s, [A, B, C]), target)
        assert "_mm512_dpbf16_ps(" in src and f"ember_dot_bf16_{mr}x{nb}_avx512_bf16(" in src
        if not HAS_BF16:
            pytest.skip("this CPU has no avx512_bf16: the C was checked, not run")
        check(ember.build(s, [A, B, C], target=target), m, n, k, nb, seed=mr * nb)
    else:
        f = ember.build(s, [A, B, C], target=target)
        assert f"ember_dot_bf16_{mr}x{nb}_c(" in f.source and "dpbf16" not in f.source
        if not Target.parse(target).executes_here:
            pytest.skip(f"this CPU lacks {', '.join(sorted(Target.parse(target).missing_features))}: the C was "
                        "checked, not run")  # fmt: skip
        check(f, m, n, k, nb, seed=mr * nb)


def test_tensorize_bf16_in_the_loop_ir():
    A, B, C = gemm(8, 32, 16, 32)
    text = str(ember.lower(tensorized(C, 4, 32), [A, B, C]))
    assert "dot_bf16(address_of(C[" in text


@pytest.mark.parametrize("mr, nb", [(32, 32), (16, 48), (16, 16)])
@pytest.mark.parametrize("k", [128, 72])
def test_amx_bf16_tiles(mr, nb, k):
    """Tiles of whole 16 x 16 blocks run on AMX's tile registers (`tdpbf16ps`) where the CPU has amx_bf16: within
    the float32 rounding of the sums, for K a multiple of 32 (tiles) and not (the vdpbf16ps kernel, by blocks of 8
    rows); the same tile without AMX (-mattr=-amx-bf16) calls the vdpbf16ps kernel."""
    if "amx_bf16" not in host_cpu_flags():
        pytest.skip("this CPU has no AMX")
    m, n = 2 * mr, 2 * nb
    A, B, C = gemm(m, n, k, nb)
    for target in ("c", "c -mattr=-amx-bf16"):
        f = ember.build(tensorized(C, mr, nb), [A, B, C], target=target)
        assert (f"ember_dot_bf16_{mr}x{nb}_amx(" in f.source) == (target == "c")
        check(f, m, n, k, nb, seed=mr + nb + k)
