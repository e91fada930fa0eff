"""Encoding text requests: render, tokenise and hash into chained block hashes, here or in worker processes.

Encoding is the per-record Python work of a chat log (chat-template rendering, splitting into memoised
segments, assembling ids, chaining hashes) and holds the GIL, so threads cannot share it. `EncodePool`
runs it in worker processes while the ingesting process reads, detects and aggregates: records go out in
batches, results come back in the order they went out, so the output does not depend on the number of
workers. Each record goes to the worker its conversation is pinned to (conversation id, or else the start
of its prompt), so a conversation's turns meet a warm segment memo and chain cache.

A worker holds its own tokenizer and segment memo. The memo is exact by construction (it cuts text only
where the tokenizer cannot merge across, `tokenize.cuts`), so the hashes are the same bytes whatever the
number of workers (tests/test_encode.py); only the work counters depend on it.
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
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import xxhash

from prefixscan.config import AnalyzeConfig
from prefixscan.errors import InputError
from prefixscan.hashing import BytesLRU, ChainCache, namespace_hash
from prefixscan.io.shapes import Record, RecordError
from prefixscan.render import content_text
from prefixscan.tokenize.base import SegmentMemo
from prefixscan.vllm_hash import RequestKeys, has_lora_path, hasher_for, request_keys

POOL_MIN_BYTES = 64 << 20  # below this much input the workers' start-up (~1-2 s) costs more than they save
MAX_AUTO_WORKERS = 3  # the ingesting process itself is the bottleneck beyond a few encoders
INTERN_BYTES = 32 << 20  # message text each worker keeps for `_Packer` (characters)
INTERN_MIN = 64  # shorter texts are sent as they are
INITIAL_SHARE = 0.0
SHARE_STEP = 0.05  # how fast this process's share of the encoding adapts (per job collected)
MAX_SHARE = 0.9
SHARE_STEPS = 1 << 16
DEPTH = 2  # batches in flight per direction and worker: bounds memory, keeps both processes busy
POLL_S = 1.0  # how often a waiting process checks that the other side is still alive


@dataclass(slots=True)
class Hashed:
    """One accepted record's encoding: its namespace, token counts and chained block hashes."""

    root: int
    n_tokens: int
    head_tokens: int | None
    hashes: np.ndarray
    tokens: np.ndarray | None  # kept only for --granularity token


@dataclass(slots=True)
class Rejected:
    """A record that cannot be encoded (template error, no tokens): it goes to the rejects table."""

    reason: str
    detail: str


@dataclass(frozen=True)
class Identity:
    """What goes into every namespace and the summary about the tokenizer that encoded the log."""

    id: str
    template_version: str
    approximate_template: bool


def _scale(lru: BytesLRU, factor: float) -> None:
    lru.max_bytes = max(1, int(lru.max_bytes * factor))


def shared_chain_cache(share: float, cfg: AnalyzeConfig | None = None) -> ChainCache:
    """A chain cache for this run's `--hash` (prefixscan's own without `cfg`), with `share` of the default
    budget (the detector's rewrites in a pool)."""
    out = ChainCache(hasher=hasher_for(cfg) if cfg is not None else None)
    out.lora_paths = dict(cfg.lora_paths) if cfg is not None else {}
    _scale(out._d, share)
    return out


def record_keys(chains: ChainCache, r: Record) -> RequestKeys | None:
    """A record's vLLM extra-key inputs (LoRA, cache_salt), or None with prefixscan's own hash."""
    if chains.hasher is None:
        return None
    return request_keys(chains.lora_paths, r.adapter, r.cache_salt)


