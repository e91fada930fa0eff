"""Canaries of one customer who repeats a request, in logs with no ids, one conversation id per request, and
users: the privacy rule counts independent sources, not conversations, so the customer's name reaches no
default output (terminal, --json, findings, explain, manifest, tables, report.md/html), while the template
text that many independent prompts share still shows. `--include-text` lets the customer's text through.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import write_jsonl
from tests.test_privacy_canary import _invoke, _run_files_text

NAME = "Zyxwvut Canarysson"
CANARIES = ("Canarysson", "Zyxwvut")
TEMPLATE = "Parcelco desk"
SYSTEM = "Parcelco desk. Be brief."
REPEATS = 7


def _records(ids: str) -> list[dict]:
    """Ten template requests (different questions) and one customer's request sent REPEATS times, the same
    but for a clock value (a dynamic field whose label names the customer: a finding).
    `ids`: "none" (inferred conversations), "per_request" (a conversation id per request), "users"
    (template requests from ten users, the customer's from one user)."""
    recs = []
    for i in range(10):
        question = f"Question from desk {i}: " + "how long does shipping to my region take? " * (i + 1)
        recs.append({"request_id": f"t{i}", "timestamp": 1_795_000_000 + i, "model": "m",
                     "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
                     **_ids(ids, f"t{i}", f"user-{i}")})
    for i in range(REPEATS):
        text = (f"Customer {NAME} clock: {8 + i}:0{i}, order {'9' * (3 * i + 1)}\n"  # a token longer each time
                + f"{NAME} writes: my parcel is late and I am upset. " * 30)
        recs.append({"request_id": f"z{i}", "timestamp": 1_795_000_100 + 60 * i, "model": "m",
                     "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}],
                     **_ids(ids, f"z{i}", "user-z")})
    return recs


def _ids(ids: str, rid: str, user: str) -> dict[str, str]:
    if ids == "per_request":
        return {"conversation_id": f"conv-{rid}"}
    if ids == "users":
        return {"conversation_id": f"conv-{rid}", "user": user}
    return {}


def _outputs(log: Path, run: Path, *extra: str) -> dict[str, str]:
    printed = {
        "analyze": _invoke(["analyze", str(log), "-o", str(run), *extra]),
        "analyze --json": _invoke(["analyze", str(log), "-o", str(run), "--force", "--json", *extra]),
        "findings": _invoke(["findings", str(run)]),
        "findings --json": _invoke(["findings", str(run), "--json"]),
        "explain": _invoke(["explain", str(run), "z3"]),
        "explain --json": _invoke(["explain", str(run), "z3", "--json"]),
        "report": _invoke(["report", str(run)]),
    }
    return {**{f"printed by {k}": v for k, v in printed.items()}, **_run_files_text(run)}


def _leaks(outputs: dict[str, str]) -> list[tuple[str, str]]:
    return [(where, c) for where, text in outputs.items() for c in CANARIES if c in text]


@pytest.mark.parametrize("ids", ["none", "per_request", "users"])
def test_one_customers_repeated_request_never_shows_but_the_template_does(ids: str, tmp_path: Path) -> None:
    log = write_jsonl(tmp_path / "log.jsonl", _records(ids))
    run = tmp_path / "run"
    outputs = _outputs(log, run)
    assert {"manifest.json", "requests.parquet", "prefixes.parquet", "findings.parquet", "report.md",
            "report.html"} <= set(outputs)
    assert _leaks(outputs) == []
    snippets = pq.read_table(run / "prefixes.parquet").column("snippet").to_pylist()
    assert any(s.startswith(TEMPLATE) for s in snippets), snippets  # ten independent prompts share it
    assert TEMPLATE in outputs["printed by analyze"] and TEMPLATE in outputs["report.md"]
    assert TEMPLATE in outputs["printed by analyze --json"]
    labels = pq.read_table(run / "findings.parquet").column("label").to_pylist()
    assert any(label.startswith("<text ") for label in labels), labels  # the customer's finding, hidden


@pytest.mark.parametrize("ids", ["none", "per_request"])
def test_include_text_shows_the_customers_text(ids: str, tmp_path: Path) -> None:
    log = write_jsonl(tmp_path / "log.jsonl", _records(ids))
    run = tmp_path / "run"
    printed = _invoke(["analyze", str(log), "-o", str(run), "--include-text", "--json"])
    files = _run_files_text(run)
    assert "Canarysson" in files["prefixes.parquet"] and "Canarysson" in printed
    assert "Canarysson" in _invoke(["explain", str(run), "z3", "--include-text"])
