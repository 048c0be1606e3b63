"""What gswgan / dpac / efsgd's training loops actually pass to their mechanisms (issue 18).

SPY tests: ``train()`` runs a few tiny iterations with the mechanism entry points wrapped, and every release is
checked against the ledger entry recorded for its iteration times the stated sensitivity: each sanitiser's
noise std (its configured value AND the noise it actually added), its clip (the configured one, active), and
efsgd's released encoder code. Every record a per-member update reads (a discriminator's critic batch during
pre-training and training, C's real batches, efsgd's encoder batch) must lie in that member's partition.

GUARD tests: with σ fixed too small for the planned iterations, the run stops exactly at the last iteration
the budget allows (computed here independently from the method's ledger entries) and ε stays ≤ the target.
"""
from __future__ import annotations

import importlib
import math

import pytest
import torch

from dpgen.core.run import Run
from dpgen.data import load_dataset
from dpgen.data.partition import record_owners
from dpgen.data.torch_utils import to_float
from dpgen.privacy import clip_rows
from dpgen.privacy.ledger import compute_epsilon

from tiny import train_in_memory

K, B = 4, 8  # tiny.py's ensemble settings (num_discriminators, batch_size)
CLIP = {"gswgan": 0.01, "dpac": 0.01, "efsgd": 0.01}  # small: clipping must be active for the checks to bite
C2, CODE_CLIP = 0.02, 1.0  # efsgd's tiny error clip and the default code clip


