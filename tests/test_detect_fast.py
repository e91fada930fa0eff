"""The fast detector (memoised pieces and request contents, list-slice alignment) by its outputs: the
findings table of adversarial logs (timestamps, UUIDs, near-identical system prompts, empty messages,
tools, drift, every order check) and of synth logs with known breakers equals a fixture, whatever the memo
bounds. The fixture (tests/data/detect_findings.json) was written by the detector as it was before the
fast path (main at 973c53d, then kept in tests/ as a frozen copy), so outputs, not internal state, now
hold the detector to it."""

from __future__ import annotations

import hashlib
import json
import os
import random
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import prefixscan.detect.content as content_mod
import prefixscan.detect.detector as detector_mod
from prefixscan.detect import Detector
from prefixscan.detect.pieces import Units, joined
from prefixscan.read.record import Record
from prefixscan.synth import REGISTRY, SynthConfig, write
from prefixscan.synth.drift import DRIFT_KINDS
from tests.conftest import ROOT, write_jsonl

FIXTURE = ROOT / "tests" / "data" / "detect_findings.json"
SEEDS = 12
SYNTH = {
    "chat": SynthConfig(requests=400, seed=3, tenants=3, scenarios=(("chat", 1.0),)),
    "all": SynthConfig(requests=400, seed=4, tenants=3, breakers=tuple(REGISTRY), breaker_rate=0.4,
                       drift=DRIFT_KINDS, drift_rate=0.3),
}

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

FIELD_MAKERS = [
    lambda r: f"Request time: 2026-11-{r % 28 + 1:02d}T10:{r % 60:02d}:00Z",
    lambda r: f"Request id: {uuid.UUID(int=r * 7919 + 1)}",
    lambda r: f"Customer name: {['Ana Lima', 'Bo Chen', 'Carla Diaz'][r % 3]}",
    lambda r: f"Session: {r * 104729 % 99991:x}",
    lambda r: f"Today is Monday, {r % 28 + 1} November 2026, and the office closes at 17:00 local time.",
    lambda r: "",
]

DRIFTS = ["none", "crlf", "nfd", "nfc", "spaces", "json_order", "blank_lines", "list_a", "list_b",
          "chunks_a", "chunks_b"]
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


def _specs(seed: int) -> list[dict]:
    """A seeded draw of request specs (fixed, so their findings are a fixture): a few system prompts per
    case, each sent many times with its own field, drift, tools and user message, so families form."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(len(BASE)) for _ in range(rng.randint(3, 9))] for _ in range(3)]
    return [{"tenant": rng.choice(["t1", "t2", ""]), "lines": rng.choice(prompts),
             "field": FIELD_MAKERS[rng.randrange(len(FIELD_MAKERS))], "field_at": rng.randint(0, 9),
             "drift": rng.choice(DRIFTS), "tools": rng.randint(0, 4),
             "user": rng.choice(["plain", "docs", "docs_swapped", "empty", "same", "blank"]),
             "turns": rng.randint(1, 3), "developer": rng.random() < 0.3, "no_system": rng.random() < 0.1}
            for _ in range(rng.randint(30, 60))]


def _every_path_specs() -> list[dict]:
    """Requests that carry each breaker the detector knows: spans, drift, every order check."""
    return [{"tenant": "t1", "lines": [0, 1, 3, 4, 5, 6, 7, 8], "field": f, "field_at": 2, "drift": d,
             "tools": tools, "user": user, "turns": 2, "developer": False, "no_system": False}
            for f, d, tools, user in [(lambda r: "", "nfc", 4, "docs"), (lambda r: "", "nfd", 4, "docs"),
                                      (lambda r: f"Request id: {uuid.UUID(int=r + 1)}", "none", 1, "docs"),
                                      (lambda r: f"Request id: {uuid.UUID(int=r + 1)}", "crlf", 2, "docs_swapped"),
                                      (lambda r: f"Customer name: {['Ana Lima', 'Bo Chen'][r % 2]}", "nfc", 3, "docs"),
                                      (lambda r: "", "spaces", 1, "plain"), (lambda r: "", "json_order", 1, "plain"),
                                      (lambda r: f"Request id: {uuid.UUID(int=r + 1)}", "none", 1, "docs"),
                                      (lambda r: "", "list_b", 1, "plain"), (lambda r: "", "list_a", 1, "plain"),
                                      (lambda r: "", "chunks_a", 1, "plain"), (lambda r: "", "chunks_b", 1, "plain")]]


def _repeated(records: list[Record], repeat: int) -> list[Record]:
    """The records, then `repeat - 1` more rounds of them under new request ids."""
    return records + [Record(r.source_file, r.source_line, f"{r.request_id}x{j}", r.timestamp_s, "chat",
                             tenant=r.tenant, messages=r.messages, tools=r.tools)
                      for j in range(1, repeat) for r in records]


def _write_log(path: Path, records: list[Record]) -> Path:
    rows = [{"request_id": r.request_id, "timestamp": 1_700_000_000 + i, "tenant": r.tenant, "model": "m",
             "messages": r.messages, **({"tools": r.tools} if r.tools is not None else {})}
            for i, r in enumerate(records)]
    return write_jsonl(path, rows)


def _cases(tmp: Path) -> dict[str, Path]:
    """Every case's log: seeded adversarial request sets, the every-path set, and two synth logs."""
    logs = {f"seed{seed}": _write_log(tmp / f"seed{seed}.jsonl", _repeated(_records(_specs(seed)), 1 + seed % 3))
            for seed in range(SEEDS)}
    logs["every_path"] = _write_log(tmp / "every_path.jsonl", _records(_every_path_specs()))
    for name, cfg in SYNTH.items():
        write(cfg, str(tmp / f"synth_{name}.jsonl"))
        logs[f"synth_{name}"] = tmp / f"synth_{name}.jsonl"
    return logs


