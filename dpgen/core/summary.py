"""The few lines ``scripts/train.py`` prints when a run ends: what it spent, what it reached, where it is, what next.

Read from the files the run wrote (``privacy.json``, ``metrics.json``), so the summary says exactly what the
run directory holds.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(float(seconds)))
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"


def _reading(entry: Any) -> str:
    """``0.812 selected / 0.798 fixed`` from one classifier's g2r entry (metrics.json)."""
    if not isinstance(entry, dict) or entry.get("accuracy") is None:
        reason = entry.get("reason") if isinstance(entry, dict) else None
        return f"not computed ({reason})" if reason else "not computed"
    text = f"{entry['accuracy']:.3f} selected (best epoch on a synthetic hold-out)"
    fixed = entry.get("fixed")
    if isinstance(fixed, dict) and fixed.get("accuracy") is not None:
        text += f" / {fixed['accuracy']:.3f} fixed (last epoch, no selection)"
    return text


def privacy_line(privacy: dict) -> str:
    """ε spent of the target and δ, and whether the bound is a DP guarantee (privacy.json's own verdict)."""
    target, delta = privacy.get("target_epsilon"), privacy.get("delta")
    eps = privacy.get("epsilon")
    if target is None or (isinstance(target, float) and math.isinf(target)) or eps is None:
        return f"privacy: eps=inf, the privacy-off reference (no noise): NOT private (delta {delta:g})"
    line = f"privacy: epsilon {float(eps):.3f} spent of {float(target):g}, delta {float(delta):g}, "
    line += f"{privacy.get('accounting', '?')} accounting"
    if privacy.get("valid_dp_guarantee"):
        return line + ": a valid DP guarantee"
    sound = privacy.get("sound_epsilon")
    why = f"; sound epsilon {float(sound):.3f}" if isinstance(sound, (int, float)) else ""
    return line + f": NOT a valid DP guarantee (privacy.json says why{why})"


def run_summary(run_dir: Path, metrics: dict) -> str:
    """The closing summary of one run (a few lines, ending with the next three commands to try)."""
    run_dir = Path(run_dir)
    privacy_file = run_dir / "privacy.json"
    privacy = json.loads(privacy_file.read_text()) if privacy_file.exists() else {}
    lines = [f"done: {metrics.get('method', '?')} on {metrics.get('dataset', '?')}, profile={metrics.get('profile', '?')}",
             privacy_line(privacy) if privacy else "privacy: no privacy.json"]
    for kind, entry in (metrics.get("g2r") or {}).items():
        lines.append(f"g2r {kind.upper()}: {_reading(entry)}")
    r2g = metrics.get("r2g")
    if isinstance(r2g, dict) and r2g.get("accuracy") is not None:
        lines.append(f"r2g ({r2g.get('classifier', '?').upper()} trained on real data): {r2g['accuracy']:.3f}")
    lines.append(f"time: {_duration(metrics.get('train_seconds'))} training, "
                 f"{_duration(metrics.get('eval_seconds'))} evaluation")
    files = [p for p in ("generator.pt", "samples.png", "privacy.json", "metrics.json", "train.log")
             if (run_dir / p).exists()]
    lines.append(f"files: {run_dir}/ ({', '.join(files)})")
    lines += ["next:",
              f"  python scripts/sample.py run={run_dir} n=1000 out=samples.npz    # draw labelled synthetic data",
              f"  python scripts/evaluate.py run={run_dir} eval=full    # both classifiers, readings trained apart",
              "  python scripts/train.py method=feta eps=1    # a DP diffusion model, a tighter budget (docs/methods.md)"]
    return "\n".join(lines)
