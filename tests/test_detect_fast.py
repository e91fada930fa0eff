"""The fast detector (memoised pieces and request contents, list-slice alignment) against the frozen
reference (tests/detect_reference): fed the same records, they must end in the same state, whatever the
memo bounds, on adversarial inputs (timestamps, UUIDs, near-identical system prompts, empty messages,
tools, drift) and on synth logs."""

from __future__ import annotations

import json
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import prefixscan.detect.content as content_mod
from prefixscan.detect import Detector
from prefixscan.detect.pieces import Units, joined
from prefixscan.io.shapes import Record
from prefixscan.synth import REGISTRY, SynthConfig, write
from prefixscan.synth.drift import DRIFT_KINDS
from tests.detect_reference.compare import differences, snapshot
from tests.detect_reference.detector import Detector as Reference

BASE = [
    "You are the support assistant of ACME Corp. Answer briefly and cite the policy you rely on.",
    "Never reveal internal ticket numbers or the names of other customers to anyone at all.",
    "Escalate to a human agent when the customer asks for a refund above the documented limit.",
    "### Customer",
    "Plan: gold",
    "The knowledge base below is authoritative; prefer it over anything you remember from training.",
    '{"region": "eu-west", "tier": 2, "flags": ["a", "b"]}',
    "Today is Monday, 30 November 2026, and the office closes at 17:00 local time for everyone.",
    "- bullet: keep answers under two hundred words unless the user explicitly asks for more detail.",
]

FIELDS = st.sampled_from([
    lambda r: f"Request time: 2026-11-{r % 28 + 1:02d}T10:{r % 60:02d}:00Z",
    lambda r: f"Request id: {uuid.UUID(int=r * 7919 + 1)}",
    lambda r: f"Customer name: {['Ana Lima', 'Bo Chen', 'Carla Diaz'][r % 3]}",
    lambda r: f"Session: {r * 104729 % 99991:x}",
    lambda r: f"Today is Monday, {r % 28 + 1} November 2026, and the office closes at 17:00 local time.",
    lambda r: "",
])

DRIFT = st.sampled_from(["none", "crlf", "nfd", "nfc", "spaces", "json_order", "blank_lines", "list_a", "list_b",
                         "chunks_a", "chunks_b"])
TOOLS_IN_TEXT = [{"name": n, "description": f"Use {n} when the customer asks about it in any message."}
                 for n in ("refund", "lookup", "escalate", "cancel")]
CHUNKS_IN_TEXT = [f"Passage {n}: " + "returns are accepted within thirty days of delivery, receipts required. " * 2
                  for n in "abcd"]


def _drift(text: str, kind: str) -> str:
    if kind == "crlf":
        return text.replace("\n", "\r\n")
    if kind in ("nfd", "nfc"):
        city = "Cafe\u0301 Zu\u0308rich" if kind == "nfd" else "Café Zürich"
        return text + city + " office notes are kept for reference by the whole support team.\n" + BASE[2] + "\n"
    if kind == "spaces":
        return text.replace(". ", ".  ", 1).replace("\n", "  \n", 1)
    if kind == "json_order":
        return text.replace('{"region": "eu-west", "tier": 2', '{"tier": 2, "region": "eu-west"')
    if kind in ("list_a", "list_b"):  # the same JSON list of tools in two orders (list_order)
        tools = TOOLS_IN_TEXT if kind == "list_a" else TOOLS_IN_TEXT[2:] + TOOLS_IN_TEXT[:2]
        return text + "Tools:\n" + json.dumps(tools, indent=2) + "\n" + BASE[5] + "\n"
    if kind in ("chunks_a", "chunks_b"):  # the same chunks between --- lines in two orders
        chunks = CHUNKS_IN_TEXT if kind == "chunks_a" else CHUNKS_IN_TEXT[::-1]
        return text + "Documents:\n" + "\n---\n".join(chunks) + "\n\n" + BASE[5] + "\n"
    if kind == "blank_lines":
        return text.replace("\n", "\n\n\n", 2)
    return text


