"""Encode workers: `RecordEncoder` in worker processes while this process reads, detects and aggregates.

Encoding is the per-record Python work of a chat log (chat-template rendering, splitting into memoised
segments, assembling ids, chaining hashes) and holds the GIL, so threads cannot share it. Records go out
in batches, results come back in the order they went out, so the output does not depend on the number
of workers. Each record goes to the worker its conversation is pinned to (conversation id, or else the
start of its prompt), so a conversation's turns meet a warm segment memo and chain cache. The worker
processes themselves (starting, the loop they run) are `encode_workers.py`.
"""

from __future__ import annotations

import queue
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from prefixscan.config import AnalyzeConfig
from prefixscan.encode.encoder import (
    Identity,
    RecordEncoder,
    pin_hash,
    pool_threads,
    rewrite_hashes,
    shared_chain_cache,
)
from prefixscan.errors import InputError
from prefixscan.pipeline.encode_wire import Packer, Receiver
from prefixscan.pipeline.encode_workers import DEPTH, Spawned, claim
from prefixscan.read.record import Record

# Before the pool has measured anything, this process's own CPU per record (reading, columns, detector,
# reuse) is taken as PRIOR_MAIN_COST times a worker's per record encoded (12k real-text chat log of bench
# row 9, default tokenizer, 2026-12-03: 0.15 ms against 0.58 ms, the workers doing the detector's
# per-content work; 0.6 before that, on synth's fresh text). Conversations stay where their first turn
# went, so a share started at 0 left every early conversation's later turns with the workers while this
# process waited for them (0.7 s of a 3.3 s ingest); `_adapt` takes over from the first job collected.
PRIOR_MAIN_COST = 0.3
INITIAL_SHARE: float | None = None  # None: the balance at PRIOR_MAIN_COST (tests hold a share still)
SHARE_STEP = 0.05  # how fast this process's share of the encoding adapts (per job collected; 0: held)
MAX_SHARE = 0.9
SHARE_STEPS = 1 << 16
MAX_OWNERS = 1 << 20  # conversations whose process is remembered
LOCAL_MIN = 256  # items encoded here before their measured cost replaces a worker's in the model
POLL_S = 1.0  # how often a waiting process checks that the other side is still alive


class WorkerFailed(InputError):
    """An encode worker died or raised; the message says which and what to do."""


@dataclass(slots=True)
class _Job:
    """A submitted batch: which positions went to which worker, and this process's part."""

    kind: str
    n: int
    parts: list[tuple[int, list[int]]]  # (worker, positions in the batch)
    local_pos: list[int]
    local: list[Any]
    local_done: list[Any] | None = None


def balance_share(e: float, m: float, workers: int, e_main: float | None = None) -> float:
    """The share of records this process should encode so that it ends with the workers: with m its own
    CPU seconds per record, e a worker's per record encoded and e_main this process's (e when unknown),
    m + s*e_main = (1 - s)*e/W at s = (e - W*m) / (W*e_main + e); none below 0, at most MAX_SHARE.
    The two differ: a worker also unpickles its records and does the detector's per-content work for
    them (`encode_workers.Prework`), which this process counts in m for its own records (12k real-text
    log: 0.58 ms against 0.41 ms)."""
    e_main = e if e_main is None else e_main
    if e <= 0 or workers * e_main + e <= 0:
        return 0.0
    return min(MAX_SHARE, max(0.0, (e - workers * m) / (workers * e_main + e)))


