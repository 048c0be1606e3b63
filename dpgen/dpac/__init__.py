"""DP-GAN-DPAC (Chen et al., CVPR 2023): GS-WGAN (:mod:`dpgen.gswgan`) plus the dual-purpose auxiliary classifier.

The classifier C is :mod:`dpgen.dpac.classifier`; :mod:`dpgen.dpac.method` plugs it into GS-WGAN's loop through
the named extension points of :class:`dpgen.gswgan.train.GsWgan`.
"""
from dpgen.dpac.method import train

__all__ = ["train"]
