"""DPAF's budget split, noise calibration and budget guards, for ``privacy.accounting=sound|paper``.

Releases (all in ONE ledger, add/remove-one, Poisson sampling):

* ``dpaf.conv1``: phase-1 DP-SGD of C (noise multiplier z1, rate q1 = B_C/N), one entry per step.
* ``dpaf.conv2+dpagg``: one per group of μ D batches. One Poisson sample of rate ρ = μB/N is split into
  μ disjoint sub-batches; the μ DPAGG outputs (z3, sensitivity √m·p: each record is in one sub-batch) and
  the conv2* DP-SGD gradient (z2, sensitivity C) are both computed from that one sample, so they are
  ONE sampling event with noise multipliers [z3, z2] (σ_eff = (z3⁻² + z2⁻²)^-½).

``paper`` reproduces Theorem 6's sum of parts: ε1 + ε2 + ε3, each part accounted on its own, DPAGG as
T3 = μ·G independently sampled batches of rate B/N and conv2* as G batches of rate ρ.
"""
from __future__ import annotations

from dataclasses import dataclass

from dpgen.errors import DpgenError
from dpgen.privacy import LedgerEntry, PrivacyLedger, calibrate_noise_multiplier, compute_epsilon

CONV1, GROUP = "dpaf.conv1", "dpaf.conv2+dpagg"
PAPER_NOTES = [
    "dpaf paper accounting (Theorem 6) is not a valid DP guarantee: the C-phase loss predicts the class "
    "proportions of a whole batch, so it couples all samples of the batch, and conv2/conv3/FC of C train "
    "non-privately on every sample; per-sample clipping of conv1 therefore does not bound its sensitivity.",
    "dpaf paper accounting: likewise the conv2* DP-SGD loss L'_BCE goes through the (noise-free) aggregation "
    "over each batch, which couples samples, so per-sample clipping does not bound conv2*'s sensitivity.",
    "dpaf paper accounting: epsilon is the paper's sum of parts eps1 + eps2 + eps3, each part converted "
    "separately, with DPAGG and conv2* treated as independently sampled although they share batches; "
    "sound_epsilon composes what was released (it still assumes per-sample sensitivities, which do not hold).",
]


@dataclass
class Split:
    """Per-part budgets; ``last`` is the part ('conv2' or 'dpagg') that takes the rest (×)."""

    eps1: float
    eps2: float
    eps3: float
    last: str


def parse_split(split, unit: str, eps: float, has_conv1: bool) -> Split:
    """(x1, x2, x3) with ``unit=eps`` (absolute, the paper's "(x1, ×, x3)") or ``fraction`` ("(x1%, x2%, x3%)").

    ``null`` (×) marks the part that gets the rest; conv1's share is 0 when conv1 is not trained in phase 1.
    """
    if unit not in ("eps", "fraction"):
        raise DpgenError(f"dpaf.split_unit must be eps or fraction, got {unit!r}")
    try:
        vals = [None if v is None else float(v) for v in split]
    except (TypeError, ValueError):
        raise DpgenError(f"dpaf.split must be [x1, x2, x3] of numbers or null, got {split!r}") from None
    if len(vals) != 3 or any(v is not None and v < 0 for v in vals):
        raise DpgenError(f"dpaf.split must be [x1, x2, x3] of non-negative numbers or null, got {list(split)}")
    vals = [None if v is None else (v * eps if unit == "fraction" else v) for v in vals]
    x1, x2, x3 = vals
    if not has_conv1:
        x1 = 0.0
    elif x1 is None or x1 <= 0:
        raise DpgenError("dpaf.split[0] (conv1's budget) must be > 0 when dpaf.conv1=transfer")
    if x2 is None and x3 is None:
        raise DpgenError("dpaf.split: give a budget to conv2* or to DPAGG (at most one of them null)")
    last = "conv2" if x2 is None or x3 is not None else "dpagg"
    rest = eps - x1 - (x3 if last == "conv2" else x2)
    if last == "conv2" and x2 is None:
        x2 = rest
    if last == "dpagg":
        x3 = rest
    if min(x2, x3) <= 0 or x1 + x2 + x3 > eps * (1 + 1e-9):
        raise DpgenError(f"dpaf.split {list(split)} ({unit}) gives eps1={x1:g}, eps2={x2:g}, eps3={x3:g}: "
                         f"each must be > 0 and they must sum to at most eps={eps:g}")
    return Split(x1, x2, x3, last)


def parse_noise_multipliers(value, has_conv1: bool) -> tuple[float | None, float, float] | None:
    """``dpaf.noise_multipliers``: null (calibrate to the split) or fixed ``[z1, z2, z3]`` (conv1's DP-SGD,
    conv2*'s DP-SGD, DPAGG); z1 may be null when conv1 is not trained in phase 1. With fixed values the
    budget guards, not the plan, decide how many steps run."""
    if value is None:
        return None
    try:
        zs = [None if v is None else float(v) for v in value]
    except (TypeError, ValueError):
        raise DpgenError(f"dpaf.noise_multipliers must be null or [z1, z2, z3], got {value!r}") from None
    if len(zs) != 3 or any(z is not None and not (0 <= z < float("inf")) for z in zs) or None in zs[1:]:
        raise DpgenError(f"dpaf.noise_multipliers must be null or [z1, z2, z3] of finite numbers >= 0, got {value!r}")
    if has_conv1 and zs[0] is None:
        raise DpgenError("dpaf.noise_multipliers: z1 (conv1's DP-SGD) is needed when dpaf.conv1=transfer")
    return zs[0], zs[1], zs[2]


