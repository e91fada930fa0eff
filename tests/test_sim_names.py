"""Named simulations side by side in a run (`simulate --name`, `--list`, `report/estimate --simulation`), the
analyze options `simulate LOGS` accepts, and `--timing-profile`."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from prefixscan.cli.app import app
from prefixscan.run import rundir, simindex
from prefixscan.run.load import load_run
from prefixscan.sim import SimResult
from prefixscan.sim.timing import load_profile
from tests.sim_tables import conversations_table

runner = CliRunner()
BPE = Path(__file__).resolve().parent.parent / "conformance" / "fixtures" / "bpe" / "tokenizer"


def make_run(path: Path) -> Path:
    p = rundir.prepare(path)
    rundir.write_table(p, "requests", conversations_table(40, 4, rate_rps=20, seed=3))
    rundir.write_manifest(p, {"config": {"block_size": 16, "hit_rule": "vllm"}})
    return p


def sim(run: Path, *args: str) -> object:
    res = runner.invoke(app, ["simulate", str(run), "-n", "2", "-p", "round_robin", "-q", *args])
    return res


def test_named_side_by_side_and_default(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    assert sim(run, "--kv-blocks", "300").exit_code == 0
    r = sim(run, "--kv-blocks", "40", "--name", "small", "--no-decision-log")
    assert r.exit_code == 0, r.output
    m = rundir.read_manifest(run)
    assert simindex.names(m) == ["default", "small"]
    assert m["simulations"]["default"]["config"]["kv_blocks"] == 300
    assert "simulate" not in m and not list(run.glob("sim_*.parquet"))  # one home: the index
    assert m["simulations"]["small"]["dir"] == "simulations/small@2"
    assert (run / "simulations" / "small@2" / "sim_policies.parquet").exists()
    assert not (run / "simulations" / "small@2" / "sim_decisions.parquet").exists()
    assert SimResult.load(run).config["kv_blocks"] == 300
    assert SimResult.load(run, "small").config["kv_blocks"] == 40
    small = load_run(run, "small")
    assert small.manifest["simulate"]["config"]["kv_blocks"] == 40
    assert small.table("sim_policies").num_rows == 1 and not small.has("sim_decisions")
    assert small.has("requests")  # other tables still come from the run itself


def test_rerun_replaces_only_that_name(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    assert sim(run, "--kv-blocks", "40", "--name", "a").exit_code == 0
    assert sim(run, "--kv-blocks", "50", "--name", "b").exit_code == 0
    before_b = (run / "simulations" / "b@2" / "sim_policies.parquet").read_bytes()
    assert (run / "simulations" / "a@1" / "sim_decisions.parquet").exists()
    assert sim(run, "--kv-blocks", "60", "--name", "a", "--no-decision-log").exit_code == 0
    m = rundir.read_manifest(run)
    assert simindex.names(m) == ["b", "a"]  # oldest write first: a was written again last
    assert m["simulations"]["a"]["config"]["kv_blocks"] == 60
    assert sorted(p.name for p in (run / "simulations").iterdir()) == ["a@3", "b@2"]  # the old a removed whole
    assert not (run / "simulations" / "a@3" / "sim_decisions.parquet").exists()
    assert (run / "simulations" / "b@2" / "sim_policies.parquet").read_bytes() == before_b
    # no default stored: readers take the most recent
    assert simindex.resolve(m, None) == "a"
    assert load_run(run).manifest["simulate"]["config"]["kv_blocks"] == 60


def test_same_input_same_bytes(tmp_path: Path) -> None:
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b")
    for run in (a, b):
        assert sim(run, "--kv-blocks", "40", "--name", "x").exit_code == 0
    for t in ("sim_policies", "sim_decisions"):
        assert pq.read_table(a / "simulations/x@1" / f"{t}.parquet").equals(
            pq.read_table(b / "simulations/x@1" / f"{t}.parquet"))


def test_list_and_unknown_names(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    r = runner.invoke(app, ["simulate", str(run), "--list", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout) == []
    assert sim(run, "--kv-blocks", "40", "--name", "small").exit_code == 0
    assert sim(run, "--kv-blocks", "300").exit_code == 0
    rows = json.loads(runner.invoke(app, ["simulate", str(run), "--list", "--json"]).stdout)
    assert [(x["name"], x["default"]) for x in rows] == [("small", False), ("default", True)]
    text = runner.invoke(app, ["simulate", str(run), "--list"]).stdout
    assert "small" in text and "simulations/small@1" in text
    for cmd in (["simulate", str(run), "--load", "--name", "nope"], ["report", str(run), "--simulation", "nope"],
                ["estimate", str(run), "--simulation", "nope", "--no-save"]):
        r = runner.invoke(app, cmd)
        assert r.exit_code != 0
        assert "no simulation named 'nope'; simulations: small, default" in r.output, r.output
        assert "Traceback" not in r.output


@pytest.mark.parametrize("bad", ["../x", "a/b", "", "-x", "x" * 65, "sp ace"])
def test_bad_names(tmp_path: Path, bad: str) -> None:
    run = make_run(tmp_path / "run")
    r = sim(run, "--name", bad)
    assert r.exit_code != 0 and "--name" in r.output and "Traceback" not in r.output
    assert not (run / "simulations").exists()


def test_report_and_estimate_pick_by_name(tmp_path: Path, chat_log: Path) -> None:
    run = tmp_path / "run"
    assert runner.invoke(app, ["analyze", str(chat_log), "-o", str(run), "-q"]).exit_code == 0
    assert sim(run, "--kv-blocks", "300").exit_code == 0
    assert sim(run, "--kv-blocks", "40", "--name", "small").exit_code == 0
    r = runner.invoke(app, ["report", str(run), "--simulation", "small", "-f", "md", "-o", str(tmp_path / "r")])
    assert r.exit_code == 0, r.output
    md = (tmp_path / "r" / "report.md").read_text()
    assert "40 KV blocks" in md and "300 KV blocks" not in md
    r = runner.invoke(app, ["report", str(run), "-f", "md", "-o", str(tmp_path / "d")])
    assert "300 KV blocks" in (tmp_path / "d" / "report.md").read_text()
    r = runner.invoke(app, ["estimate", "--simulation", "small", "--no-save"])
    assert r.exit_code != 0 and "needs a run directory" in r.output


def test_simulate_logs_takes_analyze_options(tmp_path: Path, chat_log: Path) -> None:
    out = tmp_path / "run"
    r = runner.invoke(app, ["simulate", str(chat_log), "-o", str(out), "--tokenizer", f"hf:{BPE}", "--block-size",
                            "32", "-n", "2", "-p", "round_robin", "--kv-blocks", "100", "-q", "--name", "bpe"])
    assert r.exit_code == 0, r.output
    m = rundir.read_manifest(out)
    assert m["config"]["tokenizer"] == f"hf:{BPE}" and m["config"]["block_size"] == 32
    assert simindex.names(m) == ["bpe"]
    r = runner.invoke(app, ["simulate", str(out), "--tokenizer", "none", "--block-size", "16", "-q"])
    assert r.exit_code != 0 and "options for logs (--tokenizer, --block-size)" in r.output
    r = runner.invoke(app, ["simulate", str(chat_log), "--tokenizer", "nope:x", "-q"])
    assert r.exit_code != 0 and "Traceback" not in r.output


def test_timing_profile(tmp_path: Path) -> None:
    prof = load_profile("vllm-cpu-tiny-llama")
    assert "not a GPU" in prof.hardware and prof.prefill.b_new >= 0
    run = make_run(tmp_path / "run")
    r = runner.invoke(app, ["simulate", str(run), "-n", "1", "-p", "round_robin", "--timing-profile",
                            "vllm-cpu-tiny-llama", "--json", "-q"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["workload"]["prefill_model"] == "profile:vllm-cpu-tiny-llama"
    assert doc["config"]["tpot_s"] == prof.tpot_s
    p = prof.prefill
    assert doc["config"]["prefill_coeffs"] == [p.a, p.b_new, p.c_cached, p.d_new_cached, p.e_new2]
    bad = tmp_path / "bad.json"
    for text, why in (("{", "not a timing profile"), ('{"format": "x"}', "format"),
                      ('{"format": "prefixscan-timing-profile/1"}', "prefill_ms")):
        bad.write_text(text)
        r = runner.invoke(app, ["simulate", str(run), "--timing-profile", str(bad), "-q"])
        assert r.exit_code != 0 and why in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["simulate", str(run), "--timing-profile", "no-such", "-q"])
    assert r.exit_code != 0 and "built-in: vllm-cpu-tiny-llama" in r.output
    r = runner.invoke(app, ["simulate", str(run), "--timing-profile", "vllm-cpu-tiny-llama", "--prefill-coeffs",
                            "1,2", "-q"])
    assert r.exit_code != 0 and "not both" in r.output


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from(["default", "a", "b.2", "C-3"]), st.integers(1, 9),
                              st.booleans()), min_size=1, max_size=8))
def test_store_matches_a_dict_model(tmp_path_factory: pytest.TempPathFactory, ops: list) -> None:
    """Any sequence of saves: the index, the selection rule and every table equal a plain dict's answer."""
    import pyarrow as pa

    run = make_run(tmp_path_factory.mktemp("run") / "run")
    model: dict[str, tuple[int, bool]] = {}
    order: list[str] = []
    for name, k, with_decisions in ops:
        tables = {"sim_policies": pa.table({"policy": ["p"], "k": [k]})}
        if with_decisions:
            tables["sim_decisions"] = pa.table({"k": [k] * k})
        SimResult({"kv_blocks": k}, {"requests": k}, {"p": {"k": k}}, tables).save(run, name)
        model[name] = (k, with_decisions)
        order = [n for n in order if n != name] + [name]
        m = rundir.read_manifest(run)
        assert simindex.names(m) == order
        want = "default" if "default" in model else order[-1]
        assert simindex.resolve(m, None) == want
        for n, (kk, dec) in model.items():
            view = load_run(run, n)
            assert view.manifest["simulate"]["config"]["kv_blocks"] == kk
            assert view.table("sim_policies")["k"].to_pylist() == [kk]
            assert view.has("sim_decisions") == dec


