"""The GS-WGAN probe behind docs/results.md's "What limits the GS-WGAN family": its signal/noise is G's sanitised
update measured in parameter space, so it must scale as 1/z, and the probe must not disturb the run it watches."""
from __future__ import annotations

import pytest
import torch

from tiny import TINY


def test_parameter_space_snr_scales_as_one_over_z():
    """Same G, D_k, batch and noise draw at z and 10z: the clipped signal is unchanged, the noise 10x."""
    from functools import partial

    from dpgen.dpac.diagnose import probe_step
    from dpgen.gswgan.nets import ResNetGenerator, disc_init
    from dpgen.ensemble import NetStack
    from dpgen.nets.dct import dct_basis
    from dpgen.nets.spectral import sn_init

    torch.manual_seed(0)
    shape = [1, 28, 28]
    g_net = ResNetGenerator(10, shape, 10, 8)
    disc = NetStack(partial(disc_init, 10, shape, 4), sn_init, 2, torch.Generator().manual_seed(1), torch.device("cpu"))
    bases = {16: dct_basis(tuple(shape), 16)}

    def probe(z: float) -> dict[str, float]:
        return probe_step(g_net, disc, None, torch.tensor([1]), 1e-4, z, 1.0, 8, 10, bases,
                          torch.Generator().manual_seed(2))

    low, high = probe(0.5), probe(5.0)
    assert low["gnorm"] == high["gnorm"] > 1e-4, "setup: the clip must bind"
    assert low["snr"] / high["snr"] == pytest.approx(10.0, rel=1e-4)
    assert low["snr_L16"] / high["snr_L16"] == pytest.approx(10.0, rel=1e-4)
    assert 0 < low["kept_L16"] < 1


def test_measure_probes_every_iteration_of_a_real_run(tmp_path, one_torch_thread):
    from dpgen.dpac.diagnose import measure

    rows = measure("gswgan", 10, 3, str(tmp_path / "data"), TINY["gswgan"], dataset="digits", bases=(16,))
    assert len(rows) == 3 and set(rows[0]) == {"gnorm", "snr", "snr_L16", "kept_L16", "gnorm_D", "snr_D", "snr_all",
                                               "members"}
    assert all(r["snr_D"] == pytest.approx(r["snr_all"]) for r in rows), "one path: the update is that path"
    assert all(0 <= r["snr"] < float("inf") for r in rows)
    assert all((r["snr"] > 0) == (r["members"] > 0) for r in rows), "no sampled partition: noise alone"


def test_the_probe_leaves_the_training_run_unchanged(tmp_path, one_torch_thread, monkeypatch):
    import importlib

    from tiny import train_in_memory

    tr = importlib.import_module("dpgen.gswgan.train")
    from dpgen.dpac.diagnose import probe_step

    over = [*TINY["gswgan"], "gswgan.noise_multiplier=1"]
    plain, _, _ = train_in_memory("gswgan", tmp_path / "a", *over, noise_seed=4)
    original, gen = tr.generator_step, torch.Generator().manual_seed(0)

    def probed(g_net, opt_g, disc, clf, k, san_d, san_c, beta, b, ncls, g, **kw):
        probe_step(g_net, disc, clf, k, san_d.clip, san_d.noise_multiplier, beta, b, ncls, {}, gen)
        return original(g_net, opt_g, disc, clf, k, san_d, san_c, beta, b, ncls, g, **kw)

    monkeypatch.setattr(tr, "generator_step", probed)
    watched, _, _ = train_in_memory("gswgan", tmp_path / "b", *over, noise_seed=4)
    for (n, a), b in zip(plain.state_dict().items(), watched.state_dict().values()):
        assert torch.equal(a, b), n


PRIVATE_CODE = ["efsgd.encoder.code=private", "efsgd.sampling=uniform", "privacy.accounting=paper"]


