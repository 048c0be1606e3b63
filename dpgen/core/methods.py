"""The registry of methods and released generator classes: the only code dpgen imports by name.

A method is a subpackage ``dpgen.<name>`` plus ``configs/method/<name>.yaml`` plus one entry in
:data:`METHODS`. The subpackage exposes one function::

    train(hp: DictConfig, data: ImageDataset, ledger: PrivacyLedger, run: Run) -> ReleasedGenerator

It may touch ``data.train`` only through mechanisms recorded in ``ledger``; ``run`` gives it
the device, seeded RNG, progress/logging and checkpoints. Everything else (outputs, privacy
report, evaluation) is the pipeline's job.

Config files and ``generator.pt`` name code by string (``method.module``, the generator's class).
Both are looked up in these registries and nothing else is ever imported: a crafted config or generator
file can only pick one of these entries (docs/privacy.md, "Sharing and loading generators"). :func:`load_method`
imports a method; :func:`dpgen.core.generator.released_generator_class` imports a released class (it lives
with the other code that reads ``generator.pt``, which imports this module, never the reverse).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from dpgen.errors import DpgenError

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


@dataclass(frozen=True)
class MethodInfo:
    """``module``: the package with ``train()``; ``hparams``: the config block its hyperparameters live in
    (schema: :data:`dpgen.core.schema.HPARAM_SCHEMAS`); ``multi_process``: its ``train`` splits its work over the
    ranks of ``run.dist`` (``torchrun``, docs/clusters.md); the others run in one process."""

    module: str
    hparams: str
    multi_process: bool = False


#: every method ``method=<name>`` can select (one ``configs/method/<name>.yaml`` each)
METHODS: dict[str, MethodInfo] = {
    "dpgan": MethodInfo("dpgen.dpgan", "dpgan"),
    "gswgan": MethodInfo("dpgen.gswgan", "gswgan", multi_process=True),
    "dpac": MethodInfo("dpgen.dpac", "dpac", multi_process=True),
    "efsgd": MethodInfo("dpgen.efsgd", "efsgd", multi_process=True),
    "gpate": MethodInfo("dpgen.gpate", "gpate", multi_process=True),
    "dpaf": MethodInfo("dpgen.dpaf", "dpaf"),
    "feta": MethodInfo("dpgen.feta", "feta", multi_process=True),
    "dpdm": MethodInfo("dpgen.feta", "feta", multi_process=True),
}

#: every class a ``generator.pt`` may name (``module:qualname``), i.e. every ReleasedGenerator a method's
#: ``train`` returns. A new released class must be added here, or its runs cannot be loaded.
RELEASED_GENERATORS: tuple[str, ...] = (
    "dpgen.nets.dcgan:CondGenerator",            # dpgan, dpaf
    "dpgen.gswgan.nets:ResNetGenerator",         # gswgan, dpac
    "dpgen.efsgd.nets:NoiseInjectionGenerator",  # efsgd
    "dpgen.gpate.nets:GPateGenerator",           # gpate (images)
    "dpgen.gpate.nets:GPateTabularGenerator",    # gpate (credit)
    "dpgen.feta.generator:FetaGenerator",        # feta, dpdm
)


#: class names written by older runs -> the registered class that now holds them (the code moved, the weights
#: layout did not): ``generator.pt`` files saved before GS-WGAN became its own package still load.
LEGACY_GENERATORS: dict[str, str] = {
    "dpgen.dpac.nets:ResNetGenerator": "dpgen.gswgan.nets:ResNetGenerator",
}


def available(group: str) -> list[str]:
    """Names of the options in a config group (``method``, ``dataset``, ``eval``, ...)."""
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def method_info(name: str) -> MethodInfo:
    """The registry entry of method ``name`` (a DpgenError listing the methods otherwise)."""
    if name not in METHODS:
        raise DpgenError(f"unknown method {name!r}; choose one of {', '.join(sorted(METHODS))}")
    return METHODS[name]


def load_method(name: str) -> ModuleType:
    """Import the training package of a registered method, given by its name (``dpac``) or its registered
    module (``dpgen.dpac``); any other string is refused, never imported."""
    modules = {info.module for info in METHODS.values()}
    mod = importlib.import_module(name if name in modules else method_info(name).module)
    if not callable(getattr(mod, "train", None)):
        raise DpgenError(f"method module {mod.__name__} has no train(hp, data, ledger, run) function")
    return mod
