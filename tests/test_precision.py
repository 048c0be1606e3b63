"""``precision=fp32|tf32|bf16`` and ``cudnn_benchmark`` (dpgen/core/precision.py, issue 24).

The option is checked like every other value (one line, exit 2, before anything exists); the context manager
sets and restores torch's global flags and turns bf16 autocast on (CPU autocast too, so all of this runs
here); under bf16 the DP path is unchanged: per-sample clipped norms ≤ C, noise std σC in fp32, sanitizer
releases bounded, and a tiny DP-SGD training ends with the ledger of the fp32 one while its matmuls really
ran in bf16.
"""
from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from inprocess import call, one_error

from dpgen.core.methods import METHODS
from dpgen.core.precision import (BF16_METHODS, PRECISIONS, at_least_fp32, autocast_enabled, full_precision,
                                  noise_dtype, training_precision)
from dpgen.privacy.randomness import gaussian_noise, secret_generator

# fp32 rounding of a norm of a few hundred coordinates: well under 1e-5 relative; bf16 rounding is 2^-8 ≈ 4e-3
FP32_TOL = 1e-5


def _flags() -> tuple:
    return (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
            torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark)


# ---- the option in the schema ---------------------------------------------------------------------------

@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A scratch working directory with the embedded default data."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPGEN_DATA", str(tmp_path / "data"))
    return tmp_path


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("benchmark", ["true", "false"])
def test_every_precision_passes_the_checks(capsys, workdir, precision, benchmark):
    from tiny import TINY

    code, _, err = call(capsys, "train", *TINY["dpgan"], f"precision={precision}", f"cudnn_benchmark={benchmark}")
    assert code == 0, err


def test_defaults_are_fp32_without_benchmark():
    from tiny import compose_cfg

    cfg = compose_cfg("dpgan")
    assert cfg.precision == "fp32" and cfg.cudnn_benchmark is False


@pytest.mark.parametrize("args, needle", [
    (["precision=fp16"], "precision='fp16' is invalid; expected one of fp32, tf32, bf16"),
    (["precision=BF16"], "precision='BF16' is invalid; expected one of fp32, tf32, bf16"),
    (["precision=1"], "precision"),
    (["cudnn_benchmark=maybe"], "cudnn_benchmark='maybe' is invalid; expected true or false"),
    (["-m", "precision=fp32,half"], "precision='half' is invalid"),
])
def test_a_bad_precision_is_one_line_before_anything_exists(capsys, workdir, args, needle):
    code, _, err = call(capsys, "train", *args)
    assert needle in one_error(code, err)
    assert not (workdir / "outputs").exists() and not (workdir / "multirun").exists()


def test_every_method_may_train_in_bf16():
    """The stacked ensembles cast their members explicitly (dpgen/ensemble/compute.py), so none is refused."""
    assert set(BF16_METHODS) == set(METHODS)


@pytest.mark.parametrize("method", ["gswgan", "efsgd"])
def test_bf16_is_refused_where_a_method_cannot_train_in_it(capsys, workdir, monkeypatch, method):
    # every registered method trains in bf16 now: the refusal is checked for a method taken off the list
    monkeypatch.setattr("dpgen.core.schema.BF16_METHODS", tuple(m for m in BF16_METHODS if m != method))
    line = one_error(*call(capsys, "train", f"method={method}", "precision=bf16")[::2])
    assert f"precision='bf16' is invalid; expected fp32 or tf32 for method={method}" in line
    code, _, err = call(capsys, "train", f"method={method}", "precision=tf32")
    assert code == 0, err


def test_precision_is_part_of_the_resume_fingerprint_and_old_ones_read_as_fp32():
    """A run resumes only with the precision it was started with (bit-exact resume continues the same
    arithmetic); a checkpoint or config written before the option existed describes an fp32 run;
    cudnn_benchmark may change on resume (it only picks kernels)."""
    from tiny import compose_cfg

    from dpgen.core.checkpoint import fingerprint_diff
    from dpgen.core.pipeline import fingerprint

    fp32, bf16 = fingerprint(compose_cfg("dpgan")), fingerprint(compose_cfg("dpgan", "precision=bf16"))
    assert fp32["precision"] == "fp32" and bf16["precision"] == "bf16"
    assert fingerprint_diff(fp32, bf16) == "precision: 'fp32' -> 'bf16'"
    old = {k: v for k, v in fp32.items() if k != "precision"}  # a checkpoint from before the option
    assert fingerprint_diff(old, fp32) is None
    assert fingerprint_diff(old, bf16) == "precision: 'fp32' -> 'bf16'"
    assert fingerprint_diff(fp32, fingerprint(compose_cfg("dpgan", "cudnn_benchmark=true"))) is None


