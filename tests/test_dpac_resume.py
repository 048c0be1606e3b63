"""GS-WGAN/DPAC and EFSGD resume: a run stopped by debug.stop_after and resumed ends with the uninterrupted
run's released generator and ledger (the shared EnsembleSetup restores G, D, C and the RNG streams)."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from dpgen.core.run import TrainingInterrupted
from dpgen.privacy import PrivacyLedger

from conftest import in_memory_run
from test_dpac_sanitizer import TINY_HP as DPAC_HP
from test_dpac_sanitizer import _toy_data
from test_efsgd_sanitizer import TINY_HP as EFSGD_HP


def _train(method: str, run_dir, **run_kwargs):
    import dpgen.dpac
    import dpgen.efsgd

    train, hp = (dpgen.dpac.train, DPAC_HP) if method == "dpac" else (dpgen.efsgd.train, EFSGD_HP)
    torch.manual_seed(0)  # as the pipeline's seed_everything
    ledger = PrivacyLedger(delta=1e-5, target_epsilon=8.0)
    run = in_memory_run(run_dir, ledger, checkpoint_every=100, **run_kwargs)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # bit-exact comparison needs the same thread count in every run
    try:
        gen = train(OmegaConf.create(hp), _toy_data(), ledger, run)
    finally:
        run.close()
        torch.set_num_threads(threads)
    return gen, ledger


@pytest.mark.parametrize("method", ["dpac", "efsgd"])
def test_resume_matches_uninterrupted_run(tmp_path, method):
    # the same secret randomness in both runs (privacy.noise_seed); the resumed part takes it from the checkpoint
    full_gen, full_ledger = _train(method, tmp_path / "full", noise_seed=5)
    # stop after iteration 3: past t_c = 2, so the classifier (and for efsgd the error states) are restored too
    with pytest.raises(TrainingInterrupted):
        _train(method, tmp_path / "cut", stop_after=3, noise_seed=5)
    gen, ledger = _train(method, tmp_path / "cut", resume=True)
    assert [e.to_dict() for e in ledger.entries] == [e.to_dict() for e in full_ledger.entries]
    ref = full_gen.state_dict()
    for k, v in gen.state_dict().items():
        torch.testing.assert_close(v, ref[k], rtol=0, atol=0, msg=f"{method}: generator weight {k} differs")
