"""Record shapes, field detection, timestamps, and every malformed-input kind going to rejects."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import prefixscan
from prefixscan.errors import InputError, NothingAcceptedError, RejectError, RunDirError, UsageError
from prefixscan.read.timestamps import parse_timestamp
from tests.conftest import chat, write_jsonl

MSGS = [{"role": "system", "content": "You are terse. " * 30}, {"role": "user", "content": "hello there"}]


def reasons(result) -> dict[str, int]:
    return result.summary["requests"]["rejects_by_reason"]


def test_every_malformed_kind_is_rejected_with_where_and_why(tmp_path) -> None:
    p = tmp_path / "bad.jsonl"
    good = [chat(i, f"c{i}", 1) for i in range(3)]
    lines = [json.dumps(r) for r in good] + [
        '{"request_id": "t1", "messages": [',                                   # truncated JSON
        json.dumps(dict(chat(10, "x", 1), messages=[])),                         # empty messages
        json.dumps(dict(chat(11, "x", 1), messages="not json")),                 # wrong type
        json.dumps(dict(chat(12, "x", 1), messages=[{"content": "no role"}])),   # bad message
        json.dumps({k: v for k, v in chat(13, "x", 1).items() if k != "timestamp"}),  # missing timestamp
        json.dumps(dict(chat(14, "x", 1), timestamp="yesterday-ish")),           # unparseable timestamp
        json.dumps(dict(chat(1, "x", 1))),                                       # duplicate id
        json.dumps(dict(chat(15, "x", 1), output_tokens="many")),               # wrong type of a field
        "[1, 2, 3]",                                                            # not an object
    ]
    with open(p, "wb") as f:
        f.write("\n".join(lines).encode() + b"\n")
        f.write(b'{"request_id": "u", "messages": "\xff\xfe"}\n')                # invalid UTF-8
    r = prefixscan.analyze(str(p), output=str(tmp_path / "run"))
    assert r.summary["requests"]["read"] == 13
    assert r.summary["requests"]["accepted"] == 3
    assert r.summary["requests"]["rejected"] == 10
    assert reasons(r) == {"invalid_json": 1, "empty_messages": 1, "wrong_type": 2, "bad_message": 1,
                          "missing_timestamp": 1, "bad_timestamp": 1, "duplicate_id": 1, "not_an_object": 1,
                          "invalid_utf8": 1}
    rejects = pq.read_table(tmp_path / "run" / "rejects.parquet").to_pylist()
    assert {x["source_line"] for x in rejects} == set(range(4, 14))
    assert all(x["source_file"] == str(p) and x["detail"] for x in rejects)
    dup = next(x for x in rejects if x["reason"] == "duplicate_id")
    assert dup["source_line"] == 10 and dup["detail"].startswith("`request_id` was already seen")
    assert "r1" not in dup["detail"]  # a request id may be a customer's (an email): never quoted


def test_strict_stops_at_first_reject(tmp_path) -> None:
    p = write_jsonl(tmp_path / "a.jsonl", [chat(0, "c", 1), "{oops"])
    with pytest.raises(RejectError, match=r"a.jsonl:2: invalid_json"):
        prefixscan.analyze(str(p), strict=True)


def test_wrappers_batch_gateway_litellm_completion_tokens(tmp_path) -> None:
    recs = [
        {"custom_id": "b1", "method": "POST", "url": "/v1/chat/completions", "timestamp": 1,
         "body": {"model": "m", "messages": MSGS}},
        {"request": {"model": "m", "messages": MSGS}, "timestamp": "2026-11-29T10:00:02Z", "id": "g1",
         "response": {"usage": {"prompt_tokens": 99, "completion_tokens": 7,
                                "prompt_tokens_details": {"cached_tokens": 64}}}},
    ]
    p1 = write_jsonl(tmp_path / "batch.jsonl", recs[:1])
    p2 = write_jsonl(tmp_path / "gw.jsonl", recs[1:])
    p3 = write_jsonl(tmp_path / "litellm.jsonl", [{
        "id": "l1", "trace_id": "t", "startTime": 1764410403.5, "model": "m", "messages": MSGS,
        "metadata": {"user_api_key_team_id": "team-a", "user_api_key_user_id": "u1"},
        "prompt_tokens": 10, "completion_tokens": 3}])
    p4 = write_jsonl(tmp_path / "comp.jsonl",
                     [{"id": "c1", "created": 1764410404, "prompt": "Once upon a time " * 9}])
    p5 = write_jsonl(tmp_path / "tok.jsonl",
                     [{"request_id": "k1", "timestamp": 5, "prompt_token_ids": list(range(40))}])
    r = prefixscan.analyze(str(p1), str(p2), str(p3), str(p4), str(p5), output=str(tmp_path / "run"))
    assert r.summary["requests"]["rejected"] == 0, r.tables["rejects"].to_pylist()
    shapes = r.summary["input"]["shapes"]
    assert shapes == {str(p1): "openai-batch", str(p2): "gateway", str(p3): "chat", str(p4): "completion",
                      str(p5): "tokens"}
    req = {row["request_id"]: row for row in r.tables["requests"].to_pylist()}
    assert set(req) == {"b1", "g1", "l1", "c1", "k1"}
    assert req["g1"]["actual_cached_tokens"] == 64 and req["g1"]["output_tokens"] == 7
    assert req["l1"]["tenant"] == "team-a" and req["l1"]["user"] == "u1" and req["l1"]["output_tokens"] == 3
    assert req["k1"]["prompt_tokens"] == 40
    # The batch, gateway and LiteLLM records carry the same messages: later ones hit the first.
    assert req["b1"]["cached_tokens"] == 0 and req["g1"]["cached_tokens"] > 0
    assert req["g1"]["predicted_minus_actual"] == req["g1"]["cached_tokens"] - 64


def test_gzip_parquet_nested_and_json_strings_and_field_override(tmp_path) -> None:
    gz = tmp_path / "a.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.write(json.dumps({"rid": "z1", "at": 1_764_410_400_000, "meta": {"team": "x"}, "messages": MSGS}) + "\n")
    t = pa.table({"rid": ["p1", "p2"], "at": [1_764_410_401_000, 1_764_410_402_000],
                  "meta": [{"team": "x"}, {"team": "y"}],
                  "messages": [json.dumps(MSGS), json.dumps(MSGS)]})
    pq.write_table(t, tmp_path / "b.parquet")
    r = prefixscan.analyze(str(tmp_path), fields=(("request_id", "rid"), ("timestamp", "at"), ("tenant", "meta.team")))
    rows = r.tables["requests"].to_pylist()
    assert [x["request_id"] for x in rows] == ["z1", "p1", "p2"]  # time order across files (ms epoch detected)
    assert [x["tenant"] for x in rows] == ["x", "x", "y"]
    assert rows[1]["arrival_s"] == pytest.approx(1.0)


def test_bailian_trace_conversations_from_parent_links(tmp_path) -> None:
    p = write_jsonl(tmp_path / "bl.jsonl", [
        {"chat_id": 1, "parent_chat_id": -1, "turn": 1, "type": "text", "timestamp": 0.0, "input_length": 48,
         "output_length": 5, "hash_ids": [1, 2, 3]},
        {"chat_id": 2, "parent_chat_id": 1, "turn": 2, "type": "text", "timestamp": 3.0, "input_length": 70,
         "output_length": 5, "hash_ids": [1, 2, 3, 4, 5]},
    ])
    r = prefixscan.analyze(str(p))
    rows = r.tables["requests"].to_pylist()
    assert r.summary["input"]["block_size"] == 16
    assert [x["conversation_id"] for x in rows] == ["1", "1"]
    assert rows[1]["cached_tokens"] == 48 and rows[1]["hit_source"] == "same_conversation"


@pytest.mark.parametrize("value,expected", [
    ("2026-11-29T10:15:00Z", 1795947300.0), ("2026-11-29 10:15:00", 1795947300.0),
    (1795947300, 1795947300.0), (1795947300000, 1795947300.0), (1795947300000000, 1795947300.0),
    ("1795947300.5", 1795947300.5)])
def test_timestamps(value, expected) -> None:
    assert parse_timestamp(value) == pytest.approx(expected)


def test_usage_errors(tmp_path) -> None:
    p = write_jsonl(tmp_path / "a.jsonl", [chat(0, "c", 1)])
    with pytest.raises(InputError, match="does not exist"):
        prefixscan.analyze(str(tmp_path / "missing.jsonl"))
    with pytest.raises(UsageError, match="unknown --format"):
        prefixscan.analyze(str(p), format="xml")
    with pytest.raises(UsageError, match="unknown --field"):
        prefixscan.analyze(str(p), fields=(("colour", "x"),))
    prefixscan.analyze(str(p), output=str(tmp_path / "run"))
    with pytest.raises(RunDirError, match="--force"):
        prefixscan.analyze(str(p), output=str(tmp_path / "run"))
    prefixscan.analyze(str(p), output=str(tmp_path / "run"), force=True)


def test_empty_input_reconciles(tmp_path) -> None:
    p = tmp_path / "empty.jsonl"
    p.write_text("\n")
    with pytest.raises(NothingAcceptedError, match="no record accepted: 0 read") as exc:  # as the CLI: exit 3
        prefixscan.analyze(str(p), output=str(tmp_path / "run"))
    r = exc.value.result
    assert r.summary["requests"] == {"read": 0, "accepted": 0, "rejected": 0, "rejects_by_reason": {}}
    assert r.summary["hit_rate"]["token_weighted"] == 0.0


def test_isolate_tenants_equals_tenant_attribution(tmp_path, chat_log) -> None:
    shared = prefixscan.analyze(str(chat_log))
    isolated = prefixscan.analyze(str(chat_log), isolate_tenants=True)
    assert isolated.summary["hit_rate"]["token_weighted"] == pytest.approx(
        shared.summary["hit_rate"]["tenant_isolated_token_weighted"])
    assert shared.summary["hit_rate"]["token_weighted"] > isolated.summary["hit_rate"]["token_weighted"]
    assert shared.summary["cross_tenant"]["tokens_lost_if_isolated"] > 0


def test_deterministic_bytes(tmp_path, chat_log) -> None:
    for name in ("r1", "r2"):
        prefixscan.analyze(str(chat_log), output=str(tmp_path / name))
    for table in ("requests", "summaries", "prefixes", "capacity_curve", "rejects"):
        a, b = (tmp_path / r / f"{table}.parquet" for r in ("r1", "r2"))
        assert a.read_bytes() == b.read_bytes()


def test_each_trace_file_has_its_own_id_space(tmp_path) -> None:
    """Mooncake ids are small integers per file (docs/engines.md, 'Public traces'): two files never share a block."""
    rec = {"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [0, 1]}
    a = write_jsonl(tmp_path / "a.jsonl", [rec])
    b = write_jsonl(tmp_path / "b.jsonl", [dict(rec, timestamp=1000)])
    r = prefixscan.analyze(str(a), str(b))
    assert [x["cached_tokens"] for x in r.tables["requests"].to_pylist()] == [0, 0]
    same = prefixscan.analyze(str(a), str(a).replace("a.jsonl", "a.jsonl"))
    assert same.summary["requests"]["accepted"] == 1


def test_trace_records_with_bad_fields_are_rejected(tmp_path) -> None:
    p = write_jsonl(tmp_path / "t.jsonl", [
        {"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [0, 1]},
        {"timestamp": 1, "input_length": 1024, "output_length": 1, "hash_ids": [0, 1.5]},
        {"timestamp": 2, "input_length": 1024, "output_length": 1, "hash_ids": [0, True]},
        {"timestamp": "x", "input_length": 1024, "output_length": 1, "hash_ids": [0]},
        {"input_length": 1024, "output_length": 1, "hash_ids": [0]},
        {"timestamp": 3, "output_length": 1, "hash_ids": [0]},
    ])
    r = prefixscan.analyze(str(p))
    assert r.summary["requests"]["accepted"] == 1
    assert reasons(r) == {"wrong_type": 2, "bad_timestamp": 1, "missing_timestamp": 1, "missing_field": 1}


def test_hash_tenants_hides_names_and_keeps_groups(tmp_path, chat_log) -> None:
    plain = prefixscan.analyze(str(chat_log))
    hashed = prefixscan.analyze(str(chat_log), hash_tenants=True, output=str(tmp_path / "run"))
    names = set(hashed.summary["by_tenant"])
    assert len(names) == 2 and all(n.startswith("t-") for n in names)
    assert not {"acme", "globex"} & names
    assert b"acme" not in (tmp_path / "run" / "requests.parquet").read_bytes()
    assert hashed.summary["hit_rate"] == plain.summary["hit_rate"]


def _parse_line_before(line: bytes) -> object:
    """parse_line as it was: UTF-8 checked by decoding first (the reference for the faster order)."""
    import orjson

    if not line.strip():
        return None
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return ("invalid_utf8", f"byte offset {exc.start} in the line")
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return ("invalid_json", str(exc)[:200])
    return obj if isinstance(obj, dict) else ("not_an_object", f"line holds a JSON {type(obj).__name__}")


pieces = st.sampled_from([b'{"a": "', b'"}', b"\xed\xa0\x80", b"\xc3\xa9", b"\xff", b"\xc3", b"[1]", b" ", b"x",
                          b"\xf0\x9f\x98\x80", b"\xe2\x82", b"\\ud800", b'"', b"{", b"}", b"\n"])


@settings(max_examples=400, deadline=None)
@given(st.lists(pieces, max_size=8), st.binary(max_size=6))
def test_parse_line_classifies_as_before(parts: list, tail: bytes) -> None:
    from prefixscan.read.readers import RawError, parse_line

    line = b"".join(parts) + tail
    got = parse_line(line)
    want = _parse_line_before(line)
    if isinstance(got, RawError):
        assert isinstance(want, tuple) and want[0] == got.reason
        if got.reason == "invalid_utf8":
            assert want[1] == got.detail
    else:
        assert got == want
