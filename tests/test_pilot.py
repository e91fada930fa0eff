"""The pilot (issue 31): latency columns read from real log shapes, and TTFT / queue wait by warm, partial
and cold request equal to the values computed here, directly from the log that was built."""

from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import prefixscan
from prefixscan.cli.app import app
from tests.conftest import SYSTEM, chat, write_jsonl
from tests.test_tables_doc import documented

runner = CliRunner()
# Known per-class TTFTs and queue waits (seconds, dyadic so every sum is exact). 21 warm values put p50 and
# p95 on whole ranks; 4 partial values make both interpolate; cold has 5.
WARM = [0.0625 * (k + 1) for k in range(21)][::-1]
PARTIAL = [0.5, 2.0, 0.75, 1.25]
COLD = [3.0, 1.5, 4.0, 2.5, 8.0]
QUEUE = {"warm": [0.0] * 20 + [0.5], "partial": [0.25, 0.125, 0.0, 1.0], "cold": [2.0, 0.0, 0.5, 0.25, 1.0]}
ENGINE = {"warm": 10**6, "partial": 32, "cold": 0}  # the engine's cached tokens per class (block 16)


def linear(values: list[float], p: float) -> float:
    """The p-th percentile by linear interpolation between the closest ranks, written out here (numpy's
    documented rule, including its way of forming the interpolation: from the nearer end)."""
    s = sorted(values)
    r = (len(s) - 1) * (p / 100)
    lo = math.floor(r)
    hi = min(lo + 1, len(s) - 1)
    t = r - lo
    return s[lo] + (s[hi] - s[lo]) * t if t < 0.5 else s[hi] - (s[hi] - s[lo]) * (1 - t)


def pilot_log(tmp_path, **extra_of: dict) -> tuple:
    """A gateway-style log: each request's TTFT (ms), queue wait (ms) and engine cached tokens known."""
    recs, i = [], 0
    for cls, ttfts in (("warm", WARM), ("partial", PARTIAL), ("cold", COLD)):
        for k, t in enumerate(ttfts):
            rec = chat(i, f"{cls}{k}", 1, ttft_ms=t * 1000, queue_wait_ms=QUEUE[cls][k] * 1000,
                       actual_cached_tokens=ENGINE[cls], replica=f"pod-{i % 2}", **extra_of.get(cls, {}))
            rec["messages"][0]["content"] = SYSTEM * 4  # long enough that 32 cached tokens leave > 256 to compute
            recs.append(rec)
            i += 1
    return write_jsonl(tmp_path / "pilot.jsonl", recs), recs


