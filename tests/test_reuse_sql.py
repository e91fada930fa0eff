"""The reuse SQL (prefixscan.reuse.sql) equals the compiled pipeline and the brute-force reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixscan.config import AnalyzeConfig
from prefixscan.pipeline.run import run_analysis
from prefixscan.reuse.sql import connect, reuse_of_requests, reuse_sql, run_reuse, views_of_requests
from tests.conftest import MOONCAKE, ROOT, chat, write_jsonl
from tests.oracles.ideal_ref import ideal_reuse_ref

COLUMNS = ("cached_blocks", "cached_tokens", "divergence_token", "tenant_cached_tokens", "conversation_cached_tokens")


def _chain(symbols: list[int]) -> list[int]:
    """Chained block hashes of a symbol sequence (equal hash at block j <=> equal first j+1 symbols)."""
    out, h = [], 0
    for s in symbols:
        h = xxhash.xxh3_64_intdigest(f"{h}:{s}".encode())
        out.append(h)
    return out


def _requests_table(blocks: list[list[int]], prompt: list[int], tenants: list, convs: list) -> pa.Table:
    return pa.table({"seq": pa.array(range(len(blocks)), pa.int64()),
                     "prompt_tokens": pa.array(prompt, pa.int64()),
                     "tenant": pa.array(tenants, pa.string()), "conversation_id": pa.array(convs, pa.string()),
                     "block_hashes": pa.array(blocks, pa.list_(pa.uint64()))})


req_strategy = st.lists(st.tuples(st.lists(st.integers(0, 2), min_size=0, max_size=6),
                                  st.sampled_from([None, "a", "b"]), st.sampled_from([None, "x", "y", "z"]),
                                  st.integers(0, 3)), min_size=0, max_size=14)


@settings(max_examples=60, deadline=None)
@given(req_strategy, st.sampled_from(["vllm", "trace"]), st.sampled_from([1, 4]))
def test_sql_equals_the_reference_on_random_traces(reqs: list, rule: str, B: int) -> None:
    blocks = [_chain(s) for s, *_ in reqs]
    if rule == "vllm":  # a vLLM request has ceil(n / B) blocks; the last may be partial
        prompt = [max(len(b) * B - extra % B, 0) if b else 0 for b, (_, _, _, extra) in zip(blocks, reqs, strict=True)]
    else:
        prompt = [len(b) * B - (extra if b else 0) for b, (_, _, _, extra) in zip(blocks, reqs, strict=True)]
    prompt = [max(p, 0) for p in prompt]
    tenants = [t for _, t, _, _ in reqs]
    convs = [c for _, _, c, _ in reqs]
    got = reuse_of_requests(_requests_table(blocks, prompt, tenants, convs), B, rule).to_pydict()
    ref = ideal_reuse_ref(blocks, prompt, B, rule, tenants, convs)
    assert got["cached_blocks"] == ref["k"]
    assert got["cached_tokens"] == ref["tokens"]
    assert got["tenant_cached_tokens"] == ref["tenant_tokens"]
    assert got["conversation_cached_tokens"] == ref["conv_tokens"]
    assert got["source_pos"] == ref["source"]
    assert got["divergence_token"] == [min(k * B, n) for k, n in zip(ref["k"], prompt, strict=True)]


def _assert_matches_run(run_dir: str, memory_limit: str = "1GB", threads: int | None = None) -> int:
    """Recompute a run's reuse columns from its requests table alone; they must equal the pipeline's."""
    import json

    manifest = json.loads((Path(run_dir) / "manifest.json").read_text())
    B, rule = manifest["config"]["block_size"], manifest["config"]["hit_rule"]
    req = pq.read_table(Path(run_dir) / "requests.parquet")
    got = reuse_of_requests(str(Path(run_dir) / "requests.parquet"), B, rule, memory_limit=memory_limit,
                            threads=threads)
    assert got.column("pos").to_pylist() == req.column("seq").to_pylist()
    for c in COLUMNS:
        assert got.column(c).to_pylist() == req.column(c).to_pylist(), c
    ids = req.column("request_id").to_pylist()
    src = [ids[s] if s >= 0 else None for s in got.column("source_pos").to_pylist()]
    assert src == req.column("source_request_id").to_pylist()
    return req.num_rows


def _chat_log(path: Path) -> Path:
    recs, i = [], 0
    for turn in range(1, 5):
        for conv, tenant in (("c1", "acme"), ("c2", "acme"), ("c3", "globex"), ("c4", None)):
            recs.append(chat(i, conv, turn, tenant=tenant, ts=float(i // 3)))  # equal times: input order decides
            i += 1
    recs.append(chat(i, "c1", 1, tenant="acme"))
    return write_jsonl(path, recs)


@pytest.mark.parametrize("inputs", [["chat.jsonl"], ["chat.parquet"], ["mooncake_small.jsonl"],
                                    ["chat.jsonl", "chat.parquet"]])
def test_sql_equals_the_pipeline_on_sample_logs(tmp_path: Path, inputs: list[str]) -> None:
    res = run_analysis(AnalyzeConfig(inputs=tuple(str(ROOT / "sample_logs" / n) for n in inputs),
                                     output=str(tmp_path / "run"), findings=False))
    assert _assert_matches_run(res.run_dir) > 0


@pytest.mark.parametrize("opts", [{}, {"isolate_tenants": True}, {"infer_conversations": False}])
def test_sql_equals_the_pipeline_on_a_chat_log_with_ties(tmp_path: Path, opts: dict) -> None:
    res = run_analysis(AnalyzeConfig(inputs=(str(_chat_log(tmp_path / "c.jsonl")),), output=str(tmp_path / "r"),
                                     findings=False, **opts))
    assert _assert_matches_run(res.run_dir) == 17


def test_sql_equals_the_pipeline_on_synth_chat(tmp_path: Path) -> None:
    from prefixscan.synth import write
    from prefixscan.synth.config import SynthConfig

    log = tmp_path / "synth.jsonl"
    write(SynthConfig(requests=600, seed=7), str(log), truth_path=None)
    res = run_analysis(AnalyzeConfig(inputs=(str(log),), output=str(tmp_path / "r"), findings=False))
    assert _assert_matches_run(res.run_dir) == 600


@pytest.mark.skipif(not MOONCAKE.exists(), reason="shared/data/mooncake not present")
@pytest.mark.parametrize("name", ["conversation_trace.jsonl", "synthetic_trace.jsonl"])
def test_sql_equals_the_pipeline_on_mooncake_traces_out_of_core(tmp_path: Path, name: str) -> None:
    """A 64 MB memory limit and one thread: DuckDB spills the group-bys and joins to its temp directory."""
    res = run_analysis(AnalyzeConfig(inputs=(str(MOONCAKE / name),), output=str(tmp_path / "r"), findings=False))
    assert _assert_matches_run(res.run_dir, memory_limit="64MB", threads=1) > 3000


def test_sql_on_an_empty_table_and_bad_options() -> None:
    assert reuse_of_requests(_requests_table([], [], [], []), 16, "vllm").num_rows == 0
    with pytest.raises(ValueError):
        reuse_sql(16, "nope")
    with pytest.raises(ValueError):
        with connect(memory_limit="1GB'; DROP"):
            pass


def test_views_over_an_arrow_table_match_a_parquet_file(tmp_path: Path) -> None:
    t = _requests_table([_chain([1, 2]), _chain([1, 2, 3]), _chain([2])], [32, 40, 10], ["a", "b", None],
                        [None, None, "x"])
    pq.write_table(t, tmp_path / "r.parquet")
    with connect() as con:
        views_of_requests(con, t)
        a = run_reuse(con, 16, "vllm")
    b = reuse_of_requests(str(tmp_path / "r.parquet"), 16, "vllm")
    assert a.equals(b)
    assert a.column("cached_blocks").to_pylist() == [0, 2, 0]
    assert np.array_equal(a.column("cached_tokens").to_numpy(), [0, 32, 0])


@settings(max_examples=60, deadline=None)
@given(req_strategy, st.sampled_from(["vllm", "trace"]), st.sampled_from([1, 4]), st.floats(0, 1))
def test_sql_stage_equals_the_scan_array_for_array(reqs: list, rule: str, B: int, cut: float) -> None:
    """SqlIdealStream.add returns what IdealStream.add returns, fed the same two chunks: every result array
    and the dense ids."""
    from prefixscan.reuse.ideal import IdealStream, scope_salts
    from tests.oracles.sql_ideal_ref import SqlIdealStream

    blocks = [_chain(s) for s, *_ in reqs]
    offsets = np.zeros(len(blocks) + 1, np.int64)
    np.cumsum([len(b) for b in blocks], out=offsets[1:])
    flat = np.array([h for b in blocks for h in b], dtype=np.uint64)
    prompt = np.array([len(b) * B - (e % B if b else 0) for b, (_, _, _, e) in zip(blocks, reqs, strict=True)])
    ten, conv = scope_salts([t for _, t, _, _ in reqs]), scope_salts([c for _, _, c, _ in reqs])
    scan, sql = IdealStream(), SqlIdealStream()
    m = int(cut * len(blocks))
    for a, b in ((0, m), (m, len(blocks))):
        args = (offsets[a:b + 1] - offsets[a], flat[offsets[a]:offsets[b]], prompt[a:b], B, rule, ten[a:b],
                conv[a:b])
        (want, gid_want), (got, gid) = scan.add(*args), sql.add(*args)
        for name in ("cached_blocks", "cached_tokens", "divergence_token", "tenant_cached_tokens",
                     "conversation_cached_tokens", "source"):
            assert np.array_equal(getattr(got, name), getattr(want, name)), name
        assert np.array_equal(gid, gid_want)
    assert sql.n_distinct == scan.n_distinct


def test_a_whole_analysis_with_the_sql_as_its_reuse_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pipeline's reuse scan replaced by the SQL (one chunk): every table the same bytes."""
    import filecmp

    import prefixscan.pipeline.reuse as reuse_mod
    from tests.oracles.sql_ideal_ref import SqlIdealStream

    inputs = (str(_chat_log(tmp_path / "c.jsonl")), str(ROOT / "sample_logs" / "chat.parquet"))
    scan = run_analysis(AnalyzeConfig(inputs=inputs, output=str(tmp_path / "scan"), streaming=False))
    monkeypatch.setattr(reuse_mod, "IdealStream", SqlIdealStream)
    sql = run_analysis(AnalyzeConfig(inputs=inputs, output=str(tmp_path / "sql"), streaming=False))
    for p in sorted(Path(scan.run_dir).glob("*.parquet")):
        assert filecmp.cmp(p, Path(sql.run_dir) / p.name, shallow=False), p.name
