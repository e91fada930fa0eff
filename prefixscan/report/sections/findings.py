"""Report sections on what breaks reuse: findings, why requests miss, and before/after a fix."""

from __future__ import annotations

from prefixscan.report.escape import data as esc
from prefixscan.report.fmt import opt_pct, points
from prefixscan.report.model import ReportData
from prefixscan.report.sections.blocks import Block, missing_block, num, tok


def findings(data: ReportData) -> list[Block]:
    out: list[Block] = [("h", 2, "Cache breakers")]
    if data.findings is None:
        return out + [missing_block(data, "findings", "cache-breaker findings")]
    if not data.findings:
        return out + [("p", "No cache breakers were found.")]
    tot = data.findings_total
    return out + [("p", f"{tot['findings']} findings; fixing them all would recover up to "
                        f"**{tok(tot['tokens_lost'])}** prompt tokens of reuse (the gain)."),
                  ("table", ["kind", "tenant", "where", "requests", "tokens lost", "example (redacted)", "fix"],
                   [[esc(f.get("kind")), esc(f.get("tenant") or "all"), f"message {esc(f.get('message_index'))} "
                     f"({esc(f.get('role'))}), token {esc(f.get('token_offset'))}",
                     num(f.get("requests_affected")), tok(f.get("tokens_lost")), esc(f.get("example") or ""),
                     str(f.get("fix") or "")] for f in data.findings])]


def misses(data: ReportData) -> list[Block]:
    """Why requests miss: the ideal-cache hit each request could have had, split by cause (`misses` table).

    Only the prompt-breaker part is a cache breaker; routing, eviction and the unexplained rest are not."""
    m = data.misses
    if not m:
        return []
    out: list[Block] = [("h", 2, "Why requests miss")]
    w = m.get("with_actual")
    if not w:
        out.append(("p", f"The log has no engine-reported cached tokens, so only the prompt breakers' part can be "
                         f"measured: fixing them would add {num(m['lost_breaker_tokens'])} cached prompt tokens to "
                         f"the ideal cache's {num(m['ideal_cached_tokens'])}. Log the engine's "
                         "`usage.prompt_tokens_details.cached_tokens` (and the replica that served each request) to "
                         "split the rest into routing, eviction and unexplained."))
        return out
    rows = [["prompt breakers (the findings above)", num(w["lost_breaker_tokens"])]]
    if m.get("replica_field"):
        rows += [["routing (a replica that lacked the prefix)", num(w["lost_routing_tokens"])],
                 ["eviction (the replica had it, the engine did not report it)", num(w["lost_eviction_tokens"])]]
    rows.append(["unexplained (tokenizer or template mismatch" + ("" if m.get("replica_field") else
                 "; with no replica field, routing and eviction too") + ")", num(w["lost_unexplained_tokens"])])
    out += [("p", f"Over the {num(m['requests_with_actual'])} requests with an engine value"
                  + (f", served by {m['replicas']} replicas" if m.get("replica_field") else "")
                  + f": {num(w['counterfactual_cached_tokens'])} prompt tokens were hittable with the breakers fixed, "
                  f"the engine reported {num(w['actual_cached_tokens'])} cached. The difference, by cause:"),
            ("table", ["lost to", "prompt tokens"], rows)]
    if w.get("engine_excess_tokens"):
        out.append(("p", f"The engine reported {num(w['engine_excess_tokens'])} more cached tokens than the "
                         "per-replica ideal allows on some requests: it saw traffic outside the log."))
    return out


def comparison(data: ReportData) -> list[Block]:
    """Before/after against an earlier run (`report --compare-to`): rates, breakers, prefill; B minus A."""
    d = data.comparison
    if d is None:
        return []
    out: list[Block] = [("h", 2, "Before and after"),
                        ("p", f"This run (after) against `{esc(d.a.path)}` (before): {num(d.a.requests)} and "
                              f"{num(d.b.requests)} requests." + "".join(f" {w}." for w in d.warnings)),
                        ("table", ["hit rate (ideal cache)", "before", "after", "change"],
                         [[k.replace("_", " "), opt_pct(a), opt_pct(b), points(a, b)] for k, a, b in d.rates])]
    if d.breakers is not None:
        count = {s: sum(c.status == s for c in d.breakers) for s in ("fixed", "new", "remaining")}
        out.append(("p", f"Cache breakers: {count['fixed']} fixed, {count['new']} new, {count['remaining']} "
                         "remaining (matched by kind, tenant, field label and message)."))
    pa_, pb = d.prefill_a, d.prefill_b
    out.append(("p", f"Prefill still computed with an ideal cache: {num(pa_.computed_tokens)} of "
                     f"{num(pa_.prompt_tokens)} prompt tokens before, {num(pb.computed_tokens)} of "
                     f"{num(pb.prompt_tokens)} after ({pa_.computed_per_request:,.0f} and "
                     f"{pb.computed_per_request:,.0f} per request)."))
    if d.pilot is not None:
        from prefixscan.report.sections.pilot import against

        out += against(d.pilot)
    return out
