"""The narrow ONNX formats (float8 x5, float4_e2m1fn, int4/uint4/int2/uint2): every conversion to and from float32,
through ember.compile of a Cast (or QuantizeLinear/DequantizeLinear) model, against onnx's reference evaluator
(which converts with ml_dtypes and onnx.numpy_helper) on fresh random values and the special ones: NaN, infinities,
the largest finite value and just past it, ties, subnormals and values below them. Codes must agree bit for bit."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from conftest import opencl_missing
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import ember
from ember import te
from ember.frontend.onnx import from_onnx
from ember.ops.evaluate import evaluate
from ember.tir.narrow import FLOAT_FORMATS

ONNX_TYPES = {
    "float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "int8": TensorProto.INT8,
    "uint8": TensorProto.UINT8, "int32": TensorProto.INT32, "bool": TensorProto.BOOL,
    "float8_e4m3fn": TensorProto.FLOAT8E4M3FN, "float8_e4m3fnuz": TensorProto.FLOAT8E4M3FNUZ,
    "float8_e5m2": TensorProto.FLOAT8E5M2, "float8_e5m2fnuz": TensorProto.FLOAT8E5M2FNUZ,
    "float8_e8m0fnu": TensorProto.FLOAT8E8M0, "float4_e2m1fn": TensorProto.FLOAT4E2M1,
    "int4": TensorProto.INT4, "uint4": TensorProto.UINT4, "int2": TensorProto.INT2, "uint2": TensorProto.UINT2,
}  # fmt: skip
FLOATS = list(FLOAT_FORMATS)
INTS = ["int4", "uint4", "int2", "uint2"]


def np_dtype(name: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, name, None) or name)


def model(op: str, inputs: list[tuple[str, str, tuple]], out: tuple[str, tuple], **attrs):
    node = helper.make_node(op, [name for name, _, _ in inputs], ["y"], **attrs)
    graph = helper.make_graph(
        [node], op, [helper.make_tensor_value_info(n, ONNX_TYPES[dt], s) for n, dt, s in inputs],
        [helper.make_tensor_value_info("y", ONNX_TYPES[out[0]], out[1])],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])


@pytest.fixture(params=["c", "llvm"])
def target(request) -> str:
    if request.param == "llvm":
        pytest.importorskip("llvmlite", reason="the llvm target needs llvmlite (ember[llvm])")
    return request.param


@pytest.mark.parametrize("fmt", [*FLOATS, "float8_e8m0fnu", "int4", "uint2"])
def test_opencl_converts_the_same_way(fmt):
    """The C conversion functions compile as OpenCL C (libm names renamed by its prelude): one round trip each."""
    missing = opencl_missing()
    if missing is not None:
        pytest.skip(f"no OpenCL platform: {missing}")
    x = float_probe("float8_e5m2", np.random.default_rng(9), 200)
    to = model("Cast", [("x", "float32", x.shape)], (fmt, x.shape), to=ONNX_TYPES[fmt])
    with np.errstate(invalid="ignore"):
        codes, want = run_both(to, {"x": x}, "opencl")
    if fmt in INTS:
        assert_same_int_codes(codes, want, x)
    else:
        assert_same_codes(codes, want)
    back = model("Cast", [("x", fmt, x.shape)], ("float32", x.shape), to=TensorProto.FLOAT)
    assert_same_floats(*run_both(back, {"x": want}, "opencl"))


def skip_llvm_half(dtype: str, target: str) -> None:
    if target == "llvm" and dtype == "float16":
        pytest.skip("the llvm target has no float16 yet (ember.codegen.llvm.ltype)")


def run_both(m, feeds: dict[str, np.ndarray], target: str = "c") -> tuple[np.ndarray, np.ndarray]:
    """(Ember's output, onnx's reference output); Ember compiled for `target` with no numpy fallback. Ember's own
    numpy reference (which folds constants) must give the compiled kernel's bytes too."""
    compiled = ember.compile(m, target=target, fallback=False)
    got = compiled.run(feeds)["y"]
    (want,) = ReferenceEvaluator(m).run(None, feeds)
    with np.errstate(all="ignore"):
        folded = evaluate(from_onnx(m), feeds)["y"]
    same = folded.view(np.uint8) == got.view(np.uint8)
    if got.dtype.kind == "f":
        same = same.reshape(got.shape + (-1,)).all(-1) | (np.isnan(folded) & np.isnan(got))
    assert folded.dtype == got.dtype and same.all(), f"reference {folded[~same][:5]}, kernel {got[~same][:5]}"
    return got, want


