"""Report sections on the fleet and money: scenario, policies, cost, plan, rollout, appendix."""

from __future__ import annotations

from prefixscan.report.escape import data as esc
from prefixscan.report.figures import SCENARIO_LABELS
from prefixscan.report.model import CLASSES, ReportData
from prefixscan.report.sections.blocks import (
    Block,
    estimate_missing,
    gpus,
    missing_block,
    num,
    pct,
    sec,
    tok,
    usd,
)


def policies(data: ReportData) -> list[Block]:
    out: list[Block] = [("h", 2, "Routing policy comparison")]
    if data.policies is None:
        return out + [missing_block(data, "policies", "simulation")]
    s = data.sim
    out.append(("p", f"Simulated on {_fleet(s)} of {esc(s.get('model'))} on {esc(s.get('gpu'))}, "
                     f"{num(s.get('kv_blocks_per_replica'))} KV blocks of {esc(s.get('block_size'))} tokens per "
                     f"replica, router knowledge `{esc(s.get('knowledge'))}`; from {data.policies_source}. \"prompt "
                     "tokens cached\" is token-weighted over all replicas; \"of ideal\" is the share of an unbounded "
                     f"single cache's hits; the chosen policy is **{esc(data.best_policy)}**."))
    out.append(("table", ["policy", "prompt tokens cached", "of ideal", "TTFT p50", "TTFT p95", "imbalance", "spill",
                          "prefill tokens", "evictions"],
                [[esc(p["policy"]), pct(p.get("hit_rate_token_weighted")), pct(p.get("capture_of_ideal")),
                  sec(p.get("ttft_p50_s")), sec(p.get("ttft_p95_s")), num(p.get("imbalance_max_mean"), 2),
                  pct(p.get("spill_rate")), tok(p.get("prefill_tokens")), num(p.get("evictions"))]
                 for p in data.policies]))
    out.append(("fig", "policies"))
    out.extend(_tiers_and_pd(data))
    out.append(("h", 3, "TTFT by cache outcome"))
    out.append(("table", ["policy", *(h for k in CLASSES for h in (f"{k} req", f"{k} p50 / p95"))],
                [[esc(p["policy"]), *(cell for k in CLASSES for cell in (
                    num(p.get(f"{k}_requests")), f"{sec(p.get(f'ttft_{k}_p50_s'))} / {sec(p.get(f'ttft_{k}_p95_s'))}"))]
                 for p in data.policies]))
    return out


def _fleet(s: dict) -> str:
    """"8 replicas", or "2 prefill + 2 decode replicas" for a disaggregated simulation."""
    if s.get("decode_replicas"):
        return f"{s.get('replicas')} prefill + {s.get('decode_replicas')} decode replicas"
    return f"{s.get('replicas')} replicas"


_FORMATS = {"pct": pct, "s": sec, "short": num, "int": num}


def _tiers_and_pd(data: ReportData) -> list[Block]:
    """The simulation's own KV-tier and prefill/decode results (the columns `simulate` prints)."""
    from prefixscan.report.simulate_terminal import PD_COLUMNS, TIER_COLUMNS, pd_rows

    out: list[Block] = []
    if data.sim_tiers:
        out.append(("h", 3, "Cached tokens by KV tier"))
        out.append(("p", "Share of prompt tokens served from each tier in the simulation (load = moving lower-tier "
                         "KV onto the GPU; recomputed = prompt tokens no tier held, prefilled)."))
        out.append(("table", ["policy", *(c for c, _, _ in TIER_COLUMNS)],
                    [[r["policy"], *(_FORMATS[kind](r.get(k)) for _, k, kind in TIER_COLUMNS)]
                     for r in data.sim_tiers]))
    if data.sim_pd:
        out.append(("h", 3, "Disaggregated prefill/decode against a co-located fleet"))
        out.append(("p", "P/D TTFT includes the decode queue and the KV transfer; co-located = the same GPUs "
                         "serving both phases; prefill GPUs needed keeps the prefill pool at most 80% busy."))
        rows = pd_rows([(r["policy"], r) for r in data.sim_pd], lambda v, kind: _FORMATS[kind](v))
        out.append(("table", ["policy", "fleet", *(c for c, _, _ in PD_COLUMNS)], rows))
    return out

