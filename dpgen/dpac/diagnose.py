"""Per-step signal and noise of the GS-WGAN/DPAC generator update (docs/results.md, "What limits the
GS-WGAN family").

``python -m dpgen.dpac.diagnose --eps 10 --steps 200 [--bases 49 196] [-- key=value ...]`` runs the real
``train()`` (method ``--method``, profile=quick, extra Hydra overrides after ``--``) for ``--steps`` generator
iterations and, at every iteration, measures on a fresh batch of G's samples against the sampled D_k:

* ``gnorm``: median per-sample norm of ∂L_G/∂x before clipping;
* ``snr``: ‖Jᵀ Σ clip(g_i)‖ / ‖Jᵀ Σ n_i‖ with n_i ~ N(0, (2Cz)² I), i.e. the sanitised update's signal against its
  noise in G's PARAMETER space (J = ∂x/∂θ), the ratio that decides how far one Adam step moves G along the signal;
* ``snr_L<L>``, ``kept_L<L>``: the same with the sanitiser on the L lowest DCT coefficients (``dpac.grad_basis``),
  and the fraction of ‖g_i‖ those coefficients keep.

Medians are printed per window of ``--window`` iterations. The probe's draws (G's batch, the noise) come from its
own public generator: nothing of the run's secret streams is consumed, so training proceeds as it would, and
nothing is released. It writes nothing but a scratch directory that it deletes.
"""
from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from dpgen.core.run import RecordingRun, TrainingInterrupted
from dpgen.nets.dct import dct_basis
from dpgen.privacy import clip_rows

_train = importlib.import_module("dpgen.gswgan.train")  # the module (dpgen.dpac exports the function as ``train``)


def _flat_grad(x: torch.Tensor, params: list[torch.Tensor], v: torch.Tensor) -> torch.Tensor:
    return torch.cat([t.flatten() for t in torch.autograd.grad(x, params, grad_outputs=v, retain_graph=True)])


def probe_step(g_net, disc, clf, k, clip: float, z: float, beta: float, b: int, ncls: int,
               bases: dict[int, torch.Tensor], gen: torch.Generator) -> dict[str, float]:
    """The statistics of one generator iteration (module docstring), G's loss as :func:`generator_step`'s."""
    dev = next(g_net.parameters()).device
    y = torch.randint(0, ncls, (b,), generator=gen, device=dev)
    g_net.eval()  # no spectral-norm power iteration: the probe leaves G's state as training left it
    try:
        x = g_net(g_net.sample_z(b, gen, dev), y)
    finally:
        g_net.train()
    xd = x.detach().requires_grad_(True)
    p, u = disc.member(k)
    loss = -beta * _train.disc_forward(p, u, xd, y).sum()
    if clf is not None:
        pc, uc = clf.member(0)
        loss = loss - (1.0 - beta) * _train.clf_forward(pc, uc, xd, y).sum()
    g = torch.autograd.grad(loss, xd)[0].flatten(1)
    params = [q for q in g_net.parameters() if q.requires_grad]
    std = 2.0 * clip * z

    def snr(basis: torch.Tensor | None) -> float:
        rows = g if basis is None else g @ basis
        noise = torch.randn(rows.shape, generator=gen, device=dev) * std
        clipped = clip_rows(rows, clip)
        if basis is not None:
            clipped, noise = clipped @ basis.T, noise @ basis.T
        s = _flat_grad(x, params, clipped.view_as(x))
        n = _flat_grad(x, params, noise.view_as(x))
        return (s.norm() / n.norm()).item() if std > 0 else float("inf")

    out = {"gnorm": g.norm(dim=1).median().item(), "snr": snr(None)}
    for n_basis, basis in bases.items():
        out[f"snr_L{n_basis}"] = snr(basis)
        out[f"kept_L{n_basis}"] = ((g @ basis).norm(dim=1) / g.norm(dim=1)).median().item()
    return out


def measure(method: str, eps: float | str, steps: int, data_root: str, overrides: list[str], dataset: str = "fmnist",
            bases: tuple[int, ...] = (), seed: int = 0) -> list[dict[str, float]]:
    """One row of :func:`probe_step` statistics per generator iteration of a real ``train()`` run."""
    from hydra import compose, initialize_config_dir

    from dpgen.core.config import register_resolvers
    from dpgen.core.methods import CONFIG_DIR
    from dpgen.core.pipeline import seed_everything, set_threads
    from dpgen.data import load_dataset
    from dpgen.privacy import PrivacyLedger, parse_epsilon

    register_resolvers()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[f"method={method}", f"dataset={dataset}", f"eps={eps}", f"seed={seed}",
                                          *overrides])
    set_threads(cfg.get("threads"))
    data = load_dataset(dataset, data_root)
    shape = tuple(data.shape)
    basis_of = {n: dct_basis(shape, n) for n in bases}
    ledger = PrivacyLedger(delta=float(cfg.delta), target_epsilon=parse_epsilon(cfg.eps),
                           accounting=cfg.privacy.accounting)
    rows: list[dict[str, float]] = []
    gen = torch.Generator().manual_seed(seed)
    original = _train.generator_step

    def probed(g_net, opt_g, disc, clf, k, san_d, san_c, beta, b, ncls, g):
        rows.append(probe_step(g_net, disc, clf, k, san_d.clip, san_d.noise_multiplier, beta, b, ncls, basis_of, gen))
        return original(g_net, opt_g, disc, clf, k, san_d, san_c, beta, b, ncls, g)

    seed_everything(seed)
    _train.generator_step = probed
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run = RecordingRun(Path(tmp), ledger, torch.device("cpu"), seed, {}, log_every=1, stop_after=steps,
                               progress=False, tensorboard=False)
            try:
                _train.train(cfg.dpac, data, ledger, run)
            except TrainingInterrupted:
                pass
            finally:
                run.close()
    finally:
        _train.generator_step = original
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--method", default="gswgan", choices=("gswgan", "dpac"))
    ap.add_argument("--dataset", default="fmnist")
    ap.add_argument("--eps", default="10")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--bases", type=int, nargs="*", default=[49, 196])
    ap.add_argument("--data-root", default=None)
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. dpac.num_discriminators=200")
    args = ap.parse_args(argv)
    root = args.data_root or os.environ.get("DPGEN_DATA", "data")
    rows = measure(args.method, args.eps, args.steps, root, args.overrides, args.dataset, tuple(args.bases))
    for lo in range(0, len(rows), args.window):
        part = rows[lo:lo + args.window]
        cols = " ".join(f"{key}={statistics.median(r[key] for r in part):.3g}" for key in part[0])
        print(f"iterations {lo}-{lo + len(part) - 1}: {cols}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
