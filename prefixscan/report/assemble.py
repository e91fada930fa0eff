"""Assemble ReportData from a run directory, without re-analysing.

Numbers come from the run's tables (summaries, capacity_curve, prefixes, sim_*, findings) and manifest;
the cost section comes from the saved `estimate.json` or, when the report is given scenario options, from
the estimator run at that scenario (it replays round robin and the router when the saved simulation
does not match). One scenario serves every section and is named at the top. Like `report.model`, this
module never imports the renderers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from prefixscan.errors import PrefixscanError
from prefixscan.redact import redact_snippet
from prefixscan.report.model import (
    BREAKDOWNS,
    FINDING_COLUMNS,
    GIB,
    POLICY_COLUMNS,
    TOP_FINDINGS,
    TOP_PREFIXES,
    TOP_TENANTS,
    Capacity,
    HitRate,
    KvBasis,
    ReportData,
    Traffic,
)
from prefixscan.run.load import Run, read_schema_file, read_table_file


def _rows(table: pa.Table, columns: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    names = [c for c in (columns or table.column_names) if c in table.column_names]
    return table.select(names).to_pylist()


def _traffic(run: Run) -> Traffic:
    counts = run.analysis.requests
    want = ["arrival_s", "tenant", "conversation_id", "model", "prompt_tokens", "output_tokens", "actual_cached_tokens",
            "cached_tokens"]
    path = run.checked_file("requests")
    have = set(read_schema_file(path, run.path).names)
    t = read_table_file(path, run.path, columns=[c for c in want if c in have])
    n = t.num_rows

    def col(name: str) -> np.ndarray:
        if name not in t.column_names:
            return np.zeros(0)
        return t.column(name).to_numpy(zero_copy_only=False)

    def distinct(name: str) -> int:
        if name not in t.column_names:
            return 0
        return len(t.column(name).drop_null().unique())

    from prefixscan.sim.rate import activity

    arrival, prompt, cached = col("arrival_s").astype(float), col("prompt_tokens"), col("cached_tokens")
    act = activity(arrival) if n else None
    span = float(arrival.max() - arrival.min()) if n else 0.0
    out = t.column("output_tokens").drop_null().to_numpy() if "output_tokens" in t.column_names else []
    actual_mask = np.zeros(n, bool)
    actual = np.zeros(n)
    if "actual_cached_tokens" in t.column_names:
        a = t.column("actual_cached_tokens")
        actual_mask = ~a.is_null().to_numpy(zero_copy_only=False)
        actual = a.fill_null(0).to_numpy()
    pct = lambda q: float(np.percentile(prompt, q)) if n else 0.0  # noqa: E731
    return Traffic(
        requests_read=n if counts.read is None else counts.read,
        requests_accepted=n if counts.accepted is None else counts.accepted,
        requests_rejected=counts.rejected or 0,
        rejects_by_reason=dict(counts.rejects_by_reason),
        span_s=span,
        rps=(n / span if span > 0 else None),
        prompt_tokens=int(prompt.sum()) if n else 0,
        cached_tokens=int(cached.sum()) if n else 0,
        prompt_p50=pct(50),
        prompt_p90=pct(90),
        prompt_p99=pct(99),
        output_tokens_mean=float(np.mean(out)) if len(out) else None,
        tenants=distinct("tenant"),
        conversations=distinct("conversation_id"),
        models=distinct("model"),
        with_actual_cached=int(actual_mask.sum()),
        actual_cached_tokens=int(actual[actual_mask].sum()),
        predicted_cached_tokens_for_actual=int(cached[actual_mask].sum()) if n else 0,
        busy_note=act.summary() if act else None,
        busy_rps=act.rps if act and act.gappy else None,
    )


def _summaries(data: ReportData, run: Run) -> None:
    from prefixscan.cost.replay import finite

    rows = run.table("summaries").to_pylist()
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["dimension"], []).append(r)
    whole = (by.get("all") or [{}])[0]
    steady = (by.get("steady_state") or [{}])[0]
    labels = (
        ("token-weighted (cached / prompt tokens)", "token_weighted"),
        ("block-weighted (hit blocks / all blocks)", "block_weighted"),
        ("mean of per-request hit fractions (AIPerf)", "request_mean"),
    )
    data.hit_rates = [HitRate(label, finite(whole.get(k)), finite(steady.get(k))) for label, k in labels]
    data.tenant_isolated = finite(run.analysis.tenant_isolated_hit_rate)
    for dim in BREAKDOWNS:
        rs = by.get(dim, [])
        if dim == "turn_index":
            rs = sorted(rs, key=lambda r: (not r["key"].isdigit(), int(r["key"]) if r["key"].isdigit() else 0,
                                           r["key"]))
        else:
            rs = sorted(rs, key=lambda r: (-r["prompt_tokens"], r["key"]))
        if dim == "tenant" and len(rs) > TOP_TENANTS:
            data.breakdown_omitted[dim] = len(rs) - TOP_TENANTS
            rs = rs[:TOP_TENANTS]
        if rs and not (len(rs) == 1 and rs[0]["key"] == "(none)"):
            data.breakdowns[dim] = rs


def _capacity(run: Run, ideal: float | None, kv: KvBasis, replica_kv: int | None) -> Capacity | None:
    t = run.table("capacity_curve")
    if t.num_rows == 0:
        return None
    pts = [{**r, "capacity_gib": r["capacity_tokens"] * kv.bytes_per_token / GIB} for r in t.to_pylist()]

    # analyze stores the exact capacities (from the every-capacity LRU curve) in the summary; runs written
    # before that get the first grid point that reaches the fraction.
    exact = run.analysis.exact_capacity

    def need(frac: float) -> int | None:
        key = f"lru_tokens_for_{int(frac * 100)}pct_of_ideal"
        if key in exact:
            return exact[key]
        if not ideal:
            return None
        return next((int(p["capacity_tokens"]) for p in pts if p["lru_hit_rate"] >= frac * ideal), None)

    return Capacity(pts, need(0.5), need(0.9), replica_kv)


def _prefixes(run: Run) -> list[dict[str, Any]]:
    t = run.table("prefixes")
    cols = ("rank", "prefix_tokens", "hits", "tokens_saved", "tenants", "cross_tenant_hits", "median_reuse_gap_s",
            "snippet")
    rows = _rows(t.slice(0, TOP_PREFIXES), cols)
    for r in rows:  # the table is already redacted; redacting again is idempotent and keeps the promise
        r["snippet"] = redact_snippet(r.get("snippet") or "", 80) or "(no text: hashed trace)"
    return rows


def _findings(data: ReportData, run: Run) -> None:
    t = run.table("findings")
    rows = _rows(t, FINDING_COLUMNS)
    rows.sort(key=lambda r: (-(r.get("tokens_lost") or 0), str(r.get("kind")), str(r.get("tenant"))))
    for r in rows:
        if r.get("example") is not None:
            r["example"] = redact_snippet(str(r["example"]), 80)
    data.findings_total = {"findings": len(rows), "tokens_lost": int(sum(r.get("tokens_lost") or 0 for r in rows))}
    data.findings = rows[:TOP_FINDINGS]


def _estimate_policies(data: ReportData, run: Run) -> bool:
    """Use the estimate's own replay for the policy table when it did not come from the saved simulation
    (which is then named, so a reader who ran `simulate --name NAME` sees why its table is not shown)."""
    est = data.estimate or {}
    if (est.get("baselines") or {}).get("basis") != "replay" or not est.get("policy_rows"):
        return False
    data.policies = [{k: r.get(k) for k in POLICY_COLUMNS} for r in est["policy_rows"]]
    sc = est["scenario"]
    data.sim = {"replicas": sc["replicas"], "model": sc["model"], "gpu": sc["gpu"],
                "kv_blocks_per_replica": sc["kv_blocks_per_replica"], "block_size": sc["block_size"],
                "knowledge": "exact"}
    detail = str(est["baselines"]["detail"])
    if run.sim is not None and run.sim.own_name:
        detail = detail.replace("the saved simulation", f"the saved simulation `{run.sim.name}`")
    data.policies_source = f"the estimate's replay: {detail}"
    data.best_policy = (est.get("verdict") or {}).get("router_policy")
    return True


def _sim_results(data: ReportData, run: Run) -> bool:
    """The chosen simulation's KV-tier and prefill/decode results (its own, per policy); True when it has
    any: the estimate's replay cannot stand in for such a simulation."""
    data.simulation = run.simulation
    pols = run.sim.policies if run.sim is not None else {}
    rows = [{"policy": name, **m} for name, m in pols.items()]
    if run.has("sim_policies"):  # the table keeps the run's policy order; the manifest sorts keys
        order = [p for p in run.table("sim_policies").column("policy").to_pylist()]
        rows.sort(key=lambda r: order.index(r["policy"]) if r["policy"] in order else len(order))
    data.sim_tiers = [r for r in rows if "hit_rate_gpu" in r]
    data.sim_pd = [r for r in rows if "decode_replicas" in r]
    return bool(data.sim_tiers or data.sim_pd)


