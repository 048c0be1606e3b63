"""Files dpgen reads back are untrusted (shared run directories): generator.pt, checkpoints/last.pt,
.hydra/config.yaml on resume=, privacy.json and the evaluator cache. A crafted file must never run code,
import anything but dpgen's registered classes, write anything or allocate without bound: it gets one
``error: ...`` line and exit code 2 (docs/privacy.md, "Sharing and loading generators")."""
from __future__ import annotations

import functools
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from conftest import run_script
from inprocess import call, files_in, one_error

from dpgen.core.generator import (MAX_GENERATOR_ELEMENTS, ReleasedGenerator, load_generator, released_generator_class,
                                  save_generator)
from dpgen.core.methods import RELEASED_GENERATORS
from dpgen.errors import DpgenError
from dpgen.nets.dcgan import CondGenerator

TINY_G = {"num_classes": 10, "shape": [1, 28, 28], "z_dim": 4, "width": 8}


@pytest.fixture
def tree(tmp_path):
    """tmp/run/generator.pt (a real tiny generator) and tmp/victim/ (where a crafted file would write)."""
    run, victim = tmp_path / "run", tmp_path / "victim"
    run.mkdir()
    victim.mkdir()
    save_generator(CondGenerator(**TINY_G), run / "generator.pt")
    return tmp_path


def _good(tree: Path) -> dict:
    return torch.load(tree / "run" / "generator.pt", weights_only=True)


