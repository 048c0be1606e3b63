"""Every measured figure of the documentation comes from docs/data/ (scripts/docs_tables.py; docs/development.md,
"Measured figures"):

- each generated block of README.md and docs/*.md is what the generator writes from the data today;
- every figure outside a generated block (the figure rule of scripts/docs_tables.py) equals a value of a data file;
- every current utility row's command still composes the config it was measured with;
- config comments quote no measured figure and cite no issue number;
- the data agree with the code where the code holds the same figure (PEAK_GB).
"""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from tests.test_docs import check_command, tokens

ROOT = Path(__file__).resolve().parents[1]


def _load_generator():
    spec = importlib.util.spec_from_file_location("docs_tables", ROOT / "scripts" / "docs_tables.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_tables"] = module
    spec.loader.exec_module(module)
    return module


dt = _load_generator()


def test_generated_blocks_match_their_data():
    errors = dt.stale_blocks()
    assert not errors, "\n".join(errors)


def test_every_figure_in_the_docs_is_in_a_data_file():
    errors = dt.untraced_figures()
    assert not errors, "\n".join(errors)


def test_current_rows_still_compose_the_config_they_were_measured_with():
    errors = dt.stale_hashes()
    assert not errors, "\n".join(errors)


def test_the_committed_plot_is_drawn_from_todays_data():
    errors = dt.stale_plot()
    assert not errors, "\n".join(errors)


def test_the_plots_stamp_tells_other_data(tmp_path, monkeypatch):
    png = dt.write_plot(tmp_path / "p.png")
    assert dt.stale_plot(png) == []
    points = dt.plot_points()
    monkeypatch.setattr(dt, "plot_points", lambda: [{**points[0], "mean": points[0]["mean"] + 0.001}] + points[1:])
    assert "drawn from other data" in dt.stale_plot(png)[0]
    assert "missing" in dt.stale_plot(tmp_path / "none.png")[0]


def _row(rid, method, eps, accounting, cnn, mlp=None, variant=None, train_s=None, **extra):
    draws = [{"date": "2026-01-01", "commit": "x", "g2r_cnn": c, "g2r_mlp": (mlp or cnn)[i],
              "train_s": train_s} for i, c in enumerate(cnn)]
    return dt.Row({"id": rid, "method": method, "variant": variant, "eps": eps, "accounting": accounting,
                   "current": True, "dataset": "fmnist", "profile": "quick", "command": f"c {rid}",
                   "draws": draws, **extra})


@pytest.fixture
def tiny_data(monkeypatch):
    rows = [_row("a10", "gswgan", 10, "sound", [0.5, 0.6, 0.7], [0.4, 0.4, 0.4], train_s=3600),
            _row("a1", "gswgan", 1, "sound", [0.2], train_s=3600),
            _row("a10p", "gswgan", 10, "paper", [0.9], train_s=3600),                 # not sound: not in the grid
            _row("ainf", "gswgan", float("inf"), "none", [0.8], train_s=3600),
            _row("aset", "gswgan", 5, "sound", [0.9], setting="x", train_s=3600),     # a setting: not the profile
            _row("f10", "feta", 10, "sound", [0.6], variant="mode", train_s=3600)]
    paper = [{"method": "gswgan", "dataset": "fmnist", "eps": 10, "metric": "g2r_cnn", "value": 0.65,
              "citation": "p Table 2"},
             {"method": "gswgan", "dataset": "fmnist", "eps": 10, "metric": "g2r_mlp", "value": 0.64,
              "citation": "p Table 2"},
             {"method": "gswgan", "dataset": "fmnist", "eps": 2, "metric": "g2r_cnn", "value": 0.3,
              "citation": "q Table 1"}]
    monkeypatch.setattr(dt, "utility_rows", lambda: rows)
    monkeypatch.setattr(dt, "paper_rows", lambda: paper)
    return rows


