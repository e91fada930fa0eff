"""Findings on small hand-built logs: each kind, location, tokens lost, tenant-awareness, determinism, CLI."""

from __future__ import annotations

import json
import random

import pytest
from typer.testing import CliRunner

import prefixscan
from prefixscan.cli.app import app
from prefixscan.detect.findings import JSON_KEYS
from prefixscan.errors import NothingAcceptedError
from tests.conftest import write_jsonl
from tests.test_tokenize import hf_dir  # noqa: F401 - the tiny Hugging Face tokenizer fixture

runner = CliRunner()
WORDS = "policy contract payment clause section refund invoice account customer notice period amount".split()


def prose(seed: int, paragraphs: int = 6, words: int = 60) -> str:
    r = random.Random(seed)
    return "\n\n".join(" ".join(r.choice(WORDS) for _ in range(words)).capitalize() + "." for _ in range(paragraphs))


DOC = prose(1)
SYS = "You are a careful analyst who answers only from the attached document.\n" + prose(2, 2, 40) + "\n"


def rec(i: int, system: str, user: str, tenant: str = "acme", **extra) -> dict:
    # One conversation and user per request: labels are shown only when k = 5 independent sources (users)
    # share them.
    r = {"request_id": f"r{i:03d}", "conversation_id": f"c{i:03d}", "user": f"u{i:03d}",
         "timestamp": 1_795_000_000 + i, "tenant": tenant,
         "model": "m",
         "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
    r.update(extra)
    return r


def question(i: int) -> str:
    return f"\n\nQuestion {i}: what does the {WORDS[i % len(WORDS)]} clause say about item {i * 7}?"


def ts(i: int) -> str:
    return f"2026-11-29T10:{i // 60:02d}:{i % 60:02d}Z"


@pytest.fixture
def timestamp_log(tmp_path):
    recs = [rec(i, f"Request time: {ts(i)}\n" + SYS, DOC + question(i)) for i in range(20)]
    return write_jsonl(tmp_path / "ts.jsonl", recs)


def kinds(result) -> list[str]:
    return [f.kind for f in result.findings.findings]


def test_timestamp_before_shared_document(timestamp_log) -> None:
    r = prefixscan.analyze(str(timestamp_log))
    fs = r.findings.findings
    assert [f.kind for f in fs] == ["timestamp"]
    f = fs[0]
    assert (f.tenant, f.message_index, f.role, f.char_offset, f.label) == ("acme", 0, "system", 14, "Request time")
    assert f.requests_affected == 20 and 0 < f.token_offset < 16 and f.block_index == 0
    assert f.tokens_lost > 15 * 200  # every request but the first loses the whole document
    assert "Request time" in f.fix and "after the shared content" in f.fix
    assert not any(c.isdigit() for c in f.example)  # redacted
    cf = r.summary["counterfactual"]
    assert cf["token_weighted_after_fixes"] > r.summary["hit_rate"]["token_weighted"] + 0.5
    assert set(r.summary["findings"][0]) == set(JSON_KEYS)


def test_no_findings_without_breakers_and_across_tenants(tmp_path) -> None:
    # Each tenant has its own prompt and documents: shared inside a tenant, never across. Not a finding.
    recs = []
    for i in range(40):
        tenant = ["acme", "globex", "initech"][i % 3]
        system = f"You are the assistant of {tenant}.\n" + prose(10 + i % 3, 2, 40) + "\n"
        recs.append(rec(i, system, prose(20 + i % 3) + question(i), tenant=tenant))
    r = prefixscan.analyze(str(write_jsonl(tmp_path / "clean.jsonl", recs)))
    assert r.findings.findings == []
    assert r.summary["findings"] == []
    cf = r.summary["counterfactual"]
    assert cf["token_weighted_after_fixes"] == cf["token_weighted_as_logged"] == pytest.approx(
        r.summary["hit_rate"]["token_weighted"], abs=1e-6)


def test_pattern_free_span_and_user_fields(tmp_path) -> None:
    names = ["Alice Moreau", "Bob Tanaka", "Carol Okafor", "David Rossi"]
    plans = ["Free", "Pro", "Business"]
    recs = [rec(i, f"Customer name: {names[i % 4]}\nPlan: {plans[i % 3]}\n" + SYS, DOC + question(i))
            for i in range(24)]
    r = prefixscan.analyze(str(write_jsonl(tmp_path / "tpl.jsonl", recs)))
    by = {f.label: f for f in r.findings.findings}
    assert by["Customer name"].kind == "user_name" and by["Plan"].kind == "pattern_free"
    ex = int(by["Plan"].example_request_id[1:])
    assert by["Plan"].char_offset == len(f"Customer name: {names[ex % 4]}\nPlan: ")
    assert by["Customer name"].distinct_values == 4 and "<user_name" in by["Customer name"].example


def test_normalisation_drift_kinds(tmp_path) -> None:
    tools = [{"type": "function", "function": {"name": f"tool_{k}", "description": prose(30 + k, 1, 20),
                                                "parameters": {"type": "object", "properties": {}}}}
             for k in range(4)]
    paras = prose(40, 5, 40).split("\n\n")
    recs = []
    for i in range(30):
        variant = i % 3 == 1
        system = SYS.replace("\n", "\r\n") if variant and i < 10 else SYS
        t = tools
        if variant and 10 <= i < 20:
            t = [{"function": x["function"], "type": x["type"]} for x in tools]  # key order
        if variant and i >= 20:
            t = tools[1:] + tools[:1]  # tool order
        body = "\n\n".join(paras[1::-1] + paras[2:] if variant and i >= 20 else paras)
        recs.append(rec(i, system, "Retrieved context:\n\n" + body + question(i), tools=t))
    r = prefixscan.analyze(str(write_jsonl(tmp_path / "drift.jsonl", recs)))
    assert {"line_endings", "json_key_order", "tool_order", "rag_order"} <= set(kinds(r))
    rag = next(f for f in r.findings.findings if f.kind == "rag_order")
    assert rag.message_index == 1 and rag.char_offset == len("Retrieved context:\n\n")
    tool = next(f for f in r.findings.findings if f.kind == "tool_order")
    assert (tool.message_index, tool.role) == (-1, "tools")


def test_template_churn_counts_versions(tmp_path) -> None:
    base = prose(50, 3, 50)
    cut = base.index(" ", 120)
    edited = base[:cut] + " (revision two of the policy: keep answers short)" + base[cut:]
    recs = [rec(i, "You are the analyst.\n\n" + (base if i < 15 else edited) + "\n", DOC + question(i))
            for i in range(30)]
    r = prefixscan.analyze(str(write_jsonl(tmp_path / "churn.jsonl", recs)))
    churn = [f for f in r.findings.findings if f.kind == "template_churn"]
    assert len(churn) == 1 and churn[0].detail == "2 versions serve 15/15 requests"
    assert "Pin one version" in churn[0].fix


def test_determinism_and_tables(timestamp_log, tmp_path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    prefixscan.analyze(str(timestamp_log), output=str(a))
    prefixscan.analyze(str(timestamp_log), output=str(b))
    for name in ("findings", "finding_requests"):
        assert (a / f"{name}.parquet").read_bytes() == (b / f"{name}.parquet").read_bytes()
    out = runner.invoke(app, ["query", str(a), "select count(*) as n from finding_requests"])
    assert out.exit_code == 0 and "20" in out.stdout


def test_cli_findings_and_analyze_json(timestamp_log, tmp_path) -> None:
    run = tmp_path / "run"
    r = runner.invoke(app, ["analyze", str(timestamp_log), "-o", str(run), "--json", "-q"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert [tuple(f) for f in s["findings"]] == [JSON_KEYS]
    assert set(s["counterfactual"]) >= {"token_weighted_after_fixes", "token_weighted_as_logged"}
    r = runner.invoke(app, ["findings", str(run)])
    assert r.exit_code == 0 and "timestamp" in r.stdout and "Move `Request time:`" in r.stdout
    assert "after all fixes" in r.stdout
    r = runner.invoke(app, ["findings", str(run), "--json", "--kind", "timestamp"])
    data = json.loads(r.stdout)
    assert data["findings"][0]["label"] == "Request time" and data["counterfactual"]
    r = runner.invoke(app, ["analyze", str(timestamp_log)])
    assert "Cache breakers: 1 findings" in r.stdout
    r = runner.invoke(app, ["analyze", str(timestamp_log), "-o", str(tmp_path / "nf"), "--no-findings", "-q"])
    assert r.exit_code == 0
    r = runner.invoke(app, ["findings", str(tmp_path / "nf")])
    assert r.exit_code != 0 and "no findings table" in r.stderr


def test_empty_and_hashed_inputs(tmp_path) -> None:
    empty = write_jsonl(tmp_path / "empty.jsonl", [])
    with pytest.raises(NothingAcceptedError) as nothing:
        prefixscan.analyze(str(empty))
    r = nothing.value.result
    assert r.findings.findings == [] and r.summary["counterfactual"]["requests_rewritten"] == 0
    trace = write_jsonl(tmp_path / "mc.jsonl", [{"timestamp": i, "input_length": 1024, "output_length": 8,
                                                 "hash_ids": [1, 2]} for i in range(5)])
    r = prefixscan.analyze(str(trace))
    assert r.findings.findings == []


def test_field_in_a_tool_description(tmp_path) -> None:
    def tools(i: int) -> list[dict]:
        return [{"type": "function", "function": {
            "name": f"tool_{k}",
            "description": (f"Lists orders. Current time: {ts(i)}. " if k == 0 else "") + prose(60 + k, 1, 25),
            "parameters": {"type": "object", "properties": {}}}} for k in range(3)]
    recs = [rec(i, SYS, DOC + question(i), tools=tools(i)) for i in range(12)]
    r = prefixscan.analyze(str(write_jsonl(tmp_path / "tools.jsonl", recs)))
    f = next(f for f in r.findings.findings if f.role == "tools")
    assert (f.kind, f.message_index, f.label) == ("timestamp", -1, "Current time")
    rendered = json.dumps(recs[int(f.example_request_id[1:])]["tools"][0], separators=(",", ":"))
    assert rendered[f.char_offset:].startswith("2026-11-29T10:")
    assert f.tokens_lost > 0 and f.requests_affected >= 11


def test_findings_with_a_hugging_face_tokenizer(hf_dir, timestamp_log) -> None:  # noqa: F811
    r = prefixscan.analyze(str(timestamp_log), tokenizer=f"hf:{hf_dir}")
    fs = r.findings.findings
    assert [f.kind for f in fs] == ["timestamp"] and fs[0].tokens_lost > 0
    assert fs[0].token_offset is not None and fs[0].token_offset > 0
    assert r.summary["counterfactual"]["token_weighted_after_fixes"] > r.summary["hit_rate"]["token_weighted"]
