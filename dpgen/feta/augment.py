"""The augmentation bag of the warm-up (DP-FETA Sec. 3.1.3, Eq. 8; Appendix B.3).

A(x) = A_{i1} ∘ A_{i2}(x): two operations drawn from the 14 RandAugment operations (Cubuk et al. 2020,
as implemented in torchvision), applied one after the other to each central image. Magnitudes use
torchvision's 31-bin scale and are drawn uniformly from 1..``max_magnitude`` per operation (the official
code uses 1..3 for MNIST/F-MNIST and 1..9 for RGB data). Augmenting central images is post-processing
of DP outputs, so it costs no privacy.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torchvision.transforms.v2.functional as TF

from dpgen.errors import DpgenError

BINS = 31  # torchvision RandAugment's num_magnitude_bins


def _frac(m: int) -> float:
    return m / (BINS - 1)


def _affine(img: torch.Tensor, **kw) -> torch.Tensor:
    base = {"angle": 0.0, "translate": [0, 0], "scale": 1.0, "shear": [0.0, 0.0]}
    return TF.affine(img, **{**base, **kw}, interpolation=TF.InterpolationMode.NEAREST, fill=0)


def _shear(axis: int) -> Callable[[torch.Tensor, int, float], torch.Tensor]:
    def op(img: torch.Tensor, m: int, sign: float) -> torch.Tensor:
        deg = math.degrees(math.atan(sign * 0.3 * _frac(m)))
        return _affine(img, shear=[deg, 0.0] if axis == 0 else [0.0, deg])
    return op


def _translate(axis: int) -> Callable[[torch.Tensor, int, float], torch.Tensor]:
    def op(img: torch.Tensor, m: int, sign: float) -> torch.Tensor:
        px = int(round(sign * 150.0 / 331.0 * img.shape[-1] * _frac(m)))
        return _affine(img, translate=[px, 0] if axis == 0 else [0, px])
    return op


def _color(img: torch.Tensor, m: int, sign: float) -> torch.Tensor:
    return TF.adjust_saturation(img, 1.0 + sign * 0.9 * _frac(m)) if img.shape[0] == 3 else img


#: name -> op(img_uint8 C×H×W, magnitude bin, sign ±1); the 14 operations of torchvision's RandAugment.
OPS: dict[str, Callable[[torch.Tensor, int, float], torch.Tensor]] = {
    "Identity": lambda img, m, s: img,
    "ShearX": _shear(0),
    "ShearY": _shear(1),
    "TranslateX": _translate(0),
    "TranslateY": _translate(1),
    "Rotate": lambda img, m, s: _affine(img, angle=s * 30.0 * _frac(m)),
    "Brightness": lambda img, m, s: TF.adjust_brightness(img, 1.0 + s * 0.9 * _frac(m)),
    "Color": _color,
    "Contrast": lambda img, m, s: TF.adjust_contrast(img, 1.0 + s * 0.9 * _frac(m)),
    "Sharpness": lambda img, m, s: TF.adjust_sharpness(img, 1.0 + s * 0.9 * _frac(m)),
    "Posterize": lambda img, m, s: TF.posterize(img, int(8 - round(m / ((BINS - 1) / 4)))),
    "Solarize": lambda img, m, s: TF.solarize(img, 255.0 * (1.0 - _frac(m))),
    "AutoContrast": lambda img, m, s: TF.autocontrast(img),
    "Equalize": lambda img, m, s: TF.equalize(img),
}


NAMES = list(OPS)


def _inverse_affine(angle: torch.Tensor, shear_x: torch.Tensor, shear_y: torch.Tensor, tx: torch.Tensor,
                    ty: torch.Tensor) -> torch.Tensor:
    """Per-image inverse affine matrices N×2×3 about the image centre, scale 1 (torchvision's
    ``_get_inverse_affine_matrix``, in float64 like its Python arithmetic, then float32 like its theta)."""
    rot, sx, sy = torch.deg2rad(angle), torch.deg2rad(shear_x), torch.deg2rad(shear_y)
    a = torch.cos(rot - sy) / torch.cos(sy)
    b = -torch.cos(rot - sy) * torch.tan(sx) / torch.cos(sy) - torch.sin(rot)
    c = torch.sin(rot - sy) / torch.cos(sy)
    d = -torch.sin(rot - sy) * torch.tan(sx) / torch.cos(sy) + torch.cos(rot)
    m0, m1, m3, m4 = d, -b, -c, a
    m2 = m0 * -tx + m1 * -ty
    m5 = m3 * -tx + m4 * -ty
    return torch.stack([m0, m1, m2, m3, m4, m5], dim=1).reshape(-1, 2, 3).to(torch.float32)


def _affine_batch(img: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Nearest-neighbour affine warp with fill 0, one matrix per image (torchvision's ``_affine_grid`` and
    ``_apply_grid_transform``, batched over the matrices)."""
    n, _, h, w = img.shape
    dev = img.device
    base = torch.empty(1, h, w, 3, dtype=torch.float32, device=dev)
    base[..., 0].copy_(torch.linspace((1.0 - w) * 0.5, (w - 1.0) * 0.5, steps=w, device=dev))
    base[..., 1].copy_(torch.linspace((1.0 - h) * 0.5, (h - 1.0) * 0.5, steps=h, device=dev).unsqueeze_(-1))
    base[..., 2].fill_(1)
    scaled = theta.transpose(1, 2) / torch.tensor([0.5 * w, 0.5 * h], dtype=torch.float32, device=dev)
    grid = base.view(1, h * w, 3).expand(n, -1, -1).bmm(scaled).view(n, h, w, 2)
    out = torch.nn.functional.grid_sample(img.to(torch.float32), grid, mode="nearest", padding_mode="zeros",
                                          align_corners=False)
    return out.round_().to(img.dtype)


