"""bench/gpu_profile.py's CPU smoke test (``--tiny``): the table docs/performance.md quotes is produced end to end."""
from __future__ import annotations

import importlib.util
import math
import re
import sys
import time

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
        _check_flops(r)
        assert r["setup s"] >= 0 and r["peak GB"] > 0
        # the tiny runs' own length (tests/tiny.py): dpgan 6 iterations, gpate 3
        assert r["steps (full)"] == {"dpgan": 6, "gpate": 3}[r["method"]]
        assert math.isclose(r["full run h"], (r["setup s"] + r["steps (full)"] * r["s/step"]) / 3600, rel_tol=1e-9)
    table = out.read_text()
    assert table.splitlines()[0].startswith("| method | dataset | device | s/step | GFLOP/step | TFLOP/s |")
    assert "| dpgan | digits | cpu |" in table
    captured = capsys.readouterr()
    assert table.strip() in captured.out
    # progress while it runs: a line per phase on stderr, every step at first
    for line in ("[gpu_profile dpgan", "] setup: ", "] main: training starts", "] main: step 1 ", "] main: step 2 "):
        assert line in captured.err, captured.err
    assert "s/step so far" in captured.err


def _check_flops(row: dict) -> None:
    """The TFLOP/s column: positive, and FLOPs per step / s per step."""
    assert row["GFLOP/step"] > 0 and row["TFLOP/s"] > 0, row
    assert math.isclose(row["TFLOP/s"] * row["s/step"] * 1e12, row["GFLOP/step"] * 1e9, rel_tol=1e-9)


def test_budget_stops_the_main_phase_and_reports_the_steps_timed(tmp_path, capsys, one_torch_thread):
    """A run far longer than the budget stops after about ``--budget`` s with the steps timed by then."""
    # The budget counts the setup too, which alone can take 3 s on a loaded 2-core machine: then no step is timed
    # and the check runs again with a budget that leaves room for steps.
    for budget in (3, 15):
        capsys.readouterr()
        t = time.perf_counter()
        rows = _bench().main(["--tiny", "--inline", "--methods", "dpgan", "--set", "dpgan.iters=100000",
                              "--steps", "100000", "--budget", str(budget), "--data-root", str(tmp_path / "data")])
        elapsed = time.perf_counter() - t
        r = rows[0]
        assert elapsed < budget + 60  # generous: config, data and one step after the deadline
        assert f"stopped by --budget {budget} s in " in r["notes"], r["notes"]
        if r["steps timed"]:
            break
    assert 0 < r["steps timed"] < 100000 and r["s/step"] > 0 and r["steps (full)"] == 100000
    assert f"stopped by --budget {budget} s in main" in r["notes"]
    assert f"from {r['steps timed']} of 100000" in r["notes"]
    _check_flops(r)
    assert math.isclose(r["full run h"], (r["setup s"] + 100000 * r["s/step"]) / 3600, rel_tol=1e-9)
    assert f"budget of {budget} s reached in main" in capsys.readouterr().err


def test_budget_stops_the_ensemble_pretraining_and_extrapolates_it(tmp_path, one_torch_thread):
    """The pre-training (a thousand discriminators at paper sizes) is stopped inside: per-pair time and FLOPs are
    measured, the full pre-training extrapolated, and the row says so instead of failing."""
    budget = 12  # the tiny setup takes ~3.5 s on a loaded 2-core machine; the pre-training would take hours
    t = time.perf_counter()
    rows = _bench().main(["--tiny", "--inline", "--methods", "gswgan", "--set", "gswgan.pretrain_iters=100000",
                          "--budget", str(budget), "--data-root", str(tmp_path / "data")])
    elapsed = time.perf_counter() - t
    r = rows[0]
    assert elapsed < budget + 60
    assert r["s/step"] is None and r["TFLOP/s"] is None and r["steps timed"] == 0, r
    notes = r["notes"]
    assert f"stopped by --budget {budget} s in pretrain" in notes and "no main-phase step timed" in notes, notes
    m = re.search(r"(\d+) of 100000 iterations run, ([0-9.e+-]+) ms per pair-iteration, ([0-9.e+-]+) GFLOP per "
                  r"pair-iteration \(([0-9.e+-]+) TFLOP/s\), full pre-training ([0-9.]+) (s|min|h) \(extrapolated\)",
                  notes)
    assert m, notes
    done, ms, gflop, tflops = int(m[1]), float(m[2]), float(m[3]), float(m[4])
    assert 1 <= done < 100000 and ms > 0 and gflop > 0
    assert math.isclose(tflops, gflop * 1e9 / (ms / 1e3) / 1e12, rel_tol=0.01)  # rounded in the note
    # setup = what ran before the pre-training + 4 pairs x 100000 iterations at the measured per-pair time
    assert r["setup s"] >= 4 * 100000 * ms / 1e3 * 0.99