def _sim(data: ReportData, run: Run) -> None:
    rows = _rows(run.table("sim_policies"), POLICY_COLUMNS)
    data.policies = rows
    sim = run.sim
    assert sim is not None  # the run has sim_policies
    data.policies_source = "the run's saved simulation" + (f" `{sim.name}`" if sim.own_name else "")
    data.sim = {k: getattr(sim, k) for k in ("decode_replicas", "replicas", "model", "gpu", "kv_blocks_per_replica",
                                             "block_size", "unbounded_kv", "prefill_model", "knowledge")}
    from prefixscan.cost.verdict import adoptable

    routers = [r for r in rows if adoptable(r["policy"]) and r.get("hit_rate_token_weighted") is not None]
    best = max(routers, key=lambda r: (r["hit_rate_token_weighted"], r["policy"]), default=None)
    est_best = ((data.estimate or {}).get("verdict") or {}).get("router_policy")
    data.best_policy = est_best if data.policy(est_best) else (best["policy"] if best else None)
    if data.best_policy and run.has("sim_decisions"):
        t = read_table_file(
            run.file("sim_decisions"), run.path,  # type: ignore[arg-type]  # has(): the file exists
            columns=["policy", "decision", "queue_wait_s", "measured"],
            filters=[("policy", "=", data.best_policy)],
        )
        groups: dict[str, list[float]] = {}
        for r in t.to_pylist():
            if r["measured"]:
                groups.setdefault(r["decision"] or "(none)", []).append(r["queue_wait_s"])
        data.queue_by_decision = [
            {"decision": d, "requests": len(ws), "queue_wait_mean_s": float(np.mean(ws)),
             "queue_wait_p95_s": float(np.percentile(ws, 95))}
            for d, ws in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))]


