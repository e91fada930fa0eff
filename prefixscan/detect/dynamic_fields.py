"""Dynamic fields: read a varying line as `label: value`, name its kind, and say what to move.

The alignment (pattern_free) says *which* line varies; this module says *what* it is (a timestamp, a
request id, a user's email...) from the value's shape and the label's words, where exactly the value
starts, and which characters make up the field so the rewriter can move label and value together.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

from prefixscan.affixes import common_affixes, common_prefix_length
from prefixscan.detect.normalisation import BIG, Unit
from prefixscan.detect.patterns import DATE_SPAN_RES, classify, heading_label, split_label
from prefixscan.detect.pieces import Units

_TOOL_LABEL = re.compile(r"([A-Za-z\u00C0-\uFFFF][\w \-#'\u00C0-\uFFFF]{0,40}?)\s*[:=]\s*$")


@dataclass(frozen=True, slots=True)
class SlotLine:
    """One varying line of one request."""

    mi: int
    label: str
    value: str
    value_offset: int  # character offset of the value in the message
    block: tuple[int, int]  # characters to move: heading label (if any), the line, its newline
    kind: str | None  # a field kind, or None when no pattern names it
    prose: bool  # an unlabelled long line: a template edit rather than a field
    inline: bool = False  # a date or time inside a sentence: no safe rewrite moves it (see `inline_date`)


def read_line(texts: dict[int, str], units: list[Unit] | Units, idx: int, other: str | None,
              numbers_increase: bool = False) -> SlotLine | None:
    """Describe request unit `idx` that differs from the exemplar's line `other` (None when unknown)."""
    u = units[idx]
    if u.mi < 0:
        return None  # a tool definition: reported by the normalisation checks, never moved
    text = texts[u.mi]
    line = text[u.start:u.end].rstrip("\n").rstrip("\r")
    lv = split_label(line)
    start = u.start
    label = lv.label
    value, value_start = lv.value, lv.value_start
    if not label and idx > 0:
        prev = units[idx - 1]
        if prev.mi == u.mi and prev.end <= u.start and not text[prev.end:u.start].strip():
            h = heading_label(text[prev.start:prev.end])
            if h:
                label, start = h, prev.start
    if not label and other is not None:
        # Unlabelled: the varying span starts where the two versions first differ (at a word start).
        cp = common_prefix_length(line, other.rstrip("\r"))
        while cp > 0 and line[cp - 1].isalnum():
            cp -= 1
        value_start, value = cp, line[cp:]
    prose = not label and u.length >= BIG
    kind: str | None
    if not label and other is not None:
        found = inline_date(line, other.rstrip("\r"))
        if found is not None:
            kind, vs, ve = found
            return SlotLine(u.mi, "", line[vs:ve], u.start + vs, (start, u.end), kind, False, inline=prose)
    kind = None if prose else _classify(label, value, numbers_increase)
    return SlotLine(u.mi, label, value, u.start + value_start, (start, u.end), kind, prose)


@lru_cache(maxsize=16_384)  # labels and values recur (a family's field, a few user names): under ~6 MB
def _classify_memo(label: str, value: str, numbers_increase: bool) -> str | None:
    return classify(label, value, numbers_increase)


def _classify(label: str, value: str, numbers_increase: bool) -> str | None:
    """`classify`, memoised for short labels and values (a pure function of them)."""
    long = len(label) + len(value) > 200
    return (classify if long else _classify_memo)(label, value, numbers_increase)


MAX_SPAN_TEXT = 1024  # longer lines are scanned each time (the memo stays under ~4 MB)


@lru_cache(maxsize=4096)  # an exemplar's line is compared with every request's
def _date_spans_memo(text: str) -> list[tuple[str, list[tuple[int, int]]]]:
    return [(kind, [m.span() for m in p.finditer(text)]) for kind, pats in DATE_SPAN_RES for p in pats]


def _date_spans(text: str) -> list[tuple[str, list[tuple[int, int]]]]:
    """Every match of every date pattern in `text`, pattern by pattern (memoised for short texts)."""
    return _date_spans_memo(text) if len(text) <= MAX_SPAN_TEXT else _date_spans_memo.__wrapped__(text)


def _covering(text: str, lo: int, hi: int) -> tuple[str, int, int] | None:
    """(kind, start, end) of a date or time in `text` that covers the characters [lo, hi)."""
    for kind, spans in _date_spans(text):
        for a, b in spans:
            if a <= lo and b >= hi:
                return kind, a, b
            if a > lo:
                break
    return None


def inline_date(line: str, other: str) -> tuple[str, int, int] | None:
    """When two versions of an unlabelled line differ only inside a date or time written out (in words or
    digits, in any supported language), (kind, start, end) of that date in `line`; else None. A date in
    a sentence ("Today is Monday, 20 November 2026, 09:00, and ...") is a dynamic field, not an edit."""
    cp, cs = common_affixes(line, other)
    if cp >= len(line) - cs and cp >= len(other) - cs:
        return None
    mine = _covering(line, cp, len(line) - cs)
    theirs = _covering(other, cp, len(other) - cs)
    return mine if theirs is not None else None


def int_value(value: str) -> int | None:
    """The integer a counter-like value holds, if it is one."""
    v = value.strip().lstrip("#")
    return int(v) if v.isdigit() and len(v) <= 18 else None


def tool_field(tool: Any, exemplar: Any) -> tuple[str, str, int, str] | None:
    """(label, value, offset in the tool's JSON, tool name) of the one span where a tool definition differs
    from the exemplar's, when that span sits inside a JSON string (a description); None otherwise."""
    a = orjson.dumps(tool).decode()
    b = orjson.dumps(exemplar).decode()
    cp, cs = common_affixes(a, b)
    if cp >= len(a) - cs and cp >= len(b) - cs:
        return None
    q0, q1 = a.rfind('"', 0, cp), a.find('"', len(a) - cs)
    if q0 < 0 or q1 < 0 or '"' in a[cp:len(a) - cs]:
        return None  # not inside one string: a structural difference (reported as drift, if anything)
    start = cp
    while start > q0 + 1 and not a[start - 1].isspace() and a[start - 1] != "=":
        start -= 1
    end = len(a) - cs
    while end < q1 and not a[end].isspace() and a[end] not in ",;" \
            and not (a[end] == "." and a[end + 1:end + 2] in (" ", '"')):
        end += 1
    m = _TOOL_LABEL.search(a[q0 + 1:start])
    name = tool.get("function", tool).get("name", "") if isinstance(tool, dict) else ""
    return (m.group(1).strip() if m else ""), a[start:end], start, str(name)
