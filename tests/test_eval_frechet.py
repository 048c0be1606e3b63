"""Frechet distance (Heusel et al. 2017) against closed forms."""
from __future__ import annotations

import numpy as np
import pytest

from dpgen.eval.frechet import _sym_sqrt_trace, feature_statistics, frechet_distance, frechet_distance_features


def test_identical_gaussians_give_zero() -> None:
    rng = np.random.default_rng(0)
    a = rng.normal(size=(50, 8))
    sigma = a.T @ a / 50 + 0.1 * np.eye(8)
    mu = rng.normal(size=8)
    assert abs(frechet_distance(mu, sigma, mu, sigma)) < 1e-8


def test_diagonal_gaussians_closed_form() -> None:
    # For diagonal covariances: d^2 = ||mu1 - mu2||^2 + sum_i (sqrt(a_i) - sqrt(b_i))^2
    mu1, mu2 = np.array([0.0, 1.0, -2.0]), np.array([1.0, 1.0, 0.5])
    a, b = np.array([1.0, 4.0, 0.25]), np.array([9.0, 1.0, 0.25])
    expected = np.sum((mu1 - mu2) ** 2) + np.sum((np.sqrt(a) - np.sqrt(b)) ** 2)
    assert frechet_distance(mu1, np.diag(a), mu2, np.diag(b)) == pytest.approx(expected, rel=1e-10)
    assert expected == pytest.approx(1 + 6.25 + 4 + 1)


def test_one_dimensional() -> None:
    assert frechet_distance(np.array([3.0]), np.array([[4.0]]), np.array([0.0]), np.array([[1.0]])) == pytest.approx(9 + 1)


def test_symmetric_formula_matches_sqrtm_path() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(30, 6)), rng.normal(size=(30, 6)) * 2
    s1, s2 = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    mu = np.zeros(6)
    direct = frechet_distance(mu, s1, mu, s2)
    sym = np.trace(s1) + np.trace(s2) - 2 * _sym_sqrt_trace(s1, s2)
    assert direct == pytest.approx(sym, rel=1e-8)


def test_rank_deficient_covariances_identical_sets() -> None:
    # Fewer samples than dimensions: S1 S2 is singular; the result must still be ~0 for identical sets.
    f = np.random.default_rng(2).normal(size=(10, 40))
    assert abs(frechet_distance_features(f, f)) < 1e-6 * np.trace(np.cov(f, rowvar=False))


def test_features_distance_grows_with_shift() -> None:
    rng = np.random.default_rng(3)
    f1, f2 = rng.normal(size=(4000, 3)), rng.normal(size=(4000, 3))
    near = frechet_distance_features(f1, f2)
    far = frechet_distance_features(f1, f2 + 2.0)
    assert near < 0.05
    assert far == pytest.approx(12.0 + near, abs=0.2)


def test_feature_statistics_rejects_single_sample() -> None:
    with pytest.raises(ValueError):
        feature_statistics(np.zeros((1, 4)))
    with pytest.raises(ValueError):
        frechet_distance(np.zeros(2), np.eye(2), np.zeros(3), np.eye(3))


def test_eigh_and_sqrtm_methods_agree() -> None:
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=(40, 5)), rng.normal(size=(60, 5)) + 1
    mu1, s1 = feature_statistics(a)
    mu2, s2 = feature_statistics(b)
    assert frechet_distance(mu1, s1, mu2, s2, method="eigh") == pytest.approx(
        frechet_distance(mu1, s1, mu2, s2, method="sqrtm"), rel=1e-8
    )
    with pytest.raises(ValueError):
        frechet_distance(mu1, s1, mu2, s2, method="nope")


@pytest.mark.parametrize("n1", [3, 12, 20])
def test_low_rank_path_matches_covariance_formula(n1: int) -> None:
    from dpgen.eval.frechet import frechet_distance_samples

    rng = np.random.default_rng(n1)
    f1 = rng.normal(size=(n1, 20)) * rng.uniform(0.5, 2, size=20)
    f2 = rng.normal(size=(200, 20)) + 0.3
    mu2, s2 = feature_statistics(f2)
    mu1, s1 = feature_statistics(f1)
    got, method = frechet_distance_samples(f1, mu2, s2)
    assert method == "low_rank"
    assert got == pytest.approx(frechet_distance(mu1, s1, mu2, s2, method="eigh"), rel=1e-7)
    assert got == pytest.approx(frechet_distance(mu1, s1, mu2, s2, method="sqrtm"), rel=1e-5)
    assert frechet_distance_samples(f2, mu1, s1)[1] == "sqrtm"
    assert frechet_distance_features(f1, f2) == pytest.approx(frechet_distance_features(f2, f1))
