"""The GS-WGAN discriminator ensemble's losses and its warm-up generators.

The K discriminators are a :class:`dpgen.ensemble.NetStack` (stacked functional networks, per-member Adam);
:func:`critic_step` runs one WGAN-GP step of every selected member at once. :class:`GeneratorStack` holds the
throw-away warm-up generators of pre-training, one per discriminator. The authors instead ran one process per
discriminator (official-code.md §1).
"""
from __future__ import annotations

import copy
from typing import Callable

import torch
from torch import nn
from torch.func import functional_call, grad, stack_module_state, vmap

from dpgen.gswgan.nets import Forward, Params
from dpgen.ensemble import MemberStack, NetStack, functional_step
from dpgen.core.precision import ensemble_compute
from dpgen.ensemble.compute import member_forward, to_compute


def critic_loss(fwd: Forward, p: Params, u: Params, xr: torch.Tensor, yr: torch.Tensor, xf: torch.Tensor,
                yf: torch.Tensor, alpha: torch.Tensor, lam: float, drift: float) -> torch.Tensor:
    """WGAN-GP critic loss (Gulrajani et al. 2017; GS-WGAN eq. 3): E[D(x̃)] − E[D(x)] + λ·GP + drift·E[D(x)²].

    Interpolates are scored with the real labels (in the private phase the fakes carry them too).
    """
    d_real = fwd(p, u, xr, yr)
    d_fake = fwd(p, u, xf, yf)
    xh = alpha.reshape(-1, *([1] * (xr.dim() - 1))) * xr + (1 - alpha.reshape(-1, *([1] * (xr.dim() - 1)))) * xf
    gx = grad(lambda z: fwd(p, u, z, yr).sum())(xh)
    gp = ((gx.flatten(1).norm(dim=1) - 1) ** 2).mean()
    return d_fake.mean() - d_real.mean() + lam * gp + drift * (d_real ** 2).mean()


def critic_step(stack: NetStack, fwd: Forward, members: torch.Tensor, xr: torch.Tensor, yr: torch.Tensor,
                xf: torch.Tensor, yf: torch.Tensor, alpha: torch.Tensor, lam: float, drift: float, lr: float,
                betas: tuple[float, float], sampled: bool = False) -> torch.Tensor:
    """One WGAN-GP critic step for every selected member at once (Alg. 1 lines 5–10, members in parallel);
    ``sampled``: the members are an iteration's Poisson sample (:func:`functional_step`)."""
    return functional_step(stack, lambda p, u, a, b, c, d, al: critic_loss(fwd, p, u, a, b, c, d, al, lam, drift),
                           members, xr, yr, xf, yf, alpha, lr=lr, betas=betas, sampled=sampled)


def _vmapped(device: torch.device | str) -> bool:
    """Whether warm-up generators on ``device`` run vmapped under the run's ``ensemble.generators``.

    ``auto`` keeps vmap on accelerators and the loop on a CPU, where the loop measured 1.2-3x faster. vmap turns
    each member's convolution into one group of a grouped convolution; at the paper's width (256 channels, 100
    members a chunk) that is the grouped backward the H200 profile names, and the loop's dense per-member
    convolutions are the alternative a GPU call times (docs/performance.md)."""
    mode = ensemble_compute().generators
    return torch.device(device).type != "cpu" if mode == "auto" else mode == "vmap"


class GeneratorStack:
    """M throw-away warm-up generators, one per discriminator (official ``pretrain.py``), trained at once.

    Each pre-trained D_k must depend on its own partition only, so each plays against its own generator
    (a generator shared by a chunk would learn from every member's output and carry partition j's data into
    D_k). The M copies of one ``nn.Module`` architecture are stacked (``torch.func.stack_module_state``) and
    run by ``vmap(functional_call)`` on an eval-mode template, so torch's spectral-norm parametrisation does not
    update its vectors in place; :meth:`step` does the training forward's one power iteration on the stacked
    vectors itself. Their Adam states are a :class:`~dpgen.ensemble.MemberStack` stepped as one lockstep block
    (all members step together), i.e. M separate Adams. Never released.
    """

    def __init__(self, make: Callable[[], nn.Module], m: int, device: torch.device, lr: float,
                 betas: tuple[float, float], vmapped: bool | None = None, shared_init: bool = False) -> None:
        """``vmapped``: the members batched by vmap or run in a loop; None: the run's ``ensemble.generators``."""
        nets = [make().to(device)]
        nets += [copy.deepcopy(nets[0]) if shared_init else make().to(device) for _ in range(m - 1)]
        self.vmapped = _vmapped(device) if vmapped is None else bool(vmapped)
        self.template = copy.deepcopy(nets[0]).eval()
        self.params, self.buffers = stack_module_state(nets)
        self.adam = MemberStack(self.params)  # the members' Adam states (one lockstep block)
        self.lr, self.betas = float(lr), (float(betas[0]), float(betas[1]))
        self.m = m
        # torch spectral_norm keeps (u, v) as buffers "<prefix>.0._u" / "._v" of the weight "<prefix>.original"
        self.sn = [(n[:-len("0._u")] + "original", n, n[:-1] + "v") for n in self.buffers if n.endswith("._u")]

    def sample_z(self, b: int, g: torch.Generator, n: int | None = None) -> torch.Tensor:
        """[n, b, z_dim] latent codes from the template's own prior (n = M by default)."""
        n = self.m if n is None else n
        dev = next(iter(self.params.values())).device
        return self.template.sample_z(n * b, g, dev).view(n, b, -1)

    def __call__(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Member i's images for z[i], y[i] ([M, b, ...]), by vmap or by a loop over members (the same function:
        tests/test_dpac_ensemble.py)."""
        with member_forward() as dt:  # the ensemble dtype by explicit casts (autocast misses vmap)
            return self._call(z, y, dt)

    def _call(self, z: torch.Tensor, y: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
        def one(p, bu, zz, yy):
            return functional_call(self.template, to_compute((p, bu), dt), (to_compute(zz, dt), yy)).float()

        if self.vmapped:
            return vmap(one)(self.params, self.buffers, z, y)
        return torch.stack([one({n: t[i] for n, t in self.params.items()}, {n: t[i] for n, t in self.buffers.items()},
                                z[i], y[i]) for i in range(self.m)])

    @torch.no_grad()
    def power_iteration(self) -> None:
        """torch's ``_SpectralNorm._power_method`` (one iteration), batched over members: u ← Wv/‖·‖, v ← Wᵀu/‖·‖."""
        for w_name, u_name, v_name in self.sn:
            w = self.params[w_name].flatten(2)  # Linear and Conv2d normalise along dim 0
            u = torch.nn.functional.normalize(torch.einsum("mij,mj->mi", w, self.buffers[v_name]), dim=1, eps=1e-12)
            self.buffers[u_name].copy_(u)
            self.buffers[v_name].copy_(torch.nn.functional.normalize(torch.einsum("mij,mi->mj", w, u), dim=1,
                                                                     eps=1e-12))

    def step(self, loss: Callable[[torch.Tensor], torch.Tensor], z: torch.Tensor, y: torch.Tensor) -> None:
        """One Adam step of every member on ``loss(images)`` (a sum of the members' own losses)."""
        self.power_iteration()
        grads = torch.autograd.grad(loss(self(z, y)), list(self.params.values()))
        self.adam.adam_block_(0, self.m, list(grads), self.lr, self.betas)
