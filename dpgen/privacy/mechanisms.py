"""Noisy releases that record themselves in the privacy ledger.

Sensitivity convention (add/remove-one neighbouring data sets, the relation
used by the ledger; Abadi et al. 2016, Mironov, Talwar & Zhang 2019): two data
sets are neighbours if one is the other plus one extra example.  For a sum
``f(D) = sum_{x in D} g(x)`` with every ``||g(x)||_2 <= C`` the L2 sensitivity
is ``max ||f(D) - f(D')||_2 = C`` (the extra example's contribution).  Under
replace-one adjacency the same sum would have sensitivity ``2C``.
"""

from __future__ import annotations

import math
from typing import Union

import torch

from dpgen.core.precision import at_least_fp32, full_precision
from dpgen.privacy.events import EventBuilder
from dpgen.privacy.ledger import PrivacyLedger
from dpgen.privacy.randomness import SecretGenerator, gaussian_noise, require_secret

__all__ = ["clip_rows", "gaussian_sum_query"]


def clip_rows(x: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Scale each row ``x[i]`` (all dims but the first flattened) to L2 norm at most ``max_norm``.

    ``x[i] * min(1, max_norm / ||x[i]||_2)`` -- the per-example clipping of
    Abadi et al. 2016 (Alg. 1).  Rows already inside the ball are unchanged;
    up to floating-point rounding (relative ~1e-7 in float32) clipped rows have
    norm exactly ``max_norm``.

    Reduced-precision rows (bf16, fp16, e.g. under ``precision=bf16``) are clipped in fp32 and returned in
    fp32, with autocast off: a norm or a clipped row rounded to bf16 may exceed ``max_norm`` by up to 2^-8
    relative, which the sensitivity bound does not allow.
    """
    max_norm = float(max_norm)
    if not math.isfinite(max_norm) or max_norm <= 0.0:
        raise ValueError(f"max_norm must be positive and finite, got {max_norm}")
    if x.dim() == 0:
        raise ValueError("clip_rows needs a tensor with a leading row dimension")
    x = at_least_fp32(x)
    if x.shape[0] == 0:
        return x.clone()
    with full_precision():
        norms = x.reshape(x.shape[0], -1).norm(p=2, dim=1)
        tiny = torch.finfo(norms.dtype).tiny if norms.dtype.is_floating_point else 1e-30
        factor = (max_norm / norms.clamp_min(tiny)).clamp(max=1.0)
        return x * factor.reshape((-1,) + (1,) * (x.dim() - 1)).to(x.dtype)


def gaussian_sum_query(
    values: torch.Tensor,
    *,
    sensitivity: float,
    noise_multiplier: float,
    record: Union[PrivacyLedger, EventBuilder],
    name: str | None = None,
    sampling: str = "none",
    sampling_rate: float = 1.0,
    clip_norm: float | None = None,
    generator: SecretGenerator,
) -> torch.Tensor:
    """Release ``sum_i values[i] + N(0, (noise_multiplier * sensitivity)^2 I)`` and record it.

    The Gaussian mechanism (Dwork & Roth 2014, Sec. 3.5.3; its subsampled RDP
    per Mironov, Talwar & Zhang 2019).  ``sensitivity`` is the add/remove-one
    L2 sensitivity of the sum, i.e. a bound on ``||values[i]||_2`` for any
    single example (see the module docstring; it is NOT ``2C``, which would be
    replace-one).  With ``clip_norm`` the rows are first clipped with
    :func:`clip_rows`, and then ``sensitivity >= clip_norm`` is required
    (``ValueError`` otherwise).  Without ``clip_norm`` the caller guarantees
    the bound (e.g. one-hot or [0,1]-bounded features).

    ``record`` is either the :class:`PrivacyLedger` (an entry ``name`` with
    ``sampling``/``sampling_rate`` is recorded, merging with the previous
    identical one) or an open :class:`EventBuilder` from
    ``ledger.sampled_event(...)`` (the release is added to that sampled event;
    ``noise_multiplier=0`` is the ``eps=inf`` reference: recorded, epsilon infinite;
    ``sampling``/``sampling_rate``, if given, must match the event's).  The
    sampling itself (e.g. a Poisson data loader) is the caller's job; this
    only records it. The noise comes from the secret ``generator`` (:func:`gaussian_noise`).
    """
    require_secret(generator, name or "gaussian_sum_query")
    if not isinstance(values, torch.Tensor) or values.dim() == 0:
        raise ValueError("values must be a tensor with a leading example dimension")
    sensitivity = float(sensitivity)
    noise_multiplier = float(noise_multiplier)
    if not math.isfinite(sensitivity) or sensitivity <= 0.0:
        raise ValueError(f"sensitivity must be positive and finite, got {sensitivity}")
    if not math.isfinite(noise_multiplier) or noise_multiplier < 0.0:
        raise ValueError(f"noise_multiplier must be >= 0 and finite, got {noise_multiplier}")
    if clip_norm is not None and sensitivity < float(clip_norm):
        raise ValueError(f"sensitivity={sensitivity} is smaller than clip_norm={clip_norm}; the DP guarantee would not hold")
    if isinstance(record, EventBuilder):
        if (sampling, float(sampling_rate)) != ("none", 1.0) and (sampling, float(sampling_rate)) != (
            record.sampling,
            record.sampling_rate,
        ):
            raise ValueError(
                f"gaussian_sum_query got sampling={sampling!r}, sampling_rate={sampling_rate} inside sampled event "
                f"{record.name!r} ({record.sampling!r}, {record.sampling_rate})"
            )
    elif not isinstance(record, PrivacyLedger):
        raise TypeError(f"record must be a PrivacyLedger or an EventBuilder, got {type(record).__name__}")

    # the sum and the noise in at least fp32 (precision=bf16 leaves reduced-precision values to the mechanism)
    x = at_least_fp32(values) if values.dtype.is_floating_point else values.to(torch.get_default_dtype())
    with full_precision():
        if clip_norm is not None:
            x = clip_rows(x, float(clip_norm))
        total = x.sum(dim=0)
        noise = gaussian_noise(total.shape, noise_multiplier * sensitivity, generator, device=total.device,
                               dtype=total.dtype, mechanism=name or "gaussian_sum_query")
        out = total + noise

    if isinstance(record, EventBuilder):
        record.add_gaussian(noise_multiplier)
    else:
        record.record(name or "gaussian_sum_query", [noise_multiplier], sampling=sampling, sampling_rate=sampling_rate)
    return out
