"""The batched, device-side warm-up augmentation (DP-FETA Eq. 8) reproduces torchvision's RandAugment ops."""
from __future__ import annotations

import itertools

import pytest
import torch

from dpgen.feta.augment import NAMES, OPS, AugmentBag


def _images(n: int, channels: int, seed: int = 0) -> torch.Tensor:
    """uint8 images with structure (blobs on black, as F-MNIST) and some pure noise."""
    g = torch.Generator().manual_seed(seed)
    blobs = torch.nn.functional.interpolate(torch.rand(n, channels, 7, 7, generator=g), size=(28, 28), mode="bilinear")
    img = (blobs * 300 - 60).clamp(0, 255)
    img[: n // 4] = torch.rand(n // 4, channels, 28, 28, generator=g) * 255
    return img.round().to(torch.uint8)


def _reference(img: torch.Tensor, ops, mags, signs) -> torch.Tensor:
    """torchvision, one image and one op at a time (the definition in OPS)."""
    out = []
    for i, x in enumerate(img):
        for j in range(ops.shape[1]):
            x = OPS[NAMES[int(ops[i, j])]](x, int(mags[i, j]), float(signs[i, j]))
        out.append(x)
    return torch.stack(out)


@pytest.mark.parametrize("channels,max_mag,mag_list", [(1, 3, range(1, 4)), (3, 9, range(1, 10)),
                                                      (1, 30, range(2, 31, 4))])
def test_every_op_magnitude_and_sign_matches_torchvision(channels, max_mag, mag_list):
    grid = list(itertools.product(range(len(NAMES)), mag_list, (1.0, -1.0)))
    img = _images(len(grid), channels)
    ops = torch.tensor([g[0] for g in grid]).view(-1, 1)
    mags = torch.tensor([g[1] for g in grid]).view(-1, 1)
    signs = torch.tensor([g[2] for g in grid], dtype=torch.float64).view(-1, 1)
    got = AugmentBag(1, max_mag).apply_op(img, ops[:, 0], mags[:, 0], signs[:, 0])
    ref = _reference(img, ops, mags, signs)
    assert got.dtype == torch.uint8 and got.shape == img.shape
    bad = [NAMES[int(o)] for o, a, b in zip(ops[:, 0], got, ref) if not torch.equal(a, b)]
    assert bad == [], f"ops that differ from torchvision: {sorted(set(bad))}"


def test_seeded_bag_matches_torchvision_sequentially():
    bag = AugmentBag(2, 3)
    x = _images(64, 1, seed=1).to(torch.float32) / 255
    got = bag(x, torch.Generator().manual_seed(5))
    ops, mags, signs = bag.draw(64, torch.Generator().manual_seed(5), torch.device("cpu"))
    ref = _reference((x * 255).round().to(torch.uint8), ops, mags, signs).to(torch.float32) / 255
    torch.testing.assert_close(got, ref, rtol=0, atol=0)
    assert (got - x).abs().max() > 0.05, "the bag changes images"
    torch.testing.assert_close(bag(x, torch.Generator().manual_seed(5)), got, rtol=0, atol=0)


@pytest.mark.parametrize("num_ops", [0, 2, 3, 14])
def test_draw_picks_distinct_ops_and_magnitudes_in_range(num_ops):
    ops, mags, signs = AugmentBag(num_ops, 5).draw(500, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert ops.shape == mags.shape == signs.shape == (500, num_ops)
    assert all(len(set(row.tolist())) == num_ops for row in ops), "ops within an image are distinct"
    if num_ops:
        assert mags.min() == 1 and mags.max() == 5 and set(signs.unique().tolist()) == {-1.0, 1.0}
        assert set(ops.flatten().tolist()) == set(range(len(NAMES)))  # every op of the bag is drawn
    assert AugmentBag().num_ops == 2  # Eq. 8 with m = 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bag_stays_on_cuda():
    x = torch.rand(8, 1, 28, 28, device="cuda")
    assert AugmentBag(2, 3)(x, torch.Generator(device="cuda").manual_seed(0)).device.type == "cuda"
