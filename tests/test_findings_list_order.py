"""`list_order` (issue 27): a serialized list in the system prompt (tool definitions, retrieved chunks) whose
items arrive in another order from request to request. Found, located, costed by the counterfactual (equal to
re-analysing the log with every list in its canonical order), fixed by `fix` where a stable order is safe (a
JSON list of objects sorted by its name/id key, in its own layout) and left alone, saying so, where it is not."""

from __future__ import annotations

import json
import random

import pyarrow.compute as pc
import pytest
from typer.testing import CliRunner

import prefixscan
from prefixscan.cli.app import app
from prefixscan.config import AnalyzeConfig
from prefixscan.detect.list_order import UNSAFE, find_lists, reorder_text
from prefixscan.fix import fix_logs
from tests.conftest import write_jsonl
from tests.test_findings_detect import DOC, prose, question

runner = CliRunner()
NAMES = ["search_orders", "refund_payment", "lookup_customer", "open_ticket", "send_email", "get_invoice",
         "cancel_order"]
INTRO = "You are the support agent of ACME. Use the tools below when they help.\n" + prose(2, 2, 40) + "\n\n"
OUTRO = "\n\n" + prose(3, 2, 40) + "\n"


def tools(openai: bool = False) -> list[dict]:
    out = [{"name": n, "description": f"Use {n} to " + prose(i, 1, 22).lower(),
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}} for i, n in enumerate(NAMES)]
    return [{"type": "function", "function": t} for t in out] if openai else out


def chunks() -> list[str]:
    return [f"Source: kb/{i}.md\n" + prose(40 + i, 1, 45) for i in range(6)]


def render(items: list, style: str) -> str:
    if style == "compact":
        return "Tools:\n" + json.dumps(items, separators=(",", ":"))
    if style == "indent":
        return "Tools:\n" + json.dumps(items, indent=2)
    if style == "dashes":
        return "Documents:\n" + "\n---\n".join(items)
    if style == "bullets":
        return "Documents:\n" + "\n".join(f"- {c}" for c in items)
    return "Documents:\n" + "\n".join(f"{i + 1}. {c}" for i, c in enumerate(items))  # numbered


def records(style: str = "indent", items: list | None = None, order: str = "shuffle", seed: int = 7) -> list[dict]:
    """acme: 16 conversations (1-3 turns) whose system prompt carries the list, in a seeded shuffled order
    per conversation (`order="sorted"`: sorted by name, the canonical log; "differ": a different item
    left out in each conversation); globex: 6 conversations, a fixed prompt."""
    items = items if items is not None else (tools() if style in ("compact", "indent") else chunks())
    rng = random.Random(seed)
    out: list[dict] = []
    i = 0
    for c in range(16):
        mine = list(items)
        rng.shuffle(mine)
        if order == "sorted":
            mine.sort(key=lambda t: t["name"] if isinstance(t, dict) else t)
        elif order == "differ":
            mine = [t for k, t in enumerate(items) if k != c % len(items)]
        system = INTRO + render(mine, style) + OUTRO
        history: list[dict] = []
        for turn in range(1 + c % 3):
            history = [*history, {"role": "user", "content": (DOC if turn == 0 else "") + question(i)}]
            out.append({"request_id": f"r{i:03d}", "conversation_id": f"c{c}", "tenant": "acme", "model": "m",
                        "timestamp": 1_795_000_000 + i, "messages": [{"role": "system", "content": system}, *history]})
            history.append({"role": "assistant", "content": f"Answer {i}: " + prose(i, 1, 12)})
            i += 1
    for c in range(6):
        out.append({"request_id": f"g{c}", "conversation_id": f"g{c}", "tenant": "globex", "model": "m",
                    "timestamp": 1_795_000_100 + c, "messages": [
                        {"role": "system", "content": "You are a helper.\n" + prose(9, 3, 40)},
                        {"role": "user", "content": DOC + question(c)}]})
    return sorted(out, key=lambda r: r["timestamp"])


