"""The workflow matrix: every input shape prefixscan reads x every command that takes a log or a run.

One set of conversations (three tenants, a timestamp at the top of one tenant's system prompt) is written
in each shape, so the expected numbers are known: every shape that renders the same prompts must give the
same prompt tokens and the same ideal hit rate, `fix` must raise the hit rate to what it predicted (or
refuse the file in one line and write nothing), and each command must keep its documented exit codes.
A cell that is not supported is listed in UNSUPPORTED with the one line it prints, and that line is tested.
"""

from __future__ import annotations

import gzip
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from prefixscan.cli.app import app

runner = CliRunner()
T0 = 1_795_000_000
TENANTS = ("acme", "globex", "initech")
CONVERSATIONS = 12
TURNS = 3
PARAGRAPH = ("Answer from the product catalogue and the policy handbook only. Quote the section you used. "
             "When a customer asks for a refund, check the order date, the item's condition and the payment "
             "method before promising anything, and say which rule applies. ")
TOOLS = [{"type": "function", "function": {"name": "lookup_order", "description": "Find an order by its number",
                                           "parameters": {"type": "object",
                                                          "properties": {"order": {"type": "string"}}}}}]
CANARY = "Zyxwvut Canarysson"
PNG = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9aw"
       "AAAABJRU5ErkJggg==")


def iso(t: float) -> str:
    return f"2026-11-20T09:{int(t) // 60 % 60:02d}:{int(t) % 60:02d}Z"


def conversations() -> list[dict[str, Any]]:
    """The canonical requests, in arrival order: each a system prompt, the history and a new user turn."""
    out = []
    i = 0
    for turn in range(TURNS):
        for c in range(CONVERSATIONS):
            tenant = TENANTS[c % len(TENANTS)]
            t = T0 + i * 2.0
            system = f"You are the support assistant of {tenant}. " + PARAGRAPH * 4
            if tenant == "acme":  # the breaker: a clock at the top of the system prompt
                system = f"Request time: {iso(t)}\n" + system
            history = []
            for k in range(turn + 1):
                who = f"I am {CANARY}. " if c == 5 else ""  # one customer's name, in one conversation
                history.append({"role": "user", "content": f"{who}Turn {k} of case {c}: where is order {1000 + c}?"})
                if k < turn:
                    history.append({"role": "assistant", "content": f"Order {1000 + c} left the warehouse on day "
                                                                   f"{k + 3}; it should arrive within a week."})
            out.append({"rid": f"r{i:03d}", "ts": t, "tenant": tenant, "conv": f"conv-{c:02d}", "system": system,
                        "history": history})
            i += 1
    return out


def _messages(c: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "system", "content": c["system"]}, *(dict(m) for m in c["history"])]


def _chat(c: dict[str, Any]) -> dict[str, Any]:
    return {"request_id": c["rid"], "timestamp": c["ts"], "tenant": c["tenant"], "conversation_id": c["conv"],
            "model": "m", "messages": _messages(c)}


def _chat_tools_images(c: dict[str, Any]) -> dict[str, Any]:
    r = _chat(c)
    first = r["messages"][1]
    first["content"] = [{"type": "text", "text": first["content"]}, {"type": "image_url", "image_url": {"url": PNG}}]
    r["tools"] = TOOLS
    return r


def _batch(c: dict[str, Any]) -> dict[str, Any]:
    return {"custom_id": c["rid"], "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": _messages(c)}}


def _gateway(c: dict[str, Any]) -> dict[str, Any]:
    return {"timestamp": iso(c["ts"]), "tenant": c["tenant"], "conversation_id": c["conv"],
            "request": {"model": "m", "messages": _messages(c)},
            "response": {"id": c["rid"], "usage": {"prompt_tokens": 300, "completion_tokens": 20}}}


def _litellm(c: dict[str, Any]) -> dict[str, Any]:
    return {"id": c["rid"], "call_type": "acompletion", "startTime": c["ts"], "endTime": c["ts"] + 0.5,
            "model": "m", "messages": _messages(c), "prompt_tokens": 300, "completion_tokens": 20,
            "metadata": {"user_api_key_team_id": c["tenant"], "session_id": c["conv"]}}


