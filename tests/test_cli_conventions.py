"""Conventions every command keeps (issue 27): help never cuts a flag name, usage errors are one line with
exit 2, terminal tables never cut a number, -q everywhere, failed gates and empty recordings have their own
exit codes, writers refuse to overwrite without --force."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from prefixscan.cli.app import COMMANDS, app

runner = CliRunner()


def _command(name: str):  # the click command behind `prefixscan NAME`
    import typer.main

    return typer.main.get_command(app).commands[name]


def _long_names(name: str) -> list[str]:
    names = []
    for p in _command(name).params:
        if getattr(p, "hidden", False):  # old names kept working but not shown
            continue
        names += [o for o in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ())) if o.startswith("--")]
    return names


@pytest.mark.parametrize("columns", ["80", "60"])
@pytest.mark.parametrize("name", list(COMMANDS))
def test_help_shows_every_flag_name_whole(name: str, columns: str) -> None:
    r = runner.invoke(app, [name, "--help"], env={"COLUMNS": columns})
    assert r.exit_code == 0, r.output
    assert "…" not in r.stdout
    names = _long_names(name)
    assert names
    for flag in names:  # whole: not followed by more of a word, not cut by an ellipsis
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", r.stdout), f"{name} --help cuts {flag}"


def test_help_text_is_not_split_inside_a_word() -> None:
    r = runner.invoke(app, ["simulate", "--help"], env={"COLUMNS": "60"})
    assert "gpt-oss-120b" in r.stdout and "qwen3-235b-a22b" in r.stdout and "--kv-blocks" in r.stdout
    assert not re.search(r"[a-z0-9]-\n", r.stdout)  # no line ends in the middle of a hyphenated word
    check = runner.invoke(app, ["check", "--help"], env={"COLUMNS": "80"}).stdout
    assert "\n  Example: prefixscan check runs/demo --min-hit-rate 0.4 --fail-on high\n" in check


def _one_line_usage_error(args: list[str], command: str) -> str:
    r = runner.invoke(app, args)
    assert r.exit_code == 2, (args, r.output)
    lines = r.stderr.splitlines()
    assert len(lines) == 1, (args, r.stderr)
    assert lines[0].startswith("prefixscan: error: ") and lines[0].endswith(f"(see prefixscan {command}--help)")
    assert "Usage:" not in r.output and "╭" not in r.output
    return lines[0]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_unknown_option_is_one_line(name: str) -> None:
    line = _one_line_usage_error([name, "x", "--no-such-flag"], f"{name} ")
    assert "no such option: --no-such-flag" in line


@pytest.mark.parametrize(("args", "words"), [
    (["check", "--min-hit-rate", "0.4"], "missing argument"),
    (["explain", "runs/x"], "missing argument"),
    (["diff", "runs/a"], "missing argument"),
    (["analyze", "x.jsonl", "--block-size", "abc"], "'--block-size'"),
    (["simulate", "runs/x", "--replicas", "many"], "'--replicas'"),
    (["synth", "-o", "x.jsonl", "--requests", "1.5"], "'--requests'"),
    (["query", "runs/x", "--limit", "ten"], "'--limit'"),
    (["record-events", "tcp://127.0.0.1:1"], "missing option '--output'"),
])
def test_usage_errors_are_one_line(args: list[str], words: str) -> None:
    assert words in _one_line_usage_error(args, f"{args[0]} ")


def test_unknown_command_and_root_option_are_one_line() -> None:
    assert "no such command 'simulat'" in _one_line_usage_error(["simulat", "x"], "")
    assert "no such option: --bogus" in _one_line_usage_error(["--bogus"], "")


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory):  # a run with a co-located and a P/D simulation
    from tests.conftest import chat, write_jsonl

    d = tmp_path_factory.mktemp("conv")
    log = write_jsonl(d / "log.jsonl", [chat(i, f"c{i % 6}", 1 + i // 6, tenant=["acme", "globex"][i % 2])
                                        for i in range(24)])
    run = d / "run"
    assert runner.invoke(app, ["analyze", str(log), "-o", str(run), "-q", "--no-findings"]).exit_code == 0
    r = runner.invoke(app, ["simulate", str(run), "-q", "-n", "4"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["simulate", str(run), "-q", "-p", "round_robin,prefix_hash", "--prefill-replicas", "2",
                            "--decode-replicas", "2", "--name", "pd"])
    assert r.exit_code == 0, r.output
    return run


def _cells(policies: dict, columns: list[tuple]) -> set[str]:
    from prefixscan.report.simulate_terminal import fmt

    return {fmt(s.get(c[1]), c[-1]) for s in policies.values() for c in columns} - {"–"}


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("name", ["default", "pd"])
def test_simulate_tables_never_cut_a_number(sim_run, name: str, columns: int) -> None:
    import json

    from prefixscan.report.model import CLASSES
    from prefixscan.report.simulate_terminal import COLUMNS as SIM_COLUMNS
    from prefixscan.report.simulate_terminal import PD_COLUMNS

    js = runner.invoke(app, ["simulate", str(sim_run), "--load", "--name", name, "--json", "-q"])
    policies = json.loads(js.stdout)["policies"]
    r = runner.invoke(app, ["simulate", str(sim_run), "--load", "--name", name], env={"COLUMNS": str(columns)})
    assert r.exit_code == 0, r.output
    out = r.output
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= columns
    split = [(None, f"{k}_requests", "int") for k in CLASSES]
    split += [(None, f"ttft_{k}_{p}_s", "s") for k in CLASSES for p in ("p50", "p95")]
    expected = _cells(policies, SIM_COLUMNS) | _cells(policies, split)
    if name == "pd":
        expected |= _cells(policies, PD_COLUMNS)
        assert "2P + 2D" in out
    assert len(expected) > 10
    for cell in expected:  # every value, whole: not glued to more digits, not cut
        assert re.search(rf"(?<![\w.,]){re.escape(cell)}(?![\w.,%])", out), f"{cell!r} cut at {columns} columns"


@pytest.fixture(scope="module")
def trace_run(tmp_path_factory):  # a run of a hashed trace (no prompt text)
    from tests.conftest import ROOT

    run = tmp_path_factory.mktemp("trace") / "run"
    r = runner.invoke(app, ["analyze", str(ROOT / "sample_logs" / "mooncake_small.jsonl"), "-o", str(run), "-q"])
    assert r.exit_code == 0, r.output
    return run


def test_a_failed_gate_has_its_own_exit_code(sim_run) -> None:
    from prefixscan.errors import EXIT_CHECK_FAILED, EXIT_INTERNAL

    assert EXIT_CHECK_FAILED == 8 and EXIT_CHECK_FAILED != EXIT_INTERNAL
    r = runner.invoke(app, ["check", str(sim_run), "--min-hit-rate", "1.0"])
    assert r.exit_code == 8 and r.output.splitlines()[-1] == "check failed: 1 of 1 gate(s) failed"
    assert "8 a check failed" in runner.invoke(app, ["--help"], env={"COLUMNS": "200"}).stdout
    assert "8 when one fails" in " ".join(runner.invoke(app, ["check", "--help"]).stdout.split())


def test_breaker_gates_on_a_hashed_trace_are_not_checkable(trace_run) -> None:
    import json

    r = runner.invoke(app, ["check", str(trace_run), "--fail-on", "low"])
    assert r.exit_code == 8, r.output
    lines = r.output.splitlines()
    assert lines[0].startswith("NOT CHECKABLE fail-on low: run ") and "no prompt text" in lines[0]
    assert lines[-1] == "check failed: 1 of 1 gate(s) failed (1 not checkable)"
    r = runner.invoke(app, ["check", str(trace_run), "--max-breaker-tokens", "0", "--json"])
    gate = json.loads(r.stdout)["gates"][0]
    assert r.exit_code == 8 and gate["status"] == "not_checkable" and gate["value"] is None
    r = runner.invoke(app, ["check", str(trace_run), "--fail-on", "low", "--min-hit-rate", "0.1",
                            "--allow-uncheckable"])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[-1] == "check passed: 1 gate(s) held (1 not checkable)"
    r = runner.invoke(app, ["check", str(trace_run), "--fail-on", "low", "--min-hit-rate", "0.99",
                            "--allow-uncheckable"])
    assert r.exit_code == 8  # allowing the uncheckable gate never hides a failed one


def test_record_events_with_no_event_fails_in_one_line(tmp_path) -> None:
    out = tmp_path / "ev.parquet"
    r = runner.invoke(app, ["record-events", "tcp://127.0.0.1:45999", "-o", str(out), "--idle-timeout", "0.5"])
    assert r.exit_code == 3, r.output
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(
        "prefixscan: error: no KV events received from tcp://127.0.0.1:45999 in ")
    assert not out.exists()


def test_quiet_on_explain_export_diff_and_query(sim_run, tmp_path) -> None:
    run = str(sim_run)
    for args in (["explain", run, "r7"], ["diff", run, run]):
        loud, quiet = runner.invoke(app, args), runner.invoke(app, [*args, "-q"])
        assert loud.exit_code == quiet.exit_code == 0, quiet.output
        assert loud.stdout.strip() and quiet.output == ""
        assert runner.invoke(app, [*args, "-q", "--json"]).stdout.startswith("{")  # --json still answers
    out = tmp_path / "t.jsonl"
    r = runner.invoke(app, ["export", run, "-o", str(out), "-q"])
    assert r.exit_code == 0 and r.output == "" and out.stat().st_size > 0
    sql = "select request_id from requests order by seq"
    loud = runner.invoke(app, ["query", run, sql, "--limit", "2"])
    quiet = runner.invoke(app, ["query", run, sql, "--limit", "2", "--quiet"])
    assert "22 more rows" in loud.stdout and "more rows" not in quiet.stdout and "r1" in quiet.stdout


def test_synth_refuses_an_existing_log_or_truth_without_force(tmp_path) -> None:
    out = tmp_path / "chat.jsonl"
    truth = tmp_path / "chat.jsonl.truth.jsonl"
    out.write_text("a real log\n")
    r = runner.invoke(app, ["synth", "-o", str(out), "-n", "5", "-q"])
    assert r.exit_code == 2 and r.stderr == f"prefixscan: error: {out} already exists; pass --force to replace it\n"
    assert out.read_text() == "a real log\n" and not truth.exists()
    out.unlink()
    truth.write_text("its truth\n")  # the sidecar alone is protected too, and the log is not written either
    r = runner.invoke(app, ["synth", "-o", str(out), "-n", "5", "-q"])
    assert r.exit_code == 2 and "chat.jsonl.truth.jsonl already exists" in r.stderr
    assert truth.read_text() == "its truth\n" and not out.exists()
    r = runner.invoke(app, ["synth", "-o", str(out), "-n", "5", "-q", "--force"])
    assert r.exit_code == 0 and len(out.read_text().splitlines()) == 5 and truth.read_text() != "its truth\n"


def test_export_warns_when_its_block_size_loses_the_reuse(sim_run, tmp_path) -> None:
    import json

    r = runner.invoke(app, ["export", str(sim_run), "-o", str(tmp_path / "a.jsonl"), "--json"])
    assert r.exit_code == 0, r.output
    js = json.loads(r.stdout)
    assert js["block_size"] == 512 and js["run_block_size"] == 16
    assert js["request_mean"] < js["run_block_request_mean"] / 2  # the default keeps less than half of it
    warning = r.stderr.splitlines()
    assert len(warning) == 1 and warning[0].startswith("prefixscan: warning: at 512-token blocks")
    assert f"{js['request_mean']:.4f}" in warning[0] and f"{js['run_block_request_mean']:.4f}" in warning[0]
    assert "--block-size 16" in warning[0] and js["warning"] in warning[0]
    r = runner.invoke(app, ["export", str(sim_run), "-o", str(tmp_path / "b.jsonl"), "--json", "--block-size", "16"])
    js16 = json.loads(r.stdout)
    assert r.exit_code == 0 and r.stderr == "" and js16["warning"] is None
    assert js16["request_mean"] == js["run_block_request_mean"]  # the number the warning promised
    assert runner.invoke(app, ["export", str(sim_run), "-o", str(tmp_path / "c.jsonl"), "-q"]).stderr == ""


def test_export_compresses_the_timeline(sim_run, tmp_path) -> None:
    import json

    def lines(path, *extra):
        r = runner.invoke(app, ["export", str(sim_run), "-o", str(path), "-q", *extra])
        assert r.exit_code == 0, r.output
        return [json.loads(x) for x in path.read_text().splitlines()]

    one, fast = lines(tmp_path / "1.jsonl"), lines(tmp_path / "4.jsonl", "--rate-scale", "4")
    assert one[-1]["timestamp"] > 1000  # the fixture spans seconds
    assert [x["hash_ids"] for x in one] == [x["hash_ids"] for x in fast]
    assert all(abs(f["timestamp"] - o["timestamp"] / 4) <= 1 for o, f in zip(one, fast, strict=True))
    slow = lines(tmp_path / "b.jsonl", "--to", "bailian", "--rate-scale", "0.5")
    assert slow[-1]["timestamp"] == pytest.approx(one[-1]["timestamp"] / 1000 * 2, abs=0.002)
    for bad in ("0", "-2", "inf"):
        r = runner.invoke(app, ["export", str(sim_run), "-o", str(tmp_path / "x.jsonl"), "--rate-scale", bad])
        assert r.exit_code == 2 and "--rate-scale must be a positive number" in r.stderr
        assert not (tmp_path / "x.jsonl").exists()


def test_findings_kind_is_validated(tmp_path) -> None:
    import json

    from tests.conftest import ROOT

    run = tmp_path / "run"
    log = str(ROOT / "sample_logs" / "chat.jsonl")
    assert runner.invoke(app, ["analyze", log, "-o", str(run), "-q"]).exit_code == 0
    r = runner.invoke(app, ["findings", str(run), "--kind", "timestmp"])
    assert r.exit_code == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1
    assert "--kind 'timestmp' is not a finding kind; kinds: " in r.stderr and "timestamp, tool_order" in r.stderr
    exact = json.loads(runner.invoke(app, ["findings", str(run), "--kind", "timestamp", "--json"]).stdout)["findings"]
    assert exact and {f["kind"] for f in exact} == {"timestamp"}
    for alias in ("timestamps", "TIMESTAMP", "timestamp,timestamps"):
        r = runner.invoke(app, ["findings", str(run), "--kind", alias, "--json"])
        assert r.exit_code == 0 and json.loads(r.stdout)["findings"] == exact
    both = json.loads(runner.invoke(app, ["findings", str(run), "--kind", "random-token,timestamp", "--json"]).stdout)
    assert {f["kind"] for f in both["findings"]} == {"timestamp", "random_token"}


@pytest.mark.parametrize("columns", [60, 80])
def test_analyze_and_diff_tables_keep_labels_and_numbers_whole(sim_run, columns: int) -> None:
    import json

    from tests.conftest import ROOT

    log = str(ROOT / "sample_logs" / "chat.jsonl")
    s = json.loads(runner.invoke(app, ["analyze", log, "--no-findings", "--json", "-q"]).stdout)
    r = runner.invoke(app, ["analyze", log, "--no-findings"], env={"COLUMNS": str(columns)})
    assert r.exit_code == 0 and "…" not in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= columns
    for key in s["by_prefix_class"]:  # row labels whole on one line ("conversation_history" was folded)
        assert re.search(rf"^ {key} +│", r.stdout, re.M), key
    for tenant, row in s["by_tenant"].items():
        line = next(line for line in r.stdout.splitlines() if line.strip().startswith(tenant))
        assert f"{row['requests']:,}" in line.split("│")[1]
    d = runner.invoke(app, ["diff", str(sim_run), str(sim_run)], env={"COLUMNS": str(columns)})
    assert d.exit_code == 0 and "…" not in d.stdout
    assert max(len(line) for line in d.stdout.splitlines()) <= columns
    assert "+0.0 pts" in d.stdout
