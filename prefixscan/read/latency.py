"""Latency fields of a request log, in seconds: time to first token, end-to-end latency and queue wait.

Each request carries three nullable columns, `ttft_s`, `e2e_s` and `queue_wait_s`, found in this order
(docs/pilot.md, "Latency fields"): a `--field` mapping whose name says the log's unit (`MAPPABLE`); a key
by name with its unit (`CANDIDATES`: gateway fields, vLLM's `metrics`, OTel's time to first chunk); the
difference of two clocks (LiteLLM's `completionStartTime - startTime` and `endTime - startTime`, an OTel
span's end minus start). A value that is not a non-negative number, or an end before its start, rejects
the record: a latency of the wrong kind would otherwise skew every percentile in silence.
"""

from __future__ import annotations

import math
from typing import Any

from prefixscan.read.otel import span_attributes
from prefixscan.read.record import Plan, RecordError, get_path
from prefixscan.read.timestamps import parse_timestamp
from prefixscan.redact import reject_detail

COLUMNS = ("ttft_s", "e2e_s", "queue_wait_s")
MS = 1000.0  # units per second: a value is divided by it (35 ms is 0.035 s exactly as written, not 35 * 1e-3)
# --field names: the column each fills and how many of the log's units make a second.
MAPPABLE: dict[str, tuple[str, float]] = {
    "ttft_s": ("ttft_s", 1.0), "ttft_ms": ("ttft_s", MS),
    "e2e_s": ("e2e_s", 1.0), "e2e_ms": ("e2e_s", MS),
    "queue_wait_s": ("queue_wait_s", 1.0), "queue_wait_ms": ("queue_wait_s", MS),
}
# Keys looked up by name, per column, in order, with their unit. A bare name (no unit suffix) is taken
# as seconds, the unit OpenTelemetry uses for durations; map it with --field NAME_ms=PATH when it is not.
CANDIDATES: dict[str, tuple[tuple[str, float], ...]] = {
    "ttft_s": (("ttft_s", 1.0), ("ttft_ms", MS), ("time_to_first_token_ms", MS), ("time_to_first_token", 1.0),
               ("metrics.time_to_first_token_ms", MS), ("response.metrics.time_to_first_token_ms", MS)),
    "e2e_s": (("e2e_s", 1.0), ("e2e_ms", MS), ("latency_ms", MS)),
    "queue_wait_s": (("queue_wait_s", 1.0), ("queue_wait_ms", MS), ("queue_time_ms", MS), ("queue_time", 1.0),
                     ("metrics.queue_time_ms", MS), ("response.metrics.queue_time_ms", MS)),
}
OTEL_TTFT = "gen_ai.response.time_to_first_chunk"  # seconds, from the client's request to the first chunk
_SCALE = {c: dict(cands) for c, cands in CANDIDATES.items()}
# The candidate paths per column: shapes plans them with its own fields, one plan per record layout.
PATHS = {c: tuple(p for p, _ in cands) for c, cands in CANDIDATES.items()}


def conflicting(names: list[str]) -> list[str]:
    """Columns mapped twice by --field (e.g. both ttft_s and ttft_ms): a usage error."""
    seen: dict[str, str] = {}
    out = []
    for n in names:
        if n in MAPPABLE:
            col = MAPPABLE[n][0]
            if col in seen and seen[col] != n:
                out.append(f"{seen[col]} and {n}")
            seen[col] = n
    return out


