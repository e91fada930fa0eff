"""Attach engine evidence (metrics scrapes, KV events) to a finished run: tables and a manifest section.

KV events are joined with the run by block hash (`join_events`): per request, the blocks prefixscan
predicts against what the engine stored. The run must carry vLLM's own hash values (`analyze --hash
vllm:ALGO --hash-seed SEED` with the engine's algorithm and PYTHONHASHSEED). Per request: its full blocks
(predicted), how many of them the engine reported stored (BlockStored) and removed (BlockRemoved) at any
time in the recording. A run whose hashes never appear in the events is reported as a mismatch, never as
"the engine stored nothing".
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prefixscan.errors import InputError
from prefixscan.evidence.kvevents import read_events
from prefixscan.evidence.metrics import MetricsComparison, served
from prefixscan.run.load import Run, load_run
from prefixscan.run.rundir import add_tables

JOIN_SCHEMA = pa.schema([("request_id", pa.string()), ("predicted_blocks", pa.int64()),
                         ("stored_blocks", pa.int64()), ("removed_blocks", pa.int64())])


@dataclass(frozen=True)
class EventsJoin:
    """Totals of the join, with the per-request table."""

    requests: int
    predicted_blocks: int
    stored_blocks: int  # predicted blocks the engine reported stored
    removed_blocks: int  # predicted blocks the engine reported removed (evicted) at some point
    engine_only_blocks: int  # blocks the engine stored that no request of the run predicts
    gaps: int
    missing_batches: int
    table: pa.Table

    def to_json(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "table"}
        d["stored_share"] = self.stored_blocks / self.predicted_blocks if self.predicted_blocks else 0.0
        return d

    def sentences(self) -> list[str]:
        share = self.stored_blocks / self.predicted_blocks if self.predicted_blocks else 0.0
        out = [f"KV events: the engine stored {self.stored_blocks:,} of the {self.predicted_blocks:,} full blocks "
               f"prefixscan predicts ({share:.1%}) and removed {self.removed_blocks:,} of them; "
               f"{self.engine_only_blocks:,} blocks it stored are in no request of the run"]
        if self.gaps:
            out.append(f"the recording has {self.gaps} sequence gap(s) ({self.missing_batches} batches missing): "
                       "some stores and removals were not seen")
        return out


def _hash_set(events: pa.Table, kind: str) -> np.ndarray:
    rows = events.filter(pc.equal(events.column("kind"), kind)).column("block_hashes")
    flat = pc.list_flatten(rows).to_numpy(zero_copy_only=False) if len(rows) else np.zeros(0, np.uint64)
    return np.unique(flat.astype(np.uint64))


def _gap_info(events: pa.Table) -> tuple[int, int]:
    meta = (events.schema.metadata or {}).get(b"prefixscan.kv_events")
    gaps = json.loads(meta).get("gaps", []) if meta else []
    return len(gaps), sum(int(g["missing"]) for g in gaps if not g.get("recovered"))


def join_events(run_dir: str | os.PathLike[str], events_path: str | os.PathLike[str]) -> EventsJoin:
    """Join a recording with a run analysed with vLLM's hash; InputError when no hash matches."""
    run = load_run(run_dir)
    events = read_events(events_path)
    stored, removed = _hash_set(events, "BlockStored"), _hash_set(events, "BlockRemoved")
    req = run.table("requests").select(["request_id", "block_hashes"])
    lists = req.column("block_hashes")
    lengths = pc.list_value_length(lists).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(lists).to_numpy(zero_copy_only=False).astype(np.uint64)
    owner = np.repeat(np.arange(len(lengths)), lengths)
    s_hit = np.isin(flat, stored)
    r_hit = np.isin(flat, removed)
    per_s = np.bincount(owner, weights=s_hit, minlength=len(lengths)).astype(np.int64)
    per_r = np.bincount(owner, weights=r_hit, minlength=len(lengths)).astype(np.int64)
    if len(flat) and len(stored) and not s_hit.any():
        hash_opt = (run.manifest.get("config") or {}).get("hash") or "the default xxh3 hash"
        raise InputError(f"no block of run {run_dir} appears in {events_path}: the run uses {hash_opt}; analyse "
                         "with --hash vllm:ALGO --hash-seed SEED matching the engine's algorithm and PYTHONHASHSEED")
    gaps, missing = _gap_info(events)
    table = pa.table({"request_id": req.column("request_id"), "predicted_blocks": pa.array(lengths),
                      "stored_blocks": pa.array(per_s), "removed_blocks": pa.array(per_r)}, schema=JOIN_SCHEMA)
    return EventsJoin(len(lengths), int(lengths.sum()), int(per_s.sum()), int(per_r.sum()),
                      int(np.setdiff1d(stored, np.unique(flat)).size), gaps, missing, table)


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
    from prefixscan.evidence.evictions import by_class

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