def test_first_phase_counted_apart(tmp_path, one_torch_thread):
    """dpac's iterations before the classifier: shortened, timed and FLOP-counted apart; the full run counts them
    inside its planned iterations (12 = 8 without the classifier + 4 with it). All 4 members sampled at every
    step (m = K), so the FLOPs per step do not vary with the Poisson draw."""
    rows = _bench().main(["--tiny", "--inline", "--methods", "dpac", "--set", "dpac.iters=12", "--set",
                          "dpac.partitions_per_iter=4", "--set",
                          "dpac.classifier.start=8", "--steps", "2", "--warmup", "1",
                          "--data-root", str(tmp_path / "data")])
    r = rows[0]
    assert r["steps (full)"] == 12 and r["steps timed"] == 2
    _check_flops(r)
    m = re.search(r"first phase \(classifier.start\): 8 steps at ([0-9.e+-]+) s/step, ([0-9.e+-]+) GFLOP/step",
                  r["notes"])
    assert m, r["notes"]
    first_s, first_gflop = float(m[1]), float(m[2])
    assert 0 < first_gflop < r["GFLOP/step"]  # the main phase trains the classifier too
    assert math.isclose(r["full run h"], (r["setup s"] + 8 * first_s + 4 * r["s/step"]) / 3600, rel_tol=0.01)


def test_child_output_is_relayed_and_an_overdue_child_killed(capsys, monkeypatch):
    """Subprocess mode: the child's stderr reaches ours line by line; a child past budget + margin is killed and
    its row says so; a failing child's row gives its last stderr line."""
    bench = _bench()
    sleeper = [sys.executable, "-c", "import sys, time; print('progress line', file=sys.stderr, flush=True); "
               "time.sleep(120)"]
    t = time.perf_counter()
    code, out, last = bench.run_child(sleeper, timeout=2)
    assert code is None and last == "progress line" and time.perf_counter() - t < 60
    assert "progress line" in capsys.readouterr().err

    monkeypatch.setattr(bench, "KILL_MARGIN_S", 1.0)
    row = bench.child_row("dpgan", "digits", "cpu", sleeper, budget=1.0)
    assert row["notes"].startswith("failed: exceeded budget (1 s + 1 s margin)"), row
    failing = [sys.executable, "-c", "import sys; print('first', file=sys.stderr); sys.exit('boom')"]
    assert bench.child_row("dpgan", "digits", "cpu", failing, budget=None)["notes"] == "failed: boom"
    fine = [sys.executable, "-c", "print('noise'); print('{\"method\": \"dpgan\", \"s/step\": 1.0}')"]
    assert bench.child_row("dpgan", "digits", "cpu", fine, budget=None) == {"method": "dpgan", "s/step": 1.0}


@pytest.mark.slow
def test_profile_runs_each_method_in_a_subprocess(tmp_path, capsys):
    rows = _bench().main(["--tiny", "--methods", "gpate", "--steps", "1", "--warmup", "1", "--budget", "300",
                          "--data-root", str(tmp_path / "data")])
    assert rows[0]["method"] == "gpate" and rows[0]["s/step"] > 0, rows
    _check_flops(rows[0])
    assert "[gpu_profile gpate" in capsys.readouterr().err  # the child's progress, relayed


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


