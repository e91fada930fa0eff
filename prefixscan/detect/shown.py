"""What of a finding's text may leave the run: its label and example, under the k-sharers rule.

A dynamic field's label ("Signature", "Dear ...") is the template text in front of the varying value; it
is shown (redacted) only when the finding's requests come from at least k independent sources
(`prefixscan.privacy.may_show`): distinct users, else tenants and prompts of different lengths (the
label's surroundings differ), a conversation being one source; otherwise it is replaced by a `hidden()`
marker in the label, the example and the fix. A normalisation drift's example quotes one request's line,
whose sharing is not known: the line is always hidden. An id-like value (an account number, a phone) is
shown as its kind only.
"""

from __future__ import annotations

import re

import polars as pl

from prefixscan.detect.findings import CATEGORIES, Finding, fix_sentence
from prefixscan.privacy import IDENTITY_COLUMNS, independent_sources, may_show
from prefixscan.redact import hidden, redact

_LINE_KINDS = ("whitespace", "line_endings", "unicode", "json_key_order")  # examples that quote a line
_ID_KINDS = ("request_id", "session_id", "random_token", "phone", "email", "user_name")  # values never shown
_WS = re.compile(r"\s+")


def guard_findings(findings: list[Finding], req: pl.DataFrame, k: int, include_text: bool) -> None:
    """Apply the privacy rule to each finding's text, in place. `req`: the analysis' requests (request_id,
    the identity columns and prompt_tokens; missing ones count as absent: then only users vouch)."""
    if include_text:
        return
    sources = _sources(findings, req)
    for i, f in enumerate(findings):
        if f.kind in _LINE_KINDS and f.message_index is not None and f.message_index >= 0:
            _hide_line(f)
        elif f.label:
            _guard_label(f, may_show(sources.get(i, 0), k))


def _sources(findings: list[Finding], req: pl.DataFrame) -> dict[int, int]:
    """Independent sources of each labelled finding's requests. A finding's value varies by definition,
    so its label's surroundings are told apart by the rest of the prompt: its length in tokens."""
    pairs = [(i, r) for i, f in enumerate(findings) if f.label for r in f.request_ids]
    if not pairs or not req.height or "request_id" not in req.columns:
        return {}
    cols = [c for c in (*IDENTITY_COLUMNS, "prompt_tokens") if c in req.columns]
    needed = list({r for _, r in pairs})  # a few rows of a large log
    who = req.select("request_id", *cols).filter(pl.col("request_id").is_in(needed)).unique("request_id",
                                                                                             keep="first")
    if "prompt_tokens" not in who.columns:
        who = who.with_columns(pl.lit(None, dtype=pl.Int64).alias("prompt_tokens"))
    rows = (pl.DataFrame({"_finding": [i for i, _ in pairs], "request_id": [r for _, r in pairs]},
                         schema={"_finding": pl.Int64, "request_id": pl.String})
            .join(who, on="request_id", how="inner").rename({"prompt_tokens": "length"})
            .with_columns(pl.lit("").alias("context")))
    return independent_sources(rows, "_finding")


def _guard_label(f: Finding, shared: bool) -> None:
    """`label: value`: the label stays (redacted) when shared, else a marker; an id-like value shows only
    its kind (a timestamp keeps its redacted shape: `November ##, #### ##:##`)."""
    label = f.label or ""
    shown = redact(_WS.sub(" ", label)).strip()
    ex = f.example or ""
    value = ex[len(shown) + 2:] if shown and ex.startswith(shown + ": ") else None
    if f.kind in _ID_KINDS:
        value = f"<{f.kind}>"
    if shared:
        f.example = f"{shown}: {value}" if value is not None else ex
        return
    mark = hidden(len(label))
    f.example = f"{mark}: {value}" if value is not None else mark
    f.label = mark
    if CATEGORIES.get(f.kind, "dynamic_field") in ("dynamic_field", "pattern_free"):
        f.fix = fix_sentence(f.kind, None, f.role, f.detail, f.message_index, f.char_offset, f.field_path,
                             hidden_label=len(label))


def _hide_line(f: Finding) -> None:
    ex = f.example or ""
    head, sep, line = ex.partition(": ")
    f.example = f"{head}: {hidden(len(line))}" if sep and head == f.kind else hidden(len(ex))
