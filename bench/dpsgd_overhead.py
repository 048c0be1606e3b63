"""Time one DP-SGD step against one non-private step of the same batch, per network and per-sample-gradient backend.

Networks (the DP-trained ones, at their quick-profile sizes by default):
  dpgan_D    dpgan's ProjectionDiscriminator (real + fake rows, BCE)
  dpaf_C     DPAF's classifier C, all of it by DP-SGD (the sound variant of phase 1)
  dpaf_D     DPAF's D with only conv2* trained by DP-SGD (conv1 frozen, head trained elsewhere)
  feta_unet  the FETA/DPDM UNet (EDM denoising loss)
Backends for the per-sample gradients:
  hooks      opacus GradSampleModule, grad_sample_mode="hooks" (what the methods use today)
  functorch  opacus GradSampleModule with force_functorch=True (opacus' grad_sample_mode="functorch")
  torch.func vmap(grad(per-sample loss)) over torch.func.functional_call
  ghost      dpgen.privacy.ghost.GhostClipper: per-record norms by ghost norm or materialised gradient per layer,
             the clipped sum by book-keeping (no per-record gradient of a ghost layer, no second backward); on a
             CPU the convolutions' per-record gradients by dpgen's kernel (dpgen/privacy/ghost_kernel.cpp)
  ghost-plain  the same without the kernel (dpgen.privacy.ghost.plain_strategy: the PyTorch path)
  compiled   torch.func's per-sample gradients, norms, clipping and clipped sum in one torch.compile'd function
             (inductor; what ``compile=true`` runs: dpgen.feta.dpsgd.MicroStep, dpgen.dpgan.compiled.PerSampleD)
Every private step does the same clipping (per-sample norm over all trained parameters), summing,
Gaussian noise and optimizer step, so the ratios differ only by how per-sample gradients are obtained.
With ``--compile`` the non-private step is compiled too (its forward and backward: ``compile=true``'s
non-private counterpart) and a second ratio, compiled private / compiled non-private, is printed.
``--multiplicity K`` (feta_unet only) gives every record K rows (feta's diffusion draws) whose losses are averaged
before clipping, as feta does: ``--batch`` then counts records, each of K rows, and ``--unet paper`` builds the
paper profile's UNet (nf 32, ch_mult 2,2, two residual blocks, attention at 14) instead of the quick one.
All variants of a network run in this process, on the same weights and batch, interleaved rep by rep, so a
loaded machine slows them alike (the ratios are meaningful under load, the milliseconds are not).
``--cpu-time`` adds a line per network with the ratios of the steps' CPU time in this thread (CPU only, one
thread): time the other jobs take from this one is not counted, what they take from its caches still is.

    OMP_NUM_THREADS=1 python bench/dpsgd_overhead.py [--device cpu|cuda] [--compile] [--batch 64] [--reps 5]
        [--threads 1] [--nets dpgan_D,feta_unet] [--kernels 8] [--multiplicity 32 --unet paper] [--width 64]
        [--backends hooks,torch.func,ghost] [--cpu-time] [--faults] [--malloc keep|system]

Both steps run with freed host memory kept for the next step, as a dpgen training run does
(dpgen.core.host.keep_freed_memory: glibc's mallopt); ``--malloc system`` keeps glibc's defaults, under which
both steps map and fault their temporaries in afresh every step.

``--faults`` adds a line per network with each step's minor page faults (CPU, ``getrusage``): memory the allocator
maps afresh every step, whose first touch costs a fault per page (glibc returns large freed blocks to the system).

``--kernels N`` names what a private step adds: torch.profiler over one non-private and one private (hooks)
step, then the N operators whose self time grows most from the first to the second (CPU operators on a CPU,
kernels on CUDA), each with its share of the private step's profiled time.
"""
from __future__ import annotations

import argparse
import copy
import resource
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
from opacus import GradSampleModule
from torch.func import functional_call, grad, vmap

from dpgen.core.host import keep_freed_memory
from dpgen.dpaf.nets import DpafNet, sin
from dpgen.nets.dcgan import ProjectionDiscriminator
from dpgen.nets.unet import UNet
from dpgen.privacy.ghost import GhostClipper, plain_strategy, strategy

