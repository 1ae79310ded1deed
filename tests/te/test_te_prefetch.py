"""Stage.prefetch: software prefetches of what a later iteration reads. They compute nothing, so the checks are of
where they point: the generated C is rebuilt with a recorder in place of `__builtin_prefetch`, and the addresses it
saw must be exactly the cache lines of the next panel (with a spread loop: each line once per panel, shared among
the row tiles), never outside the tensor. Results are checked against numpy on C and LLVM; the GEMM template
prefetches the next panel of a large packed B, the blocked convolution the next block of large weights."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ember
from ember import te
from ember.codegen.toolchain import compile_c
from ember.target import Target

RECORDER = """#include <stdint.h>
static const char* ember_test_seen[1 << 20];
static int64_t ember_test_n;
static inline void ember_test_prefetch(const void* p, int rw, int locality) {
  (void)rw; (void)locality;
  if (ember_test_n < (1 << 20)) ember_test_seen[ember_test_n++] = (const char*)p;
}
int64_t ember_test_count(void) { return ember_test_n; }
void ember_test_reset(void) { ember_test_n = 0; }
const char* ember_test_at(int64_t i) { return ember_test_seen[i]; }
"""


def packed_gemm(m: int, k: int, panels: int, nr: int):
    A = te.placeholder((m, k), "float32", name="A")
    B = te.placeholder((panels, k, nr), "float32", name="B")  # B packed into panels of nr columns
    r = te.reduce_axis((0, k), name="k")
    C = te.compute((m, panels * nr), lambda i, j: te.sum(A[i, r] * B[j // nr, r, j % nr], axis=r), name="C")
    return A, B, C


def schedule(A, B, C, mr: int, kr: int, nr: int, spread: bool, fuse: bool):
    """Column panels outside, row tiles inside, the accumulation computed at the row tile (the GEMM template's
    loop nest), B's next panel prefetched at each reduction step."""
    s = te.create_schedule(C)
    CL = s.cache_write(C, "local")
    i, j = s[C].op.axis
    io, ii = s[C].split(i, mr)
    jo, ji = s[C].split(j, nr)
    s[C].reorder(jo, io, ii, ji)
    ko, ki = s[CL].split(s[CL].op.reduce_axis[0], kr)
    s[CL].reorder(ko, ki, *s[CL].op.axis)
    s[CL].compute_at(s[C], io)
    s[CL].prefetch(B, ko, dim=0, offset=1, spread=(s[C], io) if spread else None)
    if fuse:
        s[C].fuse(jo, io)
    return s


def recorded(s, args, arrays) -> list[int]:
    """The addresses the prefetches of the built schedule saw, in order, in one run on `arrays`."""
    mod = ember.build(s, args, target="c")
    assert "__builtin_prefetch(&B[" in mod.source, mod.source
    src = RECORDER + mod.source.replace("__builtin_prefetch(", "ember_test_prefetch(")
    lib = ctypes.CDLL(str(compile_c(src, Target.parse("c").cflags(), name="prefetch_probe")))
    lib.ember_test_count.restype = ctypes.c_int64
    lib.ember_test_at.restype = ctypes.c_void_p
    lib.default_function.restype = ctypes.c_int32
    lib.ember_test_reset()  # the same source is the same library: dlopen hands back the one loaded, counts and all
    assert lib.default_function(*[ctypes.c_void_p(a.ctypes.data) for a in arrays]) == 0
    return [lib.ember_test_at(ctypes.c_int64(n)) for n in range(lib.ember_test_count())]


@settings(max_examples=12, deadline=None)
@given(m=st.integers(1, 13), k=st.integers(1, 40), panels=st.integers(1, 4), nr=st.sampled_from([4, 16, 32]),
       mr=st.integers(1, 6), kr=st.integers(1, 8), spread=st.booleans(), fuse=st.booleans())  # fmt: skip
