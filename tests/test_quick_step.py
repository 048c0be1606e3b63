"""bench/quick_step.py: each method's quick-profile step with compile off and on, side by side in one table."""
from __future__ import annotations

import importlib.util

import torch

from conftest import ROOT


def _bench():
    spec = importlib.util.spec_from_file_location("quick_step", ROOT / "bench" / "quick_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_step_prints_both_columns(tmp_path, capsys, monkeypatch, one_torch_thread):
    """One method, one timed step, tiny config: the table has the off and on columns and their ratio, and the
    compile-on run went through torch.compile (here the identity: compiling for real takes a minute on a CPU)."""
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    bench = _bench()
    rows = bench.main(["--tiny", "--methods", "dpgan", "--steps", "1", "--warmup", "1", "--budget", "2",
                       "--data-root", str(tmp_path / "data"), "--out", str(tmp_path / "q.md")])
    (row,) = rows
    assert row["s/step off"] > 0 and row["s/step on"] > 0
    assert row["on/off"] == row["s/step on"] / row["s/step off"]
    assert row["untimed s off"] > 0 and "compile s (≈)" in row and "on/off (median)" in row
    assert "on: 0 graphs" in row["notes"] and "never called" not in row["notes"]
    out = capsys.readouterr().out.rstrip("\n").splitlines()
    assert out[-5].startswith("quick-step: torch ") and "digits profile=quick (tiny)" in out[-5] and out[-4] == ""
    assert out[-3].startswith("| method | s/step off | s/step on | on/off | on/off (median) |")
    cells = [c.strip() for c in out[-1].strip("|").split("|")]
    assert cells[0] == "dpgan" and float(cells[1]) > 0 and float(cells[2]) > 0 and float(cells[3]) > 0
    assert (tmp_path / "q.md").read_text().rstrip("\n").splitlines()[-1] == out[-1]
