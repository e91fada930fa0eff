"""Reject details name the field, the problem and the value's kind, never the customer's value: phone and
card numbers in a timestamp field, an email used as a request id or as a record key."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from prefixscan.redact import field_name, reject_detail, value_kind
from tests.conftest import write_jsonl
from tests.test_privacy_canary import _invoke

PHONE, CARD, EMAIL = "+44 7700 900123", "4111 1111 1111 1111", "zyx.canary@canary-mail.example"
MSGS = [{"role": "user", "content": "Where is my parcel?"}]


def _log(path: Path) -> Path:
    recs = [{"request_id": f"ok{i}", "timestamp": 1_795_000_000 + i, "messages": MSGS} for i in range(3)]
    recs += [
        {"request_id": "p1", "timestamp": PHONE, "messages": MSGS},
        {"request_id": "p2", "timestamp": CARD, "messages": MSGS},
        {"request_id": "p3", "timestamp": -447700900123, "messages": MSGS},
        {"request_id": "p4", "timestamp": "Zyxwvut Canarysson", "messages": MSGS},
        {"request_id": EMAIL, "timestamp": 1_795_000_100, "messages": MSGS},
        {"request_id": EMAIL, "timestamp": 1_795_000_101, "messages": MSGS},
        {"request_id": "p5", "timestamp": 1_795_000_102, "messages": MSGS, "output_tokens": -447700900123},
        {"request_id": "p6", "timestamp": 1_795_000_103, "messages": MSGS, "output_tokens": 1.4477009},
        {"request_id": "p7", "timestamp": 1_795_000_104, EMAIL: "hello"},
    ]
    return write_jsonl(path, recs)


CANARIES = ("7700", "900123", "4111", "1111", "447700", "Canarysson", "zyx.canary", "canary-mail", "1.447")


def test_reject_details_never_quote_the_value(tmp_path: Path) -> None:
    run = tmp_path / "run"
    printed = _invoke(["analyze", str(_log(tmp_path / "log.jsonl")), "-o", str(run), "--json"])
    rejects = pq.read_table(run / "rejects.parquet").to_pylist()
    assert len(rejects) == 8  # the first record with the email id is accepted
    text = json.dumps(rejects) + printed + (run / "manifest.json").read_text()
    assert [c for c in CANARIES if c in text] == []
    details = [r["detail"] for r in rejects]
    assert sum("`timestamp`" in d for d in details) == 4
    assert any("`request_id` was already seen" in d and "30-character string" in d for d in details)
    assert any("`output_tokens` is negative (got an integer of 12 digits)" in d for d in details)
    assert any("<a 30-character key>" in d for d in details)


@pytest.mark.parametrize(("value", "kind"), [(PHONE, "a 15-character string"), (-12, "an integer of 2 digits"),
                                             (1.5, "a number"), (None, "null"), ([1, 2], "a list of 2 items")])
def test_value_kind_says_type_and_size_only(value: object, kind: str) -> None:
    assert value_kind(value) == kind
    assert reject_detail("timestamp", "is not a time", value) == f"`timestamp` is not a time (got {kind})"


def test_field_names_that_are_not_names_are_not_printed() -> None:
    assert field_name("metadata.user_id") == "metadata.user_id"
    assert field_name(EMAIL) == "<a 30-character key>"
