"""DP-FETA central images as the official code makes them (issue 16 §1): the query at half resolution,
its stated sensitivity and noise, the unchanged ledger cost, the post-processing and the mode mapping."""
from __future__ import annotations

import math

import pytest
import torch

import dpgen.feta.central as central
from dpgen.errors import DpgenError
from dpgen.feta.central import mode_from_histogram, official_post, query_central, shrink_size
from dpgen.privacy import PrivacyLedger
from dpgen.privacy.randomness import secret_generator


def _data(n: int = 400, k: int = 4, size: int = 28, seed: int = 0):
    g = secret_generator("cpu", seed=seed)
    return torch.rand(n, 1, size, size, generator=g), torch.arange(n) % k


class _SpyRelease:
    """Wraps ``gaussian_sum_query`` in dpgen.feta.central: records what each release receives and returns."""

    def __init__(self, monkeypatch):
        self.calls: list[dict] = []
        self._orig = central.gaussian_sum_query
        monkeypatch.setattr(central, "gaussian_sum_query", self)

    def __call__(self, values, **kw):
        out = self._orig(values, **kw)
        self.calls.append({"shape": tuple(values.shape), "values": values.clone(), "out": out.clone(), **kw})
        return out


def test_shrink_sizes_follow_the_official_code():
    assert [shrink_size(r) for r in (28, 32, 64, 128)] == [14, 16, 16, 16]


@pytest.mark.parametrize("kind", ["mean", "mode"])
def test_official_images_shape_range_and_8bit_grid(kind):
    x, y = _data()
    imgs, labels = query_central(kind, x, y, 4, num_images=6, q=0.5, sigma=2.0, ledger=PrivacyLedger(1e-5),
                                 generator=secret_generator("cpu", seed=0))
    assert imgs.shape == (6, 1, 28, 28) and labels.tolist() == [0, 1, 2, 3, 0, 1]
    assert imgs.min() >= 0 and imgs.max() <= 1
    torch.testing.assert_close(imgs * 255, (imgs * 255).round(), rtol=0, atol=1e-4)  # uint8 images, as official


def test_official_mean_noise_is_added_at_14x14_with_sensitivity_c_over_b_star(monkeypatch):
    spy = _SpyRelease(monkeypatch)
    x, y = torch.zeros(300, 1, 28, 28), torch.arange(300) % 3
    sigma, q = 4.0, 0.5
    b_star = q * 300 / 3
    query_central("mean", x, y, 3, num_images=3, q=q, sigma=sigma, ledger=PrivacyLedger(1e-5),
                  generator=secret_generator("cpu", seed=0))
    (call,) = spy.calls
    assert call["shape"][-3:] == (1, 14, 14), "the query runs on the shrunk images"
    assert call["sensitivity"] == pytest.approx(14.0) and call["noise_multiplier"] == sigma  # C_c = sqrt(14*14)
    # zero images: the release is pure noise; after dividing by B*_c its std is sigma * C_c / B*_c = 4*14/50
    assert (call["out"] / b_star).std().item() == pytest.approx(sigma * 14.0 / b_star, rel=0.06)
    # every released row respects the clip bound the sensitivity assumes
    assert call["values"].flatten(1).norm(dim=1).max() <= 14.0 + 1e-4


def test_official_mode_noise_is_added_at_14x14_with_sensitivity_sqrt_whc(monkeypatch):
    spy = _SpyRelease(monkeypatch)
    x, y = _data(n=300, k=3)
    query_central("mode", x, y, 3, num_images=3, q=0.5, sigma=2.0, ledger=PrivacyLedger(1e-5),
                  generator=secret_generator("cpu", seed=0))
    (call,) = spy.calls
    assert call["shape"] == (1, 3, 1, 14, 14, 2)  # one stacked row: K classes x 14x14 pixels x 2 bins
    assert call["sensitivity"] == pytest.approx(math.sqrt(14 * 14))  # Theorem 3.3 at the query resolution
    noise = call["out"] - call["values"].sum(0)
    assert noise.std().item() == pytest.approx(2.0 * 14.0, rel=0.05)


@pytest.mark.parametrize("kind", ["mean", "mode"])
def test_official_post_processing_costs_the_same_as_the_paper_query(kind):
    x, y = _data()
    entries = {}
    for post in ("official", "paper"):
        ledger = PrivacyLedger(1e-5)
        query_central(kind, x, y, 4, num_images=9, q=0.25, sigma=3.0, ledger=ledger,
                      generator=secret_generator("cpu", seed=0), post=post)
        entries[post] = [e.to_dict() for e in ledger.entries]
    assert entries["official"] == entries["paper"]
    assert [(e["sampling_rate"], e["count"], e["noise_multipliers"]) for e in entries["paper"]] == [(0.25, 3, [3.0])]


