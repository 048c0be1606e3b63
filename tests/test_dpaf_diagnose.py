"""docs/methods.md's explanation of the paper variant, measured: with Algorithm 1's batch-coupled losses each
per-sample gradient of conv2* is a fraction ≈ 1/B of the sound variant's, and its signal/noise collapses."""
from __future__ import annotations

from tiny import TINY


def test_paper_per_sample_gradients_are_a_batch_fraction_of_sound(tmp_path, one_torch_thread):
    from dpgen.dpaf.diagnose import measure

    over = [*TINY["dpaf"], "dpaf.d_epochs=1"]
    paper = measure("paper", 10, "digits", 3, str(tmp_path / "data"), over)
    sound = measure("sound", 10, "digits", 3, str(tmp_path / "data"), over)
    assert paper["gnorm_d2"] < sound["gnorm_d2"] / 8, (paper, sound)  # B = 64 samples share each aggregate
    assert paper["snr_d2"] < sound["snr_d2"] / 4, (paper, sound)
    assert paper["gnorm_c"] < sound["gnorm_c"] / 8, (paper, sound)
