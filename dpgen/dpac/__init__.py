"""DP-GAN-DPAC (Chen et al., CVPR 2023) on a GS-WGAN base (Chen et al., NeurIPS 2020, :mod:`dpgen.gswgan`).

``method=dpac`` runs GS-WGAN's training loop with DPAC's auxiliary classifier C (:mod:`dpgen.dpac.classifier`).
"""
from __future__ import annotations


def train(hp, data, ledger, run):
    """GS-WGAN's loop with the classifier (imported here: dpgen.gswgan.train imports dpgen.dpac.classifier)."""
    from dpgen.gswgan.train import train as gswgan_train

    return gswgan_train(hp, data, ledger, run)


__all__ = ["train"]
