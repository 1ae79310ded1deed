"""LLVM IR for the narrow-format conversions of `ember.tir.narrow`: one internal function each, built with selects
(no branches), computing what the C functions of `ember.codegen.narrow` compute: exact decoding, encoding rounded
half to even (llvm.rint on the value scaled to units of the last mantissa bit), the format's saturation, infinity
or NaN past its largest value; e8m0 on the float32 bits as onnx's `to_float8e8m0`."""

from __future__ import annotations

from typing import Any

import llvmlite.ir as ir

from ember.tir.narrow import E8M0, FLOAT_FORMATS, INT_FORMATS, Conversion, FloatFormat

I8, I32, F32 = ir.IntType(8), ir.IntType(32), ir.FloatType()


def _i(v: int) -> ir.Constant:
    return ir.Constant(I32, v & 0xFFFFFFFF)


def _f(v: float) -> ir.Constant:
    return ir.Constant(F32, v)


def llvm_function(module: ir.Module, conv: Conversion) -> ir.Function:
    """The conversion as an internal function of `module` (defined once): i8 -> float/i32 or float/i32 -> i8."""
    name = f"ember_{conv.name}"
    if name in module.globals:
        return module.globals[name]
    wide = I32 if conv.dtype in INT_FORMATS else F32
    ty = ir.FunctionType(I8, [wide]) if conv.encode else ir.FunctionType(wide, [I8])
    fn = ir.Function(module, ty, name)
    fn.linkage = "internal"
    B = ir.IRBuilder(fn.append_basic_block("entry"))
    (x,) = fn.args
    if conv.dtype in INT_FORMATS:
        B.ret(_int(B, conv, x))
    elif conv.dtype == E8M0:
        B.ret(_e8m0_encode(B, conv, x) if conv.encode else _e8m0_decode(B, x))
    else:
        fmt = FLOAT_FORMATS[conv.dtype]
        B.ret(_float_encode(B, module, conv, fmt, x) if conv.encode else _float_decode(B, fmt, x))
    return fn


def _pow2(B: ir.IRBuilder, k: Any) -> Any:
    """2^k as float32 for an i32 k in the normal range [-126, 127]."""
    return B.bitcast(B.shl(B.add(k, _i(127)), _i(23)), F32)


def _int(B: ir.IRBuilder, conv: Conversion, x: Any) -> Any:
    bits, signed = INT_FORMATS[conv.dtype]
    if conv.encode:  # two's complement wrap-around
        return B.trunc(B.and_(x, _i((1 << bits) - 1)), I8)
    v = B.zext(x, I32)
    if signed:  # sign-extend the low bits
        return B.ashr(B.shl(v, _i(32 - bits)), _i(32 - bits))
    return B.and_(v, _i((1 << bits) - 1))


def _float_decode(B: ir.IRBuilder, f: FloatFormat, x: Any) -> Any:
    c = B.and_(B.zext(x, I32), _i((f.sign_bit << 1) - 1))
    e = B.and_(B.lshr(c, _i(f.man_bits)), _i((1 << f.exp_bits) - 1))
    m = B.and_(c, _i((1 << f.man_bits) - 1))
    sub = B.fmul(B.uitofp(m, F32), _f(2.0 ** (f.emin - f.man_bits)))
    norm = B.fmul(B.uitofp(B.add(m, _i(1 << f.man_bits)), F32), _pow2(B, B.sub(e, _i(f.bias + f.man_bits))))
    v = B.select(B.icmp_unsigned("==", e, _i(0)), sub, norm)
    nan, inf = _f(float("nan")), _f(float("inf"))
    if f.special == "ieee":
        special = B.select(B.icmp_unsigned("!=", m, _i(0)), nan, inf)
        v = B.select(B.icmp_unsigned("==", e, _i((1 << f.exp_bits) - 1)), special, v)
    elif f.special == "fn":
        v = B.select(B.icmp_unsigned("==", B.and_(c, _i(f.sign_bit - 1)), _i(f.sign_bit - 1)), nan, v)
    negative = B.icmp_unsigned("!=", B.and_(c, _i(f.sign_bit)), _i(0))
    v = B.select(negative, B.fneg(v), v)
    if f.special == "fnuz":  # the one NaN; there is no -0
        v = B.select(B.icmp_unsigned("==", c, _i(f.sign_bit)), nan, v)
    return v


