"""Command-line plumbing shared by scripts/: one-line errors and a dry composition check.

Hydra reports a bad override with a multi-line message after it has created the run
directory. :func:`precheck` composes the config first (every value of every sweep) against the
schema (:mod:`dpgen.core.schema`), so a typo, a wrong type, a value out of range, an unknown
method/dataset, missing data or an unusable checkpoint ends with one line and exit code 2
before anything is written.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator, Sequence

from dpgen.core.methods import CONFIG_DIR, available
from dpgen.errors import DpgenError

EXIT_USER_ERROR = 2
#: the primary configs of scripts that train (train.py, audit.py): their configs are validated with the data
TRAINING_CONFIGS = ("train", "audit")


def worker_overrides(argv: Sequence[str]) -> list[str]:
    """What ranks > 0 of a ``torchrun`` (or multi-task ``srun``) launch add to the command line, so that only rank 0 writes: no ``.hydra/``,
    no ``train.log``, and a throwaway run directory (they use rank 0's, sent over the process group). Rank 0 and
    single-process runs add nothing. Several processes cannot run a sweep (``-m``): a one-line error."""
    import os
    import tempfile

    from dpgen.core.dist import launched_multi_process

    if not launched_multi_process():
        return []
    if "-m" in argv or "--multirun" in argv:
        raise DpgenError("torchrun runs one training job on several processes; a sweep (-m) is not supported there")
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        return []
    scratch = tempfile.mkdtemp(prefix=f"dpgen-rank{rank}-")
    return ["hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled",
            f"hydra.run.dir={scratch}"]


def remove_fresh_run_dir(run_dir) -> None:
    """Remove a run directory a job just created (nothing was trained or released) and its empty parents."""
    import shutil
    from pathlib import Path

    run_dir = Path(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    for parent in run_dir.parents:
        if parent == Path.cwd() or not parent.is_dir() or any(parent.iterdir()):
            break
        parent.rmdir()


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(EXIT_USER_ERROR)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn a DpgenError into ``error: <one line>`` on stderr and exit code 2."""
    try:
        yield
    except DpgenError as exc:
        fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


def _override_variants(args: Sequence[str]) -> list[list[str]]:
    """Override lists that together cover every value of every sweep (not every combination)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(args))
    plain = [o.input_line for o in parsed if not o.is_sweep_override()]
    sweeps = [o for o in parsed if o.is_sweep_override()]
    firsts = {o.key_or_group: f"{o.get_key_element()}={next(iter(o.sweep_string_iterator()))}" for o in sweeps}
    variants = [plain + list(firsts.values())]
    for o in sweeps:
        for value in list(o.sweep_string_iterator())[1:]:
            others = [v for key, v in firsts.items() if key != o.key_or_group]
            variants.append(plain + others + [f"{o.get_key_element()}={value}"])
    return variants


def _given(overrides: Sequence[str]) -> dict[str, str]:
    """key -> value of command-line overrides (``+key=v`` too), to name the value in error messages."""
    return {a.split("=", 1)[0].lstrip("+~"): a.split("=", 1)[1] for a in overrides if "=" in a}


def _launcher_tasks(overrides: Sequence[str]) -> int:
    """The largest ``hydra.launcher.tasks_per_node`` the overrides ask for (1 when none)."""
    most = 1
    for a in overrides:
        key, _, value = a.partition("=")
        if key.lstrip("+") == "hydra.launcher.tasks_per_node":
            for v in value.split(","):
                try:
                    most = max(most, int(v))
                except ValueError:
                    pass  # Hydra reports a malformed value itself
    return most


def precheck(args: Sequence[str], config_name: str = "train") -> None:
    """Compose the config for the given overrides and validate it; raise DpgenError on any problem."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from dpgen.core.config import register_configs
    from dpgen.core.pipeline import validate
    from dpgen.core.schema import check_multi_process, explain_config_error

    register_configs()
    overrides = [a for a in args if not a.startswith("-") and "=" in a]
    _check_groups(overrides)
    _check_blocks(overrides)
    training = config_name in TRAINING_CONFIGS
    if training:
        try:
            swept = _config_sweeps(overrides, config_name)
        except Exception as exc:  # noqa: BLE001 - Hydra/OmegaConf composition errors
            raise explain_config_error(exc, _given(overrides)) from None
        _check_groups(swept)
        overrides = overrides + swept
    try:
        variants = _override_variants([a for a in overrides if not a.startswith("hydra")])
    except Exception as exc:  # noqa: BLE001 - Hydra's parse errors
        raise DpgenError(f"cannot parse overrides: {str(exc).splitlines()[0]}") from None
    configs = []
    for variant in variants:  # every job's config, typed and checked without data first ...
        _check_blocks(variant)
        try:
            with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
                cfg = compose(config_name, overrides=variant)
            OmegaConf.resolve(cfg)
        except DpgenError:
            raise
        except Exception as exc:  # noqa: BLE001 - Hydra/OmegaConf composition errors
            raise explain_config_error(exc, _given(variant)) from None
        if training:
            validate(cfg)
            if _launcher_tasks(overrides) > 1:  # refused here, not inside a job that has queued for hours
                check_multi_process(cfg, several=True)
        configs.append(cfg)
    if training:
        for cfg in configs:  # ... then the data each job reads
            _check_inputs(cfg)


def _check_blocks(overrides: Sequence[str]) -> None:
    """A hyperparameter key of another method's block (``method=dpac efsgd.iters=3``) is one line naming the block
    the method reads; a key of a block the method no longer reads (``method=gswgan dpac.iters=10``: GS-WGAN's keys
    moved to ``gswgan.*``) a pointer to its new name. Every method of a sweep (``method=gswgan,dpac``) is checked."""
    from dpgen.core.methods import METHODS
    from dpgen.core.schema import HPARAM_SCHEMAS, moved_key

    methods = [m for a in overrides if a.split("=", 1)[0] == "method" for m in a.split("=", 1)[1].split(",")]
    for method in dict.fromkeys(methods):
        info = METHODS.get(method)
        for a in overrides:
            key, _, value = a.partition("=")
            key = key.lstrip("+~")
            block = key.split(".", 1)[0]
            if info is None or "." not in key or block not in HPARAM_SCHEMAS or block == info.hparams:
                continue
            new = moved_key(method, key)
            if new is not None:
                raise DpgenError(f"{key} is {new} for method={method} (its keys moved to their own block); "
                                 f"use {new}={value}")
            raise DpgenError(f"{key} is not read by method={method}: its hyperparameters are {info.hparams}.* "
                             f"(configs/method/{method}.yaml)")


def _check_groups(overrides: list[str]) -> None:
    """Every value given to a config group (also inside a sweep) names an existing config."""
    for group in ("method", "dataset", "eval", "profile"):
        for a in overrides:
            if a.split("=", 1)[0] == group:
                for value in a.split("=", 1)[1].split(","):
                    if value not in available(group):
                        raise DpgenError(f"unknown {group} {value!r}; choose one of {', '.join(available(group))}")


def _config_sweeps(overrides: list[str], config_name: str) -> list[str]:
    """``hydra.sweeper.params`` set by a config (``+experiment=...``) as overrides, so that precheck
    validates every job of an experiment too; a command-line value wins, as in Hydra."""
    from hydra import compose, initialize_config_dir

    first_job = _override_variants([a for a in overrides if not a.startswith("hydra")])[0]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name, overrides=first_job, return_hydra_config=True)
    params = cfg.hydra.sweeper.get("params") or {}
    given = {a.split("=", 1)[0].lstrip("+~") for a in overrides}
    return [f"{k}={v}" for k, v in params.items() if k not in given]


def _check_inputs(cfg) -> None:
    """Data files, the data-dependent rules (δ < 1/N, batches <= N, image sizes) and, on ``resume=``, the
    run's saved config and checkpoint, all checked before Hydra creates any directory."""
    from dpgen.core.pipeline import check_resume, validate
    from dpgen.data import load_config_dataset

    try:
        data = load_config_dataset(cfg)  # builds the cache the job will then read
    except DpgenError as exc:
        if cfg.dataset.get("alias"):  # say which concrete dataset dataset=celeba chose for this method
            raise DpgenError(f"dataset={cfg.dataset.alias} is {cfg.dataset.name} for method={cfg.method.name}: "
                             f"{exc}") from None
        raise
    validate(cfg, data)
    if cfg.resume is not None and str(cfg.resume) != "auto":  # auto: checked by the job, in its own directory
        check_resume(cfg)
