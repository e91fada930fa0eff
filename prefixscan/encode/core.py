"""Which per-request encode core runs: the compiled one (`_core.c`, built at install) or the pure-Python
reference it must equal.

The compiled core runs the loops of segment planning, the conversation resume, assembly, the block chain and
the chain cache's resume look-up over the same Python objects; the Python code around it stays the one
definition of what they compute. `PREFIXSCAN_PURE=1` (read at import, so encode workers inherit it) selects
the pure-Python path, as does a machine where the extension did not build: the output is the same bytes
either way (tests/test_encode_core.py), only the speed differs.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

try:  # by name: a compiled leaf that imports nothing of the package (the static import graph sees .py files)
    _compiled: ModuleType | None = importlib.import_module("prefixscan.encode._core")
except ImportError:  # not built (no compiler at install, or a source tree never built): pure Python
    _compiled = None
API = 2  # the calling convention this Python expects (`API` in _core.c)
if _compiled is not None and getattr(_compiled, "API", None) != API:  # a stale build: rebuild to use it
    _compiled = None

PURE_ENV = "PREFIXSCAN_PURE"
# False: the pure-Python path even when the extension is there (tests compare the two by switching this).
ENABLED: bool = _compiled is not None and os.environ.get(PURE_ENV, "").strip() in ("", "0")


def core() -> ModuleType | None:
    """The compiled core when built and not switched off, else None (take the pure-Python path)."""
    return _compiled if ENABLED else None


def describe() -> str:
    """What the manifest and `--version`-style reports can say about the core in use."""
    if _compiled is None:
        return "pure-python (compiled core not built, or built from other sources)"
    return "compiled" if ENABLED else f"pure-python ({PURE_ENV}=1)"
