"""The schema of ``configs/``: Hydra structured configs (types, checked at composition) and value checks
(ranges, choices, cross-field rules, checked by :func:`check_config` before anything is created).

``configs/train.yaml`` starts its defaults list with ``train_schema`` (:class:`TrainSchema`, registered in
Hydra's ConfigStore by :func:`register_schemas`), so every composed config, every override and every sweep
value is typed: ``dpgan.lr_d=abc`` fails while composing. Each group has one schema dataclass:

=================  ==========================================================
top level / train  :class:`TrainSchema` (eps, delta, seed, device, data_root, ...)
``privacy``        :class:`PrivacySchema`
``dataset``        :class:`DatasetSchema`
``eval``           :data:`EvalSchema` (generated from :class:`dpgen.eval.config.EvalConfig`)
``method``         :class:`MethodSchema` (name/module/hparams must match :data:`dpgen.core.methods.METHODS`)
hyperparameters    one module per block in :mod:`dpgen.core.hparams` (``dpgan``, ``gswgan``, ``dpac``,
                   ``efsgd``, ``gpate``, ``dpaf``, ``feta`` for feta and dpdm)
=================  ==========================================================

A field's allowed values are declared next to its type with :func:`dpgen.core.checks.spec` (``ge``, ``gt``, ``le``, ``lt``,
``choices``, ``length``); rules that involve several keys, the data or the method live in the schema
class's ``cross_check(node, key, ctx)``. Errors name the key the user types (``delta``, ``dpgan.clip``),
the value and what is allowed, on one line.

A new hyperparameter key is declared in its block's schema (e.g. :class:`dpgen.core.hparams.gpate.GpateHparams`)
and given its value in ``configs/method/<m>.yaml``; a key in the yaml that the schema lacks is a one-line
"unknown key" error naming the schema file.
"""
from __future__ import annotations

import dataclasses
import os
import re
import tempfile
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from omegaconf import MISSING, DictConfig, OmegaConf, open_dict

from dpgen.core.checks import (CheckContext, Facts, dataclass_in, bad, check_block, describe_type, nested,
                               spec)
from dpgen.core.hparams import (DpacHparams, DpafHparams, DpganHparams, EfsgdHparams, FetaHparams, GpateHparams,
                                GswganHparams)
from dpgen.core.hparams.gswgan import gswgan_block_from_dpac
from dpgen.core.precision import BF16_METHODS, ENSEMBLE_CONVS, ENSEMBLE_GENERATORS, PRECISIONS
from dpgen.data.folder import CHANNELS as FOLDER_CHANNELS, RESOLUTIONS as FOLDER_RESOLUTIONS
from dpgen.errors import DpgenError


# ---- the groups -----------------------------------------------------------------------------------

@dataclass
class PrivacySchema:
    accounting: str = spec(choices=("sound", "paper"))   # sound: a valid (eps, delta) bound; paper: the paper's own analysis
    accountant: str = spec(choices=("rdp", "pld"))
    #: fixes the secret streams (sampling, partition draws, noise) for debugging and tests: no DP guarantee then
    noise_seed: Optional[int] = spec(None, ge=0, lt=2**32)
    #: Gaussian noise as the sum of 4 normal draws (floating-point-robust, opacus' secure_mode)
    secure_noise: bool = spec()


