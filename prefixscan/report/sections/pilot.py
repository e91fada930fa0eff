"""The pilot's outcome, from the run's `pilot` table (written by analyze when the log carries latency):
latency by warm, partial and cold request and input tokens by model and replica (prefixscan.pilot.latency); the
same by routing decision (prefixscan.pilot.decisions); prediction next to outcome (prefixscan.pilot.prediction)."""

from __future__ import annotations

from typing import Any

from prefixscan.report.escape import data as esc
from prefixscan.report.model import CLASSES, ReportData
from prefixscan.report.sections.blocks import Block, num, pct, tok

LIMIT = 12  # model x replica rows and decision rows shown; the rest stay in the table


def ms(v: float | None) -> str:
    """A latency in milliseconds (the pilot table holds seconds)."""
    return "n/a" if v is None else f"{v * 1000:,.0f} ms"


def _pair(r: dict[str, Any], m: str) -> str:
    return "n/a" if not r[f"{m}_requests"] else f"{ms(r[f'{m}_p50_s'])} / {ms(r[f'{m}_p95_s'])}"


def evictions(rows: list[dict[str, Any]]) -> list[Block]:
    """KV evictions and the age of evicted blocks by class (the pilot table's eviction rows, written by
    `analyze --kv-events`; prefixscan.evidence.evictions)."""
    shown = [r for r in rows if r["level"] in ("eviction_all", "eviction")]
    if not shown:
        return [("p", "KV evictions and the age of evicted prefixes need the engine's KV events: `analyze "
                      "--kv-events EVENTS` (docs/record-events.md).")]
    return [("h", 3, "KV evictions by class"),
            ("p", "From the engine's recorded KV events: a removed block's age is the time since its most recent "
                  "store (the engine's clock). A request met an eviction when one of its blocks had been removed "
                  "and not stored again before it arrived; a class's evictions are those its requests met."),
            ("table", ["class", "requests", "requests that met an eviction", "evictions", "age p50 / p95"],
             [[esc(r["class"] or "all removals"), num(r["requests"]), num(r["evicted_requests"]),
               num(r["evicted_blocks"]), "n/a" if r["evicted_age_p50_s"] is None else
               f"{r['evicted_age_p50_s']:,.3g} s / {r['evicted_age_p95_s']:,.3g} s"] for r in shown])]


def pilot(data: ReportData) -> list[Block]:
    """TTFT, queue wait and end-to-end latency p50 / p95 per class; cached and uncached tokens per pool."""
    p = data.pilot
    if not p:
        return []
    rows, info = p["rows"], p.get("summary") or {}
    src = info.get("cached_source")
    basis = ("the engine's reported cached tokens (`actual_cached_tokens`)" if src == "engine" else
             "the ideal cache's cached tokens (the log reports no engine count)")
    cl = info.get("classes") or {}
    out: list[Block] = [
        ("h", 2, "Pilot: latency by warm, partial and cold requests"),
        ("p", f"Measured from the log's own latency fields. Classes by {basis}: **cold** when fewer than "
              f"{num(cl.get('block_tokens'))} tokens (one block) were cached, **warm** when at least "
              f"{num(100 * cl.get('warm_share', 0.9))}% of the prompt was or at most "
              f"{num(cl.get('warm_uncached_tokens'))} tokens were left to compute, **partial** between. "
              "Percentiles: linear interpolation between the closest ranks; n/a where the log has no value."),
        ("table", ["class", "requests", "TTFT p50 / p95", "queue wait p50 / p95", "end to end p50 / p95"],
         [[esc(r["class"] or "all requests"), num(r["requests"]), _pair(r, "ttft"), _pair(r, "queue_wait"),
           _pair(r, "e2e")] for r in rows if r["level"] in ("class", "all")]),
    ]
    pools = [r for r in rows if r["level"] == "model_replica"]
    out += [("p", "Input tokens by model and replica (the pool that served them): cached tokens skipped prefill, "
                  "uncached were computed."),
            ("table", ["model", "replica", "requests", "cached tokens", "uncached tokens", "TTFT p50 / p95"],
             [[esc(r["model"] if r["model"] is not None else "(none)"),
               esc(r["replica"] if r["replica"] is not None else "(none)"), num(r["requests"]),
               tok(r["cached_tokens"]), tok(r["uncached_tokens"]), _pair(r, "ttft")] for r in pools[:LIMIT]])]
    if len(pools) > LIMIT:
        out.append(("p", f"{num(len(pools) - LIMIT)} more model and replica rows in the run's `pilot` table."))
    out += decisions(rows, info)
    out += evictions(rows)
    name = data.best_policy
    out += prediction(rows, info, data.policy(name) if name else None, name, data.policies_source)
    return out


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "n/a"


