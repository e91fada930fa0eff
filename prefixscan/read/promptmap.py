"""Where each message's text lives in a record of its own shape: the converters, inverted, for `fix`.

Each shape's `*_map` walks a record exactly as its converter does and, for every message the converter
produces (same index as `Record.messages`), names the raw strings whose texts appear, in order, in that
message's text. `fix` edits the record through these slots, so an offset found in the normalised message
list is applied to the record's own field (`system[0].text`, `input[2].content[0].text`, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import orjson

from prefixscan.affixes import common_affixes


class Unmappable(ValueError):
    """A record whose prompt text cannot be located in its own fields: `fix` leaves it as it is."""


@dataclass
class Slot:
    """One raw string of a record, `holder[key]`, named by its path in the record's own shape."""

    holder: Any
    key: Any
    path: str

    @property
    def text(self) -> str:
        return self.holder[self.key]


@dataclass
class MessageSlots:
    """The raw strings of one normalised message, and how to add a text part at its end (None: cannot)."""

    slots: list[Slot]
    append: Callable[[str], None] | None = None


@dataclass
class PromptMap:
    """The text slots of a *copy* of a record; edit through them, then `finish()` gives the rewritten record
    (JSON strings met on the way are encoded again)."""

    obj: dict[str, Any]
    messages: list[MessageSlots] = field(default_factory=list)
    # the record's tool list (edited in place), its path, and a normalised tool in the shape's own form
    tools: tuple[list[Any], str, Callable[[dict[str, Any], Any], Any]] | None = None
    finishers: list[Callable[[], None]] = field(default_factory=list)

    def value(self, holder: Any, key: Any) -> Any:
        """`holder[key]`; a JSON string there is decoded, edited as an object and encoded again by `finish`."""
        v = holder[key] if isinstance(holder, list) else holder.get(key)
        if isinstance(v, str) and v[:1] in "[{":
            try:
                d = orjson.loads(v)
            except orjson.JSONDecodeError:
                return v
            self.finishers.append(lambda: holder.__setitem__(key, orjson.dumps(d).decode()))
            return d
        return v

    def add(self, slots: list[Slot], append: Callable[[str], None] | None = None) -> None:
        self.messages.append(MessageSlots(slots, append))

    def parts(self, holder: Any, key: Any, path: str, text_key: str = "text", new_type: str = "text") -> None:
        """One message whose content is `holder[key]`: a string, or a list of parts (text parts are slots).
        A string is the text itself, even when it holds JSON (the converters never decode content)."""
        content = holder.get(key)
        if isinstance(content, str):
            self.add([Slot(holder, key, path)])
        elif isinstance(content, list):
            self.add([Slot(p, text_key, f"{path}[{i}].{text_key}") for i, p in enumerate(content)
                      if isinstance(p, dict) and _is_text(p) and isinstance(p.get(text_key), str)],
                     lambda t: content.append({"type": new_type, text_key: t}))
        else:
            self.add([])

    def spans(self, mi: int, text: str) -> list[tuple[int, int, Slot]] | None:
        """Where each raw string of message `mi` sits in its normalised `text`; None when one is not found."""
        out, pos = [], 0
        for s in self.messages[mi].slots:
            t = s.text
            j = text.find(t, pos)
            if j < 0:
                return None
            out.append((j, j + len(t), s))
            pos = j + len(t)
        return out

    def locate(self, mi: int, text: str, offset: int) -> tuple[str, int] | None:
        """The record's own field and char offset of `offset` in normalised message `mi` (for fix hints)."""
        if not 0 <= mi < len(self.messages):
            return None
        for s, e, slot in self.spans(mi, text) or []:
            if s <= offset < e or s == offset == e:
                return slot.path, offset - s
        return None

    def write_text(self, mi: int, old: str, new: str) -> bool:
        """Make message `mi`'s text `new` (it was `old`) by editing its raw strings: each changed region must
        lie inside one raw string (or be added at the end); False, with nothing changed, when one does not."""
        if not 0 <= mi < len(self.messages):
            return False
        spans = self.spans(mi, old)
        if spans is None:
            return False
        ms = self.messages[mi]
        if len(spans) == 1 and spans[0][:2] == (0, len(old)):  # one raw string holds the whole text
            spans[0][2].holder[spans[0][2].key] = new
            return True
        regions = _regions(old, new)
        plan: list[tuple[int, int, int, str]] = []  # (span index or -1 = append, start, end, replacement)
        for i1, i2, repl in regions:
            at = next((k for k, (s, e, _) in enumerate(spans) if s <= i1 and i2 <= e), None)
            if at is None:  # a diff places an insertion or deletion anywhere in a run of equal text: slide it
                i1, i2, repl, at = _slide(old, i1, i2, repl, spans)
            if at is None:
                if not (i1 == i2 == len(old) and ms.append is not None):
                    return False
                plan.append((-1, i1, i2, repl))
            else:
                plan.append((at, i1 - spans[at][0], i2 - spans[at][0], repl))
        for at, i1, i2, repl in sorted(plan, key=lambda p: (p[0] < 0, -p[1], -p[2])):
            if at < 0:
                ms.append(repl)  # type: ignore[misc]
            else:
                slot = spans[at][2]
                t = slot.text
                slot.holder[slot.key] = t[:i1] + repl + t[i2:]
        return True

    def write_tools(self, old: list[Any], new: list[Any]) -> bool:
        """Make the tool list `new` (normalised; it was `old`): unchanged tools keep their raw bytes, changed
        ones are written in the shape's own form."""
        if self.tools is None:
            return False
        raw, _, to_raw = self.tools
        if len(raw) != len(old) or len(new) != len(old):
            return False
        free = list(range(len(old)))
        out = []
        for j, t in enumerate(new):
            k = next((k for k in free if old[k] == t), None)
            if k is None:
                out.append(to_raw(t, raw[j]))
            else:
                free.remove(k)
                out.append(raw[k])
        raw[:] = out
        return True

    def finish(self) -> dict[str, Any]:
        for f in reversed(self.finishers):  # innermost JSON string first
            f()
        self.finishers.clear()
        return self.obj


