"""The structure every scenario produces: messages made of parts, each part knowing what it shares.

Text output joins the parts; Mooncake output walks the same parts through a prefix trie to assign chained
block ids. Keeping one structure for both is what makes the two formats describe the same workload.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SHARED = "shared"  # key is global: any request with the same key under the same prefix shares it
CONV = "conv"  # key belongs to one conversation; forgotten when the conversation ends
UNIQUE = "unique"  # never shared with another request


@dataclass(slots=True)
class Field:
    """A dynamic value carried by a part: where it is inside the part and what it is."""

    kind: str
    source: str  # "breaker" (injected) or "template" (a customer field the template puts in)
    label: str
    value: str
    offset: int
    form: str = ""
    position: str = ""


@dataclass(slots=True)
class Part:
    """A piece of message content. Equal keys under an equal prefix mean equal text."""

    text: str
    key: Any = None
    scope: str = UNIQUE
    field: Field | None = None


@dataclass(slots=True)
class ToolProfile:
    """A tenant's tool list, serialised once: the long, stable head of every agent request."""

    profile_id: str
    tools: list[dict[str, Any]]
    json_text: str


@dataclass(slots=True)
class Plan:
    """One request before serialisation."""

    time: float
    scenario: str
    tenant: str
    user_index: int
    user: str
    model: str
    messages: list[tuple[str, list[Part]]]
    max_tokens: int
    output_tokens: int
    source: str  # the prompt source breakers are attached to (system prompt / template / hot prefix id)
    conversation_id: str | None = None
    turn_index: int = 0
    template_id: str | None = None
    shared: dict[str, Any] = field(default_factory=dict)
    tools: ToolProfile | None = None
    next_gap: float | None = None  # seconds until this session's next request; None when it is the last
    drift: list[dict[str, Any]] | None = None  # normalisation drift truth (only when drift is configured)
