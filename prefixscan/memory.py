"""Process memory: the peak RSS the manifest reports, handing freed heap back to the OS, and how often
the cyclic garbage collector runs while a pipeline holds large caches.

A streamed analysis frees its per-block state between stages, but glibc keeps freed small and mid-size
blocks in its heap (and after a large free it raises its mmap threshold, so even 30 MB arrays then come
from that heap). Fixing the threshold and trimming between stages keeps RSS close to what is alive.
Linux with glibc only; elsewhere these are no-ops.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

_M_MMAP_THRESHOLD = -3
_libc: ctypes.CDLL | Literal[False] | None = None  # False: looked, not glibc


def _glibc() -> ctypes.CDLL | None:  # ctypes handle or None
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc.malloc_trim  # noqa: B018 - glibc only
        except (OSError, AttributeError):
            _libc = False
    return _libc or None


def fixed_mmap_threshold(nbytes: int = 1 << 20) -> None:
    """Serve allocations of `nbytes` or more by mmap (returned to the OS when freed), permanently."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, int(nbytes))


def trim() -> None:
    """Return the heap's free memory to the OS (between stages that free large state)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far (Linux VmHWM; 0 where /proc is absent), for the
    manifest's timings: which stage sets the peak is what a memory budget needs to know."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return 0.0


# The young generation's threshold while a pipeline runs. Encoding and reading allocate millions of
# short-lived acyclic objects (units, tuples, message dicts) beside long-lived caches (token memo,
# conversation prompts, detector memos) that hold no cycles either; at the default 700 every pass that
# reaches the old generation walks those caches again (`bench/studies/encode_gc.py` measures the cost).
YOUNG_THRESHOLD = 50_000


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Collect cycles less often while a pipeline runs: what is alive on entry (modules, the tokenizer)
    is frozen out of every later pass, and the young generation is collected every YOUNG_THRESHOLD
    allocations instead of 700. Cycles are still collected, only later; both are undone on exit. A caller
    that froze objects itself (a server that forks workers) keeps them frozen: nothing is frozen here then,
    since unfreezing cannot tell its objects from ours. Only speed depends on any of this."""
    saved = gc.get_threshold()
    ours = gc.get_freeze_count() == 0
    if ours:
        gc.freeze()
    gc.set_threshold(max(saved[0], YOUNG_THRESHOLD), *saved[1:])
    try:
        yield
    finally:
        gc.set_threshold(*saved)
        if ours:
            gc.unfreeze()
