"""dpgen.report / scripts/collect.py on the fixture runs: summaries, variants, and the comparison with the papers."""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from conftest import ROOT, run_script
from dpgen.errors import DpgenError
from dpgen.report import collect_runs, compare, load_paper_results, summarise, write_comparison

FIXTURES = ROOT / "tests" / "fixtures" / "runs"


def _relabel(run: Path, **fields) -> None:
    """Edit a copied fixture so it stands for another setting (the fixtures are tiny digits runs)."""
    m = json.loads((run / "metrics.json").read_text())
    p = json.loads((run / "privacy.json").read_text())
    for key, value in fields.items():
        if key == "accounting":
            p["accounting"], p["valid_dp_guarantee"] = value, value == "sound"
        elif key == "g2r_cnn":
            m["g2r"]["cnn"]["accuracy"] = value
        else:
            m[key] = value
    (run / "metrics.json").write_text(json.dumps(m))
    (run / "privacy.json").write_text(json.dumps(p))


@pytest.fixture
def runs(tmp_path) -> Path:
    """dpgan as 'fmnist' at eps 10: a paper-profile pair (two seeds, sound), the same under paper accounting,
    and a quick run; feta mean/mode as 'fmnist'."""
    root = tmp_path / "runs"
    src = FIXTURES / "dpgan" / "digits" / "eps10" / "seed0"
    for name, fields in {
        "paper_s0": dict(dataset="fmnist", profile="paper", seed=0, g2r_cnn=0.60),
        "paper_s1": dict(dataset="fmnist", profile="paper", seed=1, g2r_cnn=0.64),
        "paper_acct": dict(dataset="fmnist", profile="paper", accounting="paper", g2r_cnn=0.70),
        "quick": dict(dataset="fmnist", profile="quick", g2r_cnn=0.30),
    }.items():
        shutil.copytree(src, root / name)
        _relabel(root / name, **fields)
    for central in ("mean", "mode"):
        shutil.copytree(FIXTURES / "feta" / "digits" / "eps10" / f"seed0-{central}", root / f"feta_{central}")
        _relabel(root / f"feta_{central}", dataset="fmnist", profile="paper", g2r_cnn=0.5 if central == "mean" else 0.4)
    return root


PAPER = [
    {"table": "t1", "method": "dpgan", "dataset": "fmnist", "eps": 10, "metric": "g2r_cnn", "value": 0.61,
     "citation": "x Table 1"},
    {"table": "t1", "method": "dpgan", "dataset": "fmnist", "eps": 1, "metric": "g2r_cnn", "value": 0.11,
     "citation": "x Table 1"},  # no run at eps 1: must not appear
    {"table": "t2", "method": "feta", "variant": "mode", "dataset": "fmnist", "eps": 10, "metric": "g2r_cnn",
     "value": 0.866, "citation": "feta Table II"},
]


def test_fixtures_are_small_and_complete():
    runs = collect_runs(FIXTURES)
    assert {r["method"] for r in runs} >= {"dpgan", "feta", "dpaf"}
    assert {r["accounting"] for r in runs} == {"sound", "paper"}
    for f in FIXTURES.rglob("*"):
        assert not f.is_file() or f.stat().st_size < 20_000, f"{f} is too large for a fixture"


def test_feta_variant_comes_from_the_run_config(runs):
    got = {r["run_dir"].rsplit("/", 1)[-1]: r["variant"] for r in collect_runs(runs)}
    assert got["feta_mean"] == "mean" and got["feta_mode"] == "mode" and got["quick"] is None


def test_comparison_keeps_accounting_modes_and_quick_runs_apart(runs):
    rows = compare(summarise(collect_runs(runs)), PAPER)
    by = {(r["method"], r["accounting"], r["profile"]): r for r in rows}
    assert set(by) == {("dpgan", "sound", "paper"), ("dpgan", "paper", "paper"), ("dpgan", "sound", "quick"),
                       ("feta", "sound", "paper")}
    sound = by[("dpgan", "sound", "paper")]
    assert sound["seeds"] == 2 and sound["ours"] == pytest.approx(0.62) and sound["diff"] == pytest.approx(0.01)
    assert sound["comparable"] and not by[("dpgan", "sound", "quick")]["comparable"]
    assert by[("dpgan", "paper", "paper")]["ours"] == pytest.approx(0.70)  # not averaged with the sound runs
    assert not by[("dpgan", "paper", "paper")]["valid_dp_guarantee"]
    feta = by[("feta", "sound", "paper")]
    assert feta["variant"] == "mode" and feta["ours"] == pytest.approx(0.4)  # the mean run is not DP-FETA_o
    assert [r["accounting"] for r in rows] == sorted((r["accounting"] for r in rows), key=["paper", "sound"].index)


