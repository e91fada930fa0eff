"""OpenAI Responses API logs as chat records, and inverted.

`instructions`; `input` as a string or items (messages, function calls and their outputs);
`usage.input_tokens_details.cached_tokens`; conversations chained by `previous_response_id`.
"""

from __future__ import annotations

from typing import Any

import orjson

from prefixscan.read.content import json_value
from prefixscan.read.promptmap import PromptMap, Slot
from prefixscan.read.record import RecordError


def is_responses(body: dict[str, Any], usage: dict[str, Any]) -> bool:
    return "input" in body and "messages" not in body and (
        "instructions" in body or "input_tokens_details" in usage or body.get("object") == "response"
        or isinstance(body.get("input"), list | str))


def _response_item(item: Any) -> list[dict[str, Any]]:
    if isinstance(item, str):
        return [{"role": "user", "content": item}]
    if not isinstance(item, dict):
        return []
    kind = item.get("type")
    if kind == "function_call":
        return [{"role": "assistant", "content": "", "tool_calls": [{"id": item.get("call_id"), "type": "function",
                 "function": {"name": item.get("name"), "arguments": item.get("arguments")}}]}]
    if kind == "function_call_output":
        out = item.get("output")
        return [{"role": "tool", "tool_call_id": item.get("call_id"),
                 "content": out if isinstance(out, str) else orjson.dumps(out).decode()}]
    content = item.get("content")
    if isinstance(content, list):
        content = [{"type": "text", "text": p.get("text", "")} if isinstance(p, dict) and p.get("type") in (
            "input_text", "output_text", "text") else p for p in content]
    return [{"role": item.get("role", "user"), "content": content}]


def responses_to_chat(body: dict[str, Any], usage: dict[str, Any], response: dict[str, Any],
                      roots: dict[Any, Any]) -> dict[str, Any]:
    """A Responses API request as a chat record; `previous_response_id` chains turns into a conversation."""
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": str(body["instructions"])})
    inp = json_value(body.get("input"))
    if not isinstance(inp, str | list):
        raise RecordError("wrong_type", f"`input` should be a string or a list of items, got {type(inp).__name__}")
    for item in [inp] if isinstance(inp, str) else inp:
        messages += _response_item(item)
    rid, prev = response.get("id"), body.get("previous_response_id")
    conv = None
    if rid is not None or prev is not None:
        conv = roots.get(("responses", prev), prev) if prev else rid
        if rid is not None:
            roots[("responses", rid)] = conv
    details = usage.get("input_tokens_details") or {}
    return {"messages": messages, "tools": body.get("tools"), "model": body.get("model"), "request_id": rid,
            "conversation_id": conv, "actual_cached_tokens": details.get("cached_tokens"),
            "output_tokens": usage.get("output_tokens"), "reported_prompt_tokens": usage.get("input_tokens")}


def responses_map(pm: PromptMap, body: dict[str, Any], path: str) -> None:
    """`responses_to_chat`, inverted."""
    if body.get("instructions"):
        pm.add([Slot(body, "instructions", f"{path}instructions")] if isinstance(body["instructions"], str) else [])
    inp = pm.value(body, "input")
    if isinstance(inp, str):
        pm.add([Slot(body, "input", f"{path}input")])
    for i, item in enumerate(inp if isinstance(inp, list) else []):
        where = f"{path}input[{i}]"
        if isinstance(item, str):
            pm.add([Slot(inp, i, where)])
        elif not isinstance(item, dict):
            continue
        elif item.get("type") == "function_call":
            pm.add([])
        elif item.get("type") == "function_call_output":
            pm.add([Slot(item, "output", f"{where}.output")] if isinstance(item.get("output"), str) else [])
        else:
            pm.parts(item, "content", f"{where}.content", new_type="input_text")
    tools = pm.value(body, "tools")
    if isinstance(tools, list):
        pm.tools = (tools, f"{path}tools", lambda new, old: new)
