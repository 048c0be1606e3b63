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


class AugmentBag:
    """Eq. 8: each image gets ``num_ops`` distinct operations from the bag, applied in sequence."""

    def __init__(self, num_ops: int = 2, max_magnitude: int = 9,
                 ops: dict[str, Callable[[torch.Tensor, int, float], torch.Tensor]] | None = None) -> None:
        self.ops = dict(OPS if ops is None else ops)
        if not 0 <= num_ops <= len(self.ops):
            raise DpgenError(f"feta.aug_ops must be between 0 and {len(self.ops)}, got {num_ops}")
        if not 0 <= max_magnitude < BINS:
            raise DpgenError(f"feta.aug_magnitude must be between 0 and {BINS - 1}, got {max_magnitude}")
        self.num_ops, self.max_magnitude = int(num_ops), int(max_magnitude)
        self._names = list(self.ops)

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Augment a float batch N×C×H×W in [0, 1] (on CPU); returns the same shape, in [0, 1]."""
        out = []
        for img in (x.clamp(0, 1) * 255).round().to(torch.uint8):
            picks = torch.randperm(len(self._names), generator=generator)[: self.num_ops].tolist()
            for i in picks:
                m = int(torch.randint(1, self.max_magnitude + 1, (1,), generator=generator)) if self.max_magnitude else 0
                sign = 1.0 if torch.rand(1, generator=generator).item() < 0.5 else -1.0
                img = self.ops[self._names[i]](img, m, sign)
            out.append(img)
        return torch.stack(out).to(torch.float32) / 255.0