def test_the_summary_is_one_row_per_method_and_one_column_per_eps(tiny_data):
    header, rule, gswgan, feta = dt.block_results_summary()
    assert header == "| method | ε = 1 | ε = 2 | ε = 5 | ε = 10 | ε = ∞ (no privacy) |"
    assert gswgan == ("| gswgan | 0.200 / 0.200 (n=1) | –; paper 0.30 / – (q Table 1) | – | "
                      "0.600 ± 0.058 / 0.400 ± 0.000 (n=3); paper 0.65 / 0.64 (p Table 2) | 0.800 / 0.800 (n=1) |")
    assert feta == "| feta (mode) | – | – | – | 0.600 / 0.600 (n=1) | – |"
    readme = dt.block_readme_methods()
    assert readme[2].endswith("| 0.200 / 0.200 (n=1) | 0.600 ± 0.058 / 0.400 ± 0.000 (n=3); paper 0.65 / 0.64 "
                              "(p Table 2) |")  # README quotes the summary's ε=1 and ε=10 cells
    assert [(p["label"], p["eps"], p["n"]) for p in dt.plot_points()] == [
        ("gswgan", 1.0, 1), ("gswgan", 10.0, 3), ("gswgan", float("inf"), 1), ("feta (mode)", 10.0, 1)]
    tiny_data.append(_row("b10", "gswgan", 10, "sound", [0.5]))
    with pytest.raises(ValueError, match="rows a10 and b10 are both current for gswgan at ε=10"):
        dt.block_results_summary()


def test_the_sweeps_time_is_its_jobs_times_their_methods_mean_train_s(tiny_data, monkeypatch):
    assert {(name, key): (len(jobs), fewest) for name, key, jobs, fewest in dt.sweep_jobs()}[
        ("eps_sweep", ("feta", "mean"))] == (15, 9)  # 5 eps x 3 seeds; three draws at eps 1 and 10, one at 2, 5 and inf
    with pytest.raises(ValueError, match="no current quick F-MNIST draw of dpgan"):
        dt.block_results_sweep()
    for method in ("dpgan", "dpac", "efsgd", "gpate", "dpaf", "dpdm"):
        tiny_data.append(_row(method, method, 10, "sound", [0.5], train_s=1800))
    tiny_data.append(_row("fm", "feta", 10, "sound", [0.5], variant="mean", train_s=5400))
    out = dt.block_results_sweep()
    assert "| `eps_sweep` | gswgan | 3600 (6) | 15 | 15.0 | 9 | 9.0 |" in out
    assert "| `eps_sweep` | dpgan | 1800 (1) | 15 | 7.5 | 9 | 4.5 |" in out
    # 2 x 1 h + 6 x 0.5 h + 1.5 h = 6.5 h per cell: 15 cells 97.5 h, 9 cells 58.5 h, two jobs at a time
    assert "|  | all |  | 135 | 97.5 | 81 | 58.5 |" in out
    assert out[-1].startswith("2 jobs at a time: 97.5 h / 2 = **48.8 h** as configured, 58.5 h / 2 = **29.2 h**")
    # a profile sized by eps: a job at an eps with draws takes their mean, the others the mean over every eps
    tiny_data.append(_row("g1", "gpate", 1, "sound", [0.3, 0.3], train_s=5400))
    out = dt.block_results_sweep()
    # eps 1: 5400 s and eps 10: 1800 s (their own draws); eps 2, 5 and inf: (1800 + 2 x 5400) / 3 = 4200 s
    assert "| `eps_sweep` | gpate | 3960 (3) | 15 | 16.5 | 9 | 9.5 |" in out