class _Pickled:
    """A pickle payload whose unpickling would write a file (it must never be unpickled)."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        from dpgen.io import atomic_write_json

        return atomic_write_json, ({"owned": True}, self.path)


def _victim(tree: Path, name: str) -> str:
    return str(tree / "victim" / name)


CRAFTED = {
    # a non-dpgen class / function
    "os.system": lambda t: {"class": "os:system", "kwargs": {"command": f"touch {_victim(t, 'sh')}"}},
    "subprocess": lambda t: {"class": "subprocess:run", "kwargs": {"args": ["touch", _victim(t, "sp")]}},
    # dpgen functions that write files (the reproduction in issue 17)
    "atomic_write_json": lambda t: {"class": "dpgen.io:atomic_write_json",
                                    "kwargs": {"obj": {"owned": True}, "path": _victim(t, "written.json")}},
    "atomic_save": lambda t: {"class": "dpgen.io:atomic_save", "kwargs": {"obj": {"owned": True},
                                                                         "path": _victim(t, "written.pt")}},
    # dpgen classes that are not released generators (one would create a run directory's files)
    "discriminator": lambda t: {"class": "dpgen.nets.dcgan:ProjectionDiscriminator",
                                "kwargs": {"num_classes": 10, "shape": [1, 28, 28]}},
    "run": lambda t: {"class": "dpgen.core.run:Run", "kwargs": {"run_dir": _victim(t, "run"), "ledger": None}},
    "base class": lambda t: {"class": "dpgen.core.generator:ReleasedGenerator", "kwargs": {"num_classes": 10}},
    "attribute path": lambda t: {"class": "dpgen.nets.dcgan:CondGenerator.__init__", "kwargs": TINY_G},
    # wrong constructor arguments
    "str for int": lambda t: {"kwargs": {**TINY_G, "num_classes": "10"}},
    "bool for int": lambda t: {"kwargs": {**TINY_G, "width": True}},
    "float for int": lambda t: {"kwargs": {**TINY_G, "z_dim": 4.5}},
    "dict for list": lambda t: {"kwargs": {**TINY_G, "shape": {"path": _victim(t, "x")}}},
    "unknown kwarg": lambda t: {"kwargs": {**TINY_G, "path": _victim(t, "x")}},
    "missing kwarg": lambda t: {"kwargs": {"num_classes": 10}},
    "kwargs not a dict": lambda t: {"kwargs": [10, [1, 28, 28]]},
    # absurd sizes: refused on the meta device, never allocated
    "huge width": lambda t: {"kwargs": {**TINY_G, "width": 10**7}},
    "huge classes": lambda t: {"kwargs": {**TINY_G, "num_classes": 10**11}},
    "huge depth": lambda t: {"class": "dpgen.feta.generator:FetaGenerator", "kwargs": {
        "num_classes": 2, "shape": [1, 8, 8], "sampler": {},
        "unet": {"nf": 4, "ch_mult": [1], "num_res_blocks": 10**6, "attn_res": []}}},
    # weights that do not fit the network
    "wrong shapes": lambda t: {"state_dict": {k: v.reshape(-1) for k, v in _good(t)["state_dict"].items()}},
    "wrong dtype": lambda t: {"state_dict": {k: v.double() if v.is_floating_point() else v
                                             for k, v in _good(t)["state_dict"].items()}},
    "missing weights": lambda t: {"state_dict": {}},
    # the envelope
    "other format": lambda t: {"format": "dpgen-generator/999"},
    "extra key": lambda t: {"code": "print('hi')"},
    # a pickle payload (not weights_only): unpickling it would write victim/pickled.json
    "pickle": lambda t: {"meta": _Pickled(t / "victim" / "pickled.json")},
}

#: what each refusal must say, so that removing one check cannot pass on a later, accidental failure
EXPECTED = {
    "os.system": "not a released dpgen generator",
    "subprocess": "not a released dpgen generator",
    "atomic_write_json": "not a released dpgen generator",
    "atomic_save": "not a released dpgen generator",
    "discriminator": "not a released dpgen generator",
    "run": "not a released dpgen generator",
    "base class": "not a released dpgen generator",
    "attribute path": "not a released dpgen generator",
    "str for int": "num_classes='10' of CondGenerator is not of type int",
    "bool for int": "width=True of CondGenerator is not of type int",
    "float for int": "z_dim=4.5 of CondGenerator is not of type int",
    "dict for list": "shape=",
    "unknown kwarg": "unknown ['path']",
    "missing kwarg": "missing ['shape']",
    "kwargs not a dict": "must be a dict",
    "huge width": "parameter elements",
    "huge classes": "parameter elements",
    "huge depth": "submodules",
    "wrong shapes": "needs",
    "wrong dtype": "torch.float64",
    "missing weights": "missing",
    "other format": "unknown format",
    "extra key": "not a dpgen generator",
    "pickle": "pickled Python objects",
}


def _write(tree: Path, changes: dict) -> None:
    torch.save({**_good(tree), **changes}, tree / "run" / "generator.pt")


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_crafted_generator_is_refused_in_one_line_and_writes_nothing(tree, capsys, case):
    _write(tree, CRAFTED[case](tree))
    before = files_in(tree)
    code, _, err = call(capsys, "sample", f"run={tree / 'run'}", "n=4", f"out={tree / 'out' / 'syn.npz'}")
    line = one_error(code, err)
    assert EXPECTED[case] in line, line
    assert files_in(tree) == before, "a refused generator.pt must not write anything"


def test_truncated_and_non_dict_files_are_refused(tree, capsys):
    path = tree / "run" / "generator.pt"
    blob = path.read_bytes()
    for content in (blob[: len(blob) // 2], b"not a torch file", b""):
        path.write_bytes(content)
        code, _, err = call(capsys, "sample", f"run={tree / 'run'}", "n=4", f"out={tree / 'syn.npz'}")
        assert "corrupt or unreadable" in one_error(code, err)
    torch.save([1, 2, 3], path)
    code, _, err = call(capsys, "sample", f"run={tree / 'run'}", "n=4", f"out={tree / 'syn.npz'}")
    assert "not a dpgen generator" in one_error(code, err)
    assert not (tree / "syn.npz").exists()


def test_the_issue_reproduction_exits_2_in_a_real_process(tree):
    """The one subprocess test: the exit code and stderr a shell sees for the issue's crafted file."""
    _write(tree, CRAFTED["atomic_write_json"](tree))
    res = run_script("sample.py", f"run={tree / 'run'}", "n=10", "out=out.npz", cwd=tree)
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.count("error:") == 1 and "not a released dpgen generator" in res.stderr
    assert not (tree / "victim" / "written.json").exists() and not (tree / "out.npz").exists()


