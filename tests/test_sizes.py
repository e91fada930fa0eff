"""Sizes: no module of `prefixscan` over 500 lines, no function over 100 (issue 29).

A module a reader cannot take in, or a function that does five things, is where a change goes wrong. Lines
are physical lines: a module's lines as `wc -l` counts them, a function's from its `def` line to its last
line (decorators left out, a nested function counted on its own as well as inside its parent).

`MODULES` and `FUNCTIONS` list today's offenders with their current size, a ceiling that may only come
down (lower an entry when its offender shrinks). The test fails when an offender grows past its entry, when
one is back under the limit or gone but still listed (delete the entry), and when a new one appears.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = "prefixscan"
MODULE_LIMIT = 500
FUNCTION_LIMIT = 100

# Modules over the limit today (path from the repository root -> lines). Only shrink.
MODULES: dict[str, int] = {
}

# Functions over the limit today ("path:qualified name" -> lines). Only shrink.
FUNCTIONS: dict[str, int] = {
}


def _sources(root: Path) -> dict[str, str]:
    """Every module of the package by its path from `root`."""
    return {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8")
            for p in sorted((root / PACKAGE).rglob("*.py"))}


def module_sizes(root: Path) -> dict[str, int]:
    """Lines of every module of the package."""
    return {path: len(text.splitlines()) for path, text in _sources(root).items()}


def function_sizes(root: Path) -> dict[str, int]:
    """Lines of every function and method of the package, by "path:qualified name"."""
    sizes: dict[str, int] = {}

    def walk(node: ast.AST, path: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    sizes[f"{path}:{name}"] = (child.end_lineno or child.lineno) - child.lineno + 1
                walk(child, path, f"{name}.")
            else:
                walk(child, path, prefix)

    for path, text in _sources(root).items():
        walk(ast.parse(text), path, "")
    return sizes


def over_limit_problems(sizes: dict[str, int], allowed: dict[str, int], limit: int, what: str) -> list[str]:
    """What is wrong with `sizes` against the limit and the shrink-only allow-list (empty: nothing)."""
    problems = []
    for name, n in sorted(sizes.items()):
        if n <= limit:
            continue
        if name not in allowed:
            problems.append(f"new {what} over {limit} lines: {name} ({n})")
        elif n > allowed[name]:
            problems.append(f"{what} grew: {name} {allowed[name]} -> {n} lines (shrink it)")
    for name in sorted(allowed):
        if sizes.get(name, 0) <= limit:
            problems.append(f"{what} {name} is no longer over {limit} lines (or gone): delete its entry")
    return problems


def test_no_module_over_500_lines() -> None:
    assert over_limit_problems(module_sizes(ROOT), MODULES, MODULE_LIMIT, "module") == []


def test_no_function_over_100_lines() -> None:
    assert over_limit_problems(function_sizes(ROOT), FUNCTIONS, FUNCTION_LIMIT, "function") == []


def test_the_allow_lists_only_shrink() -> None:
    """The check itself: a grown, a new and a vanished offender are each reported; a shrunk one is not."""
    allowed = {"a.py": 600, "b.py": 550, "c.py": 520}
    sizes = {"a.py": 601, "b.py": 540, "c.py": 100, "d.py": 501, "e.py": 500}
    got = over_limit_problems(sizes, allowed, 500, "module")
    assert got == [
        "module grew: a.py 600 -> 601 lines (shrink it)",
        "new module over 500 lines: d.py (501)",
        "module c.py is no longer over 500 lines (or gone): delete its entry",
    ]
    assert over_limit_problems({"a.py": 600}, {"a.py": 600}, 500, "module") == []


def test_function_sizes_count_def_to_last_line_and_nested_ones(tmp_path: Path) -> None:
    pkg = tmp_path / PACKAGE
    pkg.mkdir()
    (pkg / "m.py").write_text("@dec\ndef f():\n    def g():\n        pass\n    return g\n\n\nclass C:\n"
                              "    def h(self):\n        return 1\n")
    assert function_sizes(tmp_path) == {"prefixscan/m.py:f": 4, "prefixscan/m.py:f.g": 2,
                                        "prefixscan/m.py:C.h": 2}
    assert module_sizes(tmp_path) == {"prefixscan/m.py": 10}


def test_the_package_never_imports_the_test_oracles() -> None:
    """The oracles in tests/oracles/ are for the tests only: the product must not run them."""
    for path, text in _sources(ROOT).items():
        for node in ast.walk(ast.parse(text)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "tests" or n.startswith("tests.") for n in names), path
