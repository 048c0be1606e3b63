"""The released artifact: a conditional generator that maps (n, labels) to samples.

``generator.pt`` holds only what a method releases: the class to rebuild, its constructor
arguments and its weights. Anything trained without DP (discriminators, teachers, error
states, encoders) never enters it; :func:`save_generator` refuses modules that are not a
registered :class:`ReleasedGenerator`. :func:`load_generator` treats the file as untrusted input
(docs/privacy.md, "Sharing and loading generators"): the class it names must be in the registry
:data:`dpgen.core.methods.RELEASED_GENERATORS`, and :func:`released_generator_class` imports nothing else.
"""
from __future__ import annotations

import importlib
import os
import pickle
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from dpgen.core.methods import LEGACY_GENERATORS, RELEASED_GENERATORS
from dpgen.core.untrusted import check_kwargs, check_plain, check_state_dict
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


def released_generator_class(path: str) -> type:
    """The registered released-generator class named ``module:qualname``; nothing else is imported.

    The class is checked to be a :class:`ReleasedGenerator` before anyone calls it.
    """
    if isinstance(path, str):
        path = LEGACY_GENERATORS.get(path, path)  # a class name written by an older run
    if not isinstance(path, str) or path not in RELEASED_GENERATORS:
        shown = path if isinstance(path, str) else type(path).__name__
        raise DpgenError(f"class {shown[:80]!r} is not a released dpgen generator "
                         "(dpgen.core.methods.RELEASED_GENERATORS lists them)")
    module_name, qualname = path.split(":")
    cls = getattr(importlib.import_module(module_name), qualname, None)
    if not (isinstance(cls, type) and issubclass(cls, ReleasedGenerator)):
        raise DpgenError(f"registry entry {path} is not a ReleasedGenerator subclass")  # a registry bug
    return cls


def save_generator(module: ReleasedGenerator, path: str | os.PathLike, meta: dict | None = None) -> None:
    """Write the released generator atomically (temp file + rename); its class must be registered."""
    if not isinstance(module, ReleasedGenerator):
        raise TypeError("only a ReleasedGenerator may be released")
    if _class_path(module) not in RELEASED_GENERATORS:  # else load_generator would refuse the file
        raise TypeError(f"{_class_path(module)} is not in dpgen.core.methods.RELEASED_GENERATORS; register it there")
    payload = {
        "format": FORMAT,
        "class": _class_path(module),
        "kwargs": module.init_kwargs,
        "state_dict": {k: v.detach().cpu() for k, v in module.state_dict().items()},
        "meta": dict(meta or {}),
    }
    atomic_save(payload, path)


def load_generator(path: str | os.PathLike, device: str | torch.device = "cpu") -> ReleasedGenerator:
    """Rebuild a generator from ``generator.pt`` alone; the file is untrusted (it may come from anyone).

    Safe by construction (docs/privacy.md, "Sharing and loading generators"): the file is read with
    ``torch.load(weights_only=True)`` (plain containers and tensors, no pickled code); its class must be one of
    :data:`dpgen.core.methods.RELEASED_GENERATORS`; its constructor arguments must bind to that class's
    signature with values of the annotated plain types; the network is first built on the meta device under
    :data:`MAX_GENERATOR_ELEMENTS` / :data:`MAX_GENERATOR_MODULES`, and only then for real; the weights must
    match its parameter names, shapes and dtypes exactly. Any failure is a one-line DpgenError.
    """
    path = Path(path)
    if not path.is_file():
        raise DpgenError(f"no generator at {path}: pass the run directory of a finished training run")
    size = path.stat().st_size
    if size > MAX_GENERATOR_FILE_BYTES:
        raise DpgenError(f"generator file {path} is {size / 2**20:.0f} MiB, over the {MAX_GENERATOR_FILE_BYTES // 2**20} MiB "
                         "a released generator may have; refusing to read it")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "global" in str(exc).lower():  # weights_only met a reference to code (a class, a function)
            raise DpgenError(f"generator file {path} refused: it holds pickled Python objects, and only plain "
                             "values and tensors are ever loaded (weights_only)") from None
        raise DpgenError(f"generator file {path} is corrupt or unreadable (not a torch file)") from None
    except Exception as exc:  # noqa: BLE001 - any failure here means the file is unusable
        reason = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else ""
        raise DpgenError(f"generator file {path} is corrupt or unreadable ({type(exc).__name__}: {reason})") from None
    try:
        model = _rebuild(payload)
    except DpgenError as exc:
        raise DpgenError(f"generator file {path} refused: {exc}") from None
    return model.to(device).eval()


