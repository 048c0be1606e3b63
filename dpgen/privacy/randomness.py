"""The randomness a privacy analysis treats as random: secret generators and the one Gaussian-noise helper.

A DP guarantee holds over the mechanism's randomness. If anyone can replay that randomness (a generator
seeded from the run's public ``seed``), the mechanism is deterministic and its ε is infinite: an attacker
who knows every other record re-runs the public config without the target record and compares. So every
draw an analysis treats as random (Poisson or uniform sampling, the partition drawn at an iteration, every
noise) comes from a :class:`SecretGenerator`, seeded from OS entropy when a run starts
(:class:`dpgen.core.streams.RandomStreams`). Mechanisms call :func:`require_secret` on what they are
handed, so a public stream routed to a mechanism is an error at its first draw, never a silent replay.

:func:`gaussian_noise` is the only place dpgen draws Gaussian noise for a mechanism. With the stream's
``secure_noise`` set it sums several normal draws, as opacus' ``secure_mode`` (Holohan & Braghin 2021,
Sec. 5.1, against the floating-point attack of Mironov 2012 / Jin et al. 2021, arXiv 2112.05307). What
neither setting defends against: torch's generators (mt19937 on the CPU, Philox on CUDA) are not
cryptographic PRNGs; an attacker who sees enough raw draws of one stream could in principle recover its
state. dpgen never releases raw draws, only noisy sums of them (docs/privacy.md, "Threat model").
"""
from __future__ import annotations

import hashlib
import math
import secrets
from typing import Sequence

import torch

from dpgen.core.precision import noise_dtype

__all__ = ["SecretGenerator", "PublicRandomnessError", "SECURE_DRAWS", "derive_seed", "secret_generator",
           "require_secret", "gaussian_noise"]

#: normal draws summed per coordinate by secure noise: 2n with n = 2, as opacus (Holohan & Braghin 2021,
#: Sec. 5.1: the attack's complexity grows from 2^p with one draw to 2^(p(2n-1)), p the mantissa bits)
SECURE_DRAWS = 4


class PublicRandomnessError(RuntimeError):
    """A mechanism was handed a generator whose seed is public (or none). A bug in dpgen, never user input."""


class SecretGenerator(torch.Generator):
    """A ``torch.Generator`` whose seed no released file holds. The only kind of generator dpgen's privacy
    mechanisms accept (:func:`require_secret`).

    ``secure_noise``: :func:`gaussian_noise` draws from this stream with the floating-point-robust sum of
    :data:`SECURE_DRAWS` normals (the run's ``privacy.secure_noise``).
    """

    secure_noise: bool = False

    def fork(self, index: int) -> "SecretGenerator":
        """An independent secret stream keyed by this stream's seed and ``index`` (draws nothing from this one):
        for samplers that must seek (step s of a phase depends on (stream, s) only, so a resumed run draws the
        batches of the uninterrupted one)."""
        return secret_generator(self.device, derive_seed(self.initial_seed(), f"fork{int(index)}"), self.secure_noise)


def derive_seed(root: int | str, name: str) -> int:
    """A 63-bit seed for stream ``name`` under ``root`` (keyed BLAKE2b; independent streams for distinct names)."""
    key = str(root).encode()
    digest = hashlib.blake2b(name.encode(), digest_size=8, key=key[:64]).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def secret_generator(device: torch.device | str = "cpu", seed: int | None = None,
                     secure_noise: bool = False) -> SecretGenerator:
    """A :class:`SecretGenerator` on ``device``; ``seed`` None draws one from OS entropy (``secrets``).

    A fixed ``seed`` is for tests and ``privacy.noise_seed`` (a run that says it has no DP guarantee).
    """
    g = SecretGenerator(device=device)
    g.manual_seed(secrets.randbits(63) if seed is None else int(seed))
    g.secure_noise = bool(secure_noise)
    return g


def require_secret(generator: object, mechanism: str) -> SecretGenerator:
    """``generator`` if it is a :class:`SecretGenerator`; else :class:`PublicRandomnessError` naming ``mechanism``."""
    if not isinstance(generator, SecretGenerator):
        what = "no generator (torch's global RNG)" if generator is None else f"a public {type(generator).__name__}"
        raise PublicRandomnessError(
            f"{mechanism} was handed {what}; its randomness must come from a secret stream (run.secret_rng), "
            "or anyone who replays the public config replays the mechanism")
    return generator


def gaussian_noise(shape: Sequence[int] | torch.Size, std: float, generator: SecretGenerator, *,
                   device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                   mechanism: str = "Gaussian noise") -> torch.Tensor:
    """N(0, std² I) of ``shape`` from the secret ``generator`` (on its device unless ``device`` is given).

    Secure noise (``generator.secure_noise``): Σ_{j<4} N(0, 1) · std/2, the same distribution, robust to
    the floating-point attack on a single draw (opacus ``_generate_noise(secure_mode=True)``).

    A reduced-precision ``dtype`` (bf16, fp16: a sum computed under ``precision=bf16``) is drawn in fp32
    instead (:func:`dpgen.core.precision.noise_dtype`): the std the analysis assumes, and the secure sum of
    draws, need fp32's mantissa; adding fp32 noise to a bf16 sum gives an fp32 release.
    """
    g = require_secret(generator, mechanism)
    dev = g.device if device is None else device
    dtype = noise_dtype(dtype)
    noise = torch.randn(tuple(shape), generator=g, device=dev, dtype=dtype)
    if g.secure_noise:
        for _ in range(SECURE_DRAWS - 1):
            noise.add_(torch.randn(tuple(shape), generator=g, device=dev, dtype=dtype))
        return noise.mul_(float(std) / math.sqrt(SECURE_DRAWS))
    return noise.mul_(float(std))
