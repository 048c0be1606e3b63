"""One tiny end-to-end run of DPAF through the real CLI (both accounting modes)."""
from __future__ import annotations

import json

import pytest

from conftest import run_script

TINY = ["method=dpaf", "dpaf.width=4", "dpaf.fc_hidden=8", "dpaf.g_width=8", "dpaf.c_epochs=0.2",
        "dpaf.d_epochs=0.2", "dpaf.c_batch_size=128", "checkpoint_every=2", "log_every=2", "samples_per_class=2",
        "progress=false", "eval.num_samples=200", "eval.epochs=1", "eval.fid=false", "eval.classifiers=[cnn]",
        "eval.r2g=false", "eval.cnn_fid=false", "eval.real_baseline=false", "tensorboard=false"]


def _run(tmp_path, accounting: str) -> tuple[dict, dict]:
    res = run_script("train.py", *TINY, f"privacy.accounting={accounting}", f"hydra.run.dir={tmp_path}/run",
                     cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    run = tmp_path / "run"
    assert (run / "generator.pt").is_file() and (run / "samples.png").is_file()
    return json.loads((run / "privacy.json").read_text()), json.loads((run / "metrics.json").read_text())


def test_cli_sound(tmp_path):
    import torch

    privacy, metrics = _run(tmp_path, "sound")
    assert privacy["valid_dp_guarantee"] is True and privacy["epsilon"] <= 10.0
    assert [e["name"] for e in privacy["entries"]] == ["dpaf.conv1", "dpaf.conv2+dpagg"]
    assert len(privacy["entries"][1]["noise_multipliers"]) == 2
    assert metrics["method"] == "dpaf" and "g2r" in json.dumps(metrics)
    payload = torch.load(tmp_path / "run" / "generator.pt", weights_only=True)
    assert payload["class"] == "dpgen.nets.dcgan:CondGenerator"
    assert not any(k.startswith(("conv", "head")) for k in payload["state_dict"]), "only G is released"


@pytest.mark.slow
def test_cli_paper(tmp_path):
    privacy, _ = _run(tmp_path, "paper")
    assert privacy["valid_dp_guarantee"] is False and privacy["accounting"] == "paper"
    assert privacy["epsilon"] == pytest.approx(10.0, rel=0.02) and len(privacy["notes"]) == 3
