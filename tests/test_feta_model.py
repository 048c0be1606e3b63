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


@pytest.mark.parametrize("num_ops", [2, 3])
def test_augmentation_bag_applies_exactly_num_ops_distinct_ops(num_ops):
    calls: list[str] = []

    def make(name):
        def op(img, m, sign):
            calls.append(name)
            assert 1 <= m <= 5 and sign in (1.0, -1.0)
            return img
        return op

    ops = {name: make(name) for name in OPS}
    bag = AugmentBag(num_ops=num_ops, max_magnitude=5, ops=ops)
    # images are processed in order, so calls[i*m:(i+1)*m] are the ops applied to image i
    x = torch.rand(6, 1, 8, 8)
    g = torch.Generator().manual_seed(0)
    out = bag(x, g)
    assert out.shape == x.shape and out.min() >= 0 and out.max() <= 1
    assert len(calls) == num_ops * 6
    per_image = [calls[i:i + num_ops] for i in range(0, len(calls), num_ops)]
    assert all(len(set(chunk)) == num_ops for chunk in per_image), "ops within an image are distinct"
    # default bag: 2 ops (Eq. 8 with m = 2)
    assert AugmentBag().num_ops == 2


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
    assert 0.0 <= json.loads((run / "metrics.json").read_text())["g2r"]["cnn"]["accuracy"] <= 1.0