def test_ttft_and_queue_wait_by_class_equal_the_values_computed_from_the_log(tmp_path) -> None:
    log, _ = pilot_log(tmp_path)
    r = runner.invoke(app, ["analyze", str(log), "--json", "-q", "-o", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    p = json.loads(r.stdout)["pilot"]
    assert p["cached_source"] == "engine" and p["classes"]["block_tokens"] == 16
    expect = {"warm": (WARM, QUEUE["warm"]), "partial": (PARTIAL, QUEUE["partial"]), "cold": (COLD, QUEUE["cold"])}
    assert set(p["by_class"]) == set(expect)
    for cls, (ttft, queue) in expect.items():
        got = p["by_class"][cls]
        assert got["requests"] == got["ttft_requests"] == got["queue_wait_requests"] == len(ttft)
        for q in (50, 95):
            assert got[f"ttft_p{q}_s"] == linear(ttft, q), (cls, q)
            assert got[f"queue_wait_p{q}_s"] == linear(queue, q), (cls, q)
        assert got["e2e_requests"] == 0 and got["e2e_p50_s"] is None
    # the whole-rank cases are the values themselves: warm p50 is the 11th smallest, p95 the 20th
    assert p["by_class"]["warm"]["ttft_p50_s"] == 0.6875 and p["by_class"]["warm"]["ttft_p95_s"] == 1.25
    assert p["all"]["ttft_p95_s"] == linear(WARM + PARTIAL + COLD, 95)
    # the same numbers in the run's pilot table, and its columns are the documented ones
    t = pl.from_arrow(pq.read_table(tmp_path / "run" / "pilot.parquet"))
    row = t.filter((pl.col("level") == "class") & (pl.col("class") == "partial")).row(0, named=True)
    assert row["ttft_p50_s"] == linear(PARTIAL, 50) == 1.0 and row["cached_tokens"] == 4 * 32
    assert set(t.columns) == documented()["pilot"]


def test_classes_follow_the_engine_count_and_the_documented_rule(tmp_path) -> None:
    log, recs = pilot_log(tmp_path)
    res = prefixscan.analyze(str(log), findings=False)
    req = pl.from_arrow(res.tables["requests"])
    # every partial request has at least one block cached by the engine, under 90% of its prompt, and more
    # than 256 tokens left to compute: partial by the documented rule
    assert (req["prompt_tokens"] * 0.9 > 32).all() and (req["prompt_tokens"] - 32 > 256).all()
    by_model = res.summary["pilot"]["by_model_replica"]
    assert [(g["model"], g["replica"]) for g in by_model] == [("m", "pod-0"), ("m", "pod-1")]
    assert sum(g["requests"] for g in by_model) == len(recs)
    # cached + uncached = prompt tokens of the requests whose count is known (here: all)
    for g in by_model:
        assert g["cached_tokens"] + g["uncached_tokens"] == g["prompt_tokens"]
    # the engine's 10**6 on warm requests counts up to each request's prompt (more is a tokenizer mismatch)
    engine = req["actual_cached_tokens"].to_numpy()
    assert sum(g["cached_tokens"] for g in by_model) == int(np.minimum(engine, req["prompt_tokens"].to_numpy()).sum())
    assert all(g["uncached_tokens"] >= 0 for g in by_model)


def test_a_missing_engine_count_is_unknown_not_a_prediction(tmp_path) -> None:
    log, recs = pilot_log(tmp_path)
    del recs[0]["actual_cached_tokens"]  # one warm request without the engine's count
    write_jsonl(log, recs)
    p = prefixscan.analyze(str(log), findings=False).summary["pilot"]
    assert p["cached_source"] == "engine"
    assert p["by_class"]["unknown"]["requests"] == 1 and p["by_class"]["warm"]["requests"] == 20
    assert p["by_class"]["unknown"]["cached_requests"] == 0
    assert p["by_class"]["warm"]["ttft_p50_s"] == linear(WARM[1:], 50)


def test_without_an_engine_count_the_ideal_cache_classes_and_says_so(tmp_path) -> None:
    recs = [chat(i, "c0", i + 1, ttft_s=0.125 * (i + 1)) for i in range(4)]  # one conversation growing
    res = prefixscan.analyze(str(write_jsonl(tmp_path / "a.jsonl", recs)), findings=False)
    p = res.summary["pilot"]
    assert p["cached_source"] == "ideal"
    req = pl.from_arrow(res.tables["requests"])
    cold = req.filter(pl.col("cached_tokens") < 16).height
    assert p["by_class"]["cold"]["requests"] == cold == 1  # the first turn; the others reuse its prefix
    assert p["by_class"]["cold"]["ttft_p50_s"] == 0.125


def test_no_latency_no_pilot(chat_log, tmp_path) -> None:
    res = prefixscan.analyze(str(chat_log), output=str(tmp_path / "run"), findings=False)
    assert "pilot" not in res.summary and not (tmp_path / "run" / "pilot.parquet").exists()
    assert "ttft_s" not in res.summary["input"]["fields"] and "ttft" not in res.summary["input"]["fields"]["line"]
    assert pl.from_arrow(res.tables["requests"])["ttft_s"].null_count() == 15


def test_litellm_clocks_give_ttft_and_end_to_end(tmp_path) -> None:
    """LiteLLM's StandardLoggingPayload: startTime, completionStartTime, endTime (epoch seconds floats)."""
    recs = [chat(i, f"c{i}", 1, startTime=1_700_000_000.0 + i, completionStartTime=1_700_000_000.25 + i,
                 endTime=1_700_000_001.5 + i) for i in range(3)]
    for r in recs:
        del r["timestamp"]  # startTime is the record's time
    recs[2]["time_to_first_token"] = 0.5  # a key without a unit: read as seconds, and the summary says so
    res = prefixscan.analyze(str(write_jsonl(tmp_path / "l.jsonl", recs)), findings=False)
    req = pl.from_arrow(res.tables["requests"])
    assert req["ttft_s"].to_list() == [0.25, 0.25, 0.5] and req["e2e_s"].to_list() == [1.5] * 3
    assert req["queue_wait_s"].null_count() == 3
    fields = res.summary["input"]["fields"]
    assert fields["ttft_s"]["from"] == ["completionStartTime - startTime", "time_to_first_token (s)"]
    assert fields["e2e_s"]["from"] == ["endTime - startTime"] and "queue_wait_s" not in fields
    assert "ttft_s <- completionStartTime - startTime | time_to_first_token (s)" in fields["line"]


def test_vllm_per_request_metrics_in_a_gateway_response(tmp_path) -> None:
    """vLLM --enable-per-request-metrics: response `metrics.time_to_first_token_ms` / `queue_time_ms`."""
    recs = [{"request_id": f"g{i}", "timestamp": 1_700_000_000 + i,
             "request": {"model": "m", "messages": [{"role": "user", "content": f"q {i}"}]},
             "response": {"usage": {"prompt_tokens": 5}, "metrics": {"time_to_first_token_ms": 250 * (i + 1),
                                                                     "queue_time_ms": 125}}}
            for i in range(2)]
    req = pl.from_arrow(prefixscan.analyze(str(write_jsonl(tmp_path / "g.jsonl", recs)),
                                           findings=False).tables["requests"])
    assert req["ttft_s"].to_list() == [0.25, 0.5] and req["queue_wait_s"].to_list() == [0.125, 0.125]


def test_otel_genai_span_time_to_first_chunk_and_span_duration(tmp_path) -> None:
    from tests.test_ecosystem_shapes import attr, genai

    spans = [{"traceId": "t", "spanId": f"s{i}", "name": "chat m",
              "startTimeUnixNano": str(1_795_000_000_000_000_000 + i * 10**9),
              "endTimeUnixNano": str(1_795_000_000_000_000_000 + i * 10**9 + 750_000_000),
              "attributes": [attr(k, v) for k, v in {**genai(i, f"c{i}", 1),
                                                     "gen_ai.response.time_to_first_chunk": 0.375}.items()]}
             for i in range(3)]
    line = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {"name": "x"}, "spans": spans}]}]}
    res = prefixscan.analyze(str(write_jsonl(tmp_path / "o.jsonl", [line])), findings=False)
    req = pl.from_arrow(res.tables["requests"])
    assert req["ttft_s"].to_list() == [0.375] * 3 and req["e2e_s"].to_list() == [0.75] * 3
    fields = res.summary["input"]["fields"]
    assert fields["ttft_s"]["from"] == ["gen_ai.response.time_to_first_chunk (s)"]
    assert fields["e2e_s"]["from"] == ["endTimeUnixNano - startTimeUnixNano"]


