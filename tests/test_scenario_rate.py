"""Issue 27: the report's scenario merges with the saved estimate field by field and names where each value
came from; a gappy log is priced at its busy-period rate, a steady one exactly as before."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from prefixscan.cli.app import app
from prefixscan.cost import estimate
from prefixscan.sim.rate import GAP_MIN_S, activity
from tests.test_estimate_replay import OPTS, _rewrite, make_run

DAY = 86_400.0


def _cli(*args: str):
    res = CliRunner().invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res


def _md(run) -> str:
    return (run / "report.md").read_text()


def test_report_with_only_a_rate_merges_with_the_saved_estimate(tmp_path):
    """The exact sequence of the issue: the report keeps the saved 8 replicas, prices 50 req/s, gives a
    verdict and names the rate and where each value came from."""
    run = make_run(tmp_path)
    _cli("estimate", str(run), "--replicas", "8", "--scale-to-rps", "50", "-q")
    _cli("report", str(run), "--scale-to-rps", "50", "-f", "md", "-q")
    md = _md(run)
    assert "Verdict: not available" not in md and "needs a replica count" not in md
    assert "**Verdict: " in md
    assert "**Scenario:** 8 replicas of llama-3.1-70b" in md and "50 req/s" in md.split("\n\n")[1]
    assert "| replicas | 8 | saved estimate |" in md
    assert "| rate | 50 req/s | flag |" in md
    assert "| model | llama-3.1-70b | default |" in md


def test_a_flag_overrides_one_field_and_keeps_the_rest(tmp_path):
    run = make_run(tmp_path)
    _cli("estimate", str(run), "--model", "llama-3.1-8b", "--replicas", "4", "--rps", "30", "-q")
    _cli("report", str(run), "--usd-per-gpu-hour", "3", "-f", "md", "-q")
    md = _md(run)
    assert "4 replicas of llama-3.1-8b" in md and "30 req/s (saved estimate)" in md and "$3.00/GPU-hour" in md
    assert "| price | $3.00/GPU-hour | flag |" in md and "| model | llama-3.1-8b | saved estimate |" in md
    assert "re-estimated: the report's options over the scenario" in md
    est = json.loads((run / "estimate.json").read_text())["result"]  # the report never rewrites the estimate
    assert est["scenario"]["usd_per_gpu_hour"] == 2.5 and est["scenario"]["sources"]["rps"] == "flag"


def test_flag_beats_saved_estimate_beats_prefixscan_toml(tmp_path):
    run = make_run(tmp_path)
    cfg = tmp_path / "prefixscan.toml"
    cfg.write_text("[scenario]\nreplicas = 16\nmfu = 0.4\n")
    _cli("estimate", str(run), "--replicas", "8", "-q")  # no config: the replica count is a flag
    _cli("--config", str(cfg), "report", str(run), "-f", "md", "-q")
    md = _md(run)
    assert "| replicas | 8 | saved estimate |" in md and "| MFU | 0.4 | prefixscan.toml |" in md
    _cli("--config", str(cfg), "report", str(run), "--replicas", "2", "-f", "md", "-q")
    assert "| replicas | 2 | flag |" in _md(run)
    _cli("--config", str(cfg), "estimate", str(run), "-q")  # now the saved estimate took them from the file
    sources = json.loads((run / "estimate.json").read_text())["result"]["scenario"]["sources"]
    assert sources["replicas"] == "prefixscan.toml" and sources["mfu"] == "prefixscan.toml"
    cfg.write_text("[scenario]\nreplicas = 12\n")  # the file changed: its current value wins over its old one
    _cli("--config", str(cfg), "report", str(run), "-f", "md", "-q")
    md = _md(run)
    assert "| replicas | 12 | prefixscan.toml |" in md and "| MFU | 0.4 | saved estimate |" in md


def test_an_older_estimate_json_without_sources_still_merges(tmp_path):
    run = make_run(tmp_path)
    _cli("estimate", str(run), "--replicas", "8", "--rps", "50", "-q")
    doc = json.loads((run / "estimate.json").read_text())
    doc["result"]["scenario"].pop("sources")
    doc["result"]["scenario"]["rps_source"] = "--scale-to-rps"
    (run / "estimate.json").write_text(json.dumps(doc))
    _cli("report", str(run), "--usd-per-gpu-hour", "3", "-f", "md", "-q")
    md = _md(run)
    assert "8 replicas of llama-3.1-70b" in md and "50 req/s (saved estimate)" in md


def _bursts(run, n: int = 240) -> list[float]:
    """Two bursts of n/2 requests, half a second apart, one day between them."""
    half = n // 2
    arrivals = [i * 0.5 for i in range(half)] + [DAY + i * 0.5 for i in range(n - half)]
    _rewrite(run, arrival_s=arrivals)
    return arrivals


def test_a_gappy_log_is_priced_at_its_busy_period_rate(tmp_path):
    run = make_run(tmp_path)
    arrivals = _bursts(run)
    r = estimate(dataclasses.replace(OPTS, replicas=8), run)
    busy = 2 * 119 * 0.5
    assert r.workload.rps == pytest.approx(240 / busy)
    assert r.spec.rps_source == "measured over the log's busy periods"
    note = next(n for n in r.notes if "busy for" in n)
    assert "spans 24.0 h but is busy for 2.0 min" in note and "pass --rps" in note
    assert f"not the mean {240 / (arrivals[-1] - arrivals[0]):,.3g} req/s" in note
    # the size of the saving at a sample's rate is unchecked, not a "Not worth it"
    saving = next(c for c in r.verdict.checks if c.name == "saving")
    assert saving.status == "unknown" and "busy-period rate" in saving.text and "--rps" in saving.text
    assert "too little" not in r.verdict.headline and saving.text not in r.verdict.headline


def test_a_steady_log_is_unchanged(tmp_path):
    run = make_run(tmp_path)
    r = estimate(dataclasses.replace(OPTS, replicas=8), run)
    assert r.workload.rps == 240 / (239 * 0.5) and r.spec.rps_source == "measured"
    assert not any("busy" in n for n in r.notes)
    saving = next(c for c in r.verdict.checks if c.name == "saving")
    assert saving.status == "fail" and "price production traffic with --rps" in saving.text


def test_rps_compresses_the_busy_periods_to_that_rate(tmp_path):
    """--rps on a gappy log: the busy periods run at the rate (the idle day does not dilute it)."""
    from prefixscan.run.load import load_run
    from prefixscan.sim.workload import build_workload

    run = make_run(tmp_path)
    _bursts(run)
    wl = build_workload(load_run(run).table("requests"), 16, target_rps=20.0)
    gaps = np.diff(wl.arrival_s)
    assert np.median(gaps) == pytest.approx(239 / 20.0 / 238, rel=1e-6)  # (n-1) gaps over the busy time
    r = estimate(dataclasses.replace(OPTS, replicas=8, rps=20.0), run)
    assert r.workload.rps == 20.0 and r.spec.sources["rps"] == "flag"


def test_a_log_of_isolated_instants_asks_for_rps(tmp_path):
    from prefixscan.errors import UsageError

    run = make_run(tmp_path, n=6, convs=3)
    _rewrite(run, arrival_s=[0.0, 0.0, DAY, DAY, 2 * DAY, 2 * DAY])
    with pytest.raises(UsageError, match=r"cannot measure a request rate: .*isolated instants.*pass --rps"):
        estimate(dataclasses.replace(OPTS, replicas=2), run)


def test_activity_rule():
    rng = np.random.default_rng(0)
    steady = np.cumsum(rng.exponential(0.2, 5000))  # Poisson at 5 req/s
    a = activity(steady)
    assert not a.gappy and a.rps == a.mean_rps == 5000 / (steady[-1] - steady[0]) and a.note() is None
    sparse = np.arange(100) * 300.0  # one request every 5 minutes: slow, not gappy
    assert not activity(sparse).gappy
    small_gap = np.concatenate([np.arange(1000) * 1.0, 1000 + GAP_MIN_S + np.arange(1000) * 1.0])
    assert not activity(small_gap).gappy  # an idle minute in half an hour is under 10% of the span
    bursts = np.concatenate([np.arange(100) * 0.1, 3600 + np.arange(100) * 0.1])
    b = activity(bursts)
    assert b.gappy and b.idle_gaps == 1 and b.rps == pytest.approx(200 / (2 * 99 * 0.1))
