"""The one-run privacy audit (dpgen/audit/, scripts/audit.py).

* the bound: against scipy's binomial tail (δ = 0), a case worked by hand, the closed form of r = v, and
  monotone in the number of correct guesses;
* every hooked method, tiny size on a digits subset, fixed ``privacy.noise_seed``: at claimed ε = 2 the audit
  stays below it; at ``eps=inf`` (no noise, same clipping) it reaches ε_lb ≥ 3 (it has power). The mutants
  of tests/privacy_mutants.py that remove a mechanism's noise or clipping must fail the first test;
* the coins reach ``audit/coins.npy`` and no other file of the run;
* a run without an audit never touches the canary hooks, and the hooked mechanisms without canaries compute
  what they computed before;
* scripts/audit.py's bad-input contract (one line, exit 2, nothing written).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from dpgen.audit.bound import epsilon_lower_bound, guess_accuracy, max_epsilon_lower_bound, p_value
from dpgen.audit.canaries import Canaries, Guesses
from dpgen.privacy.randomness import secret_generator
from inprocess import call, files_in, one_error

# ---- the bound -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("r,v,eps", [(10, 7, 0.5), (100, 80, 1.0), (500, 412, 0.41), (500, 500, 3.0), (37, 1, 0.0)])
def test_p_value_without_delta_is_the_binomial_tail(r, v, eps):
    """δ = 0: the p-value is P[Binomial(r, e^ε/(1+e^ε)) ≥ v] (scipy), whatever m is."""
    p = math.exp(eps) / (1 + math.exp(eps))
    assert p_value(1000, r, v, eps, 0.0) == pytest.approx(stats.binom.sf(v - 1, r, p), rel=1e-12)


def test_p_value_worked_by_hand():
    """m = r = v = 2, ε = ln 3 (each guess right w.p. 3/4), δ = 0.01:
    f(2) = (3/4)² = 9/16; max over i of P[2 − i ≤ B < 2]/i: i = 1: P[B = 1] = 2·3/4·1/4 = 6/16,
    i = 2: (1/16 + 6/16)/2 = 7/32; so p = 9/16 + 2·2·0.01·6/16 = 0.5625 + 0.015 = 0.5775."""
    assert guess_accuracy(math.log(3)) == pytest.approx(0.75)
    assert p_value(2, 2, 2, math.log(3), 0.01) == pytest.approx(0.5775, abs=1e-12)
    assert p_value(2, 2, 2, math.log(3), 0.0) == pytest.approx(0.5625, abs=1e-12)


@pytest.mark.parametrize("r", [10, 100, 500])
def test_all_correct_without_delta_has_a_closed_form(r):
    """v = r, δ = 0: p(ε)^r = 0.05, so ε_lb = logit(0.05^(1/r)) (r = 10: 1.0519)."""
    p = 0.05 ** (1.0 / r)
    assert epsilon_lower_bound(1000, r, r, 0.0, 0.95) == pytest.approx(math.log(p / (1 - p)), abs=1e-5)
    assert epsilon_lower_bound(1000, 10, 10, 0.0) == pytest.approx(1.0519, abs=1e-4)


def test_the_bound_is_where_the_p_value_crosses_and_grows_with_correct_guesses():
    m, r, delta = 1000, 500, 1e-5
    last = -1.0
    for v in range(250, 501, 10):
        e = epsilon_lower_bound(m, r, v, delta)
        assert e >= last, f"eps_lb fell from {last} to {e} at v={v}"
        last = e
        if e > 0:
            assert p_value(m, r, v, e, delta) == pytest.approx(0.05, abs=1e-4)
            assert p_value(m, r, v, max(e - 0.01, 0.0), delta) < 0.05
    for e in (0.5, 1.0, 2.0):  # the p-value falls as more guesses are right
        ps = [p_value(m, r, v, e, delta) for v in range(0, r + 1, 25)]
        assert all(a >= b for a, b in zip(ps, ps[1:]))
    assert epsilon_lower_bound(m, r, 250, delta) == 0.0  # chance level shows nothing
    assert max_epsilon_lower_bound(m, r, delta) == pytest.approx(5.0875, abs=1e-3)  # the "about 5"
    # the delta term only lowers the bound
    assert epsilon_lower_bound(m, r, 480, 1e-3) < epsilon_lower_bound(m, r, 480, 0.0)


@pytest.mark.parametrize("args", [(10, 11, 5), (10, 5, 6), (10, 5, -1)])
def test_the_bound_refuses_impossible_counts(args):
    with pytest.raises(ValueError):
        p_value(*args, 1.0, 1e-5)


def test_guesses_rank_scores_and_break_ties_by_index():
    scores = np.array([0.0, 3.0, 0.0, 2.0, 0.0, 1.0])
    coins = np.array([0, 1, 1, 1, 0, 0])
    g = Guesses.from_scores(scores, coins, k_in=2, k_out=2)  # in: 1, 3 (right); out: 0, 2 (0 right, 2 wrong)
    assert (g.correct_in, g.correct_out, g.correct, g.guesses) == (2, 1, 3, 4)


def test_coins_are_fair_and_secret():
    c1 = Canaries(4000, lambda name: secret_generator("cpu", seed=1), "cpu")
    c2 = Canaries(4000, lambda name: secret_generator("cpu", seed=2), "cpu")
    assert 1800 < c1.num_included < 2200
    assert not torch.equal(c1.included, c2.included)
    with pytest.raises(Exception, match="secret"):
        Canaries(10, lambda name: torch.Generator(), "cpu")


# ---- every hooked method ---------------------------------------------------------------------------------

#: tiny audits on the first 300 digits: batches of half the data and enough steps that an included canary is
#: sampled (q·T ≥ 6), so the audit has power; each run takes seconds
_GSWGAN_AUDIT = ["iters=24", "num_discriminators=4", "partitions_per_iter=1", "pretrain_iters=2", "pretrain_chunk=4",
                 "critic_iters=1", "batch_size=16", "g_width=8", "d_width=4"]
_ENSEMBLE_AUDIT = _GSWGAN_AUDIT + ["classifier.start=2", "classifier.n_fake=1", "classifier.n_real=1",
                                   "classifier.fake_batch=10"]
_ENSEMBLE_CANARIES = ["audit.canaries=256", "audit.guesses=64"]
AUDIT_TINY: dict[str, list[str]] = {
    "dpgan": ["dpgan.iters=12", "dpgan.batch_size=150", "dpgan.g_width=8", "dpgan.d_width=8"],
    "feta": ["feta.iters=12", "feta.batch_size=150", "feta.multiplicity=1", "feta.micro_batch=150",
             "feta.unet.nf=4", "feta.sampler.steps=2", "feta.warmup_iters=2", "feta.num_central=10",
             "feta.central_batch=100"],
    "dpdm": ["feta.iters=12", "feta.batch_size=150", "feta.multiplicity=1", "feta.micro_batch=150",
             "feta.unet.nf=4", "feta.sampler.steps=2"],
    "gpate": ["gpate.teachers=6", "gpate.iters=3", "gpate.batch_size=4", "gpate.proj_dim=3",
              "gpate.teacher_warmup=1", "gpate.gf_dim=4", "gpate.gfc_dim=16", "gpate.df_dim=4", "gpate.dfc_dim=8"],
    "dpaf": ["dpaf.width=4", "dpaf.fc_hidden=8", "dpaf.g_width=8", "dpaf.batch_size=16", "dpaf.c_batch_size=150",
             "dpaf.c_epochs=1", "dpaf.d_epochs=4", "audit.canaries=1000", "audit.guesses=100"],  # 10,000: 3x slower
    # the GS-WGAN family: K=4 partitions drawn T=24 times (each ~6 times), B=16 rows, m=256 canaries of b = 4B = 64
    # rows each (K·⌊256·B / b⌋ = 256) and 64 + 64 guesses: eps_lb ~3.4 when all are right, with the 5 % split
    # among efsgd's four tests. efsgd's canaries take b = 16B rows (2(C1 + C2) = 4·C1 per row), so 256 of them
    # need K=16 partitions (4 drawn per iteration: each still ~6 times)
    "gswgan": [f"gswgan.{o}" for o in _GSWGAN_AUDIT] + _ENSEMBLE_CANARIES,
    "dpac": [f"dpac.{o}" for o in _ENSEMBLE_AUDIT] + ["dpac.sanitize=per_path"] + _ENSEMBLE_CANARIES,
    "efsgd": [f"efsgd.{o}" for o in _ENSEMBLE_AUDIT] + ["efsgd.encoder.width=4", "efsgd.encoder.steps=1",
                                                       "efsgd.num_discriminators=16", "efsgd.partitions_per_iter=4",
                                                       "efsgd.pretrain_chunk=16", "efsgd.batch_size=8"] + _ENSEMBLE_CANARIES,
}
AUDITED = tuple(AUDIT_TINY)


def compose_audit(method: str, eps, *overrides: str):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from dpgen.core.config import register_configs
    from dpgen.core.methods import CONFIG_DIR

    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("audit", overrides=[f"method={method}", "dataset=digits", f"eps={eps}", "privacy.noise_seed=0",
                                          "threads=1", "progress=false", "tensorboard=false", "samples_per_class=2",
                                          *AUDIT_TINY[method], *overrides])
    OmegaConf.resolve(cfg)
    return cfg


def digits_subset(root: Path, n: int = 300):
    from dpgen.data import load_dataset
    from dpgen.data.base import ImageDataset, Split

    data = load_dataset("digits", str(root))
    return ImageDataset(data.name, Split(data.train.x[:n], data.train.y[:n]), data.test, list(data.classes),
                        tabular=data.tabular)


def audit(method: str, run_dir: Path, eps, *overrides: str, records: int = 300, read: bool = True) -> dict | None:
    """One tiny audit run through the pipeline (what scripts/audit.py runs) on the first ``records`` digits; its
    audit.json (``read=False``: None, for a caller that writes the report itself)."""
    from dpgen.core.pipeline import run_training

    threads = torch.get_num_threads()
    try:
        run_training(compose_audit(method, eps, *overrides), run_dir,
                     data=digits_subset(run_dir.parent / "data", records), evaluate=False)
    finally:
        torch.set_num_threads(threads)
    return json.loads((run_dir / "audit.json").read_text()) if read else None


#: the tiny audits that must catch a mechanism with half its noise (one method per mechanism family), with what
#: they change in AUDIT_TINY, how many digits they train on, and the noise they halve (``gaussian_noise``'s
#: ``mechanism``). The GS-WGAN family needs more partitions (each canary is drawn with its partition only: 4
#: partitions drawn ~6 times each cannot show ε > 2) and more records for them; DPAF's DPAGG needs the budget split in its
#: favour (quick: ε 0.1 of the run's).
HALF_NOISE: dict[str, tuple[str, tuple[str, ...], int, str]] = {
    "dpgan": ("dpgan", (), 300, "DP-SGD noise"),
    "gswgan-wide": ("gswgan", ("gswgan.num_discriminators=128", "gswgan.batch_size=4", "gswgan.partitions_per_iter=32",
                               "audit.canaries=2048", "audit.guesses=100"), 1200, "sanitizer noise"),
    "gpate": ("gpate", (), 300, "GNMax argmax"),
    # the default m = 10,000 and 200 + 200 guesses (AUDIT_TINY's dpaf takes 1,000 to keep make test short)
    "dpaf-dpagg": ("dpaf", ("dpaf.split=[0.1,0.1,null]", "audit.canaries=10000", "audit.guesses=200"), 300, "DPAGG"),
}
#: every sound tiny audit: the eight methods, and the half-noise variants (slow: covered by the methods' own)
SOUND = [pytest.param(m, m, (), 300, id=m) for m in AUDITED] + [
    pytest.param(v, m, o, n, id=v, marks=pytest.mark.slow) for v, (m, o, n, _) in HALF_NOISE.items() if v != m]


@pytest.mark.parametrize("variant,method,overrides,records", SOUND)
def test_audit_stays_below_the_claimed_epsilon(variant, method, overrides, records, tmp_path):
    """A sound run at claimed ε = 2 (δ = 1e-5): ε_lb ≤ 2 by both bounds. A mechanism without its noise or its
    clipping (tests/privacy_mutants.py) reaches ~5 here, one with half its noise (HALF_NOISE) over 2."""
    report = audit(method, tmp_path / "run", 2, *overrides, records=records)
    assert report["claimed"]["epsilon"] <= 2.0 + 1e-6
    assert report["records"]["total"] == records + report["records"]["canaries_included"]
    assert report["insertion"] and all(ch["releases_observed"] > 0 for ch in report["insertion"])
    assert report["bound"] == "fdp" and report["stage_epsilon"] <= report["claimed"]["epsilon"]
    for name, bound in report["bounds"].items():
        assert bound["epsilon_lower_bound"] <= report["claimed"]["epsilon"], (name, report)
    assert report["epsilon_lower_bound"] == report["bounds"]["fdp"]["epsilon_lower_bound"]
    assert not report["finding"]


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(HALF_NOISE))
def test_a_mechanism_with_half_its_noise_is_flagged(variant, tmp_path, monkeypatch):
    """The mechanism's Gaussian noise std at half of what its ledger records (every draw of that mechanism through
    ``gaussian_noise``): at claimed ε = 2 the f-DP bound exceeds the claim. (slow: the mutants audit.*_noise_half
    of tests/privacy_mutants.py make the same change in the code, and test_audit_stays_below_the_claimed_epsilon
    must fail for them.)"""
    import dpgen.dpaf.mechanisms
    import dpgen.gpate.aggregate
    import dpgen.gswgan.sanitizer
    import dpgen.privacy.optimizer
    from dpgen.privacy.randomness import gaussian_noise

    method, overrides, records, mechanism = HALF_NOISE[variant]

    def half(shape, std, generator, *args, **kwargs):
        return gaussian_noise(shape, std * (0.5 if kwargs.get("mechanism") == mechanism else 1.0), generator, *args,
                              **kwargs)

    for module in (dpgen.privacy.optimizer, dpgen.gswgan.sanitizer, dpgen.gpate.aggregate, dpgen.dpaf.mechanisms):
        monkeypatch.setattr(module, "gaussian_noise", half)
    report = audit(method, tmp_path / "run", 2, *overrides, records=records)
    assert report["finding"] and report["epsilon_lower_bound"] > report["claimed"]["epsilon"], report


def test_coins_reach_coins_npy_and_no_released_file(tmp_path):
    """The coins (as bytes, bits, 0/1 text or the list of included canaries) appear in audit/coins.npy only; the
    released files and the log name no canary."""
    run = tmp_path / "run"
    audit("dpgan", run, 2, "tensorboard=true", "log_every=4")
    coins = np.load(run / "audit" / "coins.npy")
    report = json.loads((run / "audit.json").read_text())
    assert coins.shape == (report["canaries"],) and set(np.unique(coins)) <= {0, 1}
    included = np.flatnonzero(coins)
    needles = [coins.astype(np.uint8).tobytes(), np.packbits(coins).tobytes(), "".join(map(str, coins[:64])).encode(),
               json.dumps(coins[:32].tolist()).encode(), json.dumps(included[:16].tolist()).encode(),
               ", ".join(map(str, included[:16])).encode()]
    released = [p for p in run.rglob("*") if p.is_file() and p.parts[len(run.parts)] not in ("audit", "checkpoints")
                and p.name != "audit.json"]
    assert {p.name for p in released} >= {"generator.pt", "privacy.json", "metrics.json"}
    assert any(p.parts[len(run.parts)] == "tb" for p in released)
    for path in released:
        blob = path.read_bytes()
        for needle in needles:
            assert needle not in blob, f"{path.relative_to(run)} holds the coins"
        assert b"canar" not in blob.lower() or path.suffix == ".log", f"{path.relative_to(run)} mentions canaries"
    for name in ("privacy.json", "metrics.json"):
        assert "audit" not in json.loads((run / name).read_text()), name
    assert report["records"]["canaries_included"] == int(coins.sum())


@pytest.mark.parametrize("method", AUDITED)
def test_audit_without_noise_has_power_and_keeps_the_device_discipline(method, tmp_path, monkeypatch):
    """eps=inf (noise multiplier 0, clipping kept): the canaries are plain to see, ε_lb ≥ 3. One run checks the
    device discipline too: the canaries' factories name their device, their draws come from the run's streams, and
    they add at most one host sync per step to the method's budget (their Poisson samples are drawn 64 steps per
    sync). The bounds are computed on the host after the run, outside the watch."""
    import dpgen.audit.report
    from discipline import Report, watch
    from test_device_discipline import SYNC_BUDGET

    write_report, held = dpgen.audit.report.write_report, []
    monkeypatch.setattr(dpgen.audit.report, "write_report", lambda *args: held.append(args))
    report = Report(method)
    with watch(report):
        audit_json = audit(method, tmp_path / "run", "inf", "log_every=1000000", "checkpoint_every=1000000",
                           read=False)
    assert report.steps, "no training step observed"
    assert not report.problems(SYNC_BUDGET[method] + 1), report.table()
    assert audit_json is None and len(held) == 1
    power = write_report(*held[0])
    assert math.isinf(power["claimed"]["epsilon"]) and not power["finding"]
    assert power["epsilon_lower_bound"] >= 3.0, power


# ---- runs without an audit -------------------------------------------------------------------------------

@pytest.mark.parametrize("method", AUDITED)
def test_a_run_without_audit_never_touches_the_canary_hooks(method, tmp_path, monkeypatch):
    """No canary code runs, and no audit stream is drawn from, unless the config has an ``audit`` block."""
    from dpgen.audit import canaries as canaries_mod
    from dpgen.audit import hooks
    from tiny import train_in_memory

    def boom(*args, **kwargs):
        raise AssertionError("an audit hook ran in a run without audit")

    for cls in (hooks.DpsgdCanaries, hooks.VoteCanaries, hooks.FeatureCanaries, hooks.SanitizerCanaries,
                canaries_mod.Canaries):
        monkeypatch.setattr(cls, "__init__", boom)
    _, _, run = train_in_memory(method, tmp_path, eps=2.0, noise_seed=0)
    assert run.audit is None
    assert not [name for name in run.streams.state_dict()["secret"] if name.startswith("audit")]


def test_hooked_mechanisms_without_canaries_compute_what_they_did():
    """Confident-GNMax with no reserved bins and DPAGG without canaries: exactly the formulas of the paper, drawn
    from the same stream (the release of a run without audit is unchanged)."""
    from dpgen.dpaf.mechanisms import dpagg
    from dpgen.gpate.aggregate import confident_gnmax
    from dpgen.privacy.randomness import gaussian_noise

    counts = torch.randint(0, 9, (40, 10))
    res = confident_gnmax(counts, 4.0, 2.0, 3.0, secret_generator("cpu", seed=5))
    g = secret_generator("cpu", seed=5)
    answered = counts.float().max(1).values + gaussian_noise((40,), 2.0, g) >= 4.0
    winner = (counts.float() + gaussian_noise((40, 10), 3.0, g)).argmax(1)
    assert torch.equal(res.answered, answered) and torch.equal(res.winner, winner) and res.reserved is None
    feats = torch.randn(7, 4, 2, 2)
    out = dpagg(feats, 4.0, 1.5, 8.0, secret_generator("cpu", seed=6))
    expected = (feats.sum(0, keepdim=True) + gaussian_noise((1, 4, 2, 2), 6.0, secret_generator("cpu", seed=6))) / 8
    assert torch.equal(out, expected)


def test_gnmax_reserved_bins_take_no_part_in_the_answer():
    """The canaries' bins are noised with the real ones but never win the argmax or pass the threshold."""
    from dpgen.gpate.aggregate import confident_gnmax

    counts = torch.cat([torch.zeros(5, 3), torch.full((5, 4), 100.0)], 1)
    res = confident_gnmax(counts, 50.0, 0.0, 0.0, secret_generator("cpu", seed=0), reserved=4)
    assert not res.answered.any() and (res.winner < 3).all() and torch.equal(res.reserved, counts[:, 3:])


