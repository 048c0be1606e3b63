"""DP-GAN-DPAC (Chen et al., CVPR 2023) on a GS-WGAN base (Chen et al., NeurIPS 2020).

``method=dpac`` and ``method=gswgan`` (β = 1, no classifier) share this package. Reusable parts:
:class:`~dpgen.dpac.nets.ResNetGenerator` (released), the functional discriminator/classifier in
:mod:`dpgen.dpac.nets`, the critic step and warm-up generators of the ensemble
:mod:`dpgen.dpac.ensemble` (its stacked discriminators are a :class:`dpgen.ensemble.NetStack`), the sanitiser
:mod:`dpgen.dpac.sanitizer` and the accounting in :mod:`dpgen.dpac.accounting`.
"""
from dpgen.dpac.train import train

__all__ = ["train"]
