"""Error-feedback gradient sanitiser (EFSGD Sec. 3.3/4.1, Eq. 7–11; DiceSGD, Zhang, Bu, Wu & Hong, ICLR 2024).

Per generator iteration each component c ∈ {d (discriminator), c (classifier), e (encoder)} sends
G the per-sample gradients g ∈ R^{B×d} w.r.t. its generated images. With error feedback the
released direction is (rows = generated samples, clipping per row as in dpac)::

    v_i = clip(g_i, C1) + clip(e[k, y_i], C2)         (Eq. 7)
    e[k, y] ← e[k, y] + mean_{i: y_i = y} (g_i − v_i)  (Eq. 8–11, one e per component)
    release = v + N(0, s² I),   then ÷B

Keying. The error states are kept per PARTITION k (the sampled discriminator's) and per CLASS y. Per
partition, because an error state shared by all partitions would carry partition j's unclipped residual
into the release of an iteration that sampled k, voiding the 1/K sampling of the ledger. Per class, because
a generated-sample slot holds a different (z, y) at every iteration, so per-slot states would add unrelated
images' residuals; the residual of class-y samples of D_k is the most stable thing to feed back to class-y
samples. With several samples of one class the mean residual is added, so e[k, y] ← e − clip(e, C2) + …
stays a contraction (a sum would feed the clipped error back n times).

Noise std s and its accounting (``noise_rule``):

* ``sensitivity`` (``privacy.accounting=sound``): changing a record of partition k can move both g_i and
  e[k, y_i], so each released row moves by at most 2·(C1 + C2): s = 2·(C1 + C2)·z, a Gaussian mechanism
  with multiplier z on the B rows. This is the argument dpac's sound ledger already makes for D_k (a hidden
  per-partition state bounded by clipping), so it does not rely on DiceSGD's theorem.
* ``dicesgd`` (``privacy.accounting=paper``, as the paper and DiceSGD's code ``optimizers_utils.py``):
  s = 2·C1·z·sqrt(1 + 2·C2/C1), charged as a plain Gaussian at z by DiceSGD's theorem (proved for DP-SGD on
  model parameters). The ledger still records s ÷ (2·(C1 + C2)) so ``sound_epsilon`` stays truthful.

Without error feedback both rules are dpac's: s = 2·C1·z, sensitivity 2·C1. ``e`` holds raw, unclipped
gradient information: it lives only here and in the (private) checkpoint, never in generator.pt.
"""
from __future__ import annotations

import math

import torch

from dpgen.core.precision import at_least_fp32, full_precision
from dpgen.gswgan.sanitizer import Sanitizer
from dpgen.privacy import clip_rows
from dpgen.privacy.randomness import SecretGenerator, gaussian_noise

NOISE_RULES = ("sensitivity", "dicesgd")


def row_sensitivity(clip: float, clip_error: float, error_feedback: bool = True) -> float:
    """ℓ2 sensitivity of one released row: 2·(C1 + C2) with error feedback, 2·C1 without."""
    return 2.0 * (clip + clip_error) if error_feedback else 2.0 * clip


def ef_noise_std(clip: float, clip_error: float, noise_multiplier: float, error_feedback: bool = True,
                 rule: str = "sensitivity") -> float:
    """Per-coordinate noise std: ``sensitivity`` rule z·row_sensitivity, ``dicesgd`` rule 2·C1·z·sqrt(1 + 2·C2/C1);
    2·C1·z without error feedback."""
    if rule not in NOISE_RULES:
        raise ValueError(f"noise rule must be one of {NOISE_RULES}, got {rule!r}")
    if not error_feedback:
        return 2.0 * clip * noise_multiplier
    if rule == "dicesgd":
        return 2.0 * clip * noise_multiplier * math.sqrt(1.0 + 2.0 * clip_error / clip)
    return row_sensitivity(clip, clip_error) * noise_multiplier


