"""DP-FETA model side: augmentation bag, EDM sampler/generator, and one tiny CLI run."""
from __future__ import annotations

import json

import pytest
import torch

from dpgen.feta.augment import OPS, AugmentBag
from dpgen.feta.generator import FetaGenerator
from dpgen.nets.edm import edm_sigma_grid

TINY_UNET = dict(nf=4, ch_mult=[1, 2], num_res_blocks=1, attn_res=[7], dropout=0.0)


def test_bag_has_the_14_randaugment_ops():
    assert len(OPS) == 14
    x = torch.rand(3, 1, 28, 28)
    for name, op in OPS.items():
        out = op((x[0] * 255).to(torch.uint8), 3, -1.0)
        assert out.shape == (1, 28, 28) and out.dtype == torch.uint8, name


def test_bag_changes_images_and_is_seeded():
    x = torch.rand(4, 1, 28, 28)
    bag = AugmentBag(2, 9)
    a = bag(x, torch.Generator().manual_seed(1))
    b = bag(x, torch.Generator().manual_seed(1))
    torch.testing.assert_close(a, b)
    assert (a - (x * 255).round() / 255).abs().max() > 0.05


def test_sigma_grid_endpoints():
    t = edm_sigma_grid(50)
    assert t.shape == (51,) and t[0].item() == pytest.approx(80.0) and t[-2].item() == pytest.approx(0.002)
    assert t[-1].item() == 0.0 and bool((t[:-1] > t[1:]).all())


@pytest.mark.parametrize("sampler", [dict(name="ddim", steps=3), dict(name="edm", steps=3, churn=5.0, s_min=0.01,
                                                                           s_max=50.0, guidance=0.5)])
def test_sampler_shapes_and_determinism(sampler):
    torch.manual_seed(0)
    gen = FetaGenerator(10, [1, 28, 28], TINY_UNET, sampler)
    a, la = gen.sample(5, seed=3)
    b, _ = gen.sample(5, seed=3)
    c, _ = gen.sample(5, seed=4)
    assert a.shape == (5, 1, 28, 28) and la.tolist() == [0, 1, 2, 3, 4]
    assert a.min() >= 0 and a.max() <= 1
    torch.testing.assert_close(a, b)
    assert (a - c).abs().max() > 1e-3
    # rebuilt from its JSON-serialisable kwargs alone
    json.dumps(gen.init_kwargs)
    again = FetaGenerator(**gen.init_kwargs)
    again.load_state_dict(gen.state_dict())
    torch.testing.assert_close(again.sample(5, seed=3)[0], a)


def test_generate_in_chunks_covers_every_label_once():
    """generate() runs the sampler in pieces of ``chunk``; the pieces must come back in order and complete."""
    torch.manual_seed(0)
    gen = FetaGenerator(10, [1, 28, 28], TINY_UNET, dict(name="ddim", steps=2))
    gen.chunk = 2
    labels = torch.tensor([3, 1, 4, 1, 5])
    x = gen.generate(labels, torch.Generator().manual_seed(0))
    assert x.shape == (5, 1, 28, 28)
    # the first piece is exactly the sampler's output for the first two labels under the same stream
    gen.chunk = 100
    first = gen.generate(labels[:2], torch.Generator().manual_seed(0))
    torch.testing.assert_close(x[:2], first)
    assert (x[2:] - gen.generate(labels[2:], torch.Generator().manual_seed(0))).abs().max() > 1e-3


def test_unet_paper_size():
    from dpgen.nets.unet import UNet

    n = sum(p.numel() for p in UNet(1, 28, 10, nf=32, ch_mult=(2, 2), num_res_blocks=2, attn_res=(14,)).parameters())
    assert 1.3e6 < n < 1.6e6  # DP-FETA: about 1.5M (Table VIII)


