"""Multimodal content parts: which parts are media, and a content identifier for each (docs/analyze.md,
"Multimodal content").

Each media item renders as a short placeholder with its own content identifier (`read.content.content_text`),
so equal media give equal text and different media diverge there, as vLLM keys an item by a hash of its
content. The identifier is xxh3-128 of the media bytes (base64 data and data URLs decoded), or of the URL
or file id when the log holds no bytes; only the identifier enters prompts and outputs.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, TypeGuard

import orjson
import xxhash

TEXT_TYPES = ("text", "input_text", "output_text")
# part type -> media kind, for the OpenAI chat / Responses, vLLM and Anthropic part shapes
MEDIA_KINDS = {
    "image_url": "image", "input_image": "image", "image": "image", "image_pil": "image", "image_embeds": "image",
    "input_audio": "audio", "audio_url": "audio", "audio": "audio",
    "video_url": "video", "video": "video",
    "file": "file", "input_file": "file", "document": "file",
}
# where a part's payload lives, most specific first (nested objects are searched with the same names)
PAYLOAD_KEYS = ("data", "file_data", "url", "image_url", "audio_url", "video_url", "input_audio", "file",
                "source", "file_id", "image", "audio", "video", "uuid")
ID_HEX = 16  # hex characters of the identifier in a placeholder (64 bits)


def drop_nulls(part: dict[str, Any]) -> dict[str, Any]:
    """A part without its null fields: Parquet struct columns give every part every field of the union."""
    return {k: v for k, v in part.items() if v is not None}


def is_text_part(part: dict[str, Any]) -> bool:
    """A text part (its `text` is what the template renders)."""
    t = part.get("type")
    return t in TEXT_TYPES or (t not in MEDIA_KINDS and isinstance(part.get("text"), str))


def has_media(content: Any) -> TypeGuard[list[Any]]:
    """Whether a message's content (a list of parts) holds a media part."""
    return isinstance(content, list) and any(isinstance(p, dict) and not is_text_part(p) for p in content)


def media_kind(part: dict[str, Any]) -> str:
    """"image", "audio", "video", "file", or the part's own type for kinds prefixscan does not know."""
    t = str(part.get("type") or "part")
    return MEDIA_KINDS.get(t, t)


MAX_DEPTH = 64  # payload nesting searched (real parts nest 1-3 levels): a hostile part cannot exhaust the stack


def _payload(obj: Any) -> tuple[str, Any] | None:
    """(field, value) of the innermost payload of a part or of a nested object: the first string or bytes
    found depth first through PAYLOAD_KEYS, named by the key that holds it. Iterative and bounded by
    MAX_DEPTH, so no nesting can exhaust the stack."""
    stack: list[tuple[Any, str, int]] = [(obj, "value", 0)]
    while stack:
        cur, field, depth = stack.pop()
        if isinstance(cur, str | bytes):
            return field, cur
        if not isinstance(cur, dict) or depth >= MAX_DEPTH:
            continue
        cur = drop_nulls(cur)
        stack.extend((cur[k], k, depth + 1) for k in reversed(PAYLOAD_KEYS) if k in cur)
    return None


def _bytes_of(field: str, value: str | bytes) -> bytes:
    """The media bytes a payload names: base64 decoded (data URLs too), else the string itself (a URL)."""
    if isinstance(value, bytes):
        return value
    if value.startswith("data:"):
        _, sep, data = value.partition(",")
        if sep and ";base64" in value[: len(value) - len(data)]:
            try:
                return base64.b64decode(data, validate=False)
            except (binascii.Error, ValueError):
                pass
        return value.encode("utf-8", "surrogatepass")
    if field in ("data", "file_data"):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            pass
    return value.encode("utf-8", "surrogatepass")


def media_identifier(part: dict[str, Any]) -> str:
    """Hex xxh3-128 of the part's media content: equal media, equal id; options such as `detail` or a
    `filename` do not change it (vLLM's mm hash depends on the content, not on how it was asked for)."""
    part = drop_nulls(part)
    found = _payload({k: v for k, v in part.items() if k != "type"})
    if found is None:  # an unknown shape: the whole part, keys sorted, stands for its content
        try:
            raw = orjson.dumps(part, option=orjson.OPT_SORT_KEYS, default=str)
        except orjson.JSONEncodeError:  # nested past orjson's depth limit: its repr-free shape, bounded
            raw = _shape_bytes(part)
    else:
        raw = _bytes_of(*found)
    return xxhash.xxh3_128_hexdigest(raw)


def placeholder(part: dict[str, Any]) -> str:
    """The text a media part renders as: its kind and identifier, e.g. `<image:3f2a9c0d41b7e655>`."""
    return f"<{media_kind(part)}:{media_identifier(part)[:ID_HEX]}>"


def _shape_bytes(part: Any) -> bytes:
    """A deterministic byte string for a part too deep to write as JSON: its leaves in depth-first order,
    with their key paths' depth (iterative, so any depth is safe)."""
    out: list[str] = []
    stack: list[tuple[Any, int]] = [(part, 0)]
    while stack:
        cur, depth = stack.pop()
        if isinstance(cur, dict):
            stack.extend((v, depth + 1) for _, v in sorted(cur.items(), key=lambda kv: str(kv[0]), reverse=True))
            out.append(f"{{{depth}:" + ",".join(sorted(map(str, cur))))
        elif isinstance(cur, list | tuple):
            stack.extend((v, depth + 1) for v in reversed(cur))
            out.append(f"[{depth}:{len(cur)}")
        else:
            out.append(f"{depth}:{cur!s}")
    return "\x00".join(out).encode("utf-8", "surrogatepass")