def _anthropic_body(c: dict[str, Any]) -> dict[str, Any]:
    return {"model": "claude-x", "max_tokens": 200, "system": c["system"],
            "messages": [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]}
                         for m in c["history"]]}


def _anthropic(c: dict[str, Any]) -> dict[str, Any]:
    return {**_anthropic_body(c), "id": c["rid"], "@timestamp": c["ts"], "tenant": c["tenant"],
            "conversation_id": c["conv"], "usage": {"input_tokens": 300, "output_tokens": 20}}


def _anthropic_wrapped(c: dict[str, Any]) -> dict[str, Any]:
    return {"timestamp": iso(c["ts"]), "tenant": c["tenant"], "session_id": c["conv"],
            "request": _anthropic_body(c),
            "response": {"id": c["rid"], "usage": {"input_tokens": 300, "output_tokens": 20}}}


def _responses(c: dict[str, Any]) -> dict[str, Any]:
    return {"created_at": c["ts"], "tenant": c["tenant"], "conversation_id": c["conv"],
            "request": {"model": "m", "instructions": c["system"],
                        "input": [{"role": m["role"], "content": m["content"]} for m in c["history"]]},
            "response": {"id": c["rid"], "object": "response", "usage": {"input_tokens": 300, "output_tokens": 20}}}


def _otel(c: dict[str, Any]) -> dict[str, Any]:
    msgs = [{"role": m["role"], "parts": [{"type": "text", "content": m["content"]}]} for m in c["history"]]
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "gen_ai.conversation.id": c["conv"],
             "gen_ai.input.messages": json.dumps(msgs),
             "gen_ai.system_instructions": json.dumps([{"type": "text", "content": c["system"]}]),
             "tenant": c["tenant"]}
    return {"name": "chat m", "context": {"trace_id": "t", "span_id": c["rid"]}, "start_time": iso(c["ts"]),
            "attributes": attrs}


def _no_timestamps(c: dict[str, Any]) -> dict[str, Any]:
    r = _chat(c)
    del r["timestamp"]
    return r


def _no_conversation_ids(c: dict[str, Any]) -> dict[str, Any]:
    r = _chat(c)
    del r["conversation_id"]
    return r


def _completion(c: dict[str, Any]) -> dict[str, Any]:
    prompt = c["system"] + "".join(f"\n{m['role']}: {m['content']}" for m in c["history"])
    return {"request_id": c["rid"], "timestamp": c["ts"], "tenant": c["tenant"], "conversation_id": c["conv"],
            "model": "m", "prompt": prompt}


