"""Logs whose records carry no timestamp (issue 27): bare OpenAI chat and Anthropic bodies are read in
input order with --order input, and by default when a file's first record has no timestamp; a run that
accepts nothing is one error line (exit 3) after the counts, never tables of zeros, from the CLI and from
`prefixscan.analyze()`."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import prefixscan
from prefixscan.cli.app import app
from prefixscan.errors import NothingAcceptedError
from tests.conftest import SYSTEM, chat, write_jsonl

runner = CliRunner()


def _openai(i: int) -> dict:
    return {"model": "gpt-4o", "messages": chat(i, f"c{i % 3}", 1 + i % 3)["messages"]}


def _anthropic(i: int) -> dict:
    msgs = [m for m in chat(i, f"c{i % 3}", 1 + i % 3)["messages"] if m["role"] != "system"]
    return {"model": "claude-sonnet-4", "max_tokens": 512, "system": SYSTEM, "messages": msgs}


@pytest.mark.parametrize("make", [_openai, _anthropic], ids=["openai-chat", "anthropic"])
@pytest.mark.parametrize("order", [[], ["--order", "input"]], ids=["default", "order-input"])
def test_bare_bodies_without_a_timestamp_are_read_in_input_order(tmp_path: Path, make, order: list) -> None:
    log = write_jsonl(tmp_path / "bodies.jsonl", [make(i) for i in range(9)])
    r = runner.invoke(app, ["analyze", str(log), "--json", "-q", "--no-findings", *order])
    assert r.exit_code == 0, r.output
    res = prefixscan.analyze(str(log), findings=False, order="input" if order else "time")
    assert res.summary["requests"] == {"read": 9, "accepted": 9, "rejected": 0, "rejects_by_reason": {}}
    assert res.tables["requests"].column("timestamp_s").to_pylist() == [float(i) for i in range(9)]
    assert res.summary["hit_rate"]["token_weighted"] > 0.3
    assert res.summary["input"]["fields"]["timestamp"]["read_as"] == ["input order"]
    if not order:
        assert any("no timestamp on their first record" in n for n in res.summary["notes"])


def test_order_input_times_records_that_have_timestamps_by_order_too(tmp_path: Path) -> None:
    recs = [chat(i, "c", 1, ts=100 - i) for i in range(3)] + [_openai(7)]
    log = write_jsonl(tmp_path / "mixed.jsonl", recs)
    res = prefixscan.analyze(str(log), findings=False, order="input")
    assert res.summary["requests"]["accepted"] == 4
    assert res.tables["requests"].column("timestamp_s").to_pylist() == [0.0, 1.0, 2.0, 3.0]


def test_a_missing_timestamp_in_a_timed_file_is_still_a_reject(tmp_path: Path) -> None:
    log = write_jsonl(tmp_path / "timed.jsonl", [chat(0, "c", 1), _openai(1), chat(2, "c", 2)])
    res = prefixscan.analyze(str(log), findings=False)
    assert res.summary["requests"]["rejects_by_reason"] == {"missing_timestamp": 1}
    detail = res.tables["rejects"].column("detail").to_pylist()[0]
    assert "--field timestamp=PATH" in detail and "--order input" in detail


def test_a_responses_record_without_a_timestamp_in_a_timed_file_is_a_reject(tmp_path: Path) -> None:
    timed = {"created_at": 1_700_000_000, "request": {"instructions": "Be brief.", "input": "hi"},
             "response": {"id": "r1"}}
    untimed = {"request": {"instructions": "Be brief.", "input": "hello"}, "response": {"id": "r2"}}
    res = prefixscan.analyze(str(write_jsonl(tmp_path / "r.jsonl", [timed, untimed])), findings=False)
    assert res.summary["requests"]["rejects_by_reason"] == {"missing_timestamp": 1}


def test_a_mapped_timestamp_that_is_absent_is_never_replaced_by_input_order(tmp_path: Path) -> None:
    log = write_jsonl(tmp_path / "b.jsonl", [_openai(i) for i in range(3)])
    with pytest.raises(NothingAcceptedError, match="missing_timestamp 3"):
        prefixscan.analyze(str(log), findings=False, fields=(("timestamp", "meta.time"),))


def test_nothing_accepted_prints_the_counts_and_one_error_line_only(tmp_path: Path) -> None:
    log = write_jsonl(tmp_path / "bad.jsonl", ["{oops", '{"messages": 5, "timestamp": 1}'])
    r = runner.invoke(app, ["analyze", str(log), "-o", str(tmp_path / "run")])
    assert r.exit_code == 3
    assert r.stdout.strip().splitlines() == ["records read 2 = accepted 0 + rejected 2  (rejects: invalid_json 1, "
                                             "wrong_type 1)"]
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("prefixscan: error: no record accepted: 2 read")
    assert "0.0%" not in r.output and "cache breakers" not in r.output and "Traceback" not in r.output
    assert (tmp_path / "run" / "rejects.parquet").exists()


def test_the_library_raises_nothing_accepted_with_the_run_attached(tmp_path: Path) -> None:
    log = write_jsonl(tmp_path / "bad.jsonl", ["{oops", "[1]"])
    with pytest.raises(NothingAcceptedError, match="no record accepted: 2 read, 2 rejected") as exc:
        prefixscan.analyze(str(log), findings=False)
    assert exc.value.result.summary["requests"]["rejects_by_reason"] == {"invalid_json": 1, "not_an_object": 1}
