"""The GS-WGAN family's canary hook (dpgen.audit.hooks.SanitizerCanaries) in the gradient sanitisers.

* canaries live on extra rows of each sampled member's release, b entries each in their partition's column (b so
  that a canary moves its release by the sensitivity a record is charged for: 4B, efsgd 4B(1 + C2/C1)²): before
  the clip a Dirac row of norm DIRAC_NORM·C, after it C on each entry; the image rows are
  untouched, one noise draw covers every row, only the B image rows go on to G, and the score reads the canary's
  own entries, whichever partitions were drawn; several sampled partitions each bring their own canaries;
* efsgd: the extra rows are clipped to C1 like the image rows but take no error feedback;
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


def entries(ch: SanitizerCanaries, j: int) -> list[tuple[int, int]]:
    """(extra row, column) of canary j's entries."""
    w = ch.width
    return [(int(e) // w, int(e) % w) for e in ch.entries[j]]


def test_a_canary_owns_its_extra_rows_is_clipped_noised_and_scored():
    """K=3 partitions, B=2 rows, w=4 columns, m=6 canaries: partition 1 holds canaries 1 (slot 0) and 4 (slot 1);
    1 is included, 4 not. A canary owns b = 4B = 8 rows (C·√8 = 2C·√2, a record's sensitivity): E = 2 slots x 8."""
    c = canaries_with([1, 1, 1, 0, 0, 1])
    clip = 0.5
    san = Sanitizer(clip, 0.0, secret_generator("cpu", seed=4))
    group = SanitizerCanaries.attach(c, 3, 2, 1 / 3, {"sanitizer": san, "off": None})
    ch = c.channels["sanitizer"]
    assert list(c.channels) == ["sanitizer"] and san.audit is ch
    per = ch.per
    assert per == 8 and ch.shift == pytest.approx(clip * math.sqrt(per))
    assert ch.sensitivity == pytest.approx(2 * clip * math.sqrt(2)) and ch.strength == pytest.approx(1.0)
    assert ch.strength <= 1.0
    g = torch.randn(2, 1, 2, 2) * 0.01  # inside the clip ball: unchanged
    group.start_iteration(torch.tensor([1]))
    out = san.sanitize(g)
    rel = san.last_release
    assert ch.extra == 2 * ch.per and rel.shape == (2 + ch.extra, 4)
    assert torch.equal(rel[:2], g.reshape(2, 4))  # the image rows are untouched by the canaries
    assert torch.equal(out, g / 2)  # only the image rows go on to G, ÷B
    for r, col in entries(ch, 1):
        assert col == 1 and rel[2 + r, col] == pytest.approx(clip, rel=1e-6)  # clipped to C on each entry
    assert sum(float(rel[2 + r, col]) for r, col in entries(ch, 4)) == 0.0  # canary 4 is out
    assert float(rel[2:].abs().sum()) == pytest.approx(ch.per * clip, rel=1e-6)  # nothing else
    assert (san.last_clipped.norm(dim=1) <= clip * (1 + 1e-6)).all()
    # another partition: canary 1's entries are read again (noise only in a noisy run), whatever k was
    group.start_iteration(torch.tensor([2]))
    san.sanitize(g)
    assert sum(float(san.last_release[2 + r, col]) for r, col in entries(ch, 1)) == 0.0
    assert sum(float(san.last_release[2 + r, col]) for r, col in entries(ch, 2)) == pytest.approx(per * clip)
    c.finish()
    assert ch.releases == 2 and c.scores_host()[1] > c.scores_host()[4]


def test_the_noise_draw_covers_the_extra_rows():
    c = canaries_with([0] * 6)
    san = Sanitizer(0.5, 2.0, secret_generator("cpu", seed=4))
    SanitizerCanaries.attach(c, 3, 2, 1 / 3, {"sanitizer": san}).start_iteration(torch.tensor([0]))
    san.sanitize(torch.zeros(2, 1, 2, 2))
    expected = gaussian_noise((2 + 2 * c.channels["sanitizer"].per, 4), san.noise_std, secret_generator("cpu", seed=4))
    assert torch.equal(san.last_release, expected)


def test_error_feedback_skips_the_canary_rows():
    """efsgd: the extra rows are clipped to C1 (so a missing clip shows) but take no error feedback, and the error
    states keep the image rows' shape."""
    c = canaries_with([1, 0])
    san = ErrorFeedbackSanitizer(0.5, 0.0, 1.0, generator=secret_generator("cpu", seed=4), parts=2, classes=1)
    group = SanitizerCanaries.attach(c, 2, 1, 0.5, {"sanitizer.d": san})
    ch = c.channels["sanitizer.d"]
    assert ch.sensitivity == pytest.approx(san.sensitivity)  # 2(C1 + C2) per row, B = 1
    assert ch.per == 36 and ch.strength == pytest.approx(1.0)  # (2(0.5 + 1) / 0.5)² rows of C1: C1·6 = 2(C1 + C2)
    y, g = torch.zeros(1, dtype=torch.long), torch.zeros(1, 1, 2, 2)
    for _ in range(2):
        group.start_iteration(torch.tensor([0]))
        san.key = (torch.tensor([0]), y)
        san.sanitize(g)
    assert san.error.shape == (2, 1, 4)
    assert torch.equal(san.error, torch.zeros_like(san.error))  # nothing fed back: the image rows had no residual
    for r, col in entries(ch, 0):
        assert san.last_release[1 + r, col] == pytest.approx(0.5, rel=1e-5)  # clip(g, C1) only


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
    partitions its entries in its own member's extra rows; each row is clipped alone and the members' rows are
    summed per row index; partition 1's canaries stay at 0."""
    c = canaries_with([1, 1, 1, 1, 1, 1])
    clip = 0.5
    san = Sanitizer(clip, 0.0, secret_generator("cpu", seed=4))
    group = SanitizerCanaries.attach(c, 3, 2, 2 / 3, {"sanitizer": san})
    ch = c.channels["sanitizer"]
    g = torch.randn(2, 2, 1, 2, 2) * 0.01  # [M=2 members, B=2 rows, image]
    group.start_iteration(torch.tensor([0, 2]))
    san.sanitize_sum(g, scale=2.0)
    rel = san.last_release
    assert rel.shape == (2 + ch.extra, 4) and san.last_clipped.shape == (2 * (2 + ch.extra), 4)
    for j in (0, 2, 3, 5):
        assert sum(float(rel[2 + r, col]) for r, col in entries(ch, j)) == pytest.approx(ch.per * clip)
    for j in (1, 4):
        assert sum(float(rel[2 + r, col]) for r, col in entries(ch, j)) == 0.0
    assert (san.last_clipped.norm(dim=1) <= clip * (1 + 1e-6)).all(), "every member's row is clipped alone"
    group.start_iteration(torch.tensor([], dtype=torch.long))  # nothing drawn: the noise alone
    san.sanitize_sum(g[:0], scale=2.0)
    assert san.last_release.shape == (2 + ch.extra, 4) and san.last_release.abs().sum() == 0  # no noise here


def test_wide_partition_counts_use_several_column_blocks():
    """K > w: partitions k and k + w share a column in different row blocks; every canary has entries of its
    own."""
    c = canaries_with([1] * 10)
    san = Sanitizer(0.5, 0.0, secret_generator("cpu", seed=4))
    group = SanitizerCanaries.attach(c, 10, 1, 0.5, {"sanitizer": san})
    group.start_iteration(torch.tensor([0, 4]))
    san.sanitize_sum(torch.zeros(2, 1, 1, 2, 2), scale=1.0)
    ch = c.channels["sanitizer"]
    assert ch.extra == 3 * ch.per  # ceil(10 / 4) blocks of one slot
    positions = {p for j in range(10) for p in entries(ch, j)}
    assert len(positions) == 10 * ch.per


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
