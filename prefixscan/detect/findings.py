"""The Finding record, its ranking, the `findings` and `finding_requests` tables, and the JSON interface.

`JSON_KEYS` is what `analyze --json` and `findings --json` print for each finding; scripts depend on it,
so it only ever grows at the end.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa

from prefixscan.detect.list_order import UNSAFE as LIST_UNSAFE

JSON_KEYS = ("kind", "tenant", "message_index", "role", "char_offset", "token_offset", "requests_affected",
             "tokens_lost", "example", "fix")

# A dynamic field's kinds; `fix` moves them (and pattern-free spans) after the shared content.
FIELD_KINDS = ("timestamp", "date", "request_id", "session_id", "user_name", "email", "phone", "counter",
               "random_token")
FIELD_KINDS_MOVABLE = (*FIELD_KINDS, "pattern_free")
NORMALISATION_KINDS = ("whitespace", "line_endings", "unicode", "json_key_order", "json_spacing", "rag_order",
                       "tool_order", "list_order", "template_churn")
CATEGORIES = {**dict.fromkeys(FIELD_KINDS, "dynamic_field"), "pattern_free": "pattern_free",
              **dict.fromkeys(NORMALISATION_KINDS, "normalisation")}

FINDINGS_SCHEMA = pa.schema([
    pa.field("rank", pa.int64(), nullable=False),
    pa.field("kind", pa.string(), nullable=False),
    pa.field("category", pa.string(), nullable=False),
    pa.field("tenant", pa.string()),
    pa.field("family", pa.string()),
    pa.field("label", pa.string()),
    pa.field("message_index", pa.int32()),
    pa.field("role", pa.string()),
    pa.field("char_offset", pa.int64()),
    pa.field("token_offset", pa.int64()),
    pa.field("block_index", pa.int64()),
    pa.field("requests_affected", pa.int64(), nullable=False),
    pa.field("distinct_values", pa.int64()),
    pa.field("tokens_lost", pa.int64(), nullable=False),
    pa.field("tokens_lost_per_request", pa.float64(), nullable=False),
    pa.field("example", pa.string()),
    pa.field("example_request_id", pa.string()),
    pa.field("detail", pa.string()),
    pa.field("fix", pa.string(), nullable=False),
])

FINDING_REQUESTS_SCHEMA = pa.schema([
    pa.field("rank", pa.int64(), nullable=False),
    pa.field("request_id", pa.string(), nullable=False),
    pa.field("tokens_gained", pa.int64(), nullable=False),
])


@dataclass
class Finding:
    """One cache breaker, located, measured and with its fix."""

    kind: str
    tenant: str | None
    family: str | None
    label: str | None
    message_index: int | None
    role: str | None
    char_offset: int | None
    token_offset: int | None
    block_index: int | None
    requests_affected: int
    distinct_values: int | None
    tokens_lost: int
    example: str | None
    example_request_id: str | None
    detail: str | None
    fix: str
    rank: int = 0
    request_ids: list[str] = field(default_factory=list, repr=False)
    request_gains: list[int] = field(default_factory=list, repr=False)
    # (path in the record's own shape, char) of the example, for shapes whose message list is not the record's
    field_path: tuple[str, int] | None = field(default=None, repr=False)

    @property
    def category(self) -> str:
        return CATEGORIES.get(self.kind, "dynamic_field")

    @property
    def tokens_lost_per_request(self) -> float:
        return self.tokens_lost / self.requests_affected if self.requests_affected else 0.0

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in JSON_KEYS}

    def to_row(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k not in ("request_ids", "request_gains", "field_path")}
        d["category"] = self.category
        d["tokens_lost_per_request"] = round(self.tokens_lost_per_request, 3)
        return d


def rank(findings: list[Finding]) -> list[Finding]:
    """Most tokens lost first; ties broken by fixed keys so the order is deterministic."""
    out = sorted(findings, key=lambda f: (-f.tokens_lost, -f.requests_affected, f.kind, f.tenant or "",
                                          f.message_index if f.message_index is not None else -2,
                                          f.char_offset or 0, f.label or ""))
    for i, f in enumerate(out, start=1):
        f.rank = i
    return out


def findings_table(findings: list[Finding]) -> pa.Table:
    return pa.Table.from_pylist([f.to_row() for f in findings], schema=FINDINGS_SCHEMA)


def finding_requests_table(findings: list[Finding]) -> pa.Table:
    rows: dict[str, list[Any]] = {"rank": [], "request_id": [], "tokens_gained": []}
    for f in findings:
        rows["rank"].extend([f.rank] * len(f.request_ids))
        rows["request_id"].extend(f.request_ids)
        rows["tokens_gained"].extend(f.request_gains or [0] * len(f.request_ids))
    return pa.Table.from_pydict(rows, schema=FINDING_REQUESTS_SCHEMA)


def fixable(f: Finding) -> bool:
    """Whether `fix` rewrites this finding's requests: not a date inside a sentence (no safe rewrite), not
    a template version (which version to keep is the team's call), not a field inside a tool schema, not
    a list of text chunks whose order may be a ranking."""
    if f.detail and f.detail.startswith("written inside a sentence"):
        return False
    if f.kind == "template_churn":
        return False
    if f.kind == "list_order" and (f.detail or "").startswith(LIST_UNSAFE):
        return False
    return not (f.message_index == -1 and f.kind in FIELD_KINDS_MOVABLE)


_WHERE = {"system": "the system message", "user": "the user message", "developer": "the developer message",
          "tools": "the tool list"}


def _position(message_index: int | None, role: str | None, char_offset: int | None,
              field: tuple[str, int] | None) -> str:
    """Where to act: the record's own field and char (non-OpenAI shapes), and always the message and char."""
    if message_index is None or message_index < 0:
        return ""
    at = f"message {message_index}" + (f" ({role})" if role else "") + \
        (f", char {char_offset}" if char_offset is not None else "")
    return f"`{field[0]}` char {field[1]} ({at})" if field else at


def fix_sentence(kind: str, label: str | None, role: str | None, detail: str | None = None,
                 message_index: int | None = None, char_offset: int | None = None,
                 field: tuple[str, int] | None = None, hidden_label: int | None = None) -> str:
    """The fix in one sentence, with where to act. `label`: the template text in front of the value (shown
    only as privacy allows); `hidden_label`: the length of a label that may not be shown (the field is then
    named by its kind and position only); `field`: (path in the record's own shape, char) from
    `prompt_map`, for shapes whose message list is not the record's."""
    at = _position(message_index, role, char_offset, field)
    if label:
        lab = f"`{label}:`" + (f" at {at}" if at else "")
    elif hidden_label:
        lab = (f"the {kind} field" + (f" at {at}" if at else "") + f" (its label, {hidden_label} characters of "
               "template text, is not shown: too few conversations share it)")
    else:
        lab = "the varying text" + (f" at {at}" if at else "")
    where = _WHERE.get(role or "", "its message")
    if detail and detail.startswith("written inside a sentence"):
        return (f"No safe automatic rewrite (`fix` leaves it): the {kind} is written inside a sentence of {where}"
                + (f" ({at})" if at else "") + "; reword it so the date comes after the shared content (the end "
                "of the last user message), or round it to the day if the time is not needed.")
    if kind == "list_order":
        if detail and detail.startswith(LIST_UNSAFE):
            return (f"No safe automatic rewrite (`fix` leaves it): a list of text chunks in {where} arrives in "
                    f"another order; the {LIST_UNSAFE}, e.g. by source id.")
        return (f"Sort this JSON list in {where} before serialising it: {detail or 'by its name/id key'} (`fix` does "
                "this).")
    if kind in FIELD_KINDS_MOVABLE:
        extra = " (or pass it in headers/metadata)" if kind in ("request_id", "session_id", "random_token",
                                                                  "counter") else ""
        return f"Move {lab} out of {where} to after the shared content (the end of the last user message)" \
               f"{extra}."
    return {
        "whitespace": "Normalise whitespace the same way in every service (strip trailing spaces, one blank "
                      "line between paragraphs) before building the prompt.",
        "line_endings": "Convert CRLF to LF in every service before building the prompt.",
        "unicode": "Normalise text to Unicode NFC in every service before building the prompt.",
        "json_key_order": "Serialise JSON (tool schemas, payloads, JSON in message text) with sorted keys.",
        "json_spacing": "Serialise JSON in message text with one fixed layout (the same indent and separators in "
                        "every service, e.g. json.dumps(obj, sort_keys=True, separators=(',', ':'))).",
        "rag_order": "Order retrieved chunks with a stable tie-breaker (source id, position), not by score "
                     "alone.",
        "tool_order": "Send tools in a fixed order (e.g. sorted by name).",
        "template_churn": "Pin one version of this system prompt per deploy and retire the others"
                          + (f" ({detail})" if detail else "") + ".",
    }.get(kind, "Move the varying content after the shared content.")
