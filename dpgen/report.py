"""Collect finished runs into tables and a privacy–utility plot (used by scripts/collect.py)."""
from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from pathlib import Path

METRICS = {  # column -> path into metrics.json
    "g2r_cnn": ("g2r", "cnn", "accuracy"),
    "g2r_mlp": ("g2r", "mlp", "accuracy"),
    "r2g": ("r2g", "accuracy"),
    "cnn_fid": ("cnn_fid",),
    "fid": ("fid",),
    "is": ("is",),
    "train_seconds": ("train_seconds",),
}
KEYS = ("method", "dataset", "target_epsilon", "accounting", "profile")


def _get(d: dict, path: tuple[str, ...]):
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d if isinstance(d, (int, float)) and not isinstance(d, bool) else None


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


def write_outputs(summary: list[dict], runs: list[dict], out_dir: str | Path) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, md_path, png_path = out_dir / "results.csv", out_dir / "results.md", out_dir / "privacy_utility.png"
    with csv_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(summary[0]))
        writer.writeheader()
        writer.writerows(summary)
    cols = list(METRICS)
    lines = ["| method | dataset | ε target | ε spent | accounting | valid DP | seeds | " + " | ".join(cols) + " |",
             "|" + "---|" * (7 + len(cols))]
    for r in summary:
        lines.append(f"| {r['method']} | {r['dataset']} | {r['target_epsilon']} | {r['epsilon']:.3f} | "
                     f"{r['accounting']} | {r['valid_dp_guarantee']} | {r['seeds']} | "
                     + " | ".join(_fmt(r[f'{c}_mean'], r[f'{c}_std']) for c in cols) + " |")
    md_path.write_text("\n".join(lines) + "\n")
    _plot(summary, png_path)
    return [csv_path, md_path, png_path]


def _plot(summary: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    series: dict[str, list[tuple]] = defaultdict(list)
    for r in summary:
        if r["g2r_cnn_mean"] is not None:
            series[f"{r['method']}/{r['dataset']} ({r['accounting']})"].append(
                (r["target_epsilon"], r["g2r_cnn_mean"], r["g2r_cnn_std"]))
    for label, pts in sorted(series.items()):
        pts.sort()
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3,
                    label=label)
    ax.set_xscale("log")
    ax.set_xlabel("target ε")
    ax.set_ylabel("g2r CNN accuracy")
    ax.set_title("privacy–utility")
    if series:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
