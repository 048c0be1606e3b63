"""Collect finished runs into tables, a privacy–utility plot and a comparison with the published
numbers of configs/paper_results.yaml (used by scripts/collect.py and notebooks/results.ipynb)."""
from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from pathlib import Path

METRICS = {  # column -> path into metrics.json
    "g2r_cnn": ("g2r", "cnn", "accuracy"),  # the paper protocol: best epoch on a synthetic hold-out
    "g2r_cnn_fixed": ("g2r", "cnn", "fixed", "accuracy"),  # fixed schedule, last epoch, no selection
    "g2r_mlp": ("g2r", "mlp", "accuracy"),
    "g2r_mlp_fixed": ("g2r", "mlp", "fixed", "accuracy"),
    "r2g": ("r2g", "accuracy"),
    "cnn_fid": ("cnn_fid",),
    "fid": ("fid",),
    "is": ("is",),
    "train_seconds": ("train_seconds",),
}
KEYS = ("method", "dataset", "target_epsilon", "accounting", "profile", "variant")
#: a selected g2r accuracy this far above the fixed-schedule reading is flagged in results.md: the figure depends
#: on which epoch the selection kept, not only on the samples
SELECTION_GAP_FLAG = 0.05
# Hyperparameters that turn one method into two published versions (DP-FETA_e / DP-FETA_o): such runs
# are grouped and compared apart. method -> dotted key in the run's .hydra/config.yaml.
VARIANT_KEYS = {"feta": "feta.central"}
PAPER_FIELDS = ("table", "method", "dataset", "eps", "metric", "value", "citation")


def _get(d: dict, path: tuple[str, ...]):
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d if isinstance(d, (int, float)) and not isinstance(d, bool) else None


def _variant(run_dir: Path, method: str | None) -> str | None:
    """The published version a run reproduces, read from its composed config (None: the method has one)."""
    key = VARIANT_KEYS.get(method or "")
    cfg_file = run_dir / ".hydra" / "config.yaml"
    if key is None or not cfg_file.is_file():
        return None
    import yaml  # PyYAML comes with omegaconf

    node = yaml.safe_load(cfg_file.read_text())
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return None if node is None else str(node)


def collect_runs(root: str | Path) -> list[dict]:
    """One row per run directory that holds both metrics.json and privacy.json."""
    rows = []
    for mfile in sorted(Path(root).rglob("metrics.json")):
        pfile = mfile.with_name("privacy.json")
        if not pfile.is_file():
            continue
        metrics, privacy = json.loads(mfile.read_text()), json.loads(pfile.read_text())
        row = {k: metrics.get(k) for k in ("method", "dataset", "target_epsilon", "seed", "profile")}
        row.update({"accounting": privacy.get("accounting"), "epsilon": privacy.get("epsilon"),
                    "valid_dp_guarantee": privacy.get("valid_dp_guarantee"), "run_dir": str(mfile.parent)})
        row["variant"] = _variant(mfile.parent, row["method"])
        row.update({col: _get(metrics, path) for col, path in METRICS.items()})
        rows.append(row)
    return rows


