#!/usr/bin/env python
"""The documentation's measured figures, from their one source: ``python scripts/docs_tables.py [--check] [--hashes]``.

Every measured figure the documentation quotes (a utility reading, a time, a memory figure, an audit bound, a
probe's reading) lives in a data file under docs/data/ (docs/development.md, "Measured figures"). This script:

- writes every generated block of README.md and docs/*.md, the lines between ``<!-- generated: NAME -->`` and
  ``<!-- end generated -->``, from the data (n, mean and standard error are computed here, never stored), and the
  summary's privacy–utility plot, docs/img/privacy_utility.png (with dpgen.report's plotting function, stamped with
  a hash of the data it shows);
- ``--check``: writes nothing and exits 1 naming every generated block that differs from its data, a plot whose
  stamp is not today's data's, every figure
  outside a generated block that no data file holds (the figure rule below), and every current utility row whose
  command no longer composes to the config it was measured with (its ``config`` hash);
- ``--hashes``: rewrites the ``config`` hash of every current utility row. Run it only after a change that keeps
  every value of those commands' configs (a renamed key, say); a changed value makes the rows history.

The figure rule. In README.md, CHANGELOG.md and docs/*.md, outside generated blocks, inline code and shell commands
(their ``#`` comments are read), a *figure* is a decimal number with two or more digits after the point (0.538,
1.25), a number with a unit of time, size, share or speed (26 minutes, 2 min 5 s, 54 GB, 13 %, 677 TFLOP/s), or a
ratio written with ``×`` (3.2×). A section that quotes figures declares where they come from in a comment,
``<!-- figures: utility:dpac, findings:gpate-probe, paper:efsgd -->`` (``source_facts`` lists the kinds); the
declaration covers the section down to the next heading of its level or above, and a subsection adds its own to its
parents'. Each figure must equal, at the precision shown, a value of its section's sources, of the same unit family
(a field named ``*_s``, ``*_min``, ``*_h``, ``*_ms`` for times, ``*_gb``, ``*_mib``, ... for sizes, ``*_pct`` for
shares, ``*_tflops`` for speed; a text value keeps the unit written after each number), or a plain number for a
plain figure or a ratio (a figure written without a unit may equal a value of any unit). A utility row's values include the statistics computed from its draws (mean, standard
error, standard deviation, lowest, highest and span). ``CONSTANTS`` below lists the few non-measured numbers the
pages quote (thresholds, limits), each with its source.
"""
from __future__ import annotations

import argparse
import fnmatch
import functools
import hashlib
import json
import math
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "data"
PAPER = ROOT / "configs" / "paper_results.yaml"
START = re.compile(r"^<!-- generated: ([\w-]+) -->\s*$")
END = "<!-- end generated -->"

#: a draw's readings, in the order the tables show them
METRICS = ("g2r_cnn", "g2r_mlp", "g2r_cnn_selected", "g2r_mlp_selected", "r2g", "cnn_fid", "train_s")
#: a draw's other fields: when and at which commit it was recorded, and the ``seed=`` it ran with when not the
#: default 0 (a sweep's draws: seed changes the public randomness beside the secret noise)
DRAW_FIELDS = ("date", "commit", "seed")
#: the scripts/train.py keys that change how a run is executed, not what it computes (left out of a config hash)
RUNTIME_KEYS = ("hydra", "data_root", "threads", "progress", "device", "resume", "log_every", "checkpoint_every",
                "tensorboard", "samples_per_class", "debug",
                # how DP-SGD gets the per-record clipped sum: every backend computes the same sum within fp32's
                # tolerance, with the same ledger (tests/test_feta_privacy.py compares them), and so do the ghost
                # backend's conv paths and the captured step (tests/test_ghost.py, tests/test_graph.py)
                "dpgan.grad_backend", "feta.grad_backend", "feta.ghost_conv", "feta.cuda_graph",
                # the warm-up generators vmapped or looped: the same nets and steps within fp32's tolerance
                # (tests/test_dpac_ensemble.py)
                "ensemble.generators")
