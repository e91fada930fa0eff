"""Log shapes of the wider ecosystem, converted to the chat shape before normalisation.

- OpenTelemetry GenAI spans (semantic conventions for generative AI): OTLP JSON (`resourceSpans` /
  `scopeSpans` / `spans`, typed attribute values) or one span per line with flat attributes;
- Anthropic Messages API logs: `system` as a string or blocks, content blocks (text, image, tool_use,
  tool_result), `usage.input_tokens` *excluding* cache reads and writes (REFERENCE.md 13);
- OpenAI Responses API logs: `instructions`, `input` as a string or items (messages, function calls and
  their outputs), `usage.input_tokens_details.cached_tokens`, conversations chained by
  `previous_response_id`.

Each converter returns a plain chat record (`messages`, `tools`, `model`, `timestamp`, `request_id`,
`conversation_id`, `output_tokens`, `actual_cached_tokens`, `reported_prompt_tokens`), so the rest of the
pipeline knows one shape. Field names were checked against each format's documentation.
"""

from __future__ import annotations

from typing import Any

import orjson

SHAPES = ("otel", "anthropic", "responses")
_OTEL_VALUE_KEYS = ("stringValue", "intValue", "doubleValue", "boolValue")
# Cache-read input tokens: the convention's name, then the older spellings seen in the wild (REFERENCE.md 13).
CACHE_READ = ("gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cache_read_input_tokens",
              "gen_ai.usage.input_tokens.cached")


class ShapeError(ValueError):
    """A record of an ecosystem shape that lacks what the conversion needs (becomes a reject)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _json(value: Any) -> Any:
    """Decode a JSON string (attributes often carry structured values as strings); anything else as is."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


# ---- OpenTelemetry ----------------------------------------------------------------------------------

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
        return {a.get("key"): otlp_value(a.get("value")) for a in attrs if isinstance(a, dict)}
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


def _parts_text(parts: Any) -> str:
    if isinstance(parts, str):
        return parts
    texts = []
    for p in parts or []:
        if isinstance(p, dict) and p.get("type") in (None, "text"):
            texts.append(str(p.get("content", p.get("text", ""))))
        elif isinstance(p, str):
            texts.append(p)
    return "".join(texts)


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
            content.append({"type": "text", "text": _parts_text([p])})
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
    """A GenAI span as a chat record; ShapeError when it carries no input messages."""
    a = span_attributes(span)
    raw = _json(a.get("gen_ai.input.messages"))
    if not isinstance(raw, list) or not raw:
        raise ShapeError("not_a_genai_request", "span has no gen_ai.input.messages (the instrumentation may not "
                         "record message content; enable it, e.g. OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT)")
    messages: list[dict[str, Any]] = []
    system = _json(a.get("gen_ai.system_instructions"))
    if system:
        messages.append({"role": "system", "content": _parts_text(system)})
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise ShapeError("bad_message", f"gen_ai.input.messages item {i} is not an object")
        messages += _otel_message(m)
    tools = _json(a.get("gen_ai.tool.definitions"))
    ctx = span.get("context") if isinstance(span.get("context"), dict) else {}
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


# ---- Anthropic Messages ------------------------------------------------------------------------------

def _anthropic_blocks(role: str, content: Any) -> list[dict[str, Any]]:
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
                            "content": c if isinstance(c, str) else _parts_text(
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
               for b in (m.get("content") if isinstance(m.get("content"), list) else []))


def anthropic_to_chat(body: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages request (and its response usage) as a chat record."""
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": system if isinstance(system, str) else _parts_text(
            [{"type": "text", "content": b.get("text", "")} for b in system if isinstance(b, dict)])})
    raw = _json(body.get("messages"))
    if not isinstance(raw, list):
        raise ShapeError("wrong_type", f"`messages` should be a list, got {type(raw).__name__}")
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise ShapeError("bad_message", f"message {i} is not an object")
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


# ---- OpenAI Responses --------------------------------------------------------------------------------

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
    inp = _json(body.get("input"))
    if not isinstance(inp, str | list):
        raise ShapeError("wrong_type", f"`input` should be a string or a list of items, got {type(inp).__name__}")
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
