"""Ideal-cache (unbounded) prefix reuse, request by request in analysis order.

Because block hashes chain, the blocks of every earlier request form a prefix-closed set: a request's
hit is the longest run of leading blocks already seen. `ideal_reuse` finds it in a compiled pass over
dense block ids; `TokenPrefixIndex` (token granularity) uses binary search over hashes. The same search
runs in three scopes (whole log, same tenant, same conversation), which attributes each hit exactly and
gives the hit rate under tenant isolation.
The brute-force definition lives in `tests/oracles/ideal_ref.py`; property tests keep the two equal.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash
from numba import njit

from prefixscan.affixes import common_prefix_length
from prefixscan.encode.dense import DenseTable, SeenSet
from prefixscan.reuse.hitrule import hit_tokens_array
from prefixscan.reuse.pool import run_each

if TYPE_CHECKING:
    import polars as pl

NO_SCOPE = 0
PARALLEL_BLOCKS = 1 << 16  # a chunk's three scopes run in threads from this many blocks (below, starting the
# threads costs more than they save)


@dataclass
class IdealResult:
    """Per-request outcome arrays (index = analysis order)."""

    cached_blocks: np.ndarray  # int32: leading blocks found
    cached_tokens: np.ndarray  # int64: under the hit rule (or exact LCP with token granularity)
    divergence_token: np.ndarray  # int64: first token index not covered by the match (before the n-1 cap)
    tenant_cached_tokens: np.ndarray  # int64: hit available from the same tenant alone
    conversation_cached_tokens: np.ndarray  # int64: hit available from the same conversation alone
    source: np.ndarray  # int64: most recent earlier request holding the whole matched prefix, -1 if none


def scope_salts(keys: Sequence[str | None] | pl.Series) -> np.ndarray:
    """A 64-bit salt per request for its scope key (tenant or conversation); 0 means no scope."""
    cache: dict[str, int] = {}
    out = np.zeros(len(keys), dtype=np.uint64)
    if hasattr(keys, "null_count"):  # a polars Series: skip the Python loop when it is all null
        if keys.null_count() == len(keys):
            return out
        keys = keys.to_list()  # type: ignore[union-attr]  # a Series here
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


@njit(cache=True, nogil=True)
def _leading_runs_into(offsets, ids, last, valid, base, k, src):  # pragma: no cover - compiled
    """Per request: leading blocks seen in an earlier (valid) request, and the most recent such request
    holding the deepest one. Every block of a valid request is then marked as last touched by it (its
    index is `base` + its row: `last` carries over from earlier chunks of the same log)."""
    for r in range(len(offsets) - 1):
        a, b = offsets[r], offsets[r + 1]
        if not valid[r]:
            continue
        j = a
        while j < b and last[ids[j]] >= 0:
            j += 1
        k[r] = j - a
        if j > a:
            src[r] = last[ids[j - 1]]
        for q in range(a, b):
            last[ids[q]] = base + r


def leading_runs(offsets: np.ndarray, ids: np.ndarray, n_distinct: int,
                 valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(leading blocks already seen, source request) per request of one whole log (see the kernel)."""
    n = len(offsets) - 1
    k = np.zeros(n, np.int32)
    src = np.full(n, -1, np.int64)
    _leading_runs_into(offsets, ids, np.full(n_distinct, -1, np.int64), valid, 0, k, src)
    return k, src


def ideal_reuse(offsets: np.ndarray, hashes: np.ndarray, prompt_tokens: np.ndarray, block_size: int,
                rule: str, tenant_salts: np.ndarray, conversation_salts: np.ndarray) -> IdealResult:
    """Block-granular ideal reuse (vLLM semantics; "trace" rule for hashed traces) of a whole log.

    The log is one chunk of an `IdealStream`: hashes become dense ids (one hash-table pass), then one
    compiled pass per scope finds each request's leading run of already-seen blocks: the whole log, the
    same tenant (hash xor tenant salt) and the same conversation (hash xor conversation salt); on a large
    chunk the three run in threads. Work is linear in blocks. A log in memory and a streamed one share this
    one mechanism.
    """
    return IdealStream().add(offsets, hashes, prompt_tokens, block_size, rule, tenant_salts,
                             conversation_salts)[0]


def _cores() -> int:
    """Cores this process may run on (held to one, threads would only take turns)."""
    from prefixscan.encode.encoder import available_cores

    return available_cores()


def _concurrently(*calls: Callable[[], Any] | None, parallel: bool) -> list[Any]:
    """Each call's result (None for a None call). The scopes' passes touch disjoint state and their kernels
    release the GIL, so with `parallel` they run in threads (`pool.run_each`) and use idle cores."""
    todo = [c for c in calls if c is not None]
    done = iter(run_each(todo, None if parallel else 1))
    return [None if c is None else next(done) for c in calls]