class Spy:
    """Collects, per training iteration, what the mechanisms received and released."""

    def __init__(self, monkeypatch, data) -> None:
        self.step, self.events, self.reads, self.ledger_steps = 0, [], [], []
        self.k: list[int] = []
        self.draws: list[tuple[int, float, list[int]]] = []  # per iteration: (K, Poisson rate, sampled partitions)
        x = to_float(data.train.x)
        self.owners_of: dict[bytes, set[int]] = {}
        for row, owner in zip(x, record_owners(data.train.x, K, 0)):  # seed 0 = the run's partition key
            self.owners_of.setdefault(row.numpy().tobytes(), set()).add(int(owner))
        self._wrap(monkeypatch)

    # ---- record reads -------------------------------------------------------------------
    def check_rows(self, what: str, members: list[int], xr: torch.Tensor) -> None:
        """Every row of member m's batch xr[m] must be a record of partition members[m]."""
        for m, batch in zip(members, xr):
            for row in batch:
                owners = self.owners_of.get(row.detach().cpu().numpy().tobytes(), set())
                self.reads.append((what, m, m in owners))

    def _wrap(self, monkeypatch) -> None:
        tr = importlib.import_module("dpgen.gswgan.train")
        ef = importlib.import_module("dpgen.efsgd.train")
        dm = importlib.import_module("dpgen.dpac.method")  # DPAC's classifier phase and sanitisers
        spy = self

        orig_step = tr.critic_step

        def critic_step(stack, fwd, members, xr, *a, **kw):
            spy.check_rows("critic", members.tolist(), xr)
            return orig_step(stack, fwd, members, xr, *a, **kw)

        monkeypatch.setattr(tr, "critic_step", critic_step)
        orig_draw = tr.poisson_batch  # GS-WGAN's loop draws the partitions of all three methods

        def poisson_batch(n, q, g, device):
            k = orig_draw(n, q, g, device)
            spy.k = k.tolist()
            spy.draws.append((n, q, spy.k))
            return k

        monkeypatch.setattr(tr, "poisson_batch", poisson_batch)
        orig_uniform = tr.uniform_member

        def uniform_member(n, g, device):
            k = orig_uniform(n, g, device)
            spy.k = k.tolist()
            spy.draws.append((n, 1.0 / n, spy.k))
            return k

        monkeypatch.setattr(tr, "uniform_member", uniform_member)

        orig_clf = dm.train_classifier

        def train_classifier(clf, fake, real, *a, **kw):
            stacked = kw.get("stacked", False)

            def checked_real():
                xr, yr = real()
                spy.check_rows("classifier", spy.k, xr if stacked else xr.unsqueeze(0))
                return xr, yr
            return orig_clf(clf, fake, checked_real, *a, **kw)

        monkeypatch.setattr(dm, "train_classifier", train_classifier)

        orig_enc = ef.encoder_step

        def encoder_step(enc, k, xr, *a, **kw):
            spy.check_rows("encoder", [int(k)], xr.unsqueeze(0))
            return orig_enc(enc, k, xr, *a, **kw)

        monkeypatch.setattr(ef, "encoder_step", encoder_step)

        orig_code = ef.encoder_input

        def encoder_input(mu, y, ncls, private, code_clip, code_std, g):
            out = orig_code(mu, y, ncls, private, code_clip, code_std, g)
            raw = orig_code(mu, y, ncls, False, code_clip, code_std, g)
            noise = out - clip_rows(raw, code_clip)
            spy.events.append({"step": spy.step, "path": "code", "private": private, "clip": code_clip,
                               "std": code_std, "empirical": noise.std().item(),
                               "max_norm": clip_rows(raw, code_clip).norm(dim=1).max().item()})
            return out

        monkeypatch.setattr(ef, "encoder_input", encoder_input)

        for mod, cls_name in ((tr, "Sanitizer"), (dm, "Sanitizer"), (ef, "ErrorFeedbackSanitizer")):
            base = getattr(mod, cls_name)

            class SpySanitizer(base):
                made = 0

                def __init__(self, *a, **kw):
                    super().__init__(*a, **kw)
                    self.path = ("d", "c", "e")[SpySanitizer.made]
                    SpySanitizer.made += 1

                def sanitize_sum(self, g, *a, **kw):
                    out = super().sanitize_sum(g, *a, **kw)
                    scale = kw.get("scale", a[-1] if a else 1.0)
                    spy.events.append({
                        "step": spy.step, "path": self.path, "clip": self.clip, "std": self.noise_std,
                        "members": g.shape[0], "scale": scale,
                        "empirical": (self.last_release - self.last_signal).std().item(),
                        "max_clipped": self.last_clipped.flatten(1).norm(dim=1).max().item() if g.shape[0] else 0,
                        "summed": torch.allclose(self.last_signal, (self.last_direction if hasattr(
                            self, "last_direction") else self.last_clipped).reshape(
                            g.shape[0], g.shape[1], -1).sum(0).reshape(self.last_signal.shape), atol=1e-6),
                        "active": bool((self.last_norms > self.clip).any()),
                        "dims": self.last_release[0].numel(),
                        "error_clipped": (None if getattr(self, "last_error_clipped", None) is None else
                                          self.last_error_clipped.flatten(1).norm(dim=1).max().item())})
                    return out

            monkeypatch.setattr(mod, cls_name, SpySanitizer)

        orig_done = Run.step_done

        def step_done(run, step, *a, **kw):
            spy.ledger_steps.append([(tuple(e.noise_multipliers), e.sampling_rate, e.count)
                                     for e in run.ledger.entries])
            spy.step += 1
            return orig_done(run, step, *a, **kw)

        monkeypatch.setattr(Run, "step_done", step_done)

    def iteration_multipliers(self) -> list[tuple[tuple[float, ...], float]]:
        """The (multipliers, sampling rate) of the ledger entry each iteration added."""
        out, before = [], {}
        for snap in self.ledger_steps:
            grown = [(z, q) for z, q, c in snap if c > before.get((z, q), 0)]
            assert len(grown) == 1 and sum(c for *_, c in snap) == sum(before.values()) + 1, \
                "one ledger event per iteration"
            out.append(grown[0])
            before = {(z, q): c for z, q, c in snap}
        return out


SPY_CASES = {  # name: (method, sanitize, grad_basis, partitions per iteration m or "uniform")
    "gswgan": ("gswgan", None, None, 2),
    "gswgan_one": ("gswgan", None, None, 1),
    "dpac": ("dpac", "joint", None, 2),
    "dpac_per_path": ("dpac", "per_path", None, 2),
    "efsgd": ("efsgd", "per_path", None, 2),
    "efsgd_joint": ("efsgd", "joint", None, 2),
    "efsgd_private_uniform": ("efsgd", "per_path_private", None, "uniform"),
    "gswgan_basis": ("gswgan", None, 20, 2),
    "dpac_per_path_basis": ("dpac", "per_path", 20, 2),
}


