"""The privacy-mutation gate's runner (tests/privacy_mutants.py) on a tiny fake tree: a mutant counts as killed only
when its tests ran and one failed; a collection error, a fixture's error and a timeout are verdicts of their own,
and every verdict but 'killed' fails the gate."""
from __future__ import annotations

from pathlib import Path

import pytest

import privacy_mutants as pm

TESTS = '''
import time

import pytest

from pkg import VALUE, slow


@pytest.fixture
def checked_value():
    if VALUE < 0:
        raise RuntimeError("the fixture cannot build")
    return VALUE


def test_value():
    assert VALUE == 1


def test_fixture(checked_value):
    assert checked_value >= 0


@pytest.mark.timeout(1)
def test_slow():
    time.sleep(slow())


def test_hang():
    time.sleep(slow())
'''


@pytest.fixture
def tree(tmp_path: Path, monkeypatch) -> Path:
    (tmp_path / "pkg.py").write_text("VALUE = 1\n\n\ndef slow():\n    return 0\n")
    (tmp_path / "test_fake.py").write_text(TESTS)
    # pytest starts in a second, not five, without the installed plugins (hydra, nbmake, ...); pytest-timeout by name
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["pytest_timeout"]\n')
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    return tmp_path


def _verdict(tree: Path, original: str, mutant: str, *tests: str, timeout: int = 60) -> str:
    m = pm.Mutant("fake", "pkg.py", original, mutant, tests or ("test_fake.py",))
    verdict, _ = pm.run_mutant(m, tree, timeout)
    assert (tree / "pkg.py").read_text().startswith("VALUE = 1\n"), "the runner restores the file"
    return verdict


def test_a_failing_test_kills_and_a_passing_run_survives(tree):
    assert _verdict(tree, "VALUE = 1", "VALUE = 2", "test_fake.py::test_value") == "killed"
    assert _verdict(tree, "VALUE = 1", "VALUE = 1  # same") == "survived"


def test_an_import_error_is_an_error_not_a_kill(tree):
    for mutant in ("VALUE = (1", "VALUE = undefined_name"):  # SyntaxError / NameError at import
        verdict = _verdict(tree, "VALUE = 1", mutant)
        assert verdict.startswith("error: collection failed"), verdict


def test_a_fixture_error_is_an_error_not_a_kill(tree):
    verdict = _verdict(tree, "VALUE = 1", "VALUE = -1", "test_fake.py::test_fixture")
    assert verdict.startswith("error: ") and "the fixture cannot build" in verdict, verdict


def test_timeouts_are_not_kills(tree):
    # pytest-timeout stops the test (reported by pytest as a failure "Timeout")
    verdict = _verdict(tree, "    return 0", "    return 30", "test_fake.py::test_slow")
    assert verdict.startswith("timeout: ") and "Timeout" in verdict, verdict
    # the runner's own limit on the whole run
    verdict = _verdict(tree, "    return 0", "    return 30", "test_fake.py::test_hang", timeout=3)
    assert verdict.startswith("timeout: its tests ran past 3 s"), verdict


def test_stale_entries_fail_the_gate(tree):
    assert _verdict(tree, "VALUE = 3", "VALUE = 4").startswith("stale: original line found 0 times")
    assert _verdict(tree, "VALUE = 1", "VALUE = 2", "test_fake.py::test_missing").startswith("error: pytest usage")


@pytest.mark.parametrize("verdict", ["survived", "stale: x", "error: x", "timeout: x"])
def test_only_killed_passes_the_gate(tree, monkeypatch, capsys, verdict):
    monkeypatch.setattr(pm, "MUTANTS", [pm.Mutant("fake", "pkg.py", "VALUE = 1", "VALUE = 2", ("test_fake.py",))])
    monkeypatch.setattr(pm, "ROOT", tree)
    monkeypatch.setattr(pm, "_copy_tree", lambda dst: None)
    monkeypatch.setattr(pm, "run_mutant", lambda m, t, timeout: (verdict, 0.0))
    assert pm.main([]) == 1
    assert "not killed: fake" in capsys.readouterr().err
    monkeypatch.setattr(pm, "run_mutant", lambda m, t, timeout: ("killed", 0.0))
    assert pm.main([]) == 0
