"""Encode stage, one record at a time: render, tokenise and hash a text record into chained block hashes.

`RecordEncoder` is what runs in this process and in every encode worker (`encode_pool.py`). The tokenizer's
segment memo is exact by construction (it cuts text only where the tokenizer cannot merge across,
`tokenize.cuts`), so the hashes are the same bytes whichever process encodes a record; only the work
counters depend on it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import xxhash

from prefixscan.config import AnalyzeConfig
from prefixscan.encode.hashing import BytesLRU, ChainCache, namespace_hash
from prefixscan.encode.tokenize.base import conversation_key
from prefixscan.encode.vllm_hash import RequestKeys, has_lora_path, hasher_for, request_keys
from prefixscan.read.record import Record, RecordError

POOL_MIN_BYTES = 64 << 20  # below this much input the workers' start-up (~1-2 s) costs more than they save


@dataclass(slots=True)
class Hashed:
    """One accepted record's encoding: its namespace, token counts and chained block hashes."""

    root: int
    n_tokens: int
    head_tokens: int | None
    hashes: np.ndarray
    tokens: np.ndarray | None  # kept only for --granularity token
    detect: Any = None  # from an encode worker: the findings detector's (content, new pieces) of the record


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
    """The namespace hash a record's block chain starts from (model, adapter, salt: docs/definitions.md)."""
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
        self.threads = cfg.threads  # the tokenizer's threads (None: one per core)

    def set_threads(self, threads: int) -> None:
        """Tokenise with `threads` threads (also once loaded): a pool's processes share the cores."""
        self.threads = threads
        if self.tokenizer is not None and hasattr(self.tokenizer, "threads"):
            self.tokenizer.threads = threads

    def _caches(self) -> list[BytesLRU]:
        seg = getattr(self.tokenizer, "seg", None)
        digests = [self.chains.hasher.digest_memo] if self.chains.hasher is not None else []
        return [self.chains._d, *digests] + ([seg.memo._memo, seg.pieces, seg.last] if seg is not None else [])

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
            from prefixscan.encode.tokenize import load_tokenizer

            self.tokenizer = load_tokenizer(self.cfg.tokenizer, threads=self.threads)
            seg = getattr(self.tokenizer, "seg", None)
            if seg is not None:  # built at full size
                for lru in (seg.memo._memo, seg.pieces, seg.last):
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
    # Under their own conversation keys, so that a conversation's rewrites and its real turns do not take
    # each other's place in the tokenizer's conversation cache (each resumes from its own previous prompt).
    recs = [replace(r, conversation_id="\x00rewrite\x00" + r.conversation_id) if r.conversation_id is not None
            else r for _, r, _ in items]
    for (rid, r, root), enc in zip(items, tok.encode_batch(recs), strict=True):
        toks = getattr(enc, "tokens", None)
        if toks is None or not len(toks):
            continue
        # resumes the chain where an earlier rewrite with the same head stopped
        parts = chain_hashes(chains, r, toks, enc, root, block_size, parts=True)
        out.append((rid, parts, len(toks)))
    return out



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
    """Encode workers for this run: `cfg.workers` (--workers) when set, else one per spare core, at most one
    per POOL_MIN_BYTES of input (each worker's start-up and caches must pay for themselves), and none below
    POOL_MIN_BYTES. No fixed cap: on a many-core box a large log gets many workers, though this process
    (read, reuse, aggregate) then bounds the speed-up."""
    if cfg.workers is not None:
        return max(0, int(cfg.workers))
    if input_bytes < POOL_MIN_BYTES:
        return 0
    return max(0, min(available_cores() - 1, input_bytes // POOL_MIN_BYTES))


def pool_threads(cfg: AnalyzeConfig, processes: int) -> int:
    """Tokenizer threads of each process of a pool of `processes` (--threads when given): the cores
    shared out, so the processes' tokenizer threads do not take each other's cores."""
    return cfg.threads if cfg.threads is not None else max(1, available_cores() // processes)


def pin_hash(r: Record) -> int:
    """A 64-bit hash of what a record's conversation is pinned by (`tokenize.base.conversation_key`: its
    conversation id, else the start of its prompt; the turns of one conversation share it). Pinning keeps
    a conversation's segments and chain in one process's caches."""
    return xxhash.xxh64_intdigest(conversation_key(r).encode("utf-8", "surrogatepass"))
