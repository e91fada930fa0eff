"""Large arrays kept between compiled replays, so each replay does not fault in fresh memory.

A replay's KV state and approximate view are [replicas x distinct blocks] (0.4 GB on a 10k-request chat
log). Allocating them anew costs page faults on every replay, and on a VM whose host reclaims freed
memory a first touch costs ~1 s per 0.4 GB. `take` hands out the array kept from the previous replay
(refilled) when its shape and dtype match, else a new one; `give` keeps it for the next replay. At most
one array per name is kept; `release()` drops them all. An array is out of the pool while a replay uses
it, so concurrent replays never share one.
"""

from __future__ import annotations

import numpy as np

_pool: dict[str, np.ndarray] = {}


def take(name: str, shape: tuple[int, ...], dtype: type, fill: float | None) -> np.ndarray:
    """An array of this shape and dtype filled with `fill` (None: left as it is, for arrays whose
    entries are written before they are read), reused when the pool holds one."""
    a = _pool.pop(name, None)
    if a is not None and a.shape == shape and a.dtype == dtype:
        if fill is not None:
            a.fill(fill)
        return a
    if fill is None:
        return np.empty(shape, dtype=dtype)
    return np.zeros(shape, dtype=dtype) if fill == 0 else np.full(shape, fill, dtype=dtype)


def give(name: str, a: np.ndarray) -> None:
    """Keep `a` for the next replay (replacing whatever was kept under this name)."""
    _pool[name] = a


def release() -> None:
    """Drop every kept array (frees the memory)."""
    _pool.clear()