def test_markdown_sections_and_quick_label(runs, tmp_path):
    rows = compare(summarise(collect_runs(runs)), PAPER)
    md_path = write_comparison(rows, tmp_path / "out")[1]
    md = md_path.read_text()
    paper_sec, sound_sec = md.index("## `paper` accounting"), md.index("## `sound` accounting")
    assert paper_sec < sound_sec
    sound_part = md[sound_sec:]
    assert "| 0.610 |" not in md  # paper values print as published (0.61), not padded
    assert "0.620 ± 0.028" in sound_part and "| 0.010 |" in sound_part
    assert "**quick** (not comparable)" in sound_part and "**quick**" not in md[paper_sec:sound_sec]
    assert "0.700 ± 0.000" in md[paper_sec:sound_sec] and "0.700" not in sound_part


def test_paper_results_file_names_known_methods_datasets_and_metrics():
    from dpgen.core.methods import available

    rows = load_paper_results(ROOT / "configs" / "paper_results.yaml")
    assert len(rows) > 100
    for r in rows:
        assert r["method"] in available("method") and r["dataset"] in available("dataset"), r
        assert r["metric"] in ("g2r_cnn", "g2r_mlp", "r2g", "fid", "is")
        if r["metric"] in ("g2r_cnn", "g2r_mlp", "r2g"):
            assert 0.0 < r["value"] <= 1.0, f"accuracy must be a fraction: {r}"
        assert r["citation"].split()[0] in ("gpate", "dpac", "efsgd", "dpaf", "feta")
    # spot checks against the papers' tables
    pick = {(r["citation"], r["method"], r.get("variant"), r["dataset"], r["eps"], r["metric"]): r["value"] for r in rows}
    assert pick[("gpate Table 1c", "gpate", None, "fmnist", 1, "g2r_cnn")] == 0.5812
    assert pick[("dpac Table 2", "dpac", None, "fmnist", 10, "g2r_cnn")] == 0.73
    assert pick[("feta Table II", "feta", "mode", "fmnist", 10, "g2r_cnn")] == 0.866
    assert pick[("dpaf Table II", "dpaf", None, "celeba64", 1, "g2r_cnn")] == 0.802