def test_resume_with_another_precision_is_refused_before_anything_is_written(capsys, workdir):
    from omegaconf import OmegaConf

    from conftest import in_memory_run
    from inprocess import files_in
    from tiny import TINY, compose_cfg
    from dpgen.core.pipeline import fingerprint
    from dpgen.privacy import PrivacyLedger

    run_dir = workdir / "run"
    cfg = compose_cfg("dpgan", "precision=bf16")
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    run = in_memory_run(run_dir, PrivacyLedger(delta=float(cfg.delta), target_epsilon=10.0))
    run.fingerprint = fingerprint(cfg)
    run.save_checkpoint(2, {})
    before = files_in(workdir)
    code, _, err = call(capsys, "train", *TINY["dpgan"], f"resume={run_dir}", "precision=fp32")
    assert "precision: 'bf16' -> 'fp32'" in one_error(code, err)
    assert files_in(workdir) == before
    code, _, err = call(capsys, "train", *TINY["dpgan"], f"resume={run_dir}", "precision=bf16",
                        "cudnn_benchmark=true")
    assert code == 0, err


# ---- the context manager -----------------------------------------------------------------------------------

@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_tf32_flags_are_set_for_the_duration_and_restored(precision):
    before = _flags()
    with training_precision(precision, "cpu", cudnn_benchmark=True):
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        assert torch.get_float32_matmul_precision() == "high" and torch.backends.cudnn.benchmark
    assert _flags() == before


def test_fp32_changes_nothing_and_flags_are_restored_after_an_error():
    before = _flags()
    with training_precision("fp32", "cpu"):
        assert _flags() == before and not autocast_enabled("cpu")
    with pytest.raises(RuntimeError, match="boom"):
        with training_precision("bf16", "cpu", cudnn_benchmark=True):
            raise RuntimeError("boom")
    assert _flags() == before and not autocast_enabled("cpu")


def test_bf16_on_a_gpu_without_bfloat16_is_one_line(monkeypatch):
    from dpgen.errors import DpgenError

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    before = _flags()
    with pytest.raises(DpgenError, match="bfloat16 support"):
        with training_precision("bf16", "cuda"):
            pass
    assert _flags() == before


def test_an_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="fp32, tf32, bf16"):
        with training_precision("fp16", "cpu"):
            pass


def test_bf16_autocasts_matmuls_and_full_precision_undoes_it():
    lin = nn.Linear(4, 3)
    x = torch.randn(2, 4)
    for precision, dtype in (("fp32", torch.float32), ("tf32", torch.float32), ("bf16", torch.bfloat16)):
        with training_precision(precision, "cpu"):
            assert lin(x).dtype == dtype
            with full_precision():
                assert lin(x).dtype == torch.float32 and not autocast_enabled("cpu")
            assert autocast_enabled("cpu") == (precision == "bf16")
    assert lin(x).dtype == torch.float32


def test_bf16_sees_the_optimizer_updates():
    """One autocast region spans the whole training: with autocast's weight cache (its default) every forward
    would reuse the bf16 copy of the weights made before the first update."""
    lin = nn.Linear(3, 3)
    x = torch.ones(1, 3)
    with training_precision("bf16", "cpu"):
        before = lin(x)
        with torch.no_grad():
            lin.weight.add_(1.0)
        after = lin(x)
    assert torch.allclose(after.float(), before.float() + 3.0, atol=0.05)


def test_dtype_helpers():
    assert at_least_fp32(torch.zeros(2, dtype=torch.bfloat16)).dtype == torch.float32
    assert at_least_fp32(torch.zeros(2, dtype=torch.float16)).dtype == torch.float32
    t = torch.zeros(2, dtype=torch.float64)
    assert at_least_fp32(t) is t and at_least_fp32(torch.zeros(2, dtype=torch.long)).dtype == torch.long
    assert noise_dtype(torch.bfloat16) == torch.float32 and noise_dtype(torch.float64) == torch.float64
    assert noise_dtype(None) is None


# ---- under bf16 the DP path is unchanged ----------------------------------------------------------------

def _fp32_bits(t: torch.Tensor) -> bool:
    """Whether ``t`` (fp32) uses the low 16 mantissa bits: a bf16 value cast up to fp32 never does."""
    return bool((t.detach().contiguous().view(torch.int32) & 0xFFFF).any())


def _dp_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, 2, 1), nn.LeakyReLU(0.2), nn.Flatten(), nn.Linear(4 * 4 * 4, 10))


