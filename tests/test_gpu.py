"""On a real GPU (issue 14 §6): every method trains 2 steps, stops, and resumes on ``device=cuda``.

Marked ``gpu``: excluded from ``make test``; run with ``pytest -m gpu`` (skipped without CUDA). Host syncs
are reported by ``torch.cuda.set_sync_debug_mode("warn")`` (each with the Python line that caused it, shown
with ``-s``); the CPU harness (tests/test_device_discipline.py) is the test that enforces their budget.
Checked here: nothing crashes on CUDA, the resumed run ends where it should, and the released generator
lives and samples on the GPU; and a run resumed on CUDA continues its secret streams where the interrupted run left
them, as an uninterrupted CUDA run draws them, never replaying noise drawn before the restore
(``tests/test_resume_streams.py``, whose CPU twin runs in ``make test``).
"""
from __future__ import annotations

import os
import warnings
from collections import Counter

import pytest
import torch

from test_device_discipline import CASES, credit  # noqa: F401 (credit: the fixture)
from test_resume_streams import check_resume_continues_the_secret_streams, train_on
from tiny import METHODS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

# cuBLAS reads its workspace setting when it first runs: set before any test here touches the GPU, so that
# torch.use_deterministic_algorithms (the resume test below) gets deterministic cuBLAS products
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@pytest.mark.parametrize("case", list(CASES))
def test_two_steps_and_a_resume_on_cuda(case, tmp_path, request):
    from dpgen.core.run import TrainingInterrupted

    method, _, overrides, dataset = CASES[case]
    data = request.getfixturevalue("credit") if dataset == "credit" else None
    cuda = torch.device("cuda")
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(TrainingInterrupted):
                train_on(cuda, method, tmp_path, *overrides, data=data, stop_after=2)
            gen, ledger, run = train_on(cuda, method, tmp_path, *overrides, data=data, resume=True)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    syncs = Counter(f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message))
    print(f"\n{case}: {sum(syncs.values())} host syncs (2 steps, resume, the rest of the tiny run)")
    for where, n in syncs.most_common():
        print(f"  {where} x{n}")
    assert run.start_step == 2 and ledger.entries, "the second run resumed from step 2 and kept accounting"
    params = list(gen.parameters())
    assert params and all(p.device.type == "cuda" for p in params)
    if not data or not data.tabular:
        x, y = gen.sample(4, labels=torch.arange(4) % gen.num_classes, seed=0)
        assert torch.isfinite(x).all()


@pytest.mark.parametrize("method", METHODS)
def test_resume_on_cuda_continues_the_secret_streams(method, tmp_path, monkeypatch):
    """Uninterrupted, stopped and resumed CUDA runs with one noise seed: the secret draws before the stop and after
    the restore are the uninterrupted run's one for one, none after the restore repeats noise drawn before it, and
    the streams' states, the ledger and ε are the uninterrupted run's exactly. The runs use deterministic algorithms:
    CUDA's default kernels (cuDNN's convolution backward, atomic adds such as the ghost clipper's index_add_) may sum
    in another order each run, and a GAN amplifies that past any fixed tolerance within a few steps (dpgan's
    generator bias did, twice in two H200 runs, and matched under deterministic algorithms). The released weights
    are still compared within a tolerance, for kernels that have no deterministic version (a warning, not an
    error)."""
    _, stop, overrides, _ = CASES[method]
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        check_resume_continues_the_secret_streams(torch.device("cuda"), method, tmp_path, monkeypatch, stop,
                                                  *overrides, weights_tol=(1e-3, 1e-4))
    finally:
        torch.use_deterministic_algorithms(False)


def test_ghost_on_cuda_keeps_no_buffers_and_matches_the_cpu():
    """On CUDA the caching allocator reuses a layer's freed temporaries for the next layer's, so the ghost clipper
    keeps no buffers there (dpgen/privacy/ghost.py); its norms and clipped sum are the CPU's within TF32's tolerance."""
    from dpgen.nets.dcgan import ProjectionDiscriminator
    from dpgen.privacy.ghost import GhostClipper

    torch.manual_seed(0)
    d = ProjectionDiscriminator(10, [1, 28, 28], width=8)
    x, y, c = torch.rand(6, 1, 28, 28), torch.randint(0, 10, (6,)), torch.rand(6)
    cpu = GhostClipper(d).record(lambda: d(x, y))
    sums = cpu.clipped_sum(c)
    dc = d.cuda()
    clipper = GhostClipper(dc)
    rec = clipper.record(lambda: dc(x.cuda(), y.cuda()))
    assert not clipper._scratch
    torch.testing.assert_close(rec.sq_norms.cpu(), cpu.sq_norms, rtol=1e-2, atol=0)  # cuDNN may use TF32
    for a, b in zip(rec.clipped_sum(c.cuda()), sums):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-2, atol=1e-5)


