"""scripts/probe_samples.py (dpgen.eval.probe) on a finished tiny run: what it writes, and bad input."""
from __future__ import annotations

import json

from inprocess import call, files_in, one_error


def test_probe_writes_its_report_and_grids(trained_run, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "probe"
    code, stdout, err = call(capsys, "probe_samples", f"run={trained_run}", f"out={out}", "n=200", "epochs=1",
                             f"data_root={trained_run.parent / 'data'}")
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["probe.json", "real_grid.png", "samples_grid.png"]
    res = json.loads((out / "probe.json").read_text())
    assert res["num_samples"] == 200 and len(res["per_class_recall"]) == 10
    assert sum(map(sum, res["confusion"])) == 360  # every real test image once
    for key in ("real_test_accuracy", "label_consistency"):
        assert 0.0 <= res[key] <= 1.0
    assert set(res["variants"]) == {"smooth"}  # dpgan's generator has no batch-statistics sampling
    assert json.loads(stdout)["num_samples"] == 200


def test_probe_refuses_bad_input_before_writing(trained_run, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = call(capsys, "probe_samples", f"run={trained_run}", f"out={tmp_path / 'p'}", "variants=fancy")
    assert "variants=fancy is invalid" in one_error(code, err)
    code, _, err = call(capsys, "probe_samples", f"run={trained_run}", f"out={tmp_path}")
    assert "exists" in one_error(code, err)
    assert files_in(tmp_path) == {}
