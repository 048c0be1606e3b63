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
  median ‖clip(u_i, C_z)‖ against the noise's norm (its effect on θ goes through J at u, not a gradient);
* with a classifier path (DPAC's and EFSGD's C, from t_c on): ``c_acc_real``, the sampled classifiers' mean
  accuracy (argmax of their logits) on the first 512 images of the real test split, and ``c_acc_fake``, on the
  probe's batch of G's samples with G's labels: whether the C whose gradient reaches G classifies at all.

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
from dpgen.data.torch_utils import to_float
from dpgen.gswgan.nets import clf_forward, clf_logits
from dpgen.nets.dct import dct_basis
from dpgen.privacy import clip_rows

_train = importlib.import_module("dpgen.gswgan.train")  # the module (dpgen.gswgan exports the function as ``train``)


def _flat_grad(x: torch.Tensor, params: list[torch.Tensor], v: torch.Tensor) -> torch.Tensor:
    return torch.cat([t.flatten() for t in torch.autograd.grad(x, params, grad_outputs=v, retain_graph=True)])


def _members(k) -> torch.Tensor:
    return torch.as_tensor(k).reshape(-1)


def _rows(x: torch.Tensor, y: torch.Tensor, terms: list) -> torch.Tensor:
    """[M, B, ...] per-member image gradients (:func:`dpgen.gswgan.train.member_rows`)."""
    return _train.member_rows(x, y, terms)[0]


