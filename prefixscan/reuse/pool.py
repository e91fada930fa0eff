"""vLLM's block pool, exactly, compiled: cached tokens per request for a pool of N blocks.

`ReferencePool` (tests/oracles/pool_ref.py) is the readable model and states the rules (null block,
partial blocks that occupy a block, duplicate copies after capped full hits, lazy eviction from an LRU
free queue filled in reverse order). This is the same machine over dense block ids and flat arrays, one
request at a time, for the capacity curve (one pass per pool size, sizes in parallel) and for callers that compare per
request (`pool_hits`). State is carried in arrays, so `capacity.stream` runs it chunk by chunk.

The simulator's pool (`sim/kvcache.py`) gives the same hits at every size (tests/test_pool.py holds both to the
oracle) but costs more CPU per size, for what only a simulation needs (replicas, release times, eviction ages):
`bench/studies/pool_vs_simulator.py` measures the two in one run, so the curve keeps this one.

Arrays of one pool of N blocks (slot 0 is the null block and is never used):
- per slot: the dense id it holds (-1: none), previous / next slot in the free queue, the next copy of
  the same id (copies are listed in the order they were cached), and a ref count (a block listed twice
  by one request);
- per dense id: its first and last copy (-1: not cached);
- scalars `st`: [queue head, queue tail, hit tokens, hit blocks, duplicates, oversized requests].
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import NamedTuple, TypeVar

import numba
import numpy as np
from numba import njit

from prefixscan.encode.dense import dense_ids
from prefixscan.encode.hashing import is_trace_rule
from prefixscan.reuse.hitrule import cap_blocks, cap_tokens

HEAD, TAIL, HIT_TOK, HIT_BLK, DUPS, OVERSIZED = range(6)
T = TypeVar("T")


class PoolState(NamedTuple):
    """One pool's arrays (see the module docstring), resumable between chunks of requests."""

    slot_id: np.ndarray  # int32 [N]
    qprev: np.ndarray  # int32 [N]
    qnext: np.ndarray  # int32 [N]
    cnext: np.ndarray  # int32 [N]
    sref: np.ndarray  # int32 [N]
    first: np.ndarray  # int32 [n_distinct]
    last: np.ndarray  # int32 [n_distinct]
    st: np.ndarray  # int64 [6]
    table: np.ndarray  # int32 scratch: one request's block table


@njit(cache=True, nogil=True)
def _empty_pool(num_blocks, n_distinct, longest):  # pragma: no cover - compiled
    """The arrays of `PoolState` for an empty pool: every slot but the null block free, in order."""
    n = max(num_blocks, 1)
    st = np.zeros(6, np.int64)
    qprev = np.arange(-1, n - 1).astype(np.int32)
    qnext = np.arange(1, n + 1).astype(np.int32)
    st[HEAD], st[TAIL] = -1, -1
    if n > 1:
        qprev[1] = -1
        qnext[n - 1] = -1
        st[HEAD], st[TAIL] = 1, n - 1
    m = max(n_distinct, 1)
    return (np.full(n, -1, np.int32), qprev, qnext, np.full(n, -1, np.int32), np.zeros(n, np.int32),
            np.full(m, -1, np.int32), np.full(m, -1, np.int32), st, np.zeros(max(longest, 1) + 1, np.int32))


def new_state(num_blocks: int, n_distinct: int, longest: int) -> PoolState:
    """An empty pool of `num_blocks` blocks (block 0 is the null block); `longest` bounds the blocks
    one request occupies (its table)."""
    return PoolState(*_empty_pool(int(num_blocks), int(n_distinct), int(longest)))


@njit(cache=True)
def _clear(slot_id, cnext, first, last):  # pragma: no cover - compiled
    """Evict everything (before an oversized request; between requests every slot is free): no slot holds
    an id, no id is cached."""
    for s in range(1, len(slot_id)):
        b = slot_id[s]
        if b >= 0:
            first[b] = -1
            last[b] = -1
            slot_id[s] = -1
        cnext[s] = -1