def _float_encode(B: ir.IRBuilder, module: ir.Module, conv: Conversion, f: FloatFormat, x: Any) -> Any:
    rint = module.declare_intrinsic("llvm.rint", [F32])
    bits = B.bitcast(x, I32)
    a = B.bitcast(B.and_(bits, _i(0x7FFFFFFF)), F32)
    sign = B.select(B.icmp_signed("<", bits, _i(0)), _i(f.sign_bit), _i(0))
    unit = 1 << f.man_bits
    e_bits = B.sub(B.and_(B.lshr(bits, _i(23)), _i(0xFF)), _i(127))
    e = B.select(B.fcmp_ordered("<", a, _f(2.0**f.emin)), _i(f.emin), e_bits)  # below the normals: subnormal step
    e = B.select(B.icmp_signed(">", e, _i(127)), _i(127), e)  # infinities and NaNs: any value, selected away
    n = B.call(rint, [B.fmul(a, _pow2(B, B.sub(_i(f.man_bits), e)))])  # a in units of the last mantissa bit
    over = B.fcmp_ordered(">", B.fmul(n, _pow2(B, B.sub(e, _i(f.man_bits)))), _f(f.max_value))
    carry = B.fcmp_ordered("==", n, _f(2.0 * unit))  # rounded up to a power of two
    e2 = B.select(carry, B.add(e, _i(1)), e)
    n_int = B.fptoui(B.select(carry, _f(float(unit)), n), I32)
    normal = B.or_(B.shl(B.add(e2, _i(f.bias)), _i(f.man_bits)), B.sub(n_int, _i(unit)))
    code = B.select(B.fcmp_ordered("<", n, _f(float(unit))), n_int, normal)
    code = B.or_(sign, code)
    if f.special == "fnuz":  # no -0
        code = B.select(B.fcmp_ordered("==", n, _f(0.0)), _i(0), code)
    top = f.sign_bit - 1
    inf_code = top - unit + 1
    if conv.saturate or f.special == "none":
        overflow = B.or_(sign, _i(f.max_code))
    elif f.special == "ieee":
        overflow = B.or_(sign, _i(inf_code))
    elif f.special == "fn":
        overflow = B.or_(sign, _i(top))
    else:
        overflow = _i(f.sign_bit)
    nan = {"ieee": B.or_(sign, _i(inf_code | unit >> 1)), "fn": B.or_(sign, _i(top)), "fnuz": _i(f.sign_bit),
           "none": B.xor(sign, _i(f.sign_bit))}[f.special]  # fmt: skip
    code = B.select(B.or_(over, B.fcmp_ordered("==", a, _f(float("inf")))), overflow, code)
    code = B.select(B.fcmp_unordered("uno", x, x), nan, code)
    return B.trunc(code, I8)


def _e8m0_decode(B: ir.IRBuilder, x: Any) -> Any:
    c = B.zext(x, I32)
    bits = B.select(B.icmp_unsigned("==", c, _i(0)), _i(0x400000), B.shl(c, _i(23)))  # 2^-127 is subnormal
    return B.select(B.icmp_unsigned("==", c, _i(0xFF)), _f(float("nan")), B.bitcast(bits, F32))


def _e8m0_encode(B: ir.IRBuilder, conv: Conversion, x: Any) -> Any:
    bits = B.bitcast(x, I32)
    e = B.and_(B.lshr(bits, _i(23)), _i(0xFF))

    def nonzero(mask: int) -> Any:
        return B.icmp_unsigned("!=", B.and_(bits, _i(mask)), _i(0))

    if conv.round_mode == "up":
        up = nonzero(0x7FFFFF)
    elif conv.round_mode == "nearest":  # guard bit, and round, sticky or a nonzero exponent (as onnx)
        rest = B.or_(B.or_(nonzero(0x200000), nonzero(0x1FFFFF)), B.icmp_unsigned(">", e, _i(0)))
        up = B.and_(nonzero(0x400000), rest)
    else:
        up = ir.Constant(ir.IntType(1), 0)
    if conv.saturate:  # never past 2^127
        up = B.and_(up, B.icmp_unsigned("<", e, _i(0xFE)))
    rounded = B.add(e, B.zext(up, I32))
    return B.trunc(B.select(B.icmp_unsigned("==", e, _i(0xFF)), _i(0xFF), rounded), I8)
