"""The GS-WGAN gradient sanitiser (Chen et al. 2020, Alg. 1; DPAC paper eq. 5 and 9).

G's update needs ∇_{G(z)} L_G (data dependent: it goes through D_k / C, trained on partition k)
times the local Jacobian J_θ G(z) (data independent). A :class:`Sanitizer` is an identity on the
generated batch whose *backward* replaces each sample's incoming gradient g_i = ∂ℓ_i/∂x_i by
``clip(g_i, C) + N(0, (2·C·z)² I)`` and then averages over the batch (÷B, post-processing).
2C is the per-sample sensitivity: changing one record changes D_k (and C), so g_i may move
anywhere in the C-ball. Nothing else that depends on the data reaches G.

With a ``basis`` U (d × L, orthonormal columns, public: ``dpac.grad_basis``, the L lowest 2-D DCT atoms; a
research option, not in the papers) the sanitiser releases each row's L coefficients instead of its d pixels:
``clip(Uᵀg_i, C) + N(0, (2·C·z)² I_L)``, mapped back to the image by U (post-processing). The sensitivity (2C
per row) and the noise std are those of the pixel release, so the ledger is unchanged, but the noise lives in
L instead of d dimensions (and G then learns only the part of D's gradient inside span(U)).

Under ``precision=bf16`` the generated batch, hence g, may be bf16: the clipping, the noise and the release are
computed in fp32 with autocast off (:mod:`dpgen.core.precision`), and only the released gradient is cast back
to g's dtype for G's backward pass (autograd requires a hook to keep the dtype; rounding the noisy release
is post-processing).
"""
from __future__ import annotations

import torch

from dpgen.core.precision import at_least_fp32, full_precision
from dpgen.privacy import clip_rows
from dpgen.privacy.randomness import SecretGenerator, gaussian_noise, require_secret


class Sanitizer:
    """Backward hook that clips and noises per-sample gradients w.r.t. the generated images.

    ``noise_multiplier`` z is per sample: noise std ``2·clip·z`` per coordinate. ``last_norms`` (pre-clip norms)
    and ``last_clipped`` (the clipped rows, M·B of them), ``last_signal`` (their sum per image) and
    ``last_release`` (signal + noise, what leaves, before ÷(scale·B); the L coefficients per row when a ``basis``
    is given) are kept for tests and logging. The noise comes from the secret ``generator``.
    """

    audit = None  # an audit run's canaries (dpgen.audit.hooks.SanitizerCanaries); None computes exactly as before

    def __init__(self, clip: float, noise_multiplier: float, generator: SecretGenerator,
                 basis: torch.Tensor | None = None) -> None:
        if clip <= 0 or noise_multiplier < 0:
            raise ValueError(f"sanitizer needs clip > 0 and noise_multiplier >= 0, got {clip}, {noise_multiplier}")
        self.clip, self.noise_multiplier = float(clip), float(noise_multiplier)
        self.generator = require_secret(generator, f"{type(self).__name__} noise")
        self.basis = basis
        self.last_norms: torch.Tensor | None = None
        self.last_clipped: torch.Tensor | None = None
        self.last_release: torch.Tensor | None = None
        self.calls = 0

    @property
    def noise_std(self) -> float:
        return 2.0 * self.clip * self.noise_multiplier

    def sanitize(self, g: torch.Tensor) -> torch.Tensor:
        """Eq. (5) on every row of ``g`` [B, ...]: clip each row to ``clip``, add Gaussian noise; then ÷B.
        With a ``basis``, on each row's coefficients Uᵀg_i, mapped back by U after the noise.
        In at least fp32; the result in g's dtype (see the module docstring)."""
        return self.sanitize_sum(g.unsqueeze(0), 1.0)

    def sanitize_sum(self, g: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """The release of an iteration that sampled M partitions: ``g`` [M, B, ...] holds member j's gradient
        w.r.t. generated image i in row (j, i). Each row is clipped to ``clip``, the M clipped rows of image i are
        summed, and ONE Gaussian N(0, (2·clip·z)² I) per image is added; the result is divided by ``scale`` (the
        expected M, public) and B. A record of partition k moves only member k's B rows, each by at most 2·clip,
        so the B released rows move by at most 2·clip·√B, whatever M is (M = 0 releases the noise alone).
        M = 1 and ``scale`` 1 is the paper's Eq. (5)."""
        dtype, (m, b), shape = g.dtype, g.shape[:2], g.shape[2:]
        with full_precision():
            g = at_least_fp32(g).reshape(m * b, *shape)
            rows = g if self.basis is None else g.flatten(1) @ self.basis
            self.last_norms = rows.detach().flatten(1).norm(dim=1)
            clipped, signal, release = self._release(rows, (m, b))
            self.last_clipped, self.last_signal = clipped.detach(), signal.detach()
            self.last_release = release.detach()
            self.calls += 1
            if self.audit is not None:  # the canaries' rows: clipped, summed and noised alike, then scored
                canary_rows, positions = self.audit.rows(rows.dtype)
                self.audit.release(self._release(canary_rows, (m, self.audit.rows_per_member), positions,
                                                 self.audit.size)[2])
            if self.basis is not None:
                release = release @ self.basis.T
            return (release.reshape(b, *shape) / (float(scale) * b)).to(dtype)

    def _release(self, rows: torch.Tensor, members: tuple[int, int], positions: torch.Tensor | None = None,
                 size: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Eq. (5) on the rows of ``members`` = (M, B) members (member j's B rows after member j−1's): every row
        clipped to ``clip``, the members' clipped rows summed per row index (``positions``: summed into a vector of
        ``size`` by each row's position, an audit's canary rows), one Gaussian N(0, noise_std² I) added. Returns
        (clipped, signal, release)."""
        clipped = clip_rows(rows, self.clip)
        if positions is None:
            signal = clipped.reshape(*members, *rows.shape[1:]).sum(0)
        else:
            signal = clipped.new_zeros(size).index_add_(0, positions, clipped.reshape(-1))
        noise = gaussian_noise(signal.shape, self.noise_std, self.generator, device=rows.device, dtype=rows.dtype,
                               mechanism="sanitizer noise")
        release = signal + noise
        return clipped, signal, release

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Identity in the forward pass; the backward pass of the returned tensor is sanitised."""
        out = x.view_as(x)
        out.register_hook(self.sanitize)
        return out
