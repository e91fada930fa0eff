"""The public API keeps its names: a submodule named like an API function would replace the function on
the package the first time it is imported (`import prefixscan.explain` rebinds `prefixscan.explain`), so a
second `prefixscan.explain(...)` call would hit a module."""

from __future__ import annotations

import importlib
import pkgutil
import types

import prefixscan


def test_public_names_survive_every_submodule_import() -> None:
    for info in pkgutil.walk_packages(prefixscan.__path__, "prefixscan."):
        try:
            importlib.import_module(info.name)
        except ImportError:  # an optional dependency (ray) is absent
            continue
    shadowed = [n for n in prefixscan.__all__ if isinstance(getattr(prefixscan, n), types.ModuleType)]
    assert shadowed == []
    assert all(callable(getattr(prefixscan, n)) for n in prefixscan.__all__ if n != "__version__")
