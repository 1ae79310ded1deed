"""Calibration: the range [lo, hi] of each activation tensor over the calibration data.

Three methods, all pure numpy over arrays the caller observes one at a time:

- `minmax`: the smallest and largest value seen.
- `percentile`: a histogram of the values between min and max (`bins` bins, a second pass over the data); the range
  keeps the central `percentile` percent, cutting (100 - percentile) / 2 percent off each side (as onnxruntime's
  asymmetric percentile calibrator).
- `entropy`: TensorRT's KL-divergence calibration (Migacz, "8-bit inference with TensorRT", GTC 2017): a histogram
  of |x| over [0, max|x|] in `bins` bins; for every candidate threshold (bin edge `i` >= `quantized_bins`) the
  clipped distribution P (outliers folded into the last kept bin) is compared with Q, P merged into
  `quantized_bins` levels (twice as many for a tensor without negative values: uint8 spends all 256 on [0, t])
  and spread back over P's non-empty bins; the threshold of least KL(P || Q) wins. As NVIDIA's
  pytorch-quantization does, the first bin counts as the second: the spike of exact zeros after a ReLU would
  otherwise decide alone. The range is then [max(min, -t), min(max, t)].
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

METHODS = ("minmax", "percentile", "entropy")


def percentile_range(hist: np.ndarray, edges: np.ndarray, percentile: float) -> tuple[float, float]:
    """The range keeping the central `percentile` percent of a histogram's mass: the left edge of the bin where
    the cumulative mass passes (100 - p) / 200, the right edge of the bin where it passes 1 - (100 - p) / 200."""
    cut = (100.0 - percentile) / 200.0
    cdf = np.cumsum(hist, dtype=np.float64) / max(float(hist.sum()), 1.0)
    left = int(np.searchsorted(cdf, cut, side="right"))
    right = int(np.searchsorted(cdf, 1.0 - cut, side="left"))
    return float(edges[min(left, len(hist) - 1)]), float(edges[min(right + 1, len(hist))])


def smooth(p: np.ndarray, eps: float = 1e-4) -> np.ndarray | None:
    """Move `eps` of mass into every empty bin, taken evenly from the others (so that KL stays finite); None when
    every bin is empty."""
    zeros = p == 0
    nonzero = int((~zeros).sum())
    if nonzero == 0:
        return None
    out = p.astype(np.float64)
    out[zeros] += eps
    out[~zeros] -= eps * int(zeros.sum()) / nonzero
    return out


def kl_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """KL(P || Q) of two unnormalized distributions over the same bins (both positive where p is)."""
    p, q = p / p.sum(), q / q.sum()
    mask = p > 0
    return float(np.sum(p[mask] * np.log(p[mask] / q[mask])))


def entropy_threshold(hist: np.ndarray, edges: np.ndarray, quantized_bins: int = 128) -> float:
    """TensorRT's threshold for a histogram of |x| (`hist` over `edges`, edges[0] == 0): the bin edge whose clipped
    distribution loses least information (KL divergence) when merged into `quantized_bins` levels."""
    n = len(hist)
    if n <= quantized_bins:
        return float(edges[-1])
    hist = hist.copy()
    hist[0] = hist[1]  # the spike of exact zeros (after a ReLU) would decide alone: count it as its neighbour
    best, best_i = np.inf, n
    for i in range(quantized_bins, n + 1):
        kept = hist[:i].astype(np.float64)
        p = kept.copy()
        p[-1] += hist[i:].sum()
        merged = i // quantized_bins
        levels = kept[: quantized_bins * merged].reshape(quantized_bins, merged).sum(axis=1)
        levels[-1] += kept[quantized_bins * merged :].sum()
        nonzero = (kept != 0).astype(np.float64)
        counts = nonzero[: quantized_bins * merged].reshape(quantized_bins, merged).sum(axis=1)
        counts[-1] += nonzero[quantized_bins * merged :].sum()
        per_bin = np.divide(levels, counts, out=np.zeros_like(levels), where=counts > 0)
        q = np.repeat(per_bin, merged)
        q = np.concatenate([q, np.full(i - len(q), per_bin[-1])]) * nonzero
        p, q = smooth(p), smooth(q)
        if p is None or q is None:
            continue
        d = kl_divergence(p, q)
        if d <= best:  # on a tie, the wider range
            best, best_i = d, i
    return float(edges[best_i])


@dataclass
class RangeCollector:
    """Ranges of named tensors by one method. `observe(name, x)` for every tensor of every calibration sample;
    the histogram methods need a second pass over the same data after `start_histograms()`."""

    method: str = "minmax"
    percentile: float = 99.99
    bins: int = 2048
    quantized_bins: int = 128
    lo: dict[str, float] = field(default_factory=dict)
    hi: dict[str, float] = field(default_factory=dict)
    hists: dict[str, np.ndarray] | None = None

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"unknown calibration method {self.method!r}; choose from {', '.join(METHODS)}")
        if not 0 < self.percentile <= 100:
            raise ValueError(f"percentile must be in (0, 100], got {self.percentile}")

    @property
    def passes(self) -> int:
        """How many times the calibration data must be observed: 1 for min-max, 2 for the histogram methods."""
        return 1 if self.method == "minmax" else 2

    def start_histograms(self) -> None:
        self.hists = {}

    def observe(self, name: str, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float32)
        if x.size == 0:
            return
        if self.hists is None:
            self.lo[name] = min(self.lo.get(name, np.inf), float(x.min()))
            self.hi[name] = max(self.hi.get(name, -np.inf), float(x.max()))
            return
        lo, hi = self.hist_range(name)
        values = np.abs(x) if self.method == "entropy" else x
        h, _ = np.histogram(values, bins=self.bins, range=(lo, hi))
        self.hists[name] = self.hists.get(name, 0) + h

    def hist_range(self, name: str) -> tuple[float, float]:
        """The histogram's span: [0, max|x|] for entropy, [min, max] for percentile (never empty)."""
        lo, hi = self.lo[name], self.hi[name]
        if self.method == "entropy":
            lo, hi = 0.0, max(abs(lo), abs(hi))
        return (lo, hi) if hi > lo else (lo, lo + 1.0)

    def ranges(self) -> dict[str, tuple[float, float]]:
        """name -> (lo, hi) by the method (min-max for a tensor whose histogram was never observed)."""
        out = {}
        for name in self.lo:
            lo, hi = self.lo[name], self.hi[name]
            hist = None if self.hists is None else self.hists.get(name)
            if hist is not None and hist.sum() > 0:
                edges = np.linspace(*self.hist_range(name), self.bins + 1)
                if self.method == "percentile":
                    plo, phi = percentile_range(hist, edges, self.percentile)
                    lo, hi = max(lo, plo), min(hi, phi)
                else:
                    # a tensor without negative values gets all the 8-bit levels over [0, t]
                    t = entropy_threshold(hist, edges, self.quantized_bins * (2 if lo >= 0 else 1))
                    lo, hi = max(lo, -t), min(hi, t)
            out[name] = (lo, hi)
        return out