def _kv(run: Run, est: dict[str, Any] | None) -> KvBasis:
    """KV bytes per token for the scenario's model and KV dtype (the saved simulation's, else defaults)."""
    from prefixscan.cost.scenario import DEFAULT_DTYPE, DEFAULT_GPU, DEFAULT_MODEL
    from prefixscan.hardware.flops import dtype_bytes
    from prefixscan.hardware.models import get_model

    sc = (est or {}).get("scenario") or {}
    sim = run.sim
    if sc:
        model, dtype, gpu, src = sc["model"], sc["kv_dtype"], sc["gpu"], "the report's scenario"
    else:
        src = "the simulation's model" if sim is not None and sim.model else "default"
        model = (sim.model if sim else None) or DEFAULT_MODEL
        dtype = (sim.dtype if sim else None) or DEFAULT_DTYPE
        gpu = (sim.gpu if sim else None) or DEFAULT_GPU
    try:
        spec = get_model(model)
        per_token = spec.kv_bytes_per_token(dtype_bytes(dtype))
    except PrefixscanError:  # a --model-config model: the estimate carries its KV bytes
        spec, per_token = None, float((est or {}).get("kv_bytes_per_token") or 0.0)
    return KvBasis(spec.name if spec else model, dtype, gpu, per_token, src)


def _estimate(data: ReportData, run: Run, options: Any | None) -> None:
    """The report's scenario: options given now (flags, prefixscan.toml) merged field by field with the saved
    estimate (prefixscan.cost.saved.merge_options); the saved result itself when nothing changes and the
    run did not change since, else a fresh estimate at the merged scenario."""
    from prefixscan.cost.estimator import estimate
    from prefixscan.cost.saved import is_stale, merge_options, same_scenario
    from prefixscan.cost.scenario import FLAG, SAVED

    saved = run.estimate
    scenario = saved.scenario if saved is not None else None
    line = (saved.command_line if saved is not None else "") or "prefixscan estimate"
    merged = merge_options(scenario, options)
    if saved is not None and not is_stale(saved.document, run) and same_scenario(scenario or {}, merged):
        data.estimate = dict(saved.result)
        sc = dict(data.estimate.get("scenario") or {})
        # from the report's view: options given now keep their label, the estimate's own flags are saved
        sc["sources"] = {k: (merged.sources.get(k, FLAG) if getattr(merged, k, None) is not None else
                             SAVED if v == FLAG else v) for k, v in (sc.get("sources") or {}).items()}
        data.estimate["scenario"] = sc
        data.estimate_source = f"saved by `{line}` (estimate.json)"
    else:
        try:
            data.estimate = estimate(merged, run).to_json()
        except PrefixscanError as exc:
            data.estimate_error = str(exc)
            return
        if saved is None:
            data.estimate_source = ("`prefixscan estimate` at the report's options" if options is not None else
                                    "`prefixscan estimate` defaults on this run")
        elif is_stale(saved.document, run.path):
            data.estimate_source = (f"re-estimated at the scenario `{line}` saved in estimate.json, with the "
                                    "report's options over it (the run changed since: re-analysed or "
                                    "re-simulated)")
        else:
            data.estimate_source = (f"re-estimated: the report's options over the scenario `{line}` saved in "
                                    "estimate.json")
    data.scenario = (data.estimate.get("scenario") or {}).get("description")


