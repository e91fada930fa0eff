"""`analyze --reuse sql`: the reuse SQL run once over the whole log writes the scan's tables, byte for byte."""

from __future__ import annotations

import filecmp
import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from prefixscan.cli.app import app
from prefixscan.config import AnalyzeConfig
from prefixscan.pipeline.run import run_analysis
from tests.conftest import MOONCAKE, ROOT
from tests.test_reuse_sql import _chain, req_strategy
from tests.test_stream import _chat_log, tiny_chunks  # noqa: F401 - a fixture

SAMPLES = ROOT / "sample_logs"


def _summary(run: Path) -> dict:
    s = json.loads((run / "manifest.json").read_text())["analyze"]["summary"]
    s.pop("timings")
    s.pop("reuse")
    return s


def _same_as_scan(tmp: Path, inputs: tuple[str, ...], **opts: object) -> dict:
    """Analyze with the scan and with the SQL: every table the same bytes, the summaries equal but for the
    clocks and the reuse engine. Returns the SQL run's summary."""
    scan = run_analysis(AnalyzeConfig(inputs=inputs, output=str(tmp / "scan"), **opts))
    sql = run_analysis(AnalyzeConfig(inputs=inputs, output=str(tmp / "sql"), reuse="sql", **opts))
    a, b = Path(scan.run_dir), Path(sql.run_dir)
    names = sorted(p.name for p in a.glob("*.parquet"))
    assert names == sorted(p.name for p in b.glob("*.parquet")) and "requests.parquet" in names
    for name in names:
        assert filecmp.cmp(a / name, b / name, shallow=False), f"{name} differs"
    assert _summary(a) == _summary(b)
    assert scan.summary["reuse"] == {"engine": "scan"}
    assert not [p.name for p in b.iterdir() if p.name.startswith(".")]  # the spill is gone
    return sql.summary


@pytest.mark.parametrize("inputs", [("chat.jsonl", "chat.parquet"), ("mooncake_small.jsonl",)])
@pytest.mark.parametrize("streaming", [False, True])
def test_sql_reuse_writes_the_scans_tables_on_the_sample_logs(tmp_path: Path, inputs: tuple, streaming: bool) -> None:
    s = _same_as_scan(tmp_path, tuple(str(SAMPLES / n) for n in inputs), streaming=streaming)
    assert s["reuse"]["engine"] == "sql" and s["reuse"]["memory_limit"] == "1GB" and s["reuse"]["sql_s"] >= 0
    assert s["requests"]["accepted"] > 0


@pytest.mark.usefixtures("tiny_chunks")
@pytest.mark.parametrize("log", ["ordered", "shuffled", "mooncake"])
def test_sql_reuse_streamed_in_tiny_chunks(tmp_path: Path, log: str) -> None:
    """Many chunks (and, shuffled, the fall-back to one chunk): the SQL's positions are the scan's."""
    path = {"ordered": lambda: _chat_log(tmp_path / "o.jsonl"), "shuffled": lambda: _chat_log(tmp_path / "s.jsonl", 3),
            "mooncake": lambda: SAMPLES / "mooncake_small.jsonl"}[log]()
    s = _same_as_scan(tmp_path, (str(path),), streaming=True, reuse_memory_limit="64MB")
    assert any("not in time order" in n for n in s["notes"]) == (log == "shuffled")


def test_sql_reuse_on_a_synth_chat_log_with_tenants_isolated(tmp_path: Path) -> None:
    from prefixscan.synth import write
    from prefixscan.synth.config import SynthConfig

    log = tmp_path / "synth.jsonl"
    write(SynthConfig(requests=400, seed=11), str(log), truth_path=None)
    s = _same_as_scan(tmp_path, (str(log),), streaming=True, isolate_tenants=True, findings=False)
    assert s["requests"]["accepted"] == 400


@pytest.mark.skipif(not MOONCAKE.exists(), reason="shared/data/mooncake not present")
@pytest.mark.parametrize("name", ["conversation_trace.jsonl", "synthetic_trace.jsonl"])
def test_sql_reuse_on_the_mooncake_traces_out_of_core(tmp_path: Path, name: str) -> None:
    """Streamed, at a 32 MB DuckDB memory limit on one thread: the SQL spills, the tables stay the scan's."""
    _same_as_scan(tmp_path, (str(MOONCAKE / name),), streaming=True, findings=False, reuse_memory_limit="32MB",
                  reuse_temp_dir=str(tmp_path), threads=1)


def test_sql_reuse_on_an_empty_log(tmp_path: Path) -> None:
    log = tmp_path / "empty.jsonl"
    log.write_text("")
    res = run_analysis(AnalyzeConfig(inputs=(str(log),), output=str(tmp_path / "r"), reuse="sql"))
    assert res.summary["requests"]["accepted"] == 0 and res.summary["reuse"]["engine"] == "sql"


