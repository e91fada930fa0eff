"""A message's content, and any value a record holds, as text: one rule for the read stage and the renderer.

The read stage (`read.shapes`) and the chat renderer (`encode.render`) both turn content into text; they
use these functions so a record renders the same whichever reads it. The ecosystem converters share
`json_value` and `parts_text`.
"""

from __future__ import annotations

import base64
import datetime as dt
from decimal import Decimal
from typing import Any

import orjson

from prefixscan.read.media import is_text_part, placeholder


def json_default(obj: Any) -> Any:
    """orjson's `default` for values a Parquet row can hold and JSON has no type for: bytes as UTF-8 text
    (else `base64:...`), a Decimal as its exact number, a duration in seconds, a set as a sorted list. The
    read stage (`shapes.json_checked`) and the renderer use this one rule, so a record renders the same
    whichever reads it; anything else is a TypeError, as without it."""
    if isinstance(obj, bytes | bytearray | memoryview):
        raw = bytes(obj)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(raw).decode("ascii")
    if isinstance(obj, Decimal):
        return orjson.Fragment(str(obj)) if obj.is_finite() else str(obj)
    if isinstance(obj, dt.timedelta):
        return obj.total_seconds()
    if isinstance(obj, set | frozenset):
        return sorted(obj, key=repr)
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def json_text(value: Any, sort_keys: bool = False) -> str:
    """`value` as compact JSON text (orjson's), with `json_default` for the values JSON has no type for."""
    return orjson.dumps(value, default=json_default, option=orjson.OPT_SORT_KEYS if sort_keys else 0).decode()


def content_text(content: Any) -> str:
    """Text of a message's content: a string, or its parts in order, each media item as a placeholder
    with its content identifier (`media.placeholder`)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    out = []
    for part in content:
        if isinstance(part, dict):
            if is_text_part(part):
                out.append(str(part.get("text") or ""))
            else:
                # Multimodal item: vLLM keys it by a hash of its content, so the placeholder carries one
                # (different images diverge here, equal ones still share; no bytes or URL enter the prompt).
                out.append(placeholder(part))
        else:
            out.append(str(part))
    return "".join(out)


def json_value(value: Any) -> Any:
    """Decode a JSON string (attributes often carry structured values as strings); anything else as is."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def parts_text(parts: Any) -> str:
    """Text of an ecosystem shape's parts (OTel, Anthropic): a string, or its text parts in order."""
    if isinstance(parts, str):
        return parts
    texts = []
    for p in parts or []:
        if isinstance(p, dict) and p.get("type") in (None, "text"):
            texts.append(str(p.get("content", p.get("text", ""))))
        elif isinstance(p, str):
            texts.append(p)
    return "".join(texts)
