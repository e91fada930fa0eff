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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from prefixscan.affixes import common_affixes

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


# ---- Anthropic Messages ------------------------------------------------------------------------------

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
               for b in (m["content"] if isinstance(m.get("content"), list) else []))


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


# ---- Where each message's text lives in the record: the converters above, inverted (for `fix`) ------------
# Each `*_map` walks a record exactly as its converter does and, for every message the converter produces
# (same index as `Record.messages`), names the raw strings whose texts appear, in order, in that message's
# text. `fix` edits the record through these slots, so an offset found in the normalised message list is
# applied to the record's own field (`system[0].text`, `input[2].content[0].text`, ...).

class Unmappable(ValueError):
    """A record whose prompt text cannot be located in its own fields: `fix` leaves it as it is."""


@dataclass
class Slot:
    """One raw string of a record, `holder[key]`, named by its path in the record's own shape."""

    holder: Any
    key: Any
    path: str

    @property
    def text(self) -> str:
        return self.holder[self.key]


@dataclass
class MessageSlots:
    """The raw strings of one normalised message, and how to add a text part at its end (None: cannot)."""

    slots: list[Slot]
    append: Callable[[str], None] | None = None


@dataclass
class PromptMap:
    """The text slots of a *copy* of a record; edit through them, then `finish()` gives the rewritten record
    (JSON strings met on the way are encoded again)."""

    obj: dict[str, Any]
    messages: list[MessageSlots] = field(default_factory=list)
    # the record's tool list (edited in place), its path, and a normalised tool in the shape's own form
    tools: tuple[list[Any], str, Callable[[dict[str, Any], Any], Any]] | None = None
    finishers: list[Callable[[], None]] = field(default_factory=list)

    def value(self, holder: Any, key: Any) -> Any:
        """`holder[key]`; a JSON string there is decoded, edited as an object and encoded again by `finish`."""
        v = holder[key] if isinstance(holder, list) else holder.get(key)
        if isinstance(v, str) and v[:1] in "[{":
            try:
                d = orjson.loads(v)
            except orjson.JSONDecodeError:
                return v
            self.finishers.append(lambda: holder.__setitem__(key, orjson.dumps(d).decode()))
            return d
        return v

    def add(self, slots: list[Slot], append: Callable[[str], None] | None = None) -> None:
        self.messages.append(MessageSlots(slots, append))

    def parts(self, holder: Any, key: Any, path: str, text_key: str = "text", new_type: str = "text") -> None:
        """One message whose content is `holder[key]`: a string, or a list of parts (text parts are slots).
        A string is the text itself, even when it holds JSON (the converters never decode content)."""
        content = holder.get(key)
        if isinstance(content, str):
            self.add([Slot(holder, key, path)])
        elif isinstance(content, list):
            self.add([Slot(p, text_key, f"{path}[{i}].{text_key}") for i, p in enumerate(content)
                      if isinstance(p, dict) and _is_text(p) and isinstance(p.get(text_key), str)],
                     lambda t: content.append({"type": new_type, text_key: t}))
        else:
            self.add([])

    def spans(self, mi: int, text: str) -> list[tuple[int, int, Slot]] | None:
        """Where each raw string of message `mi` sits in its normalised `text`; None when one is not found."""
        out, pos = [], 0
        for s in self.messages[mi].slots:
            t = s.text
            j = text.find(t, pos)
            if j < 0:
                return None
            out.append((j, j + len(t), s))
            pos = j + len(t)
        return out

    def locate(self, mi: int, text: str, offset: int) -> tuple[str, int] | None:
        """The record's own field and char offset of `offset` in normalised message `mi` (for fix hints)."""
        if not 0 <= mi < len(self.messages):
            return None
        for s, e, slot in self.spans(mi, text) or []:
            if s <= offset < e or s == offset == e:
                return slot.path, offset - s
        return None

    def write_text(self, mi: int, old: str, new: str) -> bool:
        """Make message `mi`'s text `new` (it was `old`) by editing its raw strings: each changed region must
        lie inside one raw string (or be added at the end); False, with nothing changed, when one does not."""
        if not 0 <= mi < len(self.messages):
            return False
        spans = self.spans(mi, old)
        if spans is None:
            return False
        ms = self.messages[mi]
        if len(spans) == 1 and spans[0][:2] == (0, len(old)):  # one raw string holds the whole text
            spans[0][2].holder[spans[0][2].key] = new
            return True
        regions = _regions(old, new)
        plan: list[tuple[int, int, int, str]] = []  # (span index or -1 = append, start, end, replacement)
        for i1, i2, repl in regions:
            at = next((k for k, (s, e, _) in enumerate(spans) if s <= i1 and i2 <= e), None)
            if at is None:  # a diff places an insertion or deletion anywhere in a run of equal text: slide it
                i1, i2, repl, at = _slide(old, i1, i2, repl, spans)
            if at is None:
                if not (i1 == i2 == len(old) and ms.append is not None):
                    return False
                plan.append((-1, i1, i2, repl))
            else:
                plan.append((at, i1 - spans[at][0], i2 - spans[at][0], repl))
        for at, i1, i2, repl in sorted(plan, key=lambda p: (p[0] < 0, -p[1], -p[2])):
            if at < 0:
                ms.append(repl)  # type: ignore[misc]
            else:
                slot = spans[at][2]
                t = slot.text
                slot.holder[slot.key] = t[:i1] + repl + t[i2:]
        return True

    def write_tools(self, old: list[Any], new: list[Any]) -> bool:
        """Make the tool list `new` (normalised; it was `old`): unchanged tools keep their raw bytes, changed
        ones are written in the shape's own form."""
        if self.tools is None:
            return False
        raw, _, to_raw = self.tools
        if len(raw) != len(old) or len(new) != len(old):
            return False
        free = list(range(len(old)))
        out = []
        for j, t in enumerate(new):
            k = next((k for k in free if old[k] == t), None)
            if k is None:
                out.append(to_raw(t, raw[j]))
            else:
                free.remove(k)
                out.append(raw[k])
        raw[:] = out
        return True

    def finish(self) -> dict[str, Any]:
        for f in reversed(self.finishers):  # innermost JSON string first
            f()
        self.finishers.clear()
        return self.obj


