"""``compile=true`` (dpgen/core/compile.py): the compiled hot steps of the DP-SGD methods compute today's function.

On the CPU with torch's inductor backend: compiled equals eager within fp32's tolerance (1e-5 relative) for
dpgan's discriminator step and generator loss, feta/dpdm's DP-SGD micro-batch and the sampler's denoiser;
``torch._dynamo.explain`` finds no graph break in a hot step; Poisson batches are padded to buckets, so a run's
recompilations are bounded; padded rows add exactly zero to the clipped sum (weight 0) and nothing to the ledger,
and a bucket is never smaller than the batch. Compilation is slow on a CPU (tens of seconds per graph, minutes on
a loaded machine with a cold cache): dpgan's discriminator step is the family's representative in ``make test``;
the rest is ``@pytest.mark.slow``. Recompilation counts use dynamo's counting backend (the guards, hence the
recompilations, do not depend on the backend).
"""
from __future__ import annotations

import copy
import importlib
import warnings

import pytest
import torch
import torch.nn.functional as F
from opacus import GradSampleModule

from dpgen.core.compile import BUCKETS, bucket_size, compile_enabled, compiling, maybe_compile
from dpgen.dpgan.compiled import GeneratorLoss, PerSampleD
from dpgen.feta.dpsgd import MicroStep, clipped_grad_sum_func
from dpgen.nets.dcgan import CondGenerator, ProjectionDiscriminator
from dpgen.nets.edm import EDMDenoiser, edm_draws
from dpgen.nets.unet import UNet
from dpgen.privacy.per_sample import pad_rows
from dpgen.privacy.randomness import secret_generator

from tiny import compose_cfg, train_in_memory

tr = importlib.import_module("dpgen.dpgan.train")
RTOL = 1e-5  # fp32


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _d_batch(rows: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(rows, 1, 28, 28, generator=g), torch.randint(0, 10, (rows,), generator=g),
            (torch.rand(rows, generator=g) < 0.5).float())


def _unet(seed: int = 0) -> EDMDenoiser:
    torch.manual_seed(seed)
    return EDMDenoiser(UNet(1, 8, 3, nf=4, ch_mult=[1, 2], num_res_blocks=1, attn_res=[4]))