@dataclass
class DatasetSchema:
    name: str = MISSING
    delta: float = spec(gt=0.0, lt=1.0)
    #: set by configs/dataset/celeba.yaml and ffhq.yaml: the option the user typed; ``name`` is then the
    #: method's paper setting (configs/paper_dataset/<alias>_<method>.yaml)
    alias: Optional[str] = None
    note: Optional[str] = None   # why this concrete dataset (the paper's setting), logged
    #: dataset=folder only (configs/dataset/folder.yaml, dpgen/data/folder.py): the folder of images, one
    #: sub-folder per class; the square size and channel count they are resized to (settings, never read off
    #: the images); the share of each class held out when the folder has no test/
    path: Optional[str] = None
    resolution: Optional[int] = spec(None, choices=FOLDER_RESOLUTIONS)
    channels: Optional[int] = spec(None, choices=FOLDER_CHANNELS)
    test_fraction: Optional[float] = spec(None, gt=0.0, lt=1.0)

    @staticmethod
    def cross_check(node: Any, key: str, ctx: CheckContext) -> None:
        from dpgen.data import DATASETS
        from dpgen.data.folder import NAME, OPTIONS

        if node.name in DATASETS:
            given = [k for k in OPTIONS if node.get(k) is not None]
            if node.name != NAME and given:
                raise bad(f"dataset.{given[0]}", node[given[0]], f"null: dataset={node.name} does not read it "
                          f"(only dataset={NAME} does)")
            return
        if node.alias is not None:
            from dpgen.data.aliases import alias_help

            raise DpgenError(alias_help(str(node.alias), str(ctx.cfg.method.name)))
        raise bad("dataset", node.name, "one of " + ", ".join(DATASETS))


def _eval_schema() -> type:
    """The ``eval`` group's schema: the fields of :class:`dpgen.eval.config.EvalConfig` (the one list of eval
    keys) with OmegaConf types; its values are checked by ``dpgen.eval.config.resolve_config``."""
    from dpgen.eval.config import EvalConfig

    def omega(hint: Any) -> Any:
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if origin in (typing.Union, types.UnionType):
            inner = [a for a in args if a is not type(None)]
            return Optional[omega(inner[0])] if type(None) in args else omega(inner[0])
        if origin in (tuple, list):
            return List[omega(args[0])] if args else List[Any]
        return hint

    hints = typing.get_type_hints(EvalConfig)
    fields = [(f.name, omega(hints[f.name]), field(default=MISSING)) for f in dataclasses.fields(EvalConfig)]

    def cross_check(node: Any, key: str, ctx: CheckContext) -> None:
        from dpgen.eval.config import resolve_config

        resolve_config(node)

    # __module__: configs are pickled by reference (joblib sweep workers), so the class must be importable here
    return dataclasses.make_dataclass("EvalSchema", fields, namespace={"cross_check": staticmethod(cross_check),
                                                                       "__module__": __name__})


EvalSchema = _eval_schema()


@dataclass
class MethodSchema:
    name: str = MISSING
    module: str = MISSING
    hparams: str = MISSING

    @staticmethod
    def cross_check(node: Any, key: str, ctx: CheckContext) -> None:
        """A config may only name a registered method, with the module and block the registry gives it:
        ``method.module`` is imported, so it must never be anything else."""
        from dpgen.core.methods import METHODS, method_info

        info = method_info(str(node.name))
        for part in ("module", "hparams"):
            if node[part] != getattr(info, part):
                raise bad(f"method.{part}", node[part], f"{getattr(info, part)} for method {node.name} "
                          f"(registered methods: {', '.join(sorted(METHODS))})")
        if ctx.cfg.get(info.hparams) is None:
            raise DpgenError(f"method={node.name} needs its hyperparameter block '{info.hparams}' "
                             f"(configs/method/{node.name}.yaml)")


#: the methods whose mechanisms take an audit's canaries (dpgen/audit/hooks.py)
AUDITED_METHODS = ("dpgan", "feta", "dpdm", "gpate", "dpaf", "gswgan", "dpac", "efsgd")


