"""Partition isolation of gswgan / dpac / efsgd (issue 12 §1): the sound ledger charges one generator iteration
as "partition k sampled at rate 1/K", which holds only if nothing of partition j reaches D_k, C or a state used
with partition k. Two trainings on datasets that differ in one record must leave every per-partition state of
every OTHER partition bit-identical: discriminator weights, spectral-norm vectors and Adam moments, efsgd's
encoders and error-feedback states, and (since the record's partition is never sampled in the private phase) the
classifier and the generator too.

The removed record is chosen in a partition that the private iterations do not sample. That is possible because
the partition draw uses a data-independent RNG stream: the test checks that both runs draw the same sequence.
A second removal, from the partition sampled only at the LAST iteration, checks the states that the shared
generator's last (sanitised) update has not yet touched: the other partitions' discriminators, encoders and
error-feedback states (an error state shared across partitions would differ there).
"""
from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

from dpgen.data import load_dataset
from dpgen.data.base import ImageDataset, Split
from dpgen.data.partition import record_owners

from tiny import train_in_memory

K, ITERS = 16, 3
#: the mechanism randomness both neighbouring runs share; chosen so that in every case the 3 drawn partitions are
#: distinct (the second removal below needs a last-sampled partition that no earlier iteration drew)
NOISE_SEED = 3
COMMON = [f"num_discriminators={K}", f"pretrain_chunk={K}", f"iters={ITERS}", "pretrain_iters=4",
          "critic_iters=2", "classifier.start=1", "noise_multiplier=50"]
SHARED = ("g", "g_ema", "opt_g", "clf")  # legitimately differ after a sanitised release from the record's partition
CASES = {  # name: (method, accounting, extra overrides)
    "gswgan": ("gswgan", "sound", []),
    "dpac": ("dpac", "sound", []),
    "dpac_keep_classifier": ("dpac", "paper", ["classifier.reinit=false"]),
    "efsgd": ("efsgd", "sound", []),
    "gswgan_refresh": ("gswgan", "sound", ["refresh_chunk=5", "shared_init=true"]),  # research options
    "gswgan_independent_init": ("gswgan", "sound", ["shared_init=false"]),  # the papers' init (quick: shared)
    "efsgd_refresh": ("efsgd", "sound", ["refresh_chunk=3"]),
}


def _overrides(method: str, extra: list[str]) -> list[str]:
    key = "efsgd" if method == "efsgd" else "dpac"
    return [f"{key}.{o}" for o in COMMON + extra]


def _train(method, accounting, overrides, run_dir, data, monkeypatch):
    """Train; return (drawn partitions, state after pre-training, final state)."""
    tr = importlib.import_module("dpgen.gswgan.train")
    drawn, pre = [], {}
    orig_phase, orig_setup = tr.critic_phase, tr.EnsembleSetup.resume_or_pretrain

    def critic_phase(disc, parts, k, *a, **kw):
        drawn.append(int(k))
        return orig_phase(disc, parts, k, *a, **kw)

    def resume_or_pretrain(self, *a, **kw):
        orig_setup(self, *a, **kw)
        pre.update(_clone(self.disc.state_dict()))

    monkeypatch.setattr(tr, "critic_phase", critic_phase)
    monkeypatch.setattr(tr.EnsembleSetup, "resume_or_pretrain", resume_or_pretrain)
    # both neighbouring runs draw the same mechanism randomness (privacy.noise_seed): isolation is a property of
    # each fixed draw, and only then are the partitions' states comparable bit for bit
    _, ledger, run = train_in_memory(method, run_dir, *overrides, data=data, accounting=accounting,
                                     noise_seed=NOISE_SEED)
    monkeypatch.undo()
    assert sum(e.count for e in ledger.entries) == ITERS
    final = torch.load(run.checkpoint_path, weights_only=True)["state"]
    return drawn, pre, final


def _clone(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    return obj


def _differences(a, b, owner: int, path: str = "", skip: tuple[str, ...] = ()) -> list[str]:
    """Paths where ``a`` and ``b`` differ, ignoring row ``owner`` of per-partition stacks (leading dim K) and the
    top-level keys ``skip``."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), path
        return [d for k in a if not (path == "" and k in skip)
                for d in _differences(a[k], b[k], owner, f"{path}/{k}")]
    if isinstance(a, torch.Tensor):
        per_partition = path.split("/")[1] in ("disc", "enc", "errors") and a.dim() >= 1 and a.shape[0] == K
        if per_partition:
            keep = [i for i in range(K) if i != owner]
            a, b = a[keep], b[keep]
        return [] if a.shape == b.shape and torch.equal(a, b) else [path]
    return [] if a == b else [path]


def _without(data: ImageDataset, i: int) -> ImageDataset:
    return ImageDataset(data.name, Split(np.delete(data.train.x, i, 0), np.delete(data.train.y, i, 0)), data.test,
                        data.classes)


@pytest.mark.parametrize("case", list(CASES))
def test_one_record_changes_only_its_own_partitions_states(case, tmp_path, monkeypatch):
    method, accounting, extra = CASES[case]
    overrides = _overrides(method, extra)
    full = load_dataset("digits", str(tmp_path / "data"))
    drawn, pre_a, final_a = _train(method, accounting, overrides, tmp_path / "a", full, monkeypatch)
    owners = record_owners(full.train.x, K, 0)  # seed 0: the partition of every record in these runs
    unsampled = sorted(set(range(K)) - set(drawn))
    assert len(drawn) == ITERS and unsampled, "setup: some partition must stay unsampled"
    owner = unsampled[0]
    removed = int(np.flatnonzero(owners == owner)[0])
    drawn_b, pre_b, final_b = _train(method, accounting, overrides, tmp_path / "b", _without(full, removed),
                                     monkeypatch)
    assert drawn_b == drawn, "the partition draws must not depend on the data"

    # end of pre-training: only the record's own discriminator may differ
    assert _differences({"disc": pre_a}, {"disc": pre_b}, owner) == []
    assert any(not torch.equal(pre_a["params"][n][owner], pre_b["params"][n][owner]) for n in pre_a["params"]), \
        "setup: removing the record must change its own discriminator"
    # after the private iterations (none of which sampled the record's partition): nothing else may differ
    assert _differences(final_a, final_b, owner) == []

    last = drawn[-1]
    assert last not in drawn[:-1], "setup: the last iteration's partition must be new"
    removed = int(np.flatnonzero(owners == last)[0])
    drawn_c, _, final_c = _train(method, accounting, overrides, tmp_path / "c", _without(full, removed), monkeypatch)
    assert drawn_c == drawn
    assert _differences(final_a, final_c, last, skip=SHARED) == []
    assert not torch.equal(final_a["disc"]["params"]["c1.w"][last], final_c["disc"]["params"]["c1.w"][last])
