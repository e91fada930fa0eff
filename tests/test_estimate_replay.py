"""estimate and report on runs: baselines replayed at the scenario, agreement with the simulator, the
engine-reported status quo, estimate.json and the report's one scenario."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prefixscan.cost import EstimateOptions, estimate, load_estimate, save_estimate
from prefixscan.sim import SimConfig, simulate

BS = 16
OPTS = EstimateOptions(model="llama-3.1-8b", gpu="h100", tensor_parallel=1, kv_blocks=4000)


def make_run(d: Path, *, n: int = 240, shared_blocks: int = 60, convs: int = 40, tenants: int = 3,
             actual: list[int] | None = None) -> Path:
    """A requests table built by hand: every prompt starts with one shared system prompt
    (`shared_blocks` blocks), then its conversation's history (grows one block a turn), then a new turn."""
    ids: dict[tuple, int] = {}

    def block(parent: int, key: object) -> int:
        return ids.setdefault((parent, key), len(ids) + 1)

    rows, seen = [], set()
    for i in range(n):
        c = i % convs
        chain, parent = [], 0
        keys = [("sys", b) for b in range(shared_blocks)] + [("conv", c, t) for t in range(i // convs)]
        keys.append(("new", i))
        for k in keys:
            parent = block(parent, k)
            chain.append(parent)
        hit = 0
        while hit < len(chain) and chain[hit] in seen:
            hit += 1
        seen.update(chain)
        rows.append({"seq": i, "request_id": f"r{i}", "arrival_s": i * 0.5, "tenant": f"t{c % tenants}",
                     "conversation_id": f"c{c}", "prompt_tokens": len(chain) * BS,
                     "cached_tokens": min(hit * BS, len(chain) * BS - 1), "output_tokens": 50,
                     "block_hashes": chain})
    table = pa.Table.from_pylist(rows, schema=pa.schema([
        ("seq", pa.int64()), ("request_id", pa.string()), ("arrival_s", pa.float64()), ("tenant", pa.string()),
        ("conversation_id", pa.string()), ("prompt_tokens", pa.int64()), ("cached_tokens", pa.int64()),
        ("output_tokens", pa.int64()), ("block_hashes", pa.list_(pa.uint64()))]))
    if actual is not None:
        table = table.append_column("actual_cached_tokens", pa.array(actual, pa.int64()))
    run = d / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"format_version": 1, "config": {"block_size": BS,
                                                                                   "hit_rule": "vllm"}}))
    pq.write_table(table, run / "requests.parquet")
    return run


def _sim(run: Path, replicas: int, **kw) -> dict:
    cfg = SimConfig(replicas=replicas, policies=("round_robin", "sglang_cache_aware"), kv_blocks=4000,
                    model="llama-3.1-8b", gpu="h100", decision_log=True, **kw)
    return simulate(run, cfg)


def test_round_robin_is_replayed_not_one_over_replicas(tmp_path):
    """A shared system prompt is warm on every replica: replayed round robin is far above 1/replicas."""
    run = make_run(tmp_path)
    r = estimate(dataclasses.replace(OPTS, replicas=8), run)
    rr, pa_ = r.scenario("round_robin"), r.scenario("prefix_aware")
    assert r.baseline_basis == "replay" and rr.basis == "replay"
    sim = _sim(run, 8).policies
    assert rr.hit_rate_token_weighted == pytest.approx(sim["round_robin"]["hit_rate_token_weighted"], abs=0)
    assert pa_.hit_rate_token_weighted == pytest.approx(sim["sglang_cache_aware"]["hit_rate_token_weighted"], abs=0)
    assert rr.capture_of_ideal > 0.5 > 1 / 8  # analytic would say 1/8 of the ideal
    analytic = r.workload.reusable_fraction / 8
    assert rr.hit_rate_token_weighted > 4 * analytic


