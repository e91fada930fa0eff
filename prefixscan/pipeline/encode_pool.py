"""Encode workers: `RecordEncoder` in worker processes while this process reads, detects and aggregates.

Encoding is the per-record Python work of a chat log (chat-template rendering, splitting into memoised
segments, assembling ids, chaining hashes) and holds the GIL, so threads cannot share it. Records go out
in batches, results come back in the order they went out, so the output does not depend on the number
of workers. Each record goes to the worker its conversation is pinned to (conversation id, or else the
start of its prompt), so a conversation's turns meet a warm segment memo and chain cache.
"""

from __future__ import annotations

import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
import types
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from prefixscan.config import AnalyzeConfig
from prefixscan.errors import InputError
from prefixscan.io.shapes import Record
from prefixscan.pipeline.encode_wire import Packer, Receiver, Shipper, Unpacker
from prefixscan.pipeline.encoder import (
    Identity,
    RecordEncoder,
    pin_hash,
    pool_threads,
    rewrite_hashes,
    shared_chain_cache,
)

INITIAL_SHARE = 0.0
SHARE_STEP = 0.05  # how fast this process's share of the encoding adapts (per job collected)
MAX_SHARE = 0.9
SHARE_STEPS = 1 << 16
MAX_OWNERS = 1 << 20  # conversations whose process is remembered
DEPTH = 2  # batches in flight per direction and worker: bounds memory, keeps both processes busy
POLL_S = 1.0  # how often a waiting process checks that the other side is still alive



@contextmanager
def _main_not_reimported() -> Iterator[None]:
    """Start spawned workers without re-running the caller's script in them. A spawned child normally
    imports the parent's `__main__` (to find functions defined there); a script that calls `analyze`
    without an `if __name__ == "__main__":` guard would then run again in every worker. The workers'
    code and arguments live in prefixscan, so the child is told there is no main module to prepare."""
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = saved