@dataclass
class AuditSchema:
    """``audit:`` block of ``scripts/audit.py`` (configs/audit.yaml): the one-run privacy audit (dpgen/audit/)."""

    canaries: Optional[int] = spec(None, ge=1, le=1_000_000)  # m canaries (null: the method's default, audit/sizes.py)
    guesses: Optional[int] = spec(None, ge=0)                 # default of guesses_in and guesses_out (null: 2 % of m)
    guesses_in: Optional[int] = spec(None, ge=0)              # k+: "in" for the k+ highest scores
    guesses_out: Optional[int] = spec(None, ge=0)             # k-: "out" for the k- lowest scores
    confidence: float = spec(gt=0.0, lt=1.0)  # of the lower bound on epsilon
    bound: str = spec(choices=("fdp", "sn"))  # the bound printed and used for the finding (audit.json holds both)
    evaluate: bool = spec()                   # also run the shared evaluator on the audited generator

    @staticmethod
    def cross_check(node: Any, key: str, ctx: CheckContext) -> None:
        from dpgen.audit.sizes import audit_sizes, max_canaries

        cfg = ctx.cfg
        if str(cfg.method.name) not in AUDITED_METHODS:
            raise bad("method", cfg.method.name, f"one of {', '.join(AUDITED_METHODS)} for an audit")
        m, k_in, k_out = audit_sizes(cfg)
        if k_in + k_out < 1 or k_in + k_out > m:
            raise bad(f"{key}.guesses_in", k_in, f"guesses_in + guesses_out (now {k_out}) between 1 and "
                      f"{key}.canaries={m}")
        cap = max_canaries(cfg)
        if cap is not None and m > cap[0]:
            raise bad(f"{key}.canaries", m, f"at most {cap[1]}")
        if cfg.resume is not None:
            raise bad("resume", cfg.resume, "null: an audit is one uninterrupted run (its scores are not "
                      "checkpointed)")
        from dpgen.core.dist import launched_multi_process

        if launched_multi_process():
            raise DpgenError("an audit runs in one process; launch scripts/audit.py without torchrun or srun -n W")
        n = ctx.facts.n_train
        if n is not None and not float(cfg.delta) < 1.0 / (n + m):
            raise bad("delta", cfg.delta, f"a number < 1/(N + canaries) = 1/{n + m} (N={n} records and up to "
                      f"{m} included canaries)")


@dataclass
class DebugSchema:
    stop_after: Optional[int] = spec(None, ge=1)   # simulate a crash after this many steps (tests resume)


@dataclass
class EnsembleSchema:
    """How the stacked ensembles (gswgan/dpac/efsgd discriminators, classifier, encoders; gpate teachers) lay out
    their members' convolutions: grouped convolutions or unfold + one batched matmul (dpgen/ensemble/compute.py),
    and how the pre-training's warm-up generators run: vmapped, one loop iteration per member, or auto."""
    conv: str = spec("grouped", choices=ENSEMBLE_CONVS)
    generators: str = spec("auto", choices=ENSEMBLE_GENERATORS)


_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def _check_data_root(value: str) -> None:
    """An existing directory, or one that can be created (probed without leaving anything behind)."""
    path = Path(value).expanduser()
    if path.exists():
        if not path.is_dir():
            raise bad("data_root", value, "a directory (this path is a file)")
        return
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    try:
        if not parent.is_dir():
            raise OSError("not a directory")
        os.rmdir(tempfile.mkdtemp(dir=parent, prefix=".dpgen-probe-"))
    except OSError as exc:
        raise bad("data_root", value, f"a directory that exists or can be created ({parent}: "
                  f"{exc.strerror or exc})") from None


