"""One tiny end-to-end G-PATE run through the CLI: the run-directory contract."""
from __future__ import annotations

import json
import re

import pytest
import torch

from conftest import run_script

TINY_GPATE = [
    "method=gpate", "dataset=digits", "eps=10", "gpate.teachers=6", "gpate.iters=3", "gpate.batch_size=4",
    "gpate.proj_dim=3", "gpate.teacher_warmup=1", "gpate.gf_dim=4", "gpate.gfc_dim=16", "gpate.df_dim=4",
    "gpate.dfc_dim=8", "samples_per_class=2", "progress=false", "log_every=1", "eval.num_samples=200",
    "eval.epochs=1", "eval.fid=false", "eval.classifiers=[cnn]",
]


def test_gpate_cli_run_writes_the_contract(tmp_path):
    res = run_script("train.py", *TINY_GPATE, f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    run = tmp_path / "run"
    privacy = json.loads((run / "privacy.json").read_text())
    assert privacy["valid_dp_guarantee"] is True and privacy["accounting"] == "sound"
    assert 0 < privacy["epsilon"] <= 10.0
    (entry,) = privacy["entries"]
    assert entry["name"] == "gpate.confident_gnmax" and entry["count"] == 3 * 4 * 3  # iters × batch × proj_dim
    metrics = json.loads((run / "metrics.json").read_text())
    from dpgen.data import load_dataset

    n_test = len(load_dataset("digits", str(tmp_path / "data")).test)
    acc = metrics["g2r"]["cnn"]["accuracy"]
    assert abs(acc * n_test - round(acc * n_test)) < 1e-6, "an accuracy over the real test set"
    r2g = metrics["r2g"]["accuracy"]
    assert abs(r2g * 200 - round(r2g * 200)) < 1e-6, "an accuracy over the 200 synthetic samples"
    payload = torch.load(run / "generator.pt", weights_only=True)
    assert payload["class"] == "dpgen.gpate.nets:GPateGenerator"
    assert payload["kwargs"]["sample_stats"] == "running" and payload["kwargs"]["sample_group"] == 4  # quick profile
    assert not any("teacher" in k or k.startswith(("conv", "bn")) for k in payload["state_dict"])
    # metrics.json's agreement is the mean of the per-iteration agreements the log shows (log_every=1)
    logged = [float(m) for m in re.findall(r"agreement=([0-9.e+-]+)", (run / "train.log").read_text())]
    assert len(logged) == 3
    assert metrics["training"]["teacher_agreement"] == pytest.approx(sum(logged) / 3, abs=1e-3)


def test_gpate_bad_input_is_one_line(tmp_path, capsys, monkeypatch):
    """train.py's checks before Hydra, in-process (tests/inprocess.py): the refusal comes before any directory."""
    from inprocess import call, files_in, one_error

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPGEN_DATA", str(tmp_path / "data"))
    code, _, err = call(capsys, "train", "method=gpate", "dataset=digits", "gpate.teachers=5000", "progress=false",
                        f"hydra.run.dir={tmp_path}/run")
    assert code == 2 and "fewer than one record per teacher" in one_error(code, err)
    assert files_in(tmp_path) == {}
