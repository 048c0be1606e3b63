"""Issue 23: the mechanisms' randomness is secret, so a replay of the public config reproduces no release.

* streams: public ones follow ``seed``; secret ones come from OS entropy unless ``privacy.noise_seed`` fixes them,
  and a checkpoint restores both;
* every mechanism entry point refuses a public stream (or none): a spy per entry point;
* every method: two runs of one public config release different generators; with one ``noise_seed`` they
  are bit-identical and the run says it has no DP guarantee;
* the secret root is in ``checkpoints/`` and in no other file of a run directory;
* ``secure_noise``: same mean and std, a different draw.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from dpgen.core.streams import RandomStreams, fixed_root
from dpgen.privacy import PrivacyLedger
from dpgen.privacy.randomness import (SECURE_DRAWS, PublicRandomnessError, SecretGenerator, derive_seed,
                                      gaussian_noise, secret_generator)
from tiny import METHODS, train_in_memory

CPU = torch.device("cpu")


def _draw(g: torch.Generator, n: int = 8) -> torch.Tensor:
    return torch.randn(n, generator=g, device=g.device)


# ---- streams ---------------------------------------------------------------------------------------------

def test_public_streams_follow_the_seed_and_secret_streams_do_not():
    a, b, other_seed = RandomStreams(CPU, 0), RandomStreams(CPU, 0), RandomStreams(CPU, 1)
    assert torch.equal(_draw(a.public("init")), _draw(b.public("init")))
    assert not torch.equal(_draw(a.public("init")), _draw(other_seed.public("init")))
    assert not torch.equal(_draw(a.public("init")), _draw(a.public("fake")))  # names are independent streams
    assert not torch.equal(_draw(a.secret("noise")), _draw(b.secret("noise")))  # OS entropy, whatever the seed
    assert isinstance(a.secret("noise"), SecretGenerator) and not isinstance(a.public("init"), SecretGenerator)


def test_in_process_tests_replay_their_secret_draws_from_the_sessions_entropy_seed(request):
    """tests/conftest.py: an in-process test's secret streams are drawn afresh every session (its entropy seed) and
    replayed by the ``--entropy-seed`` a failing session prints; draw by draw they stay distinct (the test above)."""
    from conftest import ENTROPY_ENV, ReplayableEntropy

    replay = ReplayableEntropy(f"{os.environ[ENTROPY_ENV]}:{request.node.nodeid}")
    assert RandomStreams(CPU, 0).state_dict()["root"] == replay.token_hex(32)
    assert secret_generator().initial_seed() == replay.randbits(63)
    other = ReplayableEntropy(f"{int(os.environ[ENTROPY_ENV]) + 1}:{request.node.nodeid}")
    assert other.randbits(63) != ReplayableEntropy(f"{os.environ[ENTROPY_ENV]}:{request.node.nodeid}").randbits(63)


def test_a_fixed_root_reproduces_the_secret_streams_and_nothing_else_does():
    a, b = RandomStreams(CPU, 0, fixed_root(7)), RandomStreams(CPU, 5, fixed_root(7))
    assert torch.equal(_draw(a.secret("noise")), _draw(b.secret("noise")))  # the public seed plays no part
    assert not torch.equal(_draw(RandomStreams(CPU, 0, fixed_root(8)).secret("noise")),
                           _draw(RandomStreams(CPU, 0, fixed_root(7)).secret("noise")))
    # the public seed does not derive the secret streams: a secret stream is not a public one of the same name
    assert not torch.equal(_draw(RandomStreams(CPU, 0, fixed_root(0)).secret("x")),
                           _draw(RandomStreams(CPU, 0).public("x")))


def test_streams_continue_bit_exactly_from_their_state():
    first = RandomStreams(CPU, 3, secure_noise=True)
    first.public("fake"), first.secret("noise")
    _draw(first.public("fake")), _draw(first.secret("noise")), _draw(first.secret("late"))
    state = first.state_dict()
    expected = {name: _draw(g) for name, g in [("fake", first.public("fake")), ("noise", first.secret("noise")),
                                               ("late", first.secret("late"))]}
    resumed = RandomStreams(CPU, 3, secure_noise=True)
    resumed.load_root(state)
    noise = resumed.secret("noise")  # handed out before restore()
    resumed.restore(state)
    assert torch.equal(_draw(noise), expected["noise"])
    assert torch.equal(_draw(resumed.public("fake")), expected["fake"])
    assert torch.equal(_draw(resumed.secret("late")), expected["late"])  # handed out after restore()
    assert resumed.secret("noise").secure_noise


def test_the_run_hands_out_its_streams_with_the_noise_setting(tmp_path):
    from dpgen.core.run import Run

    run = Run(tmp_path, PrivacyLedger(delta=1e-5), CPU, 0, {}, tensorboard=False, progress=False, secure_noise=True)
    assert run.secret_rng("noise") is run.secret_rng("noise") and run.secret_rng("noise").secure_noise
    assert not isinstance(run.rng("fake"), SecretGenerator)
    assert not Run(tmp_path, PrivacyLedger(delta=1e-5), CPU, 0, {}, tensorboard=False, progress=False,
                   secure_noise=False).secret_rng("noise").secure_noise


# ---- every mechanism entry point refuses a public stream -----------------------------------------------------

def _entry_points():
    """(name, call(generator)) for every entry point a privacy analysis relies on."""
    from dpgen.gswgan.sanitizer import Sanitizer
    from dpgen.gswgan.train import Partitions
    from dpgen.dpaf.mechanisms import CompressedDPOptimizer, dpagg
    from dpgen.efsgd.sanitizer import ErrorFeedbackSanitizer
    from dpgen.efsgd.train import encoder_input
    from dpgen.feta.central import query_central
    from dpgen.feta.dpsgd import set_noisy_grads
    from dpgen.gpate.aggregate import confident_gnmax, dp_grad_agg
    from dpgen.gpate.train import laplace_noise, private_class_prior
    from dpgen.privacy import gaussian_sum_query
    from dpgen.privacy.optimizer import DPSGDOptimizer
    from dpgen.privacy.sampling import PoissonSampler, poisson_batch, poisson_chunk, uniform_member

    x = torch.rand(6, 1, 4, 4)
    y = torch.tensor([0, 1, 0, 1, 0, 1])

    def sanitize(cls, *extra, **kw):
        def call(g):
            san = cls(1.0, 1.0, *extra, generator=g, **kw)
            out = san(torch.ones(2, 3, requires_grad=True), *((torch.zeros(1, dtype=torch.long), torch.tensor([0, 1]))
                                                            if extra else ()))
            out.sum().backward()
        return call

    def dp_optimizer(cls):
        def call(g):
            opt = cls(torch.optim.SGD([torch.nn.Parameter(torch.zeros(3))], lr=0.1), noise_multiplier=1.0,
                      max_grad_norm=1.0, expected_batch_size=2, generator=g)
            p = opt.params[0]
            p.grad_sample = torch.ones(2, 3)
            opt.step()
        return call

    def grad_agg(g):
        grads = [(0, 3, torch.randn(3, 2, 1, 4, 4))]
        dp_grad_agg(grads, (1, 4, 4), 1.0, 5, 2, 1.0, 1.0, 1.0, torch.Generator(), g, 2, CPU)

    return [
        ("gaussian_noise", lambda g: gaussian_noise((3,), 1.0, g)),
        ("gaussian_sum_query", lambda g: gaussian_sum_query(torch.ones(2, 3), sensitivity=1.0, noise_multiplier=1.0,
                                                             record=PrivacyLedger(delta=1e-5), generator=g)),
        ("DP-SGD optimizer", dp_optimizer(DPSGDOptimizer)),
        ("dpaf compressed DP-SGD optimizer", dp_optimizer(CompressedDPOptimizer)),
        ("feta DP-SGD noise", lambda g: set_noisy_grads([torch.nn.Parameter(torch.zeros(3))], [torch.ones(3)], 1.0, 1.0,
                                                        2.0, g)),
        ("Poisson batch", lambda g: poisson_batch(10, 0.5, g, CPU)),
        ("Poisson chunk", lambda g: poisson_chunk(10, 0.5, 3, g, CPU)),
        ("Poisson sampler", lambda g: PoissonSampler(10, 0.5, g, 2, CPU)(0)),
        ("partition draw", lambda g: uniform_member(4, g, CPU)),
        ("partition batches", lambda g: Partitions([[0, 1], [2, 3]], CPU).sample(torch.tensor([1]), 2, g)),
        ("GS-WGAN/DPAC sanitizer", sanitize(Sanitizer)),
        ("EFSGD error-feedback sanitizer", sanitize(ErrorFeedbackSanitizer, 1.0, classes=2)),
        ("EFSGD code release", lambda g: encoder_input(torch.ones(2, 3), torch.tensor([0, 1]), 2, True, 1.0, 1.0, g)),
        ("DPAGG", lambda g: dpagg(torch.ones(4, 3), 1.0, 1.0, 4.0, g)),
        ("DP-FETA central images", lambda g: query_central("mean", x, y, 2, num_images=2, q=0.5, sigma=1.0,
                                                           ledger=PrivacyLedger(delta=1e-5), generator=g)),
        ("Confident-GNMax", lambda g: confident_gnmax(torch.ones(3, 4), 1.0, 1.0, 1.0, g)),
        ("G-PATE DPGradAgg", grad_agg),
        ("Laplace noise", lambda g: laplace_noise(3, 1.0, g)),
        ("G-PATE Laplace class prior", lambda g: private_class_prior(y.numpy(), 2, 1.0, PrivacyLedger(delta=1e-5), g)),
    ]


ENTRY_POINTS = _entry_points()


@pytest.mark.parametrize("name,call", ENTRY_POINTS, ids=[n for n, _ in ENTRY_POINTS])
def test_every_mechanism_refuses_a_public_stream(name, call):
    call(secret_generator(CPU, seed=0))  # the entry point works with a secret stream ...
    public = torch.Generator(device=CPU)
    public.manual_seed(0)
    for g in (public, None):  # ... and refuses the public seed's streams and torch's global RNG
        with pytest.raises(PublicRandomnessError):
            call(g)


# ---- whole methods: no replay without noise_seed ---------------------------------------------------------

def _weights(gen: torch.nn.Module) -> torch.Tensor:
    return torch.cat([t.detach().flatten().double() for t in gen.state_dict().values() if t.dtype.is_floating_point])


@pytest.mark.parametrize("method", METHODS)
def test_a_replay_of_the_public_config_does_not_reproduce_the_release(tmp_path, method):
    """Two runs of the same public config on the same data (the attacker's replay) release different generators;
    with one ``privacy.noise_seed`` they are bit-identical (and such a run is not private, see below)."""
    from dpgen.data import load_dataset

    data = load_dataset("digits", str(tmp_path / "data"))
    secret = [_weights(train_in_memory(method, tmp_path / f"s{i}", data=data)[0]) for i in range(2)]
    fixed = [_weights(train_in_memory(method, tmp_path / f"f{i}", data=data, noise_seed=11)[0]) for i in range(2)]
    assert not torch.equal(secret[0], secret[1]), f"{method}: two runs of one public config released the same generator"
    assert torch.equal(fixed[0], fixed[1]), f"{method}: privacy.noise_seed does not make the run reproducible"


def test_a_fixed_noise_seed_voids_the_guarantee():
    ledger = PrivacyLedger(delta=1e-5, target_epsilon=10.0, fixed_randomness=True)
    ledger.record("q", [1.0], count=3)
    out = ledger.to_json()
    assert out["valid_dp_guarantee"] is False and out["secret_randomness"] is False
    assert any("noise_seed" in n for n in out["notes"])
    assert PrivacyLedger.from_json(out).fixed_randomness
    restored = PrivacyLedger(delta=0.5)
    restored.load_state_dict(ledger.state_dict())
    assert restored.fixed_randomness and not restored.valid_dp_guarantee
    secret = PrivacyLedger(delta=1e-5, target_epsilon=10.0)
    secret.record("q", [1.0], count=3)
    assert secret.to_json()["valid_dp_guarantee"] is True and secret.to_json()["secret_randomness"] is True


# ---- secure noise --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("secure", [False, True])
def test_secure_noise_has_the_same_mean_and_std(secure):
    n, std = 400_000, 2.5
    x = gaussian_noise((n,), std, secret_generator(CPU, seed=1, secure_noise=secure), dtype=torch.float64)
    assert abs(float(x.mean())) < 0.03 * std
    assert abs(float(x.std()) / std - 1.0) < 0.03


def test_secure_noise_sums_several_draws():
    plain = gaussian_noise((1000,), 1.0, secret_generator(CPU, seed=4))
    secure = gaussian_noise((1000,), 1.0, secret_generator(CPU, seed=4, secure_noise=True))
    g = secret_generator(CPU, seed=4)
    draws = [torch.randn(1000, generator=g) for _ in range(SECURE_DRAWS)]
    assert torch.equal(plain, draws[0])
    assert torch.allclose(secure, sum(draws) / SECURE_DRAWS ** 0.5, atol=1e-6)


def test_forks_are_independent_secret_streams():
    g = secret_generator(CPU, seed=9, secure_noise=True)
    f0, f0_again, f1 = g.fork(0), g.fork(0), g.fork(1)
    assert isinstance(f0, SecretGenerator) and f0.secure_noise
    assert torch.equal(_draw(f0), _draw(f0_again)) and not torch.equal(_draw(g.fork(0)), _draw(f1))
    assert f0.initial_seed() == derive_seed(9, "fork0")


# ---- the secret root never reaches a released file -----------------------------------------------------------

def _needles(streams: dict) -> dict[str, bytes]:
    """Byte patterns the secret root or a secret stream's seed would leave in a file."""
    root = streams["root"]
    out = {"root (hex)": root.encode(), "root (int)": str(int(root, 16)).encode()}
    for name in streams["secret"]:
        seed = derive_seed(root, name)
        out[f"{name} seed (int)"] = str(seed).encode()
        out[f"{name} seed (bytes)"] = seed.to_bytes(8, "little")
    return out


def test_the_secret_root_is_in_the_checkpoint_and_nowhere_else(trained_run: Path):
    from dpgen.core.checkpoint import load_checkpoint

    streams = load_checkpoint(trained_run / "checkpoints" / "last.pt")["streams"]
    assert streams["secret"], "the run used no secret stream"
    needles = _needles(streams)
    ckpt_bytes = (trained_run / "checkpoints" / "last.pt").read_bytes()
    assert needles["root (hex)"] in ckpt_bytes  # the search finds it where it is ...
    released = [p for p in trained_run.rglob("*")
                if p.is_file() and "checkpoints" not in p.relative_to(trained_run).parts]
    assert {p.name for p in released} >= {"generator.pt", "privacy.json", "metrics.json", "samples.png", "train.log"}
    for path in released:  # ... and nowhere else (names included)
        blob = path.read_bytes() + str(path.relative_to(trained_run)).encode()
        found = [k for k, v in needles.items() if v in blob]
        assert not found, f"{path.relative_to(trained_run)} holds the {found}"
    privacy = json.loads((trained_run / "privacy.json").read_text())
    assert privacy["secret_randomness"] is True and privacy["valid_dp_guarantee"] is True


def test_a_noise_seeded_cli_run_says_it_is_not_private(tmp_path):
    from conftest import TINY, run_script

    run_dir = tmp_path / "run"
    res = run_script("train.py", *TINY, "dpgan.iters=2", "eval.num_samples=100", "privacy.noise_seed=3",
                     f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    privacy = json.loads((run_dir / "privacy.json").read_text())
    assert privacy["valid_dp_guarantee"] is False and privacy["secret_randomness"] is False
    assert privacy["epsilon"] > 0 and any("noise_seed" in n for n in privacy["notes"])
    assert "NOT private" in (run_dir / "train.log").read_text()
