"""`explain` on every request of the sample logs, checked against brute-force block bookkeeping and the logs."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import prefixscan
from prefixscan.cli.app import app
from prefixscan.read.content import content_text
from prefixscan.reuse.explain import Explainer
from tests.conftest import ROOT

runner = CliRunner()
SAMPLES = ("chat.jsonl", "chat.parquet", "mooncake_small.jsonl")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, str]:
    out = {}
    for name in SAMPLES:
        run = tmp_path_factory.mktemp("explain") / name.replace(".", "_")
        prefixscan.analyze(str(ROOT / "sample_logs" / name), output=str(run))
        out[name] = str(run)
    return out


def _messages(name: str) -> dict[str, list[dict]]:
    path = ROOT / "sample_logs" / name
    if name.endswith(".parquet"):
        rows = pq.read_table(path).to_pylist()
    else:
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return {r["request_id"]: (json.loads(r["messages"]) if isinstance(r["messages"], str) else r["messages"])
            for r in rows if "messages" in r}


@pytest.mark.parametrize("name", SAMPLES)
def test_explain_every_request(runs, name) -> None:
    ex = Explainer(runs[name])
    req = pq.read_table(f"{runs[name]}/requests.parquet").to_pylist()
    first: dict[int, int] = {}  # brute force: first request (seq) holding each block
    texts = _messages(name) if name != "mooncake_small.jsonl" else {}
    located = 0
    for r in req:
        e = ex.explain(r["request_id"])
        hs = r["block_hashes"]
        runs_ = e.runs
        assert [b for run in runs_ for b in range(run.first, run.last + 1)] == list(range(len(hs)))
        hit = sum(run.last - run.first + 1 for run in runs_ if run.status == "hit")
        assert hit * ex.block_size == r["cached_tokens"] or ex.rule == "trace"
        for run in runs_:
            for b in range(run.first, run.last + 1):
                if run.status == "miss":
                    assert b >= r["cached_blocks"]
                else:
                    assert req[first[hs[b]]]["request_id"] == run.first_request_id
                    assert run.first_tenant == req[first[hs[b]]]["tenant"]
        d = e.divergence
        if r["cached_blocks"] < len(hs) or r["source_request_id"] is None:
            assert d is not None and d.block == r["cached_blocks"] and d.token == r["divergence_token"]
            if texts and d.against_request_id is not None and d.message_index is not None:
                a, b = texts[r["request_id"]], texts[d.against_request_id]
                mi, c = d.message_index, d.char_offset
                assert [content_text(m.get("content")) for m in a[:mi]] == [content_text(m.get("content"))
                                                                           for m in b[:mi]]
                xa = content_text(a[mi].get("content")) if mi < len(a) else ""
                xb = content_text(b[mi].get("content")) if mi < len(b) else ""
                assert xa[:c] == xb[:c] and (xa[c:c + 1] != xb[c:c + 1] or a[mi].get("role") != b[mi].get("role"))
                located += 1
            if not texts:
                assert d.message_index is None and "blocks only" in (d.note or "") or d.against_request_id is None
        for h in hs:
            first.setdefault(h, r["seq"])
        blob = json.dumps(e.to_json())
        if texts:  # no customer text by default: not even a short piece of the first system prompt
            sys_text = content_text(texts[r["request_id"]][0].get("content"))
            assert sys_text[20:60] not in blob
    if texts:
        assert located > 50


def test_explain_cli_json_text_and_errors(runs) -> None:
    run = runs["chat.jsonl"]
    r = runner.invoke(app, ["explain", run, "req-000231", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["divergence"]["message_index"] == 0 and d["divergence"]["this_text"] is None
    assert [f["kind"] for f in d["findings"] if f["at_divergence"]] == ["timestamp"]
    t = runner.invoke(app, ["explain", run, "req-000231", "--include-text"])
    assert t.exit_code == 0 and "here:" in t.stdout and "UTC" in t.stdout
    plain = runner.invoke(app, ["explain", run, "req-000231"])
    assert "UTC" not in plain.stdout and "first computed by" in plain.stdout
    bad = runner.invoke(app, ["explain", run, "nope"])
    assert bad.exit_code != 0 and "not in run" in bad.output and "Traceback" not in bad.output
