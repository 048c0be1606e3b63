"""Stage I of DP-FETA: DP central images (mean images, Alg. 1; mode images, Alg. 2).

Each query round draws ONE Poisson batch of the sensitive set at rate q_c and computes one central
image per class from the disjoint label groups of that batch. A record joins exactly one group, so
the K per-class releases together have the sensitivity of a single one (parallel composition,
DP-FETA Sec. 3.1.2), and a round is recorded as one Poisson-subsampled Gaussian entry.

``post="official"`` (the default) makes the images as the official DP-FETA code and DPImageBench's
``CentralDataset`` do: the query runs on images shrunk to half resolution (¼ at 64 px, ⅛ at 128 px), so
the clip bound and hence the per-pixel noise std fall by the shrink factor at the same privacy cost;
the release is then upsampled bilinearly, median-blurred (3×3) and, for grey images, sharpened.
Mode images map the arg-max bin to argmax/(bins−1). All of that is post-processing of the DP release.
``post="paper"`` is the paper's text: full resolution, no filtering, bin mid-points (Eq. 7).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from dpgen.errors import DpgenError
from dpgen.privacy import PrivacyLedger, clip_rows, gaussian_sum_query
from dpgen.privacy.randomness import SecretGenerator, require_secret
from dpgen.privacy.sampling import poisson_batch

MEAN_ENTRY = "feta.central_mean"
MODE_ENTRY = "feta.central_mode"
POSTS = ("official", "paper")
#: the official 3×3 sharpening kernel (applied to grey images after the median blur)
SHARPEN = torch.tensor([[0.0, -1.0, 0.0], [-1.0, 5.0, -1.0], [0.0, -1.0, 0.0]])


def shrink_size(resolution: int) -> int:
    """Side length the official code queries at: ×½ up to 32 px, ×¼ at 64 px, ×⅛ at 128 px."""
    factor = {64: 4, 128: 8}.get(int(resolution), 2)
    return max(1, int(resolution) // factor)


def shrink(x: torch.Tensor, size: int) -> torch.Tensor:
    """Block-average (area) down-sampling to size×size; stays in [0, 1], so the clip bound √(C·size²) holds.

    The official code subsamples (``F.interpolate``'s default, nearest); averaging uses every pixel and, on
    F-MNIST at σ_c=5, brings the RMSE of the mean images to the true class means to 0.122 (nearest: 0.138).
    """
    return x if x.shape[-1] == size else F.interpolate(x, size=(size, size), mode="area")


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


def mode_from_histogram(hist: torch.Tensor, bins: int, post: str = "paper") -> torch.Tensor:
    """Mode pixel from the arg-max bin k (0-based), in [0, 1].

    ``post="paper"``: the bin mid-point (2k*−1)/2 · max/bins with 1-based k* = k+1 (Eq. 7), so two bins give
    0.25/0.75. ``post="official"``: k/(bins−1), so the two bins of grey images give 0/1 (the official code).
    """
    k = hist.argmax(dim=-1).to(torch.float32)
    if post == "official":
        return k / max(bins - 1, 1)
    return (2 * (k + 1) - 1) / 2.0 / bins


def _median3(x: torch.Tensor) -> torch.Tensor:
    """3×3 median per channel with replicated borders (OpenCV ``medianBlur(·, 3)``)."""
    n, c, h, w = x.shape
    patches = F.unfold(F.pad(x, (1, 1, 1, 1), mode="replicate"), 3)  # N × C·9 × H·W
    return patches.reshape(n, c, 9, h * w).median(dim=2).values.reshape(n, c, h, w)


def _sharpen(x: torch.Tensor) -> torch.Tensor:
    """The official 3×3 sharpening filter with reflect-101 borders (OpenCV ``filter2D``'s default)."""
    c = x.shape[1]
    kernel = SHARPEN.to(device=x.device, dtype=x.dtype).expand(c, 1, 3, 3)
    return F.conv2d(F.pad(x, (1, 1, 1, 1), mode="reflect"), kernel, groups=c)


def official_post(low: torch.Tensor, size: int) -> torch.Tensor:
    """Official post-processing of released low-resolution images in [0, 1] (post-processing, no privacy cost).

    Bilinear up-sampling to size×size, 8-bit quantisation, 3×3 median blur, then (grey images) the sharpening
    filter with 8-bit saturation, as ``CentralDataset.post_process``. Returns float images in [0, 1].
    """
    up = F.interpolate(low.clamp(0, 1), size=(size, size), mode="bilinear", align_corners=False)
    img = _median3((up * 255).round())
    if img.shape[1] == 1:
        img = _sharpen(img).round().clamp(0, 255)
    return img / 255.0


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
                  sigma: float, ledger: PrivacyLedger, generator: SecretGenerator, clip: float | None = None,
                  bins: int | None = None, expected_batch: float | None = None,
                  post: str = "official") -> tuple[torch.Tensor, torch.Tensor]:
    """Query ``num_images`` DP central images (⌈num_images/K⌉ rounds × K classes) and their labels.

    * ``kind="mean"`` (Alg. 1, Eq. 6): (1/B*_c) Σ clip(x_i, C_c) + N(0, σ_c² (C_c/B*_c)² I). B*_c is the
      EXPECTED (data-independent) number of records of the class in a batch, q_c·N/K: dividing by it
      gives sensitivity exactly C_c/B*_c (Theorem 3.1). Dividing by the actual count, as the official
      code does, would not.
    * ``kind="mode"`` (Alg. 2, Eq. 7): noisy histograms H + N(0, σ_c² WHC I), then the arg-max bin's value.

    ``post`` (module doc): ``official`` queries at :func:`shrink_size` resolution (C_c defaults to
    √(C·h·w) there, i.e. 14 for 28×28 grey images, and WHC counts the shrunk pixels) and post-processes with
    :func:`official_post`; ``paper`` queries at full resolution and only clamps. ``x`` float N×C×H×W in
    [0, 1] (the sensitive training split). Returns images in [0, 1] at full resolution. The Poisson batches and
    the noise come from the secret ``generator``.
    """
    require_secret(generator, "central-image query")
    if kind not in ("mean", "mode"):
        raise DpgenError(f"feta.central must be mean, mode or none, got {kind!r}")
    if post not in POSTS:
        raise DpgenError(f"feta.central_post must be official or paper, got {post!r}")
    n = x.shape[0]
    if not 0 < q <= 1:
        raise DpgenError(f"feta.central_batch gives sampling rate {q:.4g}; it must be in (0, 1] (batch <= N={n})")
    if num_images < 1:
        raise DpgenError(f"feta.num_central must be >= 1, got {num_images}")
    size = x.shape[-1]
    low = shrink_size(size) if post == "official" else size
    dim = int(x.shape[1] * low * low)
    rounds = math.ceil(num_images / num_classes)
    b_star = float(expected_batch) if expected_batch is not None else q * n / num_classes
    clip = math.sqrt(dim) if clip is None else float(clip)
    bins = (2 if x.shape[1] == 1 else 16) if bins is None else int(bins)
    images = []
    for _ in range(rounds):
        idx = poisson_batch(n, q, generator, x.device)
        xb, yb = shrink(x[idx], low), y[idx]
        if kind == "mean":
            release = noisy_class_means(xb, yb, num_classes, clip=clip, expected_batch=b_star, sigma=sigma, q=q,
                                        ledger=ledger, generator=generator).clamp(0, 1)
        else:
            hist = noisy_class_histograms(xb, yb, num_classes, bins=bins, sigma=sigma, q=q, ledger=ledger,
                                          generator=generator)
            release = mode_from_histogram(hist, bins, post)
        images.append(official_post(release, size) if post == "official" else release)
    imgs = torch.cat(images)[:num_images]
    labels = torch.arange(num_classes, device=x.device).repeat(rounds)[:num_images]
    return imgs, labels