def _config_note(stage: str, manifest: dict[str, Any]) -> str:
    """For a stage that did not record its command line: the settings that differ from the defaults."""
    cfg = (manifest.get(stage) or {}).get("config") or {}
    default: dict[str, Any] = {}
    if stage == "simulate":
        from prefixscan.sim.config import SimConfig

        default = SimConfig().to_dict()
    same = {k for k in cfg if k in default and json.dumps(default[k], default=str) == json.dumps(cfg[k])}
    diffs = [f"{k}={json.dumps(cfg[k])}" for k in sorted(cfg) if k not in same]
    return f"# {stage} settings that differ from the defaults: {', '.join(diffs) or 'none'}"


def build(run_dir: str | os.PathLike[str] | Run, options: Any | None = None,
          simulation: str | None = None) -> ReportData:
    """Assemble the report for a run (a directory or a `Run`; reads tables and the manifest, never
    re-analyses).

    `options` (an `EstimateOptions`) sets the scenario; None reuses the saved estimate.json, else prices
    the run with the estimator's defaults (the saved simulation's scenario when there is one). `simulation`
    names the stored simulation to report (default: the Run's, else `default`, else the most recent); a
    simulation named so (or a Run opened with one named), or one with KV tiers or disaggregation, gives the
    routing section its own results.
    """
    run = Run.open(run_dir, simulation)
    m = run.manifest
    cfg = m.get("config", {})
    commands = [("analyze", m["command_line"])] if m.get("command_line") else []
    for stage in ("findings", "simulate"):
        line = (m.get(stage) or {}).get("command_line") if isinstance(m.get(stage), dict) else None
        if line:
            commands.append((stage, line))
        elif isinstance(m.get(stage), dict):
            commands.append((f"{stage}: command line not recorded in the manifest", _config_note(stage, m)))
    data = ReportData(
        run_path=str(Path(run_dir)),
        version=str(m.get("version", "")),
        commands=commands,
        inputs=list(m.get("inputs", [])),
        setup={k: cfg.get(k) for k in ("tokenizer", "block_size", "hit_rule", "granularity", "isolate_tenants")},
        kv=KvBasis("", "", "", 0.0, ""),
    )
    _estimate(data, run, options)
    data.kv = _kv(run, data.estimate)
    if "estimate.json" in data.estimate_source:
        data.commands.append(("estimate", data.estimate_source.split("`")[1]))
    rd = data.run_path
    for table, section, again in (("requests", "traffic", ""), ("summaries", "reuse", ""),
                                  ("capacity_curve", "capacity", " --force"), ("prefixes", "prefixes", " --force"),
                                  ("findings", "findings", " --force")):  # analyze writes them all
        if not run.has(table):
            data.missing[section] = f"prefixscan analyze LOGS -o {rd}{again}"
    if run.has("requests"):
        data.traffic = _traffic(run)
    if run.has("summaries"):
        _summaries(data, run)
    if data.estimate_error:
        data.missing["estimate"] = f"prefixscan simulate {rd}"
    if run.has("capacity_curve"):
        ideal = data.hit_rates[0].whole if data.hit_rates else None
        data.capacity = _capacity(run, ideal, data.kv, (data.estimate or {}).get("kv_capacity_tokens_per_replica"))
    data.prefixes = _prefixes(run) if run.has("prefixes") else []
    if run.has("findings"):
        _findings(data, run)
    own = _sim_results(data, run) or run.named
    if own and run.has("sim_policies"):
        _sim(data, run)
    elif _estimate_policies(data, run):
        pass
    elif run.has("sim_policies"):
        _sim(data, run)
    else:
        data.missing["policies"] = f"prefixscan simulate {rd}"
    notes = list(run.analysis.notes)
    if data.traffic and data.traffic.requests_accepted == 0:
        notes.append("The run has no accepted requests: every section below is empty.")
    data.notes = notes
    data.misses = run.analysis.summary.get("miss_attribution")
    if run.has("pilot"):
        data.pilot = {"rows": run.table("pilot").to_pylist(), "summary": run.analysis.summary.get("pilot")}
    return data


def figure_dir(output: str | os.PathLike[str]) -> Path:
    """Where report.md's figures live (report.html embeds them)."""
    return Path(output) / "report_figures"
