"""`check` (CI gates) and `diff` (before/after) on runs with and without a cache breaker."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import prefixscan
from prefixscan.cli.app import app
from prefixscan.compare.check import severity
from tests.conftest import write_jsonl
from tests.test_findings_detect import DOC, SYS, question, rec, ts

runner = CliRunner()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[str, str]:
    """A: a timestamp at the top of the system prompt breaks reuse; B: the same traffic without it."""
    d = tmp_path_factory.mktemp("cmp")
    before = [rec(i, f"Request time: {ts(i)}\n" + SYS, DOC + question(i)) for i in range(20)]
    before += [rec(100 + i, SYS, DOC + question(i), tenant="globex") for i in range(6)]
    after = [rec(i, SYS, DOC + question(i)) for i in range(20)]
    after += [rec(100 + i, SYS, DOC + question(i), tenant="globex") for i in range(6)]
    a, b = str(d / "a"), str(d / "b")
    prefixscan.analyze(str(write_jsonl(d / "a.jsonl", before)), output=a)
    prefixscan.analyze(str(write_jsonl(d / "b.jsonl", after)), output=b)
    return a, b


def test_severity_thresholds() -> None:
    assert [severity(t, 1000) for t in (0, 9, 10, 49, 50, 900)] == ["low", "low", "medium", "medium", "high", "high"]
    assert severity(5, 0) == "low"


def test_check_passes_and_fails_with_exit_codes(runs) -> None:
    a, b = runs
    facts = prefixscan.check(a, min_hit_rate=0.0)
    assert facts.passed and len(facts.gates) == 1
    hit_a = facts.gates[0].value
    ok = runner.invoke(app, ["check", b, "--min-hit-rate", "0.5", "--max-breaker-tokens", "0"])
    assert ok.exit_code == 0, ok.output
    assert ok.output.splitlines()[-1] == "check passed: 2 gate(s) held"
    bad = runner.invoke(app, ["check", a, "--min-hit-rate", f"{hit_a + 0.01:.4f}", "--fail-on", "high"])
    assert bad.exit_code == 8
    lines = bad.output.splitlines()
    assert lines[0].startswith("FAIL min-hit-rate (token_weighted): token_weighted hit rate ")
    assert lines[1].startswith("FAIL fail-on high: 1 breaker(s) of severity high or above; worst: timestamp "
                               "(Request time), tenant acme, ")
    assert lines[-1] == "check failed: 2 of 2 gate(s) failed"


def test_check_json_and_quiet(runs) -> None:
    a, b = runs
    r = runner.invoke(app, ["check", a, "--max-breaker-tokens", "0", "--min-hit-rate", "0", "--json"])
    assert r.exit_code == 8
    data = json.loads(r.output)
    assert data["passed"] is False
    gates = {g["name"]: g for g in data["gates"]}
    assert gates["max-breaker-tokens"]["value"] > 0 and not gates["max-breaker-tokens"]["passed"]
    assert gates["min-hit-rate (token_weighted)"]["passed"]
    q = runner.invoke(app, ["check", a, "--max-breaker-tokens", "0", "--min-hit-rate", "0", "-q"])
    assert [ln.split(":")[0] for ln in q.output.splitlines()] == ["FAIL max-breaker-tokens", "check failed"]


@pytest.mark.parametrize("args, message", [
    ([], "nothing to check"),
    (["--min-hit-rate", "40"], "fraction between 0 and 1"),
    (["--fail-on", "severe"], "--fail-on must be one of low, medium, high"),
    (["--min-hit-rate", "0.1", "--definition", "hits"], "--definition must be one of"),
])
def test_check_usage_errors(runs, args, message) -> None:
    r = runner.invoke(app, ["check", runs[0], *args])
    assert r.exit_code == 2 and message in r.output


def test_check_not_a_run(tmp_path) -> None:
    r = runner.invoke(app, ["check", str(tmp_path), "--min-hit-rate", "0.1"])
    assert r.exit_code == 5 and "not a prefixscan run directory" in r.output


def test_diff_sees_the_fixed_breaker(runs) -> None:
    a, b = runs
    d = prefixscan.diff(a, b)
    rates = {k: (x, y) for k, x, y in d.rates}
    assert rates["token_weighted"][1] > rates["token_weighted"][0]
    assert [(c.status, c.breaker.kind, c.breaker.tenant) for c in d.breakers] == [("fixed", "timestamp", "acme")]
    assert d.breakers[0].tokens_lost_a > 0 and d.breakers[0].tokens_lost_b == 0
    tenants = {g.key: g for g in d.groups if g.dimension == "tenant"}
    assert tenants["acme"].delta > 0.5 and tenants["globex"].delta >= 0  # globex now also hits acme's prompt
    assert d.prefill_b.computed_tokens < d.prefill_a.computed_tokens and d.prefill_a.gpus is None


def test_diff_reversed_shows_a_new_breaker_and_gpus(runs) -> None:
    a, b = runs
    r = runner.invoke(app, ["diff", b, a, "--model", "llama-3.1-8b", "--rps", "100", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert [x["status"] for x in data["breakers"]] == ["new"]
    ga, gb = data["prefill"]["a"]["gpus"], data["prefill"]["b"]["gpus"]
    assert 0 < ga < gb  # the breaker costs prefill GPUs
    assert "llama-3.1-8b" in data["scenario"] and "100 req/s" in data["scenario"]


def test_diff_terminal(runs) -> None:
    a, b = runs
    r = runner.invoke(app, ["diff", a, b])
    assert r.exit_code == 0, r.output
    out = r.output
    assert "Ideal-cache hit rate (B - A)" in out and "Token-weighted hit rate by tenant" in out
    assert "fixed" in out and "timestamp (Request time)" in out
    assert "prefill computed (ideal cache): A " in out


def test_diff_usage(runs) -> None:
    r = runner.invoke(app, ["diff", runs[0], runs[1], "--rps", "10"])
    assert r.exit_code == 2 and "need both --model and --rps" in r.output


def test_check_exact_output_on_the_sample_log(tmp_path) -> None:
    from tests.conftest import ROOT

    run = str(tmp_path / "run")
    prefixscan.analyze(str(ROOT / "sample_logs" / "chat.jsonl"), output=run)
    r = runner.invoke(app, ["check", run, "--min-hit-rate", "0.5", "--fail-on", "high", "--max-breaker-tokens",
                            "20000"])
    assert r.exit_code == 8
    assert r.output.splitlines() == [
        "FAIL min-hit-rate (token_weighted): token_weighted hit rate 47.63% is below the minimum 50.00%",
        "FAIL max-breaker-tokens: cache breakers cost 24,608 prompt tokens of reuse (over the maximum 20,000)",
        "FAIL fail-on high: 1 breaker(s) of severity high or above; worst: random_token (Signature), tenant acme, "
        "11,056 tokens (high)",
        "check failed: 3 of 3 gate(s) failed",
    ]


def test_report_compare_to_adds_a_before_after_section(runs, tmp_path) -> None:
    a, b = runs
    r = runner.invoke(app, ["report", b, "--compare-to", a, "-o", str(tmp_path / "rep"), "-f", "md", "-q"])
    assert r.exit_code == 0, r.output
    md = (tmp_path / "rep" / "report.md").read_text()
    section = md.split("## Before and after", 1)[1].split("\n## ", 1)[0]
    d = prefixscan.diff(a, b)
    tw = next((x, y) for k, x, y in d.rates if k == "token_weighted")
    assert f"| token weighted | {100 * tw[0]:.1f}% | {100 * tw[1]:.1f}% | {100 * (tw[1] - tw[0]):+.1f} pts |" in section
    assert "Cache breakers: 1 fixed, 0 new, 0 remaining" in section
