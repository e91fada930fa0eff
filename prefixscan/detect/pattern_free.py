"""Pattern-free breakers: find the span that varies between requests that otherwise carry the same content.

A customer's name or an A/B label matches no regex, but it shows up structurally: two requests of one
tenant share long content chunks (position-independent: found by hashing units, not prefixes), yet their
prefixes diverge early and re-synchronise after a short span. Requests are grouped into *families* by
the chunks they share (a vote over known chunk hashes); each family keeps one exemplar, and every request
is aligned against its family's exemplar to locate the short spans that differ before shared content.
State is bounded: chunk owners, families and stored exemplar text all have caps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prefixscan.affixes import common_affixes
from prefixscan.detect.normalisation import BIG
from prefixscan.detect.pieces import Piece, Units

MAX_GAP = 6  # units in a varying span (fields are short; longer differences are different content)
MIN_RUN = 64  # characters of shared content that must follow a span for it to break anything
MAX_CHUNKS = 4_000_000
MAX_FAMILIES = 50_000
MAX_EXEMPLAR_CHARS = 64_000_000
MAX_SPAN_CHARS = 2000
PROSE = 160  # exemplar unit texts kept up to this length


@dataclass
class Family:
    """Requests of one tenant that share content; the first one is the exemplar others align to."""

    fid: int
    tenant: str
    units: Units
    texts: list[str | None]
    pos: dict[int, int]
    request_id: str
    root: int
    pre: list[str] = field(default_factory=list)  # blank text before each exemplar unit (to restore drift)
    tools: list[Any] | None = None  # the exemplar's tools as sent (to restore their key order)
    record: Any = None  # the exemplar Record, kept (bounded) so it can be rewritten once its slots are known
    slots: dict[int | tuple[str, int], Any] = field(default_factory=dict)  # exemplar unit index -> finding key
    requests: int = 1


@dataclass
class Alignment:
    """How a request's units line up with its family exemplar's."""

    pairs: list[tuple[int, int | None, int, int]]  # (request unit, exemplar unit or None, resync unit, span start)
    runs: list[tuple[int, int, int]]  # (request start, exemplar start, length) of matched units
    drifts: list[tuple[int, int]]  # matched units whose raw bytes differ


class _Votes:
    """One piece's share of the family vote for one tenant: characters per owning family, and the big
    units (owner key, length) whose owner was unknown when last looked up (rechecked only after owners
    were added)."""

    __slots__ = ("version", "votes", "unknown", "unknown_chars")

    def __init__(self, unknown: list[tuple[int, int]]) -> None:
        self.version = -1
        self.votes: dict[int, int] = {}
        self.unknown = unknown
        self.unknown_chars = sum(n for _, n in unknown)


class FamilyIndex:
    """Chunk owners and families, per tenant.

    Owners are only ever added (`setdefault`), never changed, so a piece's votes stay valid and only its
    still-unknown units need a new look-up, and only once `version` (bumped when owners are added) moved.
    """

    def __init__(self) -> None:
        self.owner: dict[int, int] = {}
        self.families: list[Family] = []
        self.exemplar_chars = 0
        self.version = 0

    def assign(self, tenant_salt: int, pieces: list[Piece]) -> tuple[Family | None, bool]:
        """The family a request belongs to, by a length-weighted vote of its known big units.

        Returns (family, is_new_exemplar_needed): when most of the request's big content is unknown it
        starts a family of its own, so documents and prompts each get an exemplar.
        """
        if len(pieces) == 1:
            v = self._piece_votes(tenant_salt, pieces[0])
            votes, unknown = v.votes, v.unknown_chars
        else:
            votes, unknown = {}, 0
            for p in pieces:
                v = self._piece_votes(tenant_salt, p)
                unknown += v.unknown_chars
                for f, c in v.votes.items():
                    votes[f] = votes.get(f, 0) + c
        best = max(votes.items(), key=lambda kv: (kv[1], -kv[0]))[0] if votes else None
        known = votes.get(best, 0) if best is not None else 0
        return (self.families[best] if best is not None else None), unknown > known

    def _piece_votes(self, tenant_salt: int, piece: Piece) -> _Votes:
        v = piece.votes.get(tenant_salt)  # held by the piece: evicted with it
        if v is None:
            v = piece.votes[tenant_salt] = _Votes([(n ^ tenant_salt, ln) for n, ln in
                                                   zip(piece.norm, piece.length, strict=True) if ln >= BIG])
        if v.version != self.version and v.unknown:
            still = []
            owner = self.owner
            for key, n in v.unknown:
                f = owner.get(key)
                if f is None:
                    still.append((key, n))
                else:
                    v.votes[f] = v.votes.get(f, 0) + n
            if len(still) < len(v.unknown):
                v.unknown = still
                v.unknown_chars = sum(n for _, n in still)
        v.version = self.version
        return v

    def new_family(self, tenant: str, tenant_salt: int, units: Units, texts: list[str | None],
                   request_id: str, root: int, record: Any, chars: int, pre: list[str]) -> Family | None:
        if len(self.families) >= MAX_FAMILIES:
            return None
        fam = Family(len(self.families), tenant, units, texts, {}, request_id, root, pre=pre,
                     tools=getattr(record, "tools", None))
        for i, n in enumerate(units.norm):
            fam.pos.setdefault(n, i)
        if self.exemplar_chars + chars <= MAX_EXEMPLAR_CHARS:
            fam.record = record
            self.exemplar_chars += chars
        self.families.append(fam)
        if len(self.owner) < MAX_CHUNKS:
            owner = self.owner
            for n, ln in zip(units.norm, units.length, strict=True):
                if ln >= BIG:
                    owner.setdefault(n ^ tenant_salt, fam.fid)
            self.version += 1
        return fam


def _match(rn: list[int], en: list[int], i: int, k: int) -> int:
    """Units of the matched run starting at r[i], e[k]: the whole rest compared at once (list slices
    compare at C speed), then, if it differs, the first difference found by halving."""
    m = min(len(rn) - i, len(en) - k)
    if m <= 0 or rn[i] != en[k]:
        return 0
    a, b = rn[i:i + m], en[k:k + m]
    if a == b:
        return m
    lo, hi = 1, m  # a[:lo] == b[:lo]; a[:hi] != b[:hi]
    while hi - lo > 4:
        mid = (lo + hi) >> 1
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    while a[lo] == b[lo]:
        lo += 1
    return lo


def _chars(r: Units, i: int, n: int) -> int:
    return sum(r.length[i:i + n])


def align(r: Units, fam: Family) -> Alignment:
    """Walk request and exemplar units together; at each divergence look for a re-synchronisation
    within MAX_GAP units followed by at least MIN_RUN characters of shared content."""
    e = fam.units
    rn, en = r.norm, e.norm
    nr, ne = len(rn), len(en)
    pairs: list[tuple[int, int | None, int, int]] = []
    runs: list[tuple[int, int, int]] = []
    drifts: list[tuple[int, int]] = []
    same = _same_pieces(r, e)  # leading units known equal (raw bytes too): no need to compare them
    i = k = 0
    while i < nr and k < ne:
        n = same + _match(rn, en, same, same) if same else _match(rn, en, i, k)
        if n:
            runs.append((i, k, n))
            rr, er = r.raw, e.raw
            if rr[i + same:i + n] != er[k + same:k + n]:
                drifts.extend((i + t, k + t) for t in range(same, n) if rr[i + t] != er[k + t])
            same = 0
            i += n
            k += n
            continue
        found = _resync(r, e, fam.pos, i, k)
        if found is None:
            break
        j, kk = found
        if j - i == kk - k:
            pairs.extend((i + t, k + t, j, i) for t in range(j - i) if rn[i + t] != en[k + t])
        elif _field_like(r.length[i:j]) and _field_like(e.length[k:kk]):
            pairs.extend((i + t, None, j, i) for t in range(j - i))
        i, k = j, kk
    return Alignment(pairs, runs, drifts)


def _same_pieces(r: Units, e: Units) -> int:
    """Units in the leading pieces request and exemplar share (the same text of the same message)."""
    n = 0
    for (ka, na), (kb, _) in zip(r.keys, e.keys, strict=False):
        if ka != kb:
            break
        n += na
    return n


def _resync(r: Units, e: Units, pos: dict[int, int], i: int, k: int) -> tuple[int, int] | None:
    """Where request and exemplar match again after diverging at (i, k): a unit of the request found in
    the exemplar shortly after k, else an equal-length substitution; either followed by MIN_RUN chars."""
    rn, en = r.norm, e.norm
    for j, x in enumerate(rn[i:i + MAX_GAP + 1], i):
        kk = pos.get(x)
        if kk is None or kk < k or kk - k > MAX_GAP or (j == i and kk == k):
            continue
        if _chars(r, j, _match(rn, en, j, kk)) < MIN_RUN:
            continue
        return j, kk
    # A substitution of equal length followed by shared content is also a span.
    for g, (x, y) in enumerate(zip(rn[i + 1:i + MAX_GAP + 1], en[k + 1:k + MAX_GAP + 1], strict=False), 1):
        if x == y and _chars(r, i + g, _match(rn, en, i + g, k + g)) >= MIN_RUN:
            return i + g, k + g
    return None


def _field_like(lengths: list[int]) -> bool:
    """Fields are short lines (`lengths`: of a span's units); a span holding several units one of which is
    prose, or many characters, is different content (another retrieved chunk), the variable layer."""
    return sum(lengths) <= MAX_SPAN_CHARS and not (len(lengths) > 1 and any(n >= PROSE for n in lengths))


def is_edit(a: str, b: str) -> bool:
    """Two versions of one prose line are an edit (template churn) when they share most of their text at
    the start and end; a different retrieved passage shares almost nothing."""
    p, q = common_affixes(a, b)
    return p + q >= 0.5 * min(len(a), len(b))


def covered(al: Alignment, e_index: int) -> int | None:
    """The request unit aligned with exemplar unit `e_index` by a matched run, if any."""
    for rs, es, n in al.runs:
        if es <= e_index < es + n:
            return rs + (e_index - es)
    return None