def test_saved_simulation_is_reused_when_it_matches(tmp_path):
    run = make_run(tmp_path)
    res = _sim(run, 4, target_rps=20.0)
    res.save(run)
    r = estimate(dataclasses.replace(OPTS, kv_blocks=None), run)  # every scenario option from the simulation
    assert r.baseline_basis == "saved simulation" and r.spec.replicas == 4 and r.workload.rps == 20.0
    assert r.spec.rps_source == "the saved simulation's rate"
    assert r.scenario("round_robin").hit_rate_token_weighted == res.policies["round_robin"]["hit_rate_token_weighted"]
    assert r.verdict.router_policy == "sglang_cache_aware"
    other = estimate(dataclasses.replace(OPTS, replicas=2), run)  # another scenario: replayed on the fly
    assert other.baseline_basis == "replay" and "ran 4 replicas" in other.baseline_detail
    fresh = _sim(run, 2).policies["round_robin"]["hit_rate_token_weighted"]
    # the saved simulation ran at 20 req/s; the new scenario keeps it (same rate, 2 replicas)
    at_rate = _sim(run, 2, target_rps=20.0).policies["round_robin"]["hit_rate_token_weighted"]
    assert other.scenario("round_robin").hit_rate_token_weighted == at_rate
    assert 0 < fresh <= 1


def test_report_gives_the_simulation_figures(tmp_path):
    """estimate and report agree with the simulation at the same scenario."""
    from prefixscan.report.assemble import build

    run = make_run(tmp_path)
    res = _sim(run, 4)
    res.save(run)
    data = build(run)
    est = data.estimate
    rr = next(s for s in est["scenarios"] if s["name"] == "round_robin")
    assert rr["hit_rate_token_weighted"] == res.policies["round_robin"]["hit_rate_token_weighted"]
    assert data.scenario.startswith("4 replicas of llama-3.1-8b")
    sim_rr = data.policy("round_robin")
    assert sim_rr["hit_rate_token_weighted"] == rr["hit_rate_token_weighted"]
    router = next(s for s in est["scenarios"] if s["name"] == "prefix_aware")
    assert router["hit_rate_token_weighted"] == res.policies["sglang_cache_aware"]["hit_rate_token_weighted"]
    assert est["baselines"]["basis"] == "saved simulation" and data.policies_source == "the run's saved simulation"


