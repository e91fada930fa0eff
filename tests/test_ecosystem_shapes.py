"""Ecosystem log shapes: OpenTelemetry GenAI spans (OTLP JSON and flat), Anthropic Messages, OpenAI Responses,
OpenAI batch files with no clock, and the log's own prompt token counts as a tokenizer check."""

from __future__ import annotations

import json

import polars as pl
import pytest

import prefixscan
from prefixscan.errors import NothingAcceptedError, UsageError
from prefixscan.read.otel import otlp_value
from tests.conftest import write_jsonl

SYS = "You are the support assistant of a furniture shop. Answer from the catalogue only. " * 12
SKU = {"type": "object", "properties": {"sku": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Find a product", "parameters": SKU}}]


def attr(key, value):
    if isinstance(value, bool):
        v = {"boolValue": value}
    elif isinstance(value, int):
        v = {"intValue": str(value)}  # OTLP JSON writes int64 as a string
    else:
        v = {"stringValue": value if isinstance(value, str) else json.dumps(value)}
    return {"key": key, "value": v}


def genai(i: int, conv: str, turn: int, cached: int | None = None) -> dict:
    msgs = [{"role": "user", "parts": [{"type": "text", "content": f"Question {t} in {conv}: is the oak table "
                                                                  f"in stock?"}]} for t in range(turn)]
    if turn > 1:
        msgs.insert(1, {"role": "assistant", "parts": [{"type": "tool_call", "id": f"call{i}", "name": "lookup",
                                                         "arguments": {"sku": "oak-1"}}]})
        msgs.insert(2, {"role": "tool", "parts": [{"type": "tool_call_response", "id": f"call{i}",
                                                    "result": {"stock": 3}}]})
    a = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "gen_ai.conversation.id": conv,
         "gen_ai.input.messages": json.dumps(msgs),
         "gen_ai.system_instructions": json.dumps([{"type": "text", "content": SYS}]),
         "gen_ai.tool.definitions": json.dumps(TOOLS), "gen_ai.usage.input_tokens": 500,
         "gen_ai.usage.output_tokens": 20}
    if cached is not None:
        a["gen_ai.usage.cache_read.input_tokens"] = cached
    return a


def test_otlp_values() -> None:
    assert otlp_value({"intValue": "12"}) == 12 and otlp_value({"stringValue": "x"}) == "x"
    assert otlp_value({"arrayValue": {"values": [{"intValue": "1"}, {"boolValue": True}]}}) == [1, True]
    assert otlp_value({"kvlistValue": {"values": [{"key": "a", "value": {"doubleValue": 1.5}}]}}) == {"a": 1.5}


def test_otlp_export_spans_become_requests(tmp_path) -> None:
    spans = [{"traceId": "t1", "spanId": f"s{i}", "name": "chat m",
              "startTimeUnixNano": str(1_795_000_000_000_000_000 + i * 10**9),
              "attributes": [attr(k, v) for k, v in genai(i, f"c{i % 2}", i // 2 + 1, cached=0).items()]}
             for i in range(6)]
    spans.append({"traceId": "t1", "spanId": "http", "name": "GET /", "startTimeUnixNano": "1795000000000000000",
                  "attributes": [attr("gen_ai.operation.name", "embeddings")]})  # a GenAI span without messages
    line = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {"name": "x"}, "spans": spans}]}]}
    log = write_jsonl(tmp_path / "otlp.jsonl", [line, {"resourceSpans": []}])
    r = prefixscan.analyze(str(log), findings=False)
    s = r.summary
    assert s["requests"]["read"] == 8 and s["requests"]["accepted"] == 6
    assert s["requests"]["rejects_by_reason"] == {"not_a_genai_request": 1, "empty_otlp_batch": 1}
    req = pl.from_arrow(r.tables["requests"])
    assert set(req["conversation_id"]) == {"c0", "c1"} and req["request_id"].to_list()[0] == "s0"
    assert req["actual_cached_tokens"].to_list() == [0] * 6
    # the tool call and its result are in the prompt: later turns are longer than the first
    assert req.filter(pl.col("turn_index") > 0)["prompt_tokens"].min() > req["prompt_tokens"].min()
    assert any("prompt token counts differ" in n for n in s["notes"])  # 500 reported, not what we count