def chain_hashes(chains: ChainCache, r: Record, toks: np.ndarray, enc: Any, root: int, bs: int,
                 parts: bool = False) -> Any:
    """A record's block hashes (or, with `parts`, their consecutive parts), resuming a remembered chain
    when the tokenizer gave pieces; vLLM's values when the chain cache has a vLLM hasher."""
    keys = record_keys(chains, r)
    if enc.piece_keys is not None:
        if parts:
            return chains.segments(toks, bs, root, enc.piece_keys, enc.piece_lens, enc.checkpoints, keys)
        return chains.hashes(toks, bs, root, enc.piece_keys, enc.piece_lens, enc.checkpoints, keys)
    h = chains.plain(toks, bs, root, keys)
    return [h] if parts else h


def root_of(cfg: AnalyzeConfig, r: Record, tokenizer_id: str, template: str) -> int:
    """The namespace hash a record's block chain starts from (REFERENCE.md: model, adapter, salt)."""
    tenant_salt = (r.tenant or "") if cfg.isolate_tenants else None
    return namespace_hash(r.model, tokenizer_id, r.adapter, template, r.cache_salt, tenant_salt)


class RecordEncoder:
    """Encodes text records in this process; the tokenizer loads on first use."""

    def __init__(self, cfg: AnalyzeConfig, keep_tokens: bool, cache_share: float = 1.0) -> None:
        self.cfg, self.keep_tokens = cfg, keep_tokens
        self.tokenizer: Any = None
        self.chains = shared_chain_cache(1.0, cfg)
        self.lora_without_path = 0
        self.media_items = 0
        self.cache_share = 1.0
        self.share_caches(cache_share)

    def _caches(self) -> list[BytesLRU]:
        seg = getattr(self.tokenizer, "seg", None)
        digests = [self.chains.hasher.digest_memo] if self.chains.hasher is not None else []
        return [self.chains._d, *digests] + ([seg.memo._memo, seg.pieces] if seg is not None else [])

    def share_caches(self, share: float) -> None:
        """Scale the byte budgets of this encoder's caches (chain cache, and the tokenizer's segment memo
        and piece cache) to `share` of what they were built with. The processes of a pool each encode
        their own conversations, so each needs about its share of the working set, and together they
        hold what one process would."""
        for lru in self._caches():
            _scale(lru, share / self.cache_share)
        self.cache_share = share

    def load(self) -> Any:
        if self.tokenizer is None:
            from prefixscan.tokenize import load_tokenizer

            self.tokenizer = load_tokenizer(self.cfg.tokenizer, threads=self.cfg.threads)
            seg = getattr(self.tokenizer, "seg", None)
            if seg is not None:  # built at full size
                for lru in (seg.memo._memo, seg.pieces):
                    _scale(lru, self.cache_share)
        return self.tokenizer

    def encode(self, records: list[Record]) -> list[Hashed | Rejected]:
        """Render, tokenise and hash each record (one batched tokenizer call for the new segments)."""
        tok = self.load()
        bs = self.cfg.block_size
        out: list[Hashed | Rejected] = []
        for r, e in zip(records, tok.encode_batch(records), strict=True):
            self.media_items += r.media_items
            if isinstance(e, RecordError):
                out.append(Rejected(e.reason, e.detail))
                continue
            toks = e.tokens
            if len(toks) == 0:
                out.append(Rejected("empty_prompt", "prompt has no tokens"))
                continue
            root = root_of(self.cfg, r, tok.id, tok.template_version)
            h = chain_hashes(self.chains, r, toks, e, root, bs)
            if r.adapter and self.chains.hasher is not None and not has_lora_path(self.chains.lora_paths, r.adapter):
                self.lora_without_path += 1
            out.append(Hashed(root, len(toks), e.head_tokens, h, toks if self.keep_tokens else None))
        return out

    def identity(self) -> Identity | None:
        t = self.tokenizer
        return None if t is None else Identity(t.id, t.template_version, bool(t.approximate_template))

    def stats(self) -> dict[str, Any]:
        """Work counters for the manifest (tokenizer memo, chain cache)."""
        out: dict[str, Any] = dict(vars(self.tokenizer.stats)) if self.tokenizer is not None else {}
        out.update(blocks_hashed=self.chains.blocks_hashed, blocks_reused=self.chains.blocks_reused)
        if self.chains.hasher is not None:
            out.update(vllm_lora_without_path=self.lora_without_path)
        if self.media_items:
            out.update(media_items=self.media_items)
        return out


