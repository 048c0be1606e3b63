"""The CLI contract: run outputs, sample/evaluate/collect scripts, resume, and bad input."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import TINY, run_script


def test_run_directory_contract(trained_run):
    names = {p.name for p in trained_run.iterdir()}
    for expected in (".hydra", "train.log", "tb", "checkpoints", "generator.pt", "samples.png", "privacy.json",
                     "metrics.json"):
        assert expected in names, f"{expected} missing from the run directory"
    assert any(p.name.startswith("events.out.tfevents") for p in (trained_run / "tb").iterdir())
    assert (trained_run / "checkpoints" / "last.pt").is_file()
    assert not list(trained_run.rglob("*.tmp*")), "temp files left behind"

    privacy = json.loads((trained_run / "privacy.json").read_text())
    for key in ("epsilon", "delta", "target_epsilon", "accountant", "accounting", "valid_dp_guarantee", "entries", "notes"):
        assert key in privacy
    assert 0 < privacy["epsilon"] <= privacy["target_epsilon"] == 10.0
    assert privacy["accounting"] == "sound" and privacy["valid_dp_guarantee"] is True
    assert privacy["entries"][0]["name"] == "dpgan.discriminator" and privacy["entries"][0]["count"] == 12

    metrics = json.loads((trained_run / "metrics.json").read_text())
    assert 0.0 <= metrics["g2r"]["cnn"]["accuracy"] <= 1.0
    assert metrics["fid"] is None and metrics["fid_reason"]
    assert "train.log" in names and "step 12" in (trained_run / "train.log").read_text()


def test_samples_grid_has_one_row_per_class(trained_run):
    from PIL import Image

    img = Image.open(trained_run / "samples.png")
    # 10 classes × (28 px + 1 px padding) + 1 px border, 4 columns
    assert img.size == (4 * 29 + 1, 10 * 29 + 1)


def test_released_generator_holds_only_the_generator(trained_run):
    payload = torch.load(trained_run / "generator.pt", weights_only=True)
    assert payload["class"] == "dpgen.nets.dcgan:CondGenerator"
    assert not any(k.startswith(("score", "embed.weight_d", "_module")) for k in payload["state_dict"])
    from dpgen.nets.dcgan import CondGenerator

    ref = CondGenerator(**payload["kwargs"]).state_dict()
    assert set(payload["state_dict"]) == set(ref), "generator.pt must hold exactly the generator's weights"


def test_sample_script_writes_balanced_uint8(trained_run, tmp_path):
    out = tmp_path / "syn.npz"
    res = run_script("sample.py", f"run={trained_run}", "n=50", f"out={out}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    data = np.load(out)
    assert data["x"].dtype == np.uint8 and data["x"].shape == (50, 1, 28, 28)
    assert data["y"].dtype == np.int64 and np.bincount(data["y"]).tolist() == [5] * 10
    again = run_script("sample.py", f"run={trained_run}", "n=50", f"out={out}", cwd=tmp_path)
    assert again.returncode == 2 and "exists" in again.stderr, "an existing output must not be overwritten"


def test_evaluate_and_collect_scripts(trained_run, tmp_path):
    before = (trained_run / "metrics.json").read_text()
    res = run_script("evaluate.py", f"run={trained_run}", "eval.num_samples=100", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    kept = [p for p in trained_run.glob("metrics.*.json")]
    assert kept and kept[0].read_text() == before, "the previous metrics.json must be kept"
    assert json.loads((trained_run / "metrics.json").read_text())["num_synthetic"] == 100
    res = run_script("collect.py", str(trained_run.parent), f"out={tmp_path / 'report'}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    md = (tmp_path / "report" / "results.md").read_text()
    assert "| dpgan | digits | 10 |" in md
    assert (tmp_path / "report" / "results.csv").is_file() and (tmp_path / "report" / "privacy_utility.png").is_file()


def test_resume_gives_the_same_epsilon_as_an_uninterrupted_run(trained_run, tmp_path):
    run_dir = tmp_path / "interrupted"
    res = run_script("train.py", *TINY, "debug.stop_after=6", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert res.returncode == 3, res.stderr[-2000:]
    assert not (run_dir / "generator.pt").exists()
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["step"] == 6 and ckpt["ledger"]["entries"][0]["count"] == 6
    res = run_script("train.py", *TINY, f"resume={run_dir}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    resumed = json.loads((run_dir / "privacy.json").read_text())
    full = json.loads((trained_run / "privacy.json").read_text())
    assert resumed["entries"] == full["entries"]
    assert resumed["epsilon"] == pytest.approx(full["epsilon"], rel=1e-12)
    assert (run_dir / ".hydra" / "config.yaml").is_file() and list((run_dir / ".hydra").glob("resume-*"))


@pytest.mark.parametrize("args, needle", [
    (["eps=0"], "eps"),
    (["eps=-1"], "eps"),
    (["delta=0.01"], "1/N"),
    (["method=nope"], "unknown method"),
    (["dataset=nope"], "unknown dataset"),
    (["dataset=mnist"], "mnist"),
    (["privacy.accounting=fancy"], "accounting"),
    (["no_such_key=1"], "bad config"),
    (["threads=0"], "threads"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args, needle):
    res = run_script("train.py", *args, cwd=tmp_path)
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and needle in lines[0], res.stderr
    assert not (tmp_path / "outputs").exists(), "a failed run must not leave a run directory"


def test_corrupt_checkpoint_is_rejected_and_left_untouched(trained_run, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(trained_run, copy)
    ckpt = copy / "checkpoints" / "last.pt"
    ckpt.write_bytes(b"not a checkpoint")
    before = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    res = run_script("train.py", *TINY, f"resume={copy}", cwd=tmp_path)
    assert res.returncode == 2 and "corrupt" in res.stderr
    after = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file() and p in before}
    assert after == before, "nothing already written may change"


def test_multirun_sweep_writes_one_run_per_combination(tmp_path):
    sweep = tmp_path / "sweep"
    res = run_script("train.py", "-m", *TINY, "dpgan.iters=4", "eps=1,10", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    for eps in ("1", "10"):
        run = sweep / "dpgan" / "digits" / f"eps{eps}" / "seed0"
        privacy = json.loads((run / "privacy.json").read_text())
        assert privacy["target_epsilon"] == float(eps) and privacy["epsilon"] <= float(eps)
        assert (run / "metrics.json").is_file() and (run / "generator.pt").is_file()


def test_bad_sweep_value_is_caught_before_any_run(tmp_path):
    res = run_script("train.py", "-m", *TINY, "eps=1,-1", cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.count("error:") == 1
    assert not (tmp_path / "outputs").exists()


def test_experiment_sweep_values_are_checked_before_any_run(tmp_path):
    # gpate_table1c sweeps over mnist and CelebA, which are not on this machine: precheck must
    # see the experiment's own hydra.sweeper.params, not only the command line.
    res = run_script("train.py", "-m", "+experiment=gpate_table1c", cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.count("error:") == 1, res.stderr[-2000:]
    assert "missing" in res.stderr
    assert not (tmp_path / "outputs").exists()
