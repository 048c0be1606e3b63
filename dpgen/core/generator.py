"""The released artifact: a conditional generator that maps (n, labels) to samples.

``generator.pt`` holds only what a method releases: the class to rebuild, its constructor
arguments and its weights. Anything trained without DP (discriminators, teachers, error
states, encoders) never enters it; :func:`save_generator` refuses modules that are not a
:class:`ReleasedGenerator`.
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dpgen.errors import DpgenError
from dpgen.io import atomic_save

FORMAT = "dpgen-generator/1"


def balanced_labels(n: int, num_classes: int) -> torch.Tensor:
    """Labels 0,1,..,K-1,0,1,.. so every class gets n/K samples (±1)."""
    return torch.arange(n, dtype=torch.long) % num_classes


class ReleasedGenerator(nn.Module):
    """Base class of every released generator.

    Subclasses pass their JSON-serialisable constructor arguments to ``super().__init__``
    (so the artifact can be rebuilt from ``generator.pt`` alone) and implement
    :meth:`generate`, which returns samples in [0, 1] for the given labels.
    """

    #: images live in [0, 1]; a tabular generator returning raw features sets this False
    clamp_output: bool = True

    def __init__(self, **init_kwargs: Any) -> None:
        super().__init__()
        self.init_kwargs = dict(init_kwargs)

    @property
    def num_classes(self) -> int:
        return int(self.init_kwargs["num_classes"])

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.init_kwargs["shape"])

    def generate(self, labels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def sample(
        self,
        n: int,
        labels: torch.Tensor | None = None,
        seed: int | None = None,
        batch_size: int = 1000,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw ``n`` samples (CPU float, in [0, 1] for images) and their labels (balanced unless given)."""
        labels = balanced_labels(n, self.num_classes) if labels is None else torch.as_tensor(labels).long()
        if labels.shape != (n,):
            raise DpgenError(f"expected {n} labels, got shape {tuple(labels.shape)}")
        device = next(self.parameters()).device
        gen = torch.Generator(device=device)
        gen.manual_seed(0 if seed is None else int(seed))
        was_training = self.training
        self.eval()
        chunks = []
        for i in range(0, n, batch_size):
            x = self.generate(labels[i : i + batch_size].to(device), generator=gen).float()
            chunks.append((x.clamp(0, 1) if self.clamp_output else x).cpu())
        self.train(was_training)
        return torch.cat(chunks) if chunks else torch.empty(0, *self.sample_shape), labels


def _class_path(obj: object) -> str:
    return f"{type(obj).__module__}:{type(obj).__qualname__}"


def save_generator(module: ReleasedGenerator, path: str | os.PathLike, meta: dict | None = None) -> None:
    """Write the released generator atomically (temp file + rename)."""
    if not isinstance(module, ReleasedGenerator):
        raise TypeError("only a ReleasedGenerator may be released")
    payload = {
        "format": FORMAT,
        "class": _class_path(module),
        "kwargs": module.init_kwargs,
        "state_dict": {k: v.detach().cpu() for k, v in module.state_dict().items()},
        "meta": dict(meta or {}),
    }
    atomic_save(payload, path)


def load_generator(path: str | os.PathLike, device: str | torch.device = "cpu") -> ReleasedGenerator:
    """Rebuild a generator from ``generator.pt`` alone."""
    path = Path(path)
    if not path.is_file():
        raise DpgenError(f"no generator at {path}: pass the run directory of a finished training run")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        if payload.get("format") != FORMAT:
            raise ValueError(f"unknown format {payload.get('format')!r}")
        module_name, qualname = payload["class"].split(":")
        if not module_name.startswith("dpgen."):
            raise ValueError(f"refusing to import {module_name!r}")
        cls = getattr(importlib.import_module(module_name), qualname)
        model = cls(**payload["kwargs"])
        model.load_state_dict(payload["state_dict"])
    except DpgenError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure here means the file is unusable
        raise DpgenError(f"generator file {path} is corrupt or unreadable ({type(exc).__name__}: {exc})") from None
    return model.to(device).eval()
