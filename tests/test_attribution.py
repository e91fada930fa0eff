"""Every miss attributed: breaker, routing, eviction, unexplained, checked against a brute-force replica model."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import prefixscan
from prefixscan.detect.attribution import MISSES_SCHEMA
from prefixscan.encode.hashing import hit_tokens
from prefixscan.errors import NothingAcceptedError
from tests.conftest import write_jsonl
from tests.test_findings_detect import DOC, SYS, question, rec, ts

B = 16


def hit(k: int, n: int) -> int:
    return hit_tokens(k, n, B, "vllm")


def lead(blocks: list[int], has) -> int:
    k = 0
    while k < len(blocks) and has(blocks[k]):
        k += 1
    return k


def oracle(hashes: list[list[int]], prompt: list[int], replicas: list[str], lru_blocks: int):
    """(global ideal, per-replica ideal, per-replica LRU of `lru_blocks` blocks) hit per request, by brute force."""
    seen: set[int] = set()
    per: dict[str, set[int]] = {}
    lru: dict[str, OrderedDict] = {}
    out = []
    for h, n, r in zip(hashes, prompt, replicas, strict=True):
        s, c = per.setdefault(r, set()), lru.setdefault(r, OrderedDict())
        out.append((hit(lead(h, seen.__contains__), n), hit(lead(h, s.__contains__), n),
                    hit(lead(h, c.__contains__), n)))
        seen.update(h)
        s.update(h)
        for b in h:  # in use while it runs
            c.pop(b, None)
        for b in reversed(h):  # vLLM frees a request's blocks tail first: the head is evicted last
            c[b] = True
        while len(c) > lru_blocks:
            c.popitem(last=False)
    return out


def gateway(i: int, system: str, user: str, replica: str | None, cached: int | None, tenant: str = "acme") -> dict:
    body = rec(i, system, user, tenant=tenant)
    out = {"request_id": body.pop("request_id"), "timestamp": body.pop("timestamp"), "tenant": body.pop("tenant"),
           "request": body, "response": {"usage": {}}}
    if cached is not None:
        out["response"]["usage"]["prompt_tokens_details"] = {"cached_tokens": cached}
    if replica is not None:
        out["upstream_addr"] = replica
    return out


def base_log(tmp_path, n: int = 48):
    """Two tenants, a timestamp breaker on half of one tenant's system prompts, a shared document."""
    parts = []
    for i in range(n):
        tenant = "acme" if i % 3 else "globex"
        system = (f"Request time: {ts(i)}\n" + SYS) if tenant == "acme" and i % 2 else SYS
        parts.append((i, system, DOC + question(i), tenant))
    return parts


def test_four_replica_gateway_log_attributes_the_gap_to_routing_and_eviction(tmp_path) -> None:
    parts = base_log(tmp_path)
    plain = write_jsonl(tmp_path / "plain.jsonl", [gateway(i, s, u, None, None, t) for i, s, u, t in parts])
    r0 = prefixscan.analyze(str(plain))
    req = r0.tables["requests"]
    hashes, prompt = req["block_hashes"].to_pylist(), req["prompt_tokens"].to_pylist()
    reps = [f"10.0.0.{1 + i % 4}:8000" for i in range(len(parts))]  # round robin over 4 replicas
    truth = oracle(hashes, prompt, reps, lru_blocks=60)
    logged = [gateway(i, s, u, reps[i], truth[i][2], t) for i, s, u, t in parts]
    r = prefixscan.analyze(str(write_jsonl(tmp_path / "gw.jsonl", logged)))
    assert "actual_below_predicted" not in {f.kind for f in r.findings.findings}
    assert r.tables["requests"]["replica"].to_pylist() == reps  # upstream_addr auto-detected
    m = r.tables["misses"]
    assert m.schema == MISSES_SCHEMA
    ideal = np.array(m["ideal_cached_tokens"].to_pylist())
    same = np.array(m["replica_cached_tokens"].to_pylist())
    actual = np.array(m["actual_cached_tokens"].to_pylist())
    assert ideal.tolist() == [t[0] for t in truth] and same.tolist() == [t[1] for t in truth]
    assert actual.tolist() == [t[2] for t in truth]
    routing, ev, un = (np.array(m[c].to_pylist()) for c in ("lost_routing_tokens", "lost_eviction_tokens",
                                                           "lost_unexplained_tokens"))
    assert (routing == ideal - same).all() and (ev + un == same - actual).all()
    assert routing.sum() > 0 and ev.sum() > 0 and un.sum() == 0  # an LRU engine: nothing unexplained
    assert m["engine_excess_tokens"].to_pylist() == [0] * len(parts)
    # the breaker part is the findings' credit, and it is the only part the findings count
    brk = np.array(m["lost_breaker_tokens"].to_pylist())
    fr = r.tables["finding_requests"]
    credit: dict[str, int] = {}
    for rid, g in zip(fr["request_id"].to_pylist(), fr["tokens_gained"].to_pylist(), strict=True):
        credit[rid] = credit.get(rid, 0) + g
    assert brk.tolist() == [max(credit.get(x, 0), 0) for x in m["request_id"].to_pylist()]
    assert brk.sum() > 0 and sum(f.tokens_lost for f in r.findings.findings) == sum(credit.values())
    s = r.summary["miss_attribution"]
    assert s["replica_field"] and s["replicas"] == 4
    w = s["with_actual"]
    assert w["counterfactual_cached_tokens"] - w["actual_cached_tokens"] == (
        w["lost_breaker_tokens"] + w["lost_routing_tokens"] + w["lost_eviction_tokens"]
        + w["lost_unexplained_tokens"] - w["engine_excess_tokens"])
    print(f"\n4-replica gateway log: breaker {w['lost_breaker_tokens']}, routing {w['lost_routing_tokens']}, "
          f"eviction {w['lost_eviction_tokens']}, unexplained {w['lost_unexplained_tokens']} tokens")