def test_sizes_are_bounded_before_anything_is_allocated(tree, monkeypatch):
    """The element cap is checked on the meta device: lowering it refuses the real tiny generator too,
    and nothing of its size was allocated on the CPU first."""
    import dpgen.core.generator as generator

    ref = CondGenerator(**TINY_G)
    n = sum(p.numel() for p in ref.parameters()) + sum(b.numel() for b in ref.buffers())
    assert n < MAX_GENERATOR_ELEMENTS
    monkeypatch.setattr(generator, "MAX_GENERATOR_ELEMENTS", n - 1)
    made: list[str] = []
    real_init = CondGenerator.__init__

    @functools.wraps(real_init)  # the loader reads the signature and annotations through the wrapper
    def spy(self, *a, **k):
        real_init(self, *a, **k)
        made.append(str(next(self.parameters()).device))

    monkeypatch.setattr(CondGenerator, "__init__", spy)
    with pytest.raises(DpgenError, match="parameter elements"):
        load_generator(tree / "run" / "generator.pt")
    assert made == [], "the generator must be refused while being built on the meta device"
    monkeypatch.setattr(generator, "MAX_GENERATOR_ELEMENTS", n)
    load_generator(tree / "run" / "generator.pt")
    assert made == ["meta", "cpu"]


def _tiny_instances() -> dict[str, ReleasedGenerator]:
    from dpgen.gswgan.nets import ResNetGenerator
    from dpgen.efsgd.nets import NoiseInjectionGenerator
    from dpgen.feta.generator import FetaGenerator
    from dpgen.gpate.nets import GPateGenerator, GPateTabularGenerator

    unet = {"nf": 4, "ch_mult": [1], "num_res_blocks": 1, "attn_res": [], "dropout": 0.0}
    return {
        "dpgen.nets.dcgan:CondGenerator": CondGenerator(**TINY_G),
        "dpgen.gswgan.nets:ResNetGenerator": ResNetGenerator(10, [1, 28, 28], z_dim=4, width=8),
        "dpgen.efsgd.nets:NoiseInjectionGenerator": NoiseInjectionGenerator(10, [1, 28, 28], z_dim=4, width=8),
        "dpgen.gpate.nets:GPateGenerator": GPateGenerator(10, [1, 28, 28], z_dim=4, gf_dim=4, gfc_dim=8),
        "dpgen.gpate.nets:GPateTabularGenerator": GPateTabularGenerator(2, [5], z_dim=4, hidden=8, class_prior=[0.3, 0.7]),
        "dpgen.feta.generator:FetaGenerator": FetaGenerator(2, [1, 8, 8], unet, {"name": "edm", "steps": 2}),
    }


def test_every_registered_generator_round_trips(tmp_path):
    instances = _tiny_instances()
    assert set(instances) == set(RELEASED_GENERATORS)
    for path, gen in instances.items():
        assert released_generator_class(path) is type(gen)
        save_generator(gen, tmp_path / "g.pt")
        back = load_generator(tmp_path / "g.pt")
        assert type(back) is type(gen) and back.init_kwargs == gen.init_kwargs
        for (k, v), (k2, v2) in zip(gen.state_dict().items(), back.state_dict().items()):
            assert k == k2 and torch.equal(v, v2)


def test_an_unregistered_generator_is_never_released(tmp_path):
    class Unlisted(CondGenerator):
        pass

    with pytest.raises(TypeError, match="RELEASED_GENERATORS"):
        save_generator(Unlisted(**TINY_G), tmp_path / "g.pt")
    assert not (tmp_path / "g.pt").exists()


# ---- checkpoints/last.pt ----------------------------------------------------------------------------

def _checkpoint(tmp_path: Path) -> tuple[Path, dict]:
    from conftest import in_memory_run
    from dpgen.privacy import PrivacyLedger

    ledger = PrivacyLedger(delta=1e-5, target_epsilon=1.0)
    ledger.record("x", [1.0], "poisson", 0.01, 5)
    run = in_memory_run(tmp_path, ledger)
    run.secret_rng("noise"), run.rng("fake")  # streams handed out are saved
    run.save_checkpoint(5, {"g": CondGenerator(**TINY_G).state_dict(), "sigma": 1.0,
                            "opt": {"state": {0: {"step": 3}}}})
    path = tmp_path / "checkpoints" / "last.pt"
    return path, torch.load(path, weights_only=True)