def test_bad_paper_rows_are_rejected(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rows:\n  - {table: t, method: dpgan, dataset: fmnist, eps: 1, metric: acc, value: 0.5, citation: c}\n")
    with pytest.raises(DpgenError, match="metric"):
        load_paper_results(bad)
    bad.write_text("rows:\n  - {table: t, method: dpgan, dataset: fmnist, eps: 1, metric: fid, citation: c}\n")
    with pytest.raises(DpgenError, match="value"):
        load_paper_results(bad)


def test_collect_script_writes_the_comparison(runs, tmp_path):
    res = run_script("collect.py", str(runs), f"out={tmp_path / 'report'}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out = tmp_path / "report"
    for name in ("results.csv", "results.md", "privacy_utility.png", "results_vs_paper.csv", "results_vs_paper.md"):
        assert (out / name).is_file(), name
    with (out / "results_vs_paper.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    # the real configs/paper_results.yaml has the DP-FETA_o F-MNIST eps=10 row (0.866) and G-PATE's DP-GAN one (0.6098)
    assert any(r["method"] == "feta" and r["variant"] == "mode" and r["paper"] == "0.866" for r in rows)
    assert any(r["method"] == "dpgan" and r["paper"] == "0.6098" and r["profile"] == "quick" for r in rows)
    res = run_script("collect.py", str(runs), "paper=/nonexistent.yaml", cwd=tmp_path)
    assert res.returncode == 2 and "not found" in res.stderr


def test_privacy_off_runs_are_their_own_epsilon_column(tmp_path):
    """The eps=inf fixture run (dpgan, digits) shows as `∞ (no privacy)`, after the finite ε, never as a budget."""
    from dpgen.report import NO_PRIVACY, by_epsilon, write_outputs

    runs = [r for r in collect_runs(FIXTURES) if r["method"] == "dpgan"]
    assert {r["target_epsilon"] for r in runs} == {1.0, 10.0, float("inf")}
    off = next(r for r in runs if r["target_epsilon"] == float("inf"))
    assert off["epsilon"] == float("inf") and off["valid_dp_guarantee"] is False
    summary = summarise(runs)
    columns, rows = by_epsilon(summary)
    assert columns == ["1", "10", NO_PRIVACY]
    (row,) = rows
    assert row["method"] == "dpgan" and all(c in row for c in columns)
    write_outputs(summary, runs, tmp_path)
    md = (tmp_path / "results.md").read_text()
    assert f"| dpgan | digits | {NO_PRIVACY} | ∞ | sound | False |" in md
    assert f"| {NO_PRIVACY} |" in md.split("## g2r CNN accuracy by target ε")[1]


def test_both_g2r_readings_are_collected_and_a_large_selection_gap_is_flagged(runs, tmp_path):
    from dpgen.report import SELECTION_GAP_FLAG, selection_flags, write_outputs

    for name, (selected, fixed) in {"paper_s0": (0.60, 0.58), "paper_s1": (0.64, 0.62), "quick": (0.30, 0.10)}.items():
        m = json.loads((runs / name / "metrics.json").read_text())
        m["g2r"]["cnn"].update(accuracy=selected, fixed={"accuracy": fixed, "epochs": 10}, selection_gap=selected - fixed)
        (runs / name / "metrics.json").write_text(json.dumps(m))
    summary = summarise(collect_runs(runs))
    by_profile = {(r["profile"], r["accounting"], r["method"]): r for r in summary}
    paper, quick = by_profile[("paper", "sound", "dpgan")], by_profile[("quick", "sound", "dpgan")]
    assert paper["g2r_cnn_fixed_mean"] == pytest.approx(0.60) and paper["g2r_cnn_mean"] == pytest.approx(0.62)
    assert selection_flags(paper) == [] and selection_flags(quick) == ["cnn +0.200"] and SELECTION_GAP_FLAG == 0.05
    assert by_profile[("paper", "paper", "dpgan")]["g2r_cnn_fixed_mean"] is None  # a run without the reading
    md = Path(write_outputs(summary, collect_runs(runs), tmp_path / "out")[1]).read_text()
    assert "| selection gap |" in md and "cnn +0.200" in md and "0.620 ± 0.028 (fixed 0.600)" in md


def test_summarise_reports_n_and_standard_error_beside_mean_and_std():
    runs = [{"method": "dpgan", "dataset": "fmnist", "target_epsilon": 10.0, "accounting": "sound",
             "profile": "quick", "variant": None, "epsilon": 9.9, "valid_dp_guarantee": True,
             **{c: None for c in ("g2r_cnn", "g2r_mlp", "g2r_mlp_fixed", "r2g", "cnn_fid", "fid", "is",
                                  "train_seconds")}, "g2r_cnn_fixed": v} for v in (0.5, 0.6, 0.7)]
    runs[2]["r2g"] = 0.4
    (row,) = summarise(runs)
    assert row["g2r_cnn_fixed_mean"] == pytest.approx(0.6) and row["g2r_cnn_fixed_std"] == pytest.approx(0.1)
    assert row["g2r_cnn_fixed_n"] == 3 and row["g2r_cnn_fixed_se"] == pytest.approx(0.1 / 3 ** 0.5)
    assert (row["r2g_n"], row["r2g_std"], row["r2g_se"]) == (1, 0.0, None)  # one reading: no standard error
    assert (row["g2r_cnn_n"], row["g2r_cnn_mean"], row["g2r_cnn_se"]) == (0, None, None)


def test_the_plot_draws_the_fixed_reading_with_standard_error_bars(tmp_path):
    from dpgen.report import curve_points, plot_privacy_utility

    base = {"method": "dpgan", "dataset": "fmnist", "accounting": "sound", "profile": "quick", "variant": None,
            "g2r_cnn_mean": 0.9}  # the selected reading: not the one the plot draws
    summary = [{**base, "target_epsilon": 1.0, "g2r_cnn_fixed_mean": 0.4, "g2r_cnn_fixed_se": 0.02,
                "g2r_cnn_fixed_n": 3},
               {**base, "target_epsilon": 10.0, "g2r_cnn_fixed_mean": 0.5, "g2r_cnn_fixed_se": None,
                "g2r_cnn_fixed_n": 1},
               {**base, "target_epsilon": float("inf"), "g2r_cnn_fixed_mean": 0.6, "g2r_cnn_fixed_se": None,
                "g2r_cnn_fixed_n": 1},
               {**base, "variant": "mode", "target_epsilon": 10.0, "g2r_cnn_fixed_mean": None}]  # no reading
    points = curve_points(summary)
    assert [(p["eps"], p["mean"], p["se"], p["n"]) for p in points] == [
        (1.0, 0.4, 0.02, 3), (10.0, 0.5, None, 1), (float("inf"), 0.6, None, 1)]
    assert {p["label"] for p in points} == {"dpgan/fmnist (sound, quick)"}  # ε = ∞ joins its line
    out = plot_privacy_utility(points, tmp_path / "p.png", metadata={"Description": "tiny"})
    from PIL import Image

    with Image.open(out) as img:
        assert img.format == "PNG" and img.size[0] > 300 and img.text.get("Description") == "tiny"
    plot_privacy_utility([], tmp_path / "empty.png")  # nothing to draw is still a figure, not an error
    assert (tmp_path / "empty.png").stat().st_size > 0
