"""Frechet distance between Gaussians fitted to two feature sets (Heusel et al. 2017, "GANs trained by a
two time-scale update rule converge to a local Nash equilibrium"):

    d^2 = ||mu1 - mu2||^2 + Tr(S1 + S2 - 2 (S1 S2)^{1/2}).

Numerics (``method="sqrtm"``) follow pytorch-fid's ``calculate_frechet_distance``: ``scipy.linalg.sqrtm``
of S1 S2; if that is not finite, retry with ``eps`` added to both diagonals; drop a negligible imaginary
part.  Where pytorch-fid raises on a large imaginary part, this module instead uses the equivalent
symmetric form Tr (S1^{1/2} S2 S1^{1/2})^{1/2} (``method="eigh"``), which is real by construction.

When the first set has no more samples than dimensions (n <= d) its covariance S1 = B^T B (B the
centred samples / sqrt(n - 1)) is singular and ``sqrtm`` of the singular product is ill-conditioned and
slow (tens of seconds for 2048-d on two CPU cores).  :func:`frechet_distance_samples` then uses the exact
identity Tr (S1 S2)^{1/2} = sum_i sqrt(lambda_i(B S2 B^T)) (S1 S2 and B S2 B^T share their non-zero
eigenvalues), which needs only an n x n symmetric eigenproblem.
Used for both the Inception FID and the CNN-feature distance (``cnn_fid``).
"""
from __future__ import annotations

import warnings

import numpy as np
from scipy import linalg


def feature_statistics(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and unbiased covariance (rows are samples) in float64."""
    f = np.asarray(features, dtype=np.float64)
    if f.ndim != 2 or f.shape[0] < 2:
        raise ValueError(f"need an N x D feature matrix with N >= 2, got shape {f.shape}")
    return f.mean(axis=0), np.atleast_2d(np.cov(f, rowvar=False))


def _sym_sqrt_trace(s1: np.ndarray, s2: np.ndarray) -> float:
    w, v = np.linalg.eigh((s1 + s1.T) / 2)
    r1 = (v * np.sqrt(np.clip(w, 0.0, None))) @ v.T
    m = r1 @ s2 @ r1
    ev = np.linalg.eigvalsh((m + m.T) / 2)
    return float(np.sqrt(np.clip(ev, 0.0, None)).sum())


def _sqrtm(m: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "matrix is singular": handled below
        warnings.simplefilter("ignore", DeprecationWarning)
        return linalg.sqrtm(m)


def frechet_distance(
    mu1: np.ndarray,
    sigma1: np.ndarray,
    mu2: np.ndarray,
    sigma2: np.ndarray,
    eps: float = 1e-6,
    imag_atol: float = 1e-3,
    method: str = "sqrtm",
) -> float:
    """Squared Frechet distance between N(mu1, sigma1) and N(mu2, sigma2) (Heusel et al. 2017).

    ``method="sqrtm"``: pytorch-fid's numerics (see module docstring); ``"eigh"``: the symmetric form
    Tr (S1^{1/2} S2 S1^{1/2})^{1/2}, real by construction.
    """
    if method not in ("sqrtm", "eigh"):
        raise ValueError(f"method must be 'sqrtm' or 'eigh', got {method!r}")
    mu1, mu2 = np.atleast_1d(np.asarray(mu1, np.float64)), np.atleast_1d(np.asarray(mu2, np.float64))
    s1, s2 = np.atleast_2d(np.asarray(sigma1, np.float64)), np.atleast_2d(np.asarray(sigma2, np.float64))
    if mu1.shape != mu2.shape or s1.shape != s2.shape or s1.shape != (mu1.size, mu1.size):
        raise ValueError(f"shape mismatch: mu {mu1.shape} vs {mu2.shape}, sigma {s1.shape} vs {s2.shape}")
    diff = mu1 - mu2
    if method == "eigh":
        return float(diff @ diff + np.trace(s1) + np.trace(s2) - 2.0 * _sym_sqrt_trace(s1, s2))
    covmean = _sqrtm(s1 @ s2)
    if not np.isfinite(covmean).all():
        offset = np.eye(s1.shape[0]) * eps
        covmean = _sqrtm((s1 + offset) @ (s2 + offset))
    if not np.isfinite(covmean).all():
        tr_covmean = _sym_sqrt_trace(s1, s2)
    elif np.iscomplexobj(covmean):
        if np.allclose(np.diagonal(covmean).imag, 0.0, atol=imag_atol):
            tr_covmean = float(np.trace(covmean.real))
        else:
            tr_covmean = _sym_sqrt_trace(s1, s2)
    else:
        tr_covmean = float(np.trace(covmean))
    return float(diff @ diff + np.trace(s1) + np.trace(s2) - 2.0 * tr_covmean)


def frechet_distance_samples(f1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray) -> tuple[float, str]:
    """Frechet distance between the Gaussian fitted to samples ``f1`` (N x D) and N(mu2, sigma2).

    Returns (distance, method): ``"low_rank"`` (exact n x n eigenproblem, used when N <= D) or
    ``"sqrtm"`` (:func:`frechet_distance`).
    """
    f1 = np.asarray(f1, dtype=np.float64)
    mu1, s1 = feature_statistics(f1)
    mu2 = np.atleast_1d(np.asarray(mu2, np.float64))
    s2 = np.atleast_2d(np.asarray(sigma2, np.float64))
    if f1.shape[0] > f1.shape[1]:
        return frechet_distance(mu1, s1, mu2, s2), "sqrtm"
    if mu2.shape != mu1.shape or s2.shape != s1.shape:
        raise ValueError(f"shape mismatch: features of dim {mu1.size}, mu2 {mu2.shape}, sigma2 {s2.shape}")
    b = (f1 - mu1) / np.sqrt(f1.shape[0] - 1)
    m = b @ s2 @ b.T
    ev = np.linalg.eigvalsh((m + m.T) / 2)
    tr_covmean = float(np.sqrt(np.clip(ev, 0.0, None)).sum())
    diff = mu1 - mu2
    return float(diff @ diff + np.sum(b * b) + np.trace(s2) - 2.0 * tr_covmean), "low_rank"


def frechet_distance_features(f1: np.ndarray, f2: np.ndarray) -> float:
    """Frechet distance between Gaussians fitted to two N x D feature sets (symmetric in f1, f2)."""
    small, large = (f1, f2) if len(f1) <= len(f2) else (f2, f1)
    mu, sigma = feature_statistics(large)
    return frechet_distance_samples(small, mu, sigma)[0]
