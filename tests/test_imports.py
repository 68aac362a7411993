"""The import graph of ``nsa`` and ``nsa_tui``, read from the source with ``ast``.

Why: a cycle between modules works only while every import in it stays lazy or in the right
order, and the layers must point one way: the kernels (``nsa.ops``) are below the model
(``nsa.model``), which calls them. Every import counts, lazy ones inside functions too;
imports under ``if TYPE_CHECKING:`` do not (they never run).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("nsa", "nsa_tui")


def modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of ``packages`` under ``root``."""
    out = {}
    for pkg in packages:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = f.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(node: ast.AST) -> Iterable[ast.Import | ast.ImportFrom]:
    """Every import statement under ``node``, except the bodies of ``if TYPE_CHECKING:``."""
    if isinstance(node, ast.If) and _is_type_checking(node.test):
        for sub in node.orelse:
            yield from _imports(sub)
        return
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
    for child in ast.iter_child_nodes(node):
        yield from _imports(child)


def _known(name: str, mods: dict[str, Path]) -> str | None:
    """The deepest module of ours that ``name`` (a module or a name in one) lives in."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports. Importing a module's own parent package is no
    edge: Python imports the parent first anyway, and ``__init__`` re-exports are the norm."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                dep = _known(t, mods)
                if dep is not None and dep != mod and not mod.startswith(dep + "."):
                    graph[mod].add(dep)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def path_between(graph: dict[str, set[str]], starts: Iterable[str], goal_prefix: str) -> list[str] | None:
    """An import chain from one of ``starts`` to a module under ``goal_prefix`` (breadth first)."""
    seen = {s: [s] for s in starts}
    todo = list(seen)
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v]):
            if w in seen:
                continue
            seen[w] = seen[v] + [w]
            if w == goal_prefix or w.startswith(goal_prefix + "."):
                return seen[w]
            todo.append(w)
    return None


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(modules(ROOT, PACKAGES))


def test_no_import_cycles(graph: dict[str, set[str]]) -> None:
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_ops_do_not_import_the_model(graph: dict[str, set[str]]) -> None:
    chain = path_between(graph, [m for m in graph if m == "nsa.ops" or m.startswith("nsa.ops.")], "nsa.model")
    assert chain is None, "nsa.ops reaches nsa.model: " + " -> ".join(chain or [])


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_checker_sees_lazy_and_relative_imports_and_skips_type_checking(tmp_path: Path) -> None:
    """The checks above can fail: a lazy import and a relative one close a cycle; a
    ``TYPE_CHECKING`` import does not; a parent package's re-export is no cycle."""
    _write(tmp_path, {
        "p/__init__.py": "from p.a import f\n",
        "p/a.py": "def f():\n    from p.b import g\n    return g()\n",
        "p/b.py": "from . import c\n",
        "p/c.py": "import p.a\n",
        "p/d.py": "import typing\nif typing.TYPE_CHECKING:\n    from p.e import h\nelse:\n    h = 1\n",
        "p/e.py": "from p import d\n",
    })
    g = import_graph(modules(tmp_path, ["p"]))
    assert g["p"] == {"p.a"}
    assert g["p.b"] == {"p.c"}
    assert g["p.d"] == set()
    assert cycles(g) == [["p.a", "p.b", "p.c"]]
    assert path_between(g, ["p.b"], "p.a") == ["p.b", "p.c", "p.a"]
    assert path_between(g, ["p.e"], "p.c") is None
