"""Layers: the `prefixscan` package has no import cycle (issue 29).

A cycle means no module of it can be read, tested or moved alone, and import order decides what works. The
import graph is built statically with `ast` from every module of the package, so a function-level (lazy)
import counts as much as a module-level one: hiding an import inside a function does not break a cycle.
What is left out: imports under `if TYPE_CHECKING:` (they never run), and the implicit import of a parent
package's `__init__` when a submodule is imported (an `__init__` that re-exports its submodules would
otherwise put every package in a cycle with its own children). Library modules must not import the
top-level `prefixscan` package (it re-exports the public API, so it sits on top of everything).

`ALLOWED` lists the cycles not broken yet; it can only shrink: the test fails when a new cycle appears and
when a listed one is gone (then delete it from the list).
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = "prefixscan"

# Cycles not broken yet (each a strongly connected component of the import graph, as a set of module names).
# Empty: keep it so. A cycle is broken by moving the shared piece down a layer, not by a lazy import.
ALLOWED: set[frozenset[str]] = set()


def _modules(root: Path) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its `__init__.py`)."""
    mods: dict[str, Path] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _is_type_checking(test: ast.expr) -> bool:
    """`if TYPE_CHECKING:` or `if typing.TYPE_CHECKING:`."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement in the tree, at any depth, except those under `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the package modules it imports (an import of `a.b.name` points at module `a.b` unless
    `a.b.name` is itself a module)."""
    mods = _modules(root)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [resolve(alias.name) for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    head = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(head + ([base] if base else []))
                targets = [resolve(f"{base}.{alias.name}") if f"{base}.{alias.name}" in mods else resolve(base)
                           for alias in node.names]
            graph[mod].update(t for t in targets if t and t != mod)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    comp.add(member)
                    if member == node:
                        break
                if len(comp) > 1:
                    found.append(frozenset(comp))
    return found


def _show(comps: list[frozenset[str]] | set[frozenset[str]]) -> str:
    return "\n".join("  " + " <-> ".join(sorted(c)) for c in sorted(comps, key=sorted)) or "  (none)"


def test_the_graph_sees_lazy_imports_and_skips_type_checking(tmp_path: Path) -> None:
    """The graph counts an import inside a function and leaves out one under `if TYPE_CHECKING:`."""
    pkg = tmp_path / PACKAGE
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from prefixscan import b\n    return b\n")
    (pkg / "b.py").write_text("from . import c\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from prefixscan.b import x\n"
                              "else:\n    import prefixscan.a\n")
    graph = import_graph(tmp_path)
    assert graph["prefixscan.a"] == {"prefixscan.b"}
    assert graph["prefixscan.b"] == {"prefixscan.c"}
    assert graph["prefixscan.c"] == {"prefixscan.a"}
    assert cycles(graph) == [frozenset({"prefixscan.a", "prefixscan.b", "prefixscan.c"})]


def test_no_import_cycle() -> None:
    """No new cycle, and every cycle still listed in ALLOWED still exists (the list only shrinks)."""
    found = set(cycles(import_graph()))
    new = found - ALLOWED
    gone = ALLOWED - found
    assert not new, "import cycles (move the shared piece down a layer):\n" + _show(new)
    assert not gone, "these cycles are broken: delete them from ALLOWED in tests/test_layers.py:\n" + _show(gone)


# The package's layers, bottom first: a module imports only from its own layer or the ones below it. The
# folders follow the data (read -> encode -> reuse -> findings -> sim -> cost -> report), with the run
# directory under them and the command line on top (docs/architecture.md). Names are the part of a module's
# dotted name after `prefixscan.`; a name missing here fails the test, so a new folder gets a place.
LAYERS: list[set[str]] = [
    {"version", "errors", "config", "schema", "memory", "startup", "affixes", "redact", "privacy"},
    {"run"},
    {"read"},
    {"encode"},
    {"hardware"},
    {"reuse"},
    {"detect"},
    {"pilot"},
    {"sim"},
    {"cost"},
    {"evidence"},
    {"compare"},
    {"report"},
    {"query"},
    {"pipeline"},
    {"fix", "synth"},
    {""},  # the package itself: `prefixscan.analyze` and the public names
    {"cli"},
    {"__main__"},
]


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{module}: its folder {top!r} has no layer in tests/test_layers.py LAYERS")


def test_imports_point_down() -> None:
    """Every import (lazy ones included) goes to the importer's own layer or one below it."""
    up = sorted(f"{a} -> {b}" for a, targets in import_graph().items() for b in targets if _layer(b) > _layer(a))
    assert not up, "imports that point up a layer (move the shared piece down):\n  " + "\n  ".join(up)
