"""The tokenizer interface and the segment memo shared by the backends."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import xxhash

from prefixscan.io.shapes import Record

EMPTY = np.zeros(0, dtype=np.uint32)


@dataclass
class TokenizerStats:
    """What the summary reports about tokenisation."""

    segments_seen: int = 0
    segments_tokenised: int = 0
    tokens_tokenised: int = 0
    memo_evictions: int = 0
    fallback_reason: str | None = None


class SegmentMemo:
    """Token ids per distinct text segment, keyed by xxh3-128 of the text, bounded in stored tokens."""

    def __init__(self, max_tokens: int = 64_000_000) -> None:
        self._memo: dict[bytes, np.ndarray] = {}
        self._tokens = 0
        self.max_tokens = max_tokens
        self.evictions = 0

    @staticmethod
    def key(text: str) -> bytes:
        return xxhash.xxh3_128_digest(text.encode("utf-8", "surrogatepass"))

    def get(self, key: bytes) -> np.ndarray | None:
        return self._memo.get(key)

    def put(self, key: bytes, ids: np.ndarray) -> None:
        if self._tokens + len(ids) > self.max_tokens:
            # Simple and bounded: drop everything; distinct content keeps memory from growing without limit.
            self._memo.clear()
            self._tokens = 0
            self.evictions += 1
        self._memo[key] = ids
        self._tokens += len(ids)


@dataclass
class Encoded:
    """Token ids of one record, and the tokens of its system-and-tools head when it has one.

    Chat records also carry their pieces (content key and token count per segment or special token) and
    the piece indexes after which the hash chain is worth remembering (`hashing.ChainCache`).
    """

    tokens: np.ndarray
    head_tokens: int | None
    piece_keys: list[bytes] | None = None
    piece_lens: list[int] | None = None
    checkpoints: list[int] | None = None


@dataclass
class Tokenizer:
    """Base class: `id` goes into the namespace; `approximate_template` is reported in the summary."""

    id: str
    template_version: str
    approximate_template: bool
    stats: TokenizerStats = field(default_factory=TokenizerStats)

    def encode_batch(self, records: list[Record]) -> list[Encoded]:
        raise NotImplementedError

    def encode_direct(self, record: Record) -> np.ndarray:
        """Reference path: render and tokenise the whole prompt at once (tests compare against it)."""
        raise NotImplementedError
