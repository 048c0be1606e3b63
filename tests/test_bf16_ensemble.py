"""``precision=bf16`` for the stacked ensembles (dpgen/ensemble/compute.py).

Autocast does not reach inside ``torch.func.vmap``, so the members' weights, spectral-norm vectors and inputs are
cast to bf16 inside the functional forward. Checked here: the step computes the fp32 step's function within bf16's
tolerance (and really ran its convolutions in bf16); the master weights, their gradients, Adam's moments and step
counts, the image gradients, the per-sample norms, clipped rows, noise and releases of the sanitiser stay fp32;
and the one-record isolation of every other member still holds bit for bit (rows and blocks, the GS-WGAN family
and G-PATE's teachers, end to end).
"""
from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import test_dpac_isolation
import test_ensemble
import test_gpate_train
from test_gpate_train import digits  # noqa: F401  (the fixture, for the gpate isolation test)
from dpgen.core.precision import ensemble_compute, ensemble_settings, training_precision
from dpgen.gswgan.ensemble import GeneratorStack, critic_step
from dpgen.gswgan.nets import ResNetGenerator, clf_init, disc_forward, disc_init
from dpgen.gswgan.sanitizer import Sanitizer
from dpgen.gswgan.train import generator_step
from dpgen.ensemble import NetStack, batched_forward
from dpgen.ensemble.functional import _member_grads
from dpgen.nets.spectral import sn_init
from dpgen.privacy.randomness import secret_generator

SHAPE, K, B = [1, 12, 12], 3, 4
BF16_TOL = 1e-2  # bf16 keeps 8 mantissa bits: 2^-8 ≈ 4e-3 relative per rounding


class _ConvDtypes(TorchFunctionMode):
    """Records the dtypes of every conv2d's input and weight (inside vmap too: a function mode acts first)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[torch.dtype, torch.dtype]] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.conv2d or func is torch.conv2d:
            self.seen.add((args[0].dtype, args[1].dtype))
        return func(*args, **(kwargs or {}))


def _stack() -> NetStack:
    return NetStack(partial(disc_init, 10, SHAPE, 4), sn_init, K, torch.Generator().manual_seed(1), torch.device("cpu"))


def _batch(seed: int = 2):
    g = torch.Generator().manual_seed(seed)
    xr, xf = torch.rand(K, B, *SHAPE, generator=g), torch.rand(K, B, *SHAPE, generator=g)
    yr = torch.randint(0, 10, (K, B), generator=g)
    return xr, yr, xf, yr, torch.rand(K, B, generator=g)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _step(dtype: torch.dtype) -> tuple[torch.Tensor, NetStack, set]:
    disc, spy = _stack(), _ConvDtypes()
    with ensemble_settings(dtype=dtype), spy:
        losses = critic_step(disc, disc_forward, torch.arange(K), *_batch(), 10.0, 1e-3, 1e-3, (0.5, 0.9))
    return losses, disc, spy.seen


def test_bf16_critic_step_matches_fp32_and_runs_in_bf16():
    l32, d32, seen32 = _step(torch.float32)
    l16, d16, seen16 = _step(torch.bfloat16)
    assert seen32 == {(torch.float32, torch.float32)}
    assert seen16 == {(torch.bfloat16, torch.bfloat16)}, "bf16 must reach the vmapped members' convolutions"
    assert l16.dtype == torch.float32 and _rel(l16, l32) < BF16_TOL
    # the step: the Adam-updated master weights, all together (a bias whose gradient is ~0 takes Adam's ±lr step
    # of either sign under rounding, fp32 against fp32 too)
    flat = [torch.cat([d.params[n].flatten() for n in sorted(d.params)]) for d in (d32, d16)]
    assert _rel(flat[1], flat[0]) < BF16_TOL
    assert not torch.equal(flat[1], flat[0]), "the bf16 step must differ from fp32's (it really ran in bf16)"
    # the gradients of a WGAN-GP loss (a difference of means plus a double backward) lose more to bf16's
    # rounding than the loss does: 3-4% relative here; a wrong function shows as O(1)
    p, u = _stack().gather(torch.arange(K))
    loss = partial(_critic, disc_forward)
    g32, _ = _member_grads(loss, torch.float32, p, u, *_batch())
    g16, _ = _member_grads(loss, torch.bfloat16, p, u, *_batch())
    flat = [torch.cat([g[n].flatten() for n in sorted(g)]) for g in (g32, g16)]
    assert _rel(flat[1], flat[0]) < 0.1
    assert float(F.cosine_similarity(flat[0], flat[1], dim=0)) > 0.99


def _critic(fwd, p, u, xr, yr, xf, yf, alpha):
    from dpgen.gswgan.ensemble import critic_loss

    return critic_loss(fwd, p, u, xr, yr, xf, yf, alpha, 10.0, 1e-3)


def test_bf16_keeps_master_weights_gradients_and_adam_state_fp32():
    _, disc, _ = _step(torch.bfloat16)
    for part in (disc.params, disc.u, disc.m, disc.v):
        assert {t.dtype for t in part.values()} == {torch.float32}
    assert disc.t.dtype == torch.long and disc.t.tolist() == [1] * K
    p, u = disc.gather(torch.arange(K))
    grads, losses = _member_grads(partial(_critic, disc_forward), torch.bfloat16, p, u, *_batch())
    assert {g.dtype for g in grads.values()} == {torch.float32} and losses.dtype == torch.float32
    # the image gradients (what the warm-up generators and a sanitiser receive) come back in fp32
    x = torch.rand(K, B, *SHAPE, requires_grad=True)
    with ensemble_settings(dtype=torch.bfloat16):
        out = batched_forward(disc, disc_forward, torch.arange(K), x, _batch()[1])
    (gx,) = torch.autograd.grad(out.sum(), x)
    assert out.dtype == gx.dtype == torch.float32 and bool(torch.isfinite(gx).all())


@pytest.mark.parametrize("vmapped", [False, True])
def test_bf16_warm_up_generators_run_bf16_and_keep_fp32_state(vmapped):
    torch.manual_seed(0)
    gens = GeneratorStack(partial(ResNetGenerator, 10, SHAPE, 4, 8), 2, torch.device("cpu"), 1e-3, (0.5, 0.9),
                          vmapped=vmapped)
    z, y = gens.sample_z(3, torch.Generator().manual_seed(0)), torch.randint(0, 10, (2, 3))
    ref = gens(z, y)
    spy = _ConvDtypes()
    with training_precision("bf16", "cpu"), spy:
        assert ensemble_compute().dtype == torch.bfloat16
        out = gens(z, y)
        gens.step(lambda x: x.square().sum(), z, y)
    assert ensemble_compute().dtype == torch.float32, "training_precision restores the ensembles' dtype"
    assert out.dtype == torch.float32 and _rel(out, ref) < BF16_TOL
    assert {d for d, _ in spy.seen} == {torch.bfloat16}
    for part in (gens.params, gens.buffers, gens.adam.m, gens.adam.v):
        assert {t.dtype for n, t in part.items() if t.is_floating_point()} == {torch.float32}


def test_bf16_private_generator_step_sanitises_in_fp32():
    """The private step (one sampled D_k and the classifier, outside vmap, under autocast): the sanitiser's norms,
    clipped rows and releases are fp32, its clipped rows are bounded, and G's Adam state stays fp32."""
    torch.manual_seed(0)
    g_net = ResNetGenerator(10, SHAPE, 4, 8)
    opt = torch.optim.Adam(g_net.parameters(), lr=1e-3)
    disc = _stack()
    clf = NetStack(partial(clf_init, 10, SHAPE, 4), sn_init, 1, torch.Generator().manual_seed(3), torch.device("cpu"))
    sans = [Sanitizer(0.1, 1.0, secret_generator(seed=s)) for s in (1, 2)]
    with training_precision("bf16", "cpu"):
        loss = generator_step(g_net, opt, disc, clf, torch.tensor([1]), sans[0], sans[1], 0.5, 5, 10,
                              torch.Generator().manual_seed(4))
    assert bool(torch.isfinite(loss))
    for san in sans:
        assert san.calls == 1
        assert {san.last_norms.dtype, san.last_clipped.dtype, san.last_release.dtype} == {torch.float32}
        assert bool((san.last_clipped.flatten(1).norm(dim=1) <= 0.1 * (1 + 1e-5)).all())
    assert {t.dtype for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.is_floating_point()} \
        == {torch.float32}


