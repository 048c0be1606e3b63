"""Stage I of DP-FETA: DP central images (mean images, Alg. 1; mode images, Alg. 2).

Each query round draws ONE Poisson batch of the sensitive set at rate q_c and computes one central
image per class from the disjoint label groups of that batch. A record joins exactly one group, so
the K per-class releases together have the sensitivity of a single one (parallel composition,
DP-FETA Sec. 3.1.2), and a round is recorded as one Poisson-subsampled Gaussian entry.
"""
from __future__ import annotations

import math

import torch

from dpgen.errors import DpgenError
from dpgen.privacy import PrivacyLedger, clip_rows, gaussian_sum_query

MEAN_ENTRY = "feta.central_mean"
MODE_ENTRY = "feta.central_mode"


def poisson_batch(n: int, q: float, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """Indices of a Poisson-sampled batch: each record joins independently with probability q."""
    return (torch.rand(n, generator=generator, device=device) < q).nonzero().squeeze(1)


def class_mean_sums(x: torch.Tensor, y: torch.Tensor, num_classes: int, clip: float) -> torch.Tensor:
    """Σ_i min(1, C_c/‖x_i‖) x_i per class (the numerator of Eq. 5/6 after the clipping of Eq. 4).

    ``x`` is a batch N×C×H×W in [0, 1]; returns K×C×H×W. Adding/removing one record changes one
    class slot by a vector of norm ≤ C_c, so the whole K-slot output has L2 sensitivity C_c.
    """
    xc = clip_rows(x, clip)
    out = torch.zeros((num_classes, *x.shape[1:]), dtype=xc.dtype, device=x.device)
    return out.index_add_(0, y, xc)


def class_histograms(x: torch.Tensor, y: torch.Tensor, num_classes: int, bins: int) -> torch.Tensor:
    """Per-class, per-pixel frequency histograms H ∈ ℕ^{K×C×H×W×bins} (Alg. 2 lines 3–9).

    Pixel value v ∈ [0, 1] falls into bin min(⌊v·bins⌋, bins−1). One record adds exactly one count to
    each of its W·H·C pixel histograms, so the L2 sensitivity is √(WHC) (Theorem 3.3).
    """
    out = torch.zeros((num_classes, *x.shape[1:], bins), dtype=torch.float32, device=x.device)
    for s in range(0, x.shape[0], 512):  # chunks: the one-hot tensor is bins times the batch
        idx = (x[s:s + 512] * bins).floor().clamp(0, bins - 1).long()
        out.index_add_(0, y[s:s + 512], torch.nn.functional.one_hot(idx, bins).to(torch.float32))
    return out


def mode_from_histogram(hist: torch.Tensor, bins: int) -> torch.Tensor:
    """Mode pixel = mid-point of the arg-max bin, (2k*−1)/2 · max/bins with 1-based k* (Eq. 7), in [0, 1]."""
    k = hist.argmax(dim=-1).to(torch.float32)  # 0-based index, so the 1-based k* = k + 1
    return (2 * (k + 1) - 1) / 2.0 / bins


def _release(sums: torch.Tensor, sensitivity: float, sigma: float, ledger: PrivacyLedger, name: str, q: float,
             generator: torch.Generator) -> torch.Tensor:
    """Gaussian release of the stacked per-class query (one row: parallel composition, see module doc)."""
    return gaussian_sum_query(sums[None], sensitivity=sensitivity, noise_multiplier=sigma, record=ledger, name=name,
                              sampling="poisson", sampling_rate=q, generator=generator)


def noisy_class_means(xb: torch.Tensor, yb: torch.Tensor, num_classes: int, *, clip: float, expected_batch: float,
                      sigma: float, q: float, ledger: PrivacyLedger, generator: torch.Generator) -> torch.Tensor:
    """One round of Alg. 1 on a Poisson batch: (1/B*_c) Σ clip(x_i, C_c) + N(0, σ_c² (C_c/B*_c)² I) (Eq. 6).

    Δ_mean = C_c/B*_c (Theorem 3.1) holds because B*_c is a public constant; not clamped.
    """
    sums = class_mean_sums(xb, yb, num_classes, clip)
    return _release(sums, clip, sigma, ledger, MEAN_ENTRY, q, generator) / expected_batch


def noisy_class_histograms(xb: torch.Tensor, yb: torch.Tensor, num_classes: int, *, bins: int, sigma: float,
                           q: float, ledger: PrivacyLedger, generator: torch.Generator) -> torch.Tensor:
    """One round of Alg. 2 lines 3–12: H + N(0, σ_c² WHC I), Δ_mode = √(WHC) (Theorem 3.3)."""
    hist = class_histograms(xb, yb, num_classes, bins)
    return _release(hist, math.sqrt(math.prod(xb.shape[1:])), sigma, ledger, MODE_ENTRY, q, generator)


def query_central(kind: str, x: torch.Tensor, y: torch.Tensor, num_classes: int, *, num_images: int, q: float,
                  sigma: float, ledger: PrivacyLedger, generator: torch.Generator, clip: float | None = None,
                  bins: int | None = None, expected_batch: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Query ``num_images`` DP central images (⌈num_images/K⌉ rounds × K classes) and their labels.

    * ``kind="mean"`` (Alg. 1, Eq. 6): (1/B*_c) Σ clip(x_i, C_c) + N(0, σ_c² (C_c/B*_c)² I). B*_c is the
      EXPECTED (data-independent) number of records of the class in a batch, q_c·N/K: dividing by it
      gives sensitivity exactly C_c/B*_c (Theorem 3.1). Dividing by the actual count, as the official
      code does, would not.
    * ``kind="mode"`` (Alg. 2, Eq. 7): noisy histograms H + N(0, σ_c² WHC I), then bin mid-points.

    ``x`` float N×C×H×W in [0, 1] (the sensitive training split). Returns images in [0, 1].
    """
    if kind not in ("mean", "mode"):
        raise DpgenError(f"feta.central must be mean, mode or none, got {kind!r}")
    n = x.shape[0]
    if not 0 < q <= 1:
        raise DpgenError(f"feta.central_batch gives sampling rate {q:.4g}; it must be in (0, 1] (batch <= N={n})")
    if num_images < 1:
        raise DpgenError(f"feta.num_central must be >= 1, got {num_images}")
    dim = int(math.prod(x.shape[1:]))
    rounds = math.ceil(num_images / num_classes)
    b_star = float(expected_batch) if expected_batch is not None else q * n / num_classes
    clip = math.sqrt(dim) if clip is None else float(clip)
    bins = (2 if x.shape[1] == 1 else 16) if bins is None else int(bins)
    images = []
    for _ in range(rounds):
        idx = poisson_batch(n, q, generator, x.device)
        xb, yb = x[idx], y[idx]
        if kind == "mean":
            means = noisy_class_means(xb, yb, num_classes, clip=clip, expected_batch=b_star, sigma=sigma, q=q,
                                      ledger=ledger, generator=generator)
            images.append(means.clamp(0, 1))  # post-processing
        else:
            hist = noisy_class_histograms(xb, yb, num_classes, bins=bins, sigma=sigma, q=q, ledger=ledger,
                                          generator=generator)
            images.append(mode_from_histogram(hist, bins))
    imgs = torch.cat(images)[:num_images]
    labels = torch.arange(num_classes, device=x.device).repeat(rounds)[:num_images]
    return imgs, labels
