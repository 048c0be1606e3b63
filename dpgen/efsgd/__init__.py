"""EFSGD (Ma & Zhang): error-feedback DP GAN with reconstruction loss and noise injection, on dpac.

Reuses :mod:`dpgen.dpac` and adds :class:`~dpgen.efsgd.sanitizer.ErrorFeedbackSanitizer`
(DiceSGD error feedback, one state per component), :class:`~dpgen.efsgd.nets.NoiseInjectionGenerator`
(released) and the per-partition VAE-style encoder with its privatised code (:mod:`dpgen.efsgd.train`).
"""
from dpgen.efsgd.train import train

__all__ = ["train"]
