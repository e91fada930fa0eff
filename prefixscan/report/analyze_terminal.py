"""Terminal rendering of an AnalysisResult: answers "does this traffic repeat enough to matter?" first. Then its
cache-breaker findings (what breaks reuse, where, what it costs, how to fix it; `prefixscan findings` prints them
in full) and, when the log carries latency, the pilot's outcome (prefixscan.pilot): latency by warm / partial /
cold request, by model and replica, by routing decision, and prediction next to outcome."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape

from prefixscan.report.escape import clean, safe
from prefixscan.report.fmt import pct as _pct
from prefixscan.report.fmt import print_tables, say
from prefixscan.report.fmt import tokens as _tok
from prefixscan.report.model import CLASSES


def headline(s: dict[str, Any]) -> str:
    """One sentence that answers the seed's first question."""
    tw = s["hit_rate"]["token_weighted"]
    if s["requests"]["accepted"] == 0:
        return "No request was accepted: nothing to measure (see the rejects table)."
    verdict = next(v for floor, v in ((0.5, "repeats a lot: prefix-aware routing can matter"),
                                      (0.2, "repeats moderately: worth a closer look at where reuse lives"),
                                      (-1.0, "repeats little: a prefix-aware router would have little to capture"))
                   if tw >= floor)
    return (f"With an ideal (unbounded) cache, {_pct(tw)} of prompt tokens are reusable "
            f"({_tok(s['tokens']['cached'])} of {_tok(s['tokens']['prompt'])} tokens): this traffic {verdict}.")


def _group_table(console: Console, title: str, rows: dict[str, Any], limit: int = 8) -> None:
    cells = [[safe(key), f"{r['requests']:,}", _tok(r["prompt_tokens"]), _tok(r["cached_tokens"]),
              _pct(r["token_weighted"]), _pct(r["block_weighted"]), _pct(r["request_mean"])]
             for key, r in list(rows.items())[:limit]]
    print_tables(console, title, ["key", "requests", "prompt tok", "cached tok", "token-wt", "block-wt", "req mean"],
                 cells, text={"key"}, show_edge=False,
                 caption=f"{len(rows) - limit} more in the summaries table" if len(rows) > limit else None)


def _hash_label(h: dict[str, Any]) -> str:
    """", hash vllm:ALGO seed S" when the block hashes are vLLM's values (nothing for prefixscan's own)."""
    if not h or h.get("algorithm", "xxh3") == "xxh3":
        return ""
    return escape(f", hash {h['algorithm']} seed {h.get('seed')}")


def records_line(rq: dict[str, Any]) -> str:
    """`records read N = accepted A + rejected R  (rejects: reason count, ...)`."""
    return (f"records read {rq['read']:,} = accepted {rq['accepted']:,} + rejected {rq['rejected']:,}"
            + (f"  (rejects: {safe(', '.join(f'{k} {v}' for k, v in sorted(rq['rejects_by_reason'].items())))})"
               if rq["rejected"] else ""))


