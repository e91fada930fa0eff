"""Which log keys became tenant, timestamp, conversation and replica (issue 27): one summary line, the
same in --json and the manifest, and a --field path that matches (almost) nothing is warned about with the
nearest keys the log has, instead of leaving a column null with exit 0."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

import prefixscan
from prefixscan.cli.app import app
from tests.conftest import chat, write_jsonl

runner = CliRunner()


def _meta_log(tmp_path: Path) -> Path:
    recs = []
    for i in range(8):
        r = chat(i, f"c{i % 2}", 1 + i % 2)
        recs.append({"id": r["request_id"], "created": r["timestamp"], "metadata": {"team": r["tenant"]},
                     "upstream_addr": "10.0.0.1:8000", "messages": r["messages"]})
    return write_jsonl(tmp_path / "meta.jsonl", recs)


def test_a_mistyped_field_path_is_warned_with_the_nearest_keys(tmp_path: Path) -> None:
    log = _meta_log(tmp_path)
    r = runner.invoke(app, ["analyze", str(log), "--field", "tenant=metadata.teem", "--no-findings"])
    assert r.exit_code == 0, r.output
    out = " ".join(r.stdout.split())  # the terminal wraps long lines
    assert ("--field tenant=metadata.teem matched 0 of 8 records (tenant stays null where it does not match); "
            "nearest keys in the log: metadata.team") in out
    assert "tenant <- metadata.teem (--field; matched no record)" in out


def test_a_field_path_matching_most_records_is_not_warned(tmp_path: Path) -> None:
    res = prefixscan.analyze(str(_meta_log(tmp_path)), findings=False, fields=(("tenant", "metadata.team"),))
    assert not any("matched" in n for n in res.summary["notes"])
    assert res.summary["input"]["fields"]["tenant"] == {"from": ["metadata.team"], "records": 8, "of": 8,
                                                        "mapped": True}


def test_the_summary_names_the_keys_each_field_came_from(tmp_path: Path) -> None:
    run = tmp_path / "run"
    team = ["--field", "tenant=metadata.team"]
    r = runner.invoke(app, ["analyze", str(_meta_log(tmp_path)), "--no-findings", "-o", str(run), *team])
    assert r.exit_code == 0, r.output
    line = ("fields: tenant <- metadata.team, timestamp <- created (epoch s), conversation <- (inferred), "
            "replica <- upstream_addr")
    assert line in " ".join(r.stdout.split())
    r = runner.invoke(app, ["analyze", str(_meta_log(tmp_path)), "--no-findings", "--json", "-q", *team])
    summary = json.loads(r.stdout)
    assert summary["input"]["fields"]["line"] == line
    assert summary["input"]["fields"]["conversation_id"]["inferred"] == 8
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["analyze"]["summary"]["input"]["fields"]["line"] == line


def test_fields_of_a_plain_chat_log_and_a_trace(tmp_path: Path, chat_log: Path) -> None:
    res = prefixscan.analyze(str(chat_log), findings=False)
    assert res.summary["input"]["fields"]["line"] == ("fields: tenant <- tenant, timestamp <- timestamp (epoch s), "
                                                      "conversation <- conversation_id, replica <- (none)")
    trace = write_jsonl(tmp_path / "t.jsonl", [{"timestamp": i * 10, "input_length": 1024, "output_length": 1,
                                                "hash_ids": [0, i]} for i in range(4)])
    res = prefixscan.analyze(str(trace), findings=False)
    assert res.summary["input"]["fields"]["timestamp"]["read_as"] == ["relative ms"]
