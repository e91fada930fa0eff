"""Breakers inside message text: dates and times in words (en, de, fr, es) in lines and sentences, JSON in
message text (key order, spacing, pretty-printed blocks): found, located, costed, and fixed where a safe
rewrite exists; precision and recall against `prefixscan synth` truth."""

from __future__ import annotations

import collections
import json
import random

import orjson
import pytest

import prefixscan
from prefixscan.config import AnalyzeConfig
from prefixscan.detect.patterns import DATE_SPAN_RES, value_kind
from prefixscan.fix import fix_logs
from prefixscan.synth import SynthConfig, write
from tests import test_findings_synth as fs
from tests.conftest import write_jsonl
from tests.test_findings_detect import DOC, SYS, question, rec


def date_span(text: str) -> tuple[str, int, int] | None:
    """(kind, start, end) of the first timestamp or date in `text` by the detector's patterns (a timestamp
    wins over a date; the earliest, then the longest, match within a kind)."""
    best: tuple[str, int, int] | None = None
    for kind, pats in DATE_SPAN_RES:
        for p in pats:
            m = p.search(text)
            if m and (best is None or m.start() < best[1] or (m.start() == best[1] and m.end() > best[2])):
                best = (kind, m.start(), m.end())
        if best is not None and kind == "timestamp":
            return best
    return best


DAYS = {"en": "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split(),
        "de": "Montag Dienstag Mittwoch Donnerstag Freitag Samstag Sonntag".split()}
SENTENCES = {
    "en": lambda i: f"Today is {DAYS['en'][i % 7]}, {1 + i % 28} November 2026, {9 + i % 8:02d}:{i % 60:02d}, "
                    "and you help customers of Initech with their contracts and invoices.",
    "de": lambda i: f"Heute ist {DAYS['de'][i % 7]}, {1 + i % 28}. November 2026 um {9 + i % 8:02d}:{i % 60:02d} "
                    "Uhr, und du hilfst Kunden von Initech bei Verträgen.",
    "fr": lambda i: f"Nous sommes le {1 + i % 28} novembre 2026 à {9 + i % 8}h{i % 60:02d} et vous aidez les "
                    "clients d'Initech avec leurs contrats.",
    "es": lambda i: f"Hoy es {1 + i % 28} de noviembre de 2026, {9 + i % 8:02d}:{i % 60:02d}, y ayudas a los "
                    "clientes de Initech con sus contratos.",
}


@pytest.mark.parametrize("text,kind", [
    ("Monday, 20 November 2026, 09:00", "timestamp"), ("Montag, 20. November 2026 um 09:00 Uhr", "timestamp"),
    ("le lundi 20 novembre 2026 à 9h00", "timestamp"), ("lunes, 20 de noviembre de 2026, 09:00", "timestamp"),
    ("20 November 2026", "date"), ("20. November 2026", "date"), ("le 20 novembre 2026", "date"),
    ("20 de noviembre de 2026", "date"), ("vendredi 1er mars 2027", "date"), ("Montag, 20. November", "date"),
    ("in May we shipped 20 units", None), ("Mai 2026 war gut", None), ("sun 12 pm", None),
])
def test_dates_in_words(text: str, kind: str | None) -> None:
    assert value_kind(text) == kind
    span = date_span(text)
    assert (span[0] if span else None) == kind


@pytest.mark.parametrize("lang", sorted(SENTENCES))
def test_date_inside_a_sentence_is_a_located_timestamp_without_safe_rewrite(tmp_path, lang) -> None:
    head = "You are a careful analyst.\n"
    recs = [rec(i, head + SENTENCES[lang](i) + "\n" + SYS, DOC + question(i)) for i in range(20)]
    log = write_jsonl(tmp_path / f"{lang}.jsonl", recs)
    r = prefixscan.analyze(str(log))
    (f,) = r.findings.findings
    sentence = SENTENCES[lang](int(f.example_request_id[1:]))
    start = date_span(sentence)[1]
    assert (f.kind, f.message_index, f.role) == ("timestamp", 0, "system")
    assert f.char_offset == len(head) + start and f.token_offset > 0 and f.tokens_lost > 1000
    assert f.detail.startswith("written inside a sentence") and f.fix.startswith("No safe automatic rewrite")
    out = fix_logs(AnalyzeConfig(inputs=(str(log),)), str(tmp_path / f"{lang}.fixed.jsonl"))
    assert out.rewritten == 0 and out.by_kind == {} and out.not_fixed == {"timestamp": 1}


def _shuffled(obj, r: random.Random):
    if isinstance(obj, dict):
        ks = list(obj)
        r.shuffle(ks)
        return {k: _shuffled(obj[k], r) for k in ks}
    return obj