def test_engine_reported_status_quo_from_fewer_replicas(tmp_path):
    """The "engine" ran round robin on 2 replicas; estimated at 8 replicas, today is what it reported and
    the explanation names about 2 replicas."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    base = make_run(tmp_path / "a")
    dec = _sim(base, 2).tables["sim_decisions"].to_pylist()
    rr_rows = sorted((r for r in dec if r["policy"] == "round_robin"), key=lambda r: r["seq"])
    actual = [int(r["actual_cached_tokens"]) for r in rr_rows]
    run = make_run(tmp_path / "b", actual=actual)
    r = estimate(dataclasses.replace(OPTS, replicas=8), run)
    today = r.scenario("today")
    assert r.status_quo == "today" and today.basis == "engine-reported"
    total = pq.read_table(run / "requests.parquet")
    expect = sum(actual) / sum(total.column("prompt_tokens").to_pylist())
    assert today.hit_rate_token_weighted == pytest.approx(expect)
    assert r.engine is not None and dict(r.engine.sweep)[2] == pytest.approx(expect)
    text = " ".join(r.engine.explanation)
    assert f"{expect:.1%}" in text and "about 2 replicas" in text and "fewer than the 8 assumed" in text
    sq = r.scenario("today").gpus - r.scenario("prefix_aware").gpus
    assert r.monthly_savings_usd == pytest.approx(sq * r.hours_per_month * r.spec.gpu.usd_per_hour)
    saving = next(c for c in r.verdict.checks if c.name == "saving")
    assert "today (engine-reported)" in saving.text and saving.numbers["status_quo_hit"] == pytest.approx(expect)


def test_estimate_json_is_saved_and_reused_by_report(tmp_path):
    from prefixscan.report.assemble import build

    run = make_run(tmp_path)
    r = estimate(dataclasses.replace(OPTS, replicas=4, scale_to_rps=100.0, usd_per_gpu_hour=4.0), run)
    path = save_estimate(r, run, "prefixscan estimate RUN --replicas 4 --scale-to-rps 100")
    assert path.name == "estimate.json" and not list(run.glob(".estimate.json.*"))
    assert load_estimate(run)["result"]["monthly_savings_usd"] == pytest.approx(r.monthly_savings_usd)
    data = build(run)  # no options: the saved estimate, one scenario
    assert "estimate.json" in data.estimate_source
    assert data.scenario == r.spec.describe() and "100 req/s (--rps)" in data.scenario  # the old name, one rate
    assert "$4.00/GPU-hour" in data.scenario
    assert [p["policy"] for p in data.policies] == ["round_robin", "sglang_cache_aware"]
    again = build(run, dataclasses.replace(OPTS, replicas=2))  # options win over the saved estimate
    assert again.estimate["assumptions"]["replicas"] == 2


def test_flags_only_stays_analytic():
    r = estimate(EstimateOptions(model="llama-3.1-70b", dtype="fp8", gpu="h100", replicas=32, rps=200,
                                 context_tokens=10_000, new_tokens=500, hit_rate=0.85, usd_per_gpu_hour=2.5,
                                 linear=True))
    rr = r.scenario("round_robin")
    assert r.baseline_basis == "analytic" and rr.basis == "analytic" and "1/32" in rr.source
    assert rr.hit_rate == pytest.approx(1 / 32)


def test_cli_writes_estimate_json_and_report_names_the_scenario(tmp_path):
    from typer.testing import CliRunner

    from prefixscan.cli.app import app

    run = make_run(tmp_path)
    args = ["estimate", str(run), "--model", "llama-3.1-8b", "--tp", "1", "--kv-blocks", "4000", "--replicas", "4",
            "--scale-to-rps", "50"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    first = res.output.splitlines()[0]
    assert first.startswith("Scenario: 4 replicas of llama-3.1-8b (bf16, TP1) on h100-sxm, 64,000 KV tokens")
    assert "Round robin and router from: replay" in res.output
    assert (run / "estimate.json").exists()
    out = CliRunner().invoke(app, ["report", str(run), "-o", str(tmp_path / "rep"), "-f", "md"])
    assert out.exit_code == 0, out.output
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "**Scenario:** 4 replicas of llama-3.1-8b" in md and "50 req/s (--rps)" in md  # --rps's old name
    assert "| scenario | requests with a hit | prompt tokens cached | of ideal |" in md
    assert "hit (requests)" not in md


def _rewrite(run: Path, **cols) -> None:
    t = pq.read_table(run / "requests.parquet")
    for name, values in cols.items():
        t = t.set_column(t.schema.get_field_index(name), name, pa.array(values, t.schema.field(name).type))
    pq.write_table(t, run / "requests.parquet")


def test_run_measures_traffic(tmp_path):
    run = make_run(tmp_path, n=120, convs=40)
    r = estimate(dataclasses.replace(OPTS, replicas=4), run)
    wl, t = r.workload, pq.read_table(run / "requests.parquet").to_pydict()
    assert wl.requests == 120 and wl.rps == pytest.approx(120 / (119 * 0.5))
    assert wl.context_tokens == pytest.approx(sum(t["prompt_tokens"]) / 120)
    assert wl.new_tokens == pytest.approx((sum(t["prompt_tokens"]) - sum(t["cached_tokens"])) / 120)
    assert wl.ideal_hit_rate_token_weighted == pytest.approx(sum(t["cached_tokens"]) / sum(t["prompt_tokens"]))
    assert wl.output_tokens == 50 and r.scenario("ideal").prefill_tokens_s == pytest.approx(wl.rps * wl.new_tokens)
    ideal = r.scenario("ideal")
    assert ideal.hit_rate == pytest.approx(sum(c > 0 for c in t["cached_tokens"]) / 120)


def test_scale_to_rps_prices_the_replay_at_that_rate(tmp_path):
    run = make_run(tmp_path)
    base = estimate(dataclasses.replace(OPTS, replicas=4), run)
    scaled = estimate(dataclasses.replace(OPTS, replicas=4, scale_to_rps=200.0), run)
    assert scaled.workload.rps == 200.0 and scaled.spec.rps_source == "--rps"  # scale_to_rps: its old name
    ratio = scaled.scenario("no_reuse").gpus / base.scenario("no_reuse").gpus
    assert ratio == pytest.approx(200.0 / base.workload.rps)
    at = _sim(run, 4, target_rps=200.0).policies["round_robin"]["hit_rate_token_weighted"]
    assert scaled.scenario("round_robin").hit_rate_token_weighted == at


def test_one_arrival_instant_needs_rps(tmp_path):
    from prefixscan.errors import UsageError

    run = make_run(tmp_path, n=6, convs=3)
    _rewrite(run, arrival_s=[0.0] * 6)
    with pytest.raises(UsageError, match="--rps"):
        estimate(dataclasses.replace(OPTS, replicas=2), run)
    assert estimate(dataclasses.replace(OPTS, replicas=2, rps=5.0), run).workload.rps == 5.0


def test_empty_prompts_are_a_clear_error(tmp_path):
    from prefixscan.errors import UsageError

    run = make_run(tmp_path, n=4, convs=2)
    _rewrite(run, prompt_tokens=[0] * 4, cached_tokens=[0] * 4)
    with pytest.raises(UsageError, match="nothing to prefill"):
        estimate(dataclasses.replace(OPTS, replicas=2), run)


def test_nothing_repeats_is_not_worth_it(tmp_path):
    run = make_run(tmp_path, n=40, shared_blocks=0, convs=40)  # every prompt unique: one new block each
    r = estimate(dataclasses.replace(OPTS, replicas=4), run)
    assert r.workload.ideal_hit_rate_token_weighted == 0.0
    assert r.verdict.worth_it is False and r.verdict.headline.startswith("Not worth it: little repetition")
    assert r.monthly_savings_usd == pytest.approx(0.0, abs=1e-6)


def test_unknown_router_policy_is_a_usage_error(tmp_path):
    from prefixscan.errors import UsageError

    run = make_run(tmp_path, n=20, convs=5)
    with pytest.raises(UsageError):
        estimate(dataclasses.replace(OPTS, replicas=2, policies=("no_such_router",)), run)


def test_a_stale_estimate_json_is_re_estimated_at_its_scenario(tmp_path):
    from prefixscan.report.assemble import build

    run = make_run(tmp_path)
    r = estimate(dataclasses.replace(OPTS, replicas=4, scale_to_rps=100.0), run)
    save_estimate(r, run, "prefixscan estimate RUN --replicas 4 --scale-to-rps 100")
    _sim(run, 2).save(run)  # the run changes after the estimate
    data = build(run)
    assert data.estimate_source.startswith("re-estimated at the scenario")
    # same scenario, recomputed on the changed run; its rate now comes from the saved estimate
    assert data.scenario == r.spec.describe().replace("(--rps)", "(saved estimate)")
    rr = next(s for s in data.estimate["scenarios"] if s["name"] == "round_robin")
    assert rr["hit_rate_token_weighted"] == r.scenario("round_robin").hit_rate_token_weighted


def test_engine_counters_are_today_when_the_log_has_no_per_request_counts(tmp_path):
    """`analyze --metrics` attaches vLLM's prefix-cache counters; without per-request counts they are today."""
    run = make_run(tmp_path)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["evidence"] = {"metrics": {"engine": "vllm", "queries": 100_000, "hits": 41_000, "coverage": 1.0,
                                        "same_window": True, "predicted_ideal_hit_rate": 0.9, "scrapes": 2}}
    (run / "manifest.json").write_text(json.dumps(manifest))
    r = estimate(dataclasses.replace(OPTS, replicas=8), run)
    today = r.scenario("today")
    assert r.status_quo == "today" and today.hit_rate_token_weighted == pytest.approx(0.41)
    assert today.hit_rate is None and "counters" in today.source
    assert r.engine.explanation[0] == ("The engine's vllm prefix-cache counters covering the same window as the log "
                                       "report 41.0% of prompt tokens cached (41,000 of 100,000).")
