"""Accumulators behind findings: what is known about one candidate (bounded), merging, locating tokens.

Kept apart from the Detector so the per-request path stays readable; everything here is small state
and the two computations `finalize` needs (merging keys of one field, the example's token offset).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prefixscan.detect import normalisation as nz
from prefixscan.detect.dynamic_fields import SlotLine, int_value
from prefixscan.read.record import Record
from prefixscan.redact import redact, redact_snippet

MAX_VALUES = 64
VALUE_SHAPED = {"timestamp", "date", "counter", "request_id", "session_id", "random_token", "phone"}


@dataclass
class Acc:
    """What is known about one candidate finding (bounded: values and examples are capped)."""

    key: tuple
    tenant: str
    mi: int
    role: str
    label: str
    family: str
    example: str
    example_request_id: str
    char_offset: int | None
    kinds: dict[str, int] = field(default_factory=dict)
    values: dict[int, int] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    ints: int = 0
    increases: int = 0
    last_int: int | None = None
    prose: int = 0
    token_offset: int | None = None
    detail: str | None = None
    fids: set[int] = field(default_factory=set)
    prefix: Record | None = None  # the example request up to the value, for its token offset (bounded: one)

    def merge(self, other: Acc) -> None:
        """Fold in an acc for the same field seen from another anchor (e.g. next to an edited paragraph)."""
        for k, v in other.kinds.items():
            self.kinds[k] = self.kinds.get(k, 0) + v
        for h, v in other.values.items():
            self._count(h, v)
        mine = set(self.requests)
        self.requests += [r for r in other.requests if r not in mine]
        self.ints += other.ints
        self.increases += other.increases
        self.prose += other.prose
        self.fids |= other.fids

    def add_request(self, rid: str) -> None:
        if not self.requests or self.requests[-1] != rid:
            self.requests.append(rid)

    def _count(self, h: int, n: int) -> None:
        """Count `n` more of the value hashed `h` (a new value only while fewer than MAX_VALUES are held)."""
        if h in self.values or len(self.values) < MAX_VALUES:
            self.values[h] = self.values.get(h, 0) + n

    def count_value(self, value: str, n: int) -> None:
        self._count(nz.text_hash(value), n)

    def observe(self, kind: str | None, value: str) -> None:
        self.kinds[kind or ""] = self.kinds.get(kind or "", 0) + 1
        self.count_value(value, 1)
        iv = int_value(value)
        if iv is not None:
            self.ints += 1
            if self.last_int is not None and iv > self.last_int:
                self.increases += 1
            self.last_int = iv


def _example(sl: SlotLine, kind: str | None) -> str:
    if kind in VALUE_SHAPED:
        shown = redact(sl.value)
    else:
        shown = f"<{kind or 'varying text'}>"  # names and free text are never shown, not even redacted
    return redact_snippet(f"{sl.label}: {shown}" if sl.label else shown, 96)


def merge_aliases(accs: dict[tuple, Acc]) -> dict[tuple, tuple]:
    """Merge span accs of one field (same tenant, message, label, family) found under different anchors;
    returns alias -> canonical key and removes the aliases from `accs`."""
    groups: dict[tuple, list[tuple]] = {}
    for key in accs:
        if key[0] == "span":
            groups.setdefault(key[1:4], []).append(key)
    alias: dict[tuple, tuple] = {}
    for keys in groups.values():
        if len(keys) < 2:
            continue
        keys.sort(key=lambda k: (-len(accs[k].requests), repr(k)))
        canon: list[tuple] = []
        for k in keys:
            into = next((c for c in canon if accs[c].fids & accs[k].fids), None)
            if into is None:
                canon.append(k)
            else:
                accs[into].merge(accs.pop(k))
                alias[k] = into
    return alias


def _prefix_record(rec: Record, mi: int, offset: int) -> Record:
    """What the token offset needs: the messages before `mi`, message `mi` cut at `offset`, the tools."""
    msgs = rec.messages or []
    if mi < 0:
        return Record("", 0, rec.request_id, 0.0, "chat", messages=list(msgs[:1]), tools=rec.tools)
    cut = {"role": msgs[mi].get("role"), "content": nz.message_text(msgs[mi])[:offset]}
    return Record("", 0, rec.request_id, 0.0, "chat", messages=[*msgs[:mi], cut], tools=rec.tools)


def token_offset(tokenizer: Any, acc: Acc) -> int | None:
    """Token offset of an acc's example location (computed for reported findings only)."""
    if tokenizer is None or acc.prefix is None:
        return None
    return _token_offset(tokenizer, acc.prefix, acc.mi, len(nz.message_text(acc.prefix.messages[acc.mi]))  # type: ignore[index]  # mi >= 0: chat
                         if acc.mi >= 0 else 0)


def _token_offset(tokenizer: Any, rec: Record, mi: int, offset: int) -> int | None:
    """Token index of character `offset` of message `mi` in the rendered prompt (tools: where they start)."""
    msgs = rec.messages or []
    try:
        if mi < 0:
            n_sys = next((i for i, m in enumerate(msgs) if m.get("role") not in ("system", "developer")), len(msgs))
            a = tokenizer.encode_direct(Record("", 0, "", 0.0, "chat", messages=msgs[:n_sys] or msgs[:1],
                                               tools=rec.tools))
            b = tokenizer.encode_direct(Record("", 0, "", 0.0, "chat", messages=msgs[:n_sys] or msgs[:1]))
            return _lcp(a, b)
        text = nz.message_text(msgs[mi])
        head = [*msgs[:mi], {"role": msgs[mi].get("role"), "content": text[:offset]}]
        empty = [*msgs[:mi], {"role": msgs[mi].get("role"), "content": ""}]
        a = tokenizer.encode_direct(Record("", 0, "", 0.0, "chat", messages=head, tools=rec.tools))
        b = tokenizer.encode_direct(Record("", 0, "", 0.0, "chat", messages=empty, tools=rec.tools))
        return int(len(a) - (len(b) - _lcp(a, b)))
    except Exception:  # a location hint must never fail the analysis
        return None


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    neq = np.nonzero(np.asarray(a[:n]) != np.asarray(b[:n]))[0]
    return int(neq[0]) if len(neq) else n