def render_summary(result: Any, console: Console) -> None:
    """Print the analysis summary."""
    s = result.summary
    rq = s["requests"]
    console.print(f"[bold]prefixscan analyze[/bold]  {s['input']['files']} file(s), "
                  f"shape {safe(', '.join(sorted(set(s['input']['shapes'].values()))) or '-')}, "
                  f"tokenizer {safe(s['input']['tokenizer'])}, block {s['input']['block_size']}, "
                  f"hit rule {s['input']['hit_rule']}, granularity {s['input']['granularity']}"
                  + _hash_label(s['input'].get("hash") or {}))  # already escaped
    console.print(records_line(rq))
    if s["input"].get("fields", {}).get("line"):
        console.print(safe(s["input"]["fields"]["line"]))
    console.print(f"[bold]{headline(s)}[/bold]")
    hr = s["hit_rate"]
    print_tables(console, "Ideal-cache hit rate (three definitions)",
                 ["definition", "whole log", "steady state (2nd half)"], [
        ["token-weighted (cached / prompt tokens; what vLLM counters show)", _pct(hr["token_weighted"]),
         _pct(hr["steady_state_token_weighted"])],
        ["block-weighted (hit blocks / all blocks)", _pct(hr["block_weighted"]),
         _pct(hr["steady_state_block_weighted"])],
        ["mean of per-request hit fractions (AIPerf)", _pct(hr["request_mean"]),
         _pct(hr["steady_state_request_mean"])],
        ["token-weighted with tenants isolated", _pct(hr["tenant_isolated_token_weighted"]), ""]],
        text={"definition"}, show_edge=False)
    tk = s["tokens"]
    console.print(f"avoidable prefill: {_tok(tk['cached'])} tokens; still computed: {_tok(tk['uncached'])}. "
                  f"prompt length p50/p90/p99 {_tok(tk['prompt_percentiles']['p50'])}/"
                  f"{_tok(tk['prompt_percentiles']['p90'])}/{_tok(tk['prompt_percentiles']['p99'])}, "
                  f"cached p50/p90 {_tok(tk['cached_percentiles']['p50'])}/{_tok(tk['cached_percentiles']['p90'])}")
    _group_table(console, "Where reuse lives: prefix class", s["by_prefix_class"])
    _group_table(console, "Hit source", s["by_hit_source"])
    _group_table(console, "By tenant", s["by_tenant"])
    if s["by_turn"] and len(s["by_turn"]) > 1:
        _group_table(console, "By turn index", s["by_turn"], limit=11)
    cap = s.get("capacity") or {}
    if cap.get("points"):
        need90 = cap.get("lru_tokens_for_90pct_of_ideal")
        need50 = cap.get("lru_tokens_for_50pct_of_ideal")
        console.print(f"capacity (one replica, vLLM's block pool): {_tok(need50)} tokens reach 50% of the ideal hit "
                      f"rate, {_tok(need90)} reach 90%" + ("" if need90 else " (not reached on the grid)"))
    ct = s["cross_tenant"]
    if ct["tokens_lost_if_isolated"]:
        console.print(f"cross-tenant: {ct['prefixes_shared']} shared prefixes; isolating tenants loses "
                      f"{_tok(ct['tokens_lost_if_isolated'])} cached tokens "
                      f"({_pct(hr['token_weighted'])} -> {_pct(ct['token_weighted_isolated'])})")
    if s["top_prefixes"]:
        cells = [[str(r["rank"]), _tok(r["prefix_tokens"]), f"{r['hits']:,}", _tok(r["tokens_saved"]),
                  str(r["tenants"]), safe(r["snippet"] or "(hashed trace: no text)")] for r in s["top_prefixes"]]
        print_tables(console, "Top shared prefixes (shared text only, redacted)",
                     ["#", "length", "hits", "saved", "tenants", "starts with"], cells, text={"starts with"},
                     show_edge=False)
    av = s["actual_vs_predicted"]
    if av["requests_with_actual"]:
        console.print(f"engine-reported cached tokens on {av['requests_with_actual']:,} requests: "
                      f"{_tok(av['actual_cached'])} actual vs {_tok(av['predicted_cached'])} predicted; "
                      f"{av['requests_short']:,} requests fell short of the prediction")
    if s.get("pilot"):  # the log carries latency: the pilot's outcome by warm / partial / cold
        render_pilot(s["pilot"], console)
    say(console, miss_line(s.get("miss_attribution")))
    if "findings" in s:  # cache-breaker findings
        render_top(s, console)
    for note in s["notes"]:
        console.print(f"[yellow]note:[/yellow] {safe(note)}")
    if result.run_dir:
        console.print(f"run directory: [bold]{safe(result.run_dir)}[/bold]  (query it: prefixscan query "
                      f"{safe(result.run_dir)} \"select * from summaries\")")


def render_evidence(sentences: list[str], console: Console) -> None:
    """The engine's own evidence (metrics, KV events) after the summary, one line each."""
    for s in sentences:
        console.print("evidence: " + clean(s), markup=False, highlight=False)