def _stats(values: list[float]) -> tuple[float | None, float | None, int, float | None]:
    """Mean, sample standard deviation (0.0 for one value), n, and standard error (std/√n; None below two values)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None, None, 0, None
    n = len(vals)
    mean = sum(vals) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else 0.0
    return mean, std, n, (std / math.sqrt(n) if n > 1 else None)


def summarise(runs: list[dict]) -> list[dict]:
    """For each (method, dataset, ε, accounting, profile, variant), each metric's mean, sample standard deviation
    (``_std``), number of runs with a reading (``_n``) and standard error (``_se``, std/√n; None for one run)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        groups[tuple(r[k] for k in KEYS)].append(r)
    out = []
    for key, members in sorted(groups.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        row = dict(zip(KEYS, key))
        row["seeds"] = len(members)
        row["epsilon"] = max((m["epsilon"] or 0.0) for m in members)
        row["valid_dp_guarantee"] = all(bool(m["valid_dp_guarantee"]) for m in members)
        for col in METRICS:
            row[f"{col}_mean"], row[f"{col}_std"], row[f"{col}_n"], row[f"{col}_se"] = \
                _stats([m[col] for m in members])
        out.append(row)
    return out


def _fmt(mean, std) -> str:
    return "–" if mean is None else f"{mean:.3f} ± {std:.3f}"


def selection_flags(row: dict) -> list[str]:
    """``"cnn +0.150"`` for every classifier whose selected g2r accuracy exceeds its fixed-schedule reading by more
    than :data:`SELECTION_GAP_FLAG` (means over seeds)."""
    flags = []
    for kind in ("cnn", "mlp"):
        sel, fixed = row.get(f"g2r_{kind}_mean"), row.get(f"g2r_{kind}_fixed_mean")
        if sel is not None and fixed is not None and sel - fixed > SELECTION_GAP_FLAG:
            flags.append(f"{kind} {sel - fixed:+.3f}")
    return flags


NO_PRIVACY = "∞ (no privacy)"


def eps_label(eps) -> str:
    """ε as a table heading: ``inf`` (the ``eps=inf`` privacy-off reference) is its own column, never a budget."""
    if eps is None:
        return "–"
    return NO_PRIVACY if math.isinf(float(eps)) else f"{float(eps):g}"


def _both(r: dict, metric: str) -> str:
    """The selected reading, with the fixed-schedule one beside it when there is one."""
    text = _fmt(r[f"{metric}_mean"], r[f"{metric}_std"])
    fixed = r.get(f"{metric}_fixed_mean")
    return text if fixed is None else f"{text} (fixed {fixed:.3f})"


def by_epsilon(summary: list[dict], metric: str = "g2r_cnn") -> tuple[list[str], list[dict]]:
    """``metric`` as one row per method × dataset × accounting × profile × variant and one column per target ε,
    the privacy-off reference (ε = ∞) last: the upper-bound row of a DP paper's table, side by side."""
    eps_values = sorted({float(r["target_epsilon"]) for r in summary if r["target_epsilon"] is not None})
    columns = [eps_label(e) for e in eps_values]
    rows: dict[tuple, dict] = {}
    for r in summary:
        key = tuple(r[k] for k in KEYS if k != "target_epsilon")
        row = rows.setdefault(key, dict(zip([k for k in KEYS if k != "target_epsilon"], key)))
        if r["target_epsilon"] is not None:
            row[eps_label(r["target_epsilon"])] = _both(r, metric)
    return columns, [rows[k] for k in sorted(rows, key=lambda k: tuple(str(x) for x in k))]


def write_outputs(summary: list[dict], runs: list[dict], out_dir: str | Path) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, md_path, png_path = out_dir / "results.csv", out_dir / "results.md", out_dir / "privacy_utility.png"
    with csv_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(summary[0]))
        writer.writeheader()
        writer.writerows(summary)
    cols = list(METRICS)
    lines = ["g2r columns: the paper protocol (best epoch on a synthetic hold-out) and `_fixed`, the same classifier "
             "trained on all samples for a fixed schedule, last epoch, no selection. `selection gap` names the "
             f"classifiers whose selected accuracy exceeds the fixed reading by more than {SELECTION_GAP_FLAG}.", "",
             "| method | dataset | ε target | ε spent | accounting | valid DP | profile | variant | seeds | "
             + " | ".join(cols) + " | selection gap |",
             "|" + "---|" * (10 + len(cols))]
    for r in summary:
        spent = "∞" if math.isinf(r["epsilon"]) else f"{r['epsilon']:.3f}"
        lines.append(f"| {r['method']} | {r['dataset']} | {eps_label(r['target_epsilon'])} | {spent} | "
                     f"{r['accounting']} | {r['valid_dp_guarantee']} | {r['profile']} | {r['variant'] or '–'} | "
                     f"{r['seeds']} | "
                     + " | ".join(_fmt(r[f'{c}_mean'], r[f'{c}_std']) for c in cols)
                     + f" | {', '.join(selection_flags(r)) or '–'} |")
    eps_cols, pivot = by_epsilon(summary)
    lines += ["", "## g2r CNN accuracy by target ε (fixed-schedule reading in brackets)", "",
              f"`{NO_PRIVACY}` is the `eps=inf` reference: the same code with noise multiplier 0 (clipping kept), "
              "not a private result.", "",
              "| method | dataset | accounting | profile | variant | " + " | ".join(eps_cols) + " |",
              "|" + "---|" * (5 + len(eps_cols))]
    for r in pivot:
        lines.append(f"| {r['method']} | {r['dataset']} | {r['accounting']} | {r['profile']} | {r['variant'] or '–'} | "
                     + " | ".join(r.get(c, "–") for c in eps_cols) + " |")
    md_path.write_text("\n".join(lines) + "\n")
    _plot(summary, png_path)
    return [csv_path, md_path, png_path]


#: the reading the privacy–utility plot draws: the fixed-schedule g2r CNN accuracy (last epoch, no selection)
PLOT_METRIC = "g2r_cnn_fixed"
#: where ε = ∞ (the privacy-off reference) sits on the plot's log axis: this factor beyond the largest finite ε
INF_FACTOR = 3.0


