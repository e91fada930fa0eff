"""The router's decision log (`analyze --decisions FILE`): one JSON object per request, in the form seed 002
shows, read like a request log (JSONL, JSON array, gzip, zstd or Parquet); docs/pilot.md "The router's
decision log" gives its fields and rules. `request_id` and `decision` are required; a row that breaks the
rules is a reject with where and why, never the value, and a second row for one request id a
`duplicate_id` reject (the first is kept). `prefixscan.pilot.decisions` joins it to the requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from prefixscan.errors import InputError, RejectError
from prefixscan.read.readers import RawError, read_source
from prefixscan.read.record import RecordError
from prefixscan.read.sources import Source, expand
from prefixscan.redact import reject_detail

COUNTS = ("predicted_cached_tokens", "actual_cached_tokens", "prefill_tokens")
SCHEMA = {"request_id": pl.String, "decision": pl.String, "selected_worker": pl.String,
          "candidates": pl.Int64, "candidates_known": pl.Boolean, "selected_is_candidate": pl.Boolean,
          "best_candidate_tokens": pl.Int64, "selected_candidate_tokens": pl.Int64,
          "predicted_cached_tokens": pl.Int64, "actual_cached_tokens": pl.Int64, "prefill_tokens": pl.Int64,
          "queue_wait_s": pl.Float64}


@dataclass
class DecisionLog:
    """The accepted rows (one per request id, columns of SCHEMA) and the rejects of the decision log."""

    files: list[str]
    rows: pl.DataFrame
    rejects: list[dict[str, Any]] = field(default_factory=list)

    @property
    def read(self) -> int:
        """Rows read: accepted + rejected."""
        return self.rows.height + len(self.rejects)


def sources(path: str) -> list[Source]:
    """The decision log's files (a file, directory or glob, as a log argument); InputError when none."""
    try:
        return expand([path])
    except InputError as exc:
        raise InputError(f"--decisions: {exc}") from None


def _name(v: Any, key: str, required: bool = False) -> str | None:
    if v is None or v == "":
        if required:
            raise RecordError("missing_field", reject_detail(key, "is missing"))
        return None
    if isinstance(v, bool) or not isinstance(v, str | int):
        raise RecordError("wrong_type", reject_detail(key, "is not a string or an integer", v))
    return str(v)


def _count(v: Any, key: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or (isinstance(v, float) and not v.is_integer()):
        raise RecordError("wrong_type", reject_detail(key, "is not a whole number of tokens", v))
    if v < 0:
        raise RecordError("out_of_range", reject_detail(key, "is negative"))
    return int(v)


def _wait(v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise RecordError("wrong_type", reject_detail("queue_wait_ms", "is not a number of milliseconds", v))
    if v != v or v < 0:  # NaN (a Parquet float) or negative
        raise RecordError("out_of_range", reject_detail("queue_wait_ms", "is negative or not a number"))
    return v / 1000


def _candidates(v: Any, selected: str | None, predicted: int | None) -> dict[str, Any]:
    """Candidate columns: how many, whether the selected worker is one, and (object form) the best
    candidate's predicted tokens and the selected worker's."""
    if v is None:
        return {"candidates": None, "candidates_known": False, "selected_is_candidate": None,
                "best_candidate_tokens": None, "selected_candidate_tokens": None}
    if not isinstance(v, list):
        raise RecordError("wrong_type", reject_detail("candidate_workers", "is not a list", v))
    names, tokens = [], {}
    for item in v:
        if isinstance(item, dict):
            name = _name(item.get("worker"), "candidate_workers[].worker", required=True)
            n = _count(item.get("predicted_cached_tokens"), "candidate_workers[].predicted_cached_tokens")
            if n is not None:
                tokens[name] = n
        else:
            name = _name(item, "candidate_workers[]", required=True)
        names.append(name)
    best = max(tokens.values()) if tokens else None
    mine = None if not tokens else tokens.get(selected, predicted or 0) if selected is not None else predicted or 0
    return {"candidates": len(names), "candidates_known": True,
            "selected_is_candidate": None if selected is None else selected in names,
            "best_candidate_tokens": best, "selected_candidate_tokens": mine}


def parse_row(obj: dict[str, Any]) -> dict[str, Any]:
    """One decision row as the columns of SCHEMA; RecordError (reason, detail) when it breaks the rules."""
    rid = _name(obj.get("request_id"), "request_id", required=True)
    decision = obj.get("decision")
    if decision is not None and not isinstance(decision, str):
        raise RecordError("wrong_type", reject_detail("decision", "is not a string", decision))
    if not decision:
        raise RecordError("missing_field", reject_detail("decision", "is missing"))
    selected = _name(obj.get("selected_worker"), "selected_worker")
    row: dict[str, Any] = {"request_id": rid, "decision": decision, "selected_worker": selected,
           **{k: _count(obj.get(k), k) for k in COUNTS}, "queue_wait_s": _wait(obj.get("queue_wait_ms"))}
    row.update(_candidates(obj.get("candidate_workers"), selected, row["predicted_cached_tokens"]))
    return row


def read_decisions(path: str, strict: bool = False) -> DecisionLog:
    """Every row of the decision log, accepted or rejected; RejectError at the first bad row under --strict."""
    srcs = sources(path)
    rows: list[dict[str, Any]] = []
    rejects: list[dict[str, Any]] = []
    seen: set[str] = set()
    for src in srcs:
        for line, obj in read_source(src):
            try:
                if isinstance(obj, RawError):
                    raise RecordError(obj.reason, obj.detail)
                row = parse_row(obj)
                if row["request_id"] in seen:
                    raise RecordError("duplicate_id", "a second decision row for a request id already read "
                                                      "(the first is kept)")
            except RecordError as bad:
                if strict:
                    raise RejectError(f"{src.path}:{int(line)}: {bad.reason}: {bad.detail} "
                                      "(run without --strict to collect rejects)") from None
                rejects.append({"source_file": src.path, "source_line": int(line), "reason": bad.reason,
                                "detail": bad.detail})
                continue
            seen.add(row["request_id"])
            rows.append(row)
    return DecisionLog([s.path for s in srcs], pl.DataFrame(rows, schema=SCHEMA), rejects)