def test_utility_rows_are_well_formed_and_their_commands_compose():
    """Each row's command is printed in docs/results.md's generated tables (checked against the data above), where
    tests/test_docs.py composes it with Hydra and checks it against the schema: composing it here again would
    double the cost of the slowest docs test."""
    results = (ROOT / "docs" / "results.md").read_text()
    rows = dt.utility_rows()
    ids = [r.id for r in rows]
    assert len(ids) == len(set(ids)), "duplicate row ids"
    errors = []
    for r in rows:
        where = f"docs/data/utility.yaml: {r.id}"
        for key in ("method", "accounting", "eps", "command", "draws", "dataset", "profile"):
            if r.get(key) is None:
                errors.append(f"{where}: no {key}")
        if r.accounting not in dt.ACCOUNTING_ORDER:
            errors.append(f"{where}: accounting {r.accounting!r}")
        for d in r.draws:
            if not d.get("date") or not d.get("commit"):
                errors.append(f"{where}: a draw without date and commit")
            unknown = set(d) - set(dt.METRICS) - set(dt.DRAW_FIELDS)
            if unknown:
                errors.append(f"{where}: unknown fields {sorted(unknown)}")
        if r.get("current") and not r.get("config"):
            errors.append(f"{where}: a current row needs its config hash")
        words = r.command.split()
        if words[:2] != ["python", "scripts/train.py"]:
            errors.append(f"{where}: the command must be a scripts/train.py command")
        elif f"method={r.method}" not in words:
            errors.append(f"{where}: the command does not say method={r.method}")
        if f"`{r.command}`" not in results:
            errors.append(f"{where}: its command is not in docs/results.md (run python scripts/docs_tables.py)")
    assert not errors, "\n".join(errors)