class LazyTokenizer:
    """A tokenizer loaded on first use: with workers, the ingesting process needs its own only for the
    few direct encodings of finalised findings, and should not pay the load when there are none."""

    def __init__(self, load: Callable[[], Any]) -> None:
        self._load = load

    def __getattr__(self, name: str) -> Any:
        return getattr(self._load(), name)


def rewrite_hashes(tok: Any, chains: ChainCache, block_size: int, items: list[tuple[str, Record, int]]
                   ) -> list[tuple[str, list[np.ndarray], int]]:
    """The detector's rewritten requests (id, record, namespace) tokenised and hashed: (id, block hashes as
    consecutive parts, prompt tokens). Parts, because a rewritten conversation's turns share their history
    (`ChainCache.segments`), which is then held once. Requests that do not encode are left out."""
    out = []
    for (rid, r, root), enc in zip(items, tok.encode_batch([r for _, r, _ in items]), strict=True):
        toks = getattr(enc, "tokens", None)
        if toks is None or not len(toks):
            continue
        # resumes the chain where an earlier rewrite with the same head stopped
        parts = chain_hashes(chains, r, toks, enc, root, block_size, parts=True)
        out.append((rid, parts, len(toks)))
    return out


class _Shipper:
    """Sends hash parts across the process boundary without losing their sharing: each array a part is a
    prefix of travels once, under a number, and later parts refer to it by (number, length)."""

    def __init__(self) -> None:
        self._sent: dict[int, int] = {}
        self._next = 0

    def ship(self, parts: list[np.ndarray]) -> list[tuple[int, np.ndarray | None, int]]:
        out = []
        for p in parts:
            base = p if p.base is None else p.base
            if not (isinstance(base, np.ndarray) and base.ndim == 1 and base.dtype == p.dtype
                    and base.ctypes.data == p.ctypes.data):  # not a prefix of its base: send it whole
                base = p
            key = self._sent.get(id(base))
            if key is None:
                key = self._sent[id(base)] = self._next
                self._next += 1
                weakref.finalize(base, self._sent.pop, id(base), None)  # id() is reused once it is freed
                out.append((key, base, len(p)))
            else:
                out.append((key, None, len(p)))
        return out


class _Receiver:
    """The other end of `_Shipper`: parts as read-only prefix views of the arrays received."""

    def __init__(self) -> None:
        self._arrays: dict[int, np.ndarray] = {}

    def parts(self, shipped: list[tuple[int, np.ndarray | None, int]]) -> list[np.ndarray]:
        out = []
        for key, arr, n in shipped:
            if arr is not None:
                arr.flags.writeable = False
                self._arrays[key] = arr
            out.append(self._arrays[key][:n])
        return out


class _Packer:
    """Sends message texts across the process boundary once: a text the worker already holds goes as its
    16-byte key. Multi-turn chats resend their whole history every turn and tenants share system prompts,
    so this cuts what is pickled, piped and unpickled about 5x (a synth chat log: 526 MB -> 112 MB).
    Both ends keep the same byte-bounded LRU and apply the same operations in the same order, so they
    agree on what is held without talking about it."""

    def __init__(self) -> None:
        self._held = BytesLRU(INTERN_BYTES)

    def pack(self, r: Record) -> Record:
        if not r.messages:
            return r
        msgs, changed = [], False
        for m in r.messages:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, str) and len(c) >= INTERN_MIN:
                key = SegmentMemo.key(c)
                if self._held.get(key) is None:
                    self._held.put(key, True, len(c))
                else:
                    m = {**m, "content": key}
                    changed = True
            msgs.append(m)
        return replace(r, messages=msgs) if changed else r


