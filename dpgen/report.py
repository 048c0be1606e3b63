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


def _mean_std(values: list[float]) -> tuple[float | None, float | None]:
    vals = [v for v in values if v is not None]
    if not vals:
        return None, None
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
    return mean, std


def summarise(runs: list[dict]) -> list[dict]:
    """Mean ± sample std over seeds for each (method, dataset, ε, accounting, profile)."""
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
            row[f"{col}_mean"], row[f"{col}_std"] = _mean_std([m[col] for m in members])
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


def _plot(summary: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    series: dict[str, list[tuple]] = defaultdict(list)
    no_privacy: dict[str, float] = {}
    for r in summary:
        if r["g2r_cnn_mean"] is not None and r["target_epsilon"] is not None:
            name = r["method"] + (f"[{r['variant']}]" if r.get("variant") else "")
            label = f"{name}/{r['dataset']} ({r['accounting']}, {r['profile']})"
            if math.isinf(float(r["target_epsilon"])):
                no_privacy[label] = r["g2r_cnn_mean"]
            else:
                series[label].append((r["target_epsilon"], r["g2r_cnn_mean"], r["g2r_cnn_std"]))
    colours = {}
    for label, pts in sorted(series.items()):
        pts.sort()
        bars = ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3,
                           label=label)
        colours[label] = bars.lines[0].get_color()
    for label, acc in sorted(no_privacy.items()):  # eps=inf cannot sit on a log axis: a dotted reference line
        ax.axhline(acc, ls=":", lw=1, color=colours.get(label, "grey"), label=f"{label} ε=∞ (no privacy)")
    ax.set_xscale("log")
    ax.set_xlabel("target ε")
    ax.set_ylabel("g2r CNN accuracy")
    ax.set_title("privacy–utility")
    if series or no_privacy:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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