def _autocontrast(img: torch.Tensor) -> torch.Tensor:
    """torchvision's ``autocontrast`` on uint8 images, with ``torch.where`` for its masked assignments (a masked
    ``__setitem__`` is a host sync on a GPU); same arithmetic, same result."""
    f = img.to(torch.float32)
    lo, hi = f.amin(dim=(-2, -1), keepdim=True), f.amax(dim=(-2, -1), keepdim=True)
    flat = hi == lo
    inv_scale = torch.where(flat, 1.0, (hi - lo).mul_(1.0 / 255))
    return (f - torch.where(flat, 0.0, lo)).div_(inv_scale).clamp_(0, 255).to(img.dtype)


def _per_value(op: Callable[[torch.Tensor, float], torch.Tensor], img: torch.Tensor, factor: torch.Tensor,
               values: list[float]) -> torch.Tensor:
    """Apply a torchvision op whose parameter is one scalar per call to every image at its own factor: one
    batched call per possible value (2 × max magnitude of them), each image keeps the result of its own."""
    out = img
    for v in values:
        out = torch.where((factor == v).view(-1, 1, 1, 1), op(img, v), out)
    return out


class AugmentBag:
    """Eq. 8: each image gets ``num_ops`` distinct operations from the bag, applied in sequence.

    Batched and on the images' device: the picks, magnitudes and signs of the whole batch are drawn at once
    from ``generator``, and each operation runs once per batch with one parameter per image (no host sync).
    Every operation reproduces torchvision's on uint8 images (:data:`OPS`; tests/test_feta_augment.py).
    """

    def __init__(self, num_ops: int = 2, max_magnitude: int = 9) -> None:
        if not 0 <= num_ops <= len(OPS):
            raise DpgenError(f"feta.aug_ops must be between 0 and {len(OPS)}, got {num_ops}")
        if not 0 <= max_magnitude < BINS:
            raise DpgenError(f"feta.aug_magnitude must be between 0 and {BINS - 1}, got {max_magnitude}")
        self.num_ops, self.max_magnitude = int(num_ops), int(max_magnitude)

    def draw(self, n: int, generator: torch.Generator,
             device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per image: ``num_ops`` distinct op indices into :data:`NAMES`, magnitudes in 1..max, signs ±1."""
        picks = torch.rand(n, len(NAMES), generator=generator, device=device).argsort(dim=1)[:, :self.num_ops]
        if self.max_magnitude:
            mags = torch.randint(1, self.max_magnitude + 1, (n, self.num_ops), generator=generator, device=device)
        else:
            mags = torch.zeros(n, self.num_ops, dtype=torch.long, device=device)
        signs = torch.where(torch.rand(n, self.num_ops, generator=generator, device=device) < 0.5, 1.0, -1.0)
        return picks, mags, signs.to(torch.float64)

    def apply_op(self, img: torch.Tensor, op: torch.Tensor, mag: torch.Tensor, sign: torch.Tensor) -> torch.Tensor:
        """Image i (uint8 N×C×H×W) gets operation ``NAMES[op[i]]`` at magnitude ``mag[i]`` and sign ``sign[i]``."""
        n, _, h, w = img.shape
        frac = mag.to(torch.float64) / (BINS - 1)
        zero = torch.zeros_like(frac)
        shear = torch.rad2deg(torch.atan(sign * 0.3 * frac))
        shift = torch.round(sign * 150.0 / 331.0 * w * frac)
        factor = 1.0 + sign * 0.9 * frac
        # the same float64 expression as OPS, so each image's factor equals one of these values exactly
        values = sorted({1.0 + s * 0.9 * _frac(m) for m in range(self.max_magnitude + 1) for s in (1.0, -1.0)})
        bits = (8 - torch.round(mag.to(torch.float64) / ((BINS - 1) / 4))).to(torch.long)
        mask = ((0xFF << (8 - bits)) & 0xFF).to(torch.uint8).view(-1, 1, 1, 1)
        threshold = (255.0 * (1.0 - frac)).to(torch.float32).view(-1, 1, 1, 1)
        results = {
            "Identity": lambda: img,
            "ShearX": lambda: _affine_batch(img, _inverse_affine(zero, shear, zero, zero, zero)),
            "ShearY": lambda: _affine_batch(img, _inverse_affine(zero, zero, shear, zero, zero)),
            "TranslateX": lambda: _affine_batch(img, _inverse_affine(zero, zero, zero, shift, zero)),
            "TranslateY": lambda: _affine_batch(img, _inverse_affine(zero, zero, zero, zero, shift)),
            "Rotate": lambda: _affine_batch(img, _inverse_affine(sign * 30.0 * frac, zero, zero, zero, zero)),
            # brightness blends with black: image·f exactly as torchvision's _blend (float32 product, truncation)
            "Brightness": lambda: (img * factor.to(torch.float32).view(-1, 1, 1, 1)).clamp_(0, 255).to(torch.uint8),
            "Color": lambda: img if img.shape[1] != 3 else _per_value(TF.adjust_saturation, img, factor, values),
            "Contrast": lambda: _per_value(TF.adjust_contrast, img, factor, values),
            "Sharpness": lambda: _per_value(TF.adjust_sharpness, img, factor, values),
            "Posterize": lambda: img & mask,
            "Solarize": lambda: torch.where(img >= threshold, 255 - img, img),
            "AutoContrast": lambda: _autocontrast(img),
            "Equalize": lambda: TF.equalize(img),
        }
        out = img
        for k in range(len(NAMES)):  # every op runs on the whole batch: choosing by the picks would sync
            out = torch.where((op == k).view(-1, 1, 1, 1), results[NAMES[k]](), out)
        return out

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Augment a float batch N×C×H×W in [0, 1] on its device; returns the same shape, in [0, 1]."""
        img = (x.clamp(0, 1) * 255).round().to(torch.uint8)
        picks, mags, signs = self.draw(img.shape[0], generator, img.device)
        for j in range(self.num_ops):
            img = self.apply_op(img, picks[:, j], mags[:, j], signs[:, j])
        return img.to(torch.float32) / 255.0
