"""Normalisation drift: the same content sent in different byte forms, and the units detectors compare.

Two services that assemble "the same" prompt with different normalisers (CRLF vs LF, NFC vs NFD, trailing
spaces, JSON key order, retrieved chunks in score order) never share a cache block. Detectors therefore
compare *units* (non-blank lines, one tool each) under two hashes: the raw bytes and a normal form. Equal
normal forms with different raw bytes are drift; which normaliser makes them equal names its kind.
"""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_left
from collections.abc import Iterable
from itertools import accumulate, compress, repeat
from operator import add, contains, mul, ne, not_, or_
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
_XXH64 = xxhash.xxh3_64_intdigest


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
_CLOSE_LINE = re.compile(r"\n([^\S\n]*)([}\]]),*[^\S\n]*(?=\n|\Z)")  # a line of a closing bracket alone
MAX_JSON_CHARS = 16_000


def _json_block(text: str, pos: int, end: int, line: str, n: int) -> tuple[int, str] | None:
    """(end, text) of a multi-line JSON object or array starting at this line, when the line opens one
    (`{` or `[` alone or with its first member) and a later line at the same indentation closes it; the
    block must parse. None otherwise (a one-line JSON value is a line like any other).

    The closing line is the first of the next MAX_JSON_LINES lines that starts before `n` and within
    MAX_JSON_CHARS of `pos` and holds the closing bracket alone (commas and blanks aside) at the opening
    line's indentation; the candidates are found by one regex scan."""
    t = line.strip()
    if not t or t[0] not in "{[" or (t[-1] in "}]" and len(t) > 1):
        return None
    limit = min(n, pos + MAX_JSON_CHARS + 1)  # a line read must start before this
    if end >= limit:
        return None
    indent = len(line) - len(line.lstrip())
    close = "}" if t[0] == "{" else "]"
    stop = text.find("\n", limit - 1)  # the end of the last line that may be read
    k, at = 0, end  # lines from `end` to `at`
    for m in _CLOSE_LINE.finditer(text, end - 1, len(text) if stop < 0 else stop):
        cur = m.start() + 1
        k, at = k + text.count("\n", at, cur), cur
        if cur >= limit or k >= MAX_JSON_LINES:
            return None
        if m.group(2) == close and len(m.group(1)) == indent:
            nl = text.find("\n", cur)
            nxt = len(text) if nl < 0 else nl + 1
            body = text[pos:cur] + text[cur:nxt].rstrip("\n").rstrip("\r")
            try:
                orjson.loads(body.strip())
            except orjson.JSONDecodeError:
                return None
            return nxt, body
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


def text_hashes(texts: Iterable[str], seed: int = 0) -> list[int]:
    """`text_hash` of each string, in C-level passes (no Python step per string)."""
    return list(map(_XXH64, map(str.encode, texts, repeat("utf-8"), repeat("surrogatepass")), repeat(seed)))


class Lines(NamedTuple):
    """A text's lines and `normal_line` of most of them, computed at C speed (`lines_of`).

    `normal_line` of a line that is not blank, does not open with `{` or `[` and is NFC takes one rule:
    normal form = the stripped line (carriage returns removed) with its blank runs made one space; WS when
    that differs from the line without carriage returns, CR when it held one. `norms` and `flags` hold that
    rule's values for every line; they are wrong for the `odd` lines, which callers read one by one."""

    lines: list[str]  # the text split at newlines
    starts: list[int]  # the offset of each line, then one more: starts[k + 1] is where line k's successor starts
    stripped: list[str]  # each line stripped (carriage returns removed): empty for a blank line
    norms: list[str]
    flags: list[int]
    odd: list[int]  # indexes of the lines the rule does not cover: blank, opening `{` or `[`, not NFC
    lengths: list[int]


