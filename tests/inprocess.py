"""Call the scripts' entry points in this process (no interpreter start-up): ``scripts/train.py``'s and ``audit.py``'s
``check_args`` (everything it checks before Hydra creates a directory) and the other scripts' ``cli``.
Each returns what a shell would see: the exit code, stdout and stderr."""
from __future__ import annotations

import importlib.util
import sys
from functools import lru_cache
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


@lru_cache(maxsize=None)
def script(name: str) -> ModuleType:
    """``scripts/<name>.py`` imported as a module (its ``__main__`` block does not run)."""
    spec = importlib.util.spec_from_file_location(f"dpgen_script_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def call(capsys, name: str, *args: str) -> tuple[int, str, str]:
    """Run ``scripts/<name>.py args`` in-process: (exit code, stdout, stderr). For train.py only the checks
    before Hydra (``check_args``) run: a bad input must stop there."""
    mod = script(name)
    entry = mod.check_args if name in ("train", "audit") else mod.cli
    capsys.readouterr()
    try:
        entry(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.strip().splitlines() if ln.startswith("error:")]


def one_error(code: int, stderr: str) -> str:
    """Assert the bad-input contract (exit 2, exactly one ``error:`` line, no traceback); return that line."""
    lines = error_lines(stderr)
    assert code == 2, (code, stderr[-2000:])
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-2000:]
    return lines[0]


def files_in(root: Path) -> dict[str, int]:
    """Every file and directory under ``root`` (path -> size; -1 for directories)."""
    return {str(p.relative_to(root)): (p.stat().st_size if p.is_file() else -1) for p in root.rglob("*")}
