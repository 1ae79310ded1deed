"""C for the narrow-format conversions of `ember.tir.narrow`: one small static inline function each.

Decoding is exact (ldexpf of the mantissa). Encoding rounds half to even with nearbyintf on the value scaled to
units of the last mantissa bit, then applies the format's rules past its largest finite value: saturate to it, or
give the format's infinity or NaN (ONNX's Cast with saturate=0, as ml_dtypes converts). e8m0 follows onnx's
`to_float8e8m0` on the float32 bits (the sign is ignored; NaN and infinities give 0xff)."""

from __future__ import annotations

from ember.tir.narrow import E8M0, FLOAT_FORMATS, INT_FORMATS, Conversion, FloatFormat


def c_function(conv: Conversion) -> tuple[str, str]:
    """(C name, definition) of a conversion."""
    name = f"ember_{conv.name}"
    if conv.dtype in INT_FORMATS:
        return name, _int(name, conv)
    if conv.dtype == E8M0:
        return name, _e8m0_encode(name, conv) if conv.encode else _e8m0_decode(name)
    fmt = FLOAT_FORMATS[conv.dtype]
    return name, _float_encode(name, conv, fmt) if conv.encode else _float_decode(name, conv.dtype, fmt)


def _int(name: str, conv: Conversion) -> str:
    bits, signed = INT_FORMATS[conv.dtype]
    mask = (1 << bits) - 1
    if conv.encode:  # two's complement wrap-around, as numpy's integer casts
        return f"static inline uint8_t {name}(int32_t v) {{ return (uint8_t)(v & {mask:#x}); }}"
    if not signed:
        return f"static inline int32_t {name}(uint8_t c) {{ return c & {mask:#x}; }}"
    half = 1 << (bits - 1)
    return (f"static inline int32_t {name}(uint8_t c) {{\n"
            f"  int32_t v = c & {mask:#x};\n"
            f"  return v >= {half} ? v - {1 << bits} : v;  /* sign-extend */\n}}")  # fmt: skip


def _float_decode(name: str, dtype: str, f: FloatFormat) -> str:
    m_mask = (1 << f.man_bits) - 1
    e_mask = (1 << f.exp_bits) - 1
    code_mask = (f.sign_bit << 1) - 1
    special = {
        "ieee": f"  if (e == {e_mask}) v = m ? NAN : INFINITY;\n",
        "fn": f"  if ((c & {f.sign_bit - 1:#x}) == {f.sign_bit - 1:#x}) v = NAN;\n",
        "fnuz": f"  if (c == {f.sign_bit:#x}) return NAN;  /* the one NaN; there is no -0 */\n",
        "none": "",
    }[f.special]
    low = f.emin - f.man_bits
    return (
        f"static inline float {name}(uint8_t c) {{\n"
        f"  /* {dtype}: sign, {f.exp_bits} exponent and {f.man_bits} mantissa bits, bias {f.bias} */\n"
        + (f"  c &= {code_mask:#x};\n" if code_mask != 0xFF else "")
        + f"  int e = (c >> {f.man_bits}) & {e_mask:#x}, m = c & {m_mask:#x};\n"
        f"  float v = e == 0 ? ldexpf((float)m, {low})\n"
        f"                   : ldexpf((float)(m + {1 << f.man_bits}), e - {f.bias + f.man_bits});\n"
        + special
        + f"  return (c & {f.sign_bit:#x}) ? -v : v;\n}}"
    )  # fmt: skip


def _float_encode(name: str, conv: Conversion, f: FloatFormat) -> str:
    sign, top = f.sign_bit, f.sign_bit - 1
    inf = top - (1 << f.man_bits) + 1  # ieee: exponent all ones, mantissa 0
    nan = {"ieee": f"sign | {inf | 1 << (f.man_bits - 1):#x}", "fn": f"sign | {top:#x}", "fnuz": f"{sign:#x}",
           "none": f"sign ^ {sign:#x}"}[f.special]  # fmt: skip
    if conv.saturate or f.special == "none":  # e2m1 has neither infinity nor NaN: it always saturates
        overflow = f"sign | {f.max_code:#x}"
    else:
        overflow = {"ieee": f"sign | {inf:#x}", "fn": f"sign | {top:#x}",
                    "fnuz": f"{sign:#x}"}[f.special]  # fmt: skip
    saturating = overflow.endswith(f"{f.max_code:#x}")
    past = f"saturate to {f.max_value:g}" if saturating else ("infinity" if f.special == "ieee" else "NaN")
    zero = "  if (n == 0.0f) return 0;  /* no -0 */\n" if f.special == "fnuz" else ""
    nan_note = "  /* as ml_dtypes (onnx's reference) converts it */" if f.special == "none" else ""
    unit = 1 << f.man_bits
    return (
        f"static inline uint8_t {name}(float x) {{\n"
        f"  /* round half to even; past {f.max_value:g}, {past} */\n"
        f"  uint8_t sign = signbit(x) ? {sign:#x} : 0;\n"
        f"  float a = fabsf(x);\n"
        f"  if (isnan(x)) return {nan};{nan_note}\n"
        f"  if (isinf(x)) return {overflow};\n"
        f"  int e = a < {2.0 ** f.emin!r}f ? {f.emin} : ilogbf(a);  /* below the normals: the subnormal step */\n"
        f"  float n = nearbyintf(ldexpf(a, {f.man_bits} - e));  /* a in units of the last mantissa bit */\n"
        f"  if (ldexpf(n, e - {f.man_bits}) > {f.max_value!r}f) return {overflow};\n"
        + zero
        + f"  if (n < {float(unit)!r}f) return sign | (uint8_t)n;  /* subnormal or zero */\n"
        f"  if (n == {float(2 * unit)!r}f) {{ n = {float(unit)!r}f; e += 1; }}  /* rounded up to a power of two */\n"
        f"  return sign | (uint8_t)(((e + {f.bias}) << {f.man_bits}) | ((int)n - {unit}));\n}}"
    )  # fmt: skip


def _e8m0_decode(name: str) -> str:
    return (f"static inline float {name}(uint8_t c) {{\n"
            "  return c == 0xff ? NAN : ldexpf(1.0f, (int)c - 127);  /* 2^(c - 127) */\n}")  # fmt: skip


def _e8m0_encode(name: str, conv: Conversion) -> str:
    if conv.round_mode == "up":
        up = "(x & 0x7fffffu) != 0"
    elif conv.round_mode == "nearest":  # guard bit set, and round, sticky or a nonzero exponent (as onnx)
        up = "(x & 0x400000u) && ((x & 0x200000u) || (x & 0x1fffffu) || e > 0)"
    else:
        up = ""
    if not up:
        body = ""
    elif conv.saturate:
        body = f"  if (({up}) && e < 0xfe) e += 1;  /* never past 2^127 */\n"
    else:
        body = f"  if ({up}) e += 1;  /* past 2^127: NaN */\n"
    return (
        f"static inline uint8_t {name}(float f) {{\n"
        f"  /* the float32 exponent, rounded {conv.round_mode}; the sign is ignored */\n"
        "  uint32_t x;\n"
        "  memcpy(&x, &f, 4);\n"
        "  uint32_t e = (x >> 23) & 0xffu;\n"
        "  if (e == 0xff) return 0xff;  /* NaN and infinities */\n"
        + body
        + "  return (uint8_t)e;\n}"
    )  # fmt: skip
