"""``ensemble.conv=grouped|batched`` and ``compile=true|false`` for the stacked ensembles (dpgen/ensemble/compute.py).

Each switch computes the same function as the default path within fp32's tolerance (1e-5 relative), forward and
gradients: the unfold + matmul convolution against ``F.conv2d``, and a GS-WGAN critic step and a G-PATE teacher
step under each switch against the default one. After one Adam step a member's first moment is (1 - β1)·g, so
comparing the moments compares the gradients. The compiled steps have no graph break (``torch._dynamo.explain``)
and compile a bounded number of graphs over 20 steps. Compilation is slow on a CPU: one tiny representative per
family here.
"""
from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from dpgen.core.precision import ensemble_compute, ensemble_settings, training_precision
from dpgen.gswgan.ensemble import GeneratorStack, critic_loss, critic_step
from dpgen.gswgan.nets import ResNetGenerator, disc_forward, disc_init
from dpgen.ensemble import NetStack, batched_forward
from dpgen.ensemble.compute import BatchedConv, conv2d_unfold
from dpgen.ensemble.functional import _adam_rows, _member_grads
from dpgen.gpate.ensemble import TeacherEnsemble
from dpgen.gpate.nets import TeacherCNN
from dpgen.nets.spectral import sn_init

FP32 = dict(rtol=1e-5, atol=1e-6)
SHAPE, K, B = [1, 12, 12], 3, 4
BETAS = (0.5, 0.9)


# ---- the batched convolution ---------------------------------------------------------------------------

@pytest.mark.parametrize("stride, padding, dilation, groups, batched", [
    (1, 0, 1, 1, True), (2, 2, 1, 1, True), (1, 1, 2, 1, True), (2, (1, 2), 1, 3, True), (1, 1, 1, 1, False)])
def test_unfold_convolution_is_conv2d_forward_and_backward(stride, padding, dilation, groups, batched):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, 9, 8, generator=g) if batched else torch.randn(6, 9, 8, generator=g)
    w, b = torch.randn(9, 6 // groups, 3, 3, generator=g), torch.randn(9, generator=g)
    outs, grads = [], []
    cot = torch.rand(conv2d_unfold(x, w, b, stride, padding, dilation, groups).shape, generator=g)  # > 0: no cancelling
    for conv in (F.conv2d, conv2d_unfold):
        xs, ws, bs = (t.clone().requires_grad_(True) for t in (x, w, b))
        out = conv(xs, ws, bs, stride, padding, dilation, groups)
        outs.append(out)
        grads.append(torch.autograd.grad((out * cot).sum(), (xs, ws, bs)))
    torch.testing.assert_close(outs[1], outs[0], **FP32)
    for a, r in zip(grads[1], grads[0]):
        # a gradient is a sum of up to C·kh·kw·L products whose order differs by CPU kernel: where the terms nearly
        # cancel, fp32's absolute error follows the terms' scale, not the small sum (seen: 3.4e-6 at a 0.12 entry)
        torch.testing.assert_close(a, r, rtol=FP32["rtol"], atol=1e-5 * float(r.abs().max()))


def test_batched_conv_mode_reaches_vmapped_and_grouped_convolutions():
    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs.get("groups", args[6] if len(args) > 6 else 1))
        return conv2d_unfold(*args, **kwargs)

    x, w = torch.randn(3, 2, 4, 6, 6), torch.randn(3, 5, 4, 3, 3)
    with BatchedConv():
        out = torch.func.vmap(lambda xx, ww: F.conv2d(xx, ww, padding=1))(x, w)
        grouped = F.conv2d(x.transpose(0, 1).flatten(1, 2), w.flatten(0, 1), groups=3, padding=1)
        same = F.conv2d(x[0], w[0], padding="same")  # string padding: left to torch
    ref = torch.func.vmap(lambda xx, ww: F.conv2d(xx, ww, padding=1))(x, w)
    torch.testing.assert_close(out, ref, **FP32)
    torch.testing.assert_close(grouped, ref.transpose(0, 1).flatten(1, 2), **FP32)
    torch.testing.assert_close(same, ref[0], **FP32)
    import dpgen.ensemble.compute as compute
    orig = compute.conv2d_unfold
    compute.conv2d_unfold = spy
    try:
        with BatchedConv():
            F.conv2d(x[0], w[0], padding=1)
    finally:
        compute.conv2d_unfold = orig
    assert seen == [1], "the mode must route conv2d to the unfold convolution"