@pytest.mark.parametrize("conv", ["grouped", "batched"])
def test_bf16_rows_and_blocks_keep_every_other_member_bit_identical(conv):
    with ensemble_settings(dtype=torch.bfloat16, conv=conv):
        test_ensemble.test_rows_path_isolates_every_other_member()
        test_ensemble.test_block_path_isolates_every_other_member()


@pytest.mark.parametrize("case", ["gswgan", pytest.param("efsgd", marks=pytest.mark.slow)])
def test_bf16_gswgan_family_isolation(case, tmp_path, monkeypatch):
    """tests/test_dpac_isolation.py's neighbouring runs, trained under precision=bf16."""
    with training_precision("bf16", "cpu"):
        test_dpac_isolation.test_one_record_changes_only_its_own_partitions_states(case, tmp_path, monkeypatch)


def test_bf16_gpate_teacher_isolation(monkeypatch, tmp_path, digits):
    """tests/test_gpate_train.py's neighbouring runs (released answers fixed), trained under precision=bf16: every
    teacher but the removed record's owner ends bit-identical (parameters and Adam state); the owner does not.
    (Under bf16 a single parameter of the owner may round to the same value, so the owner is checked as a whole.)"""
    aggregate = test_gpate_train.aggregate

    def fixed_answers(counts, threshold, sigma1, sigma2, generator):
        q = counts.shape[0]
        return aggregate.GNMaxResult(answered=torch.ones(q, dtype=torch.bool),
                                     winner=torch.arange(q) % counts.shape[1])

    monkeypatch.setattr(aggregate, "confident_gnmax", fixed_answers)
    states = []
    with training_precision("bf16", "cpu"):
        for name, data in (("full", digits), ("minus", test_gpate_train._remove_record(digits, 0))):
            test_gpate_train.train_in_memory("gpate", tmp_path / name, "gpate.iters=3", data=data)
            states.append(test_gpate_train._checkpoint(tmp_path / name)["state"]["teachers"])
    owner = int(test_gpate_train.assign_teachers(digits.train.x, 6, 0)[0])
    owner_moved = False
    for part in ("params", "m", "v"):
        for k in states[0][part]:
            a, b = states[0][part][k], states[1][part][k]
            assert a.dtype == torch.float32
            for i in range(6):
                if i == owner:
                    owner_moved |= not torch.equal(a[i], b[i])
                else:
                    assert torch.equal(a[i], b[i]), f"teacher {i} {part} {k}"
    assert owner_moved, "the record's own teacher must see it (the test is live)"
