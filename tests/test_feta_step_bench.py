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


def test_best_names_the_fastest_fp32_ghost_setting(fs, tmp_path, capsys):
    rows = [{"backend": "ghost", "precision": "fp32", "micro": 32, "conv": "auto", "graph": "off", "s/step": 15.0},
            {"backend": "ghost", "precision": "bf16", "micro": 128, "conv": "auto", "graph": "on", "s/step": 1.0},
            {"backend": "ghost", "precision": "fp32", "micro": 128, "conv": "patches", "graph": "on", "s/step": 3.0},
            {"backend": "ghost", "precision": "fp32", "micro": 64, "conv": "auto", "graph": "on", "notes": "failed"}]
    (tmp_path / "f.json").write_text(__import__("json").dumps(rows))
    fs.main(["--best", str(tmp_path / "f.json")])
    assert capsys.readouterr().out.strip() == \
        "--set feta.micro_batch=128 --set feta.ghost_conv=patches --set feta.cuda_graph=true"
    fs.main(["--best", str(tmp_path / "missing.json")])
    assert capsys.readouterr().out.strip() == ""


@pytest.mark.slow
def test_gpu_levers_dry_run_on_a_cpu(tmp_path):
    """bench/gpu_levers.sh, the one prepared GPU call, runs its three parts end to end on a CPU (LEVERS_TINY) and
    prints each part's table; part 3 times part 1's fastest setting."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, LEVERS_TINY="1", PYTHON=sys.executable, WHEELS="", GPU_OUT=str(tmp_path))
    out = subprocess.run(["bash", "bench/gpu_levers.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    for part in ("feta_step/feta_step.md", "gswgan/gpu_check.md", "feta_best/gpu_check.md"):
        assert f"== {tmp_path}/{part}" in out.stdout
    assert out.stdout.count("| gswgan pre-training | fp32 | off |") == 5
    assert "feta.micro_batch=" in out.stdout.split(f"== {tmp_path}/feta_best")[1].splitlines()[1]


@pytest.mark.slow
def test_footprint_bench_smoke(capsys):
    spec = importlib.util.spec_from_file_location("feta_footprint", ROOT / "bench" / "feta_footprint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.main(["--unet", "quick", "--multiplicity", "2", "--paths", "fused,patches", "--records", "1,9"])
    assert [r["path"] for r in rows] == ["estimate (meta device)", "fused", "patches"]
    assert rows[0]["GiB/record"] > 0  # the estimate; a measured slope of a tiny net may read 0 (pages reused)
    assert all(r[f"MiB at {n}"] >= 0 for r in rows[1:] for n in (1, 9))
    assert capsys.readouterr().out.rstrip().splitlines()[-1].startswith("| patches | ")


def test_a_spent_budget_skips_settings_but_not_the_first_settings_second_run(fs):
    rows = fs.main(["--device", "cpu", "--unet", "quick", "--multiplicity", "1", "--micro", "2", "--batch", "4",
                    "--conv", "auto,patches", "--graph", "off", "--precisions", "fp32", "--reps", "1", "--budget", "0"])
    assert [r["notes"] for r in rows[:-1]] == ["skipped (budget)"] * 2
    assert rows[-1]["notes"] == "first setting again" and rows[-1]["s/micro"] > 0