def _stack(k: int = K) -> NetStack:
    return NetStack(partial(disc_init, 10, SHAPE, 4), sn_init, k, torch.Generator().manual_seed(1), torch.device("cpu"))


def _batch(seed: int, m: int = K):
    g = torch.Generator().manual_seed(seed)
    xr, xf = torch.rand(m, B, *SHAPE, generator=g), torch.rand(m, B, *SHAPE, generator=g)
    yr = torch.randint(0, 10, (m, B), generator=g)
    return xr, yr, xf, yr, torch.rand(m, B, generator=g)


def _critic_steps(steps: int, members=None, k: int = K, **settings) -> tuple[list[torch.Tensor], NetStack]:
    disc, losses = _stack(k), []
    with ensemble_settings(**settings):
        for s in range(steps):
            idx = torch.arange(K) if members is None else members[s]
            losses.append(critic_step(disc, disc_forward, idx, *_batch(s, len(idx)), 10.0, 1e-3, 1e-3, BETAS,
                                      sampled=members is not None))
    return losses, disc


def test_batched_layout_critic_step_equals_grouped():
    (l0,), d0 = _critic_steps(1)
    (l1,), d1 = _critic_steps(1, conv="batched")
    torch.testing.assert_close(l1, l0, **FP32)
    for part in ("params", "m", "v", "buffers"):  # m = (1 - β1)·grad after one step
        for name, ref in getattr(d0, part).items():
            torch.testing.assert_close(getattr(d1, part)[name], ref, **FP32)
    x = torch.rand(K, B, *SHAPE, requires_grad=True)
    outs = []
    for conv in ("grouped", "batched"):
        with ensemble_settings(conv=conv):
            out = batched_forward(d0, disc_forward, torch.arange(K), x, _batch(0)[1])
        outs.append((out, torch.autograd.grad(out.sum(), x)[0]))
    for a, r in zip(outs[1], outs[0]):
        torch.testing.assert_close(a, r, **FP32)


def test_batched_layout_warm_up_generators_equal_grouped():
    torch.manual_seed(0)
    gens = GeneratorStack(partial(ResNetGenerator, 10, SHAPE, 4, 8), 2, torch.device("cpu"), 1e-3, BETAS,
                          vmapped=True)
    z, y = gens.sample_z(3, torch.Generator().manual_seed(0)), torch.randint(0, 10, (2, 3))
    ref = gens(z, y)
    with ensemble_settings(conv="batched"):
        torch.testing.assert_close(gens(z, y), ref, **FP32)


def _teachers(**kw) -> TeacherEnsemble:
    make = partial(TeacherCNN, 3, [1, 12, 12], df_dim=4, dfc_dim=8, norm="none")
    return TeacherEnsemble(make, 5, torch.device("cpu"), seed=1, **kw)


def _teacher_batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    xr, yr = torch.rand(5, 3, 1, 12, 12, generator=g), torch.randint(0, 3, (5, 3), generator=g)
    xf, yf = torch.rand(4, 1, 12, 12, generator=g), torch.randint(0, 3, (4,), generator=g)
    return TeacherEnsemble.fixed_batch(xr, yr, torch.ones(5, 3), xf, yf)


def _teacher_steps(steps: int, **settings) -> tuple[list[torch.Tensor], TeacherEnsemble]:
    ens, losses = _teachers(), []
    with ensemble_settings(**settings):
        for s in range(steps):
            losses.append(ens.train_step(_teacher_batch(s)))
    return losses, ens


def _assert_teachers_close(ens: TeacherEnsemble, ref: TeacherEnsemble) -> None:
    for part in ("params", "m", "v"):
        for name, r in getattr(ref, part).items():
            torch.testing.assert_close(getattr(ens, part)[name], r, **FP32)


