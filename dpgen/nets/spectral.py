"""Spectral normalisation (Miyato et al. 2018) for networks written as pure functions of a parameter dict.

The singular-vector estimates ``u`` are explicit state next to the parameters, so one code path serves a single
network and a ``torch.func.vmap``-ed stack of many (:class:`dpgen.ensemble.NetStack`): :func:`power_iteration`
updates ``u`` outside the differentiated forward, :func:`sn_weight` divides a weight by its estimated spectral norm.
Used by the GS-WGAN/DPAC/EFSGD discriminators, classifier and encoders.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from dpgen.core.precision import full_precision

Params = dict[str, torch.Tensor]


def sn_init(p: Params, g: torch.Generator) -> Params:
    """Initial left-singular-vector estimates for every spectrally normalised weight (keys ending in .w)."""
    return {k: F.normalize(torch.randn(p[k].shape[0], generator=g, device=g.device), dim=0)
            for k in p if k.endswith(".w")}


@torch.no_grad()
def power_iteration(p: Params, u: Params) -> Params:
    """One power-iteration step per weight (torch's spectral_norm does the same per training forward).

    Autocast off: the vectors are state kept across steps in the weights' dtype (precision=bf16 would
    compute them in bf16 and the stack could not store them)."""
    new = {}
    with full_precision():
        for k, uk in u.items():
            w = p[k].reshape(p[k].shape[0], -1)
            v = F.normalize(w.t() @ uk, dim=0, eps=1e-12)
            new[k] = F.normalize(w @ v, dim=0, eps=1e-12)
    return new


def sn_weight(w: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """w / σ̂(w), σ̂ = uᵀ W v from the current estimate u (not differentiated through u or v)."""
    wm = w.reshape(w.shape[0], -1)
    v = F.normalize(wm.t() @ u, dim=0, eps=1e-12).detach()
    wv = wm @ v  # bf16 under autocast (the private generator step); the dot needs u in its dtype
    sigma = torch.dot(u.detach().to(wv.dtype), wv)
    return w / sigma
