"""Terminal rendering of cache-breaker findings: what breaks reuse, where, what it costs, how to fix it."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from prefixscan.report.escape import safe
from prefixscan.report.fmt import tokens as _tok


def where(f: dict[str, Any]) -> str:
    """`message 0 (system), char 146, token 36 (block 2)`; parts that are unknown are left out."""
    parts = []
    if f.get("message_index") is not None:
        mi = f["message_index"]
        parts.append("tools" if mi == -1 else f"message {mi} ({safe(f.get('role'))})")
    if f.get("char_offset") is not None:
        parts.append(f"char {f['char_offset']}")
    if f.get("token_offset") is not None:
        tok = f"token {f['token_offset']}"
        if f.get("block_index") is not None:
            tok += f" (block {f['block_index']})"
        parts.append(tok)
    return ", ".join(parts) or "-"


def counterfactual_line(cf: dict[str, Any] | None) -> str | None:
    """One sentence: hit rate as logged vs after all fixes (token-weighted, ideal cache)."""
    if not cf:
        return None
    before, after = cf.get("token_weighted_as_logged", 0.0), cf.get("token_weighted_after_fixes", 0.0)
    return (f"ideal-cache token-weighted hit rate as logged {100 * before:.1f}% -> after all fixes "
            f"{100 * after:.1f}% ({_tok(cf.get('tokens_gained', 0))} more cached tokens, "
            f"{cf.get('requests_rewritten', 0):,} requests rewritten)")


def render_top(summary: dict[str, Any], console: Console, limit: int = 5) -> None:
    """The analyze summary's findings section: the top few, one line each, and the counterfactual."""
    findings = summary.get("findings") or []
    if not findings:
        console.print("cache breakers: none found (no dynamic field, varying span or normalisation drift "
                      "costs reuse in this log)")
        return
    lost = sum(f["tokens_lost"] for f in findings)
    console.print(f"[bold]Cache breakers: {len(findings)} findings, {_tok(lost)} prompt tokens of reuse lost[/bold]"
                  " (top by tokens lost)", soft_wrap=True)
    for i, f in enumerate(findings[:limit], start=1):
        console.print(f" {i}. {safe(f['kind'])}, tenant {safe(f.get('tenant') or '-')}, {where(f)}: "
                      f"{f['requests_affected']:,} requests, {_tok(f['tokens_lost'])} tokens lost; "
                      f"e.g. {safe(f.get('example') or '-')}. {safe(f.get('fix') or '')}", soft_wrap=True,
                      highlight=False)
    line = counterfactual_line(summary.get("counterfactual"))
    if line:
        console.print(line, soft_wrap=True, highlight=False)
    if len(findings) > limit:
        console.print(f"{len(findings) - limit} more: prefixscan findings RUN_DIR", highlight=False)


def render_findings(findings: list[dict[str, Any]], counterfactual: dict[str, Any] | None,
                    console: Console) -> None:
    """`prefixscan findings`: every finding, in full, one block each."""
    if not findings:
        console.print("No cache breakers were found.")
    else:
        lost = sum(f["tokens_lost"] for f in findings)
        console.print(f"[bold]{len(findings)} cache-breaker findings[/bold], ranked by prompt tokens of reuse lost "
                      f"({_tok(lost)} in total)", soft_wrap=True)
    line: str | None
    for i, f in enumerate(findings, start=1):
        per = f.get("tokens_lost_per_request")
        if per is None and f.get("requests_affected"):
            per = f["tokens_lost"] / f["requests_affected"]
        head = f"#{f.get('rank') or i} [bold]{safe(f['kind'])}[/bold] ({safe(f.get('category') or '-')}), tenant " \
               f"{safe(f.get('tenant') or '-')}" + (f", family {safe(f['family'])}" if f.get("family") else "")
        lines = [head, f"   where: {where(f)}" + (f"; label `{safe(f['label'])}`" if f.get("label") else ""),
                 f"   requests affected: {f['requests_affected']:,}; tokens lost: {_tok(f['tokens_lost'])} "
                 f"({_tok(per)} per request)"
                 + (f"; distinct values: {f['distinct_values']}" if f.get("distinct_values") else ""),
                 f"   example (redacted): {safe(f.get('example') or '-')}"
                 + (f"  (request {safe(f['example_request_id'])})" if f.get("example_request_id") else "")]
        if f.get("detail"):
            lines.append(f"   detail: {safe(f['detail'])}")
        lines.append(f"   fix: {safe(f.get('fix') or '-')}")
        for line in lines:
            console.print(line, soft_wrap=True, highlight=False)
    line = counterfactual_line(counterfactual)
    if line:
        console.print(line, soft_wrap=True, highlight=False)