def _jsonl(records: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def _write_jsonl(maker: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[Path, list], Path]:
    def write(root: Path, convs: list) -> Path:
        path = root / "log.jsonl"
        path.write_bytes(_jsonl([maker(c) for c in convs]))
        return path
    return write


def _write_gzip(root: Path, convs: list) -> Path:
    path = root / "log.jsonl.gz"
    path.write_bytes(gzip.compress(_jsonl([_chat(c) for c in convs]), mtime=0))
    return path


def _write_zstd(root: Path, convs: list) -> Path:
    path = root / "log.jsonl.zst"
    with pa.CompressedOutputStream(str(path), "zstd") as out:
        out.write(_jsonl([_chat(c) for c in convs]))
    return path


def _write_directory(root: Path, convs: list) -> Path:
    d = root / "logs"
    d.mkdir()
    half = len(convs) // 2
    (d / "a.jsonl").write_bytes(_jsonl([_chat(c) for c in convs[:half]]))
    (d / "b.jsonl").write_bytes(_jsonl([_chat(c) for c in convs[half:]]))
    return d


def _write_parquet_flat(root: Path, convs: list) -> Path:
    path = root / "log.parquet"
    rows = [{**{k: v for k, v in _chat(c).items() if k != "messages"}, "messages": json.dumps(_messages(c))}
            for c in convs]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _write_parquet_nested(root: Path, convs: list) -> Path:
    path = root / "log.parquet"
    pq.write_table(pa.Table.from_pylist([_chat(c) for c in convs]), path)
    return path


def _write_mooncake(root: Path, convs: list) -> Path:
    """A hashed trace (no text): the chat shape's run exported with 16-token blocks."""
    chat = root / "chat.jsonl"
    chat.write_bytes(_jsonl([_chat(c) for c in convs]))
    r = invoke("analyze", str(chat), "-o", str(root / "chat_run"), "-q")
    assert r.exit_code == 0, r.output
    path = root / "trace.jsonl"
    r = invoke("export", str(root / "chat_run"), "--to", "mooncake", "-o", str(path), "--block-size", "16")
    assert r.exit_code == 0, r.output
    chat.unlink()
    shutil.rmtree(root / "chat_run")
    return path


SHAPES: dict[str, Callable[[Path, list], Path]] = {
    "chat": _write_jsonl(_chat),
    "chat_tools_images": _write_jsonl(_chat_tools_images),
    "batch": _write_jsonl(_batch),
    "gateway": _write_jsonl(_gateway),
    "litellm": _write_jsonl(_litellm),
    "anthropic": _write_jsonl(_anthropic),
    "anthropic_wrapped": _write_jsonl(_anthropic_wrapped),
    "responses": _write_jsonl(_responses),
    "otel": _write_jsonl(_otel),
    "parquet_flat": _write_parquet_flat,
    "parquet_nested": _write_parquet_nested,
    "gzip": _write_gzip,
    "zstd": _write_zstd,
    "directory": _write_directory,
    "no_timestamps": _write_jsonl(_no_timestamps),
    "no_conversation_ids": _write_jsonl(_no_conversation_ids),
    "completion": _write_jsonl(_completion),
    "mooncake": _write_mooncake,
}
TEXTLESS = ("mooncake",)  # hashed traces: no text, so no breaker can be found or fixed
# Shapes whose prompts render exactly as the plain chat shape's: same tokens, same ideal hit rate.
SAME_PROMPTS = ("chat", "batch", "gateway", "litellm", "anthropic", "anthropic_wrapped", "responses", "otel",
                "parquet_flat", "parquet_nested", "gzip", "zstd", "directory", "no_timestamps",
                "no_conversation_ids", "mooncake")
# Options a shape needs (documented: docs/inputs.md).
ANALYZE_OPTIONS = {"mooncake": ["--hash-block-size", "16"]}
FIX_OPTIONS: dict[str, list[str]] = {}
# Cells that are not supported: (shape, command) -> the one line they print (a regex).
UNSUPPORTED: dict[tuple[str, str], str] = {
    ("mooncake", "fix"): "is a hashed trace (mooncake): it holds no prompt text",
    ("completion", "fix"): "holds completion prompts: cache breakers are searched for in chat messages only",
    ("completion", "findings"): "holds only completion prompts, which are not searched for cache breakers",
}
N = CONVERSATIONS * TURNS


def invoke(*args: str) -> Any:
    r = runner.invoke(app, list(args))
    assert r.exception is None or isinstance(r.exception, SystemExit), (args, r.output, r.exception)
    return r


def one_line_error(r: Any) -> None:
    """Failed commands print exactly one line on stderr, never a traceback."""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("prefixscan: "), r.stderr
    assert "Traceback" not in r.output


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every shape's log and its analyzed run (each analysed once for the whole module)."""
    root = tmp_path_factory.mktemp("matrix")
    convs = conversations()
    out: dict[str, Any] = {}
    for name, write in SHAPES.items():
        d = root / name
        d.mkdir()
        log = write(d, convs)
        run = d / "run"
        r = invoke("analyze", str(log), "-o", str(run), "--json", "-q", *ANALYZE_OPTIONS.get(name, []))
        out[name] = {"log": log, "run": run, "result": r, "dir": d}
    return out


def summary(world: dict[str, Any], shape: str) -> dict[str, Any]:
    r = world[shape]["result"]
    assert r.exit_code == 0, (shape, r.output)
    return json.loads(r.stdout)


def requests(run: Path) -> list[dict[str, Any]]:
    return pq.read_table(run / "requests.parquet").to_pylist()


def cell(shape: str, command: str) -> str | None:
    return UNSUPPORTED.get((shape, command))


@pytest.mark.parametrize("shape", SHAPES)
def test_analyze(world, shape: str) -> None:
    s = summary(world, shape)
    assert s["requests"]["read"] == s["requests"]["accepted"] == N, s["requests"]
    assert CANARY not in world[shape]["result"].stdout
    req = requests(world[shape]["run"])
    assert len(req) == N
    if shape not in TEXTLESS:  # a hashed trace holds no ids and no tenants
        assert [r["request_id"] for r in req] == [f"r{i:03d}" for i in range(N)]
        assert {r["tenant"] for r in req} == ({None} if shape == "batch" else set(TENANTS)), shape
    assert s["hit_rate"]["token_weighted"] > 0.3
    if shape in SAME_PROMPTS:
        base = requests(world["chat"]["run"])
        assert [r["prompt_tokens"] for r in req] == [r["prompt_tokens"] for r in base], shape
        assert s["hit_rate"]["token_weighted"] == summary(world, "chat")["hit_rate"]["token_weighted"], shape


@pytest.mark.parametrize("shape", SHAPES)
def test_findings(world, shape: str) -> None:
    r = invoke("findings", str(world[shape]["run"]), "--json")
    assert r.exit_code == 0, (shape, r.output)
    assert CANARY not in r.stdout
    found = json.loads(r.stdout)
    kinds = [f["kind"] for f in found["findings"]]
    if shape in TEXTLESS or cell(shape, "findings"):
        assert kinds == [] and found["checkable"] is False, found
        r = invoke("findings", str(world[shape]["run"]))
        assert r.exit_code == 0 and r.stdout.startswith("Not checkable: ") and len(r.stdout.splitlines()) == 1
        assert (cell(shape, "findings") or "has no prompt text") in r.stdout
        r = invoke("check", str(world[shape]["run"]), "--fail-on", "low", "-q")
        assert r.exit_code == 8 and "NOT CHECKABLE" in r.output, r.output
        return
    assert "timestamp" in kinds, (shape, kinds)
    top = next(f for f in found["findings"] if f["kind"] == "timestamp")
    assert top["tenant"] == (None if shape == "batch" else "acme") and top["tokens_lost"] > 0


@pytest.mark.parametrize("shape", SHAPES)
def test_explain(world, shape: str) -> None:
    rid = requests(world[shape]["run"])[2 * CONVERSATIONS + 5]["request_id"]  # the customer's third turn
    for fmt in ("--json", "-q"):
        r = invoke("explain", str(world[shape]["run"]), rid, fmt)
        assert r.exit_code == 0, (shape, r.output)
        assert CANARY not in r.output
    assert json.loads(invoke("explain", str(world[shape]["run"]), rid, "--json").stdout)["request_id"] == rid
    r = invoke("explain", str(world[shape]["run"]), "no-such-request")
    assert r.exit_code != 0 and r.exit_code != 1
    one_line_error(r)


@pytest.mark.parametrize("shape", SHAPES)
def test_fix_then_diff(world, shape: str) -> None:
    w = world[shape]
    log: Path = w["log"]
    target = w["dir"] / "fixed" / (log.name if log.is_file() else "")
    target.parent.mkdir(exist_ok=True)
    before = sorted(p.read_bytes() for p in ([log] if log.is_file() else log.iterdir()))
    r = invoke("fix", str(log), "-o", str(target if log.is_file() else w["dir"] / "fixed"), "--json", "-q",
               *FIX_OPTIONS.get(shape, []))
    assert sorted(p.read_bytes() for p in ([log] if log.is_file() else log.iterdir())) == before  # input intact
    expected = cell(shape, "fix")
    if expected:
        assert r.exit_code not in (0, 1)
        one_line_error(r)
        assert expected in r.stderr
        assert not target.exists() or target.is_dir() and not any(target.iterdir())
        return
    assert r.exit_code == 0, (shape, r.output)
    res = json.loads(r.stdout)
    assert res["requests"] == N and res["requests_rewritten"] == N // len(TENANTS), res
    assert res["token_weighted_after"] > res["token_weighted_before"] + 0.1, res
    assert res["token_weighted_after"] == pytest.approx(res["token_weighted_predicted"], abs=0.005), res
    fixed_run = w["dir"] / "fixed_run"
    fixed_input = res["outputs"][0] if len(res["outputs"]) == 1 else str(w["dir"] / "fixed")
    a = invoke("analyze", fixed_input, "-o", str(fixed_run), "--json", "-q", *ANALYZE_OPTIONS.get(shape, []))
    assert a.exit_code == 0, a.output
    after = json.loads(a.stdout)
    assert after["requests"]["accepted"] == N
    assert after["hit_rate"]["token_weighted"] == pytest.approx(res["token_weighted_after"], abs=1e-4)
    d = invoke("diff", str(w["run"]), str(fixed_run), "--json")
    assert d.exit_code == 0, d.output
    assert "timestamp" in json.dumps(json.loads(d.stdout))


@pytest.mark.parametrize("shape", SHAPES)
def test_simulate_estimate_report_named(world, shape: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(world[shape]["run"], run)
    r = invoke("simulate", str(run), "-p", "round_robin,prefix_hash", "--replicas", "4", "--name", "pilot-a", "-q")
    assert r.exit_code == 0, (shape, r.output)
    r = invoke("estimate", str(run), "--replicas", "4", "--rps", "5", "--json", "-q")
    assert r.exit_code == 0, (shape, r.output)
    r = invoke("report", str(run), "-q")
    assert r.exit_code == 0, (shape, r.output)
    md = (run / "report.md").read_text()
    assert "pilot-a" in md and "prefix_hash" in md
    r = invoke("query", str(run), "select count(*) as n from requests", "--format", "json")
    assert r.exit_code == 0 and json.loads(r.stdout)[0]["n"] == N, r.output
    assert_no_customer_text(run)


def assert_no_customer_text(run: Path) -> None:
    """No file of the run (tables' string cells included) holds the customer's name."""
    for f in sorted(run.rglob("*")):
        if f.suffix == ".parquet":
            t = pq.read_table(f)
            cells = [str(v) for c in t.columns if pa.types.is_string(c.type) or pa.types.is_large_string(c.type)
                     for v in c.to_pylist()]
            assert not any(CANARY in v for v in cells), f
        elif f.is_file():
            assert CANARY.encode() not in f.read_bytes(), f


@pytest.mark.parametrize("shape", SHAPES)
def test_query(world, shape: str) -> None:
    r = invoke("query", str(world[shape]["run"]), "select count(*) as n, count(distinct tenant) as t from requests",
               "--format", "json")
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)[0]
    assert row["n"] == N and row["t"] == (0 if shape in ("batch", *TEXTLESS) else len(TENANTS))
    r = invoke("query", str(world[shape]["run"]), "select * from no_such_table")
    assert r.exit_code == 2
    one_line_error(r)


@pytest.mark.parametrize("shape", SHAPES)
def test_check(world, shape: str) -> None:
    run = str(world[shape]["run"])
    r = invoke("check", run, "--min-hit-rate", "0.05", "-q")
    assert r.exit_code == 0, (shape, r.output)
    r = invoke("check", run, "--min-hit-rate", "0.99", "-q")
    assert r.exit_code == 8, (shape, r.exit_code, r.output)  # a failed gate has its own code


@pytest.mark.parametrize("shape", SHAPES)
def test_export(world, shape: str) -> None:
    out = world[shape]["dir"] / "trace.jsonl"
    r = invoke("export", str(world[shape]["run"]), "--to", "mooncake", "-o", str(out), "--block-size", "16",
               "--force")
    assert r.exit_code == 0, (shape, r.output)
    lines = out.read_text().splitlines()
    assert len(lines) == N and all("hash_ids" in json.loads(ln) for ln in lines)
    assert "acme" not in out.read_text()  # anonymised


def test_every_cell_is_listed() -> None:
    """No shape x command cell is left out silently: an unsupported cell names a real shape and command."""
    commands = {"analyze", "findings", "explain", "fix", "simulate", "estimate", "report", "query", "check",
                "export", "diff"}
    for shape, command in UNSUPPORTED:
        assert shape in SHAPES and command in commands
