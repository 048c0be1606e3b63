"""EFSGD networks: the dpac ResNet generator with noise injection (Sec. 4.2, Alg. 1) and the encoder.

* :class:`NoiseInjectionGenerator` is dpac's :class:`~dpgen.gswgan.nets.ResNetGenerator` (same
  modules and weights layout) whose three GBlocks add element-wise N(0, σ_noise²) to the feature
  map right after each ×2 up-sampling, i.e. before the next convolution/activation (Alg. 1:
  input "upsampled image", output "noisy image"). The noise is drawn in training *and* sampling,
  from the ``generator`` passed to :meth:`forward`/:meth:`generate`, so sampling is seeded.
  ``noise_injection`` and ``sigma_noise`` are constructor arguments, hence stored in generator.pt.
* The encoder E (VAE-style, Sec. 4.3) is a functional DCGAN trunk + linear mean head, one per
  partition (θ_E^k in Alg. 2), stacked in a :class:`~dpgen.ensemble.NetStack` like the
  discriminators. It is never released.
"""
from __future__ import annotations

import torch

from dpgen.gswgan.nets import Params, ResNetGenerator, dense, feature_dim, features, trunk_init


class NoiseInjectionGenerator(ResNetGenerator):
    """The released EFSGD generator. ``noise_injection=False`` computes exactly dpac's ResNetGenerator."""

    def __init__(self, num_classes: int, shape: list[int], z_dim: int = 10, width: int = 256,
                 noise_injection: bool = True, sigma_noise: float = 0.1) -> None:
        super().__init__(num_classes, shape, z_dim, width)
        if sigma_noise < 0:
            raise ValueError(f"sigma_noise must be >= 0, got {sigma_noise}")
        self.noise_injection, self.sigma_noise = bool(noise_injection), float(sigma_noise)
        self.init_kwargs.update(noise_injection=self.noise_injection, sigma_noise=self.sigma_noise)

    @property
    def input_dim(self) -> int:
        return self.z_dim + self.num_classes

    def _inject(self, h: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """Alg. 1: h + N(0, σ_noise²) on the up-sampled feature map, from the caller's seeded ``generator``."""
        if not self.noise_injection or self.sigma_noise == 0.0:
            return h
        return h + self.sigma_noise * torch.randn(h.shape, generator=generator, device=h.device, dtype=h.dtype)


def enc_init(shape: list[int], width: int, z_dim: int, g: torch.Generator) -> Params:
    """One encoder: the DCGAN trunk of dpac's D/C and a linear head to the latent mean μ(x) ∈ R^z_dim."""
    p = trunk_init(shape, width, g)
    p.update(dense("mu", z_dim, feature_dim(shape, width), 1, g))
    return p


def enc_forward(p: Params, u: Params, x: torch.Tensor) -> torch.Tensor:
    """μ(x): spectrally normalised trunk features → linear mean head (the head is not normalised)."""
    return features(p, u, x) @ p["mu.w"].t() + p["mu.b"]
