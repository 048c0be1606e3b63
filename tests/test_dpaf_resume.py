"""DPAF resume: a run interrupted by debug.stop_after and resumed ends with the uninterrupted run's
generator weights and ledger, whether it stops inside phase 1, at the phase boundary or inside phase 2."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from dpgen.core.run import Run, TrainingInterrupted
from dpgen.data.base import ImageDataset, Split
from dpgen.privacy import PrivacyLedger

# t1 = ceil(0.3 * 400 / 40) = 3 phase-1 steps, then ceil(0.5 * 400 / (4 * 8)) = 7 groups: 10 steps in all
HP = {"layers": None, "width": 4, "fc_hidden": 8, "activation": "lrelu", "conv1": "transfer",
      "split": [0.1, None, 0.1], "split_unit": "eps", "batch_size": 8, "c_batch_size": 40, "mu": 4, "n_critic": 2,
      "c_epochs": 0.3, "d_epochs": 0.5, "clip_c": 1.0, "clip_d": 1.0, "gc_keep": 0.9, "sin_eps": 1e-5,
      "lr_c": 2e-4, "lr_d": 2e-4, "lr_g": 2e-4, "betas": [0.5, 0.999], "z_dim": 8, "g_width": 8, "mode_seeking": 0.02}


#: the uninterrupted and the interrupted run draw the same secret randomness (only privacy.noise_seed allows that)
NOISE_SEED = 5


def _data() -> ImageDataset:
    rng = np.random.default_rng(0)
    split = Split(rng.integers(0, 256, (400, 1, 28, 28), dtype=np.uint8), rng.integers(0, 3, 400).astype(np.int64))
    return ImageDataset("toy", split, split, ["a", "b", "c"])


def _train(run_dir, stop_after=None, resume=False, noise_seed=None):
    from dpgen.dpaf import train

    torch.manual_seed(0)  # as the pipeline's seed_everything
    ledger = PrivacyLedger(delta=1e-3, target_epsilon=5.0)
    run = Run(run_dir, ledger, torch.device("cpu"), 0, {"toy": 1}, checkpoint_every=100, stop_after=stop_after,
              resume=resume, progress=False, tensorboard=False, noise_seed=noise_seed)
    # Bit-exact comparison needs the same intra-op thread count in every run (float sums are split by thread).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = train(OmegaConf.create(HP), _data(), ledger, run)
    finally:
        run.close()
        torch.set_num_threads(threads)
    return gen, ledger


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("full"), noise_seed=NOISE_SEED)


@pytest.mark.parametrize("stop", [2, 3, 5])  # inside phase 1, its last step, inside phase 2
def test_resume_matches_uninterrupted_run(tmp_path, uninterrupted, stop):
    full_gen, full_ledger = uninterrupted
    with pytest.raises(TrainingInterrupted):
        _train(tmp_path, stop_after=stop, noise_seed=NOISE_SEED)
    assert (tmp_path / "checkpoints" / "last.pt").is_file()
    gen, ledger = _train(tmp_path, resume=True)  # no noise_seed: the secret streams come back from the checkpoint
    assert [e.to_dict() for e in ledger.entries] == [e.to_dict() for e in full_ledger.entries]
    assert ledger.epsilon() == pytest.approx(full_ledger.epsilon(), rel=1e-12)
    ref = full_gen.state_dict()
    for k, v in gen.state_dict().items():
        torch.testing.assert_close(v, ref[k], rtol=0, atol=0, msg=f"generator weight {k} differs")
