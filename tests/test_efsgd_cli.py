"""End to end through scripts/train.py: method=efsgd on the embedded digits; nothing private is released."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import run_script

TINY_EFSGD = [
    "efsgd.iters=4", "efsgd.num_discriminators=4", "efsgd.partitions_per_iter=1", "efsgd.pretrain_iters=2", "efsgd.pretrain_chunk=4",
    "efsgd.critic_iters=1", "efsgd.batch_size=8", "efsgd.g_width=8", "efsgd.d_width=4", "efsgd.classifier.start=2",
    "efsgd.classifier.n_fake=1", "efsgd.classifier.n_real=1", "efsgd.classifier.fake_batch=10",
    "efsgd.encoder.width=4", "efsgd.encoder.steps=1", "efsgd.clip=0.01", "efsgd.C2=0.02",
    "checkpoint_every=2", "log_every=2", "samples_per_class=4", "progress=false",
    "eval.num_samples=200", "eval.epochs=1", "eval.fid=false", "eval.classifiers=[cnn]",
]


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def test_efsgd_cli_run_releases_no_error_state(tmp_path):
    # per_path (the paper's e_d, e_c, e_e): three error states and three paths from t_c on (joint: two and two;
    # the reconstruction code is drawn from G's prior, public, so it is no path of its own)
    # every member sampled at every iteration (q = m/K = 1): each error state has been written when the run ends
    res = run_script("train.py", "method=efsgd", "dataset=digits", *TINY_EFSGD, "efsgd.sanitize=per_path",
                     "efsgd.partitions_per_iter=4",
                     f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    run_dir = tmp_path / "run"
    for f in ("generator.pt", "privacy.json", "metrics.json", "samples.png"):
        assert (run_dir / f).is_file(), f
    payload = torch.load(run_dir / "generator.pt", weights_only=True)
    assert payload["class"] == "dpgen.efsgd.nets:NoiseInjectionGenerator"
    assert payload["kwargs"]["noise_injection"] is True and payload["kwargs"]["sigma_noise"] == pytest.approx(0.1)
    assert all(k.startswith(("fc.", "blocks.", "out.")) for k in payload["state_dict"]), "only the generator"
    # the private checkpoint holds the error states; none of them reaches generator.pt
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    errors = [s["error"] for s in ckpt["state"]["errors"].values() if s["error"] is not None]
    assert len(errors) == 3 and all(e.abs().sum() > 0 for e in errors)
    released = list(_tensors(payload))
    for e in errors:
        assert not any(t.shape == e.shape for t in released)
        row = e.flatten()[e.flatten().abs().argmax()].item()
        assert not any((t.detach().float() == row).any() for t in released if t.is_floating_point())
    for f in ("privacy.json", "metrics.json"):
        assert "error_state" not in (run_dir / f).read_text()
    privacy = json.loads((run_dir / "privacy.json").read_text())
    assert privacy["accounting"] == "sound" and privacy["epsilon"] <= 10.0
    assert [(e["name"], e["count"], len(e["noise_multipliers"])) for e in privacy["entries"]] == [
        ("efsgd.generator", 2, 2), ("efsgd.generator", 2, 3)]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["method"] == "efsgd"
    _check_accuracies(metrics)


def test_raw_encoder_code_needs_paper_accounting(tmp_path):
    res = run_script("train.py", "method=efsgd", *TINY_EFSGD, "efsgd.encoder.code=raw", cwd=tmp_path)
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "efsgd.encoder.code=raw" in lines[0], res.stderr[-2000:]


@pytest.mark.slow
def test_efsgd_paper_accounting_with_ablations(tmp_path):
    # raw codes reveal how many partitions an iteration sampled: only with one uniform partition (the paper's);
    # per_path: D's and C's releases apart, as the paper's Eq. 15 terms
    res = run_script("train.py", "method=efsgd", *TINY_EFSGD, "privacy.accounting=paper", "efsgd.encoder.code=raw",
                     "efsgd.sampling=uniform", "efsgd.sanitize=per_path",
                     "efsgd.error_feedback=false", "efsgd.noise_injection=false", f"hydra.run.dir={tmp_path}/run",
                     cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert privacy["valid_dp_guarantee"] is False and privacy["epsilon"] <= 10.0
    assert [len(e["noise_multipliers"]) for e in privacy["entries"]] == [2, 3], "C's path from classifier.start on"
    assert any("Not a valid DP guarantee" in n for n in privacy["notes"])
    payload = torch.load(tmp_path / "run" / "generator.pt", weights_only=True)
    assert payload["kwargs"]["noise_injection"] is False


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