def interleave(recs: list[dict]) -> list[dict]:
    """Later turns come after other conversations started (so a list's first order is held, then rewritten)."""
    return sorted(recs, key=lambda r: (len(r["messages"]), r["timestamp"]))


def cached(result) -> int:
    """Prompt tokens an ideal cache served over the whole log."""
    return int(pc.sum(result.tables["requests"]["cached_tokens"]).as_py())


def cf(result) -> dict:
    return result.summary["counterfactual"]


@pytest.mark.parametrize("style", ["indent", "compact"])
def test_json_list_shuffled_is_found_costed_and_fixed(tmp_path, style: str) -> None:
    log = write_jsonl(tmp_path / "log.jsonl", interleave(records(style)))
    canon = write_jsonl(tmp_path / "canon.jsonl", interleave(records(style, order="sorted")))
    r = prefixscan.analyze(str(log))
    fs = r.findings.findings
    assert [f.kind for f in fs] == ["list_order"]
    f = fs[0]
    assert (f.message_index, f.role, f.tenant, f.category) == (0, "system", "acme", "normalisation")
    assert f.detail == "7 JSON objects sorted by `name`" and "`fix` does this" in f.fix
    assert f.token_offset is not None and f.block_index == f.token_offset // 16
    # Located at the first item that differs from the canonical (sorted) order, in the example request.
    by_id = {x["request_id"]: x for x in records(style)}
    text = by_id[f.example_request_id]["messages"][0]["content"]
    sorted_text = reorder_text(text, find_lists(text)[0].canonical)
    assert text[f.char_offset] == "{" and text[:f.char_offset] == sorted_text[:f.char_offset]
    assert text[f.char_offset:f.char_offset + 40] != sorted_text[f.char_offset:f.char_offset + 40]
    # Cost: what the canonical order would have cached, measured by analysing the canonical log.
    c = prefixscan.analyze(str(canon))
    assert c.findings.findings == []
    gained = c.summary["hit_rate"]["token_weighted"]
    assert cf(r)["token_weighted_after_fixes"] == pytest.approx(gained, abs=1e-6)
    assert f.tokens_lost == cached(c) - cached(r) == cf(r)["tokens_gained"] > 0
    assert cf(r)["requests_rewritten"] == f.requests_affected
    assert f.requests_affected == sum(1 for x in records(style)
                                      if x["tenant"] == "acme" and x["messages"][0]["content"]
                                      != reorder_text(x["messages"][0]["content"],
                                                      find_lists(x["messages"][0]["content"])[0].canonical))
    # fix: every list sorted by name in its own layout; the hit rate is the one predicted.
    out = tmp_path / "fixed.jsonl"
    res = fix_logs(AnalyzeConfig(inputs=(str(log),)), str(out))
    assert res.by_kind == {"list_order": 1} and res.not_fixed == {}
    assert res.after == pytest.approx(res.predicted, abs=1e-6) and res.after > res.before + 0.2
    assert res.findings_after == 0
    fixed = [json.loads(x) for x in out.read_text().splitlines()]
    canon_recs = {x["request_id"]: x for x in records(style, order="sorted")}
    for x in fixed:
        assert x == canon_recs[x["request_id"]]  # the same bytes as a log written sorted (layout kept)


def test_openai_tool_objects_sort_by_function_name(tmp_path) -> None:
    log = write_jsonl(tmp_path / "log.jsonl", records("indent", items=tools(openai=True)))
    r = prefixscan.analyze(str(log))
    [f] = r.findings.findings
    assert f.kind == "list_order" and f.detail == "7 JSON objects sorted by `function.name`"
    res = fix_logs(AnalyzeConfig(inputs=(str(log),)), str(tmp_path / "fixed.jsonl"))
    assert res.after == pytest.approx(res.predicted, abs=1e-6) and res.findings_after == 0
    first = json.loads((tmp_path / "fixed.jsonl").read_text().splitlines()[0])["messages"][0]["content"]
    listed = json.loads(first[first.index("["):first.rindex("]") + 1])
    assert [t["function"]["name"] for t in listed] == sorted(NAMES)


