"""Calibration methods against numpy references of each method on known distributions."""

from __future__ import annotations

import numpy as np
import pytest

from ember.quantization import RangeCollector, entropy_threshold, percentile_range


def collect(method: str, batches: list[np.ndarray], **options) -> tuple[float, float]:
    """Observe the batches as calibration does (a second pass for the histogram methods); the range of 't'."""
    c = RangeCollector(method, **options)
    for p in range(c.passes):
        if p == 1:
            c.start_histograms()
        for b in batches:
            c.observe("t", b)
    return c.ranges()["t"]


def reference_entropy_threshold(hist: np.ndarray, edges: np.ndarray, levels: int = 128) -> float:
    """TensorRT's calibration as the GTC 2017 slides write it, one bin at a time in plain loops."""
    n = len(hist)
    best, best_i = np.inf, n
    hist = np.concatenate([hist[1:2], hist[1:]])  # the zero spike counts as its neighbour (pytorch-quantization)
    for i in range(levels, n + 1):
        ref = [float(v) for v in hist[:i]]
        ref[-1] += float(hist[i:].sum())
        group = i // levels
        cand = [0.0] * i
        for j in range(levels):
            start, stop = j * group, (j + 1) * group if j < levels - 1 else i
            total = sum(float(v) for v in hist[start:stop])
            nonzero = sum(1 for v in hist[start:stop] if v != 0)
            for k in range(start, stop):
                cand[k] = total / nonzero if hist[k] != 0 else 0.0
        p = smooth_reference(np.array(ref))
        q = smooth_reference(np.array(cand))
        p, q = p / p.sum(), q / q.sum()
        kl = sum(pk * np.log(pk / qk) for pk, qk in zip(p, q) if pk > 0)
        if kl <= best:
            best, best_i = kl, i
    return float(edges[best_i])


def smooth_reference(p: np.ndarray, eps: float = 1e-4) -> np.ndarray:
    zeros, nonzeros = int((p == 0).sum()), int((p != 0).sum())
    return np.array([v + eps if v == 0 else v - eps * zeros / nonzeros for v in p], dtype=np.float64)


def test_minmax_is_the_extremes_over_all_batches(rng):
    batches = [rng.standard_normal((4, 100)).astype(np.float32) * (i + 1) for i in range(5)]
    lo, hi = collect("minmax", batches)
    everything = np.concatenate([b.ravel() for b in batches])
    assert (lo, hi) == (float(everything.min()), float(everything.max()))


@pytest.mark.parametrize("percentile", [99.0, 99.9, 99.99])
def test_percentile_matches_numpy_within_one_bin(rng, percentile):
    # a heavy-tailed distribution: Laplace with a few large outliers
    batches = [rng.laplace(0.5, 1.0, 50_000).astype(np.float32) for _ in range(4)]
    batches[2][:5] = [40.0, -35.0, 60.0, 55.0, -50.0]
    lo, hi = collect("percentile", batches, percentile=percentile)
    everything = np.concatenate(batches)
    cut = (100 - percentile) / 2
    ref_lo, ref_hi = np.percentile(everything, [cut, 100 - cut])
    width = (everything.max() - everything.min()) / 2048
    assert abs(lo - ref_lo) <= width and abs(hi - ref_hi) <= width
    assert hi < 40.0 and lo > -35.0  # the outliers are cut


def test_percentile_range_on_a_known_histogram():
    hist = np.array([1, 0, 0, 96, 0, 0, 3])  # 1% in the first bin, 3% in the last
    edges = np.arange(8.0)
    assert percentile_range(hist, edges, 97.0) == (3.0, 7.0)  # 1.5% off each side: the first bin goes, the last stays
    assert percentile_range(hist, edges, 90.0) == (3.0, 4.0)  # 5% each side: the middle bin alone


def test_entropy_matches_the_reference_implementation(rng):
    x = np.abs(np.concatenate([rng.standard_normal(100_000), [25.0, 30.0]]))
    hist, edges = np.histogram(x, bins=512, range=(0, x.max()))
    ours = entropy_threshold(hist, edges, 128)
    assert ours == reference_entropy_threshold(hist, edges, 128)
    # a Gaussian with two far outliers: the threshold clips them, and keeps the bulk (|x| < 3 sigma)
    assert 3.0 < ours < 25.0


def test_entropy_range_of_a_relu_output_clips_outliers(rng):
    batches = [np.maximum(rng.standard_normal(40_000), 0).astype(np.float32) for _ in range(3)]
    batches[1][0] = 50.0
    lo, hi = collect("entropy", batches)
    assert lo == 0.0 and 2.5 < hi < 50.0
    c = RangeCollector("entropy")
    for b in batches:
        c.observe("t", b)
    c.start_histograms()
    for b in batches:
        c.observe("t", b)
    hist, edges = c.hists["t"], np.linspace(0, 50.0, 2049)
    assert hi == pytest.approx(entropy_threshold(hist, edges, 256))  # no negative values: 256 levels


def test_bad_options_name_themselves():
    with pytest.raises(ValueError, match="unknown calibration method 'kl'"):
        RangeCollector("kl")
    with pytest.raises(ValueError, match="percentile must be in"):
        RangeCollector("percentile", percentile=120)
