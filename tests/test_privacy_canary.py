"""Canary test: unique customer strings in every text field never reach a default output.

The log holds, per conversation, a made-up customer name, email, account id and phone number in the system
prompt, the user and assistant messages, a tool description and malformed records, plus canary tenant and
user names. Every command (analyze, findings, simulate, estimate, report, query, check, diff, export) runs
with its defaults; every file of the run (Parquet decoded to text, manifest, Markdown, HTML), the exported
trace and everything printed is scanned. Tenant and user names are identities the operator asked to keep
(`--hash-tenants` hashes them): by default they may appear only as tenant/user values, never in a snippet
or an example; with `--hash-tenants` they appear nowhere. `--include-text` lets the text through.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from prefixscan.cli.app import app
from tests.conftest import write_jsonl

runner = CliRunner()
CONVERSATIONS, TURNS = 8, 3
SYSTEM = ("You are the support assistant of a parcel company. Be brief and polite, quote the policy, and never "
          "promise a refund you cannot give. ") * 6


def _who(c: int) -> dict[str, str]:
    """The canaries of conversation c: nothing like them appears anywhere else in the log."""
    return {"name": f"Zyqorv Blemkat{c}x", "email": f"zyqorv.canary{c}@blemkat-mail.example",
            "account": f"ACCT-QZX{c}Q{c}W", "phone": f"+44 7700 9{c}0{c}{c}{c}"}


TENANTS = ["tenant-Vorquill", "tenant-Maskrel"]
USERS = [f"user-Quendrix{c}" for c in range(CONVERSATIONS)]


def _log(path: Path) -> Path:
    recs = []
    for c in range(CONVERSATIONS):
        w = _who(c)
        card = f"Customer: {w['name']}\nEmail: {w['email']}\nAccount: {w['account']}\nPhone: {w['phone']}\n"
        msgs = [{"role": "system", "content": card + SYSTEM}]
        tools = [{"type": "function", "function": {"name": "lookup", "description": f"Orders of {w['name']}.",
                                                   "parameters": {"type": "object", "properties": {}}}}]
        for t in range(TURNS):
            msgs = msgs + [{"role": "user", "content": f"Hi, {w['name']} here ({w['email']}); where is my "
                                                       f"parcel {w['account']}-{t}?"}]
            recs.append({"request_id": f"r{c}-{t}", "timestamp": 1_795_000_000 + 10 * c + t,
                         "tenant": TENANTS[c % 2], "user": USERS[c], "conversation_id": f"conv-{c}",
                         "model": "m", "messages": msgs, "tools": tools})
            msgs = msgs + [{"role": "assistant", "content": f"Dear {w['name']}, parcel {w['account']} is on its "
                                                            "way and arrives tomorrow."}]
    w = _who(0)  # malformed records quoting customer text: their reject details must not
    recs += ['{"messages": [{"role": "user", "content": "' + w["name"] + '"',
             {"request_id": "bad-1", "timestamp": w["name"], "messages": [{"role": "user", "content": w["email"]}]},
             {"request_id": "bad-2", "timestamp": 1_795_000_500, "messages": f"{w['name']} {w['email']}"},
             {"request_id": "bad-3", "timestamp": 1_795_000_501, "prompt": "", "user": w["account"]}]
    return write_jsonl(path, recs)


def _text_canaries() -> list[str]:
    out = []
    for c in range(CONVERSATIONS):
        w = _who(c)
        out += [w["name"], f"Blemkat{c}x", w["email"], f"canary{c}", w["account"], f"QZX{c}Q{c}W",
                w["phone"]]
    return out


def _run_files_text(run: Path) -> dict[str, str]:
    """Every file of a run as text: Parquet tables decoded row by row, the rest read as text."""
    out = {}
    for p in sorted(run.rglob("*")):
        if p.is_dir():
            continue
        if p.suffix == ".parquet":
            t = pq.read_table(p)
            out[p.name] = json.dumps(t.to_pylist(), default=str, ensure_ascii=False) + " ".join(t.column_names)
        else:
            out[p.name] = p.read_bytes().decode("utf-8", "replace")
    return out


def _invoke(args: list[str]) -> str:
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    return r.output + (r.stderr if r.stderr_bytes is not None else "")


def _all_commands(log: Path, run: Path, *extra: str) -> dict[str, str]:
    printed = {
        "analyze": _invoke(["analyze", str(log), "-o", str(run), *extra]),
        "analyze --json": _invoke(["analyze", str(log), "-o", str(run), "--force", "--json", *extra]),
        "findings": _invoke(["findings", str(run)]),
        "findings --json": _invoke(["findings", str(run), "--json"]),
        "simulate": _invoke(["simulate", str(run), "-n", "2", "--kv-blocks", "400"]),
        "simulate --json": _invoke(["simulate", str(run), "-n", "2", "--kv-blocks", "400", "--json", "--no-save"]),
        "estimate": _invoke(["estimate", str(run)]),
        "estimate --json": _invoke(["estimate", str(run), "--json"]),
        "report": _invoke(["report", str(run)]),
        "query": _invoke(["query", str(run), "select * from prefixes"]),
        "check": _invoke(["check", str(run), "--min-hit-rate", "0"]),
        "diff": _invoke(["diff", str(run), str(run)]),
        "export": _invoke(["export", str(run), "-o", str(run.parent / "exported.jsonl")]),
    }
    exported = {"exported.jsonl": (run.parent / "exported.jsonl").read_text()}
    return {**{f"printed by {k}": v for k, v in printed.items()}, **_run_files_text(run), **exported}


def _leaks(outputs: dict[str, str], canaries: list[str]) -> list[tuple[str, str]]:
    return [(where, c) for where, text in outputs.items() for c in canaries if c in text]


@pytest.fixture(scope="module")
def canary_log(tmp_path_factory) -> Path:
    return _log(tmp_path_factory.mktemp("plog") / "log.jsonl")


def test_no_customer_text_in_any_default_output(canary_log, tmp_path) -> None:
    outputs = _all_commands(canary_log, tmp_path / "run")
    assert {"manifest.json", "requests.parquet", "prefixes.parquet", "findings.parquet", "report.md",
            "report.html", "sim_policies.parquet"} <= set(outputs)
    assert _leaks(outputs, _text_canaries()) == []
    # identities: only where they are the value of a tenant/user column, never inside shown text
    run = tmp_path / "run"
    shown = {"snippet": json.dumps(pq.read_table(run / "prefixes.parquet").column("snippet").to_pylist()),
             **{c: json.dumps(pq.read_table(run / "findings.parquet").column(c).to_pylist())
                for c in ("label", "example", "fix", "detail")}}
    assert _leaks(shown, TENANTS + USERS) == []
    # the shared template text itself is allowed through (eight users share it), redacted
    prefixes = pq.read_table(tmp_path / "run" / "prefixes.parquet").to_pylist()
    assert any(r["snippet"].startswith("You are the support assistant") for r in prefixes) or all(
        r["snippet"].startswith("<text ") for r in prefixes)


def test_hash_tenants_leaves_no_identity_and_no_key(canary_log, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PREFIXSCAN_TENANT_KEY", "s3cret-canary-key-77")
    outputs = _all_commands(canary_log, tmp_path / "run", "--hash-tenants")
    assert _leaks(outputs, _text_canaries() + TENANTS + USERS + ["s3cret-canary-key-77"]) == []


def test_include_text_lets_the_text_through(canary_log, tmp_path) -> None:
    _invoke(["analyze", str(canary_log), "-o", str(tmp_path / "run"), "--include-text"])
    outputs = _run_files_text(tmp_path / "run")
    assert _leaks({"prefixes": outputs["prefixes.parquet"]}, [_who(c)["name"] for c in range(CONVERSATIONS)])