def test_shortfall_on_the_same_replica_right_after_is_unexplained(tmp_path) -> None:
    """The engine misses 64 tokens the previous request on the same replica had just computed: eviction
    cannot explain it (nothing came between), so it is unexplained (a template or tokenizer mismatch).
    A replica field with one value says nothing about routing: it counts as absent."""
    recs = [rec(i, SYS, DOC + question(i), replica=f"r{i % 2}") for i in range(20)]
    r0 = prefixscan.analyze(str(write_jsonl(tmp_path / "base.jsonl", recs)))
    pred = dict(zip(r0.tables["requests"]["request_id"].to_pylist(),
                    r0.tables["requests"]["cached_tokens"].to_pylist(), strict=True))
    for i, x in enumerate(recs):
        x["actual_cached_tokens"] = max(0, pred[x["request_id"]] - (64 if i % 2 else 0))
    r = prefixscan.analyze(str(write_jsonl(tmp_path / "actual.jsonl", recs)))
    m = r.tables["misses"]
    un = m["lost_unexplained_tokens"].to_pylist()
    # request 1 is r1's first: its engine value beats the empty replica (excess), the rest fall 64 short
    assert un == [min(64, pred[f"r{i:03d}"]) if i % 2 and i > 1 else 0 for i in range(20)]
    assert m["engine_excess_tokens"].to_pylist()[1] == pred["r001"] - 64
    assert m["lost_eviction_tokens"].to_pylist() == [0] * 20
    routing = m["lost_routing_tokens"].to_pylist()
    assert routing[2:] == [0] * 18 and routing[1] > 0  # both replicas warm after one request each
    assert not r.findings.findings  # the shortfall is not a cache breaker
    for x in recs:
        x["replica"] = "gateway-1"
    one = prefixscan.analyze(str(write_jsonl(tmp_path / "one.jsonl", recs)), findings=False)
    assert one.summary["miss_attribution"]["replica_field"] is False
    assert one.tables["misses"]["lost_routing_tokens"].null_count == 20


def test_without_replica_field_the_gap_is_unexplained(tmp_path) -> None:
    recs = [rec(i, SYS, DOC + question(i)) for i in range(20)]
    r0 = prefixscan.analyze(str(write_jsonl(tmp_path / "base.jsonl", recs)))
    pred = r0.tables["requests"]["cached_tokens"].to_pylist()
    for i, x in enumerate(recs):
        x["actual_cached_tokens"] = max(0, pred[i] - (64 if i % 2 else 0))
    r = prefixscan.analyze(str(write_jsonl(tmp_path / "actual.jsonl", recs)))
    m = r.tables["misses"]
    assert m["replica_cached_tokens"].null_count == 20 and m["lost_routing_tokens"].null_count == 20
    assert m["lost_eviction_tokens"].null_count == 20
    assert sum(m["lost_unexplained_tokens"].to_pylist()) == sum(min(64, p) if i % 2 else 0
                                                                 for i, p in enumerate(pred))
    s = r.summary["miss_attribution"]
    assert s["replica_field"] is False and s["lost_routing_tokens"] is None
    assert r.findings.findings == []