def miss_line(m: dict | None) -> str | None:
    """Why requests miss, in tokens (the `misses` table's totals over requests with an engine value):
    only the breaker part is a cache breaker."""
    if not m or not m.get("with_actual"):
        return None
    w = m["with_actual"]
    parts = [f"prompt breakers {_tok(w['lost_breaker_tokens'])}"]
    if m["replica_field"]:
        parts += [f"routing {_tok(w['lost_routing_tokens'])}", f"eviction {_tok(w['lost_eviction_tokens'])}"]
    parts.append(f"unexplained {_tok(w['lost_unexplained_tokens'])}"
                 + ("" if m["replica_field"] else " (no replica field: routing and eviction are in here; map "
                    "one with --field replica=PATH)"))
    extra = f"; the engine beat the per-replica ideal by {_tok(w['engine_excess_tokens'])}" \
        if w["engine_excess_tokens"] else ""
    return (f"why requests miss ({m['requests_with_actual']:,} with an engine value, {m['replicas']} replicas): "
            f"{_tok(w['counterfactual_cached_tokens'])} hittable with breakers fixed vs "
            f"{_tok(w['actual_cached_tokens'])} "
            f"the engine reported; lost to " + ", ".join(parts) + extra + " (table misses)")


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
        say(console, f" {i}. {safe(f['kind'])}, tenant {safe(f.get('tenant') or '-')}, {where(f)}: "
                     f"{f['requests_affected']:,} requests, {_tok(f['tokens_lost'])} tokens lost; "
                     f"e.g. {safe(f.get('example') or '-')}. {safe(f.get('fix') or '')}")
    say(console, counterfactual_line(summary.get("counterfactual")))
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
        say(console, *lines)
    say(console, counterfactual_line(counterfactual))


def secs(v: float | None) -> str:
    """A latency for a table cell: milliseconds below 10 s, seconds above; '-' when unmeasured."""
    if v is None:
        return "-"
    return f"{v * 1000:,.0f} ms" if v < 10 else f"{v:,.1f} s"


def _bare(r: dict[str, Any], m: str) -> str:
    """`p50 / p95` of measure `m` (ttft, queue_wait, e2e) in a pilot row; '-' when no request has it."""
    return f"{secs(r[f'{m}_p50_s'])} / {secs(r[f'{m}_p95_s'])}" if r[f"{m}_requests"] else "-"


def _pair(r: dict[str, Any], m: str) -> str:
    """`_bare` with the number of requests behind it."""
    return f"{_bare(r, m)} (n={r[f'{m}_requests']:,})" if r[f"{m}_requests"] else "-"


def render_pilot(p: dict[str, Any], console: Console, limit: int = 8) -> None:
    """The pilot tables, after the reuse summary."""
    src = ("the engine's reported cached tokens" if p["cached_source"] == "engine"
           else "the ideal cache's cached tokens (the log reports no engine count)")
    cl = p["classes"]
    cells = [[k, f"{r['requests']:,}", _pair(r, "ttft"), _pair(r, "queue_wait"), _pair(r, "e2e")]
             for k, r in p["by_class"].items()]
    print_tables(console, "Pilot: latency p50 / p95 by class", ["class", "requests", "TTFT", "queue wait",
                                                                 "end to end"], cells, show_edge=False,
                 caption=f"classes by {src}: cold < {cl['block_tokens']} tokens cached; warm >= "
                         f"{cl['warm_share']:.0%} of the prompt cached or <= {cl['warm_uncached_tokens']} "
                         "tokens left to compute; partial between")
    rows = p["by_model_replica"]
    cells = [[safe(r["model"]), safe(r["replica"]), f"{r['requests']:,}", _tok(r["cached_tokens"]),
              _tok(r["uncached_tokens"]), _pair(r, "ttft")] for r in rows[:limit]]
    print_tables(console, "Pilot: input tokens by model and replica", ["model", "replica", "requests", "cached tok",
                                                                       "uncached tok", "TTFT p50 / p95"],
                 cells, keys=2, text={"model", "replica"}, show_edge=False,
                 caption=f"{len(rows) - limit} more in the pilot table" if len(rows) > limit else None)
    if p.get("decisions"):
        render_decisions(p["decisions"], console, limit)
    if p.get("prediction"):
        render_prediction(p["prediction"], p["by_class"], p["all"], console)


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "-"


