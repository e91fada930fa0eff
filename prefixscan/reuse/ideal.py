"""Ideal-cache (unbounded) prefix reuse, request by request in analysis order.

Because block hashes chain, the blocks of every earlier request form a prefix-closed set: a request's
hit is the longest run of leading blocks already seen, found by binary search over its hashes with
O(log n) lookups. The same search runs in three scopes at once (whole log, same tenant, same
conversation), which attributes each hit exactly and gives the hit rate under tenant isolation.
The brute-force definition lives in `ideal_ref.py`; property tests keep the two equal.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from itertools import repeat

import numpy as np
import xxhash

from prefixscan.hashing import hit_tokens

NO_SCOPE = 0


@dataclass
class IdealResult:
    """Per-request outcome arrays (index = analysis order)."""

    cached_blocks: np.ndarray  # int32: leading blocks found
    cached_tokens: np.ndarray  # int64: under the hit rule (or exact LCP with token granularity)
    divergence_token: np.ndarray  # int64: first token index not covered by the match (before the n-1 cap)
    tenant_cached_tokens: np.ndarray  # int64: hit available from the same tenant alone
    conversation_cached_tokens: np.ndarray  # int64: hit available from the same conversation alone
    source: np.ndarray  # int64: most recent earlier request holding the whole matched prefix, -1 if none


def scope_salts(keys: list[str | None]) -> np.ndarray:
    """A 64-bit salt per request for its scope key (tenant or conversation); 0 means no scope."""
    cache: dict[str, int] = {}
    out = np.zeros(len(keys), dtype=np.uint64)
    for i, k in enumerate(keys):
        if k is None:
            continue
        v = cache.get(k)
        if v is None:
            v = xxhash.xxh3_64_intdigest(k.encode("utf-8", "surrogatepass"), seed=0x5CA1AB1E) or 1
            cache[k] = v
        out[i] = v
    return out


def _match(seen: dict | set, hl: list[int]) -> int:
    """Longest k such that hl[:k] are all in `seen` (membership is prefix-closed: binary search)."""
    lo, hi = 0, len(hl)
    if hi == 0 or hl[0] not in seen:
        return 0
    if hl[-1] in seen:
        return hi
    lo = 1  # hl[lo-1] in seen, hl[hi-1] not
    while lo < hi:
        mid = (lo + hi) // 2
        if hl[mid - 1] in seen:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


def ideal_reuse(offsets: np.ndarray, hashes: np.ndarray, prompt_tokens: np.ndarray, block_size: int,
                rule: str, tenant_salts: np.ndarray, conversation_salts: np.ndarray) -> IdealResult:
    """Block-granular ideal reuse (vLLM semantics; "trace" rule for hashed traces)."""
    n = len(prompt_tokens)
    k_all = np.zeros(n, dtype=np.int32)
    k_ten = np.zeros(n, dtype=np.int32)
    k_conv = np.zeros(n, dtype=np.int32)
    source = np.full(n, -1, dtype=np.int64)
    last: dict[int, int] = {}
    tenant_seen: set[int] = set()
    conv_seen: set[int] = set()
    for i in range(n):
        h = hashes[offsets[i]:offsets[i + 1]]
        hl = h.tolist()
        k = _match(last, hl)
        if k:
            source[i] = last[hl[k - 1]]
        k_all[i] = k
        last.update(zip(hl, repeat(i)))
        th = (h ^ tenant_salts[i]).tolist()
        k_ten[i] = _match(tenant_seen, th) if k else 0
        tenant_seen.update(th)
        if conversation_salts[i] != NO_SCOPE:
            ch = (h ^ conversation_salts[i]).tolist()
            k_conv[i] = _match(conv_seen, ch) if k else 0
            conv_seen.update(ch)
    to_tokens = np.vectorize(lambda k, p: hit_tokens(int(k), int(p), block_size, rule), otypes=[np.int64])
    pt = np.asarray(prompt_tokens, dtype=np.int64)
    return IdealResult(
        cached_blocks=k_all,
        cached_tokens=to_tokens(k_all, pt) if n else np.zeros(0, np.int64),
        divergence_token=np.minimum(k_all.astype(np.int64) * block_size, pt),
        tenant_cached_tokens=to_tokens(k_ten, pt) if n else np.zeros(0, np.int64),
        conversation_cached_tokens=to_tokens(k_conv, pt) if n else np.zeros(0, np.int64),
        source=source,
    )


class TokenPrefixIndex:
    """Exact longest common token prefix with any earlier request (SGLang page size 1).

    Full blocks are matched by hash; inside the first unmatched block, the earlier continuations of the
    matched node are kept sorted, and the longest common prefix with a set of sequences is always reached
    by a lexicographic neighbour, so two comparisons suffice.
    """

    def __init__(self, block_size: int) -> None:
        self.B = block_size
        self.children: dict[int, list[tuple[int, ...]]] = {}
        self.seen: set[int] = set()

    @staticmethod
    def _lcp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
        n = min(len(a), len(b))
        i = 0
        while i < n and a[i] == b[i]:
            i += 1
        return i

    def add(self, tokens: np.ndarray, hashes: np.ndarray, root: int) -> int:
        """Return the exact common-prefix length with earlier requests, then insert this request."""
        hl = hashes.tolist()
        k = _match(self.seen, hl)
        B = self.B
        node = hl[k - 1] if k else root
        nxt = tuple(tokens[k * B:(k + 1) * B].tolist())
        lcp = 0
        conts = self.children.get(node)
        if conts and nxt:
            pos = bisect.bisect_left(conts, nxt)
            if pos < len(conts):
                lcp = self._lcp(conts[pos], nxt)
            if pos > 0:
                lcp = max(lcp, self._lcp(conts[pos - 1], nxt))
        # Insert the continuation after every node from the match point on (only novel content).
        n_blocks_total = (len(tokens) + B - 1) // B
        for j in range(k, n_blocks_total):
            parent = hl[j - 1] if j else root
            cont = tuple(tokens[j * B:(j + 1) * B].tolist())
            lst = self.children.setdefault(parent, [])
            p = bisect.bisect_left(lst, cont)
            if p == len(lst) or lst[p] != cont:
                lst.insert(p, cont)
        self.seen.update(hl)
        return k * B + lcp