# What each cost-table column holds (docs/report.md): per-request share, token-weighted, capture of ideal.
COST_COLUMNS = ("scenario", "requests with a hit", "prompt tokens cached", "of ideal", "prefill tok/s", "prefill GPUs",
                "$ / month", "basis")


def cost(data: ReportData) -> list[Block]:
    out: list[Block] = [("h", 2, "GPUs and dollars")]
    est = data.estimate
    if not est:
        return out + [("missing", estimate_missing(data))]
    a, m, w = est["assumptions"], est["model"], est["workload"]
    base = est.get("baselines") or {}
    out.append(("p", f"Source: {data.estimate_source}. {esc(m['name'])} ({esc(a['dtype'])}, TP "
                     f"{esc(a['tensor_parallel'])}) on {esc(est['gpu']['name'])}, MFU {pct(a['mfu'], 0)}, "
                     f"${a['usd_per_gpu_hour']:.2f}/GPU-hour, {num(a['replicas'])} replicas; traffic "
                     f"{num(w['rps'], 2)} req/s, mean context {tok(w['context_tokens'])} tokens of which "
                     f"{tok(w['new_tokens'])} new per request. Round robin and the router: "
                     f"{base.get('basis', 'analytic')} ({base.get('detail', '')})."))
    out.append(("table", list(COST_COLUMNS),
                [[SCENARIO_LABELS.get(s["name"], s["name"]), pct(s.get("hit_rate")), pct(s["hit_rate_token_weighted"]),
                  pct(s.get("capture_of_ideal")), num(s["prefill_tokens_s"]), gpus(s["gpus"]),
                  usd(s["usd_per_month"]), esc(s.get("source") or "")] for s in est["scenarios"]]))
    out.append(("fig", "gpus"))
    share, sq = est.get("prefill_share"), est.get("status_quo", "round_robin")
    label = SCENARIO_LABELS.get(sq, sq)
    vs_rr = "" if sq == "round_robin" else \
        f"; against round robin {usd(est.get('monthly_savings_vs_round_robin_usd'))}/month"
    bullets = [
        f"Saving against {label}: **{usd(est['monthly_savings_usd'])}/month** "
        f"({num(est['monthly_gpu_hours_saved'])} GPU-hours){vs_rr}; against no reuse "
        f"{usd(est['monthly_savings_vs_no_reuse_usd'])}/month.",
        f"TTFT under load: {sec(est['ttft_s']['hit'])} on a hit, {sec(est['ttft_s']['miss'])} on a miss "
        f"(idle replica: {sec(est['ttft_idle_s']['hit'])} / {sec(est['ttft_idle_s']['miss'])}).",
        f"Prefill share of GPU time under {label}: {pct(share, 0)}.",
    ]
    engine = est.get("engine_reported")
    if engine:
        bullets.append("Today against the modelled round robin: " + " ".join(engine["explanation"]))
    out.append(("ul", bullets + [f"Note: {n}" for n in est.get("notes", [])]))
    return out