def _signal_noise(rows: torch.Tensor, clip: float, std: float, gen: torch.Generator,
                  basis: torch.Tensor | None = None, error: torch.Tensor | None = None,
                  clip_error: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """What a sanitiser releases for ``rows`` [M, B, d...] (flattened to coefficients by ``basis``): the M clipped
    rows of each image (plus clip(e, C2) with error feedback, ``error`` [M, B, ...]) summed, and one noise draw
    per image of std ``std``, both [B, d] and mapped back to pixels."""
    m, b = rows.shape[:2]
    flat = rows.reshape(m * b, *rows.shape[2:]).flatten(1)
    if basis is not None:
        flat = flat @ basis
    v = clip_rows(flat, clip)
    if error is not None:
        v = v + clip_rows(error.reshape(m * b, *error.shape[2:]).flatten(1), clip_error)
    v = v.reshape(m, b, v.shape[1]).sum(0)
    noise = torch.randn(v.shape, generator=gen, device=v.device) * std
    if basis is not None:
        v, noise = v @ basis.T, noise @ basis.T
    return v, noise


def probe_step(g_net, disc, clf, k, clip: float, z: float, beta: float, b: int, ncls: int,
               bases: dict[int, torch.Tensor], gen: torch.Generator, clf_members=None,
               c_score=clf_forward) -> dict[str, float]:
    """The statistics of one generator iteration (module docstring), G's loss as :func:`generator_step`'s, for the
    sampled partitions ``k`` (M of them; their clipped rows are summed before the noise)."""
    dev = next(g_net.parameters()).device
    members = _members(k).to(dev)
    y = torch.randint(0, ncls, (b,), generator=gen, device=dev)
    g_net.eval()  # no spectral-norm power iteration: the probe leaves G's state as training left it
    try:
        x = g_net(g_net.sample_z(b, gen, dev), y)
    finally:
        g_net.train()
    terms = [(disc, _train.disc_forward, members, beta)]
    if clf is not None:
        c_idx = torch.zeros_like(members) if clf_members is None else clf_members
        terms.append((clf, c_score, c_idx, 1.0 - beta))
    g = _rows(x, y, terms)
    params = [q for q in g_net.parameters() if q.requires_grad]
    std = 2.0 * clip * z

    def snr(basis: torch.Tensor | None) -> float:
        v, noise = _signal_noise(g, clip, std, gen, basis)
        s = _flat_grad(x, params, v.view_as(x))
        n = _flat_grad(x, params, noise.view_as(x))
        return (s.norm() / n.norm()).item() if std > 0 else float("inf")

    flat = g.reshape(-1, g[0, 0].numel()) if g.numel() else torch.zeros(1, x[0].numel(), device=dev)
    out = {"gnorm": flat.norm(dim=1).median().item(), "snr": snr(None), "members": float(len(members))}
    for n_basis, basis in bases.items():
        out[f"snr_L{n_basis}"] = snr(basis)
        out[f"kept_L{n_basis}"] = ((flat @ basis).norm(dim=1) / flat.norm(dim=1).clamp_min(1e-12)).median().item()
    return out


@torch.no_grad()
def classifier_accuracy(clfs, members: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> float:
    """Mean over ``members`` (rows of the stack ``clfs``) of each classifier's accuracy, argmax of its logits, on
    (``x``, ``y``); nan without members."""
    accs = []
    for j in members.tolist():
        p = {n: t[j] for n, t in clfs.params.items()}
        u = {n: t[j] for n, t in clfs.u.items()}
        accs.append((clf_logits(p, u, x).argmax(1) == y).float().mean())
    return torch.stack(accs).mean().item() if accs else float("nan")


def _path_stats(x: torch.Tensor, g: torch.Tensor, params: list[torch.Tensor], san, weight: float,
                error: torch.Tensor | None, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Path p's (signal, noise) in G's parameter space and its median pre-clip row norm: Jᵀ·w·Σ_j v_j and Jᵀ·w·n
    with v_j = clip(g_j, C) (+ clip(e, C2) with error feedback) for each sampled member j, n ~ N(0, std² I), as
    ``san`` would release them (``g`` [M, B, ...])."""
    v, noise = _signal_noise(g, san.clip, san.noise_std, gen, getattr(san, "basis", None), error,
                             getattr(san, "clip_error", 0.0))
    s = _flat_grad(x, params, (weight * v).view_as(x))
    n = _flat_grad(x, params, (weight * noise).view_as(x))
    gnorm = g.reshape(g.shape[0] * g.shape[1], -1).norm(dim=1).median().item() if g.numel() else 0.0
    return s, n, gnorm


def probe_paths(ext, it: int, k: torch.Tensor, gen: torch.Generator) -> dict[str, float]:
    """Signal/noise per release path of ``ext`` (a :class:`~dpgen.gswgan.train.GsWgan`, DPAC's or EFSGD's) at
    iteration ``it``, sampled partitions ``k``, before G's step (module docstring)."""
    base, ncls, b = ext.base, ext.ncls, ext.B
    g_net, dev = base.g_net, next(base.g_net.parameters()).device
    members = _members(k).to(dev)
    params = [q for q in g_net.parameters() if q.requires_grad]
    y = torch.randint(0, ncls, (b,), generator=gen, device=dev)
    g_net.eval()  # no spectral-norm power iteration: the probe leaves G's state as training left it
    try:
        x = g_net(g_net.sample_z(b, gen, dev), y, gen) if hasattr(ext, "san") else g_net(g_net.sample_z(b, gen, dev), y)
    finally:
        g_net.train()
    with_c = ext.c_start is not None and it >= ext.c_start
    clfs = getattr(ext, "clfs", None) if with_c else None
    out: dict[str, float] = {"members": float(len(members))}
    c_idx = None
    if clfs is not None:
        c_idx = torch.zeros_like(members) if clfs is base.clf else torch.arange(len(members), device=dev)
        n_real = min(512, len(ext.data.test.y))
        x_real = to_float(ext.data.test.x[:n_real]).to(dev)
        y_real = torch.as_tensor(ext.data.test.y[:n_real], dtype=torch.long, device=dev)
        out["c_acc_real"] = classifier_accuracy(clfs, c_idx, x_real, y_real)
        out["c_acc_fake"] = classifier_accuracy(clfs, c_idx, x.detach(), y)
    d_term = lambda w: (base.disc, _train.disc_forward, members, w)  # noqa: E731
    score = ext.c_score
    c_term = lambda w: (clfs, score, c_idx, w)  # noqa: E731
    paths: list[tuple[str, torch.Tensor, torch.Tensor, object, float, torch.Tensor | None]] = []
    if hasattr(ext, "san"):  # EFSGD: one error-feedback sanitiser per path, weights after the noise
        def err(san, rows_y):
            if san.error is None or not san.error_feedback:
                return None
            return san.error.index_select(0, members)[:, rows_y]

        if clfs is not None and ext.joint:  # one sanitiser on the gradient of -D - λ_c·C
            lam = ext.san["c"].weight
            paths.append(("dc", x, _rows(x, y, [d_term(1.0), c_term(lam)]), ext.san["d"], 1.0, err(ext.san["d"], y)))
        else:
            paths.append(("d", x, _rows(x, y, [d_term(1.0)]), ext.san["d"], 1.0, err(ext.san["d"], y)))
        if clfs is not None and not ext.joint:
            paths.append(("c", x, _rows(x, y, [c_term(1.0)]), ext.san["c"], ext.san["c"].weight,
                          err(ext.san["c"], y)))
        rb = getattr(ext, "recon_batch", None)
        if rb is not None:
            code, targets, y_rec = rb[:3]
            g_net.eval()
            try:
                xe = g_net.forward_input(code, gen)
            finally:
                g_net.train()
            m = len(members)
            rows = 2.0 * (xe.detach().unsqueeze(0) - targets[:m])
            if len(rb) > 3:  # code=prior: the row mask
                rows = rows * rb[3][:m].view(*rb[3][:m].shape, *([1] * (rows.dim() - 2)))
            paths.append(("e", xe, rows, ext.san["e"], ext.san["e"].weight,
                          err(ext.san["e"], y_rec)))
            if ext.private_code:
                raw = code  # the released code; its clipped part is what the noise hides
                noise_norm = ext.code_std * math.sqrt(raw.shape[1])
                out["snr_code"] = (clip_rows(raw, ext.code_clip).norm(dim=1).median().item() / noise_norm
                                   if noise_norm > 0 else float("inf"))
    else:
        beta = ext.beta
        if clfs is not None and getattr(ext, "joint", True):
            paths.append(("DC", x, _rows(x, y, [d_term(beta), c_term(1.0 - beta)]), ext.san_d, 1.0, None))
        else:
            paths.append(("D", x, _rows(x, y, [d_term(beta)]), ext.san_d, 1.0, None))
            if clfs is not None:
                paths.append(("C", x, _rows(x, y, [c_term(1.0 - beta)]), ext.san_c, 1.0, None))
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
            clfs = getattr(self, "clfs", None) if with_c else None
            c_idx = (None if clfs is None or clfs is self.base.clf
                     else torch.arange(len(k), device=k.device))
            row.update(probe_step(self.base.g_net, self.base.disc, clfs, k, self.san_d.clip,
                                  self.san_d.noise_multiplier, self.beta, self.B, self.ncls, basis_of,
                                  gen, clf_members=c_idx, c_score=self.c_score))
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
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. gswgan.num_discriminators=200")
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
