"""Attach engine evidence (metrics scrapes, KV events) to a finished run: tables and a manifest section.

KV events are joined with the run by block hash (`join_events`): per request, its full blocks (predicted)
and how many of them the engine reported stored and removed. The run must carry vLLM's own hash values
(`analyze --hash vllm:ALGO --hash-seed SEED`); a run whose hashes never appear in the events is a mismatch,
never "the engine stored nothing". Prometheus scrapes give the hit rate the engine served (`served`):
its counters (`COUNTERS`: vLLM's and SGLang's, in tokens) only grow, so the rate over the logged window is
the ratio of the deltas between a scrape before and one after, not the rolling "hit rate" log line
(docs/engines.md, "What the engine reports").
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prefixscan.errors import InputError
from prefixscan.evidence.kvevents import read_events
from prefixscan.run.load import Run, load_run
from prefixscan.run.rundir import add_tables
from prefixscan.schema import fields

# (queries counter, hits counter) per engine, in the order they are tried.
COUNTERS = {
    "vllm": ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"),
    "vllm-gpu": ("vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total"),
    "sglang": ("sglang:prompt_tokens_total", "sglang:cached_tokens_total"),
}
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\d+)?$")
TOLERANCE_COVERAGE = 0.01  # the scrapes' query tokens must be within 1% of the log's prompt tokens


def parse_exposition(text: str) -> dict[str, float]:
    """Sum of every sample per metric name (all label sets), from the Prometheus text format.

    A name with the legacy unsuffixed spelling (`vllm:prefix_cache_queries`) is filed under `_total` too.
    """
    out: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        m = _LINE.match(line) if not line.startswith("#") else None  # comments, TYPE and HELP lines
        if m is None:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if not math.isfinite(value):
            continue
        name = m.group(1)
        if name.endswith("_created"):
            continue
        out[name] = out.get(name, 0.0) + value
    return out


@dataclass(frozen=True)
class Served:
    """What the engine served over the window: query tokens, hit tokens, and which counters said so."""

    engine: str
    queries: float
    hits: float
    scrapes: int  # 2: a before/after delta; 1: counters since the engine started

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries > 0 else 0.0


def _counters(values: dict[str, float]) -> tuple[str, float, float] | None:
    for engine, (q, h) in COUNTERS.items():
        qv = values.get(q, values.get(q.removesuffix("_total")))
        hv = values.get(h, values.get(h.removesuffix("_total")))
        if qv is not None and hv is not None:
            return engine, qv, hv
    return None


def read_scrape(path: str | os.PathLike[str]) -> tuple[str, float, float]:
    """(engine, queries, hits) of one scrape file; an error naming the file when it has no such counters."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError(f"cannot read metrics file {p}: {exc.strerror}") from None
    found = _counters(parse_exposition(text))
    if found is None:
        names = ", ".join(f"{q} and {h}" for q, h in COUNTERS.values())
        raise InputError(f"{p} has no prefix-cache counters (looked for {names}); scrape the engine's /metrics")
    return found


def served(paths: list[str]) -> Served:
    """The served window from one scrape (since start) or two (after minus before)."""
    if len(paths) not in (1, 2):
        raise InputError("give --metrics once (a scrape after the window) or twice (before, then after)")
    scrapes = [read_scrape(p) for p in paths]
    if len({s[0] for s in scrapes}) != 1:
        raise InputError("the two metrics scrapes come from different engines")
    engine, q, h = scrapes[-1]
    if len(scrapes) == 2:
        _, q0, h0 = scrapes[0]
        if q < q0 or h < h0:
            raise InputError(f"counters went down between {paths[0]} and {paths[1]}: the engine restarted, or "
                             "the files are in the wrong order (before first)")
        q, h = q - q0, h - h0
    return Served(engine, q, h, len(scrapes))


@dataclass(frozen=True)
class MetricsComparison:
    """Served (engine counters) against predicted (the run), with whether the windows line up."""

    served: Served
    log_prompt_tokens: int
    predicted_ideal: float
    measured_in_log: float | None  # the log's own engine-reported cached tokens, token-weighted

    @property
    def coverage(self) -> float:
        return self.served.queries / self.log_prompt_tokens if self.log_prompt_tokens else 0.0

    @property
    def same_window(self) -> bool:
        return abs(self.coverage - 1.0) <= TOLERANCE_COVERAGE

    def to_json(self) -> dict:
        return {"engine": self.served.engine, "scrapes": self.served.scrapes, "queries": self.served.queries,
                "hits": self.served.hits, "served_hit_rate": self.served.hit_rate,
                "log_prompt_tokens": self.log_prompt_tokens, "coverage": self.coverage,
                "same_window": self.same_window, "tolerance": TOLERANCE_COVERAGE,
                "predicted_ideal_hit_rate": self.predicted_ideal, "measured_in_log_hit_rate": self.measured_in_log}

    def sentences(self) -> list[str]:
        """What the comparison says, in words that follow from the numbers."""
        s, out = self.served, []
        out.append(f"engine counters ({s.engine}, {'before/after delta' if s.scrapes == 2 else 'since start'}): "
                   f"{s.hits:,.0f} of {s.queries:,.0f} prompt tokens hit the prefix cache ({s.hit_rate:.1%}); "
                   f"prefixscan's ideal cache: {self.predicted_ideal:.1%}")
        if not self.same_window:
            out.append(f"the counters cover {self.coverage:.1%} of the log's {self.log_prompt_tokens:,} prompt "
                       f"tokens (tolerance ±{TOLERANCE_COVERAGE:.0%}): the scrapes and the log are not the same "
                       "window, or the engine tokenises differently; compare rates, not tokens")
        if s.hit_rate > self.predicted_ideal + 1e-9:
            out.append("the engine served more hits than an ideal cache over this log allows: it saw traffic "
                       "outside the log (warm-up, other clients) or the log is missing requests")
        else:
            out.append(f"the engine is {100 * (self.predicted_ideal - s.hit_rate):.1f} points below the ideal "
                       "cache: finite KV memory and routing (see the capacity curve and `prefixscan simulate`)")
        return out


JOIN_SCHEMA = pa.schema(fields("request_id:string predicted_blocks:int64 stored_blocks:int64 removed_blocks:int64"))


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
