"""G-PATE's training loop wired to its mechanisms: what train() passes to Confident-GNMax, the clip and the
Laplace prior matches the ledger; teachers read only their own partition and are isolated from each other;
the budget guard and the paper's data-dependent stopping rule bind exactly; eps=inf is clean; no host sync
per step."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import importlib

from dpgen.gpate import aggregate, rdp
from dpgen.gpate.ensemble import TeacherEnsemble, assign_teachers
from dpgen.privacy import LedgerEntry
from dpgen.privacy.ledger import compute_epsilon

from tiny import train_in_memory

gpate_train = importlib.import_module("dpgen.gpate.train")  # the module (the package re-exports train())
ENTRY = "gpate.confident_gnmax"
SENSITIVITY = [1.0, math.sqrt(2.0)]  # threshold check (max count), argmax (histogram, ℓ2)


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    from dpgen.data import load_dataset

    return load_dataset("digits", str(tmp_path_factory.mktemp("data")))


def _checkpoint(run_dir):
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=False)


class Spy:
    """Wraps Confident-GNMax, the vote clipping, the Laplace prior and every teacher batch of one train() call."""

    def __init__(self, monkeypatch, data, n_teachers: int, seed: int = 0, work_size: int | None = None) -> None:
        self.gnmax: list[dict] = []
        self.clips: list[float] = []
        self.laplace: list[float] = []
        self.batches = 0
        self.ledger = None
        owner = assign_teachers(data.train.x, n_teachers, seed)
        if data.tabular:
            x = gpate_train.to_model_space(torch.as_tensor(data.train.x, dtype=torch.float32))
        else:
            x = gpate_train.to_float(data.train.x)
            if work_size:
                x = torch.nn.functional.interpolate(x, size=(work_size, work_size), mode="area")
        # each teacher's records as the teachers see them (bytes of features + label): what its batch may contain
        self.allowed = [set() for _ in range(n_teachers)]
        for r in range(len(x)):
            self.allowed[int(owner[r])].add((x[r].numpy().tobytes(), int(data.train.y[r])))
        real_gnmax, real_bin, real_laplace = aggregate.confident_gnmax, aggregate.bin_index, gpate_train.laplace_noise
        real_step = TeacherEnsemble.train_step

        def gnmax(counts, threshold, sigma1, sigma2, generator):
            entry = [e for e in self.ledger.entries if e.name == ENTRY]
            res = real_gnmax(counts, threshold, sigma1, sigma2, generator)
            self.gnmax.append({"threshold": threshold, "sigma1": sigma1, "sigma2": sigma2, "q": counts.shape[0],
                               "counts": counts.clone(), "answered": res.answered.clone(),
                               "recorded_before": sum(e.count for e in entry)})
            return res

        def bin_index(u, c, bins):
            self.clips.append(c)
            return real_bin(u, c, bins)

        def laplace(n, scale, generator):
            self.laplace.append(scale)
            return real_laplace(n, scale, generator)

        def train_step(ens, batch):
            def checked(a, b):
                xr, yr, w, xf, yf = batch(a, b)
                for i in range(b - a):
                    for j in range(xr.shape[1]):
                        if w[i, j] > 0:
                            assert (xr[i, j].numpy().tobytes(), int(yr[i, j])) in self.allowed[a + i], \
                                f"teacher {a + i} read a record outside its partition"
                self.batches += 1
                return xr, yr, w, xf, yf
            return real_step(ens, checked)

        monkeypatch.setattr(aggregate, "confident_gnmax", gnmax)
        monkeypatch.setattr(aggregate, "bin_index", bin_index)
        monkeypatch.setattr(gpate_train, "laplace_noise", laplace)
        monkeypatch.setattr(TeacherEnsemble, "train_step", train_step)


def _attach_ledger(monkeypatch, spy: Spy) -> None:
    """Give the spy the run's ledger (train_in_memory builds it) before training starts."""
    from dpgen.privacy import PrivacyLedger

    real_init = PrivacyLedger.__init__

    def init(self, *a, **kw):
        real_init(self, *a, **kw)
        spy.ledger = self

    monkeypatch.setattr(PrivacyLedger, "__init__", init)