def _broken(ckpt: dict, case: str) -> object:
    c = {**ckpt}
    if case == "not a dict":
        return [1, 2]
    if case == "missing key":
        c.pop("rng")
    elif case == "negative step":
        c["step"] = -1
    elif case == "step as text":
        c["step"] = "5"
    elif case == "python rng":
        c["rng"] = {**c["rng"], "python": (3, (1, 2), None)}
    elif case == "numpy rng":
        c["rng"] = {**c["rng"], "numpy": {**c["rng"]["numpy"], "keys": [2**40] * 624}}
    elif case == "torch rng":
        c["rng"] = {**c["rng"], "torch": torch.zeros(7, dtype=torch.uint8)}
    elif case == "generator state":
        c["streams"] = {**c["streams"], "secret": {"noise": torch.zeros(5056)}}
    elif case == "secret root":
        c["streams"] = {**c["streams"], "root": "0" * 63}
    elif case == "pre-secret checkpoint":
        c["generators"] = c.pop("streams")["secret"]
    elif case == "sparse tensor in state":
        c["state"] = {"g": {"w": torch.eye(3).to_sparse()}}
    elif case == "deep state":
        deep: object = 1
        for _ in range(40):
            deep = [deep]
        c["state"] = {"x": deep}
    elif case == "ledger":
        c["ledger"] = {**c["ledger"], "entries": [{**c["ledger"]["entries"][0], "count": "5"}]}
    return c


@pytest.mark.parametrize("case", ["not a dict", "missing key", "negative step", "step as text", "python rng",
                                  "numpy rng", "torch rng", "generator state", "secret root", "pre-secret checkpoint",
                                  "sparse tensor in state", "deep state", "ledger"])
def test_crafted_checkpoint_is_one_line(tmp_path, case):
    from dpgen.core.checkpoint import load_checkpoint
    from dpgen.privacy import PrivacyLedger

    path, ckpt = _checkpoint(tmp_path)
    assert load_checkpoint(path)["step"] == 5
    torch.save(_broken(ckpt, case), path)
    with pytest.raises(DpgenError) as info:
        PrivacyLedger(delta=0.5).load_state_dict(load_checkpoint(path)["ledger"])
    assert "\n" not in str(info.value)


def test_restore_module_checks_shapes_before_loading():
    from dpgen.core.checkpoint import restore_module

    g = CondGenerator(**TINY_G)
    before = {k: v.clone() for k, v in g.state_dict().items()}
    bad = {k: torch.zeros(2, 2) if k == "fc.0.weight" else v for k, v in CondGenerator(**TINY_G).state_dict().items()}
    with pytest.raises(DpgenError, match=r"fc\.0\.weight.*needs"):
        restore_module(g, bad, "state['g']")
    assert all(torch.equal(v, before[k]) for k, v in g.state_dict().items()), "nothing loaded on failure"


# ---- .hydra/config.yaml on resume= --------------------------------------------------------------------

@pytest.fixture
def interrupted(tmp_path, monkeypatch):
    """An interrupted tiny dpgan run as scripts/train.py leaves it: .hydra/config.yaml + checkpoints/last.pt."""
    from conftest import in_memory_run
    from tiny import compose_cfg
    from dpgen.core.pipeline import fingerprint
    from dpgen.privacy import PrivacyLedger

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPGEN_DATA", str(tmp_path / "data"))
    run_dir = tmp_path / "run"
    cfg = compose_cfg("dpgan")
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    run = in_memory_run(run_dir, PrivacyLedger(delta=float(cfg.delta), target_epsilon=10.0))
    run.fingerprint = fingerprint(cfg)
    run.save_checkpoint(2, {})
    return run_dir


def _resume(capsys, run_dir: Path, *extra: str) -> tuple[int, str]:
    from tiny import TINY

    code, _, err = call(capsys, "train", *TINY["dpgan"], f"resume={run_dir}", *extra)
    return code, err


def test_a_valid_interrupted_run_passes_the_resume_checks(interrupted, capsys):
    code, err = _resume(capsys, interrupted)
    assert code == 0, err


