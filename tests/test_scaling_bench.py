"""bench/scaling.py (issue 25): 1 process, W processes and 1 process with W threads, side by side in one run."""
from __future__ import annotations

import importlib.util

import pytest

from conftest import ROOT


@pytest.mark.slow
def test_scaling_bench_reports_one_and_two_processes(tmp_path):
    spec = importlib.util.spec_from_file_location("scaling", ROOT / "bench" / "scaling.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "scaling.md"
    rows = bench.main(["--methods", "gpate", "--steps", "2", "--data-root", str(tmp_path / "data"), "--out", str(out)])
    assert [(r["processes"], r["threads/process"]) for r in rows] == [(1, 1), (2, 1), (1, 2)], rows
    assert all(r["per s"] > 0 for r in rows) and rows[0]["speed-up"] == 1.0
    assert rows[1]["speed-up"] == pytest.approx(rows[1]["per s"] / rows[0]["per s"])
    assert "| gpate | generator iterations | 2 | 1 | cpu |" in out.read_text()
