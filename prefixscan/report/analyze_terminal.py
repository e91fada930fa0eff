"""Terminal rendering of an AnalysisResult: answers "does this traffic repeat enough to matter?" first."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape

from prefixscan.report.escape import clean, safe
from prefixscan.report.fmt import pct as _pct
from prefixscan.report.fmt import print_tables
from prefixscan.report.fmt import tokens as _tok


def headline(s: dict[str, Any]) -> str:
    """One sentence that answers the seed's first question."""
    tw = s["hit_rate"]["token_weighted"]
    if s["requests"]["accepted"] == 0:
        return "No request was accepted: nothing to measure (see the rejects table)."
    if tw >= 0.5:
        verdict = "repeats a lot: prefix-aware routing can matter"
    elif tw >= 0.2:
        verdict = "repeats moderately: worth a closer look at where reuse lives"
    else:
        verdict = "repeats little: a prefix-aware router would have little to capture"
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
        from prefixscan.report.pilot_terminal import render_pilot

        render_pilot(s["pilot"], console)
    line = miss_line(s.get("miss_attribution"))
    if line:
        console.print(line, highlight=False, soft_wrap=True)
    if "findings" in s:  # cache-breaker findings (prefixscan.report.findings_terminal)
        from prefixscan.report.findings_terminal import render_top

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
