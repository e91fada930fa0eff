"""The router's decision log (issue 31, `analyze --decisions`): queue wait by decision, the share of requests
that left a warm candidate and predicted vs actual cached tokens, equal to the values computed here from the
logs the test builds; bad decision rows as rejects; a decision log that matches nothing says so."""

from __future__ import annotations

import json

import polars as pl
import pyarrow.parquet as pq
from typer.testing import CliRunner

import prefixscan
from prefixscan.cli.app import app
from tests.conftest import chat, write_jsonl
from tests.test_pilot import linear
from tests.test_tables_doc import documented

runner = CliRunner()
ENGINE = 512  # the request log's engine cached tokens on every request
TTFT_MS = [125 * ((7 * i) % 24 + 1) for i in range(24)]  # distinct, dyadic in seconds


def _decisions() -> list[dict]:
    """22 rows for r0..r21 (r22 and r23 have none) and 2 for ids the request log does not have."""
    rows = []
    # prefer-warm-worker: 13 rows, the selected worker a candidate; actual 512 on 9, 500 on one (12 tokens off:
    # within a block), 0 on three (diverged, predicted above actual)
    actual = [ENGINE] * 9 + [500] + [0] * 3
    for k in range(13):
        rows.append({"request_id": f"r{k}", "prefix_key": "p", "selected_worker": "w1", "candidate_workers": ["w1"],
                     "predicted_cached_tokens": ENGINE, "actual_cached_tokens": actual[k],
                     "queue_wait_ms": 125 * ((5 * k) % 13), "prefill_tokens": 10, "decision": "prefer-warm-worker"})
    # cold_fallback: 5 rows, predicted = actual = 0; four left their warm candidate w1; one lists no candidate
    # (nothing warm to leave); one has no queue wait of its own (the request log's 750 ms is used)
    for k in range(5):
        rows.append({"request_id": f"r{13 + k}", "selected_worker": "w2",
                     "candidate_workers": [] if k == 4 else ["w1"], "predicted_cached_tokens": 0,
                     "actual_cached_tokens": 0, "decision": "cold_fallback",
                     **({} if k == 2 else {"queue_wait_ms": 250 * (k + 3)})})
    # round-robin: per-candidate predictions. Two passed w1 (512 predicted) for w2 (0): left warm by candidates;
    # one chose w1; one's best candidate had 8 tokens (under a block): nothing warm. No actual of their own:
    # the request log's engine count (512) is used, so predicted 0 vs actual 512 diverges (actual above)
    cands = [([("w1", 512), ("w2", 0)], "w2"), ([("w1", 512), ("w2", 0)], "w2"), ([("w1", 512), ("w2", 0)], "w1"),
             ([("w1", 8), ("w2", 0)], "w2")]
    for k, (cs, sel) in enumerate(cands):
        rows.append({"request_id": f"r{18 + k}", "selected_worker": sel, "predicted_cached_tokens": 0,
                     "candidate_workers": [{"worker": w, "predicted_cached_tokens": n} for w, n in cs],
                     "queue_wait_ms": 500 * (k + 1), "decision": "round-robin"})
    rows += [{"request_id": f"ghost-{k}", "decision": "round-robin", "queue_wait_ms": 4000} for k in range(2)]
    return rows


def _logs(tmp_path, decisions: list | None = None) -> tuple:
    recs = [chat(i, f"c{i}", 1, ttft_ms=TTFT_MS[i], queue_wait_ms=750, actual_cached_tokens=ENGINE)
            for i in range(24)]
    log = write_jsonl(tmp_path / "pilot.jsonl", recs)
    dec = write_jsonl(tmp_path / "decisions.jsonl", decisions if decisions is not None else _decisions())
    return log, dec, recs


