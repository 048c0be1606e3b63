"""The GS-WGAN family's canary hook (dpgen.audit.hooks.SanitizerCanaries) in the gradient sanitisers.

* canaries live on canary rows of each sampled member, b each (b so that a canary moves its release by the
  sensitivity a record is charged for: 4B, efsgd 4B(1 + C2/C1)²): before the clip DIRAC_NORM·C, after it C on each
  row; the image rows are untouched, the canary rows get a noise draw of their own at the same std, only the B
  image rows go on to G, and the score reads the canary's own positions, whichever partitions were drawn; several
  sampled partitions each bring their own canaries;
* efsgd: the canary rows are clipped to C1 like the image rows but take no error feedback;
* more than K·⌊256·B / b⌋ canaries are refused; a canary moves its release by what a record may, never more;
* a run without an audit releases exactly what it did before the hook existed: the trained generator is
  bit-for-bit that of the sanitisers' pre-audit code (kept verbatim below).

The audits themselves (ε_lb below the claimed ε, power at ε = ∞, coins, device discipline, the mutants that remove
the sanitiser's noise or clip, half its noise) are tests/test_audit.py's, parametrised over every hooked method.
"""
from __future__ import annotations

import math

import pytest
import torch

from dpgen.audit.canaries import Canaries
from dpgen.audit.hooks import DIRAC_NORM, SanitizerCanaries, max_sanitizer_canaries, sanitizer_rows_per_canary
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


def recorder(ch: SanitizerCanaries) -> list[torch.Tensor]:
    """The canary releases ``ch`` scores, in order."""
    seen, score = [], ch.release

    def release(released: torch.Tensor) -> None:
        seen.append(released.detach().clone())
        score(released)
    ch.release = release
    return seen


def test_a_canary_owns_its_rows_is_clipped_noised_and_scored():
    """K=3 partitions, B=2 rows, m=6 canaries: partition 1 holds canaries 1 (slot 0) and 4 (slot 1); 1 is included,
    4 not. A canary owns b = 4B = 8 rows (C·√8 = 2C·√2, a record's sensitivity): P = K·S·b = 3·2·8 positions."""
    c = canaries_with([1, 1, 1, 0, 0, 1])
    clip = 0.5
    san = Sanitizer(clip, 0.0, secret_generator("cpu", seed=4))
    group = SanitizerCanaries.attach(c, 3, 2, 1 / 3, {"sanitizer": san, "off": None})
    ch = c.channels["sanitizer"]
    assert list(c.channels) == ["sanitizer"] and san.audit is ch
    per = ch.per
    assert per == 8 and ch.shift == pytest.approx(clip * math.sqrt(per))
    assert ch.sensitivity == pytest.approx(2 * clip * math.sqrt(2)) and ch.strength == pytest.approx(1.0)
    assert ch.strength <= 1.0 and ch.size == 3 * 2 * per and ch.rows_per_member == 2 * per
    seen = recorder(ch)
    g = torch.randn(2, 1, 2, 2) * 0.01  # inside the clip ball: unchanged
    group.start_iteration(torch.tensor([1]))
    out = san.sanitize(g)
    assert torch.equal(san.last_release, g)  # the image release: its rows alone, untouched
    assert torch.equal(out, g / 2)  # only the image rows go on to G, ÷B
    assert san.last_clipped.shape == g.shape  # the diagnostics hold the image rows only
    rel = seen[-1]
    assert rel.shape == (ch.size,)
    assert torch.allclose(rel[ch.entries[1]], torch.full((per,), clip), rtol=1e-6)  # clipped to C on each row
    assert float(rel[ch.entries[4]].abs().sum()) == 0.0  # canary 4 is out
    assert float(rel.abs().sum()) == pytest.approx(per * clip, rel=1e-6)  # nothing else
    # another partition: canary 1's rows are read again (noise only in a noisy run), whatever k was
    group.start_iteration(torch.tensor([2]))
    san.sanitize(g)
    assert float(seen[-1][ch.entries[1]].sum()) == 0.0
    assert float(seen[-1][ch.entries[2]].sum()) == pytest.approx(per * clip)
    c.finish()
    assert ch.releases == 2 and c.scores_host()[1] > c.scores_host()[4]


def test_the_canary_release_has_its_own_noise_draw_of_the_same_std():
    """The image release's noise, then the canary release's, from the sanitiser's secret stream at its std."""
    c = canaries_with([0] * 6)
    san = Sanitizer(0.5, 2.0, secret_generator("cpu", seed=4))
    SanitizerCanaries.attach(c, 3, 2, 1 / 3, {"sanitizer": san}).start_iteration(torch.tensor([0]))
    seen = recorder(c.channels["sanitizer"])
    san.sanitize(torch.zeros(2, 1, 2, 2))
    gen = secret_generator("cpu", seed=4)
    assert torch.equal(san.last_release, gaussian_noise((2, 1, 2, 2), san.noise_std, gen))
    assert torch.equal(seen[0], gaussian_noise((c.channels["sanitizer"].size,), san.noise_std, gen))


