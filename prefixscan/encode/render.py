"""Chat messages (+ tools) -> prompt segments, the way a ChatML-style chat template lays them out.

Used with tiktoken, where no engine template is available: it is an approximation of the engine's real
template (documented in docs/tokenizers.md and said in the summary). Special tokens split the prompt
into segments; text between them is tokenised on its own, which is exact for BPE tokenizers because
pre-tokenisation never crosses a special token. `hf:` tokenizers use the model's own template instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefixscan.encode import core as encode_core
from prefixscan.read.content import content_text, json_text

TEMPLATE_VERSION = "chatml-v1"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"


@dataclass(frozen=True, slots=True)
class Rendered:
    """A rendered prompt: alternating text and special-token pieces, and where the head ends.

    `head_pieces` counts the pieces that hold the system messages and the tool profile (the "system and
    tools" prefix class ends there).
    """

    pieces: tuple[tuple[bool, str], ...]  # (is_special, text)
    head_pieces: int


def _message_body(m: dict[str, Any]) -> str:
    body = content_text(m.get("content"))
    if m.get("tool_calls"):
        body += "\n" + json_text(m["tool_calls"])
    if m.get("name"):
        return f"{m['role']} name={m['name']}\n{body}"
    return f"{m['role']}\n{body}"


def _tools_text(tools: list[Any]) -> str:
    return "system\n# Tools\n" + "\n".join(json_text(t) for t in tools)


_START, _END, _NL, _GEN = (True, IM_START), (True, IM_END), (False, "\n"), (False, "assistant\n")


def render_chatml(messages: list[dict[str, Any]], tools: list[Any] | None) -> Rendered:
    """Render like ChatML with the generation prompt; tools go in a system block after leading system messages.

    Tool JSON keeps the key order the application sent: a key-order change is a real cache breaker.
    """
    fast = encode_core.core()
    if fast is not None:  # the same layout compiled; bodies other than role + plain text come from Python
        got = fast.render_pieces(messages, tools, _tools_text, _message_body, _START, _END, _NL, "\n", _GEN)
        if got is not None:
            return Rendered(tuple(got[0]), got[1])
    pieces: list[tuple[bool, str]] = []
    i = 0
    while i < len(messages) and messages[i].get("role") in ("system", "developer"):
        pieces += [(True, IM_START), (False, _message_body(messages[i])), (True, IM_END), (False, "\n")]
        i += 1
    if tools:
        pieces += [(True, IM_START), (False, _tools_text(tools)), (True, IM_END), (False, "\n")]
    head = len(pieces)
    for m in messages[i:]:
        pieces += [(True, IM_START), (False, _message_body(m)), (True, IM_END), (False, "\n")]
    pieces += [(True, IM_START), (False, "assistant\n")]
    return Rendered(tuple(pieces), head)


def rendered_text(r: Rendered) -> str:
    """The whole prompt as one string (for direct tokenisation in tests and fallbacks)."""
    return "".join(t for _, t in r.pieces)
