"""notebooks/results.ipynb and notebooks/privacy.ipynb execute (through nbmake) on the fixture runs.

They run in a child pytest so that `make test` needs no extra flag, and with DPGEN_RUNS pointing at
tests/fixtures/runs so that whatever a developer has under outputs/ can neither slow nor break them.
A cell that raises (including the notebooks' own asserts) fails the test.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

NOTEBOOKS = ["notebooks/results.ipynb", "notebooks/privacy.ipynb"]


def test_notebooks_are_stored_without_outputs():
    # outputs of a local run would bloat the diff and go stale; nbmake executes a fresh copy anyway
    for nb in NOTEBOOKS:
        cells = json.loads((ROOT / nb).read_text())["cells"]
        assert all(not c.get("outputs") for c in cells if c["cell_type"] == "code"), nb


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_notebook_executes_on_fixtures(notebook):
    pytest.importorskip("nbmake")
    env = {**os.environ, "DPGEN_RUNS": str(ROOT / "tests" / "fixtures" / "runs"), "OMP_NUM_THREADS": "1",
           "MPLBACKEND": "Agg"}
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbmake",
                          "--nbmake-timeout=300", notebook], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "1 passed" in res.stdout
