"""The report as a list of renderer-neutral blocks, and those blocks rendered as Markdown.

`document(data)` decides what the report says, once; `render` (here) and `prefixscan.report.html.render`
only format the blocks. Inline markup inside text is limited to **bold** and `code`. Every number is
read from the ReportData; nothing is computed here beyond formatting.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefixscan.report.figures import SCENARIO_LABELS, Figure
from prefixscan.report.fmt import opt_pct, points
from prefixscan.report.model import ReportData

Block = (
    tuple  # ("h", level, text) | ("p", text) | ("ul"/"ol", [text]) | ("table", head, rows) | ("fig", name)
)
#                ("code", text) | ("missing", text)

# What each cost-table column holds (docs/report.md): per-request share, token-weighted, capture of ideal.
COST_COLUMNS = (
    "scenario",
    "requests with a hit",
    "prompt tokens cached",
    "of ideal",
    "prefill tok/s",
    "prefill GPUs",
    "$ / month",
    "basis",
)

DIMENSION_TITLES = {
    "tenant": "tenant",
    "prefix_class": "prefix class",
    "turn_index": "turn",
    "hit_source": "hit source",
    "model": "model",
    "category": "category",
}


def pct(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{digits}%}"


def tok(x: float | None) -> str:
    """Token counts: 1,234 below 10k, then 54.10k / 12.3M style, always absolute."""
    if x is None:
        return "n/a"
    for div, suf in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= 10 * div or (div > 1e3 and abs(x) >= div):
            return f"{x / div:,.2f}{suf}"
    return f"{x:,.0f}"


def num(x: float | None, digits: int = 0) -> str:
    return "n/a" if x is None else f"{x:,.{digits}f}"


def gpus(x: float | None) -> str:
    """GPU counts are fractional; keep two significant decimals for small clusters."""
    return "n/a" if x is None else (f"{x:,.1f}" if abs(x) >= 10 else f"{x:,.2f}")


def sec(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x * 1000:,.0f} ms" if abs(x) < 1 else f"{x:,.2f} s"


def usd(x: float | None) -> str:
    return "n/a" if x is None else f"${x:,.0f}"


def gib(x: float | None) -> str:
    return "n/a" if x is None else (f"{x:,.1f} GiB" if x >= 10 else f"{x:,.2f} GiB")


def _missing(data: ReportData, key: str, what: str) -> Block:
    return (
        "missing",
        f"No {what} in this run: run `{data.missing[key]}` to fill this section, then "
        f"`prefixscan report {data.run_path}` again.",
    )


def _estimate_missing(data: ReportData) -> str:
    err = (data.estimate_error or "no data").rstrip(".")
    if "--replicas" in err:
        return (
            f"The cost estimate needs a replica count: run `{data.missing['estimate']}` to fill this "
            f"section, or pass `--replicas N` to `prefixscan report {data.run_path}`."
        )
    return f"The cost estimate could not run on this traffic: {err}."


def _summary(data: ReportData) -> list[Block]:
    out: list[Block] = [("h", 2, "Executive summary")]
    est = data.estimate
    if est:
        v = est["verdict"]
        out.append(("p", f"**Verdict: {v['headline']}**"))
        out.append(("ul", list(v["reasons"]) + [f"Router to adopt if you go ahead: {v['router']}."]))
    else:
        out.append(("p", f"**Verdict: not available.** {_estimate_missing(data)}"))
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
            f"Best simulated router policy `{best['policy']}` caches "
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


def _traffic(data: ReportData) -> list[Block]:
    out: list[Block] = [("h", 2, "Traffic profile")]
    t = data.traffic
    if t is None:
        return out + [_missing(data, "traffic", "requests table")]
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
    ]
    for reason, n in sorted(t.rejects_by_reason.items()):
        rows.append([f"rejected: {reason}", num(n)])
    if t.with_actual_cached:
        rows.append(["requests with engine-reported cached tokens", num(t.with_actual_cached)])
        rows.append(
            [
                "engine-reported vs ideal-cache cached tokens",
                f"{tok(t.actual_cached_tokens)} vs {tok(t.predicted_cached_tokens_for_actual)}",
            ]
        )
    s = data.setup
    out.append(("table", ["", "value"], rows))
    out.append(
        (
            "p",
            f"Tokenizer `{s.get('tokenizer')}`, block size {s.get('block_size')}, hit rule "
            f"`{s.get('hit_rule')}`, granularity `{s.get('granularity')}`.",
        )
    )
    return out


def _dim_table(rows: list[dict[str, Any]], title: str) -> Block:
    return (
        "table",
        [
            title,
            "requests",
            "prompt tokens",
            "cached tokens",
            "token-weighted",
            "block-weighted",
            "per-request mean",
        ],
        [
            [
                str(r["key"]),
                num(r["requests"]),
                tok(r["prompt_tokens"]),
                tok(r["cached_tokens"]),
                pct(r["token_weighted"]),
                pct(r["block_weighted"]),
                pct(r["request_mean"]),
            ]
            for r in rows
        ],
    )


def _reuse(data: ReportData, figs: dict[str, Figure]) -> list[Block]:
    out: list[Block] = [("h", 2, "Reuse by tenant, prefix class and turn")]
    if not data.hit_rates:
        return out + [_missing(data, "reuse", "summaries table")]
    out.append(
        (
            "p",
            "Ideal-cache hit rate under all three definitions (an ideal cache is unbounded and "
            "shared: the upper bound for any router).",
        )
    )
    out.append(
        (
            "table",
            ["definition", "whole log", "steady state (2nd half)"],
            [[h.name, pct(h.whole), pct(h.steady)] for h in data.hit_rates],
        )
    )
    if data.tenant_isolated is not None:
        out.append(
            (
                "p",
                f"With every tenant isolated (salted hashes) the token-weighted rate is "
                f"{pct(data.tenant_isolated)}.",
            )
        )
    for dim in ("tenant", "prefix_class", "turn_index", "hit_source", "model", "category"):
        rows = data.breakdowns.get(dim)
        title = DIMENSION_TITLES[dim]
        out.append(("h", 3, f"By {title}"))
        if not rows:
            out.append(("p", f"The log carries no {title}: every request falls in one group."))
            continue
        out.append(_dim_table(rows, title))
        if dim in data.breakdown_omitted:
            out.append(
                (
                    "p",
                    f"{data.breakdown_omitted[dim]} smaller tenants not shown "
                    "(`prefixscan query RUN_DIR \"select * from summaries where dimension='tenant'\"`).",
                )
            )
        name = "reuse_turn" if dim == "turn_index" else f"reuse_{dim}"
        if name in figs:
            out.append(("fig", name))
    return out


def _capacity(data: ReportData, figs: dict[str, Figure]) -> list[Block]:
    out: list[Block] = [("h", 2, "Capacity curve: LRU vs optimal vs ideal")]
    c = data.capacity
    if "capacity" in data.missing:
        return out + [_missing(data, "capacity", "capacity curve")]
    if c is None:
        return out + [
            ("p", "The capacity curve is empty: no request reuses anything, so no cache size helps.")
        ]
    kv = data.kv
    out.append(
        (
            "p",
            f"Token-weighted hit rate of one cache of each size. GiB use {num(kv.bytes_per_token)} "
            f"bytes of KV per token ({kv.model}, {kv.dtype} KV; model from {kv.source}; change with "
            "`--model`).",
        )
    )
    out.append(("fig", "capacity"))
    b = kv.bytes_per_token / 2**30
    lines = []
    for frac, need in ((50, c.lru_tokens_50), (90, c.lru_tokens_90)):
        lines.append(
            f"LRU reaches {frac}% of the ideal hit rate at "
            + (f"{tok(need)} tokens ({gib(need * b)})." if need else "no capacity on the curve.")
        )
    if c.replica_kv_tokens:
        lines.append(
            f"One replica holds about {tok(c.replica_kv_tokens)} tokens of KV "
            f"({gib(c.replica_kv_tokens * b)}; from the estimate's tensor parallelism and GPU)."
        )
    out.append(("ul", lines))
    out.append(
        (
            "table",
            ["capacity (tokens)", "KV (GiB)", "LRU", "optimal", "ideal", "LRU hit tokens"],
            [
                [
                    tok(p["capacity_tokens"]),
                    gib(p["capacity_gib"]),
                    pct(p["lru_hit_rate"]),
                    pct(p["opt_hit_rate"]),
                    pct(p["ideal_hit_rate"]),
                    tok(p["lru_hit_tokens"]),
                ]
                for p in c.points
            ],
        )
    )
    return out


def _prefixes(data: ReportData) -> list[Block]:
    out: list[Block] = [("h", 2, "Top shared prefixes (redacted)")]
    if "prefixes" in data.missing:
        return out + [_missing(data, "prefixes", "shared prefixes")]
    if not data.prefixes:
        return out + [("p", "No prefix was shared by two requests.")]
    out.append(
        ("p", "Ranked by prompt tokens saved; text is redacted (digits, emails, ids masked) and truncated.")
    )
    out.append(
        (
            "table",
            [
                "#",
                "length (tokens)",
                "hits",
                "tokens saved",
                "tenants",
                "cross-tenant hits",
                "median reuse gap",
                "starts with",
            ],
            [
                [
                    str(p["rank"]),
                    tok(p["prefix_tokens"]),
                    num(p["hits"]),
                    tok(p["tokens_saved"]),
                    num(p.get("tenants")),
                    num(p.get("cross_tenant_hits")),
                    sec(p.get("median_reuse_gap_s")),
                    p["snippet"],
                ]
                for p in data.prefixes
            ],
        )
    )
    return out


def _findings(data: ReportData) -> list[Block]:
    out: list[Block] = [("h", 2, "Cache breakers")]
    if data.findings is None:
        return out + [_missing(data, "findings", "cache-breaker findings")]
    if not data.findings:
        return out + [("p", "No cache breakers were found.")]
    tot = data.findings_total
    out.append(
        (
            "p",
            f"{tot['findings']} findings; fixing them all would recover up to "
            f"**{tok(tot['tokens_lost'])}** prompt tokens of reuse (the gain).",
        )
    )
    out.append(
        (
            "table",
            ["kind", "tenant", "where", "requests", "tokens lost", "example (redacted)", "fix"],
            [
                [
                    str(f.get("kind")),
                    str(f.get("tenant") or "all"),
                    f"message {f.get('message_index')} ({f.get('role')}), token {f.get('token_offset')}",
                    num(f.get("requests_affected")),
                    tok(f.get("tokens_lost")),
                    str(f.get("example") or ""),
                    str(f.get("fix") or ""),
                ]
                for f in data.findings
            ],
        )
    )
    return out


def _policies(data: ReportData, figs: dict[str, Figure]) -> list[Block]:
    out: list[Block] = [("h", 2, "Routing policy comparison")]
    if data.policies is None:
        return out + [_missing(data, "policies", "simulation")]
    s = data.sim
    out.append(
        (
            "p",
            f"Simulated on {s.get('replicas')} replicas of {s.get('model')} on {s.get('gpu')}, "
            f"{num(s.get('kv_blocks_per_replica'))} KV blocks of {s.get('block_size')} tokens per replica, "
            f"router knowledge `{s.get('knowledge')}`; from {data.policies_source}. \"prompt tokens "
            f"cached\" is token-weighted over all replicas; \"of ideal\" is the share of an unbounded "
            f"single cache's hits; the chosen policy is **{data.best_policy}**.",
        )
    )
    out.append(
        (
            "table",
            [
                "policy",
                "prompt tokens cached",
                "of ideal",
                "TTFT p50",
                "TTFT p95",
                "imbalance",
                "spill",
                "prefill tokens",
                "evictions",
            ],
            [
                [
                    p["policy"],
                    pct(p.get("hit_rate_token_weighted")),
                    pct(p.get("capture_of_ideal")),
                    sec(p.get("ttft_p50_s")),
                    sec(p.get("ttft_p95_s")),
                    num(p.get("imbalance_max_mean"), 2),
                    pct(p.get("spill_rate")),
                    tok(p.get("prefill_tokens")),
                    num(p.get("evictions")),
                ]
                for p in data.policies
            ],
        )
    )
    out.append(("fig", "policies"))
    out.append(("h", 3, "TTFT by cache outcome"))
    out.append(
        (
            "table",
            [
                "policy",
                "warm req",
                "warm p50 / p95",
                "partial req",
                "partial p50 / p95",
                "cold req",
                "cold p50 / p95",
            ],
            [
                [p["policy"]]
                + sum(
                    (
                        [
                            num(p.get(f"{k}_requests")),
                            f"{sec(p.get(f'ttft_{k}_p50_s'))} / {sec(p.get(f'ttft_{k}_p95_s'))}",
                        ]
                        for k in ("warm", "partial", "cold")
                    ),
                    [],
                )
                for p in data.policies
            ],
        )
    )
    return out


def _cost(data: ReportData, figs: dict[str, Figure]) -> list[Block]:
    out: list[Block] = [("h", 2, "GPUs and dollars")]
    est = data.estimate
    if not est:
        return out + [("missing", _estimate_missing(data))]
    a, m, w = est["assumptions"], est["model"], est["workload"]
    base = est.get("baselines") or {}
    out.append(
        (
            "p",
            f"Source: {data.estimate_source}. {m['name']} ({a['dtype']}, TP {a['tensor_parallel']}) on "
            f"{est['gpu']['name']}, MFU {pct(a['mfu'], 0)}, ${a['usd_per_gpu_hour']:.2f}/GPU-hour, "
            f"{num(a['replicas'])} replicas; traffic {num(w['rps'], 2)} req/s, mean context "
            f"{tok(w['context_tokens'])} tokens of which {tok(w['new_tokens'])} new per request. Round "
            f"robin and the router: {base.get('basis', 'analytic')} ({base.get('detail', '')}).",
        )
    )
    out.append(
        (
            "table",
            list(COST_COLUMNS),
            [
                [
                    SCENARIO_LABELS.get(s["name"], s["name"]),
                    pct(s.get("hit_rate")),
                    pct(s["hit_rate_token_weighted"]),
                    pct(s.get("capture_of_ideal")),
                    num(s["prefill_tokens_s"]),
                    gpus(s["gpus"]),
                    usd(s["usd_per_month"]),
                    s.get("source") or "",
                ]
                for s in est["scenarios"]
            ],
        )
    )
    out.append(("fig", "gpus"))
    share, sq = est.get("prefill_share"), est.get("status_quo", "round_robin")
    label = SCENARIO_LABELS.get(sq, sq)
    vs_rr = (
        "" if sq == "round_robin" else
        f"; against round robin {usd(est.get('monthly_savings_vs_round_robin_usd'))}/month"
    )
    bullets = [
        f"Saving against {label}: **{usd(est['monthly_savings_usd'])}/month** "
        f"({num(est['monthly_gpu_hours_saved'])} GPU-hours){vs_rr}; against no reuse "
        f"{usd(est['monthly_savings_vs_no_reuse_usd'])}/month.",
        f"TTFT under load: {sec(est['ttft_s']['hit'])} on a hit, "
        f"{sec(est['ttft_s']['miss'])} on a miss "
        f"(idle replica: {sec(est['ttft_idle_s']['hit'])} / {sec(est['ttft_idle_s']['miss'])}).",
        f"Prefill share of GPU time under {label}: {pct(share, 0)}.",
    ]
    engine = est.get("engine_reported")
    if engine:
        bullets.append("Today against the modelled round robin: " + " ".join(engine["explanation"]))
    out.append(("ul", bullets + [f"Note: {n}" for n in est.get("notes", [])]))
    return out


def _plan(data: ReportData) -> list[Block]:
    out: list[Block] = [("h", 2, "Measurement plan for the rollout")]
    best = data.policy(data.best_policy) or {}
    sim = bool(best)
    t = data.traffic
    ideal = data.hit_rates[0].whole if data.hit_rates else None

    def pred(text: str) -> str:
        return text if sim else "run `prefixscan simulate` for a prediction"

    qd = "; ".join(
        f"{q['decision']}: mean {sec(q['queue_wait_mean_s'])}, p95 {sec(q['queue_wait_p95_s'])} "
        f"({num(q['requests'])} req)"
        for q in data.queue_by_decision
    )
    actual = (
        f"; in these logs the engine reported {tok(t.actual_cached_tokens)} cached vs "
        f"{tok(t.predicted_cached_tokens_for_actual)} predicted over {num(t.with_actual_cached)} requests"
        if t and t.with_actual_cached
        else ""
    )
    rows = [
        [
            "cached-token rate (token-weighted) by model, pool and prefix class",
            "`vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total`; "
            "cached and uncached input tokens",
            pred(
                f"{pct(best.get('hit_rate_token_weighted'))} with `{data.best_policy}` (ideal {pct(ideal)})"
            ),
        ],
        [
            "TTFT p50 / p95 for warm, partial and cold requests",
            "router log: `actual_cached_tokens` vs the full cold prefix classifies each request",
            pred(
                " · ".join(
                    f"{k} {sec(best.get(f'ttft_{k}_p50_s'))} / {sec(best.get(f'ttft_{k}_p95_s'))}"
                    for k in ("warm", "partial", "cold")
                )
            ),
        ],
        [
            "queue wait by routing decision",
            "router log: `queue_wait_ms` grouped by `decision`",
            pred(qd or "no decision log in the run"),
        ],
        [
            "KV evictions and age of evicted prefixes",
            "engine KV events (`BlockRemoved`) or eviction counters",
            pred(f"{num(best.get('evictions'))} evictions, mean age {sec(best.get('evicted_age_mean_s'))}"),
        ],
        [
            "spill rate: requests that left a warm candidate because of the wait threshold",
            "router log: selected worker vs best candidate",
            pred(
                f"{pct(best.get('spill_rate'))} of requests ({pct(best.get('spill_rate_of_warm'))} of those "
                "with a warm candidate)"
            ),
        ],
        [
            "predicted vs actual cached tokens per request",
            "router log: `predicted_cached_tokens` vs `actual_cached_tokens`; divergence means an "
            "input-identification problem (hidden timestamp, template or tokenizer drift)",
            pred(
                f"{tok(best.get('predicted_cached_tokens'))} predicted vs {tok(best.get('cached_tokens'))} "
                "cached in simulation"
            )
            + actual,
        ],
    ]
    out.append(
        (
            "p",
            "Track these from the first day of the pilot; the right-hand column is what this run "
            "predicts, so a gap is a signal.",
        )
    )
    out.append(("table", ["metric", "where it comes from", "this run predicts"], rows))
    return out


def _rollout(data: ReportData) -> list[Block]:
    status = [
        f"done for this log: see the reuse and prefix sections (`{data.commands[0][1]}`)."
        if data.commands
        else "run `prefixscan analyze` on several days of logs.",
        (
            f"{data.findings_total.get('findings', 0)} cache breakers listed above, each with its fix."
            if data.findings is not None
            else f"run `{data.missing.get('findings')}` to list what to move."
        ),
        "compare the engine's cached-token counts with this report's ideal and LRU numbers.",
        (
            f"start from `{data.best_policy}` "
            f"({(data.estimate or {}).get('verdict', {}).get('router', 'router')})."
            if data.best_policy
            else "run `prefixscan simulate` to choose the policy."
        ),
        "use the measurement plan above as the comparison sheet.",
    ]
    return [
        ("h", 2, "Rollout order"),
        (
            "p",
            "Introduce routing for one measurable traffic class, in this order (seed 002). If there are "
            "almost no actual hits at step 3, go back to the prompt template before tuning the router.",
        ),
        ("ol", [f"{step} **This run:** {s}" for step, s in zip(data.rollout, status, strict=True)]),
    ]


def _appendix(data: ReportData) -> list[Block]:
    out: list[Block] = [
        ("h", 2, "Appendix"),
        ("h", 3, "Definitions"),
        ("ul", [f"**{k}**: {v}" for k, v in data.definitions]),
        ("h", 3, "Command lines"),
    ]
    lines = [f"# {stage}\n{line}" for stage, line in data.commands]
    lines.append(
        f"# report (re-renders from the run directory without re-analysing)\n"
        f"prefixscan report {data.run_path}"
    )
    out.append(("code", "\n".join(lines)))
    out.append(("h", 3, "Inputs"))
    out.append(
        (
            "table",
            ["file", "kind", "bytes", "fingerprint"],
            [
                [str(i.get("path")), str(i.get("kind")), num(i.get("size")), str(i.get("fingerprint"))]
                for i in data.inputs
            ],
        )
    )
    out.append(("p", f"prefixscan {data.version}; run directory `{data.run_path}`."))
    return out


def _scenario(data: ReportData, figs: dict[str, Figure]) -> list[Block]:
    """The one scenario every section is priced at, first thing in the report."""
    if not data.scenario:
        return []
    return [("p", f"**Scenario:** {data.scenario}. Every section below uses it.")]


def _misses(data: ReportData) -> list[Block]:
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


def _comparison(data: ReportData) -> list[Block]:
    """Before/after against an earlier run (`report --compare-to`): rates, breakers, prefill; B minus A."""
    d = data.comparison
    if d is None:
        return []
    out: list[Block] = [("h", 2, "Before and after"),
                        ("p", f"This run (after) against `{d.a.path}` (before): {num(d.a.requests)} and "
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
    return out


Section = Callable[[ReportData, dict[str, Figure]], list[Block]]

# The report's sections in order; each is one function (data, figures) -> blocks. A new section is one
# more function in this tuple.
SECTIONS: tuple[Section, ...] = (
    _scenario,
    lambda d, f: _summary(d),
    lambda d, f: _comparison(d),
    lambda d, f: _traffic(d),
    _reuse,
    _capacity,
    lambda d, f: _prefixes(d),
    lambda d, f: _findings(d),
    lambda d, f: _misses(d),
    _policies,
    _cost,
    lambda d, f: _plan(d),
    lambda d, f: _rollout(d),
    lambda d, f: _appendix(d),
)


def document(data: ReportData, figures: dict[str, Figure],
             sections: tuple[Section, ...] = SECTIONS) -> list[Block]:
    """The report's content as blocks; figure blocks whose figure is absent are dropped."""
    blocks: list[Block] = [("h", 1, f"prefixscan report: {data.run_path}")]
    for section in sections:
        blocks.extend(b for b in section(data, figures) if b[0] != "fig" or b[1] in figures)
    return blocks


