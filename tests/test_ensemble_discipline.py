"""Device discipline (tests/test_device_discipline.py's harness) of the stacked ensembles under the speed switches:
``precision=bf16`` with ``ensemble.conv=batched`` adds no host sync, no factory without ``device=`` and no
global-RNG draw inside a step, for the GS-WGAN family and G-PATE (``compile`` is covered by the same code path:
it wraps the functions these runs call)."""
from __future__ import annotations

import pytest

from discipline import check_method
import dpgen.ensemble.compute as compute
from dpgen.core.precision import training_precision

from test_device_discipline import CASES, SYNC_BUDGET


@pytest.mark.parametrize("case", ["gswgan", "dpac", "gpate"])
def test_bf16_batched_ensembles_keep_the_device_discipline(case, tmp_path, monkeypatch, one_torch_thread):
    method, stop_after, overrides, _ = CASES[case]
    calls = []
    orig = compute.conv2d_unfold
    monkeypatch.setattr(compute, "conv2d_unfold", lambda *a, **kw: calls.append(1) or orig(*a, **kw))
    with training_precision("bf16", "cpu", ensemble_conv="batched"):
        report = check_method(method, tmp_path, stop_after, *overrides)
    assert calls, "the run must have used the batched layout (the test is live)"
    report.method = case
    assert report.steps and report.restored is not None, f"{case}: no training step observed"
    assert not report.problems(SYNC_BUDGET[method]), report.table()
