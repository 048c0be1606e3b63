"""DP-FETA (Li et al., S&P'25): DP central images warm up an EDM diffusion model, then DP-SGD fine-tunes it.

Stage I queries DP mean images (Alg. 1) or mode images (Alg. 2) per class and pre-trains the model on
them with a bag of random augmentations (Eq. 8; post-processing). Stage II fine-tunes on the sensitive
data with DP-SGD (Eq. 9) using DPDM's noise multiplicity; its σ is calibrated so that the central
queries plus all DP-SGD steps meet the target ε (Sec. 3.3). With ``central=none`` (``method=dpdm``)
Stage I is skipped: the DPDM baseline (Dockhorn et al., TMLR 2023).
"""
from dpgen.feta.train import train

__all__ = ["train"]