def _cell(text: str) -> str:
    """Table cell: escape pipes, and angle brackets so redaction markers like <email> stay visible."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")


def render(data: ReportData, figures: dict[str, Figure], figure_dir: str = "report_figures") -> str:
    """Markdown text; figures are linked as `figure_dir/NAME.svg` (written next to report.md)."""
    out: list[str] = []
    for b in document(data, figures):
        kind = b[0]
        if kind == "h":
            out.append(f"{'#' * b[1]} {b[2]}")
        elif kind == "p":
            out.append(b[1])
        elif kind == "missing":
            out.append(f"> {b[1]}")
        elif kind in ("ul", "ol"):
            out.append("\n".join(f"{f'{i}.' if kind == 'ol' else '-'} {x}" for i, x in enumerate(b[1], 1)))
        elif kind == "table":
            head, rows = b[1], b[2]
            lines = ["| " + " | ".join(_cell(h) for h in head) + " |", "|" + "---|" * len(head)]
            lines += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
            out.append("\n".join(lines))
        elif kind == "fig":
            f = figures[b[1]]
            out.append(f"![{f.alt}]({figure_dir}/{f.name}.svg)")
        elif kind == "code":
            out.append(f"```\n{b[1]}\n```")
    return "\n\n".join(out) + "\n"
