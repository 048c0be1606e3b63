"""The CLI contract: run outputs, sample/evaluate/collect scripts, resume, and bad input.

Subprocesses only where a real process matters (training through Hydra, the exit code of the headline
usage line); the other scripts and the checks before Hydra run in-process (tests/inprocess.py).
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from conftest import TINY, run_script
from inprocess import call, files_in, one_error, script

# evaluation parts that train a real-data classifier: off where a test does not look at them
NO_REAL_CLASSIFIER = ["eval.r2g=false", "eval.real_baseline=false", "eval.cnn_fid=false"]


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
    g2r = metrics["g2r"]["cnn"]
    assert metrics["num_synthetic"] == 200 and g2r["num_train"] + g2r["num_val"] == 200
    n_test = 360  # digits: 1797 images, 1437 for training
    assert abs(g2r["accuracy"] * n_test - round(g2r["accuracy"] * n_test)) < 1e-6, "accuracy = correct / test size"
    assert metrics["fid"] is None and metrics["fid_reason"]
    assert "train.log" in names and "step 12" in (trained_run / "train.log").read_text()


def test_the_run_ends_with_a_summary_of_what_it_spent_reached_and_wrote(trained_run):
    """The last lines train.py prints: ε spent of the target with δ, both g2r readings (3 decimals), time, the files,
    and three next commands that name this run."""
    out = (trained_run.parent / "stdout.txt").read_text()
    privacy = json.loads((trained_run / "privacy.json").read_text())
    g2r = json.loads((trained_run / "metrics.json").read_text())["g2r"]["cnn"]
    assert f"privacy: epsilon {privacy['epsilon']:.3f} spent of 10, delta 1e-05, sound accounting: a valid DP" in out
    assert f"g2r CNN: {g2r['accuracy']:.3f} selected" in out and f"/ {g2r['fixed']['accuracy']:.3f} fixed" in out
    assert g2r["fixed"]["one_training"] is True  # the default evaluation: both readings from one training
    assert "training, " in out and f"files: {trained_run}/ (generator.pt, samples.png, privacy.json" in out
    nxt = out[out.index("next:"):].splitlines()[1:]
    assert len(nxt) == 3 and f"scripts/sample.py run={trained_run}" in nxt[0] and "eval=full" in nxt[1]


def test_summary_says_when_a_run_is_not_private(tmp_path):
    from dpgen.core.summary import privacy_line

    off = privacy_line({"epsilon": None, "target_epsilon": float("inf"), "delta": 1e-5})
    assert "NOT private" in off
    paper = privacy_line({"epsilon": 9.99, "target_epsilon": 10.0, "delta": 1e-5, "accounting": "paper",
                          "valid_dp_guarantee": False, "sound_epsilon": 366.1})
    assert "NOT a valid DP guarantee" in paper and "sound epsilon 366.100" in paper


def test_evaluate_takes_a_whole_evaluation_by_name(trained_run, tmp_path, capsys, monkeypatch):
    kept = []  # the evaluator trains classifiers: it keeps freed host memory as a training run does
    monkeypatch.setattr(script("evaluate"), "keep_freed_memory", lambda: kept.append(1) or True)
    code, _, err = call(capsys, "evaluate", f"run={trained_run}", "eval=nosuch")
    assert "eval='nosuch' is not an evaluation; choose one of default, full, paper" in one_error(code, err)
    copy = tmp_path / "run"
    shutil.copytree(trained_run, copy)
    code, _, err = call(capsys, "evaluate", f"run={copy}", "eval=full", "eval.num_samples=100", "eval.epochs=1",
                        "eval.fid=false", "eval.inception_score=false", *NO_REAL_CLASSIFIER)
    assert code == 0, err
    g2r = json.loads((copy / "metrics.json").read_text())["g2r"]
    assert set(g2r) == {"cnn", "mlp"} and "one_training" not in g2r["cnn"]["fixed"]  # eval=full: trained apart
    assert g2r["cnn"]["fixed"]["num_train"] == 100
    assert kept == [1]


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


def test_sample_script_writes_balanced_uint8(trained_run, tmp_path, capsys):
    out = tmp_path / "syn.npz"
    code, _, err = call(capsys, "sample", f"run={trained_run}", "n=50", f"out={out}")
    assert code == 0, err
    data = np.load(out)
    assert data["x"].dtype == np.uint8 and data["x"].shape == (50, 1, 28, 28)
    assert data["y"].dtype == np.int64 and np.bincount(data["y"]).tolist() == [5] * 10
    code, _, err = call(capsys, "sample", f"run={trained_run}", "n=50", f"out={out}")
    assert "exists" in one_error(code, err), "an existing output must not be overwritten"
    for bad in ("n=abc", "n=0", "seed=-1", "labels=x"):
        code, _, err = call(capsys, "sample", f"run={trained_run}", bad, f"out={tmp_path / 'other.npz'}",
                            *(["n=5"] if not bad.startswith("n=") else []))
        assert bad.split("=")[0] in one_error(code, err)


def test_evaluate_reproduces_the_pipelines_numbers_and_collect_summarises(trained_run, tmp_path, capsys, monkeypatch):
    """evaluate.py rebuilds everything from generator.pt and the saved config alone: with the run's own eval
    settings it must give the pipeline's numbers (same seeds, the real-data classifier from the cache)."""
    monkeypatch.setenv("DPGEN_DATA", str(trained_run.parent / "data"))  # the run's data_root: its eval cache
    run = tmp_path / "runs" / "run"  # evaluate.py rewrites metrics.json: a copy of the shared run
    shutil.copytree(trained_run, run)
    before = json.loads((run / "metrics.json").read_text())
    code, _, err = call(capsys, "evaluate", f"run={run}")
    assert code == 0, err
    kept = list(run.glob("metrics.*.json"))
    assert kept and json.loads(kept[0].read_text()) == before, "the previous metrics.json must be kept"
    again = json.loads((run / "metrics.json").read_text())
    assert again["real_classifiers"]["cnn"]["cached"] is True
    # same synthetic samples and classifier training: the same loss and (up to one test image) accuracy
    assert again["g2r"]["cnn"]["train_loss"] == pytest.approx(before["g2r"]["cnn"]["train_loss"], rel=1e-4)
    assert again["g2r"]["cnn"]["accuracy"] == pytest.approx(before["g2r"]["cnn"]["accuracy"], abs=1.01 / 360)
    assert again["r2g"]["accuracy"] == pytest.approx(before["r2g"]["accuracy"], abs=1e-9)
    assert again["real_accuracy"] == before["real_accuracy"]
    code, _, err = call(capsys, "evaluate", f"run={run}", "eval.num_samples=-5")
    assert "eval.num_samples=-5 is invalid" in one_error(code, err)
    code, _, err = call(capsys, "collect", str(run.parent), f"out={tmp_path / 'report'}")
    assert code == 0, err
    md = (tmp_path / "report" / "results.md").read_text()
    assert "| dpgan | digits | 10 |" in md
    assert (tmp_path / "report" / "results.csv").is_file() and (tmp_path / "report" / "privacy_utility.png").is_file()


