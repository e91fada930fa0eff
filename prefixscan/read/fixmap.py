"""`prompt_map`: where a record's prompt text lives in its own fields, whatever its shape (for `fix`).

The chat shapes are walked here; the ecosystem shapes by their own modules' `*_map` (read/otel.py,
read/anthropic.py, read/responses.py), on the slots of read/promptmap.py.
"""

from __future__ import annotations

from typing import Any

from prefixscan.read.anthropic import anthropic_map
from prefixscan.read.otel import otel_map
from prefixscan.read.promptmap import PromptMap, Unmappable
from prefixscan.read.record import CONTENT_FIELDS, RecordError, get_path, split_path
from prefixscan.read.responses import responses_map
from prefixscan.read.shapes import WRAPPER_KEYS, ecosystem_kind


def prompt_map(obj: dict[str, Any], shape: str, overrides: dict[str, str] | None = None) -> PromptMap:
    """Where each message of `normalise(obj, shape)` has its text in the record's own fields (a copy of
    `obj`, edited through the map by `fix`). Raises Unmappable when the record has no messages to map."""
    import copy

    pm = PromptMap(copy.deepcopy(obj))
    root = pm.obj
    overrides = overrides or {}
    try:
        kind, _, _, _ = ecosystem_kind(root, shape)
    except (RecordError, TypeError, AttributeError, ValueError) as exc:
        raise Unmappable(str(exc)) from None
    body, path = root, ""
    if shape in WRAPPER_KEYS:
        path = WRAPPER_KEYS[shape]
        body = pm.value(root, path)
        path += "."
        if not isinstance(body, dict):
            raise Unmappable(f"`{path[:-1]}` is not an object")
    if kind is not None and any(k in overrides for k in CONTENT_FIELDS):
        raise Unmappable(f"--field messages/tools on a {kind} record")
    if kind == "otel":
        otel_map(pm, root)
    elif kind == "anthropic":
        anthropic_map(pm, body, path)
    elif kind == "responses":
        responses_map(pm, body, path)
    else:
        _chat_map(pm, root, body, path, overrides)
    return pm


def _walk(pm: PromptMap, root: dict[str, Any], path: str) -> tuple[Any, Any]:
    """(holder, key) of a --field path, decoding JSON strings on the way as `get_path` does."""
    parts = split_path(path)
    cur: Any = root
    for p in parts[:-1]:
        cur = pm.value(cur, p) if isinstance(cur, dict) else None
        if not isinstance(cur, dict):
            raise Unmappable(f"--field path {path} does not lead to an object")
    return cur, parts[-1]


def _chat_map(pm: PromptMap, root: dict[str, Any], body: dict[str, Any], path: str,
              overrides: dict[str, str]) -> None:
    """The chat shapes (bare, batch `body`, gateway `request`, LiteLLM): one message per raw message."""
    holder, key, where = body, "messages", f"{path}messages"
    if "messages" in overrides:
        (holder, key), where = _walk(pm, root, overrides["messages"]), overrides["messages"]
    msgs = pm.value(holder, key)
    if not isinstance(msgs, list):
        raise Unmappable("no `messages` list")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise Unmappable(f"message {i} is not an object")
        pm.parts(m, "content", f"{where}[{i}].content")
    if "tools" in overrides:
        holder, key = _walk(pm, root, overrides["tools"])
        tpath = overrides["tools"]
    elif body.get("tools") is None and isinstance(get_path(body, "model_parameters.tools"), list | str):
        holder, key, tpath = pm.value(body, "model_parameters"), "tools", f"{path}model_parameters.tools"
    else:
        holder, key, tpath = body, "tools", f"{path}tools"
    tools = pm.value(holder, key) if isinstance(holder, dict) else None
    if isinstance(tools, list):
        pm.tools = (tools, tpath, lambda new, old: new)
