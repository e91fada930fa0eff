"""Record shapes users bring, detected per file, and the mapping of their fields to one Record.

Shapes: bare OpenAI chat bodies (also LiteLLM's StandardLoggingPayload), OpenAI batch input lines,
gateway logs with `request`/`response` objects, completions (`prompt`), pre-tokenised ids, and hashed
traces (Mooncake, Alibaba bailian). Field names were checked against each format's documentation.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from prefixscan.read import latency, record
from prefixscan.read.anthropic import anthropic_to_chat, is_anthropic
from prefixscan.read.content import content_text, json_text
from prefixscan.read.fielduse import CONVERTED_KEYS, TRACE_UNITS, FieldUse
from prefixscan.read.media import MEDIA_KINDS, has_media, is_text_part
from prefixscan.read.otel import is_genai_span, otel_to_chat
from prefixscan.read.readers import default_request_id
from prefixscan.read.record import CONTENT_FIELDS, FIELD_CANDIDATES, FieldPlans, Plan, Record, RecordError, get_path
from prefixscan.read.responses import is_responses, responses_to_chat
from prefixscan.read.timestamps import describe_timestamp, parse_timestamp
from prefixscan.redact import field_name, reject_detail

FORMATS = ("auto", "chat", "openai-batch", "gateway", "completion", "tokens", "mooncake", "bailian", "otel",
           "anthropic", "responses")
# Shapes with no clock of their own: input order is their time (one request a second, said in the summary).
# A record of another shape with no timestamp is accepted the same way under --order input or in a file
# whose first record has none (read.Reader), and rejected `missing_timestamp` in a file whose records have one.
CLOCKLESS = ("openai-batch",)
NO_CLOCK = object()

# Latency columns (seconds) are mapped by a name that says the log's unit: ttft_ms, queue_wait_s, ... (latency.py)
FIELDS = tuple(FIELD_CANDIDATES) + CONTENT_FIELDS + tuple(latency.MAPPABLE)


def detect(obj: dict[str, Any]) -> str:
    """Name the shape of one parsed record (the first good record of a file decides for the file)."""
    if "hash_ids" in obj:
        return "bailian" if "chat_id" in obj or "parent_chat_id" in obj else "mooncake"
    if "custom_id" in obj and isinstance(obj.get("body"), (dict, str)):
        return "openai-batch"
    if is_genai_span(obj):
        return "otel"
    usage = obj["usage"] if isinstance(obj.get("usage"), dict) else {}
    if "messages" in obj and is_anthropic(obj, usage):
        return "anthropic"
    if is_responses(obj, usage):
        return "responses"
    if isinstance(obj.get("request"), (dict, str)) and ("response" in obj or "messages" not in obj):
        return "gateway"
    if "messages" in obj:
        return "chat"
    if "prompt_token_ids" in obj or "token_ids" in obj:
        return "tokens"
    if "prompt" in obj:
        return "completion"
    raise RecordError("unknown_shape", "record has none of messages, prompt, prompt_token_ids, "
                      "token_ids, hash_ids, request or body; pass --format")


def _decoded(value: Any, name: str, what: str = "JSON") -> Any:
    """A value some logs store as a JSON string, decoded (any other value as it is)."""
    if not isinstance(value, str):
        return value
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        raise RecordError("wrong_type", f"`{name}` is a string that is not {what}") from None


def _as_obj(value: Any, name: str) -> dict[str, Any]:
    value = _decoded(value, name)
    if not isinstance(value, dict):
        raise RecordError("wrong_type", f"`{name}` should be an object, got {type(value).__name__}")
    return value


MAX_COUNT = 2**31 - 1  # token counts and turn numbers: no context holds more; sums stay far inside int64
MAX_TIMESTAMP_S = 253402300799.0  # 9999-12-31T23:59:59Z: anything later is a unit or parse mistake


def _int_or_none(value: Any, field: str) -> int | None:
    """A count field: None, or an integer in [0, MAX_COUNT] (integral floats and digit strings too)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise RecordError("wrong_type", f"`{field}` should be an integer, got a boolean")
    if isinstance(value, float):
        if not value.is_integer():
            raise RecordError("wrong_type", reject_detail(field, "should be an integer", value))
        value = int(value)
    elif isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 19:
        value = int(value)
    elif not isinstance(value, int):
        raise RecordError("wrong_type", reject_detail(field, "should be an integer", value))
    if value < 0:
        raise RecordError("out_of_range", reject_detail(field, "is negative", value))
    if value > MAX_COUNT:
        raise RecordError("out_of_range", reject_detail(field, f"is beyond {MAX_COUNT:,}", value))
    return value