def test_queue_wait_left_warm_and_divergence_by_decision_equal_the_values_from_the_logs(tmp_path) -> None:
    log, dec, recs = _logs(tmp_path)
    rows = _decisions()
    r = runner.invoke(app, ["analyze", str(log), "--decisions", str(dec), "--json", "-q", "-o", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    d = out["pilot"]["decisions"]
    assert (d["read"], d["accepted"], d["rejected"]) == (24, 24, 0)
    assert d["join"] == {"decision_rows": 24, "joined": 22, "decisions_without_request": 2,
                         "requests_without_decision": 2}
    ttft = {rec["request_id"]: rec["ttft_ms"] / 1000 for rec in recs}
    for name in ("prefer-warm-worker", "cold_fallback", "round-robin"):
        mine = [x for x in rows if x["decision"] == name]
        waits = [x["queue_wait_ms"] / 1000 if "queue_wait_ms" in x else 0.75 for x in mine]
        got = d["by_decision"][name]
        assert got["requests"] == len(mine) and got["queue_wait_requests"] == len(waits)
        for q in (50, 95):
            assert got[f"queue_wait_p{q}_s"] == linear(waits, q), (name, q)
            assert got[f"ttft_p{q}_s"] == linear([ttft[x["request_id"]] for x in mine if x["request_id"] in ttft], q)
    all_waits = [x["queue_wait_ms"] / 1000 if "queue_wait_ms" in x else 0.75 for x in rows]
    assert d["all"]["queue_wait_p95_s"] == linear(all_waits, 95)
    # left a warm candidate: 4 fallbacks by name, 2 round-robin rows by their candidates; 6 of 24
    assert d["left_warm"] == {"requests": 6, "share": 0.25, "by_decision_name": 4, "by_candidates_only": 2}
    assert [d["by_decision"][n]["left_warm_requests"] for n in ("prefer-warm-worker", "cold_fallback",
                                                                 "round-robin")] == [0, 4, 2]
    # predicted vs actual over the 22 rows with both: 3 + 4 diverge by more than one block (16 tokens)
    div = d["divergence"]
    assert (div["compared"], div["diverged"], div["predicted_above_actual"], div["actual_above_predicted"]) == \
        (22, 7, 3, 4)
    assert div["systematic"] and d["by_decision"]["cold_fallback"]["divergence"]["systematic"] is False
    pw = d["by_decision"]["prefer-warm-worker"]
    assert (pw["predicted_cached_tokens"], pw["actual_cached_tokens"]) == (13 * ENGINE, 9 * ENGINE + 500)
    assert d["by_decision"]["round-robin"]["actual_cached_tokens"] == 4 * ENGINE  # the request log's count
    assert pw["prefill_tokens"] == 130 and d["by_decision"]["round-robin"]["prefill_tokens"] is None
    assert any("input-identification problem" in n and "7 of 22" in n for n in out["notes"])
    assert any("22 decision rows joined a request; 2 match no request and 2 requests" in n for n in out["notes"])
    # the pilot table holds the same rows, and its columns are the documented ones
    t = pl.from_arrow(pq.read_table(tmp_path / "run" / "pilot.parquet"))
    assert set(t.columns) == documented()["pilot"]
    levels = t.filter(pl.col("level").is_in(["decision_all", "decision"]))
    assert levels["decision"].to_list() == [None, "prefer-warm-worker", "round-robin", "cold_fallback"]
    row = levels.filter(pl.col("decision") == "cold_fallback").row(0, named=True)
    assert row["queue_wait_p50_s"] == d["by_decision"]["cold_fallback"]["queue_wait_p50_s"]
    assert row["left_warm_requests"] == 4 and row["joined_requests"] == 5
    assert t.filter(pl.col("level") == "class")["decision"].null_count() == 3


def test_bad_decision_rows_are_rejects_with_where_and_why(tmp_path) -> None:
    good = {"request_id": "r0", "decision": "warm", "queue_wait_ms": 5}
    bad = ["{not json", "[1]", {"request_id": "r1"}, {"request_id": True, "decision": "warm"},
           {"request_id": "r2", "decision": "warm", "predicted_cached_tokens": -5},
           {"request_id": "r3", "decision": "warm", "candidate_workers": "w1"},
           {"request_id": "r4", "decision": "warm", "queue_wait_ms": "Zelda"},
           {"request_id": "r5", "decision": "warm", "candidate_workers": [{"predicted_cached_tokens": 3}]},
           {"request_id": "r0", "decision": "cold"}]
    log, dec, _ = _logs(tmp_path, [good, *bad])
    res = prefixscan.analyze(str(log), decisions=str(dec), findings=False)
    rej = res.tables["rejects"].to_pylist()
    assert [(x["source_line"], x["reason"]) for x in rej] == [
        (2, "invalid_json"), (3, "not_an_object"), (4, "missing_field"), (5, "wrong_type"), (6, "out_of_range"),
        (7, "wrong_type"), (8, "wrong_type"), (9, "missing_field"), (10, "duplicate_id")]
    assert all(x["source_file"] == str(dec) for x in rej)
    assert "`queue_wait_ms`" in rej[6]["detail"] and "Zelda" not in json.dumps(rej)
    d = res.summary["pilot"]["decisions"]
    assert d["read"] == d["accepted"] + d["rejected"] == 10 and d["accepted"] == 1
    assert d["rejects_by_reason"] == {"duplicate_id": 1, "invalid_json": 1, "missing_field": 2, "not_an_object": 1,
                                      "out_of_range": 1, "wrong_type": 3}
    # the request log's own counts are untouched: read = accepted + rejected for it, as always
    assert res.summary["requests"]["read"] == 24 and res.summary["requests"]["rejected"] == 0
    r = runner.invoke(app, ["analyze", str(log), "--decisions", str(dec), "-q", "--strict"])
    assert r.exit_code == 4 and f"{dec}:2: invalid_json" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_decision_log_that_matches_nothing_says_so_in_one_line(tmp_path) -> None:
    log, dec, _ = _logs(tmp_path, [{"request_id": f"x{k}", "decision": "warm", "queue_wait_ms": 8} for k in range(3)])
    r = runner.invoke(app, ["analyze", str(log), "--decisions", str(dec)])
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())  # the terminal wraps a long note
    assert text.count("none of the 3 decision rows matches a request id of the log's 24 requests") == 1
    res = prefixscan.analyze(str(log), decisions=str(dec), findings=False)
    assert res.summary["pilot"]["decisions"]["join"]["joined"] == 0
    assert sum("none of the 3 decision rows" in n for n in res.summary["notes"]) == 1
    assert res.summary["pilot"]["decisions"]["by_decision"]["warm"]["queue_wait_p50_s"] == 0.008  # still measured


def test_an_empty_or_all_rejected_decision_log_says_so(tmp_path) -> None:
    for rows in ([], [{"request_id": "r0"}]):
        log, dec, _ = _logs(tmp_path, rows)
        res = prefixscan.analyze(str(log), decisions=str(dec), findings=False)
        said = [n for n in res.summary["notes"] if n.startswith("--decisions:")]
        assert said == [f"--decisions: no decision row to join ({len(rows)} read, {len(rows)} rejected: see the "
                        "rejects table)"]
        assert res.summary["pilot"]["decisions"]["join"]["requests_without_decision"] == 24


def test_missing_decision_file_is_an_input_error_and_it_is_never_an_output(tmp_path) -> None:
    log, dec, _ = _logs(tmp_path)
    r = runner.invoke(app, ["analyze", str(log), "-q", "--decisions", str(tmp_path / "nope.jsonl")])
    assert r.exit_code == 3 and "--decisions" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    before = dec.read_bytes()
    r = runner.invoke(app, ["analyze", str(log), "-q", "--decisions", str(dec), "-o", str(dec), "--force"])
    assert r.exit_code == 2 and "would destroy the input" in r.stderr and dec.read_bytes() == before


def test_without_latency_the_decisions_still_make_the_pilot_table(tmp_path) -> None:
    recs = [chat(i, f"c{i}", 1) for i in range(3)]
    log = write_jsonl(tmp_path / "a.jsonl", recs)
    dec = write_jsonl(tmp_path / "d.jsonl", [{"request_id": f"r{i}", "decision": "warm", "queue_wait_ms": 250 * i}
                                            for i in range(3)])
    res = prefixscan.analyze(str(log), decisions=str(dec), output=str(tmp_path / "run"), findings=False)
    assert res.summary["pilot"]["decisions"]["all"]["queue_wait_p50_s"] == 0.25
    assert (tmp_path / "run" / "pilot.parquet").exists()


def test_report_and_terminal_show_decisions_escaped(tmp_path) -> None:
    evil = "warm\x1b]52;c;evil\x07 [x](http://e.example) <img src=x>"
    rows = [{"request_id": f"r{i}", "decision": evil if i % 2 else "cold_fallback", "queue_wait_ms": 125 * i}
            for i in range(6)]
    log, dec, _ = _logs(tmp_path, rows)
    run = tmp_path / "run"
    term = runner.invoke(app, ["analyze", str(log), "--decisions", str(dec), "-o", str(run)])
    assert term.exit_code == 0 and "by routing decision" in term.stdout and "\x1b]52" not in term.stdout
    r = runner.invoke(app, ["report", str(run), "-o", str(tmp_path / "rep"), "--format", "both"])
    assert r.exit_code == 0, r.output
    md = (tmp_path / "rep" / "report.md").read_text()
    part = md.split("### By routing decision")[1]
    assert "| cold_fallback | 3 |" in part and "\x1b" not in md and "<img" not in md and "\\[x\\](http" in part
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "By routing decision" in html and "<img src=x>" not in html


def test_a_parquet_decision_log_with_integer_ids_and_a_nan_wait(tmp_path) -> None:
    import pyarrow as pa

    recs = [chat(i, f"c{i}", 1, ttft_ms=100) for i in range(3)]
    for i, rec in enumerate(recs):
        rec["request_id"] = 100 + i  # integer ids in both logs join as the same strings
    log = write_jsonl(tmp_path / "a.jsonl", recs)
    pq.write_table(pa.table({"request_id": [100, 101, 102], "decision": ["warm", "warm", "cold"],
                             "queue_wait_ms": [250.0, float("nan"), 500.0]}), tmp_path / "d.parquet")
    res = prefixscan.analyze(str(log), decisions=str(tmp_path / "d.parquet"), findings=False)
    d = res.summary["pilot"]["decisions"]
    assert d["join"]["joined"] == 2 and d["rejected"] == 1
    assert res.tables["rejects"].to_pylist()[0]["reason"] == "out_of_range"
    assert d["by_decision"]["warm"]["queue_wait_p50_s"] == 0.25