def test_resume_gives_the_same_epsilon_as_an_uninterrupted_run(trained_run, tmp_path):
    run_dir = tmp_path / "interrupted"
    res = run_script("train.py", *TINY, *NO_REAL_CLASSIFIER, "debug.stop_after=6", f"hydra.run.dir={run_dir}",
                     cwd=tmp_path)
    assert res.returncode == 3, res.stderr[-2000:]
    assert not (run_dir / "generator.pt").exists()
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["step"] == 6 and ckpt["ledger"]["entries"][0]["count"] == 6
    res = run_script("train.py", *TINY, *NO_REAL_CLASSIFIER, f"resume={run_dir}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    resumed = json.loads((run_dir / "privacy.json").read_text())
    full = json.loads((trained_run / "privacy.json").read_text())
    assert resumed["entries"] == full["entries"]
    assert resumed["epsilon"] == pytest.approx(full["epsilon"], rel=1e-12)
    assert (run_dir / ".hydra" / "config.yaml").is_file() and list((run_dir / ".hydra").glob("resume-*"))


@pytest.mark.slow  # resume_dir("auto"): tests/test_clusters.py; resuming through train.py: the test above
def test_resume_auto_starts_then_continues_in_the_jobs_own_directory(trained_run, tmp_path):
    """resume=auto (the SLURM launcher's default): a first attempt starts fresh; a requeued attempt of the same
    command finds its own checkpoint and continues to the uninterrupted run's ledger, keeping the first config."""
    run_dir = tmp_path / "job"
    args = [*TINY, *NO_REAL_CLASSIFIER, "resume=auto", f"hydra.run.dir={run_dir}"]
    res = run_script("train.py", *args, "debug.stop_after=6", cwd=tmp_path)
    assert res.returncode == 3, res.stderr[-2000:]
    first_config = (run_dir / ".hydra" / "config.yaml").read_text()
    res = run_script("train.py", *args, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "resumed from" in (run_dir / "train.log").read_text()
    resumed = json.loads((run_dir / "privacy.json").read_text())
    assert resumed["entries"] == json.loads((trained_run / "privacy.json").read_text())["entries"]
    assert (run_dir / ".hydra" / "config.yaml").read_text() == first_config, "the first attempt's config is kept"
    assert list((run_dir / ".hydra").glob("resume-*/config.yaml"))


def test_the_headline_usage_line_reaches_the_data_step(tmp_path):
    """README's usage line, exactly, in a real process (the one bad-input subprocess test: exit code 2, one
    line, nothing written). Without CelebA it stops at the data with the concrete dataset named."""
    res = run_script("train.py", "method=dpaf", "dataset=celeba", "eps=1", cwd=tmp_path)
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "dataset=celeba is celeba64 for method=dpaf" in lines[0] and str(tmp_path / "data" / "celeba") in lines[0]
    assert files_in(tmp_path) == {}, "a failed run must write nothing"


def test_corrupt_checkpoint_is_rejected_and_left_untouched(trained_run, tmp_path, capsys, monkeypatch):

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPGEN_DATA", str(tmp_path / "data"))
    copy = tmp_path / "copy"
    shutil.copytree(trained_run, copy)
    ckpt = copy / "checkpoints" / "last.pt"
    ckpt.write_bytes(b"not a checkpoint")
    before = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    code, _, err = call(capsys, "train", *TINY, f"resume={copy}")
    assert "corrupt" in one_error(code, err)
    after = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    assert after == before, "nothing already written may change"


def test_a_run_from_before_secret_randomness_is_not_resumed(trained_run, tmp_path, capsys, monkeypatch):
    """A checkpoint whose noise streams came from the public seed (before issue 23) and its config without the new
    privacy keys: refused in one line, nothing written (the run it would continue has no DP guarantee)."""

    import torch

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPGEN_DATA", str(tmp_path / "data"))
    copy = tmp_path / "old"
    shutil.copytree(trained_run, copy)
    ckpt_path = copy / "checkpoints" / "last.pt"
    ckpt = torch.load(ckpt_path, weights_only=True)
    ckpt["generators"] = ckpt.pop("streams")["secret"]  # the old layout
    torch.save(ckpt, ckpt_path)
    cfg = copy / ".hydra" / "config.yaml"
    cfg.write_text("\n".join(ln for ln in cfg.read_text().splitlines()
                             if not ln.strip().startswith(("noise_seed:", "secure_noise:"))) + "\n")
    before = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    code, _, err = call(capsys, "train", *TINY, f"resume={copy}")
    assert "predates secret randomness" in one_error(code, err)
    assert {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()} == before


def test_multirun_sweep_writes_one_run_per_combination(tmp_path):
    sweep = tmp_path / "sweep"
    res = run_script("train.py", "-m", *TINY, *NO_REAL_CLASSIFIER, "dpgan.iters=4", "eps=1,10",
                     f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    for eps in ("1", "10"):
        run = sweep / "dpgan" / "digits" / f"eps{eps}" / "seed0"
        privacy = json.loads((run / "privacy.json").read_text())
        assert privacy["target_epsilon"] == float(eps) and privacy["epsilon"] <= float(eps)
        assert (run / "metrics.json").is_file() and (run / "generator.pt").is_file()


def test_bad_sweep_value_is_caught_before_any_run(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPGEN_DATA", str(tmp_path / "data"))
    code, _, err = call(capsys, "train", "-m", *TINY, "eps=1,-1")
    assert "eps (target epsilon) must be a positive number or inf, got -1" in one_error(code, err)
    assert not (tmp_path / "outputs").exists()


def test_experiment_sweep_values_are_checked_before_any_run(tmp_path, capsys, monkeypatch):
    # gpate_table1c sweeps over mnist and CelebA, which are not on this machine: precheck must
    # see the experiment's own hydra.sweeper.params, not only the command line.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPGEN_DATA", str(tmp_path / "data"))
    code, _, err = call(capsys, "train", "-m", "+experiment=gpate_table1c")
    assert "missing" in one_error(code, err)
    assert not (tmp_path / "outputs").exists()