def test_flat_span_per_line_with_aliases(tmp_path) -> None:
    recs = []
    for i in range(4):
        a = genai(i, "conv-a", i + 1)
        a["gen_ai.usage.cache_read_input_tokens"] = 64 * i  # an older alias
        recs.append({"name": "chat", "context": {"trace_id": "t", "span_id": f"x{i}"},
                     "start_time": f"2026-11-20T09:00:0{i}Z", "attributes": a})
    r = prefixscan.analyze(str(write_jsonl(tmp_path / "spans.jsonl", recs)), findings=False)
    req = pl.from_arrow(r.tables["requests"])
    assert req["request_id"].to_list() == ["x0", "x1", "x2", "x3"]
    assert req["actual_cached_tokens"].to_list() == [0, 64, 128, 192]
    assert r.summary["by_hit_source"]["same_conversation"]["requests"] == 3


def anthropic(i: int, turns: int, wrapped: bool) -> dict:
    msgs = []
    for t in range(turns):
        msgs.append({"role": "user", "content": [{"type": "text", "text": f"Turn {t}: what about the chairs?"}]})
        if t < turns - 1:
            msgs.append({"role": "assistant", "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": f"tu{t}", "name": "lookup", "input": {"sku": "chair"}}]})
            msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"tu{t}",
                                                      "content": "12 in stock"}]})
    body = {"model": "claude-x", "max_tokens": 100,
            "system": [{"type": "text", "text": SYS, "cache_control": {"type": "ephemeral"}}], "messages": msgs,
            "tools": [{"name": "lookup", "description": "Find", "input_schema": {"type": "object"}}]}
    usage = {"input_tokens": 30, "output_tokens": 9, "cache_read_input_tokens": 400 * (turns > 1),
             "cache_creation_input_tokens": 100}
    if wrapped:
        return {"timestamp": f"Mon, 20 Nov 2026 09:00:{i:02d} GMT", "session_id": "s1", "request": body,
                "response": {"id": f"msg_{i}", "usage": usage}}
    return {**body, "usage": usage, "id": f"msg_{i}", "@timestamp": 1_795_000_000 + i, "conversation_id": "s1"}


@pytest.mark.parametrize("wrapped", [False, True])
def test_anthropic_messages(tmp_path, wrapped: bool) -> None:
    log = write_jsonl(tmp_path / "a.jsonl", [anthropic(i, i + 1, wrapped) for i in range(3)])
    r = prefixscan.analyze(str(log), findings=False)
    assert r.summary["requests"]["accepted"] == 3
    req = pl.from_arrow(r.tables["requests"])
    assert req["actual_cached_tokens"].to_list() == [0, 400, 400]
    assert req["request_id"].to_list() == ["msg_0", "msg_1", "msg_2"]
    assert req["conversation_id"].to_list() == ["s1"] * 3
    assert req["cached_tokens"].to_list()[1] > 0  # the second turn extends the first
    assert r.summary["input"]["shapes"][str(log)] == ("gateway" if wrapped else "anthropic")


def test_responses_api_chains_turns(tmp_path) -> None:
    recs = []
    for i in range(3):
        body = {"model": "gpt-x", "instructions": SYS,
                "input": [{"role": "user", "content": [{"type": "input_text", "text": f"Turn {i}, again?"}]}]}
        if i:
            body["previous_response_id"] = f"resp_{i - 1}"
        recs.append({"created_at": 1_795_000_000 + i, "request": body,
                     "response": {"id": f"resp_{i}", "object": "response",
                                  "usage": {"input_tokens": 300, "output_tokens": 5,
                                            "input_tokens_details": {"cached_tokens": 256 * (i > 0)}}}})
    recs.append({"created_at": 1_795_000_009, "request": {"input": "A lone question"},
                 "response": {"id": "resp_x", "usage": {"input_tokens": 4}}})
    r = prefixscan.analyze(str(write_jsonl(tmp_path / "r.jsonl", recs)), findings=False)
    req = pl.from_arrow(r.tables["requests"])
    assert req["conversation_id"].to_list() == ["resp_0", "resp_0", "resp_0", "resp_x"]
    assert req["actual_cached_tokens"].to_list() == [0, 256, 256, None]
    assert req["request_id"].to_list() == ["resp_0", "resp_1", "resp_2", "resp_x"]


def test_batch_file_uses_input_order(tmp_path) -> None:
    recs = [{"custom_id": f"job-{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": "m", "messages": [{"role": "system", "content": SYS},
                                                 {"role": "user", "content": f"Item {i}"}]}} for i in range(5)]
    r = prefixscan.analyze(str(write_jsonl(tmp_path / "batch.jsonl", recs)), findings=False)
    assert r.summary["requests"]["accepted"] == 5
    req = pl.from_arrow(r.tables["requests"])
    assert req["request_id"].to_list() == [f"job-{i}" for i in range(5)]
    assert req["arrival_s"].to_list() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert any("no clock of their own" in n for n in r.summary["notes"])