class _Scope:
    """One scope's state across chunks: the dense-id table and the last request touching each block."""

    def __init__(self) -> None:
        self.table = DenseTable()
        self.last = np.full(1024, -1, np.int32)  # request index: a log has < 2^31 requests

    def runs(self, offsets: np.ndarray, flat: np.ndarray, salts: np.ndarray | None, valid: np.ndarray,
             base: int, reserve: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(leading blocks seen, source request, dense ids) of one chunk, continuing the log so far."""
        ids = self.table.ids(flat, offsets, salts, reserve=reserve)
        if self.table.n > len(self.last):  # grow geometrically, in place (no second copy alive)
            had = len(self.last)
            self.last.resize(max(self.table.n, int(had * 1.25)), refcheck=False)
            self.last[had:] = -1
        if base + len(offsets) > np.iinfo(np.int32).max:
            raise OverflowError("a log of 2^31 requests or more: split it and analyse the parts")
        n = len(offsets) - 1
        k = np.zeros(n, np.int32)
        src = np.full(n, -1, np.int64)
        _leading_runs_into(offsets, ids, self.last, valid, base, k, src)
        return k, src, ids


class IdealStream:
    """`ideal_reuse` over a log fed chunk by chunk in analysis order, with exactly the results of one call
    on the whole log. State grows with distinct blocks only (per scope: a dense-id table and the last
    request per block), so a log of any length is analysed in bounded memory.

    The tenant and conversation scopes need only which blocks they have seen (a SeenSet, 8 bytes a slot).
    The tenant scope starts as the whole-log scope's blocks when the first tenant appears (until then every
    request had salt 0, so the two scopes held the same blocks); the conversation scope starts empty when
    the first conversation appears (requests without one never enter it).

    Each table grows once a chunk at most (unless a sampled estimate of what the chunk adds falls short),
    and the three grow one after another before the scopes run (in threads on a large chunk), so a grow's
    peak (old and new arrays alive) is one table's, as when the scopes ran one after another.
    """

    def __init__(self) -> None:
        self.all = _Scope()
        self.tenant: SeenSet | None = None
        self.conversation: SeenSet | None = None
        self.n = 0

    @property
    def n_distinct(self) -> int:
        return self.all.table.n

    def release(self) -> None:
        """Drop the tables (the largest state of a long log) once the last chunk is in."""
        self.tenant = self.conversation = None
        self.all = _Scope()

    def add(self, offsets: np.ndarray, hashes: np.ndarray, prompt_tokens: np.ndarray, block_size: int, rule: str,
            tenant_salts: np.ndarray, conversation_salts: np.ndarray) -> tuple[IdealResult, np.ndarray]:
        """The next chunk's IdealResult (`source` in whole-log request indices) and its whole-log dense ids."""
        n = len(prompt_tokens)
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        flat = np.ascontiguousarray(hashes, dtype=np.uint64)
        pt = np.asarray(prompt_tokens, dtype=np.int64)
        everyone = np.ones(n, dtype=np.bool_)
        ten = np.asarray(tenant_salts, dtype=np.uint64)
        if self.tenant is None and ten.any():  # before this chunk enters the whole-log scope
            self.tenant = SeenSet.of_table(self.all.table)
        conv = np.asarray(conversation_salts, dtype=np.uint64)
        if self.conversation is None and conv.any():
            self.conversation = SeenSet()
        tenant, conversation, base, in_conv = self.tenant, self.conversation, self.n, conv != NO_SCOPE
        # The tables grow one after another (while one grows, its old and new arrays are both alive), then
        # the scopes run, in threads on a large chunk.
        self.all.table.reserve(flat)
        if tenant is not None:
            tenant.reserve(offsets, flat, ten, everyone)
        if conversation is not None:
            conversation.reserve(offsets, flat, conv, in_conv)
        (k_all, source, gid), k_ten, k_conv = _concurrently(
            lambda: self.all.runs(offsets, flat, None, everyone, base, reserve=False),
            None if tenant is None else lambda: tenant.runs(offsets, flat, ten, everyone, reserve=False),
            None if conversation is None else lambda: conversation.runs(offsets, flat, conv, in_conv, reserve=False),
            parallel=len(flat) >= PARALLEL_BLOCKS and _cores() > 1)
        if k_ten is None:  # no tenant so far: every request shares one scope, the whole log's
            k_ten = k_all
        if k_conv is None:
            k_conv = np.zeros(n, dtype=np.int32)
        self.n += n
        return IdealResult(
            cached_blocks=k_all,
            cached_tokens=hit_tokens_array(k_all, pt, block_size, rule),
            divergence_token=np.minimum(k_all.astype(np.int64) * block_size, pt),
            tenant_cached_tokens=hit_tokens_array(k_ten, pt, block_size, rule),
            conversation_cached_tokens=hit_tokens_array(k_conv, pt, block_size, rule),
            source=source,
        ), gid


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
                lcp = common_prefix_length(conts[pos], nxt)
            if pos > 0:
                lcp = max(lcp, common_prefix_length(conts[pos - 1], nxt))
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