@pytest.mark.parametrize("style", ["dashes", "numbered", "bullets"])
def test_text_chunks_are_costed_but_not_rewritten(tmp_path, style: str) -> None:
    log = write_jsonl(tmp_path / "log.jsonl", interleave(records(style)))
    r = prefixscan.analyze(str(log))
    [f] = r.findings.findings
    assert f.kind == "list_order" and f.detail == UNSAFE and f.fix.startswith("No safe automatic rewrite")
    assert f.tokens_lost == cf(r)["tokens_gained"] > 0 and min(f.request_gains) >= 0
    assert cf(r)["requests_rewritten"] == f.requests_affected  # the moved lines are not also taken for spans
    out = tmp_path / "fixed.jsonl"
    res = fix_logs(AnalyzeConfig(inputs=(str(log),)), str(out))
    assert res.rewritten == 0 and res.by_kind == {} and res.not_fixed == {"list_order": 1}
    assert out.read_bytes() == log.read_bytes() and res.after == pytest.approx(res.before)
    cli = runner.invoke(app, ["fix", str(log), "-o", str(tmp_path / "cli.jsonl")])
    assert cli.exit_code == 0, cli.output
    assert "no safe rewrite, left as they are: list_order 1" in cli.output


@pytest.mark.parametrize("style", ["indent", "dashes", "bullets"])
def test_lists_whose_items_differ_are_not_list_order(tmp_path, style: str) -> None:
    """Not a permutation (each conversation leaves out another item): different content, not an order."""
    log = write_jsonl(tmp_path / "log.jsonl", records(style, order="differ"))
    r = prefixscan.analyze(str(log))
    assert "list_order" not in [f.kind for f in r.findings.findings]


def test_one_order_throughout_is_not_a_finding(tmp_path) -> None:
    """An unsorted list sent in the same order every time breaks nothing (and `fix` leaves it)."""
    items = tools()
    recs = records("indent", items=items, order="differ")
    fixed = INTRO + render(items, "indent") + OUTRO
    for x in recs:
        if x["tenant"] == "acme":
            x["messages"][0]["content"] = fixed
    r = prefixscan.analyze(str(write_jsonl(tmp_path / "log.jsonl", recs)))
    assert r.findings.findings == [] and cf(r)["requests_rewritten"] == 0


def test_gateway_log_and_cli_kind(tmp_path) -> None:
    """The held-out shape of the issue: a gateway request/response log; `findings --kind list_order`."""
    recs = records("indent")
    gw = write_jsonl(tmp_path / "gw.jsonl", [
        {"request": {"model": "m", "messages": x["messages"]}, "response": {"usage": {}}, "request_id": x["request_id"],
         "timestamp": x["timestamp"], "tenant": x["tenant"], "conversation_id": x["conversation_id"]} for x in recs])
    run = tmp_path / "run"
    res = runner.invoke(app, ["analyze", str(gw), "-o", str(run)])
    assert res.exit_code == 0, res.output
    assert "list_order" in res.output
    got = runner.invoke(app, ["findings", str(run), "--kind", "list_order", "--json"])
    rows = json.loads(got.output)["findings"]
    assert [x["kind"] for x in rows] == ["list_order"] and rows[0]["category"] == "normalisation"
    out = tmp_path / "gw.fixed.jsonl"
    fixed = fix_logs(AnalyzeConfig(inputs=(str(gw),)), str(out))
    assert fixed.after == pytest.approx(fixed.predicted, abs=1e-6) and fixed.findings_after == 0
    first = json.loads(out.read_text().splitlines()[0])
    assert set(first) == {"request", "response", "request_id", "timestamp", "tenant", "conversation_id"}


