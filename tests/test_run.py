"""The typed Run (prefixscan.run.load): `Run.open(path, simulation=NAME)` gives typed sections, the chosen
simulation travels with the Run (no global), and the library functions take a Run in place of a path."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

import prefixscan
from prefixscan.errors import RunDirError, UsageError
from prefixscan.run.load import Analysis, Run, SavedEstimate, Simulation
from tests.conftest import ROOT

LOG = str(ROOT / "sample_logs" / "chat.jsonl")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> str:
    d = str(tmp_path_factory.mktemp("typed") / "run")
    prefixscan.analyze(LOG, output=d, quiet=True)
    prefixscan.simulate(d, replicas=4, kv_blocks=2000)
    prefixscan.simulate(d, name="small", replicas=2, kv_blocks=500)
    prefixscan.estimate(d, save=True)
    return d


def test_sections_are_typed_and_equal_the_manifest(run_dir) -> None:
    run = prefixscan.Run.open(run_dir)
    assert prefixscan.Run is Run and "Run" in prefixscan.__all__
    m = json.loads((Path(run_dir) / "manifest.json").read_text())
    a = run.analysis
    assert isinstance(a, Analysis)
    assert (a.requests.read, a.requests.accepted, a.requests.rejected) == tuple(
        m["analyze"]["requests"][k] for k in ("read", "accepted", "rejected"))
    assert a.tenant_isolated_hit_rate == m["analyze"]["hit_rate"]["tenant_isolated_token_weighted"]
    assert a.exact_capacity == m["analyze"]["summary"]["capacity"] and a.notes == tuple(m["analyze"].get("notes", ()))
    sim = run.sim
    assert isinstance(sim, Simulation) and sim.name == "default" and not sim.own_name
    entry = m["simulations"]["default"]
    assert (sim.replicas, sim.model, sim.kv_blocks_per_replica) == (
        4, entry["config"]["model"], entry["workload"]["kv_blocks_per_replica"])
    assert sim.policies == entry["policies"] and sim.config == entry["config"]
    est = run.estimate
    assert isinstance(est, SavedEstimate) and est.scenario == est.result["scenario"]
    assert run.findings is None  # `prefixscan findings` never re-ran on this run
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.simulation = "small"  # type: ignore[misc]  # the choice is made when the Run is opened


def test_the_chosen_simulation_travels_with_the_run(run_dir) -> None:
    small = Run.open(run_dir, simulation="small")
    assert small.sim is not None and small.sim.name == "small" and small.sim.replicas == 2 and small.named
    assert Run.open(small) is small  # handed on, it keeps its simulation
    assert prefixscan.load_run(small).table("sim_policies").equals(small.table("sim_policies"))
    assert Run.open(run_dir).sim.replicas == 4 and not Run.open(run_dir).named
    with pytest.raises(UsageError, match="no simulation named 'nope'; simulations: default, small"):
        Run.open(run_dir, simulation="nope")
    # the estimate reads the Run's simulation, as `estimate --simulation small` does
    by_run = prefixscan.estimate(small).to_json()
    by_name = prefixscan.estimate(run_dir, simulation="small").to_json()
    assert by_run == by_name and by_run != prefixscan.estimate(run_dir).to_json()


def test_report_from_a_run_equals_report_simulation(run_dir, tmp_path) -> None:
    """write_report(Run opened with a simulation) writes the bytes `report --simulation NAME` writes."""
    from typer.testing import CliRunner

    from prefixscan.cli.app import app

    prefixscan.write_report(Run.open(run_dir, simulation="small"), str(tmp_path / "py"))
    r = CliRunner().invoke(app, ["report", run_dir, "-o", str(tmp_path / "cli"), "--simulation", "small", "-q"])
    assert r.exit_code == 0, r.output
    for f in ("report.md", "report.html"):
        assert (tmp_path / "py" / f).read_bytes() == (tmp_path / "cli" / f).read_bytes()
    assert "saved simulation `small`" in (tmp_path / "py" / "report.md").read_text()


def test_library_functions_take_a_run(run_dir, tmp_path) -> None:
    run = Run.open(run_dir)
    rid = run.table("requests").column("request_id")[3].as_py()
    from prefixscan.reuse.explain import (
        explain,  # the module: once imported, it shadows the function prefixscan.reuse.explain
    )

    assert explain(run, rid).to_json() == explain(run_dir, rid).to_json()
    assert prefixscan.check(run, min_hit_rate=0.0).passed
    prefixscan.export(run, str(tmp_path / "t.jsonl"))
    prefixscan.export(run_dir, str(tmp_path / "p.jsonl"))
    assert (tmp_path / "t.jsonl").read_bytes() == (tmp_path / "p.jsonl").read_bytes()
    from prefixscan.query import run_query

    assert run_query(run, "select count(*) from requests") == run_query(run_dir, "select count(*) from requests")


def test_damaged_estimate_is_one_line(run_dir, tmp_path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    (copy / "estimate.json").write_text("[1]")
    with pytest.raises(RunDirError, match="is not a saved estimate"):
        _ = Run.open(copy).estimate


def test_no_hidden_global_chooses_the_simulation() -> None:
    """The chosen simulation is a field of the Run: no ContextVar (or module state) in the package."""
    for path in sorted((ROOT / "prefixscan").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert "ContextVar" not in names, path


def test_run_is_at_the_bottom_of_the_layering() -> None:
    """Everything io.run reaches (lazy imports included) stays below the pipeline, reporters and CLI (it
    reaches sim.workload for the columns a replay needs, and through it cost.rate: both import no run)."""
    from tests.test_layers import import_graph

    graph = import_graph()
    seen, todo = set(), ["prefixscan.run.load"]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += graph[m]
    above = sorted(m for m in seen if m.split(".")[1] in ("pipeline", "report", "cli", "compare", "detect"))
    assert above == [], above