def test_official_noise_std_per_pixel_halves():
    """Same sigma_c and batch: the official query's per-pixel noise std is half the paper's (14/600 vs 28/600)."""
    x, y = torch.zeros(6000, 1, 28, 28), torch.arange(6000) % 10
    std = {}
    for post in ("official", "paper"):
        spy_out = []
        orig = central.noisy_class_means

        def spy(*a, **k):
            out = orig(*a, **k)
            spy_out.append(out)
            return out

        central.noisy_class_means = spy
        try:
            query_central("mean", x, y, 10, num_images=10, q=1.0, sigma=5.0, ledger=PrivacyLedger(1e-5),
                          generator=secret_generator("cpu", seed=1), post=post)
        finally:
            central.noisy_class_means = orig
        std[post] = spy_out[0].std().item()
    assert std["paper"] == pytest.approx(5 * 28 / 600, rel=0.05)
    assert std["official"] == pytest.approx(5 * 14 / 600, rel=0.05)


def test_mode_mapping_official_is_argmax_over_bins_minus_one():
    hist = torch.tensor([[5.0, 1.0], [0.0, 3.0]])
    torch.testing.assert_close(mode_from_histogram(hist, 2, "official"), torch.tensor([0.0, 1.0]))
    torch.testing.assert_close(mode_from_histogram(hist, 2, "paper"), torch.tensor([0.25, 0.75]))
    h16 = torch.zeros(3, 16)
    h16[0, 0], h16[1, 7], h16[2, 15] = 1, 1, 1
    torch.testing.assert_close(mode_from_histogram(h16, 16, "official"), torch.tensor([0.0, 7 / 15, 1.0]))


def test_official_mode_background_is_black():
    """Black images with (almost) no noise: official mode images are 0 everywhere; the paper's mid-point is 0.25."""
    x, y = torch.zeros(200, 1, 28, 28), torch.arange(200) % 2
    out = {}
    for post in ("official", "paper"):
        out[post], _ = query_central("mode", x, y, 2, num_images=2, q=1.0, sigma=1e-6, ledger=PrivacyLedger(1e-5),
                                     generator=secret_generator("cpu", seed=0), post=post)
    assert out["official"].abs().max() == 0
    torch.testing.assert_close(out["paper"], torch.full_like(out["paper"], 0.25))


def test_official_post_median_blur_and_sharpen():
    flat = torch.full((1, 1, 14, 14), 0.4)
    torch.testing.assert_close(official_post(flat, 28), torch.full((1, 1, 28, 28), round(0.4 * 255) / 255))
    # the 3x3 median removes an isolated bright pixel (salt), also at the border
    salt = torch.zeros(1, 1, 8, 8)
    salt[0, 0, 3, 4] = salt[0, 0, 0, 0] = 255.0
    assert central._median3(salt).max() == 0
    # a vertical step edge gets the sharpen kernel's overshoot on the bright side, saturated at 0 on the dark side
    step = torch.zeros(1, 1, 14, 14)
    step[..., 7:] = 0.5
    out = official_post(step, 28)
    assert out.max() > 0.6 and out.min() == 0 and (out[..., -1] * 255).unique().tolist() == [128.0]
    # grey: median then [[0,-1,0],[-1,5,-1],[0,-1,0]]; colour: median only
    rgb = torch.rand(1, 3, 16, 16, generator=secret_generator("cpu", seed=0))
    up = torch.nn.functional.interpolate(rgb, size=(32, 32), mode="bilinear", align_corners=False)
    ref = (up * 255).round()
    med = torch.nn.functional.pad(ref, (1, 1, 1, 1), mode="replicate").unfold(2, 3, 1).unfold(3, 3, 1)
    med = med.reshape(1, 3, 32, 32, 9).median(-1).values
    torch.testing.assert_close(official_post(rgb, 32), med / 255)


def test_central_post_must_be_known():
    x, y = _data()
    with pytest.raises(DpgenError, match="central_post"):
        query_central("mean", x, y, 4, num_images=4, q=0.5, sigma=1.0, ledger=PrivacyLedger(1e-5),
                      generator=secret_generator("cpu", seed=0), post="fancy")
