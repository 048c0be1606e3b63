"""Tiny, fast settings for every method, and one way to run a method's ``train()`` in memory.

Shared by the tests that must cover all eight methods the same way (the ``eps=inf`` reference, and
later the spy, guard, isolation and device-discipline tests). Each method's entry is a list of Hydra
overrides applied on top of its real config (``configs/method/<m>.yaml``, profile=quick, digits), so
a test trains the code path users run, only smaller.
"""
from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from conftest import in_memory_run

METHODS = ("dpgan", "gswgan", "dpac", "efsgd", "gpate", "dpaf", "feta", "dpdm")

_GSWGAN = ["iters=4", "num_discriminators=4", "partitions_per_iter=1", "pretrain_iters=2", "pretrain_chunk=4",
           "critic_iters=1", "batch_size=8", "g_width=8", "d_width=4"]
_ENSEMBLE = _GSWGAN + ["classifier.start=2", "classifier.n_fake=1", "classifier.n_real=1", "classifier.fake_batch=10"]
_FETA = ["iters=2", "batch_size=32", "multiplicity=2", "micro_batch=16", "unet.nf=4", "sampler.steps=2"]

TINY: dict[str, list[str]] = {
    "dpgan": ["dpgan.iters=6", "dpgan.batch_size=64", "dpgan.g_width=8", "dpgan.d_width=8"],
    "gswgan": [f"gswgan.{o}" for o in _GSWGAN],
    "dpac": [f"dpac.{o}" for o in _ENSEMBLE],
    "efsgd": [f"efsgd.{o}" for o in _ENSEMBLE] + ["efsgd.encoder.width=4", "efsgd.encoder.steps=1",
                                                   "efsgd.clip=0.01", "efsgd.C2=0.02"],
    "gpate": ["gpate.teachers=6", "gpate.iters=3", "gpate.batch_size=4", "gpate.proj_dim=3",
              "gpate.teacher_warmup=1", "gpate.gf_dim=4", "gpate.gfc_dim=16", "gpate.df_dim=4", "gpate.dfc_dim=8"],
    "dpaf": ["dpaf.width=4", "dpaf.fc_hidden=8", "dpaf.g_width=8", "dpaf.c_epochs=0.2", "dpaf.d_epochs=0.2",
             "dpaf.c_batch_size=128"],
    "feta": [f"feta.{o}" for o in _FETA] + ["feta.warmup_iters=2", "feta.num_central=10"],
    "dpdm": [f"feta.{o}" for o in _FETA],
}


def compose_cfg(method: str, *overrides: str, eps: float | str = 10.0, dataset: str = "digits") -> DictConfig:
    """The composed, resolved run config of ``method`` with its tiny overrides (later overrides win)."""
    from hydra import compose, initialize_config_dir

    from dpgen.core.config import register_resolvers
    from dpgen.core.methods import CONFIG_DIR

    register_resolvers()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[f"method={method}", f"dataset={dataset}", f"eps={eps}",
                                          *TINY[method], *overrides])
    OmegaConf.resolve(cfg)
    return cfg


def train_in_memory(method: str, run_dir: Path, *overrides: str, eps: float | str = 10.0, data=None,
                    accounting: str = "sound", seed: int = 0, device=None, **run_kwargs):
    """Run ``method``'s ``train()`` on tiny settings without the CLI; returns ``(generator, ledger, run)``.

    ``data`` defaults to the embedded digits; ``device`` to the CPU. One torch thread, so two calls with the same
    ``noise_seed`` (a ``run_kwargs`` key: it fixes the secret streams) are bit-comparable; without it they differ.
    """
    from dpgen.core.methods import load_method
    from dpgen.core.pipeline import seed_everything
    from dpgen.data import load_dataset
    from dpgen.privacy import PrivacyLedger, parse_epsilon

    cfg = compose_cfg(method, f"privacy.accounting={accounting}", f"seed={seed}", *overrides, eps=eps)
    data = load_dataset("digits", str(run_dir / "data")) if data is None else data
    ledger = PrivacyLedger(delta=float(cfg.delta), target_epsilon=parse_epsilon(cfg.eps),
                           accountant=cfg.privacy.accountant, accounting=cfg.privacy.accounting)
    run = in_memory_run(run_dir, ledger, device,
                        **{"secure_noise": bool(cfg.privacy.secure_noise), **run_kwargs})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    seed_everything(seed)
    try:
        gen = load_method(cfg.method.module).train(cfg[cfg.method.hparams], data, ledger, run)
    finally:
        run.close()
        torch.set_num_threads(threads)
    return gen, ledger, run