def _is_text(p: dict[str, Any]) -> bool:
    from prefixscan.media import MEDIA_KINDS, is_text_part

    return is_text_part(p) and p.get("type") not in MEDIA_KINDS


def _blocks(blocks: list[Any], path: str) -> list[Slot]:
    """Slots of a list joined by `_parts_text` (dict parts of type text or none, and plain strings)."""
    out = []
    for i, p in enumerate(blocks):
        if isinstance(p, str):
            out.append(Slot(blocks, i, f"{path}[{i}]"))
        elif isinstance(p, dict) and p.get("type") in (None, "text"):
            tk = "content" if "content" in p else "text"
            if isinstance(p.get(tk), str):
                out.append(Slot(p, tk, f"{path}[{i}].{tk}"))
    return out


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
        pm.add([Slot(h, k, path)] if isinstance(system, str) else _blocks(system, path)
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


def _slide(old: str, i1: int, i2: int, repl: str, spans: list[tuple[int, int, Slot]]
           ) -> tuple[int, int, str, int | None]:
    """The same pure insertion or deletion moved along equal characters until it fits in one span."""
    def fits(a: int, b: int) -> int | None:
        return next((k for k, (s, e, _) in enumerate(spans) if s <= a and b <= e), None)

    if i1 == i2 or not repl:
        for step in (1, -1):
            a, b, r = i1, i2, repl
            while True:
                if step == 1 and b < len(old) and (old[a] == old[b] if not r else r[0] == old[a]):
                    a, b, r = (a + 1, b + 1, r) if not r else (a + 1, b + 1, r[1:] + old[a])
                elif step == -1 and a > 0 and (old[a - 1] == old[b - 1] if not r else r[-1] == old[a - 1]):
                    a, b, r = (a - 1, b - 1, r) if not r else (a - 1, b - 1, old[a - 1] + r[:-1])
                else:
                    break
                if (k := fits(a, b)) is not None:
                    return a, b, r, k
    return i1, i2, repl, None


def _regions(old: str, new: str) -> list[tuple[int, int, str]]:
    """The changed regions of `old` (start, end, replacement) that make `new`: one region when the change is
    a single edit, else a diff by lines (moves take whole lines) refined by characters inside small
    changed runs. Bounded: a long run without line breaks stays one region (then it may not fit a slot)."""
    a, b = common_affixes(old, new)
    if len(old) - b - a <= 0 or len(new) - b - a <= 0:
        return [(a, len(old) - b, new[a:len(new) - b])]
    import difflib

    la, lb = old.splitlines(keepends=True), new.splitlines(keepends=True)
    oa, ob = [0], [0]
    for x in la:
        oa.append(oa[-1] + len(x))
    for x in lb:
        ob.append(ob[-1] + len(x))
    out = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, la, lb, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        s0, e0, s1, e1 = oa[i1], oa[i2], ob[j1], ob[j2]
        if tag == "replace" and max(e0 - s0, e1 - s1) <= CHAR_DIFF_MAX:
            out += [(s0 + x1, s0 + x2, new[s1 + y1:s1 + y2]) for op, x1, x2, y1, y2 in difflib.SequenceMatcher(
                None, old[s0:e0], new[s1:e1], autojunk=False).get_opcodes() if op != "equal"]
        else:
            out.append((s0, e0, new[s1:e1]))
    return out


CHAR_DIFF_MAX = 4096  # characters of a changed run diffed by character (quadratic at worst)