@pytest.mark.parametrize("case", list(SPY_CASES))
def test_spy_sigma_clip_and_partition_reads_match_the_ledger(case, tmp_path, monkeypatch):
    """dpac's default (``dpac.sanitize=joint``, Eq. 9) releases one path per iteration, D's and C's gradients
    sanitised together; ``per_path`` (the official code) releases D's and, from t_c, C's apart. With
    ``dpac.grad_basis`` every release is the L clipped and noised DCT coefficients of each row, at the same
    ledger multiplier and sensitivity. Every iteration draws its partitions at the rate its ledger entry records
    (Poisson at m/K; the paper's one uniform draw, 1/K, under paper accounting), and each release is the sum of
    the sampled members' clipped rows plus ONE noise draw of the recorded std."""
    method, sanitize, basis, per_iter = SPY_CASES[case]
    data = load_dataset("digits", str(tmp_path / "data"))
    spy = Spy(monkeypatch, data)
    key = method  # each method of the family has its own block
    uniform = per_iter == "uniform"
    extra = [f"dpac.sanitize={sanitize}"] if sanitize and method == "dpac" else []
    extra += [f"{key}.grad_basis={basis}"] if basis else []
    extra += [f"{key}.sampling=uniform"] if uniform else [f"{key}.partitions_per_iter={per_iter}"]
    private = sanitize == "per_path_private"
    if method == "efsgd":  # per_path: the paper's e_d, e_c apart; joint (default): -D - λ_c·C through one sanitiser;
        # the reconstruction code: drawn from G's prior (public, the default) or the encoder's noised code (private:
        # one partition per iteration, so the paper's uniform draw under paper accounting)
        extra += [f"efsgd.sanitize={'joint' if sanitize == 'joint' else 'per_path'}"]
        extra += ["efsgd.encoder.code=private"] if private else []
    # σ fixed (no calibration: faster); the ledger and the guard treat it as any other run's
    # refresh_chunk=0 and a fixed secret draw (noise_seed) that revisits a partition within the 4 iterations, so efsgd
    # feeds an error state back
    c1 = CLIP[method] / (10 if basis else 1)  # a basis keeps part of each gradient: clipping must still bind
    _, ledger, _ = train_in_memory(method, tmp_path / "run", f"{key}.clip={c1}",
                                   f"{key}.noise_multiplier=30", f"{key}.refresh_chunk=0", *extra, data=data,
                                   noise_seed=1, accounting="paper" if uniform else "sound")
    monkeypatch.undo()
    steps = spy.iteration_multipliers()
    assert len(steps) == 4 == sum(e.count for e in ledger.entries) == len(spy.draws)

    # every record read by a per-member update lies in that member's partition
    kinds = {what for what, _, _ in spy.reads}
    assert {"critic"} <= kinds and ("classifier" in kinds) == (method != "gswgan")
    assert ("encoder" in kinds) == private
    bad = [(what, m) for what, m, ok in spy.reads if not ok]
    assert not bad, f"reads outside the member's partition: {bad[:5]}"

    sens = {"d": 2 * c1, "c": 2 * c1, "e": 2 * c1, "code": 2 * CODE_CLIP}
    if method == "efsgd":  # error feedback: a row moves by at most 2 (C1 + C2)
        sens.update(d=2 * (c1 + C2), c=2 * (c1 + C2), e=2 * (c1 + C2))
    order = {"gswgan": ["d"], "dpac": ["d"] if sanitize == "joint" else ["d", "c"],
             "efsgd": {"per_path": ["d", "c", "e"], "joint": ["d", "e"],
                       "per_path_private": ["d", "c", "e", "code"]}.get(sanitize)}[method]
    m_expected = 1 if uniform else per_iter
    for t, (multipliers, q) in enumerate(steps):
        n, rate, sampled = spy.draws[t]
        assert n == K and rate == pytest.approx(m_expected / K) and q == pytest.approx(rate), \
            "the loop samples partitions at the rate its ledger entry records"
        assert not uniform or len(sampled) == 1
        released = [e for e in spy.events if e["step"] == t]
        paths = sorted({e["path"] for e in released}, key=order.index)
        expected_paths = [p for p in order if p != "c" or t >= 2]  # tiny: the classifier starts at t_c = 2
        assert paths == expected_paths and len(multipliers) == len(paths), (t, paths, multipliers)
        # efsgd draws the noisy code twice: training E_k (encoder.steps = 1) and the release to G
        assert sum(e["path"] == "code" for e in released) == (2 if private else 0)
        z_of = dict(zip(expected_paths, multipliers))
        for e in released:
            if e["path"] != "code":
                assert e["dims"] == (basis or math.prod(data.shape)), "every pixel, or the grad_basis coefficients"
                assert e["members"] == len(sampled) and e["scale"] == m_expected and e["summed"], \
                    "one row per sampled partition, clipped, summed over them, ÷ the expected count"
            std = z_of[e["path"]] * math.sqrt(B) * sens[e["path"]]  # ledger multiplier x sqrt(B) x sensitivity
            assert e["std"] == pytest.approx(std, rel=1e-9), (t, e)
            assert e["empirical"] == pytest.approx(std, rel=0.2), f"noise actually added at step {t}: {e}"
            if e["path"] == "code":
                assert e["private"] and e["clip"] == CODE_CLIP and e["max_norm"] <= CODE_CLIP * (1 + 1e-5)
            else:
                assert e["clip"] == c1 and (e["active"] or not sampled), "the configured clip, active"
                assert e["max_clipped"] <= c1 * (1 + 1e-5)
                if method == "efsgd" and e["error_clipped"] is not None:
                    assert e["error_clipped"] <= C2 * (1 + 1e-5)
    if not uniform and per_iter > 1:
        assert any(len(d[2]) >= 2 for d in spy.draws), "setup: some iteration must sum several partitions"
    if method == "efsgd":  # the C2 check above bites only if some error state was fed back
        assert any((e.get("error_clipped") or 0) > 0 for e in spy.events), "no error state was ever fed back"


