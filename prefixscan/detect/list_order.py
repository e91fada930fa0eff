"""Serialized lists inside message text whose item order changes from request to request (`list_order`).

A system prompt that renders tool definitions as a JSON array, or retrieved chunks between `---` lines or
as a numbered list, breaks the cache when the application builds the list from a dict, a set or a score
ranking: the same items arrive in another order and the prompt diverges at the first item that moved.
Lists are read in system and developer messages, and JSON arrays also in the first user message (whose
paragraphs `rag_order` reads); the `tools` field is `tool_order`. Each list's multiset of items is
compared with the order it was seen in before.

Where a stable order is safe, a JSON array of objects that each carry a distinct name/id-like key, the
canonical order is the sort by that key, so `fix` can rewrite every request to it (keeping the original
layout: only the item texts change places). A list of text chunks may be ranked on purpose (retrieval by
score), so its canonical order is the first one seen, used by the counterfactual only; `fix` leaves it.
"""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Sequence
from typing import Any, NamedTuple

import xxhash

from prefixscan.detect.normalisation import MAX_CHARS, text_hash
from prefixscan.read.media import is_text_part

KIND = "list_order"
MIN_ITEMS = 3
NAME_KEYS = ("name", "id", "title", "key")
UNSAFE = "order may be meaningful: sort at the source if the ranking is not used"

_JSON_OPEN = re.compile(r"\[\s*\{")
# Line patterns start with a newline (matched against "\n" + text): a literal first character lets the
# regex engine skip ahead, 8 times faster on long prose than `^` with re.M, which is tried at every position.
_SEPARATOR = re.compile(r"\n[ \t]*(?:-{3,}|\*{3,}|={3,}|_{3,})[ \t]*\r?(?=\n|\Z)")
_ENUM = re.compile(r"\n[ \t]*(?:[-*\u2022]|\d{1,3}[.)]|\[\d{1,3}\]|#\d{1,3}[.:]?"
                   r"|(?:document|doc|source|chunk|passage|result)[ \t]*#?\d{1,3}[ \t]*[:.)-]?)[ \t]+(?=\S)", re.I)
_HEAD_END = re.compile(r"\n(?:[ \t\r]*|[^\n]*:[ \t\r]*|#{1,6} [^\n]*)(?=\n)")  # a blank or heading line
_BLANK = re.compile(r"\n[ \t\r]*\n")
_SEPARATOR_RUNS = ("---", "***", "===", "___")
_DECODER = json.JSONDecoder()


class TextList(NamedTuple):
    """One serialized list found in a message's text."""

    ordinal: int  # its place among the lists of the message (JSON arrays first, then chunk lists)
    spans: tuple[tuple[int, int], ...]  # (start, end) of each item's text; separators and numbers stay put
    hashes: tuple[int, ...]  # hash of each item's text, in the order sent
    sort_key: str | None  # the key a safe sort uses ("name", "function.name", ...); None: not safe to sort
    canonical: tuple[int, ...]  # item hashes in the sorted order (safe lists); else the order sent
    region: tuple[int, int]  # from the start of the line the list opens on to its end


def _key_value(item: dict[str, Any], key: str) -> Any:
    if key == "function.name":
        fn = item.get("function")
        return fn.get("name") if isinstance(fn, dict) else None
    return item.get(key)


def sort_key(items: list[Any]) -> str | None:
    """The name/id-like key that orders these objects safely: present in every item, a string (or every
    one an integer), and distinct, so the sort is total. OpenAI tool objects sort by `function.name`."""
    if not items or not all(isinstance(t, dict) for t in items):
        return None
    for key in ("function.name", *NAME_KEYS):
        vals = [_key_value(t, key) for t in items]
        if all(isinstance(v, str) for v in vals) or all(type(v) is int for v in vals):
            if len(set(vals)) == len(vals):
                return key
    return None