BACKENDS = ("hooks", "functorch", "torch.func", "ghost", "ghost-plain")
COMPILED = ("compiled",)
K, SHAPE = 10, [1, 28, 28]


class Bench(nn.Module):
    """A network plus its per-sample loss: forward(*batch) -> loss of each row (shape [rows]); ``k`` rows per
    record (consecutive), whose losses a record averages before clipping."""

    def __init__(self, net: nn.Module, loss, k: int = 1) -> None:
        super().__init__()
        self.net, self.loss, self.k = net, loss, int(k)

    def forward(self, *batch):
        return self.loss(self.net, *batch)

    def records(self, *batch):
        """The per-record losses: each record's mean over its k rows."""
        return self(*batch).reshape(-1, self.k).mean(1)


def dpgan_d(batch: int, width: int, k: int = 1, unet: str = "quick"):
    def loss(net, x, y, t):
        return F.binary_cross_entropy_with_logits(net(x, y), t, reduction="none")

    x = torch.rand(batch, *SHAPE)
    y = torch.randint(0, K, (batch,))
    t = torch.cat([torch.ones(batch // 2), torch.zeros(batch - batch // 2)])
    return Bench(ProjectionDiscriminator(K, SHAPE, width=width), loss), (x, y, t)


class VmapDpafNet(DpafNet):
    """DpafNet with its label maps built by indexing an identity matrix instead of F.one_hot: the same
    values, but F.one_hot checks the labels' range with a data-dependent .item(), which vmap (torch.func)
    refuses. dpgen/dpaf/nets.py would need the same one-line change for torch.func to train it."""

    def features(self, x, labels=None, sin_eps: float = 1e-5):
        h = self.conv1(x * 2 - 1)
        if self.k_in:
            onehot = torch.eye(self.k_in, dtype=h.dtype, device=h.device)[labels]
            h = torch.cat([h, onehot[:, :, None, None].expand(-1, -1, *h.shape[-2:])], dim=1)
        return sin(self.conv2(h), sin_eps)


def dpaf_c(batch: int, width: int, k: int = 1, unet: str = "quick"):
    def loss(net, x, y):  # sound phase 1: per-sample MSE of the class-proportion output to the one-hot label
        return ((net.score(net.features(x)).softmax(1) - torch.eye(K, device=y.device)[y]) ** 2).sum(1)

    return Bench(VmapDpafNet(SHAPE, [1, 1, 1], width=width, out_dim=K, fc_hidden=32), loss), \
        (torch.rand(batch, *SHAPE), torch.randint(0, K, (batch,)))


def dpaf_d(batch: int, width: int, k: int = 1, unet: str = "quick"):
    def loss(net, x, y, t):  # conv2* through D̂ (no aggregation), conv1 frozen
        return F.binary_cross_entropy_with_logits(net.score(net.features(x, y)), t, reduction="none")

    net = VmapDpafNet(SHAPE, [1, 1, 1], width=width, out_dim=1, num_classes_in=K, fc_hidden=32)
    for p in list(net.conv1.parameters()) + list(net.head.parameters()):
        p.requires_grad_(False)
    t = torch.cat([torch.ones(batch // 2), torch.zeros(batch - batch // 2)])
    return Bench(net, loss), (torch.rand(batch, *SHAPE), torch.randint(0, K, (batch,)), t)


def feta_unet(batch: int, width: int, k: int = 1, unet: str = "quick"):
    def loss(net, x, y, sigma, n):  # EDM-style denoising loss on fixed noise levels (preconditioning left out)
        out = net(x + sigma[:, None, None, None] * n, sigma.log() / 4, y)
        return ((out - x) ** 2).flatten(1).mean(1)

    if unet == "paper":  # configs/method/feta.yaml, profile=paper on 28 px
        net = UNet(1, 28, K, nf=32, ch_mult=(2, 2), num_res_blocks=2, attn_res=(14,))
    else:
        net = UNet(1, 28, K, nf=width, ch_mult=(1, 2), num_res_blocks=1, attn_res=(7,))
    rows = batch * k
    x = (torch.rand(batch, *SHAPE) * 2 - 1).repeat_interleave(k, 0)  # a record's K rows: one image, K draws
    y = torch.randint(0, K, (batch,)).repeat_interleave(k, 0)
    return Bench(net, loss, k), (x, y, torch.rand(rows) * 5 + 0.1, torch.randn_like(x))


NETS = {"dpgan_D": (dpgan_d, 32), "dpaf_C": (dpaf_c, 16), "dpaf_D": (dpaf_d, 16), "feta_unet": (feta_unet, 8)}


def noisy_step(params: list[torch.Tensor], grads: list[torch.Tensor], opt, clip: float, sigma: float) -> None:
    """Clip each row's gradient (norm over all parameters), sum, add N(0, σ²C²), step."""
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads]).norm(dim=0)
    scale = (clip / (norms + 1e-6)).clamp(max=1.0)
    for p, g in zip(params, grads):
        p.grad = torch.einsum("b,b...->...", scale, g) + sigma * clip * torch.randn_like(p)
    opt.step()


def make_steps(bench: Bench, batch: tuple, compile_: bool = False, backends: tuple = BACKENDS) -> dict:
    """One callable per variant (the non-private step and ``backends``), each on its own deep copy of the same
    initial weights."""
    steps = {}

    plain = copy.deepcopy(bench)
    p_params = [p for p in plain.parameters() if p.requires_grad]
    p_opt = torch.optim.SGD(p_params, lr=1e-4)

    def non_private():
        p_opt.zero_grad(set_to_none=True)
        plain.records(*batch).sum().backward()
        p_opt.step()

    steps["non-private"] = non_private

    for mode in [b for b in ("hooks", "functorch") if b in backends]:
        model = copy.deepcopy(bench)
        gsm = GradSampleModule(model, loss_reduction="sum", force_functorch=(mode == "functorch"))
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.SGD(params, lr=1e-4)

        def opacus_step(gsm=gsm, params=params, opt=opt):
            opt.zero_grad(set_to_none=True)
            for p in params:
                p.grad_sample = None
            (gsm(*batch).sum() / bench.k).backward()  # per-row grad_sample, summed over a record's k rows below
            noisy_step(params, [p.grad_sample.reshape(-1, bench.k, *p.shape).sum(1) for p in params], opt, 1.0, 1.0)

        steps[mode] = opacus_step

    names, params, opt, one_loss = functional_copy(bench)
    per_sample = vmap(grad(one_loss), in_dims=(None,) + (0,) * len(batch))
    by_record = records_of(batch, bench.k)

    def func_step():
        grads = per_sample({n: p.detach() for n, p in zip(names, params)}, *by_record)
        noisy_step(params, [grads[n] for n in names], opt, 1.0, 1.0)

    if "torch.func" in backends:
        steps["torch.func"] = func_step

    for mode, rule in (("ghost", strategy), ("ghost-plain", plain_strategy)):
        if mode not in backends:
            continue
        model = copy.deepcopy(bench)
        clipper = GhostClipper(model.net, rule)
        g_params = [p for p in model.parameters() if p.requires_grad]
        g_opt = torch.optim.SGD(g_params, lr=1e-4)

        def ghost_step(model=model, clipper=clipper, g_params=g_params, g_opt=g_opt):
            rec = clipper.record(lambda: model.records(*batch))
            scale = (1.0 / (rec.norms + 1e-6)).clamp(max=1.0)
            for p, s in zip(g_params, rec.clipped_sum(scale)):
                p.grad = s + torch.randn_like(p)
            g_opt.step()

        steps[mode] = ghost_step
    if compile_:
        steps.update(compiled_steps(bench, batch))
    return steps


def records_of(batch: tuple, k: int) -> tuple:
    """The batch's tensors with records on dim 0 and each record's k rows on dim 1 (what vmap maps over)."""
    return tuple(t.reshape(-1, k, *t.shape[1:]) for t in batch)


def functional_copy(bench: Bench) -> tuple:
    """A copy of ``bench`` for torch.func: its trainable parameters' names and tensors, an SGD over them, and the
    loss of one record (its k rows, :func:`records_of`) as a function of the trainable parameters."""
    model = copy.deepcopy(bench)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = [p for p in model.parameters() if p.requires_grad]
    frozen = {n: p for n, p in model.named_parameters() if not p.requires_grad}
    buffers = dict(model.named_buffers())

    def one_loss(train: dict, *rows):
        return functional_call(model, ({**train, **frozen}, buffers), rows).mean()

    return names, params, torch.optim.SGD(params, lr=1e-4), one_loss


def compiled_steps(bench: Bench, batch: tuple) -> dict:
    """``compile=true``'s two steps: the non-private forward/backward compiled, and the private step's per-sample
    gradients + clipping + clipped sum compiled in one function (noise and the optimizer step eager, as in dpgen)."""
    plain = copy.deepcopy(bench)
    p_params = [p for p in plain.parameters() if p.requires_grad]
    p_opt = torch.optim.SGD(p_params, lr=1e-4)
    loss_fn = torch.compile(lambda *b: plain.records(*b).sum(), dynamic=False)

    def non_private_compiled():
        p_opt.zero_grad(set_to_none=True)
        loss_fn(*batch).backward()
        p_opt.step()

    names, params, opt, one_loss = functional_copy(bench)
    by_record = records_of(batch, bench.k)

    def clipped_sum(*b):
        grads = vmap(grad(one_loss), in_dims=(None,) + (0,) * len(b))({n: p.detach() for n, p in zip(names, params)}, *b)
        g = [grads[n] for n in names]
        norms = torch.stack([x.flatten(1).norm(dim=1) for x in g]).norm(dim=0)
        scale = (1.0 / (norms + 1e-6)).clamp(max=1.0)
        return [torch.einsum("b,b...->...", scale, x) for x in g]

    summed = torch.compile(clipped_sum, dynamic=False)

    def compiled_step():
        for p, s in zip(params, summed(*by_record)):
            p.grad = s + torch.randn_like(p)
        opt.step()

    return {"non-private compiled": non_private_compiled, "compiled": compiled_step}


def cpu_ratios(cpu: dict[str, list[float]]) -> str:
    """Each variant's median thread CPU time and its ratio to the non-private step's."""
    med = {k: sorted(v)[len(v) // 2] for k, v in cpu.items() if v}
    base = med["non-private"]
    return ", ".join(f"{k} {v * 1e3:.1f} ms" + ("" if k == "non-private" else f" ({v / base:.2f})")
                     for k, v in med.items())


def profiled_ops(fn, device: torch.device) -> tuple[dict[str, float], float]:
    """Self time (s) per operator/kernel over one call of ``fn`` (device time on CUDA, CPU time otherwise),
    and the call's total of those self times."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        fn()
        _sync(device)
    out: dict[str, float] = {}
    for ev in prof.key_averages():
        t = (ev.self_device_time_total if cuda else ev.self_cpu_time_total) / 1e6
        if t > 0:
            out[ev.key] = out.get(ev.key, 0.0) + t
    return out, sum(out.values())


def added_ops(plain: dict[str, float], private: dict[str, float], total: float, n: int) -> list[str]:
    """The ``n`` operators whose self time grows most from the non-private to the private step."""
    delta = sorted(((private.get(k, 0.0) - plain.get(k, 0.0), k) for k in private), reverse=True)[:n]
    return [f"    +{d * 1e3:8.2f} ms ({100 * d / total:5.1f} % of the private step)  {k[:90]}" for d, k in delta if d > 0]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:<i>")
    ap.add_argument("--compile", action="store_true", help="also time compile=true's steps (inductor)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--kernels", type=int, default=0,
                    help="print the N operators the private (hooks and ghost) steps add")
    ap.add_argument("--multiplicity", type=int, default=1, help="feta_unet: K rows per record, averaged before clipping")
    ap.add_argument("--unet", default="quick", choices=("quick", "paper"), help="feta_unet: the profile's UNet")
    ap.add_argument("--width", type=int, default=None,
                    help="the networks' width (dpgan_D: d_width, 32 quick and 64 paper; default: each net's quick one)")
    ap.add_argument("--backends", default=",".join(BACKENDS),
                    help=f"the private steps to time, a subset of {','.join(BACKENDS)} (--compile adds compiled)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="also print the ratios of the steps' thread CPU time (CPU, --threads 1 only)")
    ap.add_argument("--faults", action="store_true", help="also print each step's minor page faults (CPU)")
    ap.add_argument("--malloc", default="keep", choices=("keep", "system"),
                    help="keep: freed host memory kept for the next step, as a training run does; system: glibc's "
                         "defaults")
    a = ap.parse_args()
    chosen = tuple(b for b in a.backends.split(",") if b)
    if not chosen or set(chosen) - set(BACKENDS):
        ap.error(f"--backends must name some of {', '.join(BACKENDS)}, got {a.backends!r}")
    device = torch.device(a.device)
    if a.cpu_time and (device.type != "cpu" or a.threads != 1):
        ap.error("--cpu-time times this thread only: it needs --device cpu and --threads 1")
    torch.set_num_threads(a.threads)
    kept = a.malloc == "keep" and keep_freed_memory()
    warnings.filterwarnings("ignore")  # opacus' full-backward-hook warnings on inputs without grad
    torch.manual_seed(0)
    backends = chosen + (COMPILED if a.compile else ())
    print(f"device {device}, batch {a.batch}, {a.reps} reps (median), {torch.get_num_threads()} thread(s), "
          f"torch {torch.__version__}; feta_unet: K={a.multiplicity}, {a.unet} UNet; host memory "
          f"{'kept' if kept else 'glibc defaults'}")
    print(f"{'network':<10} {'params':>8} {'non-private ms':>15} " + " ".join(f"{b + ' ms':>14} {'ratio':>6}"
                                                                          for b in backends) + "  fastest")
    for name in a.nets.split(","):
        build, width = NETS[name]
        width = a.width or width
        k = a.multiplicity if name == "feta_unet" else 1
        bench, batch = build(a.batch, width, k, a.unet)
        bench, batch = bench.to(device), tuple(t.to(device) for t in batch)
        n_params = sum(p.numel() for p in bench.parameters() if p.requires_grad)
        steps = make_steps(bench, batch, a.compile, chosen)
        times: dict[str, list[float]] = {k: [] for k in steps}
        cpu: dict[str, list[float]] = {k: [] for k in steps}
        faults: dict[str, int] = {k: 0 for k in steps}
        failed: dict[str, str] = {}
        for k, fn in steps.items():  # warm-up (compiles; finds unsupported backends)
            try:
                fn()
                fn()
            except Exception as exc:  # noqa: BLE001 - report the backend as unsupported, keep benchmarking
                failed[k] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
        for _ in range(a.reps):  # interleaved, so load changes on a shared machine hit every variant alike
            for k, fn in steps.items():
                if k in failed:
                    continue
                _sync(device)
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                t0, c0 = time.perf_counter(), time.thread_time()
                fn()
                _sync(device)
                times[k].append(time.perf_counter() - t0)
                cpu[k].append(time.thread_time() - c0)
                faults[k] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        med = {k: sorted(v)[len(v) // 2] for k, v in times.items() if v}
        base = med["non-private"]
        cells = []
        for b in backends:
            cells.append(f"{'failed':>14} {'–':>6}" if b not in med else f"{med[b] * 1e3:>14.1f} {med[b] / base:>6.2f}")
        fastest = min((b for b in backends if b in med), key=med.get)
        print(f"{name:<10} {n_params:>8} {base * 1e3:>15.1f} " + " ".join(cells) + f"  {fastest}")
        if a.cpu_time:
            print(f"  {name} thread CPU time: " + cpu_ratios(cpu))
        if a.faults:
            print(f"  {name} minor page faults per step: " + ", ".join(f"{k} {faults[k] / a.reps:.0f}"
                                                                     for k in steps if k not in failed))
        if "compiled" in med and "non-private compiled" in med:
            c = med["non-private compiled"]
            print(f"  {name} compile=true: non-private {c * 1e3:.1f} ms, private {med['compiled'] * 1e3:.1f} ms, "
                  f"ratio {med['compiled'] / c:.2f} (private compiled / non-private eager: {med['compiled'] / base:.2f})")
        for b, why in failed.items():
            print(f"  {name} {b}: {why}")
        if a.kernels > 0:
            plain, _ = profiled_ops(steps["non-private"], device)
            for b in ("hooks", "ghost"):
                if b in med:
                    private, total = profiled_ops(steps[b], device)
                    print(f"  {name}: what the private ({b}) step adds over the non-private one, by self time:")
                    print("\n".join(added_ops(plain, private, total, a.kernels)))


if __name__ == "__main__":
    main()