def assert_same_codes(got: np.ndarray, want: np.ndarray) -> None:
    """Same dtype and same bytes (NaN codes and their signs included)."""
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    same = got.view(np.uint8) == want.view(np.uint8)
    bad = np.flatnonzero(~same)
    assert same.all(), f"{bad.size} differ, e.g. at {bad[:5]}: got {got[bad[:5]]}, want {want[bad[:5]]}"


def assert_same_int_codes(got: np.ndarray, want: np.ndarray, x: np.ndarray) -> None:
    """Codes of a cast of `x` to int4/uint4/int2/uint2: onnx's reference where the value truncated toward zero fits
    the format; past it ONNX leaves the result undefined (ml_dtypes 0.7 gives 0, older versions wrapped, onnxruntime
    saturates) and Ember wraps around as for integer sources, checked here against numpy; NaN, infinities and values
    past int32 are only required to agree with Ember's own reference (run_both)."""
    bits = BITS[got.dtype.name]
    lo = 0 if got.dtype.name.startswith("u") else -(1 << (bits - 1))
    hi = lo + (1 << bits) - 1
    wide = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        trunc = np.trunc(wide)
        fits = (trunc >= lo) & (trunc <= hi)
        defined = np.isfinite(wide) & (np.abs(wide) < 2.0**31)
    assert_same_codes(got[fits], want[fits])
    past = defined & ~fits
    ints = np.where(past, trunc, 0).astype(np.int64)
    wrapped = ((ints - lo) % (1 << bits) + lo).astype(got.dtype)
    assert_same_codes(got[past], wrapped[past])
    assert fits.sum() > 0


BITS = {"int4": 4, "uint4": 4, "int2": 2, "uint2": 2}


def assert_same_floats(got: np.ndarray, want: np.ndarray) -> None:
    """Bit-equal float32 values (so -0 != 0), NaN equal to NaN."""
    assert got.dtype == want.dtype
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"got {got[~same][:5]}, want {want[~same][:5]}"


def float_probe(fmt_name: str, rng: np.random.Generator, n: int = 3000) -> np.ndarray:
    """Random float32 values over the format's whole range and past it, plus every special case."""
    info = ml_dtypes.finfo(np_dtype(fmt_name))
    big, tiny = float(info.max), float(info.smallest_subnormal)
    every = np.arange(256 if fmt_name.startswith("float8") else 16, dtype=np.uint8).view(np_dtype(fmt_name))
    values = every.astype(np.float32)
    finite = values[np.isfinite(values)]
    finite.sort()
    ties = (finite[1:] + finite[:-1]) / 2  # halfway between neighbours: round half to even
    exps = rng.uniform(np.log2(tiny) - 3, np.log2(big) + 2, n)
    rand = (rng.choice([-1, 1], n) * np.exp2(exps)).astype(np.float32)
    specials = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, big, -big, big * 1.03, -big * 1.03, big * 1.07,
                tiny, -tiny, tiny / 2, tiny * 0.51, -tiny * 0.49, 1e-30, 1e-45, -1e-45, 3.4e38, -3.4e38]  # fmt: skip
    return np.concatenate([values, ties, np.nextafter(ties, np.inf), rand, np.array(specials, np.float32)])


@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("fmt", FLOATS)
def test_float32_to_narrow_float_rounds_as_onnx(fmt, saturate, target):
    x = float_probe(fmt, np.random.default_rng([*fmt.encode(), saturate]))
    m = model("Cast", [("x", "float32", x.shape)], (fmt, x.shape), to=ONNX_TYPES[fmt], saturate=saturate)
    assert_same_codes(*run_both(m, {"x": x}, target))


@pytest.mark.parametrize("fmt", [*FLOATS, "float8_e8m0fnu"])
def test_every_narrow_float_code_decodes_exactly(fmt, target):
    x = np.arange(256 if fmt.startswith("float8") else 16, dtype=np.uint8).view(np_dtype(fmt))
    m = model("Cast", [("x", fmt, x.shape)], ("float32", x.shape), to=TensorProto.FLOAT)
    got, want = run_both(m, {"x": x}, target)
    assert_same_floats(got, want)