def _findings(log: Path, out: Path) -> dict:
    """The findings table's rows and a digest of the finding_requests table, as JSON values."""
    import prefixscan

    prefixscan.analyze(str(log), output=str(out), quiet=True, workers=0, capacities=())
    rows = pq.read_table(out / "findings.parquet").drop_columns(["example_request_id"]).to_pylist()
    per = pq.read_table(out / "finding_requests.parquet").to_pylist()
    digest = hashlib.sha256(json.dumps(per, sort_keys=True).encode()).hexdigest()[:16]
    return {"findings": rows, "finding_requests": [len(per), digest]}


def _all_findings(tmp: Path) -> dict[str, dict]:
    return {name: _findings(log, tmp / f"run_{name}") for name, log in _cases(tmp).items()}


def test_findings_equal_the_fixture(tmp_path: Path) -> None:
    """The detector's outputs on adversarial and synth logs equal the fixture, which the detector as it was
    before issue 15's fast path wrote (and the fast one matched state for state). To accept a deliberate
    change in findings, rerun with PREFIXSCAN_WRITE_FIXTURES=1 and review the fixture's diff."""
    got = _all_findings(tmp_path)
    if os.environ.get("PREFIXSCAN_WRITE_FIXTURES"):
        FIXTURE.write_text(json.dumps(got, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    want = json.loads(FIXTURE.read_text(encoding="utf-8"))
    assert got.keys() == want.keys()
    for name in want:
        assert got[name] == want[name], name


def test_memo_bounds_change_no_finding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Memo bounds only change speed: with every memo holding one entry the findings are the fixture's."""
    monkeypatch.setattr(content_mod, "CONTENT_BYTES", 1)
    monkeypatch.setattr(content_mod, "CHECK_BYTES", 1)
    monkeypatch.setattr(detector_mod, "MEMO_BYTES", 1)
    want = json.loads(FIXTURE.read_text(encoding="utf-8"))
    for name, log in _cases(tmp_path).items():
        if name.startswith("seed") and int(name[4:]) % 3:
            continue  # a third of the seeded cases is enough here
        assert _findings(log, tmp_path / f"run_{name}") == want[name], name


def test_the_fixture_holds_every_breaker() -> None:
    """The fixture is only worth something if its logs make the detector find each kind of breaker."""
    want = json.loads(FIXTURE.read_text(encoding="utf-8"))
    kinds = {f["kind"] for case in want.values() for f in case["findings"]}
    assert {"line_endings", "unicode", "whitespace", "json_key_order", "tool_order", "rag_order", "list_order",
            "request_id", "timestamp", "session_id", "user_name", "template_churn", "pattern_free"} <= kinds, kinds
    assert {f["kind"] for f in want["every_path"]["findings"]} >= {"unicode", "list_order", "tool_order"}
    assert all(case["findings"] for name, case in want.items() if name.startswith("synth"))


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