def test_error_feedback_skips_the_canary_rows():
    """efsgd: the canary rows are clipped to C1 like the image rows (so a missing clip shows) but take no error
    feedback, and the error states keep the image rows' shape."""
    c = canaries_with([1, 0])
    san = ErrorFeedbackSanitizer(0.5, 0.0, 1.0, generator=secret_generator("cpu", seed=4), parts=2, classes=1)
    group = SanitizerCanaries.attach(c, 2, 1, 0.5, {"sanitizer.d": san})
    ch = c.channels["sanitizer.d"]
    assert ch.sensitivity == pytest.approx(san.sensitivity)  # 2(C1 + C2) per row, B = 1
    assert ch.per == 36 and ch.strength == pytest.approx(1.0)  # (2(0.5 + 1) / 0.5)² rows of C1: C1·6 = 2(C1 + C2)
    seen = recorder(ch)
    y, g = torch.zeros(1, dtype=torch.long), torch.zeros(1, 1, 2, 2)
    for _ in range(2):
        group.start_iteration(torch.tensor([0]))
        san.key = (torch.tensor([0]), y)
        san.sanitize(g)
    assert san.error.shape == (2, 1, 1, 2, 2) and san.last_clipped.shape == (1, 1, 2, 2)
    assert torch.equal(san.error, torch.zeros_like(san.error))  # nothing fed back: the image rows had no residual
    assert torch.allclose(seen[-1][ch.entries[0]], torch.full((36,), 0.5), rtol=1e-5)  # clip(g, C1) only


def test_more_canaries_than_the_row_budget_are_refused():
    """b = 4B = 8 rows per canary (K=3, B=2): at most K·⌊256·B / b⌋ = 3·64 = 192 canaries."""
    c = canaries_with([1] * 193)
    with pytest.raises(DpgenError, match=r"audit.canaries=193 must be <= K\*\(256\*B // b\) = 3\*\(256\*2 // 8\) = 192"):
        SanitizerCanaries(c, "sanitizer", 3, 2, 0.5, 1.0, 1.0, 1 / 3)
    SanitizerCanaries(canaries_with([1] * 192), "sanitizer", 3, 2, 0.5, 1.0, 1.0, 1 / 3)


@pytest.mark.parametrize("sensitivity,clip,rows,per,strength", [
    (1.0, 0.5, 16, 64, 1.0),    # gswgan, dpac: 2C per row -> 4B rows of C
    (2.0, 0.5, 16, 256, 1.0),   # efsgd, C1 = C2 = 0.5: 2(C1 + C2) = 4·C1 -> 16B rows
    (1.3, 0.5, 3, 20, math.sqrt(20 / 20.28)),  # not a square: the largest b below the sensitivity
    (8.0, 0.5, 2, 128, math.sqrt(128 / 512)),  # beyond 64·B rows the strength falls below 1
])
def test_a_canary_takes_the_sensitivity_a_record_is_charged_for(sensitivity, clip, rows, per, strength):
    c = canaries_with([1] * 3)
    ch = SanitizerCanaries(c, "sanitizer", 3, rows, clip, 1.0, sensitivity, 1 / 3)
    assert sanitizer_rows_per_canary(sensitivity, clip, rows) == per == ch.per
    assert ch.strength == pytest.approx(strength) and ch.shift <= ch.sensitivity
    assert max_sanitizer_canaries(3, rows, per) == 3 * (256 * rows // per)


def test_canaries_of_several_sampled_partitions_enter_their_own_members_rows():
    """Poisson sampling: an iteration that drew partitions 0 and 2 (K=3, B=2) gives each included canary of those
    partitions its rows in its own member's canary rows; each row is clipped alone and the members' rows are
    summed per position; partition 1's canaries stay at 0."""
    c = canaries_with([1, 1, 1, 1, 1, 1])
    clip = 0.5
    san = Sanitizer(clip, 0.0, secret_generator("cpu", seed=4))
    group = SanitizerCanaries.attach(c, 3, 2, 2 / 3, {"sanitizer": san})
    ch = c.channels["sanitizer"]
    seen = recorder(ch)
    g = torch.randn(2, 2, 1, 2, 2) * 0.01  # [M=2 members, B=2 rows, image]
    group.start_iteration(torch.tensor([0, 2]))
    san.sanitize_sum(g, scale=2.0)
    assert san.last_release.shape == (2, 1, 2, 2) and san.last_clipped.shape == (4, 1, 2, 2)
    for j in (0, 2, 3, 5):
        assert float(seen[-1][ch.entries[j]].sum()) == pytest.approx(ch.per * clip)
    for j in (1, 4):
        assert float(seen[-1][ch.entries[j]].sum()) == 0.0
    group.start_iteration(torch.tensor([], dtype=torch.long))  # nothing drawn: the noise alone
    san.sanitize_sum(g[:0], scale=2.0)
    assert san.last_release.shape == (2, 1, 2, 2) and san.last_release.abs().sum() == 0  # no noise here
    assert seen[-1].shape == (ch.size,) and seen[-1].abs().sum() == 0


def test_every_canary_has_positions_of_its_own():
    """K = 10 partitions, m = 25 canaries (3 slots, the last partly empty): m·b distinct positions of P = K·S·b."""
    c = canaries_with([1] * 25)
    ch = SanitizerCanaries(c, "sanitizer", 10, 1, 0.5, 1.0, 1.0, 0.5)
    assert ch.slots == 3 and ch.size == 10 * 3 * ch.per
    assert len(set(ch.entries.flatten().tolist())) == 25 * ch.per
    assert int(ch.entries.max()) < ch.size


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