def test_batched_ensembles_launch_a_fixed_number_of_operators_per_chunk():
    """bench/ensemble_kernels.py: a G-PATE teacher step launches the same operators per chunk whatever its size
    (so 4x the chunk, 1/4 the operators), and a DPAC critic step the same number for 4 or 16 members."""
    spec = importlib.util.spec_from_file_location("ensemble_kernels", ROOT / "bench" / "ensemble_kernels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.main(["--teachers", "8", "--chunks", "2,8", "--members", "2,4"])
    gpate = {size: ops for name, size, ops in rows if name.startswith("gpate")}
    dpac = {size: ops for name, size, ops in rows if name.startswith("dpac")}
    assert 3.5 < gpate[2] / gpate[8] <= 4.0, gpate
    assert dpac[2] == dpac[4], dpac


# ---- FLOPs of grouped convolutions (the ensembles' members under vmap) ----------------------------------------

@pytest.mark.parametrize("transposed", [False, True])
def test_grouped_conv_backward_flop_counts_each_group_once(transposed):
    """A convolution of g groups does the work of g convolutions of one group each, forward and backward (input and
    weight gradients): the per-group formula counts exactly that, where torch's own counts the weight gradient as a
    dense convolution's (g times the work)."""
    import torch
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    bench, groups, cin, cout = _bench(), 3, 4, 6

    def count(g: int) -> int:
        x = torch.randn(5, g * cin, 9, 9, requires_grad=True)
        shape = (g * cin, cout, 3, 3) if transposed else (g * cout, cin, 3, 3)
        w = torch.randn(shape, requires_grad=True)
        mode = FlopCounterMode(display=False, custom_mapping={
            torch.ops.aten.convolution_backward: bench.grouped_conv_backward_flop})
        with mode:
            conv = F.conv_transpose2d if transposed else F.conv2d
            conv(x, w, stride=2, padding=1, groups=g).square().sum().backward()
        return int(mode.get_total_flops())

    assert count(groups) == groups * count(1) > 0


def _flops():
    spec = importlib.util.spec_from_file_location("flops", ROOT / "bench" / "flops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pretrain_flops_per_pair_do_not_grow_with_the_chunk(capsys, one_torch_thread):
    """bench/flops.py gswgan: per pair, the per-group count of a vmapped pre-training iteration is the same for 1
    and 3 pairs, and the same as the warm-up generators' loop (dense convolutions, which torch counts right);
    torch's own count adds the weight gradients' surplus once there are two pairs or more. The table's torch column
    extrapolates that surplus to the chunk, and each measured time becomes its TFLOP/s."""
    bench = _flops()
    cfg = _bench()._compose("gswgan", "fmnist", "1", "quick", [])
    shape = [1, 28, 28]
    one, surplus_one = bench.count_iteration(cfg.gswgan, shape, 10, 1)
    three, surplus_three = bench.count_iteration(cfg.gswgan, shape, 10, 3)
    loop, _ = bench.count_iteration(cfg.gswgan, shape, 10, 3, vmapped=False)
    assert all(one[p] > 0 and three[p] == 3 * one[p] for p in bench.PARTS), (one, three)
    # the loop within 0.1 %: flop_counter skips matrix-vector products (the spectral norms' σ), which vmap batches
    # into counted bmm
    assert all(math.isclose(loop[p], three[p], rel_tol=1e-3) for p in bench.PARTS), (loop, three)
    assert sum(surplus_one.values()) == 0 and surplus_three["critic"] > 0 and surplus_three["generator"] > 0
    assert surplus_three["fakes"] == 0, "no backward without gradients"
    out = bench.main(["gswgan", "--profile", "quick", "--pairs", "2", "--seconds", "2.0"])
    per_pair = sum(one.values())
    assert out["per_unit"] == per_pair and out["torch_per_unit"] > per_pair
    (sec, rate, _), = out["achieved"]
    assert math.isclose(rate, per_pair * 100 / 2.0 / 1e12)  # the quick profile's chunks of 100 pairs
    assert math.isclose(out["whole"], per_pair * 200 * 10)  # K = 200 pairs, 10 warm-up iterations
    assert "| all |" in capsys.readouterr().out


def test_feta_micro_batch_flops_per_record_do_not_grow_with_the_micro_batch(monkeypatch, capsys, one_torch_thread):
    """bench/flops.py feta: the ghost step's per-record gradients by a convolution of one group per record
    (``feta.ghost_conv=grouped``, the GPU's auto) count, per group, what the unfolded path counts (no grouped
    convolution there, which torch counts right), for 2 and 3 records alike; torch's count adds a surplus that grows
    with the records. The CPU kernel, which torch cannot count, is off for the count only."""
    from dpgen.privacy.ghost_kernel import ENV

    monkeypatch.delenv(ENV, raising=False)
    bench = _flops()
    two, surplus_two = bench.count_micro("quick", 2, 2, "grouped")
    three, surplus_three = bench.count_micro("quick", 3, 2, "grouped")
    patches, surplus_patches = bench.count_micro("quick", 2, 2, "patches")
    assert two > 0 and 3 * two == 2 * three, (two, three)
    assert math.isclose(two, patches, rel_tol=1e-6) and surplus_patches == 0, (two, patches)
    assert 0 < surplus_two < surplus_three
    import os

    assert ENV not in os.environ, "the kernel's switch is put back"
    out = bench.main(["feta", "--unet", "quick", "--profile", "quick", "--seconds", "1.0"])
    assert out["per_unit"] < out["torch_per_unit"]
    assert "| DP-SGD micro-batch" in capsys.readouterr().out