def _is_text(p: dict[str, Any]) -> bool:
    from prefixscan.read.media import MEDIA_KINDS, is_text_part

    return is_text_part(p) and p.get("type") not in MEDIA_KINDS


def block_slots(blocks: list[Any], path: str) -> list[Slot]:
    """Slots of a list joined by `content.parts_text` (dict parts of type text or none, and plain strings)."""
    out = []
    for i, p in enumerate(blocks):
        if isinstance(p, str):
            out.append(Slot(blocks, i, f"{path}[{i}]"))
        elif isinstance(p, dict) and p.get("type") in (None, "text"):
            tk = "content" if "content" in p else "text"
            if isinstance(p.get(tk), str):
                out.append(Slot(p, tk, f"{path}[{i}].{tk}"))
    return out


def _slide(old: str, i1: int, i2: int, repl: str, spans: list[tuple[int, int, Slot]]
           ) -> tuple[int, int, str, int | None]:
    """The same pure insertion or deletion moved along equal characters until it fits in one span."""
    def fits(a: int, b: int) -> int | None:
        return next((k for k, (s, e, _) in enumerate(spans) if s <= a and b <= e), None)

    if i1 == i2 or not repl:
        for step in (1, -1):
            a, b, r = i1, i2, repl
            while True:
                if step == 1 and b < len(old) and (old[a] == old[b] if not r else r[0] == old[a]):
                    a, b, r = (a + 1, b + 1, r) if not r else (a + 1, b + 1, r[1:] + old[a])
                elif step == -1 and a > 0 and (old[a - 1] == old[b - 1] if not r else r[-1] == old[a - 1]):
                    a, b, r = (a - 1, b - 1, r) if not r else (a - 1, b - 1, old[a - 1] + r[:-1])
                else:
                    break
                if (k := fits(a, b)) is not None:
                    return a, b, r, k
    return i1, i2, repl, None


def _regions(old: str, new: str) -> list[tuple[int, int, str]]:
    """The changed regions of `old` (start, end, replacement) that make `new`: one region when the change is
    a single edit, else a diff by lines (moves take whole lines) refined by characters inside small
    changed runs. Bounded: a long run without line breaks stays one region (then it may not fit a slot)."""
    a, b = common_affixes(old, new)
    if len(old) - b - a <= 0 or len(new) - b - a <= 0:
        return [(a, len(old) - b, new[a:len(new) - b])]
    import difflib

    la, lb = old.splitlines(keepends=True), new.splitlines(keepends=True)
    oa, ob = [0, *accumulate(map(len, la))], [0, *accumulate(map(len, lb))]  # where each line starts
    out = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, la, lb, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        s0, e0, s1, e1 = oa[i1], oa[i2], ob[j1], ob[j2]
        if tag == "replace" and max(e0 - s0, e1 - s1) <= CHAR_DIFF_MAX:
            out += [(s0 + x1, s0 + x2, new[s1 + y1:s1 + y2]) for op, x1, x2, y1, y2 in difflib.SequenceMatcher(
                None, old[s0:e0], new[s1:e1], autojunk=False).get_opcodes() if op != "equal"]
        else:
            out.append((s0, e0, new[s1:e1]))
    return out


CHAR_DIFF_MAX = 4096  # characters of a changed run diffed by character (quadratic at worst)