#: non-measured numbers that the pages quote, as written there, with where each is defined
CONSTANTS = {
    "9 minutes": "bench/gpu_levers.sh's limit: its parts' timeouts (140 + 195 + 150 s) and the wheels' install",
    "0.05": "collect.py flags a selected g2r reading more than 0.05 above the fixed one (dpgen/report.py)",
    "0.10": "chance accuracy of a 10-class task",
    "0.95": "audit.confidence, configs/audit.yaml",
    "95 %": "audit.confidence, configs/audit.yaml",
    "5 %": "one minus audit.confidence",
    "0.99": "the quick profiles' generator EMA (configs/method/*.yaml)",
    "0.02": "dpgan.mode_seeking and dpaf.mode_seeking (configs/method/dpgan.yaml, dpaf.yaml)",
    "0.025": "feta.sampler.s_min on F-MNIST (configs/method/feta.yaml)",
    "0.75": "G-PATE's README rule sigma1 = 0.75 x teachers at eps <= 1 (dpgen.gpate.train.resolve_hparams); "
            "the upper bin mid-point of a 2-bin mode histogram (feta.central_post=paper)",
    "0.25": "the lower bin mid-point of a 2-bin mode histogram (feta.central_post=paper)",
    "90%": "dpaf.gc_keep = 0.9 (configs/method/dpaf.yaml)",
    "2 h": "hydra/launcher=slurm's time per attempt of dpgan, dpaf and quick jobs (configs/hydra/launcher/slurm.yaml)",
    "4 h": "hydra/launcher=slurm's time per attempt of gpate (and gswgan's before the Unreleased change); the GPU "
           "check's target for GS-WGAN's whole run (bench/gpu_check.py)",
    "99 %": "the confidence of docs/auditing.md's results (audit.confidence=0.99 on their commands)",
    "2 %": "audit.guesses' default: 2 % of the canaries on each side (dpgen/audit/sizes.py)",
    "1.3×": "bench/dpsgd_overhead.py's target: a private step within 1.3 times a non-private one",
    "6 minutes": "GPU_BUDGET's default in the Makefile (bench/gpu_check.py --budget)",
    "10 h": "dpac's and efsgd's SLURM time per attempt before the Unreleased change (CHANGELOG.md)",
    "24 h": "hydra/launcher=slurm's time per attempt of feta, dpdm and the GS-WGAN family (slurm.yaml)",
    "10 s": "hydra.callbacks.sweep_gpus.poll_s (configs/hydra/launcher/local.yaml)",
    "20 s": "the Inception weights download's socket timeout (dpgen/eval/inception.py)",
    "100 s": "bench/gpu_check.py MIN_ROW_S for feta and dpdm",
    "5 s": "bench/gpu_check.py MIN_ROW_S for the other methods",
    "3 s": "bench/gpu_check.py's matmul reference runs about 3 s",
    "30 s": "make test lists every test not marked slow that took over 30 s (tests/conftest.py)",
    "20 minutes": "the quick profiles' time goal on two CPU cores (configs/profile/quick.yaml, docs/usage.md)",
    "1 GiB": "MAX_GENERATOR_ELEMENTS of float32 (dpgen/core/untrusted.py)",
    "16 MiB": "MAX_GENERATOR_FILE_BYTES is 1 GiB + 16 MiB (dpgen/core/untrusted.py)",
    "80 GB": "the GPU memory of an H100 (the memory table's card)",
    "0.1 ms": "the order of magnitude of an RDP evaluation (cached curves, dpgen/privacy/accountants/rdp.py)",
    "1 s": "the order of magnitude of a PLD evaluation (privacy.md explains why PLD runs only at the end)",
}