@pytest.mark.parametrize("overrides,accounting", [
    ((), "sound"),  # quick defaults: calibrated sigma2, no threshold check (plain GNMax)
    (("gpate.thresh=0.5",), "sound"),  # the README threshold and sigma1 = 6 sigma2
    (("gpate.thresh=0", "gpate.sigma_ratio=1.5", "gpate.teacher_fakes=official", "gpate.teacher_norm=batch"), "sound"),
    (("gpate.thresh=0.5", "gpate.work_size=14", "gpate.projection=dct", "gpate.proj_basis=20"), "sound"),
    (("gpate.noise=readme", "gpate.sigma1=60", "gpate.sigma2=10", "gpate.thresh=0.5"), "paper"),
])
def test_spy_mechanisms_receive_what_the_ledger_records(monkeypatch, tmp_path, digits, overrides, accounting):
    work_size = dict(o.split("=") for o in overrides).get("gpate.work_size")
    spy = Spy(monkeypatch, digits, n_teachers=6, work_size=int(work_size) if work_size else None)
    _attach_ledger(monkeypatch, spy)
    _, ledger, run = train_in_memory("gpate", tmp_path, *overrides, "gpate.iters=4", data=digits,
                                     accounting=accounting)
    cfg = _checkpoint(tmp_path)["state"]["cfg"]
    (entry,) = [e for e in ledger.entries if e.name == ENTRY]
    q = 4 * 3  # batch 4 x proj_dim 3
    assert len(spy.gnmax) == 4 and entry.count == 4 * q
    for i, call in enumerate(spy.gnmax):
        assert call["q"] == q and call["recorded_before"] == i * q, "each step's queries are recorded, no more"
        thresholded = call["threshold"] is not None
        released = [call["sigma1"], call["sigma2"]] if thresholded else [call["sigma2"]]
        sens = SENSITIVITY if thresholded else SENSITIVITY[1:]
        assert released == pytest.approx([z * s for z, s in zip(entry.noise_multipliers, sens)], rel=1e-12)
        assert all(s > 0 for s in released)
    thresh = dict(o.split("=") for o in overrides).get("gpate.thresh", "null")
    expect_t = None if thresh == "null" else float(thresh) * 6
    assert all(c["threshold"] == expect_t for c in spy.gnmax)
    assert cfg["threshold"] == expect_t
    if "gpate.sigma_ratio=1.5" in overrides:
        assert spy.gnmax[0]["sigma1"] == pytest.approx(1.5 * spy.gnmax[0]["sigma2"])
    assert spy.clips and all(c == 1e-4 for c in spy.clips), "votes are clipped at gpate.step_size"
    assert spy.batches >= 4 + 1, "every teacher step (warm-up included) was checked"
    if accounting == "sound":
        assert ledger.epsilon() <= 10.0


def test_spy_laplace_prior_matches_its_ledger_entry(monkeypatch, tmp_path):
    from test_gpate_ensemble import _hp, _toy

    from dpgen.gpate import train
    from dpgen.privacy import PrivacyLedger

    data = _toy(tabular=True)
    spy = Spy(monkeypatch, data, n_teachers=8)
    ledger = PrivacyLedger(delta=1e-5, target_epsilon=3.0)
    spy.ledger = ledger
    from conftest import in_memory_run

    train(_hp(iters=2, dp_class_prior=True, prior_eps=0.05, noise="calibrate", sigma1=None, sigma2=None), data,
          ledger, in_memory_run(tmp_path, ledger))
    (lap,) = [e for e in ledger.entries if e.mechanism == "laplace"]
    assert spy.laplace == [pytest.approx(lap.noise_multipliers[0] * 1.0)] and lap.noise_multipliers == [20.0]
    assert lap.count == 1


def _max_count(nm, target, delta=1e-5):
    """Largest number of queries with ε ≤ target, by a search independent of the budget guard."""
    lo, hi = 0, 1
    while compute_epsilon([LedgerEntry(ENTRY, nm, count=hi)], delta) <= target:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if compute_epsilon([LedgerEntry(ENTRY, nm, count=mid)], delta) <= target else (lo, mid)
    return lo