def lines_of(region: str) -> Lines:
    """`Lines` of `region`. Whole-region passes equal per-line ones: no blank run, composition or
    reordering crosses a newline, and a blank run never crosses a line's stripped edges."""
    lines = region.split("\n")
    lengths = list(map(len, lines))
    starts = list(accumulate(map(add, lengths, repeat(1)), initial=0))
    cr = "\r" in region
    whole = region.replace("\r", "") if cr else region
    plain = whole.split("\n") if cr else lines
    stripped = list(map(str.strip, plain))
    norms = stripped
    runs = [c for c in ("  ", "\t", "\u00a0") if c in whole]  # what a blank run (`_WS_RUN`) holds
    if runs:
        mask = list(map(contains, stripped, repeat(runs[0])))
        for c in runs[1:]:
            mask = list(map(or_, mask, map(contains, stripped, repeat(c))))
        norms = stripped.copy()
        for i in compress(range(len(lines)), mask):
            norms[i] = _WS_RUN.sub(" ", stripped[i])
    flags = list(map(mul, map(ne, norms, plain), repeat(WS)))
    if cr:
        flags = list(map(or_, flags, map(mul, map(contains, lines, repeat("\r")), repeat(CR))))
    odd = list(compress(range(len(lines)), map(not_, stripped)))
    if "{" in whole or "[" in whole:
        odd = list(compress(range(len(lines)), map(or_, map(not_, stripped),
                                                   map(str.startswith, stripped, repeat(("{", "["))))))
    if not whole.isascii() and not unicodedata.is_normalized("NFC", whole):
        odd = sorted({*odd, *(i for i, t in enumerate(plain)
                              if not t.isascii() and not unicodedata.is_normalized("NFC", t))})
    return Lines(lines, starts, stripped, norms, flags, odd, lengths)


_last_leading: list[tuple[str, Lines]] = []  # the last text `leading_lines` read, and its Lines (one pair: read
# and replaced whole, so a thread never pairs one text with another's lines)


def leading_lines(text: str) -> tuple[Lines, int]:
    """(`Lines` of the lines that start in the first MAX_CHARS characters of `text`, MAX_CHARS or the
    text's length). The last text's are kept: its units and its RAG check read the same first user message."""
    n = min(len(text), MAX_CHARS)
    last = _last_leading[:1]
    if last and last[0][0] is text:
        return last[0][1], n
    cut = text.find("\n", n - 1) if n else 0  # the end of the last line that starts before n
    tab = lines_of(text if cut < 0 else text[:cut])
    if cut < 0:
        tab.starts[-1] -= 1  # the last line ends the text: no newline
    _last_leading[:] = [(text, tab)]
    return tab, n


def _blank_ws(pending: str) -> bool:
    """Whether the blank lines before a unit make it whitespace drift: more than one, or not empty."""
    return pending.count("\n") != 1 or bool(pending.strip("\n"))


def _unit(mi: int, pos: int, end: int, line: str, block: bool, pending: str, seed: int) -> Unit:
    """The unit of one line (or JSON block) at `pos`, after the blank lines `pending`."""
    norm, flags, nosort = _normal_json(line) if block else normal_line(line)
    if pending and _blank_ws(pending):
        flags |= WS
    nh = text_hash(norm, seed)
    rh = nh if norm == line and not pending else text_hash(pending + line, seed)
    return Unit(mi, pos, end, nh, rh, flags, nosort, len(line))


def message_units(mi: int, text: str, seed: int) -> list[Unit]:
    """Units of one message's leading text (the lines that start in its first MAX_CHARS characters);
    blank lines fold into the next unit's raw hash."""
    return message_columns(mi, text, seed)[0]


