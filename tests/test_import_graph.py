"""dpgen's modules import each other without a cycle, and the privacy layer imports only downward.

The graph is built from the source (``ast``), not by importing: every ``import`` / ``from ... import``
anywhere in a module counts (module level, inside functions and classes, under ``if TYPE_CHECKING``), so
an import moved into a function cannot hide a cycle. ``from pkg import name`` is an edge to the submodule
``pkg.name`` when that is a module and to ``pkg`` otherwise; relative imports are resolved; a literal
``importlib.import_module("dpgen....")`` counts too. A package's ``__init__`` is not an implicit
dependency of its submodules (Python runs it first, but every package that re-exports its submodules
would then be a cycle). Any strongly connected component of more than one module fails, named with the
import lines that close it.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: the accounting stack of dpgen.privacy, bottom first: each module may import only modules before it
PRIVACY_LAYERS = (
    "dpgen.privacy.validation",
    "dpgen.privacy.events",
    "dpgen.privacy.accountants.rdp",
    "dpgen.privacy.accountants.pld",
    "dpgen.privacy.accountants",
    "dpgen.privacy.calibrate",
    "dpgen.privacy.budget",
    "dpgen.privacy.ledger",
)


def package_modules(root: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """``{dotted module name: (file, is_package)}`` for every ``.py`` file of ``root/package``."""
    mods = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return mods


def _known(name: str, mods: dict) -> str | None:
    """The innermost module of ``mods`` that ``name`` is or lies in (``a.b.func`` -> ``a.b``)."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path, package: str) -> dict[str, dict[str, str]]:
    """``{module: {imported module: "file:line"}}`` over the modules of ``package`` (first import line each)."""
    mods = package_modules(root, package)
    graph: dict[str, dict[str, str]] = {m: {} for m in mods}
    for mod, (path, is_pkg) in mods.items():
        here = mod.split(".") if is_pkg else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here[: len(here) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "import_module" and node.args \
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                targets = [node.args[0].value]
            for target in targets:
                dep = _known(target, mods) if target.split(".")[0] == package else None
                if dep and dep != mod:
                    graph[mod].setdefault(dep, f"{path.relative_to(root)}:{node.lineno}")
    return graph


def cycles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def describe(graph: dict[str, dict[str, str]], comp: list[str]) -> str:
    edges = [f"  {a} -> {b} ({graph[a][b]})" for a in comp for b in sorted(graph[a]) if b in comp]
    return "import cycle among " + ", ".join(comp) + ":\n" + "\n".join(edges)


def test_dpgen_has_no_import_cycle():
    graph = import_graph(ROOT, "dpgen")
    assert len(graph) > 50 and "dpgen.privacy.budget" in graph["dpgen.privacy.ledger"]  # the parser sees imports
    found = cycles(graph)
    assert not found, "\n".join(describe(graph, comp) for comp in found)


def test_the_privacy_layers_import_only_downward():
    graph = import_graph(ROOT, "dpgen")
    for i, mod in enumerate(PRIVACY_LAYERS):
        upward = [f"{dep} ({where})" for dep, where in graph[mod].items()
                  if dep in PRIVACY_LAYERS[i:] or dep == "dpgen.privacy"]
        assert not upward, f"{mod} imports a module at or above its layer: {', '.join(upward)}"
    assert "dpgen.privacy.calibrate" in graph["dpgen.privacy.budget"]


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


@pytest.mark.parametrize("closing_import", [
    "from pkg.a import f\n",                                           # module level
    "def g():\n    from ..a import f\n",                               # relative, inside a function
    "import pkg.a as a\n",                                             # plain import
    "import typing\nif typing.TYPE_CHECKING:\n    from .. import a\n",  # a submodule, type-only
    "import importlib\nA = importlib.import_module('pkg.a')\n",        # by a literal name
])
def test_a_cycle_is_found_however_it_is_imported(tmp_path, closing_import):
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.sub.b import g\ndef f():\n    pass\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/b.py": closing_import,
    })
    graph = import_graph(tmp_path, "pkg")
    assert cycles(graph) == [["pkg.a", "pkg.sub.b"]], graph
    assert "pkg.sub.b -> pkg.a (pkg/sub/b.py:" in describe(graph, ["pkg.a", "pkg.sub.b"])


def test_a_package_reexporting_its_submodules_is_no_cycle(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": "from pkg.a import f\nfrom .b import g\n",
        "pkg/a.py": "from pkg.b import g\ndef f():\n    pass\n",
        "pkg/b.py": "import os\ndef g():\n    pass\n",
    })
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg"] == {"pkg.a": "pkg/__init__.py:1", "pkg.b": "pkg/__init__.py:2"}
    assert cycles(graph) == []