def test_engine_above_the_replica_ideal_marks_the_model_mismatched(tmp_path) -> None:
    """An engine that reports more than an ideal per-replica cache could hold sees other tokens: every
    shortfall of that model is then unexplained, not eviction."""
    recs = [rec(i, SYS, DOC + question(i), replica=f"r{i % 2}") for i in range(20)]
    r0 = prefixscan.analyze(str(write_jsonl(tmp_path / "base.jsonl", recs)))
    pred = r0.tables["requests"]["cached_tokens"].to_pylist()
    for i, x in enumerate(recs):
        x["actual_cached_tokens"] = pred[i] + 32 if i % 3 == 0 else max(0, pred[i] - 48)
    r = prefixscan.analyze(str(write_jsonl(tmp_path / "mm.jsonl", recs)))
    m = r.tables["misses"]
    assert sum(m["engine_excess_tokens"].to_pylist()) > 0
    assert sum(m["lost_eviction_tokens"].to_pylist()) == 0 and sum(m["lost_unexplained_tokens"].to_pylist()) > 0
    assert r.summary["miss_attribution"]["with_actual"]["requests_mismatched_model"] == 20


def test_log_prompt_counts_disagreeing_make_every_shortfall_unexplained(tmp_path) -> None:
    """The log's own prompt token counts are twice prefixscan's: the engine tokenises differently, so the
    gap cannot be eviction."""
    parts = base_log(tmp_path, 24)
    plain = write_jsonl(tmp_path / "plain.jsonl", [gateway(i, s, u, None, None, t) for i, s, u, t in parts])
    req = prefixscan.analyze(str(plain), findings=False).tables["requests"]
    prompt = req["prompt_tokens"].to_pylist()
    reps = [f"r{i % 2}" for i in range(len(parts))]
    logged = []
    for i, s, u, t in parts:
        g = gateway(i, s, u, reps[i], 0, t)
        g["response"]["usage"]["prompt_tokens"] = 2 * prompt[i]
        logged.append(g)
    r = prefixscan.analyze(str(write_jsonl(tmp_path / "mm.jsonl", logged)), findings=False)
    m = r.tables["misses"]
    assert r.summary["miss_attribution"]["tokenizer_mismatch"] is True
    assert sum(m["lost_eviction_tokens"].to_pylist()) == 0
    assert m["lost_unexplained_tokens"].to_pylist() == m["replica_cached_tokens"].to_pylist()


def test_misses_table_on_a_trace_and_empty_log(tmp_path) -> None:
    from tests.conftest import ROOT

    r = prefixscan.analyze(str(ROOT / "sample_logs" / "mooncake_small.jsonl"))
    m = r.tables["misses"]
    assert m.num_rows == 2000 and m["lost_breaker_tokens"].to_pylist() == [0] * 2000
    assert m["ideal_cached_tokens"].to_pylist() == r.tables["requests"]["cached_tokens"].to_pylist()
    empty = write_jsonl(tmp_path / "empty.jsonl", [])
    with pytest.raises(NothingAcceptedError) as nothing:  # the library refuses a run that measured nothing
        prefixscan.analyze(str(empty))
    assert nothing.value.result.tables["misses"].num_rows == 0  # the run it built is still there to inspect
    assert isinstance(m, pa.Table)


def test_findings_cli_shows_the_split_and_json_has_it(tmp_path) -> None:
    import json

    from typer.testing import CliRunner

    from prefixscan.cli.app import app

    recs = [rec(i, f"Request time: {ts(i)}\n" + SYS, DOC + question(i), replica=f"r{i % 2}",
                actual_cached_tokens=0) for i in range(20)]
    run = tmp_path / "run"
    prefixscan.analyze(str(write_jsonl(tmp_path / "a.jsonl", recs)), output=str(run))
    out = CliRunner().invoke(app, ["findings", str(run)])
    assert out.exit_code == 0 and "why requests miss (20 with an engine value, 2 replicas)" in out.stdout
    assert "routing" in out.stdout and "eviction" in out.stdout
    j = json.loads(CliRunner().invoke(app, ["findings", str(run), "--json"]).stdout)
    w = j["miss_attribution"]["with_actual"]
    assert w["actual_cached_tokens"] == 0 and w["counterfactual_cached_tokens"] == (
        w["lost_breaker_tokens"] + w["lost_routing_tokens"] + w["lost_eviction_tokens"] + w["lost_unexplained_tokens"])
    assert [f["kind"] for f in j["findings"]] == ["timestamp"]


def _chain(tokens: list[int]) -> list[int]:
    """Chained 'hashes' of a list of block contents (prefix-closed like the real ones)."""
    out, h = [], 7
    for t in tokens:
        h = hash((h, t)) & (2**63 - 1)
        out.append(h)
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 2), min_size=1, max_size=6), st.integers(0, 2),
                          st.integers(0, 3)), min_size=1, max_size=25))
