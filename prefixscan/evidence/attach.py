"""Attach engine evidence (metrics scrapes, KV events) to a finished run: tables and a manifest section."""

from __future__ import annotations

import os
from dataclasses import dataclass

from prefixscan.evidence.join import EventsJoin, join_events
from prefixscan.evidence.metrics import MetricsComparison, served
from prefixscan.run.load import Run, load_run
from prefixscan.run.rundir import add_tables


@dataclass(frozen=True)
class Evidence:
    """What the engine's own evidence says about a run."""

    metrics: MetricsComparison | None
    kv_events: EventsJoin | None
    evictions: dict | None = None  # by warm / partial / cold request (prefixscan.evidence.evictions)

    def sentences(self) -> list[str]:
        out: list[str] = []
        for part in (self.metrics, self.kv_events):
            if part is not None:
                out += part.sentences()
        if self.evictions is not None:
            out.append(eviction_sentence(self.evictions))
        return out

    def to_json(self) -> dict:
        kv = None if self.kv_events is None else self.kv_events.to_json()
        if kv is not None and self.evictions is not None:
            kv["evictions"] = self.evictions
        return {"metrics": None if self.metrics is None else self.metrics.to_json(), "kv_events": kv}


def eviction_sentence(e: dict) -> str:
    """KV evictions and the age of evicted blocks, by class, in one line."""
    def age(d: dict) -> str:
        p50, p95 = d["evicted_age_p50_s"], d["evicted_age_p95_s"]
        return "age n/a" if p50 is None else f"age p50 {p50:,.3g} s / p95 {p95:,.3g} s"

    a = e["all"]
    parts = [f"{k} {d['evicted_requests']:,} of {d['requests']:,} requests, {d['evicted_blocks']:,} evictions, "
             f"{age(d)}" for k, d in e["by_class"].items()]
    return (f"KV evictions: {a['evicted_blocks']:,} blocks removed ({age(a)}); by class: " + "; ".join(parts)
            + " (pilot table, levels eviction_all and eviction)")


def _evictions(run, kv_events: str, tables: dict) -> dict | None:  # a Run (run/load.py)
    """The pilot table with its eviction rows (a run with a pilot table only), and their summary."""
    if not run.has("pilot"):
        return None
    import pyarrow as pa
    import pyarrow.compute as pc

    from prefixscan.evidence.evictions import by_class
    from prefixscan.evidence.kvevents import read_events

    block = int((run.manifest.get("config") or {}).get("block_size") or 16)
    rows, info = by_class(run, read_events(kv_events), block)
    pilot = run.table("pilot")
    kept = pilot.filter(pc.invert(pc.starts_with(pilot.column("level"), "eviction")))
    tables["pilot"] = pa.concat_tables([kept, rows.cast(kept.schema)])
    return info


def _measured(run: Run) -> float | None:
    """The log's own engine-reported hit rate (token-weighted), as the estimator measures it."""
    from prefixscan.cost.measure import engine_reported

    e = engine_reported(run.table("requests"))
    return e.hit_rate_token_weighted if e is not None and e.prompt_tokens else None


def attach_evidence(run_dir: str | os.PathLike[str], metrics: list[str] | None = None,
                    kv_events: str | None = None) -> Evidence:
    """Compare the run with the engine's counters and/or KV events, and save the result in the run."""
    run = load_run(run_dir)
    analysis = run.analysis
    comparison = None
    if metrics:
        comparison = MetricsComparison(served(list(metrics)),
                                       int((analysis.summary.get("tokens") or {}).get("prompt", 0)),
                                       float(analysis.hit_rate.get("token_weighted", 0.0)), _measured(run))
    joined = join_events(run_dir, kv_events) if kv_events else None
    tables = {"kv_events_join": joined.table} if joined is not None else {}
    ev = Evidence(comparison, joined, _evictions(run, kv_events, tables) if kv_events else None)
    add_tables(run_dir, tables, "evidence", ev.to_json())
    return ev