def test_python_api_names_and_profile(tmp_path: Path) -> None:
    import prefixscan

    run = make_run(tmp_path / "run")
    res = prefixscan.simulate(str(run), name="prof", replicas=1, policies=("round_robin",),
                              timing_profile="vllm-cpu-tiny-llama", tpot_s=0.5)
    assert res.info["prefill_model"] == "profile:vllm-cpu-tiny-llama" and res.config["tpot_s"] == 0.5
    assert prefixscan.load_run(str(run), simulation="prof").manifest["simulate"]["config"]["tpot_s"] == 0.5
    with pytest.raises(Exception, match="no simulation named 'x'; simulations: prof"):
        prefixscan.load_run(str(run), simulation="x")


def test_python_api_decides_as_the_cli(tmp_path: Path) -> None:
    """The defaults and errors that follow from other options are SimConfig.from_options's, so
    `prefixscan.simulate()` applies them as `prefixscan simulate` does (they once lived only in the CLI)."""
    import prefixscan
    from prefixscan.errors import UsageError
    from prefixscan.sim.config import SimConfig

    run = make_run(tmp_path / "run")
    one = {"replicas": 1, "policies": ("round_robin",), "save": False}
    assert prefixscan.simulate(str(run), event_delay_s=0.5, **one).config["knowledge"] == "delayed"
    assert prefixscan.simulate(str(run), **one).config["knowledge"] == "exact"
    assert SimConfig.from_options(event_delay_s=0.5, knowledge="exact").knowledge == "exact"  # given: kept
    res = prefixscan.simulate(str(run), prefill_coeffs=(1.0, 0.1), **one)
    assert res.config["prefill_model"] == "coeffs" and res.info["prefill_model"] == "user-coeffs"
    both = "give --timing-profile or --prefill-coeffs, not both"
    with pytest.raises(UsageError, match=f"^{both}$"):
        prefixscan.simulate(str(run), timing_profile="vllm-cpu-tiny-llama", prefill_coeffs=(1.0,), **one)
    r = runner.invoke(app, ["simulate", str(run), "--timing-profile", "vllm-cpu-tiny-llama", "--prefill-coeffs", "1",
                            "-q"])
    assert r.exit_code == 2 and both in r.output
    with pytest.raises(UsageError, match="needs --timing-profile"):
        SimConfig.from_options(prefill_model="profile")
