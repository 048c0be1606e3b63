"""DPAF (Lin et al. 2023): differentially private feature aggregation in the forward phase.

Phase 1 trains a classifier C (predicting a batch's class proportions) whose conv1 is DP-SGD-trained and
then frozen into the discriminator D. Phase 2 trains D with DPAGG (SIN-normalized features summed over a
batch plus Gaussian noise of sensitivity √m·p, Eq. 3–4) between conv2* and conv3*: conv3*/FC* learn from
DPAGG outputs every batch (post-processing), conv2* by DP-SGD every μ batches (Fig. 7), G through D
without aggregation (D̂). ``privacy.accounting=paper`` runs Algorithm 1 as published (not DP, see
accounting.PAPER_NOTES); ``sound`` trains all of C and conv2* by DP-SGD on per-sample losses and accounts
conv2* + DPAGG as one sampling event per group of μ batches.
"""
from dpgen.dpaf.train import train

__all__ = ["train"]
