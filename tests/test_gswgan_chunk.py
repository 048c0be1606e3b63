"""``gswgan.pretrain_chunk: null`` (gswgan, dpac, efsgd): the pre-training's chunks sized from the device's memory,
measured on throw-away pairs that read no record and no secret stream (dpgen/gswgan/train.py)."""
from __future__ import annotations

import importlib
from functools import partial

import pytest
import torch
from omegaconf import OmegaConf

from dpgen.core.dist import Dist
from dpgen.ensemble import NetStack
from dpgen.gswgan.nets import ResNetGenerator, disc_init
from dpgen.nets.spectral import sn_init

from tiny import train_in_memory

SHAPE = [1, 28, 28]
gtrain = importlib.import_module("dpgen.gswgan.train")  # the package attribute `train` is the function


def _setup(k: int = 8):
    disc = NetStack(partial(disc_init, 10, SHAPE, 8), sn_init, k, torch.Generator().manual_seed(0), torch.device("cpu"))
    make_gen = partial(ResNetGenerator, 10, SHAPE, 10, 8)
    hp = OmegaConf.create({"pretrain_chunk": None, "batch_size": 4, "lr": 1e-4, "g_lr": None, "betas": [0.0, 0.99],
                           "gp_weight": 10.0, "drift": 0.0})
    return disc, make_gen, hp


class _Memory:
    def __init__(self, seen) -> None:
        self.seen = seen

    def start(self) -> int:
        return 0

    def peak(self) -> int:
        return self.seen[-1] * 10**6  # 1 MB per pair


def test_an_integer_is_kept_and_null_off_cuda_is_the_default_chunk():
    disc, make_gen, hp = _setup()
    assert gtrain.pretrain_chunk_for(disc, make_gen, OmegaConf.merge(hp, {"pretrain_chunk": 3}), SHAPE) == 3
    assert gtrain.pretrain_chunk_for(disc, make_gen, hp, SHAPE) == min(8, gtrain.DEFAULT_CHUNK)


def test_null_measures_throw_away_pairs_on_zeros_and_fits_the_free_memory(monkeypatch):
    """The probe runs the real critic and generator steps on 2, 2 and 6 copies of member 0 with zero images; the
    ensemble, the global generator and every member's state are untouched; 5 MB free at 1 MB per pair: 3 pairs."""
    import dpgen.privacy.micro_batch as mb
    from dpgen.gswgan import ensemble

    disc, make_gen, hp = _setup()
    before = {k: v.clone() for k, v in disc.params.items()}
    state = torch.get_rng_state()
    seen, real = [], ensemble.critic_step

    def spy(stack, forward, idx, xr, yr, xf, yf, *rest):
        seen.append(len(idx))
        assert float(xr.abs().sum()) == 0.0 and stack is not disc
        return real(stack, forward, idx, xr, yr, xf, yf, *rest)

    monkeypatch.setattr(ensemble, "critic_step", spy)
    monkeypatch.setattr(mb, "free_memory", lambda device: 5 * 10**6)
    assert gtrain.pretrain_chunk_for(disc, make_gen, hp, SHAPE, memory=_Memory(seen)) == 3
    assert seen == [2, 2, 6]
    assert all(torch.equal(before[k], v) for k, v in disc.params.items())
    assert torch.equal(state, torch.get_rng_state())
    monkeypatch.setattr(mb, "free_memory", lambda device: 10**12)
    assert gtrain.pretrain_chunk_for(disc, make_gen, hp, SHAPE, memory=_Memory(seen)) == 8, "at most K"


def test_the_ranks_take_the_least_chunk(monkeypatch):
    """Ranks split the chunks by index: each one's size (the default off CUDA, or measured) goes through Dist.min."""
    import dpgen.privacy.micro_batch as mb
    from dpgen.gswgan import ensemble

    asked, seen, real = [], [], ensemble.critic_step
    monkeypatch.setattr(Dist, "min", lambda self, v: (asked.append(v), 2)[1])
    monkeypatch.setattr(ensemble, "critic_step", lambda stack, f, idx, *a: (seen.append(len(idx)), real(stack, f, idx, *a)))
    monkeypatch.setattr(mb, "free_memory", lambda device: 10**12)
    disc, make_gen, hp = _setup()
    assert gtrain.pretrain_chunk_for(disc, make_gen, hp, SHAPE) == 2 and asked == [8]
    assert gtrain.pretrain_chunk_for(disc, make_gen, hp, SHAPE, memory=_Memory(seen)) == 2 and asked == [8, 8]


@pytest.mark.parametrize("method", ["gswgan"])
def test_a_run_with_a_memory_sized_chunk_trains(tmp_path, method):
    _, ledger, _ = train_in_memory(method, tmp_path, f"{method}.pretrain_chunk=null")
    assert ledger.entries