@pytest.mark.parametrize("method,over,paths", [
    ("dpac", ["dpac.sanitize=per_path"], {"D", "C"}),
    ("dpac", ["dpac.sanitize=joint"], {"DC"}),
    ("efsgd", ["efsgd.sanitize=per_path"], {"d", "c", "e"}),
    ("efsgd", ["efsgd.sanitize=joint"], {"dc", "e"}),
    ("efsgd", PRIVATE_CODE, {"dc", "e"}),
], ids=["dpac_per_path", "dpac_joint", "efsgd_per_path", "efsgd_joint", "efsgd_private_code"])
def test_every_release_path_is_probed_against_its_own_noise(tmp_path, one_torch_thread, method, over, paths):
    """One snr_<path> per path the iteration releases (C's from t_c = 2 on, joint: D's path becomes D + C's);
    doubling z halves the D path's signal/noise on the same state (a fixed secret draw: iteration 0 is the same
    in both runs)."""
    from dpgen.dpac.diagnose import measure

    key = method  # each method of the family has its own block
    many = [] if over == PRIVATE_CODE else [f"{key}.partitions_per_iter=2"]  # Poisson: some sampled partitions
    rows = {z: measure(method, 10, 3, str(tmp_path / "data"),
                       [*TINY[method], *over, *many, f"{key}.noise_multiplier={z}"], dataset="digits", noise_seed=0)
            for z in (20, 40)}
    got = {k[4:] for k in rows[20][2] if k.startswith("snr_") and k not in ("snr_all", "snr_code")}
    assert got == paths and len(rows[20]) == 3 and rows[20][0]["members"] > 0
    assert ("snr_code" in rows[20][2]) == (over == PRIVATE_CODE)
    first = "D" if method == "dpac" else "d"  # before t_c every method releases D's gradient alone
    assert rows[20][0][f"snr_{first}"] / rows[40][0][f"snr_{first}"] == pytest.approx(2.0, rel=1e-4)
    assert all(0 < r["snr_all"] < float("inf") for r in rows[20])
    has_c = [("c_acc_real" in r) for r in rows[20]]
    assert has_c == [False, False, True], "C's accuracy is read exactly where C's gradient reaches G (t_c = 2)"
    assert 0 <= rows[20][2]["c_acc_real"] <= 1 and 0 <= rows[20][2]["c_acc_fake"] <= 1


def test_classifier_accuracy_is_each_sampled_members_argmax_accuracy():
    """A member whose bias makes it answer one class reads the frequency of that class; the figure is the mean over
    the members asked for, never over the whole stack."""
    from functools import partial

    from dpgen.ensemble import NetStack
    from dpgen.gswgan.diagnose import classifier_accuracy
    from dpgen.gswgan.nets import clf_init
    from dpgen.nets.spectral import sn_init

    g = torch.Generator().manual_seed(0)
    stack = NetStack(partial(clf_init, 10, [1, 8, 8], 4), sn_init, 3, g, torch.device("cpu"))
    stack.params["lin.b"][1, 3] = 1e4
    stack.params["lin.b"][2, 5] = 1e4
    x = torch.rand(200, 1, 8, 8, generator=g)
    y = torch.cat([torch.full((30,), 3), torch.full((50,), 5), torch.arange(120) % 10])
    p3, p5 = (y == 3).float().mean().item(), (y == 5).float().mean().item()
    assert classifier_accuracy(stack, torch.tensor([1]), x, y) == pytest.approx(p3)
    assert classifier_accuracy(stack, torch.tensor([1, 2]), x, y) == pytest.approx((p3 + p5) / 2)


@pytest.mark.parametrize("method", ["dpac", "efsgd"])
def test_the_path_probe_leaves_the_training_run_unchanged(tmp_path, one_torch_thread, monkeypatch, method):
    from tiny import train_in_memory

    from dpgen.gswgan.diagnose import extension_classes, probe_paths

    key = method  # each method of the family has its own block
    over = [*TINY[method], f"{key}.noise_multiplier=20", f"{key}.sanitize=per_path"]
    plain, _, _ = train_in_memory(method, tmp_path / "a", *over, noise_seed=4)
    cls, gen, seen = extension_classes()[method], torch.Generator().manual_seed(0), []
    original = cls.generator_step

    def probed(self, it, k):
        seen.append(probe_paths(self, it, k, gen))
        return original(self, it, k)

    monkeypatch.setattr(cls, "generator_step", probed)
    watched, _, _ = train_in_memory(method, tmp_path / "b", *over, noise_seed=4)
    assert len(seen) == 4 and any(len(r) > 3 for r in seen), "the probe ran, with more than one path"
    for (n, a), b in zip(plain.state_dict().items(), watched.state_dict().values()):
        assert torch.equal(a, b), n