def paper_parts(entries: list[LedgerEntry], mu: int) -> dict[str, list[LedgerEntry]]:
    """The ledger split the way Theorem 6 counts it (see module docstring)."""
    parts: dict[str, list[LedgerEntry]] = {"conv1": [], "conv2": [], "dpagg": []}
    for e in entries:
        if e.name == GROUP:
            z3, z2 = e.noise_multipliers
            parts["dpagg"].append(LedgerEntry("dpaf.dpagg", [z3], "poisson", e.sampling_rate / mu, e.count * mu))
            parts["conv2"].append(LedgerEntry("dpaf.conv2", [z2], "poisson", e.sampling_rate, e.count))
        else:
            parts["conv1"].append(e)
    return parts


def paper_epsilon_fn(mu: int, accountant: str):
    """``ledger.paper_epsilon``: Σ over parts of each part's own ε (Theorem 6 as the paper applies it)."""
    def eps(entries: list[LedgerEntry], delta: float) -> float:
        return sum(compute_epsilon(p, delta, accountant=accountant) for p in paper_parts(entries, mu).values() if p)
    return eps


class Budget:
    """Calibration and guards. ``sound``: everything against the one ledger's target. ``paper``: each part
    against its own ε_i on a shadow ledger (the paper's accounting), while the main ledger records the
    releases as they happened."""

    def __init__(self, ledger: PrivacyLedger, split: Split, mu: int, q1: float, t1: int, q: float, groups: int,
                 fixed: tuple[float | None, float, float] | None = None):
        self.ledger, self.split, self.mu, self.fixed = ledger, split, mu, fixed
        self.q1, self.t1, self.q, self.rho, self.groups = q1, t1, q, min(1.0, mu * q), groups
        self.paper = ledger.accounting == "paper"
        if self.paper:
            ledger.paper_epsilon = paper_epsilon_fn(mu, ledger.accountant)
            for note in PAPER_NOTES:
                if note not in ledger.notes:
                    ledger.notes.append(note)

    def _cal(self, target: float, make, base=()) -> float:
        if self.ledger.privacy_off:
            return 0.0  # eps=inf: every part of the split is noiseless, whatever its share
        return calibrate_noise_multiplier(target, self.ledger.delta, make, base=list(base),
                                          accountant=self.ledger.accountant)

    def conv1_sigma(self) -> float:
        """z1 with ε(conv1's t1 steps) = ε1 (or the fixed z1)."""
        if self.fixed:
            return self.fixed[0]
        return self._cal(self.split.eps1, lambda z: [LedgerEntry(CONV1, [z], "poisson", self.q1, self.t1)])

    def group_sigmas(self) -> tuple[float, float]:
        """(z3, z2). sound: the non-rest part brings the ledger to ε1 + its ε (base = phase-1 entries), the rest
        part brings it to the total; paper: each alone to its ε_i. Fixed values are returned as they are."""
        if self.fixed:
            return self.fixed[2], self.fixed[1]
        s, g = self.split, self.groups

        def group(zs):
            return [LedgerEntry(GROUP, zs, "poisson", self.rho, g)]
        if self.paper:
            z3 = self._cal(s.eps3, lambda z: [LedgerEntry("dpaf.dpagg", [z], "poisson", self.rho / self.mu, g * self.mu)])
            z2 = self._cal(s.eps2, lambda z: [LedgerEntry("dpaf.conv2", [z], "poisson", self.rho, g)])
            return z3, z2
        base = list(self.ledger.entries)
        total = s.eps1 + s.eps2 + s.eps3
        if s.last == "conv2":
            z3 = self._cal(s.eps1 + s.eps3, lambda z: group([z]), base)
            z2 = self._cal(total, lambda z: group([z3, z]), base)
        else:
            z2 = self._cal(s.eps1 + s.eps2, lambda z: group([z]), base)
            z3 = self._cal(total, lambda z: group([z, z2]), base)
        return z3, z2

    # -- guards -----------------------------------------------------------------------------
    def _shadow(self, part: str, target: float) -> PrivacyLedger:
        target = self.ledger.target_epsilon if self.ledger.privacy_off else target
        sh = PrivacyLedger(self.ledger.delta, target_epsilon=target, accountant=self.ledger.accountant)
        sh.entries = list(paper_parts(self.ledger.entries, self.mu)[part])
        return sh

    def start_conv1(self, z1: float) -> None:
        self.z1 = z1
        src = self._shadow("conv1", self.split.eps1) if self.paper else self.ledger
        self.g1 = src.budget_guard(CONV1, [z1], "poisson", self.q1)

    def conv1_step(self) -> bool:
        """Consult the guard; record one conv1 step. False (nothing recorded) if the budget is spent."""
        if not self.g1.allows():
            return False
        self.g1.step()
        if self.paper:
            self.ledger.record(CONV1, [self.z1], "poisson", self.q1)
        return True

    def start_groups(self, z3: float, z2: float) -> None:
        self.zs = [z3, z2]
        if self.paper:
            self.g2 = self._shadow("conv2", self.split.eps2).budget_guard("dpaf.conv2", [z2], "poisson", self.rho)
            self.g3 = self._shadow("dpagg", self.split.eps3).budget_guard("dpaf.dpagg", [z3], "poisson",
                                                                          self.rho / self.mu)
        else:
            self.g2 = self.ledger.budget_guard(GROUP, self.zs, "poisson", self.rho)

    def group_step(self) -> bool:
        """Consult the guard(s); record one joint conv2*+DPAGG sampling event. False if the budget is spent."""
        if self.paper:
            if not (self.g2.allows() and self.g3.allows() and self.g3.remaining >= self.mu):
                return False
            self.g2.step()
            for _ in range(self.mu):
                self.g3.step()
            self.ledger.record(GROUP, self.zs, "poisson", self.rho)
            return True
        if not self.g2.allows():
            return False
        self.g2.step()
        return True