def seconds(value: Any, name: str, per_second: float = 1.0) -> float | None:
    """A duration field in seconds: None when absent; RecordError when not a non-negative finite number."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise RecordError("wrong_type", f"`{name}` should be a number of {_unit(per_second)}, got a boolean")
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass  # still a string: refused below
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RecordError("wrong_type", reject_detail(name, f"should be a number of {_unit(per_second)}", value))
    if value < 0:
        raise RecordError("out_of_range", reject_detail(name, "is negative", value))
    return float(value) / per_second


def _unit(per_second: float) -> str:
    return "seconds" if per_second == 1.0 else "milliseconds"


def _clock(value: Any, name: str) -> float:
    """One end of a LiteLLM call (epoch seconds, or an ISO time some exports write)."""
    try:
        return parse_timestamp(value)
    except (ValueError, TypeError, OverflowError):
        raise RecordError("bad_timestamp", reject_detail(name, "is neither ISO-8601 nor an epoch number",
                                                         value)) from None


def _between(start: float, end: float, what: str) -> float:
    d = end - start
    if d < 0:
        raise RecordError("out_of_range", f"{what} is before the start of the call")
    return d


def read(holders: tuple[dict[str, Any], ...], obj: dict[str, Any], overrides: dict[str, str], span: bool,
         plan: Plan, where: dict[str, str | None] | None = None) -> tuple[float | None, float | None, float | None]:
    """(ttft_s, e2e_s, queue_wait_s) of one record; `holders` as in shapes.normalise, `obj` the outer
    record (a converted OTel span keeps its own keys there), `span` when it came from an OTel span, `plan`
    the holders' field plan (record.FieldPlans, with PATHS among its fields). `where`, when given, gets each
    column found by name or convention and where it came from, with the unit it was read in (the summary's
    `fields` line says so: a key without a unit in its name is read as seconds, which the user should see)."""
    if not (span or overrides or plan["ttft_s"] or plan["e2e_s"] or plan["queue_wait_s"]) and all(
            h.get("startTime") is None for h in holders):
        return None, None, None  # the usual log: no latency anywhere (one check per record)
    out: dict[str, float | None] = dict.fromkeys(COLUMNS)
    src: dict[str, str] = {}
    mapped = set()
    for name, path in overrides.items():
        if name in MAPPABLE:
            col, per_second = MAPPABLE[name]
            out[col] = seconds(get_path(obj, path), name, per_second)
            mapped.add(col)
    for col in COLUMNS:
        if col in mapped:
            continue
        for path, dotted, i in plan[col]:
            v = get_path(holders[i], path) if dotted else holders[i].get(path)
            if v is not None:
                out[col] = seconds(v, path, _SCALE[col][path])
                src[col] = f"{path} ({'ms' if _SCALE[col][path] == MS else 's'})"
                break
    if span:
        _span_times(obj, out, mapped, src)
    elif out["ttft_s"] is None or out["e2e_s"] is None:
        _litellm_times(holders, out, mapped, src)
    if where is not None:
        where.update(src)
    return out["ttft_s"], out["e2e_s"], out["queue_wait_s"]


def _litellm_times(holders: tuple[dict[str, Any], ...], out: dict[str, float | None], mapped: set[str],
                   src: dict[str, str]) -> None:
    """LiteLLM's StandardLoggingPayload: the call's start, its first chunk and its end, epoch seconds."""
    holder = next((h for h in holders if h.get("startTime") is not None), None)
    if holder is None:
        return
    first, end = holder.get("completionStartTime"), holder.get("endTime")
    if first is None and end is None:
        return
    start = _clock(holder["startTime"], "startTime")
    if out["ttft_s"] is None and "ttft_s" not in mapped and first is not None:
        out["ttft_s"] = _between(start, _clock(first, "completionStartTime"), "completionStartTime")
        src["ttft_s"] = "completionStartTime - startTime"
    if out["e2e_s"] is None and "e2e_s" not in mapped and end is not None:
        out["e2e_s"] = _between(start, _clock(end, "endTime"), "endTime")
        src["e2e_s"] = "endTime - startTime"


def _span_times(span: dict[str, Any], out: dict[str, float | None], mapped: set[str], src: dict[str, str]) -> None:
    """An OpenTelemetry GenAI span: its time-to-first-chunk attribute and its own start and end."""
    if out["ttft_s"] is None and "ttft_s" not in mapped:
        out["ttft_s"] = seconds(span_attributes(span).get(OTEL_TTFT), OTEL_TTFT)
        if out["ttft_s"] is not None:
            src["ttft_s"] = f"{OTEL_TTFT} (s)"
    if out["e2e_s"] is None and "e2e_s" not in mapped:
        start = span.get("startTimeUnixNano", span.get("start_time_unix_nano"))
        end = span.get("endTimeUnixNano", span.get("end_time_unix_nano"))
        if start is not None and end is not None:
            out["e2e_s"] = _between(_nanos(start, "startTimeUnixNano"), _nanos(end, "endTimeUnixNano"),
                                    "endTimeUnixNano") * 1e-9
            src["e2e_s"] = "endTimeUnixNano - startTimeUnixNano"


def _nanos(value: Any, name: str) -> int:
    """An OTLP time: integer nanoseconds, often a decimal string (JSON has no 64-bit integers); kept an
    integer so the difference of two is exact."""
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise RecordError("wrong_type", reject_detail(name, "should be integer nanoseconds", value))