class EncodePool:
    """`workers` encode processes, plus a share of the work done here. `submit` a job ("encode": records;
    "rewrite": the detector's rewritten requests), `collect` the oldest job's results in its item order,
    `close` for the tokenizer identity and counters. Use as a context manager: leaving it on an error
    stops the workers.

    The share encoded in this process follows a cost model (`_adapt`): this process's own CPU seconds per
    record (reading, columns, detector, reuse: everything but encoding and waiting) against the workers'
    CPU seconds per record encoded, so that this process takes only as much encoding as leaves it no
    slower than the workers; none when its own work alone takes longer (many workers). Which process
    encodes a record never changes its hashes, only the counters."""

    def __init__(self, cfg: AnalyzeConfig, keep_tokens: bool, workers: int, local: RecordEncoder) -> None:
        self.cfg, self.workers, self.local = cfg, workers, local
        share = 1.0 / (workers + 1)
        local.share_caches(share)
        local.set_threads(pool_threads(cfg, workers + 1))
        spawned = claim(cfg, keep_tokens, workers)
        self._in, self._out, self._procs = spawned.inq, spawned.outq, spawned.procs
        self._inflight: deque[_Job] = deque()
        self._receivers = [Receiver() for _ in range(workers)]
        self._packers = [Packer() for _ in range(workers)]
        self._local_rewrites = shared_chain_cache(share, cfg)
        # the fraction of new conversations encoded here (adapted in `collect`)
        self.share = balance_share(1.0, PRIOR_MAIN_COST, workers) if INITIAL_SHARE is None else INITIAL_SHARE
        self._owners: dict[int, int] = {}  # pin hash -> the process its conversation was given to
        self.local_items = 0
        self.closed = False
        self.wait_s = 0.0  # time the ingesting process spent waiting for workers (manifest)
        # for `_adapt`, in CPU seconds (on a busy machine the walls say more about the load than the work);
        # this thread's only: the requests writer and the capacity passes run beside it in other threads
        self._t0, self._local_s, self._items = time.thread_time(), 0.0, 0
        self._local_n = 0  # items encoded here so far (for this process's CPU seconds per item)
        self._enc_s, self._enc_n = 0.0, 0  # the workers' CPU seconds and items encoded
        self.peak_rss_mib = 0.0  # the workers' peaks, summed (known after close)

    def __enter__(self) -> EncodePool:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.closed:
            self.terminate()

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def _owner(self, r: Record) -> int:
        """-1 (this process) or the worker a record's conversation is pinned to. A conversation stays with
        the process that encoded its first turn, whose memo holds its history; the share decides where
        new conversations go (moving a conversation would tokenise its whole history again)."""
        h = pin_hash(r)
        w = self._owners.get(h)
        if w is None:
            w = -1 if (h >> 40) % SHARE_STEPS < self.share * SHARE_STEPS else h % self.workers
            if len(self._owners) >= MAX_OWNERS:  # bounded; a forgotten conversation is placed again
                self._owners.clear()
            self._owners[h] = w
        return w

    def submit(self, kind: str, items: list[Any]) -> None:
        """Send a job out, split by the process each item's conversation is pinned to (blocks only while
        that worker already has DEPTH jobs queued). This process's part is encoded later, while it would
        otherwise wait for a worker (`collect`), so the reading goes on at once. "rewrite" items are
        (id, record, namespace)."""
        parts: dict[int, tuple[list[int], list[Any]]] = {}
        self._items += len(items)
        for i, it in enumerate(items):
            w = self._owner(it if kind == "encode" else it[1])
            pos, sub = parts.setdefault(w, ([], []))
            pos.append(i)
            if w < 0:
                sub.append(it)
            else:
                pack = self._packers[w].pack
                sub.append(pack(it) if kind == "encode" else (it[0], pack(it[1]), it[2]))
        remote = sorted(w for w in parts if w >= 0)
        for w in remote:
            self._put(w, (kind, parts[w][1]))
        local_pos, local = parts.get(-1, ([], []))
        self.local_items += len(local)
        self._inflight.append(_Job(kind, len(items), [(w, parts[w][0]) for w in remote], local_pos, local))

    def _encode_local(self, job: _Job) -> None:
        if job.local_done is None and not job.local:
            job.local_done = []  # nothing here: the tokenizer need not even load in this process
        if job.local_done is None:
            t0 = time.thread_time()
            if job.kind == "encode":
                job.local_done = self.local.encode(job.local)
            else:
                job.local_done = rewrite_hashes(self.local.load(), self._local_rewrites, self.cfg.block_size,
                                                job.local)
            self._local_n += len(job.local)
            job.local = []
            self._local_s += time.thread_time() - t0

    def collect(self) -> tuple[str, list[Any]]:
        """The kind and results of the oldest job still out: for "encode" one Hashed or Rejected per
        record in order; for "rewrite" (id, hash parts, prompt tokens) per request that encoded."""
        job = self._inflight.popleft()
        self._encode_local(job)
        got = []
        for w, _ in job.parts:
            for later in self._inflight:  # while the worker is not done, do this process's later parts
                if not self._out[w].empty():
                    break
                self._encode_local(later)
            res, (busy, n) = self._get(w)
            self._enc_s += busy
            self._enc_n += n
            got.append(res)
        self._adapt()
        local = job.local_done or []
        if job.kind == "rewrite":
            return job.kind, [(rid, self._receivers[w].parts(shipped), k)
                              for (w, _), res in zip(job.parts, got, strict=True) for rid, shipped, k in res] + local
        out: list[Any] = [None] * job.n
        for (_, pos), res in [*zip(job.parts, got, strict=True), ((-1, job.local_pos), local)]:
            for p, x in zip(pos, res, strict=True):
                out[p] = x
        return job.kind, out

    def _adapt(self) -> None:
        """Move the share (by at most SHARE_STEP) towards the balance of the cost model (`balance_share`),
        with the CPU seconds per record measured so far."""
        if not self._enc_n or not self._items:
            return
        e = self._enc_s / self._enc_n
        own = time.thread_time() - self._t0 - self._local_s  # waiting takes no CPU
        m = own / self._items
        e_main = self._local_s / self._local_n if self._local_n >= LOCAL_MIN else None
        target = balance_share(e, m, self.workers, e_main)
        self.share += max(-SHARE_STEP, min(SHARE_STEP, target - self.share))

    def close(self) -> tuple[Identity | None, list[dict[str, Any]]]:
        """Stop the workers after the batches still out (collect those first): the tokenizer identity and
        each worker's counters. The pool's own counters are then in `counters()`."""
        assert not self._inflight, "collect every batch before close"
        for w in range(self.workers):
            self._put(w, ("close", None))
        ident, stats = None, []
        for w in range(self.workers):
            (w_ident, w_stats, w_rss), _ = self._get(w)
            ident = ident or w_ident
            stats.append(w_stats)
            self.peak_rss_mib += w_rss
        for p in self._procs:
            p.join(timeout=30)
        self.closed = True
        return ident, stats

    def counters(self) -> dict[str, Any]:
        """What the manifest reports about the pool (`summary.input.tokenizer_stats`)."""
        return {"encode_workers": self.workers, "peak_rss_mib_workers": round(self.peak_rss_mib, 1),
                "wait_s_main": round(self.wait_s, 2), "encoded_in_main": self.local_items,
                "final_share_main": round(self.share, 2),
                # the cost model's CPU seconds (`_adapt`), for bench row 9's scaling model: this process's
                # own work (read, columns, detector, routing), its encoding, and the workers' encoding
                "cpu_s_main_own": round(time.thread_time() - self._t0 - self._local_s, 2),
                "cpu_s_main_encode": round(self._local_s, 2), "cpu_s_workers_encode": round(self._enc_s, 2)}

    def terminate(self) -> None:
        Spawned((), self._in, self._out, self._procs).stop()
        self.closed = True

    def _put(self, w: int, msg: tuple[str, Any]) -> None:
        t0 = time.perf_counter()
        while True:
            try:
                self._in[w].put(msg, timeout=POLL_S)
                self.wait_s += time.perf_counter() - t0
                return
            except queue.Full:
                self._check(w)

    def _get(self, w: int) -> tuple[Any, Any]:
        """A worker's next reply, and the (CPU seconds, items) it spent encoding that job."""
        t0 = time.perf_counter()
        while True:
            try:
                kind, payload, work = self._out[w].get(timeout=POLL_S)
                self.wait_s += time.perf_counter() - t0
            except queue.Empty:
                self._check(w)
                continue
            if kind == "error":
                self.terminate()
                if isinstance(payload, BaseException):
                    raise payload
                raise WorkerFailed(f"encode worker {w} failed:\n{payload}")
            return payload, work

    def _check(self, w: int) -> None:
        p = self._procs[w]
        if not p.is_alive():
            code = p.exitcode
            self.terminate()
            raise WorkerFailed(
                f"encode worker {w} exited with code {code} before finishing (out of memory, or killed?). "
                "Re-run with --workers 0 (Python: workers=0) to encode in the main process.")


__all__ = ["DEPTH", "EncodePool", "WorkerFailed"]