def test_batched_layout_teacher_step_and_votes_equal_grouped():
    (l0,), e0 = _teacher_steps(1)
    (l1,), e1 = _teacher_steps(1, conv="batched")
    torch.testing.assert_close(l1, l0, **FP32)
    _assert_teachers_close(e1, e0)
    x, y = torch.rand(6, 1, 12, 12), torch.tensor([0, 1, 2, 0, 1, 2])
    ref = torch.cat([g for _, _, g in e0.input_grads_chunks(x, y)])
    with ensemble_settings(conv="batched"):
        got = torch.cat([g for _, _, g in e0.input_grads_chunks(x, y)])
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, ref, **FP32)


def test_training_precision_sets_the_ensemble_settings_for_the_duration():
    assert ensemble_compute().conv == "grouped" and not ensemble_compute().compile
    with training_precision("tf32", "cpu", compile=True, ensemble_conv="batched"):
        s = ensemble_compute()
        assert (s.dtype, s.compile, s.conv) == (torch.float32, True, "batched")
    assert ensemble_compute() == type(s)()
    with pytest.raises(ValueError, match="ensemble.conv"):
        with ensemble_settings(conv="loop"):
            pass
    with pytest.raises(ValueError, match="ensemble.generators"):
        with ensemble_settings(generators="grouped"):
            pass


@pytest.mark.parametrize("mode, on_cpu, on_cuda", [("auto", False, True), ("vmap", True, True),
                                                    ("loop", False, False)])
def test_ensemble_generators_decides_how_the_warm_up_generators_run(mode, on_cpu, on_cuda):
    """``ensemble.generators``: auto keeps today's choice (vmap on a GPU, the loop on a CPU); vmap and loop force
    it on every device. A stack given ``vmapped`` explicitly keeps it."""
    from dpgen.gswgan.ensemble import GeneratorStack, _vmapped
    from dpgen.gswgan.nets import ResNetGenerator

    with training_precision("fp32", "cpu", ensemble_generators=mode):
        assert (_vmapped("cpu"), _vmapped(torch.device("cuda"))) == (on_cpu, on_cuda)
        make = partial(ResNetGenerator, 10, [1, 8, 8], 10, 4)
        assert GeneratorStack(make, 2, torch.device("cpu"), 1e-3, (0.5, 0.9)).vmapped is on_cpu
        assert GeneratorStack(make, 2, torch.device("cpu"), 1e-3, (0.5, 0.9), vmapped=not on_cpu).vmapped is not on_cpu
    assert ensemble_compute().generators == "auto"


# ---- torch.compile ---------------------------------------------------------------------------------------

def _graphs() -> int:
    return counters["stats"]["unique_graphs"]


def test_compiled_critic_step_equals_eager_without_graph_breaks():
    """The GS-WGAN family's representative: the members' critic gradients (WGAN-GP, double backward, vmapped)
    and their per-row Adam, compiled. 20 steps of 2 to 5 sampled members of 8 (a Poisson sample's count varies
    from one iteration to the next): the same losses and states as eager, no
    graph break, and one graph (the counts are padded to one bucket, not compiled apart; Adam runs eagerly on the
    sampled rows)."""
    torch._dynamo.reset()  # graphs compiled by earlier tests in this process do not count
    disc = _stack()
    p, u = disc.gather(torch.tensor([0, 2]))
    loss = partial(lambda fwd, pp, uu, a, b, c, d, al: critic_loss(fwd, pp, uu, a, b, c, d, al, 10.0, 1e-3),
                   disc_forward)
    explained = torch._dynamo.explain(_member_grads)(loss, torch.float32, p, u, *_batch(0, 2))
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    grads, _ = _member_grads(loss, torch.float32, p, u, *_batch(0, 2))
    explained = torch._dynamo.explain(_adam_rows)(_stack(), torch.tensor([0, 2]), grads, 1e-3, BETAS)
    assert explained.graph_break_count == 0, explained.break_reasons

    g = torch.Generator().manual_seed(5)
    members = [torch.randperm(8, generator=g)[:2 + s % 4] for s in range(20)]
    eager, d0 = _critic_steps(20, members, k=8)
    before = _graphs()
    compiled, d1 = _critic_steps(20, members, k=8, compile=True)
    assert _graphs() - before == 1, "one graph for the gradients: counts 2 to 5 share a bucket"
    assert [len(c) for c in compiled] == [len(m) for m in members], "one loss per sampled member, not per padded row"
    torch.testing.assert_close(torch.cat(compiled), torch.cat(eager), rtol=1e-5, atol=1e-5)
    for part in ("params", "buffers"):
        flat = [torch.cat([getattr(d, part)[n].flatten() for n in sorted(d0.params if part == "params" else d0.u)])
                for d in (d0, d1)]
        assert float((flat[1] - flat[0]).norm() / flat[0].norm()) < 1e-5, part
    assert torch.equal(d1.t, d0.t)