def test_field_maps_a_latency_with_its_unit(tmp_path) -> None:
    recs = [chat(i, f"c{i}", 1, perf={"first": 40 * (i + 1), "wait": 2}) for i in range(2)]
    log = write_jsonl(tmp_path / "f.jsonl", recs)
    res = prefixscan.analyze(str(log), findings=False,
                             fields=[("ttft_ms", "perf.first"), ("queue_wait_s", "perf.wait")])
    req = pl.from_arrow(res.tables["requests"])
    assert req["ttft_s"].to_list() == [0.04, 0.08] and req["queue_wait_s"].to_list() == [2.0, 2.0]
    assert res.summary["input"]["fields"]["ttft_ms"]["records"] == 2  # counted, so a typo is caught
    r = runner.invoke(app, ["analyze", str(log), "-q", "--field", "ttft_ms=perf.first", "--field", "ttft_s=x"])
    assert r.exit_code == 2 and "ttft_ms and ttft_s map the same latency column" in r.stderr
    notes = prefixscan.analyze(str(log), findings=False, fields=[("ttft_ms", "perf.nope")]).summary["notes"]
    assert any("--field ttft_ms=perf.nope matched 0 of 2" in n for n in notes)


@pytest.mark.parametrize(("extra", "reason"), [
    ({"ttft_ms": "fast"}, "wrong_type"),
    ({"queue_wait_ms": -3}, "out_of_range"),
    ({"ttft_s": True}, "wrong_type"),
    ({"startTime": 1_700_000_010.0, "endTime": 1_700_000_009.0}, "out_of_range"),
    ({"startTime": 1_700_000_010.0, "completionStartTime": "soon"}, "bad_timestamp"),
])
def test_a_latency_of_the_wrong_kind_is_a_reject_with_its_reason(tmp_path, extra, reason) -> None:
    good = chat(0, "c0", 1, ttft_s=0.5)
    bad = chat(1, "c1", 1, **extra)
    if "startTime" in extra:
        del bad["timestamp"]
    res = prefixscan.analyze(str(write_jsonl(tmp_path / "b.jsonl", [good, bad])), findings=False)
    assert res.summary["requests"]["rejects_by_reason"] == {reason: 1}
    rej = res.tables["rejects"].to_pylist()[0]
    assert rej["source_line"] == 2 and "soon" not in (rej["detail"] or "") and "fast" not in (rej["detail"] or "")


