"""scripts/wheelhouse.py, the offline GPU node's payload (docs/clusters.md, "Offline GPU nodes"): the checked-in
constraints against what the installed dependencies declare, ``download`` taking every version from them (never
from the Python running it), ``install`` refusing a wheelhouse of other versions, and ``data``. No network: every
pip call is captured."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from conftest import ROOT

#: the node's Python, for the environment markers of the declared requirements (make wheelhouse PY=3.12)
TARGET = {"python_version": "3.12", "python_full_version": "3.12.0", "sys_platform": "linux",
          "platform_system": "Linux", "os_name": "posix", "platform_machine": "x86_64",
          "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
#: the dependencies whose declared requirements the pins must meet, at the least (the issue's antlr4 / omegaconf
#: mismatch broke hydra-core: "Could not deserialize ATN with version 3 (expected 4)")
MUST_CHECK = ("hydra-core", "omegaconf", "opacus", "dp-accounting", "pytorch-fid")


@pytest.fixture(scope="module")
def wh():
    spec = importlib.util.spec_from_file_location("wheelhouse", ROOT / "scripts" / "wheelhouse.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def violations(wh, pins: dict[str, str], dists) -> list[str]:
    """Each requirement (for CPython 3.12 on Linux, no extras) that an installed distribution of ``dists``
    declares on a pinned distribution and that the pin does not satisfy."""
    out = []
    for dist in dists:
        for line in importlib.metadata.requires(dist) or []:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(TARGET):
                continue
            name = wh.norm(req.name)
            if name in pins and not req.specifier.contains(pins[name], prereleases=True):
                out.append(f"{dist} {importlib.metadata.version(dist)} requires {line!r}; pinned {name}=={pins[name]}")
    return out


def test_constraints_pin_every_wheel_exactly_once(wh):
    pins = wh.read_constraints()
    assert sorted(pins) == sorted(wh.norm(n) for n in wh.WHEELS)
    lines = [ln.split("#")[0].strip() for ln in wh.CONSTRAINTS.read_text().splitlines()]
    names = [wh.norm(ln.split("==")[0]) for ln in lines if ln]
    assert len(names) == len(set(names)) == len(wh.WHEELS)
    assert all(v and v[0].isdigit() for v in pins.values())


def test_constraints_meet_what_the_installed_dependencies_declare(wh):
    """Every pin satisfies the Requires-Dist of every installed wheelhouse distribution that names it: hydra-core,
    omegaconf, opacus, dp-accounting and pytorch-fid at the least (dm-tree, tensorboard, ... where installed)."""
    pins = wh.read_constraints()
    dists = [n for n in wh.WHEELS if wh.installed(n) is not None]
    assert set(MUST_CHECK) <= set(dists)
    bad = violations(wh, pins, dists)
    assert not bad, "refresh the constraints (docs/clusters.md, Offline GPU nodes):\n" + "\n".join(bad)


def test_the_check_catches_the_newest_of_each(wh):
    """The versions a download without pins fetched (antlr4-python3-runtime 4.13.2, omegaconf 2.4.0) fail it."""
    pins = {**wh.read_constraints(), "antlr4-python3-runtime": "4.13.2", "omegaconf": "2.4.0"}
    bad = violations(wh, pins, MUST_CHECK)
    assert any(b.startswith("hydra-core") and "antlr4" in b for b in bad)
    assert any(b.startswith("hydra-core") and "omegaconf==2.4.0" in b for b in bad)
    assert any(b.startswith("omegaconf") and "antlr4" in b for b in bad)


@pytest.mark.parametrize("text, message", [
    ("opacus==1.6.0\n", "missing: .*hydra-core"),
    ("{all}torch==2.3.0\n", "not in WHEELS: torch"),
    ("{all}omegaconf==2.3.0\n", "omegaconf pinned twice"),
    ("{all}# comment\nomegaconf>=2.3\n", "is not name==version"),
])
def test_constraints_refuse_a_file_that_does_not_pin_each_wheel_once(wh, tmp_path, text, message):
    all_pins = "".join(f"{n}==1.0\n" for n in wh.WHEELS if n != "omegaconf" or "twice" in message)
    path = tmp_path / "c.txt"
    path.write_text(text.format(all=all_pins))
    with pytest.raises(SystemExit, match=message):
        wh.read_constraints(path)


def _fake_pip(calls: list[list[str]]):
    """subprocess.run stand-in: records the command; ``pip download`` / ``pip wheel`` leave a wheel per spec."""
    def run(cmd, check):
        calls.append(cmd)
        where = cmd[cmd.index("--dest") + 1] if "download" in cmd else cmd[cmd.index("--wheel-dir") + 1]
        for arg in cmd:
            if "==" in arg:
                name, version = arg.split("==")
                (Path(where) / f"{name.replace('-', '_')}-{version}-py3-none-any.whl").write_bytes(b"")
    return run


def test_download_takes_every_version_from_the_constraints(wh, tmp_path, monkeypatch):
    """Whatever the running Python has installed (here: every distribution at 4.13.2, or none), pip is asked for
    ``name==pinned`` for every wheel, the sdist-only antlr4 runtime built at its pin too; a stale wheel of another
    version in the folder (an earlier, unpinned download) is removed."""
    pins = wh.read_constraints()
    dest = tmp_path / "wheelhouse"
    dest.mkdir()
    (dest / "antlr4_python3_runtime-4.13.2-py3-none-any.whl").write_bytes(b"")
    (dest / "omegaconf-2.4.0-py3-none-any.whl").write_bytes(b"")
    for installed in (lambda name: "4.13.2", lambda name: None):
        monkeypatch.setattr(wh.importlib.metadata, "version", installed)
        monkeypatch.setattr(wh, "installed", installed)
        calls: list[list[str]] = []
        monkeypatch.setattr(wh.subprocess, "run", _fake_pip(calls))
        files = wh.download(dest, "3.12")
        assert [c[3] for c in calls] == ["download", "wheel"]
        download, wheel = calls
        assert download[download.index("--python-version") + 1] == "3.12"
        asked = [a for a in download + wheel if "==" in a]
        assert sorted(wh.norm(a.split("==")[0]) for a in asked) == sorted(pins)
        assert all(a.split("==")[1] == pins[wh.norm(a.split("==")[0])] for a in asked)
        assert not set(download[download.index("--dest") + 2:]) - set(asked)  # nothing unpinned asked for
        assert wheel[-1] == "antlr4-python3-runtime==4.9.3"
        assert sorted((wh.wheel_name(f), wh.wheel_version(f)) for f in files) == sorted(pins.items())


def test_freeze_writes_this_pythons_versions_and_keeps_the_header(wh, tmp_path, monkeypatch):
    path = tmp_path / "c.txt"
    path.write_text("# how to refresh\nopacus==0.1\n")
    monkeypatch.setattr(wh, "installed", lambda name: "9.9")
    assert wh.freeze(path) == {wh.norm(n): "9.9" for n in wh.WHEELS}
    assert path.read_text().startswith("# how to refresh\nopacus==9.9\n")
    monkeypatch.setattr(wh, "installed", lambda name: None if name == "tqdm" else "1")
    with pytest.raises(SystemExit, match="not installed in .*: tqdm"):
        wh.freeze(path)


def test_wheelhouse_installs_only_what_the_node_lacks(wh, tmp_path, monkeypatch):
    """scripts/wheelhouse.py install: pip without index or dependencies into --target, for the wheels whose
    distribution this Python does not have (here: pytest is kept, the made-up one installed); --all takes all."""
    names = ["dm_tree-0.1.10-cp312-cp312-manylinux_2_28_x86_64.whl", "pytest-8.0.0-py3-none-any.whl",
             "no_such_dist_xyz-1.0-py3-none-any.whl"]
    for n in names:
        (tmp_path / n).write_bytes(b"")
    assert [wh.wheel_name(tmp_path / n) for n in names] == ["dm-tree", "pytest", "no-such-dist-xyz"]
    calls = []
    monkeypatch.setattr(wh.subprocess, "run", lambda cmd, check: calls.append(cmd))
    chosen = wh.install(tmp_path, tmp_path / "site", everything=False)
    assert "no_such_dist_xyz-1.0-py3-none-any.whl" in {c.name for c in chosen}
    assert "pytest-8.0.0-py3-none-any.whl" not in {c.name for c in chosen}
    assert calls[0][1:9] == ["-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--upgrade"]
    assert calls[0][9:11] == ["--target", str(tmp_path / "site")] and calls[0][11:] == [str(c) for c in chosen]
    assert len(wh.install(tmp_path, tmp_path / "site", everything=True)) == 3
    with pytest.raises(SystemExit, match="no wheels"):
        wh.install(tmp_path / "empty", tmp_path / "site", everything=False)


@pytest.mark.parametrize("names, message", [
    (["antlr4_python3_runtime-4.13.2-py3-none-any.whl"], "not the pinned antlr4-python3-runtime==4.9.3"),
    (["omegaconf-2.3.1-py3-none-any.whl", "omegaconf-2.4.0-py3-none-any.whl"], "two wheels of omegaconf"),
])
def test_install_refuses_a_wheelhouse_of_other_versions(wh, tmp_path, monkeypatch, names, message):
    """A wheelhouse made before the pins (the versions of whichever Python ran it) stops before pip runs."""
    for n in names:
        (tmp_path / n).write_bytes(b"")
    calls = []
    monkeypatch.setattr(wh.subprocess, "run", lambda cmd, check: calls.append(cmd))
    with pytest.raises(SystemExit, match=message):
        wh.install(tmp_path, tmp_path / "site", everything=True)
    assert not calls


def test_a_refusal_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "omegaconf-2.4.0-py3-none-any.whl").write_bytes(b"")
    got = subprocess.run([sys.executable, str(ROOT / "scripts" / "wheelhouse.py"), "install", "--wheels",
                          str(tmp_path), "--target", str(tmp_path / "site")], capture_output=True, text=True)
    assert got.returncode == 2 and "Traceback" not in got.stderr
    assert got.stderr.strip().splitlines() == [
        "error: omegaconf-2.4.0-py3-none-any.whl is not the pinned omegaconf==2.3.1 (wheelhouse-constraints.txt): "
        "rerun make wheelhouse"]
    assert not (tmp_path / "site").exists()


def test_wheelhouse_data_copies_the_four_files(wh, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for n in wh.FMNIST_FILES:
        (src / n).write_bytes(n.encode())
    out = wh.copy_data(src, tmp_path / ".data" / "fashion-mnist")
    assert sorted(p.name for p in out) == sorted(wh.FMNIST_FILES)
    assert all(p.read_bytes() == p.name.encode() for p in out)