@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
def test_float32_to_e8m0_rounds_as_onnx(round_mode, saturate, target):
    """onnx.numpy_helper.to_float8e8m0 on the float32 bits: random bit patterns cover negatives, subnormals, NaNs."""
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32)
    powers = np.exp2(np.arange(-149, 128, dtype=np.float64)).astype(np.float32)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.4e38, -1.5, 1.5, 1.75, 1.25], np.float32)
    x = np.concatenate([bits.view(np.float32), powers, np.nextafter(powers, np.inf), np.nextafter(powers, 0), specials])
    m = model("Cast", [("x", "float32", x.shape)], ("float8_e8m0fnu", x.shape), to=TensorProto.FLOAT8E8M0,
              saturate=saturate, round_mode=round_mode)  # fmt: skip
    assert_same_codes(*run_both(m, {"x": x}, target))


@pytest.mark.parametrize("fmt", INTS)
@pytest.mark.parametrize("src", ["float32", "int32", "int8"])
def test_narrow_ints_wrap_and_truncate_as_onnx(fmt, src, target):
    """To int4/uint4/int2/uint2: truncation toward zero, then two's complement wrap-around (ml_dtypes' astype)."""
    rng = np.random.default_rng(3)
    if src == "float32":
        x = np.concatenate([rng.uniform(-40, 40, 500), np.arange(-20, 20) + 0.5,
                            [np.nan, np.inf, -np.inf, 3e9, -3e9, 1e30, -0.0]]).astype(np.float32)  # fmt: skip
    else:
        info = np.iinfo(src)
        x = rng.integers(max(info.min, -10**6), min(info.max, 10**6), 600).astype(src)
    m = model("Cast", [("x", src, x.shape)], (fmt, x.shape), to=ONNX_TYPES[fmt])
    with np.errstate(invalid="ignore"):
        got, want = run_both(m, {"x": x}, target)
    assert_same_int_codes(got, want, x) if src == "float32" else assert_same_codes(got, want)


@pytest.mark.parametrize("fmt", INTS)
@pytest.mark.parametrize("to", ["float32", "int8", "float16", "bool"])
def test_narrow_ints_decode(fmt, to, target):
    skip_llvm_half(to, target)
    x = np.arange(16 if "4" in fmt else 4, dtype=np.uint8).view(np_dtype(fmt))
    got, want = run_both(model("Cast", [("x", fmt, x.shape)], (to, x.shape), to=ONNX_TYPES[to]), {"x": x}, target)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("src,dst", [("float8_e4m3fn", "float8_e5m2"), ("float8_e5m2", "float8_e4m3fnuz"),
                                     ("float16", "float8_e5m2fnuz"), ("int4", "float4_e2m1fn"),
                                     ("float8_e4m3fn", "int4"), ("float4_e2m1fn", "float8_e8m0fnu")])  # fmt: skip
def test_narrow_to_narrow_and_float16(src, dst, target):
    skip_llvm_half(src, target)
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(300) * 20).astype(np.float32)
    x = x.astype(np_dtype(src)) if not src.startswith("float8") else ml_dtypes_saturate(x, src)
    m = model("Cast", [("x", src, x.shape)], (dst, x.shape), to=ONNX_TYPES[dst])
    with np.errstate(invalid="ignore", over="ignore"):
        got, want = run_both(m, {"x": x}, target)
    if dst in INTS and src.startswith("float"):
        assert_same_int_codes(got, want, x.astype(np.float32))
    else:
        assert_same_codes(got, want)


def ml_dtypes_saturate(x: np.ndarray, fmt: str) -> np.ndarray:
    big = float(ml_dtypes.finfo(np_dtype(fmt)).max)
    return np.clip(x, -big, big).astype(np_dtype(fmt))