PAYLOAD = {"account": {"tier": "gold", "region": "eu-west", "since": 2019}, "features": ["search", "export"],
           "limits": {"rpm": 600, "tpm": 90000}, "locale": "en-GB"}


@pytest.mark.parametrize("style,kind", [("line", "json_key_order"), ("pretty", "json_key_order"),
                                        ("spacing", "json_spacing")])
def test_json_in_message_text(tmp_path, style: str, kind: str) -> None:
    head = "You are a careful analyst.\nAccount settings:\n"
    recs = []
    for i in range(30):
        r = random.Random(i)
        if style == "spacing":
            js = json.dumps(PAYLOAD, separators=(",", ":") if i % 2 else (", ", ": "))
        else:
            js = json.dumps(_shuffled(PAYLOAD, r), indent=2 if style == "pretty" else None)
        recs.append(rec(i, head + js + "\n" + SYS, DOC + question(i)))
    log = write_jsonl(tmp_path / f"{style}.jsonl", recs)
    res = prefixscan.analyze(str(log))
    (f,) = res.findings.findings
    assert (f.kind, f.message_index) == (kind, 0) and f.char_offset >= len(head) and f.tokens_lost > 400
    out = fix_logs(AnalyzeConfig(inputs=(str(log),)), str(tmp_path / f"{style}.fixed.jsonl"))
    assert out.by_kind == {kind: 1} and out.findings_after == 0
    assert out.after == pytest.approx(out.predicted, abs=1e-6) and out.after > out.before
    fixed = [orjson.loads(x) for x in open(tmp_path / f"{style}.fixed.jsonl", "rb")]
    for a, b in zip(recs, fixed, strict=True):  # the rewrite keeps the JSON's content
        sa, sb = a["messages"][0]["content"], b["messages"][0]["content"]
        ja = json.loads(sa[len(head):sa.index("\n" + SYS[:20])])
        jb = json.loads(sb[len(head):sb.index("\n" + SYS[:20])])
        assert ja == jb


def test_text_breakers_precision_recall_against_synth_truth(tmp_path, capsys) -> None:
    """Synth's in-text kinds (date_words, timestamp_words: en/de/fr/es, in a labelled line or inside a
    sentence), across midnight so dates change too."""
    kind_map = {**fs.KIND_MAP, "date_words": "date", "timestamp_words": "timestamp"}
    cfg = SynthConfig(requests=1500, seed=41, tenants=3, prompt_tokens=700, breakers=("date_words",
                      "timestamp_words"), breaker_rate=0.8, start="2026-11-29T23:58:00Z")
    path = tmp_path / "text.jsonl"
    write(cfg, str(path))
    truth = {t["request_id"]: t for t in map(orjson.loads, open(f"{path}.truth.jsonl", "rb"))}
    found = [f.to_row() for f in prefixscan.analyze(str(path)).findings.findings]
    old = fs.KIND_MAP
    fs.KIND_MAP = kind_map
    try:
        per = fs.evaluate(found, truth)["per_kind"]
    finally:
        fs.KIND_MAP = old
    tp, fp, fn = (sum(v[k] for v in per.values()) for k in range(3))
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    with capsys.disabled():
        print(f"\nin-text breakers vs synth truth (date_words, timestamp_words; en/de/fr/es; lines and "
              f"sentences): precision {precision:.3f}, recall {recall:.3f} (tp {tp}, fp {fp}, fn {fn})")
        for kind, (a, b, c) in sorted(per.items()):
            print(f"  {kind:<10} tp {a}, fp {b}, fn {c}")
    # Recall is below the field-line kinds' 0.95: a labelled date that changes once a day at the top of a
    # multi-turn source is not reported, because moving it to the end of the last user message costs the
    # conversation more history reuse than the one change at midnight (its counterfactual gain is negative).
    assert precision >= 0.95 and recall >= 0.85
    inline = collections.Counter(f["detail"] or "" for f in found)
    assert any(k.startswith("written inside a sentence") for k in inline)


def test_sentence_style_renders_its_value_without_a_label() -> None:
    from prefixscan.synth.breakers import REGISTRY, SENTENCE_STYLES, TEXT_KINDS, BreakerSpec, Context, render

    ctx = Context(1_795_000_000.25, 5, 42, "acme", "conv-000001", 17, random.Random(0))
    for kind in TEXT_KINDS:
        entry = REGISTRY[kind]
        for form in entry.forms:
            for style in SENTENCE_STYLES:
                line, value, offset = render(BreakerSpec(kind, entry.labels[0], form, style, "top"), ctx)
                assert line[offset:].startswith(value) and entry.labels[0] not in line
                assert date_span(line)[1] == offset  # the detector's date starts where the truth says