@pytest.mark.parametrize("thresh", ["0.5", "null"])
def test_budget_guard_stops_exactly_at_its_limit(tmp_path, digits, thresh):
    """Planned 500 iterations at fixed sigmas, ε=2 allows fewer: the run stops at the last iteration that fits."""
    _, ledger, _ = train_in_memory("gpate", tmp_path, "gpate.noise=readme", "gpate.sigma1=60", "gpate.sigma2=20",
                                   f"gpate.thresh={thresh}", "gpate.iters=500", eps=2.0, data=digits)
    nm = [60.0, 20 / math.sqrt(2)] if thresh == "0.5" else [20 / math.sqrt(2)]
    q = 12
    limit = _max_count(nm, 2.0)
    assert limit < 500 * q, "the guard must bind in this test"
    steps = _checkpoint(tmp_path)["step"]
    (entry,) = ledger.entries
    assert steps == limit // q and entry.count == steps * q and entry.noise_multipliers == pytest.approx(nm)
    assert ledger.epsilon() <= 2.0 < compute_epsilon([LedgerEntry(ENTRY, nm, count=(steps + 1) * q)], 1e-5)


@pytest.mark.parametrize("log_every", [1, 1000])
def test_paper_accounting_stops_where_the_data_dependent_epsilon_would_cross(monkeypatch, tmp_path, digits,
                                                                             log_every):
    """The deferred (sync-free) check stops at the same iteration as a per-iteration check would."""
    spy = Spy(monkeypatch, digits, n_teachers=6)
    _attach_ledger(monkeypatch, spy)
    _, ledger, run = train_in_memory("gpate", tmp_path, "gpate.noise=readme", "gpate.sigma1=30", "gpate.sigma2=30",
                                     "gpate.thresh=0.5", "gpate.iters=400", f"log_every={log_every}", eps=3.0, data=digits,
                                     accounting="paper")
    cum = np.zeros(len(rdp.PAPER_ORDERS))
    stop = None
    for t, call in enumerate(spy.gnmax):
        step = rdp.data_dependent_rdp(call["counts"].numpy(), call["answered"].numpy(), call["threshold"],
                                      call["sigma1"], call["sigma2"])
        if rdp.classic_epsilon(cum + step, 1e-5) > 3.0:
            stop = t
            break
        cum += step
    assert stop is not None and 0 < stop < 400, "the data-dependent budget must bind in this test"
    assert len(spy.gnmax) == stop + 1, "the crossing iteration is computed, then dropped"
    assert _checkpoint(tmp_path)["step"] == stop
    assert ledger.report_epsilon() == pytest.approx(rdp.classic_epsilon(cum, 1e-5), rel=1e-12)
    assert ledger.report_epsilon() <= 3.0
    assert ledger.entries[0].count == (stop + 1) * 12, "the sound entry counts every aggregation made"


def _remove_record(data, r):
    from dpgen.data.base import ImageDataset, Split

    keep = np.arange(len(data.train)) != r
    return ImageDataset(data.name, Split(data.train.x[keep], data.train.y[keep]), data.test, data.classes)


@pytest.mark.parametrize("overrides", [(), ("gpate.teacher_fakes=official", "gpate.teacher_norm=batch")])
def test_teachers_are_isolated_from_each_others_records(monkeypatch, tmp_path, digits, overrides):
    """Neighbouring datasets (record r removed) with the released answers fixed: every teacher but r's owner
    ends bit-identical (parameters and Adam state); the owner does not."""
    def fixed_answers(counts, threshold, sigma1, sigma2, generator):
        q = counts.shape[0]
        return aggregate.GNMaxResult(answered=torch.ones(q, dtype=torch.bool),
                                     winner=torch.arange(q) % counts.shape[1])

    monkeypatch.setattr(aggregate, "confident_gnmax", fixed_answers)
    r = 0  # first record of its owner's partition: in that teacher's first batch
    states = []
    for name, data in (("full", digits), ("minus", _remove_record(digits, r))):
        train_in_memory("gpate", tmp_path / name, *overrides, "gpate.iters=3", data=data)
        states.append(_checkpoint(tmp_path / name)["state"]["teachers"])
    owner = int(assign_teachers(digits.train.x, 6, 0)[r])
    for part in ("params", "m", "v"):
        for k in states[0][part]:
            a, b = states[0][part][k], states[1][part][k]
            for i in range(6):
                assert torch.equal(a[i], b[i]) == (i != owner), f"teacher {i} {part} {k}"


