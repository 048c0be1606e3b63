"""EFSGD networks: the dpac ResNet generator with noise injection (Sec. 4.2, Alg. 1) and the encoder.

* :class:`NoiseInjectionGenerator` is dpac's :class:`~dpgen.dpac.nets.ResNetGenerator` (same
  modules and weights layout) whose three GBlocks add element-wise N(0, σ_noise²) to the feature
  map right after each ×2 up-sampling, i.e. before the next convolution/activation (Alg. 1:
  input "upsampled image", output "noisy image"). The noise is drawn in training *and* sampling,
  from the ``generator`` passed to :meth:`forward`/:meth:`generate`, so sampling is seeded.
  ``noise_injection`` and ``sigma_noise`` are constructor arguments, hence stored in generator.pt.
* The encoder E (VAE-style, Sec. 4.3) is a functional DCGAN trunk + linear mean head, one per
  partition (θ_E^k in Alg. 2), stacked in a :class:`~dpgen.dpac.ensemble.NetStack` like the
  discriminators. It is never released.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from dpgen.dpac.nets import Params, ResNetGenerator, _features, _trunk_init, feature_dim, pixel_norm


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
        if not self.noise_injection or self.sigma_noise == 0.0:
            return h
        return h + self.sigma_noise * torch.randn(h.shape, generator=generator, device=h.device, dtype=h.dtype)

    def forward_input(self, u: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """G on a ready input vector u = [z, label code] (the encoder path feeds a privatised u)."""
        h = pixel_norm(F.relu(self.fc(u).view(-1, self.width, 4, 4)))
        for blk in self.blocks:  # GBlock.forward with the injection after the main-path up-sampling
            up = F.interpolate(F.relu(pixel_norm(h)), scale_factor=2, mode="nearest")
            up = self._inject(up, generator)
            r = blk.conv2(F.relu(pixel_norm(blk.conv1(up))))
            h = r + blk.skip(F.interpolate(h, scale_factor=2, mode="nearest"))
        img = torch.sigmoid(self.out(F.relu(pixel_norm(h))))
        _, hh, ww = self.sample_shape
        top, left = (32 - hh) // 2, (32 - ww) // 2
        return img[:, :, top:top + hh, left:left + ww]

    def forward(self, z: torch.Tensor, y: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return self.forward_input(torch.cat([z, F.one_hot(y, self.num_classes).to(z.dtype)], dim=1), generator)

    def generate(self, labels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return self(self.sample_z(len(labels), generator, labels.device), labels, generator)


def enc_init(shape: list[int], width: int, z_dim: int, g: torch.Generator) -> Params:
    """One encoder: the DCGAN trunk of dpac's D/C and a linear head to the latent mean μ(x) ∈ R^z_dim."""
    p = _trunk_init(shape, width, g)
    f = feature_dim(shape, width)
    p["mu.w"] = torch.randn(z_dim, f, generator=g) * (1.0 / f) ** 0.5
    p["mu.b"] = torch.zeros(z_dim)
    return p


def enc_forward(p: Params, u: Params, x: torch.Tensor) -> torch.Tensor:
    """μ(x): spectrally normalised trunk features → linear mean head (the head is not normalised)."""
    return _features(p, u, x) @ p["mu.w"].t() + p["mu.b"]