TIME = {"ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}
SIZE = {"kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 2.0 ** 10, "mib": 2.0 ** 20, "gib": 2.0 ** 30}
UNIT_WORDS = {"ms": ("time", "ms"), "s": ("time", "s"), "sec": ("time", "s"), "min": ("time", "min"),
              "minute": ("time", "min"), "minutes": ("time", "min"), "h": ("time", "h"), "hour": ("time", "h"),
              "hours": ("time", "h"), "kb": ("size", "kb"), "mb": ("size", "mb"), "gb": ("size", "gb"),
              "kib": ("size", "kib"), "mib": ("size", "mib"), "gib": ("size", "gib"), "%": ("pct", "%"),
              "tflop/s": ("tflops", "tflops"), "×": ("plain", ""), "x": ("plain", "")}
FIELD_UNITS = {"ms": ("time", "ms"), "s": ("time", "s"), "min": ("time", "min"), "h": ("time", "h"),
               "kb": ("size", "kb"), "mb": ("size", "mb"), "gb": ("size", "gb"), "kib": ("size", "kib"),
               "mib": ("size", "mib"), "gib": ("size", "gib"), "pct": ("pct", "%"), "tflops": ("tflops", "tflops")}


# ---- data -----------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _load_text(path: Path, text: str):
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def load(name: str) -> dict:
    """docs/data/<name>.yaml (parsed once per content; treat the result as read-only)."""
    path = DATA / f"{name}.yaml"
    return _load_text(path, path.read_text(encoding="utf-8")) or {}


@dataclass
class Stats:
    """n, mean, standard deviation (n - 1), standard error, lowest and highest of one metric over a row's draws."""
    values: list[float]
    n: int = 0
    mean: float = math.nan
    sd: float | None = None
    se: float | None = None
    lo: float = math.nan
    hi: float = math.nan

    def __post_init__(self):
        self.n = len(self.values)
        if self.n:
            self.mean, self.lo, self.hi = statistics.fmean(self.values), min(self.values), max(self.values)
        if self.n >= 2:
            self.sd = statistics.stdev(self.values)
            self.se = self.sd / math.sqrt(self.n)


@dataclass
class Row:
    """One utility command: its fields as in docs/data/utility.yaml, and the statistics of its draws."""
    data: dict
    stats: dict[str, Stats] = field(default_factory=dict)

    def __post_init__(self):
        for m in METRICS:
            vals = [float(d[m]) for d in self.draws if d.get(m) is not None]
            if vals:
                self.stats[m] = Stats(vals)

    def __getattr__(self, key):
        try:
            return self.__dict__["data"][key]
        except KeyError:
            raise AttributeError(key) from None

    @property
    def draws(self) -> list[dict]:
        return self.data.get("draws") or []

    def get(self, key, default=None):
        return self.data.get(key, default)


def utility_rows() -> list[Row]:
    doc = load("utility")
    defaults = doc.get("defaults") or {}
    return [Row({**defaults, **r}) for r in doc.get("rows") or []]


def paper_rows() -> list[dict]:
    return (_load_text(PAPER, PAPER.read_text(encoding="utf-8")) or {}).get("rows") or []


def config_hashes(commands: list[str]) -> dict[str, str]:
    """sha256 (12 hex digits) of the config that each command (a scripts/train.py command) composes today,
    resolved, without the keys that only change how a run executes (``RUNTIME_KEYS``)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from dpgen.core.config import register_configs
    from dpgen.core.methods import CONFIG_DIR

    register_configs()
    out = {}
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        for command in commands:
            words = command.split()
            cfg = compose("train", overrides=words[words.index("scripts/train.py") + 1:])
            data = OmegaConf.to_container(cfg, resolve=True)
            for key in RUNTIME_KEYS:
                *parents, leaf = key.split(".")
                node = data
                for part in parents:
                    node = node.get(part) if isinstance(node, dict) else None
                if isinstance(node, dict):
                    node.pop(leaf, None)
            out[command] = hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return out


# ---- formatting -----------------------------------------------------------------------------------------------

def fmt(metric: str, value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if metric == "cnn_fid":
        return f"{value:.1f}"
    if metric == "train_s":
        return f"{value:.0f}"
    return f"{value:.3f}"


def eps_text(eps) -> str:
    return "∞" if isinstance(eps, float) and math.isinf(eps) else f"{eps:g}"


def mean_se(row: Row, metric: str) -> str:
    """``0.514 ± 0.014 (8)``; one draw: ``0.628 (1)``."""
    s = row.stats.get(metric)
    if s is None:
        return "–"
    if s.se is None:
        return f"{fmt(metric, s.mean)} (1)"
    return f"{fmt(metric, s.mean)} ± {fmt(metric, s.se)} ({s.n})"


def label(row: Row) -> str:
    text = row.method + (f" ({row.variant})" if row.get("variant") else "")
    if row.profile != "quick":
        text += f", profile={row.profile}"
    return text + (f", {row.setting}" if row.get("setting") else "")


def accounting_text(row: Row) -> str:
    if row.accounting == "none":
        return "none (privacy off)"
    if row.accounting == "paper":
        sound = row.get("sound_eps")
        return f"paper (not DP; sound ε {sound:g})" if sound is not None else "paper (not DP)"
    return row.accounting


def published(method: str, dataset: str, eps, variant=None, metric: str = "g2r_cnn") -> list[dict]:
    """The published numbers of configs/paper_results.yaml for one setting (several papers may report one)."""
    out = []
    for p in paper_rows():
        if (p["method"], p["dataset"], p["metric"]) != (method, dataset, metric) or float(p["eps"]) != float(eps):
            continue
        if p.get("variant") not in (None, variant):
            continue
        out.append(p)
    return out


def paper_value(value: float) -> str:
    """A published number as its table prints it: at least two decimals (0.70), up to four (0.6579)."""
    text = f"{value:.4f}".rstrip("0")
    return text + "0" * max(0, 2 - len(text.split(".")[1])) if "." in text else text


def published_text(row: Row, metric: str = "g2r_cnn") -> str:
    if row.accounting == "none":
        return "–"
    items = []
    for p in published(row.method, row.dataset, row.eps, row.get("variant"), metric):
        note = "; a different DP-GAN" if "not our dpgan" in p.get("note", "") else (
            ", re-run by the EFSGD authors" if "re-run" in p.get("note", "") else "")
        items.append(f"{paper_value(p['value'])} ({p['citation']}{note})")
    return "; ".join(items) if items else "not reported"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


# ---- the generated blocks -------------------------------------------------------------------------------------

ORDER = ("dpgan", "gswgan", "dpac", "efsgd", "gpate", "dpaf", "feta", "dpdm")
ACCOUNTING_ORDER = ("sound", "paper", "none")


def current(rows: list[Row]) -> list[Row]:
    """The current rows, by method (README's order), variant, accounting and descending ε."""
    def key(r: Row):
        return (ORDER.index(r.method) if r.method in ORDER else len(ORDER), str(r.get("variant") or ""),
                ACCOUNTING_ORDER.index(r.accounting), -float(r.eps))
    return sorted((r for r in rows if r.get("current")), key=key)


# ---- the summary across ε: one row per method, one column per ε (README's table quotes two of them) -----------

#: the summary's columns: the target ε of the sound rows, and ∞ (the eps=inf rows, accounting none)
SUMMARY_EPS = (1.0, 2.0, 5.0, 10.0, math.inf)
#: the privacy–utility plot of the summary's data, embedded in docs/results.md
PLOT = ROOT / "docs" / "img" / "privacy_utility.png"
#: the experiments that fill the summary (configs/experiment/), and the launcher whose workers run their jobs
SWEEP = ("eps_sweep", "eps_sweep_feta_mode")
LAUNCHER = ROOT / "configs" / "hydra" / "launcher" / "local.yaml"
#: the draws the summary needs at least: three at these ε, one at every other column
MANY_DRAWS_EPS, MANY_DRAWS = (1.0, 10.0), 3


def method_label(method: str, variant: str | None) -> str:
    return method + (f" ({variant})" if variant else "")


def summary_cells() -> dict[tuple[str, str | None], dict[float, Row]]:
    """The current rows of the summary: F-MNIST at profile=quick, the profile's own command (no ``setting``), under
    sound accounting at a finite ε or privacy off at ε = ∞, as {(method, variant): {ε: row}} in README's order."""
    cells: dict[tuple[str, str | None], dict[float, Row]] = {}
    for r in current(utility_rows()):
        eps = float(r.eps)
        if r.profile != "quick" or r.dataset != "fmnist" or r.get("setting") or eps not in SUMMARY_EPS:
            continue
        if r.accounting != ("sound" if math.isfinite(eps) else "none"):
            continue
        key = (r.method, r.get("variant"))
        if eps in cells.setdefault(key, {}):
            raise ValueError(f"docs/data/utility.yaml: rows {cells[key][eps].id} and {r.id} are both current for "
                             f"{method_label(*key)} at ε={eps_text(eps)}; mark one current: false")
        cells[key][eps] = r
    return cells


def _reading(s: Stats | None, metric: str) -> str:
    if s is None:
        return "–"
    return fmt(metric, s.mean) + (f" ± {fmt(metric, s.se)}" if s.se is not None else "")


def cnn_mlp(row: Row) -> str:
    """``0.481 ± 0.001 / 0.476 ± 0.006 (n=3)``: the fixed CNN and MLP readings, mean ± standard error over the
    row's draws (a single draw: the reading alone, n=1)."""
    cnn, mlp = row.stats.get("g2r_cnn"), row.stats.get("g2r_mlp")
    counts = [s.n for s in (cnn, mlp) if s is not None]
    n = "–" if not counts else str(counts[0]) if len(set(counts)) == 1 else f"{cnn.n} / {mlp.n}"
    return f"{_reading(cnn, 'g2r_cnn')} / {_reading(mlp, 'g2r_mlp')} (n={n})"


def published_pairs(method: str, variant: str | None, eps: float, dataset: str = "fmnist") -> list[str]:
    """The published g2r CNN / MLP figures of one setting, one per table that gives one (``–`` for a classifier
    the table leaves out), with the citation."""
    if math.isinf(eps):
        return []
    by_table: dict[str, dict] = {}
    for metric in ("g2r_cnn", "g2r_mlp"):
        for p in published(method, dataset, eps, variant, metric):
            by_table.setdefault(p["citation"], {"note": p.get("note", "")})[metric] = p["value"]
    out = []
    for citation, v in by_table.items():
        note = ", a different DP-GAN" if "not our dpgan" in v["note"] else (
            ", re-run by the EFSGD authors" if "re-run" in v["note"] else "")
        pair = " / ".join(paper_value(v[m]) if m in v else "–" for m in ("g2r_cnn", "g2r_mlp"))
        out.append(f"{pair} ({citation}{note})")
    return out


def summary_cell(cells: dict[float, Row], key: tuple[str, str | None], eps: float) -> str:
    """One cell of the summary: our readings (``–`` without a draw), then ``paper`` and the published ones."""
    row = cells.get(eps)
    text = cnn_mlp(row) if row is not None else "–"
    pubs = published_pairs(key[0], key[1], eps)
    return text + ("; paper " + "; ".join(pubs) if pubs else "")


def block_readme_methods() -> list[str]:
    """README: each method at its quick profile, sound ε=1 and ε=10 (docs/results.md's summary), beside the g2r
    figures its paper publishes."""
    info = load("utility").get("methods") or {}
    body = [[f"`{method}`" + (f" ({variant})" if variant else ""), info.get(method, {}).get("paper", ""),
             summary_cell(cells, (method, variant), 1.0), summary_cell(cells, (method, variant), 10.0)]
            for (method, variant), cells in summary_cells().items()]
    return table(["method", "paper", "ε = 1: g2r CNN / MLP (n)", "ε = 10: g2r CNN / MLP (n)"], body)


def block_results_commands() -> list[str]:
    """results.md: every current row (paper accounting too) with r2g, mean ± standard error over its draws."""
    body = []
    for r in current(utility_rows()):
        body.append([label(r), r.dataset, r.profile, eps_text(float(r.eps)), accounting_text(r),
                     mean_se(r, "g2r_cnn"), mean_se(r, "g2r_mlp"), mean_se(r, "r2g"), published_text(r),
                     f"`{r.command}`"])
    return table(["method", "dataset", "profile", "ε", "accounting", "g2r CNN fixed", "g2r MLP fixed", "r2g",
                  "published g2r CNN", "command"], body)


def block_results_summary() -> list[str]:
    """results.md: one row per method (feta's two variants apart), one column per ε, each cell the fixed g2r CNN /
    MLP readings as mean ± standard error (n draws), the published figures beside them."""
    body = [[method_label(*key)] + [summary_cell(cells, key, eps) for eps in SUMMARY_EPS]
            for key, cells in summary_cells().items()]
    return table(["method"] + [f"ε = {eps_text(e)}" + (" (no privacy)" if math.isinf(e) else "") for e in SUMMARY_EPS],
                 body)


def plot_points() -> list[dict]:
    """The summary's fixed g2r CNN readings as the points of dpgen.report.plot_privacy_utility."""
    points = []
    for key, cells in summary_cells().items():
        for eps, row in sorted(cells.items()):
            s = row.stats.get("g2r_cnn")
            if s is not None:
                points.append({"label": method_label(*key), "eps": eps, "mean": s.mean, "se": s.se, "n": s.n})
    return points


def plot_stamp(points: list[dict]) -> str:
    """What the committed plot was drawn from: a hash of its points, kept in the PNG's Description."""
    data = json.dumps([{**p, "eps": str(p["eps"])} for p in points], sort_keys=True)
    return f"scripts/docs_tables.py from docs/data/utility.yaml, data {hashlib.sha256(data.encode()).hexdigest()[:12]}"


def write_plot(path: Path | None = None) -> Path:
    """Draw the summary's plot (docs/img/privacy_utility.png) with scripts/collect.py's plotting function."""
    from dpgen.report import plot_privacy_utility

    points = plot_points()
    path = path or PLOT
    path.parent.mkdir(parents=True, exist_ok=True)
    return plot_privacy_utility(points, path, title="F-MNIST, profile=quick, sound accounting",
                                eps_ticks=SUMMARY_EPS, metadata={"Description": plot_stamp(points)})


def stale_plot(path: Path | None = None) -> list[str]:
    """An error unless the committed plot was drawn from today's data (the stamp in its Description)."""
    path = path or PLOT
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    if not path.is_file():
        return [f"{rel}: missing; run python scripts/docs_tables.py"]
    from PIL import Image  # matplotlib's own dependency

    with Image.open(path) as img:
        stamp = getattr(img, "text", {}).get("Description")
    if stamp != plot_stamp(plot_points()):
        return [f"{rel}: drawn from other data than docs/data/utility.yaml holds; run python scripts/docs_tables.py"]
    return []


def sweep_jobs() -> list[tuple[str, tuple[str, str | None], list[float], int]]:
    """(experiment, (method, variant), the ε of its jobs, one per job as configured, jobs with the fewest draws) of
    each method of the sweep."""
    out = []
    for name in SWEEP:
        doc = yaml.safe_load((ROOT / "configs" / "experiment" / f"{name}.yaml").read_text(encoding="utf-8"))
        params = {k: str(v).split(",") for k, v in doc["hydra"]["sweeper"]["params"].items()}
        eps = [float("inf") if e.strip().lower() in ("inf", ".inf") else float(e) for e in params["eps"]]
        fewest = sum(MANY_DRAWS if e in MANY_DRAWS_EPS else 1 for e in eps)
        central = params.get("feta.central", ["mean"])[0]
        for method in params["method"]:
            out.append((name, (method, central if method == "feta" else None), eps * len(params["seed"]), fewest))
    return out


def block_results_sweep() -> list[str]:
    """results.md: the summary's sweep, method by method, and how long it takes on the CPU the draws ran on. A job at
    ε takes the mean train s of its method's current F-MNIST quick draws at that ε (a profile may size its run by ε,
    as gpate's does), else at any ε (the other quick profiles fix their step count); the jobs run as many at a time
    as the local launcher's workers, as the draws did."""
    workers = int(yaml.safe_load(LAUNCHER.read_text(encoding="utf-8"))["hydra"]["launcher"]["n_jobs"])
    times: dict[tuple[str, str | None], dict[float, list[float]]] = {}
    for r in current(utility_rows()):
        if r.profile == "quick" and r.dataset == "fmnist" and not r.get("setting"):
            times.setdefault((r.method, r.get("variant")), {}).setdefault(float(r.eps), []).extend(
                float(d["train_s"]) for d in r.draws if d.get("train_s") is not None)
    body, full_s, fewest_s, full_n, fewest_n = [], 0.0, 0.0, 0, 0
    for name, key, jobs, n_fewest in sweep_jobs():
        by_eps = {e: t for e, t in times.get(key, {}).items() if t}
        if not by_eps:
            raise ValueError(f"docs/data/utility.yaml: no current quick F-MNIST draw of {method_label(*key)} "
                             "with train_s, to time the sweep by")
        anywhere = Stats([t for ts in by_eps.values() for t in ts]).mean
        job_s = {e: Stats(by_eps[e]).mean if e in by_eps else anywhere for e in set(jobs)}
        n_full = len(jobs)
        full = sum(job_s[e] for e in jobs)
        once = {e: MANY_DRAWS if e in MANY_DRAWS_EPS else 1 for e in set(jobs)}
        fewest = sum(job_s[e] * k for e, k in once.items())
        assert sum(once.values()) == n_fewest
        full_s, fewest_s = full_s + full, fewest_s + fewest
        full_n, fewest_n = full_n + n_full, fewest_n + n_fewest
        draws = sum(len(t) for t in by_eps.values())
        body.append([f"`{name}`", method_label(*key), f"{full / n_full:.0f} ({draws})", str(n_full),
                     f"{full / 3600:.1f}", str(n_fewest), f"{fewest / 3600:.1f}"])
    body.append(["", "all", "", str(full_n), f"{full_s / 3600:.1f}", str(fewest_n), f"{fewest_s / 3600:.1f}"])
    return table(["experiment", "method", "train s per job (draws)", "jobs", "jobs' h", "jobs, fewest draws",
                  "jobs' h, fewest draws"], body) + [
        "", f"{workers} jobs at a time: {full_s / 3600:.1f} h / {workers} = **{full_s / 3600 / workers:.1f} h** as "
            f"configured, {fewest_s / 3600:.1f} h / {workers} = **{fewest_s / 3600 / workers:.1f} h** with the "
            "fewest draws; training only, without `eval=full`'s time."]


def _draw_table(rows: list[Row]) -> list[str]:
    body, notes = [], {}
    for r in rows:
        note = r.get("note")
        mark = ""
        if note:
            mark = " " + notes.setdefault(note, f"[{len(notes) + 1}]")
        for i, d in enumerate(r.draws, 1):
            flag = " ⚑" if any(d.get(f"{k}_selected") is not None and d.get(k) is not None
                              and d[f"{k}_selected"] - d[k] > 0.05 for k in ("g2r_cnn", "g2r_mlp")) else ""
            sel = " / ".join(fmt("g2r_cnn", d.get(k)) for k in ("g2r_cnn_selected", "g2r_mlp_selected"))
            body.append([label(r) + mark if i == 1 else "″", str(i), eps_text(float(r.eps)),
                         accounting_text(r) if i == 1 else "″",
                         fmt("g2r_cnn", d.get("g2r_cnn")), fmt("g2r_mlp", d.get("g2r_mlp")), sel + flag,
                         fmt("r2g", d.get("r2g")), fmt("cnn_fid", d.get("cnn_fid")), fmt("train_s", d.get("train_s")),
                         str(d.get("date", "")), f"`{r.command}`" if i == 1 else "″"])
    out = table(["run", "draw", "ε", "accounting", "g2r CNN fixed", "g2r MLP fixed", "selected CNN / MLP", "r2g",
                 "cnn_fid", "train s", "date", "command"], body)
    if notes:
        out += [""] + [f"- {mark} {note}" for note, mark in notes.items()]
    return out


def block_results_draws() -> list[str]:
    return _draw_table(current(utility_rows()))


def block_results_history() -> list[str]:
    return _draw_table([r for r in utility_rows() if not r.get("current")])


def block_demo_output() -> list[str]:
    demo = load("cpu")["demo"]
    return ["```text", *demo["output"].rstrip("\n").splitlines(), "```"]


def _cells(row: dict, columns: list[tuple[str, str]]) -> list[str]:
    out = []
    for key, _ in columns:
        v = row.get(key)
        if v is None:
            out.append("")
        elif isinstance(v, float):
            out.append(f"{v:g}")
        else:
            out.append(str(v))
    return out


def _data_table(doc: str, name: str) -> list[str]:
    """A table of docs/data/<doc>.yaml's ``tables.<name>``: ``columns`` ([key, header] pairs) and ``rows``."""
    spec = load(doc)["tables"][name]
    columns = [tuple(c) for c in spec["columns"]]
    out = table([h for _, h in columns], [_cells(r, columns) for r in spec["rows"]])
    return out + ([""] + [spec["after"].rstrip("\n")] if spec.get("after") else [])


BLOCKS = {
    "readme-methods": block_readme_methods,
    "results-summary": block_results_summary,
    "results-commands": block_results_commands,
    "results-draws": block_results_draws,
    "results-history": block_results_history,
    "results-sweep": block_results_sweep,
    "demo-output": block_demo_output,
}


def render(name: str) -> list[str]:
    if name in BLOCKS:
        return BLOCKS[name]()
    doc, _, table_name = name.partition("-")  # <file>-<table>: docs/data/<file>.yaml's tables.<table>
    if table_name and (DATA / f"{doc}.yaml").is_file() and table_name in (load(doc).get("tables") or {}):
        return _data_table(doc, table_name)
    raise KeyError(f"no generated block named {name!r}")


# ---- pages ----------------------------------------------------------------------------------------------------

def pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks_of(text: str) -> list[tuple[str, int, int]]:
    """(name, index of the first body line, index of the end marker) of every generated block of a page."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        m = START.match(lines[i])
        if m:
            j = next((k for k in range(i + 1, len(lines)) if lines[k].strip() == END), None)
            if j is None:
                raise ValueError(f"line {i + 1}: generated block {m.group(1)!r} has no {END!r}")
            out.append((m.group(1), i + 1, j))
            i = j
        i += 1
    return out


def regenerate(text: str) -> str:
    lines = text.splitlines()
    for name, start, end in reversed(blocks_of(text)):
        lines[start:end] = render(name)
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")


def stale_blocks() -> list[str]:
    errors = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        try:
            fresh = regenerate(text)
        except (ValueError, KeyError) as exc:
            errors.append(f"{page.relative_to(ROOT)}: {exc}")
            continue
        if fresh != text:
            names = [n for n, s, e in blocks_of(text) if text.splitlines()[s:e] != render(n)]
            errors.append(f"{page.relative_to(ROOT)}: generated block(s) {', '.join(names)} differ from docs/data; "
                          "run python scripts/docs_tables.py")
    return errors


def stale_hashes() -> list[str]:
    errors = []
    rows = current(utility_rows())
    hashes = config_hashes([r.command for r in rows])
    for r in rows:
        now = hashes[r.command]
        if r.get("config") != now:
            errors.append(f"docs/data/utility.yaml: row {r.id}: its command composes config {now}, not the "
                          f"{r.get('config')} it was measured with: re-measure it, or mark it current: false")
    return errors


def write_hashes() -> None:
    path = DATA / "utility.yaml"
    text = path.read_text(encoding="utf-8")
    rows = current(utility_rows())
    hashes = config_hashes([r.command for r in rows])
    for r in rows:
        now = hashes[r.command]
        pattern = re.compile(rf"(- id: {re.escape(r.id)}\n(?:  .*\n)*?  config: )(\S+)")
        text, n = pattern.subn(lambda m: m.group(1) + now, text, count=1)
        if not n:
            raise SystemExit(f"row {r.id} has no config: line to rewrite")
    path.write_text(text, encoding="utf-8")


# ---- the figure rule ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Fact:
    value: float
    family: str      # plain, time, size, pct, tflops
    unit: str        # the unit the value is in ("" for plain)


def _field_unit(key: str, inherited: tuple[str, str] = ("plain", "")) -> tuple[str, str]:
    suffix = key.rsplit("_", 1)[-1].lower() if "_" in key else ""
    return FIELD_UNITS.get(suffix, inherited)


def _walk(node, key: str, out: list[Fact], inherited: tuple[str, str] = ("plain", "")) -> None:
    """The numbers of a data node as facts; a field named with a unit suffix gives that unit to what it holds."""
    if isinstance(node, bool) or node is None:
        return
    unit_here = _field_unit(key, inherited)
    if isinstance(node, (int, float)):
        if math.isfinite(float(node)):
            out.append(Fact(float(node), *unit_here))
    elif isinstance(node, dict):
        for k, v in node.items():
            _walk(v, str(k), out, unit_here)
    elif isinstance(node, list):
        for v in node:
            _walk(v, key, out, inherited)
    elif isinstance(node, str):  # a value written as text ("10.4 h", an output quoted verbatim): its numbers count
        for m in _TEXT_NUMBER.finditer(node):
            unit = m.group("unit")
            family, u = UNIT_WORDS.get(unit.lower(), ("plain", "")) if unit else unit_here
            if m.group("a"):
                out.append(Fact(60 * float(m.group("a")) + float(m.group("b")), "time", "s"))
            else:
                out.append(Fact(float(m.group("num").replace(",", "")), family, u))


def _row_facts(row: Row) -> list[Fact]:
    out: list[Fact] = []
    _walk({k: v for k, v in row.data.items() if k not in ("command", "config", "note")}, "", out)
    for metric, s in row.stats.items():
        family, unit = _field_unit(metric)
        vals = [s.mean, s.lo, s.hi, s.hi - s.lo] + [v for v in (s.sd, s.se) if v is not None]
        out += [Fact(v, family, unit) for v in vals]
    return out


@functools.lru_cache(maxsize=None)
def source_facts(source: str) -> tuple[Fact, ...]:
    """The values one figure source names: ``utility:<row id>`` (a glob; the row's draws, ε and statistics),
    ``paper:<method>`` (a glob; configs/paper_results.yaml's numbers, also as percents), ``config:<path>`` (the
    numbers configs/<path> sets: limits and sizes that are not measured), or ``<file>:<dotted key>`` (a part of
    docs/data/<file>.yaml; ``*``: all of it). Raises KeyError if it names nothing."""
    kind, _, path = source.partition(":")
    out: list[Fact] = []
    if kind == "utility":
        rows = [r for r in utility_rows() if fnmatch.fnmatchcase(r.id, path)]
        for r in rows:
            out += _row_facts(r)
        if not rows:
            raise KeyError(source)
    elif kind == "paper":
        rows = [p for p in paper_rows() if fnmatch.fnmatchcase(p["method"], path)]
        for p in rows:
            out += [Fact(float(p["value"]), "plain", ""), Fact(100 * float(p["value"]), "pct", "%")]
        if not rows:
            raise KeyError(source)
    elif kind == "config":  # numbers a config file sets (limits, sizes): configs/<path>
        file = ROOT / "configs" / path
        if not file.is_file():
            raise KeyError(source)
        _walk(yaml.safe_load(file.read_text(encoding="utf-8")), "", out)
    else:
        if not (DATA / f"{kind}.yaml").is_file():
            raise KeyError(source)
        node = load(kind)
        key = ""
        if path not in ("", "*"):
            for part in path.split("."):
                if not isinstance(node, dict) or part not in node:
                    raise KeyError(source)
                node, key = node[part], part
        _walk(node, key, out)
    return tuple(out)


_NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
_UNIT = r"ms|s|sec|min|minutes?|h|hours?|[KMG]i?B|%|TFLOP/s|×"
_FIGURE = re.compile(
    rf"(?<![\w.,/#=+-])(?P<a>{_NUMBER})\s?min\s(?P<b>\d+)\s?s\b"  # 2 min 5 s
    rf"|(?<![\w.,/#=+-])(?P<num>{_NUMBER})(?P<rest>(?:\s?[–-]\s?(?:{_NUMBER}))*)"
    rf"(?:(?P<sp>\s?)(?P<unit>{_UNIT})(?![\w/]))?")
_TEXT_NUMBER = re.compile(
    rf"(?<![\w.])(?P<a>{_NUMBER})\s?min\s(?P<b>\d+)\s?s\b"
    rf"|(?<![\w.])(?P<num>{_NUMBER})(?:\s?(?P<unit>{_UNIT})(?![\w/]))?")
_VERSION_BEFORE = re.compile(r"(?i)(python|py=|torch|cuda|cudnn|cu|version|v|≥|>=)\s*$")
_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
_LINK_TARGET = re.compile(r"\]\([^)]*\)")
_SOURCES = re.compile(r"<!--\s*figures:\s*(.*?)\s*-->")
_HEADING = re.compile(r"^(#{1,6})\s")


def _decimals(text: str) -> int:
    return len(text.split(".", 1)[1]) if "." in text else 0


def figure_tokens(text: str) -> list[tuple[str, float, int, str, str]]:
    """(as written, value, decimals shown, family, unit) of every figure in a piece of prose."""
    out = []
    for m in _FIGURE.finditer(text):
        if m.group("a"):
            out.append((m.group(0), 60 * float(m.group("a")) + float(m.group("b")), 0, "time", "s"))
            continue
        unit = m.group("unit")
        if unit == "×" and m.group("sp"):
            unit = None  # "100 × 4": a product, not a ratio
        tail = text[m.end():m.end() + 3]
        if re.match(r"[eE][-+]?\d", tail) or re.match(r"\.\d", tail):  # 1e-5, or a version 2.11.0
            continue
        if _VERSION_BEFORE.search(text[max(0, m.start() - 12):m.start()]):
            continue
        numbers = [m.group("num")] + re.findall(_NUMBER, m.group("rest") or "")
        family, u = UNIT_WORDS.get(unit.lower(), ("plain", "")) if unit else ("plain", "")
        for num in numbers:
            if not unit and _decimals(num) < 2:
                continue
            out.append((num + (f" {unit}" if unit else ""), float(num.replace(",", "")), _decimals(num), family, u))
    return out


def _convert(fact: Fact, unit: str) -> float:
    if fact.family == "time":
        return fact.value * TIME[fact.unit] / TIME[unit]
    if fact.family == "size":
        return fact.value * SIZE[fact.unit] / SIZE[unit]
    return fact.value


def traced(value: float, decimals: int, family: str, unit: str, known) -> bool:
    tol = 0.5 * 10 ** -decimals + 1e-9
    if family == "plain":  # a figure written without a unit may be any value, whatever the unit of its field
        return any(abs(f.value - value) <= tol for f in known)
    return any(f.family == family and abs(_convert(f, unit) - value) <= tol for f in known)


def scanned_text(page: Path) -> list[tuple[int, str, tuple[str, ...]]]:
    """(line number, text, figure sources) the figure rule reads: prose without inline code and link targets,
    ``#`` comments of shell blocks, and every line of ``text`` blocks; generated blocks and other code blocks are
    skipped. A ``<!-- figures: SOURCE, ... -->`` comment declares where the figures of its section (to the next
    heading of its level or above) come from; a subsection adds its own to its parents'."""
    out, lines = [], page.read_text(encoding="utf-8").splitlines()
    in_fence, lang, in_generated = None, "", False
    stack: list[tuple[int, list[str]]] = [(0, [])]
    for n, line in enumerate(lines, 1):
        sources = tuple(s for _, srcs in stack for s in srcs)
        if START.match(line):
            in_generated = True
            continue
        if line.strip() == END:
            in_generated = False
            continue
        if in_generated:
            continue
        fence = re.match(r"^\s*(```+|~~~+)\s*([\w+-]*)", line)
        if fence and in_fence is None:
            in_fence, lang = fence.group(1), fence.group(2).lower()
            continue
        if in_fence is not None:
            if line.strip().startswith(in_fence):
                in_fence = None
            elif lang == "text":
                out.append((n, line, sources))
            elif lang in ("", "bash", "sh", "shell", "console") and "#" in line:
                comment = re.split(r"(?:^|\s)#\s", line, maxsplit=1)
                if len(comment) == 2:
                    out.append((n, comment[1], sources))
            continue
        heading = _HEADING.match(line)
        if heading:
            level = len(heading.group(1))
            while stack[-1][0] >= level:
                stack.pop()
            stack.append((level, []))
            sources = tuple(s for _, srcs in stack for s in srcs)
        declared = _SOURCES.search(line)
        if declared:
            stack[-1][1].extend(s.strip() for s in declared.group(1).split(",") if s.strip())
            continue
        if line.lstrip().startswith("<!--"):
            continue
        out.append((n, _LINK_TARGET.sub("]()", _SPAN.sub(lambda m: " " * len(m.group(0)), line)), sources))
    return out


def untraced_figures(paths: list[Path] | None = None, known: list[Fact] | None = None) -> list[str]:
    """Every figure of the pages that no declared source of its section holds (``known``: check against these
    facts instead, for tests), and every declared source that names nothing."""
    errors = []
    for page in paths or pages():
        rel = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
        for n, text, sources in scanned_text(page):
            if known is None:
                facts, missing = [], []
                for s in sources:
                    try:
                        facts += source_facts(s)
                    except KeyError:
                        missing.append(s)
                for s in dict.fromkeys(missing):
                    errors.append(f"{rel}:{n}: figure source {s!r} names nothing in docs/data or paper_results")
            else:
                facts = known
            for shown, value, decimals, family, unit in figure_tokens(text):
                if shown in CONSTANTS or shown.replace(" ", "") in CONSTANTS:
                    continue
                if not traced(value, decimals, family, unit, facts):
                    where = f"the section's sources ({', '.join(sources)})" if sources and known is None else \
                        "a data file (declare its source: <!-- figures: ... -->)"
                    errors.append(f"{rel}:{n}: {shown!r} is not in {where}")
    return sorted(set(errors), key=lambda e: (e.split(":")[0], int(e.split(":")[1])))


# ---- command line ---------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 naming what disagrees with docs/data")
    ap.add_argument("--hashes", action="store_true", help="rewrite the config hash of every current utility row")
    args = ap.parse_args(argv)
    if args.hashes:
        write_hashes()
        print("rewrote the config hashes of docs/data/utility.yaml's current rows")
        return 0
    if args.check:
        errors = stale_blocks() + stale_plot() + untraced_figures() + stale_hashes()
        for e in errors:
            print(e)
        return 1 if errors else 0
    for page in pages():
        text = page.read_text(encoding="utf-8")
        fresh = regenerate(text)
        if fresh != text:
            page.write_text(fresh, encoding="utf-8")
            print(f"wrote {page.relative_to(ROOT)}")
    if stale_plot():
        print(f"wrote {write_plot().relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