def test_split_matches_brute_force(reqs) -> None:
    """Random block logs, replicas and engine values: I, R and P from sets, the split from the definitions."""
    hashes = [_chain(b) for b, _, _ in reqs]
    prompt = [len(h) * B + 5 for h in hashes]
    reps = [f"r{r}" for _, r, _ in reqs]
    seen: set[int] = set()
    per: dict[str, set[int]] = {}
    last: dict[str, list[int]] = {}
    rows = []
    for h, n, r, (_, _, cut) in zip(hashes, prompt, reps, reqs, strict=True):
        i_hit = hit(lead(h, seen.__contains__), n)
        r_hit = hit(lead(h, per.setdefault(r, set()).__contains__), n)
        prev = last.get(r, [])
        p_hit = hit(next((k for k in range(min(len(h), len(prev))) if h[k] != prev[k]), min(len(h), len(prev))), n)
        actual = max(r_hit - cut * B, 0)
        rows.append((i_hit, r_hit, p_hit, actual))
        seen.update(h)
        per[r].update(h)
        last[r] = h
    table = pa.table({"seq": list(range(len(reqs))), "request_id": [f"q{i}" for i in range(len(reqs))],
                      "model": ["m"] * len(reqs), "replica": reps, "prompt_tokens": prompt,
                      "cached_tokens": [x[0] for x in rows], "actual_cached_tokens": [x[3] for x in rows],
                      "block_hashes": pa.array(hashes, pa.list_(pa.uint64()))})
    m = _whole(table, B, "vllm", [])[0].to_pydict()
    if len(set(reps)) < 2:  # one replica value says nothing about routing: treated as no replica field
        assert m["replica_cached_tokens"] == [None] * len(rows) and m["lost_eviction_tokens"] == [None] * len(rows)
        assert m["lost_unexplained_tokens"] == [max(i - a, 0) for i, _, _, a in rows]
        return
    for k, (i_hit, r_hit, p_hit, actual) in enumerate(rows):
        assert m["ideal_cached_tokens"][k] == i_hit and m["replica_cached_tokens"][k] == r_hit
        assert m["lost_routing_tokens"][k] == i_hit - r_hit
        assert m["lost_unexplained_tokens"][k] == max(min(p_hit, r_hit) - actual, 0)
        assert m["lost_eviction_tokens"][k] + m["lost_unexplained_tokens"][k] == r_hit - actual


def test_report_shows_why_requests_miss(tmp_path) -> None:
    from prefixscan.report.write import write_report

    parts = base_log(tmp_path)
    plain = write_jsonl(tmp_path / "plain.jsonl", [gateway(i, s, u, None, None, t) for i, s, u, t in parts])
    req = prefixscan.analyze(str(plain)).tables["requests"]
    reps = [f"10.0.0.{1 + i % 4}:8000" for i in range(len(parts))]
    truth = oracle(req["block_hashes"].to_pylist(), req["prompt_tokens"].to_pylist(), reps, lru_blocks=60)
    log = write_jsonl(tmp_path / "gw.jsonl", [gateway(i, s, u, reps[i], truth[i][2], t) for i, s, u, t in parts])
    run = tmp_path / "run"
    w = prefixscan.analyze(str(log), output=str(run)).summary["miss_attribution"]["with_actual"]
    write_report(str(run))
    md = (run / "report.md").read_text()
    section = md.split("## Why requests miss", 1)[1].split("\n## ", 1)[0]
    assert f"served by 4 replicas: {w['counterfactual_cached_tokens']:,} prompt tokens" in section
    for label, key in (("prompt breakers", "lost_breaker_tokens"), ("routing", "lost_routing_tokens"),
                       ("eviction", "lost_eviction_tokens")):
        row = next(x for x in section.splitlines() if x.startswith(f"| {label}"))
        assert row.rstrip(" |").endswith(f"{w[key]:,}"), row


def _whole(requests: pa.Table, *args) -> tuple[pa.Table, dict]:
    """The misses table of a table in memory as one table, and its totals (the run streams the groups)."""
    from prefixscan.detect.attribution import attribute_groups

    groups, totals = attribute_groups(requests, *args)
    parts = list(groups)
    return (pa.concat_tables(parts) if parts else MISSES_SCHEMA.empty_table()), totals.summary()


