"""bench/gpu_profile.py's CPU smoke test (``--tiny``): the table README quotes is produced end to end."""
from __future__ import annotations

import importlib.util
import math

import pytest

from conftest import ROOT


def _bench():
    spec = importlib.util.spec_from_file_location("gpu_profile", ROOT / "bench" / "gpu_profile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_profile_table(tmp_path, capsys, one_torch_thread):
    bench = _bench()
    out = tmp_path / "profile.md"
    rows = bench.main(["--tiny", "--inline", "--methods", "dpgan,gpate", "--steps", "2", "--warmup", "1",
                       "--data-root", str(tmp_path / "data"), "--out", str(out)])
    assert [r["method"] for r in rows] == ["dpgan", "gpate"]
    for r in rows:
        assert r["device"] == "cpu" and r["s/step"] > 0 and math.isclose(r["steps/s"], 1 / r["s/step"])
        assert r["setup s"] >= 0 and r["peak GB"] > 0
        # the tiny runs' own length (tests/tiny.py): dpgan 6 iterations, gpate 3
        assert r["steps (full)"] == {"dpgan": 6, "gpate": 3}[r["method"]]
        assert math.isclose(r["full run h"], (r["setup s"] + r["steps (full)"] * r["s/step"]) / 3600, rel_tol=1e-9)
    table = out.read_text()
    assert table.splitlines()[0].startswith("| method | dataset | device | s/step") and "| dpgan | digits | cpu |" in table
    assert table.strip() in capsys.readouterr().out


@pytest.mark.slow
def test_profile_runs_each_method_in_a_subprocess(tmp_path):
    rows = _bench().main(["--tiny", "--methods", "gpate", "--steps", "1", "--warmup", "1",
                          "--data-root", str(tmp_path / "data")])
    assert rows[0]["method"] == "gpate" and rows[0]["s/step"] > 0, rows


def test_first_phases_are_timed_apart_at_paper_sizes():
    """The paper runs whose first steps cost differently: dpac/efsgd before t_c, feta's warm-up, dpaf's phase 1."""
    from types import SimpleNamespace

    bench = _bench()
    data = SimpleNamespace(train=range(60000), shape=(1, 28, 28))  # F-MNIST's size, nothing loaded

    def phase(method):
        cfg = bench._compose(method, "fmnist", "10", "paper", [])
        return bench._first_phase(method, cfg[cfg.method.hparams], data), cfg[cfg.method.hparams]

    assert phase("dpac")[0] == phase("efsgd")[0] == ("classifier.start", 6000)
    assert phase("feta")[0] == ("warmup_iters", 2000)
    assert phase("gswgan")[0] == phase("dpgan")[0] == phase("dpdm")[0] == phase("gpate")[0] == (None, 0)
    (key, t1), hp = phase("dpaf")
    assert (key, t1) == ("c_epochs", math.ceil(60000 / 64))
    short = float(bench._shorten(key, 23, hp, data))
    assert math.ceil(short * 60000 / int(hp.c_batch_size)) == 23  # dpaf's own t1 formula gives 23 steps