def test_eps_inf_is_clean_under_both_accountings(tmp_path, digits):
    """No divide-by-zero from a data-dependent analysis of σ=0 answers; the run reports ε=∞, not private."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for accounting in ("sound", "paper"):
            _, ledger, _ = train_in_memory("gpate", tmp_path / accounting, "gpate.noise=readme", eps="inf",
                                           data=digits, accounting=accounting)
            assert all(z == 0.0 for e in ledger.entries for z in e.noise_multipliers)
            assert ledger.report_epsilon() == math.inf and not ledger.valid_dp_guarantee
    with pytest.raises(ValueError, match="positive noise"):
        rdp.data_dependent_rdp(np.ones((1, 3)), np.ones(1, bool), 1.0, 0.0, 0.0)


class _SyncCounter(torch.overrides.TorchFunctionMode):
    """Counts host syncs made from dpgen code, and fails on a seeded random factory without device=."""

    SYNCS = {torch.Tensor.item, torch.Tensor.cpu, torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.__bool__,
             torch.Tensor.__float__, torch.Tensor.__int__, torch.Tensor.nonzero, torch.nonzero}
    RANDOM = {torch.randn, torch.rand, torch.randint, torch.randperm}

    def __init__(self) -> None:
        super().__init__()
        self.syncs: list[str] = []

    @staticmethod
    def _caller() -> str | None:
        """The dpgen line that called the function directly (torch's own internals, e.g. torch.optim reading its
        CPU step counters, are not dpgen's syncs)."""
        import sys

        name = sys._getframe(2).f_code.co_filename
        return f"{name.split('/dpgen/')[-1]}:{sys._getframe(2).f_lineno}" if "/dpgen/" in name else None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.RANDOM and "generator" in kwargs and "device" not in kwargs:
            raise AssertionError(f"{func.__name__}(generator=...) without device= at {self._caller()}")
        if func in self.SYNCS:
            where = self._caller()
            if where is not None:
                self.syncs.append(where)
        return func(*args, **kwargs)


@pytest.mark.parametrize("accounting", ["sound", "paper"])
def test_no_host_sync_per_training_step(tmp_path, digits, accounting):
    """The syncs of a 3- and a 9-iteration run are the same: the loop itself never waits for the device."""
    counts = []
    for iters in (3, 9):
        mode = _SyncCounter()
        with mode:
            train_in_memory("gpate", tmp_path / f"{accounting}{iters}", f"gpate.iters={iters}", "log_every=1000",
                            "gpate.noise=readme", "gpate.sigma1=600", "gpate.sigma2=100", data=digits,
                            accounting=accounting, checkpoint_every=1000)
        counts.append(sorted(mode.syncs))
    assert counts[0] == counts[1], f"per-step syncs: {sorted(set(counts[1]) - set(counts[0]))}"


@pytest.mark.parametrize("accounting,overrides", [
    ("sound", ()),
    ("paper", ("gpate.teacher_fakes=official", "gpate.teacher_norm=batch", "gpate.noise=readme", "gpate.sigma1=60",
               "gpate.sigma2=10")),
])
def test_resume_matches_the_uninterrupted_run(tmp_path, digits, accounting, overrides):
    """Stopped after iteration 3 and resumed: the released generator, teachers, partition position, ledger and
    (paper) data-dependent RDP are those of the uninterrupted run."""
    from dpgen.core.run import TrainingInterrupted

    args = ("gpate", *overrides, "gpate.iters=6", "log_every=4")
    # the same secret randomness in both runs (privacy.noise_seed); the resumed part takes it from the checkpoint
    full, full_ledger, _ = train_in_memory(args[0], tmp_path / "full", *args[1:], data=digits, accounting=accounting,
                                           noise_seed=5)
    with pytest.raises(TrainingInterrupted):
        train_in_memory(args[0], tmp_path / "cut", *args[1:], data=digits, accounting=accounting, stop_after=3,
                        noise_seed=5)
    gen, ledger, _ = train_in_memory(args[0], tmp_path / "cut", *args[1:], data=digits, accounting=accounting,
                                     resume=True)
    assert [e.to_dict() for e in ledger.entries] == [e.to_dict() for e in full_ledger.entries]
    assert ledger.report_epsilon() == full_ledger.report_epsilon()
    for k, v in gen.state_dict().items():
        torch.testing.assert_close(v, full.state_dict()[k], rtol=0, atol=0, msg=f"generator {k}")
    a, b = _checkpoint(tmp_path / "full")["state"], _checkpoint(tmp_path / "cut")["state"]
    assert a["sampler"] == b["sampler"] and a["rdp_cum"] == b["rdp_cum"] and a["agreement_sum"] == b["agreement_sum"]
    for k in a["teachers"]["params"]:
        assert torch.equal(a["teachers"]["params"][k], b["teachers"]["params"][k]), k
