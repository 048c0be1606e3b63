"""GS-WGAN (Chen, Orekondy & Fritz, NeurIPS 2020): gradient-sanitised Wasserstein GAN.

Reusable parts: :class:`~dpgen.gswgan.nets.ResNetGenerator` (released), the functional discriminator/classifier in
:mod:`dpgen.gswgan.nets`, the critic step and warm-up generators of the ensemble :mod:`dpgen.gswgan.ensemble`
(its stacked discriminators are a :class:`dpgen.ensemble.NetStack`), the sanitiser :mod:`dpgen.gswgan.sanitizer`
and the accounting in :mod:`dpgen.gswgan.accounting`.
"""
from dpgen.gswgan.train import train

__all__ = ["train"]
