"""Signal processing: DFT, STFT, MelWeightMatrix. Complex values are stored as a trailing
axis of length 2 (real, imaginary); real signals have a trailing axis of length 1."""

from __future__ import annotations

import math

import numpy as np

from ember import te
from ember.graph.types import TensorType, np_dtype
from ember.ops.common import ShapeError
from ember.ops.opdef import Attr, Pattern, ShapeDependsOnData, op
from ember.ops.te_lib import NotLowerable, lowering
from ember.templates.flat import schedule_tables
from ember.tir.expr import Expr

DFT_ATTRS = [Attr("axis", "int", -2), Attr("dft_length", "int", None), Attr("inverse", "int", 0),
             Attr("onesided", "int", 0)]  # fmt: skip


def _dft_axis(a: dict, rank: int) -> int:
    """The signal axis; the trailing complex axis is not a valid choice."""
    axis = a["axis"]
    if axis == rank - 1 or axis == -1:
        raise ShapeError("the DFT axis cannot be the trailing real/imaginary axis")
    return axis + rank if axis < 0 else axis


def _dft_lengths(a: dict, x: TensorType) -> tuple[int, int]:
    """(transform length n, output length along the axis)."""
    axis = _dft_axis(a, x.rank)
    size = x.shape[axis]
    inverse, onesided = a["inverse"], a["onesided"]
    n = a["dft_length"] or (2 * (size - 1) if inverse and onesided else size)
    return n, (n // 2 + 1 if onesided and not inverse else n)


def _dft_infer(a: dict, x: TensorType) -> TensorType:
    if x.shape[-1] not in (1, 2):
        raise ShapeError(f"DFT input needs a trailing axis of 1 (real) or 2 (complex), got {x}")
    axis = _dft_axis(a, x.rank)
    _, out = _dft_lengths(a, x)
    last = 1 if a["inverse"] and a["onesided"] else 2
    return x.with_shape(x.shape[:axis] + (out,) + x.shape[axis + 1 : -1] + (last,))


def _complex(x: np.ndarray) -> np.ndarray:
    """Complex values; single precision for float32 signals (as runtimes compute them)."""
    ctype = np.complex64 if x.dtype == np.float32 else np.complex128
    z = x[..., 0].astype(ctype)
    return z + 1j * x[..., 1].astype(ctype) if x.shape[-1] == 2 else z


def _split(z: np.ndarray, dtype) -> np.ndarray:
    return np.stack([z.real, z.imag], axis=-1).astype(dtype)


@op("DFT", Pattern.OPAQUE, infer=_dft_infer, attrs=DFT_ATTRS)
def dft(a: dict, x: np.ndarray) -> np.ndarray:
    """(Inverse) discrete Fourier transform along `axis`; onesided keeps the n//2+1 unique bins
    (forward) or takes them as input and returns a real signal (inverse)."""
    axis = _dft_axis(a, x.ndim)
    n, _ = _dft_lengths(a, TensorType.of(x))
    z = _complex(x)
    if a["inverse"] and a["onesided"]:
        return np.fft.irfft(z, n=n, axis=axis)[..., None].astype(x.dtype)
    y = np.fft.ifft(z, n=n, axis=axis) if a["inverse"] else np.fft.fft(z, n=n, axis=axis)
    if a["onesided"]:
        y = np.take(y, np.arange(n // 2 + 1), axis=axis)
    return _split(y, x.dtype)


def _stft_infer(a: dict, x: TensorType, window: TensorType | None = None) -> TensorType:
    length, step = a["frame_length"], a["frame_step"]
    frames = (x.shape[1] - length) // step + 1
    bins = length // 2 + 1 if a["onesided"] else length
    return x.with_shape((x.shape[0], frames, bins, 2))


@op("STFT", Pattern.OPAQUE, infer=_stft_infer, inputs=(1, 2),
    attrs=[Attr("frame_step", "int"), Attr("frame_length", "int"), Attr("onesided", "int", 1)])  # fmt: skip
def stft(a: dict, x: np.ndarray, window: np.ndarray | None = None) -> np.ndarray:
    """DFT of each (windowed) frame of frame_length samples, frame_step apart."""
    length, step = a["frame_length"], a["frame_step"]
    frames = (x.shape[1] - length) // step + 1
    z = _complex(x)
    w = np.ones(length) if window is None else window.astype(np.float64)
    pieces = np.stack([z[:, f * step : f * step + length] * w for f in range(frames)], axis=1)
    y = np.fft.fft(pieces, axis=-1)
    if a["onesided"]:
        y = y[..., : length // 2 + 1]
    return _split(y, x.dtype)


def _mel_infer(a: dict, *ts) -> TensorType:
    raise ShapeDependsOnData("the MelWeightMatrix shape depends on num_mel_bins and dft_length")


@op("MelWeightMatrix", Pattern.OPAQUE, infer=_mel_infer, inputs=(5, 5),
    attrs=[Attr("output_datatype", "dtype", "float32")])  # fmt: skip
def mel_weight_matrix(a: dict, num_bins, dft_length, sample_rate, low_hz, high_hz) -> np.ndarray:
    """Triangular mel filters over the n//2+1 spectrogram bins (shape [bins, num_mel_bins])."""
    mels, n, rate = int(num_bins), int(dft_length), int(sample_rate)
    to_mel = lambda hz: 2595 * np.log10(1 + hz / 700)  # noqa: E731
    lo_mel, hi_mel = to_mel(float(low_hz)), to_mel(float(high_hz))
    edges_mel = lo_mel + np.arange(mels + 2) * (hi_mel - lo_mel) / (mels + 2)  # step as ONNX and ORT take it
    edges = np.floor((n + 1) * (700 * (10 ** (edges_mel / 2595) - 1)) / rate).astype(np.int64)
    out = np.zeros((n // 2 + 1, mels))
    for i in range(mels):
        lo, mid, hi = edges[i : i + 3]
        if mid == lo:
            out[mid, i] = 1
        else:
            out[lo : mid + 1, i] = (np.arange(lo, mid + 1) - lo) / (mid - lo)
        if hi > mid:
            out[mid:hi, i] = (hi - np.arange(mid, hi)) / (hi - mid)
    return out.astype(np_dtype(a["output_datatype"]))


# -- TE computes: transforms as direct sums (O(n^2) per signal, not an FFT) over twiddle tables --------
def _twiddles(n: int) -> tuple[te.Tensor, te.Tensor]:
    """cos and sin of 2 pi m / n for m < n, in float64 (the sums index them with k * t mod n); exact on the quarter
    turns (sin pi is 0, not 1.2e-16), so that a real signal's DC and Nyquist bins have an imaginary part of exactly
    0, as FFTs give: its sign decides the bin's angle (pi or -pi)."""
    def exact(m, fn):  # on a quarter turn the value is -1, 0 or 1: rounding it gives it exactly
        v = fn(te.cast(m, "float64") * (2 * math.pi) / n)
        return te.if_then_else((m * 4) % n == 0, te.round(v), v)

    return (te.compute((n,), lambda m: exact(m, te.cos), name="twiddle_cos"),
            te.compute((n,), lambda m: exact(m, te.sin), name="twiddle_sin"))  # fmt: skip


def _component(x: te.Tensor, idx: tuple, c: int) -> Expr:
    """Real (c=0) or imaginary (c=1) part of x at idx (all axes but the trailing one), in float64."""
    if c >= x.shape[-1]:
        return te.const(0.0, "float64")
    return te.cast(x[idx + (c,)], "float64")


def _phase(k: Expr, t: Expr, n: int) -> Expr:
    return te.cast(k, "int64") * t % n


@lowering("DFT", schedule=schedule_tables("dft"))
def _dft_te(a: dict, x: te.Tensor) -> te.Tensor:
    axis = _dft_axis(a, x.ndim)
    xt = TensorType(x.shape, x.dtype.name)
    n, _ = _dft_lengths(a, xt)
    shape = _dft_infer(a, xt).shape
    size, inverse = x.shape[axis], bool(a["inverse"])
    if isinstance(n, int) and n <= 0:
        raise NotLowerable("DFT of length 0")
    cos_t, sin_t = _twiddles(n)

    if inverse and a["onesided"]:  # a real signal from the n // 2 + 1 bins of a Hermitian spectrum

        def acc_body(*o):
            k = te.reduce_axis((0, n), name="k")
            low = k.var <= n // 2  # bins above n // 2 are conjugates of the ones below
            src = te.if_then_else(low, k.var, n - k.var)
            idx = o[:axis] + (te.minimum(src, size - 1),) + o[axis + 1 : -1]
            ph = _phase(k.var, o[axis], n)
            im = te.if_then_else(low, _component(x, idx, 1), -_component(x, idx, 1))
            return te.sum(_component(x, idx, 0) * cos_t[ph] - im * sin_t[ph], axis=k, where=src < size)

    else:

        def acc_body(*o):
            static = isinstance(size, int) and isinstance(n, int)
            length = min(size, n) if static else size if n is size else te.minimum(size, n)
            t = te.reduce_axis((0, length), name="t")  # the signal is cut or zero-padded to n
            idx = o[:axis] + (t.var,) + o[axis + 1 : -1]
            ph = _phase(o[axis], t.var, n)
            zr, zi, cs, sn = _component(x, idx, 0), _component(x, idx, 1), cos_t[ph], sin_t[ph]
            sign = 1.0 if inverse else -1.0  # z * exp(sign * i * phase)
            re, im = zr * cs - sign * zi * sn, zi * cs + sign * zr * sn
            return te.sum(te.if_then_else(o[-1] == 0, re, im), axis=t)

    acc = te.compute(shape, acc_body, name="dft_acc")
    scale = 1.0 / n if inverse else 1.0
    return te.compute(shape, lambda *o: te.cast(acc[o] * scale, x.dtype), name="dft", tag="dft")


@lowering("STFT", schedule=schedule_tables("stft"))
def _stft_te(a: dict, x: te.Tensor, window: te.Tensor | None = None) -> te.Tensor:
    length, step = a["frame_length"], a["frame_step"]
    shape = _stft_infer(a, TensorType(x.shape, x.dtype.name)).shape
    if length <= 0:
        raise NotLowerable("STFT frames of length 0")
    cos_t, sin_t = _twiddles(length)

    def acc_body(b, f, k, c):
        t = te.reduce_axis((0, length), name="t")
        idx = (b, f * step + t.var)
        w = te.cast(window[t.var], "float64") if window is not None else te.const(1.0, "float64")
        zr, zi = _component(x, idx, 0) * w, _component(x, idx, 1) * w
        ph = _phase(k, t.var, length)
        cs, sn = cos_t[ph], sin_t[ph]
        return te.sum(te.if_then_else(c == 0, zr * cs + zi * sn, zi * cs - zr * sn), axis=t)

    acc = te.compute(shape, acc_body, name="stft_acc")
    return te.compute(shape, lambda *o: te.cast(acc[o], x.dtype), name="stft", tag="stft")
