"""Report sections on the traffic and its reuse: summary, traffic, reuse by dimension, capacity, prefixes."""

from __future__ import annotations

from prefixscan.report.escape import data as esc
from prefixscan.report.figures import SCENARIO_LABELS
from prefixscan.report.model import ReportData
from prefixscan.report.sections.blocks import (
    Block,
    estimate_missing,
    gib,
    gpus,
    missing_block,
    num,
    pct,
    sec,
    tok,
    usd,
)

DIMENSION_TITLES = {"tenant": "tenant", "prefix_class": "prefix class", "turn_index": "turn",
                    "hit_source": "hit source", "model": "model", "category": "category"}


def summary(data: ReportData) -> list[Block]:
    out: list[Block] = [("h", 2, "Executive summary")]
    est = data.estimate
    if est:
        v = est["verdict"]
        out.append(("p", f"**Verdict: {v['headline']}**"))
        out.append(("ul", list(v["reasons"]) + [f"Router to adopt if you go ahead: {v['router']}."]))
    else:
        out.append(("p", f"**Verdict: not available.** {estimate_missing(data)}"))
    bullets = []
    t, hr = data.traffic, data.hit_rates
    if t and hr:
        bullets.append(
            f"With an ideal (unbounded) cache **{pct(hr[0].whole)}** of prompt tokens are reusable "
            f"(token-weighted: {tok(t.cached_tokens)} of {tok(t.prompt_tokens)} tokens; "
            f"steady state {pct(hr[0].steady)})."
        )
    best, rr = data.policy(data.best_policy), data.policy("round_robin")
    if best:
        line = (
            f"Best simulated router policy `{esc(best['policy'])}` caches "
            f"**{pct(best['hit_rate_token_weighted'])}** "
            f"of prompt tokens on {data.sim.get('replicas')} replicas (token-weighted, cluster-wide; "
            f"{data.policies_source})"
        )
        if rr:
            line += f", against {pct(rr['hit_rate_token_weighted'])} for round robin"
        bullets.append(line + f"; TTFT p50 {sec(best['ttft_p50_s'])}, p95 {sec(best['ttft_p95_s'])}.")
    if est:
        g, sq = est["gpus"], est.get("status_quo", "round_robin")
        today = f"{gpus(g['today'])} today (engine-reported), " if "today" in g else ""
        bullets.append(
            f"Prefill GPUs: {today}{gpus(g['round_robin'])} under round robin, "
            f"{gpus(g['prefix_aware'])} prefix-aware, {gpus(g['ideal'])} with an ideal cache: "
            f"**{usd(est['monthly_savings_usd'])}/month saved** against {SCENARIO_LABELS.get(sq, sq)}."
        )
    if data.findings_total:
        bullets.append(
            f"Cache breakers: {data.findings_total['findings']} findings costing "
            f"{tok(data.findings_total['tokens_lost'])} prompt tokens of reuse."
        )
    out.append(("ul", bullets) if bullets else ("p", "No traffic was analysed."))
    out.extend(("p", f"Note: {n}") for n in data.notes)
    return out


def traffic(data: ReportData) -> list[Block]:
    out: list[Block] = [("h", 2, "Traffic profile")]
    t = data.traffic
    if t is None:
        return out + [missing_block(data, "traffic", "requests table")]
    rows = [
        ["records read", num(t.requests_read)],
        ["accepted", num(t.requests_accepted)],
        ["rejected", num(t.requests_rejected)],
        ["time span", sec(t.span_s)],
        ["mean rate (measured in the log)", f"{num(t.rps, 2)} req/s"],
        ["prompt tokens (total)", tok(t.prompt_tokens)],
        ["prompt tokens p50 / p90 / p99", f"{tok(t.prompt_p50)} / {tok(t.prompt_p90)} / {tok(t.prompt_p99)}"],
        ["output tokens (mean)", num(t.output_tokens_mean, 1)],
        ["tenants / conversations / models", f"{num(t.tenants)} / {num(t.conversations)} / {num(t.models)}"],
        *([f"rejected: {esc(reason)}", num(n)] for reason, n in sorted(t.rejects_by_reason.items())),
    ]
    if t.with_actual_cached:
        rows += [["requests with engine-reported cached tokens", num(t.with_actual_cached)],
                 ["engine-reported vs ideal-cache cached tokens",
                  f"{tok(t.actual_cached_tokens)} vs {tok(t.predicted_cached_tokens_for_actual)}"]]
    s = data.setup
    out.append(("table", ["", "value"], rows))
    if t.busy_note:
        rate = f"busy-period rate {num(t.busy_rps, 2)} req/s" if t.busy_rps == t.busy_rps else "no measurable rate"
        out.append(("p", f"Note: {t.busy_note[0].upper()}{t.busy_note[1:]}: its {rate} is the traffic's rate "
                         "an estimate uses unless `--rps` sets one."))
    out.append(("p", f"Tokenizer `{esc(s.get('tokenizer'))}`, block size {esc(s.get('block_size'))}, hit rule "
                     f"`{esc(s.get('hit_rule'))}`, granularity `{esc(s.get('granularity'))}`."))
    return out