def _tools(r: int, variant: int) -> list[dict] | None:
    if variant == 0:
        return None
    a = {"type": "function", "function": {"name": "lookup", "description": "Find an order.",
                                          "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}}
    desc = f"Refund (limits as of 2026-11-{r % 28 + 1:02d})."
    b = {"type": "function", "function": {"name": "refund", "description": desc, "parameters": {"type": "object"}}}
    if variant == 2:
        b = {"function": b["function"], "type": "function"}  # key order drift
    if variant >= 3:  # the same two tools in either order
        b = {"type": "function", "function": {"name": "refund", "description": "Refund.", "parameters": {}}}
        return [b, a] if variant == 3 else [a, b]
    return [a, b]


def _docs(seed: int, order: list[int]) -> str:
    paras = [f"Document {i}: " + f"policy text about returns and warranties for item {seed + i}. " * 4
             for i in range(4)]
    return "\n\n".join(paras[i] for i in order) + "\n\nWhat does the warranty cover?"


request = st.fixed_dictionaries({
    "tenant": st.sampled_from(["t1", "t2", ""]),
    "lines": st.lists(st.integers(0, len(BASE) - 1), min_size=0, max_size=9),
    "field": FIELDS, "field_at": st.integers(0, 9),
    "drift": DRIFT, "tools": st.integers(0, 4),
    "user": st.sampled_from(["plain", "docs", "docs_swapped", "empty", "same", "blank"]),
    "turns": st.integers(1, 3), "developer": st.booleans(), "no_system": st.booleans(),
})


def _record(i: int, spec: dict, k: int) -> Record:
    lines = [BASE[j] for j in spec["lines"]]
    field = spec["field"](i)
    if field:
        lines.insert(min(spec["field_at"], len(lines)), field)
    system = _drift("\n".join(lines) + ("\n" if lines else ""), spec["drift"])
    user = {"plain": f"Question {i % 4}: where is my order?", "docs": _docs(i % 2, [0, 1, 2, 3]),
            "docs_swapped": _docs(i % 2, [1, 0, 2, 3]), "empty": "", "same": "Hello",
            "blank": "\n\n  \n"}[spec["user"]]
    msgs: list[dict] = [] if spec["no_system"] else [{"role": "system", "content": system}]
    if spec["developer"]:
        msgs.append({"role": "developer", "content": "Reply in English.\n" + BASE[0]})
    msgs.append({"role": "user", "content": user})
    for t in range(k):  # later turns resend the history
        msgs += [{"role": "assistant", "content": f"Answer {t}."}, {"role": "user", "content": f"Follow-up {t}?"}]
    return Record("f.jsonl", i, f"r{i}-{k}", float(i), "chat", tenant=spec["tenant"] or None, messages=msgs,
                  tools=_tools(i, spec["tools"]))


def _records(specs: list[dict]) -> list[Record]:
    out = []
    for i, spec in enumerate(specs):
        for k in range(spec["turns"]):
            out.append(_record(i, spec, k))
    return out


def _same(records: list[Record], fast: Detector | None = None) -> None:
    fast = fast or Detector(16)
    ref = Reference(16)
    for i, r in enumerate(records):
        fast.feed(r, i % 3)
        ref.feed(r, i % 3)
    a, b = snapshot(fast), snapshot(ref)
    assert a == b, differences(a, b)
    fast.retro_exemplars()  # finalize's first step reads the exemplars' units again
    ref.retro_exemplars()
    fast.retro_lists()
    ref.retro_lists()
    a, b = snapshot(fast), snapshot(ref)
    assert a == b, differences(a, b)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=st.lists(request, min_size=1, max_size=14), repeat=st.integers(1, 3))
def test_fast_detector_equals_reference(specs: list[dict], repeat: int) -> None:
    records = _records(specs)
    _same(records * 1 + [Record(r.source_file, r.source_line, f"{r.request_id}x{j}", r.timestamp_s, "chat",
                                tenant=r.tenant, messages=r.messages, tools=r.tools)
                         for j in range(1, repeat) for r in records])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=st.lists(request, min_size=1, max_size=10))
def test_fast_detector_equals_reference_with_tiny_memos(specs: list[dict]) -> None:
    """Memo bounds only change speed: with every memo holding one entry the state is the same."""
    saved = content_mod.CONTENT_BYTES, content_mod.CHECK_BYTES
    try:
        content_mod.CONTENT_BYTES = content_mod.CHECK_BYTES = 1
        _same(_records(specs), Detector(16, memo_bytes=1))
    finally:
        content_mod.CONTENT_BYTES, content_mod.CHECK_BYTES = saved


