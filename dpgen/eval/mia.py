"""Full black-box membership inference against a generator (GAN-Leaks, Chen et al. CCS 2020, Sec. 5.1).

The attacker sees only synthetic samples. A candidate x is scored by its distance to the nearest
synthetic sample, ``R(x) = min_j ||x - s_j||_2`` (GAN-Leaks Eq. 4 with the L2 distance and no
calibration): a memorised training image has a near-copy among the samples, so small distances mean
"member". DPAF reports the resulting AUC-ROC in Table XVII (1.0 for SGD training, ~0.5 for DPAF).
"""
from __future__ import annotations

import numpy as np
import torch


def _flat(x) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x)
    return t.reshape(len(t), -1).double()


def nearest_distances(candidates, synthetic, cand_labels=None, syn_labels=None, chunk: int = 4096) -> np.ndarray:
    """L2 distance from each candidate to its nearest synthetic sample (GAN-Leaks' full black-box score).

    With labels, a candidate is only compared with synthetic samples of its own class (the attacker of a
    conditional generator draws samples of the candidate's label). Inputs are any arrays of equal
    per-sample size (uint8 images are compared on their 0..255 values; the scale does not change the AUC).
    A candidate whose class has no synthetic sample gets +inf.
    """
    c, s = _flat(candidates), _flat(synthetic)
    if c.shape[1] != s.shape[1]:
        raise ValueError(f"candidates have {c.shape[1]} values per sample, synthetic samples {s.shape[1]}")
    if (cand_labels is None) != (syn_labels is None):
        raise ValueError("give labels for both candidates and synthetic samples, or for neither")
    out = np.full(len(c), np.inf)
    if cand_labels is None:
        groups = [(np.arange(len(c)), s)]
    else:
        cl, sl = np.asarray(cand_labels), np.asarray(syn_labels)
        groups = [(np.flatnonzero(cl == k), s[torch.as_tensor(sl == k)]) for k in np.unique(cl)]
    for rows, pool in groups:
        if len(rows) == 0 or len(pool) == 0:
            continue
        best = torch.full((len(rows),), float("inf"), dtype=torch.float64)
        for i in range(0, len(pool), chunk):  # chunks keep the distance matrix small for large pools
            best = torch.minimum(best, torch.cdist(c[rows], pool[i:i + chunk]).min(dim=1).values)
        out[rows] = best.numpy()
    return out


def auc(member_scores, nonmember_scores) -> float:
    """AUC-ROC of "higher score = member": P(score_member > score_nonmember) + ½ P(tie).

    Computed exactly as the Mann–Whitney U statistic over all member/non-member pairs, so it needs no
    threshold grid: 1.0 for a perfect separation, 0.5 for identical distributions, 0.0 for a reversed one.
    """
    m = np.asarray(member_scores, dtype=np.float64).ravel()
    n = np.asarray(nonmember_scores, dtype=np.float64).ravel()
    if len(m) == 0 or len(n) == 0:
        raise ValueError("AUC needs at least one member and one non-member score")
    both = np.concatenate([m, n])
    order = np.argsort(both, kind="mergesort")
    ranks = np.empty(len(both))
    sorted_vals = both[order]
    # average ranks over ties (1-based), so tied pairs count 1/2
    i = 0
    while i < len(both):
        j = i
        while j + 1 < len(both) and sorted_vals[j + 1] == sorted_vals[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    u = ranks[: len(m)].sum() - len(m) * (len(m) + 1) / 2.0
    return float(u / (len(m) * len(n)))


def gan_leaks_auc(members, nonmembers, synthetic, member_labels=None, nonmember_labels=None,
                  syn_labels=None) -> dict:
    """Membership AUC of the nearest-synthetic-sample attack; the score is minus the distance."""
    d_in = nearest_distances(members, synthetic, member_labels, syn_labels)
    d_out = nearest_distances(nonmembers, synthetic, nonmember_labels, syn_labels)
    return {"auc": auc(-d_in, -d_out), "member_dist_mean": float(np.mean(d_in)),
            "nonmember_dist_mean": float(np.mean(d_out))}