def decisions(rows: list[dict[str, Any]], info: dict[str, Any]) -> list[Block]:
    """By routing decision: queue wait, requests that left a warm candidate, and the router's predicted against
    the engine's actual cached tokens, from the `pilot` table's decision rows."""
    d = info.get("decisions")
    shown = [r for r in rows if r["level"] in ("decision_all", "decision")]
    if not d or not shown:
        return [("p", "Queue wait by routing decision and predicted against actual cached tokens need the router's "
                      "decision log: `analyze --decisions FILE` (docs/pilot.md).")]
    j, lw = d["join"], d["left_warm"]
    out: list[Block] = [
        ("h", 3, "By routing decision"),
        ("p", f"From the router's decision log: {num(d['read'])} rows read = {num(d['accepted'])} accepted + "
              f"{num(d['rejected'])} rejected (the rejects table); {num(j['joined'])} joined a request, "
              f"{num(j['decisions_without_request'])} match no request and {num(j['requests_without_decision'])} "
              f"requests have no decision row. Queue wait: the decision row's `queue_wait_ms`, else the request log's. "
              f"{num(lw['requests'])} requests ({_share(lw['requests'], d['accepted'])}) left a warm candidate: "
              f"{num(lw['by_decision_name'])} by a fallback or overflow decision, {num(lw['by_candidates_only'])} "
              "more passed a warmer candidate (rule in docs/pilot.md)."),
        ("table", ["decision", "requests", "queue wait p50 / p95", "TTFT p50 / p95", "left warm",
                   "predicted / actual cached", "diverged by more than a block"],
         [[esc(r["decision"] if r["level"] == "decision" else "all decisions"), num(r["requests"]),
           _pair(r, "queue_wait"), _pair(r, "ttft"),
           f"{num(r['left_warm_requests'])} ({_share(r['left_warm_requests'], r['requests'])})",
           f"{tok(r['predicted_cached_tokens'])} / {tok(r['actual_cached_tokens'])}",
           f"{num(r['diverged_requests'])} of {num(r['compared_requests'])}"] for r in shown[:LIMIT + 1]]),
    ]
    if len(shown) > LIMIT + 1:
        out.append(("p", f"{num(len(shown) - LIMIT - 1)} more decisions in the run's `pilot` table."))
    div = d.get("divergence") or {}
    if div.get("systematic"):
        out.append(("p", f"**Predicted and actual diverge regularly**: on {num(div['diverged'])} of "
                         f"{num(div['compared'])} decisions ({_share(div['diverged'], div['compared'])}) they differ "
                         "by more than one block. Seed 002's rule: a regular divergence is an input-identification "
                         "problem, not a GPU problem (a hidden timestamp, a template change, a different tokenizer "
                         "on part of the fleet, a normaliser that differs between services)."))
    return out


def _classes(c: dict[str, int] | None) -> str:
    return "n/a" if not c else " / ".join(num(c.get(k)) for k in CLASSES)


def _pp(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:+.1f} pp"


