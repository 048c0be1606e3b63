"""DP-GAN / DP-CGAN baseline: a conditional GAN whose discriminator is trained with DP-SGD.

The discriminator is the only network that sees real data; it is trained by DP-SGD
(Abadi et al. 2016, Alg. 1: Poisson sampling, per-sample clipping, Gaussian noise) through
opacus. The generator only ever sees the discriminator, so it is post-processing
(Xie et al. 2018 "DPGAN"; Torkzadehmahani et al. 2019 "DP-CGAN").
"""
from dpgen.dpgan.train import train

__all__ = ["train"]
