"""Attach engine evidence (metrics scrapes, KV events) to a finished run: tables and a manifest section."""

from __future__ import annotations

import os
from dataclasses import dataclass

from prefixscan.evidence.join import EventsJoin, join_events
from prefixscan.evidence.metrics import MetricsComparison, served
from prefixscan.io.run import Run, load_run
from prefixscan.io.rundir import add_tables


@dataclass(frozen=True)
class Evidence:
    """What the engine's own evidence says about a run."""

    metrics: MetricsComparison | None
    kv_events: EventsJoin | None

    def sentences(self) -> list[str]:
        out: list[str] = []
        for part in (self.metrics, self.kv_events):
            if part is not None:
                out += part.sentences()
        return out

    def to_json(self) -> dict:
        return {"metrics": None if self.metrics is None else self.metrics.to_json(),
                "kv_events": None if self.kv_events is None else self.kv_events.to_json()}


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
    ev = Evidence(comparison, joined)
    tables = {"kv_events_join": joined.table} if joined is not None else {}
    add_tables(run_dir, tables, "evidence", ev.to_json())
    return ev
