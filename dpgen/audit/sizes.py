"""How many canaries and guesses an audit takes: the defaults and the caps of each mechanism family.

A canary costs a coordinate, not a training example (:mod:`dpgen.audit.hooks`), so an audit takes as many as the
run holds cheaply (``audit.canaries=null``):

=====================================  =================  ==========================================================
family                                 default m          cap
=====================================  =================  ==========================================================
DP-SGD (dpgan, feta, dpdm), DPAF       10,000             δ < 1/(N + m) (the canaries are records); 10^6
G-PATE (Confident-GNMax)               10,000             50,000: two reserved bins per canary in each query
GS-WGAN family (gswgan, dpac, efsgd)   K·⌊64·B / b⌋       K·⌊256·B / b⌋: b sanitiser canary rows per canary
                                       (quick: 3,200;     (4B; efsgd 4B(1 + C2/C1)²), at most 256·B per member
                                       efsgd 800)         (quick: 12,800; efsgd 3,200)
=====================================  =================  ==========================================================

Guesses (``audit.guesses=null``): k+ = k− = 2 % of m, but at least min(100, m/10), fixed before the run
(:func:`default_guesses`). The f-DP bound of a Gaussian or subsampled Gaussian mechanism with 10,000 canaries is
best near 2 % of m on each side at ε ≈ 4 and near 10 % at ε ≈ 1, only a few percent lower at 2 %; with fewer
canaries a few dozen guesses cannot show much (40 all right among 1,000 canaries cannot reject ε = 4), hence
the floor (tests/test_audit_fdp.py).
"""
from __future__ import annotations

from typing import Any

__all__ = ["BOUNDS", "DEFAULT_CANARIES", "GUESS_FRACTION", "GPATE_MAX_CANARIES", "audit_sizes", "default_guesses",
           "max_canaries", "ensemble_size", "sanitizer_rows"]

#: the lower bounds ``audit.bound`` picks from: the f-DP test (default) and Steinke, Nasr & Jagielski's
BOUNDS = ("fdp", "sn")
DEFAULT_CANARIES = 10_000
GUESS_FRACTION = 0.02
MIN_GUESSES = 100
GPATE_MAX_CANARIES = 50_000


def ensemble_size(cfg: Any) -> tuple[int, int] | None:
    """(K, B) of a GS-WGAN-family run (its block has ``num_discriminators``), else None."""
    block = cfg.get(str(cfg.method.hparams))
    if block is None or "num_discriminators" not in block:
        return None
    return int(block.num_discriminators), int(block.batch_size)


def sanitizer_rows(cfg: Any) -> int:
    """b, the sanitiser rows of a GS-WGAN-family canary (:func:`dpgen.audit.hooks.sanitizer_rows_per_canary`
    for the run's per-row sensitivity: 2C, or efsgd's 2(C1 + C2) with error feedback)."""
    from dpgen.audit.hooks import sanitizer_rows_per_canary
    from dpgen.efsgd.sanitizer import row_sensitivity

    block = cfg.get(str(cfg.method.hparams))
    clip = float(block.clip)
    feedback = "C2" in block and bool(block.get("error_feedback", False))
    sensitivity = row_sensitivity(clip, float(block.C2), True) if feedback else 2.0 * clip
    return sanitizer_rows_per_canary(sensitivity, clip, int(block.batch_size))


def max_canaries(cfg: Any, budget: int | None = None) -> tuple[int, str] | None:
    """The method's cap on m and how to say it, or None (only δ and 10^6 bound it); ``budget``: the GS-WGAN
    family's extra rows per image row (default :data:`dpgen.audit.hooks.ROW_BUDGET`)."""
    ens = ensemble_size(cfg)
    if ens is not None:
        from dpgen.audit.hooks import ROW_BUDGET, max_sanitizer_canaries

        p, b, budget = cfg.method.hparams, sanitizer_rows(cfg), budget or ROW_BUDGET
        cap = max_sanitizer_canaries(ens[0], ens[1], b, budget)
        return cap, (f"{p}.num_discriminators * ({budget} * {p}.batch_size // {b}) = {cap} ({b} extra "
                     "sanitiser rows per canary)")
    if str(cfg.method.name) == "gpate":
        return GPATE_MAX_CANARIES, f"{GPATE_MAX_CANARIES} for gpate (two reserved vote bins per canary and query)"
    return None


def default_guesses(m: int) -> int:
    """k+ = k− for m canaries: 2 % of m, but at least min(100, m/10) (at least 1)."""
    return max(1, round(GUESS_FRACTION * m), min(MIN_GUESSES, int(m) // 10))


def audit_sizes(cfg: Any) -> tuple[int, int, int]:
    """(m, k+, k−) of ``cfg.audit``, the nulls resolved to the method's defaults."""
    a = cfg.audit
    if a.canaries is not None:
        m = int(a.canaries)
    else:
        from dpgen.audit.hooks import DEFAULT_ROW_BUDGET

        cap = max_canaries(cfg, DEFAULT_ROW_BUDGET) if ensemble_size(cfg) is not None else None
        m = cap[0] if cap is not None else DEFAULT_CANARIES
    default_k = default_guesses(m)
    k_in = int(a.guesses_in) if a.get("guesses_in") is not None else default_k
    k_out = int(a.guesses_out) if a.get("guesses_out") is not None else default_k
    return m, k_in, k_out
