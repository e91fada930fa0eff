"""The regex library: every surface form the issue names, labels in several languages, label styles."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixscan.detect.normalisation import NORMALISERS, drift_kind, message_units, needs
from prefixscan.detect.patterns import classify, heading_label, label_kind, split_label, value_kind
from prefixscan.detect.rewrite import apply_ops


@pytest.mark.parametrize("value", [
    "2026-11-29T10:15:00Z", "2026-11-29T10:15:00.123Z", "2026-11-29T10:15:00+01:00", "2026-11-29T10:15:00",
    "2026-11-29 10:15", "2026-11-29 10:15:07", "Sun, 29 Nov 2026 10:15:00 +0000", "29 Nov 2026 10:15 GMT",
    "November 29, 2026 10:15:00 UTC", "11/29/2026 10:15", "29.11.2026 10:15:00", "1795947300", "1795947300123",
])
def test_timestamps(value: str) -> None:
    assert value_kind(value) == "timestamp"
    assert classify("Current time", value) == "timestamp"


@pytest.mark.parametrize("value", ["2026-11-29", "29 Nov 2026", "11/29/2026", "29.11.2026", "November 29, 2026",
                                   "Sun, 29 Nov 2026", "2026年11月29日"])
def test_dates(value: str) -> None:
    assert value_kind(value) == "date"


@pytest.mark.parametrize("label,value,kind", [
    ("Request ID", "9b2f0c1e-4a8d-4c1b-9e7f-0a1b2c3d4e5f", "request_id"),
    ("Trace-Id", "4bf92f3577b34da6", "request_id"),
    ("X-Request-Id", "req_5kZ8aQw2Lm9Tx3Vb7Nc1Pd", "request_id"),
    ("Correlation ID", "01JDQ7X9Z8K3M5N7P9R1T3V5W7", "request_id"),
    ("ID de solicitud", "482913004471", "request_id"),
    ("Session ID", "sess_8KfZ2q9XwL3mN5bT", "session_id"),
    ("ID сессии", "a1b2c3d4e5f60718", "session_id"),
    ("Nonce", "q83vEjRkZ3JhbmRvbS1ub25jZQ==", "random_token"),
    ("Signature", "6a8ac4ba05805975ed2f89d9", "random_token"),
    ("Request #", "17", "counter"),
    ("Aufruf Nr.", "00000017", "counter"),
    ("User email", "emma.smith@acme.example.com", "email"),
    ("Contact", "Emma Smith <emma.smith@acme.example.com>", "email"),
    ("Phone", "+15551234567", "phone"),
    ("Téléphone", "(555) 123-4567", "phone"),
    ("Телефон", "+44 20 7946 0958", "phone"),
    ("Customer name", "Emma Smith", "user_name"),
    ("Nombre del usuario", "Smith, Emma", "user_name"),
    ("ユーザー名", "emma.smith", "user_name"),
    ("Fecha y hora", "2026-11-29 10:15", "timestamp"),
    ("当前时间", "1795947300", "timestamp"),
    ("Plan", "Enterprise", None),
    ("Region", "ap-northeast", None),
])
def test_classify(label: str, value: str, kind: str | None) -> None:
    assert classify(label, value) == kind


def test_counter_vs_random_number_by_trend() -> None:
    assert classify("Ref number", "834", numbers_increase=True) == "request_id"
    assert classify("", "834", numbers_increase=True) == "counter"
    assert classify("", "834") == "random_token"


@pytest.mark.parametrize("line,label,value", [
    ("Request time: 2026-11-29T10:15:00Z", "Request time", "2026-11-29T10:15:00Z"),
    ("[Request time: 2026-11-29T10:15:00Z]", "Request time", "2026-11-29T10:15:00Z"),
    ("Request time=2026-11-29T10:15:00Z", "Request time", "2026-11-29T10:15:00Z"),
    ('{"Request time": "2026-11-29T10:15:00Z"}', "Request time", "2026-11-29T10:15:00Z"),
    ("Nom de l'utilisateur: Emma", "Nom de l'utilisateur", "Emma"),
    ("2026-11-29T10:15:00Z", "", "2026-11-29T10:15:00Z"),
    ("November 29, 2026 10:15:00 UTC", "", "November 29, 2026 10:15:00 UTC"),
])
def test_split_label_styles(line: str, label: str, value: str) -> None:
    lv = split_label(line)
    assert (lv.label, lv.value) == (label, value)
    assert line[lv.value_start:].startswith(value)


def test_heading_labels_and_prose_is_not_a_label() -> None:
    assert heading_label("### Request time") == "Request time"
    assert heading_label("**Date**") == "Date"
    assert heading_label("This is a whole sentence of ordinary prose that goes on.") is None
    long = "Note: " + "the assistant must answer politely and cite the policy section. " * 4
    assert split_label(long).label == ""
    assert label_kind("Hotel name") != "phone"


def test_units_and_drift_kinds() -> None:
    a = message_units(0, "Intro line here.\nSecond line with text\n", 1)
    b = message_units(0, "Intro line here.\r\nSecond line with text\r\n", 1)
    c = message_units(0, "Intro line here.  \nSecond line with text\n", 1)
    assert [u.norm for u in a] == [u.norm for u in b] == [u.norm for u in c]
    assert drift_kind(b[0], a[0]) == "line_endings" and drift_kind(c[0], a[0]) == "whitespace"
    nfd = message_units(0, "Cafe\u0301 Zu\u0308rich\n", 1)
    nfc = message_units(0, "Café Zürich\n", 1)
    assert nfd[0].norm == nfc[0].norm and drift_kind(nfd[0], nfc[0]) == "unicode"
    j1 = message_units(0, '{"a": 1, "b": 2}\n', 1)
    j2 = message_units(0, '{"b": 2, "a": 1}\n', 1)
    assert j1[0].norm == j2[0].norm and drift_kind(j1[0], j2[0]) == "json_key_order"
    assert needs("line_endings", "a\r\nb") and not needs("line_endings", "a\nb")
    assert NORMALISERS["whitespace"]("a  b  \n\n\n\nc") == "a b\n\nc"


def test_rewriter_keeps_label_and_value() -> None:
    msgs = [{"role": "system", "content": "Request time: 2026-11-29T10:15:00Z\nYou are helpful.\n"},
            {"role": "user", "content": "Question?"}]
    out, _ = apply_ops(msgs, None, [("move", 0, 0, 35)])
    assert out[0]["content"] == "You are helpful.\n"
    assert out[1]["content"] == "Question?\n\nRequest time: 2026-11-29T10:15:00Z\n"
    assert msgs[0]["content"].startswith("Request time")  # inputs untouched
    tools = [{"name": "b", "x": 1}, {"name": "a", "x": 2}]
    _, t2 = apply_ops(msgs, tools, [("normalise", "json_key_order")])
    assert list(t2[0]) == ["name", "x"]


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(st.text(st.characters(blacklist_categories=("Cs",)), max_size=60), min_size=1, max_size=8),
       pick=st.integers(0, 7), user=st.text(max_size=40))
def test_move_keeps_every_line_and_detector_never_fails(lines: list[str], pick: int, user: str) -> None:
    from prefixscan.detect.detector import Detector
    from prefixscan.read.record import Record

    text = "\n".join(lines) + "\n"
    starts = [0]
    for ln in lines:
        starts.append(starts[-1] + len(ln) + 1)
    i = pick % len(lines)
    msgs = [{"role": "system", "content": text}, {"role": "user", "content": user}]
    out, _ = apply_ops(msgs, None, [("move", 0, starts[i], starts[i + 1])])
    before = sorted(x for m in msgs for x in m["content"].split("\n") if x)
    after = sorted(x for m in out for x in m["content"].split("\n") if x)
    assert before == after
    det = Detector(16)
    for k in range(3):
        det.feed(Record("f", k, f"r{k}", float(k), "chat", tenant="t", messages=msgs), 1)
        det.feed(Record("f", k, f"s{k}", float(k), "chat", tenant="t", messages=out), 1)
    assert det.errors == 0