def test_class_boundaries_in_absolute_tokens_and_share() -> None:
    from prefixscan.pilot.latency import classify

    prompt = np.array([5000, 5000, 1000, 300, 300, 100, 10], dtype=np.int64)
    cached = np.array([4500, 4499, 15, 44, 43, 16, 0], dtype=np.int64)
    # 90% of 5000 is warm, one token less (501 left) partial; under one block (16) is cold whatever the share;
    # 256 tokens left to compute is warm, 257 partial; a short prompt with one block cached is warm
    assert classify(cached, prompt, 16).tolist() == ["warm", "partial", "cold", "warm", "partial", "warm", "cold"]


def test_report_shows_the_pilot_with_values_escaped(tmp_path) -> None:
    log, recs = pilot_log(tmp_path)
    recs[0]["replica"] = "pod-\x1b]52;c;evil\x07 [x](http://e.example) <img src=x>"
    write_jsonl(log, recs)
    run = tmp_path / "run"
    assert runner.invoke(app, ["analyze", str(log), "-q", "-o", str(run)]).exit_code == 0
    r = runner.invoke(app, ["report", str(run), "-o", str(tmp_path / "rep"), "--format", "both"])
    assert r.exit_code == 0, r.output
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## Pilot: latency by warm, partial and cold requests" in md
    part = md.split("## Pilot")[1]
    assert f"{linear(PARTIAL, 50) * 1000:,.0f} ms / {linear(PARTIAL, 95) * 1000:,.0f} ms" in part
    assert "\x1b" not in md and "\\x1b" in part and "<img" not in md and "\\[x\\](http" in part
    assert "| all requests | 30 |" in part and "-9" not in part  # no negative uncached tokens
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "Pilot: latency by warm" in html and "<img src=x>" not in html and "\x1b" not in html


def test_no_customer_text_in_the_pilot_outputs(tmp_path) -> None:
    log, recs = pilot_log(tmp_path)
    for rec in recs:
        rec["messages"][-1]["content"] += " Customer Zelda Quimby-Arkwright asks."
    write_jsonl(log, recs)
    run = tmp_path / "run"
    r = runner.invoke(app, ["analyze", str(log), "--json", "-q", "-o", str(run)])
    assert r.exit_code == 0 and "pilot" in json.loads(r.stdout)
    assert "Zelda" not in r.stdout and b"Zelda" not in (run / "pilot.parquet").read_bytes()
    term = runner.invoke(app, ["analyze", str(log)])
    assert "Pilot: latency" in term.stdout and "Zelda" not in term.stdout


def test_has_latency_reads_the_footer_and_every_row_group(tmp_path) -> None:
    import pyarrow as pa

    from prefixscan.pilot.latency import has_latency

    nulls = pa.array([None] * 4, pa.float64())
    late = pa.array([None, None, None, 0.5], pa.float64())
    t = pa.table({"ttft_s": late, "e2e_s": nulls, "queue_wait_s": nulls})
    for stats in (True, False):  # with and without the footer's null counts
        pq.write_table(t, tmp_path / "r.parquet", row_group_size=2, write_statistics=stats)
        assert has_latency(tmp_path / "r.parquet")  # the value is in the second row group only
        pq.write_table(t.set_column(0, "ttft_s", nulls), tmp_path / "n.parquet", row_group_size=2,
                       write_statistics=stats)
        assert not has_latency(tmp_path / "n.parquet")
    pq.write_table(pa.table({"x": [1]}), tmp_path / "old.parquet")  # a run written before the columns existed
    assert not has_latency(tmp_path / "old.parquet")