def curve_points(summary: list[dict], metric: str = PLOT_METRIC) -> list[dict]:
    """The points :func:`plot_privacy_utility` draws from a :func:`summarise` table: one per row with a reading,
    labelled by method[variant]/dataset (accounting, profile); an ``eps=inf`` run joins its accounting's line."""
    points = []
    for r in summary:
        mean = r.get(f"{metric}_mean")
        if mean is None or r["target_epsilon"] is None:
            continue
        name = r["method"] + (f"[{r['variant']}]" if r.get("variant") else "")
        points.append({"label": f"{name}/{r['dataset']} ({r['accounting']}, {r['profile']})",
                       "eps": float(r["target_epsilon"]), "mean": mean, "se": r.get(f"{metric}_se"),
                       "n": r.get(f"{metric}_n") or 1})
    return points


def plot_privacy_utility(points: list[dict], path: str | Path, *,
                         ylabel: str = "g2r CNN accuracy, fixed reading", title: str = "privacy–utility",
                         eps_ticks: list[float] | tuple[float, ...] = (),
                         metadata: dict[str, str] | None = None) -> Path:
    """A privacy–utility plot: one line per ``label``, the mean reading against the target ε on a log axis, with
    standard-error bars (a point of one draw, ``se`` None, gets a hollow marker and no bar). ε = ∞ (the eps=inf
    reference) is drawn at :data:`INF_FACTOR` × the largest finite ε, past a dashed break, ticked ``∞``, and joined
    to its line by a dotted segment: it is not a budget. ``points``: mappings with label, eps, mean, se, n (from
    :func:`curve_points`, or scripts/docs_tables.py's docs/data/utility.yaml); ``eps_ticks``: finite ε to mark on
    the axis beside those of the points (a table's columns, drawn or not); ``metadata``: PNG text entries."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, NullLocator

    finite = sorted({float(p["eps"]) for p in points if math.isfinite(float(p["eps"]))}
                    | {float(e) for e in eps_ticks if math.isfinite(float(e))})
    x_inf = (finite[-1] if finite else 1.0) * INF_FACTOR
    series: dict[str, list[dict]] = {}
    for p in points:
        series.setdefault(p["label"], []).append(p)
    cmap = plt.get_cmap("tab10" if len(series) <= 10 else "tab20")
    markers = "osD^vP*Xh<>p"
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for i, (label, pts) in enumerate(series.items()):
        colour, marker = cmap(i % cmap.N), markers[i % len(markers)]
        pts = sorted(pts, key=lambda p: float(p["eps"]))
        xs = [x_inf if math.isinf(float(p["eps"])) else float(p["eps"]) for p in pts]
        ys = [float(p["mean"]) for p in pts]
        fin = [k for k, p in enumerate(pts) if math.isfinite(float(p["eps"]))]
        ax.plot([xs[k] for k in fin], [ys[k] for k in fin], "-", color=colour, lw=1.2)
        if fin and len(fin) < len(pts):  # the privacy-off point: a dotted join, never part of the curve
            ax.plot([xs[fin[-1]], x_inf], [ys[fin[-1]], ys[-1]], ":", color=colour, lw=1)
        for x, y, p in zip(xs, ys, pts):
            if p.get("se") is not None:
                ax.errorbar([x], [y], yerr=[float(p["se"])], fmt="none", ecolor=colour, capsize=3, lw=1)
            ax.plot([x], [y], marker=marker, ls="none", color=colour, ms=5,
                    markerfacecolor=colour if (p.get("n") or 1) >= 2 else "white")
        ax.plot([], [], "-", marker=marker, color=colour, label=label)  # the legend's entry
    ax.set_xscale("log")
    ticks = finite + ([x_inf] if any(math.isinf(float(p["eps"])) for p in points) else [])
    if len(ticks) > len(finite):
        ax.axvline(math.sqrt((finite[-1] if finite else 1.0) * x_inf), color="grey", ls="--", lw=0.8)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([f"{t:g}" if t in finite else "∞\n(no privacy)" for t in ticks])
    if ticks:
        ax.set_xlim(ticks[0] / 1.5, ticks[-1] * 1.5)
    ax.set_xlabel("target ε")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    handles, _ = ax.get_legend_handles_labels()
    handles += [Line2D([], [], marker="o", ls="none", color="black", label="mean ± standard error (n ≥ 2)"),
                Line2D([], [], marker="o", ls="none", color="black", markerfacecolor="white", label="one draw (n = 1)")]
    if points:
        ax.legend(handles=handles, fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(True, axis="y", lw=0.3)
    path = Path(path)
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None, **(metadata or {})})
    plt.close(fig)
    return path


def _plot(summary: list[dict], path: Path) -> None:
    plot_privacy_utility(curve_points(summary), path)


# -- comparison with the papers ------------------------------------------------------------------

ACCOUNTINGS = ("paper", "sound")  # sections of results_vs_paper.md, in this order


def load_paper_results(path: str | Path) -> list[dict]:
    """The rows of configs/paper_results.yaml, checked: a typo there would silently match nothing."""
    import yaml

    from dpgen.errors import DpgenError

    doc = yaml.safe_load(Path(path).read_text()) or {}
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        raise DpgenError(f"{path}: expected a top-level 'rows:' list")
    for i, r in enumerate(rows):
        missing = [f for f in PAPER_FIELDS if not isinstance(r, dict) or r.get(f) is None]
        if missing:
            raise DpgenError(f"{path}: row {i} lacks {', '.join(missing)}")
        if r["metric"] not in METRICS:
            raise DpgenError(f"{path}: row {i} has metric {r['metric']!r}; use one of {', '.join(METRICS)}")
    return rows


def compare(summary: list[dict], paper_rows: list[dict]) -> list[dict]:
    """One row per (published number, group of our runs with the same method/dataset/ε/variant/accounting/profile).

    ``diff`` is ours − paper (positive = higher than published; for FID lower is better). Published numbers
    without a matching run are left out: results_vs_paper lists what was measured. ``comparable`` is False
    for profile=quick: CPU-sized models are not the paper's and their numbers say nothing about the paper's.
    """
    out = []
    for p in paper_rows:
        for r in summary:
            if (r["method"], r["dataset"]) != (p["method"], p["dataset"]):
                continue
            if r["target_epsilon"] is None or not math.isclose(float(r["target_epsilon"]), float(p["eps"])):
                continue
            if p.get("variant") is not None and r.get("variant") != p["variant"]:
                continue
            ours, std = r[f"{p['metric']}_mean"], r[f"{p['metric']}_std"]
            out.append({
                "accounting": r["accounting"], "profile": r["profile"], "comparable": r["profile"] == "paper",
                "table": p["table"], "method": p["method"], "variant": r.get("variant"), "dataset": p["dataset"],
                "eps": float(p["eps"]), "epsilon_spent": r["epsilon"], "valid_dp_guarantee": r["valid_dp_guarantee"],
                "metric": p["metric"], "paper": float(p["value"]), "ours": ours, "ours_std": std,
                "seeds": r["seeds"], "diff": None if ours is None else ours - float(p["value"]),
                "citation": p["citation"], "note": p.get("note") or "",
            })
    # accounting sections first, paper-profile (comparable) rows before quick ones inside each
    order = {a: i for i, a in enumerate(ACCOUNTINGS)}
    out.sort(key=lambda c: (order.get(c["accounting"], len(order)), not c["comparable"], c["table"], c["method"],
                            str(c["variant"]), c["dataset"], c["eps"], c["metric"]))
    return out


def _num(v, digits: int = 3) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def write_comparison(rows: list[dict], out_dir: str | Path) -> list[Path]:
    """results_vs_paper.csv (every row) and results_vs_paper.md (one section per accounting mode)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out_dir / "results_vs_paper.csv", out_dir / "results_vs_paper.md"
    fields = ["accounting", "profile", "comparable", "table", "method", "variant", "dataset", "eps", "epsilon_spent",
              "valid_dp_guarantee", "metric", "paper", "ours", "ours_std", "seeds", "diff", "citation", "note"]
    with csv_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    lines = ["# Our results next to the published ones", "",
             "`diff` = ours − paper (for FID lower is better). The papers' ε are under their own accounting; "
             "our `paper` rows reproduce that accounting (not a valid DP guarantee where it under-counts), "
             "our `sound` rows spend the same ε under a valid bound. Rows marked **quick** come from "
             "`profile=quick` (CPU-sized models and budgets): they are not comparable with the paper.", ""]
    if not rows:
        lines.append("No run matches a published number (method, dataset, ε, variant) of configs/paper_results.yaml.")
    for acc in sorted({r["accounting"] for r in rows}, key=lambda a: (a not in ACCOUNTINGS, str(a))):
        lines += [f"## `{acc}` accounting", "",
                  "| table | method | dataset | ε | ε spent | metric | paper | ours | diff | seeds | profile | citation |",
                  "|" + "---|" * 12]
        for r in (r for r in rows if r["accounting"] == acc):
            method = r["method"] + (f" ({r['variant']})" if r["variant"] else "")
            profile = "paper" if r["comparable"] else f"**{r['profile']}** (not comparable)"
            ours = "–" if r["ours"] is None else f"{r['ours']:.3f} ± {r['ours_std']:.3f}"
            cite = r["citation"] + (f"; {r['note']}" if r["note"] else "")
            lines.append(f"| {r['table']} | {method} | {r['dataset']} | {r['eps']:g} | {_num(r['epsilon_spent'])} | "
                         f"{r['metric']} | {r['paper']:g} | {ours} | {_num(r['diff'])} | {r['seeds']} | {profile} | "
                         f"{cite} |")
        lines.append("")
    md_path.write_text("\n".join(lines) + "\n")
    return [csv_path, md_path]
