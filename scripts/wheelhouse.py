#!/usr/bin/env python3
"""Wheels and data for an offline GPU node (docs/clusters.md, "Offline GPU nodes"). Standard library only: the
node runs ``install`` with its own Python, before anything of dpgen can be imported.

    python scripts/wheelhouse.py download [--python-version 3.12] [--dest wheelhouse]   # on a machine with internet
    python scripts/wheelhouse.py data [--src /usr/share/datasets/fashion-mnist] [--dest .data/fashion-mnist]
    python3 scripts/wheelhouse.py install [--wheels wheelhouse] [--target /tmp/site] [--all]    # on the node
    .venv/bin/python scripts/wheelhouse.py freeze      # refresh the constraints from the environment the tests pass in

``download`` fetches, for CPython ``--python-version`` on manylinux x86_64, one wheel per distribution in
:data:`WHEELS` (no dependency resolution: the list is dpgen's runtime dependencies and their own, less what a
CUDA torch image brings: torch, torchvision, numpy, scipy, pillow, PyYAML, ...), each at the version that the
checked-in constraints file (:data:`CONSTRAINTS`) pins, whichever Python runs the script: a mutually compatible
set (hydra-core 1.3 needs antlr4-python3-runtime 4.9 and omegaconf < 2.4; the newest of each is not). Wheels of
other versions left in the folder by an earlier download are removed. A distribution published only as an sdist
(antlr4-python3-runtime 4.9.3, pure Python) is built into a wheel here with ``pip wheel``. scikit-learn and
matplotlib are left out: nothing the GPU check runs imports them (the embedded ``digits`` data do), and their
wheels would double the payload. ``freeze`` writes the constraints file from the versions installed in the Python
running it (the dpgen environment the tests passed in): the one explicit way to change the pins.

``data`` copies the four Fashion-MNIST files into the repository (``.data/fashion-mnist``: the loader reads
``<data_root>/fashion-mnist``), from ``--src`` or, where that lacks them, from the Debian package
``dataset-fashion-mnist`` fetched with ``apt-get download`` (nothing installed); ``install`` installs the wheels
into ``--target`` with ``pip --no-index --no-deps``, skipping the distributions the node's Python already has (its
torch, tensorboard, numpy stay its own) unless ``--all``, after checking that the wheelhouse holds one wheel per
distribution, at the pinned version; then run with ``PYTHONPATH=<target>:$PWD``.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: dpgen's runtime dependencies (pyproject.toml) that a CUDA torch image lacks, with their own dependencies
WHEELS = (
    "opacus", "opt-einsum",                                            # opacus (+ torch, numpy, scipy)
    "dp-accounting", "absl-py", "attrs", "dm-tree", "wrapt",           # dp-accounting (+ mpmath, numpy, scipy)
    "hydra-core", "omegaconf", "antlr4-python3-runtime", "packaging",  # hydra (+ PyYAML)
    "pytorch-fid",                                                     # (+ torch, torchvision, numpy, scipy)
    "tqdm",
    "tensorboard", "tensorboard-data-server", "grpcio", "protobuf", "markdown", "werkzeug",
)
#: published as an sdist only (for the version hydra-core pins): built into a wheel locally
SDIST_ONLY = ("antlr4-python3-runtime",)
#: the pins of :data:`WHEELS` (checked in; ``freeze`` rewrites it)
CONSTRAINTS = Path(__file__).resolve().with_name("wheelhouse-constraints.txt")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
FMNIST_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                "t10k-labels-idx1-ubyte.gz")


def norm(name: str) -> str:
    """A distribution name as PEP 503 compares them (``dm_tree`` = ``dm-tree``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(name: str) -> str | None:
    """The version of ``name`` installed in this Python, or None."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def read_constraints(path: Path = CONSTRAINTS) -> dict[str, str]:
    """``{normalised name: version}`` from a constraints file of ``name==version`` lines (``#`` comments), with
    exactly one pin for each distribution in :data:`WHEELS` and no other."""
    pins: dict[str, str] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9.+!_-]+)", line)
        if m is None:
            raise SystemExit(f"error: {path}:{n}: {line!r} is not name==version")
        name = norm(m[1])
        if name in pins:
            raise SystemExit(f"error: {path}:{n}: {m[1]} pinned twice")
        pins[name] = m[2]
    wanted = {norm(w) for w in WHEELS}
    if set(pins) != wanted:
        missing, extra = sorted(wanted - set(pins)), sorted(set(pins) - wanted)
        raise SystemExit(f"error: {path} must pin exactly the wheelhouse's distributions"
                         f"{'; missing: ' + ', '.join(missing) if missing else ''}"
                         f"{'; not in WHEELS: ' + ', '.join(extra) if extra else ''}")
    return pins


def freeze(path: Path = CONSTRAINTS) -> dict[str, str]:
    """Write the constraints file from the versions installed in this Python (every :data:`WHEELS` entry)."""
    versions = {name: installed(name) for name in WHEELS}
    missing = [n for n, v in versions.items() if v is None]
    if missing:
        raise SystemExit(f"error: not installed in {sys.executable}: {', '.join(missing)} (run freeze in .venv)")
    head = [line for line in (path.read_text().splitlines() if path.is_file() else []) if line.startswith("#")]
    path.write_text("\n".join([*head, *(f"{n}=={v}" for n, v in versions.items())]) + "\n")
    return read_constraints(path)


def download(dest: Path, python_version: str, constraints: Path = CONSTRAINTS) -> list[Path]:
    """One wheel per :data:`WHEELS` entry into ``dest``, for CPython ``python_version`` on manylinux x86_64, at
    the versions ``constraints`` pins (never this Python's); wheels of other versions in ``dest`` are removed."""
    pins = read_constraints(constraints)
    dest.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip"]
    binary = [f"{n}=={pins[norm(n)]}" for n in WHEELS if n not in SDIST_ONLY]
    platform = [a for p in PLATFORMS for a in ("--platform", p)]
    subprocess.run([*pip, "download", "--no-deps", "--only-binary=:all:", "--python-version", python_version,
                    "--implementation", "cp", *platform, "--dest", str(dest), *binary], check=True)
    for name in SDIST_ONLY:  # pure Python: a wheel built here serves any CPython 3
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([*pip, "wheel", "--no-deps", "--wheel-dir", tmp, f"{name}=={pins[norm(name)]}"],
                           check=True)
            for whl in Path(tmp).glob("*.whl"):
                shutil.copy2(whl, dest / whl.name)
    stale = [w for w in sorted(dest.glob("*.whl")) if pins.get(wheel_name(w)) != wheel_version(w)]
    for w in stale:
        w.unlink()
    if stale:
        print(f"wheelhouse: removed wheels not pinned: {', '.join(w.name for w in stale)}", file=sys.stderr)
    return sorted(dest.glob("*.whl"))


def debian_fmnist(workdir: Path) -> Path | None:
    """The Debian package ``dataset-fashion-mnist`` downloaded (``apt-get download``, no root install) and
    unpacked in ``workdir``: the folder with its four files, or None where apt is not available."""
    if not (shutil.which("apt-get") and shutil.which("dpkg-deb")):
        return None
    got = subprocess.run(["apt-get", "download", "dataset-fashion-mnist"], cwd=workdir, capture_output=True, text=True)
    debs = sorted(workdir.glob("dataset-fashion-mnist_*.deb"))
    if got.returncode or not debs:
        print(f"apt-get download dataset-fashion-mnist failed: {got.stderr.strip()[-300:]}", file=sys.stderr)
        return None
    subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(workdir / "root")], check=True)
    return workdir / "root" / "usr" / "share" / "datasets" / "fashion-mnist"


def copy_data(src: Path, dest: Path) -> list[Path]:
    """The four Fashion-MNIST files from ``src`` into ``dest`` (``.gz`` or uncompressed, as found). Where
    ``src`` lacks them, the Debian package is fetched and unpacked in a temporary folder instead."""
    if not all((src / n).is_file() or (src / n[:-3]).is_file() for n in FMNIST_FILES):
        with tempfile.TemporaryDirectory() as tmp:
            unpacked = debian_fmnist(Path(tmp))
            if unpacked is not None:
                print(f"{src} lacks the files: using the package dataset-fashion-mnist", file=sys.stderr)
                return copy_data(unpacked, dest)
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for name in FMNIST_FILES:
        found = next((p for p in (src / name, src / name[:-3]) if p.is_file()), None)
        if found is None:
            raise SystemExit(f"error: {src / name} not found (apt-get install dataset-fashion-mnist, or "
                             f"--src <folder with the four files>)")
        shutil.copy2(found, dest / found.name)
        out.append(dest / found.name)
    return out


def wheel_name(path: Path) -> str:
    """The distribution a wheel file installs (its file name's first field)."""
    return norm(path.name.split("-", 1)[0])


def wheel_version(path: Path) -> str:
    """The version of a wheel file (its file name's second field)."""
    return path.name.split("-")[1]


def check_wheels(files: list[Path], pins: dict[str, str]) -> None:
    """One wheel per distribution, and a pinned distribution's at its pinned version, else a one-line exit."""
    seen: dict[str, str] = {}
    for f in files:
        name = wheel_name(f)
        if name in seen:
            raise SystemExit(f"error: two wheels of {name} in {f.parent} ({seen[name]}, {f.name}): "
                             f"rerun make wheelhouse")
        seen[name] = f.name
        if name in pins and wheel_version(f) != pins[name]:
            raise SystemExit(f"error: {f.name} is not the pinned {name}=={pins[name]} ({CONSTRAINTS.name}): "
                             f"rerun make wheelhouse")


def install(wheels: Path, target: Path, everything: bool, constraints: Path = CONSTRAINTS) -> list[Path]:
    """Install the wheels in ``wheels`` into ``target`` (no index, no dependencies, no byte-compiling), except
    those of distributions this Python already has, unless ``everything``. The wheelhouse must hold the pinned
    versions (:func:`check_wheels`): a wheelhouse from before the constraints file is refused, not installed."""
    files = sorted(wheels.glob("*.whl"))
    if not files:
        raise SystemExit(f"error: no wheels in {wheels} (make wheelhouse on a machine with internet)")
    check_wheels(files, read_constraints(constraints))
    chosen = [f for f in files if everything or installed(wheel_name(f)) is None]
    skipped = sorted({wheel_name(f) for f in files} - {wheel_name(f) for f in chosen})
    if skipped:
        print(f"wheelhouse: already installed, kept: {', '.join(skipped)}", file=sys.stderr)
    if chosen:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--upgrade", "--target", str(target), *map(str, chosen)], check=True)
    print(f"wheelhouse: {len(chosen)} wheels installed into {target}", file=sys.stderr)
    return chosen


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("download", help="wheels for an offline node")
    d.add_argument("--dest", default="wheelhouse")
    d.add_argument("--python-version", default="3.12")
    d.add_argument("--constraints", default=str(CONSTRAINTS), help="the pins (name==version per line)")
    c = sub.add_parser("data", help="copy the Fashion-MNIST files into the repository")
    c.add_argument("--src", default="/usr/share/datasets/fashion-mnist")
    c.add_argument("--dest", default=".data/fashion-mnist")
    i = sub.add_parser("install", help="install the wheels on the node")
    i.add_argument("--wheels", default="wheelhouse")
    i.add_argument("--target", default="/tmp/site")
    i.add_argument("--all", action="store_true", help="also the distributions this Python already has")
    i.add_argument("--constraints", default=str(CONSTRAINTS))
    f = sub.add_parser("freeze", help="write the constraints from this Python's installed versions")
    f.add_argument("--constraints", default=str(CONSTRAINTS))
    a = ap.parse_args(argv)
    if a.cmd == "download":
        files = download(Path(a.dest), a.python_version, Path(a.constraints))
    elif a.cmd == "data":
        files = copy_data(Path(a.src), Path(a.dest))
    elif a.cmd == "freeze":
        pins = freeze(Path(a.constraints))
        print(f"{len(pins)} pins from {sys.executable} in {a.constraints}")
        return
    else:
        install(Path(a.wheels), Path(a.target), a.all, Path(a.constraints))
        return
    size = sum(f.stat().st_size for f in files)
    print(f"{len(files)} files, {size / 2**20:.1f} MiB in {Path(a.dest)}")


if __name__ == "__main__":
    try:
        main()
    except SystemExit as e:  # a refusal (a one-line message) exits 2, as bad input does in dpgen
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            raise SystemExit(2) from None
        raise