@pytest.mark.parametrize("backend", ["ghost", "torch_func"])
def test_feta_step_captured_as_a_cuda_graph_replays_fresh_draws(backend):
    """``feta.cuda_graph``: the micro-batch step is captured (no fallback to eager) and every replay computes with its
    own draws: the same logical batch under two draws of the diffusion noise gives two different clipped sums, each
    the eager step's within TF32's tolerance; the Poisson remainder is padded to the captured shape."""
    from dpgen.feta.dpsgd import MicroStep, clipped_grad_sum_func
    from dpgen.nets.edm import EDMDenoiser
    from dpgen.nets.unet import UNet
    from dpgen.privacy.randomness import secret_generator

    torch.manual_seed(0)
    net = EDMDenoiser(UNet(1, 28, 10, nf=8, ch_mult=[1, 2], num_res_blocks=1, attn_res=[14])).cuda()
    eager = MicroStep(net, 0.1, grad_backend=backend)
    graphed = MicroStep(net, 0.1, grad_backend=backend, graph=True)
    x = torch.rand(11, 1, 28, 28, device="cuda") * 2 - 1
    y = torch.randint(0, 10, (11,), device="cuda")
    sums = []
    for seed in (1, 2, 3):
        got = {}
        for name, step in (("eager", eager), ("graph", graphed)):
            gen = secret_generator("cuda", seed=seed)
            got[name] = clipped_grad_sum_func(net, x, y, 4, 0.1, 4, gen, step=step)
        for a, b in zip(got["graph"][0], got["eager"][0]):
            torch.testing.assert_close(a, b, rtol=2e-2, atol=1e-5)
        torch.testing.assert_close(got["graph"][1], got["eager"][1], rtol=2e-2, atol=1e-6)
        sums.append(torch.cat([s.flatten() for s in got["graph"][0]]))
    assert graphed.fn.captured and graphed.fn.failed is None
    assert graphed.fn.calls == 9  # 3 micro-batches (4 + 4 + 3 padded to 4) per batch: two eager, a capture, replays
    assert not torch.allclose(sums[0], sums[1]) and not torch.allclose(sums[1], sums[2])


def test_feta_micro_batch_null_is_measured_on_cuda():
    """``feta.micro_batch: null`` on CUDA measures the run's step (peak growth per record) and fits a power of two of
    records into the measured share of the free memory; the probe leaves no gradient on the parameters."""
    from dpgen.feta.dpsgd import MicroStep, micro_batch_for
    from dpgen.nets.edm import EDMDenoiser
    from dpgen.nets.unet import UNet
    from dpgen.privacy import micro_batch as mb

    torch.manual_seed(0)
    net = EDMDenoiser(UNet(1, 28, 10, nf=8, ch_mult=[1, 2], num_res_blocks=1, attn_res=[14])).cuda()
    step = MicroStep(net, 1.0, grad_backend="ghost")

    def run(m: int) -> None:
        z = torch.zeros(m, 4, 1, 28, 28, device="cuda")
        step((z, torch.zeros(m, 4, dtype=torch.long, device="cuda"), torch.ones(m, 4, device="cuda"), z), m)

    fp = mb.measured_footprint(run, mb.CudaMemory(torch.device("cuda")))
    assert fp > 4 * 28 * 28 * 4, "at least the K rows' input images"
    m = micro_batch_for(net, None, 4, [1, 28, 28], 1 << 20, torch.device("cuda"), step=step)
    assert m & (m - 1) == 0 and m * fp < torch.cuda.get_device_properties(0).total_memory
    assert all(p.grad is None for p in net.parameters())


def test_gswgan_pretrain_chunk_null_is_measured_on_cuda():
    """``gswgan.pretrain_chunk: null`` on CUDA: the probe's throw-away pairs give a chunk between 1 and K, and the
    ensemble itself is untouched."""
    import importlib
    from functools import partial

    from omegaconf import OmegaConf

    from dpgen.ensemble import NetStack
    from dpgen.gswgan.nets import ResNetGenerator, disc_init
    from dpgen.nets.spectral import sn_init

    gtrain = importlib.import_module("dpgen.gswgan.train")
    shape = [1, 28, 28]
    disc = NetStack(partial(disc_init, 10, shape, 8), sn_init, 16, torch.Generator().manual_seed(0),
                    torch.device("cuda"))
    before = {k: v.clone() for k, v in disc.params.items()}
    hp = OmegaConf.create({"pretrain_chunk": None, "batch_size": 8, "lr": 1e-4, "g_lr": None, "betas": [0.0, 0.99],
                           "gp_weight": 10.0, "drift": 0.0})
    chunk = gtrain.pretrain_chunk_for(disc, partial(ResNetGenerator, 10, shape, 10, 8), hp, shape)
    assert 1 <= chunk <= 16
    assert all(torch.equal(before[k], v) for k, v in disc.params.items())
