"""Prediction next to outcome (issue 31): prefixscan's ideal cache (and, when the run holds one, the chosen
simulation's or estimate's policy) against what the engine did, from the pilot table's prediction rows and
the summary's `pilot.prediction` (prefixscan.pilot.prediction)."""

from __future__ import annotations

from typing import Any

from prefixscan.report.sections.blocks import Block, num, pct, tok

CLASSES = ("warm", "partial", "cold")


def _classes(c: dict[str, int] | None) -> str:
    return "n/a" if not c else " / ".join(num(c.get(k)) for k in CLASSES)


def _pp(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:+.1f} pp"


def _policy_column(policy: dict[str, Any] | None, ms: Any) -> list[str] | None:
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


def prediction(rows: list[dict[str, Any]], info: dict[str, Any], pair: Any, ms: Any,
               policy: dict[str, Any] | None = None, policy_name: str | None = None,
               policy_source: str = "") -> list[Block]:
    """Blocks "Prediction next to outcome"; `pair(row, metric)` formats a p50 / p95 as the pilot section does,
    `policy` is the chosen simulation's or estimate's row (report.model.POLICY_COLUMNS) when the run has one."""
    p = info.get("prediction")
    if not p:
        return [("p", "Prediction next to outcome needs the engine's cached tokens in the log "
                      "(`usage.prompt_tokens_details.cached_tokens` or `--field actual_cached_tokens=PATH`).")]
    pr, rt, me, gap, div = p["predicted"], p.get("as_routed"), p["measured"], p["gap"], p["divergence"]
    by_class = {r["class"]: r for r in rows if r["level"] == "class"}
    every = next((r for r in rows if r["level"] == "all"), None)
    measured_ttft = [pair(every, "ttft") if every else "n/a",
                     *[pair(by_class[k], "ttft") if k in by_class else "n/a" for k in CLASSES]]
    labels = ["hit rate (token-weighted)", "cached tokens", "prefill (uncached) tokens",
              "warm / partial / cold requests", "TTFT p50 / p95", "TTFT warm", "TTFT partial", "TTFT cold"]
    cols = {"predicted (ideal cache)": [pct(pr["hit_rate"]), tok(pr["cached_tokens"]), tok(pr["uncached_tokens"]),
                                        _classes(pr["classes"]), *["n/a"] * 4]}
    if rt:
        cols["as routed (ideal per replica)"] = [pct(rt["hit_rate"]), tok(rt["cached_tokens"]),
                                                 tok(rt["uncached_tokens"]), *["n/a"] * 5]
    sim = _policy_column(policy, ms)
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
         [[r["predicted_class"], r["class"], num(r["requests"]), pair(r, "ttft"),
           f"{tok(r['predicted_cached_tokens'])} / {tok(r['actual_cached_tokens'])}",
           tok(r["lost_routing_tokens"]), tok(r["lost_eviction_tokens"]), tok(r["lost_unexplained_tokens"]),
           tok(r["engine_excess_tokens"])] for r in rows if r["level"] == "prediction"]),
    ]
    regular = div["input_identification"]["systematic"] or p.get("tokenizer_mismatch")
    out.append(("p", ("**Prediction and outcome diverge regularly**: " if regular else "") + p["verdict"] + "."))
    return out
