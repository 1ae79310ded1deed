"""C for the narrow-format conversions of `ember.tir.narrow`: one small static inline function each.

Decoding is exact (float32 bits built from the code). Encoding rounds half to even on the float32 bits, then applies
the format's rules past its largest finite value: saturate to it, or give the format's infinity or NaN (ONNX's Cast
with saturate=0, as ml_dtypes converts). e8m0 follows onnx's
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
    """Normal codes become float32 bits directly (exponent rebiased, mantissa shifted up); subnormal codes are their
    mantissa times the subnormal step (exact). Selects, not branches: codes arrive in any order."""
    m_mask, e_mask = (1 << f.man_bits) - 1, (1 << f.exp_bits) - 1
    code_mask = (f.sign_bit << 1) - 1
    special = {
        "ieee": f"  if (e == {e_mask}) bits = m ? 0x7fc00000u : 0x7f800000u;  /* NaN, infinity */\n",
        "fn": f"  if ((c & {f.sign_bit - 1:#x}) == {f.sign_bit - 1:#x}) bits = 0x7fc00000u;  /* NaN */\n",
        "fnuz": f"  if (c == {f.sign_bit:#x}) bits = 0x7fc00000u;  /* the one NaN; there is no -0 */\n",
        "none": "",
    }[f.special]
    return (
        f"static inline float {name}(uint8_t c) {{\n"
        f"  /* {dtype}: sign, {f.exp_bits} exponent and {f.man_bits} mantissa bits, bias {f.bias} */\n"
        + (f"  c &= {code_mask:#x};\n" if code_mask != 0xFF else "")
        + f"  uint32_t e = (c >> {f.man_bits}) & {e_mask:#x}, m = c & {m_mask:#x}, sub;\n"
        f"  float step = (float)m * 0x1p{f.emin - f.man_bits}f;  /* a subnormal (or zero) code's value */\n"
        "  memcpy(&sub, &step, 4);\n"
        f"  uint32_t bits = e == 0 ? sub : (e + {127 - f.bias}u) << 23 | m << {23 - f.man_bits};\n"
        + special
        + f"  bits |= (uint32_t)(c & {f.sign_bit:#x}) << {31 - f.exp_bits - f.man_bits};  /* the sign */\n"
        + "  float v;\n"
        "  memcpy(&v, &bits, 4);\n"
        "  return v;\n}"
    )  # fmt: skip


def _float_encode(name: str, conv: Conversion, f: FloatFormat) -> str:
    """Normal results: the float32 bits with the dropped mantissa bits rounded half to even (a carry moves into the
    exponent), rebiased. Subnormal results: the value in units of the subnormal step, rounded by nearbyintf. Past
    the largest finite code (infinity included): saturate, or the format's infinity or NaN."""
    sign, top, unit = f.sign_bit, f.sign_bit - 1, 1 << f.man_bits
    inf = top - unit + 1  # ieee: exponent all ones, mantissa 0
    nan = {"ieee": f"sign | {inf | unit >> 1:#x}", "fn": f"sign | {top:#x}", "fnuz": f"{sign:#x}",
           "none": f"sign ^ {sign:#x}"}[f.special]  # fmt: skip
    saturating = conv.saturate or f.special == "none"  # e2m1 has neither infinity nor NaN: it always saturates
    if saturating:
        overflow = f"sign | {f.max_code:#x}"
    else:
        overflow = {"ieee": f"sign | {inf:#x}", "fn": f"sign | {top:#x}", "fnuz": f"{sign:#x}"}[f.special]
    past = f"saturate to {f.max_value:g}" if saturating else ("infinity" if f.special == "ieee" else "NaN")
    drop = 23 - f.man_bits
    zero = "  if (code == 0) return 0;  /* no -0 */\n" if f.special == "fnuz" else ""
    nan_note = "  /* as ml_dtypes (onnx's reference) converts it */" if f.special == "none" else ""
    return (
        f"static inline uint8_t {name}(float x) {{\n"
        f"  /* round half to even; past {f.max_value:g}, {past} */\n"
        "  uint32_t a, code;\n"
        "  memcpy(&a, &x, 4);\n"
        f"  uint8_t sign = (a >> {31 - f.exp_bits - f.man_bits}) & {sign:#x};\n"
        "  a &= 0x7fffffffu;\n"
        f"  if (a > 0x7f800000u) return {nan};{nan_note}\n"
        f"  if (a < {f.emin + 127}u << 23) {{  /* below the normals: in units of the subnormal step */\n"
        "    float v;\n"
        "    memcpy(&v, &a, 4);\n"
        f"    code = (uint32_t)nearbyintf(v * 0x1p{f.man_bits - f.emin}f);\n"
        "  } else {  /* drop the low mantissa bits, rounding half to even; rebias the exponent */\n"
        f"    code = (a + {(1 << (drop - 1)) - 1:#x}u + ((a >> {drop}) & 1u)) >> {drop};\n"
        f"    code -= {127 - f.bias}u << {f.man_bits};\n"
        "  }\n"
        f"  if (code > {f.max_code:#x}) return {overflow};\n"
        + zero
        + "  return sign | (uint8_t)code;\n}"
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