#: the most parameter + buffer elements a loaded generator may have: 2**28 (1 GiB of float32). The largest
#: paper-profile generator (G-PATE, 64 px: gfc 1024, gf 64) has about 35M.
MAX_GENERATOR_ELEMENTS = 2**28
#: the most submodules a loaded generator may have (construction time grows with them; the paper DP-FETA
#: UNet has a few hundred)
MAX_GENERATOR_MODULES = 5000
#: the largest generator.pt read at all: the weights of MAX_GENERATOR_ELEMENTS float32 values plus 16 MiB
MAX_GENERATOR_FILE_BYTES = 4 * MAX_GENERATOR_ELEMENTS + 2**24
_PAYLOAD_KEYS = {"format", "class", "kwargs", "state_dict", "meta"}


def _rebuild(payload: Any) -> ReleasedGenerator:
    if not isinstance(payload, dict) or not {"format", "class", "kwargs", "state_dict"} <= set(payload) \
            or not set(payload) <= _PAYLOAD_KEYS:
        keys = sorted(map(str, payload)) if isinstance(payload, dict) else type(payload).__name__
        raise DpgenError(f"not a dpgen generator (expected keys {sorted(_PAYLOAD_KEYS)}, got {keys})")
    if payload["format"] != FORMAT:
        raise DpgenError(f"unknown format {str(payload['format'])[:40]!r} (expected {FORMAT})")
    cls = released_generator_class(payload["class"])  # a registered ReleasedGenerator, checked before any call
    kwargs = check_kwargs(cls, payload["kwargs"])
    check_plain(payload.get("meta", {}), "meta")
    with bounded_construction(MAX_GENERATOR_ELEMENTS, MAX_GENERATOR_MODULES, cls.__name__), torch.device("meta"):
        _construct(cls, kwargs)  # sizes first, without allocating anything
    model = _construct(cls, kwargs)
    check_state_dict(model, payload["state_dict"], "weights")
    model.load_state_dict(payload["state_dict"])
    return model


def _construct(cls: type, kwargs: dict) -> ReleasedGenerator:
    try:
        return cls(**kwargs)
    except DpgenError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, RuntimeError, ZeroDivisionError) as exc:
        raise DpgenError(f"{cls.__name__} cannot be built from these arguments ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:120] if str(exc) else ''})") from None


@contextmanager
def bounded_construction(max_elements: int, max_modules: int, what: str) -> Iterator[None]:
    """Abort building ``what`` as soon as it registers more than ``max_elements`` parameter/buffer elements or
    ``max_modules`` submodules (global registration hooks, removed on exit): a crafted width or depth becomes a
    one-line DpgenError, never an out-of-memory kill or an endless loop."""
    from torch.nn.modules import module as nn_module

    counts = {"elements": 0, "modules": 0}

    def on_tensor(_module, _name, tensor):
        if tensor is not None:
            counts["elements"] += tensor.numel()
            if counts["elements"] > max_elements:
                raise DpgenError(f"{what} would have more than {max_elements:,} parameter elements "
                                 "(dpgen.core.generator.MAX_GENERATOR_ELEMENTS); refusing to build it")

    def on_module(_module, _name, _sub):
        counts["modules"] += 1
        if counts["modules"] > max_modules:
            raise DpgenError(f"{what} would have more than {max_modules:,} submodules "
                             "(dpgen.core.generator.MAX_GENERATOR_MODULES); refusing to build it")

    handles = [nn_module.register_module_parameter_registration_hook(on_tensor),
               nn_module.register_module_buffer_registration_hook(on_tensor),
               nn_module.register_module_module_registration_hook(on_module)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
