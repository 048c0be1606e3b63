#!/usr/bin/env python
"""Summarise runs: ``python scripts/collect.py <outputs dir> [out=<dir>]``.

Writes results.csv and results.md (mean ± std over seeds per method × dataset × ε ×
accounting) and privacy_utility.png into ``out`` (default: the outputs dir).
"""
from __future__ import annotations

import sys
from pathlib import Path

from dpgen.cli import user_errors
from dpgen.errors import DpgenError
from dpgen.report import collect_runs, summarise, write_outputs


def main(argv: list[str]) -> None:
    if not argv or "=" in argv[0]:
        raise DpgenError("usage: python scripts/collect.py <outputs dir> [out=<dir>]")
    root = Path(argv[0])
    out = Path(argv[1].split("=", 1)[1]) if len(argv) > 1 and argv[1].startswith("out=") else root
    runs = collect_runs(root)
    if not runs:
        raise DpgenError(f"no finished runs (metrics.json + privacy.json) under {root}")
    paths = write_outputs(summarise(runs), runs, out)
    for p in paths:
        print(f"wrote {p}")


if __name__ == "__main__":
    with user_errors():
        main(sys.argv[1:])
