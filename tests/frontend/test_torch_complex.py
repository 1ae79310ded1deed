"""Complex tensors in the PyTorch frontend: FFTs (torch.fft, torch.stft) and the arithmetic around them, against
torch on fresh random inputs (max error 1e-4 of the output's scale: float32 transforms of a few dozen points);
complex ops without a converter, complex inputs and complex outputs are refused by name."""

from __future__ import annotations

import numpy as np
import pytest

import ember

torch = pytest.importorskip("torch", reason="the PyTorch frontend needs torch (pip install -e '.[torch]')")
nn = torch.nn


def assert_close(ours, ref, rtol: float = 1e-4) -> None:
    ours, ref = np.asarray(ours), ref.detach().numpy()
    assert ours.shape == ref.shape and ours.dtype == ref.dtype, (ours.shape, ours.dtype, ref.shape, ref.dtype)
    err = float(np.abs(ours.astype(np.float64) - ref).max()) / max(float(np.abs(ref).max()), 1e-6)
    assert err <= rtol, f"max relative error {err:.2e} > {rtol:.0e}"


def check(module: nn.Module, *inputs: torch.Tensor) -> list[np.ndarray]:
    m = ember.compile(module.eval(), inputs)
    ours = m(*[x.numpy() for x in inputs])
    ours = ours if isinstance(ours, tuple) else (ours,)
    with torch.no_grad():
        refs = module(*inputs)
    refs = refs if isinstance(refs, tuple) else (refs,)
    for a, b in zip(ours, refs, strict=True):
        assert_close(a, b)
    return list(ours)


class FourierMixing(nn.Module):
    """FNet's token mixing: the real part of a 2-d FFT over the sequence and hidden axes, between linear layers."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x):
        return self.b(torch.fft.fftn(self.a(x), dim=(1, 2)).real + x)


def test_fnet_fourier_mixing():
    torch.manual_seed(0)
    check(FourierMixing(), torch.randn(2, 6, 8))


class Spectrogram(nn.Module):
    def forward(self, x):
        spec = torch.stft(x, n_fft=16, hop_length=4, window=torch.hann_window(16), return_complex=True)
        return spec.abs() ** 2, torch.view_as_real(spec), spec.angle(), spec.real, spec.imag


def test_stft_power_phase_and_parts():
    torch.manual_seed(1)
    x = torch.randn(2, 100)
    module = Spectrogram()
    m = ember.compile(module, (x,))
    ours = m(x.numpy())
    refs = module(x)
    for i in (0, 1, 3, 4):
        assert_close(ours[i], refs[i])
    # the angle jumps from pi to -pi where the imaginary part crosses 0: compare it away from there
    away = np.abs(refs[4].numpy()) > 1e-4 * float(refs[0].max().sqrt())
    assert away.mean() > 0.6  # (DC and Nyquist bins, and the reflected first and last frames, are real)
    np.testing.assert_allclose(ours[2][away], refs[2].numpy()[away], atol=1e-4)


class FFTArithmetic(nn.Module):
    """A circular correlation by rfft/irfft (with "ortho" scaling), full transforms with "forward" scaling and a
    complex quotient, 2-d real transforms, and complex sums and products with real and complex operands."""

    def forward(self, x, y):
        f = torch.fft.rfft(x, dim=-1, norm="ortho")
        g = torch.fft.rfft(y, dim=-1)
        corr = torch.fft.irfft(f * g.conj(), n=x.shape[-1], dim=-1)
        full = torch.fft.ifft(torch.fft.fft(x) / (torch.fft.fft(y) + 3), norm="forward")
        mixed = torch.polar(y.abs() + 0.5, x) * torch.complex(x, y) - 2 * f.repeat(1, 2)[:, : x.shape[1]]
        pairs = torch.view_as_complex(torch.stack([x, y], dim=-1))  # (x + iy)
        return (corr, torch.view_as_real(full * pairs), torch.fft.irfft2(torch.fft.rfft2(x * 3)), (f * 2 - g).imag,
                torch.view_as_real(mixed.permute(1, 0)), torch.cat([f, g], dim=-1).abs())  # fmt: skip


def test_fft_arithmetic():
    torch.manual_seed(2)
    check(FFTArithmetic(), torch.randn(2, 10), torch.randn(2, 10))


def test_odd_lengths_and_inverse_sizes():
    class Odd(nn.Module):
        def forward(self, x):
            return torch.fft.irfft(torch.fft.rfft(x), n=9), torch.fft.irfft(torch.fft.rfft(x, n=12), n=7)

    torch.manual_seed(3)
    check(Odd(), torch.randn(3, 9))


def test_unsupported_complex_op_is_named():
    class Exp(nn.Module):
        def forward(self, x):
            return torch.view_as_real(torch.exp(torch.fft.fft(x)))

    with pytest.raises(ValueError, match=r"aten.exp.default on complex tensors"):
        ember.compile(Exp(), (torch.randn(4, 8),))


def test_complex_outputs_and_inputs_are_refused():
    class Out(nn.Module):
        def forward(self, x):
            return torch.fft.fft(x)

    with pytest.raises(ValueError, match="complex .*view_as_real"):
        ember.compile(Out(), (torch.randn(4, 8),))

    class In(nn.Module):
        def forward(self, z):
            return z.abs()

    with pytest.raises(ValueError, match="complex"):
        ember.compile(In(), (torch.randn(4, 8, dtype=torch.complex64),))
