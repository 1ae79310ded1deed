"""Complex tensors in the torch frontend: FFTs and what models do around them (FNet's Fourier mixing, spectrograms
by torch.stft, FFT convolutions).

A complex torch tensor becomes an Ember float tensor with a trailing axis of 2 (real, imaginary), as the DFT op
takes and gives them. A node that reads or makes a complex tensor is converted by the table here (`COMPLEX`);
an op without an entry is refused by name ("aten.sin on complex tensors"), never run on the pairs as if they
were reals. Graph inputs and outputs stay real: `torch.view_as_real` turns a complex result into one."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import fx

from ember.frontend.onnx_importer import ModelError
from ember.frontend.torch_ops import COMPLEX, Ctx, atan2, converter, is_complex, module_path, slice_range
from ember.graph.ir import Value
from ember.ops.common import norm_axis


def complex_converter(*names: str):
    return converter(*names, table=COMPLEX)


def _rank(arg: fx.Node) -> int:
    """The torch rank of a tensor argument (a complex one's Ember value has one axis more)."""
    return arg.meta["val"].dim()


def _real_dtype(c: Ctx) -> str:
    return {torch.complex64: "float32", torch.complex128: "float64", torch.complex32: "float16"}[c.out.dtype]


def _pairs(c: Ctx, arg: Any, dtype: str) -> Value:
    """An argument as (re, im) pairs: complex ones as they are, real ones with a zero imaginary part."""
    if is_complex(arg):
        return c.imp.cast(c.imp.value(arg), dtype)
    x = c.imp.value(arg, dtype)
    u = c.imp.add1("Unsqueeze", [x], {"axes": (len(x.shape),)}, f"{c.name}_u")
    return c.imp.add1("Pad", [u], {"pads": (0,) * (2 * len(u.shape) - 1) + (1,), "mode": "constant", "value": 0.0},
                      f"{c.name}_pairs")  # fmt: skip


def _part(c: Ctx, x: Value, which: int, name: str) -> Value:
    """The real (0) or imaginary (1) part of pairs."""
    return c.imp.add1("Gather", [x, c.const(np.int64(which))], {"axis": len(x.shape) - 1}, name)


def _join(c: Ctx, re: Value, im: Value) -> Value:
    parts = [c.imp.add1("Unsqueeze", [p], {"axes": (len(p.shape),)}, f"{c.name}_{k}")
             for k, p in (("re", re), ("im", im))]  # fmt: skip
    return c.add("Concat", parts, {"axis": len(re.shape)})


# -- conversions -------------------------------------------------------------------------------------------------
@complex_converter("_to_copy", "to", "type_as", "clone", "alias", "detach", "lift_fresh_copy", "contiguous",
                   "resolve_conj", "resolve_neg", "view_as_real", "view_as_complex")  # fmt: skip
def _copy(c: Ctx) -> Value:
    """Casts and copies: real to complex (a zero imaginary part), complex to complex, and complex to real (the
    real part, as torch's cast does); view_as_real and view_as_complex are the pairs themselves."""
    src = c.node.args[0]
    if c.node.target.overloadpacket.__name__ == "view_as_complex":  # (..., 2) reals: already the pairs
        return c.add("Identity", [c.imp.value(src, _real_dtype(c))])
    if not c.out.is_complex():  # complex -> real: view_as_real keeps the pairs, a cast keeps the real part
        pairs = c.imp.value(src)
        if c.node.target.overloadpacket.__name__ == "view_as_real":
            return c.add("Identity", [pairs])
        return c.imp.cast(_part(c, pairs, 0, c.name), c.out_dtype)
    return c.add("Identity", [_pairs(c, src, _real_dtype(c))])


@complex_converter("real", "imag")
def _real_imag(c: Ctx) -> Value:
    return _part(c, c.imp.value(c.node.args[0]), 0 if c.node.target.overloadpacket.__name__ == "real" else 1, c.name)


@complex_converter("abs")
def _abs(c: Ctx) -> Value:
    x = c.imp.value(c.node.args[0])
    return c.add("ReduceL2", [x], {"axes": (len(x.shape) - 1,), "keepdims": 0})


@complex_converter("angle")
def _angle(c: Ctx) -> Value:
    x = c.imp.value(c.node.args[0])
    return atan2(c, _part(c, x, 1, f"{c.name}_im"), _part(c, x, 0, f"{c.name}_re"))


@complex_converter("_conj", "conj", "conj_physical")
def _conjugate(c: Ctx) -> Value:
    x = c.imp.value(c.node.args[0])
    return c.add("Mul", [x, c.const(np.array([1, -1], x.dtype))])


@complex_converter("polar", "complex")
def _from_parts(c: Ctx) -> Value:
    """complex(re, im), polar(abs, angle)."""
    a, b = c.imp.value(c.node.args[0], _real_dtype(c)), c.imp.value(c.node.args[1], _real_dtype(c))
    if c.node.target.overloadpacket.__name__ == "polar":
        a, b = (c.imp.add1("Mul", [a, c.imp.add1(f, [b], name=f"{c.name}_{f.lower()}")], name=f"{c.name}_{k}")
                for f, k in (("Cos", "re"), ("Sin", "im")))  # fmt: skip
    return _join(c, a, b)


# -- arithmetic --------------------------------------------------------------------------------------------------
@complex_converter("add", "sub", "mul", "div", "neg")
def _arith(c: Ctx) -> Value:
    """Elementwise: sums and differences of pairs; products and quotients by a real operand scale both parts;
    the product of two complex operands is (ac - bd, ad + bc), the quotient (ac + bd, bc - ad) / (c^2 + d^2)."""
    op = c.node.target.overloadpacket.__name__
    dt = _real_dtype(c)
    if op == "neg":
        return c.add("Neg", [c.imp.value(c.node.args[0])])
    a, b = c.node.args[0], c.node.args[1]
    alpha = c.node.kwargs.get("alpha", 1)
    if isinstance(b, complex) or isinstance(a, complex):
        raise ModelError(f"{c.node.name} at {module_path(c.node)}: a complex Python scalar operand")
    if op in ("add", "sub"):
        y = _pairs(c, b, dt)
        if alpha != 1:
            y = c.imp.add1("Mul", [y, c.const(alpha, dt)], name=f"{c.name}_alpha")
        return c.add("Add" if op == "add" else "Sub", [_pairs(c, a, dt), y])
    if not is_complex(b) or not is_complex(a):  # a real operand: scales both parts
        z, r = (a, b) if is_complex(a) else (b, a)
        real = c.imp.value(r, dt)
        real = c.imp.add1("Unsqueeze", [real], {"axes": (len(real.shape),)}, f"{c.name}_r") if real.shape else real
        if op == "div" and not is_complex(a):
            raise ModelError(f"{c.node.name} at {module_path(c.node)}: a real tensor divided by a complex one")
        return c.add("Mul" if op == "mul" else "Div", [c.imp.value(z), real])
    x, y = c.imp.value(a), c.imp.value(b)
    xr, xi, yr, yi = (_part(c, v, k, f"{c.name}_{n}") for v, k, n in ((x, 0, "xr"), (x, 1, "xi"), (y, 0, "yr"),
                                                                    (y, 1, "yi")))  # fmt: skip

    def mul(p, q, n):
        return c.imp.add1("Mul", [p, q], name=f"{c.name}_{n}")

    if op == "mul":
        re = c.imp.add1("Sub", [mul(xr, yr, "rr"), mul(xi, yi, "ii")], name=f"{c.name}_re")
        im = c.imp.add1("Add", [mul(xr, yi, "ri"), mul(xi, yr, "ir")], name=f"{c.name}_im")
        return _join(c, re, im)
    den = c.imp.add1("Add", [mul(yr, yr, "yy"), mul(yi, yi, "zz")], name=f"{c.name}_den")
    re = c.imp.add1("Add", [mul(xr, yr, "rr"), mul(xi, yi, "ii")], name=f"{c.name}_ren")
    im = c.imp.add1("Sub", [mul(xi, yr, "ir"), mul(xr, yi, "ri")], name=f"{c.name}_imn")
    re, im = (c.imp.add1("Div", [p, den], name=f"{c.name}_{k}") for k, p in (("re", re), ("im", im)))
    return _join(c, re, im)


# -- shapes: the same op on the pairs, the trailing axis kept last ------------------------------------------------
def _axis(c: Ctx, dim: int) -> int:
    """A dim of the first argument, non-negative by its torch rank."""
    return norm_axis(dim, _rank(c.node.args[0]), "dim")


@complex_converter("permute")
def _permute(c: Ctx) -> Value:
    perm = (*(_axis(c, d) for d in c.arg(1)), _rank(c.node.args[0]))
    return c.add("Transpose", [c.imp.value(c.node.args[0])], {"perm": perm})


@complex_converter("view", "reshape", "_unsafe_view", "flatten", "unflatten", "squeeze", "unsqueeze", "expand")
def _reshape(c: Ctx) -> Value:
    op = "Expand" if c.node.target.overloadpacket.__name__ == "expand" else "Reshape"
    return c.add(op, [c.imp.value(c.node.args[0])], {"shape": (*c.out_shape, 2)})


@complex_converter("repeat")
def _repeat(c: Ctx) -> Value:
    repeats, x = tuple(c.arg(1, "repeats")), c.imp.value(c.node.args[0])
    extra = len(repeats) - _rank(c.node.args[0])
    if extra > 0:  # torch prepends dims of size 1
        x = c.imp.add1("Reshape", [x], {"shape": (1,) * extra + x.shape}, f"{c.name}_r")
    return c.add("Tile", [x], {"repeats": (*repeats, 1)})


@complex_converter("slice")
def _slice(c: Ctx) -> Value:
    dim = _axis(c, c.arg(1, "dim", 0))
    size = c.imp.static(c.node.args[0].meta["val"].shape[dim])
    start, end = slice_range(size, c.arg(2, "start"), c.arg(3, "end"))
    return c.add("Slice", [c.imp.value(c.node.args[0])], {"starts": (start,), "ends": (end,), "axes": (dim,),
                                                          "steps": (c.arg(4, "step", 1),)})  # fmt: skip


@complex_converter("select")
def _select(c: Ctx) -> Value:
    dim = _axis(c, c.arg(1, "dim"))
    size = c.imp.static(c.node.args[0].meta["val"].shape[dim])
    index = c.arg(2, "index")
    return c.add("Gather", [c.imp.value(c.node.args[0]), c.const(np.int64(index + size if index < 0 else index))],
                 {"axis": dim})  # fmt: skip


@complex_converter("cat", "concat")
def _cat(c: Ctx) -> Value:
    dt = _real_dtype(c)
    values = [_pairs(c, a, dt) for a in c.node.args[0]]
    return c.add("Concat", values, {"axis": norm_axis(c.arg(1, "dim", 0), c.out.dim(), "dim")})


# -- Fourier transforms ------------------------------------------------------------------------------------------
def _scaled(c: Ctx, x: Value, lengths: list[int], normalization: int, inverse: bool) -> Value:
    """torch's normalization (0: none, 1: 1/sqrt(n), 2: 1/n, n the product of the transformed lengths) against the
    DFT op's (none forward, 1/n inverse)."""
    n = math.prod(lengths)
    want = {0: 1.0, 1: 1.0 / math.sqrt(n), 2: 1.0 / n}[normalization]
    have = 1.0 / n if inverse else 1.0
    return x if want == have else c.imp.add1("Mul", [x, c.const(want / have, x.dtype)], name=f"{c.name}_norm")


def _dfts(c: Ctx, x: Value, dims: list[int], inverse: bool) -> Value:
    for d in dims:
        x = c.imp.add1("DFT", [x], {"axis": d, "inverse": int(inverse)}, f"{c.name}_dft{d}")
    return x


def _dims(c: Ctx) -> list[int]:
    return [_axis(c, d) for d in c.arg(1, "dim")]


@complex_converter("_fft_c2c")
def _fft_c2c(c: Ctx) -> Value:
    x = c.imp.value(c.node.args[0])
    dims, normalization, forward = _dims(c), c.arg(2, "normalization"), bool(c.arg(3, "forward"))
    y = _dfts(c, x, dims, not forward)
    return c.add("Identity", [_scaled(c, y, [x.shape[d] for d in dims], normalization, not forward)])


@complex_converter("_fft_r2c")
def _fft_r2c(c: Ctx) -> Value:
    """A real signal's transform over dims; onesided keeps the n // 2 + 1 bins of the last of them."""
    x = c.imp.value(c.node.args[0], _real_dtype(c))
    dims, normalization, onesided = _dims(c), c.arg(2, "normalization"), bool(c.arg(3, "onesided"))
    u = c.imp.add1("Unsqueeze", [x], {"axes": (len(x.shape),)}, f"{c.name}_real")
    y = c.imp.add1("DFT", [u], {"axis": dims[-1], "onesided": int(onesided)}, f"{c.name}_dft{dims[-1]}")
    y = _dfts(c, y, dims[:-1], False)
    return c.add("Identity", [_scaled(c, y, [x.shape[d] for d in dims], normalization, False)])


@complex_converter("_fft_c2r")
def _fft_c2r(c: Ctx) -> Value:
    """The real signal of a Hermitian spectrum: full inverse transforms over all dims but the last, then the
    onesided inverse of the last to last_dim_size samples."""
    x = c.imp.value(c.node.args[0])
    dims, normalization, n = _dims(c), c.arg(2, "normalization"), c.arg(3, "last_dim_size")
    y = _dfts(c, x, dims[:-1], True)
    y = c.imp.add1("DFT", [y], {"axis": dims[-1], "inverse": 1, "onesided": 1, "dft_length": n},
                   f"{c.name}_dft{dims[-1]}")  # fmt: skip
    y = c.imp.add1("Squeeze", [y], {"axes": (len(y.shape) - 1,)}, f"{c.name}_real")
    lengths = [x.shape[d] for d in dims[:-1]] + [n]
    return c.add("Identity", [_scaled(c, y, lengths, normalization, True)])
