"""`prefixscan export`: hashed traces for replay tools, exact against native runs and (when installed) AIPerf."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

import prefixscan
from prefixscan.cli.app import app
from prefixscan.run.export import renumber, trace_reuse
from tests.conftest import ROOT

runner = CliRunner()
SAMPLE = ROOT / "sample_logs"


def read(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def chat_runs(tmp_path_factory) -> dict[int, str]:
    d = tmp_path_factory.mktemp("exp")
    out = {}
    for b in (16, 64):
        out[b] = str(d / f"run{b}")
        prefixscan.analyze(str(SAMPLE / "chat.jsonl"), output=out[b], block_size=b, findings=False)
    return out


def test_renumber_and_reuse_reference() -> None:
    assert renumber([[7, 9, None], [7, 9, 4], [None]]) == [[0, 1, 2], [0, 1, 3], [4]]
    mean, blocks = trace_reuse([[0, 1, 2], [0, 1, 3], [4]])
    assert mean == pytest.approx((0 + 2 / 3 + 0) / 3) and blocks == pytest.approx(2 / 7)


def test_hashed_trace_round_trips_exactly(tmp_path) -> None:
    run = tmp_path / "mc"
    prefixscan.analyze(str(SAMPLE / "mooncake_small.jsonl"), output=str(run), findings=False)
    r = prefixscan.export(str(run), str(tmp_path / "out.jsonl"))
    got, src = read(tmp_path / "out.jsonl"), read(SAMPLE / "mooncake_small.jsonl")
    t0 = src[0]["timestamp"]
    assert [g["hash_ids"] for g in got] == [s["hash_ids"] for s in src]  # the sample's ids are first-seen order
    assert [g["timestamp"] for g in got] == [s["timestamp"] - t0 for s in src]
    assert [(g["input_length"], g["output_length"]) for g in got] == [(s["input_length"], s["output_length"])
                                                                      for s in src]
    assert r.own_tail_ids == 0 and r.requests == 2000
    # a trace's own reuse as a trace is what prefixscan measured on it (block fractions, unbounded)
    again = prefixscan.analyze(str(tmp_path / "out.jsonl"), findings=False)
    assert again.summary["hit_rate"]["block_weighted"] == pytest.approx(r.block_weighted, abs=1e-12)


def test_coarsening_equals_a_native_run(chat_runs, tmp_path) -> None:
    """16-token hashes coarsened to 64-token blocks identify the same full blocks as a 64-token run."""
    prefixscan.export(chat_runs[16], str(tmp_path / "c.jsonl"), to="bailian", block_size=64)
    prefixscan.export(chat_runs[64], str(tmp_path / "n.jsonl"), to="bailian", block_size=64)
    c, n = read(tmp_path / "c.jsonl"), read(tmp_path / "n.jsonl")
    assert [x["input_length"] for x in c] == [x["input_length"] for x in n]
    full = [[x["hash_ids"][: x["input_length"] // 64] for x in rows] for rows in (c, n)]
    assert renumber(full[0]) == renumber(full[1])
    assert all(len(x["hash_ids"]) == -(-x["input_length"] // 64) for x in c)


def test_bailian_fields_and_anonymity(chat_runs, tmp_path) -> None:
    out = tmp_path / "b.jsonl"
    r = prefixscan.export(chat_runs[16], str(out), to="bailian")
    rows = read(out)
    assert set(rows[0]) == {"chat_id", "parent_chat_id", "timestamp", "input_length", "output_length", "type",
                            "turn", "hash_ids"}
    assert [x["chat_id"] for x in rows] == list(range(len(rows)))
    parents = [x["parent_chat_id"] for x in rows]
    assert all(-1 <= p < i for i, p in enumerate(parents)) and any(p >= 0 for p in parents)
    text = out.read_text()
    for secret in ("acme", "globex", "req-0", "conv"):
        assert secret not in text
    assert r.block_size == 16 and r.ids == sum(len(x["hash_ids"]) for x in rows)


def test_export_refuses_bad_targets(chat_runs, tmp_path) -> None:
    out = tmp_path / "x.jsonl"
    out.write_text("keep me\n")
    r = runner.invoke(app, ["export", chat_runs[16], "-o", str(out)])
    assert r.exit_code == 2 and "exists; pass --force" in r.output and out.read_text() == "keep me\n"
    r = runner.invoke(app, ["export", chat_runs[16], "-o", str(Path(chat_runs[16]) / "t.jsonl")])
    assert r.exit_code == 2 and "is a run directory" in r.output
    r = runner.invoke(app, ["export", chat_runs[64], "-o", str(tmp_path / "y.jsonl"), "--block-size", "16"])
    assert r.exit_code == 2 and "multiple of the run's block size 64" in r.output
    r = runner.invoke(app, ["export", chat_runs[16], "--to", "csv", "-o", str(tmp_path / "z.jsonl")])
    assert r.exit_code == 2 and "--to must be one of mooncake, bailian" in r.output


def _aiperf() -> str | None:
    env = os.environ.get("PREFIXSCAN_AIPERF")
    cand = [env] if env else [str(ROOT / "bench" / "out" / "peers-venv" / "bin" / "aiperf"), shutil.which("aiperf")]
    return next((c for c in cand if c and Path(c).exists()), None)


@pytest.mark.slow
def test_aiperf_reads_the_export(chat_runs, tmp_path) -> None:
    """AIPerf's analyze-trace reports the same mean per-request hit as the export summary (peer oracle)."""
    aiperf = _aiperf()
    if aiperf is None:
        pytest.skip("aiperf not installed (set PREFIXSCAN_AIPERF or run `make bench` once for its peers venv)")
    for run, target in ((chat_runs[16], "mooncake"), (chat_runs[16], "bailian")):
        out = tmp_path / f"{target}.jsonl"
        r = prefixscan.export(run, str(out), to=target)
        report = tmp_path / f"{target}.aiperf.json"
        subprocess.run([aiperf, "analyze-trace", str(out), "--block-size", str(r.block_size), "--output-file",
                        str(report)], check=True, capture_output=True, timeout=300)
        assert json.loads(report.read_text())["cache_hit_rate"] == pytest.approx(r.request_mean, abs=1e-9)