@dataclass
class TrainSchema:
    """The composed config of ``scripts/train.py`` (configs/train.yaml and its groups)."""

    method: MethodSchema = nested(MethodSchema)
    dataset: DatasetSchema = nested(DatasetSchema)
    eval: EvalSchema = nested(EvalSchema)  # type: ignore[valid-type]
    privacy: PrivacySchema = nested(PrivacySchema)
    profile: str = spec(choices=("quick", "paper"))
    eps: Any = MISSING               # a positive number or inf: dpgen.privacy.parse_epsilon
    delta: float = spec(gt=0.0, lt=1.0)
    seed: int = spec(ge=0, lt=2**32)
    device: str = MISSING            # auto | cpu | cuda | cuda:<i>
    threads: Optional[int] = spec(None, ge=1)
    data_root: str = MISSING
    resume: Optional[str] = None
    checkpoint_every: int = spec(ge=1)
    log_every: int = spec(ge=1)
    samples_per_class: int = spec(ge=1, le=1000)
    tensorboard: bool = MISSING
    progress: bool = MISSING
    #: the training's arithmetic (dpgen/core/precision.py); the DP path (clipping, noise) stays fp32 under each
    precision: str = spec(choices=PRECISIONS)
    cudnn_benchmark: bool = spec()   # cuDNN picks convolution algorithms by timing them (GPU runs not bit-exact)
    #: torch.compile of each method's hot step (dpgen/core/compile.py); the same function within its tolerance
    compile: bool = False
    ensemble: EnsembleSchema = nested(EnsembleSchema)
    debug: DebugSchema = nested(DebugSchema)
    audit: Optional[AuditSchema] = None  # set by configs/audit.yaml (scripts/audit.py) only
    # one hyperparameter block per method family (only the selected method's block is set)
    dpgan: Optional[DpganHparams] = None
    gswgan: Optional[GswganHparams] = None
    dpac: Optional[DpacHparams] = None
    efsgd: Optional[EfsgdHparams] = None
    gpate: Optional[GpateHparams] = None
    dpaf: Optional[DpafHparams] = None
    feta: Optional[FetaHparams] = None
    #: per-method SLURM sizing that configs/hydra/launcher/slurm.yaml adds and reads (not a job setting). Hydra
    #: merges launcher configs before this schema, so its default must be MISSING (a None would erase them).
    slurm: Optional[Dict[str, Any]] = field(default=MISSING, metadata={"absent_ok": True})

    @staticmethod
    def cross_check(node: Any, key: str, ctx: CheckContext) -> None:
        from dpgen.privacy import parse_epsilon

        parse_epsilon(node.eps)
        if not _DEVICE.match(str(node.device)):
            raise bad("device", node.device, "auto, cpu, cuda or cuda:<index>")
        _check_data_root(str(node.data_root))
        if node.precision == "bf16" and str(node.method.name) not in BF16_METHODS:
            raise bad("precision", node.precision, f"fp32 or tf32 for method={node.method.name} (bf16 autocast "
                      f"is supported by {', '.join(BF16_METHODS)}; dpgen/core/precision.py)")
        # resume=auto is decided per job by dpgen/core/resume.py (continue if the job's directory has a checkpoint)
        if node.resume is not None and str(node.resume) != "auto" and not Path(str(node.resume)).is_dir():
            raise bad("resume", node.resume, "the directory of an interrupted run")
        check_multi_process(node)


def check_multi_process(cfg: Any, several: bool | None = None) -> None:
    """Under ``torchrun`` (or several tasks of one job: ``srun``, ``hydra.launcher.tasks_per_node``): a method whose
    ``train`` splits its work over the ranks, with the backend that does. ``several``: whether the run will have
    several processes (None: this process's launch says so; the CLI passes True before submitting a job of
    several tasks)."""
    from dpgen.core.dist import launched_by_torchrun
    from dpgen.core.methods import METHODS

    if not (launched_by_torchrun() if several is None else several):
        return
    info = METHODS.get(str(cfg.method.name))
    if info is not None and not info.multi_process:
        multi = ", ".join(m for m, i in METHODS.items() if i.multi_process)
        raise DpgenError(f"method={cfg.method.name} trains in one process; launch it without torchrun, srun -n W "
                         f"or hydra.launcher.tasks_per_node=W (multi-process methods: {multi})")
    hp = cfg.get(info.hparams) if info is not None else None
    if hp is not None and str(hp.get("grad_backend", "ghost")) == "opacus":
        raise bad(f"{info.hparams}.grad_backend", hp.grad_backend, "ghost or torch_func under torchrun (opacus hooks "
                  "run in one process)")