def _json_lists(text: str) -> list[tuple[tuple[tuple[int, int], ...], list[Any], int, int]]:
    """(item spans, items, start, end) of each JSON array of at least MIN_ITEMS objects in `text`."""
    out = []
    pos = 0
    for m in _JSON_OPEN.finditer(text):
        if m.start() < pos:
            continue  # inside an array already read
        spans: list[tuple[int, int]] = []
        items: list[Any] = []
        i = m.start() + 1
        ok = False
        while True:
            while i < len(text) and text[i] in " \t\r\n":
                i += 1
            try:
                obj, end = _DECODER.raw_decode(text, i)
            except ValueError:
                break
            spans.append((i, end))
            items.append(obj)
            i = end
            while i < len(text) and text[i] in " \t\r\n":
                i += 1
            if text[i:i + 1] == ",":
                i += 1
                continue
            ok = text[i:i + 1] == "]"
            break
        if ok and len(items) >= MIN_ITEMS and all(isinstance(t, dict) for t in items):
            out.append((tuple(spans), items, m.start(), i + 1))
            pos = i + 1
    return out


def _core(text: str, s: int, e: int) -> tuple[int, int] | None:
    """(start, end) of text[s:e] without surrounding whitespace; None when nothing is left."""
    seg = text[s:e]
    stripped = seg.strip()
    if not stripped:
        return None
    start = s + len(seg) - len(seg.lstrip())
    return start, start + len(stripped)


def _separated(text: str) -> list[tuple[int, int]]:
    """Items of a list of chunks between separator lines (`---`, `***`, `===`): the chunks between two
    separators, the text before the first (after a blank line or a heading such as `Documents:`) and
    the paragraph after the last."""
    if not any(c in text for c in _SEPARATOR_RUNS):  # a separator line holds one of these
        return []
    padded = "\n" + text  # positions in `padded` are one more than in `text`
    seps = [(m.start(), m.end() - 1) for m in _SEPARATOR.finditer(padded)]  # (line start, line end) in text
    if len(seps) < 2:
        return []
    items: list[tuple[int, int] | None] = []
    start = 0
    for m in _HEAD_END.finditer(padded, 0, seps[0][0] + 1):  # after the last blank line or heading line
        start = m.end()
    items.append(_core(text, start, seps[0][0]))
    for (_, e), (s, _) in zip(seps, seps[1:], strict=False):
        items.append(_core(text, e, s))
    tail = _BLANK.search(text, seps[-1][1])
    items.append(_core(text, seps[-1][1], tail.start() if tail else len(text)))
    return [it for it in items if it is not None]


def _numbered(text: str) -> list[list[tuple[int, int]]]:
    """Numbered or bulleted lists (`1. `, `[2] `, `Document 3: `, `- `, `* `): the items' texts without their
    markers, each up to the next marker, the last one up to the paragraph's end. Markers stay in place when
    items move. An item's text starts at a non-blank character (`_ENUM`), so it is never empty."""
    out: list[list[tuple[int, int]]] = []
    run: list[tuple[int, int]] = []
    found = list(_ENUM.finditer("\n" + text))  # positions in "\n" + text are one more than in text
    if len(found) < MIN_ITEMS:  # every item has its own marker
        return out
    search, last = _BLANK.search, len(found) - 1
    limits = [m.start() for m in found[1:]]  # the next marker's line start in text
    limits.append(len(text))
    for k, (m, limit) in enumerate(zip(found, limits, strict=True)):
        item = m.end() - 1
        blank = search(text, item, limit)
        end = blank.start() if blank else limit
        run.append((item, item + len(text[item:end].rstrip())))
        if blank is not None or k == last:  # a blank line ends the list
            if len(run) >= MIN_ITEMS:
                out.append(run)
            run = []
    return out


