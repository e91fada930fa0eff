"""One chat log written in every shape prefixscan reads (for the `fix` shape tests): the same conversations,
so the hit rates before and after `fix` are the same numbers in every shape."""

from __future__ import annotations

import copy
import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

KEEP = ("request_id", "timestamp", "tenant", "conversation_id", "user", "model")


def _meta(r: dict[str, Any]) -> dict[str, Any]:
    return {k: r[k] for k in KEEP if k in r}


def _split(r: dict[str, Any]) -> tuple[str | None, list[dict[str, Any]]]:
    msgs = r["messages"]
    if msgs and msgs[0]["role"] == "system":
        return msgs[0]["content"], msgs[1:]
    return None, msgs


def chat(r: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(r)


def _tools(r: dict[str, Any]) -> dict[str, Any]:
    return {"tools": r["tools"]} if r.get("tools") else {}


def batch(r: dict[str, Any]) -> dict[str, Any]:
    return {"custom_id": r["request_id"], "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": r.get("model"), "messages": r["messages"], **_tools(r)}}


def gateway(r: dict[str, Any]) -> dict[str, Any]:
    return {**_meta(r), "request": {"model": r.get("model"), "messages": r["messages"], **_tools(r)},
            "response": {"usage": {"prompt_tokens": 1}}}


def gateway_string(r: dict[str, Any]) -> dict[str, Any]:
    """A gateway whose request body is stored as a JSON string."""
    g = gateway(r)
    g["request"] = json.dumps(g["request"])
    return g


def litellm(r: dict[str, Any]) -> dict[str, Any]:
    return {"id": r["request_id"], "startTime": r["timestamp"], "model": r.get("model"),
            "messages": r["messages"], "metadata": {"user_api_key_team_id": r.get("tenant"),
                                                    "session_id": r.get("conversation_id")},
            "model_parameters": {"temperature": 0, **_tools(r)}}


def _blocks(text: str, n: int = 1) -> list[dict[str, Any]]:
    """`text` as `n` Anthropic text blocks (cut at paragraph breaks)."""
    if n == 1:
        return [{"type": "text", "text": text}]
    paras = text.split("\n\n")
    k = max(1, len(paras) // n)
    cuts = ["\n\n".join(paras[:k]) + "\n\n", "\n\n".join(paras[k:])]
    return [{"type": "text", "text": c} for c in cuts if c]


def anthropic(r: dict[str, Any], system_blocks: int = 2) -> dict[str, Any]:
    system, msgs = _split(r)
    out: dict[str, Any] = {**_meta(r), "max_tokens": 256}
    if system is not None:
        out["system"] = _blocks(system, system_blocks)
        out["system"][-1]["cache_control"] = {"type": "ephemeral"}
    out["messages"] = [{"role": m["role"], "content": _blocks(m["content"])} for m in msgs]
    if r.get("tools"):
        out["tools"] = [{"name": t["function"]["name"], "description": t["function"]["description"],
                         "input_schema": t["function"]["parameters"]} for t in r["tools"]]
    return out


def anthropic_string_system(r: dict[str, Any]) -> dict[str, Any]:
    out = anthropic(r)
    if "system" in out:
        out["system"] = "".join(b["text"] for b in out["system"])
    return out


def anthropic_strings(r: dict[str, Any]) -> dict[str, Any]:
    """`system` and every message content as plain strings (the issue's log: system offsets cut messages[0])."""
    out = anthropic_string_system(r)
    out["messages"] = [{"role": m["role"], "content": m["content"][0]["text"]} for m in out["messages"]]
    return out


def anthropic_wrapped(r: dict[str, Any]) -> dict[str, Any]:
    body = anthropic(r)
    return {**_meta(r), "request": {k: v for k, v in body.items() if k not in KEEP or k == "model"},
            "response": {"usage": {"input_tokens": 1, "cache_read_input_tokens": 0, "output_tokens": 1}}}


def responses(r: dict[str, Any]) -> dict[str, Any]:
    system, msgs = _split(r)
    out: dict[str, Any] = {**_meta(r)}
    if system is not None:
        out["instructions"] = system
    out["input"] = [{"role": m["role"], "content": [{"type": "input_text" if m["role"] != "assistant"
                                                     else "output_text", "text": m["content"]}]} for m in msgs]
    return {**out, **_tools(r)}


def otel(r: dict[str, Any]) -> dict[str, Any]:
    system, msgs = _split(r)
    from prefixscan.read.timestamps import parse_timestamp

    attrs: dict[str, Any] = {"gen_ai.request.model": r.get("model"), "tenant": r.get("tenant"),
                             "gen_ai.conversation.id": r.get("conversation_id"),
                             "gen_ai.input.messages": json.dumps(
                                 [{"role": m["role"], "parts": [{"type": "text", "content": m["content"]}]}
                                  for m in msgs])}
    if r.get("tools"):
        attrs["gen_ai.tool.definitions"] = json.dumps(r["tools"])
    if system is not None:
        attrs["gen_ai.system_instructions"] = json.dumps([{"type": "text", "content": system}])
    return {"name": "chat", "spanId": r["request_id"], "startTimeUnixNano": int(parse_timestamp(r["timestamp"]) * 1e9),
            "attributes": attrs}


def otlp_lines(recs: list[dict[str, Any]], per_line: int = 3) -> list[dict[str, Any]]:
    """OTLP JSON exports: `per_line` spans a line, attributes typed as OTLP key/values."""
    out = []
    for i in range(0, len(recs), per_line):
        spans = []
        for r in recs[i:i + per_line]:
            s = otel(r)
            s["attributes"] = [{"key": k, "value": {"stringValue": str(v)}} for k, v in s["attributes"].items()
                               if v is not None]
            s["startTimeUnixNano"] = str(s["startTimeUnixNano"])
            spans.append(s)
        out.append({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]})
    return out


SHAPES: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "chat": chat, "openai-batch": batch, "gateway": gateway, "gateway-string": gateway_string, "litellm": litellm,
    "anthropic": anthropic, "anthropic-string-system": anthropic_string_system, "anthropic-strings": anthropic_strings,
    "anthropic-wrapped": anthropic_wrapped, "responses": responses, "otel": otel,
}


def write(path: Path, recs: list[dict[str, Any]], how: str = "") -> Path:
    data = b"".join(orjson.dumps(r) + b"\n" for r in recs)
    if how == "gz":
        data = gzip.compress(data, mtime=0)
    elif how == "zst":
        import pyarrow as pa

        with pa.CompressedOutputStream(str(path), "zstd") as out:
            out.write(data)
        return path
    path.write_bytes(data)
    return path


def parquet(path: Path, recs: list[dict[str, Any]], nested: bool) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{**_meta(r), "messages": r["messages"] if nested else json.dumps(r["messages"]),
             "tools": json.dumps(r["tools"]) if r.get("tools") else None} for r in recs]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
