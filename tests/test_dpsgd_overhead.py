"""bench/dpsgd_overhead.py's --kernels: the operators a private step adds, ranked by the growth of their self time."""
import importlib.util
from pathlib import Path

import torch

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


def test_profiled_ops_sees_a_matmul_on_the_cpu():
    a = torch.randn(64, 64)
    ops, total = bench.profiled_ops(lambda: a @ a, torch.device("cpu"))
    assert total > 0 and any("mm" in k for k in ops)
