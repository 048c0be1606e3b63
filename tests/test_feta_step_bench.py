"""bench/feta_step.py on a CPU: the real micro-batch step per setting, the extrapolation to a DP-SGD step and the
stage, the first setting timed again last, and the table printed last."""
from __future__ import annotations

import importlib.util
import math

import pytest

from conftest import ROOT


@pytest.fixture(scope="module")
def fs():
    spec = importlib.util.spec_from_file_location("feta_step", ROOT / "bench" / "feta_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smoke_on_a_cpu(fs, capsys, tmp_path):
    rows = fs.main(["--device", "cpu", "--unet", "quick", "--multiplicity", "2", "--micro", "4,auto", "--batch", "16",
                    "--conv", "auto", "--graph", "off,on", "--precisions", "fp32", "--reps", "2", "--iters", "100",
                    "--out", str(tmp_path)])
    assert [(r["micro"], r["graph"]) for r in rows] == [(4, "off"), (4, "on"), (16, "off"), (16, "on"), (4, "off")]
    assert [r["notes"].split(";")[0] for r in rows[2:4]] == ["auto: 16 records"] * 2
    assert rows[-1]["notes"] == "first setting again"  # auto: the expected batch rounded up caps it at 16
    for r in rows:
        assert r["s/step"] == pytest.approx(r["s/micro"] * math.ceil(16 / r["micro"]))
        assert r["stage h"] == pytest.approx(r["s/step"] * 100 / 3600)
        assert r["min"] <= r["s/micro"] <= r["max"]
    assert all("eager (CUDA only)" in r["notes"] for r in rows if r["graph"] == "on")
    out = capsys.readouterr().out.rstrip().splitlines()
    assert out[-1].startswith("| ghost | fp32 | 4 | auto | off |") and out[-9].startswith("feta DP-SGD micro-batch")
    assert (tmp_path / "feta_step.md").read_text().strip().splitlines()[-1] == out[-1]
