"""End to end through scripts/train.py: method=dpac (and gswgan) on the embedded digits."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import run_script

TINY_DPAC = [
    "dpac.iters=4", "dpac.num_discriminators=4", "dpac.partitions_per_iter=1", "dpac.pretrain_iters=2", "dpac.pretrain_chunk=4",
    "dpac.critic_iters=1", "dpac.batch_size=8", "dpac.g_width=8", "dpac.d_width=4", "dpac.classifier.start=2",
    "dpac.classifier.n_fake=1", "dpac.classifier.n_real=1", "dpac.classifier.fake_batch=10",
    "checkpoint_every=2", "log_every=2", "samples_per_class=4", "progress=false",
    "eval.num_samples=200", "eval.epochs=1", "eval.fid=false", "eval.classifiers=[cnn]",
]


def _check_run(run_dir, name: str, accounting: str = "sound") -> dict:
    for f in ("generator.pt", "privacy.json", "metrics.json", "samples.png"):
        assert (run_dir / f).is_file(), f
    payload = torch.load(run_dir / "generator.pt", weights_only=True)
    assert payload["class"] == "dpgen.gswgan.nets:ResNetGenerator"
    assert all(k.startswith(("fc.", "blocks.", "out.")) for k in payload["state_dict"]), "only the generator"
    privacy = json.loads((run_dir / "privacy.json").read_text())
    assert privacy["accounting"] == accounting and privacy["entries"][0]["name"] == "dpac.generator"
    assert sum(e["count"] for e in privacy["entries"]) == 4
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["method"] == name
    _check_accuracies(metrics)
    return privacy

#: GS-WGAN's keys live in its own block (``gswgan.*``), without DPAC's classifier
TINY_GSWGAN = [o.replace("dpac.", "gswgan.") for o in TINY_DPAC if not o.startswith("dpac.classifier")]


def test_dpac_cli_run(tmp_path):
    res = run_script("train.py", "method=dpac", *TINY_DPAC, f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    privacy = _check_run(tmp_path / "run", "dpac")
    assert privacy["valid_dp_guarantee"] is True and privacy["epsilon"] <= 10.0
    # dpac.sanitize=joint (the default, Eq. 9): one released path per iteration, before and after t_c (per_path's
    # second path from t_c on is checked in test_dpac_sanitizer.py and test_dpac_spy.py)
    assert [len(e["noise_multipliers"]) for e in privacy["entries"]] == [1]


@pytest.mark.slow
def test_gswgan_cli_run_paper_accounting(tmp_path):
    res = run_script("train.py", "method=gswgan", *TINY_GSWGAN, "privacy.accounting=paper",
                     f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    privacy = _check_run(tmp_path / "run", "gswgan", "paper")
    assert privacy["valid_dp_guarantee"] is False and privacy["epsilon"] <= 10.0 < privacy["sound_epsilon"]
    assert [len(e["noise_multipliers"]) for e in privacy["entries"]] == [1], "no classifier path in gswgan"
    assert any("Not a valid DP guarantee" in n for n in privacy["notes"])


def test_bad_beta_is_a_one_line_error(tmp_path):
    res = run_script("train.py", "method=dpac", *TINY_DPAC, "dpac.beta=1.5", cwd=tmp_path)
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "dpac.beta" in lines[0], res.stderr[-2000:]


def _check_accuracies(metrics: dict) -> None:
    """Accuracies are counts over their evaluation sets (not just numbers in [0, 1]): g2r over digits' test
    split, r2g over the synthetic samples; the g2r classifier trained on the synthetic train/val split."""
    from dpgen.data import load_dataset

    n_test = len(load_dataset("digits").test)
    cnn = metrics["g2r"]["cnn"]
    assert cnn["num_train"] + cnn["num_val"] == metrics["num_synthetic"]
    assert cnn["accuracy"] * n_test == pytest.approx(round(cnn["accuracy"] * n_test), abs=1e-6), cnn
    if metrics.get("r2g") is not None:
        r2g, n = metrics["r2g"]["accuracy"], metrics["num_synthetic"]
        assert r2g * n == pytest.approx(round(r2g * n), abs=1e-6), metrics["r2g"]