class ErrorFeedbackSanitizer(Sanitizer):
    """dpac's :class:`Sanitizer` plus error states ``error`` [parts, classes, ...] and a post-sanitisation weight.

    Call it as ``san(x, k, y)`` (a hook, one partition) or :meth:`sanitize_sum` (M sampled partitions ``k``):
    ``y`` the rows' labels.
    ``weight`` multiplies the released (clipped + noised) gradient — post-processing, so the loss
    weights of Eq. 15 (λ_c, γ_recon) act on G's update instead of being undone by clipping.
    ``last_clipped`` is clip(g, C1), ``last_error_clipped`` clip(e, C2), ``last_direction`` v (per row, M·B
    rows), ``last_signal`` v summed per image, ``last_release`` that + noise (before weight and ÷(scale·B)).
    """

    def __init__(self, clip: float, noise_multiplier: float, clip_error: float, error_feedback: bool = True,
                 weight: float = 1.0, generator: SecretGenerator | None = None, parts: int = 1, classes: int = 1,
                 rule: str = "sensitivity") -> None:
        super().__init__(clip, noise_multiplier, generator)
        if clip_error <= 0 or (rule == "dicesgd" and clip_error < clip):  # sound rule: any C2 > 0 (2(C1+C2)z)
            raise ValueError(f"error clip C2={clip_error} must be > 0, and >= C1={clip} under the dicesgd rule")
        ef_noise_std(clip, clip_error, noise_multiplier, error_feedback, rule)  # validates the rule
        self.clip_error, self.error_feedback, self.weight = float(clip_error), bool(error_feedback), float(weight)
        self.parts, self.classes, self.rule = int(parts), int(classes), rule
        self.error: torch.Tensor | None = None
        self.key: tuple[torch.Tensor, torch.Tensor] | None = None
        self.last_error_clipped: torch.Tensor | None = None
        self.last_direction: torch.Tensor | None = None

    @property
    def noise_std(self) -> float:
        return ef_noise_std(self.clip, self.clip_error, self.noise_multiplier, self.error_feedback, self.rule)

    @property
    def sensitivity(self) -> float:
        """ℓ2 sensitivity of one released row."""
        return row_sensitivity(self.clip, self.clip_error, self.error_feedback)

    @property
    def accounted_multiplier(self) -> float:
        """What one released row costs: noise std ÷ its sensitivity (z under the ``sensitivity`` rule)."""
        return self.noise_std / self.sensitivity

    def __call__(self, x: torch.Tensor, k: torch.Tensor | None = None, y: torch.Tensor | None = None) -> torch.Tensor:
        """Identity forward; the backward is sanitised with the error states of partition ``k``, classes ``y``."""
        if self.error_feedback and (k is None or y is None):
            raise ValueError("error feedback needs the sampled partition k and the rows' labels y")
        self.key = (k, y)
        return super().__call__(x)

    def update(self, g: torch.Tensor) -> torch.Tensor:
        """v = clip(g, C1) + clip(e[k, y], C2) for the rows ``g`` [B, ...] of the one partition k and labels y that
        :meth:`__call__` was given; e[k, y] += mean residual. Returns v (no noise). Without error feedback
        v = clip(g, C1). :meth:`update_members` with M = 1."""
        k, y = self.key if self.key is not None else (None, None)
        return self.update_members(g.unsqueeze(0), k, y)[0]

    def update_members(self, g: torch.Tensor, k: torch.Tensor | None, y: torch.Tensor | None,
                       feedback: bool = True) -> torch.Tensor:
        """v = clip(g, C1) + clip(e[k_j, y_i], C2) for every row (j, i) of ``g`` [M, B, ...] (member j, partition
        k_j); e[k_j, y] += member j's mean residual over its class-y rows. Returns v (no noise). Without error
        feedback v = clip(g, C1). In at least fp32, the error states included (called with autocast off by
        :meth:`sanitize_sum`; the states are hidden DP state that clipping must bound exactly). ``last_clipped``,
        ``last_error_clipped`` and ``last_direction`` keep the M·B rows, member j's after member j−1's.
        ``feedback=False`` (an audit's canary rows): clip(g, C1) only, no error state read or written, no diagnostics
        kept."""
        g = at_least_fp32(g.detach())
        m, b, shape = g.shape[0], g.shape[1], g.shape[2:]
        flat = g.reshape(m * b, *shape)
        clipped = clip_rows(flat, self.clip).reshape(g.shape)
        if not feedback:
            return clipped
        self.last_norms = flat.flatten(1).norm(dim=1)
        self.last_clipped = clipped.reshape(flat.shape)
        if not self.error_feedback:
            self.last_direction = self.last_clipped
            return clipped
        k = torch.as_tensor(k, device=g.device).reshape(-1)
        if self.error is None:
            self.error = torch.zeros((self.parts, self.classes, *shape), device=g.device, dtype=g.dtype)
        e_k = self.error.index_select(0, k)  # [M, classes, ...]
        e_clipped = clip_rows(e_k[:, y].reshape(m * b, *shape), self.clip_error).reshape(g.shape)
        v = clipped + e_clipped
        slot = (torch.arange(m, device=g.device).unsqueeze(1) * self.classes + y.unsqueeze(0)).reshape(-1)
        sums = torch.zeros((m * self.classes, *shape), device=g.device, dtype=g.dtype).index_add_(
            0, slot, (g - v).reshape(m * b, *shape))
        counts = torch.zeros(m * self.classes, device=g.device, dtype=g.dtype).index_add_(
            0, slot, torch.ones(m * b, device=g.device, dtype=g.dtype))
        e_k = e_k + (sums / counts.clamp_min(1.0).reshape(-1, *([1] * len(shape)))).reshape(e_k.shape)
        self.error.index_copy_(0, k, e_k)
        self.last_error_clipped, self.last_direction = e_clipped.reshape(flat.shape), v.reshape(flat.shape)
        return v

    def sanitize(self, g: torch.Tensor) -> torch.Tensor:
        """The hook of :meth:`__call__` (one partition, the paper's draw): :meth:`sanitize_sum` with M = 1."""
        k, y = self.key if self.key is not None else (None, None)
        return self.sanitize_sum(g.unsqueeze(0), k, y, 1.0)

    def sanitize_sum(self, g: torch.Tensor, k: torch.Tensor | None, y: torch.Tensor | None,
                     scale: float = 1.0) -> torch.Tensor:
        """The release of an iteration that sampled partitions ``k`` [M]: v (:meth:`update`) summed over the M
        members per generated image, plus ONE noise draw per image, weighted and ÷(``scale``·B); computed in at
        least fp32 and returned in g's dtype (as :meth:`Sanitizer.sanitize_sum`). A record of partition k_j moves
        only member j's rows, each by at most 2·(C1 + C2)."""
        dtype, (m, b), shape = g.dtype, g.shape[:2], g.shape[2:]
        with full_precision():
            g = at_least_fp32(g)
            v = self.update_members(g, k, y).sum(0)
            release = self._noisy(v)
            self.last_signal, self.last_release = v.detach(), release.detach()
            self.calls += 1
            if self.audit is not None:  # the canaries' rows: clipped to C1 (no feedback), summed, noised, scored
                canary_rows, positions = self.audit.rows(g.dtype)
                per = self.audit.rows_per_member
                clipped = self.update_members(canary_rows.view(m, per, 1), k, None, feedback=False)
                self.audit.release(self._noisy(clipped.new_zeros(self.audit.size).index_add_(
                    0, positions, clipped.reshape(-1))))
            return (self.weight * release.reshape(b, *shape) / (float(scale) * b)).to(dtype)

    def _noisy(self, v: torch.Tensor) -> torch.Tensor:
        """v + N(0, noise_std² I), one draw from the secret stream: the release of Eq. 7–11."""
        noise = gaussian_noise(v.shape, self.noise_std, self.generator, device=v.device, dtype=v.dtype,
                               mechanism="error-feedback sanitizer noise")
        return v + noise

    def state_dict(self) -> dict:
        return {"error": self.error}

    def load_state_dict(self, d: dict, device: torch.device | None = None) -> None:
        """Restore the error states (onto ``device``: checkpoints are loaded on the CPU)."""
        e = d.get("error")
        self.error = None if e is None else e.to(device if device is not None else e.device)
