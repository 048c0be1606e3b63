"""The GS-WGAN family's canary hook (dpgen.audit.hooks.SanitizerCanaries) in the gradient sanitisers.

* one included canary per partition and generated-sample row enters the sanitiser's rows, before the clip, as a
  Dirac column of its own; after the clip it adds C to that one row, the noise draw covers its column, only the
  image columns go on to G, and the score reads the released column of the canary's (public) row; with several
  sampled partitions each canary enters its own member's rows, which are clipped apart and then summed;
* m > K·B canaries are refused;
* a run without an audit releases exactly what it did before the hook existed: the trained generator is
  bit-for-bit that of the sanitisers' pre-audit code (kept verbatim below).

The audits themselves (ε_lb below the claimed ε, power at ε = ∞, coins, device discipline, the mutants that remove
the sanitiser's noise or clip) are tests/test_audit.py's, parametrised over every hooked method.
"""
from __future__ import annotations

import pytest
import torch

from dpgen.audit.canaries import Canaries
from dpgen.audit.hooks import DIRAC_NORM, SanitizerCanaries
from dpgen.core.precision import at_least_fp32, full_precision
from dpgen.gswgan.sanitizer import Sanitizer
from dpgen.efsgd.sanitizer import ErrorFeedbackSanitizer
from dpgen.errors import DpgenError
from dpgen.privacy import clip_rows
from dpgen.privacy.randomness import gaussian_noise, secret_generator


def canaries_with(coins: list[int]) -> Canaries:
    c = Canaries(len(coins), lambda name: secret_generator("cpu", seed=3), "cpu")
    c.included = torch.tensor(coins, dtype=torch.bool)
    c.members = c.included.nonzero().squeeze(1)
    return c


def test_a_canary_is_one_dirac_row_of_its_partition_clipped_noised_and_scored():
    """K=3 partitions, B=2 rows, m=6: partition 1 holds canaries 1 (row 0) and 4 (row 1); 1 is included, 4 not."""
    c = canaries_with([1, 1, 1, 0, 0, 1])
    clip = 0.5
    san = Sanitizer(clip, 0.0, secret_generator("cpu", seed=4))
    group = SanitizerCanaries.attach(c, 3, 2, {"sanitizer": san, "off": None})
    assert list(c.channels) == ["sanitizer"] and san.audit is group.channels[0]
    g = torch.randn(2, 1, 2, 2) * 0.01  # inside the clip ball: unchanged without a canary
    group.start_iteration(torch.tensor([1]))
    out = san.sanitize(g)
    rel = san.last_release
    assert rel.shape == (2, 4 + 6)
    ext0 = torch.cat([g[0].flatten(), torch.tensor([0.0, DIRAC_NORM * clip, 0, 0, 0, 0])])
    assert torch.allclose(rel[0], ext0 * clip / ext0.norm())  # row 0 clipped with its canary: norm C
    assert rel[0, 4 + 1] == pytest.approx(clip, rel=1e-6)
    assert torch.equal(rel[1, 4:], torch.zeros(6))  # canary 4 is out: its row carries no canary
    assert torch.allclose(rel[1, :4], g[1].flatten())
    assert torch.equal(out, rel[:, :4].reshape(g.shape) / 2)  # only the image columns go on to G, ÷B
    scores = c.channels["sanitizer"].scores
    assert scores[1] > 0 and torch.count_nonzero(scores) == 1
    # another partition: canary 1's column is read again (noise only in a noisy run), whatever k was
    group.start_iteration(torch.tensor([2]))
    san.sanitize(g)
    assert san.last_release[0, 4 + 2] == pytest.approx(clip, rel=1e-6) and c.channels["sanitizer"].releases == 2


def test_the_noise_draw_covers_the_canary_columns():
    c = canaries_with([0] * 6)
    san = Sanitizer(0.5, 2.0, secret_generator("cpu", seed=4))
    SanitizerCanaries.attach(c, 3, 2, {"sanitizer": san}).start_iteration(torch.tensor([0]))
    san.sanitize(torch.zeros(2, 1, 2, 2))
    expected = gaussian_noise((2, 10), san.noise_std, secret_generator("cpu", seed=4))
    assert torch.equal(san.last_release, expected)


def test_error_feedback_carries_the_canary_columns():
    """efsgd: the error state spans the canary columns, so an included canary's residual is fed back (clipped to C2)
    at the next iteration of its partition."""
    c = canaries_with([1, 0])
    san = ErrorFeedbackSanitizer(0.5, 0.0, 1.0, generator=secret_generator("cpu", seed=4), parts=2, classes=1)
    group = SanitizerCanaries.attach(c, 2, 1, {"sanitizer.d": san})
    y, g = torch.zeros(1, dtype=torch.long), torch.zeros(1, 1, 2, 2)
    for _ in range(2):
        group.start_iteration(torch.tensor([0]))
        san.key = (torch.tensor([0]), y)
        san.sanitize(g)
    assert san.error.shape == (2, 1, 4 + 2)
    assert san.last_release[0, 4] == pytest.approx(0.5 + 1.0, rel=1e-5)  # clip(g, C1) + clip(e, C2)
    assert torch.equal(san.error[1], torch.zeros(1, 6))  # partition 1's state never saw the canary


