"""Conversation-prefix memo: a multi-turn request resends its conversation's history, so its leading
pieces are the previous turn's prompt without the generation prompt. Their tokens, unit keys and chain
state are taken from the memo whole, and only the pieces after them are planned, tokenised and hashed.

Exact by construction: a prompt's tokens are the concatenation of its pieces' tokens (pieces are cut at
special tokens, where no tokenizer merges, and a piece's tokens depend only on its text and on whether
it is the prompt's first piece, which a prefix always includes). A remembered prefix is used only when
the request's leading pieces are EQUAL to it (`==` on the text of every piece, every time, never a
sample or a hash), so equal pieces give equal tokens. The look-up key (the request's head and first
message) only finds the candidates; a wrong candidate fails the comparison and the request is planned
in full. Only speed depends on what is remembered (tests run with tiny bounds).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prefixscan.hashing import BytesLRU
from prefixscan.render import content_text

# Bound of the memo (a prefix costs its pieces' text, token ids, unit keys and lengths). Turns of one
# conversation replace each other, so what is held is about one history per live conversation.
PREFIX_BYTES = 64 << 20
PER_KEY = 8  # conversations remembered under one look-up key (same head and first message)
ENTRY = 400  # bytes an entry costs besides its arrays (objects, dict slots; an estimate)


@dataclass(slots=True, eq=False)
class Prefix:
    """The leading pieces of a prompt and what they encode to: token ids, the memo keys and token count
    of each unit, where each piece's units end, and per namespace root the chain's rolling key after
    the last unit (`hashing.ChainCache`), with the keys of the checkpoints inside it."""

    pieces: tuple[tuple[bool, str], ...]
    tokens: np.ndarray
    keys: list[bytes]
    lens: np.ndarray  # int64, one per unit
    piece_end: list[int]
    rolls: dict[int, tuple[int, tuple[int, ...]]] = field(default_factory=dict)

    @property
    def n_units(self) -> int:
        return len(self.keys)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def nbytes(self) -> int:
        text = sum(len(t) for _, t in self.pieces)
        return text + self.tokens.nbytes + 24 * len(self.keys) + self.lens.nbytes + 8 * len(self.piece_end) + ENTRY


def lookup_key(messages: list[dict[str, Any]], tools: Any) -> int | None:
    """Where a request's candidate prefixes are filed: its leading system messages and first other
    message (every turn of a conversation starts with them), and its tools' count. None: no such message."""
    i = 0
    while i < len(messages) and messages[i].get("role") in ("system", "developer"):
        i += 1
    if i >= len(messages):
        return None
    try:
        return hash((len(tools or ()), *(content_text(m.get("content")) for m in messages[:i + 1])))
    except TypeError:  # content that renders oddly: no memo for this request
        return None


class PrefixMemo:
    """Remembered prefixes, filed by `lookup_key`, bounded in bytes (least recently used out first)."""

    def __init__(self, max_bytes: int | None = None) -> None:
        self._lru = BytesLRU(PREFIX_BYTES if max_bytes is None else max_bytes)
        self.hits = 0
        self.hit_pieces = 0

    @property
    def max_bytes(self) -> int:
        return self._lru.max_bytes

    def find(self, key: int | None, pieces: tuple[tuple[bool, str], ...]) -> Prefix | None:
        """The longest remembered prefix the request's pieces start with (and go on after), else None."""
        if key is None:
            return None
        cands = self._lru.get(key)
        if not cands:
            return None
        best = None
        n = len(pieces)
        for c in cands:
            k = len(c.pieces)
            if k < n and (best is None or k > len(best.pieces)) and pieces[:k] == c.pieces:
                best = c
        if best is not None:
            self.hits += 1
            self.hit_pieces += len(best.pieces)
        return best

    def remember(self, key: int | None, new: Prefix, used: Prefix | None) -> None:
        """File `new` under `key`, in place of the prefix it extends (that conversation's previous turn)."""
        if key is None:
            return
        cands = self._lru.get(key) or []
        keep = [c for c in cands if c is not used and c.pieces != new.pieces][:PER_KEY - 1]
        keep.insert(0, new)
        self._lru.put(key, keep, sum(c.nbytes() for c in keep))


def extend(base: Prefix | None, pieces: tuple[tuple[bool, str], ...], k: int, toks: np.ndarray,
           keys: list[bytes], lens: list[int], piece_end: list[int]) -> Prefix:
    """The prefix of the first `k` pieces of a prompt (`k` > the base's pieces): `keys`, `lens` are the
    units after the base, `piece_end` every piece's end (absolute), `toks` the whole prompt's ids."""
    n_units = piece_end[k - 1]
    b_units = base.n_units if base is not None else 0
    own = n_units - b_units
    if base is not None:
        all_keys = base.keys + keys[:own]
        all_lens = np.concatenate([base.lens, np.asarray(lens[:own], dtype=np.int64)])
    else:
        all_keys = keys[:own]
        all_lens = np.asarray(lens[:own], dtype=np.int64)
    n_tok = int(all_lens.sum())
    out = toks[:n_tok].copy()
    out.flags.writeable = False
    return Prefix(pieces[:k], out, all_keys, all_lens, piece_end[:k])


def tokens_before(base: Prefix | None, lens: list[int], unit: int) -> int:
    """Tokens of a prompt's first `unit` units, given its base prefix and the lengths of the units after."""
    if base is None:
        return int(sum(lens[:unit]))
    if unit <= base.n_units:
        return int(base.lens[:unit].sum())
    return base.n_tokens + int(sum(lens[:unit - base.n_units]))
