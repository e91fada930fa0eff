"""Plans -> request records and ground-truth records.

The request record is exactly what `analyze` reads (an OpenAI chat body with flat metadata). The truth
record says what the generator knows and a detector must rediscover: the scenario, the shared content a
request reuses, and every dynamic field with the message and character offset where it sits.
"""

from __future__ import annotations

import time
from typing import Any

from prefixscan.synth.plan import Plan


def iso_ms(epoch: float) -> str:
    """ISO-8601 UTC with milliseconds, e.g. 2026-11-29T10:15:00.123Z."""
    total_ms = int(round(epoch * 1000))
    sec, ms = divmod(total_ms, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)) + f".{ms:03d}Z"


def request_id(seq: int, prefix: str = "") -> str:
    return f"{prefix}req-{seq + 1:06d}"


def render(plan: Plan, seq: int, epoch: float, prefix: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
    """The request record and its ground-truth record."""
    messages = [{"role": role, "content": parts[0].text if len(parts) == 1 else "".join(p.text for p in parts)}
                for role, parts in plan.messages]
    fields = fields_only(plan)
    rid = request_id(seq, prefix)
    record: dict[str, Any] = {"request_id": rid, "timestamp": iso_ms(epoch + plan.time), "tenant": plan.tenant}
    if plan.conversation_id is not None:
        record["conversation_id"] = prefix + plan.conversation_id
    record["user"] = plan.user
    record["model"] = plan.model
    record["messages"] = messages
    if plan.tools is not None:
        record["tools"] = plan.tools.tools
    record["max_tokens"] = plan.max_tokens
    record["output_tokens"] = plan.output_tokens
    return record, truth(plan, rid, fields, prefix)


def truth(plan: Plan, rid: str, fields: list[dict[str, Any]], prefix: str = "") -> dict[str, Any]:
    """The ground-truth sidecar line for one request."""
    out = {
        "request_id": rid,
        "scenario": plan.scenario,
        "tenant": plan.tenant,
        "conversation_id": None if plan.conversation_id is None else prefix + plan.conversation_id,
        "turn_index": plan.turn_index,
        "template_id": plan.template_id,
        "shared_prefix": plan.shared,
        "fields": fields,
    }
    if plan.drift is not None:
        out["drift"] = plan.drift  # only when drift is configured, so older outputs stay byte-identical
    return out


def fields_only(plan: Plan) -> list[dict[str, Any]]:
    """Field truth without building message text (for the Mooncake path, where no text is written)."""
    out = []
    for i, (role, parts) in enumerate(plan.messages):
        pos = 0
        for p in parts:
            f = p.field
            if f is not None:
                out.append({"kind": f.kind, "source": f.source, "message_index": i, "role": role,
                            "char_offset": pos + f.offset, "value": f.value, "label": f.label,
                            "form": f.form, "position": f.position})
            pos += len(p.text)
    return out