# ---- budget guard that binds ----------------------------------------------------------------

def _planned_entries(method: str, z: float, n: int, sanitize: str | None = None) -> list:
    """The method's own ledger entries for n tiny iterations at per-sample multiplier z (sound accounting)."""
    if method == "efsgd":
        from dpgen.efsgd.accounting import iteration_entries
        return iteration_entries(z, K, B, n, 2 if sanitize == "per_path" else None, True, False)  # prior code
    from dpgen.gswgan.accounting import iteration_entries
    return iteration_entries(z, K, B, n, 2 if method == "dpac" and sanitize == "per_path" else None)


@pytest.mark.parametrize("method,z,sanitize", [("gswgan", 6.0, None), ("dpac", 8.0, "per_path"), ("dpac", 6.0, "joint"),
                                               ("efsgd", 10.0, "per_path")])
def test_budget_guard_stops_at_the_last_allowed_iteration(method, z, sanitize, tmp_path):
    key = method
    target, planned = 3.0, 40
    extra = [f"{key}.sanitize={sanitize}"] if sanitize else []
    _, ledger, _ = train_in_memory(method, tmp_path, f"{key}.noise_multiplier={z}", f"{key}.iters={planned}", *extra,
                                   eps=target)
    done = sum(e.count for e in ledger.entries)
    allowed = max(n for n in range(planned + 1) if n == 0 or compute_epsilon(
        _planned_entries(method, z, n, sanitize), 1e-5) <= target)
    assert 2 < allowed < planned, "setup: the guard must bind after the classifier starts"
    assert done == allowed
    assert ledger.epsilon() <= target < compute_epsilon(_planned_entries(method, z, allowed + 1, sanitize), 1e-5)


def test_paper_budget_stops_at_the_paper_analysis_cap(tmp_path):
    from dpgen.gswgan.accounting import paper_max_iters

    _, ledger, _ = train_in_memory("gswgan", tmp_path, "gswgan.noise_multiplier=6", "gswgan.iters=40", eps=3.0,
                                   accounting="paper")
    cap = paper_max_iters(6.0, K, B, 1e-5, 3.0, 40)
    assert 0 < cap < 40 and sum(e.count for e in ledger.entries) == cap
    assert ledger.report_epsilon() <= 3.0
    # the paper's analysis extended to m partitions per iteration: m of K sampled without replacement
    _, ledger, _ = train_in_memory("gswgan", tmp_path / "m2", "gswgan.noise_multiplier=6", "gswgan.iters=40",
                                   "gswgan.partitions_per_iter=2", eps=3.0, accounting="paper")
    cap = paper_max_iters(6.0, K, B, 1e-5, 3.0, 40, per_iter=2)
    assert 0 < cap < 40 and sum(e.count for e in ledger.entries) == cap
    assert ledger.report_epsilon() <= 3.0