def _feta_batch(m: int, k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(m * k, 1, 8, 8, generator=g) * 2 - 1
    y = torch.randint(0, 3, (m * k,), generator=g)
    sigma, noise = edm_draws(x, g)
    return x.reshape(m, k, 1, 8, 8), y.reshape(m, k), sigma.reshape(m, k), noise.reshape(m, k, 1, 8, 8)


# ---- the switch and the buckets (fast) ----------------------------------------------------------------------

def test_the_switch_is_off_by_default_and_scoped():
    assert not compile_enabled()
    with compiling(True):
        assert compile_enabled()
        with compiling(False):
            assert not compile_enabled()
        assert compile_enabled()
    assert not compile_enabled()
    f = lambda x: x + 1  # noqa: E731
    assert maybe_compile(f) is f, "eager by default: today's path, unchanged"


def test_compile_is_a_top_level_bool_defaulting_to_false():
    assert compose_cfg("dpgan").compile is False
    assert compose_cfg("feta", "compile=true").compile is True
    from dpgen.core.schema import LATER_KEYS, Facts, check_config

    assert LATER_KEYS["compile"] is False  # runs saved before the key read as eager
    check_config(compose_cfg("feta", "compile=true", "feta.micro_batch=null"), Facts())  # null: sized by memory
    with pytest.raises(Exception, match="compile=maybe"):
        compose_cfg("dpgan", "compile=maybe")


def test_a_bucket_is_never_smaller_than_the_batch_and_the_buckets_are_few():
    for rows in range(0, 3000):
        b, coarse = bucket_size(rows), bucket_size(rows, 64, fine=False)
        assert b >= rows and coarse >= rows, "a Poisson-sampled record is never dropped to fit a bucket"
        assert b in BUCKETS or b == rows
        assert b <= max(8, rows * 1.25), "a quarter octave: at most 25% padding"
    assert bucket_size(40, cap=32) == 40, "a cap below the rows is ignored"
    assert bucket_size(20, cap=32, fine=False) == 32 and bucket_size(33, cap=32, fine=False) == 64
    # dpgan's rows: a Poisson batch of mean 64 (std 8) plus 64 fake rows; within 5 std: at most 5 graphs
    assert len({bucket_size(r) for r in range(128 - 40, 128 + 41)}) <= 5
    with pytest.raises(ValueError, match="never smaller"):
        pad_rows((torch.zeros(5, 2),), 4)


def test_padded_rows_add_exactly_zero_to_the_clipped_sum():
    net, k, m = _unet(), 2, 5
    batch = _feta_batch(m, k)
    plain = MicroStep(net, clip=0.01)
    padded = MicroStep(net, clip=0.01, pad=True)  # eager, but padded to a bucket as the compiled step is
    assert pad_rows(batch, bucket_size(m, 16, fine=False))[0][0].shape[0] == 8
    (s0, l0), (s1, l1) = plain(batch, 16), padded(batch, 16)
    for a, b in zip(s1, s0):
        assert _rel(a, b) < RTOL
    assert _rel(l1, l0) < RTOL
    # rows of weight 0 only: every parameter's clipped sum is exactly zero (and so is the loss)
    sums, loss = padded._sum(torch.zeros(m), *batch)
    assert all(bool((s == 0).all()) for s in sums) and float(loss) == 0.0
    assert all(s.dtype == torch.float32 for s in s1), "the clipped sum stays fp32"


def test_dpgan_padded_rows_have_exactly_zero_gradient_and_never_reach_the_optimizer():
    d = ProjectionDiscriminator(10, [1, 28, 28], width=4)
    ps = PerSampleD(d, compile=False)
    x, y, t = _d_batch(6)
    grads, _ = ps._grads(x, y, t, torch.zeros(6))
    assert all(bool((g == 0).all()) for g in grads)
    ps.compiled = True  # pad as the compiled step does (the function stays eager)
    grads, _ = ps(x, y, t)
    assert all(g.shape[0] == 6 for g in grads), "padded rows are sliced off before opacus clips"


# ---- compiled == eager (inductor) -------------------------------------------------------------------------------

def test_dpgan_compiled_discriminator_step_equals_opacus_eager(one_torch_thread):
    """The family's representative in ``make test``: the compiled per-sample gradients vs opacus' hooks, and the
    whole DP-SGD step (clip, secret noise, Adam) on both, from the same noise stream."""
    warnings.filterwarnings("ignore", message="Full backward hook")
    torch.manual_seed(0)
    d = ProjectionDiscriminator(10, [1, 28, 28], width=4)
    x, y, t = _d_batch(37)
    gsm = GradSampleModule(copy.deepcopy(d), loss_reduction="sum")
    d_c = copy.deepcopy(d)
    opts = []
    for net in (gsm, d_c):
        opts.append(tr.DPSGDOptimizer(torch.optim.Adam(net.parameters(), lr=1e-3), noise_multiplier=1.0,
                                      max_grad_norm=0.1, expected_batch_size=32, loss_reduction="sum",
                                      generator=secret_generator("cpu", seed=3)))
    loss_e = tr.discriminator_step(gsm, opts[0], x[:20], y[:20], x[20:], y[20:])
    ps = PerSampleD(d_c, compile=True)
    grads, _ = ps(x, y, torch.cat([torch.ones(20), torch.zeros(17)]))
    loss_c = tr.discriminator_step(None, opts[1], x[:20], y[:20], x[20:], y[20:], per_sample=ps)
    assert _rel(loss_c, loss_e) < RTOL
    for pe, pc in zip(gsm._module.parameters(), d_c.parameters()):
        assert _rel(pc.detach(), pe.detach()) < RTOL
        assert pc.dtype == torch.float32
    for st in opts[1].original_optimizer.state.values():
        assert all(v.dtype == torch.float32 for v in st.values() if v.is_floating_point())


@pytest.mark.slow
def test_dpgan_generator_loss_compiled_equals_eager(one_torch_thread):
    torch.manual_seed(0)
    g = CondGenerator(10, [1, 28, 28], z_dim=16, width=8)
    d = ProjectionDiscriminator(10, [1, 28, 28], width=4)
    z, y = tr.generator_draws(g, 32, 10, torch.Generator().manual_seed(1))
    g2 = copy.deepcopy(g)
    eager = tr.generator_loss_at(g, d, z, y, 0.02)
    eager.backward()
    comp = GeneratorLoss(tr.generator_loss_at)(g2, d, z, y, 0.02)
    comp.backward()
    assert _rel(comp, eager) < RTOL
    flat = [torch.cat([p.grad.flatten() for p in net.parameters()]) for net in (g2, g)]
    assert _rel(*flat) < 1e-4  # a backward through batch norm: fp32 sums in another order (biases before a
    # batch norm have a zero gradient, ~1e-11 of rounding each, so they are compared within the whole vector)


@pytest.mark.slow
def test_feta_compiled_micro_step_equals_eager(one_torch_thread):
    net, k = _unet(), 2
    eager, comp = MicroStep(net, clip=0.01), MicroStep(net, clip=0.01, compile=True)
    for m in (5, 8):  # a remainder (padded to 8) and a full micro-batch
        batch = _feta_batch(m, k, seed=m)
        (se, le), (sc, lc) = eager(batch, 8), comp(batch, 8)
        assert _rel(lc, le) < RTOL
        for a, b in zip(sc, se):
            assert _rel(a, b) < RTOL and a.dtype == torch.float32


@pytest.mark.slow
def test_feta_sampler_compiled_equals_eager(one_torch_thread):
    from dpgen.feta.generator import FetaGenerator

    torch.manual_seed(0)
    gen = FetaGenerator(3, [1, 8, 8], {"nf": 4, "ch_mult": [1, 2], "num_res_blocks": 1, "attn_res": [4]},
                        {"name": "edm", "steps": 3, "guidance": 1.0}, chunk=4)
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    eager = gen.generate(labels, torch.Generator().manual_seed(0))
    with compiling(True):
        comp = gen.generate(labels, torch.Generator().manual_seed(0))
    assert _rel(comp, eager) < RTOL
    assert "_sampler_net" not in "".join(gen.state_dict()), "the released state dict is the eager one's"


# ---- no graph break inside a hot step ------------------------------------------------------------------------------

@pytest.mark.slow
def test_no_graph_break_inside_the_hot_steps():
    d = ProjectionDiscriminator(10, [1, 28, 28], width=4)
    ps = PerSampleD(d, compile=False)
    x, y, t = _d_batch(8)
    assert torch._dynamo.explain(ps._grads)(x, y, t, torch.ones(8)).graph_break_count == 0
    g = CondGenerator(10, [1, 28, 28], z_dim=16, width=8)
    z, yz = tr.generator_draws(g, 8, 10, torch.Generator().manual_seed(1))
    assert torch._dynamo.explain(tr.generator_loss_at)(g, d, z, yz, 0.02).graph_break_count == 0
    step = MicroStep(_unet(), clip=0.01)
    assert torch._dynamo.explain(step._sum)(torch.ones(4), *_feta_batch(4, 2)).graph_break_count == 0
    from dpgen.core.precision import training_precision

    with training_precision("bf16", torch.device("cpu"), False):  # autocast off around the clipping: no break
        assert torch._dynamo.explain(step._sum)(torch.ones(4), *_feta_batch(4, 2)).graph_break_count == 0


# ---- recompilations are bounded over 20 Poisson steps ---------------------------------------------------------------

@pytest.mark.slow
def test_recompilations_are_bounded_over_20_poisson_steps():
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    d = ProjectionDiscriminator(10, [1, 28, 28], width=4)
    ps = PerSampleD(d, compile=True, backend=counter)
    g = torch.Generator().manual_seed(0)
    sizes = []
    for _ in range(20):  # dpgan's step: a Poisson batch of rate 0.1 from 640 records, plus 64 fake rows
        real = int((torch.rand(640, generator=g) < 0.1).sum())
        sizes.append(real + 64)
        grads, _ = ps(*_d_batch(real + 64))
        assert grads[0].shape[0] == real + 64
    assert len(set(sizes)) > 5, "the batch size varies"
    assert counter.frame_count <= len({bucket_size(s) for s in sizes}) <= 3

    torch._dynamo.reset()
    counter = CompileCounter()
    net = _unet()
    step = MicroStep(net, clip=0.01, compile=True, backend=counter)
    for i in range(20):
        m = int((torch.rand(200, generator=g) < 0.1).sum())  # feta: Poisson batches of mean 20, micro-batch 8
        x = torch.rand(m, 1, 8, 8, generator=g) * 2 - 1
        clipped_grad_sum_func(net, x, torch.randint(0, 3, (m,), generator=g), 2, 0.01, 8, g, step=step)
    assert counter.frame_count <= 2, "the remainders meet the buckets 8 (the micro-batch itself) only"


# ---- a whole run: the ledger and the release ----------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(3600)  # dpdm: compiling the 28-px UNet's vmap(grad) takes minutes on a loaded CPU
@pytest.mark.parametrize("method", ["dpgan", "dpdm"])
def test_a_compiled_run_has_the_ledger_and_the_release_of_eager(tmp_path, method):
    """Same secret streams (noise_seed): the compiled run's ledger is the eager one's (padding adds nothing to
    it), and its released generator draws the eager one's samples within 1e-3. Not the weights: a bias before a
    normalisation layer has a zero gradient up to rounding (~1e-11), which Adam turns into +/- lr steps in
    either direction, so such weights drift apart while the function they compute does not."""
    gens, ledgers = [], []
    extra = ("dpgan.iters=3",) if method == "dpgan" else ()
    for compile_ in (False, True):
        with compiling(compile_):
            gen, ledger, _ = train_in_memory(method, tmp_path / str(compile_), *extra, noise_seed=5)
        gens.append(gen.eval())
        ledgers.append([e.to_dict() for e in ledger.entries])
    assert ledgers[0] == ledgers[1] and ledgers[0]
    labels = torch.arange(10) % gens[0].num_classes
    x_e, x_c = (g.generate(labels, torch.Generator().manual_seed(0)) for g in gens)
    assert _rel(x_c, x_e) < 1e-3


def test_sample_script_takes_compile_true_or_false(tmp_path):
    from conftest import run_script

    res = run_script("sample.py", "run=nowhere", "n=3", "out=o.npz", "compile=maybe", cwd=tmp_path, timeout=120)
    assert res.returncode == 2 and "compile='maybe' is invalid; expected true or false" in res.stderr
