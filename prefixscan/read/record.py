"""One request as every stage after the read stage sees it (`Record`), and where its fields are found.

`FIELD_CANDIDATES` lists, per field, the paths tried in order on a record of any shape (the unwrapped
record, then the outer one); `--field NAME=PATH` replaces them. `get_path` reads such a path.

`FieldPlans` says which candidate paths of each field can match a record of a given layout (the keys of
each holder object), since trying all ~70 candidates per record is costly: a candidate can only be non-null
when its first path part is a key of the holder. A log's records share a few layouts, so a plan is built on
the first record of each and reused; it gives the same first non-null candidate, in the same order
(candidate, then holder), as the plain loop (`tests/test_fieldplan.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import orjson

# Candidate paths per field, tried in order on the unwrapped record and then on the outer record.
FIELD_CANDIDATES: dict[str, tuple[str, ...]] = {
    "request_id": ("request_id", "requestId", "id", "custom_id", "litellm_call_id", "chat_id", "response.id"),
    "timestamp": ("timestamp", "@timestamp", "event_time", "startTime", "start_time", "created_at", "createdAt",
                  "request_time", "time", "ts", "created"),
    "tenant": ("tenant", "tenant_id", "team_id", "org_id", "organization", "metadata.tenant",
               "metadata.user_api_key_team_id", "metadata.team_id", "metadata.user_api_key_org_id"),
    "conversation_id": ("conversation_id", "conversationId", "session_id", "sessionId", "thread_id",
                        "metadata.session_id", "metadata.conversation_id"),
    "user": ("user", "user_id", "end_user", "metadata.user_api_key_user_id", "metadata.user_id"),
    "model": ("model", "model_group", "body.model"),
    "adapter": ("adapter", "lora", "lora_name", "lora_request"),
    "cache_salt": ("cache_salt",),
    # The replica (engine instance) that served the request, for routing/eviction attribution. LiteLLM's
    # StandardLoggingPayload names the deployment `model_id` and its URL `api_base`; nginx logs
    # `upstream_addr`, Envoy `upstream_host`; Kubernetes-side logs a pod or instance.
    "replica": ("replica", "replica_id", "server", "server_id", "backend", "worker", "worker_id", "upstream",
                "upstream_addr", "upstream_host", "pod", "pod_name", "instance", "instance_id", "api_base",
                "metadata.replica", "hidden_params.api_base"),
    "category": ("category", "type", "task_type"),
    "turn_index": ("turn_index", "turn"),
    "output_tokens": ("output_tokens", "completion_tokens", "output_length", "usage.completion_tokens",
                      "response.usage.completion_tokens"),
    "actual_cached_tokens": ("actual_cached_tokens", "num_cached_tokens", "cached_tokens",
                             "usage.prompt_tokens_details.cached_tokens",
                             "response.usage.prompt_tokens_details.cached_tokens"),
    "reported_prompt_tokens": ("reported_prompt_tokens", "prompt_tokens", "usage.prompt_tokens",
                               "response.usage.prompt_tokens"),
}


# The fields above a Record holds as strings (besides request_id)
STRING_FIELDS = ("tenant", "conversation_id", "user", "model", "adapter", "cache_salt", "replica", "category")
# Where the prompt itself is: mapped with --field like the fields above, never looked up by name.
CONTENT_FIELDS = ("messages", "tools", "prompt")


class RecordError(ValueError):
    """A record that parsed as JSON but is not a usable request."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(slots=True)
class Record:
    """One request, normalised; the content is one of messages / prompt / token_ids / hash_ids."""

    source_file: str
    source_line: int
    request_id: str
    timestamp_s: float
    kind: str  # chat | completion | tokens | hashed
    tenant: str | None = None
    conversation_id: str | None = None
    user: str | None = None
    model: str | None = None
    adapter: str | None = None
    cache_salt: str | None = None
    replica: str | None = None
    category: str | None = None
    turn_index: int | None = None
    output_tokens: int | None = None
    actual_cached_tokens: int | None = None
    reported_prompt_tokens: int | None = None  # the log's own prompt token count (a tokenizer/template check)
    ttft_s: float | None = None  # time to first token, end-to-end latency and queue wait (latency.py)
    e2e_s: float | None = None
    queue_wait_s: float | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[Any] | None = None
    prompt: str | None = None
    token_ids: list[int] | np.ndarray | None = None
    hash_ids: np.ndarray | None = None
    input_length: int | None = None
    media_items: int = 0  # media parts in the messages, each now a placeholder (read/media.py)


@lru_cache(maxsize=256)
def split_path(path: str) -> tuple[str, ...]:
    """`a.b.c` -> (a, b, c); a part in double or single quotes keeps its dots: `attributes."gen_ai.request.model"`."""
    parts, cur, quote, i = [], list[str](), None, 0
    while i < len(path):
        ch = path[i]
        if quote:
            if ch == quote:
                quote = None
            else:
                cur.append(ch)
        elif ch in "\"'" and not cur:
            quote = ch
        elif ch == ".":
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    if quote:
        raise ValueError(f"unclosed quote in field path {path!r}")
    parts.append("".join(cur))
    return tuple(parts)


def get_path(obj: Any, path: str) -> Any:
    """Follow a dotted path through dicts (and JSON strings met on the way); None when absent.

    Parts may be quoted to hold dots (OpenTelemetry attribute keys): `attributes."gen_ai.input.messages"`."""
    cur = obj
    for part in (split_path(path) if ("'" in path or '"' in path) else path.split(".")):
        if isinstance(cur, str) and cur[:1] in "{[":
            try:
                cur = orjson.loads(cur)
            except orjson.JSONDecodeError:
                return None
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
        if cur is None:
            return None
    return cur


Plan = dict[str, tuple[tuple[str, bool, int], ...]]  # field -> (path, dotted, holder index) to try, in order


class FieldPlans:
    """Plans per holder layout for one candidate table (bounded: cleared when `limit` layouts are held)."""

    def __init__(self, candidates: Mapping[str, tuple[str, ...]], limit: int = 4096) -> None:
        self.paths = {f: tuple((p, "." in p, p.split(".", 1)[0]) for p in c) for f, c in candidates.items()}
        self.limit = limit
        self.plans: dict[tuple[tuple[Any, ...], ...], Plan] = {}

    def plan(self, holders: tuple[dict[str, Any], ...]) -> Plan:
        """The candidates of every field that can be non-null in these holders, in lookup order."""
        key = tuple(tuple(h) for h in holders)
        got = self.plans.get(key)
        if got is None:
            keysets = [set(k) for k in key]
            got = {f: tuple((path, dotted, i) for path, dotted, first in ps for i, ks in enumerate(keysets)
                            if first in ks)
                   for f, ps in self.paths.items()}
            if len(self.plans) >= self.limit:
                self.plans.clear()
            self.plans[key] = got
        return got
