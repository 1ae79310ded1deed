"""Signal processing: DFT, STFT, MelWeightMatrix. Complex values are stored as a trailing
axis of length 2 (real, imaginary); real signals have a trailing axis of length 1."""

from __future__ import annotations

import numpy as np

from ember.graph.types import TensorType, np_dtype
from ember.ops.common import ShapeError
from ember.ops.opdef import Attr, Pattern, ShapeDependsOnData, op

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