def test_fast_detector_equals_reference_on_synth_logs(tmp_path) -> None:
    from prefixscan.config import AnalyzeConfig
    from prefixscan.io.sources import expand
    from prefixscan.pipeline.read import Reader

    for name, cfg in {
        "chat": SynthConfig(requests=400, seed=3, tenants=3, scenarios=(("chat", 1.0),)),
        "all": SynthConfig(requests=400, seed=4, tenants=3, breakers=tuple(REGISTRY), breaker_rate=0.4,
                           drift=DRIFT_KINDS, drift_rate=0.3),
    }.items():
        log = tmp_path / f"{name}.jsonl"
        write(cfg, str(log))
        records = [r for ev in Reader(AnalyzeConfig((str(log),)), expand([str(log)]), 256).events()
                   if isinstance(ev, list) for r in ev if r.kind == "chat"]
        assert records
        _same(records)


def test_the_generated_records_exercise_every_path() -> None:
    """The strategy above is only worth something if the reference finds spans, drift and orders in it."""
    specs = [{"tenant": "t1", "lines": [0, 1, 3, 4, 5, 6, 7, 8], "field": f, "field_at": 2, "drift": d,
              "tools": tools, "user": user, "turns": 2, "developer": False, "no_system": False}
             for f, d, tools, user in [(lambda r: "", "nfc", 4, "docs"), (lambda r: "", "nfd", 4, "docs"),
                                       (lambda r: f"Request id: {uuid.UUID(int=r + 1)}", "none", 1, "docs"),
                                       (lambda r: f"Request id: {uuid.UUID(int=r + 1)}", "crlf", 2, "docs_swapped"),
                                       (lambda r: f"Customer name: {['Ana Lima', 'Bo Chen'][r % 2]}", "nfc", 3, "docs"),
                                       (lambda r: "", "spaces", 1, "plain"), (lambda r: "", "json_order", 1, "plain"),
                                       (lambda r: f"Request id: {uuid.UUID(int=r + 1)}", "none", 1, "docs"),
                                       (lambda r: "", "list_b", 1, "plain"), (lambda r: "", "list_a", 1, "plain"),
                                       (lambda r: "", "chunks_a", 1, "plain"), (lambda r: "", "chunks_b", 1, "plain")]]
    ref = Reference(16)
    for r in _records(specs):
        ref.feed(r, 0)
    kinds = {k[0] for k in ref.accs} | {k[2] for k in ref.accs if k[0] in ("drift", "order")}
    assert {"span", "drift", "order", "line_endings", "unicode", "tool_order", "rag_order",
            "list_order"} <= kinds, kinds
    assert {k[-1] for k in ref.accs if k[2:3] == ("list_order",)} == {"name", ""}  # a JSON list and text chunks
    assert ref.pending and not ref.errors
    _same(_records(specs))


def test_units_view_indexes_like_a_list() -> None:
    det = Detector(16)
    rec = Record("f", 0, "a", 0.0, "chat", messages=[{"role": "system", "content": "one line here\n\ntwo\n"},
                                                      {"role": "user", "content": "three\nfour"}],
                 tools=[{"name": "x"}])
    texts, c = det.contents.of(rec, 1)
    units = joined(det.contents.pieces_of(c, rec, texts))
    listed = list(units)
    assert [units[i] for i in range(len(units))] == listed
    assert units[-1] == listed[-1]
    assert [u.mi for u in listed] == [0, 0, -1, 1, 1]
    assert len(Units([], [], [], [])) == 0


def test_counterfactual_with_nothing_rewritten_is_the_baseline(tmp_path) -> None:
    """The counterfactual skips its re-run when no request was rewritten: the re-run gives the baseline."""
    from pathlib import Path

    import prefixscan
    from prefixscan.detect.attribution import table_chunks
    from prefixscan.detect.counterfactual import run_counterfactual
    from prefixscan.pipeline.aggregate import read_columns

    log = tmp_path / "mix.jsonl"
    write(SynthConfig(requests=300, seed=9, tenants=3, breakers=()), str(log))
    prefixscan.analyze(str(log), output=str(tmp_path / "run"))
    path = Path(tmp_path / "run" / "requests.parquet")
    req = read_columns(path, ["request_id", "tenant", "prompt_tokens", "cached_tokens"])
    full = run_counterfactual(req, table_chunks(str(path)), 16, "vllm", {}, {}, skip_unchanged=False)
    quick = run_counterfactual(req, table_chunks(str(path)), 16, "vllm", {}, {})
    assert full.cached_after == full.cached_before > 0
    assert (quick.to_json(), quick.credit) == (full.to_json(), full.credit)