class _Unpacker:
    """The worker's end of `_Packer`: restores each keyed text from its copy of the LRU."""

    def __init__(self) -> None:
        self._held = BytesLRU(INTERN_BYTES)

    def unpack(self, r: Record) -> Record:
        for m in r.messages or ():
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, bytes):
                text = self._held.get(c)
                if text is None:  # cannot happen while both ends apply the same operations
                    raise RuntimeError("encode worker: a message text it should hold is missing")
                m["content"] = text
            elif isinstance(c, str) and len(c) >= INTERN_MIN:
                self._held.put(SegmentMemo.key(c), c, len(c))
        return r


def merge_stats(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum the counters of several encoders; the first fallback reason met is the one reported."""
    out: dict[str, Any] = {}
    for p in parts:
        for k, v in p.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                if out.get(k) is None:
                    out[k] = v
            else:
                out[k] = out.get(k, 0) + v
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def auto_workers(cfg: AnalyzeConfig, input_bytes: int) -> int:
    """Encode workers for this run: `cfg.workers` when set, else one per spare core (up to
    MAX_AUTO_WORKERS) for inputs of POOL_MIN_BYTES or more, else none."""
    if cfg.workers is not None:
        return max(0, int(cfg.workers))
    if input_bytes < POOL_MIN_BYTES:
        return 0
    return max(0, min(available_cores() - 1, MAX_AUTO_WORKERS))


def pin_hash(r: Record) -> int:
    """A 64-bit hash of what a record's conversation is pinned by: its conversation id, else the start of
    its prompt (the turns of one conversation share it). Pinning keeps a conversation's segments and
    chain in one process's caches."""
    if r.conversation_id is not None:
        key = f"c\0{r.tenant}\0{r.conversation_id}"
    elif r.messages:
        key = "m\0" + "\0".join(content_text(m.get("content"))[:512] for m in r.messages[:2])
    else:
        key = "p\0" + (r.prompt or "")[:1024]
    return xxhash.xxh64_intdigest(key.encode("utf-8", "surrogatepass"))


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
        import multiprocessing as mp

        # spawn, not fork: the ingesting process already runs polars' and the tokenizer's thread pools,
        # which a forked child would inherit in an undefined state.
        ctx = mp.get_context("spawn")
        self.cfg, self.workers, self.local = cfg, workers, local
        share = 1.0 / (workers + 1)
        local.share_caches(share)
        self._in = [ctx.Queue(maxsize=DEPTH) for _ in range(workers)]
        self._out = [ctx.Queue(maxsize=DEPTH) for _ in range(workers)]
        me = os.getpid()  # each worker watches for this process's death (`die_with_parent`)
        self._procs = [ctx.Process(target=_serve, args=(cfg, keep_tokens, share, self._in[w], self._out[w], me),
                                   name=f"prefixscan-encode-{w}", daemon=True) for w in range(workers)]
        with _main_not_reimported():
            for p in self._procs:
                p.start()
        self._inflight: deque[_Job] = deque()
        self._receivers = [_Receiver() for _ in range(workers)]
        self._packers = [_Packer() for _ in range(workers)]
        self._local_rewrites = shared_chain_cache(share, cfg)
        self.share = INITIAL_SHARE  # fraction of conversations encoded here (adapted in `collect`)
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
        """-1 (this process) or the worker a record's conversation is pinned to."""
        h = pin_hash(r)
        if (h >> 40) % SHARE_STEPS < self.share * SHARE_STEPS:
            return -1
        return h % self.workers

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
        for p in self._procs:
            if p.is_alive():
                p.terminate()
        for p in self._procs:
            p.join(timeout=5)
        for q in self._in + self._out:
            q.cancel_join_thread()
            q.close()
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
    # the detector's rewrites have their own chain cache, as in-process
    rewrites, shipper = shared_chain_cache(cache_share, cfg), _Shipper()
    unpacker = _Unpacker()
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
