"""Keep numba's on-disk cache honest across modules.

numba's `cache=True` checks only the timestamp of the file defining a function, so a kernel that calls
kernels from another module (the engine calls every policy and `kvcache`) would keep stale machine code
after those modules change. `guard()` fingerprints the sources the compiled replay is built from and,
when the fingerprint changes, empties the cache index of every kernel in this package before first use.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

_SIM = Path(__file__).resolve().parent.parent
_done = False


def _sources() -> list[Path]:
    """Every module kernels are compiled from, including constants they freeze (`layout.py`)."""
    return sorted((_SIM / "fast").rglob("*.py")) + [_SIM / "kvcache.py", _SIM / "knowledge.py"]


def fingerprint() -> str:
    h = hashlib.sha1()
    for p in _sources():
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _dispatchers() -> list:
    import importlib
    import pkgutil

    from numba.core.registry import CPUDispatcher

    out = []  # this package's modules, found by path: importing the package here would be an import cycle
    for mod in pkgutil.walk_packages([str(_SIM / "fast")], f"{__package__}."):
        m = importlib.import_module(mod.name)
        out += [v for v in vars(m).values() if isinstance(v, CPUDispatcher) and v.__module__ == m.__name__]
    return out


def guard() -> None:
    """Flush this package's numba caches once per process if its sources (or kvcache's) changed."""
    global _done
    if _done:
        return
    _done = True
    try:
        disps = _dispatchers()
        stamp_dir = Path(disps[0]._cache.cache_path)  # numba has no public API for this
        stamp = stamp_dir / "prefixscan-fast.fingerprint"
        fp = fingerprint()
        if stamp.exists() and stamp.read_text() == fp:
            return
        for d in disps:
            d._cache.flush()
        stamp.write_text(fp)
    except (OSError, AttributeError, IndexError):
        return  # a read-only or unusual cache location: numba's own per-file check still applies