def test_tools_field_shuffled_is_tool_order_and_fixed(tmp_path) -> None:
    """The `tools` field of OpenAI chat bodies (rendered into the prompt by the template) in another order
    per conversation: `tool_order`, rewritten by `fix` to one order, reaching the predicted hit rate."""
    recs = records("indent")
    for x in recs:
        if x["tenant"] == "acme":
            x["messages"][0]["content"] = INTRO + OUTRO
            ts = tools(openai=True)
            random.Random(x["conversation_id"]).shuffle(ts)
            x["tools"] = ts
    log = write_jsonl(tmp_path / "log.jsonl", recs)
    r = prefixscan.analyze(str(log))
    assert [f.kind for f in r.findings.findings] == ["tool_order"]
    res = fix_logs(AnalyzeConfig(inputs=(str(log),)), str(tmp_path / "fixed.jsonl"))
    assert res.after == pytest.approx(res.predicted, abs=1e-6) and res.after > res.before


def test_find_lists_shapes() -> None:
    text = "Intro:\n[{\"id\": 3, \"v\": [1, 2]}, {\"id\": 1}, {\"id\": 2}] and [{\"x\": 1}, {\"x\": 1}, {\"x\": 2}]\n"
    a, b = find_lists(text)
    assert a.sort_key == "id" and len(a.hashes) == 3 and b.sort_key is None  # duplicate values: no safe sort
    assert reorder_text(text, a.canonical).startswith('Intro:\n[{"id": 1}, {"id": 2}, {"id": 3, "v": [1, 2]}]')
    assert find_lists("[{\"a\": 1}, {\"a\": 2}]") == []  # two items: too short to call a list
    assert find_lists("no list [1, 2, 3] here") == []  # not objects
    assert find_lists("[{\"a\": 1}, {\"a\": 2}, {\"a\": 3}") == []  # unterminated
    numbered = "Intro\n\n1. alpha one\n2. beta two\n3. gamma three\n\nEnd"
    [n] = find_lists(numbered)
    assert n.sort_key is None
    moved = reorder_text(numbered, (n.hashes[2], n.hashes[0], n.hashes[1]))
    assert moved == "Intro\n\n1. gamma three\n2. alpha one\n3. beta two\n\nEnd"  # numbers stay in place


def test_synth_list_order_truth_is_found_and_fixed(tmp_path) -> None:
    """`prefixscan synth --drift list_order`: every shuffled-list truth slot found, nothing reported that is
    not in the truth; `fix` sorts the lists and reaches the predicted hit rate."""
    from prefixscan.synth import SynthConfig, write
    from tests.test_findings_synth import evaluate

    cfg = SynthConfig(requests=900, seed=5, tenants=3, prompt_tokens=400, breakers=(), drift=("list_order",),
                      drift_rate=1.0)
    path = tmp_path / "syn.jsonl"
    write(cfg, str(path))
    truth = {t["request_id"]: t for t in map(json.loads, open(f"{path}.truth.jsonl"))}
    assert any(d["kind"] == "list_order" for t in truth.values() for d in t.get("drift") or [])
    r = prefixscan.analyze(str(path))
    got = evaluate([f.to_row() for f in r.findings.findings], truth)
    assert got["per_kind"]["list_order"] == [3, 0, 0]  # (the template scenario's customer fields are found too)
    assert all(fp == fn == 0 for _, fp, fn in got["per_kind"].values())
    res = fix_logs(AnalyzeConfig(inputs=(str(path),)), str(tmp_path / "fixed.jsonl"))
    assert res.by_kind["list_order"] == 3 and "list_order" not in res.not_fixed
    assert res.after == pytest.approx(res.predicted, abs=1e-6) and res.after > res.before


