"""Redaction of customer text in examples: digits, emails, ids and long tokens are masked, then truncated."""

from __future__ import annotations

import re

EMAIL_RE = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
UUID_RE = re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")
_HEXID = re.compile(r"\b(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{8,}\b")
_LONGTOK = re.compile(r"\b[A-Za-z0-9_\-+/=]{24,}\b")
_DIGITS = re.compile(r"\d")
_WS = re.compile(r"\s+")


def redact(text: str) -> str:
    """Mask what could identify a customer: emails, UUIDs, hex/base64-like ids, every digit."""
    text = EMAIL_RE.sub("<email>", text)
    text = UUID_RE.sub("<uuid>", text)
    text = _HEXID.sub("<id>", text)
    text = _LONGTOK.sub("<token>", text)
    return _DIGITS.sub("#", text)


def redact_snippet(text: str, limit: int = 96) -> str:
    """One-line redacted, truncated example."""
    s = redact(_WS.sub(" ", text)).strip()
    return s if len(s) <= limit else s[: limit - 1] + "…"