def _policy_column(policy: dict[str, Any] | None) -> list[str] | None:
    """The chosen policy's cells, in the order of the comparison's rows; None without one."""
    if not policy:
        return None

    def pair(a: str, b: str) -> str:
        return "n/a" if policy.get(a) is None else f"{ms(policy.get(a))} / {ms(policy.get(b))}"

    counts: dict[str, Any] = {k: policy.get(f"{k}_requests") for k in CLASSES}
    cached, prompt = policy.get("cached_tokens"), policy.get("prompt_tokens")
    return [pct(policy.get("hit_rate_token_weighted")), tok(cached),
            tok(policy.get("prefill_tokens") if policy.get("prefill_tokens") is not None else
                (prompt - cached if prompt is not None and cached is not None else None)),
            _classes(counts) if all(v is not None for v in counts.values()) else "n/a",
            pair("ttft_p50_s", "ttft_p95_s"), *[pair(f"ttft_{k}_p50_s", f"ttft_{k}_p95_s") for k in CLASSES]]


def prediction(rows: list[dict[str, Any]], info: dict[str, Any], policy: dict[str, Any] | None = None,
               policy_name: str | None = None, policy_source: str = "") -> list[Block]:
    """Prefixscan's ideal cache (and, when the run holds one, the chosen simulation's or estimate's policy:
    `policy`, its row of report.model.POLICY_COLUMNS) against what the engine did, from the pilot table's
    prediction rows and the summary's `pilot.prediction`."""
    p = info.get("prediction")
    if not p:
        return [("p", "Prediction next to outcome needs the engine's cached tokens in the log "
                      "(`usage.prompt_tokens_details.cached_tokens` or `--field actual_cached_tokens=PATH`).")]
    pr, rt, me, gap, div = p["predicted"], p.get("as_routed"), p["measured"], p["gap"], p["divergence"]
    by_class = {r["class"]: r for r in rows if r["level"] == "class"}
    every = next((r for r in rows if r["level"] == "all"), None)
    measured_ttft = [_pair(every, "ttft") if every else "n/a",
                     *[_pair(by_class[k], "ttft") if k in by_class else "n/a" for k in CLASSES]]
    labels = ["hit rate (token-weighted)", "cached tokens", "prefill (uncached) tokens",
              "warm / partial / cold requests", "TTFT p50 / p95", "TTFT warm", "TTFT partial", "TTFT cold"]
    cols = {"predicted (ideal cache)": [pct(pr["hit_rate"]), tok(pr["cached_tokens"]), tok(pr["uncached_tokens"]),
                                        _classes(pr["classes"]), *["n/a"] * 4]}
    if rt:
        cols["as routed (ideal per replica)"] = [pct(rt["hit_rate"]), tok(rt["cached_tokens"]),
                                                 tok(rt["uncached_tokens"]), *["n/a"] * 5]
    sim = _policy_column(policy)
    if sim:
        cols[f"{policy_name} ({policy_source or 'simulation'})"] = sim
    cols["measured (engine)"] = [pct(me["hit_rate"]), tok(me["cached_tokens"]), tok(me["uncached_tokens"]),
                                 _classes(me["classes"]), *measured_ttft]
    n = div["compared"]
    delta = None if gap["hit_rate_points"] is None else -gap["hit_rate_points"]
    out: list[Block] = [
        ("h", 3, "Prediction next to outcome"),
        ("p", f"On the {num(n)} requests whose log line carries the engine's cached tokens: prefixscan's ideal "
              f"cache of the log as sent predicted a {pct(pr['hit_rate'])} hit rate, the engine reported "
              f"{pct(me['hit_rate'])} ({_pp(delta)}). "
              f"The {tok(gap['cached_tokens'])} tokens between them split by the miss attribution (the `misses` "
              f"table): routing {tok(gap['lost_routing_tokens'])}, eviction {tok(gap['lost_eviction_tokens'])}, "
              f"unexplained {tok(gap['lost_unexplained_tokens'])}, minus {tok(gap['engine_excess_tokens'])} the "
              "engine reported above the prediction. Classes of both sides by the same rule (above)."
              + (" The simulation's TTFT classes follow the simulator's own rule (docs/simulator.md) and its "
                 "requests are those after its warm-up." if sim else "")),
        ("table", ["", *cols], [[label, *[c[i] for c in cols.values()]] for i, label in enumerate(labels)]),
        ("p", "Each request by its predicted and its measured class: where the engine served a request the "
              "prediction called warm as partial or cold, its TTFT is the divergence's cost."),
        ("table", ["predicted", "measured", "requests", "TTFT p50 / p95", "predicted / actual cached",
                   "routing", "eviction", "unexplained", "engine above"],
         [[r["predicted_class"], r["class"], num(r["requests"]), _pair(r, "ttft"),
           f"{tok(r['predicted_cached_tokens'])} / {tok(r['actual_cached_tokens'])}",
           tok(r["lost_routing_tokens"]), tok(r["lost_eviction_tokens"]), tok(r["lost_unexplained_tokens"]),
           tok(r["engine_excess_tokens"])] for r in rows if r["level"] == "prediction"]),
    ]
    regular = div["input_identification"]["systematic"] or p.get("tokenizer_mismatch")
    out.append(("p", ("**Prediction and outcome diverge regularly**: " if regular else "") + p["verdict"] + "."))
    return out