def test_dp_sgd_step_clips_in_fp32_under_bf16(one_torch_thread):
    """opacus' hooks compute the per-sample gradients in bf16 under autocast; DPSGDOptimizer clips them in fp32:
    a one-record step with noise 0 releases that record's clipped gradient, whose norm is C to fp32 rounding."""
    from opacus import GradSampleModule

    from dpgen.privacy.optimizer import DPSGDOptimizer

    clip = 0.5
    gsm = GradSampleModule(_dp_model(), loss_reduction="sum")
    opt = DPSGDOptimizer(torch.optim.SGD(gsm.parameters(), lr=0.0), noise_multiplier=0.0, max_grad_norm=clip,
                         expected_batch_size=1, loss_reduction="sum", generator=secret_generator(seed=1))
    x, y = torch.randn(12, 1, 8, 8) * 50, torch.arange(12) % 10
    sample_dtypes, norms = set(), []
    with training_precision("bf16", "cpu"):
        for i in range(len(x)):
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(gsm(x[i:i + 1]), y[i:i + 1], reduction="sum")
            loss.backward()
            sample_dtypes |= {p.grad_sample.dtype for p in gsm.parameters()}
            opt.step()
            assert {p.grad.dtype for p in gsm.parameters()} == {torch.float32}
            norms.append(torch.cat([p.grad.flatten() for p in gsm.parameters()]).double().norm().item())
    assert torch.bfloat16 in sample_dtypes, "the per-sample gradients were not computed under bf16 autocast"
    assert max(norms) <= clip * (1 + FP32_TOL), norms
    assert min(norms) >= clip * (1 - FP32_TOL), "every record was clipped (its gradient is far above C)"


def test_dp_sgd_batch_clips_every_record_in_fp32_under_bf16(one_torch_thread):
    """A whole Poisson-like batch through opacus under bf16: record i is the one-hot input e_i, so its gradient
    lives in column i of the weight and column i of the clipped sum is record i's clipped gradient."""
    from opacus import GradSampleModule

    from dpgen.privacy.optimizer import DPSGDOptimizer

    n, clip = 16, 0.5
    torch.manual_seed(0)
    gsm = GradSampleModule(nn.Linear(n, 64, bias=False), loss_reduction="sum")
    opt = DPSGDOptimizer(torch.optim.SGD(gsm.parameters(), lr=0.0), noise_multiplier=0.0, max_grad_norm=clip,
                         expected_batch_size=n, loss_reduction="sum", generator=secret_generator(seed=1))
    target = torch.randn(n, 64) * 50
    with training_precision("bf16", "cpu"):
        (gsm(torch.eye(n) * 50) * target).sum().backward()
        assert gsm._module.weight.grad_sample.dtype == torch.bfloat16
        opt.step()
    norms = gsm._module.weight.grad.double().norm(dim=0)
    assert ((norms / clip - 1).abs() <= FP32_TOL).all(), norms


@pytest.mark.parametrize("secure", [False, True])
def test_dp_sgd_noise_is_fp32_with_std_sigma_c_under_bf16(one_torch_thread, secure):
    from opacus import GradSampleModule

    from dpgen.privacy.optimizer import DPSGDOptimizer

    sigma, clip = 1.3, 0.7
    torch.manual_seed(0)
    gsm = GradSampleModule(nn.Linear(400, 100), loss_reduction="sum")  # 40,100 noise coordinates
    opt = DPSGDOptimizer(torch.optim.SGD(gsm.parameters(), lr=0.0), noise_multiplier=sigma, max_grad_norm=clip,
                         expected_batch_size=8, loss_reduction="sum",
                         generator=secret_generator(seed=2, secure_noise=secure))
    with training_precision("bf16", "cpu"):
        gsm(torch.randn(8, 400)).pow(2).sum().backward()
        opt.step()
        noise = torch.cat([(p.grad - p.summed_grad).flatten() for p in gsm.parameters()])
    assert noise.dtype == torch.float32 and _fp32_bits(noise)
    assert abs(noise.std().item() / (sigma * clip) - 1) < 0.03 and abs(noise.mean().item()) < 0.03 * sigma * clip


def test_gaussian_noise_for_a_bf16_sum_is_fp32():
    g = secret_generator(seed=3)
    with training_precision("bf16", "cpu"):
        noise = gaussian_noise((50_000,), 2.0, g, dtype=torch.bfloat16)
    assert noise.dtype == torch.float32 and _fp32_bits(noise)
    assert abs(noise.std().item() / 2.0 - 1) < 0.03