def render_decisions(d: dict[str, Any], console: Console, limit: int = 8) -> None:
    """Queue wait, left-warm requests and predicted vs actual cached tokens by routing decision."""
    j = d["join"]
    rows = [("all decisions", d["all"]), *list(d["by_decision"].items())[:limit]]
    cells = [[safe(k), f"{r['requests']:,}", _bare(r, "queue_wait"), _pair(r, "ttft"),
              f"{r['left_warm_requests']:,} ({_share(r['left_warm_requests'], r['requests'])})",
              f"{_tok(r['predicted_cached_tokens'])} / {_tok(r['actual_cached_tokens'])}",
              f"{r['diverged_requests']:,} of {r['compared_requests']:,}"] for k, r in rows]
    more = len(d["by_decision"]) - limit
    print_tables(console, "Pilot: p50 / p95 by routing decision (the router's decision log)",
                 ["decision", "requests", "queue wait", "TTFT", "left warm", "cached pred / actual",
                  "off > 1 block"], cells, keys=1, text={"decision"},
                 show_edge=False,
                 caption=f"decision rows read {d['read']:,} = accepted {d['accepted']:,} + rejected "
                         f"{d['rejected']:,}; joined {j['joined']:,}, {j['decisions_without_request']:,} match no "
                         f"request, {j['requests_without_decision']:,} requests have no decision row"
                         + (f"; {more} more decisions in the pilot table" if more > 0 else ""))


def _classes(c: dict[str, int] | None) -> str:
    return "-" if not c else " / ".join(f"{c[k]:,}" for k in CLASSES)


def render_prediction(p: dict[str, Any], by_class: dict[str, Any], every: dict[str, Any], console: Console) -> None:
    """Prefixscan's prediction next to the engine's outcome (prefixscan.pilot.prediction)."""
    pr, rt, me, gap = p["predicted"], p.get("as_routed"), p["measured"], p["gap"]
    sides = [("predicted (ideal cache)", pr), *([("as routed (ideal per replica)", rt)] if rt else []),
             ("measured (engine)", me)]
    cells = [[name, f"{s['hit_rate']:.1%}" if s["hit_rate"] is not None else "-", _tok(s["cached_tokens"]),
              _tok(s["uncached_tokens"]), _classes(s.get("classes")),
              _pair(every, "ttft") if s is me else "-"] for name, s in sides]
    print_tables(console, "Pilot: prediction next to outcome", ["", "hit rate", "cached tok", "prefill tok",
                                                                "warm / partial / cold", "TTFT p50 / p95"],
                 cells, show_edge=False,
                 caption=f"{p['divergence']['compared']:,} requests with the engine's count; gap "
                         f"{_tok(gap['cached_tokens'])} tokens = routing {_tok(gap['lost_routing_tokens'])} + "
                         f"eviction {_tok(gap['lost_eviction_tokens'])} + unexplained "
                         f"{_tok(gap['lost_unexplained_tokens'])} - engine above {_tok(gap['engine_excess_tokens'])}"
                         " (table misses)")
    cells = [[c["predicted_class"], c["class"], f"{c['requests']:,}", _pair(c, "ttft"),
              f"{_tok(c['predicted_cached_tokens'])} / {_tok(c['actual_cached_tokens'])}",
              " / ".join(_tok(c[k]) for k in ("lost_routing_tokens", "lost_eviction_tokens",
                                              "lost_unexplained_tokens", "engine_excess_tokens"))]
             for c in p.get("by_class_pair") or []]
    print_tables(console, "Pilot: predicted class -> measured class", ["predicted", "measured", "requests",
                                                                        "TTFT p50 / p95", "cached pred / actual",
                                                                        "routing / eviction / unexpl. / above"],
                 cells, keys=2, show_edge=False)
