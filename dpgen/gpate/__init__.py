"""G-PATE (Long et al., NeurIPS 2021): a DP generator trained from private aggregation of teacher discriminators.

n teacher discriminators are trained non-privately on disjoint partitions (run as one batched
model, :mod:`dpgen.gpate.ensemble`).  For every synthetic sample, each teacher's ∂L/∂x is
randomly projected to k dims, clipped and binned, and Confident-GNMax releases one bin per
dimension (DPGradAgg, Alg. 2, :mod:`dpgen.gpate.aggregate`); G is fit by MSE to x + Δx_priv.
Privacy: :mod:`dpgen.gpate.rdp` (sound data-independent entries; paper data-dependent RDP).
"""
from dpgen.gpate.train import train

__all__ = ["train"]
