"""Streaming analyze: the same tables, byte for byte, as the in-memory path, in any chunking."""

from __future__ import annotations

import filecmp
import json
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import prefixscan.pipeline.config as ingest_mod
import prefixscan.read.mooncake as fast_mod
from prefixscan.config import AnalyzeConfig
from prefixscan.encode.dense import DenseTable, dense_ids
from prefixscan.errors import UsageError
from prefixscan.pipeline.run import run_analysis
from prefixscan.reuse.ideal import IdealStream, ideal_reuse
from prefixscan.run import rundir
from tests.conftest import MOONCAKE, ROOT, chat, write_jsonl


@pytest.fixture
def tiny_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Many chunks on small inputs: every chunk boundary case is exercised."""
    monkeypatch.setattr(ingest_mod, "STREAM_TEXT_ROWS", 3)
    monkeypatch.setattr(ingest_mod, "ONE_CHUNK_TEXT_ROWS", 3)
    monkeypatch.setattr(ingest_mod, "BATCH", 2)
    monkeypatch.setattr(ingest_mod, "STREAM_TRACE_ROWS", 40)
    monkeypatch.setattr(fast_mod, "CHUNK_BYTES", 2500)
    # small row groups, cut by rows and by block hashes: the streamed writer must cut where the whole does
    monkeypatch.setattr(rundir, "ROW_GROUP_SIZE", 9)
    monkeypatch.setattr(rundir, "GROUP_BLOCKS", 120)


def _both(tmp: Path, inputs: list[str], **opts: object) -> tuple:
    out = {}
    for mode in (False, True):
        cfg = AnalyzeConfig(inputs=tuple(inputs), output=str(tmp / f"run-{mode}"), streaming=mode, **opts)
        out[mode] = run_analysis(cfg)
    return out[False], out[True]


def _assert_same(mem, streamed) -> None:
    a, b = Path(mem.run_dir), Path(streamed.run_dir)
    names = sorted(p.name for p in a.glob("*.parquet"))
    assert names == sorted(p.name for p in b.glob("*.parquet"))
    for name in names:
        assert filecmp.cmp(a / name, b / name, shallow=False), f"{name} differs"
    sa, sb = (json.loads((p / "manifest.json").read_text())["analyze"]["summary"] for p in (a, b))
    sa.pop("timings"), sb.pop("timings")
    assert sa == sb
    assert streamed.tables["requests"].equals(mem.tables["requests"])
    assert not list(b.glob(".*"))  # no temporary or spill file is left behind


def _chat_log(path: Path, shuffle: int = 0) -> Path:
    recs = []
    i = 0
    for turn in range(1, 5):
        for conv, tenant in (("c1", "acme"), ("c2", "acme"), ("c3", "globex"), ("c4", None)):
            recs.append(chat(i, conv, turn, tenant=tenant, ts=float(i // 3)))  # equal times: input order decides
            i += 1
    recs.append(chat(i, "c1", 1, tenant="acme", actual_cached_tokens=3))
    recs.append("{not json")
    recs.append(chat(0, "c9", 1))  # duplicate id: a reject
    if shuffle:
        random.Random(shuffle).shuffle(recs)
    return write_jsonl(path, recs)


@pytest.mark.usefixtures("tiny_chunks")
@pytest.mark.parametrize("opts", [{}, {"isolate_tenants": True, "hash_tenants": True, "tenant_key": "k"},
                                  {"findings": False}])
def test_chat_log_streams_to_the_same_bytes(tmp_path: Path, opts: dict) -> None:
    mem, streamed = _both(tmp_path, [str(_chat_log(tmp_path / "chat.jsonl"))], **opts)
    assert streamed.summary["requests"]["rejected"] == 2
    _assert_same(mem, streamed)


@pytest.mark.usefixtures("tiny_chunks")
@pytest.mark.parametrize("name", ["mooncake_small.jsonl", "chat.jsonl"])
def test_sample_logs_stream_to_the_same_bytes(tmp_path: Path, name: str) -> None:
    _assert_same(*_both(tmp_path, [str(ROOT / "sample_logs" / name)]))


@pytest.mark.usefixtures("tiny_chunks")
@pytest.mark.skipif(not MOONCAKE.exists(), reason="shared/data/mooncake not present")
def test_real_trace_with_local_disorder_streams(tmp_path: Path) -> None:
    """Swapped neighbours are sorted within a held-back chunk: still streamed, still identical."""
    lines = (MOONCAKE / "conversation_trace.jsonl").read_text().splitlines()[:1500]
    for i in range(0, len(lines) - 1, 7):
        lines[i], lines[i + 1] = lines[i + 1], lines[i]
    log = tmp_path / "jitter.jsonl"
    log.write_text("\n".join(lines) + "\n")
    mem, streamed = _both(tmp_path, [str(log)])
    _assert_same(mem, streamed)
    assert not any("not in time order" in n for n in streamed.summary["notes"])


@pytest.mark.usefixtures("tiny_chunks")
def test_out_of_order_log_falls_back_to_memory_and_says_so(tmp_path: Path) -> None:
    mem, streamed = _both(tmp_path, [str(_chat_log(tmp_path / "chat.jsonl", shuffle=3))])
    assert any("not in time order" in n for n in streamed.summary["notes"])
    for name in ("requests", "summaries", "prefixes", "capacity_curve", "rejects"):
        assert streamed.tables[name].equals(mem.tables[name])


def test_streaming_needs_a_run_directory_and_block_granularity(tmp_path: Path) -> None:
    log = str(ROOT / "sample_logs" / "mooncake_small.jsonl")
    with pytest.raises(UsageError, match="-o"):
        run_analysis(AnalyzeConfig(inputs=(log,), streaming=True))
    with pytest.raises(UsageError, match="in-memory"):
        run_analysis(AnalyzeConfig(inputs=(log,), output=str(tmp_path / "r"), streaming=True, granularity="token"))


def test_auto_streams_large_logs_with_a_run_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import prefixscan.pipeline.config as analysis_mod
    from prefixscan.pipeline.config import streams
    from prefixscan.read.sources import expand

    log = str(ROOT / "sample_logs" / "mooncake_small.jsonl")
    src = expand([log])
    assert not streams(AnalyzeConfig(inputs=(log,), output=str(tmp_path)), src)  # small: in memory
    monkeypatch.setattr(analysis_mod, "STREAM_MIN_BYTES", 1)
    assert streams(AnalyzeConfig(inputs=(log,), output=str(tmp_path)), src)
    assert not streams(AnalyzeConfig(inputs=(log,)), src)
    assert not streams(AnalyzeConfig(inputs=(log,), output=str(tmp_path), granularity="token"), src)
    assert not streams(AnalyzeConfig(inputs=(log,), output=str(tmp_path), streaming=False), src)


def test_cli_stream_flag_streams(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from prefixscan.cli.app import app

    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["analyze", str(ROOT / "sample_logs" / "mooncake_small.jsonl"), "-o", str(out),
                                   "--stream", "-q", "--json"])
    assert res.exit_code == 0, res.output
    mem = run_analysis(AnalyzeConfig(inputs=(str(ROOT / "sample_logs" / "mooncake_small.jsonl"),)))
    import pyarrow.parquet as pq

    assert pq.read_table(out / "requests.parquet").equals(mem.tables["requests"])


def test_empty_log_streams(tmp_path: Path) -> None:
    log = write_jsonl(tmp_path / "bad.jsonl", ["{oops", "[1, 2"])
    mem, streamed = _both(tmp_path, [str(log)])
    _assert_same(mem, streamed)
    assert streamed.summary["requests"] == mem.summary["requests"]


rows = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 5), st.integers(0, 2), st.integers(0, 2)), max_size=40)


@settings(max_examples=150, deadline=None)
@given(rows, st.lists(st.integers(0, 40), max_size=5), st.sampled_from(["vllm", "trace"]))
def test_ideal_stream_equals_one_call(reqs: list, cuts: list, rule: str) -> None:
    """Fed in any chunks, IdealStream gives ideal_reuse's arrays, tenant and conversation scopes included
    (scopes that appear only after the first chunk too)."""
    salts = np.array([0, 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F], dtype=np.uint64)
    lengths = np.array([r[1] for r in reqs], dtype=np.int64)
    off = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    flat = np.array([r[0] * 1000 + j for r in reqs for j in range(r[1])], dtype=np.uint64)
    prompt = np.maximum(lengths * 16 - 5, 0)
    ten, conv = salts[[r[2] for r in reqs]], salts[[r[3] for r in reqs]]
    want = ideal_reuse(off, flat, prompt, 16, rule, ten, conv)
    n = len(reqs)
    edges = sorted({0, n, *[c for c in cuts if c <= n]})
    stream, parts, ids = IdealStream(), [], []
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        res, gid = stream.add(off[a:b + 1] - off[a], flat[off[a]:off[b]], prompt[a:b], 16, rule, ten[a:b], conv[a:b])
        parts.append(res)
        ids.append(gid)
    for f in ("cached_blocks", "cached_tokens", "divergence_token", "tenant_cached_tokens",
              "conversation_cached_tokens", "source"):
        got = np.concatenate([getattr(p, f) for p in parts]) if parts else np.zeros(0)
        assert np.array_equal(got, getattr(want, f)), f
    if n:
        assert np.array_equal(np.concatenate(ids), dense_ids(flat)[0])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=300), st.integers(1, 50))
def test_dense_table_grows_and_keeps_first_appearance_ids(values: list, step: int) -> None:
    x = np.array(values + values[::2], dtype=np.uint64)
    table = DenseTable(slots=16)
    got = np.concatenate([table.ids(x[i:i + step]) for i in range(0, len(x), step)] or [np.zeros(0, np.int32)])
    _, first = np.unique(x, return_index=True)
    order = np.argsort(first)
    expected = np.empty(len(x), np.int64)
    inverse = np.unique(x, return_inverse=True)[1]
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    expected[:] = rank[inverse] if len(x) else expected
    assert np.array_equal(got, expected)
    assert table.n == len(set(values))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=60), st.lists(st.integers(0, 30), max_size=8))
def test_member_equals_isin(values: list, keys: list) -> None:
    from prefixscan.reuse.prefixes import member

    v, k = np.array(values, dtype=np.uint64), np.array(keys, dtype=np.uint64)
    assert np.array_equal(member(v, k), np.isin(v, k))


@settings(max_examples=60, deadline=None)
@given(rows, st.lists(st.integers(0, 40), max_size=5), st.sets(st.integers(0, 39), max_size=8))
def test_counterfactual_in_chunks_equals_one_chunk(reqs: list, cuts: list, rewrite: set) -> None:
    """The streamed counterfactual (block hashes read back chunk by chunk) credits exactly what the
    in-memory one (one chunk) does."""
    import polars as pl

    from prefixscan.detect.counterfactual import run_counterfactual

    n = len(reqs)
    lengths = np.array([r[1] for r in reqs], dtype=np.int64)
    off = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    flat = np.array([r[0] * 1000 + j for r in reqs for j in range(r[1])], dtype=np.uint64)
    req = pl.DataFrame({"request_id": [f"r{i}" for i in range(n)], "prompt_tokens": lengths * 16,
                        "cached_tokens": np.zeros(n, np.int64)})
    # rewritten requests get the hashes of request 0's prefix family (shared), in two parts
    rewritten = {f"r{i}": ([np.arange(1, 3, dtype=np.uint64), np.arange(3, 4, dtype=np.uint64)], 48)
                 for i in rewrite if i < n}
    keys = {rid: [("finding", int(rid[1:]) % 2)] for rid in rewritten}
    one = run_counterfactual(req, [(off, flat)], 16, "vllm", rewritten, keys)
    edges = sorted({0, n, *[c for c in cuts if c <= n]})
    chunks = [(off[a:b + 1] - off[a], flat[off[a]:off[b]]) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    many = run_counterfactual(req, iter(chunks), 16, "vllm", rewritten, keys)
    assert many.to_json() == one.to_json()
    assert many.credit == one.credit


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.integers(0, 6), max_size=6), max_size=25), st.lists(st.booleans(), max_size=25))
def test_seen_set_runs_equal_a_python_set(reqs: list, valid: list) -> None:
    """Leading runs of keys seen by earlier valid requests, key 0 and growth from a tiny table included."""
    from prefixscan.encode.dense import SeenSet

    valid = (valid + [True] * len(reqs))[:len(reqs)]
    off = np.concatenate([[0], np.cumsum([len(r) for r in reqs])]).astype(np.int64)
    flat = np.array([h for r in reqs for h in r], dtype=np.uint64)
    got = SeenSet(slots=16).runs(off, flat, np.zeros(len(reqs), np.uint64), np.array(valid, dtype=np.bool_))
    seen: set[int] = set()
    for i, r in enumerate(reqs):
        k = 0
        if valid[i]:
            while k < len(r) and r[k] in seen:
                k += 1
            seen.update(r)
        assert got[i] == k


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 300), max_size=80), st.integers(1, 12), st.integers(1, 400))
def test_group_ends_greedy(lengths: list, rows: int, blocks: int) -> None:
    """Row groups hold at most `rows` rows and `blocks` hashes, a longer row alone, cut front to back."""
    import prefixscan.run.rundir as rd

    old = rd.ROW_GROUP_SIZE, rd.GROUP_BLOCKS
    rd.ROW_GROUP_SIZE, rd.GROUP_BLOCKS = rows, blocks
    try:
        ends = rd.group_ends(np.array(lengths, dtype=np.int64))
    finally:
        rd.ROW_GROUP_SIZE, rd.GROUP_BLOCKS = old
    want, count, total = [], 0, 0
    for i, n in enumerate(lengths):
        if count and (count == rows or total + n > blocks):
            want.append(i)
            count, total = 0, 0
        count, total = count + 1, total + n
    if lengths:
        want.append(len(lengths))
    assert ends == want


def test_a_failure_after_streaming_leaves_no_temporary_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run is built beside its target and swapped in at the end; a failure removes it whole, so the
    target never appears and the corrected re-run needs no --force."""
    import prefixscan.detect.run as run_mod

    def boom(*_a: object, **_k: object) -> None:
        raise RuntimeError("findings failed")

    monkeypatch.setattr(run_mod, "run_findings", boom)
    out = tmp_path / "run"
    log = str(ROOT / "sample_logs" / "mooncake_small.jsonl")
    with pytest.raises(RuntimeError, match="findings failed"):
        run_analysis(AnalyzeConfig(inputs=(log,), output=str(out), streaming=True))
    assert not out.exists() and list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    assert run_analysis(AnalyzeConfig(inputs=(log,), output=str(out), streaming=True)).run_dir
