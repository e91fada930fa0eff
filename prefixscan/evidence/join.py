"""KV events joined with a run: per request, the blocks prefixscan predicts against what the engine stored.

The join is by block hash, so the run must carry vLLM's own hash values (`analyze --hash vllm:ALGO
--hash-seed SEED` with the engine's algorithm and PYTHONHASHSEED). Per request: its full blocks
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
from prefixscan.run.load import load_run

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
