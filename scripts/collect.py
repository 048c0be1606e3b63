#!/usr/bin/env python
"""Summarise runs: ``python scripts/collect.py <outputs dir> [out=<dir>] [paper=<yaml>]``.

Writes into ``out`` (default: the outputs dir):
- results.csv and results.md: mean ± std over seeds per method × dataset × ε × accounting × profile × variant
  (results.csv adds each metric's n and standard error);
- privacy_utility.png: the fixed g2r CNN reading (mean ± standard error) against ε, ε=∞ at the end of the axis;
- results_vs_paper.csv and results_vs_paper.md: each of our numbers next to the published one of
  ``paper`` (default configs/paper_results.yaml) with the difference, `paper` and `sound` accounting apart,
  profile=quick rows marked as not comparable.
"""
from __future__ import annotations

import sys
from pathlib import Path

from dpgen.cli import user_errors
from dpgen.core.methods import CONFIG_DIR
from dpgen.errors import DpgenError
from dpgen.report import collect_runs, compare, load_paper_results, summarise, write_comparison, write_outputs

USAGE = "usage: python scripts/collect.py <outputs dir> [out=<dir>] [paper=<yaml>]"


def main(argv: list[str]) -> None:
    if not argv or "=" in argv[0]:
        raise DpgenError(USAGE)
    root = Path(argv[0])
    opts = {"out": str(root), "paper": str(CONFIG_DIR / "paper_results.yaml")}
    for arg in argv[1:]:
        key, sep, value = arg.partition("=")
        if not sep or key not in opts:
            raise DpgenError(f"unknown argument {arg!r}; {USAGE}")
        opts[key] = value
    out, paper = Path(opts["out"]), Path(opts["paper"])
    if not paper.is_file():
        raise DpgenError(f"paper results file {paper} not found")
    runs = collect_runs(root)
    if not runs:
        raise DpgenError(f"no finished runs (metrics.json + privacy.json) under {root}")
    summary = summarise(runs)
    paths = write_outputs(summary, runs, out)
    paths += write_comparison(compare(summary, load_paper_results(paper)), out)
    for p in paths:
        print(f"wrote {p}")


def cli(argv: list[str] | None = None) -> None:
    """The command line: ``main`` with one-line errors and exit code 2 (tests call this in-process)."""
    with user_errors():
        main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    cli()