def _requests(reqs) -> pa.Table:
    """A requests table (the attribution's columns and block hashes) from (blocks, replica, model, cut,
    credited) tuples; replica and model may be None, engine values only where cut >= 0."""
    hashes = [_chain(b) for b, *_ in reqs]
    prompt = [len(h) * B + 5 for h in hashes]
    return pa.table({
        "seq": list(range(len(reqs))), "request_id": [f"q{i}" for i in range(len(reqs))],
        "model": [None if m is None else f"m{m}" for _, _, m, _, _ in reqs],
        "replica": [None if r is None else f"r{r}" for _, r, _, _, _ in reqs], "prompt_tokens": prompt,
        "cached_tokens": [0] * len(reqs),
        "actual_cached_tokens": [None if r[3] < 0 else max(n - B * (1 + r[3]), 0)
                                 for n, r in zip(prompt, reqs, strict=True)],
        "block_hashes": pa.array(hashes, pa.list_(pa.uint64()))})


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 2), min_size=1, max_size=5), st.one_of(st.none(), st.integers(0, 2)),
                          st.one_of(st.none(), st.integers(0, 1)), st.integers(-1, 3), st.integers(0, 4)),
                max_size=30),
       st.integers(1, 7), st.booleans(), st.booleans())
def test_row_groups_give_the_table_of_one_group(tmp_path_factory, reqs, group, granular, mismatch) -> None:
    """The run attributes the requests file one row group at a time and writes each group as it comes:
    the same rows, totals and file bytes as the whole table at once, with replicas, engine values,
    models (some mismatched), credited findings and every pass switched on or off."""
    import types

    import pyarrow.parquet as pq

    from prefixscan.pipeline import detect
    from prefixscan.run import rundir

    table = _requests(reqs)
    tmp = tmp_path_factory.mktemp("groups")
    path = tmp / "requests.parquet"
    pq.write_table(table, path, row_group_size=group)
    findings = [types.SimpleNamespace(rank=k, request_ids=[f"q{i}" for i, r in enumerate(reqs) if r[4] % 3 == k]
                                      + ["absent"], request_gains=[r[4] * B for r in reqs if r[4] % 3 == k] + [B])
                for k in (1, 2)]
    whole, whole_summary = _whole(table, B, "vllm", findings, granular, mismatch)
    ing = types.SimpleNamespace(block_size=B, hit_rule="vllm", prompt_check=types.SimpleNamespace(
        compared=len(reqs) if mismatch else 0, differ=len(reqs)))
    cfg = types.SimpleNamespace(granularity="block" if granular else "token")
    on_disk, summary = detect.misses(ing, cfg, path, types.SimpleNamespace(findings=findings), tmp / "m.tmp")
    assert summary == whole_summary and on_disk.num_rows == len(reqs)
    rundir.write_parquet(whole, tmp / "whole.parquet")
    assert (tmp / "m.tmp").read_bytes() == (tmp / "whole.parquet").read_bytes()


def test_streamed_misses_file_is_cut_like_one_written_at_once(tmp_path, monkeypatch) -> None:
    """More rows than a row group (made small here): the streamed file has the whole table's groups and bytes."""
    import types

    from prefixscan.pipeline import detect
    from prefixscan.run import rundir

    monkeypatch.setattr(rundir, "ROW_GROUP_SIZE", 4)
    import pyarrow.parquet as pq

    reqs = [([i % 3, i % 2], i % 3, 0, i % 4 - 1, i) for i in range(23)]

    pq.write_table(_requests(reqs), tmp_path / "requests.parquet", row_group_size=5)
    ing = types.SimpleNamespace(block_size=B, hit_rule="vllm", prompt_check=types.SimpleNamespace(compared=0, differ=0))
    cfg = types.SimpleNamespace(granularity="block")
    on_disk, _ = detect.misses(ing, cfg, tmp_path / "requests.parquet", None, tmp_path / "m.tmp")
    rundir.write_parquet(_whole(_requests(reqs), B, "vllm", [])[0], tmp_path / "whole.parquet")
    assert pq.ParquetFile(on_disk.path).num_row_groups == 6
    assert on_disk.path.read_bytes() == (tmp_path / "whole.parquet").read_bytes()


def test_result_tables_on_disk_are_read_when_iterated(tmp_path) -> None:
    """The requests and misses tables stay on disk until asked for, by name or by iterating the result."""
    import pyarrow.parquet as pq

    from tests.conftest import ROOT

    run = tmp_path / "run"
    r = prefixscan.analyze(str(ROOT / "sample_logs" / "mooncake_small.jsonl"), output=str(run))
    items = dict(r.tables.items())
    assert all(isinstance(t, pa.Table) for t in items.values()) and len(r.tables.values()) == len(items)
    assert items["misses"].equals(pq.read_table(run / "misses.parquet")) and items["misses"].num_rows == 2000
    assert r.tables.get("absent") is None and r.tables.get("requests").num_rows == 2000
