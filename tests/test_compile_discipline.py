"""Device discipline of ``compile=true``'s code paths (the rules of tests/test_device_discipline.py).

The torch/dispatch modes of ``tests/discipline.py`` cannot watch inside an inductor graph, so here
``torch.compile`` is the identity: everything ``compile=true`` adds around the graphs runs and is watched (the
bucket padding, the weights, dpgan's torch.func per-sample gradients handed to opacus, the generator's draws
outside its loss). Inside a compiled graph there is no host sync by construction: a sync would break the graph,
and tests/test_compile.py::test_no_graph_break_inside_the_hot_steps finds none.
"""
from __future__ import annotations

import pytest
import torch

from discipline import check_method
from dpgen.core.compile import compiling

from test_device_discipline import CASES, SYNC_BUDGET


@pytest.mark.parametrize("case", ["dpgan", "feta", "dpdm"])
def test_compile_true_keeps_the_device_discipline(case, tmp_path, monkeypatch, one_torch_thread):
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    method, stop_after, overrides, _ = CASES[case]
    with compiling(True):
        report = check_method(method, tmp_path, stop_after, *overrides)
    print("\n" + report.table())
    assert report.steps and report.restored is not None
    assert not report.problems(SYNC_BUDGET[method]), report.table()
