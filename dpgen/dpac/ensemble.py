"""A stack of K functional networks trained at once (the GS-WGAN discriminator ensemble).

The K discriminators' parameters are stacked along a leading dim; a training step gathers the
rows of the selected members, computes every member's own WGAN-GP loss gradient with
``torch.func.vmap(torch.func.grad(...))`` and applies a per-member Adam update. Adam is
element-wise, so this equals K separate optimisers (tested against a per-member loop).
The authors instead ran one process per discriminator (official-code.md §1).
"""
from __future__ import annotations

import copy
from typing import Callable

import torch
from torch import nn
from torch.func import functional_call, grad, stack_module_state, vmap

from dpgen.dpac.nets import Forward, Params, power_iteration


class NetStack:
    """K networks of one functional architecture plus their spectral-norm vectors and Adam states."""

    def __init__(self, init: Callable[[torch.Generator], Params], sn: Callable[[Params, torch.Generator], Params],
                 k: int, g: torch.Generator, device: torch.device, shared_init: bool = False) -> None:
        """``shared_init``: every member starts from the same random draw (data-independent, so no privacy cost)."""
        members = [init(g)] * k if shared_init else [init(g) for _ in range(k)]
        us = [sn(members[0], g)] * k if shared_init else [sn(m, g) for m in members]
        self.params = {n: torch.stack([m[n] for m in members]).to(device) for n in members[0]}
        self.u = {n: torch.stack([m[n] for m in us]).to(device) for n in us[0]}
        self.m = {n: torch.zeros_like(t) for n, t in self.params.items()}
        self.v = {n: torch.zeros_like(t) for n, t in self.params.items()}
        self.t = torch.zeros(k, dtype=torch.long, device=device)

    def __len__(self) -> int:
        return int(self.t.shape[0])

    def gather(self, members: torch.Tensor) -> tuple[Params, Params]:
        return ({n: t[members] for n, t in self.params.items()}, {n: t[members] for n, t in self.u.items()})

    def member(self, k: int | torch.Tensor) -> tuple[Params, Params]:
        """Detached copies of one member's parameters (for the generator step). ``k`` may be a one-element
        device tensor: indexing by it keeps the training loop free of host syncs."""
        idx = torch.as_tensor(k, device=self.t.device).reshape(1)
        return ({n: t.index_select(0, idx)[0].detach() for n, t in self.params.items()},
                {n: t.index_select(0, idx)[0] for n, t in self.u.items()})

    def adam_step(self, members: torch.Tensor, grads: Params, lr: float, betas: tuple[float, float],
                  eps: float = 1e-8) -> None:
        """Adam (Kingma & Ba 2015, Alg. 1) on rows ``members`` only, each with its own step count."""
        b1, b2 = betas
        t = self.t[members] + 1
        self.t[members] = t
        for n, g in grads.items():
            shape = (-1,) + (1,) * (g.dim() - 1)
            m = self.m[n][members].mul(b1).add_(g, alpha=1 - b1)
            v = self.v[n][members].mul(b2).addcmul_(g, g, value=1 - b2)
            c1 = (1 - b1 ** t.to(g.dtype)).reshape(shape)
            c2 = (1 - b2 ** t.to(g.dtype)).reshape(shape)
            self.m[n][members], self.v[n][members] = m, v
            self.params[n][members] = self.params[n][members] - lr * (m / c1) / ((v / c2).sqrt() + eps)

    def reset(self, init: Callable[[torch.Generator], Params], sn: Callable[[Params, torch.Generator], Params],
              g: torch.Generator) -> None:
        """Re-initialise every member and its optimiser state (DPAC's per-iteration classifier reset)."""
        fresh = NetStack(init, sn, len(self), g, self.t.device)
        self.__dict__.update(fresh.__dict__)

    def state_dict(self) -> dict:
        return {"params": self.params, "u": self.u, "m": self.m, "v": self.v, "t": self.t}

    def load_state_dict(self, d: dict) -> None:
        """Restore a :meth:`state_dict` onto this stack's device (checkpoints are loaded on the CPU)."""
        dev = self.t.device
        self.params, self.u, self.m, self.v = ({n: t.to(dev) for n, t in d[key].items()}
                                               for key in ("params", "u", "m", "v"))
        self.t = d["t"].to(dev)


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


