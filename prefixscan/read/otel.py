"""OpenTelemetry GenAI spans (the semantic conventions for generative AI) as chat records, and inverted.

OTLP JSON (`resourceSpans` / `scopeSpans` / `spans`, typed attribute values) or one span per line with flat
attributes. Field names were checked against the conventions' documentation (docs/engines.md).
"""

from __future__ import annotations

from typing import Any

import orjson

from prefixscan.read.content import json_value, parts_text
from prefixscan.read.promptmap import PromptMap, Slot, Unmappable, block_slots
from prefixscan.read.record import RecordError

_OTEL_VALUE_KEYS = ("stringValue", "intValue", "doubleValue", "boolValue")


# Cache-read input tokens: the convention's name, then the older spellings seen in the wild (docs/engines.md).
CACHE_READ = ("gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cache_read_input_tokens",
              "gen_ai.usage.input_tokens.cached")


def otlp_value(v: Any) -> Any:
    """A typed OTLP attribute value ({"stringValue": ...}, arrays, kvlists) as plain Python."""
    if not isinstance(v, dict):
        return v
    for k in _OTEL_VALUE_KEYS:
        if k in v:
            return int(v[k]) if k == "intValue" else v[k]
    if "arrayValue" in v:
        return [otlp_value(x) for x in (v["arrayValue"] or {}).get("values") or []]
    if "kvlistValue" in v:
        return {kv.get("key"): otlp_value(kv.get("value")) for kv in (v["kvlistValue"] or {}).get("values") or []}
    return None


def span_attributes(span: dict[str, Any]) -> dict[str, Any]:
    """Attributes of a span as a flat dict, whether OTLP (a list of key/value) or already a dict."""
    attrs = span.get("attributes")
    if isinstance(attrs, list):
        return {a.get("key"): otlp_value(a.get("value")) for a in attrs if isinstance(a, dict)}  # type: ignore[misc]  # OTLP keys: str
    return dict(attrs) if isinstance(attrs, dict) else {}