@dataclass
class _Spawned:
    """Encode worker processes and their queues, started by `_spawn` for one (config, workers)."""

    key: tuple[Any, ...]
    inq: list[Any]
    outq: list[Any]
    procs: list[Any]

    def stop(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(timeout=5)
        for q in self.inq + self.outq:
            q.cancel_join_thread()
            q.close()


def _key(cfg: AnalyzeConfig, keep_tokens: bool, workers: int) -> tuple[Any, ...]:
    # the run resolves --hash-tenants' key after the workers may have started; encoding never reads it
    return replace(cfg, tenant_key=None), keep_tokens, workers


def _spawn(cfg: AnalyzeConfig, keep_tokens: bool, workers: int) -> _Spawned:
    import multiprocessing as mp

    # spawn, not fork: the ingesting process already runs polars' and the tokenizer's thread pools,
    # which a forked child would inherit in an undefined state.
    ctx = mp.get_context("spawn")
    share = 1.0 / (workers + 1)
    inq = [ctx.Queue(maxsize=DEPTH) for _ in range(workers)]
    outq = [ctx.Queue(maxsize=DEPTH) for _ in range(workers)]
    me = os.getpid()  # each worker watches for this process's death (`die_with_parent`)
    procs = [ctx.Process(target=_serve, args=(cfg, keep_tokens, share, inq[w], outq[w], me),
                         name=f"prefixscan-encode-{w}", daemon=True) for w in range(workers)]
    with _main_not_reimported():
        for p in procs:
            p.start()
    return _Spawned(_key(cfg, keep_tokens, workers), inq, outq, procs)


_EARLY: _Spawned | None = None  # workers started by `start_early`, until a pool claims or discards them


def start_early(cfg: AnalyzeConfig, keep_tokens: bool, workers: int) -> None:
    """Start the encode workers a run will ask for now, so their start-up (interpreter, imports, tokenizer:
    ~1 s) overlaps this process's own imports and set-up instead of delaying the first encoded batch.
    The pool of the run with the same options claims them (`discard_early` stops unclaimed ones)."""
    global _EARLY
    discard_early()
    _EARLY = _spawn(cfg, keep_tokens, workers)


def discard_early() -> None:
    """Stop workers `start_early` started that no pool claimed (a run that failed or encoded nothing)."""
    global _EARLY
    early, _EARLY = _EARLY, None
    if early is not None:
        early.stop()


def _claim(cfg: AnalyzeConfig, keep_tokens: bool, workers: int) -> _Spawned:
    """The early-started workers when they were started for these options and still run, else new ones."""
    global _EARLY
    early, _EARLY = _EARLY, None
    if early is not None and early.key == _key(cfg, keep_tokens, workers) and all(p.is_alive() for p in early.procs):
        return early
    if early is not None:
        early.stop()
    return _spawn(cfg, keep_tokens, workers)


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


class EncodePool:
    """`workers` encode processes, plus a share of the work done here. `submit` a job ("encode": records;
    "rewrite": the detector's rewritten requests), `collect` the oldest job's results in its item order,
    `close` for the tokenizer identity and counters. Use as a context manager: leaving it on an error
    stops the workers.

    The share encoded in this process adapts: when this process finds no results waiting while the
    workers had input queued, it takes more conversations; when a worker finds its queue empty, fewer.
    On two cores, with one worker, this balances the two processes whatever the log's mix of encoding
    and other work. Which process encodes a record never changes its hashes, only the counters."""

    def __init__(self, cfg: AnalyzeConfig, keep_tokens: bool, workers: int, local: RecordEncoder) -> None:
        self.cfg, self.workers, self.local = cfg, workers, local
        share = 1.0 / (workers + 1)
        local.share_caches(share)
        local.set_threads(pool_threads(cfg, workers + 1))
        spawned = _claim(cfg, keep_tokens, workers)
        self._in, self._out, self._procs = spawned.inq, spawned.outq, spawned.procs
        self._inflight: deque[_Job] = deque()
        self._receivers = [Receiver() for _ in range(workers)]
        self._packers = [Packer() for _ in range(workers)]
        self._local_rewrites = shared_chain_cache(share, cfg)
        self.share = INITIAL_SHARE  # fraction of new conversations encoded here (adapted in `collect`)
        self._owners: dict[int, int] = {}  # pin hash -> the process its conversation was given to
        self.local_items = 0
        self.closed = False
        self.wait_s = 0.0  # time the ingesting process spent waiting for workers (manifest)
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
        if job.local_done is None:
            if job.kind == "encode":
                job.local_done = self.local.encode(job.local)
            else:
                job.local_done = rewrite_hashes(self.local.load(), self._local_rewrites, self.cfg.block_size,
                                                job.local)
            job.local = []

    def collect(self) -> tuple[str, list[Any]]:
        """The kind and results of the oldest job still out: for "encode" one Hashed or Rejected per
        record in order; for "rewrite" (id, hash parts, prompt tokens) per request that encoded."""
        job = self._inflight.popleft()
        self._encode_local(job)
        got = []
        waited = idle = False
        for w, _ in job.parts:
            for later in self._inflight:  # while the worker is not done, do this process's later parts
                if not self._out[w].empty():
                    break
                self._encode_local(later)
            waited |= self._out[w].empty()
            res, w_idle = self._get(w)
            idle |= w_idle
            got.append(res)
        if waited and not idle:
            self.share = min(MAX_SHARE, self.share + SHARE_STEP)
        elif idle and not waited:
            self.share = max(0.0, self.share - SHARE_STEP)
        local = job.local_done or []
        if job.kind == "rewrite":
            return job.kind, [(rid, self._receivers[w].parts(shipped), k)
                              for (w, _), res in zip(job.parts, got, strict=True) for rid, shipped, k in res] + local
        out: list[Any] = [None] * job.n
        for (_, pos), res in [*zip(job.parts, got, strict=True), ((-1, job.local_pos), local)]:
            for p, x in zip(pos, res, strict=True):
                out[p] = x
        return job.kind, out

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
                "final_share_main": round(self.share, 2)}

    def terminate(self) -> None:
        _Spawned((), self._in, self._out, self._procs).stop()
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

    def _get(self, w: int) -> tuple[Any, bool]:
        """A worker's next reply, and whether it had found its queue empty before that job."""
        t0 = time.perf_counter()
        while True:
            try:
                kind, payload, idle = self._out[w].get(timeout=POLL_S)
                self.wait_s += time.perf_counter() - t0
            except queue.Empty:
                self._check(w)
                continue
            if kind == "error":
                self.terminate()
                if isinstance(payload, BaseException):
                    raise payload
                raise WorkerFailed(f"encode worker {w} failed:\n{payload}")
            return payload, idle

    def _check(self, w: int) -> None:
        p = self._procs[w]
        if not p.is_alive():
            code = p.exitcode
            self.terminate()
            raise WorkerFailed(
                f"encode worker {w} exited with code {code} before finishing (out of memory, or killed?). "
                "Re-run with --workers 0 (Python: workers=0) to encode in the main process.")