def functional_step(stack: NetStack, loss: Callable[..., torch.Tensor], members: torch.Tensor, *inputs: torch.Tensor,
                    lr: float, betas: tuple[float, float]) -> torch.Tensor:
    """One optimiser step of every selected member on its own inputs (leading member dim [M, ...]).

    Each member's gradient is ``torch.func.grad`` of its own loss, batched over members with
    ``vmap``; then per-member Adam. Returns the M losses.
    """
    p, u = stack.gather(members)
    u = vmap(power_iteration)(p, u)
    for n in u:
        stack.u[n][members] = u[n]

    def loss_and_aux(pp, uu, *xs):
        value = loss(pp, uu, *xs)
        return value, value.detach()

    grads, losses = vmap(grad(loss_and_aux, has_aux=True))(p, u, *inputs)
    stack.adam_step(members, grads, lr, betas)
    return losses


def critic_step(stack: NetStack, fwd: Forward, members: torch.Tensor, xr: torch.Tensor, yr: torch.Tensor,
                xf: torch.Tensor, yf: torch.Tensor, alpha: torch.Tensor, lam: float, drift: float, lr: float,
                betas: tuple[float, float]) -> torch.Tensor:
    """One WGAN-GP critic step for every selected member at once (Alg. 1 lines 5–10, members in parallel)."""
    return functional_step(stack, lambda p, u, a, b, c, d, al: critic_loss(fwd, p, u, a, b, c, d, al, lam, drift),
                           members, xr, yr, xf, yf, alpha, lr=lr, betas=betas)


def batched_forward(stack: NetStack, fwd: Forward, members: torch.Tensor, x: torch.Tensor,
                    y: torch.Tensor) -> torch.Tensor:
    """Outputs [M, B] of the selected members on their own inputs [M, B, ...]; differentiable w.r.t. x only."""
    p, u = stack.gather(members)
    p = {n: t.detach() for n, t in p.items()}
    return vmap(fwd)(p, u, x, y)


class GeneratorStack:
    """M throw-away warm-up generators, one per discriminator (official ``pretrain.py``), trained at once.

    Each pre-trained D_k must depend on its own partition only, so each plays against its own generator
    (a generator shared by a chunk would learn from every member's output and carry partition j's data into
    D_k). The M copies of one ``nn.Module`` architecture are stacked (``torch.func.stack_module_state``) and
    run by ``vmap(functional_call)`` on an eval-mode template, so torch's spectral-norm parametrisation does not
    update its vectors in place; :meth:`step` does the training forward's one power iteration on the stacked
    vectors itself. One Adam over the stacked tensors is M separate Adams: it is element-wise and all members
    step together (same step count). Never released.
    """

    def __init__(self, make: Callable[[], nn.Module], m: int, device: torch.device, lr: float,
                 betas: tuple[float, float], vmapped: bool | None = None, shared_init: bool = False) -> None:
        nets = [make().to(device)]
        nets += [copy.deepcopy(nets[0]) if shared_init else make().to(device) for _ in range(m - 1)]
        self.vmapped = torch.device(device).type != "cpu" if vmapped is None else bool(vmapped)
        self.template = copy.deepcopy(nets[0]).eval()
        self.params, self.buffers = stack_module_state(nets)
        self.opt = torch.optim.Adam(list(self.params.values()), lr=lr, betas=betas)
        self.m = m
        # torch spectral_norm keeps (u, v) as buffers "<prefix>.0._u" / "._v" of the weight "<prefix>.original"
        self.sn = [(n[:-len("0._u")] + "original", n, n[:-1] + "v") for n in self.buffers if n.endswith("._u")]

    def sample_z(self, b: int, g: torch.Generator, n: int | None = None) -> torch.Tensor:
        """[n, b, z_dim] latent codes from the template's own prior (n = M by default)."""
        n = self.m if n is None else n
        dev = next(iter(self.params.values())).device
        return self.template.sample_z(n * b, g, dev).view(n, b, -1)

    def __call__(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Member i's images for z[i], y[i] ([M, b, ...]).

        vmap on accelerators; by default a loop over members on a CPU, where it measured 1.2-3x faster
        (vmap turns the convolutions into grouped ones)."""
        def one(p, bu, zz, yy):
            return functional_call(self.template, (p, bu), (zz, yy))

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
        self.opt.zero_grad(set_to_none=True)
        loss(self(z, y)).backward()
        self.opt.step()