@pytest.mark.parametrize("fmt", [*FLOATS, *INTS])
def test_quantize_dequantize_linear(fmt, target):
    """QuantizeLinear per axis (with a zero point for the integers and float4) and DequantizeLinear, as onnx's
    reference computes them."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((3, 40)) * 30).astype(np.float32)
    scale = rng.uniform(0.05, 2.0, 3).astype(np.float32)
    inputs = [("x", "float32", x.shape), ("s", "float32", (3,))]
    feeds = {"x": x, "s": scale}
    if not fmt.startswith("float8"):
        zp = rng.integers(0 if fmt.startswith("u") else -1, 2, 3).astype(np.float32).astype(np_dtype(fmt))
        inputs.append(("z", fmt, (3,)))
        feeds["z"] = zp
    out_attr = {} if "z" in feeds else {"output_dtype": ONNX_TYPES[fmt]}
    q = model("QuantizeLinear", inputs, (fmt, x.shape), axis=0, **out_attr)
    got, want = run_both(q, feeds, target)
    assert_same_codes(got, want)
    dq_inputs = [("q", fmt, x.shape), *inputs[1:]]
    dq_feeds = {"q": want, **{k: v for k, v in feeds.items() if k != "x"}}
    got, want = run_both(model("DequantizeLinear", dq_inputs, ("float32", x.shape), axis=0), dq_feeds, target)
    assert_same_floats(got, want)


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e8m0fnu", "int4", "uint2"])
def test_data_movement_keeps_codes(fmt, target):
    """Transpose and Concat move codes as bytes (NaN payloads and -0 included)."""
    x = np.random.default_rng(2).integers(0, 256 if fmt.startswith("float8") else 4, (5, 7)).astype(np.uint8)
    x = x.view(np_dtype(fmt))
    got, want = run_both(model("Transpose", [("x", fmt, x.shape)], (fmt, (7, 5)), perm=[1, 0]), {"x": x}, target)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    m = model("Concat", [("x", fmt, x.shape), ("w", fmt, x.shape)], (fmt, (10, 7)), axis=0)
    got, want = run_both(m, {"x": x, "w": x[::-1].copy()}, target)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_generated_c_has_one_function_per_conversion():
    A = te.placeholder((64,), "float32", name="A")
    B = te.compute((64,), lambda i: te.cast(A[i], "float8_e4m3fn"), name="B")
    C = te.compute((64,), lambda i: te.cast(B[i], "float32") + te.cast(te.cast(A[i], "int4"), "float32"), name="C")
    f = ember.build(te.create_schedule([B, C]), [A, B, C], target="c")
    for fn in ("ember_float32_to_float8_e4m3fn_sat(", "ember_float8_e4m3fn_to_float32(", "ember_int32_to_int4(",
               "ember_int4_to_int32("):  # fmt: skip
        assert fn in f.source
    a = np.random.default_rng(4).standard_normal(64).astype(np.float32) * 10
    b, c = np.zeros(64, np_dtype("float8_e4m3fn")), np.zeros(64, np.float32)
    f(a, b, c)
    want_b = ml_dtypes_saturate(a, "float8_e4m3fn")
    np.testing.assert_array_equal(b.view(np.uint8), want_b.view(np.uint8))
    as_int4 = (np.trunc(a).astype(np.int64) + 8) % 16 - 8  # toward zero, then wrapped (past [-8, 7]: see above)
    np.testing.assert_array_equal(c, want_b.astype(np.float32) + as_int4.astype(np.float32))


def test_arithmetic_on_codes_is_refused_with_a_clear_error():
    A = te.placeholder((8,), "float8_e5m2", name="A")
    with pytest.raises(TypeError, match="float8_e5m2 values: they are stored codes"):
        te.compute((8,), lambda i: A[i] + A[i], name="B")


def test_narrow_inputs_are_checked_and_survive_save_and_load(tmp_path):
    x = np.arange(16, dtype=np.uint8).view(np_dtype("int4"))
    m = ember.compile(model("Cast", [("x", "int4", (16,))], ("float8_e5m2", (16,)), to=TensorProto.FLOAT8E5M2),
                      target="c", fallback=False)  # fmt: skip
    with pytest.raises(Exception, match="has dtype uint8, wants int4"):
        m(x.view(np.uint8))
    m.save(tmp_path / "m")
    y = ember.load(tmp_path / "m")(x)
    np.testing.assert_array_equal(y.view(np.uint8), x.astype(np.float32).astype(np_dtype("float8_e5m2")).view(np.uint8))