def test_order_input_overrides_timestamps(tmp_path) -> None:
    recs = [{"request_id": f"r{i}", "timestamp": 1_795_000_000 - i * 60, "messages": [
        {"role": "user", "content": f"hello {i}"}]} for i in range(3)]
    r = prefixscan.analyze(str(write_jsonl(tmp_path / "o.jsonl", recs)), findings=False, order="input")
    assert pl.from_arrow(r.tables["requests"])["request_id"].to_list() == ["r0", "r1", "r2"]
    with pytest.raises(UsageError, match="--order must be time or input"):
        prefixscan.analyze(str(tmp_path / "o.jsonl"), findings=False, order="random")


@pytest.mark.parametrize("bad, reason", [
    ({"resourceSpans": [{"scopeSpans": [{"spans": [{"spanId": "a", "startTimeUnixNano": "1", "attributes": [
        {"key": "gen_ai.input.messages", "value": {"stringValue": "[1, 2]"}}]}]}]}]}, "bad_message"),
    ({"model": "c", "system": "x", "messages": "not json"}, "wrong_type"),
    # (a Responses record with no timestamp: accepted in input order now, issue 27; the reject of one in a
    # timed file is tests/test_inputs_clock.py)
])
def test_malformed_ecosystem_records_are_rejects(tmp_path, bad, reason) -> None:
    log = write_jsonl(tmp_path / "bad.jsonl", [bad, "not json", bad])
    with pytest.raises(NothingAcceptedError) as exc:  # nothing accepted: exit 3, as the CLI
        prefixscan.analyze(str(log), findings=False, format="auto")
    s = exc.value.result.summary["requests"]
    assert s["read"] == s["accepted"] + s["rejected"]
    assert s["accepted"] == 0 and s["rejects_by_reason"] == {reason: 2, "invalid_json": 1}, s


def test_field_paths_quote_dotted_keys_and_map_messages(tmp_path) -> None:
    from prefixscan.read.record import get_path, split_path

    assert split_path('attributes."gen_ai.request.model"') == ("attributes", "gen_ai.request.model")
    assert split_path("a.'b.c'.d") == ("a", "b.c", "d")
    assert get_path({"a": {"x.y": {"z": 3}}}, 'a."x.y".z') == 3
    with pytest.raises(ValueError, match="unclosed quote"):
        split_path('a."b')
    recs = [{"span": {"start": 1_795_000_000 + i, "attributes": {
        "llm.model_name": "m", "session.id": "sess",
        "llm.input_messages": json.dumps([{"role": "system", "content": SYS},
                                          {"role": "user", "content": f"Turn {i}"}])}}} for i in range(3)]
    log = write_jsonl(tmp_path / "openinference.jsonl", recs)
    r = prefixscan.analyze(str(log), findings=False, fields=(
        ("messages", 'span.attributes."llm.input_messages"'), ("timestamp", "span.start"),
        ("model", 'span.attributes."llm.model_name"'), ("conversation_id", 'span.attributes."session.id"')))
    req = pl.from_arrow(r.tables["requests"])
    assert r.summary["requests"]["accepted"] == 3 and req["conversation_id"].to_list() == ["sess"] * 3
    assert req["model"].to_list() == ["m"] * 3 and req["cached_tokens"].to_list()[1] > 0


def test_zstd_files_and_directory_skips(tmp_path) -> None:
    import pyarrow as pa

    from tests.conftest import ROOT

    data = (ROOT / "sample_logs" / "chat.jsonl").read_bytes()
    d = tmp_path / "logs"
    d.mkdir()
    with pa.output_stream(str(d / "chat.jsonl.zst"), compression="zstd") as f:
        f.write(data)
    (d / "notes.txt").write_text("not a log")
    (d / "export.csv").write_text("a,b\n")
    r = prefixscan.analyze(str(d), findings=False)
    assert r.summary["requests"]["accepted"] == 400
    note = next(n for n in r.summary["notes"] if "were skipped" in n)
    assert "2 file(s)" in note and "notes.txt" in note and "export.csv" in note
    whole = (d / "chat.jsonl.zst").read_bytes()
    (tmp_path / "cut.jsonl.zst").write_bytes(whole[: len(whole) // 2])
    r = prefixscan.analyze(str(tmp_path / "cut.jsonl.zst"), findings=False)
    s = r.summary["requests"]
    assert s["rejects_by_reason"] == {"corrupt_file": 1} and 100 < s["accepted"] < 400
    assert s["read"] == s["accepted"] + s["rejected"]
