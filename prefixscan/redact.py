"""Redaction of customer text in examples: digits, emails, ids and long tokens are masked, then truncated.

Redaction is the second line of defence: what may be shown at all is decided first by how many
independent sources share the text (`prefixscan.privacy`); what is shown is then redacted. Text that may not be
shown is replaced by `hidden()`, a marker that redaction leaves alone.
"""

from __future__ import annotations

import re

EMAIL_RE = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
UUID_RE = re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")
_CUT_EMAIL = re.compile(r"[\w.+-]*@[\w.-]*")  # what is left of an email cut by truncation ("bob@exa")
_HEXID = re.compile(r"\b(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{8,}\b")
_LONGTOK = re.compile(r"\b[A-Za-z0-9_\-+/=]{24,}\b")
_DIGITS = re.compile(r"\d")
_WS = re.compile(r"\s+")
_HIDDEN = re.compile(r"<text (?:[0-9a-f]{6}… )?\d+ (?:tokens|chars)>")


def hidden(length: int, unit: str = "chars", ident: str | None = None) -> str:
    """The marker shown instead of text that too few independent sources share: `<text 2f9a1c… 412 tokens>`.

    `ident` is an identifier already public in the same output (a prefix's block hash), never a hash of
    the hidden text itself: an unkeyed hash of a short text is confirmed by guessing the text."""
    return f"<text {ident[:6]}… {length} {unit}>" if ident else f"<text {length} {unit}>"


def redact(text: str) -> str:
    """Mask what could identify a customer: emails (whole or cut), UUIDs, hex/base64-like ids, every digit.
    `hidden()` markers pass through unchanged, so redacting twice is the same as once."""
    parts = _HIDDEN.split(text)
    marks = _HIDDEN.findall(text)
    out = [_redact_plain(p) for p in parts]
    return "".join(x for pair in zip(out, [*marks, ""], strict=True) for x in pair)


def _redact_plain(text: str) -> str:
    text = EMAIL_RE.sub("<email>", text)
    text = _CUT_EMAIL.sub("<email>", text)
    text = UUID_RE.sub("<uuid>", text)
    text = _HEXID.sub("<id>", text)
    text = _LONGTOK.sub("<token>", text)
    return _DIGITS.sub("#", text)


def redact_snippet(text: str, limit: int = 96) -> str:
    """One-line redacted, truncated example."""
    s = redact(_WS.sub(" ", text)).strip()
    return s if len(s) <= limit else s[: limit - 1] + "…"


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,47}")
_NOTHING = object()


def value_kind(value: object) -> str:
    """What a reject detail may say of a value from the log: its type and size, never the value (a phone
    or card number in a timestamp field, an email used as an id are the customer's)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return f"an integer of {len(str(abs(value)))} digits"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return f"a {len(value)}-character string"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} items"
    if isinstance(value, dict):
        return f"an object of {len(value)} keys"
    return f"a {type(value).__name__}"


def field_name(name: str) -> str:
    """A key of the log's record as a reject may print it: an identifier-like name as is, anything else (an
    email or a sentence used as a key) by its length only."""
    return name if _NAME.fullmatch(name) else f"<a {len(name)}-character key>"


def reject_detail(field: str, problem: str, value: object = _NOTHING) -> str:
    """The one way a reject's detail is written: the field, the problem and, when given, the value's kind
    (`value_kind`), never the value: "`timestamp` is not a time (got a 15-character string)"."""
    got = f" (got {value_kind(value)})" if value is not _NOTHING else ""
    return f"`{field_name(field)}` {problem}{got}"
