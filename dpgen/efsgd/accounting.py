"""Privacy accounting of EFSGD generator iterations (dpac's, with more release paths).

As in dpac (:mod:`dpgen.gswgan.accounting`), one generator iteration samples partitions at rate q
(m/K with Poisson sampling, 1/K for the paper's one draw) and releases, per path, B per-sample rows, each with ℓ2 sensitivity 2·C (C = C1 for
gradients, C_z for the encoder's latent codes) and noise std 2·C·z (times DiceSGD's factor with
error feedback, whose cost the ledger takes to be that of the plain Gaussian, see
:mod:`dpgen.efsgd.sanitizer`). Joint sensitivity 2C·sqrt(P·B): each path is recorded as one
Gaussian z/sqrt(B) inside one sampled event. Paths per iteration:

* ``D``   — discriminator gradient, always;
* ``C``   — classifier gradient, from t_c on (when the classifier is on);
* ``E``   — reconstruction gradient ∇_{G(u)} γ‖G(u) − x‖² (when ``recon``);
* ``code``— the privatised encoder input u = clip([μ(x), onehot(y)], C_z) + noise (when ``recon``
  with ``encoder.code=private``): G's Jacobian is evaluated at u, so u is a release too.

``paper`` mode: EFSGD adopts GS-WGAN's analysis ([27], autodp): B·T compositions at multiplier z,
sampled without replacement at 1/K, Mironov conversion, D path only (dpac's ``paper`` numbers).
"""
from __future__ import annotations

import math
from typing import Callable


from dpgen.gswgan.accounting import paper_epsilon_fn as dpac_paper_epsilon_fn
from dpgen.privacy import LedgerEntry

ENTRY = "efsgd.generator"


def paths_at(it: int, c_start: int | None, recon: bool, private_code: bool) -> int:
    """Number of Gaussian releases (paths) in generator iteration ``it``."""
    return 1 + int(c_start is not None and it >= c_start) + (1 + int(private_code) if recon else 0)


def iteration_entries(z: float, k: int, batch: int, iters: int, c_start: int | None, recon: bool,
                      private_code: bool, start: int = 0, per_iter: int = 1) -> list[LedgerEntry]:
    """Sound ledger entries for iterations start..iters−1: one entry per run of equal path counts, each
    sampling partitions at rate ``per_iter``/K."""
    zp, q = z / math.sqrt(batch), min(1.0, per_iter / k)
    out: list[LedgerEntry] = []
    cuts = sorted({start, iters} | ({c_start} if c_start is not None and start < c_start < iters else set()))
    for a, b in zip(cuts[:-1], cuts[1:]):
        if b > a:
            out.append(LedgerEntry(ENTRY, [zp] * paths_at(a, c_start, recon, private_code), "poisson", q,
                                   count=b - a))
    return out


def paper_epsilon_fn(batch: int, z_scale: float = 1.0, per_iter: int = 1) -> Callable[[list[LedgerEntry], float], float]:
    """``ledger.paper_epsilon``: GS-WGAN's count (B compositions per iteration of the first, D, path).

    ``z_scale`` maps the D path's recorded multiplier back to the paper's z (the entries record DiceSGD's
    noise ÷ the per-row sensitivity 2·(C1 + C2), see :mod:`dpgen.efsgd.sanitizer`)."""
    return dpac_paper_epsilon_fn(batch, entry=ENTRY, z_scale=z_scale, per_iter=per_iter)
