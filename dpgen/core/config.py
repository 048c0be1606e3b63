"""What configs/ needs registered before Hydra composes it: the OmegaConf resolvers below and the
structured-config schema ``train_schema`` (:mod:`dpgen.core.schema`); :func:`register_configs` does both.

- ``${by_profile:PAPER,QUICK}``: the value for the active ``profile``.
- ``${by_dataset:{mnist: 1000, celeba32: 2543, default: 1000}}``: the value for the active dataset.
- ``${by_method:{dpaf: 64, default: 32}}``: the value for the active method.
- ``${by_eps:{1: 300, 5: 600, default: 1000}}``: the value for the run's target ε (``eps``), from a table of ε
  thresholds: the entry of the smallest key ≥ ε (here 300 for ε ≤ 1, 600 for 1 < ε ≤ 5), ``default`` above every
  key and for ``eps=inf`` (:func:`by_eps`). The rule by which dpgen.gpate.train.resolve_hparams applies G-PATE's
  README settings (given at ε = 1 and 10) reads the same way: ``{1: 4000, default: 2000}`` teachers.
- ``${folder_delta:}``: ``dataset=folder``'s default δ, the largest power of ten below 1/N
  (:func:`dpgen.data.folder.default_delta`: the folder is listed, nothing is decoded).
- ``${eps_tag:${eps}}``: ε as a directory name (10 and 10.0 both give ``10``).
- ``${run_dir:${resume},DEFAULT}`` / ``${hydra_subdir:${resume},${hydra.runtime.output_dir}}``: a resumed
  run keeps writing into its original directory, and its new Hydra config goes beside (not over) the old one;
  ``resume=auto`` keeps the job's own directory and resumes only if it already holds a checkpoint.
- ``${default_resume:}``: ``resume``'s default, ``auto`` under hydra/launcher=slurm, else null.
"""
from __future__ import annotations

import math
import time

from omegaconf import OmegaConf

from dpgen.errors import DpgenError


def _box(value):
    """Resolvers may return lists/dicts; OmegaConf.resolve accepts them only as containers."""
    return OmegaConf.create(value) if isinstance(value, (list, tuple, dict)) else value


def _by_profile(paper, quick, *, _root_):
    return _box(paper if _root_.profile == "paper" else quick)


def _lookup(table, name: str, kind: str, where: str):
    """``table[name]``, else ``table['default']``; a name in neither is a one-line error naming the config to fix."""
    if name in table:
        return _box(table[name])
    if "default" in table:
        return _box(table["default"])
    raise DpgenError(f"no value for {kind} {name!r} in {dict(table)}; add it to the {where} config")


def _by_dataset(table, *, _root_):
    return _lookup(table, _root_.dataset.name, "dataset", "method")


def _by_method(table, *, _root_):
    return _lookup(table, _root_.method.name, "method", "dataset")


def by_eps(table, eps) -> object:
    """The value of an ε-threshold ``table`` for the target ``eps`` (a number, ``inf``, or their strings).

    The table maps upper bounds on ε to values: the entry of the smallest key ≥ ε applies, so ``{1: a, 5: b,
    default: c}`` gives ``a`` for ε ≤ 1, ``b`` for 1 < ε ≤ 5, and ``c`` for ε > 5 and for ``eps=inf`` (the
    privacy-off reference). Keys are positive numbers (``inf`` is allowed and then plays ``default``'s part, so the
    two cannot both be given); without ``default`` (or ``inf``) an ε above every key is an error, never a silent
    fallback. A threshold table and not a table of exact ε values, so that a sweep's ε between two keys (ε = 2 in
    the table above) gets the setting of the next larger budget's key, as dpgen.gpate.train.resolve_hparams applies
    G-PATE's README settings for ε = 1 and 10 (ε ≤ 1 / ε > 1). Every problem is a one-line
    :class:`~dpgen.errors.DpgenError`.
    """
    from dpgen.privacy import parse_epsilon

    target = parse_epsilon(eps)
    if not hasattr(table, "items") or not len(table):
        raise DpgenError(f"by_eps takes a table of epsilon thresholds such as {{1: 300, default: 1000}}, got {table!r}")
    shown = dict(table.items())
    bounds: list[tuple[float, object]] = []
    fallback, has_default = None, False
    for key, value in shown.items():
        if str(key) == "default":
            fallback, has_default = value, True
            continue
        try:
            bound = parse_epsilon(key, key="a by_eps key")
        except DpgenError:
            raise DpgenError(f"by_eps keys are epsilon thresholds (positive numbers or inf) or default, got {key!r} "
                             f"in {shown}") from None
        if any(b == bound for b, _ in bounds):
            raise DpgenError(f"by_eps has epsilon threshold {bound:g} twice in {shown}")
        bounds.append((bound, value))
    if has_default and any(math.isinf(b) for b, _ in bounds):
        raise DpgenError(f"by_eps has both inf and default in {shown}: they mean the same entry; keep one")
    for bound, value in sorted(bounds, key=lambda bv: bv[0]):
        if target <= bound:
            return _box(value)
    if has_default:
        return _box(fallback)
    raise DpgenError(f"no value for eps={target:g} in by_eps table {shown}: its largest key is "
                     f"{max(b for b, _ in bounds):g}; add a default (or a key >= {target:g})")