def reuse(data: ReportData) -> list[Block]:
    out: list[Block] = [("h", 2, "Reuse by tenant, prefix class and turn")]
    if not data.hit_rates:
        return out + [missing_block(data, "reuse", "summaries table")]
    out.append(("p", "Ideal-cache hit rate under all three definitions (an ideal cache is unbounded and shared: the "
                     "upper bound for any router)."))
    out.append(("table", ["definition", "whole log", "steady state (2nd half)"],
                [[h.name, pct(h.whole), pct(h.steady)] for h in data.hit_rates]))
    if data.tenant_isolated is not None:
        out.append(("p", f"With every tenant isolated (salted hashes) the token-weighted rate is "
                         f"{pct(data.tenant_isolated)}."))
    for dim, title in DIMENSION_TITLES.items():
        rows = data.breakdowns.get(dim)
        out.append(("h", 3, f"By {title}"))
        if not rows:
            out.append(("p", f"The log carries no {title}: every request falls in one group."))
            continue
        out.append(("table", [title, "requests", "prompt tokens", "cached tokens", "token-weighted", "block-weighted",
                              "per-request mean"],
                    [[esc(r["key"]), num(r["requests"]), tok(r["prompt_tokens"]), tok(r["cached_tokens"]),
                      pct(r["token_weighted"]), pct(r["block_weighted"]), pct(r["request_mean"])] for r in rows]))
        if dim in data.breakdown_omitted:
            out.append(("p", f"{data.breakdown_omitted[dim]} smaller tenants not shown "
                             "(`prefixscan query RUN_DIR \"select * from summaries where dimension='tenant'\"`)."))
        out.append(("fig", "reuse_turn" if dim == "turn_index" else f"reuse_{dim}"))  # dropped when not drawn
    return out


def capacity(data: ReportData) -> list[Block]:
    out: list[Block] = [("h", 2, "Capacity curve: LRU vs optimal vs ideal")]
    c = data.capacity
    if "capacity" in data.missing:
        return out + [missing_block(data, "capacity", "capacity curve")]
    if c is None:
        return out + [("p", "The capacity curve is empty: no request reuses anything, so no cache size helps.")]
    kv = data.kv
    out.append(("p", f"Token-weighted hit rate of one cache of each size. GiB use {num(kv.bytes_per_token)} bytes of "
                     f"KV per token ({esc(kv.model)}, {esc(kv.dtype)} KV; model from {esc(kv.source)}; change with "
                     "`--model`)."))
    out.append(("fig", "capacity"))
    b = kv.bytes_per_token / 2**30
    lines = [f"LRU reaches {frac}% of the ideal hit rate at "
             + (f"{tok(need)} tokens ({gib(need * b)})." if need else "no capacity on the curve.")
             for frac, need in ((50, c.lru_tokens_50), (90, c.lru_tokens_90))]
    if c.replica_kv_tokens:
        lines.append(f"One replica holds about {tok(c.replica_kv_tokens)} tokens of KV "
                     f"({gib(c.replica_kv_tokens * b)}; from the estimate's tensor parallelism and GPU).")
    out.append(("ul", lines))
    out.append(("table", ["capacity (tokens)", "KV (GiB)", "LRU", "optimal", "ideal", "LRU hit tokens"],
                [[tok(p["capacity_tokens"]), gib(p["capacity_gib"]), pct(p["lru_hit_rate"]), pct(p["opt_hit_rate"]),
                  pct(p["ideal_hit_rate"]), tok(p["lru_hit_tokens"])] for p in c.points]))
    return out


def prefixes(data: ReportData) -> list[Block]:
    out: list[Block] = [("h", 2, "Top shared prefixes (redacted)")]
    if "prefixes" in data.missing:
        return out + [missing_block(data, "prefixes", "shared prefixes")]
    if not data.prefixes:
        return out + [("p", "No prefix was shared by two requests.")]
    return out + [("p", "Ranked by prompt tokens saved; text is redacted (digits, emails, ids masked) and truncated."),
                  ("table", ["#", "length (tokens)", "hits", "tokens saved", "tenants", "cross-tenant hits",
                             "median reuse gap", "starts with"],
                   [[str(p["rank"]), tok(p["prefix_tokens"]), num(p["hits"]), tok(p["tokens_saved"]),
                     num(p.get("tenants")), num(p.get("cross_tenant_hits")), sec(p.get("median_reuse_gap_s")),
                     esc(p["snippet"])] for p in data.prefixes])]
