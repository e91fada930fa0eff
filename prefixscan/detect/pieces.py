"""The detector's units memoised per text: what a request brings is a few *pieces* (one per early message,
one for the tool list), each holding its units computed once per distinct text.

Why: a tenant's system prompt and a conversation's first user message come back on every request and every
turn. A piece keeps the columns the family vote and the alignment compare (norm and raw hashes, lengths) as
lists, and the whole units packed (64 bytes a unit, unpacked only where a request differs from its family's
exemplar), so the per-request cost no longer grows with the length of the resent text: the text is hashed
once to find its piece, and nothing else is done per unit unless something differs.
"""

from __future__ import annotations

import struct
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import orjson
import xxhash

from prefixscan.detect import normalisation as nz
from prefixscan.hashing import BytesLRU

UNIT = struct.Struct("<qqqQQqQq")  # nz.Unit packed: 64 bytes instead of a tuple of eight int objects
PIECE_OVERHEAD = 400  # bytes a memo entry is charged beyond its array (the Piece, its key, the text hash)


class Units:
    """A request's (or an exemplar's) units: the columns the vote and the alignment compare, as Python
    lists (list slices compare at C speed), and the pieces' packed units end to end; indexing unpacks an
    `nz.Unit` (Python ints)."""

    __slots__ = ("parts", "norm", "raw", "length", "_ends")

    def __init__(self, parts: list[bytes], norm: list[int], raw: list[int], length: list[int]) -> None:
        self.parts = parts
        self.norm, self.raw, self.length = norm, raw, length
        self._ends: list[int] | None = None

    def __len__(self) -> int:
        return len(self.norm)

    def __getitem__(self, i: int) -> nz.Unit:
        if i < 0:
            i += len(self.norm)
        if not 0 <= i < len(self.norm):
            raise IndexError(i)
        if len(self.parts) == 1:
            return nz.Unit._make(UNIT.unpack_from(self.parts[0], i * UNIT.size))
        if self._ends is None:
            self._ends = list(accumulate(len(p) // UNIT.size for p in self.parts))
        lo = 0
        for p, end in zip(self.parts, self._ends, strict=True):
            if i < end:
                return nz.Unit._make(UNIT.unpack_from(p, (i - lo) * UNIT.size))
            lo = end
        raise IndexError(i)

    def __iter__(self) -> Iterator[nz.Unit]:
        for p in self.parts:
            yield from map(nz.Unit._make, UNIT.iter_unpack(p))


def joined(pieces: list[Piece]) -> Units:
    """The units of a request: its pieces end to end, in message order."""
    if len(pieces) == 1:
        p = pieces[0]
        return Units([p.packed], p.norm, p.raw, p.length)
    norm: list[int] = []
    raw: list[int] = []
    length: list[int] = []
    for p in pieces:
        norm += p.norm
        raw += p.raw
        length += p.length
    return Units([p.packed for p in pieces], norm, raw, length)


@dataclass(slots=True, eq=False)
class Piece:
    """One early message's (or the tool list's) units and what the per-request checks need of its text."""

    key: tuple  # ("u", message index, role seed, 128-bit text hash) or ("t", 128-bit hash of the tools' JSON)
    packed: bytes  # the units, `UNIT` each
    norm: list[int]
    raw: list[int]
    length: list[int]
    cr: bool = False  # the text holds a carriage return (`nz.needs("line_endings", text)`)
    nonnfc: bool = False  # the text is not NFC (`nz.needs("unicode", text)`)

    @classmethod
    def of(cls, key: tuple, units: list[nz.Unit], cr: bool = False, nonnfc: bool = False) -> Piece:
        return cls(key, b"".join(UNIT.pack(*u) for u in units), [u.norm for u in units], [u.raw for u in units],
                   [u.length for u in units], cr, nonnfc)

    def size(self) -> int:
        """Bytes charged to the memo: the packed units, three lists of ints, and the entry itself."""
        return len(self.packed) + 130 * len(self.norm) + PIECE_OVERHEAD


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
            hit = Piece.of(key, nz.message_units(mi, text, seed), "\r" in text,
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
