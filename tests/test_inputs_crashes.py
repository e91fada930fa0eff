"""Records that once ended a whole command with "internal error" (issue 28) are a reject row or are read:
a media part nested 1,000 levels deep, tools and tool calls nested past what JSON writers take, Parquet
tool calls and tools holding binary or decimal values (in `analyze` and in `fix`), and wrong-typed values
where strings or objects are expected."""

from __future__ import annotations

import decimal
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from prefixscan.cli.app import app
from prefixscan.config import AnalyzeConfig
from prefixscan.pipeline.run import run_analysis
from prefixscan.read.content import json_text
from prefixscan.read.media import media_identifier
from tests.conftest import chat, write_jsonl

runner = CliRunner()
GOOD = '{"request_id": "ok", "timestamp": 1700000001, "model": "m", "messages": [{"role": "user", "content": "hi"}]}'


def _nested(depth: int, leaf: str = '{"data": "aGVsbG8="}', key: str = "source") -> str:
    return ('{"' + key + '": ') * depth + leaf + "}" * depth


def _line(content_part: str) -> str:
    return ('{"request_id": "deep", "timestamp": 1700000000, "model": "m", "messages": [{"role": "user", '
            '"content": [' + content_part + "]}]}")


def _analyze(path: Path, **kw: object):
    return run_analysis(AnalyzeConfig(inputs=(str(path),), quiet=True, **kw))


def test_a_media_part_nested_1000_levels_is_a_reject_not_a_crash(tmp_path: Path) -> None:
    log = tmp_path / "deep.jsonl"
    log.write_text(_line('{"type": "image_url", "image_url": ' + _nested(1000) + "}") + "\n" + GOOD + "\n")
    r = runner.invoke(app, ["analyze", str(log), "-o", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    assert "records read 2 = accepted 1 + rejected 1  (rejects: wrong_type 1)" in r.stdout
    rej = pq.read_table(tmp_path / "run" / "rejects.parquet").to_pylist()
    assert [(x["source_line"], x["detail"]) for x in rej] == [(1, "message 0 is nested too deeply to be written "
                                                                  "as JSON")]


def test_media_identifiers_of_deep_parts_are_found_without_recursion() -> None:
    part: dict = {"data": "aGVsbG8="}
    for _ in range(1500):  # deeper than Python's recursion limit (a Parquet struct or a Python caller)
        part = {"image_url": part}
    part["type"] = "image_url"
    assert len(media_identifier(part)) == 32  # a bounded search, then the part's shape: no RecursionError
    shallow = {"type": "image_url", "image_url": {"url": "https://x/cat.png", "detail": "low"}}
    assert media_identifier(shallow) == media_identifier({"type": "image_url", "image_url": "https://x/cat.png"})


@pytest.mark.parametrize("where", ["tool_calls", "tools", "tenant"])
def test_values_nested_past_json_writers_are_rejects(tmp_path: Path, where: str) -> None:
    rec = {k: v for k, v in chat(0, "c", 1).items() if k != where}
    deep = _nested(300, leaf="1", key="q")  # orjson reads 1,024 levels and writes about 250
    text = json.dumps(rec)[:-1]
    if where == "tool_calls":
        text = text.replace('"messages": [', '"messages": [{"role": "assistant", "content": "", "tool_calls": ['
                            + deep + "]}, ") + "}"
    else:
        text += f', "{where}": ' + ("[" + deep + "]" if where == "tools" else deep) + "}"
    log = tmp_path / "x.jsonl"
    log.write_text(text + "\n" + GOOD + "\n")
    res = _analyze(log)
    assert res.summary["requests"]["accepted"] == 1
    assert res.summary["requests"]["rejects_by_reason"] == {"wrong_type": 1}


def _parquet(tmp_path: Path, kind: str, where: str) -> Path:
    value = b"\x00\xffraw" if kind == "binary" else decimal.Decimal("1.25")
    msgs = [{"role": "system", "content": "You are helpful. " * 40}, {"role": "user", "content": "hi"}]
    rows = []
    for i in range(4):
        m = [dict(x) for x in msgs]
        if where == "tool_calls":
            m.insert(1, {"role": "assistant", "content": "", "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}, "extra": value}]})
        rows.append({"request_id": f"r{i}", "timestamp": 1_700_000_000 + i, "messages": m,
                     **({"tools": [{"type": "function", "name": "f", "extra": value}]} if where == "tools" else {})})
    path = tmp_path / f"{where}_{kind}.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.mark.parametrize("kind", ["binary", "decimal"])
@pytest.mark.parametrize("where", ["tool_calls", "tools"])
def test_parquet_binary_and_decimal_values_are_read_and_fixed(tmp_path: Path, kind: str, where: str) -> None:
    path = _parquet(tmp_path, kind, where)
    r = runner.invoke(app, ["analyze", str(path), "--json", "-q"])
    assert r.exit_code == 0, r.output
    assert '"accepted": 4' in r.stdout
    out = tmp_path / "fixed.parquet"
    r = runner.invoke(app, ["fix", str(path), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert pq.read_table(out).num_rows == 4 and pq.read_table(out).schema == pq.read_schema(path)


def test_json_text_writes_what_json_has_no_type_for() -> None:
    assert json_text({"b": b"ab", "x": b"\xff", "d": decimal.Decimal("1.250"), "s": {2, 1}}) == (
        '{"b":"ab","x":"base64:/w==","d":1.250,"s":[1,2]}')
    with pytest.raises(TypeError):
        json_text({"o": object()})


@pytest.mark.parametrize("patch", [
    {"tenant": [1, {"a": 2}]}, {"model": {"name": "m"}}, {"conversation_id": 5.5}, {"request_id": [1, 2]},
    {"tools": [1, "x", None]}, {"messages": [{"role": "user", "content": [1, None, {"type": "text", "text": 5}]}]},
    {"messages": [{"role": "user", "content": "x", "name": {"a": 1}}]},
    {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": [1, 2]}]}]},
    {"messages": [{"role": "assistant", "content": "x", "tool_calls": "oops"}, {"role": "user", "content": "y"}]},
    {"metadata": [1]}, {"usage": [1]}, {"timestamp": [1]}, {"tools": "not json"}, {"messages": 7},
], ids=lambda p: "-".join(p))
def test_wrong_typed_values_are_read_or_rejected(tmp_path: Path, patch: dict) -> None:
    log = write_jsonl(tmp_path / "w.jsonl", [chat(0, "c", 1) | patch, chat(1, "c", 2)])
    res = _analyze(log)
    rq = res.summary["requests"]
    assert rq["read"] == 2 == rq["accepted"] + rq["rejected"] and rq["accepted"] >= 1
