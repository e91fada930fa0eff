"""Hit rate of one KV cache as a function of its capacity: LRU for every capacity in one pass, plus OPT.

An operator sizing KV memory wants the whole curve, not one simulation per guess. LRU has the inclusion
property (a bigger cache always holds what a smaller one holds), so one pass computing each block's
*stack distance* gives the hit for every capacity at once (Mattson, Gecsei, Slutz and Traiger, "Evaluation
techniques for storage hierarchies", IBM Systems Journal 9(2), 1970). Distances are counted with a Fenwick
tree over virtual access times, renumbered when full so that it needs O(distinct) slots. The optimal
reference is Belady's farthest-next-use rule (Belady, "A study of replacement algorithms for a
virtual-storage computer", IBM Systems Journal 5(2), 1966) with bypass: a block is not cached when nothing
cached is needed strictly later than it. It is computed per capacity point. Semantics, proofs and
measured numbers are in `docs/capacity.md`; the slow references these are tested against are in
`tests/oracles/` (`capacity_ref.py`, and `lru_stack.py`, the one-pass LRU stack with its block histogram).
The kernels are resumable (state carried in arrays), so that
`stream.CapacityStream` runs them over a log fed in chunks, in bounded memory.

Where the optimal cache provably equals the ideal one, it need not be simulated (`opt_ideal_capacity`).
Let S_r be the blocks whose request-granular lifetime [first listing, last listing] contains request r, and
L the largest |S_r|. With a capacity of at least L blocks, Belady's cache with bypass (`capacity._opt_chunk`)
never loses a hit: when it is full at an admission of request r, every resident block outside S_r is
never used again (counted as dead), and fewer than L resident blocks are in S_r (the incoming one is not
resident), so a dead block is the victim. The one other way it skips a block is the bypass of a block
never used again, which also stops admitting the rest of its request; that loses nothing if, in every
request, no block used again follows a block never used again (chained hashes guarantee it; it is
checked). Then every re-use hits, as in the infinite cache: OPT = ideal at every capacity >= L, where the
most expensive grid points lie.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import NamedTuple, cast

import numpy as np
import pyarrow as pa
from numba import njit

from prefixscan.encode.dense import dense_ids
from prefixscan.reuse.capacity.table import (  # the table and weights, shared with the streamed and sampled curves
    TARGET_FRACTIONS,
    TARGET_NAMES,
    block_weights,
    curve_table,
    resolve_capacities,
)
from prefixscan.reuse.pool import (
    check_csr,
    hit_target,
    longest_request,
    occupied_blocks,
    pool_curve,
    pool_tasks,
    run_each,
    smallest_pools,
    target_brackets,
)
from prefixscan.reuse.pool_fast import FastPool, lru_pool_curves, merged


class Prepared(NamedTuple):
    """A request sequence reduced to what the kernels need (built once, shared by LRU and OPT)."""

    offsets: np.ndarray  # int64, n_requests + 1
    ids: np.ndarray  # int32 dense block ids (first-seen order), one per listed block
    weights: np.ndarray  # int64 tokens each block adds to its request's hit when it matches
    n_distinct: int
    total_prompt_tokens: int


def prepare(offsets: np.ndarray, hashes: np.ndarray, prompt_tokens: np.ndarray, block_size: int,
            rule: str, ids: tuple[np.ndarray, int] | None = None, weights: bool = True) -> Prepared:
    """Validate the CSR input and remap uint64 hashes to dense ids so kernels index plain arrays (and,
    unless `weights` is False, make every listed block's weight: 8 bytes per listed block)."""
    offsets, prompt_tokens = check_csr(offsets, hashes, prompt_tokens, block_size, rule)
    # A compiled hash table numbers blocks in first-seen order (deterministic, no sort).
    ids_, n_distinct = ids if ids is not None else dense_ids(hashes)
    w = block_weights(offsets, prompt_tokens, block_size, rule) if weights else np.zeros(0, np.int64)
    return Prepared(offsets, ids_, w, n_distinct, int(prompt_tokens.sum()))


# ---------------------------------------------------------------- OPT (Belady with bypass), per capacity


@njit(cache=True, nogil=True)
def _next_keys(offsets, ids, upcoming, r0, width, out):  # pragma: no cover - compiled
    """Next-use keys of one run of requests (the first is request r0), scanning backwards; resumable:
    `upcoming` (the next listing seen so far per block, `never` at first) carries to the run before."""
    for r in range(len(offsets) - 2, -1, -1):
        a = offsets[r]
        b = offsets[r + 1]
        for p in range(a, b):
            out[p] = upcoming[ids[p]]
        for p in range(b - 1, a - 1, -1):  # backwards, so a block listed twice keeps its first position
            upcoming[ids[p]] = (r0 + r) * width + (p - a)


def key_dtype(never: int) -> type[np.signedinteger]:
    """The next-use keys' integer type: int32 when every key, `never` included, fits (half the memory the
    OPT passes walk: their per-block keys and heap), else int64. The values, so the results, are the same."""
    return np.int32 if never <= np.iinfo(np.int32).max else np.int64


def next_keys(prep: Prepared, width: int) -> np.ndarray:
    """For each listed block, when it is next listed: request * width + position in that request, where
    `width` exceeds every request's length; n_requests * width = never. One integer orders next uses by
    request, then by position, which is the eviction order of the optimal cache. Typed by `key_dtype`."""
    never = (len(prep.offsets) - 1) * width
    out = np.empty(len(prep.ids), key_dtype(never))
    upcoming = np.full(prep.n_distinct, never, out.dtype)
    _next_keys(prep.offsets, prep.ids, upcoming, 0, width, out)
    return out


@njit(cache=True)
def _compact(hk, hb, hn, key):  # pragma: no cover - compiled
    """Keep only live entries and re-heapify; returns the new size. Live: key[b] == k, or -2 - k while the
    kernel marks the blocks it has just pushed. At most one per resident block, so at most the capacity:
    compacting when the arrays are full means they never need to grow."""
    m = 0
    for q in range(hn):
        kb = key[hb[q]]
        if kb == hk[q] or kb == -2 - hk[q]:
            hk[m] = hk[q]
            hb[m] = hb[q]
            m += 1
    for q in range((m - 2) // 4, -1, -1):  # sift each inner entry down (the largest child moves up)
        kq = hk[q]
        bq = hb[q]
        i = q
        while True:
            c = 4 * i + 1
            if c >= m:
                break
            for d in range(c + 1, min(c + 4, m)):
                if hk[d] > hk[c]:
                    c = d
            if hk[c] <= kq:
                break
            hk[i] = hk[c]
            hb[i] = hb[c]
            i = c
        hk[i] = kq
        hb[i] = bq
    return m


@njit(cache=True, nogil=True)
def _opt_chunk(offsets, ids, weights, nk, key, hk, hb, st, cap, width, never):  # pragma: no cover - compiled
    """Run the optimal cache with bypass holding `cap` blocks (docs/capacity.md) over one run of requests;
    resumable: key, the heap (hk, hb) and st = [heap size, resident, dead, hit tokens, hit blocks] carry
    the state to the next run. `never` is (all requests) x width.

    key[b] = the block's next-use key (`next_keys`) while resident, -1 when absent. A lazy 4-ary max-heap holds
    (key, block) entries; stale ones (key[b] differs) are skipped when popped, and it is compacted when
    full (at most one live entry per resident block, so it never grows). While a request runs, its
    resident blocks have no live entry (their keys change at its start), which is what keeps them from
    being victims; they are pushed when it ends. Blocks never used again are not pushed: they only count
    in `dead`, are always the first victims, and which of them goes changes nothing (none is listed
    again). Live keys are distinct (request and position), so the victim never depends on the heap's
    layout. Push and pop are written out: a compiled helper taking the arrays costs an atomic reference
    count per array per call, more than the heap work itself."""
    hcap = len(hk)
    hn, size, dead, tok, blk = st[0], st[1], st[2], st[3], st[4]
    for r in range(len(offsets) - 1):
        a = offsets[r]
        b = offsets[r + 1]
        m = a
        while m < b and key[ids[m]] >= 0:  # hits are decided before any admission (and get their next use)
            tok += weights[m]
            blk += 1
            key[ids[m]] = nk[m]
            m += 1
        for p in range(m, b):  # the other resident blocks of the request get their new next use
            if key[ids[p]] >= 0:
                key[ids[p]] = nk[p]
        for p in range(a, b):  # admit in order until one is refused: each admitted block's parent is resident
            if key[ids[p]] >= 0:
                continue
            if size >= cap:
                if nk[p] >= never:
                    break  # nothing resident is used strictly later than never
                if dead > 0:
                    dead -= 1
                else:  # evict the top if its next use is strictly later than the offered block's request
                    limit = (nk[p] // width + 1) * width
                    evicted = False
                    while hn > 0:
                        k0 = hk[0]
                        b0 = hb[0]
                        if key[b0] == k0 and k0 < limit:
                            break
                        hn -= 1  # pop: the last entry sifts down from the root
                        kl = hk[hn]
                        bl = hb[hn]
                        i = 0
                        while True:
                            c = 4 * i + 1
                            if c >= hn:
                                break
                            for d in range(c + 1, min(c + 4, hn)):
                                if hk[d] > hk[c]:
                                    c = d
                            if hk[c] <= kl:
                                break
                            hk[i] = hk[c]
                            hb[i] = hb[c]
                            i = c
                        hk[i] = kl
                        hb[i] = bl
                        if key[b0] == k0:
                            key[b0] = -1
                            evicted = True
                            break
                    if not evicted:
                        break
                size -= 1
            key[ids[p]] = nk[p]
            size += 1
        for p in range(a, b):  # push each resident block once; -2 - key marks "pushed" for repeated ids
            k = key[ids[p]]
            if k >= never:
                key[ids[p]] = -1
                dead += 1
            elif k >= 0:
                if hn == hcap:
                    hn = _compact(hk, hb, hn, key)
                i = hn  # sift up from the free slot
                while i > 0:
                    par = (i - 1) // 4
                    if hk[par] >= k:
                        break
                    hk[i] = hk[par]
                    hb[i] = hb[par]
                    i = par
                hk[i] = k
                hb[i] = ids[p]
                hn += 1
                key[ids[p]] = -2 - k
        for p in range(a, b):
            if key[ids[p]] < -1:
                key[ids[p]] = -2 - key[ids[p]]
    st[0], st[1], st[2], st[3], st[4] = hn, size, dead, tok, blk


def opt_heap_slots(cap: int, total_blocks: int, slack: float = 1.0) -> int:
    """Heap entries for capacity `cap`: live entries are at most `cap`, so cap x (1 + slack) + 64 slots
    compact at most every slack x cap pushes; more than every listed block plus 64 is never needed."""
    return int(min(cap + int(slack * cap) + 64, total_blocks + 64))


@njit(cache=True, nogil=True)
def _opt_one(offsets, ids, weights, nk, n_distinct, cap, width):  # pragma: no cover - compiled
    """(hit tokens, hit blocks) of the optimal cache with bypass holding `cap` blocks, in one run."""
    n_req = len(offsets) - 1
    hcap = min(2 * cap + 64, offsets[n_req] + 64)  # opt_heap_slots(cap, total, 1.0)
    st = np.zeros(5, np.int64)
    key = np.full(n_distinct, -1, nk.dtype)  # keys, their heap and nk share one type (`key_dtype`)
    _opt_chunk(offsets, ids, weights, nk, key, np.empty(hcap, nk.dtype), np.empty(hcap, np.int32), st, cap,
               width, n_req * width)
    return st[3], st[4]


def opt_tasks(prep: Prepared, capacities_blocks: Sequence[int] | np.ndarray) -> list[Callable[[], tuple[int, int]]]:
    """One task per capacity in blocks, each giving (hit tokens, hit blocks) of the optimal cache (Belady
    with bypass, prefix-closed), for `pool.run_each`: the next-use keys are computed once for all."""
    caps = np.asarray(capacities_blocks, dtype=np.int64).reshape(-1)
    if len(caps) == 0 or len(prep.ids) == 0:
        return [lambda: (0, 0) for _ in caps]
    width = int(np.diff(prep.offsets).max()) + 1
    args = (prep.offsets, prep.ids, prep.weights, next_keys(prep, width), prep.n_distinct)
    return [partial(_opt_one, *args, int(c), width) for c in caps]


def opt_hits(prep: Prepared, capacities_blocks: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hit tokens, hit blocks) of the optimal cache (Belady with bypass, prefix-closed) at each capacity
    in blocks, capacities in parallel threads."""
    caps = np.asarray(capacities_blocks, dtype=np.int64).reshape(-1)
    small = len(prep.ids) * len(caps) < 1 << 16  # starting the threads costs more than the work
    hits = run_each(opt_tasks(prep, caps), 1 if small else None)
    return np.array([h[0] for h in hits], np.int64), np.array([h[1] for h in hits], np.int64)


# ---------------------------------------------------------------- the curve (its table: table.curve_table)


def capacity_curve(offsets: np.ndarray, hashes: np.ndarray, prompt_tokens: np.ndarray, block_size: int,
                   rule: str, capacities_tokens: Sequence[int] | None = None, opt: bool = True,
                   ids: tuple[np.ndarray, int] | None = None, sample: float | None = None) -> pa.Table:
    """Token-weighted hit rate of one cache per capacity: vLLM's block pool (the `lru_*` columns, exact,
    `pool.py`), OPT with bypass, infinite.

    Requests are taken in the given (analysis) order, one at a time. A capacity in tokens is a pool of
    N = floor(tokens / block_size) blocks, block 0 of which is vLLM's null block; OPT gets the same N - 1
    blocks. Without `capacities_tokens`, a log-spaced grid up to the working set is used. With
    `opt=False` the OPT columns are null. Rates are 0 when there are no prompt tokens.
    `stream.CapacityStream` gives the same table from requests fed in chunks, in bounded memory.
    With `sample` (a rate below 1), the `lru_*` columns are estimated (`capacity.sampled`), OPT is null.
    """
    if sample is not None and sample < 1.0:  # the sampler makes its weights chunk by chunk
        from prefixscan.reuse.capacity.sampled import sampled_capacity_curve

        prep = prepare(offsets, hashes, prompt_tokens, block_size, rule, ids, weights=False)
        return sampled_capacity_curve(prep.offsets, prep.ids, prep.n_distinct, prompt_tokens, block_size, rule,
                                      sample, capacities_tokens)
    prep = prepare(offsets, hashes, prompt_tokens, block_size, rule, ids)
    prompts = np.ascontiguousarray(prompt_tokens, dtype=np.int64)
    cap_tok, cap_blk = resolve_capacities(capacities_tokens, prep.n_distinct, block_size)
    # A cache that holds the whole working set never evicts: OPT = ideal there, no need to simulate;
    # and from L blocks on (`opt_ideal_capacity`) it provably loses no hit either.
    small = opt_held(cap_blk) < opt_ideal_capacity(prep.offsets, prep.ids, prep.n_distinct) if opt else None
    held = opt_held(cap_blk)[small] if small is not None else np.zeros(0, np.int64)
    # The keyed LRU over listed blocks (the ideal, and guesses for the targets) and, in the same pass, the
    # pool at every size where its histogram is exact (`pool_fast`), in one run of threads with the grid's
    # pool sizes it cannot cover (below its `lo`: some request would not fit) and the OPT capacities
    # (largest first: the costlier ones, so the cheap ones fill in at the end). Other sizes the grid or
    # the target search asks for are simulated when asked.
    below = np.unique(cap_blk[cap_blk <= longest_request(prep.offsets, prompts, block_size)])
    order = np.argsort(-held, kind="stable")
    tasks: list[Callable[[], object]] = [lambda: lru_pool_curves(prep.offsets, prep.ids, prep.weights,
                                                                 prep.n_distinct, prompts, block_size, rule)]
    tasks += pool_tasks(prep.offsets, prep.ids, prep.n_distinct, prompts, block_size, rule, below)
    tasks += opt_tasks(prep, held[order])
    small_run = len(prep.ids) * len(tasks) < 1 << 16  # starting the threads costs more than the work
    done = run_each(tasks, 1 if small_run else None)
    keyed, fast = cast(tuple[np.ndarray, FastPool], done[0])
    hits = [cast(tuple[int, int], h)[0] for h in done[1:]]
    known = dict(zip(below.tolist(), hits[: len(below)], strict=True))
    opt_tok = np.zeros(len(held), np.int64)
    opt_tok[order] = hits[len(below) :]

    def simulate(sizes: Sequence[int]) -> list[int]:
        todo = [s for s in sizes if s not in known]
        known.update(zip(todo, pool_curve(prep.offsets, prep.ids, prep.n_distinct, prompts, block_size, rule,
                                          todo)[0].tolist(), strict=True))
        return [known[s] for s in sizes]

    def evaluate(sizes: Sequence[int] | np.ndarray) -> np.ndarray:
        return merged(fast, simulate, sizes)

    return exact_table(cap_tok, cap_blk, evaluate, int(keyed[-1]), prep.total_prompt_tokens, small,
                       lambda _: opt_tok, occupied_blocks(prep.offsets, prompts, block_size) + 1,
                       block_size, target_guesses(keyed))


def opt_held(cap_blk: np.ndarray) -> np.ndarray:
    """The blocks OPT may hold at each pool size: one fewer than the pool (vLLM's null block holds nothing)."""
    return np.maximum(cap_blk - 1, 0)


def target_guesses(keyed: np.ndarray) -> list[int]:
    """Where the pool should reach each target fraction: one block past the keyed LRU curve's crossing
    (the pool's null block holds nothing), which it follows closely."""
    ideal = int(keyed[-1])
    return [int(np.searchsorted(keyed, hit_target(f, ideal), side="left")) + 1 for f in TARGET_FRACTIONS]


def exact_table(cap_tok: np.ndarray, cap_blk: np.ndarray, evaluate: Callable[[Sequence[int] | np.ndarray], np.ndarray],
                ideal: int, total: int, small: np.ndarray | None, opt_run: Callable[[np.ndarray], np.ndarray],
                never_evicts: int, block_size: int, guesses: list[int]) -> pa.Table:
    """The exact curve's table, in memory or streamed: vLLM's pool at the grid (`evaluate(sizes)`: hit tokens
    per pool size), OPT at the capacities `small` marks (`opt_run(blocks held)`; the others equal the ideal;
    None: OPT null), and the smallest pools (tokens) whose hit reaches 50% and 90% of the ideal, searched
    between the grid points (`pool.smallest_pools`, the `target_guesses` first), as metadata for the summary."""
    pool_tok = evaluate(cap_blk)
    opt_tok = None
    if small is not None:
        opt_tok = np.full(len(cap_tok), ideal, dtype=np.int64)
        if small.any():
            opt_tok[small] = opt_run(opt_held(cap_blk)[small])
    targets: dict[str, int | None] = dict.fromkeys(TARGET_NAMES)
    if ideal > 0:
        goals = [hit_target(f, ideal) for f in TARGET_FRACTIONS]
        brackets = [target_brackets(cap_blk, pool_tok, g, never_evicts) for g in goals]
        sizes = smallest_pools(evaluate, goals, brackets, guesses)
        targets = {name: n * block_size for name, n in zip(TARGET_NAMES, sizes, strict=True)}
    return curve_table(cap_tok, cap_blk, pool_tok, ideal, total, opt_tok, targets)


# ---------------------------------------------------------------- OPT = ideal from L blocks on

@njit(cache=True, nogil=True)
def _last_use(offsets, ids, r0, last):  # pragma: no cover - compiled
    """last[b] = the (global) request that lists block b last, over one run of requests starting at r0."""
    for r in range(len(offsets) - 1):
        for p in range(offsets[r], offsets[r + 1]):
            last[ids[p]] = r0 + r


@njit(cache=True, nogil=True)
def _overlap(offsets, ids, r0, last, seen, st):  # pragma: no cover - compiled
    """One run of requests: st = [unused, live now, largest live, chained (1/0)]; consumes `last` (a
    block's entry is set to -1 once its lifetime ended) and marks `seen`."""
    for r in range(len(offsets) - 1):
        g = r0 + r
        ended = 0
        done = False  # a block never used again was met in this request
        for p in range(offsets[r], offsets[r + 1]):
            b = ids[p]
            if not seen[b]:  # a first listing
                seen[b] = True
                st[1] += 1
            lb = last[b]
            future = lb > g
            if future and done:
                st[3] = 0
            if not future:
                done = True
            if lb == g:
                last[b] = -1
                ended += 1
        if st[1] > st[2]:
            st[2] = st[1]
        st[1] -= ended


def opt_ideal_runs(runs: Callable[[], Iterable[tuple[int, np.ndarray, np.ndarray]]], n_distinct: int) -> int:
    """The least capacity (blocks held) from which OPT = ideal: L when chained, else the working set, from
    two reads of the requests (`runs()`: (first request, local offsets, dense ids) run by run)."""
    last = np.full(max(n_distinct, 1), -1, np.int32)
    for r0, offsets, ids in runs():
        _last_use(offsets, ids, r0, last)
    st, seen = np.array([0, 0, 0, 1], np.int64), np.zeros(max(n_distinct, 1), np.bool_)
    for r0, offsets, ids in runs():
        _overlap(offsets, ids, r0, last, seen, st)
    return min(int(st[2]), int(n_distinct)) if st[3] else int(n_distinct)


def opt_ideal_capacity(offsets: np.ndarray, ids: np.ndarray, n_distinct: int) -> int:
    """`opt_ideal_runs` over requests held in memory (dense ids below n_distinct)."""
    return opt_ideal_runs(lambda: [(0, offsets, ids)], n_distinct)