def test_torch_func_per_record_grads_run_bf16_and_return_fp32(one_torch_thread):
    """feta/dpdm's per-record gradients (torch.func): the forward runs in bf16, the gradients come back fp32."""
    from dpgen.privacy.per_sample import per_record_grads

    model = _dp_model()
    seen = []
    model[0].register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    with training_precision("bf16", "cpu"):
        grads, _ = per_record_grads(model, lambda call, xr: call(xr).pow(2).mean(), (torch.randn(10, 2, 1, 8, 8),))
    assert {g.dtype for g in grads} == {torch.float32} and seen == [torch.bfloat16]
    assert [g.shape[0] for g in grads] == [10] * 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_feta_clipped_sum_is_fp32_under_bf16(dtype):
    """:func:`add_clipped` (feta/dpdm's flat clipping and sum; ``dtype``: torch.func gives fp32, opacus' hooks
    bf16): record i's gradient lives only in slot i of every parameter, so slot i of the sum is record i's
    clipped gradient, whose norm must be C to fp32 rounding (autocast would run the einsum in bf16)."""
    from dpgen.feta.dpsgd import add_clipped

    n, clip = 12, 0.25
    torch.manual_seed(0)
    per_record = []
    for shape in ((4, 1, 3, 3), (4,), (10, 64), (10,)):
        g = torch.zeros(n, n, *shape)
        for i in range(n):
            g[i, i] = torch.randn(*shape) * 50
        per_record.append(g.to(dtype))
    acc = [torch.zeros(g.shape[1:]) for g in per_record]
    with training_precision("bf16", "cpu"):
        add_clipped(acc, per_record, clip)
    norms = torch.stack([torch.cat([a[i].flatten() for a in acc]).double().norm() for i in range(n)])
    assert {a.dtype for a in acc} == {torch.float32}
    assert ((norms / clip - 1).abs() <= FP32_TOL).all(), norms


def test_clip_rows_and_gaussian_sum_query_on_bf16_values():
    from dpgen.privacy import PrivacyLedger, clip_rows, gaussian_sum_query

    x = (torch.randn(64, 300) * 30).to(torch.bfloat16)
    with training_precision("bf16", "cpu"):
        clipped = clip_rows(x, 1.5)
        out = gaussian_sum_query(x, sensitivity=1.5, noise_multiplier=1.0, clip_norm=1.5,
                                 record=PrivacyLedger(delta=1e-5), name="q", generator=secret_generator(seed=4))
    norms = clipped.double().norm(dim=1)
    assert clipped.dtype == torch.float32 and out.dtype == torch.float32 and _fp32_bits(out)
    assert norms.max() <= 1.5 * (1 + FP32_TOL) and norms.min() >= 1.5 * (1 - FP32_TOL)


@pytest.mark.parametrize("kind", ["dpac", "efsgd"])
def test_sanitizer_release_is_bounded_and_fp32_under_bf16(kind):
    """The GS-WGAN/DPAC and EFSGD sanitizers on a bf16 generated batch: rows clipped in fp32 (≤ C, or
    C1 + C2 with error feedback), noise std as the analysis says, the release fp32; G gets its gradient in
    the batch's dtype."""
    from dpgen.gswgan.sanitizer import Sanitizer
    from dpgen.efsgd.sanitizer import ErrorFeedbackSanitizer

    clip, z, b = 0.3, 1.1, 32
    gen = secret_generator(seed=5)
    if kind == "dpac":
        san, bound = Sanitizer(clip, z, gen), clip
    else:
        san = ErrorFeedbackSanitizer(clip, z, 2 * clip, generator=gen, parts=2, classes=3)
        bound = 3 * clip
    x = torch.randn(b, 1, 16, 16, requires_grad=True)
    w = torch.randn(b, 1, 16, 16) * 40
    with training_precision("bf16", "cpu"):
        xb = x.to(torch.bfloat16)
        out = san(xb) if kind == "dpac" else san(xb, torch.tensor([1]), torch.arange(b) % 3)
        for _ in range(2 if kind == "efsgd" else 1):  # the second step feeds the error state back
            x.grad = None
            (out.float() * w).sum().backward(retain_graph=True)
    direction = san.last_clipped if kind == "dpac" else san.last_direction
    norms = direction.double().flatten(1).norm(dim=1)
    assert direction.dtype == san.last_release.dtype == torch.float32
    assert norms.max() <= bound * (1 + FP32_TOL), norms.max()
    noise = (san.last_release - direction).flatten()
    assert _fp32_bits(noise) and abs(noise.std().item() / san.noise_std - 1) < 0.03
    if kind == "efsgd":
        assert san.error.dtype == torch.float32
    assert x.grad is not None and x.grad.dtype == torch.float32


