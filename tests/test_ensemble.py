"""The shared ensemble layout (dpgen.ensemble): per-partition isolation, per-member Adam, checkpoints.

GS-WGAN's 1/K sampling argument and PATE's per-teacher vote both need member i's state to depend on partition i
alone. The isolation tests train twice on datasets that differ in ONE record and check that every other member's
state (parameters, spectral-norm vectors, Adam moments and step counts) is bit-identical, for both update paths:
sampled members stepped by index (the GS-WGAN main phase, :meth:`MemberStack.adam_rows_`) and lockstep blocks of
members (pre-training chunks, G-PATE teachers, :meth:`MemberStack.adam_block_`).
"""
from __future__ import annotations

from functools import partial

import torch

from dpgen.gswgan.ensemble import critic_step
from dpgen.gswgan.nets import disc_forward, disc_init
from dpgen.ensemble import MemberStack, NetStack
from dpgen.nets.spectral import sn_init

SHAPE = [1, 8, 8]
K, PER, B = 5, 6, 3  # members, records per partition, batch
CHANGED = 2  # the partition that holds the differing record
BETAS = (0.5, 0.9)


def _data(changed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """K·PER records; record 0 of partition CHANGED differs between the two datasets."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(K, PER, *SHAPE, generator=g)
    y = torch.randint(0, 10, (K, PER), generator=g)
    if changed:
        x[CHANGED, 0] = 1.0 - x[CHANGED, 0]
        y[CHANGED, 0] = (y[CHANGED, 0] + 1) % 10
    return x, y


def _state(st: MemberStack, rows: list[int]) -> dict[str, torch.Tensor]:
    out = {"t": st.t[rows]}
    for name in ("params", "buffers", "m", "v"):
        out.update({f"{name}.{k}": v[rows] for k, v in getattr(st, name).items()})
    return out


def _train_netstack(changed: bool) -> NetStack:
    """Lockstep-free GS-WGAN schedule: every member steps on its own partition, then sampled members one at a
    time, by index (the sampled index and batch positions come from a public stream, the same for both data)."""
    x, y = _data(changed)
    disc = NetStack(partial(disc_init, 10, SHAPE, 4), sn_init, K, torch.Generator().manual_seed(1), torch.device("cpu"))
    pick = torch.Generator().manual_seed(2)
    every = torch.arange(K)
    for _ in range(2):  # pre-training: all members at once, each on its own records
        idx = torch.randint(0, PER, (K, B), generator=pick)
        xr, yr = x[every[:, None], idx], y[every[:, None], idx]
        xf = torch.rand(K, B, *SHAPE, generator=pick)
        critic_step(disc, disc_forward, every, xr, yr, xf, yr, torch.rand(K, B, generator=pick), 10.0, 1e-3, 1e-2,
                    BETAS)
    for _ in range(6):  # main phase: one sampled member per step
        k = torch.randint(0, K, (1,), generator=pick)
        idx = torch.randint(0, PER, (1, B), generator=pick)
        xr, yr = x[k[:, None], idx], y[k[:, None], idx]
        critic_step(disc, disc_forward, k, xr, yr, torch.rand(1, B, *SHAPE, generator=pick), yr,
                    torch.rand(1, B, generator=pick), 10.0, 1e-3, 1e-2, BETAS)
    return disc


def _linear_stack(n: int = K) -> MemberStack:
    g = torch.Generator().manual_seed(3)
    return MemberStack({"w": torch.randn(n, 10, SHAPE[-1] * SHAPE[-2], generator=g), "b": torch.zeros(n, 10)})


def _block_loss(st: MemberStack, a: int, b: int, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """Members a..b-1's cross-entropy on their own records (x [b-a, PER, ...]); gradients in ``params`` order."""
    p = st.block(a, b, grad=True)
    logits = torch.einsum("mcd,mnd->mnc", p["w"], x.flatten(2)) + p["b"][:, None]
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum")
    return list(torch.autograd.grad(loss, list(p.values())))


def _train_blocks(changed: bool, block: int = 2, steps: int = 4) -> MemberStack:
    x, y = _data(changed)
    st = _linear_stack()
    for _ in range(steps):
        for a, b in st.blocks(block):  # blocks cut across partition boundaries: 0-1, 2-3, 4
            st.adam_block_(a, b, _block_loss(st, a, b, x[a:b], y[a:b]), 1e-2, BETAS)
    return st


def _assert_isolated(make) -> None:
    base, other = make(False), make(True)
    others = [i for i in range(K) if i != CHANGED]
    for name, value in _state(base, others).items():
        assert torch.equal(value, _state(other, others)[name]), f"{name} of a member without the record changed"
    moved = [n for n, v in _state(base, [CHANGED]).items() if not torch.equal(v, _state(other, [CHANGED])[n])]
    assert any(n.startswith("params.") for n in moved), "the member holding the record must see it (test is live)"


def test_rows_path_isolates_every_other_member():
    _assert_isolated(_train_netstack)


def test_block_path_isolates_every_other_member():
    _assert_isolated(_train_blocks)


def test_both_paths_are_one_adam_per_member():
    """adam_block_ on blocks and adam_rows_ on one member at a time equal K separate torch Adams."""
    x, y = _data(False)
    blocks, rows = _linear_stack(), _linear_stack()
    refs = [{k: v[i].clone().requires_grad_(True) for k, v in _linear_stack().params.items()} for i in range(K)]
    opts = [torch.optim.Adam(list(r.values()), lr=1e-2, betas=BETAS) for r in refs]
    for _ in range(3):
        for a, b in blocks.blocks(2):
            blocks.adam_block_(a, b, _block_loss(blocks, a, b, x[a:b], y[a:b]), 1e-2, BETAS)
        for i in range(K):
            grads = _block_loss(rows, i, i + 1, x[i:i + 1], y[i:i + 1])
            rows.adam_rows_(torch.tensor([i]), dict(zip(rows.params, grads)), 1e-2, BETAS)
            opts[i].zero_grad()
            logits = refs[i]["w"] @ x[i].flatten(1).T + refs[i]["b"][:, None]
            torch.nn.functional.cross_entropy(logits.T, y[i], reduction="sum").backward()
            opts[i].step()
    for k in blocks.params:
        ref = torch.stack([r[k].detach() for r in refs])
        torch.testing.assert_close(blocks.params[k], ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(rows.params[k], ref, rtol=1e-5, atol=1e-6)
    assert blocks.t.tolist() == rows.t.tolist() == [3] * K


def test_rows_path_steps_only_the_selected_members():
    st = _linear_stack()
    x, y = _data(False)
    before = {k: v.clone() for k, v in st.params.items()}
    grads = _block_loss(st, 3, 4, x[3:4], y[3:4])
    st.adam_rows_(torch.tensor([3]), dict(zip(st.params, grads)), 1e-2, BETAS)
    assert st.t.tolist() == [0, 0, 0, 1, 0]
    for k, v in st.params.items():
        assert torch.equal(v[[0, 1, 2, 4]], before[k][[0, 1, 2, 4]]) and not torch.equal(v[3], before[k][3])


def test_a_reloaded_stack_continues_bit_exactly():
    """state_dict → load_state_dict → more steps equals the uninterrupted run (the block path re-reads its step
    count from ``t`` after a load)."""
    x, y = _data(False)
    whole = _train_blocks(False, steps=5)
    part = _train_blocks(False, steps=3)
    resumed = _linear_stack()
    resumed.load_state_dict({k: (v if not isinstance(v, dict) else {n: t.clone() for n, t in v.items()})
                             for k, v in part.state_dict().items()})
    for _ in range(2):
        for a, b in resumed.blocks(2):
            resumed.adam_block_(a, b, _block_loss(resumed, a, b, x[a:b], y[a:b]), 1e-2, BETAS)
    for name, value in _state(whole, list(range(K))).items():
        assert torch.equal(value, _state(resumed, list(range(K)))[name]), name


def test_checkpoints_of_the_earlier_layouts_still_load():
    """NetStack wrote its spectral-norm vectors as "u"; G-PATE's teachers wrote one int step count."""
    st = _train_blocks(False, steps=2)
    legacy = {"params": st.params, "m": st.m, "v": st.v, "t": 2}
    fresh = _linear_stack()
    fresh.load_state_dict(legacy)
    assert fresh.t.tolist() == [2] * K and all(torch.equal(fresh.params[k], st.params[k]) for k in st.params)
    disc = _train_netstack(False)
    other = NetStack(partial(disc_init, 10, SHAPE, 4), sn_init, K, torch.Generator().manual_seed(9), torch.device("cpu"))
    other.load_state_dict({"params": disc.params, "u": disc.u, "m": disc.m, "v": disc.v, "t": disc.t})
    assert all(torch.equal(other.u[k], disc.u[k]) for k in disc.u)