def test_compiled_teacher_step_equals_eager_without_graph_breaks():
    """G-PATE's representative: the teachers' chunk loss (forward and backward compiled; torch's fused Adam is
    already one kernel per parameter group). 20 steps: the same losses and states, no graph break, one graph."""
    torch._dynamo.reset()
    ens = _teachers()
    batch = _teacher_batch(0)(0, 5)
    explained = torch._dynamo.explain(ens.chunk_loss)(ens.block(0, 5, grad=True), *batch)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    eager, e0 = _teacher_steps(20)
    before = _graphs()
    compiled, e1 = _teacher_steps(20, compile=True)
    assert _graphs() - before == 1, "one graph over 20 steps"
    torch.testing.assert_close(torch.stack(compiled), torch.stack(eager), rtol=1e-5, atol=1e-6)
    for name in e0.params:  # after 20 Adam steps: relative to the parameters' size
        assert float((e1.params[name] - e0.params[name]).norm() / e0.params[name].norm()) < 1e-5, name
    assert torch.equal(e1.t, e0.t)


# ---- the config keys, through the pipeline --------------------------------------------------------------------

def test_the_pipeline_applies_precision_compile_and_ensemble_conv(tmp_path, monkeypatch, one_torch_thread):
    """``precision=bf16 compile=true ensemble.conv=batched ensemble.generators=vmap`` in the config reach a gswgan run's
    members' steps and warm-up generators (the schema accepts them for an ensemble method), and the defaults leave the
    run fp32, eager, grouped, its generators looped on a CPU.
    torch.compile is replaced by a recorder here: the compiled path itself is checked above."""
    from tiny import compose_cfg

    import dpgen.ensemble.compute as compute
    import dpgen.ensemble.functional as functional
    from dpgen.core.pipeline import run_training

    monkeypatch.chdir(tmp_path)
    seen, wrapped = [], []
    orig_adam = functional._adam_rows

    def _adam_rows(*a, **kw):  # every members' step of the ensembles ends here
        seen.append(ensemble_compute())
        return orig_adam(*a, **kw)

    monkeypatch.setattr(functional, "_adam_rows", _adam_rows)
    import dpgen.gswgan.ensemble as gens_module

    stacks, orig_init = [], gens_module.GeneratorStack.__init__

    def init(self, *a, **kw):  # the pre-training's warm-up generators
        orig_init(self, *a, **kw)
        stacks.append(self.vmapped)

    monkeypatch.setattr(gens_module.GeneratorStack, "__init__", init)
    monkeypatch.setattr(compute.torch, "compile", lambda fn, **kw: wrapped.append(fn) or fn)
    monkeypatch.setattr(compute, "_COMPILED", {})
    for name, extra in (("default", []), ("fast", ["precision=bf16", "compile=true", "ensemble.conv=batched",
                                                   "ensemble.generators=vmap"])):
        seen.clear()
        stacks.clear()
        cfg = compose_cfg("gswgan", *extra, "privacy.noise_seed=7", "tensorboard=false", "progress=false",
                          "threads=1", "samples_per_class=1", f"data_root={tmp_path / 'data'}")
        run_training(cfg, tmp_path / name, evaluate=False)
        assert seen, "no members' step ran"
        want = (torch.bfloat16, True, "batched") if extra else (torch.float32, False, "grouped")
        assert {(s.dtype, s.compile, s.conv) for s in seen} == {want}
        assert stacks and set(stacks) == {bool(extra)}, "auto loops on a CPU; ensemble.generators=vmap batches"
    assert ensemble_compute() == type(seen[0])(), "the settings end with the training"
    assert {f.__name__ for f in wrapped} == {"_member_grads", "_adam_rows"}