@njit(cache=True, nogil=True)
def _pool_chunk(offsets, ids, prompts, block_size, trace, slot_id, qprev, qnext, cnext, sref,  # pragma: no cover
                first, last, st, table, out):
    """Run one chunk of requests through the pool; per-request cached tokens into `out` (if not empty).
    Queue and copy-list updates are written out, the queue's ends in locals: a compiled helper taking these
    arrays costs an atomic reference count per array per call (one call per block: several times slower)."""
    n_slots = len(slot_id) - 1
    per_req = len(out) > 0
    head, tail = st[HEAD], st[TAIL]
    for r in range(len(offsets) - 1):
        a = offsets[r]
        nb = offsets[r + 1] - a
        n = prompts[r]
        total = max(nb, (n + block_size - 1) // block_size) if n > 0 else nb
        cap = min(nb, cap_blocks(n, block_size, trace))
        k = 0
        while k < cap and first[ids[a + k]] >= 0:
            k += 1
        hit = min(k * block_size, cap_tokens(n, block_size, trace)) if k > 0 else 0
        st[HIT_TOK] += hit
        st[HIT_BLK] += k
        if per_req:
            out[r] = hit
        if total > n_slots:  # oversized: keep only its first n_slots full blocks (oracle: pool_hits_ref)
            st[OVERSIZED] += 1
            _clear(slot_id, cnext, first, last)
            total = n_slots
            nb = min(nb, n_slots)
            k = 0
        for j in range(total):  # touch the hits (k first), then take new blocks from the queue's head
            if j < k:
                s = first[ids[a + j]]
                sref[s] += 1
                table[j] = s
                if sref[s] > 1:  # already taken out of the queue by this request
                    continue
            else:
                s = head
                sref[s] = 1
                table[j] = s
            p = qprev[s]  # unlink s from the free queue
            q = qnext[s]
            if p >= 0:
                qnext[p] = q
            else:
                head = q
            if q >= 0:
                qprev[q] = p
            else:
                tail = p
            qprev[s] = -1
            qnext[s] = -1
            b = slot_id[s]
            if j < k or b < 0:
                continue
            slot_id[s] = -1  # a reused slot loses its id (lazy eviction): unlink it from b's copies
            if first[b] == s:
                first[b] = cnext[s]
                if cnext[s] < 0:
                    last[b] = -1
            else:
                p = first[b]
                while cnext[p] != s:
                    p = cnext[p]
                cnext[p] = cnext[s]
                if last[b] == s:
                    last[b] = p
            cnext[s] = -1
        for j in range(k, nb):  # every new full block gets its id, duplicates included
            s = table[j]
            b = ids[a + j]
            if first[b] >= 0:
                st[DUPS] += 1
                cnext[last[b]] = s
            else:
                first[b] = s
            last[b] = s
            slot_id[s] = b
        for j in range(total - 1, -1, -1):  # free in reverse order; a block without an id goes to the front
            s = table[j]
            sref[s] -= 1
            if sref[s] > 0:
                continue
            if slot_id[s] >= 0:
                qprev[s] = tail
                qnext[s] = -1
                if tail >= 0:
                    qnext[tail] = s
                else:
                    head = s
                tail = s
            else:
                qprev[s] = -1
                qnext[s] = head
                if head >= 0:
                    qprev[head] = s
                else:
                    tail = s
                head = s
    st[HEAD], st[TAIL] = head, tail


def check_csr(offsets: np.ndarray, ids: np.ndarray, prompt_tokens: np.ndarray, block_size: int,
              rule: str) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, prompt lengths) as contiguous int64, or a ValueError saying what is inconsistent."""
    is_trace_rule(rule)
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    prompts = np.ascontiguousarray(prompt_tokens, dtype=np.int64)
    if offsets.ndim != 1 or len(offsets) < 1 or offsets[0] != 0 or np.any(np.diff(offsets) < 0):
        raise ValueError("offsets must be non-decreasing CSR offsets starting at 0")
    if len(prompts) != len(offsets) - 1:
        raise ValueError(f"{len(prompts)} prompt lengths for {len(offsets) - 1} requests")
    if len(ids) != offsets[-1]:
        raise ValueError(f"offsets end at {offsets[-1]} but there are {len(ids)} block hashes (ids)")
    return offsets, prompts


def longest_request(offsets: np.ndarray, prompts: np.ndarray, block_size: int) -> int:
    """Most blocks one request occupies (listed or partial), to size a pool's block table."""
    if len(prompts) == 0:
        return 0
    listed = int(np.diff(offsets).max())
    return max(listed, int(-(-int(prompts.max()) // block_size)))  # both rules: see the oracle's request_shape


def run_chunk(state: PoolState, offsets: np.ndarray, ids: np.ndarray, prompts: np.ndarray, block_size: int,
              rule: str, out: np.ndarray | None = None) -> None:
    """Feed one chunk of requests (dense int32 ids below the state's n_distinct) to a pool state."""
    _pool_chunk(offsets, ids, prompts, int(block_size), rule == "trace", state.slot_id, state.qprev,
                state.qnext, state.cnext, state.sref, state.first, state.last, state.st, state.table,
                np.zeros(0, np.int64) if out is None else out)


def pool_hits(offsets: np.ndarray, hashes: np.ndarray, prompt_tokens: np.ndarray, block_size: int,
              num_blocks: int, rule: str = "vllm") -> np.ndarray:
    """Cached tokens of every request (int64) with vLLM's block pool of `num_blocks` blocks (block 0 is
    the null block, so N - 1 hold cache), requests one at a time in the given order.

    `offsets`/`hashes`: the requests' block hashes as CSR (a list<uint64> column's offsets and values);
    under "vllm" they are the full blocks only, as vLLM hashes them. Equal to the tests' `pool_hits_ref`.
    """
    offsets, prompts = check_csr(offsets, hashes, prompt_tokens, block_size, rule)
    ids, n = dense_ids(np.ascontiguousarray(hashes, dtype=np.uint64))
    state = new_state(num_blocks, n, longest_request(offsets, prompts, block_size))
    out = np.zeros(len(prompts), np.int64)
    run_chunk(state, offsets, ids, prompts, block_size, rule, out)
    return out


@njit(cache=True, nogil=True)
def _pool_one(offsets, ids, prompts, block_size, trace, n_distinct, n_blocks, longest):  # pragma: no cover - compiled
    slot_id, qprev, qnext, cnext, sref, first, last, st, table = _empty_pool(n_blocks, n_distinct, longest)
    _pool_chunk(offsets, ids, prompts, block_size, trace, slot_id, qprev, qnext, cnext, sref, first, last, st,
                table, np.zeros(0, np.int64))
    return st[HIT_TOK], st[DUPS]


def kernel_threads() -> int:
    """Threads the curve's kernels may use: numba's thread count (NUMBA_NUM_THREADS, the cores by default)."""
    return max(1, int(getattr(numba.config, "NUMBA_NUM_THREADS", 1)))  # set when numba's config loads


def run_each(tasks: Sequence[Callable[[], T]], threads: int | None = None) -> list[T]:
    """Each task's result, in order: the tasks (compiled kernels that release the GIL) run on `threads`
    threads (`kernel_threads()` by default), the calling thread one of them, each taking the next task as
    it frees, so tasks of unequal cost (pool sizes, OPT capacities) leave no thread idle while any is left.
    The helper threads are daemons, as the capacity thread is: an interrupt does not wait for them. The
    first error is raised again here once every thread stopped."""
    n = min(kernel_threads() if threads is None else threads, len(tasks))
    out: list[T | None] = [None] * len(tasks)
    errors: list[BaseException] = []
    order = iter(range(len(tasks)))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                i = next(order, None) if not errors else None
            if i is None:
                return
            try:
                out[i] = tasks[i]()
            except BaseException as e:  # raised again in the caller's thread
                with lock:
                    errors.append(e)
                return

    helpers = [threading.Thread(target=work, name="prefixscan-kernel", daemon=True) for _ in range(n - 1)]
    for t in helpers:
        t.start()
    work()
    for t in helpers:
        t.join()
    if errors:
        raise errors[0]
    return out  # type: ignore[return-value]  # every slot was filled


def pool_curve(offsets: np.ndarray, ids: np.ndarray, n_distinct: int, prompt_tokens: np.ndarray, block_size: int,
               rule: str, pool_blocks: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(hit tokens, duplicate copies made) with a pool of each size in `pool_blocks`, over dense ids."""
    caps = np.asarray(pool_blocks, dtype=np.int64).reshape(-1)
    small = len(ids) * len(caps) < 1 << 22  # starting threads costs more than the work
    res = run_each(pool_tasks(offsets, ids, n_distinct, prompt_tokens, block_size, rule, caps), 1 if small else None)
    return np.array([x[0] for x in res], np.int64).reshape(-1), np.array([x[1] for x in res], np.int64).reshape(-1)


def pool_tasks(offsets: np.ndarray, ids: np.ndarray, n_distinct: int, prompt_tokens: np.ndarray, block_size: int,
               rule: str, pool_blocks: Sequence[int] | np.ndarray) -> list[Callable[[], tuple[int, int]]]:
    """One task per pool size, each giving `pool_curve`'s (hit tokens, duplicate copies), for `run_each`."""
    offsets, prompts = check_csr(offsets, ids, prompt_tokens, block_size, rule)
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    longest = longest_request(offsets, prompts, block_size)
    args = (offsets, ids, prompts, int(block_size), rule == "trace", int(n_distinct))
    return [partial(_pool_one, *args, int(c), longest) for c in np.asarray(pool_blocks, np.int64).reshape(-1)]


def smallest_pools(evaluate: Callable[[list[int]], Sequence[int] | np.ndarray], targets: Sequence[int],
                   brackets: Sequence[tuple[int, int]], guesses: Sequence[int] | None = None) -> list[int]:
    """For each target hit, a pool size N with hit(N) >= target > hit(N - 1) inside its bracket (lo, hi),
    where hit(lo) < target <= hit(hi). `evaluate(sizes)` runs the pool at several sizes at once (one pass
    over the requests for all of them).

    A guess (e.g. from the one-pass keyed LRU curve, which the pool follows closely) is tried first, with
    the size below it: when it is the crossing, that is one pass for every target. Otherwise the guess
    narrows the bracket and bisection finishes. The pool's hit is not proven to grow with its size (none
    of 26,000 random traces tried broke it), so this is *a* crossing, the first one when it does."""
    lo = [b[0] for b in brackets]
    hi = [b[1] for b in brackets]
    if guesses is not None:
        idx = [i for i in range(len(targets)) if hi[i] - lo[i] > 1]
        gs = [min(max(int(guesses[i]), lo[i] + 1), hi[i]) for i in idx]
        sizes = [x for g in gs for x in (g - 1, g)]
        hits = list(evaluate(sizes)) if sizes else []
        for n, (i, g) in enumerate(zip(idx, gs, strict=True)):
            below, at = hits[2 * n], hits[2 * n + 1]
            if at >= targets[i]:
                hi[i] = g - 1 if below >= targets[i] and g - 1 > lo[i] else g
            else:
                lo[i] = g
            if below < targets[i] and g - 1 > lo[i]:
                lo[i] = g - 1
    while True:
        todo = [i for i in range(len(targets)) if hi[i] - lo[i] > 1]
        if not todo:
            return hi
        mids = [(lo[i] + hi[i]) // 2 for i in todo]
        for i, m, h in zip(todo, mids, evaluate(mids), strict=True):
            if h >= targets[i]:
                hi[i] = m
            else:
                lo[i] = m


def target_brackets(grid: np.ndarray, grid_hits: np.ndarray, target: int, never_evicts: int) -> tuple[int, int]:
    """(lo, hi) pool sizes for `smallest_pools`: hi = the smallest grid size whose hit reaches `target`
    (the pool that never evicts when none does), lo = the largest grid size below it, or 0."""
    reach = grid[grid_hits >= target]
    hi = int(reach.min()) if len(reach) else never_evicts
    below = grid[grid < hi]
    return (int(below.max()) if len(below) else 0), hi


def hit_target(fraction: float, ideal: int) -> int:
    """The least whole number of hit tokens that counts as reaching `fraction` of the ideal hit."""
    t = fraction * float(ideal)
    return int(np.ceil(t - 1e-9 * max(1.0, t)))


def occupied_blocks(offsets: np.ndarray, prompts: np.ndarray, block_size: int) -> int:
    """Blocks all requests occupy in total (each its listing, or ceil(n/B) if more): a pool of this many
    blocks plus the null block never evicts. `capacity.stream` adds it up chunk by chunk, so the target
    searches, and so the targets, are the same."""
    listed = np.diff(np.asarray(offsets, dtype=np.int64))
    need = -(-np.maximum(np.asarray(prompts, dtype=np.int64), 0) // block_size)
    return int(np.maximum(listed, need).sum())