def measured_steps(data: ReportData) -> dict[int, str]:
    """The rollout steps (seed 002; 3, 4, 5 counted from 1) this run's pilot measured, with what it found:
    the rollout section says so instead of asking for a measurement that is above it."""
    info = (data.pilot or {}).get("summary") or {}
    out: dict[int, str] = {}
    pred = info.get("prediction")
    if pred:
        out[3] = (f"measured: the engine reported a {pct(pred['measured']['hit_rate'])} hit rate where the ideal "
                  f"cache predicts {pct(pred['predicted']['hit_rate'])}; {pred['verdict']} (\"Prediction next "
                  "to outcome\" above).")
    d = info.get("decisions")
    if d and d.get("left_warm", {}).get("share") is not None:
        out[4] = (f"measured from the router's decision log: {pct(d['left_warm']['share'])} of decisions left a "
                  "warm candidate (\"By routing decision\" above).")
    warm = (info.get("by_class") or {}).get("warm") or {}
    if warm.get("ttft_requests"):
        out[5] = (f"measured: warm TTFT p50 / p95 {_pair(warm, 'ttft')} (the pilot section above; `prefixscan "
                  "diff` compares it with a control run or pool).")
    return out


def against(c: Any) -> list[Block]:
    """Pilot against control in the report's before/after section (`report --compare-to`): per class, the
    requests, TTFT and queue wait p50 / p95 of both runs, B - A (prefixscan.compare.pilot)."""
    from prefixscan.compare.pilot import pilot_json

    groups = pilot_json(c)["groups"]

    def cell(v: dict[str, Any]) -> str:
        delta = "n/a" if v["delta"] is None else f"{v['delta'] * 1000:+,.0f} ms"
        return f"{ms(v['a'])} / {ms(v['b'])} ({delta})"

    rows = [[esc(g), f"{num(d['requests']['a'])} / {num(d['requests']['b'])}", cell(d["ttft_p50_s"]),
             cell(d["ttft_p95_s"]), cell(d["queue_wait_p95_s"])] for g, d in groups.items()]
    h = groups["all"]["hit_rate"]
    return [("p", f"The pilot's measurement, before / after (change): hit rate {pct(h['a'])} / {pct(h['b'])}, by "
                  f"{esc(c.a.cached_source)} / {esc(c.b.cached_source)} cached tokens."
                  + "".join(f" {esc(w)}." for w in c.warnings)),
            ("table", ["class", "requests", "TTFT p50", "TTFT p95", "queue wait p95"], rows)]