#: hyperparameter block name -> its schema (the TrainSchema field of the same name)
HPARAM_SCHEMAS: dict[str, type] = {"dpgan": DpganHparams, "gswgan": GswganHparams, "dpac": DpacHparams,
                                   "efsgd": EfsgdHparams, "gpate": GpateHparams, "dpaf": DpafHparams,
                                   "feta": FetaHparams}


def check_config(cfg: DictConfig, facts: Facts | None = None) -> None:
    """Every value of a composed config against the schema (method block included). Data-dependent rules
    (a batch at most N, an image size a method supports) run when ``facts`` describe the loaded data."""
    try:
        check_block(cfg, TrainSchema, "", CheckContext(cfg, facts or Facts()))
    except DpgenError:
        raise
    except Exception as exc:  # noqa: BLE001 - OmegaConf errors while resolving a value
        raise explain_config_error(exc) from None


def register_schemas() -> None:
    """Register :class:`TrainSchema` as ``train_schema`` in Hydra's ConfigStore (configs/train.yaml uses it)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="train_schema", node=TrainSchema)


# ---- OmegaConf/Hydra errors as one line -----------------------------------------------------------

_SCHEMA_FILES = {"dpgan": "dpgen/core/hparams/dpgan.py", "gswgan": "dpgen/core/hparams/gswgan.py",
                 "dpac": "dpgen/core/hparams/dpac.py",
                 "efsgd": "dpgen/core/hparams/efsgd.py", "gpate": "dpgen/core/hparams/gpate.py",
                 "dpaf": "dpgen/core/hparams/dpaf.py", "feta": "dpgen/core/hparams/feta.py"}


def _omegaconf_error(exc: BaseException) -> Any:
    from omegaconf.errors import OmegaConfBaseException

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OmegaConfBaseException) and getattr(exc, "full_key", None):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _dpgen_error(exc: BaseException) -> DpgenError | None:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DpgenError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def schema_hint(key: str) -> Any:
    """The declared type of a dotted key (``dpgan.lr_d``), or None if the schema has no such key."""
    hint: Any = TrainSchema
    for part in key.split("."):
        cls = dataclass_in(hint)
        if cls is None:
            return None
        hints = typing.get_type_hints(cls)
        if part not in hints:
            return None
        hint = hints[part]
    return hint


def _keys_of(key: str) -> list[str]:
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    cls = dataclass_in(schema_hint(parent)) if parent else TrainSchema
    return [f.name for f in dataclasses.fields(cls)] if cls else []


def explain_config_error(exc: BaseException, given: dict[str, str] | None = None) -> DpgenError:
    """A Hydra/OmegaConf composition or resolution error as one line naming the key, the value and what is
    allowed. ``given``: the command-line overrides (key -> value), to tell a typo from a schema gap."""
    given = given or {}
    raised = _dpgen_error(exc)
    if raised is not None:  # a resolver's own one-line error (e.g. ${folder_delta:} listing a missing folder)
        return raised
    err = _omegaconf_error(exc)
    text = next((ln.strip() for ln in str(err or exc).splitlines() if ln.strip()), type(exc).__name__)
    if err is None:
        key = re.search(r"Could not override '([^']+)'", str(exc))
        if key and "not in struct" in str(exc.__cause__ or exc) or key and "No match in" in str(exc):
            return _unknown_key(key.group(1), given)
        return DpgenError(f"bad config: {text}")
    key = str(err.full_key)
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, MissingMandatoryValue, ValidationError

    if isinstance(err, (ConfigKeyError, ConfigAttributeError)) and schema_hint(key) is None:
        return _unknown_key(key, given)
    if isinstance(err, MissingMandatoryValue):
        return DpgenError(f"{key} has no value; set {key}=... (or declare it in the method's yaml file)")
    if isinstance(err, ValidationError):
        hint = schema_hint(key)
        value = given.get(key, _value_in(text))
        return bad(key, value, describe_type(hint) if hint is not None else "another type")
    return DpgenError(f"bad config: {key}: {text}")


def _value_in(message: str) -> Any:
    m = re.search(r"Value '(.*?)' of type", message)
    return m.group(1) if m else "?"


def _unknown_key(key: str, given: dict[str, str]) -> DpgenError:
    block = key.split(".", 1)[0]
    known = _keys_of(key)
    shown = ", ".join(known[:12]) + (", ..." if len(known) > 12 else "")
    if key in given or f"+{key}" in given or block not in _SCHEMA_FILES:
        return DpgenError(f"unknown key {key}; valid keys here: {shown}")
    return DpgenError(f"unknown key {key} in configs/method/*.yaml: declare it in {_SCHEMA_FILES[block]} "
                      f"(valid keys here: {shown})")


# ---- a saved run config (.hydra/config.yaml), read back ---------------------------------------------------

MAX_RUN_CONFIG_BYTES = 2**20


#: keys added after runs were saved, with the value that describes a run whose config lacks them (a missing
#: ``eval`` key takes its :class:`dpgen.eval.config.EvalConfig` default: it only says how to re-evaluate)
LATER_KEYS: dict[str, Any] = {
    "privacy.noise_seed": None,      # issue 23: such runs did not fix their noise by this key ...
    "privacy.secure_noise": False,   # ... and drew one normal per noise coordinate
    "precision": "fp32",             # issue 24: runs before the option trained in torch's default precision ...
    "cudnn_benchmark": False,        # ... with cuDNN's default (no benchmark)
    "compile": False,                # issue 32: runs before the option ran eagerly
    "dpac.sanitize": "per_path",     # issue 26: dpac runs before the option sanitised D's and C's paths apart
    "dpac.grad_basis": None,         # issue 26: ... and released every pixel of the image gradient
    "efsgd.sanitize": "per_path",    # efsgd runs before the option released D's and C's gradients apart
    "dpac.sampling": "uniform",      # GS-WGAN-family runs before the option drew one partition per iteration
    "dpac.partitions_per_iter": 1,
    "efsgd.sampling": "uniform",
    "efsgd.partitions_per_iter": 1,
    "dpac.g_lr_decay_start": None,   # GS-WGAN-family runs before the option kept G's learning rate constant
    "efsgd.g_lr_decay_start": None,
    "efsgd.encoder.match": "first",  # efsgd runs before the option paired each prior code with the first record
    "dpac.classifier.loss": "wgan",  # GS-WGAN-family runs before the option trained C on the papers' class score ...
    "dpac.classifier.lr": None,      # ... at D's learning rate
    "efsgd.classifier.loss": "wgan",
    "efsgd.classifier.lr": None,
    "dpac.classifier.real_batch": None,  # ... on real batches of B images
    "efsgd.classifier.real_batch": None,
    "dpgan.grad_backend": "opacus",  # dpgan runs before the option took per-sample gradients from opacus' hooks
    "feta.ghost_conv": "auto",       # feta/dpdm runs before the option took the CPU-measured rule on every device
    "feta.cuda_graph": False,        # ... and ran the micro-batch step eagerly
}


#: methods whose keys moved to a block of their own after runs were saved: method -> (the block those runs were
#: saved with, the block now, how the old block reads as the new one)
MOVED_BLOCKS: dict[str, tuple[str, str, Callable[[dict], dict]]] = {
    "gswgan": ("dpac", "gswgan", gswgan_block_from_dpac),  # GS-WGAN shared DPAC's block until it got its own
}


def moved_key(method: str, key: str) -> str | None:
    """The key a command-line ``key`` of ``method`` is now (``dpac.iters`` of method=gswgan: ``gswgan.iters``), or
    None when it did not move (or has no counterpart: ``dpac.beta`` of method=gswgan)."""
    moved = MOVED_BLOCKS.get(method)
    if moved is None or key.split(".", 1)[0] != moved[0]:
        return None
    new = moved[1] + key[len(moved[0]):]
    return new if schema_hint(new) is not None else None


def _move_blocks(raw: DictConfig) -> None:
    """A saved config of a method whose keys have since moved (:data:`MOVED_BLOCKS`) reads as one saved with the new
    block: ``method.hparams`` and the block itself (whose later keys :func:`_fill_later_keys` has filled)."""
    method = raw.get("method")
    moved = MOVED_BLOCKS.get(str(method.get("name"))) if isinstance(method, DictConfig) else None
    if moved is None:
        return
    old, new, convert = moved
    if method.get("hparams") != old or not isinstance(raw.get(old), DictConfig) or new in raw:
        return
    block = convert(OmegaConf.to_container(raw[old], resolve=False))
    with open_dict(raw):
        raw[new] = block
        method.hparams = new
        del raw[old]


def saved_fingerprint(stored: dict) -> dict:
    """A checkpoint's fingerprint (:func:`dpgen.core.pipeline.fingerprint`) written before its method's keys moved
    (:data:`MOVED_BLOCKS`), with its ``hparams`` read as the new block's."""
    moved = MOVED_BLOCKS.get(str(stored.get("method")))
    if moved is None or not isinstance(stored.get("hparams"), dict):
        return stored
    return {**stored, "hparams": moved[2](stored["hparams"])}