def _by_eps(table, *, _root_):
    return by_eps(table, _root_.eps)


def _folder_delta(*, _root_):
    from dpgen.data import dataset_options
    from dpgen.data.folder import default_delta

    return default_delta(dataset_options(_root_.dataset))


def _eps_tag(eps) -> str:
    """ε as a directory name: eps=10 and eps=10.0 name the same directory, eps=inf/.inf give ``inf``."""
    from dpgen.privacy import parse_epsilon

    try:
        return f"{parse_epsilon(eps):g}"
    except DpgenError:
        return str(eps)  # validate() reports the bad value in one line before anything is written


def _default_resume(*, _root_):
    """``resume``'s default: null, or ``slurm.resume`` (``auto``) when hydra/launcher=slurm adds that table, so
    a requeued SLURM job continues from its own checkpoint. A plain ``slurm.resume`` interpolation cannot be
    used: without that launcher ``slurm`` is MISSING in the schema (see dpgen/core/schema.py)."""
    if "slurm" not in _root_ or OmegaConf.is_missing(_root_, "slurm") or _root_.slurm is None:
        return None
    return _root_.slurm.get("resume")


def _hydra_subdir(resume, output_dir=None) -> str | None:
    """Where Hydra writes this job's config: ``.hydra`` for a new run; beside it (``.hydra/resume-<time>``) when
    the job continues an existing run, so the original config is never overwritten. ``resume=auto`` continues
    only when ``output_dir`` already holds a checkpoint (a requeued SLURM job, see dpgen/core/resume.py).
    Nowhere (None) on ranks > 0 of a multi-process job (``hydra.launcher.tasks_per_node`` > 1)."""
    from dpgen.core.dist import launch_rank
    from dpgen.core.resume import resume_dir

    if launch_rank() > 0:  # a task > 0 of a multi-task submitit job shares rank 0's directory: rank 0 writes it
        return None
    fresh = resume in (None, "", "null") or (str(resume) == "auto" and resume_dir("auto", output_dir or ".") is None)
    return ".hydra" if fresh else f".hydra/resume-{time.strftime('%Y-%m-%d_%H-%M-%S')}"


def register_configs() -> None:
    """Register the resolvers and the config schema (idempotent; call before composing configs/train.yaml)."""
    from dpgen.core.schema import register_schemas

    register_schemas()
    for name, fn in {
        "by_profile": _by_profile,
        "by_dataset": _by_dataset,
        "by_method": _by_method,
        "by_eps": _by_eps,
        "folder_delta": _folder_delta,
        "eps_tag": _eps_tag,
        "run_dir": lambda resume, default: default if resume in (None, "", "null", "auto") else str(resume),
        "hydra_subdir": _hydra_subdir,
        "default_resume": _default_resume,
    }.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


#: the former name of :func:`register_configs` (it registered the resolvers only)
register_resolvers = register_configs