def find_lists(text: str, chunks: bool = True) -> list[TextList]:
    """Every serialized list of at least MIN_ITEMS items in the leading MAX_CHARS of `text`; JSON arrays
    only with `chunks=False` (a first user message, whose paragraphs `rag_order` reads)."""
    text = text[:MAX_CHARS]
    out: list[TextList] = []
    taken: list[tuple[int, int]] = []
    for spans, items, start, end in _json_lists(text):
        hs = tuple(text_hash(text[s:e]) for s, e in spans)
        key = sort_key(items)
        canon = hs
        if key is not None:
            canon = tuple(h for _, h in sorted(zip([_key_value(t, key) for t in items], hs, strict=True)))
        out.append(TextList(len(out), spans, hs, key, canon, (text.rfind("\n", 0, start) + 1, end)))
        taken.append((start, end))
    for spans_l in [_separated(text), *_numbered(text)] if chunks else []:
        if len(spans_l) < MIN_ITEMS or any(a < e and s < b for s, e in spans_l for a, b in taken):
            continue
        hs = tuple(text_hash(text[s:e]) for s, e in spans_l)
        out.append(TextList(len(out), tuple(spans_l), hs, None, hs,
                            (text.rfind("\n", 0, spans_l[0][0]) + 1, spans_l[-1][1])))
    return out


def signature(tl: TextList, mi: int, salt: int) -> tuple[int, int]:
    """(multiset hash, sequence hash) of a list's items: the same items in another order share the first."""
    return order_signature(tl.hashes, salt ^ xxhash.xxh3_64_intdigest(f"list:{mi}:{tl.ordinal}".encode()))


def order_signature(hs: tuple[int, ...], seed: int) -> tuple[int, int]:
    """(multiset hash, sequence hash) of items: the same items in another order share the first only."""
    ms = xxhash.xxh3_64_intdigest(array("Q", sorted(hs)).tobytes(), seed=seed)  # native uint64s, as numpy's
    return ms, xxhash.xxh3_64_intdigest(array("Q", hs).tobytes())


def first_difference(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), 0)


def in_regions(regions: dict[int, list[tuple[int, int]]], u: Any) -> bool:
    """Whether unit `u` (normalisation.Unit) lies inside one of `regions` (message index -> (start, end))."""
    return any(s <= u.start and u.end <= e + 1 for s, e in regions.get(u.mi, ()))


def reorder_text(text: str, canon: tuple[int, ...]) -> str:
    """`text` with the list holding exactly the items of `canon` rewritten in that order: each item's text
    goes to the place of the item `canon` puts there; everything between items (commas, indentation,
    separator lines, numbers) stays. Unchanged when no such list is found."""
    want = sorted(canon)
    for tl in find_lists(text):
        if tl.hashes != canon and sorted(tl.hashes) == want:
            return placed(text, tl.spans, tl.hashes, canon)
    return text


def placed(text: str, spans: Sequence[tuple[int, int]], hashes: Sequence[int], canon: Sequence[int]) -> str:
    """`text` with its items (at `spans`, hashed `hashes`) put in the order `canon` gives (the same hashes,
    another order): each span receives the text of the item `canon` puts there; what lies between stays."""
    by_hash: dict[int, list[str]] = {}
    for (s, e), h in zip(spans, hashes, strict=True):
        by_hash.setdefault(h, []).append(text[s:e])
    parts, prev = [], 0
    for (s, e), h in zip(spans, canon, strict=True):
        parts += [text[prev:s], by_hash[h].pop(0)]
        prev = e
    return "".join(parts) + text[prev:]


def apply_list_op(msgs: list[dict[str, Any]], op: tuple, counterfactual: bool) -> None:
    """Apply ("list_reorder", message_index, canonical hashes, safe) to `msgs` in place (a copy made by
    `apply_ops`). `fix` applies only safe ones (a JSON list sorted by its key); the counterfactual all.
    Content given as parts: the text part holding the list is rewritten (a new list of new parts)."""
    _, mi, canon, safe = op
    if not (safe or counterfactual) or not 0 <= mi < len(msgs):
        return
    content = msgs[mi].get("content")
    if isinstance(content, str):
        msgs[mi]["content"] = reorder_text(content, tuple(canon))
    elif isinstance(content, list):
        for i, part in enumerate(content):
            if isinstance(part, dict) and is_text_part(part) and isinstance(part.get("text"), str):
                new = reorder_text(part["text"], tuple(canon))
                if new != part["text"]:
                    msgs[mi]["content"] = [*content[:i], {**part, "text": new}, *content[i + 1:]]
                    return