def _commands(node, where: str):
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("command", "commands"):
                for c in ([v] if isinstance(v, str) else v):
                    yield where, c
            else:
                yield from _commands(v, f"{where}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _commands(v, f"{where}[{i}]")


def test_the_commands_of_the_data_files_exist():
    """Every command a data file names runs a script, module or target that exists, with keys it reads."""
    errors = []
    for name in ("findings", "cpu", "gpu", "audit"):
        for where, command in _commands(dt.load(name), f"docs/data/{name}.yaml"):
            for words in tokens(command):
                errors += check_command(where, words)
    assert not errors, "\n".join(errors)


def test_statistics_are_computed_from_the_draws():
    s = dt.Stats([0.5, 0.6, 0.7])
    assert (s.n, round(s.mean, 6), round(s.sd, 6), round(s.se, 6)) == (3, 0.6, 0.1, round(0.1 / 3 ** 0.5, 6))
    assert dt.Stats([0.5]).se is None
    row = dt.Row({"method": "x", "draws": [{"g2r_cnn": 0.5}, {"g2r_cnn": 0.6}, {"g2r_cnn": 0.7}]})
    assert dt.mean_se(row, "g2r_cnn") == "0.600 ± 0.058 (3)"


def test_the_gpu_memory_figures_are_the_codes():
    from dpgen.core.devices import PEAK_GB, QUICK_GB

    gpu = dt.load("gpu")
    assert gpu["peak_gb"] == PEAK_GB and gpu["quick_gb"] == QUICK_GB


# ---- the rule catches what it should ------------------------------------------------------------------------

@pytest.fixture
def known():
    return [dt.Fact(0.538, "plain", ""), dt.Fact(1560.0, "time", "s"), dt.Fact(10.4, "time", "h"),
            dt.Fact(54.0, "size", "gb"), dt.Fact(13.1, "pct", "%")]


@pytest.mark.parametrize("text, bad", [
    ("gswgan read 0.538 by the CNN.", []),
    ("gswgan read 0.54 by the CNN.", []),                           # the same figure, shown to 2 decimals
    ("gswgan read 0.539 by the CNN.", ["0.539"]),
    ("a run takes 26 minutes", []),                                 # 1560 s
    ("a run takes 27 minutes", ["27 minutes"]),
    ("pre-training takes 10.4 h", []),
    ("pre-training takes 10.4–14.4 h", ["14.4 h"]),                 # a range: each end is a figure
    ("each job claims 54 GB", []),
    ("each job claims 55 GB", ["55 GB"]),
    ("13.1 % of the step", []),
    ("3.2× faster", ["3.2 ×"]),
    ("100 × 4 fakes, lr 2e-3, clip 0.5, torch 2.11.0, Python 3.12, 2026-11-26, ε=10", []),
    ("chance is 0.10, flagged above 0.05", []),                     # CONSTANTS
])
def test_the_figure_rule(tmp_path, known, text, bad):
    page = tmp_path / "page.md"
    page.write_text(f"# T\n\n{text}\n\n```bash\npython scripts/train.py eps=0.123  # 0.777 s\n```\n", encoding="utf-8")
    errors = dt.untraced_figures([page], known)
    found = [re.search(r"'(.*)'", e).group(1) for e in errors]
    assert found == bad + ["0.777 s"], errors                       # a shell comment is read, its command is not


def test_a_hand_edit_of_a_generated_block_is_caught(tmp_path, monkeypatch):
    page = tmp_path / "README.md"
    fresh = dt.regenerate("# T\n\n<!-- generated: results-summary -->\n<!-- end generated -->\n")
    assert "| dpac |" in fresh
    page.write_text(fresh.replace("| dpac |", "| dpac (edited) |", 1), encoding="utf-8")
    monkeypatch.setattr(dt, "pages", lambda: [page])
    monkeypatch.setattr(dt, "ROOT", tmp_path)
    assert any("results-summary" in e for e in dt.stale_blocks())


def test_a_table_of_any_data_file_is_a_generated_block(tmp_path, monkeypatch):
    """``<!-- generated: <file>-<table> -->`` renders docs/data/<file>.yaml's ``tables.<table>``; an unknown
    table is an error, never an empty block."""
    (tmp_path / "audit.yaml").write_text(
        "tables:\n  bounds:\n    columns: [[method, method], [eps_lb, ε_lb]]\n"
        "    rows:\n      - {method: dpgan, eps_lb: 0.77}\n    after: one run per cell\n", encoding="utf-8")
    monkeypatch.setattr(dt, "DATA", tmp_path)
    assert dt.render("audit-bounds") == ["| method | ε_lb |", "|---|---|", "| dpgan | 0.77 |", "", "one run per cell"]
    with pytest.raises(KeyError):
        dt.render("audit-nothing")


# ---- config comments ----------------------------------------------------------------------------------------

def _config_comments():
    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "#" in line:
                comment = line.split("#", 1)[1] if line.lstrip().startswith("#") else re.split(r"\s#", line, 1)[-1]
                yield path, n, comment


def _set_values(path: Path) -> set[float]:
    """The numbers a config file sets (its hyperparameters), which its comments may name."""
    out = set()
    for m in re.finditer(r"(?<![\w.])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", re.sub(r"#.*", "", path.read_text())):
        out.add(float(m.group(0)))
    return out


def test_config_comments_quote_no_measured_figure_and_no_issue():
    """A config comment points to the page that holds a measured figure: by the figure rule of
    scripts/docs_tables.py, it may name only the numbers its file sets (hyperparameters) and CONSTANTS.
    configs/paper_results.yaml holds published numbers and is left out. Issue numbers mean nothing to a user."""
    errors = []
    for path, n, comment in _config_comments():
        where = f"{path.relative_to(ROOT)}:{n}"
        if re.search(r"(?i)\bissues?\s*#?\d+|#\d+\b", comment):
            errors.append(f"{where}: cites an issue: {comment.strip()}")
        if path.name == "paper_results.yaml":
            continue
        allowed = _set_values(path)
        for shown, value, _, family, _ in dt.figure_tokens(comment):
            if shown in dt.CONSTANTS or shown.replace(" ", "") in dt.CONSTANTS:
                continue
            if family == "plain" and value in allowed:
                continue
            errors.append(f"{where}: quotes the figure {shown!r}; point to the docs page that holds it")
    assert not errors, "\n".join(errors)
