"""The detector's units memoised per text: what a request brings is a few *pieces* (one per early message,
one for the tool list), each holding its units computed once per distinct text.

Why: a tenant's system prompt and a conversation's first user message come back on every request and every
turn. A piece keeps its units and the columns the family vote and the alignment compare (norm and raw
hashes, lengths) as lists, so the per-request cost no longer grows with the length of the resent text: the
text is hashed once to find its piece, and nothing else is done per unit unless something differs.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import orjson
import xxhash

from prefixscan.detect import normalisation as nz
from prefixscan.encode.hashing import BytesLRU

_NORM, _RAW, _LENGTH = (itemgetter(nz.Unit._fields.index(f)) for f in ("norm", "raw", "length"))
UNIT_BYTES = 320  # memory of one unit held in a piece: its tuple and ints, a pointer in each column, a vote
PIECE_OVERHEAD = 400  # bytes a memo entry is charged beyond its units (the Piece, its key, the text hash)


class Units:
    """A request's (or an exemplar's) units, and the columns the vote and the alignment compare, as
    Python lists: list slices compare at C speed."""

    __slots__ = ("units", "norm", "raw", "length", "keys")

    def __init__(self, units: list[nz.Unit], norm: list[int], raw: list[int], length: list[int],
                 keys: list[tuple[tuple, int]] | None = None) -> None:
        self.units = units
        self.norm, self.raw, self.length = norm, raw, length
        self.keys = keys or []  # (piece key, units) of the pieces end to end: equal keys, equal units

    def __len__(self) -> int:
        return len(self.units)

    def __getitem__(self, i: int) -> nz.Unit:
        return self.units[i]

    def __iter__(self) -> Iterator[nz.Unit]:
        return iter(self.units)


def joined(pieces: list[Piece]) -> Units:
    """The units of a request: its pieces end to end, in message order."""
    if len(pieces) == 1:
        p = pieces[0]
        return Units(p.units, p.norm, p.raw, p.length, [(p.key, len(p.units))])
    units: list[nz.Unit] = []
    norm: list[int] = []
    raw: list[int] = []
    length: list[int] = []
    for p in pieces:
        units += p.units
        norm += p.norm
        raw += p.raw
        length += p.length
    return Units(units, norm, raw, length, [(p.key, len(p.units)) for p in pieces])


@dataclass(slots=True, eq=False)
class Piece:
    """One early message's (or the tool list's) units and what the per-request checks need of its text."""

    key: tuple  # ("u", message index, role seed, 128-bit text hash) or ("t", 128-bit hash of the tools' JSON)
    units: list[nz.Unit]
    norm: list[int]
    raw: list[int]
    length: list[int]
    cr: bool = False  # the text holds a carriage return (`nz.needs("line_endings", text)`)
    nonnfc: bool = False  # the text is not NFC (`nz.needs("unicode", text)`)
    votes: dict[int, Any] = field(default_factory=dict)  # tenant salt -> its share of the family vote

    @classmethod
    def of(cls, key: tuple, units: list[nz.Unit], cr: bool = False, nonnfc: bool = False) -> Piece:
        return cls(key, units, list(map(_NORM, units)), list(map(_RAW, units)), list(map(_LENGTH, units)), cr, nonnfc)

    def size(self) -> int:
        """Bytes charged to the memo."""
        return UNIT_BYTES * len(self.units) + PIECE_OVERHEAD


def text_key(text: str) -> int:
    return xxhash.xxh3_128_intdigest(text.encode("utf-8", "surrogatepass"))


class PieceMemo:
    """Pieces by text, bounded by bytes (a dynamic system prompt is new text on every request)."""

    def __init__(self, max_bytes: int) -> None:
        self.lru = BytesLRU(max_bytes)

    def message(self, mi: int, seed: int, text: str, key: tuple | None = None) -> Piece:
        """The piece of message `mi` (`key`: its memo key, if the caller has it)."""
        key = key or ("u", mi, seed, text_key(text))
        hit = self.lru.get(key)
        if hit is None:
            hit = Piece(key, *nz.message_columns(mi, text, seed), "\r" in text,
                        not text.isascii() and not unicodedata.is_normalized("NFC", text))
            self.lru.put(key, hit, hit.size())
        return hit

    def tools(self, tools: list[Any], seed: int, key: tuple | None = None) -> Piece:
        key = key or ("t", xxhash.xxh3_128_intdigest(orjson.dumps(tools)))
        hit = self.lru.get(key)
        if hit is None:
            hit = Piece.of(key, nz.tool_units(tools, seed))
            self.lru.put(key, hit, hit.size())
        return hit