def test_cli_end_to_end(tmp_path):
    from conftest import run_script

    res = run_script("train.py", "method=feta", "feta.warmup_iters=2", "feta.iters=2", "feta.batch_size=32",
                     "feta.multiplicity=2", "feta.micro_batch=16", "feta.num_central=10", "feta.unet.nf=4",
                     "feta.sampler.steps=2", "checkpoint_every=2", "log_every=2", "samples_per_class=2",
                     "progress=false", "eval.num_samples=100", "eval.epochs=1", "eval.fid=false",
                     "eval.classifiers=[cnn]", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    run = tmp_path / "run"
    for name in ("generator.pt", "privacy.json", "metrics.json", "samples.png"):
        assert (run / name).is_file(), name
    privacy = json.loads((run / "privacy.json").read_text())
    assert [e["name"] for e in privacy["entries"]] == ["feta.central_mean", "feta.dpsgd"]
    assert privacy["entries"][1]["count"] == 2 and 0 < privacy["epsilon"] <= 10.0
    payload = torch.load(run / "generator.pt", weights_only=True)
    assert payload["class"] == "dpgen.feta.generator:FetaGenerator"
    # the reported accuracy is the evaluator's on the released generator: recomputed from generator.pt alone, it
    # is a count over the real test split and agrees (up to float noise between processes)
    from omegaconf import OmegaConf

    from dpgen.core.generator import load_generator
    from dpgen.core.pipeline import evaluate_generator
    from dpgen.data import load_dataset

    acc = json.loads((run / "metrics.json").read_text())["g2r"]["cnn"]["accuracy"]
    cfg = OmegaConf.load(run / ".hydra" / "config.yaml")
    data = load_dataset("digits", str(tmp_path / "data"))
    cfg.eval.update({"r2g": False, "real_baseline": False, "cnn_fid": False})
    again = evaluate_generator(load_generator(run / "generator.pt", torch.device("cpu")), data, cfg,
                               torch.device("cpu"))["g2r"]["cnn"]["accuracy"]
    n_test = len(data.test.y)
    assert acc * n_test == pytest.approx(round(acc * n_test), abs=1e-6)
    assert again == pytest.approx(acc, abs=3 / n_test)


class _Oracle(torch.nn.Module):
    """A denoiser that knows the answer: the same clean images for any input, σ and label (incl. the null class)."""

    def __init__(self, clean: torch.Tensor) -> None:
        super().__init__()
        self.clean = clean
        self.unused = torch.nn.Parameter(torch.zeros(1))  # the generator reads its device from a parameter

    def forward(self, x, sigma, labels):
        # row i answers clean[i mod n]: a guided call batches (x | y) and (x | null) as 2n rows
        return self.clean[torch.arange(x.shape[0]) % self.clean.shape[0]].to(x.dtype).clone()


class _GaussianData(torch.nn.Module):
    """The exact denoiser of data ~ N(μ, s² I): D(x; σ) = μ + s²/(s²+σ²)(x − μ)."""

    mu, s = 0.3, 0.2

    def forward(self, x, sigma, labels):
        sig2 = sigma.reshape(-1, 1, 1, 1).to(x.dtype) ** 2
        return self.mu + self.s ** 2 / (self.s ** 2 + sig2) * (x - self.mu)


@pytest.mark.parametrize("name", ["ddim", "edm"])
@pytest.mark.parametrize("steps", [1, 2, 5, 18])
@pytest.mark.parametrize("churn,guidance", [(0.0, 0.0), (10.0, 0.0), (0.0, 2.0), (40.0, 1.0)])
def test_every_sampler_returns_the_oracle_image(name, steps, churn, guidance):
    """With a perfect denoiser every sampler must end exactly on its answer (the last step returns D)."""
    from dpgen.nets.edm import sample

    clean = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
    out = sample(_Oracle(clean), torch.tensor([0, 1, 2, 0]), (1, 8, 8), torch.Generator().manual_seed(1), name=name,
                 steps=steps, churn=churn, s_min=0.025, s_max=50.0, guidance=guidance, null_label=3)
    torch.testing.assert_close(out, clean, rtol=0, atol=5e-5)  # float32 error of steps from σ_max = 80


def test_generator_returns_the_oracle_image_in_chunks():
    clean = torch.rand(7, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    gen = FetaGenerator(10, [1, 28, 28], TINY_UNET, dict(name="edm", steps=5, churn=10.0, s_min=0.025, s_max=50.0))
    gen.net = _Oracle(clean[:3] * 2 - 1)
    gen.chunk = 3
    x, _ = gen.sample(7, seed=0)
    torch.testing.assert_close(x, torch.cat([clean[:3], clean[:3], clean[:1]]), rtol=0, atol=5e-5)


@pytest.mark.parametrize("sampler", [dict(name="ddim", steps=50), dict(name="edm", steps=50),
                                     dict(name="edm", steps=50, churn=10.0, s_min=0.025, s_max=50.0)])
def test_samplers_reproduce_gaussian_data(sampler):
    """Exact denoiser of N(μ, s²): the σ grid and the ODE/SDE steps must return that distribution (mean, std)."""
    from dpgen.nets.edm import sample

    d = _GaussianData()
    out = sample(d, torch.zeros(2000, dtype=torch.long), (1, 4, 4), torch.Generator().manual_seed(0), **sampler)
    assert out.mean().item() == pytest.approx(d.mu, abs=0.01)
    assert out.std().item() == pytest.approx(d.s, rel=0.08)


@pytest.mark.parametrize("method", ["feta", "dpdm"])
def test_quick_sampler_leaves_no_noise_in(method):
    """The quick profile's few-step sampler on Gaussian data: at most a little noisier than the data (35%).

    A 5-step Heun sampler (9 evaluations) overshoots at σ ≈ data std and leaves ~3× the data's spread (0.66 for
    s = 0.2): the salt-and-pepper noise of the old quick samples."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from dpgen.core.config import register_resolvers
    from dpgen.core.methods import CONFIG_DIR
    from dpgen.nets.edm import sample

    register_resolvers()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[f"method={method}", "dataset=fmnist", "profile=quick"])
    quick = OmegaConf.to_container(cfg.feta.sampler, resolve=True)
    d = _GaussianData()
    out = sample(d, torch.zeros(2000, dtype=torch.long), (1, 4, 4), torch.Generator().manual_seed(0), **quick)
    assert 0.5 * d.s < out.std().item() < 1.35 * d.s  # 10 Heun steps: 1.30 s; ddim 10: 0.70 s


def test_sample_chunk_is_sized_by_device_unless_set():
    from dpgen.errors import DpgenError

    gen = FetaGenerator(10, [1, 28, 28], TINY_UNET, dict(name="ddim", steps=2))
    assert gen.chunk_size(torch.device("cpu")) == 100
    assert gen.chunk_size(torch.device("meta")) == FetaGenerator.GPU_CHUNK > 1000
    assert FetaGenerator(**{**gen.init_kwargs, "chunk": 7}).chunk_size(torch.device("meta")) == 7
    with pytest.raises(DpgenError, match="sample_chunk"):
        FetaGenerator(10, [1, 28, 28], TINY_UNET, dict(name="ddim", steps=2), chunk=0)


def test_guidance_batches_the_conditional_and_null_calls_into_one():
    """(1+w) D(x|y) − w D(x|∅) from one denoiser call of 2n rows equals the two calls made apart."""
    from dpgen.nets.edm import _guided

    calls = []

    class Labelled(torch.nn.Module):
        def forward(self, x, sigma, labels):
            calls.append(x.shape[0])
            return x * 0.5 + labels.reshape(-1, 1, 1, 1).to(x.dtype) / sigma.reshape(-1, 1, 1, 1)

    net, x, y = Labelled(), torch.randn(5, 1, 4, 4), torch.tensor([0, 1, 2, 1, 0])
    want = 3.0 * net(x, torch.full((5,), 2.0), y) - 2.0 * net(x, torch.full((5,), 2.0), torch.full_like(y, 3))
    calls.clear()
    torch.testing.assert_close(_guided(net, x, 2.0, y, 3, 2.0), want)
    assert calls == [10], "one call of 2n rows"