@pytest.mark.parametrize(("args", "says"), [
    (["--reuse", "duck"], "--reuse must be scan or sql"),
    (["--reuse", "sql", "--reuse-memory-limit", "lots"], "--reuse-memory-limit: not a memory size"),
    (["--reuse", "sql", "--reuse-memory-limit", "1GB'; DROP"], "--reuse-memory-limit: not a memory size"),
    (["--reuse", "sql", "--reuse-temp-dir", "/nonexistent/spill"], "--reuse-temp-dir: /nonexistent/spill: not a"),
    (["--reuse", "sql", "--granularity", "token"], "--reuse sql measures block granularity"),
])
def test_bad_reuse_options_are_one_line_usage_errors(tmp_path: Path, args: list[str], says: str) -> None:
    r = CliRunner().invoke(app, ["analyze", str(SAMPLES / "chat.jsonl"), "-o", str(tmp_path / "r"), "-q", *args])
    assert r.exit_code == 2, r.output
    assert says in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "r").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_temp_dir_is_a_usage_error(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        r = CliRunner().invoke(app, ["analyze", str(SAMPLES / "chat.jsonl"), "-q", "--reuse", "sql",
                                     "--reuse-temp-dir", str(ro)])
    finally:
        ro.chmod(0o700)
    assert r.exit_code == 2 and "cannot write there" in r.output and len(r.output.strip().splitlines()) == 1


def _parts(tmp: Path, blocks: list[list[int]], prompt: list[int], ten, conv) -> None:
    """The `reqs` and `blocks` relations of a trace, as one Parquet file each (as the collect step writes)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    for d in ("reqs", "blocks"):
        (tmp / d).mkdir()
    n = len(blocks)
    lengths = np.array([len(b) for b in blocks], np.int64)
    key = lambda s: pa.array(s, type=pa.uint64(), mask=s == 0)  # noqa: E731
    pq.write_table(pa.table({"pos": np.arange(n, dtype=np.int64), "n_blocks": lengths,
                             "prompt_tokens": np.array(prompt, np.int64), "tenant": key(ten), "conv": key(conv)}),
                   tmp / "reqs" / "p.parquet")
    pq.write_table(pa.table({"pos": np.repeat(np.arange(n, dtype=np.int64), lengths),
                             "idx": np.concatenate([np.arange(k, dtype=np.int32) for k in lengths] or [[]]).astype(
                                 np.int32),
                             "h": pa.array([h for b in blocks for h in b], type=pa.uint64())}),
                   tmp / "blocks" / "p.parquet")


@settings(max_examples=40, deadline=None)
@given(req_strategy, st.sampled_from(["vllm", "trace"]), st.sampled_from([1, 4]), st.lists(st.floats(0, 1), max_size=3))
def test_the_query_once_then_chunks_equals_the_scan(reqs: list, rule: str, B: int, cuts: list[float]) -> None:
    """`reuse_to_parquet` over the whole trace, then `SqlIdealCursor` chunk by chunk: every array of
    `IdealStream.add` on the same chunks, the dense ids and the distinct count included."""
    import tempfile

    import numpy as np

    from prefixscan.reuse.ideal import IdealStream, scope_salts
    from prefixscan.reuse.sql import SqlIdealCursor, connect, reuse_to_parquet, views_of_parquet

    blocks = [_chain(s) for s, *_ in reqs]
    offsets = np.zeros(len(blocks) + 1, np.int64)
    np.cumsum([len(b) for b in blocks], out=offsets[1:])
    flat = np.array([h for b in blocks for h in b], dtype=np.uint64)
    prompt = [len(b) * B - (e % B if b else 0) for b, (_, _, _, e) in zip(blocks, reqs, strict=True)]
    ten, conv = scope_salts([t for _, t, _, _ in reqs]), scope_salts([c for _, _, c, _ in reqs])
    with tempfile.TemporaryDirectory() as tmp:
        _parts(Path(tmp), blocks, prompt, ten, conv)
        with connect("64MB", tmp, 1) as con:
            views_of_parquet(con, f"{tmp}/reqs", f"{tmp}/blocks")
            n_distinct = reuse_to_parquet(con, B, rule, tmp)
        cursor, scan = SqlIdealCursor(f"{tmp}/reuse.parquet", f"{tmp}/ids.parquet", n_distinct), IdealStream()
        edges = sorted({0, len(blocks), *(int(c * len(blocks)) for c in cuts)})
        for a, b in zip(edges, edges[1:], strict=False):
            args = (offsets[a:b + 1] - offsets[a], flat[offsets[a]:offsets[b]], np.array(prompt[a:b], np.int64), B,
                    rule, ten[a:b], conv[a:b])
            (want, gid_want), (got, gid) = scan.add(*args), cursor.add(*args)
            for name in ("cached_blocks", "cached_tokens", "divergence_token", "tenant_cached_tokens",
                         "conversation_cached_tokens", "source"):
                assert np.array_equal(getattr(got, name), getattr(want, name)), name
            assert np.array_equal(gid, gid_want)
        assert n_distinct == scan.n_distinct
        with pytest.raises(ValueError):  # a request past the query's last position is refused
            cursor.add(np.zeros(2, np.int64), np.zeros(0, np.uint64), np.zeros(1, np.int64), B, rule,
                       np.zeros(1, np.uint64), np.zeros(1, np.uint64))
        cursor.release()


def test_a_memory_limit_too_small_for_duckdb_is_a_one_line_env_error(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["analyze", str(SAMPLES / "mooncake_small.jsonl"), "-o", str(tmp_path / "r"), "-q",
                                 "--reuse", "sql", "--reuse-memory-limit", "1MB"])
    assert r.exit_code == 7, r.output
    assert "the reuse SQL ran out of memory within --reuse-memory-limit 1MB" in r.output
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "r").exists()