def test_crafted_run_config_cannot_import_a_module(interrupted, capsys, tmp_path, monkeypatch):
    """method.module names code dpgen would import: a module that writes a file on import is never imported."""
    (tmp_path / "evil_dpgen_module.py").write_text(
        f"open({str(tmp_path / 'victim-imported')!r}, 'w').write('owned')\ndef train(*a): pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg_file = interrupted / ".hydra" / "config.yaml"
    for module in ("os", "evil_dpgen_module"):
        cfg = OmegaConf.load(cfg_file)
        cfg.method.module = module
        cfg_file.write_text(OmegaConf.to_yaml(cfg))
        before = files_in(tmp_path)
        code, err = _resume(capsys, interrupted)
        assert "method.module" in one_error(code, err) and module in err
        assert files_in(tmp_path) == before
    assert "evil_dpgen_module" not in sys.modules and not (tmp_path / "victim-imported").exists()


@pytest.mark.parametrize("edit, needle", [
    (lambda text: text + "not_a_key: 1\n", "unknown key not_a_key"),
    (lambda text: "- a list\n", "not a mapping"),
    (lambda text: text.replace("seed: 0", "seed: [1, 2]"), "seed"),
    (lambda text: text.replace("seed: 0", "seed: -4"), "seed=-4 is invalid"),
    (lambda text: "{{{", "unreadable YAML"),
    (lambda text: text * 20000, "larger than a run config"),
])
def test_damaged_run_config_is_one_line(interrupted, capsys, edit, needle):
    cfg_file = interrupted / ".hydra" / "config.yaml"
    cfg_file.write_text(edit(cfg_file.read_text()))
    code, err = _resume(capsys, interrupted)
    assert needle in one_error(code, err)


def test_resume_with_other_settings_is_refused_before_anything_is_written(interrupted, capsys, tmp_path):
    before = files_in(tmp_path)
    code, err = _resume(capsys, interrupted, "eps=3")
    assert "differs" in one_error(code, err) and "eps" in err
    assert files_in(tmp_path) == before


# ---- privacy.json -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("change", [
    {"entries": "abc"}, {"entries": [{"name": "x", "noise_multipliers": ["1"]}]},
    {"entries": [{"name": "x", "noise_multipliers": [1.0], "count": "3"}]},
    {"entries": [{"name": "x", "noise_multipliers": [1.0], "count": 10**30}]},
    {"entries": [{"name": ["x"], "noise_multipliers": [1.0]}]}, {"notes": "abc"}, {"notes": [1]},
    {"delta": "abc"}, {"delta": 2.0}, {"target_epsilon": "inf"}, {"accounting": ["sound"]}, {"accountant": "exact"},
])
def test_crafted_privacy_json_is_one_line(change):
    from dpgen.privacy import PrivacyLedger

    ledger = PrivacyLedger(delta=1e-5, target_epsilon=1.0)
    ledger.record("x", [1.0], "poisson", 0.01, 5)
    good = ledger.to_json()
    assert PrivacyLedger.from_json(good).epsilon() == pytest.approx(ledger.epsilon())
    with pytest.raises(DpgenError) as info:
        PrivacyLedger.from_json({**good, **change})
    assert "\n" not in str(info.value)
    with pytest.raises(DpgenError):
        PrivacyLedger.from_json([good])


def test_privacy_json_of_the_privacy_off_reference_still_loads():
    from dpgen.privacy import PrivacyLedger

    ledger = PrivacyLedger(delta=1e-5, target_epsilon=math.inf)
    ledger.record("x", [0.0], "poisson", 0.01, 5)
    assert PrivacyLedger.from_json(ledger.to_json()).epsilon() == math.inf


# ---- the evaluator cache -------------------------------------------------------------------------------

def test_evaluator_cache_ignores_entries_it_did_not_write(tmp_path):
    from dpgen.eval import cache

    path = tmp_path / "c.pt"
    good = {"state_dict": {"w": torch.ones(2)}, "info": {"epochs": 1}}
    cache.save_torch(path, good)
    assert torch.equal(cache.load_torch(path)["state_dict"]["w"], torch.ones(2))
    for bad in ({"state_dict": [1, 2]}, {"state_dict": {"w": 3}}, {"state_dict": {"w": torch.ones(2)}, "info": [1]},
                {"state_dict": {"w": torch.eye(2).to_sparse()}}):
        cache.save_torch(path, bad)
        assert cache.load_torch(path) is None, bad
    torch.save({"x": _Pickled(tmp_path / "pickled.json")}, path)
    assert cache.load_torch(path) is None and not (tmp_path / "pickled.json").exists()

    npz = tmp_path / "s.npz"
    shapes = {"mu": (3,), "sigma": (3, 3), "n": ()}
    cache.save_arrays(npz, mu=np.zeros(3), sigma=np.eye(3), n=np.array(5))
    assert cache.load_arrays(npz, shapes) is not None
    for bad in ({"mu": np.zeros(4), "sigma": np.eye(3), "n": np.array(5)},
                {"mu": np.full(3, np.nan), "sigma": np.eye(3), "n": np.array(5)},
                {"mu": np.array(["a", "b", "c"]), "sigma": np.eye(3), "n": np.array(5)}):
        cache.save_arrays(npz, **bad)
        assert cache.load_arrays(npz, shapes) is None