def _fill_later_keys(raw: DictConfig) -> None:
    """Give a saved config the keys it predates (a key present in the file is kept as written)."""
    from dpgen.eval.config import EvalConfig

    later = dict(LATER_KEYS)
    if isinstance(raw.get("eval"), DictConfig):
        later.update({f"eval.{f.name}": _plain_default(getattr(EvalConfig(), f.name))
                      for f in dataclasses.fields(EvalConfig)})
    for key, value in later.items():
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(raw, parent)
        if isinstance(node, DictConfig) and leaf not in node:
            node[leaf] = value


def _plain_default(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def load_run_config(run_dir: str | os.PathLike) -> DictConfig:
    """``<run_dir>/.hydra/config.yaml``, typed and checked like a freshly composed config.

    The file may come from a shared run directory: it is parsed by OmegaConf's safe YAML loader, merged into
    :class:`TrainSchema` (unknown keys and wrong types refused) and checked by :func:`check_config`, so a
    crafted ``method.module: os`` is a one-line DpgenError and nothing it names is ever imported.
    """
    from omegaconf import OmegaConf

    cfg_file = Path(run_dir) / ".hydra" / "config.yaml"
    if not cfg_file.is_file():
        raise DpgenError(f"{run_dir} is not a dpgen run directory (no .hydra/config.yaml)")
    if cfg_file.stat().st_size > MAX_RUN_CONFIG_BYTES:
        raise DpgenError(f"{cfg_file} is larger than a run config can be ({MAX_RUN_CONFIG_BYTES // 1024} KiB)")
    try:
        raw = OmegaConf.load(cfg_file)
    except Exception as exc:  # noqa: BLE001 - YAML errors
        raise DpgenError(f"{cfg_file} is not a valid dpgen run config: unreadable YAML ({type(exc).__name__})") from None
    if not isinstance(raw, DictConfig):
        raise DpgenError(f"{cfg_file} is not a valid dpgen run config: not a mapping")
    _fill_later_keys(raw)
    try:
        _move_blocks(raw)
    except DpgenError as exc:
        raise DpgenError(f"{cfg_file} is not a valid dpgen run config: {exc}") from None
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(TrainSchema), raw)
        OmegaConf.set_struct(cfg, True)
    except Exception as exc:  # noqa: BLE001 - schema errors
        raise DpgenError(f"{cfg_file} is not a valid dpgen run config: {explain_config_error(exc)}") from None
    try:
        check_config(cfg)
    except DpgenError as exc:
        raise DpgenError(f"{cfg_file} is not a valid dpgen run config: {exc}") from None
    return cfg
