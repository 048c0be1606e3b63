"""Per-step signal and noise of the GS-WGAN-family generator update, per release path (docs/results.md, "What
limits the GS-WGAN family"; docs/methods.md, "Signal and noise per release path").

``python -m dpgen.gswgan.diagnose --method {gswgan,dpac,efsgd} --eps 10 --steps 200 [--bases 49 196] [-- key=value ...]``
(``python -m dpgen.dpac.diagnose`` is the same entry point) runs the method's real ``train()`` (profile=quick,
extra Hydra overrides after ``--``) for ``--steps`` generator iterations and, at every iteration, just before G's
step, measures on a fresh batch of G's samples against the sampled D_k (and C, E_k):

* ``gnorm``, ``snr``: :func:`probe_step`, GS-WGAN's D path (with DPAC's C loss folded in, as ``sanitize=joint``):
  the median per-sample norm of ∂L_G/∂x before clipping, and ‖Jᵀ Σ clip(g_i)‖ / ‖Jᵀ Σ n_i‖ with n_i ~ N(0, (2Cz)² I),
  the sanitised update's signal against its noise in G's PARAMETER space (J = ∂x/∂θ), the ratio that decides how
  far one Adam step moves G along the signal;
* ``snr_L<L>``, ``kept_L<L>``: the same with the sanitiser on the L lowest DCT coefficients (``dpac.grad_basis``),
  and the fraction of ‖g_i‖ those coefficients keep;
* per release path p of the method at that iteration (:func:`probe_paths`: ``D``; ``DC`` for DPAC's joint
  sanitiser, ``D`` and ``C`` per path; EFSGD's ``d`` (``dc`` joint), ``c``, ``e`` and ``code``): ``gnorm_<p>`` and ``snr_<p>``
  with the path's own clip, noise std (error-feedback term clip(e[k, y], C2) included, read only) and weight, and
  ``snr_all``, the whole update's (the sum over the gradient paths). ``snr_code`` is in G's INPUT space: the
  median ‖clip(u_i, C_z)‖ against the noise's norm (its effect on θ goes through J at u, not a gradient).

Medians are printed per window of ``--window`` iterations. The probe's draws (G's batch, the noise) come from its
own public generator: nothing of the run's secret streams is consumed and no state is updated (G in eval mode, the
error states read), so training proceeds as it would, and nothing is released. It writes nothing but a scratch
directory that it deletes.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from dpgen.core.run import RecordingRun, TrainingInterrupted
from dpgen.nets.dct import dct_basis
from dpgen.privacy import clip_rows

_train = importlib.import_module("dpgen.gswgan.train")  # the module (dpgen.gswgan exports the function as ``train``)


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


def _path_stats(x: torch.Tensor, g: torch.Tensor, params: list[torch.Tensor], san, weight: float,
                error: torch.Tensor | None, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Path p's (signal, noise) in G's parameter space and its median pre-clip row norm: Jᵀ·w·v and Jᵀ·w·n with
    v = clip(g_i, C) (+ clip(e, C2) with error feedback), n ~ N(0, std² I), as ``san`` would release them."""
    rows = g.flatten(1)
    basis = getattr(san, "basis", None)
    if basis is not None:
        rows = rows @ basis
    v = clip_rows(rows, san.clip)
    if error is not None:
        v = v + clip_rows(error.flatten(1), san.clip_error)
    noise = torch.randn(v.shape, generator=gen, device=v.device) * san.noise_std
    if basis is not None:
        v, noise = v @ basis.T, noise @ basis.T
    s = _flat_grad(x, params, (weight * v).view_as(x))
    n = _flat_grad(x, params, (weight * noise).view_as(x))
    return s, n, g.flatten(1).norm(dim=1).median().item()


def _image_grad(loss_fn, x: torch.Tensor) -> torch.Tensor:
    xd = x.detach().requires_grad_(True)
    return torch.autograd.grad(loss_fn(xd), xd)[0]