def message_columns(mi: int, text: str, seed: int) -> tuple[list[Unit], list[int], list[int], list[int]]:
    """`message_units`, and their norm, raw and length columns (what a piece holds).

    The lines of `normal_line`'s common rule are made units in bulk (`Lines`): their raw hash is their
    normal form's unless a flag says they differ. Only the odd lines (blank, JSON, not NFC) and the line
    after blank lines are looked at one by one."""
    if not text:
        return [], [], [], []
    tab, n = leading_lines(text)
    lines, starts, flags = tab.lines, tab.starts, tab.flags.copy()
    nh = text_hashes(tab.norms, seed)
    rh = nh.copy()  # a line's raw text is its normal form unless a flag says otherwise
    for i, h in zip(compress(range(len(lines)), flags), text_hashes(compress(lines, flags), seed), strict=True):
        rh[i] = h
    ends, lengths = starts[1:], tab.lengths.copy()
    nosort: list[int] | None = None
    keep: list[bool] | None = None
    if tab.odd:  # blank lines fold into the next line's raw hash; JSON and non-NFC lines are read one by one
        nosort, keep = [0] * len(lines), [True] * len(lines)
        pending, last_blank, skip = "", -2, 0
        stripped = tab.stripped
        for i in tab.odd:
            if pending and i != last_blank + 1:  # the blank lines end at a line of the common rule
                j = last_blank + 1
                rh[j] = _XXH64((pending + lines[j]).encode("utf-8", "surrogatepass"), seed)  # text_hash
                if pending != "\n" and _blank_ws(pending):
                    flags[j] |= WS
                pending = ""
            if i < skip:
                continue  # inside a JSON block
            if not stripped[i]:
                keep[i], pending, last_blank = False, pending + lines[i] + "\n", i
                continue
            line, end = lines[i], ends[i]
            block = _json_block(text, starts[i], end, line, n)
            if block is not None:  # a pretty-printed JSON value spanning lines: one unit, compared as JSON
                end, line = block
                skip = bisect_left(starts, end, i + 1)
                keep[i + 1:skip] = [False] * (skip - i - 1)
            _, _, ends[i], nh[i], rh[i], flags[i], nosort[i], lengths[i] = _unit(
                mi, starts[i], end, line, block is not None, pending, seed)
            pending = ""
        if pending and last_blank + 1 < len(lines):
            j = last_blank + 1
            rh[j] = text_hash(pending + lines[j], seed)
            if _blank_ws(pending):
                flags[j] |= WS
    cols = zip(repeat(mi), starts, ends, nh, rh, flags, repeat(0) if nosort is None else nosort, lengths)
    if keep is None:
        return list(map(tuple.__new__, repeat(Unit), cols)), nh, rh, lengths
    return (list(map(tuple.__new__, repeat(Unit), compress(cols, keep))),
            list(compress(nh, keep)), list(compress(rh, keep)), list(compress(lengths, keep)))


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
    """The hash of a paragraph's non-blank lines in normal form, joined by spaces."""
    return paragraph_hashes(lines_of(text), [(0, len(text))], seed)[0]


def paragraph_hashes(tab: Lines, paras: list[tuple[int, int]], seed: int = 0) -> list[int]:
    """`paragraph_hash` of each (start, end) paragraph of the text `tab` holds the lines of; each starts and
    ends where lines do (as `paragraphs` gives them), within those lines."""
    return line_paragraph_hashes(tab, [(bisect_left(tab.starts, s), bisect_left(tab.starts, e)) for s, e in paras],
                                 seed)


def line_paragraph_hashes(tab: Lines, paras: list[tuple[int, int]], seed: int = 0) -> list[int]:
    """`paragraph_hash` of each paragraph made of the lines [a, b) of `tab`."""
    keep = list(map(bool, tab.stripped))
    norms = tab.norms
    if tab.odd:
        norms = norms.copy()
        for i in tab.odd:
            if keep[i]:
                norms[i] = normal_line(tab.lines[i])[0]
    return text_hashes([" ".join(compress(norms[a:b], keep[a:b])) for a, b in paras], seed)


def line_paragraphs(tab: Lines, k: int) -> list[tuple[int, int]]:
    """`paragraphs` of the text made of the first `k` lines of `tab`, each with its newline, as line ranges
    [a, b). A separator (`_PARA`) is the newline before a line of spaces, tabs and carriage returns only,
    and that line with its newline; separators do not overlap, so the next one is two lines on at least."""
    out = []
    a = 0
    for j in tab.odd:  # the blank lines are odd ones
        if j >= k:
            break
        if j > a and not tab.lines[j].strip(" \t\r"):
            out.append((a, j + 1))
            a = j + 1
    if a < k:
        out.append((a, k))
    return out


def message_text(m: dict[str, Any]) -> str:
    return content_text(m.get("content"))