def test_dpaf_sin_and_dpagg_on_bf16_features():
    """DPAF's sensitivity rests on SIN: every normalised map has norm ≤ p; in bf16 that could fail by 2^-8."""
    from dpgen.dpaf.mechanisms import dpagg
    from dpgen.dpaf.nets import agg_sensitivity, sin

    h = (torch.randn(16, 8, 4, 4) * 7 + 3).to(torch.bfloat16)
    with training_precision("bf16", "cpu"):
        f = sin(h)
        agg = dpagg(f, agg_sensitivity(8, 4, 4), 1.0, 16.0, secret_generator(seed=6))
    assert f.dtype == torch.float32 and agg.dtype == torch.float32
    assert f.double().flatten(2).norm(dim=2).max() <= 4 * (1 + FP32_TOL)


# ---- end to end --------------------------------------------------------------------------------------------

def _spy_layers(monkeypatch) -> list[tuple[torch.dtype, bool]]:
    """Record (output dtype, autocast on) of every Linear and Conv2d forward from now on."""
    seen: list[tuple[torch.dtype, bool]] = []
    for cls in (nn.Linear, nn.Conv2d):
        def spy(self, x, _orig=cls.forward):
            out = _orig(self, x)
            seen.append((out.dtype, autocast_enabled("cpu")))
            return out
        monkeypatch.setattr(cls, "forward", spy)
    return seen


@pytest.mark.parametrize("method", BF16_METHODS)
def test_every_bf16_method_trains_in_bf16(tmp_path, monkeypatch, method):
    """Each method the schema lets train under bf16 does (tiny settings), with bf16 layers, and returns an
    fp32 generator."""
    from tiny import train_in_memory

    seen = _spy_layers(monkeypatch)
    with training_precision("bf16", "cpu"):
        gen, ledger, _ = train_in_memory(method, tmp_path, noise_seed=1)
    assert torch.bfloat16 in {d for d, on in seen if on}, f"{method} ran no layer in bf16"
    params = list(gen.parameters())
    assert params and all(p.dtype == torch.float32 and bool(torch.isfinite(p).all()) for p in params)
    assert ledger.entries and ledger.epsilon() <= ledger.target_epsilon * (1 + 1e-9)


def test_a_bf16_dpgan_run_has_the_ledger_of_fp32_and_really_ran_bf16(tmp_path, monkeypatch, one_torch_thread):
    """The pipeline applies the option: a tiny dpgan run (DP-SGD through opacus) with precision=bf16 trains
    with bf16 matmuls and convolutions, releases and samples its generator in fp32, and records exactly the
    privacy ledger and ε of the same run in fp32."""
    from tiny import compose_cfg
    from dpgen.core.pipeline import run_training

    monkeypatch.chdir(tmp_path)
    seen = _spy_layers(monkeypatch)
    flags = _flags()
    privacy = {}
    for precision in ("fp32", "bf16"):
        cfg = compose_cfg("dpgan", f"precision={precision}", "privacy.noise_seed=7", "tensorboard=false",
                          "progress=false", "threads=1", "samples_per_class=1", f"data_root={tmp_path / 'data'}")
        seen.clear()
        run_training(cfg, tmp_path / precision, evaluate=False)
        training = [d for d, on in seen if on]
        if precision == "bf16":
            assert training and set(training) == {torch.bfloat16}, "bf16 ran no matmul in bf16"
        else:
            assert not training
        assert seen[-1] == (torch.float32, False), "samples.png is drawn in fp32, outside autocast"
        assert _flags() == flags and not autocast_enabled("cpu")
        privacy[precision] = json.loads((tmp_path / precision / "privacy.json").read_text())
    assert privacy["bf16"]["entries"] == privacy["fp32"]["entries"]
    assert math.isclose(privacy["bf16"]["epsilon"], privacy["fp32"]["epsilon"], rel_tol=0, abs_tol=0)


def test_gpu_profile_measures_the_precision_it_is_given(tmp_path, monkeypatch, capsys, one_torch_thread):
    """bench/gpu_profile.py --set precision=bf16 trains in bf16 (as the pipeline does) and says so in its notes."""
    import importlib.util

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("gpu_profile_precision", ROOT / "bench" / "gpu_profile.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    seen = _spy_layers(monkeypatch)
    rows = bench.main(["--tiny", "--inline", "--methods", "dpgan", "--steps", "2", "--warmup", "1", "--set",
                       "precision=bf16", "--data-root", str(tmp_path / "data")])
    assert "precision=bf16" in rows[0]["notes"]
    assert torch.bfloat16 in {d for d, on in seen if on} and not autocast_enabled("cpu")
