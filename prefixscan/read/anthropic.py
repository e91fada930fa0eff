"""Anthropic Messages API logs as chat records, and inverted.

`system` as a string or blocks; content blocks (text, image, tool_use, tool_result); `usage.input_tokens`
*excludes* cache reads and writes, so the prompt is their sum (docs/engines.md).
"""

from __future__ import annotations

from typing import Any

import orjson

from prefixscan.read.content import json_value, parts_text
from prefixscan.read.promptmap import PromptMap, Slot, Unmappable
from prefixscan.read.record import RecordError


def _anthropic_blocks(role: str | None, content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    parts, calls, results = [], [], []
    for b in content or []:
        if not isinstance(b, dict):
            continue
        kind = b.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": b.get("text", "")})
        elif kind == "tool_use":
            calls.append({"id": b.get("id"), "type": "function", "function": {
                "name": b.get("name"), "arguments": orjson.dumps(b.get("input", {}), option=orjson.OPT_SORT_KEYS
                                                                 ).decode()}})
        elif kind == "tool_result":
            c = b.get("content")
            results.append({"role": "tool", "tool_call_id": b.get("tool_use_id"),
                            "content": c if isinstance(c, str) else parts_text(
                                [{"type": "text", "content": x.get("text", "")} for x in c or []
                                 if isinstance(x, dict)])})
        else:  # image, document, ...: a media part hashed by its content downstream
            parts.append({k: v for k, v in b.items() if k != "cache_control"})
    out = []
    if parts or calls or not results:
        msg: dict[str, Any] = {"role": role, "content": parts}
        if calls:
            msg["tool_calls"] = calls
        out.append(msg)
    return out + results


def is_anthropic(body: dict[str, Any], usage: dict[str, Any]) -> bool:
    if "input_tokens" in usage and ("cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage):
        return True
    if "system" in body and "messages" in body:
        return True
    msgs = body.get("messages")
    return any(isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result") and "messages" in body
               for m in (msgs if isinstance(msgs, list) else []) if isinstance(m, dict)
               for b in (m["content"] if isinstance(m.get("content"), list) else []))


def anthropic_to_chat(body: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages request (and its response usage) as a chat record."""
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": system if isinstance(system, str) else parts_text(
            [{"type": "text", "content": b.get("text", "")} for b in system if isinstance(b, dict)])})
    raw = json_value(body.get("messages"))
    if not isinstance(raw, list):
        raise RecordError("wrong_type", f"`messages` should be a list, got {type(raw).__name__}")
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise RecordError("bad_message", f"message {i} is not an object")
        messages += _anthropic_blocks(m.get("role"), m.get("content"))
    tools = [{"type": "function", "function": {"name": t.get("name"), "description": t.get("description"),
                                               "parameters": t.get("input_schema")}}
             for t in body.get("tools") or [] if isinstance(t, dict)] or None
    read, write, fresh = (usage.get(k) for k in ("cache_read_input_tokens", "cache_creation_input_tokens",
                                                 "input_tokens"))
    ints = [x for x in (read, write, fresh) if isinstance(x, int) and not isinstance(x, bool)]
    return {"messages": messages, "tools": tools, "model": body.get("model"), "actual_cached_tokens": read,
            "output_tokens": usage.get("output_tokens"),
            # input_tokens excludes cache reads and writes: the prompt is their sum
            "reported_prompt_tokens": sum(ints) if fresh is not None else None,
            "cache_breakpoints": _breakpoints(body)}


def _breakpoints(body: dict[str, Any]) -> int:
    """How many `cache_control` breakpoints the request sets (Anthropic caches up to the last one)."""
    n = 0
    for holder in ([body.get("system")] if isinstance(body.get("system"), list) else []) + [
            m.get("content") for m in body.get("messages") or [] if isinstance(m, dict)] + [body.get("tools")]:
        if isinstance(holder, list):
            n += sum(1 for b in holder if isinstance(b, dict) and b.get("cache_control"))
    return n


def anthropic_map(pm: PromptMap, body: dict[str, Any], path: str) -> None:
    """`anthropic_to_chat`, inverted (`path`: where the body sits, "" or "request.")."""
    system = body.get("system")
    if system:
        pm.add([Slot(body, "system", f"{path}system")] if isinstance(system, str) else
               [Slot(b, "text", f"{path}system[{i}].text") for i, b in enumerate(system)
                if isinstance(b, dict) and isinstance(b.get("text"), str)])
    raw = pm.value(body, "messages")
    for i, m in enumerate(raw if isinstance(raw, list) else []):
        if not isinstance(m, dict):
            raise Unmappable(f"message {i} is not an object")
        content, where = m.get("content"), f"{path}messages[{i}].content"
        if isinstance(content, str):
            pm.add([Slot(m, "content", where)])
            continue
        slots, results, other = [], [], False
        for j, b in enumerate(content or []):
            if not isinstance(b, dict):
                continue
            kind = b.get("type")
            if kind == "tool_result":
                c = b.get("content")
                results.append([Slot(b, "content", f"{where}[{j}].content")] if isinstance(c, str) else
                               [Slot(x, "text", f"{where}[{j}].content[{n}].text") for n, x in enumerate(c or [])
                                if isinstance(x, dict) and isinstance(x.get("text"), str)])
            else:
                other = True
                if kind == "text" and isinstance(b.get("text"), str):
                    slots.append(Slot(b, "text", f"{where}[{j}].text"))
        if other or not results:
            pm.add(slots, (lambda t, c=content: c.append({"type": "text", "text": t}))  # type: ignore[misc]  # the default (c=content) binds this loop's list
                   if isinstance(content, list) else None)
        for r in results:
            pm.add(r)
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        if not all(isinstance(t, dict) for t in tools):
            raise Unmappable("a tool is not an object")

        def to_raw(new: dict[str, Any], old: Any) -> dict[str, Any]:
            fn = new.get("function") or {}
            out = {**(old if isinstance(old, dict) else {}), "name": fn.get("name"),
                   "input_schema": fn.get("parameters")}
            if fn.get("description") is not None or "description" in out:
                out["description"] = fn.get("description")
            return out
        pm.tools = (tools, f"{path}tools", to_raw)