def check_timestamp(ts: float, raw: Any) -> float:
    """A parsed timestamp must be finite, not negative, and before year 10000: NaN or 1e300 would poison
    every later duration and rate."""
    if ts != ts or ts in (float("inf"), float("-inf")):
        raise RecordError("bad_timestamp", reject_detail("timestamp", "is not finite", raw))
    if ts < 0:
        raise RecordError("bad_timestamp", reject_detail("timestamp", "is negative", raw))
    if ts > MAX_TIMESTAMP_S:
        raise RecordError("bad_timestamp", reject_detail("timestamp", "is after year 9999 (wrong unit?)", raw))
    return ts


def _tools(body: dict[str, Any]) -> list[Any] | None:
    tools = body.get("tools")
    if tools is None:  # LiteLLM's StandardLoggingPayload keeps them with the call's parameters
        tools = get_path(body, "model_parameters.tools")
    if isinstance(tools, str) and not tools.strip():
        return None
    tools = _decoded(tools, "tools")
    if tools is not None and not isinstance(tools, list):
        raise RecordError("wrong_type", "`tools` should be a list")
    return json_checked(tools, "`tools`") if tools else None


def _str_or_none(value: Any, name: str = "a field") -> str | None:
    if value is None or value == "":
        return None
    if isinstance(value, (dict, list)):
        try:
            return json_text(value, sort_keys=True)
        except (orjson.JSONEncodeError, TypeError):
            raise RecordError("wrong_type", f"`{name}` holds a value that cannot be written as JSON (nested too "
                              "deeply, or of a type JSON has no place for)") from None
    if isinstance(value, bytes):
        return json_text(value)[1:-1] if value else None
    return str(value)


def json_checked(value: Any, what: str) -> Any:
    """A value later stages write as JSON (tools, a message with tool calls or parts): as is when orjson can
    write it; values JSON has no type for (bytes, decimals from Parquet) become JSON values by the
    renderer's own rule (`read.content.json_default`); nested deeper than orjson writes (about 250 levels),
    a `wrong_type` reject here rather than a crash in whichever stage writes it first."""
    try:
        orjson.dumps(value)
        return value
    except orjson.JSONEncodeError as exc:
        if "ecursion" in str(exc):
            raise RecordError("wrong_type", f"{what} is nested too deeply to be written as JSON") from None
    try:
        return orjson.loads(json_text(value))
    except (orjson.JSONEncodeError, orjson.JSONDecodeError, TypeError):
        raise RecordError("wrong_type", f"{what} holds a value that cannot be written as JSON") from None