def test_several_tests_share_the_confidence():
    """Weighted Bonferroni: the error probabilities of the tests sum to 1 − confidence; one channel is one test
    at the whole confidence; with several, the combined score takes half and the channels share the rest."""
    from dpgen.audit.report import split_confidence

    assert split_confidence(0, 0.99) == split_confidence(1, 0.99) == [0.99]
    for channels in (2, 3, 5):
        levels = split_confidence(channels, 0.99)
        assert len(levels) == channels + 1
        assert sum(1.0 - c for c in levels) == pytest.approx(0.01)
        assert levels[0] == pytest.approx(0.995) and all(c == pytest.approx(1 - 0.005 / channels) for c in levels[1:])


def test_default_canaries_and_guesses_per_family():
    """audit.canaries=null: 10,000, or K·⌊64·B / b⌋ for the GS-WGAN family (b rows per canary);
    audit.guesses=null: 2 % of m on each side, at least min(100, m/10)."""
    from hydra import compose, initialize_config_dir

    from dpgen.audit.sizes import audit_sizes, default_guesses
    from dpgen.core.config import register_configs
    from dpgen.core.methods import CONFIG_DIR

    assert [default_guesses(m) for m in (5, 300, 1000, 3200, 10000, 50000)] == [1, 30, 100, 100, 200, 1000]
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        sizes = {m: audit_sizes(compose("audit", overrides=[f"method={m}", "dataset=digits"]))
                 for m in ("dpgan", "gpate", "gswgan", "efsgd")}
        set_apart = audit_sizes(compose("audit", overrides=["method=dpgan", "audit.canaries=500", "audit.guesses_in=7"]))
    assert sizes == {"dpgan": (10000, 200, 200), "gpate": (10000, 200, 200), "gswgan": (3200, 100, 100),
                     "efsgd": (800, 80, 80)}  # K·⌊64·B / b⌋: b = 4B, efsgd 16B (C1 = C2)
    assert set_apart == (500, 7, 50)