def test_prefetch_takes_the_next_panels_lines(m, k, panels, nr, mr, kr, spread, fuse):
    A, B, C = packed_gemm(m, k, panels, nr)
    s = schedule(A, B, C, mr, kr, nr, spread, fuse)
    rng = np.random.default_rng(m * 1000 + k)
    a = rng.standard_normal((m, k)).astype("float32")
    b = rng.standard_normal((panels, k, nr)).astype("float32")
    c = np.zeros((m, panels * nr), "float32")
    seen = recorded(s, [A, B, C], [a, b, c])
    dense = b.transpose(1, 0, 2).reshape(k, panels * nr)
    np.testing.assert_allclose(c, a @ dense, rtol=1e-4, atol=1e-4)
    offsets = [p - b.ctypes.data for p in seen]
    assert all(0 <= o < b.nbytes for o in offsets), "a prefetch outside B"
    steps = -(-k // kr)
    tiles = -(-m // mr)
    lines = -(-min(kr, k) * nr // 16)  # 16 floats a line: the lines of one reduction step's rows of a panel
    per_panel = tiles * steps * (-(-lines // tiles) if spread else lines)
    assert len(offsets) == panels * per_panel
    panel_bytes = k * nr * 4
    for p in range(panels):  # while panel p is computed: the lines of panel min(p + 1, last), each at least once
        nxt = min(p + 1, panels - 1)
        covered = np.zeros(panel_bytes, bool)
        for o in offsets[p * per_panel : (p + 1) * per_panel]:
            rel = o - nxt * panel_bytes
            assert 0 <= rel < panel_bytes, f"panel {p} prefetched outside panel {nxt}"
            covered[rel : rel + 64] = True
        assert covered.all(), f"panel {p}: bytes of panel {nxt} never prefetched"


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_prefetch_results_and_ir(target):
    if target == "llvm":
        pytest.importorskip("llvmlite")
    A, B, C = packed_gemm(20, 33, 3, 16)
    s = schedule(A, B, C, 6, 4, 16, spread=True, fuse=True)
    text = str(ember.lower(s, [A, B, C]))
    assert "prefetch(B[" in text, text
    assert s.steps[-2].kind == "prefetch"
    again = te.Schedule.from_record(C, s.record())  # a step like any: it replays
    assert str(ember.lower(again, [A, B, C])) == text
    rng = np.random.default_rng(3)
    a = rng.standard_normal((20, 33)).astype("float32")
    b = rng.standard_normal((3, 33, 16)).astype("float32")
    c = np.zeros((20, 48), "float32")
    ember.build(s, [A, B, C], target=target)(a, b, c)
    np.testing.assert_allclose(c, a @ b.transpose(1, 0, 2).reshape(33, 48), rtol=1e-4, atol=1e-4)


def test_prefetch_errors_name_the_culprit():
    A, B, C = packed_gemm(8, 16, 2, 16)
    s = te.create_schedule(C)
    D = te.placeholder((4,), "float32", name="D")
    with pytest.raises(te.ScheduleError, match="'D' is not part of this schedule"):
        s[C].prefetch(D, s[C].op.reduce_axis[0])
    X = te.compute(D.shape, lambda i: D[i] * 2, name="X")
    Y = te.compute(D.shape, lambda i: X[i] + 1, name="Y")
    with pytest.raises(te.ScheduleError, match="stage 'Y': prefetch of 'D': this stage does not read it"):
        te.create_schedule(Y)[Y].prefetch(D, Y.op.axis[0])
    with pytest.raises(te.ScheduleError, match="dim 3 out of range"):
        s[C].prefetch(B, s[C].op.reduce_axis[0], dim=3)
    with pytest.raises(te.ScheduleError, match="no loop 'nope'"):
        s[C].prefetch(B, "nope")
    s[C].prefetch(B, s[C].op.axis[0])  # a whole row's reduction: 2 panels x 16 x 16 floats per iteration, fine
    ember.lower(s, [A, B, C])
    big_a, big_b, big_c = packed_gemm(4, 4096, 2, 64)
    s2 = te.create_schedule(big_c)
    s2[big_c].prefetch(big_b, s2[big_c].op.axis[0])
    with pytest.raises(te.ScheduleError, match="cache lines per iteration"):
        ember.lower(s2, [big_a, big_b, big_c])


def test_gemm_template_prefetches_large_packed_b_only(tmp_path):
    """The next panel is prefetched where B is large and each panel serves several row tiles; a skinny product
    (one row tile) streams each panel once and is left to the hardware prefetcher, as is a small B."""
    from ember.templates import nn as T

    for rows, n, k, want in ((16, 1024, 768, True), (1, 1024, 768, False), (16, 64, 64, False)):
        rng = np.random.default_rng(n + rows)
        x = rng.standard_normal((rows, k)).astype("float32")
        w = rng.standard_normal((k, n)).astype("float32")
        assert (w.nbytes >= T.PREFETCH_MIN_BYTES) == (n > 64)
        m = ember.compile(_matmul_model(x.shape, w), target="c -threads=1")
        src = (m.save(tmp_path / f"mm{rows}x{n}") / "model.c").read_text()
        assert ("__builtin_prefetch" in src) == want, (rows, n, k)
        np.testing.assert_allclose(m(x), x @ w, rtol=1e-4, atol=1e-3)


def _matmul_model(shape, w):
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [shape[0], w.shape[1]])
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm", [x], [y],
                          [numpy_helper.from_array(w, "w")])  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_conv_template_prefetches_the_next_blocks_weights(tmp_path):
    """A 3x3 convolution of 256 channels at 7x7 (2.4 MB of weights, two row tiles per block of output channels)
    prefetches the next block's weights; its output matches onnxruntime."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    w = (rng.standard_normal((256, 256, 3, 3)) * 0.05).astype("float32")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256, 7, 7])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256, 7, 7])
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    g = helper.make_graph([node], "conv", [x], [y], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m = ember.compile(model, target="c -threads=1")
    src = (m.save(tmp_path / "conv") / "model.c").read_text()
    assert "__builtin_prefetch(&in1[" in src
    feed = rng.standard_normal((1, 256, 7, 7)).astype("float32")
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": feed})[0]
    np.testing.assert_allclose(m(feed), ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))