def die_with_parent(parent_pid: int) -> None:
    """End this worker when the process that started it dies, however it dies (SIGKILL included): the
    kernel's parent-death signal on Linux, and everywhere a thread that sees the parent change. Ctrl-C
    reaches the whole process group: the parent handles it and stops the workers, so they ignore it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform == "linux":
        try:
            import ctypes

            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # pragma: no cover - no libc prctl: the thread below still works
            pass
    if os.getppid() != parent_pid:  # it died before the signal was armed
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="prefixscan-parent-watch", daemon=True).start()


PARENT_POLL_S = 0.5


def _serve(cfg: AnalyzeConfig, keep_tokens: bool, cache_share: float, inq: Any, outq: Any,
           parent_pid: int | None = None) -> None:
    """A worker's loop: encode batches until told to close, then report identity, counters, peak RSS."""
    from prefixscan.memory import fixed_mmap_threshold, peak_rss_mib

    if parent_pid is not None:
        die_with_parent(parent_pid)
    fixed_mmap_threshold()
    enc = RecordEncoder(cfg, keep_tokens, cache_share)
    enc.set_threads(pool_threads(cfg, round(1 / cache_share)))
    try:  # before the first batch arrives (the workers may start early: `start_early`)
        enc.load()
    except Exception:  # noqa: BLE001, S110 - the first batch loads it again and reports the failure as usual
        pass
    # the detector's rewrites have their own chain cache, as in-process
    rewrites, shipper = shared_chain_cache(cache_share, cfg), Shipper()
    unpacker = Unpacker()
    busy = 0.0
    try:
        while True:
            idle = inq.empty()  # nothing queued: the ingesting process is the slower side just now
            kind, payload = inq.get()
            t0 = time.perf_counter()
            if kind == "close":
                stats = enc.stats()
                stats.update(cpu_s_workers=time.process_time(), busy_s_workers=busy)
                outq.put(("done", (enc.identity(), stats, peak_rss_mib()), idle))
                return
            if kind == "encode":
                outq.put(("done", enc.encode([unpacker.unpack(r) for r in payload]), idle))
            else:
                payload = [(rid, unpacker.unpack(r), root) for rid, r, root in payload]
                done = rewrite_hashes(enc.load(), rewrites, cfg.block_size, payload)
                outq.put(("done", [(rid, shipper.ship(parts), n) for rid, parts, n in done], idle))
            busy += time.perf_counter() - t0
    except Exception as exc:  # noqa: BLE001 - every failure goes back to the ingesting process
        try:  # the queue pickles in a background thread, where a failure would be lost: try it here
            pickle.loads(pickle.dumps(exc))
            outq.put(("error", exc, False))
        except Exception:  # noqa: BLE001 - an exception that cannot be pickled goes back as text
            outq.put(("error", traceback.format_exc(), False))
