"""Encode worker processes: started (early, before the pipeline's imports, or when a pool needs them),
claimed by the run's `EncodePool`, and the loop each runs (`_serve`): encode batches until told to close.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
import traceback
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from prefixscan.config import AnalyzeConfig
from prefixscan.encode.encoder import Hashed, RecordEncoder, pool_threads, rewrite_hashes, shared_chain_cache
from prefixscan.encode.hashing import BytesLRU
from prefixscan.pipeline.encode_wire import Shipper, Unpacker
from prefixscan.read.record import Record

DEPTH = 6  # batches in flight per direction and worker: bounds memory; deep enough that a burst of long
# prompts on one side does not leave the other waiting (2 left both sides waiting in turn on real text)


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
class Spawned:
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


def _spawn(cfg: AnalyzeConfig, keep_tokens: bool, workers: int) -> Spawned:
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
    return Spawned(_key(cfg, keep_tokens, workers), inq, outq, procs)


_EARLY: Spawned | None = None  # workers started by `start_early`, until a pool claims or discards them


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


def claim(cfg: AnalyzeConfig, keep_tokens: bool, workers: int) -> Spawned:
    """The early-started workers when they were started for these options and still run, else new ones."""
    global _EARLY
    early, _EARLY = _EARLY, None
    if early is not None and early.key == _key(cfg, keep_tokens, workers) and all(p.is_alive() for p in early.procs):
        return early
    if early is not None:
        early.stop()
    return _spawn(cfg, keep_tokens, workers)



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
SENT_BYTES = 8 << 20  # memory of which contents and pieces a worker already sent (keys only)


class Prework:
    """The findings detector's per-content work (`detect.content`: units of the early messages, their
    serialized lists, the order checks), done in the worker that encodes a record: on real text it was
    half the ingesting process's own work. Each content and piece goes back once, with the first record
    that needs it (`Hashed.detect`); the detector adopts it (`ContentMemo.adopt`) and finds the rest of
    the conversation's turns in its memo. A conversation's turns are pinned to one worker, so its first
    turn is the one that carries them. Only speed depends on what is sent: the detector computes what it
    is not sent."""

    def __init__(self) -> None:
        from prefixscan.detect.content import ContentMemo, tenant_salt
        from prefixscan.detect.detector import MEMO_BYTES

        self.memo, self.salt = ContentMemo(MEMO_BYTES), tenant_salt
        self.sent = BytesLRU(SENT_BYTES)

    def of(self, r: Record) -> tuple[Any, list[Any]] | None:
        """(content, the pieces not sent before) of a chat record whose content was not sent, else None."""
        if r.kind != "chat" or not r.messages:
            return None
        try:
            texts, content = self.memo.of(r, self.salt(r.tenant or ""))
            if self.sent.get(content.key) is not None:
                return None
            self.sent.put(content.key, True, 100 + 40 * len(content.key))
            new = []
            for p in self.memo.pieces_of(content, r, texts, live=False):
                if self.sent.get(p.key) is None:
                    self.sent.put(p.key, True, 150)
                    new.append(p)
            return content, new
        except Exception:  # the detector, fed the record, meets the same failure and counts it
            return None


def _serve(cfg: AnalyzeConfig, keep_tokens: bool, cache_share: float, inq: Any, outq: Any,
           parent_pid: int | None = None) -> None:
    """A worker's loop: encode batches until told to close, then report identity, counters, peak RSS."""
    from prefixscan.memory import fewer_collections, fixed_mmap_threshold, peak_rss_mib

    if parent_pid is not None:
        die_with_parent(parent_pid)
    fixed_mmap_threshold()
    enc = RecordEncoder(cfg, keep_tokens, cache_share)
    enc.set_threads(pool_threads(cfg, round(1 / cache_share)))
    try:  # before the first batch arrives (the workers may start early: `start_early`)
        enc.load()
    except Exception:  # the first batch loads it again and reports the failure as usual
        pass
    # the detector's rewrites have their own chain cache, as in-process
    rewrites, shipper = shared_chain_cache(cache_share, cfg), Shipper()
    unpacker = Unpacker()
    prework = Prework() if cfg.findings else None
    busy = 0.0
    try:
        with fewer_collections():  # its caches are large and hold no cycles
            while True:
                kind, payload = inq.get()
                t0, c0 = time.perf_counter(), time.process_time()
                if kind == "close":
                    stats = enc.stats()
                    stats.update(cpu_s_workers=time.process_time(), busy_s_workers=busy)
                    outq.put(("done", (enc.identity(), stats, peak_rss_mib()), (0.0, 0)))
                    return
                if kind == "encode":
                    recs = [unpacker.unpack(r) for r in payload]
                    out: list[Any] = enc.encode(recs)
                    if prework is not None:
                        for r, e in zip(recs, out, strict=True):
                            if isinstance(e, Hashed):
                                e.detect = prework.of(r)
                else:
                    payload = [(rid, unpacker.unpack(r), root) for rid, r, root in payload]
                    done = rewrite_hashes(enc.load(), rewrites, cfg.block_size, payload)
                    out = [(rid, shipper.ship(parts), n) for rid, parts, n in done]
                # the cost model's input (`EncodePool._adapt`): CPU seconds and items of this job
                outq.put(("done", out, (time.process_time() - c0, len(payload))))
                busy += time.perf_counter() - t0
    except Exception as exc:  # every failure goes back to the ingesting process
        try:  # the queue pickles in a background thread, where a failure would be lost: try it here
            pickle.loads(pickle.dumps(exc))
            outq.put(("error", exc, None))
        except Exception:  # an exception that cannot be pickled goes back as text
            outq.put(("error", traceback.format_exc(), None))
