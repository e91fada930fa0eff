"""Chained block ids straight from a plan's prefix structure (Mooncake trace semantics).

A request is a path of parts; equal keys under an equal path mean equal text. Walking the parts through a
trie whose nodes remember the block ids completed inside them gives chained-prefix ids without touching
tokens: block k's id belongs to the node holding the block's last token, so equal ids mean equal whole
prefixes. Ids are small integers handed out in order of first appearance, and the last partial block gets
its own id, so len(hash_ids) == ceil(input_length / block). Token counts are estimates (chars / 4).
"""

from __future__ import annotations

from typing import Any

from prefixscan.synth.plan import CONV, SHARED, UNIQUE, Plan
from prefixscan.synth.text import CHARS_PER_TOKEN, estimate_tokens

HEADER_TOKENS = 4  # role markers around each message, as chat templates add
_HEADERS = {r: ("hdr", r) for r in ("system", "user", "assistant", "tool")}


class _Node:
    __slots__ = ("children", "end", "ids", "partial", "stored")

    def __init__(self, end: int, ids: list[int], stored: bool) -> None:
        self.children: dict[Any, _Node] = {}
        self.end = end
        self.ids = ids
        self.partial = -1
        self.stored = stored


class BlockMapper:
    """Assigns Mooncake hash ids to plans, in the order they are fed; forgets finished conversations."""

    def __init__(self, block: int = 512) -> None:
        self.block = block
        self.root = _Node(0, [], True)
        self.next_id = 0
        self.hit_blocks = 0
        self.total_blocks = 0
        self._conv_roots: dict[str, list[tuple[_Node, Any]]] = {}
        self._conv_paths: dict[str, tuple[list[Any], list[_Node]]] = {}

    def _new(self, parent: _Node, key: Any, scope: str, tokens: int, conv: str | None) -> _Node:
        """Create the child of `parent` for a part not seen under it, handing out ids for its blocks."""
        end = parent.end + tokens
        n = end // self.block - parent.end // self.block
        if n:
            start = self.next_id
            self.next_id += n
            ids = parent.ids + list(range(start, start + n))
        else:
            ids = parent.ids
        stored = parent.stored and scope != UNIQUE
        node = _Node(end, ids, stored)
        if scope != UNIQUE:
            parent.children[key] = node
            if scope == CONV and parent.stored and conv is not None:
                self._conv_roots.setdefault(conv, []).append((parent, key))
        return node

    def map(self, plan: Plan) -> tuple[int, list[int]]:
        """(input_length, hash_ids) of one plan; call in request order."""
        first_new = self.next_id
        conv = plan.conversation_id
        node = self.root
        messages = plan.messages
        # A conversation resends the same message objects: resume after the longest identical run.
        prev = self._conv_paths.get(conv) if conv is not None else None
        start = 0
        if prev is not None:
            prev_msgs, prev_nodes = prev
            limit = min(len(prev_msgs), len(messages))
            while start < limit and messages[start] is prev_msgs[start]:
                start += 1
        if start:
            nodes = prev_nodes[:start]
            node = nodes[-1]
        else:
            nodes = []
            if plan.tools is not None:
                key = ("tools", plan.tools.profile_id)
                child = node.children.get(key)
                node = child if child is not None else self._new(node, key, SHARED,
                                                                  estimate_tokens(plan.tools.json_text), conv)
        new = self._new
        headers = _HEADERS
        for i in range(start, len(messages)):
            role, parts = messages[i]
            key = headers.get(role) or ("hdr", role)
            child = node.children.get(key)
            node = child if child is not None else new(node, key, SHARED, HEADER_TOKENS, conv)
            for p in parts:
                if p.scope is not UNIQUE:
                    child = node.children.get(p.key)
                    if child is not None:
                        node = child
                        continue
                node = new(node, p.key, p.scope, (len(p.text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN, conv)
            nodes.append(node)
        ids = node.ids
        if node.end % self.block:
            if node.partial < 0:
                node.partial = self.next_id
                self.next_id += 1
            ids = ids + [node.partial]
        self.total_blocks += len(ids)
        # Every id handed out during this call lies on this request's path; all others were seen before.
        self.hit_blocks += len(ids) - (self.next_id - first_new)
        if conv is not None:
            if plan.next_gap is None:
                self._conv_paths.pop(conv, None)
                for parent, key in self._conv_roots.pop(conv, ()):
                    parent.children.pop(key, None)
            else:
                self._conv_paths[conv] = (messages, nodes)
        return node.end, ids


def mooncake_record(plan: Plan, input_length: int, ids: list[int]) -> dict[str, Any]:
    """One Mooncake trace line: relative ms timestamp, lengths, chained block ids."""
    return {"timestamp": int(round(plan.time * 1000)), "input_length": input_length,
            "output_length": plan.output_tokens, "hash_ids": ids}
