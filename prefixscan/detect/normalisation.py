"""Normalisation drift: the same content sent in different byte forms, and the units detectors compare.

Two services that assemble "the same" prompt with different normalisers (CRLF vs LF, NFC vs NFD, trailing
spaces, JSON key order, retrieved chunks in score order) never share a cache block. Detectors therefore
compare *units* (non-blank lines, one tool each) under two hashes: the raw bytes and a normal form. Equal
normal forms with different raw bytes are drift; which normaliser makes them equal names its kind.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any, NamedTuple

import orjson
import xxhash

from prefixscan.read.content import content_text

MAX_CHARS = 32_000  # leading characters of each early message that detectors look at
BIG = 48  # units at least this long identify content (family anchors, resync points)

CR, NONNFC, WS, JSON = 1, 2, 4, 8
DRIFT_KINDS = ("line_endings", "unicode", "whitespace", "json_key_order", "json_spacing")

_WS_RUN = re.compile(r"[ \t\u00a0]{2,}|\t")
_BLANKS = re.compile(r"\n[ \t]*\n(?:[ \t]*\n)+")
_PARA = re.compile(r"\n[ \t\r]*\n")


def text_hash(s: str, seed: int = 0) -> int:
    """The 64-bit hash detectors compare texts by (any string, lone surrogates included)."""
    return xxhash.xxh3_64_intdigest(s.encode("utf-8", "surrogatepass"), seed=seed)


class Unit(NamedTuple):
    """One comparable piece of an early message: a non-blank line, or one tool of the tool list.

    A tuple of ints, so the garbage collector stops tracking it: millions of units stay cheap to hold.
    """

    mi: int  # message index; -1 for the tool list
    start: int  # character offset of the line in the message (or tool index)
    end: int  # end offset, newline included
    norm: int  # hash of the normal form
    raw: int  # hash of the raw bytes, preceding blank lines included
    flags: int
    nosort: int  # JSON units: hash of the compact JSON in the sender's key order
    length: int


def normal_line(line: str) -> tuple[str, int, int]:
    """(normal form, flags saying what it took, key-order-preserving JSON hash) of one line."""
    flags = 0
    s = line
    if s.endswith("\r") or "\r" in s:
        flags |= CR
        s = s.replace("\r", "")
    if not s.isascii() and not unicodedata.is_normalized("NFC", s):
        flags |= NONNFC
        s = unicodedata.normalize("NFC", s)
    t = s.strip()
    if t[:1] not in "{[" and len(t) == len(s) and "  " not in t and "\t" not in t and "\u00a0" not in t:
        return t, flags, 0  # the common case: nothing to normalise
    if len(t) > 1 and t[0] in "{[" and t[-1] in "}]":
        try:
            obj = orjson.loads(t)
        except orjson.JSONDecodeError:
            obj = None
        if obj is not None:
            return (orjson.dumps(obj, option=orjson.OPT_SORT_KEYS).decode(), flags | JSON,
                    text_hash(orjson.dumps(obj).decode()))
    if s != t or _WS_RUN.search(t):
        flags |= WS
        t = _WS_RUN.sub(" ", t)
    return t, flags, 0


MAX_JSON_LINES = 400
MAX_JSON_CHARS = 16_000


def _json_block(text: str, pos: int, end: int, line: str, n: int) -> tuple[int, str] | None:
    """(end, text) of a multi-line JSON object or array starting at this line, when the line opens one
    (`{` or `[` alone or with its first member) and a later line at the same indentation closes it; the
    block must parse. None otherwise (a one-line JSON value is a line like any other)."""
    t = line.strip()
    if not t or t[0] not in "{[" or (t[-1] in "}]" and len(t) > 1):
        return None
    indent = len(line) - len(line.lstrip())
    close = "}" if t[0] == "{" else "]"
    cur = end
    for _ in range(MAX_JSON_LINES):
        if cur >= n or cur - pos > MAX_JSON_CHARS:
            return None
        nl = text.find("\n", cur)
        nxt = len(text) if nl < 0 else nl + 1
        ln = text[cur:nxt].rstrip("\n").rstrip("\r")
        s = ln.strip()
        if s[:1] == close and len(ln) - len(ln.lstrip()) == indent and s.rstrip(",") == close:
            body = text[pos:cur] + ln
            try:
                orjson.loads(body.strip())
            except orjson.JSONDecodeError:
                return None
            return nxt, body
        cur = nxt
    return None


def _normal_json(block: str) -> tuple[str, int, int]:
    """normal_line for a multi-line JSON block: keys sorted, compact; flags say what else it took."""
    flags = JSON
    if "\r" in block:
        flags |= CR
    if not block.isascii() and not unicodedata.is_normalized("NFC", block):
        flags |= NONNFC
    obj = orjson.loads(unicodedata.normalize("NFC", block.replace("\r", "")).strip())
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS).decode(), flags, text_hash(orjson.dumps(obj).decode())


def early_messages(messages: list[dict[str, Any]]) -> list[int]:
    """Indexes of the messages detectors read: system/developer messages and the first user message."""
    out = []
    for i, m in enumerate(messages[:6]):
        role = m.get("role")
        if role not in ("system", "developer", "user"):
            break
        out.append(i)
        if role == "user":
            break
    return out


def message_units(mi: int, text: str, seed: int) -> list[Unit]:
    """Units of one message's leading text; blank lines fold into the next unit's raw hash."""
    units: list[Unit] = []
    pos = 0
    n = min(len(text), MAX_CHARS)
    pending_blank = ""
    while pos < n:
        nl = text.find("\n", pos)
        end = len(text) if nl < 0 else nl + 1
        line = text[pos:end - 1] if nl >= 0 else text[pos:end]
        if not line.strip():
            pending_blank += text[pos:end]
            pos = end
            continue
        block = _json_block(text, pos, end, line, n)
        if block is not None:  # a pretty-printed JSON value spanning lines: one unit, compared as JSON
            end, line = block
        norm, flags, nosort = normal_line(line) if block is None else _normal_json(line)
        if pending_blank and (pending_blank.count("\n") != 1 or pending_blank.strip("\n")):
            flags |= WS
        nh = text_hash(norm, seed)
        rh = nh if norm == line and not pending_blank else text_hash(pending_blank + line, seed)
        units.append(Unit(mi, pos, end, nh, rh, flags, nosort, len(line)))
        pending_blank = ""
        pos = end
    return units


def tool_units(tools: list[Any], seed: int) -> list[Unit]:
    """One unit per tool: raw = the JSON as sent, normal form = keys sorted."""
    out = []
    for i, t in enumerate(tools):
        raw = orjson.dumps(t).decode()
        norm = orjson.dumps(t, option=orjson.OPT_SORT_KEYS).decode()
        flags = JSON | (0 if raw == norm else WS)
        raw_hash = text_hash(raw, seed)
        out.append(Unit(-1, i, i + 1, text_hash(norm, seed), raw_hash, flags, raw_hash, len(raw)))
    return out


def drift_kind(a: Unit, b: Unit) -> str:
    """Which normaliser makes two units with equal normal forms and different raw bytes equal."""
    diff = a.flags ^ b.flags
    if diff & CR:
        return "line_endings"
    if diff & NONNFC:
        return "unicode"
    if a.flags & b.flags & JSON:
        return "json_key_order" if a.nosort != b.nosort else "json_spacing"
    return "whitespace"


# ---------------------------------------------------------------- normalisers (used by the rewriter)

def _sorted_json(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _sorted_json(obj[k]) for k in sorted(obj)}
    if isinstance(obj, list):
        return [_sorted_json(v) for v in obj]
    return obj


def _json_lines(text: str) -> str:
    out = []
    for line in text.split("\n"):
        t = line.strip()
        if len(t) > 1 and t[0] in "{[" and t[-1] in "}]":
            try:
                line = line[: len(line) - len(line.lstrip())] + orjson.dumps(_sorted_json(orjson.loads(t))).decode()
            except orjson.JSONDecodeError:
                pass
        out.append(line)
    return "\n".join(out)


_TRAILING = re.compile(r"[ \t\u00a0]+(?=\n|$)")
_WS_NEEDED = re.compile(r"[ \t\u00a0]\n|[ \t\u00a0]$|[ \t\u00a0]{2}|\t|\n[ \t]*\n[ \t]*\n")


def _whitespace(text: str) -> str:
    """Trailing blanks removed, runs of blanks collapsed, at most one blank line between paragraphs."""
    return _BLANKS.sub("\n\n", _WS_RUN.sub(" ", _TRAILING.sub("", text)))


NORMALISERS = {
    "line_endings": lambda s: s.replace("\r\n", "\n").replace("\r", "\n"),
    "unicode": lambda s: unicodedata.normalize("NFC", s),
    "whitespace": _whitespace,
    "json_key_order": _json_lines,
}


def needs(kind: str, text: str) -> bool:
    """Whether normaliser `kind` would change `text` (cheap checks first)."""
    if kind == "line_endings":
        return "\r" in text
    if kind == "unicode":
        return not text.isascii() and not unicodedata.is_normalized("NFC", text)
    if kind == "whitespace":
        return _WS_NEEDED.search(text) is not None
    return NORMALISERS[kind](text) != text


def paragraphs(text: str) -> list[tuple[int, int]]:
    """(start, end) of blank-line separated paragraphs, each end including its separator."""
    out = []
    pos = 0
    for m in _PARA.finditer(text):
        out.append((pos, m.end()))
        pos = m.end()
    if pos < len(text):
        out.append((pos, len(text)))
    return out


def paragraph_hash(text: str, seed: int = 0) -> int:
    return text_hash(" ".join(normal_line(ln)[0] for ln in text.split("\n") if ln.strip()), seed)


def message_text(m: dict[str, Any]) -> str:
    return content_text(m.get("content"))
