"""Reference copy (tests/detect_reference/__init__.py).

Pattern-free breakers: find the span that varies between requests that otherwise carry the same content.

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
from prefixscan.detect.normalisation import BIG, Unit

MAX_GAP = 6  # units in a varying span (fields are short; longer differences are different content)
MIN_RUN = 64  # characters of shared content that must follow a span for it to break anything
MAX_CHUNKS = 4_000_000
MAX_FAMILIES = 50_000
MAX_EXEMPLAR_CHARS = 64_000_000
MAX_TEXT = 4096
MAX_SPAN_CHARS = 2000
PROSE = 160  # exemplar unit texts kept up to this length


@dataclass
class Family:
    """Requests of one tenant that share content; the first one is the exemplar others align to."""

    fid: int
    tenant: str
    units: list[Unit]
    texts: list[str | None]
    pos: dict[int, int]
    request_id: str
    root: int
    pre: list[str] = field(default_factory=list)  # blank text before each exemplar unit (to restore drift)
    tools: list[Any] | None = None  # the exemplar's tools as sent (to restore their key order)
    record: Any = None  # the exemplar Record, kept (bounded) so it can be rewritten once its slots are known
    slots: dict[int, Any] = field(default_factory=dict)  # exemplar unit index -> finding key
    requests: int = 1


@dataclass
class Alignment:
    """How a request's units line up with its family exemplar's."""

    pairs: list[tuple[int, int | None, int, int]]  # (request unit, exemplar unit or None, resync unit, span start)
    runs: list[tuple[int, int, int]]  # (request start, exemplar start, length) of matched units
    drifts: list[tuple[int, int]]  # matched units whose raw bytes differ


class FamilyIndex:
    """Chunk owners and families, per tenant."""

    def __init__(self) -> None:
        self.owner: dict[int, int] = {}
        self.families: list[Family] = []
        self.exemplar_chars = 0

    def assign(self, tenant_salt: int, units: list[Unit]) -> tuple[Family | None, bool]:
        """The family a request belongs to, by a length-weighted vote of its known big units.

        Returns (family, is_new_exemplar_needed): when most of the request's big content is unknown it
        starts a family of its own, so documents and prompts each get an exemplar.
        """
        votes: dict[int, int] = {}
        unknown = 0
        for u in units:
            if u.length < BIG:
                continue
            f = self.owner.get(u.norm ^ tenant_salt)
            if f is None:
                unknown += u.length
            else:
                votes[f] = votes.get(f, 0) + u.length
        best = max(votes.items(), key=lambda kv: (kv[1], -kv[0]))[0] if votes else None
        known = votes.get(best, 0) if best is not None else 0
        return (self.families[best] if best is not None else None), unknown > known

    def new_family(self, tenant: str, tenant_salt: int, units: list[Unit], texts: list[str | None],
                   request_id: str, root: int, record: Any, chars: int, pre: list[str]) -> Family | None:
        if len(self.families) >= MAX_FAMILIES:
            return None
        fam = Family(len(self.families), tenant, units, texts, {}, request_id, root, pre=pre,
                     tools=getattr(record, "tools", None))
        for i, u in enumerate(units):
            fam.pos.setdefault(u.norm, i)
        if self.exemplar_chars + chars <= MAX_EXEMPLAR_CHARS:
            fam.record = record
            self.exemplar_chars += chars
        self.families.append(fam)
        if len(self.owner) < MAX_CHUNKS:
            for u in units:
                if u.length >= BIG:
                    self.owner.setdefault(u.norm ^ tenant_salt, fam.fid)
        return fam


def _run(r: list[Unit], e: list[Unit], i: int, k: int) -> tuple[int, int]:
    """(units, characters) of the matched run starting at r[i], e[k]."""
    n = 0
    chars = 0
    while i + n < len(r) and k + n < len(e) and r[i + n].norm == e[k + n].norm:
        chars += r[i + n].length
        n += 1
    return n, chars


def align(r: list[Unit], fam: Family) -> Alignment:
    """Walk request and exemplar units together; at each divergence look for a re-synchronisation
    within MAX_GAP units followed by at least MIN_RUN characters of shared content."""
    e = fam.units
    pairs: list[tuple[int, int | None, int, int]] = []
    runs: list[tuple[int, int, int]] = []
    drifts: list[tuple[int, int]] = []
    i = k = 0
    while i < len(r) and k < len(e):
        n, _ = _run(r, e, i, k)
        if n:
            runs.append((i, k, n))
            drifts.extend((i + t, k + t) for t in range(n) if r[i + t].raw != e[k + t].raw)
            i += n
            k += n
            continue
        found = None
        for j in range(i, min(len(r), i + MAX_GAP + 1)):
            kk = fam.pos.get(r[j].norm)
            if kk is None or kk < k or kk - k > MAX_GAP or (j == i and kk == k):
                continue
            if kk < k or _run(r, e, j, kk)[1] < MIN_RUN:
                continue
            found = (j, kk)
            break
        if found is None:
            # A substitution of equal length followed by shared content is also a span.
            for g in range(1, MAX_GAP + 1):
                if i + g < len(r) and k + g < len(e) and r[i + g].norm == e[k + g].norm \
                        and _run(r, e, i + g, k + g)[1] >= MIN_RUN:
                    found = (i + g, k + g)
                    break
        if found is None:
            break
        j, kk = found
        if j - i == kk - k:
            pairs.extend((i + t, k + t, j, i) for t in range(j - i) if r[i + t].norm != e[k + t].norm)
        elif _field_like(r[i:j]) and _field_like(e[k:kk]):
            pairs.extend((i + t, None, j, i) for t in range(j - i))
        i, k = j, kk
    return Alignment(pairs, runs, drifts)


def _field_like(units: list[Unit]) -> bool:
    """Fields are short lines; a span holding several units one of which is prose, or many characters,
    is different content (another retrieved chunk), which is the variable layer, not a breaker."""
    chars = sum(u.length for u in units)
    return chars <= MAX_SPAN_CHARS and not (len(units) > 1 and any(u.length >= PROSE for u in units))


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
