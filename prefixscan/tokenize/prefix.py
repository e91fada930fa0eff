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
SKETCH = 48  # characters of a message's start and end in its look-up key
ENTRY = 400  # bytes an entry costs besides its arrays (objects, dict slots; an estimate)


@dataclass(slots=True, eq=False)
class Prefix:
    """The leading pieces of a prompt and what they encode to: token ids (a read-only view of the
    prompt's array), the memo key and token count of each unit, where each piece's units end, and per
    namespace root the chain's rolling key after the last unit (`hashing.ChainCache`), with the keys of
    the checkpoints inside it."""

    flags: bytes  # 1 for a special-token piece, 0 for text, one per piece
    texts: tuple[str, ...]  # the pieces' text (strings, not (flag, text) pairs: fewer objects to track)
    tokens: np.ndarray
    # Tuples, not lists: tuples of atomic values drop out of the garbage collector's tracking, so a
    # memo of thousands of prefixes does not slow every collection (it did: render took 3x as long).
    keys: tuple[bytes, ...]
    lens: tuple[int, ...]  # one per unit
    piece_end: tuple[int, ...]
    size: int  # bytes it holds, roughly (its text, ids, keys, lengths)
    rolls: dict[int, tuple[int, tuple[int, ...]]] = field(default_factory=dict)

    @property
    def n_pieces(self) -> int:
        return len(self.texts)

    @property
    def n_units(self) -> int:
        return len(self.keys)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


Signature = tuple[bytes, tuple[str, ...]]


def signature(pieces: tuple[tuple[bool, str], ...]) -> Signature:
    """A prompt's pieces as (flags, texts), the form prefixes are held and compared in."""
    return bytes(bool(s) for s, _ in pieces), tuple(t for _, t in pieces)


def _sketch(content: Any) -> tuple[int, str, str]:
    text = content if isinstance(content, str) else content_text(content)
    return len(text), text[:SKETCH], text[-SKETCH:]


def lookup_key(messages: list[dict[str, Any]], tools: Any) -> int | None:
    """Where a request's candidate prefixes are filed: a sketch (length, start, end) of its leading system
    messages and first other message (every turn of a conversation starts with them), and its tools'
    count. A sketch, not a hash of the text: long system prompts made hashing them cost more than the
    memo saved; two conversations with the same sketch are told apart by the comparison. None: no such
    message."""
    i = 0
    while i < len(messages) and messages[i].get("role") in ("system", "developer"):
        i += 1
    if i >= len(messages):
        return None
    try:
        return hash((len(tools or ()), *(_sketch(m.get("content")) for m in messages[:i + 1])))
    except TypeError:  # content that renders oddly: no memo for this request
        return None


class PrefixMemo:
    """Remembered prefixes, filed by `lookup_key`, bounded in bytes (least recently used out first)."""

    def __init__(self, max_bytes: int | None = None) -> None:
        self._lru = BytesLRU(PREFIX_BYTES if max_bytes is None else max_bytes)

    @property
    def max_bytes(self) -> int:
        return self._lru.max_bytes

    def find(self, key: int | None, sig: Signature) -> Prefix | None:
        """The longest remembered prefix the request's pieces (`signature`) start with and go on after."""
        if key is None:
            return None
        cands = self._lru.get(key)
        if not cands:
            return None
        best = None
        flags, texts = sig
        n = len(texts)
        for c in cands:
            k = c.n_pieces
            if k < n and (best is None or k > best.n_pieces) and flags[:k] == c.flags and texts[:k] == c.texts:
                best = c
        return best

    def remember(self, key: int | None, new: Prefix, used: Prefix | None) -> None:
        """File `new` under `key`, in place of the prefix it extends (that conversation's previous turn)."""
        if key is None:
            return
        cands = self._lru.get(key) or []
        keep = [c for c in cands if c is not used and c.texts != new.texts][:PER_KEY - 1]
        keep.insert(0, new)
        self._lru.put(key, keep, sum(c.size for c in keep))


def extend(base: Prefix | None, sig: Signature, k: int, toks: np.ndarray,
           keys: list[bytes], lens: list[int], piece_end: list[int]) -> Prefix:
    """The prefix of the first `k` pieces of a prompt (`k` > the base's pieces): `keys`, `lens` are the
    units after the base, `piece_end` every piece's end (absolute), `toks` the whole prompt's ids."""
    n_units = piece_end[k - 1]
    if base is not None:
        own = n_units - base.n_units
        all_keys, all_lens = base.keys + tuple(keys[:own]), base.lens + tuple(lens[:own])
        n_tok, size, j = base.n_tokens + sum(lens[:own]), base.size, base.n_pieces
    else:
        own = n_units
        all_keys, all_lens = tuple(keys[:own]), tuple(lens[:own])
        n_tok, size, j = sum(lens[:own]), ENTRY, 0
    flags, texts = sig
    size += sum(map(len, texts[j:k])) + 28 * (own + k - j) + 4 * n_tok
    # A view, not a copy: the prompt's array is made read-only, so what the prefix holds cannot change.
    toks.flags.writeable = False
    return Prefix(flags[:k], texts[:k], toks[:n_tok], all_keys, all_lens, tuple(piece_end[:k]), size)


def tokens_before(base: Prefix | None, lens: list[int], unit: int) -> int:
    """Tokens of a prompt's first `unit` units, given its base prefix and the lengths of the units after."""
    if base is None:
        return int(sum(lens[:unit]))
    if unit <= base.n_units:
        return int(sum(base.lens[:unit]))
    return base.n_tokens + int(sum(lens[:unit - base.n_units]))
