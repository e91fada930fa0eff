"""Conversations inferred from message-prefix continuity, for logs that carry no conversation id.

A chat client resends the whole history every turn: turn k+1's messages are turn k's messages plus the
assistant's answer and the next user message. So a request whose leading messages equal *all* the
messages of an earlier request (same tenant and model) continues that request's conversation. LiteLLM's
default payload has no conversation id; without this, multi-turn history looks like a shared document and
its hits like same-tenant reuse.

State is two entries per request (a 64-bit hash of its whole message list -> conversation id), bounded by
`max_entries` (oldest dropped first: a conversation idle for millions of requests starts a new one).
"""

from __future__ import annotations

from typing import Any

import orjson
import xxhash

from prefixscan.read.content import content_text

MAX_ENTRIES = 4_000_000
PREFIX = "inferred:"


def _message_key(m: dict[str, Any]) -> bytes:
    """What identifies a message across resends: role, text and tool calls (not extra fields a client or
    gateway adds, such as `refusal: null`)."""
    parts = [str(m.get("role", "")), content_text(m.get("content"))]
    calls = m.get("tool_calls")
    if calls:
        parts.append(orjson.dumps(calls, option=orjson.OPT_SORT_KEYS).decode())
    if m.get("tool_call_id"):
        parts.append(str(m["tool_call_id"]))
    return "\x00".join(parts).encode("utf-8", "surrogatepass")


def prefix_hashes(messages: list[dict[str, Any]], seed: int) -> list[int]:
    """Chained hash of messages[:i+1] for every i (the chain makes each one name the whole prefix)."""
    out: list[int] = []
    h = seed
    for m in messages:
        h = xxhash.xxh3_64_intdigest(_message_key(m), seed=h)
        out.append(h)
    return out


class ConversationInference:
    """Assigns an inferred conversation id to chat requests without one, in input order."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.ends: dict[int, str] = {}  # hash of a request's whole message list -> its conversation
        self.max_entries = max_entries
        self.inferred = 0  # requests given an inferred id
        self.continued = 0  # of those, requests found to continue an earlier one

    def assign(self, request_id: str, tenant: str | None, model: str | None,
               messages: list[dict[str, Any]]) -> str:
        """The conversation of a request: the one whose latest request's messages this request's leading
        messages equal (longest such prefix), else a new one named after this request.

        A second chain skips system and developer messages: a dynamic field there (a timestamp in the
        system prompt) changes every turn's system message while the dialogue itself still extends. That
        match only counts when the request goes on with an assistant message (the previous answer)."""
        seed = xxhash.xxh3_64_intdigest(f"{tenant or ''}\x00{model or ''}".encode("utf-8", "surrogatepass"))
        hs = prefix_hashes(messages, seed)
        dialogue = [m for m in messages if m.get("role") not in ("system", "developer")]
        ds = prefix_hashes(dialogue, seed ^ 0xD1A1)
        conv = _longest(self.ends, hs, None)
        if conv is None:
            conv = _longest(self.ends, ds, dialogue)
        self.inferred += 1
        if conv is None:
            conv = PREFIX + request_id
        else:
            self.continued += 1
        for chain in (hs, ds):
            if chain:
                self.ends.pop(chain[-1], None)
                self.ends[chain[-1]] = conv
        while len(self.ends) > self.max_entries:
            del self.ends[next(iter(self.ends))]
        return conv


def _longest(ends: dict[int, str], chain: list[int], dialogue: list[dict[str, Any]] | None) -> str | None:
    """The conversation of the longest proper prefix of `chain` that ends an earlier request; on the
    dialogue chain, only a prefix followed by an assistant message."""
    for i in range(len(chain) - 2, -1, -1):
        if dialogue is not None and dialogue[i + 1].get("role") != "assistant":
            continue
        conv = ends.get(chain[i])
        if conv is not None:
            return conv
    return None
