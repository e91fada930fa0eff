"""The rewriter shared by the counterfactual and `prefixscan fix`: apply a request's rewrite operations.

Operations never change what a request means: a moved field keeps its label and value and goes to the
end of the last user message (after the stable section); normalisers change bytes, not content; a
reorder restores the order in which the same retrieved chunks or tools were first seen. Only the
counterfactual uses `replace` (unifying template versions), because choosing a version is the team's call.

Offsets are into a message's text (`read.content.content_text`: a list of text parts counts as its parts joined),
in the normalised message list of `prefixscan.read.shapes.normalise`; `fix` writes the result back into each
record's own fields through `prefixscan.read.shapes.prompt_map`. A new operation kind only has to change
message texts (or the tool list) here: the mapping back to every shape is shared.

Operations (tuples, JSON-serialisable):
- ("move", message_index, start, end)
- ("replace", message_index, start, end, text)        counterfactual only (template version)
- ("restore", message_index, start, end, text)        drift: the same text in the exemplar's bytes
- ("retool", tool_index, tool)                          a tool schema in the exemplar's key order
- ("retool_cf", tool_index, tool)                       counterfactual only: a tool without its dynamic field
- ("normalise", kind)                                  line_endings | unicode | whitespace | json_key_order
- ("reorder", message_index, canonical_hashes)         message_index -1 = the tool list
- ("list_reorder", message_index, canonical_hashes, safe)  a list inside message text (list_order.py)
"""

from __future__ import annotations

from typing import Any

import orjson
import xxhash

from prefixscan.detect.list_order import apply_list_op, placed
from prefixscan.detect.normalisation import NORMALISERS, _sorted_json, early_messages, paragraph_hash, paragraphs
from prefixscan.read.content import content_text

Op = tuple


def _tool_hash(t: Any) -> int:
    return xxhash.xxh3_64_intdigest(orjson.dumps(t, option=orjson.OPT_SORT_KEYS))


def _reorder_text(text: str, canon: tuple[int, ...]) -> str:
    """The leading paragraphs in the order `canon` gives, when they are its items; else `text` unchanged."""
    head = paragraphs(text)[:len(canon)]
    hashes = [paragraph_hash(text[s:e]) for s, e in head]
    return placed(text, head, hashes, canon) if len(head) == len(canon) and sorted(hashes) == sorted(canon) else text


def _text(content: Any) -> str | None:
    """The editable text of a message's content: a string, or a list of text parts joined (normalised
    records carry media as placeholders in strings, so a list holds text parts only); None otherwise."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return content_text(content)
    return None


def apply_ops(messages: list[dict[str, Any]], tools: list[Any] | None, ops: list[Op],
              counterfactual: bool = True) -> tuple[list[dict[str, Any]], list[Any] | None]:
    """New (messages, tools) with `ops` applied; inputs are not modified."""
    msgs = [dict(m) for m in messages]
    moved: list[str] = []
    edits: dict[int, list[Op]] = {}
    for op in ops:
        if op[0] in ("move", "restore") or (op[0] == "replace" and counterfactual):
            edits.setdefault(op[1], []).append(op)
        elif (op[0] == "retool" or (op[0] == "retool_cf" and counterfactual)) and tools and 0 <= op[1] < len(tools):
            tools = [*tools[:op[1]], op[2], *tools[op[1] + 1:]]
    for mi in sorted(edits):
        content = _text(msgs[mi].get("content")) if 0 <= mi < len(msgs) else None
        if content is None:
            continue
        blocks = []
        for op in sorted(edits[mi], key=lambda o: (-o[2], -o[3])):
            s, e = op[2], op[3]
            if op[0] == "move":
                blocks.append(content[s:e].rstrip("\n"))
                content = content[:s] + content[e:]
            else:
                content = content[:s] + op[4] + content[e:]
        msgs[mi]["content"] = content
        moved.extend(reversed(blocks))
    for op in ops:
        if op[0] == "reorder":
            if op[1] < 0 and tools:
                order = {h: i for i, h in enumerate(op[2])}
                if sorted(order) == sorted(_tool_hash(t) for t in tools):
                    tools = sorted(tools, key=lambda t: order[_tool_hash(t)])
            elif 0 <= op[1] < len(msgs) and (text := _text(msgs[op[1]].get("content"))) is not None:
                new = _reorder_text(text, tuple(op[2]))
                if new != text:
                    msgs[op[1]]["content"] = new
        elif op[0] == "list_reorder":
            apply_list_op(msgs, op, counterfactual)
    for op in ops:
        if op[0] != "normalise":
            continue
        fn = NORMALISERS[op[1]]
        for mi in early_messages(msgs):
            if (text := _text(msgs[mi].get("content"))) is not None and (new := fn(text)) != text:
                msgs[mi]["content"] = new
        if op[1] == "json_key_order" and tools:
            tools = [_sorted_json(t) for t in tools]
    if moved:
        dest = max((i for i, m in enumerate(msgs) if m.get("role") == "user"), default=len(msgs) - 1)
        content = _text(msgs[dest].get("content"))
        tail = "\n".join(moved)
        if content is not None:  # the same bytes whether the content was a string or a list of parts
            msgs[dest]["content"] = content + ("\n" if content.endswith("\n") else "\n\n") + tail + "\n"
    return msgs, tools