def _unwrap(obj: dict[str, Any], shape: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(body carrying the prompt, response usage holder or {}) for each wrapper shape."""
    if shape == "openai-batch":
        return _as_obj(obj.get("body"), "body"), {}
    if shape == "gateway":
        resp = obj.get("response")
        return _as_obj(obj.get("request"), "request"), _as_obj(resp, "response") if resp else {}
    return obj, {}


def _check_messages(messages: Any) -> list[dict[str, Any]]:
    messages = _decoded(messages, "messages")
    if not isinstance(messages, list):
        raise RecordError("wrong_type", f"`messages` should be a list, got {type(messages).__name__}")
    if not messages:
        raise RecordError("empty_messages", "`messages` is empty")
    messages = list(messages)  # checked values and media placeholders go into a copy: the record stays as read
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RecordError("bad_message", f"message {i} has no string `role`")
        c = m.get("content")
        if c is not None and not isinstance(c, (str, list)):
            raise RecordError("bad_message", f"message {i} content should be a string or a list of parts")
        if isinstance(c, list) or len(m) > 3 or not m.keys() <= _PLAIN_MESSAGE:  # tool calls, parts: written as JSON
            messages[i] = json_checked(m, f"message {i}")
    return messages


_PLAIN_MESSAGE = {"role", "content", "name"}


def _flatten_media(messages: list[dict[str, Any]]) -> int:
    """Media parts become placeholders with their content id here, for every tokenizer and stage, and
    the bytes and URLs go no further (read/media.py). Returns how many were of a known media kind."""
    n = 0
    for i, m in enumerate(messages):
        c = m.get("content")
        if has_media(c):
            n += sum(1 for p in c if isinstance(p, dict) and not is_text_part(p) and p.get("type") in MEDIA_KINDS)
            messages[i] = {**m, "content": content_text(c)}
    return n


def _int_list(value: Any, field: str) -> np.ndarray:
    """A JSON list of integers as an int64 array (validated in C: no per-element Python checks)."""
    value = _decoded(value, field, "a JSON list")
    if not isinstance(value, list) or (value and set(map(type, value)) != {int}):  # bools are not ids
        raise RecordError("wrong_type", f"`{field}` should be a list of integers")
    try:
        return np.asarray(value, dtype=np.int64)
    except OverflowError:
        raise RecordError("wrong_type", f"`{field}` holds integers beyond 64 bits") from None


TRACE_FIELDS = {"mooncake": {"timestamp", "input_length", "output_length", "hash_ids"},
                "bailian": {"chat_id", "parent_chat_id", "turn", "type", "timestamp", "input_length",
                            "output_length", "hash_ids"}}


_PLANS = FieldPlans({**FIELD_CANDIDATES, **latency.PATHS})  # latency columns planned with the fields


def _lookup(field: str, holders: tuple[dict[str, Any], ...], outer: dict[str, Any],
            overrides: dict[str, str], plan: Plan) -> tuple[Any, str | None]:
    """The first non-null candidate of `field` (an override names its one path), trying only the candidates
    the holders' layout can match (`record.FieldPlans`), and the path it came from (None when none matched)."""
    if field in overrides:
        v = get_path(outer, overrides[field])
        return v, overrides[field] if v is not None else None
    for path, dotted, i in plan[field]:
        v = get_path(holders[i], path) if dotted else holders[i].get(path)
        if v is not None:
            return v, path
    return None, None


def normalise(obj: dict[str, Any], shape: str, source_file: str, line: int,
              overrides: dict[str, str], bailian_roots: dict[Any, Any] | None = None,
              use: FieldUse | None = None) -> Record:
    """Map one parsed record of a known shape to a Record, or raise RecordError saying why not.

    A record with no timestamp gets NaN: whether that is accepted is the read stage's decision (its place
    in input order becomes its time for a shape with no clock, under `--order input`, or in a file whose
    first record had none; otherwise it raises `missing_timestamp()`). `use`, when given, counts which log
    key each summarised field came from."""
    original_shape = shape
    obj, shape = _convert(obj, shape, bailian_roots if bailian_roots is not None else {})
    body, resp = _unwrap(obj, shape)
    if overrides and any(k in overrides for k in CONTENT_FIELDS):
        body = {**body, **{k: get_path(obj, overrides[k]) for k in CONTENT_FIELDS if k in overrides}}
    holders = (body,) if body is obj else (body, obj)
    if resp:
        holders += ({"usage": resp.get("usage")},)
    kind, content = _content(obj, body, shape)

    if kind == "hashed" and not overrides:
        rec = _trace_record(obj, shape, source_file, line, content, bailian_roots)
        if use is not None:
            use.add({"timestamp": "timestamp", "conversation_id": "parent_chat_id" if shape == "bailian" else None,
                     "tenant": None, "replica": None}, TRACE_UNITS[shape], keys=obj)
        return rec
    plan = _PLANS.plan(holders)
    where: dict[str, str | None] = {}
    ts_raw, where["timestamp"] = _lookup("timestamp", holders, obj, overrides, plan)
    if ts_raw is None:
        ts_raw = NO_CLOCK
    ts = _timestamp(ts_raw, shape, overrides)

    rid = _lookup("request_id", holders, obj, overrides, plan)[0]
    rec = Record(source_file=source_file, source_line=line,
                 request_id=str(rid) if rid is not None else default_request_id(source_file, line),
                 timestamp_s=ts, kind=kind, **content)
    for name in record.STRING_FIELDS:
        value, found = _lookup(name, holders, obj, overrides, plan)
        if use is not None and (name in FieldUse.TRACKED or name in overrides):
            where[name] = found
        setattr(rec, name, _str_or_none(value, name))
    if shape == "bailian":
        rec.category = _str_or_none(obj.get("type"))
        rec.conversation_id = _bailian_root(obj, bailian_roots if bailian_roots is not None else {})
        where["conversation_id"] = "parent_chat_id" if rec.conversation_id is not None else None
    rec.ttft_s, rec.e2e_s, rec.queue_wait_s = latency.read(holders, obj, overrides, original_shape == "otel",
                                                            plan, where if use is not None else None)
    if use is not None:
        if original_shape in CONVERTED_KEYS:  # the converter's keys, named by where it took them from
            where = {f: CONVERTED_KEYS[original_shape].get(f, p) if p is not None and f not in overrides else p
                     for f, p in where.items()}
        for name in overrides:  # the other mapped fields: found or not
            if name not in where and (name in FIELD_CANDIDATES or name in latency.MAPPABLE):
                where[name] = overrides[name] if get_path(obj, overrides[name]) is not None else None
        use.add(where, describe_timestamp(ts_raw) if ts_raw is not NO_CLOCK else "input order", keys=obj,
                converted=shape != original_shape)
    for name in ("turn_index", "output_tokens", "actual_cached_tokens", "reported_prompt_tokens"):
        setattr(rec, name, _int_or_none(_lookup(name, holders, obj, overrides, plan)[0], name))
    return rec


def _content(obj: dict[str, Any], body: dict[str, Any], shape: str) -> tuple[str, dict[str, Any]]:
    """(kind, Record fields of the prompt) of a record: hashed blocks, chat messages, a completion prompt or
    token ids; RecordError when the shape's prompt is missing or of the wrong type."""
    if shape in ("mooncake", "bailian"):
        hash_ids = _int_list(obj.get("hash_ids"), "hash_ids")
        n = _int_or_none(obj.get("input_length"), "input_length")
        if n is None:
            raise RecordError("missing_field", "hashed trace record has no `input_length`")
        kind, content = "hashed", {"hash_ids": hash_ids, "input_length": n}
    elif shape in ("chat", "openai-batch", "gateway") and "messages" in body:
        msgs = list(_check_messages(body.get("messages")))  # a copy: media flattening must not edit the record
        kind, content = "chat", {"messages": msgs, "tools": _tools(body), "media_items": _flatten_media(msgs)}
    elif "prompt" in body and shape in ("completion", "openai-batch", "gateway", "chat"):
        p = body.get("prompt")
        if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            kind, content = "tokens", {"token_ids": _int_list(p, "prompt")}
        elif isinstance(p, str):
            if not p:
                raise RecordError("empty_prompt", "`prompt` is empty")
            kind, content = "completion", {"prompt": p}
        else:
            raise RecordError("wrong_type", "`prompt` should be a string or a list of token ids")
    elif shape == "tokens" or "prompt_token_ids" in body or "token_ids" in body:
        key = "prompt_token_ids" if "prompt_token_ids" in body else "token_ids"
        ids = _int_list(body.get(key), key)
        if len(ids) == 0:
            raise RecordError("empty_prompt", f"`{key}` is empty")
        kind, content = "tokens", {"token_ids": ids}
    else:
        raise RecordError("missing_field", f"a {shape} record needs `messages` (or `prompt`); found keys "
                          f"{', '.join(field_name(str(k)) for k in sorted(body)[:8])}")
    return kind, content


def _timestamp(ts_raw: Any, shape: str, overrides: dict[str, str]) -> float:
    """The arrival time in epoch seconds (NaN without a clock: ingest orders such records by input);
    Mooncake and bailian timestamps are relative, in ms and s."""
    try:
        ts = float("nan") if ts_raw is NO_CLOCK else parse_timestamp(ts_raw)
        if shape == "mooncake" and "timestamp" not in overrides:
            ts = float(ts_raw) / 1000.0  # Mooncake timestamps are relative milliseconds
        elif shape == "bailian" and "timestamp" not in overrides:
            ts = float(ts_raw)  # bailian timestamps are relative seconds
    except (ValueError, TypeError, OverflowError):  # the message may quote the value: say its kind only
        why = "is neither ISO-8601, RFC 2822 nor an epoch number"
        raise RecordError("bad_timestamp", reject_detail("timestamp", why, ts_raw)) from None
    if ts_raw is not NO_CLOCK:  # no clock: NaN on purpose, ingest gives it its place in input order
        check_timestamp(ts, ts_raw)
    return ts


def ecosystem_kind(obj: dict[str, Any], shape: str
                   ) -> tuple[str | None, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Which converter a record goes through ("otel", "anthropic", "responses" or None), with its body, the
    response (or {}) and the usage: one decision for `_convert` and `prompt_map`, so the two cannot drift."""
    if shape == "otel":
        return "otel", obj, {}, {}
    if shape not in ("anthropic", "responses", "gateway", "openai-batch"):
        return None, obj, {}, {}
    body, resp = _unwrap(obj, shape)
    usage = next((u for u in (resp.get("usage"), body.get("usage"), obj.get("usage")) if isinstance(u, dict)), {})
    if shape == "anthropic" or ("messages" in body and is_anthropic(body, usage)):
        return "anthropic", body, resp, usage
    if shape == "responses" or is_responses(body, usage):
        return "responses", body, resp, usage
    return None, body, resp, usage


def missing_timestamp(overrides: dict[str, str]) -> RecordError:
    """The reject of a record with no timestamp in a log whose records have one (read.Reader decides)."""
    if "timestamp" in overrides:
        return RecordError("missing_timestamp", "the --field timestamp path is absent from this record")
    return RecordError("missing_timestamp", "no timestamp field (tried "
                       f"{', '.join(FIELD_CANDIDATES['timestamp'][:5])}...); map one with --field timestamp=PATH, "
                       "or pass --order input to time records by their order")


def _convert(obj: dict[str, Any], shape: str, roots: dict[Any, Any]) -> tuple[dict[str, Any], str]:
    """Ecosystem shapes (OTel spans, Anthropic, Responses; also inside gateway or batch wrappers) as chat."""
    if shape == "chat":  # the hot path: a bare chat file is never converted
        return obj, shape
    try:
        kind, body, resp, usage = ecosystem_kind(obj, shape)
        if kind == "otel":
            return {**obj, **_present(otel_to_chat(obj))}, "chat"
        if kind == "anthropic":
            return {**obj, **_present(anthropic_to_chat(body, usage))}, "chat"
        if kind == "responses":
            return {**obj, **_present(responses_to_chat(body, usage, resp or obj, roots))}, "chat"
    except RecordError:
        raise
    except (TypeError, AttributeError, ValueError) as exc:  # the message may quote a value: its type only
        raise RecordError("wrong_type", f"a {shape} record has an unexpected structure "
                                        f"({type(exc).__name__})") from None
    return obj, shape


WRAPPER_KEYS = {"openai-batch": "body", "gateway": "request"}


def _present(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _trace_record(obj: dict[str, Any], shape: str, source_file: str, line: int, content: dict[str, Any],
                  bailian_roots: dict[Any, Any] | None) -> Record:
    """Hashed traces have fixed field names: read them directly (the generic lookup costs more than the
    rest of the record). Extra fields (request_id, tenant, ...) still go through the generic lookup."""
    ts_raw = obj.get("timestamp")
    if ts_raw is None:
        raise RecordError("missing_timestamp", f"{shape} record has no `timestamp`")
    if isinstance(ts_raw, bool) or not isinstance(ts_raw, (int, float)):
        raise RecordError("bad_timestamp", f"{shape} `timestamp` should be a number, got {type(ts_raw).__name__}")
    try:
        ts = float(ts_raw) / 1000.0 if shape == "mooncake" else float(ts_raw)  # ms vs s (docs/engines.md)
    except OverflowError:
        raise RecordError("bad_timestamp", reject_detail("timestamp", f"is out of range for {shape}", ts_raw)) from None
    check_timestamp(ts, ts_raw)
    rid = obj.get("request_id")
    rec = Record(source_file=source_file, source_line=line,
                 request_id=str(rid) if rid is not None else default_request_id(source_file, line), timestamp_s=ts,
                 kind="hashed", **content)
    rec.output_tokens = _int_or_none(obj.get("output_length"), "output_length")
    if len(obj) > len(TRACE_FIELDS[shape]) or rid is not None:
        holders = (obj,)
        plan = _PLANS.plan(holders)
        for name in record.STRING_FIELDS:
            setattr(rec, name, _str_or_none(_lookup(name, holders, obj, {}, plan)[0]))
        rec.actual_cached_tokens = _int_or_none(_lookup("actual_cached_tokens", holders, obj, {}, plan)[0],
                                                "actual_cached_tokens")
    if shape == "bailian":
        rec.category = _str_or_none(obj.get("type"))
        rec.turn_index = _int_or_none(obj.get("turn"), "turn")
        rec.conversation_id = _bailian_root(obj, bailian_roots if bailian_roots is not None else {})
        if rid is None and obj.get("chat_id") is not None:
            rec.request_id = str(obj["chat_id"])
    return rec


def _bailian_root(obj: dict[str, Any], roots: dict[Any, Any]) -> str | None:
    """A bailian conversation is the chain of parent_chat_id links back to its first turn."""
    chat, parent = obj.get("chat_id"), obj.get("parent_chat_id")
    if chat is None:
        return None
    for name, v in (("chat_id", chat), ("parent_chat_id", parent)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, str))):
            raise RecordError("wrong_type", f"bailian `{name}` should be an integer or a string")
    root = roots.get(parent, parent) if parent not in (None, -1, "-1", "") else chat
    roots[chat] = root
    return str(root)
