"""`prefixscan fix`: same format out, meaning kept, untouched records byte-identical, gain measured."""

from __future__ import annotations

import gzip
import json

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from prefixscan.cli.app import app
from prefixscan.config import AnalyzeConfig
from prefixscan.fix import fix_logs
from tests.test_findings_detect import DOC, SYS, question, rec, ts

runner = CliRunner()


def records(n: int = 16) -> list[dict]:
    out = [rec(i, f"Request time: {ts(i)}\n" + SYS, DOC + question(i)) for i in range(n)]
    out += [rec(100 + i, SYS, DOC + question(i), tenant="globex") for i in range(4)]  # clean: left alone
    return out


def lines(msgs: list[dict]) -> list[str]:
    return sorted(ln for m in msgs for ln in m["content"].split("\n") if ln.strip())


def write_lines(path, recs, gz=False) -> None:
    data = b"".join(orjson.dumps(r) + b"\n" for r in recs)
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)


@pytest.mark.parametrize("gz", [False, True])
def test_fix_jsonl_keeps_meaning_and_format(tmp_path, gz: bool) -> None:
    src = tmp_path / ("log.jsonl.gz" if gz else "log.jsonl")
    recs = records()
    write_lines(src, recs, gz)
    out = tmp_path / ("fixed.jsonl.gz" if gz else "fixed.jsonl")
    res = fix_logs(AnalyzeConfig(inputs=(str(src),)), str(out))
    assert res.rewritten == 16 and res.requests == 20
    assert res.after > res.before + 0.4 and res.after == pytest.approx(res.predicted, abs=0.01)
    assert res.findings_after == 0
    raw = out.read_bytes()
    if gz:
        assert raw[:2] == b"\x1f\x8b"
        raw = gzip.decompress(raw)
    fixed = [json.loads(x) for x in raw.splitlines()]
    assert [r["request_id"] for r in fixed] == [r["request_id"] for r in recs]
    for a, b in zip(recs, fixed, strict=True):
        assert lines(a["messages"]) == lines(b["messages"])  # every line kept: label and value moved together
        assert {k: v for k, v in a.items() if k != "messages"} == {k: v for k, v in b.items() if k != "messages"}
    assert fixed[3]["messages"][0]["content"] == SYS
    assert fixed[3]["messages"][1]["content"].endswith(f"\n\nRequest time: {ts(3)}\n")
    original = (gzip.decompress(src.read_bytes()) if gz else src.read_bytes()).splitlines()
    assert raw.splitlines()[16:] == original[16:]  # untouched records are copied byte for byte


def test_fix_parquet_and_gateway_shapes(tmp_path) -> None:
    recs = records(12)
    table = pa.Table.from_pylist([{"request_id": r["request_id"], "timestamp": r["timestamp"], "tenant": r["tenant"],
                                   "messages": json.dumps(r["messages"])} for r in recs])
    src = tmp_path / "log.parquet"
    pq.write_table(table, src)
    out = tmp_path / "fixed.parquet"
    res = fix_logs(AnalyzeConfig(inputs=(str(src),)), str(out))
    fixed = pq.read_table(out)
    assert fixed.schema == table.schema and fixed.num_rows == 16 and res.rewritten == 12
    assert json.loads(fixed["messages"][0].as_py())[0]["content"] == SYS

    gw = tmp_path / "gw.jsonl"
    write_lines(gw, [{"request": {"model": "m", "messages": r["messages"]}, "response": {"usage": {}},
                      "request_id": r["request_id"], "timestamp": r["timestamp"], "tenant": r["tenant"]}
                     for r in recs])
    res = fix_logs(AnalyzeConfig(inputs=(str(gw),)), str(tmp_path / "gw.fixed.jsonl"))
    first = json.loads((tmp_path / "gw.fixed.jsonl").read_text().splitlines()[1])
    assert first["request"]["messages"][0]["content"] == SYS and res.after > res.before


def test_fix_cli(tmp_path) -> None:
    src = tmp_path / "log.jsonl"
    write_lines(src, records())
    out = tmp_path / "fixed.jsonl"
    r = runner.invoke(app, ["fix", str(src), "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["requests_rewritten"] == 16 and data["findings_by_kind"] == {"timestamp": 1}
    assert data["token_weighted_after"] > data["token_weighted_before"]
    r = runner.invoke(app, ["fix", str(src), "-o", str(out)])
    assert r.exit_code == 2 and "--force" in r.stderr
    r = runner.invoke(app, ["fix", str(src), "-o", str(out), "--force"])
    assert r.exit_code == 0 and "before" in r.stderr and "after" in r.stderr
