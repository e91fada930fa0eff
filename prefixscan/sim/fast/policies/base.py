"""The arrays one compiled policy carries through the replay, and the Python side that builds them.

Every policy kernel has the signature `choose(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni,
cand) -> (replica, reason code, predicted cached tokens, candidates written to cand)`: request i (its
block count and prompt tokens), the cluster (`ci`/`cf`/`g`/`fp`, see `layout.py`; the engine has already
put the known matched blocks in ci[KB] and predicted cached tokens in ci[CACHEDV]), and the policy's own
float/int parameters (`pf`, `pi`), float/int state (`sf`, `si`), uint64 keys and ring points (`pu`) and
the seeded uniform stream (`uni`). Unused arrays are one-element dummies, so one dispatch serves all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash

from prefixscan.sim.fast.policies.common import RING_HEADER
from prefixscan.sim.fast.xxh import xxh3_u64_vec
from prefixscan.sim.workload import Workload


def _f() -> np.ndarray:
    return np.zeros(1, dtype=np.float64)


def _i() -> np.ndarray:
    return np.zeros(1, dtype=np.int64)


def _u() -> np.ndarray:
    return np.zeros(1, dtype=np.uint64)


@dataclass
class PolicyArrays:
    """One policy's parameters and state for its kernel, plus how to name its reason codes."""

    code: int
    reasons: Callable[[int], str]
    pf: np.ndarray = field(default_factory=_f)
    pi: np.ndarray = field(default_factory=_i)
    sf: np.ndarray = field(default_factory=_f)
    si: np.ndarray = field(default_factory=_i)
    pu: np.ndarray = field(default_factory=_u)
    width: int = 3  # most candidates one decision lists
    stats: Callable[[np.ndarray, np.ndarray], dict[str, Any]] = lambda sf, si: {}


def fixed_reasons(names: tuple[str, ...]) -> Callable[[int], str]:
    return lambda code: names[code]


def f64(*vals: float) -> np.ndarray:
    return np.array(vals, dtype=np.float64)


def i64(*vals: int) -> np.ndarray:
    return np.array(vals, dtype=np.int64)


def ring_policy(
    code: int,
    reasons: Callable[[int], str],
    policy: Any,
    w: Workload,
    slots: int,
    key_mode: str,
    state: np.ndarray | None = None,
) -> PolicyArrays:
    """Arrays of a consistent-hash policy: request keys, every slot's `Ring` points, an unbuilt ring.

    `si` = ring header, then `state` (the policy's own ints, from index RING_HEADER), then the owners of
    the sorted points; `pu` = keys, all slots' points, sorted active points.
    """
    p = policy.params
    vn = max(1, p.vnodes)
    spts = np.array(
        [xxhash.xxh3_64_intdigest(f"replica-{r}-vnode-{v}".encode(), seed=policy.seed) for r in range(slots)
         for v in range(vn)],
        dtype=np.uint64,
    )
    keys = request_keys(w, key_mode, p.prefix_blocks)
    state = np.zeros(0, dtype=np.int64) if state is None else state.astype(np.int64)
    head = i64(-1, 0, 0, vn, RING_HEADER + len(state), w.n)
    si = np.concatenate([head, state, np.zeros(slots * vn, dtype=np.int64)])
    pu = np.concatenate([keys, spts, np.zeros(slots * vn, dtype=np.uint64)])
    return PolicyArrays(code, reasons, si=si, pu=pu)


def request_keys(w: Workload, mode: str, prefix_blocks: int) -> np.ndarray:
    """ring.request_key for every request at once (the same xxh3 values, compiled)."""
    n = w.n
    nb = np.diff(w.offsets)
    out = np.zeros(n, dtype=np.uint64)
    conv = (w.conv_key != 0) if mode == "conversation" else np.zeros(n, dtype=bool)
    empty = ~conv & (nb == 0)
    pref = ~conv & (nb > 0)
    if conv.any():
        out[conv] = xxh3_u64_vec(w.conv_key[conv], np.uint64(1), np.zeros(int(conv.sum()), dtype=np.uint64))
    if empty.any():
        idx = np.flatnonzero(empty).astype(np.uint64)
        out[empty] = xxh3_u64_vec(idx, np.uint64(3), np.zeros(len(idx), dtype=np.uint64))
    if pref.any():
        pos = w.offsets[:-1][pref] + np.minimum(prefix_blocks, nb[pref]) - 1
        vals = w.block_keys[w.blocks[pos]]
        out[pref] = xxh3_u64_vec(vals, np.uint64(2), np.zeros(len(vals), dtype=np.uint64))
    return out