def plan(data: ReportData) -> list[Block]:
    best = data.policy(data.best_policy) or {}
    t = data.traffic
    ideal = data.hit_rates[0].whole if data.hit_rates else None

    def pred(text: str) -> str:
        return text if best else "run `prefixscan simulate` for a prediction"

    qd = "; ".join(f"{q['decision']}: mean {sec(q['queue_wait_mean_s'])}, p95 {sec(q['queue_wait_p95_s'])} "
                   f"({num(q['requests'])} req)" for q in data.queue_by_decision)
    actual = (f"; in these logs the engine reported {tok(t.actual_cached_tokens)} cached vs "
              f"{tok(t.predicted_cached_tokens_for_actual)} predicted over {num(t.with_actual_cached)} requests"
              if t and t.with_actual_cached else "")
    ttft = " · ".join(f"{k} {sec(best.get(f'ttft_{k}_p50_s'))} / {sec(best.get(f'ttft_{k}_p95_s'))}"
                      for k in CLASSES)
    rows = [
        ["cached-token rate (token-weighted) by model, pool and prefix class",
         "`vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total`; cached and uncached input tokens",
         pred(f"{pct(best.get('hit_rate_token_weighted'))} with `{esc(data.best_policy)}` (ideal {pct(ideal)})")],
        ["TTFT p50 / p95 for warm, partial and cold requests",
         "router log: `actual_cached_tokens` vs the full cold prefix classifies each request", pred(ttft)],
        ["queue wait by routing decision", "router log: `queue_wait_ms` grouped by `decision`",
         pred(qd or "no decision log in the run")],
        ["KV evictions and age of evicted prefixes", "engine KV events (`BlockRemoved`) or eviction counters",
         pred(f"{num(best.get('evictions'))} evictions, mean age {sec(best.get('evicted_age_mean_s'))}")],
        ["spill rate: requests that left a warm candidate because of the wait threshold",
         "router log: selected worker vs best candidate",
         pred(f"{pct(best.get('spill_rate'))} of requests ({pct(best.get('spill_rate_of_warm'))} of those with a "
              "warm candidate)")],
        ["predicted vs actual cached tokens per request",
         "router log: `predicted_cached_tokens` vs `actual_cached_tokens`; divergence means an "
         "input-identification problem (hidden timestamp, template or tokenizer drift)",
         pred(f"{tok(best.get('predicted_cached_tokens'))} predicted vs {tok(best.get('cached_tokens'))} cached in "
              "simulation") + actual],
    ]
    return [("h", 2, "Measurement plan for the rollout"),
            ("p", "Track these from the first day of the pilot; the right-hand column is what this run predicts, so "
                  "a gap is a signal."),
            ("table", ["metric", "where it comes from", "this run predicts"], rows)]


def rollout(data: ReportData) -> list[Block]:
    status = [
        f"done for this log: see the reuse and prefix sections (`{esc(data.commands[0][1])}`)."
        if data.commands else "run `prefixscan analyze` on several days of logs.",
        f"{data.findings_total.get('findings', 0)} cache breakers listed above, each with its fix."
        if data.findings is not None else f"run `{esc(data.missing.get('findings'))}` to list what to move.",
        "compare the engine's cached-token counts with this report's ideal and LRU numbers.",
        f"start from `{esc(data.best_policy)}` ({(data.estimate or {}).get('verdict', {}).get('router', 'router')})."
        if data.best_policy else "run `prefixscan simulate` to choose the policy.",
        "use the measurement plan above as the comparison sheet.",
    ]
    from prefixscan.report.sections.pilot import measured_steps

    for step, said in measured_steps(data).items():
        status[step - 1] = said
    return [("h", 2, "Rollout order"),
            ("p", "Introduce routing for one measurable traffic class, in this order (seed 002). If there are "
                  "almost no actual hits at step 3, go back to the prompt template before tuning the router."),
            ("ol", [f"{step} **This run:** {s}" for step, s in zip(data.rollout, status, strict=True)])]


def appendix(data: ReportData) -> list[Block]:
    lines = [f"# {stage}\n{line}" for stage, line in data.commands]
    lines.append(f"# report (re-renders from the run directory without re-analysing)\n"
                 f"prefixscan report {data.run_path}")
    return [("h", 2, "Appendix"), ("h", 3, "Definitions"), ("ul", [f"**{k}**: {v}" for k, v in data.definitions]),
            ("h", 3, "Command lines"), ("code", "\n".join(lines)), ("h", 3, "Inputs"),
            ("table", ["file", "kind", "bytes", "fingerprint"],
             [[esc(i.get("path")), esc(i.get("kind")), num(i.get("size")), esc(i.get("fingerprint"))]
              for i in data.inputs]),
            ("p", f"prefixscan {esc(data.version)}; run directory `{esc(data.run_path)}`.")]


def scenario(data: ReportData) -> list[Block]:
    """The one scenario every section is priced at, first thing in the report."""
    if not data.scenario:
        return []
    from prefixscan.cost.scenario import source_rows

    sc = (data.estimate or {}).get("scenario") or {}
    out: list[Block] = [("p", f"**Scenario:** {data.scenario}. Every section below uses it.")]
    rows = source_rows(sc)
    if rows:
        out.append(("table", ["setting", "value", "from"], rows))
    return out
