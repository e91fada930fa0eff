"""The miss attribution's replica pass: per request, the same-replica ideal hit R and the hit on the
previous request the same replica served P, one row group of the requests table at a time
(`attribution.py` explains what they split)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import polars as pl
from numba import njit

from prefixscan.reuse.hitrule import hit_tokens_array
from prefixscan.reuse.ideal import IdealStream, scope_salts


@njit(cache=True, nogil=True)
def _previous_lcp(offsets: np.ndarray, flat: np.ndarray, codes: np.ndarray, first: int,
                  n_codes: int) -> tuple[np.ndarray, np.ndarray]:
    """(per request from `first` on: its common block prefix with the last earlier request of the same
    replica code, 0 if none or the code is < 0; the index of each code's last request, -1 if none)."""
    n = len(offsets) - 1
    last = np.full(n_codes, -1, np.int64)
    k = np.zeros(max(n - first, 0), np.int64)
    for i in range(n):
        c = codes[i]
        if c < 0:
            continue
        j = last[c]
        if i >= first and j >= 0:
            a, b = offsets[j], offsets[i]
            m = min(offsets[j + 1] - a, offsets[i + 1] - b)
            t = 0
            while t < m and flat[a + t] == flat[b + t]:
                t += 1
            k[i - first] = t
        last[c] = i
    return k, last


class LastPerReplica:
    """The block hashes of the last request each replica served, carried from one row group to the next
    (copies: a view would keep a whole group's hashes alive)."""

    def __init__(self, replicas: list[str]) -> None:
        self.index = {r: i for i, r in enumerate(replicas)}
        self.salts = scope_salts(replicas)  # the scope salt of each replica code
        self.kept: dict[int, np.ndarray] = {}

    def codes(self, replica: pl.Series) -> np.ndarray:
        """Each request's replica code (-1: none)."""
        if not self.index:
            return np.full(len(replica), -1, np.int64)
        return replica.replace_strict(self.index, return_dtype=pl.Int64).fill_null(-1).to_numpy()

    def previous(self, offsets: np.ndarray, flat: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """Per request of a group: its common block prefix with the last earlier request of its replica."""
        held = sorted(self.kept)
        lens = np.array([len(self.kept[c]) for c in held], np.int64)
        pre = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        all_off = np.concatenate([pre, offsets[1:] + pre[-1]])
        all_flat = np.concatenate([*(self.kept[c] for c in held), flat]) if held else flat
        k, last = _previous_lcp(all_off, all_flat, np.concatenate([np.array(held, np.int64), codes]),
                                len(held), len(self.index))
        for c in np.flatnonzero(last >= len(held)).tolist():
            j = last[c]
            self.kept[c] = all_flat[all_off[j]:all_off[j + 1]].copy()
        return k


def replica_pass(groups: Iterable[tuple[pl.DataFrame, tuple[np.ndarray, np.ndarray]]], n: int,
                 replicas: list[str], block_size: int, rule: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ideal I, same-replica ideal R, hit on the previous request of the same replica P) per request.

    One ideal pass with the replica as the scope (the scope salt), plus, per request, the common block
    prefix with the last request the same replica served (kept per replica: a handful of arrays). Reads
    one row group at a time; the three results are held for the whole log (24 bytes a request), since the
    model mismatch check needs every R before any row is final. `groups`: per row group, its
    prompt_tokens and replica columns and its (local CSR offsets, block hashes); `replicas`: the log's
    distinct replicas."""
    ideal, same, prev_hit = (np.zeros(n, np.int64) for _ in range(3))
    stream = IdealStream()
    last = LastPerReplica(replicas)
    at = 0
    for g, (offsets, flat) in groups:
        m = len(offsets) - 1
        if m != g.height:
            raise ValueError(f"a block chunk covers {m} requests, its row group has {g.height}")
        prompt, codes = g["prompt_tokens"].to_numpy().astype(np.int64), last.codes(g["replica"])
        salts = np.zeros(m, np.uint64)
        salts[codes >= 0] = last.salts[codes[codes >= 0]]
        res, _ = stream.add(offsets, flat, prompt, block_size, rule, salts, np.zeros(m, np.uint64))
        ideal[at:at + m] = res.cached_tokens
        same[at:at + m] = res.tenant_cached_tokens
        prev_hit[at:at + m] = hit_tokens_array(last.previous(offsets, flat, codes), prompt, block_size, rule)
        at += m
    stream.release()
    if at != n:
        raise ValueError(f"the block chunks cover {at} requests, the table has {n}")
    return ideal, same, prev_hit