def probe_paths(ext, it: int, k: torch.Tensor, gen: torch.Generator) -> dict[str, float]:
    """Signal/noise per release path of ``ext`` (a :class:`~dpgen.gswgan.train.GsWgan`, DPAC's or EFSGD's) at
    iteration ``it``, sampled partition ``k``, before G's step (module docstring)."""
    base, hp, ncls, b = ext.base, ext.hp, ext.ncls, ext.B
    g_net, dev = base.g_net, next(base.g_net.parameters()).device
    params = [q for q in g_net.parameters() if q.requires_grad]
    y = torch.randint(0, ncls, (b,), generator=gen, device=dev)
    g_net.eval()  # no spectral-norm power iteration: the probe leaves G's state as training left it
    try:
        x = g_net(g_net.sample_z(b, gen, dev), y, gen)
    finally:
        g_net.train()
    p, u = base.disc.member(k)
    pc, uc = base.clf.member(0)
    d = lambda xx: _train.disc_forward(p, u, xx, y).sum()  # noqa: E731
    c = lambda xx: _train.clf_forward(pc, uc, xx, y).sum()  # noqa: E731
    with_c = ext.c_start is not None and it >= ext.c_start
    paths: list[tuple[str, torch.Tensor, torch.Tensor, object, float, torch.Tensor | None]] = []
    out: dict[str, float] = {}
    if hasattr(ext, "san"):  # EFSGD: one error-feedback sanitiser per path, weights after the noise
        def err(san, rows_y):
            if san.error is None or not san.error_feedback:
                return None
            return san.error.index_select(0, k.reshape(1))[0][rows_y]

        if with_c and ext.joint:  # one sanitiser on the gradient of -D - λ_c·C
            lam = ext.san["c"].weight
            paths.append(("dc", x, _image_grad(lambda xx: -d(xx) - lam * c(xx), x), ext.san["d"], 1.0,
                          err(ext.san["d"], y)))
        else:
            paths.append(("d", x, _image_grad(lambda xx: -d(xx), x), ext.san["d"], 1.0, err(ext.san["d"], y)))
        if with_c and not ext.joint:
            paths.append(("c", x, _image_grad(lambda xx: -c(xx), x), ext.san["c"], ext.san["c"].weight,
                          err(ext.san["c"], y)))
        rb = getattr(ext, "recon_batch", None)
        if rb is not None:
            code, x_rec, y_rec = rb[:3]
            mask = rb[3].view(-1, *([1] * (x_rec.dim() - 1))) if len(rb) > 3 else 1.0  # code=prior
            g_net.eval()
            try:
                xe = g_net.forward_input(code, gen)
            finally:
                g_net.train()
            paths.append(("e", xe, _image_grad(lambda xx: ((xx - x_rec) * mask).pow(2).sum(), xe), ext.san["e"],
                          ext.san["e"].weight, err(ext.san["e"], y_rec)))
            if ext.private_code:
                raw = code  # the released code; its clipped part is what the noise hides
                noise_norm = ext.code_std * math.sqrt(raw.shape[1])
                out["snr_code"] = (clip_rows(raw, ext.code_clip).norm(dim=1).median().item() / noise_norm
                                   if noise_norm > 0 else float("inf"))
    else:
        beta = float(hp.beta)
        if with_c and getattr(ext, "joint", True):
            paths.append(("DC", x, _image_grad(lambda xx: -beta * d(xx) - (1.0 - beta) * c(xx), x), ext.san_d, 1.0,
                          None))
        else:
            paths.append(("D", x, _image_grad(lambda xx: -beta * d(xx), x), ext.san_d, 1.0, None))
            if with_c:
                paths.append(("C", x, _image_grad(lambda xx: -(1.0 - beta) * c(xx), x), ext.san_c, 1.0, None))
    s_all, n_all = 0, 0
    for name, xp, g, san, weight, error in paths:
        s, n, gnorm = _path_stats(xp, g, params, san, weight, error, gen)
        out[f"gnorm_{name}"] = gnorm
        out[f"snr_{name}"] = (s.norm() / n.norm()).item() if san.noise_std > 0 else float("inf")
        s_all, n_all = s_all + s, n_all + n
    out["snr_all"] = (s_all.norm() / n_all.norm()).item() if n_all.norm() > 0 else float("inf")
    return out


def extension_classes() -> dict[str, type]:
    """The class whose ``generator_step`` the probe wraps, per method (each is a GS-WGAN extension)."""
    from dpgen.dpac.method import Dpac
    from dpgen.efsgd.train import Efsgd

    return {"gswgan": _train.GsWgan, "dpac": Dpac, "efsgd": Efsgd}


def measure(method: str, eps: float | str, steps: int, data_root: str, overrides: list[str], dataset: str = "fmnist",
            bases: tuple[int, ...] = (), seed: int = 0, noise_seed: int | None = None) -> list[dict[str, float]]:
    """One row of statistics per generator iteration of a real ``train()`` run: :func:`probe_step`'s (GS-WGAN's and
    DPAC's D path, with the ``bases``) and :func:`probe_paths`' (every method, every release path). ``noise_seed``
    fixes the run's secret streams (tests: two probes of one state)."""
    from hydra import compose, initialize_config_dir

    from dpgen.core.config import register_resolvers
    from dpgen.core.methods import CONFIG_DIR, load_method
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
    cls = extension_classes()[method]
    original = cls.generator_step

    def probed(self, it: int, k: torch.Tensor) -> torch.Tensor:
        row = {}
        if not hasattr(self, "san"):  # GS-WGAN / DPAC: the D-path statistics with the DCT bases
            with_c = self.c_start is not None and it >= self.c_start
            row.update(probe_step(self.base.g_net, self.base.disc, self.base.clf if with_c else None, k,
                                  self.san_d.clip, self.san_d.noise_multiplier, float(self.hp.beta), self.B,
                                  self.ncls, basis_of, gen))
        row.update(probe_paths(self, it, k, gen))
        rows.append(row)
        return original(self, it, k)

    seed_everything(seed)
    cls.generator_step = probed
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run = RecordingRun(Path(tmp), ledger, torch.device("cpu"), seed, {}, log_every=1, stop_after=steps,
                               progress=False, tensorboard=False, noise_seed=noise_seed)
            try:
                load_method(cfg.method.module).train(cfg[cfg.method.hparams], data, ledger, run)
            except TrainingInterrupted:
                pass
            finally:
                run.close()
    finally:
        cls.generator_step = original
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--method", default="gswgan", choices=("gswgan", "dpac", "efsgd"))
    ap.add_argument("--dataset", default="fmnist")
    ap.add_argument("--eps", default="10")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--bases", type=int, nargs="*", default=[49, 196])
    ap.add_argument("--data-root", default=None)
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. dpac.num_discriminators=200")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the run's setup line: K, B, T, z per path
    root = args.data_root or os.environ.get("DPGEN_DATA", "data")
    rows = measure(args.method, args.eps, args.steps, root, args.overrides, args.dataset, tuple(args.bases))
    for lo in range(0, len(rows), args.window):
        part = rows[lo:lo + args.window]
        keys = list(dict.fromkeys(key for r in part for key in r))  # paths appear when they start (C from t_c)
        cols = " ".join(f"{key}={statistics.median(r[key] for r in part if key in r):.3g}" for key in keys)
        print(f"iterations {lo}-{lo + len(part) - 1}: {cols}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
