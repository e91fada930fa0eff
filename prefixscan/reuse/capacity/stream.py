"""The capacity curve of `lru.capacity_curve` over a request stream fed in chunks, in bounded memory.

`capacity_curve` holds per-listed-block arrays for the whole log (ids, weights, next-use keys, a Fenwick
slot per access): about 7.4 GiB on a 10M-request trace. Here memory is O(distinct blocks + requests):

- `add` runs the one-pass LRU stack-distance histogram (Mattson, Gecsei, Slutz and Traiger 1970)
  chunk by chunk with its state carried over, over a Fenwick tree of about two slots per distinct block
  (marks are renumbered when the clock reaches its end, `pool_fast._renumber`), and appends the chunk's
  block ids to a spill file. Per request it keeps only the length and the prompt tokens (12 bytes).
- `finish` computes the next-use keys of Belady's rule (1966) by reading the ids spill backwards into a
  second spill, then runs the optimal cache with bypass forward, chunk by chunk, up to `OPT_GROUP`
  capacities per read within a memory budget (each with its per-block keys and a bounded heap), reading
  both spills into reused buffers.

Spills are read with `readinto`, not memory-mapped (`spill.py`: the chunk check, the run plan, the
reads and writes): mapped file pages would count in the RSS. The kernels
are `lru`'s own, so the table is the same, value for value; `tests/test_capacity_stream.py` checks it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from types import TracebackType
from typing import BinaryIO, NamedTuple

import numpy as np
import pyarrow as pa

from prefixscan.encode.hashing import is_trace_rule
from prefixscan.reuse.capacity.lru import (
    _next_keys,
    _opt_chunk,
    exact_table,
    key_dtype,
    opt_heap_slots,
    opt_held,
    opt_ideal_runs,
    target_guesses,
)
from prefixscan.reuse.capacity.spill import (
    Chunk,
    check_chunk,
    key_width,
    local_offsets,
    plan_chunks,
    read_at,
    write_all,
)
from prefixscan.reuse.capacity.table import block_weights, resolve_capacities
from prefixscan.reuse.pool import HIT_TOK, new_state, occupied_blocks, run_chunk
from prefixscan.reuse.pool_fast import (
    _fenwick_ones,
    _lru_pool_chunk,
    _renumber,
    fast_pool,
    lru_tree_slots,
    merged,
    new_st,
    request_shape,
)


class _Opt(NamedTuple):
    """One capacity's optimal-cache state, carried from chunk to chunk."""

    cap: int
    key: np.ndarray  # per distinct block (`lru.key_dtype`): next-use key while resident, -1 absent
    hk: np.ndarray  # heap keys (the same type)
    hb: np.ndarray  # int32 heap block ids
    st: np.ndarray  # int64 [heap size, resident, dead, hit tokens, hit blocks]


