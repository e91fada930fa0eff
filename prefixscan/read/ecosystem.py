"""Log shapes of the wider ecosystem, converted to the chat shape before normalisation.

One module per ecosystem, each with its converter (`*_to_chat`) and that converter inverted for `fix`
(`*_map`, on the slots of `read/promptmap.py`):
- `read/otel.py`: OpenTelemetry GenAI spans;
- `read/anthropic.py`: Anthropic Messages API logs;
- `read/responses.py`: OpenAI Responses API logs.

Each converter returns a plain chat record (`messages`, `tools`, `model`, `timestamp`, `request_id`,
`conversation_id`, `output_tokens`, `actual_cached_tokens`, `reported_prompt_tokens`), so the rest of the
pipeline knows one shape; a record that lacks what its conversion needs raises `read/record.py`'s
RecordError (a reject). This module holds what they share.
"""

from __future__ import annotations

from typing import Any

import orjson


def json_value(value: Any) -> Any:
    """Decode a JSON string (attributes often carry structured values as strings); anything else as is."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def parts_text(parts: Any) -> str:
    if isinstance(parts, str):
        return parts
    texts = []
    for p in parts or []:
        if isinstance(p, dict) and p.get("type") in (None, "text"):
            texts.append(str(p.get("content", p.get("text", ""))))
        elif isinstance(p, str):
            texts.append(p)
    return "".join(texts)
