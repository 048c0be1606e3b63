"""GS-WGAN as its own package (dpgen/gswgan): the registry entry, the legacy generator name, the extension points.

* ``method=gswgan`` runs :mod:`dpgen.gswgan` (multi-process capable), ``dpac`` and ``efsgd`` build on it;
* a ``generator.pt`` written before the move names ``dpgen.dpac.nets:ResNetGenerator``: it still loads, as the
  same weights in the class that now holds them, and nothing else is accepted in its place;
* GS-WGAN refuses a classifier (that is DPAC), and no package imports another's private name.
"""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
import torch

from dpgen.core.generator import load_generator, save_generator
from dpgen.core.methods import LEGACY_GENERATORS, METHODS, RELEASED_GENERATORS, load_method
from dpgen.errors import DpgenError

ROOT = Path(__file__).resolve().parents[1]


def test_gswgan_is_its_own_registry_entry():
    assert METHODS["gswgan"].module == "dpgen.gswgan" and METHODS["gswgan"].multi_process
    assert METHODS["dpac"].module == "dpgen.dpac" and METHODS["efsgd"].module == "dpgen.efsgd"
    gtr = importlib.import_module("dpgen.gswgan.train")  # the package attribute `train` is the function
    assert load_method("gswgan").train is gtr.train
    assert load_method("dpgen.dpac").train is not gtr.train  # dpac's own extension


def test_a_generator_saved_under_the_old_class_name_still_loads(tmp_path):
    from dpgen.gswgan.nets import ResNetGenerator

    gen = ResNetGenerator(10, [1, 28, 28], z_dim=4, width=8)
    save_generator(gen, tmp_path / "generator.pt")
    payload = torch.load(tmp_path / "generator.pt", weights_only=True)
    assert payload["class"] == "dpgen.gswgan.nets:ResNetGenerator"
    payload["class"] = "dpgen.dpac.nets:ResNetGenerator"  # what runs before the move wrote
    torch.save(payload, tmp_path / "old.pt")
    old = load_generator(tmp_path / "old.pt")
    assert type(old) is ResNetGenerator
    for (n, a), b in zip(gen.state_dict().items(), old.state_dict().values()):
        assert torch.equal(a, b), n
    assert set(LEGACY_GENERATORS.values()) <= set(RELEASED_GENERATORS)
    payload["class"] = "dpgen.dpac.nets:GBlock"  # the old module's other names are not aliased
    torch.save(payload, tmp_path / "bad.pt")
    with pytest.raises(DpgenError, match="not a released dpgen generator"):
        load_generator(tmp_path / "bad.pt")


def test_gswgan_refuses_a_classifier(tmp_path):
    from tiny import train_in_memory

    with pytest.raises(DpgenError, match="use method=dpac"):
        train_in_memory("gswgan", tmp_path, "dpac.classifier.enabled=true", "dpac.beta=0.8")


def test_no_package_imports_a_private_name_of_another():
    """The GS-WGAN family shares code through public names and the extension points only."""
    bad = []
    for pkg in ("gswgan", "dpac", "efsgd"):
        for path in sorted((ROOT / "dpgen" / pkg).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dpgen."):
                    other = node.module.split(".")[1]
                    bad += [f"{path.name}: {node.module}.{a.name}" for a in node.names
                            if other != pkg and a.name.startswith("_")]
    assert not bad, bad