def test_json_list_in_the_first_user_message(tmp_path) -> None:
    """Retrieved documents as a JSON array in the first user message, shuffled per conversation: found
    there (role user), and `fix` sorts them by `id`."""
    docs = [{"id": f"kb-{i}", "text": prose(60 + i, 1, 40)} for i in range(6)]
    recs = json.loads(json.dumps(records("indent")))  # a conversation's turns share message objects
    for x in recs:
        if x["tenant"] == "acme":
            x["messages"][0]["content"] = INTRO + OUTRO
            mine = list(docs)
            random.Random(x["conversation_id"]).shuffle(mine)
            first = next(m for m in x["messages"] if m["role"] == "user")
            first["content"] = "Context:\n" + json.dumps(mine) + "\n\n" + first["content"]
    log = write_jsonl(tmp_path / "log.jsonl", recs)
    r = prefixscan.analyze(str(log))
    [f] = r.findings.findings
    assert (f.kind, f.message_index, f.role, f.detail) == ("list_order", 1, "user", "6 JSON objects sorted by `id`")
    res = fix_logs(AnalyzeConfig(inputs=(str(log),)), str(tmp_path / "fixed.jsonl"))
    assert res.after == pytest.approx(res.predicted, abs=1e-6) and res.after > res.before and res.findings_after == 0


def test_past_the_hold_bound_prediction_and_fix_still_agree(tmp_path, monkeypatch) -> None:
    """Requests sent in a list's first order before a second order showed up are held to be rewritten;
    past the bound they stay as sent, in the counterfactual and in `fix` alike."""
    import prefixscan.detect.orders as orders_mod

    log = write_jsonl(tmp_path / "log.jsonl", interleave(records("indent")))
    full = prefixscan.analyze(str(log))
    monkeypatch.setattr(orders_mod, "HOLD_CHARS", 1)
    bounded = prefixscan.analyze(str(log))
    assert cf(bounded)["requests_rewritten"] < cf(full)["requests_rewritten"]
    res = fix_logs(AnalyzeConfig(inputs=(str(log),)), str(tmp_path / "fixed.jsonl"))
    assert res.after == pytest.approx(res.predicted, abs=1e-6) == cf(bounded)["token_weighted_after_fixes"]


def test_with_a_timestamp_before_the_list_both_are_found_and_fixed(tmp_path) -> None:
    recs = json.loads(json.dumps(records("indent")))
    for x in recs:
        if x["tenant"] == "acme":
            stamp = f"Request time: 2026-11-29T10:{int(x['request_id'][1:]) % 60:02d}:00Z\n"
            x["messages"][0]["content"] = stamp + x["messages"][0]["content"]
    log = write_jsonl(tmp_path / "log.jsonl", recs)
    r = prefixscan.analyze(str(log))
    assert sorted(f.kind for f in r.findings.findings) == ["list_order", "timestamp"]
    res = fix_logs(AnalyzeConfig(inputs=(str(log),)), str(tmp_path / "fixed.jsonl"))
    assert res.by_kind == {"list_order": 1, "timestamp": 1}
    assert res.after == pytest.approx(res.predicted, abs=1e-6) and res.findings_after == 0


def test_system_message_as_text_parts(tmp_path) -> None:
    """A system message sent as content parts ([{"type": "text", "text": ...}]): found and fixed in its part."""
    recs = json.loads(json.dumps(records("indent")))
    for x in recs:
        sys_msg = x["messages"][0]
        sys_msg["content"] = [{"type": "text", "text": sys_msg["content"]}]
    log = write_jsonl(tmp_path / "log.jsonl", recs)
    r = prefixscan.analyze(str(log))
    assert [f.kind for f in r.findings.findings] == ["list_order"]
    out = tmp_path / "fixed.jsonl"
    res = fix_logs(AnalyzeConfig(inputs=(str(log),)), str(out))
    assert res.after == pytest.approx(res.predicted, abs=1e-6) and res.after > res.before + 0.2
    canon = {x["request_id"]: x["messages"][0]["content"] for x in records("indent", order="sorted")}
    for x in map(json.loads, out.read_text().splitlines()):
        assert x["messages"][0]["content"] == [{"type": "text", "text": canon[x["request_id"]]}]