class CapacityStream:
    """Feed requests in analysis order, chunk by chunk; `finish()` gives `capacity_curve`'s table.

    Keyword options (defaults suit a 10M-request trace): `tree_floor`, the LRU tree's least number of slots;
    `chunk_blocks`, listed blocks per read of the spills in `finish`; `opt_budget_bytes`, the state the OPT
    capacities of one pass over the spills may share (up to OPT_GROUP of them; a larger one runs alone).
    """

    def __init__(self, block_size: int, rule: str, spill_dir: str, *, tree_floor: int = 1 << 16,
                 chunk_blocks: int = 1 << 21, opt_budget_bytes: int = 640 << 20, defer_lru: bool = False) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        is_trace_rule(rule)
        if tree_floor < 1 or chunk_blocks < 1:
            raise ValueError("tree_floor and chunk_blocks must be positive")
        self.block_size = int(block_size)
        self.rule = rule
        self._tree_floor = int(tree_floor)
        self._chunk_blocks = int(chunk_blocks)
        self._opt_budget = int(opt_budget_bytes)
        self._spill_dir = spill_dir
        self._keys_path: str | None = None  # made by finish
        self._ids_path, self._ids_file = self._spill("capacity-ids-")  # int32 per listed block
        self._prompts_path, self._prompts_file = self._spill("capacity-prompts-")  # int64 per request
        self._lengths: list[np.ndarray] = []  # int32 listed blocks per request, one array per chunk
        self._total_prompt_tokens = 0
        self._max_prompt = 0
        self._occupied = 0  # blocks all requests occupy (pool.occupied_blocks): a pool that never evicts
        # LRU state (pool_fast._lru_pool_chunk): Fenwick tree, latest time per block, token histogram, [marked, clock]
        self._tree = np.zeros(lru_tree_slots(0, self._tree_floor) + 1, np.int32)
        self._last = np.zeros(0, np.int32)
        self._tok_hist = np.zeros(1, np.int64)
        self._pool_hist = np.zeros(1, np.int64)  # the pool's histogram (pool_fast), over distance + unlisted
        self._lru_state = new_st()
        self._most_blocks = 0  # most blocks one request occupies (pool_fast.fast_pool)
        self._most_unlisted = 0
        self._n_seen = 0  # largest id + 1
        self._total_blocks = 0
        self._done = False
        # With defer_lru, add() only spills and the LRU pass reads the spills in finish(): its state (about
        # 24 bytes per distinct block) is then never alive beside the caller's own per-block state.
        self._defer_lru = bool(defer_lru)

    # ------------------------------------------------------------ feeding

    @property
    def total_blocks(self) -> int:
        """Listed blocks fed so far (what the automatic sampling threshold is compared with)."""
        return self._total_blocks

    def add(self, offsets: np.ndarray, ids: np.ndarray, prompt_tokens: np.ndarray) -> None:
        """offsets: int64 local CSR for this chunk (starts at 0), ids: int32 GLOBAL dense block ids
        (first-appearance order across the whole stream, as `prefixscan.encode.dense.dense_ids` would number the
        concatenation; the results only need every id below the n_distinct given to `finish`),
        prompt_tokens: int64 per request."""
        if self._done:
            raise RuntimeError("CapacityStream.add after finish() or close()")
        offsets, ids, prompts = check_chunk(offsets, ids, prompt_tokens)
        if self._defer_lru:
            if len(ids):
                self._n_seen = max(self._n_seen, int(ids.max()) + 1)
        else:
            self._lru(offsets, ids, prompts)
        assert self._ids_file is not None and self._prompts_file is not None
        ids.tofile(self._ids_file)
        prompts.tofile(self._prompts_file)
        self._lengths.append(np.diff(offsets).astype(np.int32))
        self._total_prompt_tokens += int(prompts.sum())
        self._max_prompt = max(self._max_prompt, int(prompts.max()) if len(prompts) else 0)
        self._occupied += occupied_blocks(offsets, prompts, self.block_size)
        self._total_blocks += len(ids)

    def _lru(self, offsets: np.ndarray, ids: np.ndarray, prompts: np.ndarray) -> None:
        """One chunk of the every-capacity LRU pass (state carried between chunks)."""
        cap, unl = request_shape(offsets, prompts, self.block_size, self.rule)
        if len(unl):
            self._most_unlisted = max(self._most_unlisted, int(unl.max()))
            self._most_blocks = max(self._most_blocks, int((np.diff(offsets) + unl).max()))
        if len(ids):
            self._reserve(int(ids.max()) + 1)
        need = self._n_seen + self._most_unlisted + 1  # distances are below the blocks seen
        if len(self._pool_hist) < need:
            self._pool_hist.resize(need + need // 8, refcheck=False)
        weights = block_weights(offsets, prompts, self.block_size, self.rule)
        _lru_pool_chunk(offsets, ids, weights, cap, unl, self._tree, self._last, self._tok_hist, self._pool_hist,
                        self._lru_state)

    def _deferred_lru(self, lengths: np.ndarray) -> None:
        """The LRU pass over the spills, chunk by chunk, sized once for every block seen."""
        seen, self._n_seen = self._n_seen, 0
        self._reserve(seen)
        for _, offsets, ids, prompts, _ in self._read(self._plan(lengths), lengths):
            self._lru(offsets, ids, prompts)

    def _spill(self, prefix: str) -> tuple[str, BinaryIO]:
        fd, path = tempfile.mkstemp(prefix=prefix, suffix=".bin", dir=self._spill_dir)
        return path, os.fdopen(fd, "wb")

    def _reserve(self, n_seen: int) -> None:
        """Grow the per-block LRU arrays to `n_seen` blocks (with an eighth of headroom), and the tree to
        twice that, so a renumbering always frees half of it. `ndarray.resize` reallocates in place (no
        second copy alive) and zero-fills, which is "never seen" / an empty histogram bin."""
        if n_seen <= self._n_seen:
            return
        self._n_seen = n_seen
        if n_seen > len(self._last):
            room = n_seen + n_seen // 8
            self._last.resize(room, refcheck=False)
            self._tok_hist.resize(room + 1, refcheck=False)
        if lru_tree_slots(n_seen, self._tree_floor) > len(self._tree) - 1:
            marked = _renumber(self._tree, self._last)  # times 1..marked, then a bigger tree over them
            self._lru_state[1] = marked
            self._tree.resize(lru_tree_slots(n_seen + n_seen // 8, self._tree_floor) + 1, refcheck=False)
            _fenwick_ones(self._tree, marked)

    # ------------------------------------------------------------ the table

    def finish(self, n_distinct: int, capacities_tokens: Sequence[int] | None = None,
               opt: bool = True, sample: float | None = None) -> pa.Table:
        """Exactly `capacity_curve(concat offsets, hashes, concat prompt, block_size, rule,
        capacities_tokens, opt, ids=(concat ids, n_distinct))`: same schema, values and metadata.
        The spill files are removed, whether it succeeds or not; the stream cannot be fed again."""
        if self._done:
            raise RuntimeError("CapacityStream.finish called twice or after close()")
        try:
            if sample is not None and sample < 1.0:
                return self._sampled(int(n_distinct), capacities_tokens, sample)
            return self._finish(int(n_distinct), capacities_tokens, opt)
        finally:
            self.close()

    def _close_spills(self, n: int) -> np.ndarray:
        """Check `n` (the distinct blocks) against the ids fed, close the spill files for writing and
        return every request's length in blocks."""
        if n < max(self._n_seen, 0) or n < 0:
            raise ValueError(f"n_distinct={n} but block id {self._n_seen - 1} was fed" if n >= 0
                             else f"n_distinct must be non-negative, got {n}")
        assert self._ids_file is not None and self._prompts_file is not None
        self._ids_file.close()
        self._prompts_file.close()
        lengths = np.concatenate([np.zeros(0, np.int32), *self._lengths])
        self._lengths = []
        return lengths

    def _finish(self, n: int, capacities_tokens: Sequence[int] | None, opt: bool) -> pa.Table:
        lengths = self._close_spills(n)
        cap_tok, cap_blk = resolve_capacities(capacities_tokens, n, self.block_size)
        held = opt_held(cap_blk)
        opt_tok: np.ndarray | None = None  # OPT's hits, when they were computed beside the LRU pass
        if self._defer_lru:  # the LRU pass on a second thread, beside OPT's bound and next-use keys (all
            # three only read the ids spill; together they hold less than one OPT pass will), and beside
            # the OPT passes too when both states fit the budget together
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefixscan-lru") as side:
                lru = side.submit(self._deferred_lru, lengths)
                small = self._opt_prepare(n, lengths, held) if opt else None
                if small is not None and small.any() and self._opt_fits_beside_lru(held[small], n, lengths):
                    opt_tok = self._opt_hits(held[small], n, lengths)
                lru.result()
        else:
            small = self._opt_prepare(n, lengths, held) if opt else None
        self._tree = self._last = np.zeros(0, np.int32)  # the LRU pass is over: free it before OPT
        lru_tok = np.zeros(n + 1, np.int64)
        hist = self._tok_hist  # bins at or past n_seen are 0: distances are below the blocks seen
        np.cumsum(hist[:n] if len(hist) >= n else np.concatenate([hist, np.zeros(n - len(hist), np.int64)]),
                  out=lru_tok[1:])
        self._tok_hist = np.zeros(0, np.int64)
        del hist
        ideal = int(lru_tok[-1])
        guesses = target_guesses(lru_tok)
        del lru_tok
        fast = fast_pool(self._pool_hist, self._lru_state, self._most_blocks)
        self._pool_hist = np.zeros(0, np.int64)

        def evaluate(sizes: Sequence[int] | np.ndarray) -> np.ndarray:
            return merged(fast, lambda rest: self._pool_hits(np.asarray(rest, np.int64), n, lengths), sizes)

        def opt_run(caps: np.ndarray) -> np.ndarray:  # caps: held[small], which opt_tok was computed at
            return opt_tok if opt_tok is not None else self._opt_hits(caps, n, lengths)

        return exact_table(cap_tok, cap_blk, evaluate, ideal, self._total_prompt_tokens, small, opt_run,
                           self._occupied + 1, self.block_size, guesses)

    def _sampled(self, n: int, capacities_tokens: Sequence[int] | None, rate: float) -> pa.Table:
        """The sampled curve (`sampled.sampled_table`) instead of the exact passes and OPT: three
        reads of the spills chunk by chunk into reused buffers, so memory is the sample's state and one
        chunk, not 12 bytes per listed block."""
        from prefixscan.reuse.capacity.sampled import sampled_table

        lengths = self._close_spills(n)
        chunks = self._plan(lengths)

        def read() -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
            for _, offsets, ids, pr, _ in self._read(chunks, lengths):
                yield (offsets, ids, block_weights(offsets, pr, self.block_size, self.rule),
                       request_shape(offsets, pr, self.block_size, self.rule)[1])

        return sampled_table(read, n, self._total_prompt_tokens, self.block_size, rate, capacities_tokens)

    # ------------------------------------------------------------ vLLM's block pool from the spills

    def _pool_hits(self, sizes: np.ndarray, n: int, lengths: np.ndarray) -> np.ndarray:
        """Hit tokens of vLLM's block pool at each size in blocks (`pool.pool_curve`), a few sizes per
        forward read of the spills, their kernels in two threads."""
        if self._total_blocks == 0 or len(sizes) == 0:
            return np.zeros(len(sizes), np.int64)
        chunks = self._plan(lengths)
        longest = self._longest(lengths)

        def run(pool: ThreadPoolExecutor, group: list[int]) -> dict[int, int]:
            states = [(c, new_state(c, n, longest)) for c in group]
            for _, offsets, ids, prompts, _ in self._read(chunks, lengths):
                for f in _start(pool, run_chunk, [(st, offsets, ids, prompts, self.block_size, self.rule)
                                                  for _, st in states], len(ids)):
                    f.result()
            return {c: int(st.st[HIT_TOK]) for c, st in states}

        return self._grouped(sizes, n, lambda size, n: 8 * n + 20 * size, run)

    def _longest(self, lengths: np.ndarray) -> int:
        """Most blocks one request occupies (its longest listing, or its prompt in blocks)."""
        most = int(lengths.max()) if len(lengths) else 0
        return max(most, -(-self._max_prompt // self.block_size))

    def _read(self, chunks: list[Chunk], lengths: np.ndarray,
              keys: bool = False) -> Iterator[tuple[Chunk, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """(run, local offsets, ids, prompt tokens, next-use keys if `keys` else nothing) chunk by chunk into
        reused buffers: the caller is done with a chunk before asking for the next, or with `keys` (the OPT
        pass, whose kernels run while the next chunk is read) before asking for the one after the next."""
        most = max((c.b1 - c.b0 for c in chunks), default=0)
        rows = max((c.r1 - c.r0 for c in chunks), default=0)
        kd = key_dtype(key_width(lengths)[1]) if keys else np.int64
        bufs = [(np.empty(most, np.int32), np.empty(most if keys else 0, kd), np.empty(rows, np.int64))
                for _ in range(2 if keys else 1)]
        assert not keys or self._keys_path is not None
        with ExitStack() as files:
            fi, fp = (files.enter_context(open(p, "rb", buffering=0)) for p in (self._ids_path, self._prompts_path))
            fk = files.enter_context(open(str(self._keys_path), "rb", buffering=0)) if keys else None
            for i, c in enumerate(chunks):
                ids_buf, keys_buf, prompts = bufs[i % len(bufs)]
                m = c.b1 - c.b0
                yield (c, local_offsets(lengths, c), read_at(fi, c.b0, ids_buf[:m]),
                       read_at(fp, c.r0, prompts[: c.r1 - c.r0]),
                       keys_buf if fk is None else read_at(fk, c.b0, keys_buf[:m]))

    # ------------------------------------------------------------ OPT from the spills

    def _opt_prepare(self, n: int, lengths: np.ndarray, held: np.ndarray) -> np.ndarray:
        """Which capacities OPT must run at, and (if any) their next-use keys spilled. A cache that holds
        the whole working set never evicts, and from L on OPT = ideal (`lru.opt_ideal_capacity`): those
        need no run."""
        small = held < self._opt_ideal_capacity(n, lengths)
        if small.any() and self._total_blocks:
            width, never = key_width(lengths)
            self._spill_keys(self._plan(lengths), lengths, n, width, never)
        return small

    def _opt_hits(self, caps: np.ndarray, n: int, lengths: np.ndarray) -> np.ndarray:
        """Hit tokens of the optimal cache at each capacity in blocks (all below n), as `opt_hits`, from the
        next-use keys `_opt_prepare` spilled."""
        if self._total_blocks == 0:
            return np.zeros(len(caps), np.int64)
        width, never = key_width(lengths)
        chunks = self._plan(lengths)
        size = np.dtype(key_dtype(never)).itemsize
        return self._grouped(caps, n, lambda cap, n: self._opt_bytes(cap, n, size),
                             lambda pool, group: self._opt_pass(pool, group, n, chunks, lengths, width, never))

    def _grouped(self, sizes: np.ndarray, n: int, cost: Callable[[int, int], int],
                 run: Callable[[ThreadPoolExecutor, list[int]], dict[int, int]]) -> np.ndarray:
        """Hit tokens at each size, `run` giving them for one group of distinct sizes (`_groups`) at a time,
        with two threads for its kernels."""
        hits: dict[int, int] = {}
        with ThreadPoolExecutor(max_workers=2) as pool:
            for group in self._groups(np.unique(sizes).tolist(), n, cost):
                hits.update(run(pool, group))
        return np.array([hits[int(c)] for c in sizes], np.int64)

    def _plan(self, lengths: np.ndarray) -> list[Chunk]:
        """The runs of requests each read of the spills takes (none when no block was fed)."""
        return plan_chunks(lengths, self._chunk_blocks) if self._total_blocks else []

    def _opt_ideal_capacity(self, n: int, lengths: np.ndarray) -> int:
        """`lru.opt_ideal_runs` from two forward reads of the ids spill (5 bytes per distinct block)."""
        if self._total_blocks == 0:
            return n
        chunks = self._plan(lengths)
        return opt_ideal_runs(lambda: ((c.r0, o, ids) for c, o, ids, _, _ in self._read(chunks, lengths)), n)

    def _spill_keys(self, chunks: list[Chunk], lengths: np.ndarray, n: int, width: int, never: int) -> None:
        """Next-use keys (`capacity.next_keys`) of every listed block into a spill, from a backward read of
        the ids spill: the scan must see the future first."""
        fd, self._keys_path = tempfile.mkstemp(prefix="capacity-keys-", suffix=".bin",
                                               dir=os.path.dirname(self._ids_path))
        most = max(c.b1 - c.b0 for c in chunks)
        ids_buf = np.empty(most, np.int32)
        keys_buf = np.empty(most, key_dtype(never))
        upcoming = np.full(n, never, keys_buf.dtype)
        with open(self._ids_path, "rb", buffering=0) as fi, os.fdopen(fd, "wb", buffering=0) as fo:
            fo.truncate(self._total_blocks * keys_buf.itemsize)
            for c in reversed(chunks):
                m = c.b1 - c.b0
                ids = read_at(fi, c.b0, ids_buf[:m])
                _next_keys(local_offsets(lengths, c), ids, upcoming, c.r0, width, keys_buf[:m])
                fo.seek(c.b0 * keys_buf.itemsize)
                write_all(fo, keys_buf[:m])

    def _groups(self, caps: list[int], n: int, cost: Callable[[int, int], int]) -> Iterator[list[int]]:
        """Capacities to run together, up to OPT_GROUP per read of the spills: the largest left, then the
        smallest, largest, ... while their states fit the budget together (per capacity: a key per
        distinct block plus a heap of a key and an id per slot, `_opt_bytes`). Reading and weighing the spills
        once for more capacities leaves the two cores to the kernels."""
        caps = sorted(caps)
        while caps:
            group = [caps.pop()]
            used = cost(group[0], n)
            while caps and len(group) < OPT_GROUP:
                nxt = caps[0] if len(group) % 2 else caps[-1]
                if used + cost(nxt, n) > self._opt_budget:
                    break
                group.append(caps.pop(0) if len(group) % 2 else caps.pop())
                used += cost(nxt, n)
            yield group

    def _opt_fits_beside_lru(self, caps: np.ndarray, n: int, lengths: np.ndarray) -> bool:
        """Whether the deferred LRU pass's state (at most 32 bytes per distinct block: tree, last use, two
        histograms, with `_reserve`'s headroom) and the costliest group of OPT capacities fit
        `opt_budget_bytes` together."""
        size = np.dtype(key_dtype(key_width(lengths)[1])).itemsize
        group = sorted(int(c) for c in caps)[-OPT_GROUP:]
        return 32 * n + sum(self._opt_bytes(c, n, size) for c in group) <= self._opt_budget

    def _opt_bytes(self, cap: int, n: int, key_size: int = 8) -> int:
        return key_size * n + (key_size + 4) * opt_heap_slots(cap, self._total_blocks, _HEAP_SLACK)

    def _opt_pass(self, pool: ThreadPoolExecutor, caps: list[int], n: int, chunks: list[Chunk],
                  lengths: np.ndarray, width: int, never: int) -> dict[int, int]:
        """Hit tokens per capacity of the group: one forward read of the spills, each chunk run for every
        capacity in the pool's threads (the kernel releases the GIL) while the next chunk is read."""
        states, kd = [], key_dtype(never)
        for cap in caps:
            slots = opt_heap_slots(cap, self._total_blocks, _HEAP_SLACK)
            states.append(_Opt(cap, np.full(n, -1, kd), np.empty(slots, kd),
                               np.empty(slots, np.int32), np.zeros(5, np.int64)))
        feed = self._read(chunks, lengths, keys=True)
        cur = next(feed, None)
        while cur is not None:
            _, offsets, ids, prompts, nk = cur
            weights = block_weights(offsets, prompts, self.block_size, self.rule)
            futures = _start(pool, _opt_chunk, [(offsets, ids, weights, nk, s.key, s.hk, s.hb, s.st, s.cap, width,
                                                 never) for s in states], len(ids))
            cur = next(feed, None)  # reads into the other buffers while the kernels run
            for f in futures:
                f.result()
        return {s.cap: int(s.st[3]) for s in states}

    # ------------------------------------------------------------ cleanup

    def close(self) -> None:
        """Remove the spill files and drop the state; idempotent."""
        self._done = True
        for f in (self._ids_file, self._prompts_file):
            if f is not None and not f.closed:
                f.close()
        for path in (self._ids_path, self._prompts_path, self._keys_path):
            if path is not None and os.path.exists(path):
                os.unlink(path)
        self._tree = self._last = np.zeros(0, np.int32)
        self._tok_hist = self._pool_hist = np.zeros(0, np.int64)
        self._lengths = []

    def __enter__(self) -> CapacityStream:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _start(pool: ThreadPoolExecutor, kernel: Callable[..., None], args: list[tuple],
           blocks: int) -> list[Future[None]]:
    """Run `kernel` on each argument tuple: at once in this thread for a chunk of fewer than _THREADED_BLOCKS
    blocks (not worth a thread hand-off), else in the pool; the futures to wait for are returned."""
    if blocks < _THREADED_BLOCKS:
        for a in args:
            kernel(*a)
        return []
    return [pool.submit(kernel, *a) for a in args]


OPT_GROUP = 8  # sizes per pass over the spills (their kernels share two threads; more balance them better)
_THREADED_BLOCKS = 1 << 14  # smaller chunks run in the calling thread
_HEAP_SLACK = 0.25  # heap slots = 1.25 x capacity + 64: compaction every cap/4 pushes at most