# ---- scripts/audit.py --------------------------------------------------------------------------------------

def test_audit_cli_writes_its_report_and_one_summary_line(tmp_path):
    """scripts/audit.py end to end: the run's files plus audit.json and audit/coins.npy, and the summary line."""
    import re

    from conftest import run_script

    run = tmp_path / "run"
    res = run_script("audit.py", "method=gpate", "eps=2", "privacy.noise_seed=0", "threads=1", "progress=false",
                     "audit.canaries=2000", *AUDIT_TINY["gpate"], f"hydra.run.dir={run}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    last = res.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"audit: gpate eps=2 claimed, eps_lb=\d+\.\d\d \(fdp, 95 %\), 2000 canaries, \d+/200 correct",
                        last), last
    report = json.loads((run / "audit.json").read_text())
    assert report["canaries"] == 2000 and report["guesses"] == {"in": 100, "out": 100, "total": 200}  # min(100, m/10)
    assert report["bound"] == "fdp" and set(report["bounds"]) == {"fdp", "sn"}
    assert {"generator.pt", "privacy.json", "metrics.json", "audit.json", "audit.log"} <= {p.name for p in run.iterdir()}
    assert np.load(run / "audit" / "coins.npy").sum() == report["records"]["canaries_included"]


def test_an_audit_run_is_not_resumed_by_train(capsys, tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    run = tmp_path / "run"
    audit("gpate", run, 2)
    (run / ".hydra").mkdir()
    OmegaConf.save(compose_audit("gpate", 2), run / ".hydra" / "config.yaml")
    monkeypatch.chdir(tmp_path)
    code, _, err = call(capsys, "train", "method=gpate", "eps=2", *AUDIT_TINY["gpate"], f"resume={run}",
                        f"data_root={tmp_path / 'data'}")
    assert "is an audit run" in one_error(code, err)


@pytest.mark.parametrize("args,says", [
    (["audit.canaries=0"], "audit.canaries=0 is invalid"),
    (["audit.guesses=6000"], "guesses_in"),
    (["audit.bound=exact"], "audit.bound='exact' is invalid; expected one of fdp, sn"),
    (["method=gpate", "audit.canaries=60000"], "audit.canaries=60000 is invalid; expected at most 50000 for gpate"),
    (["audit.guesses_out=-1"], "audit.guesses_out=-1 is invalid"),
    (["audit.confidence=1.0"], "audit.confidence=1.0 is invalid"),
    (["audit.canaries=abc"], "audit.canaries"),
    (["audit.typo=3"], "unknown key audit.typo"),
    (["method=gswgan", "audit.canaries=13000"], "audit.canaries=13000 is invalid; expected at most "
                                                 "gswgan.num_discriminators * (256 * gswgan.batch_size // 64) = 12800"),
    (["delta=5e-4"], "1/(N + canaries)"),
    (["eps=0"], "eps"),
])
def test_audit_cli_bad_input_is_one_line_and_writes_nothing(args, says, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = files_in(tmp_path)
    code, _, err = call(capsys, "audit", f"data_root={tmp_path / 'data'}", f"hydra.run.dir={tmp_path / 'run'}", *args)
    assert says in one_error(code, err)
    assert not (tmp_path / "run").exists() and not (tmp_path / "outputs").exists()
    assert {k for k in files_in(tmp_path) if not k.startswith("data")} == {k for k in before if not k.startswith("data")}