def expand_otlp(obj: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The spans of an OTLP JSON export (one object holding many), or None when `obj` is not one."""
    rs = obj.get("resourceSpans")
    if not isinstance(rs, list):
        return None
    out = []
    for r in rs:
        for ss in (r or {}).get("scopeSpans") or (r or {}).get("instrumentationLibrarySpans") or []:
            out += [s for s in (ss or {}).get("spans") or [] if isinstance(s, dict)]
    return out


def is_genai_span(obj: dict[str, Any]) -> bool:
    attrs = span_attributes(obj)
    return any(isinstance(k, str) and k.startswith("gen_ai.") for k in attrs) and (
        "spanId" in obj or "span_id" in obj or "context" in obj or "startTimeUnixNano" in obj or "start_time" in obj)


def _otel_message(m: dict[str, Any]) -> list[dict[str, Any]]:
    """One GenAI message (role + parts) as OpenAI-style messages (tool results become tool messages)."""
    role, parts = m.get("role"), m.get("parts")
    if parts is None:
        return [{"role": role, "content": m.get("content")}]
    calls, results, content = [], [], []
    for p in parts if isinstance(parts, list) else []:
        kind = p.get("type") if isinstance(p, dict) else "text"
        if kind == "tool_call":
            args = p.get("arguments")
            calls.append({"id": p.get("id"), "type": "function", "function": {
                "name": p.get("name"), "arguments": args if isinstance(args, str) else orjson.dumps(args).decode()}})
        elif kind == "tool_call_response":
            res = p.get("result", p.get("response"))
            results.append({"role": "tool", "tool_call_id": p.get("id"),
                            "content": res if isinstance(res, str) else orjson.dumps(res).decode()})
        elif kind == "text":
            content.append({"type": "text", "text": parts_text([p])})
        else:  # media (blob, uri, file) and other parts: kept as a part, hashed by content downstream
            content.append(p)
    out = []
    if content or calls or not results:
        text_only = all(c.get("type") == "text" for c in content)
        msg: dict[str, Any] = {"role": role, "content": "".join(c["text"] for c in content) if text_only else content}
        if calls:
            msg["tool_calls"] = calls
        out.append(msg)
    return out + results


def _first(attrs: dict[str, Any], *names: str) -> Any:
    return next((attrs[n] for n in names if attrs.get(n) is not None), None)


def _span_start(span: dict[str, Any]) -> Any:
    ns = span.get("startTimeUnixNano", span.get("start_time_unix_nano"))
    if ns is not None:
        return int(ns) / 1e9
    return span.get("start_time", span.get("startTime"))


def otel_to_chat(span: dict[str, Any]) -> dict[str, Any]:
    """A GenAI span as a chat record; RecordError when it carries no input messages."""
    a = span_attributes(span)
    raw = json_value(a.get("gen_ai.input.messages"))
    if not isinstance(raw, list) or not raw:
        raise RecordError("not_a_genai_request", "span has no gen_ai.input.messages (the instrumentation may not "
                         "record message content; enable it, e.g. OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT)")
    messages: list[dict[str, Any]] = []
    system = json_value(a.get("gen_ai.system_instructions"))
    if system:
        messages.append({"role": "system", "content": parts_text(system)})
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise RecordError("bad_message", f"gen_ai.input.messages item {i} is not an object")
        messages += _otel_message(m)
    tools = json_value(a.get("gen_ai.tool.definitions"))
    ctx = span["context"] if isinstance(span.get("context"), dict) else {}
    input_tokens = _first(a, "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens")
    return {
        "messages": messages, "tools": tools if isinstance(tools, list) else None,
        "model": _first(a, "gen_ai.request.model", "gen_ai.response.model"), "timestamp": _span_start(span),
        "request_id": span.get("spanId") or span.get("span_id") or ctx.get("span_id") or a.get("gen_ai.response.id"),
        "conversation_id": a.get("gen_ai.conversation.id"),
        "output_tokens": _first(a, "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens"),
        "actual_cached_tokens": _first(a, *CACHE_READ),
        "reported_prompt_tokens": input_tokens,
        "tenant": _first(a, "tenant", "tenant.id", "enduser.id"), "user": a.get("user.id"),
    }


def otel_map(pm: PromptMap, span: dict[str, Any]) -> None:
    """`otel_to_chat`, inverted."""
    attrs = span.get("attributes")

    def attr(key: str) -> tuple[Any, Any, Any, str]:
        path = f'attributes."{key}"'
        if isinstance(attrs, dict):
            return pm.value(attrs, key), attrs, key, path
        entry = next((a for a in reversed(attrs) if isinstance(a, dict) and a.get("key") == key), None) \
            if isinstance(attrs, list) else None
        if entry is None:
            return None, None, None, path
        v = entry.get("value")
        if isinstance(v, dict) and "stringValue" in v:
            return pm.value(v, "stringValue"), v, "stringValue", path
        if isinstance(v, dict):
            raise Unmappable(f"OTLP attribute {key} is not a string value")
        return pm.value(entry, "value"), entry, "value", path

    system, h, k, path = attr("gen_ai.system_instructions")
    if system:
        pm.add([Slot(h, k, path)] if isinstance(system, str) else block_slots(system, path)
               if isinstance(system, list) else [])
    raw, _, _, path = attr("gen_ai.input.messages")
    for i, m in enumerate(raw if isinstance(raw, list) else []):
        if not isinstance(m, dict):
            raise Unmappable(f"gen_ai.input.messages item {i} is not an object")
        parts = m.get("parts")
        if parts is None:
            pm.parts(m, "content", f"{path}[{i}].content")
            continue
        slots, results, content, calls = [], [], False, False
        for j, p in enumerate(parts if isinstance(parts, list) else []):
            kind = p.get("type") if isinstance(p, dict) else "text"
            if kind == "tool_call":
                calls = True
            elif kind == "tool_call_response":
                rk = "result" if "result" in p else "response"
                results.append([Slot(p, rk, f"{path}[{i}].parts[{j}].{rk}")] if isinstance(p.get(rk), str) else [])
            else:
                content = True
                if isinstance(p, str):
                    slots.append(Slot(parts, j, f"{path}[{i}].parts[{j}]"))
                elif kind == "text":
                    tk = "content" if "content" in p else "text"
                    if isinstance(p.get(tk), str):
                        slots.append(Slot(p, tk, f"{path}[{i}].parts[{j}].{tk}"))
        if content or calls or not results:
            pm.add(slots, (lambda t, ps=parts: ps.append({"type": "text", "content": t}))  # type: ignore[misc]  # the default (ps=parts) binds this loop's list
                   if isinstance(parts, list) else None)
        for r in results:
            pm.add(r)
    tools, _, _, path = attr("gen_ai.tool.definitions")
    if isinstance(tools, list):
        pm.tools = (tools, path, lambda new, old: new)
