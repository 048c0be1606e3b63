"""A run's random streams: public ones that ``seed`` fixes, secret ones that nobody can replay.

* ``public(name)``: seeded from (``seed``, name). Initialisation, the latent z and labels of generated
  samples, the diffusion draws of a training loss, augmentation of released images, evaluation: anything a
  privacy analysis does not treat as random. Reproducible from the public config.
* ``secret(name)``: a :class:`~dpgen.privacy.randomness.SecretGenerator` seeded from (secret root, name).
  The root is 256 bits of OS entropy drawn when the run starts, whatever ``seed`` is; it is kept only in
  ``checkpoints/last.pt`` (so a resumed run continues bit-exactly) and never written to a released file.
  ``privacy.noise_seed`` fixes the root for debugging and tests; such a run says it has no DP guarantee.

Every stream handed out is saved in the checkpoint; :meth:`RandomStreams.restore` puts a resumed run's
streams where the interrupted run left them.
"""
from __future__ import annotations

import hashlib
import re
import secrets

import torch

from dpgen.errors import DpgenError
from dpgen.privacy.randomness import SecretGenerator, derive_seed, secret_generator

__all__ = ["RandomStreams", "fixed_root", "ROOT_PATTERN", "NAME_PATTERN"]

#: a secret root: 256 bits as 64 lowercase hex digits
ROOT_PATTERN = re.compile(r"[0-9a-f]{64}")
#: a stream name
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def fixed_root(noise_seed: int) -> str:
    """The secret root that ``privacy.noise_seed=<int>`` fixes (a deterministic 256-bit hex string)."""
    return hashlib.blake2b(f"privacy.noise_seed={int(noise_seed)}".encode(), digest_size=32).hexdigest()


class RandomStreams:
    """Named generators on ``device``: :meth:`public` from ``seed``, :meth:`secret` from a secret root."""

    def __init__(self, device: torch.device | str, seed: int, root: str | None = None,
                 secure_noise: bool = False) -> None:
        self.device = torch.device(device)
        self.seed = int(seed)
        self._root = secrets.token_hex(32) if root is None else str(root)
        if not ROOT_PATTERN.fullmatch(self._root):
            raise ValueError("a secret root is 64 lowercase hex digits")
        self.secure_noise = bool(secure_noise)
        self._public: dict[str, torch.Generator] = {}
        self._secret: dict[str, SecretGenerator] = {}
        self._saved: dict | None = None  # a checkpoint's states, applied by restore()

    def public(self, name: str) -> torch.Generator:
        """The public stream ``name`` (the same object for the same name)."""
        if name not in self._public:
            _check_name(name)
            g = torch.Generator(device=self.device)
            g.manual_seed(derive_seed(self.seed, name))
            self._public[name] = g
            self._restore_one("public", name, g)
        return self._public[name]

    def secret(self, name: str) -> SecretGenerator:
        """The secret stream ``name`` (the same object for the same name)."""
        if name not in self._secret:
            _check_name(name)
            g = secret_generator(self.device, derive_seed(self._root, name), self.secure_noise)
            self._secret[name] = g
            self._restore_one("secret", name, g)
        return self._secret[name]

    # ---- checkpoints ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The root and every handed-out stream's state (private: checkpoints only)."""
        return {"root": self._root,
                "public": {k: g.get_state() for k, g in self._public.items()},
                "secret": {k: g.get_state() for k, g in self._secret.items()}}

    def load_root(self, state: dict) -> None:
        """Take a checkpoint's secret root (before any stream is handed out: they derive from it)."""
        if self._public or self._secret:
            raise RuntimeError("load the secret root before handing out streams")
        self._root = state["root"]

    def restore(self, state: dict) -> None:
        """Put every stream handed out so far, and any handed out later, where ``state`` left it."""
        self._saved = state
        for kind, streams in (("public", self._public), ("secret", self._secret)):
            for name, g in streams.items():
                self._restore_one(kind, name, g)

    def _restore_one(self, kind: str, name: str, g: torch.Generator) -> None:
        if self._saved is not None and name in self._saved[kind]:
            try:
                g.set_state(self._saved[kind][name])
            except RuntimeError:  # e.g. a CPU generator's state for a CUDA stream
                raise DpgenError(f"the checkpoint's {kind} stream {name!r} does not fit a {self.device.type} "
                                 "generator; resume on the device type the run started on") from None


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ValueError(f"stream names are 1-64 characters of [A-Za-z0-9_.:-], got {name!r}")
