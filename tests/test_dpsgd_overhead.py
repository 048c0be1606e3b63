"""bench/dpsgd_overhead.py's --kernels: the operators a private step adds, ranked by the growth of their self time."""
import importlib.util
from pathlib import Path

import torch

from dpgen.privacy import ghost_kernel

SPEC = importlib.util.spec_from_file_location("dpsgd_overhead", Path(__file__).parents[1] / "bench" / "dpsgd_overhead.py")
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)


def test_added_ops_ranks_growth_and_drops_shrinking_ops():
    plain = {"aten::conv2d": 5.0, "aten::relu": 1.0}
    private = {"aten::conv2d": 5.5, "aten::relu": 0.5, "aten::bmm": 3.0}
    lines = bench.added_ops(plain, private, total=9.0, n=5)
    assert "aten::bmm" in lines[0] and "33.3 %" in lines[0]
    assert "aten::conv2d" in lines[1]
    assert not any("relu" in line for line in lines)


def test_cpu_ratios_divide_medians_by_the_non_private_median():
    line = bench.cpu_ratios({"non-private": [0.010, 0.020, 0.030], "ghost": [0.033, 0.026, 0.900]})
    assert line == "non-private 20.0 ms, ghost 33.0 ms (1.65)"


def test_profiled_ops_sees_a_matmul_on_the_cpu():
    a = torch.randn(64, 64)
    ops, total = bench.profiled_ops(lambda: a @ a, torch.device("cpu"))
    assert total > 0 and any("mm" in k for k in ops)


def test_every_backend_steps_the_same_records_with_k_rows_each(one_torch_thread, monkeypatch):
    """--multiplicity 2: every private step (opacus hooks and functorch, torch.func, ghost with and without dpgen's CPU
    kernel) runs on records of two rows, the ghost step clips what torch.func clips (same per-record gradients,
    before the noise), and ghost-plain's clipper never calls the kernel."""
    torch.manual_seed(0)
    net, batch = bench.feta_unet(3, 4, k=2)
    assert batch[0].shape[0] == 6 and torch.equal(batch[0][0], batch[0][1]), "a record's rows share its image"
    steps = bench.make_steps(net, batch)
    assert set(steps) == {"non-private", "hooks", "functorch", "torch.func", "ghost", "ghost-plain"}
    for step in steps.values():
        step()
    names, params, _, one_loss = bench.functional_copy(net)
    grads = torch.func.vmap(torch.func.grad(one_loss), in_dims=(None,) + (0,) * 4)(
        {n: p.detach() for n, p in zip(names, params)}, *bench.records_of(batch, 2))
    rec = bench.GhostClipper(net.net).record(lambda: net.records(*batch))
    ref = torch.sqrt(sum(grads[n].flatten(1).pow(2).sum(1) for n in names))
    torch.testing.assert_close(rec.norms, ref, rtol=1e-5, atol=0)
    assert set(bench.make_steps(net, batch, backends=("ghost",))) == {"non-private", "ghost"}
    calls = []
    monkeypatch.setattr(ghost_kernel, "conv_record_grads", lambda *a, **k: calls.append(a))
    bench.make_steps(net, batch, backends=("ghost-plain",))["ghost-plain"]()
    assert calls == []


def test_faults_prints_each_steps_minor_page_faults(monkeypatch, capsys, one_torch_thread):
    """Both steps run with host memory kept as a training run keeps it (dpgen.core.host), unless --malloc system."""
    kept = []
    monkeypatch.setattr(bench, "keep_freed_memory", lambda: kept.append(1) or True)
    argv = ["dpsgd_overhead.py", "--nets", "dpgan_D", "--batch", "4", "--reps", "2", "--backends", "ghost", "--faults"]
    for extra, said in (([], "host memory kept"), (["--malloc", "system"], "host memory glibc defaults")):
        monkeypatch.setattr("sys.argv", argv + extra)
        bench.main()
        out = capsys.readouterr().out
        line = next(l for l in out.splitlines() if "minor page faults per step" in l)
        assert "non-private " in line and "ghost " in line and said in out.splitlines()[0]
    assert kept == [1]


def test_ghost_memory_measures_a_steps_peak_above_the_start(one_torch_thread):
    spec = importlib.util.spec_from_file_location("ghost_memory", Path(__file__).parents[1] / "bench" / "ghost_memory.py")
    mem = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mem)
    r = mem.measure("feta_unet", batch=2, k=3, unet="quick", reps=1)
    assert r["rows"] == 6 and r["peak_mib"] >= r["before_mib"] > 0 and r["step_mib"] >= 0


def test_width_builds_the_network_at_that_width(monkeypatch, capsys, one_torch_thread):
    """--width 64: dpgan's D at the paper profile's d_width (244,609 parameters against the quick 67,009)."""
    for width, params in ((None, 67009), (64, 244609)):
        argv = ["dpsgd_overhead.py", "--nets", "dpgan_D", "--batch", "2", "--reps", "1", "--backends", "ghost"]
        monkeypatch.setattr("sys.argv", argv + ([] if width is None else ["--width", str(width)]))
        bench.main()
        row = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("dpgan_D "))
        assert row.split()[1] == str(params)


def test_ghost_kernel_bench_times_every_way_on_each_of_ds_convolutions(monkeypatch, capsys, one_torch_thread):
    spec = importlib.util.spec_from_file_location("ghost_kernel_bench", Path(__file__).parents[1] / "bench" / "ghost_kernel.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr("sys.argv", ["ghost_kernel.py", "--batch", "3", "--reps", "2", "--width", "8"])
    mod.main()
    lines = [l for l in capsys.readouterr().out.splitlines() if "->" in l]
    assert [l.split(":")[0].split("(")[0].split() for l in lines] == [["1", "->", "8"], ["8", "->", "16"], ["16", "->", "16"]]
    ways = ["patches", "grouped", "wgrad"] + (["kernel", "GFLOP/s"] if ghost_kernel.available() else [])
    assert all(w in l for l in lines for w in ways)
