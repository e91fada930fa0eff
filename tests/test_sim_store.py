"""A simulation is replaced as one unit (issue 28): a re-simulation interrupted at any table boundary, by an
error or by a kill, leaves the run exactly the old simulation or exactly the new one, and `report` agrees;
simulate holds the run's lock for its whole write."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefixscan.cli.app import app
from prefixscan.run import rundir, simindex, simstore
from prefixscan.run.load import load_run
from prefixscan.sim import SimResult
from tests.conftest import chat, write_jsonl

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()
OLD = ["-n", "4", "-p", "round_robin", "--kv-blocks", "64"]
NEW = ["-n", "16", "-p", "all", "--kv-blocks", "64"]
NEW_TABLES = 4  # sim_policies, sim_replicas, sim_decisions, sim_timeline


@pytest.fixture(scope="module")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An analysed run with one simulation on 4 replicas (copied by each test)."""
    d = tmp_path_factory.mktemp("store")
    log = write_jsonl(d / "log.jsonl", [chat(i, f"c{i % 5}", 1 + i // 5, tenant="acme") for i in range(15)])
    run = d / "run"
    assert runner.invoke(app, ["analyze", str(log), "-o", str(run), "-q"]).exit_code == 0
    r = runner.invoke(app, ["simulate", str(run), *OLD, "-q"])
    assert r.exit_code == 0, r.output
    return run


def copy_run(base: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(base, run)
    return run


def state(run: Path) -> dict:
    """What a reader sees of the default simulation: its manifest entry and every table's rows."""
    res = SimResult.load(run)
    return {"config": res.config, "policies": res.policies,
            "tables": {t: tb.to_pylist() for t, tb in sorted(res.tables.items())}}


def report_replicas(run: Path, tmp_path: Path) -> tuple[str, list[str]]:
    """The report's "Simulated on N replicas" sentence and its policy rows."""
    out = tmp_path / f"report{time.monotonic_ns()}"
    r = runner.invoke(app, ["report", str(run), "-f", "md", "-o", str(out), "-q"])
    assert r.exit_code == 0, r.output
    md = (out / "report.md").read_text()
    line = next(x for x in md.splitlines() if x.startswith("Simulated on"))
    section = md.split("## Routing policy comparison")[1].split("\n#")[0]  # its first table
    rows = [x.split("|")[1].strip() for x in section.splitlines() if x.startswith("| ") and "policy" not in x]
    return line.split(" replicas")[0], rows


@pytest.fixture(scope="module")
def old_and_new(base_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    """The state after the old simulation and after an uninterrupted new one."""
    d = tmp_path_factory.mktemp("ref")
    new = copy_run(base_run, d)
    assert runner.invoke(app, ["simulate", str(new), *NEW, "-q"]).exit_code == 0
    return state(base_run), state(new)


class Boom(OSError):
    pass


@pytest.mark.parametrize("k", range(NEW_TABLES + 1))
def test_error_after_k_tables_leaves_the_old_simulation(base_run, old_and_new, tmp_path, monkeypatch, k) -> None:
    """The table writer fails after k tables (k = all: the manifest write fails): the old simulation
    stays, whole, and nothing of the new one is left behind."""
    run = copy_run(base_run, tmp_path)
    old, new = old_and_new
    written = []
    real_table, real_manifest = simstore.write_table, simstore.write_manifest

    def table(where, name, tb):
        if len(written) == k:
            raise Boom(28, "No space left on device")
        written.append(name)
        return real_table(where, name, tb)

    def manifest(path, m):
        if k == NEW_TABLES:
            raise Boom(28, "No space left on device")
        return real_manifest(path, m)

    monkeypatch.setattr(simstore, "write_table", table)
    monkeypatch.setattr(simstore, "write_manifest", manifest)
    r = runner.invoke(app, ["simulate", str(run), *NEW, "-q"])
    assert r.exit_code == 7 and "no space left" in r.output and "Traceback" not in r.output
    monkeypatch.undo()
    assert state(run) == old != new
    assert sorted(p.name for p in (run / "simulations").iterdir()) == ["default@1"]
    assert report_replicas(run, tmp_path) == ("Simulated on 4", ["round_robin"])


def test_error_after_the_switch_keeps_the_new_simulation(base_run, old_and_new, tmp_path, monkeypatch) -> None:
    """Once the manifest points at the new simulation, a failure removing the old one cannot undo it."""
    run = copy_run(base_run, tmp_path)
    monkeypatch.setattr(simstore, "_remove_version", lambda *a: (_ for _ in ()).throw(Boom(5, "I/O error")))
    r = runner.invoke(app, ["simulate", str(run), *NEW, "-q"])
    assert r.exit_code == 7
    monkeypatch.undo()
    assert state(run) == old_and_new[1]
    line, rows = report_replicas(run, tmp_path)
    assert line == "Simulated on 16" and len(rows) > 1
    # the next simulate removes the directory the manifest no longer points at
    assert runner.invoke(app, ["simulate", str(run), *OLD, "--name", "other", "-q"]).exit_code == 0
    assert sorted(p.name for p in (run / "simulations").iterdir()) == ["default@2", "other@3"]


KILLER = textwrap.dedent("""
    import os, signal, sys
    from prefixscan.run import simstore
    point, k = sys.argv[1], int(sys.argv[2])
    n = [0]
    real_table, real_manifest, real_remove = simstore.write_table, simstore.write_manifest, simstore._remove_version
    def die():
        os.kill(os.getpid(), signal.SIGKILL)
    def table(where, name, tb):
        if point == "table" and n[0] == k:
            die()
        n[0] += 1
        return real_table(where, name, tb)
    def manifest(path, m):
        if point == "manifest":
            die()
        return real_manifest(path, m)
    def remove(*a):
        if point == "remove":
            die()
        return real_remove(*a)
    simstore.write_table, simstore.write_manifest, simstore._remove_version = table, manifest, remove
    from prefixscan.cli.app import main
    sys.argv = ["prefixscan", *sys.argv[3:]]
    main()
""")


@pytest.mark.parametrize("point,k", [*(("table", k) for k in range(NEW_TABLES)), ("manifest", 0), ("remove", 0)])
def test_kill_at_every_boundary(base_run, old_and_new, tmp_path, point, k) -> None:
    """SIGKILL after k tables, at the manifest switch, or after it: the run is the old simulation or the new
    one, never a mix; the report agrees; the next simulate removes what the killed one left."""
    run = copy_run(base_run, tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", KILLER, point, str(k), "simulate", str(run), *NEW, "-q"],
                       env=env, capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == -signal.SIGKILL, p.stderr
    old, new = old_and_new
    if point == "remove":
        assert state(run) == new
        assert report_replicas(run, tmp_path)[0] == "Simulated on 16"
    else:
        assert state(run) == old
        assert report_replicas(run, tmp_path) == ("Simulated on 4", ["round_robin"])
    r = runner.invoke(app, ["simulate", str(run), *OLD, "--name", "next", "-q"])
    assert r.exit_code == 0, r.output
    left = sorted(p.name for p in (run / "simulations").iterdir())
    assert left == (["default@2", "next@3"] if point == "remove" else ["default@1", "next@2"])


def test_two_simulates_at_once(base_run, tmp_path) -> None:
    """A second simulate on a run another simulate is writing: exit 5, one line naming it in use; the
    first finishes and the run is its simulation."""
    run = copy_run(base_run, tmp_path)
    gate = tmp_path / "gate"
    hold = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        import prefixscan.sim as sim
        real = sim.simulate
        def slow(*a, **k):
            Path({str(gate)!r}).write_text("in")
            while Path({str(gate)!r}).read_text() != "go":
                time.sleep(0.05)
            return real(*a, **k)
        sim.simulate = slow
        from prefixscan.cli.app import main
        sys.argv = ["prefixscan", "simulate", {str(run)!r}, "-n", "16", "-p", "all", "--kv-blocks", "64", "-q"]
        main()
    """)
    first = subprocess.Popen([sys.executable, "-c", hold], env={**os.environ, "PYTHONPATH": str(ROOT)},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (gate.exists() and gate.read_text() == "in"):
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.05)
        second = subprocess.run([sys.executable, "-m", "prefixscan", "simulate", str(run), "-n", "2", "-q"],
                                env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
        assert second.returncode == 5, second.stderr
        assert len(second.stderr.strip().splitlines()) == 1
        assert "in use" in second.stderr and "Traceback" not in second.stderr
    finally:
        gate.write_text("go")
        out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert SimResult.load(run).config["replicas"] == 16
    assert simindex.names(rundir.read_manifest(run)) == ["default"]


def test_old_layout_default_is_read_and_replaced(base_run, tmp_path) -> None:
    """A run written before per-simulation directories (tables at the top, the `simulate` section) is read
    as `default`; re-simulating moves it into simulations/ and removes the top-level tables."""
    run = copy_run(base_run, tmp_path)
    m = rundir.read_manifest(run)
    entry = m.pop("simulations")["default"]
    for t in entry["tables"]:
        shutil.move(run / entry["dir"] / f"{t}.parquet", run / f"{t}.parquet")
        m["tables"][t] = {"rows": entry["tables"][t], "stage": "simulate"}
    shutil.rmtree(run / "simulations")
    m["simulate"] = {k: entry[k] for k in ("config", "workload", "policies")}
    (run / "manifest.json").write_text(json.dumps(m))
    assert SimResult.load(run).config["replicas"] == 4
    assert report_replicas(run, tmp_path) == ("Simulated on 4", ["round_robin"])
    assert runner.invoke(app, ["simulate", str(run), *NEW, "-q"]).exit_code == 0
    assert not list(run.glob("sim_*.parquet"))
    m = rundir.read_manifest(run)
    assert "simulate" not in m and not any(t.startswith("sim_") for t in m["tables"])
    assert SimResult.load(run).config["replicas"] == 16


def test_report_estimate_query_read_the_chosen_simulation(base_run, tmp_path) -> None:
    """Issue 27: with only named simulations, report works (its sim_decisions come from the simulation's own
    directory); `report --simulation` shows that simulation's own P/D or KV-tier results; `query` sees the
    chosen simulation's sim_* tables, `--simulation NAME` picks one."""
    run = copy_run(base_run, tmp_path)
    m = rundir.read_manifest(run)
    shutil.rmtree(run / "simulations")
    m.pop("simulations")
    (run / "manifest.json").write_text(json.dumps(m))
    base = ["simulate", str(run), "-p", "round_robin,prefix_hash", "--kv-blocks", "64", "-q"]
    assert runner.invoke(app, [*base, "-n", "3", "--name", "only"]).exit_code == 0
    out = tmp_path / "r_only"
    r = runner.invoke(app, ["report", str(run), "-f", "md", "-o", str(out), "-q"])
    assert r.exit_code == 0, r.output
    md = (out / "report.md").read_text()
    assert "Simulated on 3 replicas" in md and "saved simulation `only`" in md
    plan = md.split("## Measurement plan")[1]
    assert "no decision log in the run" not in plan and " req)" in plan  # sim_decisions of `only` was read
    assert runner.invoke(app, [*base, "--prefill-replicas", "1", "--decode-replicas", "1", "--name", "pd"]
                         ).exit_code == 0
    assert runner.invoke(app, [*base, "-n", "2", "--host-kv-blocks", "64", "--shared-kv-blocks", "64",
                               "--name", "tiers"]).exit_code == 0
    sections = {}
    for name in ("pd", "tiers", "only"):
        out = tmp_path / f"r_{name}"
        r = runner.invoke(app, ["report", str(run), "--simulation", name, "-f", "md", "-o", str(out), "-q"])
        assert r.exit_code == 0, r.output
        md = (out / "report.md").read_text()
        sections[name] = md.split("## Routing policy comparison")[1].split("\n## ")[0]
        assert f"saved simulation `{name}`" in sections[name]
    assert "1 prefill + 1 decode replicas" in sections["pd"] and "Disaggregated prefill/decode" in sections["pd"]
    assert "| round_robin | 1P + 1D |" in sections["pd"] and "Cached tokens by KV tier" not in sections["pd"]
    assert "Cached tokens by KV tier" in sections["tiers"] and "Disaggregated" not in sections["tiers"]
    assert "Simulated on 2 replicas" in sections["tiers"]
    assert "Cached tokens by KV tier" not in sections["only"] and "Disaggregated" not in sections["only"]
    assert len(set(sections.values())) == 3
    # estimate reuses the simulation it was pointed at (its replica count)
    r = runner.invoke(app, ["estimate", str(run), "--simulation", "only", "--no-save", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["scenario"]["replicas"] == 3
    # query: the chosen simulation's tables as sim_* views
    pols = {n: load_run(run, n).manifest["simulate"]["policies"] for n in ("only", "pd", "tiers")}
    for name in ("only", "pd", "tiers", None):
        args = ["query", str(run), "select policy, hit_rate_token_weighted from sim_policies order by 1",
                "--format", "json"]
        r = runner.invoke(app, args + (["--simulation", name] if name else []))
        assert r.exit_code == 0, r.output
        got = {x["policy"]: x["hit_rate_token_weighted"] for x in json.loads(r.stdout)}
        want = pols[name or "tiers"]  # no default: the most recent
        assert got == {p: v["hit_rate_token_weighted"] for p, v in want.items()}
    r = runner.invoke(app, ["query", str(run), "select 1", "--simulation", "nope"])
    assert r.exit_code == 2 and "no simulation named 'nope'" in r.output


def test_a_reader_whose_simulation_was_replaced_is_told_so(base_run, tmp_path) -> None:
    """A reader that opened the run before a re-simulation finished gets one line saying so, not a table
    of the new simulation under the old one's manifest entry."""
    from prefixscan.errors import RunDirError

    run = copy_run(base_run, tmp_path)
    before = load_run(run)
    assert runner.invoke(app, ["simulate", str(run), *NEW, "-q"]).exit_code == 0
    with pytest.raises(RunDirError, match="was replaced while this command read it"):
        before.table("sim_policies")
    assert load_run(run).table("sim_policies").num_rows > 1