def test_more_canaries_than_partitions_times_rows_are_refused():
    c = canaries_with([1] * 7)
    with pytest.raises(DpgenError, match=r"audit.canaries=7 must be <= K\*B = 3\*2 = 6"):
        SanitizerCanaries(c, "sanitizer", 3, 2, 0.5, 1.0)


def test_canaries_of_several_sampled_partitions_enter_their_own_members_rows():
    """Poisson sampling: an iteration that drew partitions 0 and 2 (K=3, B=2) gives each included canary a Dirac
    column in its own member's row only; each row is clipped alone, the members' rows are summed per image, and
    the score reads canary j's column in row j // K, whichever members were drawn."""
    c = canaries_with([1, 1, 1, 1, 1, 1])
    clip = 0.5
    san = Sanitizer(clip, 0.0, secret_generator("cpu", seed=4))
    group = SanitizerCanaries.attach(c, 3, 2, {"sanitizer": san})
    g = torch.randn(2, 2, 1, 2, 2) * 0.01  # [M=2 members, B=2 rows, image]
    group.start_iteration(torch.tensor([0, 2]))
    san.sanitize_sum(g, scale=2.0)
    rel = san.last_release
    assert rel.shape == (2, 4 + 6) and san.last_clipped.shape == (4, 4 + 6)
    # canaries of partition 0 (0 in row 0, 3 in row 1) and 2 (2 in row 0, 5 in row 1): each adds C, once
    for j in (0, 2, 3, 5):
        assert rel[j // 3, 4 + j] == pytest.approx(clip, rel=1e-6)
    assert rel[:, 4 + 1].abs().sum() == 0 and rel[:, 4 + 4].abs().sum() == 0  # partition 1 was not drawn
    assert (san.last_clipped.norm(dim=1) <= clip * (1 + 1e-6)).all(), "every member's row is clipped alone"
    group.start_iteration(torch.tensor([], dtype=torch.long))  # nothing drawn: the noise alone
    san.sanitize_sum(g[:0], scale=2.0)
    assert san.last_release.shape == (2, 10) and san.last_release.abs().sum() == 0  # no noise in this test


# ---- a run without an audit: the pre-audit sanitisers, verbatim ------------------------------------------------

def sanitize_before_audit(self, g: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    dtype, (m, b), shape = g.dtype, g.shape[:2], g.shape[2:]
    with full_precision():
        g = at_least_fp32(g).reshape(m * b, *shape)
        rows = g if self.basis is None else g.flatten(1) @ self.basis
        self.last_norms = rows.detach().flatten(1).norm(dim=1)
        clipped = clip_rows(rows, self.clip)
        signal = clipped.reshape(m, b, *rows.shape[1:]).sum(0)
        noise = gaussian_noise(signal.shape, self.noise_std, self.generator, device=g.device, dtype=g.dtype,
                               mechanism="sanitizer noise")
        release = signal + noise
        self.last_clipped, self.last_signal = clipped.detach(), signal.detach()
        self.last_release = release.detach()
        self.calls += 1
        if self.basis is not None:
            release = release @ self.basis.T
        return (release.reshape(b, *shape) / (float(scale) * b)).to(dtype)


def ef_sanitize_before_audit(self, g: torch.Tensor, k, y, scale: float = 1.0) -> torch.Tensor:
    dtype, (m, b), shape = g.dtype, g.shape[:2], g.shape[2:]
    with full_precision():
        g = at_least_fp32(g)
        v = self.update_members(g, k, y).sum(0)
        noise = gaussian_noise(v.shape, self.noise_std, self.generator, device=g.device, dtype=g.dtype,
                               mechanism="error-feedback sanitizer noise")
        self.last_signal, self.last_release = v.detach(), (v + noise).detach()
        self.calls += 1
        return (self.weight * (v + noise).reshape(b, *shape) / (float(scale) * b)).to(dtype)


@pytest.mark.parametrize("method,extra", [("gswgan", ()), ("dpac", ("dpac.sanitize=per_path",)), ("efsgd", ()),
                                          ("gswgan", ("gswgan.partitions_per_iter=2",))])
def test_a_run_without_audit_releases_what_it_did_before_the_hook(method, extra, tmp_path, monkeypatch):
    from tiny import train_in_memory

    gen, _, run = train_in_memory(method, tmp_path / "now", *extra, eps=2.0, noise_seed=0)
    assert run.audit is None
    monkeypatch.setattr(Sanitizer, "sanitize_sum", sanitize_before_audit)
    monkeypatch.setattr(ErrorFeedbackSanitizer, "sanitize_sum", ef_sanitize_before_audit)
    ref, _, _ = train_in_memory(method, tmp_path / "before", *extra, eps=2.0, noise_seed=0)
    now, before = gen.state_dict(), ref.state_dict()
    assert now.keys() == before.keys()
    for name in now:
        assert torch.equal(now[name], before[name]), name
